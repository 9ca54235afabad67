"""Data-scaled priors: full-batch EM's training log-likelihood never decreases with the
default prior (toy data and V = 49152 with few tokens per state), the penalised
log-likelihood is monotone (EM-MAP guarantee), the old flat pseudocount drowns the data
at V = 49152; the EOS mask; the training job's gap share against stored LM log-probs."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmm_distill import hmm as F
from hmm_distill.data import logprobs_name, write_samples
from hmm_distill.em import EM, full_batch_em, pad_batch
from hmm_distill.init import cluster_init, random_init
from hmm_distill.priors import data_prior, first_eos_mask, flat_prior, unigram
from hmm_distill.train import TrainConfig, train


def _em_with_objective(p0, X, mask, prior, iterations, engine=None):
    """Full-batch EM; returns (log-likelihood history, penalised history)."""
    thetas = [F.as_params(*p0)]

    def cb(it, params, total):
        thetas.append(F.from_token_major(params))

    _, hist = full_batch_em(p0, [pad_batch(X, mask, X.shape[0])], iterations=iterations,
                            pseudocount=prior, engine=engine or EM(), callback=cb)
    pen = [h + prior.log_density(t) for h, t in zip(hist, thetas)]
    return np.array(hist), np.array(pen)


def test_default_prior_monotone_on_toy_data():
    cfg = TrainConfig(data="x")
    rng = np.random.default_rng(5)
    H, V, T = 5, 12, 20
    X = rng.integers(0, V, (64, T))
    X[:, ::3] = rng.integers(0, 3, (64, (T + 2) // 3))
    X[:10, 15:] = V - 1  # some rows end early (EOS = V-1), the padding is masked
    mask = first_eos_mask(X, V - 1)
    prior = data_prior(X, mask, H, V, strength=cfg.prior_strength, unigram_smoothing=cfg.unigram_smoothing)
    with jax.enable_x64(True):
        p0 = random_init(jax.random.key(0), H, V, dtype=jnp.float64)
        hist, pen = _em_with_objective(p0, X, mask, prior, 25)
    assert np.all(np.diff(hist) >= -1e-9 * abs(hist[0])), np.diff(hist)
    assert np.all(np.diff(pen) >= -1e-9 * abs(pen[0])), np.diff(pen)
    assert hist[-1] > hist[0] + 1.0


def np_hmm_sample(pi, A, B, n, T, seed):
    """``n`` token sequences of length ``T`` from the HMM ``(pi, A, B)`` (numpy arrays,
    rows normalised), drawn with numpy by inverse CDF (test data; JAX's eager sampler
    costs seconds of compilation per call)."""
    rng = np.random.default_rng(seed)
    pi, A, B = (np.asarray(x, np.float64) for x in (pi, A, B))
    cA, cB = np.cumsum(A, 1), np.cumsum(B, 1)

    def draw(c, rows):  # one index per row of c[rows] (rows of a cumulative table)
        u = rng.random(len(rows))[:, None] * c[rows, -1:]
        return np.minimum((c[rows] <= u).sum(1), c.shape[1] - 1)

    h = draw(np.cumsum(pi)[None], np.zeros(n, int))
    X = np.empty((n, T), np.int64)
    for t in range(T):
        X[:, t] = draw(cB, h)
        h = draw(cA, h)
    return X


def np_token_logprobs(pi, A, B, X):
    """``log p(x_t | x_<t)`` ``[N, T]`` under the HMM, by the scaled forward recursion in
    numpy (float64)."""
    pi, A, B = (np.asarray(x, np.float64) for x in (pi, A, B))
    alpha = np.broadcast_to(pi, (X.shape[0], len(pi)))
    out = np.empty(X.shape)
    for t in range(X.shape[1]):
        a = (alpha if t == 0 else alpha @ A) * B[:, X[:, t]].T
        c = a.sum(1)
        out[:, t], alpha = np.log(c), a / c[:, None]
    return out


def _np_random_params(rng, H, V, noise):
    def soft(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return soft(noise * rng.normal(size=H)), soft(noise * rng.normal(size=(H, H))), soft(noise * rng.normal(size=(H, V)))


def _zipf_planted(V, n, T, seed=0, true_h=8, support=3000):
    rng = np.random.default_rng(seed)
    pi = np.full(true_h, 1 / true_h)
    A = rng.dirichlet(np.full(true_h, 0.3), true_h)
    B = np.zeros((true_h, V))
    for h in range(true_h):
        idx = rng.choice(V, support, replace=False)
        w = 1 / np.arange(1, support + 1) ** 1.1
        B[h, idx] = w / w.sum()
    return np_hmm_sample(pi, A, B, n, T, seed)


def test_default_prior_monotone_at_realistic_vocabulary():
    """V = 49152, H = 16, 96 x 32 = 3072 tokens (192 per state, most tokens unseen):
    with the default data-scaled prior the training log-likelihood rises at every
    iteration; the former flat pseudocount 0.01 (491 pseudo-tokens per state, 2.6x the
    data) makes it fall after the first M-step."""
    V, H, N, T = 49152, 16, 96, 32
    X = _zipf_planted(V, N, T)
    mask = np.ones_like(X, bool)
    cfg = TrainConfig(data="x")
    prior = data_prior(X, mask, H, V, strength=cfg.prior_strength, unigram_smoothing=cfg.unigram_smoothing)
    assert prior.row_mass(H, V)["emit_row"] == pytest.approx(cfg.prior_strength * N * T / H, rel=1e-6)
    p0 = cluster_init(X, H, V, seed=0)
    eng = EM()
    hist, pen = _em_with_objective(p0, X, mask, prior, 8, eng)
    assert np.all(np.diff(hist) > 0), np.diff(hist)
    assert np.all(np.diff(pen) >= -1e-6 * abs(pen[0])), np.diff(pen)  # float32
    flat, _ = _em_with_objective(p0, X, mask, flat_prior(0.01, 0.01), 2, eng)
    assert flat[1] < flat[0] - 100, flat


def test_first_eos_mask_and_unigram():
    X = np.array([[1, 2, 9, 9, 9], [9, 9, 9, 9, 9], [1, 2, 3, 4, 5], [3, 9, 1, 9, 2]])
    m = first_eos_mask(X, 9)
    ref = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
    np.testing.assert_array_equal(m, ref)
    u = unigram(X, m, 10, 0.5)
    c = np.zeros(10)
    for row, mr in zip(X, ref):
        for x, ok in zip(row, mr):
            c[x] += ok
    np.testing.assert_allclose(u, (c + 0.5) / (c.sum() + 5.0))


def test_train_reports_gap_share_from_lm_logprobs(tmp_path):
    """The job's held-out LM log-likelihood is the mean stored log-prob over the valid
    held-out tokens, the unigram baseline the add-β unigram of the training tokens, and
    gap share = (HMM - unigram) / (LM - unigram)."""
    rng = np.random.default_rng(0)
    V, T, N = 20, 10, 60
    true = _np_random_params(rng, 3, V, 2.0)
    X = np_hmm_sample(*true, N, T, 4)
    lp = np_token_logprobs(*true, X).astype(np.float32)  # log p(x_t | x_<t) under the "LM"
    eos = V - 1
    mask = first_eos_mask(X, eos)
    lp = np.where(mask, lp, 0.0).astype(np.float32)
    d = tmp_path / "data"
    write_samples(d, X, vocab_size=V, eos_token_id=eos, fingerprint="toy")
    np.save(d / logprobs_name(0), lp)
    meta = json.loads((d / "metadata.json").read_text())
    meta["shards"][0]["logprobs"] = logprobs_name(0)
    (d / "metadata.json").write_text(json.dumps(meta))
    cfg = TrainConfig(data=str(d), out=str(tmp_path / "run"), hidden_size=3, epochs=2, batch_size=16,
                      plot=False, progress=False, heldout_frac=0.25, mode="full")
    res = train(cfg, log=lambda *a: None)
    m = res.metrics[-1]
    from hmm_distill.train import heldout_split

    tr, ho = heldout_split(N, 0.25, 0)
    assert m["lm_heldout_ll"] == pytest.approx(float(lp[ho][mask[ho]].mean()), rel=1e-6)
    u = unigram(X[tr], mask[tr], V, cfg.unigram_smoothing)
    assert m["unigram_heldout_ll"] == pytest.approx(float(np.log(u)[X[ho][mask[ho]]].mean()), rel=1e-9)
    hmm_ll = float(np.sum(np_token_logprobs(*res.params, X[ho]) * mask[ho]) / mask[ho].sum())
    assert m["heldout_ll"] == pytest.approx(hmm_ll, rel=1e-5)
    assert m["gap_share"] == pytest.approx((hmm_ll - m["unigram_heldout_ll"])
                                           / (m["lm_heldout_ll"] - m["unigram_heldout_ll"]), rel=1e-4)
