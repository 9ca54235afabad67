"""GCD and LCD on the device (JAX) — docs/design.md §3.

Pure functions over a :class:`~jaxcd.automata.tensorized.TensorizedAutomaton` ``fa``
(whose arrays should be on the device: ``fa = fa.to_device()``). All work on one
sequence and ``vmap`` over particles with fixed shapes.

Backward (once per constraint and budget ``n``)::

    β_n = f
    β_t = 1{ T_out · ((T_in β_{t+1}) ∘ (B_f 1_V)) }          t = n-1 … 0

in index form: ``β_t[s] = max_{e: src(e)=s} β_{t+1}[dst(e)]`` (every stored edge has
a non-empty label). ``tables.beta[t, s] = 1`` iff some path of exactly ``n - t``
tokens leads from ``s`` to ``⊥``.

Forward (per step; the token-level automaton is deterministic, so the state set
``a_t`` is one state ``s``)::

    w_{t+1} = (T_outᵀ a_t) ∘ (T_in β_{t+1})
    m_{t+1} = 1{ w_{t+1}ᵀ B_f }      = cum_masks[row_index[base[s] + Σ_e w_{t+1}[e]]]
    a_{t+1} = δ(s, x_{t+1})

(the one-row form is exact: live edges are a prefix of the dist-sorted edge list,
see :mod:`jaxcd.automata.tensorized`). LCD uses ``β_∞ = 1`` on every live state (the
automaton is trimmed) — no budget guarantee.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..automata.tensorized import TensorizedAutomaton
from ..errors import BudgetTooSmallError


class BudgetTables(NamedTuple):
    """``beta``: bool ``[N + 1, num_states]``; ``beta[t]`` is ``β_t`` for budget ``n``
    (for LCD, every row is ``β_∞``). ``N ≥ n`` is the tables' static length (a budget
    *bucket*, so that one compiled program serves every budget up to ``N``); ``n`` (int32
    scalar, possibly traced) is the budget itself, ``None`` meaning ``N``. Rows past ``n``
    are never read as masks (the budget is spent there).

    ``live_out``: int32 ``[n + 1, num_states]``, ``live_out[t, s] = Σ_{e: src(e)=s}
    β_t(dst e)`` — the number of live out-edges, i.e. ``Σ_e w_t[e]`` of docs/design.md §3 for
    the state set ``{s}``. Precomputed once with the tables so that a mask step is two
    scalar gathers and one row gather (computing it per step from ``beta`` made the
    vmapped mask 4-6x slower on CPU). ``None`` (tables built by hand): computed from
    ``beta`` at each step.
    """

    beta: jax.Array
    live_out: jax.Array | None = None
    n: jax.Array | None = None

    @property
    def max_steps(self) -> int:
        """Static length ``N`` (rows ``0..N``)."""
        return self.beta.shape[0] - 1

    @property
    def budget(self):
        """The budget ``n`` (host side: an int)."""
        return self.max_steps if self.n is None else int(self.n)

    def limit(self):
        """The budget as a (possibly traced) scalar, for jitted code."""
        return self.max_steps if self.n is None else self.n


class ConstraintState(NamedTuple):
    """Per-sequence constraint state a particle carries: automaton state and the
    number of tokens generated so far (EOS padding included)."""

    state: jax.Array   # int32 []
    t: jax.Array       # int32 []


def check_budget(fa: TensorizedAutomaton, budget: int) -> None:
    """Raise :class:`BudgetTooSmallError` (naming the smallest budget that works) if
    ``β_0(s_0) = 0`` (for a stack of automata: for any row). Host-side, before any
    decoding."""
    if not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ValueError(f"budget must be a positive integer (tokens, EOS included), got {budget!r}")
    dist, init = np.asarray(fa.dist), np.asarray(fa.initial_state)
    if dist.ndim == 1:
        need, which = int(dist[init]), None
    else:
        needs = dist[np.arange(dist.shape[0]), init]
        which = int(np.argmax(needs))
        need = int(needs[which])
    if need > budget:
        what = f"constraint {fa.key!r}" if fa.key else "the constraint"
        if which is not None:
            what = f"the constraint of row {which}"
        raise BudgetTooSmallError(int(budget), need, what)


def check_steps(budget, max_steps: int) -> None:
    """The budget must fit the static length ``max_steps`` (host side, when concrete)."""
    if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    if not isinstance(budget, jax.core.Tracer) and int(budget) > int(max_steps):
        raise ValueError(f"budget {int(budget)} exceeds max_steps={max_steps}")


def is_final(fa: TensorizedAutomaton, state: jax.Array) -> jax.Array:
    """True where ``state`` is ``⊥`` (the only state at distance 0 from ``⊥``; works
    for a flattened stack too, which has one ``⊥`` per row)."""
    return jnp.take(fa.dist, state, mode="clip") == 0


def backward(fa: TensorizedAutomaton, budget, max_steps: int | None = None) -> BudgetTables:
    """β tables for budget ``n`` by the backward recursion (a ``lax.scan`` of
    ``max_steps`` steps; default ``max_steps = budget``). ``budget`` may be traced: one
    compiled program per automaton bucket and ``max_steps`` serves every budget
    ``n ≤ max_steps``. ``fa`` may be a
    stack (:func:`jaxcd.decoding.buckets.stack_automata`): the tables are then those of its
    flattened form (:func:`jaxcd.decoding.buckets.flatten`), which every decoder uses."""
    if max_steps is None:
        max_steps = int(budget)
    check_steps(budget, max_steps)
    return _backward(fa, jnp.asarray(budget, jnp.int32), steps=int(max_steps))


@partial(jax.jit, static_argnames=("steps",))
def _backward(fa: TensorizedAutomaton, n: jax.Array, *, steps: int) -> BudgetTables:
    from .buckets import flatten
    fa = flatten(fa)
    S = fa.num_states
    rem0 = fa.dist == 0            # paths of exactly r tokens to ⊥, r = 0 ... steps

    def step(b_next, _):
        b = jax.ops.segment_max(b_next[fa.edge_dst].astype(jnp.int32), fa.edge_src,
                                num_segments=S) > 0
        return b, b

    _, rems = jax.lax.scan(step, rem0, None, length=steps)
    rem = jnp.concatenate([rem0[None], rems], axis=0)                  # [steps + 1, S]
    # β_t for budget n needs a path of n - t tokens (rows past n: ⊥ only, never read)
    beta = rem[jnp.clip(n - jnp.arange(steps + 1), 0, steps)]
    return BudgetTables(beta, live_out_counts(fa, beta), n)


def live_out_counts(fa: TensorizedAutomaton, beta: jax.Array) -> jax.Array:
    """``live_out[t, s] = Σ_{e: src(e)=s} beta[t, dst(e)]``: int32 ``[T, num_states]``."""
    per_edge = beta[:, fa.edge_dst].astype(jnp.int32).T                 # [E, T]
    return jax.ops.segment_sum(per_edge, fa.edge_src, num_segments=fa.num_states).T


def lcd_tables(fa: TensorizedAutomaton, budget, max_steps: int | None = None) -> BudgetTables:
    """Tables that make :func:`mask` compute the LCD mask for ``budget`` steps (may be
    traced when ``max_steps``, the static length, is given)."""
    if max_steps is None:
        max_steps = int(budget)
    check_steps(budget, max_steps)
    return _lcd_tables(fa, jnp.asarray(budget, jnp.int32), steps=int(max_steps))


@partial(jax.jit, static_argnames=("steps",))
def _lcd_tables(fa, n, *, steps):
    from .buckets import flatten
    fa = flatten(fa)
    live = jnp.asarray(fa.dist) < (1 << 30)
    beta = jnp.broadcast_to(live, (steps + 1, fa.num_states))
    return BudgetTables(beta, live_out_counts(fa, beta), n)


def init_state(fa: TensorizedAutomaton) -> ConstraintState:
    """Start state of one automaton (for a flattened stack, see :func:`init_states`)."""
    return ConstraintState(jnp.asarray(fa.initial_state, jnp.int32).reshape(()), jnp.int32(0))


def init_states(fa: TensorizedAutomaton, num_rows: int, per_row: int = 1) -> ConstraintState:
    """Start states ``[num_rows · per_row]``: ``fa.initial_state`` broadcast, or, for a
    flattened stack (``initial_state [num_rows]``), each row's own start state repeated
    ``per_row`` times (e.g. ``K`` particles per prompt)."""
    init = jnp.asarray(fa.initial_state, jnp.int32)
    if init.ndim == 0:
        state = jnp.full((num_rows * per_row,), init, jnp.int32)
    else:
        if init.shape[0] != num_rows:
            raise ValueError(f"{init.shape[0]} stacked automata for {num_rows} prompt rows: "
                             "give one automaton per row")
        state = jnp.repeat(init, per_row)
    return ConstraintState(state, jnp.zeros(num_rows * per_row, jnp.int32))


def _num_live_edges(fa, beta_next, state):
    return jnp.sum(beta_next[fa.out_dst[state]].astype(jnp.int32))


def mask_words(fa: TensorizedAutomaton, tables: BudgetTables, cs: ConstraintState) -> jax.Array:
    """Bit-packed next-token mask, uint32 ``[W]``; all zero once the budget is spent.

    Also works on a batch as it is: ``cs`` with leading axes ``[...]`` gives
    ``[..., W]`` (one gather for the whole batch; what :data:`batched_mask_words`
    does). ``vmap`` gives the same result."""
    n = tables.limit()
    t_next = jnp.minimum(cs.t + 1, n)
    if tables.live_out is not None:
        k = tables.live_out[t_next, cs.state]
    else:
        k = _num_live_edges(fa, tables.beta[t_next], cs.state)
    # Once the budget is spent, take k = 0: row base[s] is the empty union. Selecting
    # the row index (a scalar) instead of the words keeps the whole mask one row
    # gather; a select over the W gathered words made XLA:CPU fuse it into a scalar
    # loop (measured 37 µs -> 10 µs per call on CPU).
    k = jnp.where(cs.t < n, k, 0)
    row = jnp.take(fa.row_index, fa.out_start[cs.state] + cs.state + k, mode="clip")
    # Materialise the row indices before the gather: fused into it, XLA:CPU recomputes
    # them per word (a batch of 64 took 2x longer). `clip` drops the bounds select.
    row = jax.lax.optimization_barrier(row)
    return jnp.take(fa.cum_masks, row, axis=0, mode="clip")


def unpack(words: jax.Array, vocab_size: int) -> jax.Array:
    """uint32 ``[..., W]`` -> bool ``[..., vocab_size]``."""
    bits = (words[..., :, None] >> jnp.arange(32, dtype=jnp.uint32)) & jnp.uint32(1)
    return bits.reshape(words.shape[:-1] + (-1,))[..., :vocab_size].astype(bool)


def mask(fa: TensorizedAutomaton, tables: BudgetTables, cs: ConstraintState) -> jax.Array:
    """Next-token mask, bool ``[vocab_size]``: ``m_{t+1}`` of docs/design.md §3."""
    return unpack(mask_words(fa, tables, cs), fa.vocab_size)


def out_edge(fa: TensorizedAutomaton, state: jax.Array, token: jax.Array
             ) -> tuple[jax.Array, jax.Array]:
    """``(found, j)``: whether ``token`` is allowed from ``state``, and the index ``j`` of
    the out-edge (column of ``fa.out_dst[state]``) that takes it."""
    D = fa.out_dst.shape[-1]
    start = fa.out_start[state]
    deg = fa.out_start[state + 1] - start
    rows = start + state + 1 + jnp.arange(D)
    rows = fa.row_index[jnp.minimum(rows, fa.row_index.shape[0] - 1)]
    word = fa.cum_masks[rows, token >> 5]
    hit = ((word >> (token & 31).astype(jnp.uint32)) & 1).astype(bool) & (jnp.arange(D) < deg)
    return jnp.any(hit), jnp.argmax(hit)


def next_state(fa: TensorizedAutomaton, state: jax.Array, token: jax.Array) -> jax.Array:
    """``δ(state, token)``; ``fa.dead_state`` if the token is not allowed from ``state``."""
    found, first = out_edge(fa, state, token)
    return jnp.where(found, fa.out_dst[state, first], fa.dead_state).astype(jnp.int32)


def advance(fa: TensorizedAutomaton, cs: ConstraintState, token: jax.Array) -> ConstraintState:
    """State after emitting ``token``."""
    return ConstraintState(next_state(fa, cs.state, token), cs.t + 1)


def is_accepting(fa: TensorizedAutomaton, cs: ConstraintState) -> jax.Array:
    """True once the sequence has ended in ``⊥`` (a valid output followed by EOS)."""
    return is_final(fa, cs.state)


# Jitted entry points for single sequences; vmap them (or jit(vmap(...))) for particles.
mask_jit = jax.jit(mask)
mask_words_jit = jax.jit(mask_words)
advance_jit = jax.jit(advance)
batched_mask_words = jax.jit(mask_words)   # cs with a leading batch axis
batched_advance = jax.jit(jax.vmap(advance, in_axes=(None, 0, 0)))


@partial(jax.jit, static_argnames=("num_walks",))
def random_walks(key: jax.Array, fa: TensorizedAutomaton, tables: BudgetTables,
                 num_walks: int) -> tuple[jax.Array, jax.Array]:
    """Masked random walks: ``num_walks`` sequences of ``n`` tokens, each token drawn
    uniformly from the current mask (a stand-in for an LM; used by tests and the
    demo). Returns ``(tokens int32 [num_walks, n], final_state int32 [num_walks])``.
    A walk whose mask is empty (possible under LCD tables) keeps emitting EOS and
    stays in its state (it will not be accepting)."""
    n = tables.beta.shape[0] - 1

    def one(k):
        def step(cs, k_t):
            m = mask(fa, tables, cs)
            logits = jnp.where(m, 0.0, -jnp.inf)
            tok = jax.random.categorical(k_t, logits)
            tok = jnp.where(jnp.any(m), tok, fa.eos_id).astype(jnp.int32)
            nxt = advance(fa, cs, tok)
            nxt = ConstraintState(jnp.where(jnp.any(m), nxt.state, cs.state), nxt.t)
            return nxt, tok

        cs, toks = jax.lax.scan(step, init_state(fa), jax.random.split(k, n))
        return toks, cs.state

    return jax.vmap(one)(jax.random.split(key, num_walks))
