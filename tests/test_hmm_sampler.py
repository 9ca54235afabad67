"""The LM sampler, checked exactly against TableLM: the empirical distribution of
whole sampled sequences matches the LM's probabilities (chi-square, fixed seed), EOS
padding, resumable shards, independence of the batch size."""

from __future__ import annotations

import itertools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import chisquare

from jaxcd.lm.interface import TableLM
from hmm_distill import hmm as F
from hmm_distill.data import load_samples
from hmm_distill.errors import ConfigError, SampleDataError, SampleDirMismatchError
from hmm_distill.lms import HMMLanguageModel, load_lm, table_fingerprint
from hmm_distill.sampler import read_prompts, run_sampling, sample_continuations, sequence_keys

V, EOS, T = 3, 2, 4


def _prefix_probs(prefix):  # depends on the whole prefix; EOS more likely later
    k = len(prefix)
    s = sum(prefix)
    return np.array([1.0 + (s % 2), 1.0 + k, 0.3 + 0.5 * k])


def _table_lm():
    return TableLM.from_function(_prefix_probs, V, depth=T, eos_token_id=EOS)


def _exact_distribution(lm, temperature=1.0):
    """Probabilities of every EOS-padded length-T sequence (sampled at temperature τ)."""
    logp, children = (np.asarray(a, np.float64) for a in lm.params)
    children = children.astype(int)
    probs = {}
    for seq in itertools.product(range(V), repeat=T):
        if EOS in seq:  # canonical: everything after the first EOS is EOS
            i = seq.index(EOS)
            if any(t != EOS for t in seq[i:]):
                continue
            n = i + 1
        else:
            n = T
        node, total = 0, 1.0
        for v in seq[:n]:
            q = np.exp(logp[node] / temperature)
            total *= q[v] / q.sum()
            node = children[node, v]
        probs[seq] = total
    return probs


@pytest.mark.parametrize("temperature,num", [(1.0, 20000), (0.5, 8000)])
def test_sampled_sequences_match_table_lm(temperature, num):
    lm = _table_lm()
    exact = _exact_distribution(lm, temperature)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-9)
    ids = np.full((num, 1), EOS, np.int32)
    lens = np.ones(num, np.int32)
    toks = np.asarray(sample_continuations(lm, lm.params, ids, lens, sequence_keys(0, np.arange(num)),
                                           length=T, temperature=temperature))
    assert toks.shape == (num, T) and toks.dtype == np.int32
    # EOS padding: after the first EOS only EOS
    after = np.maximum.accumulate(toks == EOS, axis=1)
    assert np.all(toks[after] == EOS)
    keys = list(exact)
    index = {s: i for i, s in enumerate(keys)}
    counts = np.zeros(len(keys))
    for row in map(tuple, toks):
        counts[index[row]] += 1  # KeyError = an impossible sequence was sampled
    expected = np.array([exact[s] for s in keys]) * num
    # pool rare cells (expected < 5) so the chi-square approximation holds
    rare = expected < 5
    obs, exp = counts[~rare], expected[~rare]
    if rare.any():
        obs, exp = np.append(obs, counts[rare].sum()), np.append(exp, expected[rare].sum())
    assert len(obs) >= 10
    stat, pval = chisquare(obs, exp)
    assert pval > 1e-3, (stat, pval, len(obs))


def test_greedy_and_hmm_lm():
    lm = _table_lm()
    toks = np.asarray(sample_continuations(lm, lm.params, np.full((3, 1), EOS, np.int32),
                                           np.ones(3, np.int32), sequence_keys(0, np.arange(3)),
                                           length=T, temperature=0.0))
    assert np.all(toks == toks[0])  # argmax is deterministic
    # an HMM behind the LM interface: sample marginals equal the HMM's own sampler's
    p = F.random_params(jax.random.key(0), 3, 5, noise=2.0)
    hlm = HMMLanguageModel(p, eos_token_id=4)
    n = 6000
    toks = np.asarray(sample_continuations(hlm, hlm.params, np.zeros((n, 1), np.int32),
                                           np.ones(n, np.int32), sequence_keys(1, np.arange(n)),
                                           length=2, temperature=1.0))
    xs = np.array(F.sample(p, jax.random.key(2), n, 2)[0])
    xs[:, 1] = np.where(xs[:, 0] == 4, 4, xs[:, 1])  # EOS padding
    for t in range(2):
        np.testing.assert_allclose(np.bincount(toks[:, t], minlength=5) / n,
                                   np.bincount(xs[:, t], minlength=5) / n, atol=0.03)


def test_run_sampling_shards_resume_and_batch_independence(tmp_path):
    lm = _table_lm()
    kw = dict(num_seqs=50, length=T, shard_size=20, seed=3, temperature=1.0, model_name="table",
              fingerprint=table_fingerprint(V, EOS), progress=False)
    d = tmp_path / "s"
    meta = run_sampling(lm, lm.params, d, batch_size=8, **kw)
    assert [s["num_seqs"] for s in meta["shards"]] == [20, 20, 10] and meta["complete"]
    data = load_samples(d, expect_vocab_size=V, expect_fingerprint=table_fingerprint(V, EOS))
    assert data.tokens.shape == (50, T) and data.eos_token_id == EOS
    # other batch size -> identical samples (per-sequence keys)
    d2 = tmp_path / "s2"
    run_sampling(lm, lm.params, d2, batch_size=16, **kw)
    np.testing.assert_array_equal(load_samples(d2).tokens, data.tokens)
    # resume: remove one shard and corrupt another; complete shards are kept untouched
    os.remove(d / "shard_00001.npy")
    (d / "shard_00002.npy").write_bytes(b"partial")
    t0 = os.stat(d / "shard_00000.npy").st_mtime_ns
    run_sampling(lm, lm.params, d, batch_size=8, **kw)
    assert os.stat(d / "shard_00000.npy").st_mtime_ns == t0
    np.testing.assert_array_equal(load_samples(d).tokens, data.tokens)
    # extending the run adds shards; the earlier ones stay
    meta = run_sampling(lm, lm.params, d, batch_size=8, **{**kw, "num_seqs": 70})
    ext = load_samples(d).tokens
    assert ext.shape == (70, T) and len(meta["shards"]) == 4
    np.testing.assert_array_equal(ext[:40], data.tokens[:40])
    # different settings in the same directory are refused
    with pytest.raises(SampleDirMismatchError, match="seed"):
        run_sampling(lm, lm.params, d, batch_size=8, **{**kw, "seed": 4})


def test_prompts_and_lm_specs(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("1 0\n\n0 0 1\n")
    texts, ids = read_prompts(f, fmt="ids", bos=EOS)
    assert ids == [[EOS, 1, 0], [EOS, 0, 0, 1]] and len(texts) == 2

    class FakeTok:
        def encode(self, text, add_special_tokens=False):
            return [len(w) % V for w in text.split()]

    _, ids = read_prompts(f, fmt="text", tokenizer_loader=FakeTok)
    assert ids == [[1, 1], [1, 1, 1]]
    with pytest.raises(SampleDataError, match="no prompts"):
        (tmp_path / "e.txt").write_text("\n")
        read_prompts(tmp_path / "e.txt", fmt="ids")
    # prompts are recorded and cycled
    lm = _table_lm()
    meta = run_sampling(lm, lm.params, tmp_path / "d", num_seqs=5, length=T, shard_size=5,
                        batch_size=5, prompt_ids=[[EOS, 1, 0], [EOS]], prompt_texts=["a", "b"],
                        progress=False)
    assert meta["prompts"] == ["a", "b"] and meta["prompt_ids"] == [[EOS, 1, 0], [EOS]]
    with pytest.raises(SampleDataError, match="outside the vocabulary"):
        run_sampling(lm, lm.params, tmp_path / "d3", num_seqs=5, length=T, prompt_ids=[[7]],
                     progress=False)
    # LM specs
    toy = load_lm("toy:16:1")
    assert toy.lm.vocab_size == 16 and toy.fingerprint == table_fingerprint(16, 15)
    np.savez(tmp_path / "t.npz", logprobs=np.asarray(lm.params[0]), children=np.asarray(lm.params[1]),
             eos_token_id=EOS)
    tab = load_lm(f"table:{tmp_path / 't.npz'}")
    assert tab.lm == lm
    from hmm_distill.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown --lm"):
        load_lm("bogus:1")


def test_sample_cli_with_hmm_lm(tmp_path, capsys):
    from hmm_distill.checkpoint import save_checkpoint
    from hmm_distill.cli import main

    p = F.random_params(jax.random.key(0), 3, 6)
    ck = save_checkpoint(tmp_path / "planted.safetensors", p, fingerprint="fp-x", eos_token_id=5)
    out = tmp_path / "samples"
    rc = main(["sample", "--lm", f"hmm:{ck}", "--out", str(out), "--num-seqs", "30", "--length", "7",
               "--shard-size", "16", "--batch-size", "8", "--no-progress"])
    assert rc == 0
    s = load_samples(out, expect_fingerprint="fp-x", expect_vocab_size=6)
    assert s.tokens.shape == (30, 7)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["model"].startswith("hmm:") and len(meta["shards"]) == 2


def test_shared_prefill_equals_padded_batch(tmp_path):
    """run_sampling batches rows by prompt and prefills each distinct prompt once, padded
    only to its batch's longest prompt; the draws equal those of one fully padded batch.
    TableLM: exactly; a tiny random Llama (JaxLM, blocked attention): same tokens,
    log-probs to float32 noise."""
    from jaxcd.lm.interface import pad_prompts
    from hmm_distill.sampler import sample_continuations_with_logprobs, sample_rows_shared_prefill

    lm = _table_lm()
    prompts = [[EOS, 1, 0], [EOS], [EOS, 0], [EOS, 1, 1]]
    n = 30
    meta = run_sampling(lm, lm.params, tmp_path / "t", num_seqs=n, length=T, shard_size=n, batch_size=8,
                        seed=5, prompt_ids=prompts, progress=False)
    got = load_samples(tmp_path / "t")
    ids, lens = pad_prompts([prompts[i % len(prompts)] for i in range(n)])
    ref_t, ref_lp = sample_continuations_with_logprobs(lm, lm.params, ids, lens, sequence_keys(5, np.arange(n)),
                                                       length=T)
    np.testing.assert_array_equal(got.tokens, np.asarray(ref_t))
    np.testing.assert_array_equal(got.logprobs, np.asarray(ref_lp))
    assert meta["decode_row_steps"] <= 4 * 8 * T and meta["prefill_tokens"] == 4 * 8 * 3

    from test_lm_llama import write_tiny_gguf
    from jaxcd.lm.loading import load_lm as load_jax_lm

    write_tiny_gguf(tmp_path / "tiny.gguf", "llama", tied=True, seed=1)
    jlm, jparams = load_jax_lm(tmp_path / "tiny.gguf", attn_block=8, tokenizer=False)[:2]
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 250, size=k)) for k in (3, 11, 5, 19)]
    which = np.array([0, 1, 1, 3, 2, 0, 3, 3])
    keys = sequence_keys(1, np.arange(len(which)))
    L = 12
    toks, lps, npre = sample_rows_shared_prefill(jlm, jparams, prompts, which, keys, length=L,
                                                 prompt_bucket=4, unique_bucket=8)
    assert npre == 8 * 20  # 4 distinct prompts padded to 8 rows of 20 (19 rounded up to 4)
    ids, lens = pad_prompts([prompts[w] for w in which], length=24)  # wider padding than above
    ref_t, ref_lp = sample_continuations_with_logprobs(jlm, jparams, ids, lens, keys, length=L)
    np.testing.assert_array_equal(np.asarray(toks), np.asarray(ref_t))
    np.testing.assert_allclose(np.asarray(lps), np.asarray(ref_lp), atol=1e-4)
    assert np.asarray(toks).std() > 0


def _pool_against_reference(tmp_path, eos_boost):
    """A tiny random Llama whose EOS (token 188) gets its embedding scaled by ``eos_boost``;
    sample_pool over 23 sequences of 4 prompts must give every sequence the tokens of
    sample_continuations_with_logprobs with its own key (log-probs to float32 noise).
    Returns what the callers check further."""
    import dataclasses

    from flax import nnx
    from jaxcd.lm.interface import pad_prompts
    from jaxcd.lm.llama import JaxLM
    from jaxcd.lm.loading import load_lm as load_jax_lm
    from test_lm_llama import write_tiny_gguf
    from hmm_distill.sampler import sample_continuations_with_logprobs, sample_pool

    write_tiny_gguf(tmp_path / "tiny.gguf", "llama", tied=True, seed=1)
    base, base_params = load_jax_lm(tmp_path / "tiny.gguf", attn_block=8, tokenizer=False)[:2]
    pure = nnx.to_pure_dict(base_params)
    E = np.array(pure["embed"]["embedding"])
    E[188] *= eos_boost
    pure["embed"]["embedding"] = E
    jlm = JaxLM(dataclasses.replace(base.config, eos_token_id=188), attn_block=8)
    jparams = jlm.params_from_pure_dict(pure)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 250, size=k)) for k in (3, 11, 5, 19)]
    n, L = 23, 10
    seq_ids = np.arange(n) + 100
    which = seq_ids % 4
    out = {}
    st = sample_pool(jlm, jparams, prompts, seq_ids, which, 7, length=L, batch_size=4, chunk=3, group=2,
                     prompt_bucket=4, on_done=lambda j, t, lq: out.__setitem__(j, (t, lq)))
    assert sorted(out) == list(range(n))
    ids, lens = pad_prompts([prompts[w] for w in which])
    ref_t, ref_lp = sample_continuations_with_logprobs(jlm, jparams, ids, lens, sequence_keys(7, seq_ids),
                                                       length=L)
    got = np.stack([out[j][0] for j in range(n)])
    np.testing.assert_array_equal(got, np.asarray(ref_t))
    np.testing.assert_allclose(np.stack([out[j][1] for j in range(n)]), np.asarray(ref_lp), atol=1e-4)
    return jlm, prompts, n, L, seq_ids, which, out, st, got, jparams


def test_continuous_batching_equals_batch_sampling(tmp_path):
    """sample_pool (JaxLM): rows refilled as their continuations end (only those rows of the
    cache written), prompts placed at the pool's current cache slot, caches moved left
    when full; every sequence gets the tokens of sample_continuations_with_logprobs with
    its own key (log-probs to float32 noise), and exactly what the whole-cache refill gives. A tiny random Llama whose EOS is made likely (so rows end at different steps)."""
    from hmm_distill.sampler import sample_pool

    jlm, prompts, n, L, seq_ids, which, out, st, got, jparams = _pool_against_reference(
        tmp_path, eos_boost=3.0)
    assert st["shifts"] > 0
    assert st["refills"] == n and st["refill_calls"] > st["shifts"]
    # the whole-cache refill (the earlier method) gives the same draws, bit for bit
    out_copy = {}
    sample_pool(jlm, jparams, prompts, seq_ids, which, 7, length=L, batch_size=4, chunk=3, group=2,
                prompt_bucket=4, refill="copy", on_done=lambda j, t, lq: out_copy.__setitem__(j, (t, lq)))
    for j in range(n):
        np.testing.assert_array_equal(out_copy[j][0], out[j][0])
        np.testing.assert_array_equal(out_copy[j][1], out[j][1])
    ended = (got == 188).any(1)
    assert 0.3 < ended.mean() < 1  # rows end at different steps, some at the cap
    # run_sampling: continuous (default for a JaxLM) and batched give the same shards
    kw = dict(num_seqs=n, length=L, shard_size=12, batch_size=4, seed=3, prompt_ids=prompts, progress=False)
    m1 = run_sampling(jlm, jparams, tmp_path / "c", **kw)
    run_sampling(jlm, jparams, tmp_path / "b", continuous=False, **kw)
    a, b = load_samples(tmp_path / "c"), load_samples(tmp_path / "b")
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert m1["decode_row_steps"] > 0 and m1["eos_fraction"] == pytest.approx((a.tokens == 188).any(1).mean())


def test_continuous_batching_long_tail_stays_inside_the_cache(tmp_path):
    """Long continuations (EOS less likely than above): after the last refill the live
    rows keep decoding chunk after chunk, so the cache must be moved left without a
    refill too (a write past the last slot would be clamped onto it and silently change
    the draws). Every sequence still equals sample_continuations_with_logprobs."""
    st = _pool_against_reference(tmp_path, eos_boost=2.0)[7]
    assert st["tail_shifts"] > 0


def test_two_pools_in_threads_equal_batch_sampling(tmp_path):
    """run_sampling(pools=2): the shard's sequences split by prompt into two pools sampled
    in two threads; every sequence still gets the tokens of the batched sampler
    (sample_continuations_with_logprobs with its own key; log-probs to float32 noise),
    and each prompt is prefilled in one pool only."""
    from hmm_distill.sampler import split_by_prompt

    jlm, prompts, *_, jparams = _pool_against_reference(tmp_path, eos_boost=3.0)
    which = np.array([0, 0, 2, 2, 1, 3, 3, 3, 1])
    parts = split_by_prompt(which, 2)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(which)))
    assert all(np.all(np.diff(p) > 0) for p in parts)  # original order kept
    assert not set(which[parts[0]]) & set(which[parts[1]])  # a prompt lives in one part
    assert [len(p) for p in split_by_prompt(which, 9)] == [2, 2, 2, 3]  # empty parts dropped
    kw = dict(num_seqs=29, length=10, shard_size=29, batch_size=4, seed=5, prompt_ids=prompts, progress=False)
    m2 = run_sampling(jlm, jparams, tmp_path / "p2", pools=2, **kw)
    run_sampling(jlm, jparams, tmp_path / "b", continuous=False, **kw)
    a, b = load_samples(tmp_path / "p2"), load_samples(tmp_path / "b")
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert m2["pools"] == 2 and 0 < m2["eos_fraction"] < 1
    with pytest.raises(ConfigError):
        run_sampling(jlm, jparams, tmp_path / "p0", pools=0, **kw)


def test_pools_stop_when_one_fails(tmp_path, monkeypatch):
    """With pools=2, a pool that raises stops the other at its next chunk (instead of
    letting it finish its whole part), and the caller gets the real error."""
    import time
    import types

    import hmm_distill.sampler as S

    chunks = []

    def fake_pool(lm, params, prompt_ids, idx, which, seed, *, on_chunk=None, **kw):
        if 1 in set(np.asarray(which).tolist()):          # the pool holding prompt 1 fails
            raise ValueError("boom")
        for _ in range(2000):                              # the other "decodes" 2000 chunks
            time.sleep(0.001)
            chunks.append(1)
            on_chunk()
        return {"prefill_tokens": 0, "decode_row_steps": 0}

    monkeypatch.setattr(S, "sample_pool", fake_pool)
    lm = types.SimpleNamespace(vocab_size=10, eos_token_id=2)
    with pytest.raises(ValueError, match="boom"):
        S.run_sampling(lm, None, tmp_path / "x", num_seqs=8, length=4, shard_size=8, batch_size=4,
                       prompt_ids=[[1], [3], [4], [5]], progress=False, continuous=True, pools=2)
    assert 1 <= len(chunks) < 100


def test_pool_memory_is_estimated_before_sampling(tmp_path, monkeypatch):
    """run_sampling estimates the pools' peak memory from the LM state's shapes before it
    samples (the KV cache of every row: its real size, measured here by a real prefill);
    when the estimate exceeds the available memory it raises MemoryEstimateError naming
    both, instead of the process being killed, and writes no shard."""
    from hmm_distill import em
    from hmm_distill.errors import MemoryEstimateError
    from hmm_distill.sampler import pool_memory_bytes

    jlm, prompts, *_, jparams = _pool_against_reference(tmp_path, eos_boost=3.0)
    P, T, B = max(len(p) for p in prompts), 10, 4
    S = jlm.cache_slots(P + T + 16)
    st, lp = jlm.prefill(jparams, jnp.zeros((B, P), jnp.int32), jnp.full((B,), P, jnp.int32), S)
    real = sum(x.nbytes for x in jax.tree.leaves((st, lp)))
    est = pool_memory_bytes(jlm, jparams, batch_size=B, max_prompt_len=P, length=T)
    assert est >= 2 * real
    assert pool_memory_bytes(jlm, jparams, batch_size=2 * B, max_prompt_len=P, length=T) > est

    kw = dict(num_seqs=8, length=T, shard_size=8, batch_size=B, seed=5, prompt_ids=prompts, progress=False)
    monkeypatch.setattr(em, "available_memory_bytes", lambda device=None: est // 2)
    with pytest.raises(MemoryEstimateError, match=r"GiB are available: lower --batch-size"):
        run_sampling(jlm, jparams, tmp_path / "small", **kw)
    assert not list((tmp_path / "small").glob("*.npy"))
    monkeypatch.setattr(em, "available_memory_bytes", lambda device=None: 4 * est)
    meta = run_sampling(jlm, jparams, tmp_path / "ok", **kw)
    assert meta["complete"] and load_samples(tmp_path / "ok").tokens.shape == (8, T)
