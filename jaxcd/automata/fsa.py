"""Byte-level finite automata (host side, NumPy): NFA construction, subset
determinisation, Moore minimisation, trimming, product, union and concatenation.

Conventions
-----------
- Alphabet: bytes 0..255. Languages are sets of byte strings.
- :class:`NFA` has epsilon moves and byte-range transitions; it is the build
  target of the front-ends (regex, keywords, hand-built automata).
- :class:`DFA` is column-compressed: ``byte_class[256]`` maps a byte to one of
  ``C`` equivalence classes and ``trans[Q, C]`` holds the next state or ``-1``
  (dead). State 0 is the start state.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from ..limits import current_limits, too_large
from .utf8 import normalize_ranges, utf8_sequences

DEFAULT_MAX_STATES = 200_000     # the default of CompileLimits.max_dfa_states


# ---------------------------------------------------------------------------------------
# NFA
# ---------------------------------------------------------------------------------------
class NFA:
    """A byte-level NFA with epsilon moves, built by hand or by the front-ends.

    Example::

        nfa = NFA()
        s, t = nfa.add_state(), nfa.add_state(accepting=True)
        nfa.start = s
        nfa.add_string(s, t, "yes")
        nfa.add_string(s, t, "no")
        dfa = minimize(determinize(nfa))
    """

    def __init__(self):
        self.eps: list[list[int]] = []
        self._trans: list[list[tuple[int, int, int]]] = []
        # class fragments inserted by add_codepoints whose inner states' transitions
        # are not yet written into _trans: (first inner state, dst, class key)
        self._pending: list[tuple[int, int, tuple]] = []
        self.accepting: set[int] = set()
        self.start: int = 0
        self.max_states = current_limits().max_nfa_states
        # a producer's own bound on the DFA of this NFA, below
        # CompileLimits.max_dfa_states (a cheaper fallback exists past it): determinize
        # stops there
        self.dfa_cap: int | None = None

    @property
    def trans(self) -> list[list[tuple[int, int, int]]]:
        """Per state, its byte-range transitions ``(lo, hi, dst)``.

        Large character classes are inserted as a copy of their DFA fragment; the
        transitions of the fragment's inner states are kept as a reference to the
        cached fragment until something reads them here (the batched determiniser reads
        them as arrays instead, see :func:`_flat_transitions`). The result is the same
        lists, in the same order, as writing them at insertion time."""
        if self._pending:
            self._write_pending()
        return self._trans

    def _write_pending(self) -> None:
        for first, dst, key in self._pending:
            for i, row in enumerate(_fragment_parts(key)[1]):
                self._trans[first + i].extend(
                    [(lo, hi, dst if d < 0 else first + d) for lo, hi, d in row])
        self._pending.clear()

    def _grow(self, n: int) -> None:
        """Refuse to grow past ``CompileLimits.max_nfa_states`` (checked before adding)."""
        if len(self.eps) + n > self.max_states:
            raise too_large("max_nfa_states", len(self.eps) + n, "NFA states", "build NFA",
                            at_least=True)

    @property
    def num_states(self) -> int:
        return len(self.eps)

    def add_state(self, accepting: bool = False) -> int:
        if len(self.eps) >= self.max_states:
            self._grow(1)
        self.eps.append([])
        self._trans.append([])
        q = len(self.eps) - 1
        if accepting:
            self.accepting.add(q)
        return q

    def _check(self, *states):
        for q in states:
            if not (0 <= q < self.num_states):
                raise ValueError(f"NFA: state {q} does not exist (have {self.num_states})")

    def add_epsilon(self, src: int, dst: int) -> None:
        n = len(self.eps)                   # the check inline (see add_byte_range)
        if not (0 <= src < n and 0 <= dst < n):
            self._check(src, dst)
        self.eps[src].append(dst)

    def add_byte_range(self, src: int, dst: int, lo: int, hi: int) -> None:
        # the check inline: this is the builders' innermost call (millions per large
        # schema), and one more Python frame there can cross a chunk of CPython 3.11's
        # frame stack on every call (an mmap and munmap each: 40 s of kernel time on a
        # SchemaStore schema, depending on the depth the compile starts at)
        n = len(self.eps)
        if not (0 <= src < n and 0 <= dst < n):
            self._check(src, dst)
        if not (0 <= lo <= hi <= 255):
            raise ValueError(f"NFA: bad byte range [{lo}, {hi}]")
        self._trans[src].append((lo, hi, dst))

    def add_byte_ranges(self, src: int, ranges: list[tuple[int, int, int]]) -> None:
        """:meth:`add_byte_range` for each ``(lo, hi, dst)`` of ``ranges``, in order."""
        n = len(self.eps)
        self._check(src)
        for lo, hi, d in ranges:
            if not (0 <= d < n and 0 <= lo <= hi <= 255):
                self.add_byte_range(src, d, lo, hi)         # raises, naming it
        self._trans[src].extend(ranges)

    def add_bytes(self, src: int, dst: int, data: bytes) -> None:
        """A path spelling exactly ``data`` (epsilon if empty)."""
        self._check(src, dst)
        if not data:
            self.add_epsilon(src, dst)
            return
        cur = src
        for i, b in enumerate(data):
            nxt = dst if i == len(data) - 1 else self.add_state()
            self._trans[cur].append((b, b, nxt))
            cur = nxt

    def add_string(self, src: int, dst: int, text: str) -> None:
        """A path spelling the UTF-8 encoding of ``text``."""
        self.add_bytes(src, dst, text.encode("utf-8"))

    def accepts(self, data: bytes) -> bool:
        """Whether the NFA accepts ``data`` (a run over sets of states: for a few short
        strings, where determinising the whole NFA would cost more)."""
        eps, trans = self.eps, self.trans

        def close(states):
            seen = set(states)
            stack = list(states)
            while stack:
                for y in eps[stack.pop()]:
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
            return seen
        cur = close([self.start]) if self.num_states else set()
        for b in data:
            cur = close({d for q in cur for lo, hi, d in trans[q] if lo <= b <= hi})
            if not cur:
                return False
        return not cur.isdisjoint(self.accepting)

    def add_codepoints(self, src: int, dst: int, ranges: Iterable[tuple[int, int]]) -> None:
        """Paths spelling exactly one code point from the inclusive ``ranges`` (UTF-8).

        Large classes (``.``, ``\\w``, ``[^"]``) are inserted as their minimal byte DFA
        (cached per class), which keeps later determinisation small. Its start state is
        ``src``, its accepting state ``dst``, its other ("inner") states new states
        ``first, first + 1, ...`` in the fragment's order; the inner states' transitions
        are written lazily (see :attr:`trans`): ``(\\w{1,12} ){3,8}`` inserts Unicode
        ``\\w``'s 308 inner states 97 times."""
        self._check(src, dst)
        key = _normalized(ranges) if isinstance(ranges, tuple) else tuple(normalize_ranges(ranges))
        seqs = _class_sequences(key)
        if len(seqs) <= 4:
            for seq in seqs:
                cur = src
                for i, (a, b) in enumerate(seq):
                    nxt = dst if i == len(seq) - 1 else self.add_state()
                    self._trans[cur].append((a, b, nxt))
                    cur = nxt
            return
        start_runs, inner_rows, _ = _fragment_parts(key)
        n_inner = len(inner_rows)
        self._grow(n_inner)
        first = len(self.eps)
        self.eps.extend([] for _ in range(n_inner))
        self._trans.extend([] for _ in range(n_inner))
        self._trans[src].extend([(lo, hi, dst if d < 0 else first + d) for lo, hi, d in start_runs])
        self._pending.append((first, dst, key))

    def embed(self, other: "NFA") -> tuple[int, set[int]]:
        """Copy ``other`` into this NFA; return (its start, its accepting states)."""
        off = len(self.eps)
        self._grow(len(other.eps))
        rows = other.trans                  # (writes other's pending fragments once)
        self.eps.extend([[d + off for d in e] if e else [] for e in other.eps])
        self._trans.extend([[(lo, hi, d + off) for lo, hi, d in r] if r else []
                            for r in rows])
        return other.start + off, {a + off for a in other.accepting}


# ---------------------------------------------------------------------------------------
# DFA
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class DFA:
    """Deterministic byte automaton; state 0 is the start; ``-1`` in ``trans`` is dead."""

    trans: np.ndarray        # int32 [Q, C]
    accepting: np.ndarray    # bool [Q]
    byte_class: np.ndarray   # int32 [256]

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.trans.shape[1])

    def byte_table(self) -> np.ndarray:
        """int32 ``[Q, 256]`` next-state table (``-1`` = dead)."""
        return self.trans[:, self.byte_class]

    def run(self, data: bytes, state: int = 0) -> int:
        """State after reading ``data`` from ``state`` (``-1`` once dead)."""
        for b in data:
            if state < 0:
                return -1
            state = int(self.trans[state, self.byte_class[b]])
        return state

    def accepts(self, data: bytes) -> bool:
        if self.num_states == 0:
            return False
        q = self.run(data)
        return q >= 0 and bool(self.accepting[q])

    def to_nfa(self, chunk: int = 1 << 16) -> NFA:
        nfa = NFA()
        Q = self.num_states
        if Q == 0:
            nfa.add_state()
            return nfa
        if Q > nfa.max_states:
            nfa._grow(nfa.max_states + 1)          # the error adding state by state gives
        # byte ranges of each class: (lo, hi, class), ascending
        cls = np.asarray(self.byte_class)
        cut = np.flatnonzero(np.concatenate([[True], cls[1:] != cls[:-1]]))
        lo = cut
        hi = np.append(cut[1:], 256) - 1
        c = cls[cut]
        nfa.eps = [[] for _ in range(Q)]
        trans: list = []
        # per state, its runs in ascending order with a live target (vectorised; a few
        # states at a time to bound the [states, runs] scratch)
        for q0 in range(0, Q, chunk):
            d = self.trans[q0:q0 + chunk][:, c]
            qi, ri = np.nonzero(d >= 0)
            flat = list(zip(lo[ri].tolist(), hi[ri].tolist(), d[qi, ri].tolist()))
            ends = np.cumsum(np.bincount(qi, minlength=len(d))).tolist()
            a = 0
            for b in ends:
                trans.append(flat[a:b])
                a = b
        nfa._trans = trans
        nfa.accepting = set(np.flatnonzero(self.accepting).tolist())
        nfa.start = 0
        return nfa


def empty_dfa() -> DFA:
    return DFA(np.zeros((0, 1), np.int32), np.zeros((0,), bool), np.zeros(256, np.int32))


# ---------------------------------------------------------------------------------------
# determinisation
# ---------------------------------------------------------------------------------------
def _byte_classes(nfa: NFA) -> tuple[np.ndarray, list[int]]:
    _, lo, hi, _ = _flat_transitions(nfa)
    edges = _unique_ints(np.concatenate([lo, hi + 1, [0, 256]]))
    byte_class = (np.searchsorted(edges, np.arange(256), side="right") - 1).astype(np.int32)
    return byte_class, edges.tolist()


_SMALL_NFA = 256     # NFAs up to this size are determinised by the plain-Python loop


def determinize(nfa: NFA, max_states: int | None = None) -> DFA:
    """Subset construction over byte equivalence classes.

    Subsets hold only the NFA's *important* states (those with a byte transition, or
    accepting): two subsets with the same important states have the same future, so
    this gives the same DFA with smaller subsets. Work and memory are proportional to
    the total size of the subsets (``CompileLimits.max_subset_entries``) times the
    number of byte classes; the number of DFA states is bounded by
    ``CompileLimits.max_dfa_states`` (or ``max_states``), checked before each new state.

    Large NFAs with few epsilon moves (under 10% of the states: large character classes
    inserted as DFA fragments) go through :func:`_determinize_batched` (the same
    construction, one BFS level at a time with NumPy: a DFA state whose subset is a
    single NFA state — most of them there — copies that state's precomputed successor
    row). Epsilon-heavy NFAs (JSON Schemas, counters) make mostly multi-state subsets,
    which the plain loop handles as fast: measured 0.8 vs 0.8 s on a 57,700-state
    schema NFA, 0.16 vs 1.5 s on the 29,682-state ``(\\w{1,12} ){3,8}``.
    """
    limits = current_limits()
    max_states = limits.max_dfa_states if max_states is None else int(max_states)
    cap = getattr(nfa, "dfa_cap", None)
    if cap is not None:
        max_states = min(max_states, int(cap))
    if nfa.num_states == 0:
        return empty_dfa()
    n = nfa.num_states
    if n > _SMALL_NFA and sum(1 for e in nfa.eps if e) < 0.1 * n:
        return _determinize_batched(nfa, max_states, limits.max_subset_entries)
    return _determinize_python(nfa, max_states, limits.max_subset_entries)


def _flat_transitions(nfa: NFA):
    """All byte-range transitions as int64 arrays ``(src, lo, hi, dst)``: those in the
    lists by state, then the pending fragments' (see :attr:`NFA.trans`) as arrays."""
    rows = nfa._trans
    counts = np.fromiter(map(len, rows), np.int64, nfa.num_states)
    # (fromiter over the flattened ints: twice as fast as np.array over the tuples)
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(rows)), np.int64,
                       3 * int(counts.sum())).reshape(-1, 3)
    parts = [(np.repeat(np.arange(nfa.num_states), counts), flat[:, 0], flat[:, 1], flat[:, 2])]
    for first, dst, key in nfa._pending:
        q, lo, hi, d = _fragment_parts(key)[2]
        parts.append((first + q, lo, hi, np.where(d >= 0, first + d, dst)))
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(x) for x in zip(*parts))


def _determinize_batched(nfa: NFA, max_states: int, max_entries: int) -> DFA:
    n = nfa.num_states
    tq, tlo, thi, td = _flat_transitions(nfa)
    bounds = _unique_ints(np.concatenate([tlo, thi + 1, [0, 256]]))
    byte_class = (np.searchsorted(bounds, np.arange(256), side="right") - 1).astype(np.int32)
    C = len(bounds) - 1
    acc_nfa = np.zeros(n, bool)
    if nfa.accepting:
        acc_nfa[np.fromiter(nfa.accepting, np.int64)] = True
    important = acc_nfa.copy()
    important[tq] = True
    # subset ids: a singleton {q} is q itself; larger subsets get ids n, n+1, ... ;
    # -1 is the empty subset (dead)
    subsets: list[frozenset[int]] = []
    sid_of: dict[frozenset[int], int] = {}

    def intern(s) -> int:
        if not s:
            return -1
        if len(s) == 1:
            return next(iter(s))
        s = frozenset(s)
        j = sid_of.get(s)
        if j is None:
            j = sid_of[s] = n + len(subsets)
            subsets.append(s)
        return j

    def members(sid: int):
        return (sid,) if sid < n else subsets[sid - n]

    # epsilon closures (restricted to important states) of the states that need one
    has_eps = np.fromiter(map(bool, nfa.eps), bool, n)
    close_sid = np.where(important, np.arange(n), -1)
    need = _unique_ints(np.concatenate([td, [nfa.start]]))
    for q in need[has_eps[need]].tolist():
        seen = {q}
        stack = [q]
        while stack:
            x = stack.pop()
            for y in nfa.eps[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        close_sid[q] = intern([x for x in seen if important[x]])
    # successor rows of the important NFA states: (class, subset id), CSR by state.
    # Ranges of one state sorted by lo; a state whose ranges overlap (several targets
    # on one class: rare once classes are inserted as DFA fragments) is done in Python.
    o = np.lexsort((tlo, tq))
    tq, tlo, thi, td = tq[o], tlo[o], thi[o], td[o]
    clo, chi = byte_class[tlo], byte_class[thi]
    same = np.zeros(len(tq), bool)
    same[1:] = tq[1:] == tq[:-1]
    ovl = np.zeros(n, bool)
    ovl[tq[1:][same[1:] & (clo[1:] <= chi[:-1])]] = True
    vec = ~ovl[tq]
    cnt = np.where(vec, chi - clo + 1, 0)
    rq = np.repeat(tq.astype(np.int32), cnt)              # int32: [sum of row lengths]
    rc = _ranges_of(clo, cnt).astype(np.int32)
    rs = np.repeat(close_sid[td].astype(np.int32), cnt)
    if ovl.any():
        xq, xc, xs = [], [], []
        qa = np.searchsorted(tq, np.arange(n + 1))           # tq is sorted
        for q in np.nonzero(ovl)[0].tolist():
            acc: dict[int, set[int]] = {}
            a, b = int(qa[q]), int(qa[q + 1])
            for lo, hi, d in zip(tlo[a:b].tolist(), thi[a:b].tolist(), td[a:b].tolist()):
                c = int(close_sid[d])
                if c < 0:
                    continue
                for ci in range(int(byte_class[lo]), int(byte_class[hi]) + 1):
                    acc.setdefault(ci, set()).update(members(c))
            for ci in sorted(acc):
                xq.append(q)
                xc.append(ci)
                xs.append(intern(acc[ci]))
        rq = np.concatenate([rq, np.array(xq, np.int32)])
        rc = np.concatenate([rc, np.array(xc, np.int32)])
        rs = np.concatenate([rs, np.array(xs, np.int32)])
        o = _argsort_ints(rq)
        rq, rc, rs = rq[o], rc[o], rs[o]
    live = rs >= 0
    row_q, row_c, row_s = (rq, rc, rs) if live.all() else (rq[live], rc[live], rs[live])
    del rq, rc, rs
    rstart = np.searchsorted(row_q, np.arange(n + 1))

    # breadth-first subset construction, one level at a time
    start = int(close_sid[nfa.start])
    if start < 0:
        return empty_dfa()
    dfa_of = np.full(max(2 * (n + len(subsets)), 1024), -1, np.int32)   # subset id -> DFA state
    dfa_of[start] = 0
    order = [start]
    entries = len(members(start))
    rowcache: dict[int, tuple[list[int], list[int]]] = {}

    def row_lists(q: int):
        r = rowcache.get(q)
        if r is None:
            a, b = int(rstart[q]), int(rstart[q + 1])
            r = rowcache[q] = (row_c[a:b].tolist(), row_s[a:b].tolist())
        return r

    def union_row(sid: int):
        accum: dict[int, set[int]] = {}
        for q in subsets[sid - n]:
            for c, t in zip(*row_lists(q)):
                u = accum.get(c)
                if u is None:
                    u = accum[c] = set()
                u.update(members(t))
        cs = sorted(accum)
        return cs, [intern(accum[c]) for c in cs]

    def grow():
        nonlocal dfa_of
        if n + len(subsets) > len(dfa_of):
            dfa_of = np.concatenate([dfa_of, np.full(n + 2 * len(subsets), -1, np.int32)])

    def over_states():
        return too_large("max_dfa_states", max_states + 1, "DFA states", "determinise",
                         at_least=True, value=max_states)

    def over_entries():
        return too_large("max_subset_entries", entries, "subset entries", "determinise",
                         at_least=True)

    # the DFA's rows, written level by level (capacity doubled when full; starts at the
    # number of important NFA states, at most 32,768 rows)
    out = np.full((min(max(int(important.sum()), 16), 1 << 15), C), -1, np.int32)

    def room(rows: int):
        nonlocal out
        if rows > len(out):
            bigger = np.full((max(rows, min(2 * len(out), max_states)), C), -1, np.int32)
            bigger[:len(out)] = out
            out = bigger

    py_src: list[int] = []
    py_c: list[int] = []
    py_dst: list[int] = []
    i = 0
    while i < len(order):
        batch = order[i:]
        base = i
        i = len(order)
        if len(batch) <= 16:                              # small levels: plain Python
            for j, sid in enumerate(batch):
                cs, ts = row_lists(sid) if sid < n else union_row(sid)
                grow()
                for c, t in zip(cs, ts):
                    d = int(dfa_of[t])
                    if d < 0:
                        d = len(order)
                        if d >= max_states:
                            raise over_states()
                        entries += len(members(t))
                        if entries > max_entries:
                            raise over_entries()
                        dfa_of[t] = d
                        order.append(t)
                    py_src.append(base + j)
                    py_c.append(c)
                    py_dst.append(d)
            continue
        batch = np.array(batch, np.int64)
        single = batch < n
        # rows of singleton subsets: copy the NFA state's successor row
        qs = batch[single]
        a, b = rstart[qs], rstart[qs + 1]
        c_ = b - a
        idx = _ranges_of(a, c_)
        srcs = [np.repeat((base + np.nonzero(single)[0]).astype(np.int32), c_)]
        cls = [row_c[idx]]
        tsid = [row_s[idx]]
        # rows of larger subsets: per class, the union of the members' successors
        for j in np.nonzero(~single)[0].tolist():
            cs, ts = union_row(int(batch[j]))
            srcs.append(np.full(len(cs), base + j, np.int32))
            cls.append(np.array(cs, np.int32))
            tsid.append(np.array(ts, np.int32))
        grow()
        src, cl, ts = np.concatenate(srcs), np.concatenate(cls), np.concatenate(tsid)
        fresh = ts[dfa_of[ts] < 0]
        if len(fresh):
            fresh = fresh[np.sort(_unique_first_inverse(fresh)[0])]   # first-seen order
            if len(order) + len(fresh) > max_states:
                raise over_states()
            big = fresh[fresh >= n]
            entries += len(fresh) - len(big) + sum(len(subsets[s - n]) for s in big.tolist())
            if entries > max_entries:
                raise over_entries()
            dfa_of[fresh] = len(order) + np.arange(len(fresh))
            order.extend(fresh.tolist())
        room(base + len(batch))
        flat = src.astype(np.int64)                       # flat positions src * C + c
        flat *= C
        flat += cl
        out.reshape(-1)[flat] = dfa_of[ts]
    room(len(order))
    out[py_src, py_c] = py_dst
    trans = out[:len(order)]
    if len(out) > 2 * len(order) + 1024:               # much spare room: release it
        trans = trans.copy()
    order_a = np.array(order, np.int64)
    accepting = np.zeros(len(order), bool)
    sm = order_a < n
    accepting[sm] = acc_nfa[order_a[sm]]
    acc_set = nfa.accepting
    for j in np.nonzero(~sm)[0].tolist():
        accepting[j] = not subsets[int(order_a[j]) - n].isdisjoint(acc_set)
    return DFA(trans, accepting, byte_class)


def _union_runs(runs: list, interned: dict) -> list:
    """Disjoint runs ``(lo, hi, T)`` (class ranges, ascending) from runs sorted by
    ``lo`` that may overlap: on each stretch of classes, the union of the subsets of the
    runs covering it (interned, so equal unions are the same object)."""
    cuts = sorted({r[0] for r in runs} | {r[1] + 1 for r in runs})
    out: list = []
    active: list = []
    k, R = 0, len(runs)
    for a, b in zip(cuts, cuts[1:]):
        while k < R and runs[k][0] <= a:
            active.append(runs[k])
            k += 1
        active = [r for r in active if r[1] >= a]
        if not active:
            continue
        U = active[0][2]
        for r in active[1:]:
            T = r[2]
            if T is not U and not T <= U:
                U = U | T
        if len(active) > 1:
            U = interned.setdefault(U, U)
        if out and out[-1][1] == a - 1 and out[-1][2] is U:
            out[-1] = (out[-1][0], b - 1, U)
        else:
            out.append((a, b - 1, U))
    return out


def _disjoint_runs(runs: list, interned: dict) -> list:
    """``runs`` (class ranges with their subsets) sorted, overlaps merged by union,
    adjacent runs to the same subset joined."""
    if len(runs) < 2:
        return runs
    runs.sort(key=itemgetter(0))
    prev = runs[0]
    out = [prev]
    for r in runs[1:]:
        if r[0] <= prev[1]:
            return _union_runs(runs, interned)
        if r[0] == prev[1] + 1 and r[2] is prev[2]:
            prev = out[-1] = (prev[0], r[1], prev[2])
        else:
            out.append(r)
            prev = r
    return out


def _determinize_python(nfa: NFA, max_states: int, max_entries: int) -> DFA:
    """:func:`determinize` state by state in plain Python (small NFAs, and the
    epsilon-heavy NFAs of JSON Schemas).

    Rows are runs ``(first class, last class, successor subset)``, not one entry per
    class: a string's inner state has a few runs over a hundred classes. Per NFA state
    its runs (epsilon-closed sets of important states) are built once; a closure is
    built once per NFA state and shared by every run that reaches it. A subset's row is
    its members' runs, sorted; where they overlap, each stretch of classes takes the
    union of the runs covering it. The table is written from the runs at the end."""
    n = nfa.num_states
    byte_class, _ = _byte_classes(nfa)
    C = int(byte_class.max()) + 1
    trans = nfa.trans
    eps = nfa.eps
    accepting_nfa = nfa.accepting
    important = [bool(t) for t in trans]
    for q in accepting_nfa:
        important[q] = True
    # epsilon closures, restricted to important states (one frozenset per NFA state,
    # built on first use)
    closure: list = [None] * n

    def close(q: int) -> frozenset[int]:
        if not eps[q]:
            c = closure[q] = frozenset((q,)) if important[q] else frozenset()
            return c
        seen = {q}
        stack = [q]
        while stack:
            x = stack.pop()
            for y in eps[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        c = closure[q] = frozenset([x for x in seen if important[x]])
        return c

    # per NFA state: its runs, disjoint and ascending, subsets non-empty (on first use)
    succ: list = [None] * n
    interned: dict[frozenset[int], frozenset[int]] = {}
    bc = byte_class.tolist()

    def successors(q: int) -> list:
        runs = []
        for lo, hi, d in trans[q]:
            T = closure[d]
            if T is None:
                T = close(d)
            if T:                                         # else no important state: dead
                runs.append((bc[lo], bc[hi], T))
        if len(runs) > 1:
            runs = _disjoint_runs(runs, interned)
        succ[q] = runs
        return runs

    start = close(nfa.start)
    ids = {start: 0}
    order = [start]
    entries = len(start)
    src_l: list[int] = []                                # the table's runs
    lo_l: list[int] = []
    hi_l: list[int] = []
    dst_l: list[int] = []
    src_add, lo_add, hi_add, dst_add = src_l.append, lo_l.append, hi_l.append, dst_l.append
    ids_get = ids.get
    i = 0
    while i < len(order):
        S = order[i]
        if len(S) == 1:
            q, = S
            runs = succ[q]
            if runs is None:
                runs = successors(q)
        else:
            runs = []
            for q in S:
                r = succ[q]
                if r is None:
                    r = successors(q)
                runs += r
            runs = _disjoint_runs(runs, interned)
        for lo, hi, T in runs:
            j = ids_get(T)
            if j is None:
                j = len(order)
                if j >= max_states:
                    raise too_large("max_dfa_states", j + 1, "DFA states", "determinise",
                                    at_least=True, value=max_states)
                entries += len(T)
                if entries > max_entries:
                    raise too_large("max_subset_entries", entries, "subset entries",
                                    "determinise", at_least=True)
                ids[T] = j
                order.append(T)
            src_add(i)
            lo_add(lo)
            hi_add(hi)
            dst_add(j)
        i += 1
    trans_out = np.full(len(order) * C, -1, np.int32)
    if src_l:
        lo_a = np.array(lo_l, np.int64)
        lens = np.array(hi_l, np.int64) - lo_a + 1
        first = np.array(src_l, np.int64) * C + lo_a - (np.cumsum(lens) - lens)
        pos = np.repeat(first, lens) + np.arange(int(lens.sum()), dtype=np.int64)
        trans_out[pos] = np.repeat(np.array(dst_l, np.int32), lens)
    accepting = np.array([not S.isdisjoint(accepting_nfa) for S in order], bool)
    return DFA(trans_out.reshape(len(order), C), accepting, byte_class)


# ---------------------------------------------------------------------------------------
# trimming and minimisation
# ---------------------------------------------------------------------------------------
def _compress_columns(trans: np.ndarray, byte_class: np.ndarray):
    """Merge byte classes with identical columns; classes numbered in the lexicographic
    order of their columns (as ``np.unique(trans.T, axis=0)`` would)."""
    if trans.shape[0] == 0:
        return np.zeros((0, 1), np.int32), np.zeros(256, np.int32)
    Q, C = trans.shape
    # equal columns by a random projection, checked exactly below. Integer weights, and
    # blocks of rows whose sums stay below 2^52, so that the float64 sums are exact
    # whatever order BLAS adds in: equal columns always get equal sums (with float
    # weights, BLAS may round two equal columns' sums differently)
    rows = 1 << 12
    wbits = max(1, 52 - 12 - int(Q).bit_length())
    w = np.random.default_rng(0x636F6C73).integers(0, 1 << wbits, Q).astype(np.float64)
    h = np.zeros(C)
    for r0 in range(0, Q, rows):
        h += w[r0:r0 + rows] @ trans[r0:r0 + rows]
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    dup = np.nonzero(first[inv] != np.arange(C))[0]                 # merged columns
    if len(dup) and not (np.take(trans, dup, axis=1)
                         == np.take(trans, first[inv[dup]], axis=1)).all():   # collision
        _, first, inv = np.unique(trans.T, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
    perm = _lex_order(trans, first)
    rank_first = first[perm]
    lex = np.empty(len(first), np.int64)
    lex[perm] = np.arange(len(first))
    return np.ascontiguousarray(np.take(trans, rank_first, axis=1), dtype=np.int32), \
        lex[inv].astype(np.int32)[byte_class]


def _lex_order(trans: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Positions in ``cols`` of the distinct columns ``trans[:, cols]`` in the
    lexicographic order of their entries, top row first (entries are >= -1: shifted
    by one, big-endian bytes compare like the integer sequences). Rows are read in
    blocks of growing length, each only for the columns still tied with another on
    every row before it; a tied group is ordered by the block's rows."""
    Q = trans.shape[0]
    groups = [np.arange(len(cols))]                 # in order; tied on rows [0, lo)
    lo, hi = 0, 256
    while lo < Q and any(len(g) > 1 for g in groups):
        hi = min(Q, hi)
        tied = np.concatenate([g for g in groups if len(g) > 1])
        block = (np.take(trans[lo:hi], cols[tied], axis=1).T + np.int64(1)).astype(">u4")
        key = dict(zip(tied.tolist(), (row.tobytes() for row in block)))
        out = []
        for g in groups:
            if len(g) == 1:
                out.append(g)
                continue
            members = sorted(g.tolist(), key=key.__getitem__)
            run = [members[0]]
            for a, b in zip(members, members[1:]):
                if key[a] != key[b]:
                    out.append(np.array(run))
                    run = []
                run.append(b)
            out.append(np.array(run))
        groups = out
        lo, hi = hi, hi * 16
    # (columns equal on every row stay in their order, as a stable sort leaves them)
    return np.concatenate(groups).astype(np.int64)


def _ranges(starts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Concatenation of the index ranges ``starts[i] .. starts[i + 1] - 1``, ``i`` in ``idx``."""
    a = starts[idx]
    return _ranges_of(a, starts[idx + 1] - a)


def _ranges_of(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The concatenated index ranges ``start[i] .. start[i] + count[i] - 1``."""
    total = int(count.sum())
    return np.repeat(start - (np.cumsum(count) - count), count) + np.arange(total)


def _unique_ints(x: np.ndarray) -> np.ndarray:
    """``np.unique(x)`` for a 1-D integer array, by sorting (NumPy 2's hash-based
    ``unique`` is several times slower on the arrays here)."""
    x = np.sort(x)
    if len(x) < 2:
        return x
    keep = np.empty(len(x), bool)
    keep[0] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]


_PACKED_SORT_MIN = 1024


def _argsort_ints(x: np.ndarray) -> np.ndarray:
    """``np.argsort(x, kind="stable")`` (int64) for a 1-D integer array.

    Where the value range times the length fits in 63 bits, each value is packed with
    its index into one int64 (value above, index below) and those are sorted: NumPy's
    ``sort`` of int64 is SIMD-accelerated and its ``argsort`` is not (measured 4x on 9
    million pairs of a lifted automaton). Ties keep their index order, so the result is
    the stable argsort's exactly; other arrays use ``np.argsort``."""
    n = len(x)
    if n < _PACKED_SORT_MIN or x.dtype.kind not in "iu":
        return np.argsort(x, kind="stable")
    lo, hi = int(x.min()), int(x.max())
    b = max((n - 1).bit_length(), 1)
    if hi - lo >= (1 << (63 - b)) or hi >= (1 << 63):
        return np.argsort(x, kind="stable")
    key = x.astype(np.int64)                       # a copy
    if lo:
        key -= lo
    key <<= b
    key |= np.arange(n, dtype=np.int64)
    key.sort()
    key &= (1 << b) - 1
    return key


def _unique_first_inverse(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_index=True, return_inverse=True)[1:]`` for a 1-D array (the
    index of each distinct value's first occurrence, and the inverse), with less fixed
    overhead (:func:`_finite_blocks` calls it once per height)."""
    o = _argsort_ints(x)
    xs = x[o]
    new = np.empty(len(x), bool)
    new[:1] = True
    np.not_equal(xs[1:], xs[:-1], out=new[1:])
    inv = np.empty(len(x), np.int64)
    inv[o] = np.cumsum(new) - 1
    return o[new], inv


def _successor_pairs(trans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct live transitions ``(src, dst)`` of ``trans`` (int64, sorted).
    Adjacent byte classes mostly share their target: entries equal to their left
    neighbour are dropped first, the rest deduplicated by one sort."""
    Q = trans.shape[0]
    keep = trans >= 0
    keep[:, 1:] &= trans[:, 1:] != trans[:, :-1]
    key = np.repeat(np.arange(Q, dtype=np.int64) * Q, keep.sum(1))
    key += trans[keep]
    key = _unique_ints(key)
    return key // Q, key % Q


def _predecessors(trans: np.ndarray, with_outdeg: bool = False, pairs=None):
    """CSR of the reversed transition graph: the distinct predecessors of ``q`` are
    ``pred[start[q]:start[q + 1]]`` (ascending); with ``with_outdeg`` also the number
    of distinct successors of each state. ``pairs``: :func:`_successor_pairs` of
    ``trans``, in any order, if known."""
    Q = trans.shape[0]
    src, dst = _successor_pairs(trans) if pairs is None else pairs
    o = _argsort_ints(dst * Q + src)                               # by dst, then src
    src, dst = src[o], dst[o]
    start = np.searchsorted(dst, np.arange(Q + 1))
    if with_outdeg:
        return src, start, np.bincount(src, minlength=Q)
    return src, start


def _finite_levels(pred: np.ndarray, pstart: np.ndarray, outdeg: np.ndarray) -> list:
    """States of a trimmed DFA whose language is finite, by height (level ``k``: the
    longest word from the state has ``k`` bytes): reverse topological order from the
    states without successors (Kahn). States on or above a cycle are never reached."""
    deg = outdeg.astype(np.int64).copy()
    level = np.nonzero(deg == 0)[0]
    levels = []
    while len(level):
        levels.append(level)
        p = pred[_ranges(pstart, level)]
        if len(p) == 0:
            break
        np.subtract.at(deg, p, 1)
        level = _unique_ints(p[deg[p] == 0])
    return levels


def _finite_blocks(trans_q: np.ndarray, accepting: np.ndarray, levels: list,
                   mult: np.ndarray) -> np.ndarray:
    """Equivalence classes of the finite-language states (see :func:`_finite_levels`):
    two states are equivalent iff they have the same height, acceptance and successor
    blocks. Returns int64 block ids (``-1`` for the other states)."""
    Q, C = trans_q.shape
    block = np.full(Q + 1, -1, np.int64)                            # [Q]: dead
    m = mult.T.copy()                                               # [C + 1, 2]
    nid = 0
    for lv in levels:
        sig = np.empty((len(lv), C + 1), np.int64)
        sig[:, :C] = block[trans_q[lv]]
        sig[:, C] = accepting[lv]
        if len(lv) == 1:
            inv = np.zeros(1, np.int64)
        else:
            h = sig @ m                                             # wrapping int64
            key = h[:, 0] ^ (h[:, 1] * np.int64(0x9E3779B97F4A7C15 - (1 << 64)))
            first, inv = _unique_first_inverse(key)
            if not (sig == sig[first[inv]]).all():                 # hash collision
                _, inv = np.unique(sig, axis=0, return_inverse=True)
                inv = inv.reshape(-1)
        block[lv] = nid + inv
        nid += int(inv.max()) + 1
    return block[:Q]


_SMALL = 32     # frontiers up to this size are handled in plain Python (same result)


def _bfs_order(trans: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """States reachable from 0 through ``allowed`` states, in the order a sequential
    BFS (successors in class order) visits them; computed level by level."""
    Q = trans.shape[0]
    seen = np.zeros(Q + 1, bool)
    seen[0] = True
    seen[Q] = True                                      # index -1 (dead) is never taken
    seen[:Q] |= ~allowed
    pos = np.zeros(Q + 1, np.int64)
    levels = [np.zeros(1, np.int64)]
    frontier = levels[0]
    while len(frontier):
        if len(frontier) <= _SMALL:                     # same order, less overhead
            nxt = []
            for row in trans[frontier].tolist():
                for t in dict.fromkeys(row):            # distinct, first-seen order
                    if not seen[t]:
                        seen[t] = True
                        nxt.append(t)
            if not nxt:
                break
            frontier = np.array(nxt, np.int64)
            levels.append(frontier)
            continue
        cand = trans[frontier].ravel()
        cand = cand[~seen[cand]]
        if len(cand) == 0:
            break
        idx = np.arange(len(cand))
        pos[cand[::-1]] = idx[::-1]                     # first occurrence of each state
        frontier = cand[pos[cand] == idx].astype(np.int64)
        seen[frontier] = True
        levels.append(frontier)
    return np.concatenate(levels)


def trim(dfa: DFA) -> DFA:
    """Keep states reachable from the start and co-reachable to an accepting state;
    renumber in BFS order from the start."""
    return _trim(dfa)[0]


def _trim(dfa: DFA, all_coreachable: bool = False):
    """:func:`trim`, and the distinct live transitions ``(src, dst)`` of the result
    (None with ``all_coreachable``: the caller knows that every state is co-reachable,
    e.g. ``dfa`` is itself the output of ``trim``; no reverse search)."""
    Q = dfa.num_states
    if Q == 0:
        return dfa, None
    trans = dfa.trans
    co = np.ones(Q, bool) if all_coreachable else dfa.accepting.copy()
    pairs = None
    # co-reachable: reverse BFS from the accepting states
    frontier = np.zeros(0, np.int64) if all_coreachable else np.nonzero(co)[0]
    if len(frontier):
        pairs = _successor_pairs(trans)
        pred, pstart = _predecessors(trans, pairs=pairs)
    while len(frontier):
        # every state enters the frontier once: dedupe (a state with k predecessor
        # edges from the frontier would otherwise be expanded k times, and the
        # work list would grow by a factor k per level)
        if len(frontier) <= _SMALL:
            cand: set[int] = set()
            for f in frontier.tolist():
                cand.update(pred[pstart[f]:pstart[f + 1]].tolist())
            p = np.array(sorted(c for c in cand if not co[c]), np.int64)
        else:
            p = pred[_ranges(pstart, frontier)]
            p = _unique_ints(p[~co[p]])
        co[p] = True
        frontier = p
    if not co[0]:
        return empty_dfa(), None
    # reachable from start through co-reachable states, BFS order
    order = _bfs_order(trans, co)
    if len(order) == Q and (order == np.arange(Q)).all():
        # already in BFS order (a determinised DFA whose states are all co-reachable):
        # nothing to renumber (_compress_columns copies)
        t2, bc = _compress_columns(trans, dfa.byte_class)
        return DFA(t2, dfa.accepting.copy(), bc), pairs
    remap = np.full(Q + 1, -1, np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    new_trans = trans.take(order, axis=0)
    # renumber in place; -1 (dead) wraps to remap[Q] = -1 (``take`` with the default
    # mode would first copy the indices to intp: a 26 MB temporary here)
    np.take(remap, new_trans, out=new_trans, mode="wrap")
    t2, bc = _compress_columns(new_trans, dfa.byte_class)
    if pairs is not None:
        s, d = remap[pairs[0]], remap[pairs[1]]
        live = (s >= 0) & (d >= 0)
        pairs = (s[live].astype(np.int64), d[live].astype(np.int64))
    return DFA(t2, dfa.accepting[order], bc), pairs


def _group_rows(sig: np.ndarray, mult: np.ndarray) -> np.ndarray:
    """Group ids of equal rows of ``sig`` (integer ``[n, k]``): two 64-bit polynomial
    hashes (wrapping arithmetic; a product with the multipliers, rows in chunks of at
    most 8 MB of int64), verified exactly; exact ``np.unique`` on a collision."""
    n, k = sig.shape
    h = np.empty((2, n), np.int64)
    step = max(1, (1 << 20) // max(k, 1))
    for r0 in range(0, n, step):
        h[:, r0:r0 + step] = mult[:, :k] @ sig[r0:r0 + step].T.astype(np.int64)
    inv = _unique_first_inverse(h[0] ^ (h[1] * np.int64(0x9E3779B97F4A7C15 - (1 << 64))))[1]
    reps = np.full(int(inv.max()) + 1, -1, np.int64)
    reps[inv[::-1]] = np.arange(len(inv))[::-1]
    if not (sig == sig[reps[inv]]).all():                       # hash collision
        _, inv = np.unique(sig, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
    return inv


def _group_small(key: np.ndarray) -> np.ndarray:
    """Group ids of equal rows of a small int64 matrix (first-seen order)."""
    ids: dict[tuple, int] = {}
    return np.array([ids.setdefault(r, len(ids)) for r in map(tuple, key.tolist())], np.int64)


def _refine_round_small(affected, blockx, trans_q, size, bsig, n_ids, pred, pstart):
    """One round of :func:`minimize`'s refinement in plain Python (few states: the
    same groups and ids as the vectorised round, without its fixed overhead)."""
    aff = affected.tolist()
    b_a = blockx[affected].tolist()
    rows = blockx[trans_q[affected]].tolist()
    groups: dict[tuple, list[int]] = {}
    in_round: dict[int, int] = {}
    for i, (b, r) in enumerate(zip(b_a, rows)):
        groups.setdefault((b, tuple(r)), []).append(i)
        in_round[b] = in_round.get(b, 0) + 1
    by_block: dict[int, list[tuple[tuple, list[int]]]] = {}
    for (b, sig), members in groups.items():
        by_block.setdefault(b, []).append((sig, members))
    moved: list[int] = []
    for b, gs in by_block.items():
        if int(size[b]) > in_round[b]:                    # unaffected members keep bsig[b]
            keep_sig = tuple(bsig[b].tolist())
            keep = next((k for k, (sig, _) in enumerate(gs) if sig == keep_sig), -1)
        else:                                             # largest group keeps the id
            keep = max(range(len(gs)), key=lambda k: (len(gs[k][1]), -k))
            bsig[b] = gs[keep][0]
        for k, (sig, members) in enumerate(gs):
            if k == keep:
                continue
            bsig[n_ids] = sig
            size[n_ids] = len(members)
            size[b] -= len(members)
            for i in members:
                blockx[aff[i]] = n_ids
                moved.append(aff[i])
            n_ids += 1
    cand: set[int] = set()
    for m in moved:
        cand.update(pred[pstart[m]:pstart[m + 1]].tolist())
    return np.array(sorted(cand), np.int64), n_ids


def _accept_distance(pred: np.ndarray, pstart: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    """Bytes on the shortest path from each state of a trimmed DFA to an accepting
    state (a reverse BFS from the accepting states)."""
    dist = np.full(len(accepting), -1, np.int64)
    frontier = np.nonzero(accepting)[0]
    dist[frontier] = 0
    d = 0
    while len(frontier):
        d += 1
        p = pred[_ranges(pstart, frontier)]
        p = _unique_ints(p[dist[p] < 0])
        dist[p] = d
        frontier = p
    return dist


_FINITE_MIN_STATES = 256   # smaller DFAs: plain refinement (its small rounds are cheaper)


def minimize(dfa: DFA) -> DFA:
    """Trim, then Moore partition refinement; result in BFS order.

    Refinement is a worklist: a state's signature (its block and its successors'
    blocks) can only change when a successor changed block, so each round regroups
    only the predecessors of the states that moved. Every block remembers the
    signature its unaffected members share, so a round costs time proportional to the
    states it regroups (times the number of byte classes), never to the whole
    automaton: a counter like ``a{0,20000}`` (20,000 rounds of one or two states) is
    linear. In a block whose members were all regrouped, the largest group keeps the
    block's id. The fixpoint is Moore's (the coarsest stable partition).

    States with a finite language (no cycle below them: every state of an acyclic DFA,
    the tails of the others) are grouped first, exactly and without rounds: equivalent
    states have the same height (longest word), so they are grouped level by level from
    the accepting sinks up, by their successors' blocks (Revuz). They are never
    equivalent to a state with an infinite language, so refinement runs only on the
    others, with the finite blocks fixed, from blocks of equal acceptance and distance
    to acceptance (invariants of equivalence)."""
    dfa, pairs = _trim(dfa)
    Q = dfa.num_states
    if Q == 0:
        return dfa
    trans = dfa.trans
    C = trans.shape[1]
    rng = np.random.default_rng(0x6A78)
    mult = rng.integers(1, 1 << 62, size=(2, C + 1), dtype=np.int64) | 1
    pred, pstart, outdeg = _predecessors(trans, with_outdeg=True, pairs=pairs)
    trans_q = trans          # block arrays have Q + 1 entries: dead (-1) reads the last
    # states with a finite language: blocks by height, bottom-up (exact, no refinement)
    levels = _finite_levels(pred, pstart, outdeg) if Q > _FINITE_MIN_STATES else []
    fin = np.zeros(Q, bool)
    if levels:
        fin[np.concatenate(levels)] = True
    blockx = np.empty(Q + 1, np.int32)                     # block of each state; [Q] = dead
    blockx[Q] = -1
    n_ids = 2
    if levels:
        fblock = _finite_blocks(trans_q, dfa.accepting, levels, mult)
        blockx[:Q][fin] = 2 + fblock[fin]
        n_ids = 2 + int(fblock[fin].max()) + 1
    inf = np.nonzero(~fin)[0]
    size = np.zeros(Q + 2, np.int64)                       # block ids never exceed Q + 1
    if levels:
        size[:n_ids] += np.bincount(blockx[:Q][fin], minlength=n_ids)
    # the others start in blocks of equal acceptance and distance to acceptance (both
    # the same for equivalent states, so the fixpoint is the same), not in two: the
    # first rounds regroup fewer states (measured: 0.31 -> 0.26 s on a 46,000-state
    # JSON Schema DFA)
    if len(inf):
        dist = _accept_distance(pred, pstart, dfa.accepting)
        _, first_inv = _unique_first_inverse(dist[inf] * 2 + dfa.accepting[inf])
        n_init = int(first_inv.max()) + 1
        blockx[inf] = n_ids + first_inv
        size[n_ids:n_ids + n_init] = np.bincount(first_inv)
        n_ids += n_init
    bsig = np.zeros((Q + 2, C), np.int32)                  # signature of unaffected members
    affected = inf
    while len(affected):
        if len(affected) <= _SMALL:
            affected, n_ids = _refine_round_small(affected, blockx, trans_q, size, bsig, n_ids,
                                                  pred, pstart)
            continue
        b_a = blockx[affected]
        s_a = blockx[trans_q[affected]]                    # [n, C]
        key = np.concatenate([b_a[:, None], s_a], axis=1)
        inv = _group_small(key) if len(affected) <= 64 else _group_rows(key, mult)
        G = int(inv.max()) + 1
        first = np.full(G, -1, np.int64)
        first[inv[::-1]] = np.arange(len(inv))[::-1]
        g_blk, g_sig = b_a[first], s_a[first]
        g_cnt = np.bincount(inv, minlength=G)
        # does the block keep members outside this round (which share bsig[block])?
        _, b_inv = _unique_first_inverse(b_a)
        g_has_rep = size[g_blk] > np.bincount(b_inv)[b_inv[first]]
        g_id = np.where(g_has_rep & (g_sig == bsig[g_blk]).all(1), g_blk, -1)
        norep = np.nonzero(~g_has_rep)[0]
        if len(norep):                                     # largest group keeps the id
            o = norep[np.lexsort((-g_cnt[norep], g_blk[norep]))]
            gb = g_blk[o]                                  # sorted: first of each run
            keep = o[np.flatnonzero(np.concatenate([[True], gb[1:] != gb[:-1]]))]
            g_id[keep] = g_blk[keep]
            bsig[g_blk[keep]] = g_sig[keep]
        fresh = np.nonzero(g_id < 0)[0]
        if len(fresh) == 0:
            break
        g_id[fresh] = n_ids + np.arange(len(fresh))
        bsig[g_id[fresh]] = g_sig[fresh]
        n_ids += len(fresh)
        new_blk = g_id[inv]
        mv = np.nonzero(new_blk != b_a)[0]
        moved = affected[mv]
        np.subtract.at(size, b_a[mv], 1)
        np.add.at(size, new_blk[mv], 1)
        blockx[moved] = new_blk[mv]
        affected = _unique_ints(pred[_ranges(pstart, moved)])
    block = blockx[:Q]
    block = _unique_first_inverse(block)[1]
    nblocks = int(block.max()) + 1
    if nblocks == Q:
        # already minimal: the quotient would be isomorphic to ``dfa`` (same byte
        # classes), and trim's output depends only on the DFA up to isomorphism (BFS
        # order from the start, then its columns in lexicographic order). Trim again
        # all the same: the BFS now visits classes in that lexicographic order, which
        # can renumber the states.
        return _trim(dfa, all_coreachable=True)[0]
    # the start's block first (ids 0 and block[0] swapped), one representative per
    # block; the quotient of a trimmed DFA is trimmed: only renumbered in BFS order
    start = int(block[0])
    swap = np.arange(nblocks)
    swap[[0, start]] = swap[[start, 0]]
    remap = np.empty(Q + 1, np.int32)
    remap[:Q] = swap[block]
    remap[Q] = -1                                          # dead (-1) wraps here
    reps = np.empty(nblocks, np.int64)
    reps[remap[Q - 1::-1]] = np.arange(Q)[::-1]
    new_trans = trans.take(reps, axis=0)
    np.take(remap, new_trans, out=new_trans, mode="wrap")
    return _trim(DFA(new_trans, dfa.accepting[reps], dfa.byte_class), all_coreachable=True)[0]


# ---------------------------------------------------------------------------------------
# combinators
# ---------------------------------------------------------------------------------------
def intersect(a: DFA, b: DFA, max_states: int | None = None) -> DFA:
    """Product automaton accepting L(a) ∩ L(b) (minimised); at most
    ``CompileLimits.max_dfa_states`` (or ``max_states``) states, checked before each
    new state. Work: O(states of the product x byte classes)."""
    if max_states is None:
        max_states = current_limits().max_dfa_states
    if a.num_states == 0 or b.num_states == 0:
        return empty_dfa()
    pair = a.byte_class.astype(np.int64) * b.num_classes + b.byte_class
    uniq, byte_class = np.unique(pair, return_inverse=True)
    ca, cb = uniq // b.num_classes, uniq % b.num_classes
    ta = a.trans[:, ca].astype(np.int64)
    tb = b.trans[:, cb].astype(np.int64)
    nb = b.num_states
    # breadth-first over the reachable pairs, one level at a time (vectorised): pair
    # (x, y) is the key x * nb + y; a level's new pairs get ids in the order of their
    # first appearance (row-major over the level's states and the classes), which is the
    # order of a state-by-state BFS
    dense = a.num_states * nb <= _DENSE_PAIR_IDS
    if dense:
        id_of = np.full(a.num_states * nb, -1, np.int32)  # ids < max_dfa_states
        id_of[0] = 0
    else:
        known_keys = np.zeros(1, np.int64)
        known_ids = np.zeros(1, np.int64)
    keys = [np.zeros(1, np.int64)]
    frontier = keys[0]
    rows = []
    n = 1
    while len(frontier):
        da = ta[frontier // nb]
        db = tb[frontier % nb]
        ok = (da >= 0) & (db >= 0)
        flat = (da * nb + db)[ok]
        if dense:
            fresh = flat[id_of[flat] < 0]
        else:
            pos = np.minimum(np.searchsorted(known_keys, flat), len(known_keys) - 1)
            fresh = flat[known_keys[pos] != flat]
        uk = fresh[np.sort(_unique_first_inverse(fresh)[0])]   # in order of appearance
        if n + len(uk) > max_states:
            raise too_large("max_dfa_states", int(max_states) + 1, "states", "intersect",
                            at_least=True, value=int(max_states))
        new_ids = n + np.arange(len(uk), dtype=np.int64)
        n += len(uk)
        if dense:
            id_of[uk] = new_ids
            ids = id_of[flat]
        else:
            allk = np.concatenate([known_keys, uk])
            o = _argsort_ints(allk)
            known_keys = allk[o]
            known_ids = np.concatenate([known_ids, new_ids])[o]
            ids = known_ids[np.searchsorted(known_keys, flat)]
        row = np.full(ok.shape, -1, np.int32)
        row[ok] = ids
        rows.append(row)
        keys.append(uk)
        frontier = uk
    trans = np.concatenate(rows).astype(np.int32)
    order = np.concatenate(keys)
    acc = a.accepting[order // nb] & b.accepting[order % nb]
    return minimize(DFA(trans, acc.astype(bool), byte_class.astype(np.int32)))


# pair-id table of intersect: a dense array when the pair space has at most this many
# entries (8 bytes each), else sorted keys
_DENSE_PAIR_IDS = 1 << 23


def _as_nfa(x) -> NFA:
    return x.to_nfa() if isinstance(x, DFA) else x


def union(*parts: "NFA | DFA") -> NFA:
    """NFA accepting the union of the parts' languages."""
    out = NFA()
    s = out.add_state()
    f = out.add_state(accepting=True)
    out.start = s
    for p in parts:
        ps, pacc = out.embed(_as_nfa(p))
        out.add_epsilon(s, ps)
        for q in pacc:
            out.add_epsilon(q, f)
    return out


def concat(*parts: "NFA | DFA") -> NFA:
    """NFA accepting the concatenation of the parts' languages."""
    out = NFA()
    cur = out.add_state()
    out.start = cur
    for p in parts:
        ps, pacc = out.embed(_as_nfa(p))
        out.add_epsilon(cur, ps)
        cur = out.add_state()
        for q in pacc:
            out.add_epsilon(q, cur)
    out.accepting = {cur}
    return out


@lru_cache(maxsize=4096)
def _normalized(ranges: tuple) -> tuple:
    return tuple(normalize_ranges(ranges))


@lru_cache(maxsize=4096)
def _class_sequences(key: tuple) -> list:
    """UTF-8 byte-range sequences of the (normalised) code-point ranges ``key``."""
    return [seq for lo, hi in key for seq in utf8_sequences(lo, hi)]


def codepoint_states(ranges: tuple) -> int:
    """Number of NFA states :meth:`NFA.add_codepoints` adds for the normalised
    ``ranges`` (for size estimates before building)."""
    seqs = _class_sequences(ranges)
    if len(seqs) <= 4:
        return sum(len(seq) - 1 for seq in seqs)
    return _class_fragment(ranges)[1] - 2


_DIRECT_CLASS_SEQS = 64     # classes with more UTF-8 sequences: built bottom-up


def _class_dfa_direct(ranges) -> DFA:
    """Minimal DFA reading one UTF-8 encoded code point of the normalised ``ranges``
    (surrogates excluded), built bottom-up: a state inside a character is identified by
    how many bytes remain and what each next continuation byte leads to."""
    mem = np.zeros(0x140000, bool)           # 5 * 64**3: whole lead-byte blocks
    for lo, hi in ranges:
        mem[lo:hi + 1] = True
    mem[0xD800:0xE000] = False
    mem[0x110000:] = False
    # level 1: the last continuation byte; a state per distinct 64-bit pattern
    blk = mem.reshape(-1, 64)                                      # [0x5000, 64]
    key1 = np.packbits(blk, axis=1, bitorder="little").view("<u8").ravel()
    u1, id1 = np.unique(key1, return_inverse=True)
    id1 = id1.reshape(-1)
    id1 = np.where(key1 == 0, -1, id1 - (u1[0] == 0))              # empty -> dead
    n1 = len(u1) - int(u1[0] == 0)
    # level 2: a continuation byte, then the last one
    c2 = id1.reshape(-1, 64).copy()                                 # [0x140, 64] by cp >> 12
    c2[0, :32] = -1                                                 # E0 80..9F: overlong
    u2, id2 = np.unique(c2, axis=0, return_inverse=True)
    id2 = id2.reshape(-1)
    empty2 = (u2 == -1).all(1)
    id2 = np.where(empty2[id2], -1, id2 - np.cumsum(empty2)[id2])
    n2 = len(u2) - int(empty2.sum())
    # level 3 (four-byte characters): by cp >> 18
    c3 = id2.reshape(-1, 64).copy()                                 # [5, 64]
    c3[0, :16] = -1                                                 # F0 80..8F: overlong
    u3, id3 = np.unique(c3, axis=0, return_inverse=True)
    id3 = id3.reshape(-1)
    empty3 = (u3 == -1).all(1)
    id3 = np.where(empty3[id3], -1, id3 - np.cumsum(empty3)[id3])
    n3 = len(u3) - int(empty3.sum())
    # states: 0 start, 1 accept, then levels 1, 2, 3
    o1, o2, o3 = 2, 2 + n1, 2 + n1 + n2
    S = o3 + n3
    trans = np.full((S, 256), -1, np.int32)
    # level 1 rows: pattern bits -> accept
    pat1 = u1[u1 != 0]
    bits = np.unpackbits(pat1.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little").astype(bool)
    trans[o1:o2, 0x80:0xC0] = np.where(bits, 1, -1)
    r2 = u2[~empty2]
    trans[o2:o3, 0x80:0xC0] = np.where(r2 >= 0, o1 + r2, -1)
    r3 = u3[~empty3]
    trans[o3:S, 0x80:0xC0] = np.where(r3 >= 0, o2 + r3, -1)
    row = trans[0]
    row[:0x80] = np.where(mem[:0x80], 1, -1)
    l1 = id1[2:32]                                                  # C2..DF: cp >> 6
    row[0xC2:0xE0] = np.where(l1 >= 0, o1 + l1, -1)
    l2 = id2[:16]                                                   # E0..EF: cp >> 12
    row[0xE0:0xF0] = np.where(l2 >= 0, o2 + l2, -1)
    l3 = id3[:5]                                                    # F0..F4: cp >> 18
    row[0xF0:0xF5] = np.where(l3 >= 0, o3 + l3, -1)
    acc = np.zeros(S, bool)
    acc[1] = True
    return DFA(trans, acc, np.arange(256, dtype=np.int32))


def _class_nfa(ranges: tuple) -> NFA:
    """NFA reading one UTF-8 encoded code point of ``ranges``: one byte path per UTF-8
    sequence range (the subset construction's input; small classes). A fresh NFA per
    call (NFAs are mutable: callers may extend it)."""
    nfa = NFA()
    s, f = nfa.add_state(), nfa.add_state(accepting=True)
    nfa.start = s
    for lo, hi in ranges:
        for seq in utf8_sequences(lo, hi):
            cur = s
            for i, (a, b) in enumerate(seq):
                nxt = f if i == len(seq) - 1 else nfa.add_state()
                nfa.trans[cur].append((a, b, nxt))
                cur = nxt
    return nfa


@lru_cache(maxsize=4096)
def _class_fragment(ranges: tuple) -> tuple[list, int, int]:
    """Minimal DFA reading exactly one UTF-8 encoded code point of ``ranges``:
    ``(transitions (q, lo, hi, dst), num_states, accepting state)``; state 0 starts.
    Cached per class: a counted repetition such as ``\\w{1,12}`` inserts the same class
    at every position (97 times in ``(\\w{1,12} ){3,8}``), and building the fragment of
    Unicode ``\\w`` costs tens of milliseconds."""
    if len(_class_sequences(ranges)) > _DIRECT_CLASS_SEQS:
        dfa = minimize(_class_dfa_direct(ranges))
    else:
        dfa = minimize(determinize(_class_nfa(ranges)))
    accept = int(np.nonzero(dfa.accepting)[0][0])
    return _byte_runs(dfa), dfa.num_states, accept


@lru_cache(maxsize=4096)
def _fragment_parts(ranges: tuple):
    """:func:`_class_fragment` split for :meth:`NFA.add_codepoints`, with its inner states
    (all but the start and the accepting state) numbered ``0, 1, ...`` in order and the
    accepting state as ``-1``: ``(start_runs [(lo, hi, d)], inner_rows [[(lo, hi, d)]],
    (q, lo, hi, d) int64 arrays of the inner rows)``."""
    runs, num_states, accept = _class_fragment(ranges)
    inner = [q - 1 - (q > accept) if q != accept else -1 for q in range(num_states)]
    start_runs = []
    inner_rows: list[list[tuple[int, int, int]]] = [[] for _ in range(num_states - 2)]
    for q, lo, hi, d in runs:
        if d == 0 or q == accept:               # one code point: no way back, no way on
            raise AssertionError(f"class fragment of {ranges[:4]}...: not a one-character DFA")
        (start_runs if q == 0 else inner_rows[inner[q]]).append((lo, hi, inner[d]))
    flat = [(qi, lo, hi, d) for qi, row in enumerate(inner_rows) for lo, hi, d in row]
    arrays = tuple(np.array(col, np.int64) for col in zip(*flat)) if flat else \
        tuple(np.zeros(0, np.int64) for _ in range(4))
    return start_runs, inner_rows, arrays


def _byte_runs(dfa: DFA) -> list[tuple[int, int, int, int]]:
    """(state, lo, hi, dst) for maximal byte runs with the same destination, by state
    then byte."""
    table = dfa.byte_table()
    S = table.shape[0]
    if S == 0:
        return []
    change = np.ones(table.shape, bool)
    change[:, 1:] = table[:, 1:] != table[:, :-1]
    starts = np.flatnonzero(change)                       # every row starts a run
    ends = np.append(starts[1:] - 1, S * 256 - 1)
    d = table.ravel()[starts]
    live = d >= 0
    starts, ends, d = starts[live], ends[live], d[live]
    return list(zip((starts >> 8).tolist(), (starts & 255).tolist(), (ends & 255).tolist(),
                    d.tolist()))


def literal_dfa(strings: Sequence[bytes]) -> DFA:
    """Minimal DFA of a finite set of byte strings."""
    nfa = NFA()
    s, f = nfa.add_state(), nfa.add_state(accepting=True)
    nfa.start = s
    for x in strings:
        nfa.add_bytes(s, f, x)
    return minimize(determinize(nfa))


# ---------------------------------------------------------------------------------------
# Boolean operations on DFAs (used by the JSON Schema builder for ``oneOf``, ``not``,
# ``if``/``then``/``else``)
# ---------------------------------------------------------------------------------------
def complete(dfa: DFA) -> DFA:
    """``dfa`` with an explicit (rejecting) sink instead of ``-1`` transitions."""
    Q = dfa.num_states
    if Q == 0:
        return DFA(np.zeros((1, 1), np.int32), np.zeros(1, bool), np.zeros(256, np.int32))
    trans = np.concatenate([dfa.trans, np.full((1, dfa.num_classes), Q, np.int32)], axis=0)
    trans = np.where(trans < 0, Q, trans).astype(np.int32)
    return DFA(trans, np.concatenate([dfa.accepting, [False]]), dfa.byte_class)


def complement(dfa: DFA) -> DFA:
    """DFA of every byte string not in ``L(dfa)`` (over all 256 byte values)."""
    c = complete(dfa)
    return DFA(c.trans, ~c.accepting, c.byte_class)


def difference(a: DFA, b: DFA, max_states: int | None = None) -> DFA:
    """Product automaton accepting ``L(a) \\ L(b)`` (minimised); the same state limit
    as :func:`intersect`."""
    if a.num_states == 0:
        return empty_dfa()
    if b.num_states == 0:
        return a
    return intersect(a, complement(b), max_states)


def is_empty(dfa: DFA) -> bool:
    """True if ``L(dfa)`` is empty (no accepting state reachable from the start): a
    breadth-first search, one level at a time."""
    Q = dfa.num_states
    if Q == 0:
        return True
    if dfa.accepting[0]:
        return False
    seen = np.zeros(Q + 1, bool)
    seen[0] = seen[Q] = True                        # [Q]: dead (-1) wraps here
    frontier = np.zeros(1, np.int64)
    while len(frontier):
        nxt = dfa.trans[frontier].ravel()
        nxt = _unique_ints(nxt[~seen[nxt]])
        if dfa.accepting[nxt].any():
            return False
        seen[nxt] = True
        frontier = nxt
    return True
