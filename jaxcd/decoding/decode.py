"""Constrained sampling from a language model: unconstrained, LCD and GCD.

One jitted program per (LM, number of sequences, budget, method): a
``lax.while_loop`` over at most ``budget`` steps with fixed shapes and a ``done`` mask
(a finished sequence emits EOS; the loop stops once every sequence has finished, and
the output is EOS-padded to ``budget`` exactly as running every step would pad it). Per step and sequence::

    logp  = lm.step(...)                        # [V] next-token log-probabilities
    m     = mask(fa, tables, cs)                # GCD: β_{t+1}-live tokens; LCD: β_∞
    x     ~ softmax((logp + log m) / temperature)
    cs    = advance(fa, cs, x)

With GCD tables, every sampled sequence ends in ``⊥`` within the budget (docs/design.md
§3); LCD may run out of budget mid-output (``valid = False``).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..automata.tensorized import TensorizedAutomaton
from . import gcd
from .sampling import categorical_with_logprob

METHODS = ("none", "lcd", "gcd")


class SampleOutput(NamedTuple):
    """What :func:`sample` returns. ``logprob - proposal_logprob`` is each sample's
    importance log-weight ``log p_lm(x) / q(x)`` against the LM (docs/design.md §6): with
    GCD at temperature 1 it is ``Σ_t log Σ_v p_lm(v | x_<t) m_t(v)``, the log mass the
    masks kept, and its exponential has expectation ``p_lm(x ∈ L_n)`` under the
    proposal. For a target restricted to ``L_n`` multiply by ``valid`` (an LCD sample
    cut off by the budget has weight 0)."""

    tokens: jax.Array           # int32 [B, n]  (EOS-padded)
    valid: jax.Array            # bool [B]     ended in ⊥ (constraint met, EOS emitted)
    ended: jax.Array            # bool [B]     emitted EOS within the budget
    logprob: jax.Array          # float32 [B]  Σ log p_lm of the sampled tokens up to EOS
    proposal_logprob: jax.Array  # float32 [B] Σ log q of the same tokens (q: the
    #                              distribution actually sampled; NaN if greedy: no density)
    steps: jax.Array | None = None  # int32 []  decoding steps actually run (LM steps + 1);
    #                              divide timings by this, not by the budget


def masked_logits(fa: TensorizedAutomaton, tables: gcd.BudgetTables, cs: gcd.ConstraintState,
                  logp: jax.Array) -> jax.Array:
    """``logp`` float ``[B, V_lm]`` with every token outside the GCD/LCD mask of each row
    set to ``-inf`` (``cs``: one :class:`~jaxcd.decoding.gcd.ConstraintState` per row).

    Works on the packed words directly: one gather of ``W = ceil(V/32)`` uint32 per row
    (:func:`jaxcd.decoding.gcd.mask_words`), then a shift-and-test per logit fused into the
    ``where`` — no bool ``[B, V]`` mask is materialised. Ids ``>= fa.vocab_size`` (an LM
    head wider than the tokenizer) are disallowed; automaton ids beyond ``V_lm`` are
    dropped.
    """
    words = jax.vmap(gcd.mask_words, in_axes=(None, None, 0))(fa, tables, cs)   # [B, W]
    B, V = logp.shape
    W_need = -(-V // 32)
    if words.shape[1] < W_need:                      # LM head wider than the automaton
        words = jnp.pad(words, ((0, 0), (0, W_need - words.shape[1])))
    elif words.shape[1] > W_need:
        words = words[:, :W_need]
    ids = jnp.arange(V, dtype=jnp.uint32)
    bit = (words[:, ids >> 5] >> (ids & 31)) & jnp.uint32(1)             # [B, V], fused
    allowed = bit != 0
    if V > fa.vocab_size and -(-fa.vocab_size // 32) * 32 > fa.vocab_size:
        allowed = allowed & (jnp.arange(V) < fa.vocab_size)   # (bits past V_fa are 0 anyway)
    return jnp.where(allowed, logp, -jnp.inf)


def draw(key: jax.Array, logits: jax.Array, done: jax.Array, eos, *, greedy: bool = False):
    """The token draw that every decoding loop shares (:func:`sample`,
    :func:`sample_stepwise`, :func:`jaxcd.decoding.smc.run`, hmm_distill's sampler), with its EOS
    logic in one place.

    ``logits`` float ``[B, V]`` (``-inf`` = disallowed; already tempered and masked);
    ``done`` bool ``[B]``. ``key``: one key for the whole batch, or ``[B]`` keys (one per
    row). Returns ``(tok int32 [B], log_q [B], done' [B], empty [B])``:

    - ``tok ~ softmax(logits)`` (:func:`jaxcd.decoding.sampling.categorical_with_logprob`), or the
      argmax when ``greedy``;
    - rows already ``done`` and rows with no finite logit (``empty``) emit EOS;
    - ``log_q``: float32 ``log softmax(logits)[tok]`` — NaN when ``greedy`` (a point mass
      has no proposal density to report), ``-inf`` for ``empty`` rows;
    - ``done' = done | (tok == eos)``.
    """
    if greedy:
        tok = jnp.argmax(logits, axis=-1)
        lq = jnp.full(tok.shape, jnp.nan, jnp.float32)
    elif (key.ndim == 1 and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)) or \
            (key.ndim == 2 and not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)):
        # one key per row (typed [B] or raw uint32 [B, 2])
        tok, lq = jax.vmap(lambda k, l: tuple(x[0] for x in categorical_with_logprob(k, l[None])))(
            key, logits)
    else:
        tok, lq = categorical_with_logprob(key, logits)
    empty = ~jnp.any(jnp.isfinite(logits), axis=-1)
    tok = jnp.where(done | empty, eos, tok).astype(jnp.int32)
    lq = jnp.where(empty, -jnp.inf, lq)
    return tok, lq, done | (tok == eos), empty


def _select(k, logp, fa, tables, cs, done, total, temperature, eos, *, constrained: bool,
            greedy: bool):
    """One decoding step without the LM: mask, :func:`draw` (one key for the whole
    batch), bookkeeping, automaton advance (vmapped over the batch)."""
    masked = masked_logits(fa, tables, cs, logp) if constrained else logp
    tok, lq, new_done, empty = draw(k, masked / temperature, done, eos, greedy=greedy)
    # an empty mask (not reachable from a live GCD/LCD state; guarded) has no
    # proposal: log q = +inf makes the importance weight 0 (docs/design.md §6)
    lq = jnp.where(empty, jnp.inf, lq)
    lp = jnp.take_along_axis(logp, tok[:, None], axis=1)[:, 0]
    total_p, total_q = total
    total = (total_p + jnp.where(done, 0.0, lp), total_q + jnp.where(done, 0.0, lq))
    if constrained:
        cs = jax.vmap(gcd.advance, in_axes=(None, 0, 0))(fa, cs, tok)
    return tok, cs, new_done, total


def _check_eos(lm, fa, constrained, tables=None, budget=None):
    """Static checks where the LM, the automaton and the tables meet (shapes and ids are
    static, so these run while tracing too)."""
    if not constrained or fa is None:
        return
    if int(lm.eos_token_id) != int(fa.eos_id):
        raise ValueError(f"the LM's EOS id ({lm.eos_token_id}) differs from the automaton's "
                         f"({fa.eos_id}): compile the constraint with this model's vocabulary")
    if tables is not None:
        if tables.beta.shape[1] != fa.num_states:
            raise ValueError(f"the mask tables are for {tables.beta.shape[1]} states, the "
                             f"automaton has {fa.num_states}: build them for this automaton")
        if budget is not None and tables.beta.shape[0] - 1 < budget:
            raise ValueError(f"tables were built for {tables.beta.shape[0] - 1} steps, "
                             f"fewer than budget={budget}")


def _init_cs(fa, B: int, constrained: bool) -> gcd.ConstraintState:
    if constrained:
        return gcd.init_states(fa, B)
    return gcd.ConstraintState(jnp.zeros(B, jnp.int32), jnp.zeros(B, jnp.int32))


class Prefilled(NamedTuple):
    """A prompt batch run through the LM once (:func:`prefill`), to start several decodes
    from: :func:`sample` and :func:`jaxcd.decoding.smc.run` take it as ``prefilled=`` and skip
    their own prefill (methods, particle counts and seeds then share one prefill).

    ``state``: the LM state (KV cache with ``max_len`` slots); ``logp``: float32
    ``[B, V]`` next-token log-probabilities after each prompt; ``width``: the prompt
    batch's width ``P``; ``max_len``: the cache length (``P`` + the longest decode).

    A prefill of ONE prompt (``B = 1``) serves a decode of any number of rows of that
    same prompt (e.g. ``K`` samples): it is broadcast to the decoder's rows."""

    state: Any
    logp: jax.Array
    width: int
    max_len: int


def prefill(lm, params: Any, prompt_ids, prompt_lengths, max_len: int) -> Prefilled:
    """Prefill left-padded prompts ``[B, P]`` once, with room for ``max_len - P`` decode
    steps. Example (two methods, one prefill)::

        pre = decode.prefill(lm, params, ids, lens, ids.shape[1] + 64)
        a = decode.sample(k1, lm, params, ids, lens, fa, gcd_tables, budget=64,
                          constrained=True, prefilled=pre)
        b = smc.run(k2, lm, params, ids, lens, fa, budget=64, num_particles=8,
                    prefilled=pre)
    """
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    state, logp = lm.prefill(params, prompt_ids, jnp.asarray(prompt_lengths, jnp.int32),
                             int(max_len))
    return Prefilled(state, logp, int(prompt_ids.shape[1]), int(max_len))


def check_prefilled(pre: Prefilled, prompt_ids, max_steps: int) -> None:
    if pre.width != prompt_ids.shape[1] or pre.logp.shape[0] not in (1, prompt_ids.shape[0]):
        raise ValueError(f"prefilled= is for prompts [{pre.logp.shape[0]}, {pre.width}], not "
                         f"{list(prompt_ids.shape)}")
    if pre.max_len < pre.width + max_steps:
        raise ValueError(f"prefilled= has a cache of {pre.max_len} slots, fewer than the prompt "
                         f"width {pre.width} + {max_steps} max_steps: prefill with a larger max_len")


def broadcast_prefill(pre, B: int):
    """``(state, logp)`` of a prefill with 1 or ``B`` rows, as ``B`` rows (traceable)."""
    state, logp = pre
    if logp.shape[0] == B:
        return state, logp
    rows = logp.shape[0]
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (B,) + x.shape[1:])
                        if getattr(x, "ndim", 0) >= 1 and x.shape[0] == rows else x,
                        (state, logp))


def sample(key: jax.Array, lm, params: Any, prompt_ids: jax.Array, prompt_lengths: jax.Array,
           fa: TensorizedAutomaton | None, tables: gcd.BudgetTables | None, *,
           constrained: bool, budget=None, max_steps: int | None = None,
           temperature: float = 1.0, greedy: bool = False,
           prefilled: Prefilled | None = None) -> SampleOutput:
    """Sample up to ``budget`` tokens for every prompt (left-padded ``[B, P]``).

    ``budget`` (int, possibly traced; default: the tables' own budget when constrained,
    else ``max_steps``) is the budget enforced: tokens past it are EOS. ``max_steps``
    (static; default ``budget``) is the length of the loop and of ``tokens``, so that one
    compiled program (per LM, batch shape, ``max_steps`` bucket and automaton bucket)
    serves every budget ``≤ max_steps`` and every constraint of the bucket. Give at
    least one of the two. ``fa`` may be one automaton for every
    row or a stack with one per row (:func:`jaxcd.decoding.buckets.stack_automata`; ``tables``
    then from :func:`jaxcd.decoding.gcd.backward` of that stack). ``steps`` in the output counts
    the decoding steps actually run. ``prefilled``: the prompts already run through the
    LM (:func:`prefill`), for several decodes from one prefill."""
    if budget is None and max_steps is None:
        raise ValueError("sample: give budget= or max_steps=")
    if max_steps is None:
        if isinstance(budget, jax.core.Tracer):
            raise ValueError("sample: a traced budget needs a static max_steps=")
        max_steps = int(budget)
    if budget is None:
        budget = tables.limit() if (constrained and tables is not None) else max_steps
    gcd.check_steps(budget, int(max_steps))
    pre = None
    if prefilled is not None:
        check_prefilled(prefilled, prompt_ids, int(max_steps))
        pre = (prefilled.state, prefilled.logp)
    return _sample(key, lm, params, prompt_ids, prompt_lengths, fa, tables,
                   jnp.asarray(budget, jnp.int32), jnp.asarray(temperature, jnp.float32), pre,
                   budget=int(max_steps), constrained=constrained, greedy=greedy)


@partial(jax.jit, static_argnames=("lm", "budget", "constrained", "greedy"))
def _sample(key, lm, params, prompt_ids, prompt_lengths, fa, tables, limit, temperature, pre, *,
            budget: int, constrained: bool, greedy: bool) -> SampleOutput:
    # ``budget`` (static) is the loop length max_steps; ``limit`` the budget enforced
    if constrained:
        from .buckets import flatten
        fa = flatten(fa)
    _check_eos(lm, fa, constrained, tables, budget)
    B = prompt_ids.shape[0]
    max_len = prompt_ids.shape[1] + budget
    if pre is None:
        lm_state, logp = lm.prefill(params, prompt_ids, prompt_lengths, max_len)
    else:
        lm_state, logp = broadcast_prefill(pre, B)
    eos = lm.eos_token_id
    cs = _init_cs(fa, B, constrained)

    # step t draws with fold_in(key, t): the same draws whatever the static length, so a
    # budget bucket N >= n gives the tokens that budget=n would

    # A while loop, not a scan: it stops once every row has emitted EOS. The steps it
    # leaves out would only append EOS to finished rows (``draw``), add nothing to the
    # log-probabilities (``_select``) and keep their automaton state, so the result is
    # the same as running all ``budget`` steps, without the LM work of the padding.
    def cond(carry):
        t, _, _, _, done, _, _ = carry
        return (t < limit) & ~jnp.all(done)

    def step(carry):
        t, lm_state, logp, cs, done, total, toks = carry
        tok, cs, done, total = _select(jax.random.fold_in(key, t), logp, fa, tables, cs, done,
                                       total, temperature,
                                       eos, constrained=constrained, greedy=greedy)
        lm_state, logp = lm.step(params, lm_state, tok)
        return t + 1, lm_state, logp, cs, done, total, toks.at[:, t].set(tok)

    zero = jnp.zeros(B, jnp.float32)
    init = (jnp.int32(0), lm_state, logp, cs, jnp.zeros(B, bool), (zero, zero),
            jnp.full((B, budget), eos, jnp.int32))
    steps, _, _, cs, done, total, toks = jax.lax.while_loop(cond, step, init)
    valid = gcd.is_final(fa, cs.state) if constrained else done
    return SampleOutput(toks, valid, done, *total, steps)


def tables_for(fa: TensorizedAutomaton, method: str, budget: int,
               max_steps: int | None = None) -> gcd.BudgetTables | None:
    """β tables for ``method`` ('gcd' checks the budget first and names the minimum);
    ``max_steps``: their static length (a budget bucket, default ``budget``)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "gcd":
        gcd.check_budget(fa, budget)
        return gcd.backward(fa, budget, max_steps)
    if method == "lcd":
        return gcd.lcd_tables(fa, budget, max_steps)
    return None


# ---------------------------------------------------------------------------------------
# step-wise sampling: a host loop around the LM's own compiled step
# ---------------------------------------------------------------------------------------
@partial(jax.jit, static_argnames=("constrained", "greedy"))
def _select_jit(keys, t, logp, fa, tables, cs, done, total, temperature, eos, *,
                constrained: bool, greedy: bool):
    return _select(jax.random.fold_in(keys, t), logp, fa, tables, cs, done, total, temperature, eos,
                   constrained=constrained, greedy=greedy)


@partial(jax.jit, static_argnums=0, donate_argnums=2)
def _lm_step_donated(lm, params, state, tokens):
    return lm.step(params, state, tokens)


def sample_stepwise(key: jax.Array, lm, params: Any, prompt_ids, prompt_lengths,
                    fa: TensorizedAutomaton | None, tables: gcd.BudgetTables | None, *,
                    budget: int, max_len: int, constrained: bool, temperature: float = 1.0,
                    greedy: bool = False, stop_when_done: bool = True,
                    jit_lm: bool = True) -> SampleOutput:
    """Like :func:`sample`, but the loop over the ``budget`` steps runs on the host.

    Per step it calls the LM's step (compiled once per LM, batch size and ``max_len``)
    and ONE small jitted function that masks, samples and advances the automata of
    the whole batch (compiled per constraint/table shape, in well under a second). So
    many constraints, budgets and methods reuse a single compiled LM — what
    :func:`sample` cannot do, since it compiles one program per (LM, batch, budget,
    method, constraint shape). Keep the batch size, the prompt width (left-pad with
    :func:`~jaxcd.lm.interface.pad_prompts` and ``length=``) and ``max_len`` fixed
    across calls to avoid recompiling the LM.

    Same randomness as :func:`sample`: step ``t`` draws the whole batch with
    ``fold_in(key, t)``, so given the same log-probabilities the
    tokens are the same (bit-identical for :class:`~jaxcd.lm.interface.TableLM`; for a
    real LM, XLA may round the scanned program's logits differently from the stand-alone
    step's, so a rare near-tie draw can differ — the distribution is the same). ``max_len`` (static for the LM) must be at least ``prompt_len + budget - 1``
    (the last token is never fed back). With ``stop_when_done`` (default) the loop
    stops as soon as every row has emitted EOS and pads the rest with EOS, exactly as
    :func:`sample` would have produced them.

    ``jit_lm=True`` runs ``lm.step`` under a jit that donates the LM state (the KV
    cache is updated in place instead of copied every step); ``jit_lm=False`` calls
    ``lm.step`` as is (host-side LMs such as :class:`~jaxcd.lm.torch_adapter.TorchLM`).
    """
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
    B, P = prompt_ids.shape
    budget = int(budget)
    if budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget}")
    if max_len < P + budget - 1:
        raise ValueError(f"max_len={max_len} cannot hold the prompt ({P} slots) and "
                         f"{budget - 1} fed-back tokens (need >= {P + budget - 1})")
    if constrained:
        if fa is None or tables is None:
            raise ValueError("constrained=True needs fa and tables")
        _check_eos(lm, fa, constrained)
        if tables.beta.shape[0] - 1 < budget:
            raise ValueError(f"tables were built for {tables.beta.shape[0] - 1} steps, "
                             f"fewer than budget={budget}")
    eos = jnp.int32(lm.eos_token_id)
    temperature = jnp.float32(temperature)
    keys = key
    lm_state, logp = lm.prefill(params, prompt_ids, prompt_lengths, int(max_len))
    if constrained:
        from .buckets import flatten
        fa = flatten(fa)
    cs = _init_cs(fa, B, constrained)
    done = jnp.zeros(B, bool)
    total = (jnp.zeros(B, jnp.float32), jnp.zeros(B, jnp.float32))
    step_fn = (lambda st, tok: _lm_step_donated(lm, params, st, tok)) if jit_lm else \
        (lambda st, tok: lm.step(params, st, tok))
    toks = []
    for t in range(budget):
        tok, cs, done, total = _select_jit(keys, np.int32(t), logp, fa, tables, cs, done, total,
                                           temperature, eos, constrained=constrained,
                                           greedy=greedy)
        toks.append(tok)
        if t + 1 == budget or (stop_when_done and bool(jnp.all(done))):
            break
        lm_state, logp = step_fn(lm_state, tok)
    tokens = jnp.stack(toks, axis=1)
    steps = tokens.shape[1]
    if tokens.shape[1] < budget:
        tokens = jnp.pad(tokens, ((0, 0), (0, budget - tokens.shape[1])),
                         constant_values=lm.eos_token_id)
    valid = gcd.is_final(fa, cs.state) if constrained else done
    return SampleOutput(tokens, valid, done, *total, jnp.int32(steps))
