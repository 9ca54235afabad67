"""Adaptive weighted rejection sampling (AWRS) for black-box constraints (host side).

Seed ``002`` (Lipkin et al.), Definition 2. Given next-token log-probabilities
``log p`` ``[V]`` and a black-box check ``accept(v) -> bool``, the target is the
locally constrained distribution

    π(v) = p(v) · 1{accept(v)} / Z,      Z = Σ_v p(v) · 1{accept(v)}.

:func:`sample` returns a token drawn *exactly* from ``π`` and ``log Ẑ`` with
``E[Ẑ · f(token)] = Σ_v p(v) 1{accept(v)} f(v)`` for every ``f`` (a properly weighted
pair, so ``Ẑ`` is unbiased for ``Z``: the incremental weight of an SMC step whose
proposal is ``π``). Only the tokens it draws are checked, never the whole vocabulary.

**AWRS (``method="awrs"``, Definition 2).**

1. Adaptive rejection loop: draw tokens from ``p`` without replacement (rejected
   tokens are removed and the rest renormalised) until the first accepted token
   ``x``; ``N`` rejections ``r_1..r_N``.
2. A second loop over a fresh ordering of the tokens not rejected so far (``x``
   stays in the pool: acceptances are replaced, rejections are not) until an
   accepted token; ``M`` further rejections.
3. ``Ẑ = (Σ_v p(v) − Σ_{i≤N} p(r_i)) / (N + M + 1)`` — the mass left after the *first*
   loop, over the number of rejections of both loops plus one.

Derivation (the paper's RAVI argument, App. D): the extended target is
``p(x)·1{accept(x)}·m(r | x)`` where the meta-proposal ``m`` runs a full adaptive loop
(``r'_1..r'_L``, ``x'``) and cuts it at a uniform split point ``s ∈ {0..L}``; the
meta-meta-proposal continues the first loop. All loop probabilities cancel except
``p(x) / R_N`` in the proposal and ``1/(L+1)`` for the split, leaving
``Ẑ = R_N / (N + M + 1)`` with ``R_N = Σ_v p(v) − Σ_{i≤N} p(r_i)``.

**Recursive AWRS (``method="recursive"``, App. H.3.3).** From ``Z = p(v) 1{accept(v)}
+ (1 − p(v)) Z_{−v}`` for any ``v`` (``Z_{−v}`` the constrained mass of ``p`` with
``v`` removed and renormalised): walk one ordering without replacement; each rejected
``v_i`` scales the estimate by ``1 − p(v_i | rest)``; at the first accepted ``v_k``
the estimate is ``p(v_k) + R_k · 1{accept(v_{k+1})}`` with one more draw ``v_{k+1}``
from the tokens left (``R_k`` their mass; ``p(v_k)`` alone when none is left).
Conditional on the ordering up to ``v_k``, ``E[Ẑ] = Z`` exactly. At most ``k + 1``
checks. With ``max_checks = n`` the recursion stops at the ``n``-th check with the
one-sample base case ``R_{n−1} · 1{accept(v_n)}`` (still properly weighted, at most
``n`` checks, but the token is then not exactly from ``π``: a rejected last draw
gives weight 0).

Numerics: float64 on the host; remaining masses are summed directly over the tokens
left (``log Σ exp``), never as ``1 − Σ rejected`` (no cancellation when almost all the
mass is rejected). Tokens with ``log p = −inf`` are never drawn nor checked. A step
where every token of positive probability is rejected returns ``(-1, -inf, checks)``,
never an exception.

Sampling without replacement uses an exponential race (the paper's App. H.1, the
Gumbel-top-k trick in linear space): keys ``E_v / p(v)`` with ``E_v`` i.i.d.
standard exponential, sorted increasingly; the order of the keys restricted to any
subset is a draw without replacement from ``p`` restricted to it. Only the top of the
order is sorted (``argpartition``: 16, then 512), the full sort happens only if that
runs out. (``V`` exponentials cost a fraction of ``V`` Gumbels: no logarithms.)
Masses are summed in linear space after shifting ``log p`` by its maximum.

Example::

    import numpy as np
    from jaxcd.decoding import awrs
    logp = np.log([0.5, 0.3, 0.2])
    token, log_w, checks = awrs.sample(np.random.default_rng(0), logp, lambda v: v != 0)
    # token ∈ {1, 2} with P(1) = 0.6; E[exp(log_w)] = 0.5
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

__all__ = ["sample", "METHODS"]

METHODS = ("awrs", "recursive")

_FIRST_CHUNK = 16
_MIDDLE_CHUNK = 512


def _race_order(rng: np.random.Generator, w: np.ndarray) -> Iterator[int]:
    """Tokens with ``w > 0`` in increasing order of ``E_v / w_v`` (``E_v`` i.i.d.
    standard exponential): a draw without replacement from ``w / Σw``. Lazy: sorts
    the top 16, then the top 512, and the whole vocabulary only if those run out."""
    with np.errstate(divide="ignore", over="ignore"):
        keys = rng.standard_exponential(w.shape[0]) / w          # +inf where w == 0
    n = int(np.count_nonzero(keys < np.inf))
    if n == 0:
        return
    if n <= _FIRST_CHUNK or keys.size <= _FIRST_CHUNK:
        for v in np.argsort(keys, kind="stable")[:n]:
            yield int(v)
        return
    done = 0
    for k in (_FIRST_CHUNK, _MIDDLE_CHUNK, None):
        k = n if k is None or k >= n else k
        if k < keys.size:
            top = np.argpartition(keys, k - 1)[:k]
        else:
            top = np.arange(keys.size)
        top = top[np.argsort(keys[top], kind="stable")][:k]
        for v in top[done:]:
            yield int(v)
        done = k
        if k == n:
            return


def _check_inputs(logprobs, method: str, max_checks) -> np.ndarray:
    logp = np.asarray(logprobs, dtype=np.float64)
    if logp.ndim != 1 or logp.size == 0:
        raise ValueError(f"logprobs must be a non-empty vector [vocab_size], got shape "
                         f"{np.shape(logprobs)}")
    if not np.all(logp < np.inf):                  # NaN compares False too
        raise ValueError("logprobs contains NaN or +inf")
    if method not in METHODS:
        raise ValueError(f"unknown AWRS method {method!r}; choose one of {', '.join(METHODS)}")
    if max_checks is not None:
        if method != "recursive":
            raise ValueError("max_checks bounds the cost only of method='recursive' "
                             "(Definition 2's AWRS has no properly weighted early stop here)")
        if int(max_checks) < 1:
            raise ValueError(f"max_checks must be >= 1, got {max_checks}")
    return logp


class _Checker:
    """Calls ``accept`` at most once per token and counts the calls."""

    def __init__(self, accept: Callable[[int], bool]):
        self.accept = accept
        self.cache: dict[int, bool] = {}
        self.calls = 0

    def __call__(self, v: int) -> bool:
        hit = self.cache.get(v)
        if hit is None:
            hit = bool(self.accept(v))
            self.cache[v] = hit
            self.calls += 1
        return hit


def sample(rng: np.random.Generator, logprobs, accept: Callable[[int], bool], *,
           max_checks: int | None = None, method: str = "awrs") -> tuple[int, float, int]:
    """One token from ``p(v) 1{accept(v)} / Z`` and the log of an unbiased estimate of
    ``Z = Σ_v p(v) 1{accept(v)}``.

    Args:
      rng: a ``numpy.random.Generator``.
      logprobs: float ``[vocab_size]``, log-probabilities of the next token (``-inf``
        for impossible tokens). If they are not normalised, ``Z`` is with respect to
        ``exp(logprobs)`` as given.
      accept: ``accept(v: int) -> bool``, the black-box constraint check. Called at
        most once per token per call.
      max_checks: bound on the number of checks (``method="recursive"`` only).
      method: ``"awrs"`` (Definition 2) or ``"recursive"`` (App. H.3.3); see the
        module docstring.

    Returns:
      ``(token, log_weight, num_checks)``: ``token`` int (``-1`` when every token of
      positive probability is rejected, or when the ``max_checks`` base case is
      rejected), ``log_weight`` = ``log Ẑ`` (``-inf`` in those cases), ``num_checks``
      the number of ``accept`` calls made.
    """
    logp = _check_inputs(logprobs, method, max_checks)
    check = _Checker(accept)
    if method == "awrs":
        return _awrs(rng, logp, check)
    return _recursive(rng, logp, check, None if max_checks is None else int(max_checks))


def _weights(logp: np.ndarray) -> tuple[np.ndarray, float]:
    """``(w, shift)`` with ``w = exp(logp - shift)`` (max entry 1, 0 for ``-inf``)."""
    shift = float(np.max(logp))
    if shift == -np.inf:
        return np.zeros_like(logp), 0.0
    return np.exp(logp - shift), shift


def _log_mass(w: np.ndarray, keep: np.ndarray, shift: float) -> float:
    total = float(np.sum(w, where=keep))
    return float(np.log(total)) + shift if total > 0 else -np.inf


def _awrs(rng, logp, check) -> tuple[int, float, int]:
    w, shift = _weights(logp)
    removed = np.zeros(logp.shape, bool)
    x, n_rej = -1, 0
    for v in _race_order(rng, w):
        if check(v):
            x = v
            break
        removed[v] = True
        n_rej += 1
    if x < 0:
        return -1, -np.inf, check.calls
    log_rest = _log_mass(w, ~removed, shift)       # R_N: mass left after the first loop
    m_rej = 0
    for v in _race_order(rng, np.where(removed, 0.0, w)):
        if check(v):                                # x is still in the pool: terminates
            break
        removed[v] = True
        m_rej += 1
    return x, log_rest - float(np.log(n_rej + m_rej + 1)), check.calls


def _recursive(rng, logp, check, max_checks) -> tuple[int, float, int]:
    w, shift = _weights(logp)
    removed = np.zeros(logp.shape, bool)
    order = _race_order(rng, w)
    for v in order:
        if max_checks is not None and check.calls == max_checks - 1:
            # base case: the one-sample estimator R_{i-1} · 1{accept(v_i)}, where the
            # product of the rejected levels' factors (1 - p(v_j | rest)) telescopes to
            # R_{i-1}, the mass not yet removed
            if check(v):
                return v, _log_mass(w, ~removed, shift), check.calls
            return -1, -np.inf, check.calls
        removed[v] = True
        if check(v):
            log_rest = _log_mass(w, ~removed, shift)   # R_k: mass of the tokens left
            nxt = next(order, None)
            if nxt is None or log_rest == -np.inf:
                return v, float(logp[v]), check.calls
            if check(nxt):
                return v, float(np.logaddexp(logp[v], log_rest)), check.calls
            return v, float(logp[v]), check.calls
    return -1, -np.inf, check.calls
