"""Resampling a particle system from its log-weights (device side, jittable).

Each resampler maps ``(key, log_weights float [K]) -> ancestors int32 [K]``: particle
``k`` of the next generation is a copy of particle ``ancestors[k]``. For ``B`` prompts
with ``K`` particles each, ``jax.vmap`` over the leading axis (one key per prompt).

- :func:`multinomial`: ``K`` independent draws from ``w / Σw``.
- :func:`stratified`: one uniform in each stratum ``[i/K, (i+1)/K)``.
- :func:`systematic`: one shared uniform, ``u_i = (i + U) / K``; particle ``j`` is
  copied ``⌊K w_j⌋`` or ``⌈K w_j⌉`` times.

All three are unbiased: ``E[#{k : ancestors[k] = j}] = K w_j / Σw``.

**A zero-weight particle is never chosen**, whatever the float rounding (the
guard blackjax's inverse-CDF resamplers lack: ``searchsorted`` with side ``left``
on a plain ``cumsum`` can return a leading zero-weight index for ``u = 0``, and an
associative-scan cumsum need not be monotone). See :func:`_inverse_cdf` for the
construction and the proof. If every weight is ``-inf`` the identity ``arange(K)``
is returned (callers do not resample then).

The helpers :func:`ess` and :func:`log_mean_exp` guard the all-``-inf`` case
explicitly (``0`` and ``-inf``, never NaN).

Example::

    import jax, jax.numpy as jnp
    from jaxcd.decoding import resampling
    lw = jnp.log(jnp.array([0.0, 0.5, 0.25, 0.25]))
    idx = resampling.systematic(jax.random.key(0), lw)   # never 0
    ess = resampling.ess(lw)                              # 2.666...
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

__all__ = ["multinomial", "stratified", "systematic", "RESAMPLERS", "get", "ess",
           "log_mean_exp"]


def _float_dtype(log_weights: jax.Array):
    dt = jnp.asarray(log_weights).dtype
    return dt if jnp.issubdtype(dt, jnp.floating) else jnp.result_type(float)


def _check(log_weights: jax.Array) -> jax.Array:
    log_weights = jnp.asarray(log_weights)
    if log_weights.ndim != 1:
        raise ValueError(
            f"log_weights must be a vector [num_particles] (vmap over prompts), got shape "
            f"{log_weights.shape}")
    if log_weights.shape[0] == 0:
        raise ValueError("log_weights is empty: need at least one particle")
    return log_weights.astype(_float_dtype(log_weights))


def _inverse_cdf(log_weights: jax.Array, u: jax.Array) -> jax.Array:
    """Indices ``i`` with ``F[i] > u >= F[i-1]`` for uniforms ``u`` in ``[0, 1)``.

    Construction (``K`` particles, float dtype of the input):

    1. ``w = exp(lw - max lw)`` (exactly ``0`` where ``lw = -inf``, max entry ``1``);
    2. ``s = cumsum(w)`` — whatever order XLA adds in (it may use an associative
       scan, so ``s`` need not be monotone and a zero weight need not leave the sum
       unchanged);
    3. ``m = cummax(where(w > 0, s, 0))`` — max is exact, so ``m`` is non-decreasing
       and ``m[i] = m[i-1]`` exactly whenever ``w[i] = 0``, and ``m[i] = 0`` for a
       leading run of zero weights;
    4. ``F = min(m · (1 / m[K-1]), 1)``, and ``F = 1`` exactly where ``m = m[K-1]``
       (we do not rely on ``x / x = 1``: XLA may rewrite a division by a scalar into a
       multiplication by its rounded reciprocal, and on CPU ``x · fl(1/x)`` can be
       ``1 - 2⁻⁵³``). Each step is an elementwise monotone map of ``m`` and the
       ``m = m[K-1]`` entries are a suffix, so ``F`` is non-decreasing,
       ``F[i] = F[i-1]`` whenever ``m[i] = m[i-1]`` (in particular when ``w[i] = 0``),
       and ``F[K-1] = 1``;
    5. ``u`` is clamped to ``[0, 1 - epsneg]`` (strictly below 1) and
       ``idx = searchsorted(F, u, side='right')`` = the first ``i`` with ``F[i] > u``.

    Claim: ``w[idx] > 0``. Proof. ``u < 1 = F[K-1]``, so ``idx <= K-1`` exists.
    If ``idx = 0``: ``F[0] > u >= 0``, so ``m[0] > 0``, so ``w[0] > 0`` (otherwise
    ``m[0] = 0``). If ``idx > 0``: ``F[idx] > u >= F[idx-1]``, so
    ``F[idx] != F[idx-1]``, which by (4) rules out ``w[idx] = 0``. ∎

    In real arithmetic ``F[i] - F[i-1] = w[i] / Σw``, so ``P(idx = i) = w[i] / Σw``
    for a uniform ``u``; float rounding only perturbs interval widths by a few ulps.
    """
    dtype = log_weights.dtype
    top = jnp.max(log_weights)
    top = jnp.where(jnp.isfinite(top), top, jnp.zeros((), dtype))
    w = jnp.exp(log_weights - top)                       # exp(-inf) = 0
    s = jnp.cumsum(w)
    m = jax.lax.cummax(jnp.where(w > 0, s, jnp.zeros((), dtype)), axis=0)
    total = m[-1]
    one = jnp.ones((), dtype)
    F = jnp.minimum(m * (one / jnp.where(total > 0, total, one)), one)
    F = jnp.where(m == total, one, F)
    u = jnp.clip(u.astype(dtype), 0, 1 - jnp.finfo(dtype).epsneg)
    K = log_weights.shape[0]
    # compare_all is O(K²) but compiles to one fused comparison (fast for small K)
    method = "compare_all" if K <= 1024 else "scan"
    idx = jnp.searchsorted(F, u, side="right", method=method).astype(jnp.int32)
    idx = jnp.minimum(idx, K - 1)                        # only reachable when total == 0
    return jnp.where(total > 0, idx, jnp.arange(u.shape[0], dtype=jnp.int32))


@jax.jit
def multinomial(key: jax.Array, log_weights: jax.Array) -> jax.Array:
    """``K`` i.i.d. ancestors from ``w / Σw``: int32 ``[K]``."""
    lw = _check(log_weights)
    u = jax.random.uniform(key, lw.shape, lw.dtype)
    return _inverse_cdf(lw, u)


@jax.jit
def stratified(key: jax.Array, log_weights: jax.Array) -> jax.Array:
    """Stratified resampling: ``u_i = (i + U_i) / K`` with ``U_i`` i.i.d. uniform."""
    lw = _check(log_weights)
    K = lw.shape[0]
    u = (jnp.arange(K, dtype=lw.dtype) + jax.random.uniform(key, (K,), lw.dtype)) / K
    return _inverse_cdf(lw, u)


@jax.jit
def systematic(key: jax.Array, log_weights: jax.Array) -> jax.Array:
    """Systematic resampling: ``u_i = (i + U) / K`` with one shared uniform ``U``;
    particle ``j`` gets ``⌊K w̄_j⌋`` or ``⌈K w̄_j⌉`` copies."""
    lw = _check(log_weights)
    K = lw.shape[0]
    u = (jnp.arange(K, dtype=lw.dtype) + jax.random.uniform(key, (), lw.dtype)) / K
    return _inverse_cdf(lw, u)


RESAMPLERS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "multinomial": multinomial,
    "stratified": stratified,
    "systematic": systematic,
}


def get(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The resampler called ``name`` (one of :data:`RESAMPLERS`)."""
    try:
        return RESAMPLERS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown resampler {name!r}; choose one of {', '.join(sorted(RESAMPLERS))}"
        ) from None


def _logsumexp(lw: jax.Array) -> jax.Array:
    top = jnp.max(lw, axis=-1, keepdims=True)
    safe = jnp.where(jnp.isfinite(top), top, jnp.zeros((), lw.dtype))
    s = jnp.log(jnp.sum(jnp.exp(lw - safe), axis=-1)) + safe[..., 0]
    return jnp.where(jnp.isneginf(top[..., 0]), -jnp.inf, s)


@jax.jit
def log_mean_exp(log_weights: jax.Array) -> jax.Array:
    """``log((1/K) Σ_k exp(lw_k))`` over the last axis; ``-inf`` when all are ``-inf``."""
    lw = jnp.asarray(log_weights)
    lw = lw.astype(_float_dtype(lw))
    return _logsumexp(lw) - jnp.log(jnp.asarray(lw.shape[-1], lw.dtype))


@jax.jit
def ess(log_weights: jax.Array) -> jax.Array:
    """Effective sample size ``(Σw)² / Σw²`` over the last axis, in log space
    (``exp(2·lse(lw) − lse(2·lw))``, shift-invariant); ``0`` when all are ``-inf``."""
    lw = jnp.asarray(log_weights)
    lw = lw.astype(_float_dtype(lw))
    top = jnp.max(lw, axis=-1, keepdims=True)
    dead = jnp.isneginf(top[..., 0])
    lw = lw - jnp.where(jnp.isfinite(top), top, jnp.zeros((), lw.dtype))   # max entry 0
    a = _logsumexp(lw)
    b = _logsumexp(2 * lw)
    zero = jnp.zeros((), lw.dtype)
    return jnp.where(dead, zero, jnp.exp(jnp.where(dead, zero, 2 * a - b)))
