r"""SMC for black-box constraints: AWRS proposals around jitted LM steps (host loop).

The constraint is a Python predicate on the byte prefix,
``predicate(prefix: bytes, final: bool) -> bool``:

- ``final=False``: can ``prefix`` still be extended to a valid output?
- ``final=True``: is ``prefix`` itself a complete valid output? (decides whether EOS
  is accepted).

Target: ``p(x | prompt, x ∈ L_n) ∝ p_T(x | prompt) · 1{x ∈ L_n}`` where ``p_T`` is the
LM at ``temperature`` (next-token distributions ``softmax(logp / T)``; ``T = 1`` is
the LM itself) and ``L_n`` the outputs of at most ``n = budget`` tokens, EOS included.

Per step ``t`` and live particle with prefix bytes ``b`` (docs/design.md §6 with the potential
``φ_t = 1{b can still be extended}``)::

    accept(v) = predicate(b, final=True)          if v = EOS
                False                             if v is special, or t = n-1 (only EOS
                                                  can end a generation within budget)
                predicate(b + bytes(v), final=False)  otherwise
    x_t, Ẑ_t = awrs.sample(rng, log p_T(· | x_{<t}), accept)
    log w   += log Ẑ_t

``Ẑ_t`` is an unbiased estimate of ``Σ_v p_T(v | x_{<t}) accept(v)`` properly weighted
with ``x_t`` (:mod:`jaxcd.decoding.awrs`), so this is SMC with the locally constrained proposal
and random (unbiased) incremental weights. A particle that emits EOS is finished: it
emits EOS padding and keeps its weight. A step where every token is rejected gives
weight ``-inf`` and finishes the particle; a particle still unfinished after ``n``
steps gets weight ``-inf`` (cannot happen with the last-step rule above, kept as a
guard).

Resampling per prompt (:mod:`jaxcd.decoding.resampling`) concerns the particles that have
not finished with a valid output (the rule of :func:`jaxcd.decoding.smc.run`): when their
``ESS < ess_threshold · K_u`` (``K_u`` of them; never with ``ess_threshold = 0``: plain
importance sampling), they are resampled among themselves (dead particles, of weight 0,
are only replaced) and share their total weight equally; finished particles keep their
places and weights. Not after the last step, not when every such weight is 0 and not
when every particle of the prompt has finished. The sum of the weights is preserved in
expectation, so ``log_Z`` = log-mean-exp of the final weights is unbiased for
``Z = p_T(x ∈ L_n | prompt)``. ``ess`` reports the ESS of all ``K`` weights. The LM
state (KV cache) is gathered only on steps where some prompt resamples.

Predicate calls are cached per ``(prefix, final)`` across particles and steps;
``num_checks[b, k]`` counts the real calls made on behalf of particle slot ``(b, k)``
(cache misses; slots are not permuted by resampling, so ``num_checks.sum()`` is the
total number of predicate calls).

Host/device border: the LM's prefill and step are jitted; AWRS, the predicate and
the weights (float64) live on the host; resampling indices come from the jitted
resamplers.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import awrs, resampling
from .smc_types import SMCResult

__all__ = ["run_blackbox"]


def _token_table(token_bytes, lm) -> tuple[list[bytes], np.ndarray]:
    """``(bytes per id, is_special bool [V])`` from a Vocabulary or a sequence of bytes
    (empty byte strings are special)."""
    V = int(lm.vocab_size)
    eos = int(lm.eos_token_id)
    if hasattr(token_bytes, "token_bytes") and hasattr(token_bytes, "is_special"):
        vocab = token_bytes
        if int(vocab.eos_id) != eos:
            raise ValueError(f"the vocabulary's EOS id ({vocab.eos_id}) differs from the "
                             f"LM's ({eos})")
        table = [bytes(b) for b in vocab.token_bytes]
        special = np.asarray(vocab.is_special, bool).copy()
    else:
        try:
            table = [bytes(b) for b in token_bytes]
        except TypeError:
            raise ValueError("token_bytes must be a jaxcd.Vocabulary or a sequence of bytes "
                             "per token id") from None
        special = np.array([len(b) == 0 for b in table], bool)
    if len(table) != V:
        raise ValueError(f"token_bytes has {len(table)} entries but the LM has {V} tokens")
    special[eos] = True
    return table, special


def _check_args(budget, num_particles, resample, ess_threshold, temperature, predicate,
                method):
    if not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    if not isinstance(num_particles, (int, np.integer)) or num_particles < 1:
        raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
    resampling.get(resample)
    if not 0.0 <= float(ess_threshold) <= 1.0:
        raise ValueError(f"ess_threshold must be in [0, 1], got {ess_threshold!r}")
    if not float(temperature) > 0.0 or not np.isfinite(float(temperature)):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    if not callable(predicate):
        raise ValueError("predicate must be callable: predicate(prefix: bytes, final: bool)")
    if method not in awrs.METHODS:
        raise ValueError(f"unknown AWRS method {method!r}; choose one of "
                         f"{', '.join(awrs.METHODS)}")


@lru_cache(maxsize=32)
def _programs(lm, K: int, max_len: int, resample: str):
    """Jitted device pieces for one (LM, particle count, cache length, resampler)."""

    @jax.jit
    def prefill(params, ids, lengths):
        state, logp = lm.prefill(params, ids, lengths, max_len)
        state = jax.tree.map(lambda x: jnp.repeat(x, K, axis=0), state)
        return state, jnp.repeat(logp, K, axis=0)

    step = jax.jit(lm.step)
    gather = jax.jit(lambda state, idx: jax.tree.map(lambda x: x[idx], state))
    one = resampling.get(resample)

    @jax.jit
    def resampler(key, t, log_w):                  # [B, K] -> ancestors [B, K]
        keys = jax.random.split(jax.random.fold_in(key, t), log_w.shape[0])
        return jax.vmap(one)(keys, log_w)

    return prefill, step, gather, resampler


def _host_log_softmax(logp: np.ndarray, temperature: float) -> np.ndarray:
    x = np.asarray(logp, np.float64) / temperature
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return x - top - np.log(np.sum(np.exp(x - top), axis=-1, keepdims=True))


def _np_log_mean_exp(lw: np.ndarray) -> np.ndarray:
    top = np.max(lw, axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.mean(np.exp(lw - safe), axis=-1)) + safe[..., 0]
    return np.where(np.isneginf(top[..., 0]), -np.inf, out)


def _np_ess(lw: np.ndarray) -> np.ndarray:
    top = np.max(lw, axis=-1, keepdims=True)
    safe = np.where(np.isfinite(top), top, 0.0)
    w = np.exp(lw - safe)
    s1, s2 = w.sum(-1), (w * w).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s2 > 0, s1 * s1 / np.where(s2 > 0, s2, 1.0), 0.0)


def _rng_from_key(key: jax.Array) -> np.random.Generator:
    """A NumPy generator seeded by the key's bits (and a tag, so that it differs from
    any generator seeded by the raw key elsewhere)."""
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.random.default_rng(np.asarray(key, np.uint64).ravel().tolist() + [0x5A3C])


def run_blackbox(key: jax.Array, lm, params: Any, prompt_ids, prompt_lengths, *,
                 predicate: Callable[[bytes, bool], bool], token_bytes, budget: int,
                 num_particles: int, resample: str = "systematic", ess_threshold: float = 0.5,
                 temperature: float = 1.0, seed: int | None = None, method: str = "awrs",
                 max_checks: int | None = None, eos_id: int | None = None) -> SMCResult:
    """SMC with AWRS proposals for ``predicate`` (see the module docstring).

    Args:
      key: JAX PRNG key (resampling; also seeds AWRS's NumPy generator when ``seed``
        is ``None``).
      lm, params: a :class:`jaxcd.lm.interface.LanguageModel` and its parameters.
      prompt_ids: int32 ``[B, P]`` left-padded; prompt_lengths: int32 ``[B]``.
      predicate: ``predicate(prefix: bytes, final: bool) -> bool``.
      token_bytes: a :class:`jaxcd.Vocabulary` (exact token bytes; special tokens other
        than EOS are never accepted) or a sequence of ``bytes`` per token id (empty =
        special).
      budget: ``n``, the most tokens per output, EOS included.
      num_particles: ``K`` per prompt.
      resample: ``"multinomial"``, ``"stratified"`` or ``"systematic"``.
      ess_threshold: resample when ``ESS < ess_threshold · K`` (0: never).
      temperature: the target is the LM at this temperature.
      seed: seed of the host NumPy generator AWRS draws from (default: from ``key``).
      method, max_checks: passed to :func:`jaxcd.decoding.awrs.sample` (``"awrs"`` is
        Definition 2; ``"recursive"`` optionally bounds the checks per step).
      eos_id: optional; must equal ``lm.eos_token_id`` (a consistency check).

    Returns:
      :class:`~jaxcd.decoding.smc_types.SMCResult`: ``tokens [B, K, n]`` (EOS-padded),
      ``log_weights [B, K]``, ``log_Z [B]``, ``valid [B, K]``, ``ess [B, n]``,
      ``resampled [B, n]``, ``num_checks [B, K]``.

    Example::

        import re
        pat = re.compile(rb"[0-9]{1,3}")
        pred = lambda b, final: (pat.fullmatch(b) is not None if final
                                 else re.fullmatch(rb"[0-9]{0,3}", b) is not None)
        res = run_blackbox(jax.random.key(0), lm, params, ids, lens, predicate=pred,
                           token_bytes=vocab, budget=8, num_particles=16)
    """
    _check_args(budget, num_particles, resample, ess_threshold, temperature, predicate, method)
    if max_checks is not None and method != "recursive":
        raise ValueError("max_checks needs method='recursive' (see jaxcd.decoding.awrs)")
    if eos_id is not None and int(eos_id) != int(lm.eos_token_id):
        raise ValueError(f"eos_id={eos_id} differs from the LM's EOS id ({lm.eos_token_id})")
    table, special = _token_table(token_bytes, lm)
    n, K = int(budget), int(num_particles)
    eos = int(lm.eos_token_id)
    T = float(temperature)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
    if prompt_ids.ndim != 2 or prompt_lengths.shape != (prompt_ids.shape[0],):
        raise ValueError(f"prompt_ids must be [B, P] and prompt_lengths [B], got "
                         f"{prompt_ids.shape} and {prompt_lengths.shape}")
    B = int(prompt_ids.shape[0])
    N = B * K
    if key is None:
        raise ValueError("key is required (a JAX PRNG key, e.g. jax.random.key(0))")
    rng = np.random.default_rng(seed) if seed is not None else _rng_from_key(key)
    prefill, step, gather, resampler = _programs(lm, K, int(prompt_ids.shape[1]) + n, resample)

    cache: dict[tuple[bytes, bool], bool] = {}
    checks = np.zeros(N, np.int64)

    def checked(i: int, prefix: bytes, final: bool) -> bool:
        hit = cache.get((prefix, final))
        if hit is None:
            hit = bool(predicate(prefix, final))
            cache[(prefix, final)] = hit
            checks[i] += 1
        return hit

    tokens = np.full((N, n), eos, np.int32)
    log_w = np.zeros(N, np.float64)
    done = np.zeros(N, bool)
    valid = np.zeros(N, bool)
    prefixes: list[bytes] = [b""] * N
    ess_out = np.zeros((B, n), np.float64)
    resampled = np.zeros((B, n), bool)

    state, logp = prefill(params, prompt_ids, prompt_lengths)
    for t in range(n):
        last = t == n - 1
        lt = _host_log_softmax(np.asarray(logp), T)
        for i in np.flatnonzero(~done):
            i = int(i)
            prefix = prefixes[i]

            def accept(v, i=i, prefix=prefix):
                if v == eos:
                    return checked(i, prefix, True)
                if special[v] or last:
                    return False
                return checked(i, prefix + table[v], False)

            tok, lw, _ = awrs.sample(rng, lt[i], accept, method=method, max_checks=max_checks)
            if tok < 0:
                log_w[i] = -np.inf
                done[i] = True
                continue
            log_w[i] += lw
            tokens[i, t] = tok
            if tok == eos:
                done[i] = True
                valid[i] = True
            else:
                prefixes[i] = prefix + table[tok]
        lwb = log_w.reshape(B, K)
        ess_out[:, t] = _np_ess(lwb)
        if done.all():
            ess_out[:, t + 1:] = ess_out[:, t:t + 1]     # weights no longer change
            break
        # resampling concerns the particles that have not finished with a valid output:
        # the unfinished ones (among themselves) and dead ones (weight 0, only replaced).
        # A finished particle's weight is final (its EOS probability paid), an
        # unfinished one's is not yet, so resampling across the two would kill finished
        # outputs of small weight that later EOS factors would have restored
        # (:mod:`jaxcd.decoding.smc`, "Resampling")
        run_ = ~valid.reshape(B, K)
        lw_run = np.where(run_, lwb, -np.inf)
        n_run = run_.sum(1)
        need = ((_np_ess(lw_run) < float(ess_threshold) * n_run) & np.isfinite(lw_run).any(1)
                & (n_run > 0) & (not last))
        if need.any():
            anc = np.asarray(resampler(key, np.int32(t), lw_run))
            # the j-th resampled slot takes a uniformly chosen one of the K draws
            # (exchangeable, so each is distributed as w/Σw over the unfinished particles)
            perm = np.stack([rng.permutation(K) for _ in range(B)])
            rank = np.maximum(np.cumsum(run_, axis=1) - 1, 0)
            pick = np.take_along_axis(anc, np.take_along_axis(perm, rank, axis=1), axis=1)
            anc = np.where(need[:, None] & run_, pick, np.arange(K)[None])
            idx = (anc + (np.arange(B) * K)[:, None]).reshape(N)
            # they share their total weight equally (the sum of all weights, and so the
            # evidence estimate, is unchanged in expectation)
            with np.errstate(divide="ignore"):
                lme = _np_log_mean_exp(lw_run) + np.log(K / np.maximum(n_run, 1))
            log_w = np.where(need[:, None] & run_, lme[:, None], lwb).reshape(N)
            tokens, done, valid = tokens[idx], done[idx], valid[idx]
            prefixes = [prefixes[j] for j in idx]
            state = gather(state, jnp.asarray(idx, jnp.int32))
            resampled[:, t] = need
        if not last:
            state, logp = step(params, state, tokens[:, t])
    log_w = np.where(done & valid, log_w, -np.inf)
    valid &= np.isfinite(log_w)
    lwb = log_w.reshape(B, K)
    return SMCResult(
        tokens=jnp.asarray(tokens.reshape(B, K, n)),
        log_weights=jnp.asarray(lwb),
        log_Z=jnp.asarray(_np_log_mean_exp(lwb)),
        valid=jnp.asarray(valid.reshape(B, K)),
        ess=jnp.asarray(ess_out),
        resampled=jnp.asarray(resampled),
        num_checks=jnp.asarray(checks.reshape(B, K).astype(np.int32)),
    )
