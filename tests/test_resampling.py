"""Resamplers (jaxcd.decoding.resampling): counts match K·w (chi-square / exact
floor-ceil bounds / unbiasedness within standard errors), a zero-weight index is never returned (adversarial
float32 and float64 inputs and hand-placed uniforms), ESS and log-mean-exp equal numpy
float64 references, and systematic/stratified agree index for index with blackjax's
resamplers (same key, same uniforms) on weights without zeros.

Every statistical check runs the resampler on an ``[R, K] = [1024, 64]`` batch of
log-weights (one compiled program per resampler and dtype, shared by all tests)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxcd.decoding import resampling
from jaxcd.decoding.resampling import _inverse_cdf

NAMES = ["multinomial", "stratified", "systematic"]
R, K = 1024, 64


@functools.lru_cache(maxsize=None)
def _program(name):
    return jax.jit(jax.vmap(resampling.get(name)))


def _resample(name, seed, lw):
    """Ancestors [R, K] for R independent keys; ``lw`` [K] (broadcast) or [R, K]."""
    lw = jnp.broadcast_to(jnp.asarray(lw), (R, K))
    return np.asarray(_program(name)(jax.random.split(jax.random.key(seed), R), lw))


def _counts(idx: np.ndarray) -> np.ndarray:
    """[R, K] ancestor arrays -> [R, K] copy counts per particle."""
    return np.stack([np.bincount(row, minlength=K) for row in idx])


def _log(w):
    with np.errstate(divide="ignore"):
        return np.log(w)


def _weights(seed, alpha, zeros):
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(K) * alpha)
    w[rng.choice(K, zeros, replace=False)] = 0.0
    return w / w.sum()


def test_get_and_input_errors():
    assert set(resampling.RESAMPLERS) == set(NAMES)
    with pytest.raises(ValueError, match="multinomial, stratified, systematic"):
        resampling.get("residual")
    with pytest.raises(ValueError, match="vector"):
        resampling.systematic(jax.random.key(0), jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="empty"):
        resampling.systematic(jax.random.key(0), jnp.zeros((0,)))


def test_multinomial_chi_square():
    w = _weights(0, 1.0, 10)
    idx = _resample("multinomial", 1, jnp.asarray(_log(w), jnp.float32))
    total = np.bincount(idx.ravel(), minlength=K)
    assert total[w == 0].sum() == 0
    pos = w > 0
    expected = R * K * w[pos]
    chi2 = ((total[pos] - expected) ** 2 / expected).sum()
    p = stats.chi2.sf(chi2, pos.sum() - 1)
    assert p > 1e-3, (chi2, p)          # fixed seed; would fail by chance with prob. 1e-3
    # draws within one call are independent: the count of the heaviest particle per call
    # is binomial(K, w_j); its sample variance matches K w (1 - w) (4 SEs, SE of a sample
    # variance of a near-normal variable = var·sqrt(2/R))
    j = int(np.argmax(w))
    c = _counts(idx)[:, j]
    var = K * w[j] * (1 - w[j])
    assert abs(c.var() - var) < 4 * var * np.sqrt(2 / R), (c.var(), var)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_systematic_counts_are_floor_or_ceil(dtype):
    """For every call, #copies of j ∈ {⌊K w_j⌋, ⌈K w_j⌉} (a different w per call)."""
    rng = np.random.default_rng(1)
    w = rng.dirichlet(np.ones(K) * 0.5, size=R)
    w[rng.random((R, K)) < 0.3] = 0.0
    w[:, 0] += 1e-3
    w /= w.sum(1, keepdims=True)
    with jax.enable_x64(dtype == "float64"):
        lw = jnp.asarray(_log(w), dtype)
        w = np.exp(np.asarray(lw, np.float64))               # the weights as rounded
        w /= w.sum(1, keepdims=True)
        c = _counts(_resample("systematic", 2, lw))
    Kw = K * w
    slack = 1e-9 if dtype == "float64" else 1e-4             # K w at an integer boundary
    assert np.all((c >= np.floor(Kw - slack)) & (c <= np.ceil(Kw + slack)))
    assert np.all(c.sum(1) == K)


@pytest.mark.parametrize("name", NAMES)
def test_unbiased_counts(name):
    w = _weights(3, 0.7, 8)
    c = _counts(_resample(name, 4, jnp.asarray(_log(w), jnp.float32)))
    Kw = K * w
    # per-call count variance <= K w (1 - w) (multinomial; stratified is lower) and
    # <= 1/4 for systematic (counts in {floor, ceil}); 5 standard errors of the mean
    sd = np.sqrt(np.maximum(Kw * (1 - w), 0.25) / R)
    assert np.all(np.abs(c.mean(0) - Kw) < 5 * sd), ((c.mean(0) - Kw) / sd).max()
    assert np.all(c[:, w == 0] == 0)


ADVERSARIAL = {          # all of length K
    "zeros_at_ends_and_between": np.array([-np.inf] * 5 + [0.0] + [-np.inf] * 3 + [-2.0]
                                          + [-np.inf] * 54),
    "one_huge_many_tiny": np.array([0.0] + [-80.0] * 40 + [-np.inf] * 19 + [-85.0] * 3
                                   + [-np.inf]),
    "single_positive_last": np.array([-np.inf] * 63 + [-3.0]),
    "single_positive_first": np.array([-1e30] + [-np.inf] * 63),
    # float32 cumsum of 32 ones stalls: the later tiny weights add nothing; zeros between
    "cumsum_rounds_badly": np.concatenate([np.zeros(32), np.tile([-20.0, -np.inf], 16)]),
    "alternating": np.tile([0.0, -np.inf, -1e-7, -np.inf], 16),
    "huge_finite": np.array([3e38, -np.inf, 3e38] + [-np.inf] * 61),
    "ones_then_zeros": np.array([0.0] * 33 + [-np.inf] * 31),
}


def _zero_mask(lw) -> np.ndarray:
    """Weights that are exactly zero after the resampler's shift by the max."""
    lw = np.asarray(lw, np.float64)
    top = lw.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(lw) | (np.exp(lw - top) == 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_never_a_zero_weight_index(dtype):
    names = sorted(ADVERSARIAL)
    rows = np.arange(R) % len(names)                          # case of each batch row
    with jax.enable_x64(dtype == "float64"):
        lw = jnp.asarray(np.stack([ADVERSARIAL[n] for n in names]), dtype)   # [C, K]
        zero = _zero_mask(np.asarray(lw))
        for name in NAMES:
            idx = _resample(name, 7, lw[rows])
            assert idx.dtype == np.int32 and idx.shape == (R, K)
            bad = zero[rows[:, None], idx]
            assert not bad.any(), (name, [names[r] for r in rows[bad.any(1)]])
        # the inverse CDF itself at hand-placed uniforms: 0, every breakpoint F[i] and
        # its float neighbours, and values at or above 1 (clamped below 1)
        us = []
        for c in range(len(names)):
            x = np.asarray(lw[c], np.float64)
            w = np.exp(x - x.max())
            F = np.asarray(np.cumsum(w) / w.sum(), dtype)
            us.append(np.concatenate([[0.0, 1.0, 2.0, np.nextafter(np.asarray(1, dtype), 0)],
                                      F, np.nextafter(F, np.asarray(0, dtype)),
                                      np.nextafter(F, np.asarray(1, dtype))]).astype(dtype))
        idx = np.asarray(jax.jit(jax.vmap(_inverse_cdf))(lw, jnp.asarray(np.stack(us))))
        assert idx.min() >= 0 and idx.max() < K
        for c, case in enumerate(names):
            assert not zero[c][idx[c]].any(), case


def test_single_particle_and_all_minus_inf():
    every = jax.jit(lambda key, lw: [resampling.get(n)(key, lw) for n in NAMES])
    for lw in ([0.5], [-jnp.inf]):
        assert [x.tolist() for x in every(jax.random.key(0), jnp.array(lw))] == [[0]] * 3
    for name in NAMES:
        np.testing.assert_array_equal(_resample(name, 0, jnp.full((K,), -jnp.inf, jnp.float32)),
                                      np.tile(np.arange(K), (R, 1)))


def test_unbatched_matches_vmapped_and_dtypes():
    w = _weights(8, 1.0, 20)
    with jax.enable_x64(True):
        lw64 = jnp.asarray(_log(w), jnp.float64)
        batched = _resample("systematic", 5, lw64)
        keys = jax.random.split(jax.random.key(5), R)
        one = resampling.systematic(keys[3], lw64)
        np.testing.assert_array_equal(one, batched[3])
        assert np.all(w[np.asarray(one)] > 0)
        assert one.dtype == jnp.int32
        assert resampling.ess(lw64).dtype == jnp.float64
        assert resampling.log_mean_exp(lw64).dtype == jnp.float64
    assert resampling.ess(jnp.asarray(_log(w), jnp.float32)).dtype == jnp.float32


def _np_ess(lw):
    lw = np.asarray(lw, np.float64)
    if np.all(np.isneginf(lw)):
        return 0.0
    w = np.exp(lw - lw.max())
    return w.sum() ** 2 / (w ** 2).sum()


def _np_lme(lw):
    lw = np.asarray(lw, np.float64)
    if np.all(np.isneginf(lw)):
        return -np.inf
    m = lw.max()
    return m + np.log(np.mean(np.exp(lw - m)))


def _ess_cases() -> np.ndarray:
    """Rows of length 100 (padded with -inf), batched over the leading axis."""
    rng = np.random.default_rng(4)
    cases = [rng.normal(size=10) * 3, np.array([-np.inf, 0.0, -np.inf]),
             np.full(4, -np.inf), np.array([1e30, 1e30 - 1.0, -np.inf]),
             np.array([-1e30, -1e30]), np.array([5.0]), rng.normal(size=100) * 30,
             np.array([0.0, -800.0, -np.inf]), rng.normal(size=100) - 1e4]
    out = np.full((len(cases), 100), -np.inf)
    for i, c in enumerate(cases):
        out[i, :len(c)] = c
    return out


def test_ess_and_log_mean_exp_against_numpy():
    cases = _ess_cases()
    with jax.enable_x64(True):
        e = np.asarray(resampling.ess(jnp.asarray(cases)))
        m = np.asarray(resampling.log_mean_exp(jnp.asarray(cases)))
    ref_e = np.array([_np_ess(c) for c in cases])
    ref_m = np.array([_np_lme(c) for c in cases])
    np.testing.assert_allclose(e, ref_e, rtol=1e-12)
    np.testing.assert_array_equal(np.isneginf(m), np.isneginf(ref_m))
    fin = np.isfinite(ref_m)
    np.testing.assert_allclose(m[fin], ref_m[fin], rtol=1e-12, atol=1e-12)
    # float32: relative accuracy ~1e-5 against the float64 reference of the rounded input
    c32 = cases.astype(np.float32)
    e = np.asarray(resampling.ess(jnp.asarray(c32)))
    m = np.asarray(resampling.log_mean_exp(jnp.asarray(c32)))
    ref_e = np.array([_np_ess(c) for c in c32])
    ref_m = np.array([_np_lme(c) for c in c32])
    assert np.all(np.isfinite(e)) and not np.any(np.isnan(m))
    np.testing.assert_allclose(e, ref_e, rtol=1e-4)
    np.testing.assert_array_equal(np.isneginf(m), np.isneginf(ref_m))
    fin = np.isfinite(ref_m)
    np.testing.assert_allclose(m[fin], ref_m[fin], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["systematic", "stratified"])
def test_agrees_with_blackjax(name):
    """Same key -> same uniforms as blackjax's resamplers; on weights without zeros the
    ancestors agree index for index up to float ties at interval boundaries."""
    from blackjax.smc import resampling as bj

    w = np.random.default_rng(6).dirichlet(np.ones(K), size=R)     # [R, K], no zeros
    ours = _resample(name, 100, jnp.log(jnp.asarray(w, jnp.float32)))
    keys = jax.random.split(jax.random.key(100), R)
    ref = np.asarray(jax.jit(jax.vmap(lambda k, x: getattr(bj, name)(k, x, K)))(
        keys, jnp.asarray(w, jnp.float32)))
    mismatches = int((ours != ref).sum())
    assert mismatches <= ours.size // 1000, (mismatches, ours.size)
