"""jaxcd.decoding.sampling.categorical (blocked inverse CDF) against the exact softmax.

Distributional checks with fixed seeds: Pearson chi-square of the sampled counts
against ``N · softmax(logits)`` (cells with expected count < 5 pooled), accepted at
p-value > 1e-3; the statistic's null distribution is what makes the tolerance depend
on the sample size. Zero-probability tokens (``-inf`` logits, as after a GCD mask)
must never be drawn.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxcd.decoding.sampling import _pick, categorical, categorical_with_logprob

draw = jax.jit(categorical, static_argnames=("block",))


def sample_counts(logits: np.ndarray, n: int, seed: int, rows: int = 4096, block: int = 256):
    """Counts over ``V`` of ``n`` draws from one logits row (batched ``rows`` at a time)."""
    V = logits.shape[0]
    batch = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (rows, V))
    key = jax.random.PRNGKey(seed)
    counts = np.zeros(V, np.int64)
    for i in range(-(-n // rows)):
        toks = np.asarray(draw(jax.random.fold_in(key, i), batch, block=block))
        counts += np.bincount(toks, minlength=V)[:V]
    return counts


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    exp = n * probs
    big = exp >= 5
    obs_c = np.append(counts[big], counts[~big].sum())
    exp_c = np.append(exp[big], exp[~big].sum())
    if exp_c[-1] < 5:                      # pooled cell too small: merge it into the largest
        k = np.argmax(exp_c[:-1])
        obs_c[k] += obs_c[-1]
        exp_c[k] += exp_c[-1]
        obs_c, exp_c = obs_c[:-1], exp_c[:-1]
    stat = ((obs_c - exp_c) ** 2 / exp_c).sum()
    return float(stats.chi2.sf(stat, df=len(exp_c) - 1))


def softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


@pytest.mark.parametrize("V,block", [(1000, 256), (300, 256), (64, 256), (4096, 64)])
def test_matches_softmax(V, block):
    rng = np.random.default_rng(V)
    logits = rng.normal(0, 2.5, V)                 # a wide range of probabilities
    logits[rng.random(V) < 0.3] = -np.inf          # a GCD-like mask
    n = 200_000
    counts = sample_counts(logits, n, seed=V, block=block)
    assert counts[~np.isfinite(logits)].sum() == 0
    p = softmax(logits)
    assert chi_square_pvalue(counts, p) > 1e-3
    # the most likely tokens individually: within 5 binomial standard deviations
    top = np.argsort(-p)[:20]
    sd = np.sqrt(n * p[top] * (1 - p[top]))
    assert np.all(np.abs(counts[top] - n * p[top]) < 5 * sd)


def test_full_vocabulary_block_masses():
    """V = 49152 (SmolLM2): chi-square over the 192 blocks and over the tokens of the
    heaviest block, i.e. both levels of the two-level draw."""
    V = 49152
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 3.0, V)
    logits[rng.random(V) < 0.5] = -np.inf
    n = 30_720                  # expected counts: >= 9.6 per block, >= 24 per heavy token
    counts = sample_counts(logits, n, seed=3, rows=1024)
    assert counts[~np.isfinite(logits)].sum() == 0
    p = softmax(logits)
    assert chi_square_pvalue(counts.reshape(-1, 256).sum(1), p.reshape(-1, 256).sum(1)) > 1e-3
    heavy = np.argsort(-p)[:200]
    probs = np.append(p[heavy], 1 - p[heavy].sum())
    obs = np.append(counts[heavy], n - counts[heavy].sum())
    assert chi_square_pvalue(obs, probs) > 1e-3


def test_single_allowed_token_and_tiny_probabilities():
    V = 700                                         # last block padded
    for only in (0, 255, 256, 699):
        logits = np.full((8, V), -np.inf, np.float32)
        logits[:, only] = 0.0
        toks = np.asarray(draw(jax.random.PRNGKey(only), jnp.asarray(logits)))
        assert np.all(toks == only)
    # one token with relative probability e^-30 next to a dominant one: never drawn in
    # 40k draws (expected 4e-9 draws), and no masked token ever
    logits = np.full(V, -np.inf, np.float32)
    logits[[3, 500]] = [30.0, 0.0]
    counts = sample_counts(logits, 40_960, seed=11, rows=4096)
    assert counts[3] == 40_960


def test_pick_clamps_rounded_up_uniform():
    """A uniform that rounds up to the total picks the last positive entry, never a
    trailing zero-probability one."""
    w = jnp.asarray([[0.5, 0.0, 0.25, 0.0, 0.0]], jnp.float32)
    c = jnp.cumsum(w, axis=-1)
    assert int(_pick(c, w, c[:, -1:])[0]) == 2
    assert int(_pick(c, w, jnp.zeros((1, 1)))[0]) == 0
    assert int(_pick(c, w, jnp.full((1, 1), 0.5))[0]) == 2      # c_0 = 0.5 is not > 0.5


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        categorical(jax.random.PRNGKey(0), jnp.zeros(10))


def test_logprob_of_drawn_token_is_log_softmax():
    """The returned log-probability equals log softmax(logits)[token] (float64
    reference); rows with no finite logit give -inf."""
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 4.0, (64, 1000)).astype(np.float32)
    logits[rng.random(logits.shape) < 0.4] = -np.inf
    logits[7] = -np.inf
    tok, lp = jax.jit(categorical_with_logprob)(jax.random.PRNGKey(2), jnp.asarray(logits))
    tok, lp = np.asarray(tok), np.asarray(lp)
    x = logits.astype(np.float64)
    for b in range(64):
        if b == 7:
            assert lp[b] == -np.inf
            continue
        ref = x[b, tok[b]] - (np.log(np.exp(x[b] - x[b].max()).sum()) + x[b].max())
        assert np.isfinite(x[b, tok[b]]) and abs(lp[b] - ref) < 1e-5
