"""Latent-variable initialisation: the recorded token features, k-means, the counts.

References: the features against a prefix-by-prefix recomputation from the LM's own
table (TableLM) and, for the tiny Llama, against teacher-forced log-probabilities;
k-means against scipy's Lloyd iterations from the same starting centres; the counts
against a loop over positions; the whole initialisation against an HMM whose hidden
states the features reveal."""

from __future__ import annotations

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from scipy.cluster.vq import kmeans2

from hmm_distill import hmm as F
from hmm_distill.data import load_features, load_samples
from hmm_distill.errors import SampleDataError, SampleDirMismatchError
from hmm_distill.lms import table_fingerprint
from hmm_distill.lvd import assign, kmeans, lvd_counts, lvd_init, params_from_counts
from hmm_distill.priors import first_eos_mask
from hmm_distill.sampler import feature_projection, run_sampling, token_features
from hmm_distill.train import TrainConfig, train
from jaxcd.lm.interface import TableLM

V, EOS, T = 3, 2, 4


def _table_lm():
    from test_hmm_sampler import _prefix_probs

    return TableLM.from_function(_prefix_probs, V, depth=T, eos_token_id=EOS), _prefix_probs


def _ref_feature(fn, prefix, R):
    p = np.asarray(fn(tuple(prefix)), np.float64)
    lp = np.log(p / p.sum())
    return (lp - lp.mean()) @ R


@pytest.mark.parametrize("batch_size", [4, 16])
def test_features_are_the_projected_centred_logprobs_of_each_prefix(tmp_path, batch_size):
    lm, fn = _table_lm()
    D = 5
    meta = run_sampling(lm, lm.params, tmp_path / "s", num_seqs=30, length=T, shard_size=12,
                        batch_size=batch_size, seed=2, fingerprint=table_fingerprint(V, EOS),
                        progress=False, features=D)
    assert meta["features"] == D and all(s["features"] for s in meta["shards"])
    data = load_samples(tmp_path / "s")
    R = np.asarray(feature_projection(V, D, 2), np.float64)
    off = 0
    for s in meta["shards"]:
        f = np.asarray(load_features(tmp_path / "s" / s["features"], (s["num_seqs"], T)), np.float64)
        tok = data.tokens[off:off + s["num_seqs"]]
        m = first_eos_mask(tok, EOS)
        for i in range(tok.shape[0]):
            for t in range(T):
                if m[i, t]:
                    np.testing.assert_allclose(f[i, t], _ref_feature(fn, tok[i, :t], R), rtol=2e-3, atol=2e-3)
                else:
                    assert not f[i, t].any()  # 0 after the first EOS
        off += s["num_seqs"]
    # a resume asking for other features is refused
    with pytest.raises(SampleDirMismatchError, match="features"):
        run_sampling(lm, lm.params, tmp_path / "s", num_seqs=30, length=T, shard_size=12,
                     batch_size=batch_size, seed=2, fingerprint=table_fingerprint(V, EOS),
                     progress=False, features=3)


def test_continuous_batching_records_the_teacher_forced_features(tmp_path):
    """Tiny random Llama, continuous batching (rows refilled mid-run): every recorded
    feature equals token_features of the log-probabilities the model gives that prefix
    when the prompt and the drawn tokens are fed at once (float16 storage)."""
    from jaxcd.decoding.buckets import pad_prompts
    from jaxcd.lm.loading import load_lm as load_jax_lm
    from test_lm_llama import write_tiny_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf", "llama", tied=True, seed=1)
    jlm, jparams = load_jax_lm(tmp_path / "tiny.gguf", attn_block=8, tokenizer=False)[:2]
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 250, size=k)) for k in (3, 11, 5)]
    D, L, n = 6, 7, 9
    meta = run_sampling(jlm, jparams, tmp_path / "s", num_seqs=n, length=L, shard_size=n, batch_size=4,
                        seed=5, prompt_ids=prompts, progress=False, features=D)
    assert meta["decode_row_steps"] > 0
    data = load_samples(tmp_path / "s")
    feats = np.asarray(load_features(tmp_path / "s" / meta["shards"][0]["features"], (n, L)), np.float32)
    R = feature_projection(jlm.vocab_size, D, 5)
    eos = jlm.eos_token_id
    for i in range(n):
        p = prompts[i % len(prompts)]
        valid = int(first_eos_mask(data.tokens[i:i + 1], eos).sum())
        full = p + data.tokens[i, :valid - 1].tolist()
        ids, lens = pad_prompts([full])
        lp = np.asarray(jlm.logprobs_all(jparams, ids, lens))[0]  # [P, V]: after each position
        ref = np.asarray(token_features(jnp.asarray(lp[len(p) - 1:len(p) - 1 + valid]), R))
        scale = np.abs(ref).max()
        np.testing.assert_allclose(feats[i, :valid], ref, atol=2e-3 * scale + 1e-3)
        assert not feats[i, valid:].any()


def test_kmeans_matches_scipy_lloyd_from_the_same_centres():
    rng = np.random.default_rng(1)
    # overlapping clusters: Lloyd's path from given centres is not trivial
    X = np.concatenate([rng.normal(c, 0.9, size=(200, 3)) for c in ((0, 0, 0), (3, 0, 0), (0, 3, 1), (2, 2, 2))])
    X = X.astype(np.float32)
    init = X[[0, 1, 2, 3, 500]]  # a poor start: four centres in one cluster
    C, info = kmeans(X, 5, key=jax.random.key(0), iters=200, init=init)
    C2, lab2 = kmeans2(X.astype(np.float64), init.astype(np.float64), minit="matrix", iter=200)
    lab, _ = assign(X, C)
    np.testing.assert_array_equal(lab, lab2)
    np.testing.assert_allclose(C, C2, atol=1e-4)
    assert info["iterations"] > 3
    # well separated clusters from the k-means++ seeding: recovered exactly
    X = np.concatenate([rng.normal(c, 0.3, size=(200, 3)) for c in ((0, 0, 0), (4, 0, 0), (0, 4, 1), (3, 3, 3))])
    X = X.astype(np.float32)
    C, info = kmeans(X, 4, key=jax.random.key(0), iters=100)
    lab, _ = assign(X, C)
    blocks = lab.reshape(4, 200)
    assert all(len(set(b)) == 1 for b in blocks) and len({b[0] for b in blocks}) == 4
    assert info["empty"] == 0 and info["inertia"] == pytest.approx(((X - C[lab]) ** 2).sum(1).mean(), rel=1e-4)


def test_kmeans_more_clusters_than_distinct_points_and_bad_input():
    X = np.repeat(np.eye(3, dtype=np.float32), 5, axis=0)
    C, _ = kmeans(X, 5, key=jax.random.key(1))
    lab, d = assign(X, C)
    assert np.allclose(d, 0)  # every point sits on a centre
    with pytest.raises(SampleDataError, match="NaN"):
        kmeans(np.array([[np.nan, 0.0]], np.float32), 1, key=jax.random.key(0))


def test_counts_equal_a_loop_over_positions():
    rng = np.random.default_rng(3)
    H, Vb, D = 3, 6, 2
    C = np.array([[0, 0], [5, 0], [0, 5]], np.float32)
    tokens = rng.integers(0, Vb, size=(7, 5))
    tokens[:, 3] = np.where(rng.random(7) < 0.5, 5, tokens[:, 3])  # EOS = 5 at times
    mask = first_eos_mask(tokens, 5)
    z_true = rng.integers(0, H, size=tokens.shape)
    feats = C[z_true] + rng.normal(0, 0.1, size=tokens.shape + (D,)).astype(np.float32)
    chunks = [(tokens[:4], mask[:4], feats[:4]), (tokens[4:], mask[4:], feats[4:])]
    start, trans, emit, tok = lvd_counts(chunks, C, H, Vb)
    s_ref, t_ref, e_ref = np.zeros(H), np.zeros((H, H)), np.zeros((H, Vb))
    for i in range(tokens.shape[0]):
        for t in range(tokens.shape[1]):
            if not mask[i, t]:
                continue
            e_ref[z_true[i, t], tokens[i, t]] += 1
            if t == 0:
                s_ref[z_true[i, t]] += 1
            if t + 1 < tokens.shape[1] and mask[i, t + 1]:
                t_ref[z_true[i, t], z_true[i, t + 1]] += 1
    np.testing.assert_array_equal(start, s_ref)
    np.testing.assert_array_equal(trans, t_ref)
    np.testing.assert_array_equal(emit, e_ref)
    np.testing.assert_array_equal(tok, np.bincount(tokens[mask], minlength=Vb))
    p = params_from_counts(start, trans, emit, tok, pseudocount=0.5, smoothing=0.1)
    u = (tok + 1) / (tok.sum() + Vb)
    B_ref = 0.9 * e_ref / e_ref.sum(1, keepdims=True) + 0.1 * u
    np.testing.assert_allclose(np.asarray(p.B), B_ref, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(p.A), (t_ref + 0.5) / (t_ref + 0.5).sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(p.pi), (s_ref + 0.5) / (s_ref + 0.5).sum(), rtol=1e-5)


def _planted_hmm(H=4, Vb=12, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.dirichlet(np.full(H, 0.3), size=H)
    B = rng.dirichlet(np.full(Vb, 0.2), size=H)
    pi = rng.dirichlet(np.ones(H))
    return F.as_params(pi, A, B)


def test_lvd_recovers_an_hmm_whose_states_the_features_reveal():
    """Features = a noisy code of the true hidden state: LVD's initial model is the true
    HMM up to a relabelling, to the sampling error of 4000 sequences."""
    H, Vb, N, L = 4, 12, 4000, 12
    true = _planted_hmm(H, Vb)
    key = jax.random.key(0)
    toks, states = F.sample(true, key, N, L)
    toks, states = np.asarray(toks), np.asarray(states)
    code = np.eye(H, dtype=np.float32) * 10
    feats = code[states] + np.random.default_rng(1).normal(0, 0.5, size=states.shape + (H,)).astype(np.float32)
    mask = np.ones(toks.shape, bool)
    params, info = lvd_init(lambda: [(toks[:2000], mask[:2000], feats[:2000]),
                                     (toks[2000:], mask[2000:], feats[2000:])],
                            H, Vb, seed=0, pseudocount=0.0, smoothing=1e-6)
    assert info["tokens"] == N * L and info["states_used"] == H
    B = np.asarray(params.B)
    # true state h -> the LVD state whose emissions are nearest (a permutation)
    perm = np.array([np.abs(B - np.asarray(true.B)[h]).sum(1).argmin() for h in range(H)])
    assert len(set(perm.tolist())) == H
    # standard errors: B rows from >= N*L/H/3 tokens each; 5 sigma of a proportion <= 0.5
    n_min = np.bincount(states.ravel(), minlength=H).min()
    tol = 5 * np.sqrt(0.25 / n_min) + 1e-3
    np.testing.assert_allclose(B[perm], np.asarray(true.B), atol=tol)
    np.testing.assert_allclose(np.asarray(params.A)[np.ix_(perm, perm)], np.asarray(true.A), atol=2 * tol)


def test_train_with_lvd_init_from_sampled_features(tmp_path):
    lm, _ = _table_lm()
    run_sampling(lm, lm.params, tmp_path / "s", num_seqs=200, length=T, shard_size=64, batch_size=32, seed=0,
                 fingerprint=table_fingerprint(V, EOS), progress=False, features=4)
    res = train(TrainConfig(data=str(tmp_path / "s"), out=str(tmp_path / "run"), hidden_size=3, epochs=2,
                            init="lvd", mode="full", plot=False, progress=False), log=lambda *a: None)
    assert len(res.metrics) == 3 and np.isfinite(res.metrics[-1]["heldout_ll"])
    # no features recorded: a clear error
    run_sampling(lm, lm.params, tmp_path / "nf", num_seqs=20, length=T, shard_size=64, batch_size=32, seed=0,
                 fingerprint=table_fingerprint(V, EOS), progress=False)
    with pytest.raises(SampleDataError, match="--features"):
        train(TrainConfig(data=str(tmp_path / "nf"), out=str(tmp_path / "run2"), hidden_size=3, epochs=1,
                          init="lvd", plot=False, progress=False), log=lambda *a: None)


def test_continuations_per_prompt(tmp_path):
    """c consecutive sequences share a prompt: the same draws as c = 1 over the prompt list
    with each prompt repeated c times (tiny random Llama: the draws depend on the prompt)."""
    from jaxcd.lm.loading import load_lm as load_jax_lm
    from test_lm_llama import write_tiny_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf", "llama", tied=True, seed=1)
    jlm, jparams = load_jax_lm(tmp_path / "tiny.gguf", attn_block=8, tokenizer=False)[:2]
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, 250, size=k)) for k in (3, 9, 5)]
    kw = dict(num_seqs=14, length=5, shard_size=7, batch_size=4, seed=1, progress=False)
    m = run_sampling(jlm, jparams, tmp_path / "a", prompt_ids=prompts, continuations_per_prompt=3, **kw)
    run_sampling(jlm, jparams, tmp_path / "b", prompt_ids=[p for p in prompts for _ in range(3)], **kw)
    assert m["continuations_per_prompt"] == 3
    a, b = load_samples(tmp_path / "a"), load_samples(tmp_path / "b")
    np.testing.assert_array_equal(a.tokens, b.tokens)
    with pytest.raises(SampleDirMismatchError, match="continuations_per_prompt"):
        run_sampling(jlm, jparams, tmp_path / "a", prompt_ids=prompts, continuations_per_prompt=2, **kw)


DEVICES_SCRIPT = r"""
import json, sys
import numpy as np, jax
sys.path.insert(0, sys.argv[2])
from test_lm_llama import write_tiny_gguf
from jaxcd.lm.loading import load_lm as load_jax_lm
from hmm_distill.data import load_features, load_samples
from hmm_distill.sampler import run_sampling
assert len(jax.devices()) == 2, jax.devices()
d = sys.argv[1]
write_tiny_gguf(d + "/tiny.gguf", "llama", tied=True, seed=1)
jlm, jparams = load_jax_lm(d + "/tiny.gguf", attn_block=8, tokenizer=False)[:2]
rng = np.random.default_rng(0)
prompts = [list(map(int, rng.integers(1, 250, size=k))) for k in (3, 9, 5, 12)]
kw = dict(num_seqs=20, length=6, shard_size=10, batch_size=4, seed=2, prompt_ids=prompts, progress=False,
          features=4)
run_sampling(jlm, jparams, d + "/one", pools=2, **kw)
import hmm_distill.sampler as S
seen, orig = [], S.sample_pool
def spy(lm, params, *a, **k):
    seen.append(sorted({dv.id for x in jax.tree.leaves(params) for dv in x.devices()}))
    return orig(lm, params, *a, **k)
S.sample_pool = spy
m = run_sampling(jlm, jparams, d + "/two", devices=jax.devices(), **kw)
a, b = load_samples(d + "/one"), load_samples(d + "/two")
fa = [np.asarray(load_features(__import__("pathlib").Path(d) / x / s["features"], (10, 6)), np.float32)
      for x in ("one", "two") for s in m["shards"]]
print("RESULT " + json.dumps({"tokens_equal": bool((a.tokens == b.tokens).all()),
                              "lp_diff": float(np.abs(a.logprobs - b.logprobs).max()),
                              "feat_diff": float(max(np.abs(fa[0] - fa[2]).max(), np.abs(fa[1] - fa[3]).max())),
                              "pools": m["pools"], "devices": sorted(map(tuple, seen))}))
"""


def test_sampling_on_two_devices_equals_two_pools_on_one(tmp_path):
    """One pool per device (data-parallel sampling over local devices): the same draws,
    log-probabilities and features as two pools on one device (4 forced host devices
    need their own process)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    env["JAX_PLATFORMS"] = "cpu"
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", DEVICES_SCRIPT, str(tmp_path), str(root / "tests")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert out["tokens_equal"] and out["lp_diff"] < 1e-4 and out["feat_diff"] < 1e-2 and out["pools"] == 2, out
    assert sorted({d for ds in out["devices"] for d in ds}) == [0, 1], out  # each pool's weights on its device
