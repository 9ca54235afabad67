r"""Pure, jittable functions over HMM parameters ``(π, A, B)``.

Model
-----
Hidden size ``H``, vocabulary size ``V``::

    π  [H]      π_h      = p(h_1 = h)                      (sums to 1)
    A  [H, H]   A_{h,h'} = p(h_{t+1} = h' | h_t = h)       (rows sum to 1)
    B  [H, V]   B_{h,v}  = p(x_t = v | h_t = h)            (rows sum to 1)

Parameters are plain *probability* arrays (exact zeros allowed), collected in
:class:`HMMParams`. Sequences are int32 ``tokens [N, T]`` with an optional bool
``mask [N, T]`` whose valid positions form a prefix of each row (``mask`` is
``None`` = all valid; a row with no valid position contributes nothing). Training
sequences are LM continuations padded with EOS to a fixed ``T``, so EOS padding is
ordinary data and the HMM models lengths; masks are for prefixes / batch padding.

Numerics: scaled forward, independently normalised backward
-----------------------------------------------------------
A product of ``T`` probabilities underflows float32 (128 tokens at ``1e-5`` each
is ``1e-640``), so nothing here forms an unnormalised α or β.

*Forward* (per-step normalisation with a stored log-scale). Carry the predictive
hidden distribution ``u_t = p(h_t | x_{<t})`` (``u_1 = π``)::

    w_t(h)   = log u_t(h) + log B_{h, x_t}                  (log space: no underflow)
    log c_t  = logsumexp_h w_t(h)   = log p(x_t | x_{<t})    (the stored log-scale)
    α̂_t(h)   = exp(w_t(h) - log c_t) = p(h_t | x_{≤t})
    u_{t+1}  = α̂_t A                                         (a matmul [N,H]@[H,H])

so ``log p(x_{1:T}) = Σ_t log c_t``. At a masked position ``u`` is carried over and
``log c_t = 0``.

*Backward* (normalised messages; the posteriors are ratios, so β's scale is free).
With ``β_T = 1``::

    v_{t+1}(h') = exp(log B_{h',x_{t+1}} + log β̃_{t+1}(h') - max_h'(...))   (max 1)
    r_t         = A v_{t+1}                                   (matmul [N,H]@[H,H]ᵀ)
    β̃_t         = r_t / s_t,     s_t = max_h r_t(h)

(``β̃_t = β_t`` up to a positive factor). Posteriors::

    γ_t(h)      = softmax_h(log α̂_t(h) + log β̃_t(h))                = p(h_t=h | x)
    ξ_t(h,h')   = α̂_t(h) A_{h,h'} v_{t+1}(h') / Z_t,   Z_t = α̂_t · r_t = p(h_t=h, h_{t+1}=h' | x)

and the expected transition counts are one matmul,
``Σ_{n,t} ξ_t = A ⊙ (Xᵀ Y)`` with ``X = α̂_t / √Z_t``, ``Y = v_{t+1} / √Z_t``
(the symmetric split keeps both factors in range).

Exact zeros: ``log 0 = -inf`` is used as is (no epsilon clamps). Every logsumexp
whose inputs are all ``-inf`` and every ``0/0`` is guarded explicitly: an
impossible step gives ``log c_t = -inf``, zero messages and zero posteriors, so an
impossible sequence has log-likelihood ``-inf`` and contributes nothing to the
expected counts (it is counted in :attr:`Counts.n_impossible`).

Memory: emissions are gathered as columns ``B[:, x]`` (``[T, N, H]``; a row gather
of ``Bᵀ``), emission counts are accumulated by scatter-add into ``[V, H]``; nothing
is one-hot over ``V``. The E-step uses ``O(H·V + N·T·H)`` memory. Every function
accepts :class:`HMMParams` (``B [H, V]``, the public layout) or
:class:`HMMParamsT` (``Bᵀ [V, H]``, the faster layout EM keeps while training).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxcd.hmm import HMMParams  # the parameter type lives in jaxcd (which never imports us)

from .errors import InvalidParamsError

Array = jax.Array


class HMMParamsT(NamedTuple):
    """The same parameters in the *token-major* layout used inside EM:
    ``pi [H]``, ``A [H, H]``, ``BT [V, H] = Bᵀ``.

    Gathering emission columns ``B[:, x]`` is then a contiguous row gather and the
    emission counts scatter-add into rows; on CPU this is ~10x faster than the
    strided column access of ``B [H, V]``. Convert with :func:`to_token_major` /
    :func:`from_token_major` (one ``H×V`` transpose each).
    """

    pi: Array
    A: Array
    BT: Array


def to_token_major(params: HMMParams) -> HMMParamsT:
    return HMMParamsT(params.pi, params.A, jnp.asarray(params.B).T)


def from_token_major(params: HMMParamsT) -> HMMParams:
    return HMMParams(params.pi, params.A, jnp.asarray(params.BT).T)


class Counts(NamedTuple):
    """Expected sufficient statistics of a batch (sums over sequences and time).

    Attributes:
      start: ``[H]``  ``Σ_n γ^n_1(h)``.
      trans: ``[H, H]`` ``Σ_n Σ_t ξ^n_t(h, h')``.
      emit_vh:  ``[V, H]`` ``Σ_n Σ_t γ^n_t(h) [x^n_t = v]`` (token-major: the layout
        the scatter-add produces; ``emit_vh.T`` is the ``[H, V]`` table).
      loglik: scalar, ``Σ_n log p(x^n)`` over the *possible* sequences.
      n_tokens: scalar, number of valid positions of the possible sequences.
      n_seqs: scalar, number of sequences with at least one valid position.
      n_impossible: scalar, number of sequences with ``p(x^n) = 0``.
    """

    start: Array
    trans: Array
    emit_vh: Array
    loglik: Array
    n_tokens: Array
    n_seqs: Array
    n_impossible: Array


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _log_normalise(w: Array, axis: int = -1) -> tuple[Array, Array, Array]:
    """``(p, log p, lse)`` with ``p = softmax(w)``, ``lse = logsumexp(w)``.

    All-``-inf`` input gives ``p = 0``, ``log p = -inf``, ``lse = -inf`` (no NaN).
    """
    m = jnp.max(w, axis=axis, keepdims=True)
    m0 = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(w - m0)
    s = jnp.sum(e, axis=axis, keepdims=True)
    ok = s > 0
    s1 = jnp.where(ok, s, 1.0)
    p = jnp.where(ok, e / s1, 0.0)
    lse = jnp.where(ok, m0 + jnp.log(s1), -jnp.inf)
    logp = jnp.where(ok, w - jnp.where(ok, lse, 0.0), -jnp.inf)
    return p, logp, jnp.squeeze(lse, axis)


def _shift_exp(w: Array, axis: int = -1) -> tuple[Array, Array]:
    """``(exp(w - max w), max w)``; all ``-inf`` gives zeros and ``-inf``."""
    m = jnp.max(w, axis=axis, keepdims=True)
    ok = jnp.isfinite(m)
    e = jnp.where(ok, jnp.exp(w - jnp.where(ok, m, 0.0)), 0.0)
    return e, jnp.squeeze(m, axis)


def normalise_rows(x: Array, fallback: Array | None = None) -> Array:
    """Divide each row (last axis) by its sum; zero-sum rows become ``fallback``'s row
    (uniform if ``fallback`` is None). No epsilon: the 0/0 case is selected out."""
    s = jnp.sum(x, axis=-1, keepdims=True)
    ok = s > 0
    out = x / jnp.where(ok, s, 1.0)
    if fallback is None:
        fallback = jnp.full_like(x, 1.0 / x.shape[-1])
    return jnp.where(ok, out, fallback)


def _tm(params) -> HMMParamsT:
    """Either layout -> token-major (inside jit the transpose fuses into the gather)."""
    if isinstance(params, HMMParamsT):
        return params
    return HMMParamsT(params[0], params[1], params[2].T)


def _prep(p: HMMParamsT, tokens: Array, mask: Array | None):
    tokens = jnp.asarray(tokens, jnp.int32)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [N, T], got shape {tokens.shape}")
    if mask is None:
        mask = jnp.ones(tokens.shape, bool)
    mask = jnp.asarray(mask, bool)
    # log emission columns, time-major: logE[t, n, h] = log B[h, x^n_t] (a row gather of Bᵀ);
    # a dropped token (id < 0) is marginalised: its emission probability is 1 in every state
    dropT = (tokens < 0).T
    logE = jnp.log(jnp.take(p.BT, jnp.maximum(tokens, 0).T, axis=0))  # [T, N, H]
    logE = jnp.where(dropT[..., None], 0.0, logE)
    return tokens, mask, logE


def _forward_scan(p: HMMParamsT, logE: Array, maskT: Array):
    """Scaled forward over time-major ``logE [T, N, H]``, ``maskT [T, N]``.

    Returns ``log_alpha [T, N, H]`` (``log α̂_t`` at valid steps, ``log u_t`` at masked
    ones), ``log_c [T, N]`` and the final predictive carry ``u [N, H]``."""
    pi, A = p.pi, p.A
    N = logE.shape[1]
    u0 = jnp.broadcast_to(pi, (N, pi.shape[0]))

    def step(u, inp):
        logE_t, m_t = inp
        log_u = jnp.log(u)
        alpha, log_alpha, log_c = _log_normalise(log_u + logE_t)
        m = m_t[:, None]
        u_next = jnp.where(m, alpha @ A, u)
        log_alpha = jnp.where(m, log_alpha, log_u)
        log_c = jnp.where(m_t, log_c, 0.0)
        return u_next, (log_alpha, log_c)

    u, (log_alpha, log_c) = jax.lax.scan(step, u0, (logE, maskT))
    return log_alpha, log_c, u


def _backward_scan(p: HMMParamsT, logE: Array, maskT: Array):
    """Normalised backward. Returns ``log_beta [T, N, H]`` (``log β̃_t``),
    ``v [T-1, N, H]`` (``v_{t+1}`` for ``t = 0..T-2``) and ``log_s [T-1, N]``
    (``log`` of the normaliser ``s_t = max_h r_t(h)`` of ``r_t = A v_{t+1}``)."""
    AT = p.A.T
    T, N, H = logE.shape
    lb_last = jnp.zeros((N, H), logE.dtype)  # β_T = 1

    def step(lb_next, inp):
        logE_next, m_next = inp
        v, _ = _shift_exp(logE_next + lb_next)
        r = v @ AT
        s = jnp.max(r, axis=-1, keepdims=True)
        ok = s > 0
        log_s = jnp.where(ok, jnp.log(jnp.where(ok, s, 1.0)), -jnp.inf)
        lb = jnp.where(ok, jnp.log(r) - jnp.where(ok, log_s, 0.0), -jnp.inf)
        m = m_next[:, None]
        lb = jnp.where(m, lb, 0.0)  # past the end: β = 1
        v = jnp.where(m, v, 0.0)
        log_s = jnp.where(m_next, log_s[:, 0], 0.0)
        return lb, (lb, v, log_s)

    if T == 1:
        return lb_last[None], jnp.zeros((0, N, H), logE.dtype), jnp.zeros((0, N), logE.dtype)
    _, (lb, v, log_s) = jax.lax.scan(step, lb_last, (logE[1:], maskT[1:]), reverse=True)
    log_beta = jnp.concatenate([lb, lb_last[None]], 0)
    return log_beta, v, log_s


# --------------------------------------------------------------------------------------
# public pure functions (``params``: HMMParams or HMMParamsT)
# --------------------------------------------------------------------------------------
@jax.jit
def forward(params: HMMParams, tokens: Array, mask: Array | None = None) -> tuple[Array, Array]:
    """Scaled forward pass.

    Args:
      params: :class:`HMMParams` ``(π [H], A [H,H], B [H,V])`` (or :class:`HMMParamsT`).
      tokens: int ``[N, T]``; mask: bool ``[N, T]`` (prefix-valid) or None.
    Returns:
      ``log_alpha [N, T, H]``: ``log p(h_t = h | x_{≤t})`` (normalised filtered
      posteriors; at masked positions the carried prediction) and
      ``log_c [N, T]``: ``log p(x_t | x_{<t})`` (0 at masked positions), so
      ``log p(x) = Σ_t log_c``.
    """
    p = _tm(params)
    _, mask, logE = _prep(p, tokens, mask)
    log_alpha, log_c, _ = _forward_scan(p, logE, mask.T)
    return jnp.swapaxes(log_alpha, 0, 1), log_c.T


@jax.jit
def backward(params: HMMParams, tokens: Array, mask: Array | None = None) -> Array:
    """Normalised backward pass.

    Returns ``log_beta [N, T, H]`` with ``log β̃_t(h) = log p(x_{>t} | h_t = h) + c_{n,t}``
    for an unspecified per-(n, t) constant (each step is rescaled so ``max_h β̃_t = 1``;
    ``β̃_T = 1``). Posteriors only need β up to that constant.
    """
    p = _tm(params)
    _, mask, logE = _prep(p, tokens, mask)
    log_beta, _, _ = _backward_scan(p, logE, mask.T)
    return jnp.swapaxes(log_beta, 0, 1)


def log_likelihood_(params, tokens: Array, mask: Array | None = None) -> Array:
    p = _tm(params)
    _, mask, logE = _prep(p, tokens, mask)
    _, log_c, _ = _forward_scan(p, logE, mask.T)
    return jnp.sum(log_c, axis=0)


log_likelihood = jax.jit(log_likelihood_)
log_likelihood.__doc__ = """``log p(x^n)`` for each sequence, float ``[N]`` (``-inf`` if impossible).
``params``: :class:`HMMParams` or :class:`HMMParamsT`."""


def _posterior_pieces(params, tokens, mask, logE=None):
    p = _tm(params)
    if logE is None:
        tokens, mask, logE = _prep(p, tokens, mask)
    maskT = mask.T
    log_alpha, log_c, _ = _forward_scan(p, logE, maskT)
    log_beta, v, log_s = _backward_scan(p, logE, maskT)
    loglik = jnp.sum(log_c, axis=0)  # [N]
    possible = jnp.isfinite(loglik)  # [N]
    # γ_t = softmax(log α̂_t + log β̃_t)
    gamma, _, log_ab = _log_normalise(log_alpha + log_beta)  # [T,N,H], [T,N]
    gamma = jnp.where((maskT & possible[None])[..., None], gamma, 0.0)
    # Z_t = α̂_t · r_t = s_t · Σ_h α̂_t β̃_t ;  log Z_t = log s_t + lse(log α̂_t + log β̃_t)
    log_Z = log_s + log_ab[:-1]  # [T-1, N]
    valid = maskT[1:] & possible[None] & jnp.isfinite(log_Z)
    half = jnp.where(valid, 0.5 * log_Z, 0.0)[..., None]
    X = jnp.where(valid[..., None], jnp.exp(log_alpha[:-1] - half), 0.0)  # [T-1,N,H]
    Y = jnp.where(valid[..., None], v * jnp.exp(-half), 0.0)               # [T-1,N,H]
    return p, tokens, mask, loglik, possible, gamma, X, Y


@jax.jit
def posteriors(params: HMMParams, tokens: Array, mask: Array | None = None):
    """Explicit posteriors (materialises ξ: use on small problems only).

    Returns ``(gamma [N, T, H], xi [N, T-1, H, H], loglik [N])`` with
    ``gamma[n,t,h] = p(h_t = h | x^n)`` and ``xi[n,t,h,h'] = p(h_t=h, h_{t+1}=h' | x^n)``;
    zero at masked positions and for impossible sequences.
    """
    p, _, _, loglik, _, gamma, X, Y = _posterior_pieces(params, tokens, mask)
    xi = X[..., :, None] * p.A[None, None] * Y[..., None, :]  # [T-1,N,H,H]
    return jnp.swapaxes(gamma, 0, 1), jnp.swapaxes(xi, 0, 1), loglik


def expected_counts(params, tokens: Array, mask: Array | None = None) -> Counts:
    """E-step: expected sufficient statistics of a batch (see :class:`Counts`).

    ``params``: :class:`HMMParams` or (faster inside EM) :class:`HMMParamsT`.
    Cost ``O(N T H²)``: one batched ``[N,H]@[H,H]`` matmul per step in each of the
    forward and backward scans, plus one ``[H,(T-1)N]@[(T-1)N,H]`` matmul for
    ``Σ ξ``; emission counts by scatter-add of ``γ [T·N, H]`` into rows of
    ``[V, H]``. Not jitted itself (it is traced inside the jitted/sharded EM steps);
    :func:`expected_counts_jit` is the jitted version.
    """
    return _counts(params, tokens, mask)


def _counts(params, tokens, mask, logE=None, emit_rows=None):
    """:func:`expected_counts` with optional precomputed ``logE [T, N, H]`` and emission
    scatter ``emit_rows(tokens_flat, gamma_flat) -> [V_local, H]`` (vocabulary-sharded EM)."""
    if logE is not None:
        tokens = jnp.asarray(tokens, jnp.int32)
        mask = jnp.ones(tokens.shape, bool) if mask is None else jnp.asarray(mask, bool)
    p, tokens, mask, loglik, possible, gamma, X, Y = _posterior_pieces(params, tokens, mask, logE)
    H = p.A.shape[0]
    T, N = gamma.shape[:2]
    start = jnp.sum(gamma[0], axis=0)
    M = max(T - 1, 0) * N
    trans = p.A * (X.reshape(M, H).T @ Y.reshape(M, H))
    kept = tokens >= 0  # dropped tokens (id < 0) add no emission counts
    g_emit = jnp.where(kept.T[..., None], gamma, 0.0).reshape(T * N, H)
    tok_flat = jnp.maximum(tokens, 0).T.reshape(-1)
    if emit_rows is None:
        V = p.BT.shape[0]
        emit_vh = jnp.zeros((V, H), gamma.dtype).at[tok_flat].add(g_emit)
    else:
        emit_vh = emit_rows(tok_flat, g_emit)
    valid_tok = mask & possible[:, None] & kept
    return Counts(
        start=start,
        trans=trans,
        emit_vh=emit_vh,
        loglik=jnp.sum(jnp.where(possible, loglik, 0.0)),
        n_tokens=jnp.sum(valid_tok).astype(gamma.dtype),
        n_seqs=jnp.sum(jnp.any(mask, axis=1)).astype(gamma.dtype),
        n_impossible=jnp.sum(~possible).astype(gamma.dtype),
    )


expected_counts_jit = jax.jit(expected_counts)


def zero_counts(hidden_size: int, vocab_size: int, dtype=jnp.float32) -> Counts:
    """All-zero :class:`Counts` (the identity of :func:`add_counts`)."""
    z = jnp.zeros((), dtype)
    return Counts(jnp.zeros((hidden_size,), dtype), jnp.zeros((hidden_size, hidden_size), dtype),
                  jnp.zeros((vocab_size, hidden_size), dtype), z, z, z, z)


@jax.jit
def add_counts(a: Counts, b: Counts) -> Counts:
    return jax.tree.map(jnp.add, a, b)


def m_step(counts: Counts, prev, pseudocount=0.0, emission_pseudocount=None):
    """M-step: normalised expected counts plus pseudocounts (MAP under a Dirichlet prior).

    ``π ∝ start + λ_π``, ``A_h ∝ trans_h + λ_A``, ``B_h ∝ emit_h + λ_B``: the MAP
    estimate under Dirichlet priors with parameters ``1 + λ`` (``λ = 0``: maximum
    likelihood, as hmmlearn with its default priors).

    ``pseudocount`` is a scalar ``λ`` (used for ``π`` and ``A``) or a pair
    ``(λ_π, λ_A)`` whose members broadcast against ``[H]`` and ``[H, H]``;
    ``emission_pseudocount`` (default: ``λ`` itself when that is a scalar) is a scalar or a
    ``[V]`` vector (the same pseudo-counts for every state's row, e.g. a scaled unigram:
    :mod:`hmm_distill.priors`). A row whose smoothed counts are all zero (possible only
    with ``λ = 0``: a state never visited) keeps its previous value instead of 0/0.
    Returns the layout of ``prev`` (:class:`HMMParams` or :class:`HMMParamsT`).
    """
    dt = counts.trans.dtype
    if isinstance(pseudocount, (tuple, list)):
        lam_pi, lam_a = (jnp.asarray(x, dt) for x in pseudocount)
        if emission_pseudocount is None:
            raise ValueError("m_step: give emission_pseudocount with a (λ_π, λ_A) pair")
    else:
        lam_pi = lam_a = jnp.asarray(pseudocount, dt)
    lam_b = lam_a if emission_pseudocount is None else jnp.asarray(emission_pseudocount, dt)
    if lam_b.ndim not in (0, 1):
        raise ValueError(f"emission pseudocount must be a scalar or [V], got shape {lam_b.shape}")
    pi = normalise_rows(counts.start + lam_pi, prev.pi)
    A = normalise_rows(counts.trans + lam_a, prev.A)
    if isinstance(prev, HMMParamsT):
        e = counts.emit_vh + (lam_b[:, None] if lam_b.ndim == 1 else lam_b)  # normalise over V = axis 0
        s = jnp.sum(e, axis=0, keepdims=True)
        ok = s > 0
        BT = jnp.where(ok, e / jnp.where(ok, s, 1.0), prev.BT)
        return HMMParamsT(pi, A, BT)
    B = normalise_rows(counts.emit_vh.T + lam_b, prev.B)
    return HMMParams(pi, A, B)


def mix_params(old, new, eta):
    """Stochastic-EM interpolation ``θ ← (1 - η) θ + η θ̂``; a convex combination of
    row-stochastic arrays is row-stochastic, so the result stays normalised."""
    eta = jnp.asarray(eta, old.A.dtype)
    return jax.tree.map(lambda a, b: (1 - eta) * a + eta * b, old, new)


@jax.jit
def predictive_logprobs(params: HMMParams, tokens: Array, mask: Array | None = None) -> Array:
    """Next-token distribution after each (masked) prefix.

    ``log p(x_{L+1} = v | x_{1:L}) = log Σ_h u_{L+1}(h) B_{h,v}`` with
    ``u_{L+1} = p(h_{L+1} | x_{1:L})`` from the scaled forward pass; ``L`` = number
    of valid positions (``L = 0`` gives ``log(π B)``). Returns float ``[N, V]``;
    ``-inf`` for tokens of probability 0, and everywhere if the prefix itself has
    probability 0 (the conditional is undefined).
    """
    p = _tm(params)
    _, mask, logE = _prep(p, tokens, mask)
    _, log_c, u = _forward_scan(p, logE, mask.T)
    possible = jnp.isfinite(jnp.sum(log_c, axis=0))
    probs = u @ p.BT.T
    return jnp.where(possible[:, None], jnp.log(probs), -jnp.inf)


@partial(jax.jit, static_argnames=("num", "length"))
def sample(params: HMMParams, key: Array, num: int, length: int) -> tuple[Array, Array]:
    """Draw ``num`` sequences of ``length`` tokens: returns ``(tokens, states)`` int32
    ``[num, length]``. (No EOS logic: an HMM distilled from EOS-padded data emits EOS
    padding itself.)"""
    log_pi, log_A, log_B = (jnp.log(x) for x in params)
    k0, key = jax.random.split(key)
    h0 = jax.random.categorical(k0, log_pi, shape=(num,))

    def step(h, k):
        kx, kh = jax.random.split(k)
        x = jax.random.categorical(kx, log_B[h])
        h_next = jax.random.categorical(kh, log_A[h])
        return h_next, (x, h)

    _, (xs, hs) = jax.lax.scan(step, h0, jax.random.split(key, length))
    return xs.T.astype(jnp.int32), hs.T.astype(jnp.int32)


# --------------------------------------------------------------------------------------
# construction / validation
# --------------------------------------------------------------------------------------
def random_params(key: Array, hidden_size: int, vocab_size: int, *, noise: float = 1.0,
                  dtype=jnp.float32, emission_base: Array | None = None) -> HMMParams:
    """Random parameters ``row ∝ base · exp(noise · N(0, 1))``; ``base`` is uniform
    (or ``emission_base [V]`` for ``B``)."""
    kp, ka, kb = jax.random.split(key, 3)
    H, V = hidden_size, vocab_size
    pi = jax.nn.softmax(noise * jax.random.normal(kp, (H,), dtype))
    A = jax.nn.softmax(noise * jax.random.normal(ka, (H, H), dtype), axis=-1)
    zb = noise * jax.random.normal(kb, (H, V), dtype)
    if emission_base is not None:
        base = jnp.asarray(emission_base, dtype)
        B = normalise_rows(base[None] * jnp.exp(zb - zb.max(-1, keepdims=True)))
    else:
        B = jax.nn.softmax(zb, axis=-1)
    return HMMParams(pi, A, B)


def validate_params(params: HMMParams, *, atol: float = 1e-4, what: str = "HMM parameters") -> None:
    """Raise :class:`InvalidParamsError` unless shapes agree, entries are finite and
    non-negative and every row sums to 1 (within ``atol``)."""
    pi, A, B = (np.asarray(x) for x in params)
    if pi.ndim != 1 or A.ndim != 2 or B.ndim != 2:
        raise InvalidParamsError(f"{what}: expected pi [H], A [H,H], B [H,V]; got shapes "
                                 f"{pi.shape}, {A.shape}, {B.shape}")
    H = pi.shape[0]
    if A.shape != (H, H) or B.shape[0] != H:
        raise InvalidParamsError(f"{what}: inconsistent shapes pi {pi.shape}, A {A.shape}, B {B.shape}")
    for name, x in (("pi", pi), ("A", A), ("B", B)):
        if not np.all(np.isfinite(x)):
            raise InvalidParamsError(f"{what}: {name} contains NaN or inf")
        if np.any(x < 0):
            raise InvalidParamsError(f"{what}: {name} has negative entries")
        err = np.max(np.abs(x.sum(-1, dtype=np.float64) - 1.0))
        if err > atol:
            raise InvalidParamsError(f"{what}: rows of {name} do not sum to 1 (max error {err:.3g})")


def as_params(pi, A, B, dtype=None) -> HMMParams:
    """Wrap three array-likes as :class:`HMMParams` (optionally cast)."""
    return HMMParams(*(jnp.asarray(x, dtype) for x in (pi, A, B)))
