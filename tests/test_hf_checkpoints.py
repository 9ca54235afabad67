"""Hugging Face checkpoint folders: parity of jaxcd.load_model with transformers' own
PyTorch models (the acceptance test of issue 20), tokenizer bytes, RoPE scaling,
errors, memory refusal and tensor-parallel sharding.

Every model and tokenizer is built here, at random, tiny, and written with
``save_pretrained``: nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402

import jaxcd  # noqa: E402
from jaxcd.lm.loading import load_lm  # noqa: E402
from jaxcd.errors import ModelFileError  # noqa: E402
from jaxcd.lm.llama import JaxLM  # noqa: E402
from jaxcd.vocab import Vocabulary  # noqa: E402

V = 300
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              max_position_embeddings=64, initializer_range=0.3)
WINDOW = 4
CORPUS = ["The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x ** 2\n",
          '{"name": "Ada", "age": 36}', "Café naïve façade résumé", "中文测试 你好 世界",
          "Emoji 😀🎉👍🏽", "0 1 12 123 1234 -42 3.14", "  spaces\tand\ttabs\r\n"] * 20
TEXTS = CORPUS[:8] + ["Ω≈ç√∫˜µ≤≥÷ ½ ¼", "\x00\x01 control \x7f", "ありがとう"]

CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# ----------------------------------------------------------------------------- tokenizers
def byte_level_tokenizer():
    """A byte-level BPE tokenizer (GPT-2 / Llama-3 / Qwen style) trained on CORPUS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=290, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT)


def sentencepiece_tokenizer(style: str):
    """A SentencePiece-style BPE with ``<0xNN>`` byte fallback: ``style="gemma"``
    (spaces -> ▁ by a normalizer, no prefix space) or ``"llama"`` (Metaspace with a
    prefix space, decoder strips it: Llama-2 / Mistral)."""
    from tokenizers import (Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            trainers)
    from transformers import PreTrainedTokenizerFast

    t0 = Tokenizer(models.BPE())
    t0.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    t0.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=160, show_progress=False))
    model = json.loads(t0.to_str())["model"]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    for p, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        if p not in pieces and len(pieces) < 290:
            pieces.append(p)
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    merges = [m for m in merges if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True))
    dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if style == "gemma":
        tok.normalizer = normalizers.Replace(" ", "\u2581")
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                     prepend_scheme="first", split=False)
        dec.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(dec)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>", pad_token="<pad>", chat_template=CHAT)


@pytest.fixture(scope="module")
def bpe_tokenizer():
    return byte_level_tokenizer()


@pytest.mark.parametrize("kind", ["byte_level", "gemma", "llama"])
def test_vocabulary_bytes_match_tokenizer_decoding(kind, tmp_path):
    """Vocabulary.from_tokenizer's bytes of EVERY token equal the tokenizer's own
    decoding of it (after an anchor token, so no prefix-space rule applies), and the
    bytes of an encoding join to the text, multi-byte characters split over
    byte-fallback / partial tokens included. The tokenizer goes through
    save_pretrained and jaxcd's loader."""
    from jaxcd.lm.hf_checkpoint import load_hf_tokenizer

    src = byte_level_tokenizer() if kind == "byte_level" else sentencepiece_tokenizer(kind)
    src.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    tok = load_hf_tokenizer(tmp_path)
    vocab = Vocabulary.from_tokenizer(tok)
    assert vocab.vocab_size == len(tok) and vocab.eos_id == tok.eos_token_id
    anchor = next(i for i in vocab.ordinary_ids.tolist()
                  if vocab.token_bytes[i].isalpha() and vocab.token_bytes[i].isascii()
                  and not tok.convert_ids_to_tokens(i).startswith("<0x"))
    a_text = tok.decode([anchor])
    n_partial = 0
    for i in vocab.ordinary_ids.tolist():
        b = vocab.token_bytes[i]
        got = tok.decode([anchor, i])
        assert got.startswith(a_text)
        got = got[len(a_text):]
        try:
            want = b.decode("utf-8")
        except UnicodeDecodeError:
            want = b.decode("utf-8", errors="replace")
            n_partial += 1
        assert got == want, (i, tok.convert_ids_to_tokens(i), b, got)
    assert n_partial > 0          # byte-fallback / partial-UTF-8 tokens were checked
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        joined = b"".join(vocab.token_bytes[i] for i in ids)
        if kind == "llama":   # Metaspace's prefix space; the decoder strips one space
            assert joined == b" " + tok.decode(ids).encode(), text
            assert joined.lstrip(b" ") == text.encode().lstrip(b" ")
        else:
            assert joined == text.encode(), text
    special = [tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens]
    assert all(vocab.is_special[i] for i in special)


# ----------------------------------------------------------------------------- parity
def _configs():
    T = transformers
    sliding = ["sliding_attention", "full_attention", "sliding_attention"]
    return {
        "llama": (T.LlamaForCausalLM, T.LlamaConfig(
            **COMMON, attention_bias=True,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**COMMON, tie_word_embeddings=True)),
        "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config(
            **COMMON, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 8})),
        "mistral": (T.MistralForCausalLM, T.MistralConfig(**COMMON, sliding_window=WINDOW)),
        "gemma3": (T.Gemma3ForCausalLM, T.Gemma3TextConfig(
            **COMMON, sliding_window=WINDOW, layer_types=sliding, query_pre_attn_scalar=12,
            final_logit_softcapping=3.0,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                "rope_theta": 50000.0},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 100.0}})),
    }


def save_tiny(arch: str, folder, tokenizer, seed: int = 0):
    """A random tiny ``arch`` model (norm weights and biases random too), saved with its
    tokenizer. Returns the PyTorch model (float32, eager attention)."""
    cls, cfg = _configs()[arch]
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def _reference(model, seq: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


P_LONG, P_SHORT, STEPS, MAX_LEN = 9, 6, 7, 16


def _check_parity(lm, params, model, rng):
    """Prefill of two left-padded prompts (lengths 9 and 6) and 7 cached decode steps
    (past the window of 4) against transformers' full forward over each row."""
    seqs = [rng.integers(0, V, P_LONG + STEPS).tolist(),
            rng.integers(0, V, P_SHORT + STEPS).tolist()]
    lens = [P_LONG, P_SHORT]
    ids = np.zeros((2, P_LONG), np.int32)
    for r, (s, n) in enumerate(zip(seqs, lens)):
        ids[r, P_LONG - n:] = s[:n]
    refs = [_reference(model, s) for s in seqs]
    state, lp = lm.prefill(params, jnp.asarray(ids), jnp.asarray(lens, jnp.int32), MAX_LEN)
    errs = [max(np.abs(np.asarray(lp[r]) - refs[r][lens[r] - 1]).max() for r in range(2))]
    for t in range(STEPS):
        toks = jnp.asarray([seqs[r][lens[r] + t] for r in range(2)], jnp.int32)
        state, lp = lm.step(params, state, toks)
        errs.append(max(np.abs(np.asarray(lp[r]) - refs[r][lens[r] + t]).max()
                        for r in range(2)))
    spread = float(np.mean([r.std(-1).mean() for r in refs]))
    return errs, spread


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma3"])
def test_parity_with_transformers(arch, tmp_path, bpe_tokenizer):
    model = save_tiny(arch, tmp_path, bpe_tokenizer)
    m = jaxcd.load_model(str(tmp_path))
    assert m.lm.dtype == jnp.float32 and m.lm.config.arch == arch.replace("gemma3", "gemma3_text")
    errs, spread = _check_parity(m.lm, m.params, model, np.random.default_rng(1))
    assert spread > 0.25                     # far from uniform: the comparison has teeth
    assert max(errs) < 1e-4, (arch, errs)
    if arch in ("mistral", "gemma3"):
        # the same through the blocked decode attention (cache visited 4 slots at a time)
        lm4 = JaxLM(m.lm.config, attn_block=4)
        errs, _ = _check_parity(lm4, m.params, model, np.random.default_rng(2))
        assert max(errs) < 1e-4, (arch, "blocked", errs)
    # the chat template and EOS come from the checkpoint
    ids = m.encode_prompt("hi")
    assert m.tokenizer.decode(ids).startswith("<|im_start|>user\nhi<|im_end|>")
    assert m.vocab.eos_id == m.lm.eos_token_id == bpe_tokenizer.eos_token_id


def test_rope_scaling_matches_transformers():
    """inv_freq and attention scaling of linear / llama3 / yarn (with and without
    mscale) against transformers.modeling_rope_utils."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from jaxcd.lm.hf_checkpoint import config_from_dict

    cases = [
        {"rope_type": "linear", "factor": 3.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
        {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 2048,
         "beta_fast": 16, "beta_slow": 2, "mscale": 0.7, "mscale_all_dim": 1.0},
    ]
    for rp in cases:
        hf = transformers.LlamaConfig(hidden_size=1024, num_attention_heads=8, head_dim=128,
                                      max_position_embeddings=131072,
                                      rope_parameters={"rope_theta": 500000.0, **rp})
        inv, att = ROPE_INIT_FUNCTIONS[rp["rope_type"]](hf, "cpu")
        d = json.loads(hf.to_json_string())
        d.update(vocab_size=32, intermediate_size=64, num_hidden_layers=1)
        (ours, our_att), = config_from_dict(d).rope_tables()
        np.testing.assert_allclose(ours, inv.numpy(), rtol=2e-6, err_msg=str(rp))
        assert abs(our_att - att) < 1e-6, rp


def test_unsupported_configs_are_refused(tmp_path):
    from jaxcd.lm.hf_checkpoint import load_hf_weights, read_hf_config

    base = dict(COMMON, model_type="llama")
    cases = {
        "model_type 'gpt_neox'": dict(base, model_type="gpt_neox"),
        "rope_scaling RoPE type 'dynamic'": dict(base, rope_scaling={"rope_type": "dynamic",
                                                                     "factor": 2.0}),
        "mlp_bias": dict(base, mlp_bias=True),
        "hidden_act='gelu'": dict(base, hidden_act="gelu"),
        "partial_rotary_factor": dict(base, partial_rotary_factor=0.5),
        "quantization_config": dict(base, quantization_config={"quant_method": "gptq"}),
        "attn_logit_softcapping": dict(base, model_type="gemma3_text",
                                       attn_logit_softcapping=50.0),
        "multimodal Gemma 3": {"model_type": "gemma3", "text_config": {}},
    }
    for needle, cfg in cases.items():
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelFileError, match=needle.split("'")[0].split("=")[0]):
            read_hf_config(tmp_path)
    with pytest.raises(ModelFileError, match="no model.safetensors"):
        (tmp_path / "config.json").write_text(json.dumps(base))
        load_hf_weights(tmp_path, read_hf_config(tmp_path), np.float32)


def test_sharded_checkpoint_bf16_and_memory_refusal(tmp_path, bpe_tokenizer, monkeypatch):
    """Shards + index (bfloat16 tensors) load lazily to the same weights as one file;
    dtype=bfloat16 keeps bf16 weights; an impossible memory limit is refused with the
    figure before loading."""
    model = save_tiny("qwen3", tmp_path / "one", bpe_tokenizer)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    bpe_tokenizer.save_pretrained(tmp_path / "sharded")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    lm1, p1, *_ = load_lm(str(tmp_path / "one"), dtype="float32")
    lm2, p2, *_ = load_lm(str(tmp_path / "sharded"), dtype="bfloat16")
    assert lm2.dtype == jnp.bfloat16
    a = np.asarray(p1["layers"]["mlp"]["up_proj"]["kernel"][...])
    b = np.asarray(p2["layers"]["mlp"]["up_proj"]["kernel"][...]).astype(np.float32)
    assert b.dtype == np.float32 and np.abs(a - b).max() <= np.abs(a).max() * 2 ** -8
    ids, lens = jnp.asarray([[5, 17, 99, 3, 250, 7]]), jnp.asarray([6])
    _, lp1 = lm1.prefill(p1, ids, lens, 8)
    _, lp2 = lm2.prefill(p2, ids, lens, 8)          # bf16 weights/activations, f32 softmax
    assert lp2.dtype == jnp.float32
    err = np.abs(np.asarray(lp1) - np.asarray(lp2)).max()
    assert 0 < err < 0.15, err
    monkeypatch.setenv("JAXCD_MEMORY_LIMIT_GB", "0.00001")
    with pytest.raises(ModelFileError, match=r"needs 0\.\d+ GiB.*only 0\.00 GiB"):
        load_lm(str(tmp_path / "one"))
    with pytest.raises(ModelFileError, match="KV cache"):
        lm1.prefill(p1, jnp.zeros((1, 4), jnp.int32), jnp.asarray([4]), 64)


def test_mesh_sharding_equals_one_device(tmp_path, bpe_tokenizer):
    """On 4 forced host devices (a subprocess), weights sharded tensor-parallel over a
    (data=2, model=2) mesh give the log-probs of one device; loading imports no torch.
    jaxcd.generate with that model (GCD greedy, and SMC) splits the prompt rows over the
    data axis and gives the outputs of one device, each valid for its own regex."""
    save_tiny("gemma3", tmp_path, bpe_tokenizer)
    script = textwrap.dedent(f"""
        import sys, numpy as np, jax, jax.numpy as jnp
        from jax.sharding import Mesh
        import jaxcd
        from jaxcd.lm.loading import data_sharding
        assert len(jax.devices()) == 4
        one = jaxcd.load_model({str(tmp_path)!r})
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
        tp = jaxcd.load_model({str(tmp_path)!r}, mesh=mesh)
        assert "torch" not in sys.modules
        q = tp.params["layers"]["attn"]["q_proj"]["kernel"][...]
        assert q.sharding.spec[-1] == "model" and len(q.addressable_shards) == 4
        ids = jnp.asarray(np.random.default_rng(0).integers(0, 300, (2, 9)), jnp.int32)
        lens = jnp.asarray([9, 6], jnp.int32)
        out = []
        for m, x in ((one, ids), (tp, jax.device_put(ids, data_sharding(mesh)))):
            st, lp = m.lm.prefill(m.params, x, lens, 16)
            lps = [lp]
            for t in range(6):
                st, lp = m.lm.step(m.params, st, x[:, t])
                lps.append(lp)
            out.append(np.stack([np.asarray(l) for l in lps]))
        err = np.abs(out[0] - out[1]).max()
        print("ERR", err)
        assert err < 1e-5, err
        # generate: 4 prompts with their own regexes, rows split over the data axis
        rxs = ["(ab|ba){2,4}", "[0-9]{3}", "(yes|no)", "x+y"]
        prompts = ["hi", "a number", "say", "go on"]
        res = {{}}
        for name, m in (("one", one), ("tp", tp)):
            for meth, kw in (("gcd", dict(num_samples=2, temperature=0.0)),
                             ("smc", dict(smc=jaxcd.SMCConfig(num_particles=2), seed=3))):
                rs = jaxcd.generate_batch(prompts, constraints=[{{"regex": r}} for r in rxs],
                                          model=m, method=meth, budget=12, progress=False, **kw)
                res[name, meth] = rs
        import re
        for meth in ("gcd", "smc"):
            a, b = res["one", meth], res["tp", meth]
            assert a[0].stats["data_shards"] == 1 and b[0].stats["data_shards"] == 2
            for r, x, y in zip(rxs, a, b):
                assert all(re.fullmatch(r, t) for t in y.texts), (r, y.texts)
                assert x.texts == y.texts, (meth, x.texts, y.texts)
        print("GEN ok")
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                          + " --xla_force_host_platform_device_count=4").strip())
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ERR" in r.stdout and "GEN ok" in r.stdout


def test_folder_model_everywhere(tmp_path, bpe_tokenizer, capsys):
    """A checkpoint folder works where a Model works: the CLI's --model (GCD: every
    output matches), jaxcd.generate with SMC, and the tokenizer/LM loaders that
    hmm_distill's sampler calls (``--lm gguf:FOLDER``)."""
    import re

    from jaxcd.cli import main
    from jaxcd.tokenizer import load_tokenizer

    save_tiny("gemma3", tmp_path, bpe_tokenizer)
    rx = "(ab|ba){2,4}"
    rc = main(["generate", "--model", str(tmp_path), "--regex", rx, "--prompt", "hi",
               "--budget", "12", "--num-samples", "2", "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and out
    for line in out:
        texts = json.loads(line).get("texts") or [json.loads(line)["text"]]
        assert all(re.fullmatch(rx, t) for t in texts), texts
    res = jaxcd.generate("hi", regex=rx, method="smc", smc=jaxcd.SMCConfig(num_particles=4),
                         budget=12, model=str(tmp_path), seed=0, num_samples=3)
    assert len(res.texts) == 3 and res.particles is None
    assert all(re.fullmatch(rx, t) for t in res.texts)
    assert load_tokenizer(tmp_path).get_vocab() == bpe_tokenizer.get_vocab()
    assert load_lm(tmp_path, tokenizer=False).lm.config.arch == "gemma3_text"
