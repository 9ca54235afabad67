"""GGUF files of the architectures added with Hugging Face checkpoints (``qwen3``,
``gemma3``): random tiny models written with the ``gguf`` package as llama.cpp's
converter lays them out, loaded by jaxcd and by transformers' own GGUF loader, compared
on every position (float32, atol 1e-4). Nothing is downloaded."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")


def write_gguf(path, arch: str, seed: int = 0, V=256, H=64, F=128, L=6, nh=2, nkv=1, D=256,
               window=4):
    """A random tiny ``qwen3`` or ``gemma3`` GGUF (norm weights stored + 1 for Gemma, as
    llama.cpp's converter does; Q/K not permuted: NEOX RoPE)."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_freq_base(10000.0 if arch == "qwen3" else 1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(V)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    if arch == "gemma3":
        w.add_sliding_window(window)

    def put(name, arr, qt=Q.F32):
        arr = np.asarray(arr, np.float32)
        if qt == Q.F32:
            w.add_tensor(name, arr)
        elif qt == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, quantize(arr, qt), raw_dtype=qt)

    def g(*shape, s=0.2):
        return rng.normal(scale=s, size=shape)

    shift = 1.0 if arch == "gemma3" else 0.0

    def norm(n):                       # Gemma: the file holds 1 + w
        return shift + g(n, s=0.3) + (0.0 if arch == "gemma3" else 1.0)

    put("token_embd.weight", g(V, H, s=0.5), Q.Q8_0)
    put("output_norm.weight", norm(H))
    for i in range(L):
        p = f"blk.{i}."
        put(p + "attn_norm.weight", norm(H))
        put(p + "attn_q.weight", g(nh * D, H), Q.F16)
        put(p + "attn_k.weight", g(nkv * D, H), Q.Q8_0)
        put(p + "attn_v.weight", g(nkv * D, H), Q.F16)
        put(p + "attn_output.weight", g(H, nh * D, s=0.05))
        put(p + "attn_q_norm.weight", norm(D))
        put(p + "attn_k_norm.weight", norm(D))
        put(p + "ffn_norm.weight", norm(H))
        put(p + "ffn_gate.weight", g(F, H), Q.Q8_0)
        put(p + "ffn_up.weight", g(F, H), Q.F16)
        put(p + "ffn_down.weight", g(H, F))
        if arch == "gemma3":
            put(p + "post_attention_norm.weight", norm(H))
            put(p + "post_ffw_norm.weight", norm(H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_tiny_gguf_matches_transformers(tmp_path, arch):
    from jaxcd.lm.interface import pad_prompts
    from jaxcd.lm.loading import load_lm
    from jaxcd.lm.torch_adapter import load_hf_model_from_gguf

    path = tmp_path / f"tiny_{arch}.gguf"
    # transformers' qwen3 GGUF mapping ignores attention.key_length (Qwen3Config's
    # default head_dim, 128, applies); Gemma 3 reads it (and assumes
    # query_pre_attn_scalar = 256 = head_dim, as llama.cpp does for all but 27B)
    D = 128 if arch == "qwen3" else 256
    write_gguf(path, arch, D=D)
    lm, params = load_lm(path, tokenizer=False)[:2]
    c = lm.config
    assert c.qk_norm and c.head_dim == D
    if arch == "gemma3":     # layers 0-4 local (window 4, base 10000), layer 5 global
        assert c.sliding_layers == (True,) * 5 + (False,) and c.sliding_window == 4
        assert c.rope_local_theta == 10000.0 and c.post_norms and c.norm_offset == 1.0
    hf = load_hf_model_from_gguf(path, torch.float32)
    seqs = [[5, 17, 99, 3, 250, 7, 7, 42, 11, 12, 13], [9, 2, 3, 4, 5, 6]]
    ids, lens = pad_prompts(seqs, pad_id=0)
    ours = np.asarray(lm.logprobs_all(params, ids, lens))
    for b, seq in enumerate(seqs):
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([seq])).logits[0].double(), -1).numpy()
        assert ref.std(-1).mean() > 0.25
        np.testing.assert_allclose(ours[b, ids.shape[1] - len(seq):], ref, atol=1e-4)
