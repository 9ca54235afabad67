"""The tensorized automaton (host side, NumPy) — docs/design.md §2.

:class:`TensorizedAutomaton` is the token-level automaton ``M`` that
:func:`jaxcd.automata.lifting.tensorize` builds from a byte DFA (its states, the
terminal state ``⊥`` and the ``dead`` state are described there), stored as tables that
the device-side decoding (:mod:`jaxcd.decoding`) gathers from. This module holds the
type and its I/O: the JAX pytree registration, ``save`` / ``load`` (``FORMAT_VERSION``),
:func:`cache_key` (the on-disk cache entry of a constraint) and :func:`pad_automaton`
(shared shapes, so that one compiled program serves many constraints).

Storage (the maths of docs/design.md with a layout chosen for fast masks):

- ``edge_src``, ``edge_dst`` (int32 ``[E]``) are ``T_out`` and ``T_in`` in index form;
  edges are sorted by source, then by ``dist[dst]`` (shortest number of tokens from
  ``dst`` to ``⊥``).
- Cumulative masks: for state ``s`` with out-edges ``e_1..e_d`` (in that order),
  logical row ``base[s] + k`` (``base[s] = out_start[s] + s``, ``k = 0..d``) is the
  bit-packed union ``L_{e_1} ∪ … ∪ L_{e_k}`` (row ``base[s]`` is empty). Many logical
  rows are equal (states with the same out-labels, in every copy of a counter), so
  they are stored once: ``row_index`` (int32 ``[E + S]``) maps a logical row to a row
  of ``cum_masks`` (uint32 ``[R, W]``, ``W = ceil(V / 32)``, bit ``v % 32`` of word
  ``v // 32``; row 0 is the empty set). Tables grow with the number ``R`` of distinct
  rows, not with ``(E + S) · V``. Equal rows are found from 128-bit sums of random
  per-token values without building the rows (see
  :func:`jaxcd.automata.lifting._dedupe_rows`). ``B_f`` is recovered exactly as
  ``row_k XOR row_{k-1}`` because a DFA's out-labels are disjoint.
- Because ``β_{t+1}(s') = 1{dist[s'] ≤ n - t - 1}`` is monotone in ``dist``, the live
  out-edges of a state always form a prefix of its sorted edge list, so the GCD
  mask ``1{w_{t+1}ᵀ B_f}`` is the single logical row ``base[s] + Σ_e β_{t+1}(dst e)``
  — two gathers (``row_index``, then ``cum_masks``), whatever the budget. Tests
  check this against the dense formula.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np

from .bits import unpack_bits

if TYPE_CHECKING:
    from ..vocab import Vocabulary

INF_DIST = 1 << 30
FORMAT_VERSION = 3

_DATA_FIELDS = ("edge_src", "edge_dst", "out_start", "out_dst", "cum_masks", "row_index",
                "dist", "initial_state", "final_state", "dead_state")
_ARRAY_FIELDS = _DATA_FIELDS[:7]
_ID_FIELDS = ("initial_state", "final_state", "dead_state")
_META_FIELDS = ("vocab_size", "eos_id")


@dataclass(frozen=True)
class TensorizedAutomaton:
    """A token-level DFA over a real vocabulary, stored as (sparse) ``T_out``, ``T_in``,
    ``B_f`` plus per-state tables (see the module docstring).

    A JAX pytree whose leaves are **all** the arrays, the state ids included
    (``initial_state``, ``final_state``, ``dead_state``: int32 scalars); only
    ``vocab_size`` and ``eos_id`` (the vocabulary's) are static. So a jitted function
    compiles once per *shape* of automaton, not once per constraint: pad automata to a
    shared bucket (:func:`jaxcd.decoding.buckets.bucket_automaton`) and every constraint in that
    bucket reuses the compiled program. ``key`` (a label for error messages) is host-side
    only: it does not travel through ``jit`` (an unflattened copy has ``key = ""``).

    Automata stacked with :func:`jaxcd.decoding.buckets.stack_automata` have a leading batch axis
    on every leaf (``dist [B, S]``, ``initial_state [B]``, ...): one constraint per
    prompt row.

    Arrays are NumPy when built; ``fa.to_device()`` gives a copy with ``jax.Array``
    leaves for the jitted functions in :mod:`jaxcd.decoding.gcd` (do it once, not per step).
    """

    edge_src: np.ndarray    # int32 [E]
    edge_dst: np.ndarray    # int32 [E]
    out_start: np.ndarray   # int32 [S + 1]   CSR offsets of out-edges
    out_dst: np.ndarray     # int32 [S, D]    out-edge destinations, padded with dead_state
    cum_masks: np.ndarray   # uint32 [R, W]   distinct cumulative masks (row 0 empty)
    row_index: np.ndarray   # int32 [E + S]   logical row base[s] + k -> row of cum_masks
    dist: np.ndarray        # int32 [S]       tokens to ⊥ (INF_DIST if none; 0 only at ⊥)
    initial_state: np.ndarray  # int32 []
    final_state: np.ndarray    # int32 []     ⊥
    dead_state: np.ndarray     # int32 []
    vocab_size: int
    eos_id: int
    key: str = ""

    def __post_init__(self):
        # host-built ids become int32 scalars (hashable, usable as indices); tracers and
        # device arrays are left as they are
        for f in _ID_FIELDS:
            v = getattr(self, f)
            if isinstance(v, (int, np.integer)) or (isinstance(v, np.ndarray) and v.ndim == 0):
                object.__setattr__(self, f, np.int32(v))

    # -- sizes -------------------------------------------------------------------------
    @property
    def num_states(self) -> int:
        return int(np.shape(self.dist)[-1])

    @property
    def batch_shape(self) -> tuple:
        """``()`` for one automaton, ``(B,)`` for a stack
        (:func:`~jaxcd.decoding.buckets.stack_automata`)."""
        return tuple(np.shape(self.dist)[:-1])

    @property
    def bucket(self) -> tuple[int, int, int, int]:
        """``(states, edges, max out-degree, mask rows)``: the shapes a jitted function
        compiles for."""
        return (self.num_states, int(np.shape(self.edge_src)[-1]),
                int(np.shape(self.out_dst)[-1]), int(np.shape(self.cum_masks)[-2]))

    # -- sizes -------------------------------------------------------------------------
    @property
    def num_edges(self) -> int:
        return int(np.shape(self.edge_src)[-1])

    @property
    def num_words(self) -> int:
        return int(np.shape(self.cum_masks)[-1])

    @property
    def nbytes(self) -> int:
        return int(sum(np.asarray(getattr(self, f)).nbytes for f in _ARRAY_FIELDS))

    @property
    def min_budget(self) -> int:
        """Smallest budget (tokens, EOS included) for which the constraint can be met."""
        return int(self.dist[self.initial_state])

    def stats(self) -> dict:
        return {"num_states": self.num_states, "num_edges": self.num_edges,
                "vocab_size": self.vocab_size, "max_out_degree": int(self.out_dst.shape[1]),
                "min_budget": self.min_budget, "num_mask_rows": int(self.cum_masks.shape[0]),
                "nbytes": self.nbytes}

    def to_device(self) -> "TensorizedAutomaton":
        return jax.device_put(self)

    # -- dense views (docs/design.md §2), for tests and the HMM product ---------------------
    @property
    def T_out(self) -> np.ndarray:
        m = np.zeros((self.num_states, self.num_edges), np.uint8)
        m[np.asarray(self.edge_src), np.arange(self.num_edges)] = 1
        return m

    @property
    def T_in(self) -> np.ndarray:
        m = np.zeros((self.num_edges, self.num_states), np.uint8)
        m[np.arange(self.num_edges), np.asarray(self.edge_dst)] = 1
        return m

    def label_words(self) -> np.ndarray:
        """Bit-packed ``B_f``: uint32 ``[E, W]``."""
        src = np.asarray(self.edge_src)
        out_start = np.asarray(self.out_start)
        rows = out_start[src] + src + (np.arange(self.num_edges) - out_start[src]) + 1
        cum, ri = np.asarray(self.cum_masks), np.asarray(self.row_index)
        return cum[ri[rows]] ^ cum[ri[rows - 1]]

    @property
    def B_f(self) -> np.ndarray:
        """Dense ``B_f``: bool ``[E, V]``."""
        return unpack_bits(self.label_words(), self.vocab_size)

    @property
    def initial(self) -> np.ndarray:
        return np.eye(self.num_states, dtype=np.uint8)[self.initial_state]

    @property
    def final(self) -> np.ndarray:
        return np.eye(self.num_states, dtype=np.uint8)[self.final_state]

    # -- host-side stepping (NumPy) ------------------------------------------------------
    def next_state(self, state: int, token: int) -> int:
        """``δ(state, token)``; ``dead_state`` if the token is not allowed."""
        out_start = self.out_start
        a, b = int(out_start[state]), int(out_start[state + 1])
        if a == b or not 0 <= token < self.vocab_size:
            return self.dead_state
        base = a + state
        col = self.cum_masks[self.row_index[base + 1: base + 1 + (b - a)], token >> 5]
        hit = np.nonzero((col >> np.uint32(token & 31)) & np.uint32(1))[0]
        if len(hit) == 0:
            return self.dead_state
        return int(self.edge_dst[a + hit[0]])

    def mask_words(self, state: int, steps_left: int | None) -> np.ndarray:
        """Packed mask of tokens allowed from ``state`` when ``steps_left`` tokens remain
        (EOS included); ``None`` = LCD (no budget)."""
        a, b = int(self.out_start[state]), int(self.out_start[state + 1])
        if steps_left is None:
            k = b - a
        else:
            k = int(np.count_nonzero(self.dist[self.edge_dst[a:b]] <= steps_left - 1))
        return self.cum_masks[self.row_index[a + state + k]]

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        path = Path(path)
        if self.batch_shape:
            raise ValueError("save: a stacked automaton; save each constraint on its own")
        meta = {f: int(getattr(self, f)) for f in _META_FIELDS + _ID_FIELDS}
        meta["key"] = self.key
        meta["format_version"] = FORMAT_VERSION
        # a private temporary file, renamed atomically: concurrent saves of one cache key
        # (e.g. parallel test workers) never interleave their bytes
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                         **{f_: np.asarray(getattr(self, f_)) for f_ in _ARRAY_FIELDS})
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> "TensorizedAutomaton":
        with np.load(path) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.pop("format_version", None) != FORMAT_VERSION:
                raise ValueError(f"{path}: cached automaton has an old format")
            return cls(**{f: z[f] for f in _ARRAY_FIELDS}, **meta)


def _flatten(fa: TensorizedAutomaton):
    return tuple(getattr(fa, f) for f in _DATA_FIELDS), (fa.vocab_size, fa.eos_id)


def _flatten_with_keys(fa: TensorizedAutomaton):
    return (tuple((jax.tree_util.GetAttrKey(f), getattr(fa, f)) for f in _DATA_FIELDS),
            (fa.vocab_size, fa.eos_id))


def _unflatten(aux, children) -> TensorizedAutomaton:
    fa = object.__new__(TensorizedAutomaton)       # no __post_init__: leaves may be anything
    for f, v in zip(_DATA_FIELDS, children):
        object.__setattr__(fa, f, v)
    object.__setattr__(fa, "vocab_size", aux[0])
    object.__setattr__(fa, "eos_id", aux[1])
    object.__setattr__(fa, "key", "")
    return fa


jax.tree_util.register_pytree_with_keys(TensorizedAutomaton, _flatten_with_keys, _unflatten,
                                        _flatten)


_COMPILER_HASH: list[str] = []


def compiler_hash() -> str:
    """A hash of the constraint compiler's source (``jaxcd/automata/*.py`` and the
    vocabulary code): part of every automaton cache key, so a change to the compiler
    never serves an automaton built by older code."""
    if not _COMPILER_HASH:
        h = hashlib.sha256()
        here = Path(__file__).resolve().parent
        for f in sorted(here.glob("*.py")) + [here.parent / "vocab.py"]:
            if f.exists():
                h.update(f.name.encode())
                h.update(f.read_bytes())
        _COMPILER_HASH.append(h.hexdigest()[:16])
    return _COMPILER_HASH[0]


def cache_key(kind: str, source: str, options: dict, vocab: Vocabulary) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([kind, source, options, vocab.fingerprint, FORMAT_VERSION,
                         compiler_hash()], sort_keys=True, default=str).encode())
    return h.hexdigest()[:40]


def _pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def pad_automaton(fa: TensorizedAutomaton, num_states: int | None = None,
                  num_edges: int | None = None, max_out_degree: int | None = None,
                  num_mask_rows: int | None = None, key: str = "padded") -> tuple[TensorizedAutomaton, np.ndarray]:
    """The same token automaton with padded shapes, so that one compiled program
    (:func:`jaxcd.decoding.smc.run`, :func:`jaxcd.decoding.decode.sample`,
    :func:`jaxcd.decoding.gcd.backward`, :func:`jaxcd.decoding.pgcd.backward`) serves many
    constraints: the static fields become ``num_states`` (default: the next power of two of ``fa.num_states + 1``),
    ``initial_state = 0``, ``final_state = num_states - 2``, ``dead_state =
    num_states - 1`` and ``key``; the arrays get ``num_edges`` edges (default: the next
    power of two), ``max_out_degree`` columns of ``out_dst`` and ``num_mask_rows`` rows
    of ``cum_masks`` (defaults: the next power of two).

    The language, budgets and masks are unchanged: padding states have no edges
    (``dist = INF_DIST``); padding edges are ``dead → dead`` with an empty label set
    (so ``β``, ``β^P``, masks and ``δ`` of every real state are untouched and ``dead``
    stays dead). Returns ``(padded, new_id)`` with ``new_id[old_state]`` the state's id
    in the padded automaton.
    """
    S, E = fa.num_states, fa.num_edges
    D = int(np.asarray(fa.out_dst).shape[1])
    S2 = _pow2(S + 1) if num_states is None else int(num_states)
    E2 = _pow2(E) if num_edges is None else int(num_edges)
    D2 = _pow2(D) if max_out_degree is None else int(max_out_degree)
    cum = np.asarray(fa.cum_masks)
    R = cum.shape[0]
    R2 = _pow2(R) if num_mask_rows is None else int(num_mask_rows)
    if S2 < S or E2 < E or D2 < D or R2 < R:
        raise ValueError(f"pad_automaton: cannot shrink ({S} states, {E} edges, out-degree {D}, "
                         f"{R} mask rows) to ({S2}, {E2}, {D2}, {R2})")
    init, fin, dead = fa.initial_state, fa.final_state, fa.dead_state
    if len({init, fin, dead}) < 3:
        raise ValueError("pad_automaton: initial, final and dead states must differ")
    new_id = np.empty(S, np.int64)
    others = np.setdiff1d(np.arange(S), [init, fin, dead])
    new_id[init] = 0
    new_id[others] = np.arange(1, len(others) + 1)
    new_id[fin], new_id[dead] = S2 - 2, S2 - 1
    src, dst = np.asarray(fa.edge_src, np.int64), np.asarray(fa.edge_dst, np.int64)
    out_start = np.asarray(fa.out_start, np.int64)
    deg = np.diff(out_start)
    # edges: grouped by new source, each source keeping its own (dist-sorted) order
    order = np.argsort(new_id[src], kind="stable")
    n_src = np.concatenate([new_id[src][order], np.full(E2 - E, S2 - 1)])
    n_dst = np.concatenate([new_id[dst][order], np.full(E2 - E, S2 - 1)])
    n_deg = np.zeros(S2, np.int64)
    n_deg[new_id] = deg
    n_deg[S2 - 1] += E2 - E
    n_start = np.concatenate([[0], np.cumsum(n_deg)])
    # logical mask rows: each state's block of deg + 1 rows moves to its new base; new
    # rows (padding states and edges) point at row 0, the empty set
    s_of_row = np.repeat(np.arange(S), deg + 1)
    off = np.arange(len(s_of_row)) - (out_start[s_of_row] + s_of_row)
    n_rows = n_start[new_id[s_of_row]] + new_id[s_of_row] + off
    n_index = np.zeros(E2 + S2, np.int32)
    n_index[n_rows] = np.asarray(fa.row_index)
    n_cum = np.zeros((R2, cum.shape[1]), np.uint32)
    n_cum[:R] = cum
    out_dst = np.asarray(fa.out_dst, np.int64)
    n_out = np.full((S2, D2), S2 - 1, np.int32)
    n_out[new_id, :D] = new_id[out_dst]
    dist = np.full(S2, INF_DIST, np.int32)
    dist[new_id] = np.asarray(fa.dist)
    return TensorizedAutomaton(
        edge_src=n_src.astype(np.int32), edge_dst=n_dst.astype(np.int32),
        out_start=n_start.astype(np.int32), out_dst=n_out, cum_masks=n_cum, row_index=n_index,
        dist=dist,
        vocab_size=fa.vocab_size, initial_state=0, final_state=S2 - 2,
        dead_state=S2 - 1, eos_id=fa.eos_id, key=key), new_id
