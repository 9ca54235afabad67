"""The subset construction of :func:`jaxcd.automata.fsa._determinize_python` against
a plain-Python subset construction (kept below verbatim as the reference) and against Python's ``re``: the same DFA up to isomorphism (identical after
minimisation), the same subsets, the same limit errors."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcd.automata import fsa
from jaxcd.automata.fsa import DFA, NFA, minimize
from jaxcd.automata.regex import regex_to_nfa
from jaxcd.errors import AutomatonTooLargeError
from jaxcd.limits import too_large


# ----------------------------------------------------------------------------------
# the reference: a plain-Python subset construction
# ----------------------------------------------------------------------------------
def _byte_classes_ref(nfa: NFA) -> tuple[np.ndarray, list[int]]:
    bounds = {0, 256}
    for row in nfa.trans:
        for lo, hi, _ in row:
            bounds.add(lo)
            bounds.add(hi + 1)
    edges = sorted(bounds)
    byte_class = np.zeros(256, np.int32)
    for ci in range(len(edges) - 1):
        byte_class[edges[ci]:edges[ci + 1]] = ci
    return byte_class, edges



def determinize_python_ref(nfa: NFA, max_states: int, max_entries: int) -> DFA:
    """:func:`determinize` state by state in plain Python (small NFAs)."""
    n = nfa.num_states
    byte_class, _ = _byte_classes_ref(nfa)
    accepting_nfa = nfa.accepting
    important = [bool(nfa.trans[q]) or q in accepting_nfa for q in range(n)]
    # epsilon closures, restricted to important states
    closure: list[frozenset[int] | None] = [None] * n

    def close(q: int) -> frozenset[int]:
        c = closure[q]
        if c is None:
            seen = {q}
            stack = [q]
            while stack:
                x = stack.pop()
                for y in nfa.eps[x]:
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
            c = closure[q] = frozenset(x for x in seen if important[x])
        return c

    # per NFA state: class -> closed successor subset (built on first use)
    succ: list[dict[int, frozenset[int]] | None] = [None] * n
    interned: dict[frozenset[int], frozenset[int]] = {}

    bc = byte_class.tolist()

    def successors(q: int) -> dict[int, frozenset[int]]:
        m = succ[q]
        if m is None:
            raw: dict[int, int | set[int]] = {}
            for lo, hi, d in nfa.trans[q]:
                for ci in range(bc[lo], bc[hi] + 1):
                    t = raw.get(ci)
                    if t is None:
                        raw[ci] = d
                    elif isinstance(t, set):
                        t.add(d)
                    elif t != d:
                        raw[ci] = {t, d}
            m = {}
            for ci, ds in raw.items():
                if isinstance(ds, int):
                    m[ci] = close(ds)
                else:
                    T = frozenset().union(*(close(d) for d in ds))
                    m[ci] = interned.setdefault(T, T)
            succ[q] = m
        return m

    start = close(nfa.start)
    ids = {start: 0}
    order = [start]
    entries = len(start)
    rows: list[dict[int, int]] = []
    i = 0
    while i < len(order):
        S = order[i]
        i += 1
        if len(S) == 1:
            targets = successors(next(iter(S)))
        else:
            acc: dict[int, set[int] | frozenset[int]] = {}
            for q in S:
                for ci, T in successors(q).items():
                    t = acc.get(ci)
                    if t is None:
                        acc[ci] = T
                    elif isinstance(t, frozenset):
                        if not T <= t:
                            u = set(t)
                            u |= T
                            acc[ci] = u
                    else:
                        t |= T
            targets = acc
        row: dict[int, int] = {}
        for ci, T in targets.items():
            if not T:
                continue                                  # no important state: dead
            if not isinstance(T, frozenset):
                T = frozenset(T)
            j = ids.get(T)
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
            row[ci] = j
        rows.append(row)
    C = int(byte_class.max()) + 1
    trans = np.full((len(order), C), -1, np.int32)
    for q, row in enumerate(rows):
        for ci, d in row.items():
            trans[q, ci] = d
    accepting = np.array([not S.isdisjoint(accepting_nfa) for S in order], bool)
    return DFA(trans, accepting, byte_class)


def same(a: DFA, b: DFA) -> bool:
    return (a.trans.shape == b.trans.shape and np.array_equal(a.trans, b.trans)
            and np.array_equal(a.accepting, b.accepting)
            and np.array_equal(a.byte_class, b.byte_class))


def check(nfa: NFA, max_states: int = 200_000, max_entries: int = 10_000_000) -> None:
    ref = determinize_python_ref(nfa, max_states, max_entries)
    new = fsa._determinize_python(nfa, max_states, max_entries)
    assert np.array_equal(ref.byte_class, new.byte_class)
    assert ref.num_states == new.num_states
    assert int(ref.accepting.sum()) == int(new.accepting.sum())
    assert same(minimize(ref), minimize(new))


PATTERNS = [
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    r'"([^"\\]|\\.)*"',
    r"(a|ab|abc)*c?(b|bc)*",
    r"\w+( \w+)*",
    r"[α-ω]+|[\u4e00-\u9fff]{1,2}|\U0001F600",
    r"(x?y?z?){0,4}[a-c]{2,5}",
    r"((a|b)*abb)|(\d{2,3}-){1,3}",
    r"(?s:.{0,3})é",
    r"",
    r"(ab|a)*?b+?",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_regex_nfas_match_reference(pattern):
    check(regex_to_nfa(pattern))


def random_nfa(rng: random.Random, n: int, eps_p: float, n_ranges: int) -> NFA:
    nfa = NFA()
    for _ in range(n):
        nfa.add_state(accepting=rng.random() < 0.2)
    nfa.start = rng.randrange(n)
    for q in range(n):
        for _ in range(rng.randrange(n_ranges + 1)):
            lo = rng.choice((rng.randrange(256), rng.randrange(97, 100)))
            hi = min(255, lo + rng.choice((0, 0, 1, 2, 30)))
            nfa.add_byte_range(q, rng.randrange(n), lo, hi)
        while rng.random() < eps_p:
            nfa.add_epsilon(q, rng.randrange(n))
    return nfa


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.floats(0, 0.8), st.integers(0, 3))
def test_random_nfas_match_reference(seed, n, eps_p, n_ranges):
    """Random NFAs: epsilon cycles, overlapping ranges to several targets, states
    without an important state in their closure, accepting states without moves."""
    check(random_nfa(random.Random(seed), n, eps_p, n_ranges))


def test_schema_nfa_matches_reference():
    from jaxcd.automata.json_schema import schema_to_nfa
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer", "minimum": -5},
        "tags": {"type": "array", "items": {"enum": ["a", "bc", "d"]}},
        "x": {"type": "number"}, "free": {}}, "required": ["name"]}
    nfa = schema_to_nfa(schema, property_order="auto")[0]
    assert nfa.num_states > fsa._SMALL_NFA
    check(nfa)


@pytest.mark.parametrize("cap", [1, 2, 5, 17])
def test_limits_match_reference(cap):
    nfa = regex_to_nfa(r"(a|b)*a(a|b){3}")
    for kw in ({"max_states": cap, "max_entries": 10**7}, {"max_states": 10**6, "max_entries": cap}):
        errs = []
        for f in (determinize_python_ref, fsa._determinize_python):
            try:
                f(nfa, **kw)
                errs.append(None)
            except AutomatonTooLargeError as e:
                errs.append(str(e))
        assert errs[0] == errs[1]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1), st.integers(0, 5000), st.sampled_from(
    [(0, 3), (-5, 5), (0, 10**5), (-(2**40), 2**40), (0, 2**62), (2**63 - 10, 2**63 - 1)]),
    st.sampled_from(["int64", "int32", "uint64", "uint16"]))
def test_argsort_ints_is_stable_argsort(seed, n, rng_lo_hi, dtype):
    lo, hi = rng_lo_hi
    info = np.iinfo(dtype)
    lo, hi = max(lo, int(info.min)), min(hi, int(info.max))
    if lo > hi:
        lo, hi = 0, 3
    x = np.random.default_rng(seed).integers(lo, hi, n, endpoint=True, dtype=np.int64 if hi < 2**63 else np.uint64).astype(dtype)
    o = fsa._argsort_ints(x)
    assert np.array_equal(o, np.argsort(x, kind="stable"))
    f, inv = fsa._unique_first_inverse(x)
    _, f2, inv2 = np.unique(x, return_index=True, return_inverse=True)
    assert np.array_equal(f, f2) and np.array_equal(inv, inv2.ravel())


def test_argsort_ints_uint64_near_top():
    x = np.array([2**64 - 1, 2**63, 5, 2**63, 0] * 400, np.uint64)
    assert np.array_equal(fsa._argsort_ints(x), np.argsort(x, kind="stable"))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 300, 5000, 70000]),
       st.integers(1, 40), st.integers(0, 3))
def test_compress_columns_matches_unique(seed, Q, C, agree):
    """Classes merged and ordered as ``np.unique(trans.T, axis=0)``: tables whose
    columns repeat, and (``agree``) columns that agree on long prefixes of rows, so the
    order is decided past the first blocks that _lex_order reads."""
    rng = np.random.default_rng(seed)
    base = rng.integers(-1, 4, (Q, max(1, C // 2)), dtype=np.int32)
    trans = base[:, rng.integers(0, base.shape[1], C)].copy()      # repeated columns
    if agree and Q > 1:
        cut = int(rng.integers(Q // 2, Q))
        trans[:cut] = trans[:cut, :1]                              # equal down to ``cut``
        trans[cut:] = rng.integers(-1, 3, (Q - cut, C), dtype=np.int32)
    byte_class = rng.integers(0, C, 256).astype(np.int32)
    got, bc = fsa._compress_columns(trans, byte_class)
    want, inv = np.unique(trans.T, axis=0, return_inverse=True)
    assert np.array_equal(got, want.T)
    assert np.array_equal(bc, inv.reshape(-1)[byte_class])


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 2**32 - 1), st.integers(1, 300), st.integers(1, 6),
       st.floats(0.0, 0.05))
def test_is_empty_matches_reachability(seed, Q, C, p_acc):
    """:func:`fsa.is_empty` against a plain depth-first search over the table."""
    rng = np.random.default_rng(seed)
    trans = rng.integers(-1, Q, (Q, C), dtype=np.int32)
    trans[rng.random((Q, C)) < 0.5] = -1                           # sparse: often empty
    accepting = rng.random(Q) < p_acc
    seen, stack, reach_acc = {0}, [0], False
    while stack:
        q = stack.pop()
        reach_acc |= bool(accepting[q])
        for d in trans[q].tolist():
            if d >= 0 and d not in seen:
                seen.add(d)
                stack.append(d)
    dfa = DFA(trans, accepting, np.zeros(256, np.int32) % C)
    assert fsa.is_empty(dfa) == (not reach_acc)
