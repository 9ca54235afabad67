"""Continuous batching: a stream of requests, each with its own constraint, through a
fixed set of ``rows`` batch rows; a row whose request has finished takes the next one.

:func:`jaxcd.decoding.decode.sample` decodes a batch as one unit: it runs until its
longest row ends, so rows that finish early idle. With requests of unequal length (the
usual case: a short enum next to a long object) most of a static batch's steps are
spent on finished rows. :func:`serve` keeps every row busy instead:

1. requests are prefilled ``group`` at a time (the next waiting request and the next
   ones of its prompt class; a group is prefilled at ``group`` rows whatever it holds)
   and held; their rows enter free batch rows as these come, one insert call per
   held group and round: KV entries, next-token log-probabilities, automaton (one row
   of a stacked automaton, :func:`jaxcd.decoding.buckets.stack_automata`) and β tables
   (the insert program has the group's shape; the group's rows not entering are
   dropped, so a partial insert compiles nothing new);
2. one jitted program runs decode steps for the whole batch until a row has finished
   while requests wait (or every row has, when none does);
3. the host collects the finished rows' outputs and fills those rows at once from the
   held group (prefilling the next group when none is held); back to 2. No row idles
   waiting for ``group`` rows to free up (the earlier scheme waited for whole groups:
   occupancy 0.85 against 0.94 on the serving benchmark's stream).

Every shape is fixed by the engine's buckets (rows, prompt width, budget bucket,
automaton bucket, and the insert group's prompt bucket), so after one warm-up per bucket
no request compiles anything.

**Same draws as one by one.** Each request carries its own key; step ``t`` of a request
draws with ``fold_in(key, t)``, exactly what :func:`~jaxcd.decoding.decode.sample` does for
a batch of one. With an LM whose log-probabilities do not depend on the batch's other
rows (e.g. :class:`~jaxcd.lm.interface.TableLM`) a request gets bit-for-bit the tokens of
``decode.sample`` with its key (tested); a real LM's logits can differ in the last bits
with the batch composition, so only a near-tie draw can differ.

**The KV cache** (:class:`~jaxcd.lm.llama.JaxLM`'s layout: ``k [B, L, n_kv, D, S]``,
``v [B, L, n_kv, S, D]``, ``offset [B]``, one write slot ``s`` shared by the rows) has
``S = P + 2N`` slots for prompt width ``P`` and budget bucket ``N``. The requests inserted
together are prefilled at their own prompt bucket ``P_g ≤ P`` (the longest prompt of the
group, rounded up: a prefill costs its width, and most prompts of a stream are far shorter
than its longest), and a request inserted at slot ``s`` (``s ≥ P``) gets its prompt's keys
and values in slots ``[s - P_g, s)`` and ``offset = s - len(prompt)``, so its positions are
those of a stand-alone prefill. Before
an insertion that would leave fewer than ``N`` free slots, the cache is shifted left by
``δ = min(s - P, min offset of the live rows)`` (one roll of the cache, every ``~N``
steps): live rows lose nothing, and afterwards ``s ≤ P + N``, so there is room for a
whole budget. LMs whose state has no positions (every leaf per row, e.g. ``TableLM``)
are handled by replacing the row's state.

Budgets: one budget ``n`` (≤ the bucket ``N``) for every request of a call; the β tables
of each request are its own automaton's (built for ``G`` new rows at a time and written
into the stack's tables).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..automata.tensorized import TensorizedAutomaton, pad_automaton
from . import gcd
from .buckets import budget_bucket, common_bucket, flatten, pad_prompts, prompt_bucket
from .decode import draw, masked_logits, tables_for

__all__ = ["Request", "Finished", "ServeStats", "ServePolicy", "serve", "stack_bytes", "shared_prefix_len",
           "stream_prefix_len", "insert_classes", "rest_bucket"]


class Request(NamedTuple):
    """One request: ``prompt_ids`` (token ids, not padded), ``fa`` (its automaton, or
    ``None`` for unconstrained decoding) and ``key`` (a ``jax.random.PRNGKey``; its step
    ``t`` draws with ``fold_in(key, t)``)."""

    prompt_ids: Sequence[int]
    fa: TensorizedAutomaton | None
    key: Any


class Finished(NamedTuple):
    """The output of one request (host arrays), in the fields of
    :class:`~jaxcd.decoding.decode.SampleOutput` for a batch of one, plus ``steps``: the
    decoding steps this request took (tokens drawn, EOS included)."""

    tokens: np.ndarray          # int32 [budget_bucket], EOS-padded
    valid: bool
    ended: bool
    logprob: float
    proposal_logprob: float
    steps: int


@dataclass
class ServeStats:
    """What one :func:`serve` call did: ``steps`` (batch decode steps run, each one LM
    step for all ``rows``), ``chunks`` (decode calls), ``inserts`` (insert calls, each up
    to ``group`` requests of one prefilled group), ``prefills`` (prefill calls, each
    ``group`` rows), ``shifts`` (cache shifts), ``row_steps`` (Σ over requests of
    their own steps: ``row_steps / (steps · rows)`` is the share of row-steps that did
    useful work), ``groups`` (automaton buckets served, in order), ``prefill_tokens``
    (prompt tokens run through the LM by the inserts, padding included), ``padding_rows``
    (prefill rows that held no request: only the stream's last group has any),
    ``prefix_tokens`` (the prompts' shared prefix, prefilled once; 0 if none)."""

    rows: int = 0
    steps: int = 0
    chunks: int = 0
    inserts: int = 0
    shifts: int = 0
    row_steps: int = 0
    groups: list = field(default_factory=list)
    decode_s: float = 0.0
    insert_s: float = 0.0
    prefill_tokens: int = 0      # Σ over insert calls of group rows × prefill width
    padding_rows: int = 0        # insert rows that held no request (prefilled all the same)
    prefix_tokens: int = 0       # the shared prompt prefix prefilled once (0: none)
    prefills: int = 0            # prefill calls (each up to ``group`` requests)

    @property
    def occupancy(self) -> float:
        """Share of the batch's row-steps that decoded a live request."""
        return self.row_steps / max(self.steps * self.rows, 1)


# ------------------------------------------------------------------ the LM state, by layout
def _is_kv(state) -> bool:
    return isinstance(state, dict) and {"k", "v", "slot", "offset"} <= set(state)


_SHAPES: dict = {}


def _prefill_shapes(lm, params, B: int, P: int, max_len: int):
    """Shapes of ``lm.prefill``'s output (traced once per LM, params layout and sizes)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    key = (lm, B, P, max_len, treedef,
           tuple((tuple(np.shape(x)), str(getattr(x, "dtype", ""))) for x in leaves))
    if key not in _SHAPES:
        if len(_SHAPES) > 64:
            _SHAPES.clear()
        _SHAPES[key] = jax.eval_shape(
            lambda p: lm.prefill(p, jnp.zeros((B, P), jnp.int32), jnp.ones((B,), jnp.int32),
                                 max_len), params)
    return _SHAPES[key]


def _empty_state(lm, params, B: int, P: int, max_len: int):
    """An LM state of ``B`` empty rows with room for ``max_len`` slots, write slot ``P``."""
    shapes = _prefill_shapes(lm, params, B, P, max_len)
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0])
    logp = jnp.zeros(shapes[1].shape, shapes[1].dtype)
    if _is_kv(state):
        state = dict(state, slot=jnp.full((B,), P, jnp.int32), offset=jnp.full((B,), P, jnp.int32))
    return state, logp


def _insert_state(state, rows, new, s, P: int):
    """Rows ``rows`` [G] (``B`` = dropped) of ``state`` replaced by the prefilled ``new``
    (``G`` rows, prompt width ``P``), written at slots ``[s - P, s)``."""
    if not _is_kv(state):
        return jax.tree.map(lambda x, y: x.at[rows].set(y, mode="drop"), state, new)
    B = state["k"].shape[0]
    z = jnp.zeros((), jnp.int32)
    k, v = state["k"], state["v"]

    def put(i, kv):
        k, v = kv
        b = rows[i]
        ok = b < B
        bb = jnp.minimum(b, B - 1)
        kn = jax.lax.dynamic_slice_in_dim(new["k"], i, 1, 0)[..., :P]
        vn = jax.lax.dynamic_slice_in_dim(new["v"], i, 1, 0)[..., :P, :]
        ko = jax.lax.dynamic_slice(k, (bb, z, z, z, s - P), kn.shape)
        vo = jax.lax.dynamic_slice(v, (bb, z, z, s - P, z), vn.shape)
        k = jax.lax.dynamic_update_slice(k, jnp.where(ok, kn, ko), (bb, z, z, z, s - P))
        v = jax.lax.dynamic_update_slice(v, jnp.where(ok, vn, vo), (bb, z, z, s - P, z))
        return k, v

    k, v = jax.lax.fori_loop(0, rows.shape[0], put, (k, v))
    offset = state["offset"].at[rows].set(s - P + new["offset"], mode="drop")
    return dict(state, k=k, v=v, offset=offset)


def _shift_state(state, delta):
    """The cache shifted ``delta`` slots to the left (``slot`` and ``offset`` too)."""
    if not _is_kv(state):
        return state
    S = state["v"].shape[3]
    idx = (jnp.arange(S) + delta) % S
    return dict(state, k=jnp.take(state["k"], idx, axis=4), v=jnp.take(state["v"], idx, axis=3),
                slot=state["slot"] - delta, offset=jnp.maximum(state["offset"] - delta, 0))


# --------------------------------------------------------------------------- the programs
class _Carry(NamedTuple):
    lm_state: Any
    logp: jax.Array          # [B, V]
    state: jax.Array         # int32 [B]  automaton state (flattened ids)
    t: jax.Array             # int32 [B]  tokens drawn by the row's request
    done: jax.Array          # bool [B]   emitted EOS
    active: jax.Array        # bool [B]   holds a request not yet collected
    lp: jax.Array            # float32 [B]
    lq: jax.Array            # float32 [B]
    toks: jax.Array          # int32 [B, N]
    keys: jax.Array          # uint32 [B, 2]


def _finished(c: _Carry, limit):
    return c.active & (c.done | (c.t >= limit))


def _stack_rows(fas: Sequence[TensorizedAutomaton], bucket) -> TensorizedAutomaton:
    """The automata of ``fas`` padded to ``bucket`` and stacked ``[G, ...]`` (host
    arrays), as :func:`~jaxcd.decoding.buckets.stack_automata` lays them out, except
    ``out_dst``, which is left out (shape ``[G, S, 0]``): the decode loop reads a
    transition's target from ``edge_dst`` at ``out_start[state] + j``
    (:func:`_next_state_stacked`), the same entry in the canonical layout. ``out_dst``
    padded to the bucket's out-degree is the largest table of a stack after the masks
    (``S × D`` ids: 16 MiB per row at bucket (4096, ·, 1024, ·), for automata whose real
    out-degree is a few dozen). Each automaton is padded once, straight into the stack,
    with only its own mask rows copied (the rest of the bucket's rows stay zero)."""
    S, E, D, R = (int(x) for x in bucket)
    G = len(fas)
    W = int(fas[0].cum_masks.shape[1])
    out = {"edge_src": np.empty((G, E), np.int32), "edge_dst": np.empty((G, E), np.int32),
           "out_start": np.empty((G, S + 1), np.int32),
           "out_dst": np.zeros((G, S, 0), np.int32),
           "cum_masks": np.zeros((G, R, W), np.uint32),
           "row_index": np.empty((G, E + S), np.int32), "dist": np.empty((G, S), np.int32),
           "initial_state": np.empty((G,), np.int32), "final_state": np.empty((G,), np.int32),
           "dead_state": np.empty((G,), np.int32)}
    for g, fa in enumerate(fas):
        if fa.num_states > S or fa.num_edges > E or fa.out_dst.shape[1] > D or \
                fa.cum_masks.shape[0] > R:
            raise ValueError(f"automaton {fa.key!r} ({fa.bucket}) does not fit bucket {bucket}")
        p, _ = pad_automaton(fa, num_states=S, num_edges=E,
                             max_out_degree=int(fa.out_dst.shape[1]),
                             num_mask_rows=int(fa.cum_masks.shape[0]), key=fa.key)
        for k in ("edge_src", "edge_dst", "out_start", "row_index", "dist", "initial_state",
                  "final_state", "dead_state"):
            out[k][g] = getattr(p, k)
        out["cum_masks"][g, :p.cum_masks.shape[0]] = p.cum_masks
    return TensorizedAutomaton(**out, vocab_size=fas[0].vocab_size, eos_id=fas[0].eos_id,
                               key="stack")


def _flat_view(fa: TensorizedAutomaton, D: int) -> TensorizedAutomaton:
    """:func:`~jaxcd.decoding.buckets.flatten` of a :func:`_stack_rows` stack (no
    ``out_dst``), with an ``out_dst`` of shape ``[0, D]``: :func:`gcd.out_edge` reads
    the out-degree ``D`` from it, and any other read fails instead of reading wrong
    ids."""
    ffa = flatten(fa)
    object.__setattr__(ffa, "out_dst", jnp.zeros((0, D), jnp.int32))
    return ffa


def _next_state_stacked(ffa: TensorizedAutomaton, state, tok):
    """``gcd.next_state`` of the flattened stack for each row's flat ``state`` [B] and
    token: the out-edge ``j`` found on ``ffa``, its target ``edge_dst[out_start[state] +
    j]`` (flat ids already: :func:`~jaxcd.decoding.buckets.flatten` offsets both)."""
    found, j = jax.vmap(gcd.out_edge, in_axes=(None, 0, 0))(ffa, state, tok)
    e = jnp.minimum(ffa.out_start[state] + j, ffa.edge_dst.shape[0] - 1)
    return jnp.where(found, ffa.edge_dst[e], ffa.dead_state).astype(jnp.int32)


@partial(jax.jit, static_argnames=("lm", "constrained", "greedy", "D"), donate_argnums=(4,))
def _decode_chunk(lm, params, fa, tables, c: _Carry, release, limit, temperature, stop_at, *,
                  constrained: bool, greedy: bool, D: int = 0):
    """Rows ``release`` [B] (collected by the host) leave the batch; then decode steps for
    every row until ``stop_at`` active rows have finished or none is live. Returns the
    carry, the steps run, ``valid [B]`` and ``finished [B]``."""
    c = c._replace(active=c.active & ~release)
    ffa = _flat_view(fa, D) if constrained else None
    eos = lm.eos_token_id
    N = c.toks.shape[1]
    B = c.toks.shape[0]

    def cond(x):
        c, i = x
        fin = _finished(c, limit)
        return (jnp.sum(fin) < stop_at) & jnp.any(c.active & ~fin)

    def step(x):
        c, i = x
        live = c.active & ~_finished(c, limit)
        keys = jax.vmap(jax.random.fold_in)(c.keys, c.t)
        if constrained:
            cs = gcd.ConstraintState(c.state, c.t)
            logits = masked_logits(ffa, tables, cs, c.logp)
        else:
            logits = c.logp
        tok, lq, _, empty = draw(keys, logits / temperature, ~live, eos, greedy=greedy)
        lq = jnp.where(empty, jnp.inf, lq)
        lp = jnp.take_along_axis(c.logp, tok[:, None], axis=1)[:, 0]
        state = c.state
        if constrained:
            nxt = _next_state_stacked(ffa, c.state, tok)
            state = jnp.where(live, nxt, c.state)
        toks = c.toks.at[jnp.arange(B), jnp.where(live, c.t, N)].set(tok, mode="drop")
        lm_state, logp = lm.step(params, c.lm_state, tok)
        c = _Carry(lm_state, logp, state, c.t + live.astype(jnp.int32),
                   c.done | (live & (tok == eos)), c.active,
                   c.lp + jnp.where(live, lp, 0.0), c.lq + jnp.where(live, lq, 0.0), toks, c.keys)
        return c, i + 1

    c, steps = jax.lax.while_loop(cond, step, (c, jnp.int32(0)))
    valid = gcd.is_final(ffa, c.state) if constrained else c.done
    return c, steps, valid, _finished(c, limit)


@partial(jax.jit, static_argnames=("constrained", "P", "eos"), donate_argnums=(0, 1, 2))
def _insert(c: _Carry, fa, tables, rows, new_state, new_logp, new_fa, new_tables, new_keys, s,
            *, constrained: bool, P: int, eos: int):
    """Requests ``rows`` [G] (``B``: padding, dropped) enter the batch."""
    B = c.toks.shape[0]
    eos_row = jnp.full(c.toks.shape[1:], eos, c.toks.dtype)
    lm_state = _insert_state(c.lm_state, rows, new_state, s, P)
    state = c.state
    if constrained:
        S = fa.dist.shape[1]
        fa = jax.tree.map(lambda x, y: x.at[rows].set(y, mode="drop"), fa, new_fa)
        G = rows.shape[0]

        def put(big, small):                    # [T, B·S] <- [T, G·S] by row blocks
            T = big.shape[0]
            out = big.reshape(T, B, S).at[:, rows].set(small.reshape(T, G, S), mode="drop")
            return out.reshape(T, B * S)

        tables = gcd.BudgetTables(put(tables.beta, new_tables.beta),
                                  put(tables.live_out, new_tables.live_out), tables.n)
        state = state.at[rows].set(rows * S + new_fa.initial_state, mode="drop")
    z = jnp.zeros(rows.shape, jnp.int32)
    c = _Carry(lm_state, c.logp.at[rows].set(new_logp, mode="drop"), state,
               c.t.at[rows].set(z, mode="drop"), c.done.at[rows].set(False, mode="drop"),
               c.active.at[rows].set(True, mode="drop"),
               c.lp.at[rows].set(0.0, mode="drop"), c.lq.at[rows].set(0.0, mode="drop"),
               c.toks.at[rows].set(eos_row, mode="drop"), c.keys.at[rows].set(new_keys, mode="drop"))
    return c, fa, tables


@partial(jax.jit, donate_argnums=(0,))
def _shift(c: _Carry, delta):
    return c._replace(lm_state=_shift_state(c.lm_state, delta))


# ------------------------------------------------------------------------------- serving
def _pick_group(queue: list, k: int, width: dict) -> list:
    """Take ``k`` requests off ``queue`` for one insert group: the first waiting request
    and, in queue order, the next ones of its insert class ``width[i]`` (``(path,
    width)``: the group is prefilled at its widest member's width, so a long prompt
    among short ones would multiply the group's prefill); then, if still short, the next
    ones of the same path and a narrower width; then any."""
    w = width[queue[0]]
    order = ([i for i in queue if width[i] == w]
             + [i for i in queue if width[i][0] == w[0] and width[i][1] < w[1]]
             + [i for i in queue if width[i][0] != w[0] or width[i][1] > w[1]])
    take = order[:k]
    chosen = set(take)
    queue[:] = [i for i in queue if i not in chosen]
    return take


def shared_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens that every prompt of ``prompts`` begins with, at most the shortest
    prompt's length minus one (each prompt keeps a token of its own)."""
    prompts = [list(p) for p in prompts]
    if not prompts:
        return 0
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for p in prompts[1:]:
        k = 0
        while k < n and p[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


def insert_classes(lengths: Sequence[int], P: int, n0: int, pow2_rest: bool = False
                   ) -> list[tuple[int, int]]:
    """The insert class of prompts of ``lengths`` tokens in a stream of width ``P`` whose
    prompts share ``n0`` tokens (0: no shared prefix): ``(0, T)``, prefilled after the
    shared prefix at rest width ``T`` (the insert writes the prefix's bucket + ``T`` <=
    ``P`` slots), or ``(1, Pg)``, prefilled whole at its prompt bucket. One prefill
    program and one insert program per class: a warm-up with a request of each class
    compiles every program of a stream. ``pow2_rest``: :class:`ServePolicy`'s."""
    PB = prompt_bucket(n0) if n0 else 0
    out = []
    for n in lengths:
        T = (prompt_bucket(n - n0) if pow2_rest else rest_bucket(n - n0)) if n0 else 0
        out.append((0, T) if n0 and PB + T <= P else (1, prompt_bucket(n)))
    return out


def rest_bucket(n: int) -> int:
    """The prefill width of a prompt's rest after the shared prefix: ``n`` rounded up to
    a multiple of 8 up to 32, then to a power of two. Finer than
    :func:`~jaxcd.decoding.buckets.prompt_bucket` (at least 32) where most rests lie: a
    group's prefill costs its width, and a stream's rests after a chat template's system
    turn are mostly 16-31 tokens (one more prefill and insert program per class)."""
    n = max(int(n), 1)
    return -(-n // 8) * 8 if n <= 32 else prompt_bucket(n)


def stream_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """The shared prefix :func:`serve` prefills once for these prompts (0: none)."""
    n0 = min(_MAX_PREFIX, shared_prefix_len(prompts))
    return n0 if n0 >= _MIN_PREFIX else 0


@dataclass(frozen=True)
class ServePolicy:
    """Scheduling choices of :func:`serve` (host side; the defaults are the fastest).

    ``sync_inserts``: wait for each insert's programs before timing it (profiling:
    otherwise an insert's device work runs asynchronously and is timed in the next
    decode call, so ``ServeStats.insert_s`` counts only the host's share).
    ``whole_groups``: insert whole groups only, a decode call running until ``group``
    rows are free (instead of inserting into the free rows and holding the rest).
    ``pow2_rest``: prefill a prompt's rest after the shared prefix at
    :func:`~jaxcd.decoding.buckets.prompt_bucket` width, not :func:`rest_bucket`."""

    sync_inserts: bool = False
    whole_groups: bool = False
    pow2_rest: bool = False

_MAX_PREFIX = 32     # a shared prefix is prefilled at width 32 (longer ones are cut)
_MIN_PREFIX = 8      # shorter shared prefixes are not worth a program of their own


def stack_bytes(bucket, vocab_size: int, rows: int) -> int:
    """Device bytes of ``rows`` automata stacked at ``bucket`` = (states, edges,
    out-degree, mask rows) as :func:`serve` holds them (no ``out_dst``), with their β
    tables for a budget bucket of 64."""
    S, E, D, R = (int(x) for x in bucket)
    W = -(-int(vocab_size) // 32)
    per_row = 4 * (R * W + 3 * E + 3 * S + 1) + 65 * S * 5
    return rows * per_row


def _raw_key(key) -> jax.Array:
    """A PRNG key as raw ``uint32 [2]`` (typed keys are unwrapped)."""
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    if key.shape != (2,):
        raise ValueError(f"a request's key must be a jax.random.PRNGKey (uint32 [2]), got shape "
                         f"{key.shape}")
    return key.astype(jnp.uint32)


def serve(lm, params, requests: Sequence[Request], *, budget: int, method: str = "gcd",
          rows: int = 16, group: int | None = None, temperature: float = 1.0,
          pad_id: int = 0, prompt_width: int | None = None, progress=None,
          stats: ServeStats | None = None,
          max_automata_bytes: int = 1 << 30, share_prefix: bool = True,
          policy: ServePolicy = ServePolicy()) -> list[Finished]:
    """Decode ``requests`` with continuous batching; returns one :class:`Finished` per
    request, in order.

    ``method``: ``"gcd"`` (every output valid and ended within ``budget``), ``"lcd"`` or
    ``"none"`` (then every request's ``fa`` must be ``None``, or is ignored). ``rows``:
    batch rows; ``group``: requests prefilled together (default ``rows // 4``; they enter
    the batch as rows free up). Every automaton is
    padded to the common bucket of all requests (one stream, one set of programs) when
    the batch's stacked automata take at most ``max_automata_bytes``
    (:func:`stack_bytes`); otherwise requests are served in groups by their own bucket,
    smallest first, a group of large automata with fewer rows (as many as fit; an error
    if not even one does). ``temperature=0`` is greedy. ``progress``: a callable ``progress(n_done)`` called as requests finish.
    ``stats``: a :class:`ServeStats` to fill in. ``share_prefix`` (LMs with
    ``prefill_after``, e.g. :class:`~jaxcd.lm.llama.JaxLM`): the tokens every prompt
    begins with (a chat template's system turn; up to 32) are prefilled once, and each
    insert group runs only the rest of its prompts through the LM, attending to the
    prefix's cache (:meth:`~jaxcd.lm.llama.JaxLM.prefill_after`: the same cache and
    log-probabilities as prefilling the whole prompts, up to float rounding).
    ``policy``: scheduling choices (:class:`ServePolicy`).

    Raises :class:`~jaxcd.errors.BudgetTooSmallError` (naming the request's constraint)
    before decoding if some request's constraint cannot end within ``budget``."""
    if method not in ("gcd", "lcd", "none"):
        raise ValueError(f"method must be 'gcd', 'lcd' or 'none', got {method!r}")
    if not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    requests = list(requests)
    if not requests:
        return []
    rows = int(rows)
    G = max(1, min(rows, int(group) if group else max(1, rows // 4)))
    constrained = method != "none"
    st = stats if stats is not None else ServeStats()
    st.rows = rows
    N = budget_bucket(int(budget))
    P = prompt_width or prompt_bucket(max(len(r.prompt_ids) for r in requests))
    if max(len(r.prompt_ids) for r in requests) > P:
        raise ValueError(f"a prompt has {max(len(r.prompt_ids) for r in requests)} tokens, more "
                         f"than prompt_width={P}")
    if constrained:
        for i, r in enumerate(requests):
            if r.fa is None:
                raise ValueError(f"request {i} has no automaton (method={method!r})")
            if method == "gcd":
                gcd.check_budget(r.fa, int(budget))
        common = common_bucket([r.fa for r in requests])
        V = requests[0].fa.vocab_size
        if stack_bytes(common, V, rows) <= max_automata_bytes:
            groups = [(common, list(range(len(requests))), rows)]     # one stream
        else:        # one stream per bucket, large automata with fewer rows
            order: dict = {}
            for i, r in enumerate(requests):
                order.setdefault(common_bucket([r.fa]), []).append(i)
            groups = []
            for b, ix in sorted(order.items()):
                fit = int(max_automata_bytes // stack_bytes(b, V, 1))
                if fit < 1:
                    raise ValueError(
                        f"one automaton of bucket {b} takes {stack_bytes(b, V, 1) / 2**20:.1f} "
                        f"MiB, more than max_automata_bytes={max_automata_bytes / 2**20:.1f} MiB")
                groups.append((b, ix, min(rows, fit)))
    else:
        groups = [(None, list(range(len(requests))), rows)]
    out: list[Finished | None] = [None] * len(requests)
    n_done = 0
    for bucket, idx, rows_g in groups:
        st.groups.append(list(bucket) if bucket else None)
        n_done = _serve_group(lm, params, requests, idx, bucket, out, st, budget=int(budget),
                              N=N, P=P, rows=rows_g, G=min(G, rows_g), method=method,
                              temperature=temperature,
                              pad_id=pad_id, progress=progress, n_done=n_done,
                              share_prefix=share_prefix, policy=policy)
    return out


def _serve_group(lm, params, requests, idx, bucket, out, st: ServeStats, *, budget, N, P, rows,
                 G, method, temperature, pad_id, progress, n_done, share_prefix=True,
                 policy: ServePolicy = ServePolicy()):
    constrained = method != "none"
    B = rows
    S_cache = P + 2 * N
    eos = int(lm.eos_token_id)
    greedy = temperature == 0
    temp = jnp.float32(max(temperature, 1e-6))
    lm_state, logp0 = _empty_state(lm, params, B, P, S_cache)
    fa = tables = None
    if constrained:                     # empty rows: any automaton, all-zero tables
        fa = _stack_rows([requests[idx[0]].fa] * B, bucket).to_device()
        S = int(bucket[0])
        tables = gcd.BudgetTables(jnp.zeros((N + 1, B * S), bool),
                                  jnp.zeros((N + 1, B * S), jnp.int32), jnp.int32(budget))
    c = _Carry(lm_state, logp0, jnp.zeros(B, jnp.int32), jnp.zeros(B, jnp.int32),
               jnp.zeros(B, bool), jnp.zeros(B, bool), jnp.zeros(B, jnp.float32),
               jnp.zeros(B, jnp.float32), jnp.full((B, N), eos, jnp.int32),
               jnp.zeros((B, 2), jnp.uint32))
    limit = jnp.int32(budget)
    c = _shift(c, jnp.int32(0))         # compile every program of the stream up front
    release = np.zeros(B, bool)
    queue = list(idx)
    holder = [None] * B                 # request index per row
    s = P                               # shared write slot (host mirror)
    offsets = np.full(B, P, np.int64)   # host mirror of the rows' offsets

    # the prompts' shared prefix (a chat template's system turn): prefilled once, each
    # insert group then runs only the rest of its prompts through the LM
    prefix, n0, PB = None, 0, 0
    if share_prefix and hasattr(lm, "prefill_after") and _is_kv(lm_state):
        n0 = stream_prefix_len([requests[i].prompt_ids for i in idx])
        if n0:
            PB = prompt_bucket(n0)
            ids0, lens0 = pad_prompts([list(requests[idx[0]].prompt_ids[:n0])], pad_id=pad_id,
                                      length=PB)
            prefix = lm.prefill(params, jnp.asarray(ids0), jnp.asarray(lens0), PB)[0]
            st.prefill_tokens += PB
            st.prefix_tokens = n0
    width = dict(zip(idx, insert_classes([len(requests[i].prompt_ids) for i in idx], P, n0,
                                         policy.pow2_rest)))

    held: list = []     # prefilled groups not yet wholly inserted (see below)

    def prefill_group():
        """Prefill the next group of up to G waiting requests (padded to G rows) and hold
        it: its rows enter the batch as rows free up."""
        take = _pick_group(queue, min(G, len(queue)), width)
        pad = G - len(take)
        rows_in = take + take[-1:] * pad
        # the group's own width (<= P): most prompts are far shorter than the stream's
        # longest, and the prefill's cost is its width
        if all(width[i][0] == 0 for i in take):         # after the shared prefix
            T = max(width[i][1] for i in take)
            Pg = PB + T
            ids, lens = pad_prompts([requests[i].prompt_ids[n0:] for i in rows_in],
                                    pad_id=pad_id, length=T)
            new_state, new_logp = lm.prefill_after(params, prefix, jnp.asarray(ids),
                                                   jnp.asarray(lens), Pg)
            st.prefill_tokens += G * T
        else:
            Pg = min(P, max(prompt_bucket(len(requests[i].prompt_ids)) for i in take))
            ids, lens = pad_prompts([requests[i].prompt_ids for i in rows_in],
                                    pad_id=pad_id, length=Pg)
            new_state, new_logp = lm.prefill(params, jnp.asarray(ids), jnp.asarray(lens), Pg)
            st.prefill_tokens += G * Pg
        st.padding_rows += pad
        st.prefills += 1
        new_fa = new_tables = None
        if constrained:
            new_fa = _stack_rows([requests[i].fa for i in rows_in], bucket).to_device()
            new_tables = tables_for(new_fa, method, budget, N)
        keys = jnp.stack([_raw_key(requests[i].key) for i in rows_in])
        held.append({"take": take, "next": 0, "Pg": Pg, "args": (new_state, new_logp, new_fa,
                                                                  new_tables, keys)})

    while queue or held or any(h is not None for h in holder):
        free = [b for b in range(B) if holder[b] is None]
        t0 = time.perf_counter()
        # Free rows take waiting requests at once. Requests are prefilled G at a time (a
        # prefill's cost per request falls with its rows) and held; a held group's
        # requests enter free rows as they come, through the insert program of the
        # group's shape with the rows not entering now dropped (a held prefill is valid
        # at any later write slot: positions count from the request's own start). So no
        # row idles waiting for G rows to free up.
        while free and (queue or held):
            if policy.whole_groups and not held and len(free) < min(G, len(queue)):
                break
            if not held:
                prefill_group()
            h = held[0]
            j0 = h["next"]
            j1 = min(len(h["take"]), j0 + len(free))
            rws = [free.pop(0) for _ in range(j1 - j0)]
            if s + N > S_cache:          # not room for a whole budget: shift the cache left
                live = [offsets[b] for b in range(B) if holder[b] is not None]
                delta = int(min([s - P] + live))
                if delta > 0:
                    c = _shift(c, jnp.int32(delta))
                    s -= delta
                    offsets -= delta
                    st.shifts += 1
            row_arr = jnp.asarray([B] * j0 + rws + [B] * (G - j1), jnp.int32)
            c, fa, tables = _insert(c, fa, tables, row_arr, *h["args"], jnp.int32(s),
                                    constrained=constrained, P=h["Pg"], eos=eos)
            for i, b in zip(h["take"][j0:j1], rws):
                holder[b] = i
                release[b] = False          # a new request, not the collected one
                offsets[b] = s - len(requests[i].prompt_ids)
            h["next"] = j1
            if j1 == len(h["take"]):
                held.pop(0)
            st.inserts += 1
        if policy.sync_inserts and st.inserts:
            jax.block_until_ready(c)
        st.insert_s += time.perf_counter() - t0
        # decode until G rows finished (or all, when nobody waits)
        t0 = time.perf_counter()
        n_active = sum(h is not None for h in holder)
        # stop as soon as a row is free for a waiting request (all rows busy here)
        stop_at = 1 if (queue or held) else n_active
        if policy.whole_groups:          # until the next group has G free rows
            stop_at = max(1, min(G, len(queue)) - len(free)) if queue else n_active
        c, steps, valid, fin = _decode_chunk(lm, params, fa, tables, c, jnp.asarray(release),
                                             limit, temp, jnp.int32(stop_at),
                                             constrained=constrained, greedy=greedy,
                                             D=int(bucket[2]) if constrained else 0)
        steps = int(steps)
        s += steps
        st.steps += steps
        st.chunks += 1
        fin = np.asarray(fin)
        release = fin.copy()
        if fin.any():
            host = jax.device_get((c.toks, valid, c.done, c.lp, c.lq, c.t))
            toks, val, done, lp, lq, tt = host
            for b in np.flatnonzero(fin):
                i = holder[b]
                out[i] = Finished(np.array(toks[b]), bool(val[b]), bool(done[b]),
                                  float(lp[b]), float(lq[b]) if not greedy else float("nan"),
                                  int(tt[b]))
                st.row_steps += int(tt[b])
                holder[b] = None
                n_done += 1
            if progress is not None:
                progress(n_done)
        st.decode_s += time.perf_counter() - t0
    return n_done
