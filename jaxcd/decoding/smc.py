r"""Sequential Monte Carlo over particles — docs/design.md §6.

Target: the global posterior ``p(x | prompt, x ∈ L_n) ∝ p_lm(x | prompt)·1{x ∈ L_n}``
(``p_lm`` at ``temperature``: the LM's next-token distributions ``softmax(logp / T)``;
``T = 1`` is the LM itself). ``K`` particles per prompt, ``B`` prompts, one jitted
``lax.while_loop`` over at most the ``n`` budget steps (it stops once every particle
has emitted EOS). Every particle carries its tokens, LM state
(KV cache), automaton state, HMM predictive vector, log-weight, log-potential and a
done flag, all in one pytree with the particle axis (``B·K``) first.

Per step, for a live particle with prefix ``x_{<t}`` and potential ``φ``::

    x_t ~ q(· | x_{<t})
    log w += log p_lm(x_t | x_{<t}) + log φ(x_{1:t}) − log φ(x_{<t}) − log q(x_t | x_{<t})

=============  =========================================  ===================================
proposal       ``q(v) ∝``                                 potential ``φ``
=============  =========================================  ===================================
``lcd``        ``p_lm(v)·m^LCD(v)``                        ``1{x can still reach ⊥}`` (dead ends and
                                                          budget overruns get weight 0)
``gcd``        ``p_lm(v)·m^GCD(v)``                        GCD mask ``β_t(s_t)`` (always 1)
``lookahead``  ``p_lm(v)·ψ(x_{<t} v)``                     ``ψ`` (P-GCD, :mod:`jaxcd.decoding.pgcd`;
                                                          with ``defensive=λ > 0``, the
                                                          defensive potential below)
``product``    ``p_lm(v)·p_prod(v | x_{<t})``              as ``lookahead``
=============  =========================================  ===================================

so ``gcd`` adds ``log Σ_v p_lm(v) m(v)`` and (with ``defensive=0``) ``lookahead`` adds
``log Σ_v p_lm(v) ψ(x_{<t} v) − log ψ(x_{<t})``. ``psi_power=α`` tempers the P-GCD
proposals (``p_lm(v)·ψ(x_{<t} v)^α``, ``product``: ``p_lm(v)·p_prod(v | x_{<t})^α``) and
leaves the potential alone; the weight divides by the tempered ``q``, so it stays exact. Potentials are relative to the start
(``φ(∅) = 1``; ψ is divided by ``ψ(∅)``, one constant per prompt), so particles start at
``log w_0 = 0``.

**Defensive mixture** (``lookahead`` and ``product``). The P-GCD proposal ``q_P`` above is
mixed with the GCD proposal::

    q(v) = (1 − λ)·q_P(v) + λ·q_GCD(v),      q_GCD(v) ∝ p_lm(v)·m^GCD(v)

and the weight divides by this ``q`` (``λ = defensive``, default :data:`DEFENSIVE` = 0.05;
``0`` gives ``q_P`` alone). The target is unchanged, so weights stay exact and ``Ẑ``
unbiased; what changes is the proposal's support and tails. ``ψ`` comes from a small HMM,
and an HMM can be wrong by orders of magnitude about a token it never saw in its
training samples: a distilled HMM gives every such token the same pseudocount
(≈ 1e-6), so ``ψ`` of a word that needs two unseen tokens is ~1e-5 × that of a word
that needs one, whatever the LM thinks. ``q_P`` then gives such a continuation
probability ~1e-5 while the posterior gives it 0.4: its weight ``p/q`` is huge and almost
never drawn, and the pooled estimate is off by the missing mass at any practical number of
runs (study 6b's ``shape``: TV 0.35 at K = 64 with ``λ = 0``, 0.007 with ``λ = 0.05``).
The mixture bounds every step's proposal from below by ``λ·q_GCD``, so the support of
``q`` is the GCD support and no step's weight exceeds ``1/λ`` times GCD's; the price,
where ``q_P`` is already good, is a factor of at most ``(1 − λ)^{-1}`` per step on the
weights (so an LM that *is* the HMM no longer gets zero-variance weights).

**Defensive potential** (``lookahead`` and ``product``, ``λ > 0``). Resampling selects
particles by their twisted weights ``p·φ/q``, so a potential that underrates a prefix
starves it whatever the proposal: the particles the mixture draws there are killed at the
next resampling step. Study 6b's ``mode`` on Qwen2.5-Coder: the demo HMM rates "b" (of
b·icy·cling, posterior 0.215) e^−12.7 below the start and "walking" e^13.9 above it; with
``φ = ψ``, "bicycling" survived resampling in almost no run (TV 0.085 at K = 64 in the
study; in a 2 × 1000-run check 0.15 at K = 128 and ``Ẑ/Z`` 0.91 ± 0.015 at K = 64:
unbiased in theory, but the mass sits in runs too rare to see), while without resampling
TV was 0.013. So for ``λ > 0`` the potential is built step
by step::

    φ(x_{<t} v) = φ(x_{<t})·r(v),   r(v) = (1 − λ)·ρ(v)/E_{q_GCD}[ρ] + λ,   ρ(v) = ψ(x_{<t} v)/ψ(x_{<t})

``r`` ranks the tokens as ``ψ`` does, averages 1 under the GCD proposal and is never below
``λ``: no step can cut a prefix's twisted weight by more than ``λ`` against GCD's (where
``r`` is about ``λ``, the proposal's own defensive part drew it with probability about
``λ·q_GCD``, and the two cancel). ``λ = 1`` is GCD's potential 1; where ``ψ = 0`` at every
token ``r = 1``. ``λ = 0`` keeps the pure potential ``ψ`` of docs/design.md §6: where
``ψ(x_{<t} v) = 0`` at a token GCD allows (an HMM zero, or underflow) ``φ`` keeps the
prefix's value (``φ(x_{<t} v) = φ(x_{<t})``: the twist makes no claim there), and
``ψ(∅) = 0`` starts at ``φ = 1``. Either way the final potential ``φ(x·EOS)`` is set to
``1{x ∈ L}`` exactly (not ψ's rounding of it), so a particle's final weight is
``p_lm(x)/q(x)`` exactly, whatever ``φ`` is in between, and ``Ẑ`` is unbiased.

A particle
that has emitted EOS is finished: it emits EOS padding and its weight no longer
changes; its potential is ``1{x ∈ L}`` exactly (``ψ(x·EOS) = 1{x ∈ L}``). At the end,
a particle that is not in ``⊥`` gets weight 0 (only LCD can leave one there).

Resampling concerns a prompt's **unfinished** particles only (those that have not emitted
EOS): when their ``ESS = (Σw)²/Σw² < ess_threshold·K_u`` (``K_u`` of them; never with
``ess_threshold = 0``, i.e. plain importance sampling), they are resampled among
themselves and share their total weight equally (each gets the mean of their weights);
finished particles keep their places and weights. It runs under ``lax.cond``, so the KV
cache is gathered only on steps where some prompt resamples. The sum of the weights is
preserved in expectation, so ``log_Z`` — the log-mean-exp of the final weights — is
unbiased for ``Z = p_lm(x ∈ L_n | prompt)``. Why not resample finished particles too: a
finished particle's weight is final (its EOS probability is paid), an unfinished one's
is not, so across the two the weights are not comparable — study 6b's ``ocean`` has
"Pacific·EOS" finished with weight 4e-6 beside "Ar·ctic" at 0.05 whose EOS factor
(9e-4) is still to come; resampling them together kept Pacific in about 1 run in 1000
and the pooled estimate gave it 0.0002 instead of 0.014 (TV 0.02 at K = 64; 0.001 with
this rule). ``ess`` still reports the ESS of all ``K`` weights. A prompt whose weights
are all 0 is never resampled and gets ``log_Z = −inf``; nor is a prompt whose particles
have all emitted EOS (its ensemble is final), even while other prompts of the batch are
still decoding — the same rules as :func:`jaxcd.decoding.smc_blackbox.run_blackbox`.

When several devices are visible, the particle axis is sharded across them
(``B·K`` must be divisible by the device count; otherwise it runs on one device).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..automata.tensorized import TensorizedAutomaton
from . import decode, gcd, pgcd, resampling
from .smc_types import SMCResult

PROPOSALS = ("lcd", "gcd", "lookahead", "product")
DEFENSIVE = 0.05     # default GCD share λ of the P-GCD proposals' mixture and potential

__all__ = ["run", "run_blackbox", "SMCResult", "PROPOSALS", "Particles"]


class Particles(NamedTuple):
    """The particle system (every leaf has the particle axis ``B·K`` first)."""

    tokens: jax.Array          # int32 [N, n]
    lm_state: Any
    logp: jax.Array            # [N, V_lm] next-token log-probs of the LM
    cs: gcd.ConstraintState    # [N], [N]
    u: jax.Array               # [N, H] HMM predictive vector (H = 1 without an HMM)
    log_w: jax.Array           # [N]
    log_phi: jax.Array         # [N] log-potential of the current prefix
    done: jax.Array            # bool [N]


def _check(fa, lm, hmm, proposal, budget, num_particles, resample, ess_threshold,
           defensive=DEFENSIVE, psi_power=1.0):
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
    if not 0.0 <= float(defensive) <= 1.0:
        raise ValueError(f"defensive must be in [0, 1], got {defensive!r}")
    if not (np.isfinite(float(psi_power)) and float(psi_power) >= 0.0):
        raise ValueError(f"psi_power must be a finite number >= 0, got {psi_power!r}")
    resampling.get(resample)
    if not isinstance(num_particles, (int, np.integer)) or num_particles < 1:
        raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
    if not 0.0 <= float(ess_threshold) <= 1.0:
        raise ValueError(f"ess_threshold must be in [0, 1], got {ess_threshold!r}")
    if int(lm.eos_token_id) != int(fa.eos_id):
        raise ValueError(f"the LM's EOS id ({lm.eos_token_id}) differs from the automaton's "
                         f"({fa.eos_id}): compile the constraint with this model's vocabulary")
    if lm.vocab_size < fa.vocab_size:
        raise ValueError(f"the LM has {lm.vocab_size} tokens, fewer than the automaton's "
                         f"{fa.vocab_size}: compile the constraint with this model's vocabulary")
    if proposal in ("lookahead", "product"):
        if hmm is None:
            raise ValueError(f"proposal {proposal!r} needs an HMM (hmm=...; distil one with "
                             "`hmm-distill`)")
        pgcd.check_hmm(fa, hmm, lm=lm)
    if proposal != "lcd":
        gcd.check_budget(fa, budget)
    elif not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")


def run(key: jax.Array, lm, params: Any, prompt_ids, prompt_lengths, fa: TensorizedAutomaton,
        *, budget: int, num_particles: int, proposal: str = "gcd", hmm=None,
        resample: str = "systematic", ess_threshold: float = 0.5, temperature: float = 1.0,
        table_dtype=None, tables: gcd.BudgetTables | None = None,
        ptables: pgcd.PGCDTables | None = None, max_steps: int | None = None,
        prefilled: decode.Prefilled | None = None, defensive: float = DEFENSIVE,
        psi_power: float = 1.0) -> SMCResult:
    """SMC with ``num_particles`` particles per prompt (``prompt_ids`` int32 ``[B, P]``
    left-padded, ``prompt_lengths [B]``); see the module docstring. Returns an
    :class:`~jaxcd.decoding.smc_types.SMCResult` (``tokens [B, K, n]``, ``log_weights [B, K]``,
    ``log_Z [B]``, ``valid [B, K]``, ``ess [B, n]``, ``resampled [B, n]``).

    ``tables`` (:func:`jaxcd.decoding.gcd.backward`, or
    :func:`~jaxcd.decoding.gcd.lcd_tables` for LCD) and ``ptables``
    (:func:`jaxcd.decoding.pgcd.backward`) may be passed to reuse tables across calls with
    the same constraint, HMM and budget; they are built otherwise (P-GCD's with
    ``kernel="auto"``: build them with :func:`jaxcd.decoding.pgcd.backward` to choose).

    ``fa`` may be one automaton for every prompt or a stack with one per prompt row
    (:func:`jaxcd.decoding.buckets.stack_automata`). ``max_steps`` (static; default ``budget``) is
    the length of the loop and of the outputs (``tokens [B, K, max_steps]``, ``ess``,
    ``resampled``): pass a budget bucket (:func:`jaxcd.decoding.buckets.budget_bucket`) so that
    one compiled program serves every budget up to it; the budget itself is traced, and
    tokens past it are EOS. ``result.steps`` counts the steps actually run.
    ``prefilled`` (:func:`jaxcd.decoding.decode.prefill` of the same prompts): start from that
    prefill instead of running the prompts again (one prefill, several runs).
    ``defensive`` (``λ`` in ``[0, 1]``, default :data:`DEFENSIVE`): for ``lookahead`` and
    ``product``, the share of the GCD proposal in the defensive mixture and the floor of
    each step's factor of the defensive potential (module docstring; ``0``: the pure P-GCD
    proposal and potential ``ψ``, ``1``: GCD's proposal and potential); ignored by ``gcd``
    and ``lcd``.
    ``psi_power`` (``α ≥ 0``, default 1): tempers the P-GCD proposal,
    ``q_P(v) ∝ p_lm(v)·ψ(x v)^α`` (``product``: ``p_lm(v)·p_prod(v | x)^α``); ``α < 1``
    trusts the HMM less, ``0`` keeps only its support. The potential is not tempered and
    the weights divide by the proposal actually drawn from, so they stay exact.

    Example::

        res = smc.run(jax.random.key(0), lm, params, ids, lens, fa, budget=32,
                      num_particles=16, proposal="lookahead", hmm=hmm)
        w = jax.nn.softmax(res.log_weights, axis=-1)    # the weighted ensemble
    """
    _check(fa, lm, hmm, proposal, budget, num_particles, resample, ess_threshold, defensive,
           psi_power)
    budget, K = int(budget), int(num_particles)
    steps = budget if max_steps is None else int(max_steps)
    gcd.check_steps(budget, steps)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
    if fa.batch_shape and fa.batch_shape != (prompt_ids.shape[0],):
        raise ValueError(f"{fa.batch_shape[0]} stacked automata for {prompt_ids.shape[0]} "
                         "prompt rows: give one automaton per row")
    S_flat = int(np.prod(np.shape(fa.dist)))
    fa_d = fa.to_device() if isinstance(fa.cum_masks, np.ndarray) else fa
    if tables is None:
        gtables = (gcd.lcd_tables(fa_d, budget, steps) if proposal == "lcd"
                   else gcd.backward(fa_d, budget, steps))
    else:
        gtables = tables
        if tables.beta.shape != (steps + 1, S_flat) or tables.budget != budget:
            raise ValueError(f"tables= has shape {tables.beta.shape} and budget "
                             f"{tables.budget}, expected {(steps + 1, S_flat)} (max_steps + 1, "
                             f"num_states) and budget {budget}")
    if proposal in ("lookahead", "product"):
        if ptables is None:
            ptables = pgcd.backward(fa, hmm, budget, table_dtype=table_dtype, max_steps=steps)
        else:
            pgcd.check_tables(fa, ptables)
            if ptables.budget != budget or ptables.max_steps != steps:
                raise ValueError(f"ptables= were built for budget {ptables.budget} "
                                 f"(max_steps {ptables.max_steps}), not {budget} "
                                 f"(max_steps {steps})")
        hpi, hA, hB = (jnp.asarray(a) for a in (hmm.pi, hmm.A, hmm.B))
    else:
        ptables, hpi, hA, hB = None, None, None, None
    pre = None
    if prefilled is not None:
        decode.check_prefilled(prefilled, prompt_ids, steps)
        pre = (prefilled.state, prefilled.logp)
    return _run(key, lm, params, prompt_ids, prompt_lengths, fa_d, gtables, ptables, hpi, hA, hB,
                jnp.asarray(temperature, jnp.float32), jnp.asarray(ess_threshold, jnp.float32),
                jnp.asarray(budget, jnp.int32), pre, jnp.asarray(defensive, jnp.float32),
                jnp.asarray(psi_power, jnp.float32),
                budget=steps, K=K, proposal=proposal, resample=resample)


def _particle_sharding(N: int):
    devs = jax.devices()
    if len(devs) < 2 or N % len(devs):
        return None
    return NamedSharding(Mesh(np.array(devs), ("particles",)), PartitionSpec("particles"))


def _shard(tree, sharding, N):
    if sharding is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding)
                        if getattr(x, "ndim", 0) >= 1 and x.shape[0] == N else x, tree)


@partial(jax.jit, static_argnames=("lm", "budget", "K", "proposal", "resample"))
def _run(key, lm, params, prompt_ids, prompt_lengths, fa, gtables, ptables, hpi, hA, hB, temperature,
         ess_threshold, limit, pre, defensive, psi_power, *, budget, K, proposal, resample):
    from .buckets import flatten
    fa = flatten(fa)
    B = prompt_ids.shape[0]
    N = B * K
    n = budget                # static length (a bucket); `limit` is the budget enforced
    eos = lm.eos_token_id
    sharding = _particle_sharding(N)
    use_hmm = ptables is not None
    resampler = resampling.get(resample)

    # prefill once per prompt, broadcast to the K particles of each prompt
    if pre is None:
        lm_state, logp = lm.prefill(params, prompt_ids, prompt_lengths, prompt_ids.shape[1] + n)
    else:
        lm_state, logp = decode.broadcast_prefill(pre, B)
    rep = lambda x: jnp.repeat(x, K, axis=0)                            # noqa: E731
    lm_state, logp = jax.tree.map(rep, lm_state), rep(logp)
    wdt = jnp.result_type(logp.dtype, ptables.mant.dtype if use_hmm else logp.dtype,
                          jnp.float32)
    if use_hmm:
        wdt = jnp.result_type(wdt, hpi.dtype)
    cs = gcd.init_states(fa, B, K)
    if use_hmm:
        u = jnp.broadcast_to((hpi / jnp.sum(hpi)).astype(wdt), (N,) + hpi.shape)
        cs0 = gcd.init_states(fa, B)                                    # one per prompt
        st0 = pgcd.PGCDState(cs0, u[:B])
        log_phi0 = jax.vmap(pgcd.prefix_logpsi, in_axes=(None, None, None, 0))(
            fa, None, ptables, st0).astype(wdt)
        # ψ(∅) = 0 (an HMM that gives the constraint probability 0): no claim (φ = 1);
        # the budget is feasible (checked), so the GCD part of the proposal still draws
        log_phi0 = jnp.where(jnp.isfinite(log_phi0), log_phi0, 0.0)
        # the potential is ψ relative to ψ(∅) (one constant per prompt): φ(∅) = 1
        log_psi0 = jnp.repeat(log_phi0, K)
    else:
        u = jnp.zeros((N, 1), wdt)
        log_psi0 = jnp.zeros((N,), wdt)
    log_phi = jnp.zeros((N,), wdt)
    parts = Particles(jnp.full((N, n), eos, jnp.int32), lm_state, logp, cs, u,
                      log_phi, log_phi, jnp.zeros((N,), bool))
    parts = _shard(parts, sharding, N)
    V_lm = logp.shape[1]

    def pad_v(x):                                   # automaton [.., V_fa] -> LM [.., V_lm]
        if x.shape[-1] == V_lm:
            return x
        return jnp.pad(x, ((0, 0), (0, V_lm - x.shape[-1])), constant_values=-jnp.inf)

    def step(parts: Particles, inp):
        t, k = inp
        k_tok, k_res = jax.random.split(k)
        lt = jax.nn.log_softmax(parts.logp.astype(wdt) / temperature.astype(wdt), axis=-1)
        if proposal in ("lcd", "gcd"):
            a = decode.masked_logits(fa, gtables, parts.cs, lt)        # log p_lm + log m
            phi_new = jnp.zeros_like(a)
            lse = jax.nn.logsumexp(a, axis=-1)
        else:
            sts = pgcd.PGCDState(parts.cs, parts.u)
            logpsi, lpsi_x, lprod = pgcd.batched_scores(fa, ptables, sts)
            logpsi, lprod = pad_v(logpsi.astype(wdt)), pad_v(lprod.astype(wdt))
            a_gcd = decode.masked_logits(fa, gtables, parts.cs, lt)
            # the proposal's score, tempered (ψ^α or p_prod^α; α = 0 keeps the support);
            # the potential below uses ψ itself
            score = logpsi if proposal == "lookahead" else lprod
            score = jnp.where(jnp.isfinite(score), psi_power.astype(wdt) * score, -jnp.inf)
            a, lse = _defensive(lt, score, a_gcd, defensive.astype(wdt))
            allowed = jnp.isfinite(a_gcd)
            lam = defensive.astype(wdt)
            # λ = 0: the potential ψ (relative to ψ(∅)); where ψ = 0 at a token GCD allows
            # (an HMM zero or an underflow) φ keeps the prefix's value: no claim, and the
            # particle lives on
            pure = jnp.where(jnp.isfinite(logpsi), logpsi - log_psi0[:, None],
                             jnp.where(allowed, parts.log_phi[:, None], -jnp.inf))
            # λ > 0: the defensive potential, step by step φ(x v) = φ(x)·r(v) with
            # r(v) = (1 − λ)·ρ(v)/E_GCD[ρ] + λ, ρ(v) = ψ(x v)/ψ(x): r ranks the tokens as ψ
            # does, averages 1 under the GCD proposal and is never below λ, so a
            # resampling step cannot starve a prefix that ψ underrates (λ = 1: GCD's φ = 1)
            lpsi_x = lpsi_x.astype(wdt)
            okx = jnp.isfinite(lpsi_x)[:, None]
            lrho = jnp.where(okx, logpsi - jnp.where(okx, lpsi_x[:, None], 0.0), -jnp.inf)
            lqg = a_gcd - jax.nn.logsumexp(a_gcd, axis=-1, keepdims=True)
            lmean = jax.nn.logsumexp(jnp.where(allowed, lqg + lrho, -jnp.inf), axis=-1,
                                     keepdims=True)
            okm = jnp.isfinite(lmean)
            lr = jnp.logaddexp(jnp.log1p(-lam) + lrho - jnp.where(okm, lmean, 0.0),
                               jnp.log(lam))
            lr = jnp.where(okm, lr, 0.0)                 # ψ = 0 at every token: no claim
            bounded = jnp.where(allowed, parts.log_phi[:, None] + lr, -jnp.inf)
            phi_new = jnp.where(lam > 0, bounded, pure)
            # after EOS the potential is 1{x ∈ L} exactly (GCD allows EOS iff x ∈ L), not
            # ψ's rounding of it nor a kept value: the final weight is then p(x)/q(x)
            # exactly
            phi_new = phi_new.at[:, eos].set(jnp.where(allowed[:, eos], 0.0, -jnp.inf))
        # the shared draw (EOS for finished rows and empty proposals); log q is recomputed
        # below in the weights' dtype
        tok, _, done, empty = decode.draw(k_tok, a.astype(jnp.float32), parts.done, eos)
        empty = empty | ~jnp.isfinite(lse)
        take = lambda x: jnp.take_along_axis(x, tok[:, None], axis=1)[:, 0]   # noqa: E731
        log_q = take(a) - lse
        phi_tok = take(phi_new)
        inc = take(lt) + phi_tok - parts.log_phi - log_q
        live = ~parts.done
        log_w = jnp.where(live & empty, -jnp.inf,
                          jnp.where(live, parts.log_w + jnp.where(empty, 0.0, inc), parts.log_w))
        log_phi = jnp.where(live, phi_tok, parts.log_phi)
        cs = jax.vmap(gcd.advance, in_axes=(None, 0, 0))(fa, parts.cs, tok)
        cs = gcd.ConstraintState(jnp.where(live, cs.state, parts.cs.state), cs.t)
        if use_hmm:
            nu = jax.vmap(pgcd.hmm_update, in_axes=(None, None, 0, 0))(hA, hB, parts.u, tok)
            u = jnp.where(live[:, None], nu.astype(wdt), parts.u)
        else:
            u = parts.u
        tokens = parts.tokens.at[:, t].set(tok)
        lm_state, logp = lm.step(params, parts.lm_state, tok)
        parts = Particles(tokens, lm_state, logp, cs, u, log_w, log_phi, done)
        # --- resampling ---------------------------------------------------------------
        lw = log_w.reshape(B, K)
        ess = jax.vmap(resampling.ess)(lw)
        # only unfinished particles are resampled, among themselves: a finished particle's
        # weight is final (its EOS probability paid), an unfinished one's is not yet, so
        # resampling across the two would kill finished outputs of small weight that the
        # unfinished ones' later EOS factors would have restored (study 6b's ``ocean``)
        run_ = ~done.reshape(B, K)
        lw_run = jnp.where(run_, lw, -jnp.inf)
        n_run = jnp.sum(run_, axis=1)
        ess_run = jax.vmap(resampling.ess)(lw_run)
        any_live = jnp.any(jnp.isfinite(lw_run), axis=1)
        # so a prompt whose particles have all emitted EOS is never resampled (its ensemble
        # is final; resampling would only add noise) — the rule of run_blackbox too
        need = (ess_run < ess_threshold * n_run) & any_live & (n_run > 0) & (t < limit - 1)

        def do_resample(parts):
            kr, kp = jax.random.split(k_res)
            anc = jax.vmap(resampler)(jax.random.split(kr, B), lw_run)         # [B, K]
            # the j-th unfinished slot takes a uniformly chosen one of the K draws
            # (exchangeable, so each is distributed as w/Σw over the unfinished particles)
            perm = jax.vmap(lambda k: jax.random.permutation(k, K))(jax.random.split(kp, B))
            rank = jnp.cumsum(run_, axis=1) - 1
            pick = jnp.take_along_axis(anc, jnp.take_along_axis(perm, jnp.maximum(rank, 0),
                                                                axis=1), axis=1)
            anc = jnp.where(need[:, None] & run_, pick, jnp.arange(K)[None])
            idx = (anc + (jnp.arange(B) * K)[:, None]).reshape(N)
            new = jax.tree.map(lambda x: x[idx], parts)
            # the unfinished particles share their total weight equally: the sum of all
            # weights (and so the evidence estimate) is unchanged in expectation
            lme = jax.vmap(resampling.log_mean_exp)(lw_run) + jnp.log(
                jnp.maximum(K, 1) / jnp.maximum(n_run, 1)).astype(lw.dtype)
            lw2 = jnp.where(need[:, None] & run_, lme[:, None], lw).reshape(N).astype(wdt)
            return _shard(new._replace(log_w=lw2), sharding, N)

        parts = jax.lax.cond(jnp.any(need), do_resample, lambda p: p, parts)
        return parts, (ess, need)

    # A while loop over the steps that stops once every particle has emitted EOS: later
    # steps would only append EOS and keep every weight (done particles are frozen, and
    # a finished prompt is never resampled), so the weighted ensemble they leave is the
    # same. Those steps report the final ESS and no resampling.
    # step t draws with fold_in(key, t): the same whatever the static length n

    def cond(carry):
        t, parts, _, _ = carry
        return (t < limit) & ~jnp.all(parts.done)

    def body(carry):
        t, parts, ess_a, res_a = carry
        parts, (ess, need) = step(parts, (t, jax.random.fold_in(key, t)))
        return t + 1, parts, ess_a.at[t].set(ess), res_a.at[t].set(need)

    init = (jnp.int32(0), parts, jnp.zeros((n, B), wdt), jnp.zeros((n, B), bool))
    t_end, parts, ess, resampled = jax.lax.while_loop(cond, body, init)
    ess_end = jax.vmap(resampling.ess)(parts.log_w.reshape(B, K)).astype(ess.dtype)
    ess = jnp.where((jnp.arange(n) < t_end)[:, None], ess, ess_end[None])
    valid = gcd.is_final(fa, parts.cs.state)
    log_w = jnp.where(valid, parts.log_w, -jnp.inf).reshape(B, K)
    log_Z = jax.vmap(resampling.log_mean_exp)(log_w)
    return SMCResult(parts.tokens.reshape(B, K, n), log_w, log_Z, valid.reshape(B, K),
                     ess.T, resampled.T, steps=t_end)


def _defensive(lt, lpsi, a_gcd, lam):
    """The P-GCD proposals' defensive mixture ``q = (1 − λ)·q_P + λ·q_GCD`` per row, in log
    space: ``q_P ∝ exp(lt + lpsi)`` (``lpsi`` = ``log ψ`` or ``log p_prod``), ``q_GCD ∝
    exp(a_gcd)`` (``lt`` masked by GCD). Returns ``(log q [N, V], log-normaliser [N])``
    (normaliser 0, or ``−inf`` for a row where GCD allows nothing). Where ``q_P`` is empty
    (``ψ = 0`` at every token) ``q = q_GCD``; ``λ = 0`` gives ``q_P`` exactly."""
    aP = lt + lpsi
    lseP = jax.nn.logsumexp(aP, axis=-1, keepdims=True)
    lseG = jax.nn.logsumexp(a_gcd, axis=-1, keepdims=True)
    okP, okG = jnp.isfinite(lseP), jnp.isfinite(lseG)
    lqP = jnp.where(okP, aP - jnp.where(okP, lseP, 0.0), -jnp.inf)
    lqG = jnp.where(okG, a_gcd - jnp.where(okG, lseG, 0.0), -jnp.inf)
    mix = jnp.logaddexp(jnp.log1p(-lam) + lqP, jnp.log(lam) + lqG)   # λ = 1: log 0 + .. = -inf
    lq = jnp.where(lam > 0, jnp.where(okP, mix, lqG), lqP)
    lq = jnp.where(lam >= 1, lqG, lq)
    lse = jnp.where(okP | ((lam > 0) & okG), 0.0, -jnp.inf)[:, 0]
    return lq, lse


def run_blackbox(*args, **kwargs) -> SMCResult:
    """SMC with AWRS proposals for a constraint given as a Python predicate on the byte
    prefix (see :func:`jaxcd.decoding.smc_blackbox.run_blackbox`)."""
    from .smc_blackbox import run_blackbox as _rb
    return _rb(*args, **kwargs)
