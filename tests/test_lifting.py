"""Token lifting (docs/design.md §2) equals a brute-force reference.

Reference: for every DFA state ``q`` reachable by whole tokens and every ordinary
token ``v``, run the byte DFA over ``bytes(v)`` from ``q`` (``DFA.run``). The lifted
transitions — individual ones plus the bulk rows of run shortcuts — must be exactly
that set. The toy cases force the run shortcut on (any run length, any token count)
so it is exercised on small vocabularies; on the real vocabulary the shortcut path is
compared with the plain trie walk.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from jaxcd import EmptyLanguageError, Vocabulary
from jaxcd.automata.bits import unpack_bits
from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.json_schema import schema_to_regex
from jaxcd.automata.lifting import lift_transitions, tensorize
from jaxcd.automata.regex import regex_to_nfa

WORKLOAD = Path(__file__).parent / "data" / "workload"


def dfa_of(pattern, flags=0):
    return minimize(determinize(regex_to_nfa(pattern, flags)))


def lifted_set(dfa, vocab, **kw):
    lifted = lift_transitions(dfa, vocab, **kw)
    src, tok, dst = lifted.triples(vocab.vocab_size)
    states = lifted.states
    out = set(zip(states[src].tolist(), tok.tolist(), states[dst].tolist()))
    assert len(out) == len(src), "a transition was produced twice"
    return out, set(states.tolist())


def reference_set(dfa, vocab):
    toks = [(i, t) for i, t in enumerate(vocab.token_bytes) if not vocab.is_special[i]]
    reach, order, out = {0}, [0], set()
    while order:
        q = order.pop()
        for i, t in toks:
            d = dfa.run(t, q)
            if d >= 0:
                out.add((q, i, d))
                if d not in reach:
                    reach.add(d)
                    order.append(d)
    return out, reach


def toy_vocab(seed, n=60):
    rng = np.random.default_rng(seed)
    alphabet = [b"a", b"b", b"c", b"1", b"2", b'"', b"\\", b" ", b"\xc3", b"\xa9", b"\xe2\x82\xac",
                b"'", b"}", b","]
    toks = {b"<eos>"}
    while len(toks) < n:
        k = int(rng.integers(1, 7))
        toks.add(b"".join(alphabet[int(j)] for j in rng.integers(0, len(alphabet), k)))
    toks = sorted(toks - {b"<eos>"})
    toks.append(toks[3])                                   # a duplicate byte string
    return Vocabulary.from_token_bytes([b"<eos>"] + toks, eos_id=0)


TOY_PATTERNS = [
    r"[abc ]{0,5}'",
    r"[a-c]+1[0-9]*",
    r'"([^"\\]|\\["\\])*"(,"x":"[^"\\]{1,4}")?\}',
    r"(?s:.){2,6}",
    r"'[a-z ]{1,3}', '(é|€)*'",
    r"(ab|ba)*c?[12]{0,3}",
    r"[^,]*,[^,]*",
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pattern", TOY_PATTERNS)
def test_lifting_equals_brute_force_toy(pattern, seed):
    vocab = toy_vocab(seed)
    dfa = dfa_of(pattern)
    ref, ref_states = reference_set(dfa, vocab)
    for kw in ({}, {"min_run_bytes": 1, "min_run_tokens": 1},
               {"min_run_bytes": 1, "min_run_tokens": 1, "max_pairs": 3}):
        got, states = lifted_set(dfa, vocab, **kw)
        assert states == ref_states, kw
        assert got == ref, kw


def workload_dfa(name):
    spec = json.loads((WORKLOAD / "workload.json").read_text())
    (c,) = [c for c in spec["constraints"] if c["name"] == name]
    src = (WORKLOAD / c["file"]).read_text().strip()
    if c["kind"] == "regex":
        return dfa_of(src)
    return dfa_of(schema_to_regex(src, "")[0], re.ASCII)


@pytest.mark.parametrize("name", ["re_email", "re_func_call", "js_tool_call"])
def test_lifting_shortcut_equals_plain_walk(smol_vocab, name):
    dfa = workload_dfa(name)
    plain = lift_transitions(dfa, smol_vocab, min_run_bytes=257)   # no shortcut
    assert len(plain.bulk_src) == 0
    fast = lift_transitions(dfa, smol_vocab)
    assert len(fast.bulk_src) > 0 and len(fast.src) < len(plain.src) // 4
    assert np.array_equal(plain.states, fast.states)
    a = np.stack(plain.triples(smol_vocab.vocab_size))
    b = np.stack(fast.triples(smol_vocab.vocab_size))
    key = lambda t: np.lexsort(t[::-1])
    assert np.array_equal(a[:, key(a)], b[:, key(b)])



# ---------------------------------------------------------------------------------------
# the tensorized tables (distinct mask rows + row_index) against the byte DFA
# ---------------------------------------------------------------------------------------
def reference_token_automaton(dfa, vocab):
    """``{(q, v): q'}`` for DFA states reachable from 0 by whole tokens that can still
    reach an accepting state by whole tokens (``DFA.run`` on every ordinary token)."""
    toks = [bytes(t) for t in vocab.token_bytes]
    ordinary = [v for v in range(vocab.vocab_size) if not vocab.is_special[v]]
    trans, seen, todo = {}, {0}, [0]
    while todo:
        q = todo.pop()
        for v in ordinary:
            d = dfa.run(toks[v], q)
            if d >= 0:
                trans[(q, v)] = d
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
    live = {q for q in seen if dfa.accepting[q]}
    grew = True
    while grew:
        grew = False
        for (q, _), d in trans.items():
            if d in live and q not in live:
                live.add(q)
                grew = True
    return {k: d for k, d in trans.items() if k[0] in live and d in live}, live


def check_tables(dfa, vocab):
    """Logical mask rows ``cum_masks[row_index[base[s] + k]]`` are exactly the token
    automaton of ``dfa``: row ``base[s]`` empty, rows growing by non-empty disjoint
    labels, each label's tokens moving the DFA along the edge, EOS from exactly the
    accepting states, and nothing missing. Returns the tensorized automaton."""
    ref, live = reference_token_automaton(dfa, vocab)
    if 0 not in live:
        with pytest.raises(EmptyLanguageError):
            tensorize(dfa, vocab)
        return None
    fa = tensorize(dfa, vocab)
    cum = unpack_bits(np.asarray(fa.cum_masks)[np.asarray(fa.row_index)], vocab.vocab_size)
    start, dst = np.asarray(fa.out_start), np.asarray(fa.edge_dst)
    phi, todo, pairs = {fa.initial_state: 0}, [fa.initial_state], 0
    seen_fa = {fa.initial_state}
    while todo:
        s = todo.pop()
        q = phi[s]
        base, deg = start[s] + s, start[s + 1] - start[s]
        rows = cum[base: base + deg + 1]
        assert not rows[0].any()
        eos = False
        for k in range(deg):
            assert (rows[k] <= rows[k + 1]).all()
            lab = np.nonzero(rows[k + 1] & ~rows[k])[0].tolist()
            assert lab
            d = int(dst[start[s] + k])
            if d == fa.final_state:
                assert lab == [vocab.eos_id]
                eos = True
                continue
            for v in lab:
                assert (q, v) in ref, (s, v)
                assert phi.setdefault(d, ref[(q, v)]) == ref[(q, v)]
            pairs += len(lab)
            if d not in seen_fa:
                seen_fa.add(d)
                todo.append(d)
        assert eos == bool(dfa.accepting[q])
    assert sorted(phi.values()) == sorted(set(phi.values())) == sorted(live)   # a bijection
    assert pairs == len(ref)
    return fa



@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("pattern", TOY_PATTERNS + [r"([a-c]{1,3} ){1,3}", r"(1|2|ab){3,5}\}"])
def test_tables_equal_token_automaton_toy(pattern, seed):
    check_tables(dfa_of(pattern), toy_vocab(seed))


def test_tables_equal_token_automaton_smol(smol_vocab):
    """Counters give many equal rows (every position of ``[0-9a-f]{6}`` allows the
    same hex tokens): stored once, and still exactly the DFA's transitions."""
    fa = check_tables(dfa_of(r"[0-9a-f]{6}-(x|yz)"), smol_vocab)
    assert fa.cum_masks.shape[0] < 0.6 * len(fa.row_index)


# ---------------------------------------------------------------------------------------
# delta lifting (a state lifted as a few bytes' difference from its main successor):
# open objects' "any key but the declared ones"
# ---------------------------------------------------------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402

from jaxcd.automata.json_schema import schema_to_nfa  # noqa: E402
from jaxcd.automata.lifting import _delta_states  # noqa: E402

_KEY_CHARS = st.sampled_from(["a", "b", "c", "1", "é", "€", " "])


def open_object_dfa(keys, required):
    schema = {"type": "object", "properties": {k: {"type": "string", "maxLength": 3}
                                               for k in keys},
              "required": [k for k in keys if k in required],
              "additionalProperties": {"type": "integer"}}
    nfa, _ = schema_to_nfa(schema, "")
    return minimize(determinize(nfa))


@settings(max_examples=25, deadline=None)
@given(keys=st.lists(st.text(_KEY_CHARS, min_size=1, max_size=4), min_size=1, max_size=4,
                     unique=True),
       required=st.sets(st.text(_KEY_CHARS, min_size=1, max_size=4), max_size=2),
       seed=st.integers(0, 2))
def test_delta_lifting_equals_brute_force(keys, required, seed):
    """Random declared key sets: the delta lifting (forced on every candidate state,
    with and without the bulk-row budget) gives exactly the brute-force transitions."""
    vocab = toy_vocab(seed)
    dfa = open_object_dfa(keys, required)
    ref, ref_states = reference_set(dfa, vocab)
    for kw in ({}, {"max_delta_fraction": 1.0},
               {"max_delta_fraction": 1.0, "max_delta_rows": 0, "min_run_bytes": 1,
                "min_run_tokens": 1},
               {"max_delta_fraction": 1.0, "delta_pack_tokens": 1},
               {"max_delta_fraction": 1.0, "delta_pack_tokens": 2, "max_delta_rows": 3,
                "min_run_bytes": 1, "min_run_tokens": 1}):
        got, states = lifted_set(dfa, vocab, **kw)
        assert states == ref_states, kw
        assert got == ref, kw


@pytest.mark.parametrize("keys", [["name", "age", "email", "city", "country"],
                                  ["a", "ab", "abc", "b\u00e9", "x_y"]])
def test_delta_lifting_equals_plain_smol(smol_vocab, keys):
    """SmolLM2 vocabulary: delta lifting on and off give the same transitions, and the
    open object's key-prefix states are lifted as deltas."""
    dfa = open_object_dfa(keys, keys[:1])
    q, r = _delta_states(dfa, smol_vocab.trie, 0.25)
    assert len(q) >= len(keys)
    plain = lift_transitions(dfa, smol_vocab, delta=False)
    for kw in ({}, {"max_delta_rows": 0}):
        fast = lift_transitions(dfa, smol_vocab, **kw)
        assert np.array_equal(plain.states, fast.states)
        a = np.stack(plain.triples(smol_vocab.vocab_size))
        b = np.stack(fast.triples(smol_vocab.vocab_size))
        key = lambda t: np.lexsort(t[::-1])
        assert np.array_equal(a[:, key(a)], b[:, key(b)])


@pytest.mark.parametrize("keys", [["name", "age", "email", "city", "country"],
                                  ["a", "ab", "abc", "b\u00e9", "x_y"]])
def test_delta_packed_rows_equal_copies_smol(smol_vocab, keys):
    """A delta state's copies of its reference's individual transitions, packed into
    shared rows or not (``delta_pack_tokens`` past the vocabulary): the
    same transitions, and tensorize builds identical tables; packing removes individual
    transitions."""
    dfa = open_object_dfa(keys, keys[:1])
    V = smol_vocab.vocab_size
    key = lambda t: np.lexsort(t[::-1])
    off = lift_transitions(dfa, smol_vocab, delta_pack_tokens=V + 1)
    a = np.stack(off.triples(V))
    for pack in (1, 16, 256):
        on = lift_transitions(dfa, smol_vocab, delta_pack_tokens=pack)
        assert np.array_equal(off.states, on.states)
        b = np.stack(on.triples(V))
        assert np.array_equal(a[:, key(a)], b[:, key(b)])
        assert len(on.src) < len(off.src), pack
    import jaxcd.automata.lifting as L
    fa = tensorize(dfa, smol_vocab)
    orig = L.lift_transitions
    try:
        L.lift_transitions = lambda d, v: orig(d, v, delta_pack_tokens=V + 1)
        fb = tensorize(dfa, smol_vocab)
    finally:
        L.lift_transitions = orig
    for f in ("edge_src", "edge_dst", "out_start", "out_dst", "cum_masks", "row_index",
              "dist"):
        assert np.array_equal(getattr(fa, f), getattr(fb, f)), f


def test_delta_rows_shared_between_objects(smol_vocab):
    """Several open objects with declared keys that differ from the plain key body on
    the same bytes: the masked bulk rows are stored once per (row, bytes) and the
    transitions equal the plain walk's."""
    keys = ["name", "nick", "size"]
    inner = {"type": "object", "properties": {k: {"type": "integer"} for k in keys}}
    schema = {"type": "object", "properties": {f"o{i}": dict(inner, required=keys[:i % 3])
                                               for i in range(4)}}
    dfa = minimize(determinize(schema_to_nfa(schema, "")[0]))
    plain = lift_transitions(dfa, smol_vocab, delta=False)
    fast = lift_transitions(dfa, smol_vocab)
    assert np.array_equal(plain.states, fast.states)
    a = np.stack(plain.triples(smol_vocab.vocab_size))
    b = np.stack(fast.triples(smol_vocab.vocab_size))
    key = lambda t: np.lexsort(t[::-1])
    assert np.array_equal(a[:, key(a)], b[:, key(b)])
    q, _ = _delta_states(dfa, smol_vocab.trie, 0.25)
    used = np.unique(fast.bulk_row[np.isin(fast.states[fast.bulk_src], q)])
    assert len(used) > 0
    assert len(np.unique(fast.rows[used], axis=0)) == len(used)      # no masked row twice


@pytest.mark.parametrize("pattern", [r"[a-z]{3,40}@[a-z]+\.(com|org)", r".{0,30}", "abc",
                                     r"(a|b)*abb[\u00e9-\u4e00]{2,9}", r"[^\"\\]{5,50}x"])
def test_dfa_to_nfa_is_the_byte_table(pattern):
    """``DFA.to_nfa`` (vectorised, in chunks of states): every state's ranges are
    disjoint, ascending, and send each byte where the DFA's byte table does (no range
    for a dead byte); same accepting states; any chunk size gives the same lists."""
    dfa = minimize(determinize(regex_to_nfa(pattern)))
    table = dfa.byte_table()
    nfa = dfa.to_nfa()
    assert nfa.num_states == dfa.num_states and nfa.start == 0
    assert nfa.accepting == {q for q in range(dfa.num_states) if dfa.accepting[q]}
    for q in range(dfa.num_states):
        got = np.full(256, -1)
        prev = -1
        for lo, hi, d in nfa.trans[q]:
            assert prev < lo <= hi and d >= 0
            got[lo:hi + 1] = d
            prev = hi
        assert np.array_equal(got, table[q])
    for chunk in (1, 3):
        assert dfa.to_nfa(chunk=chunk).trans == nfa.trans


def test_dominant_successor_against_a_loop():
    """``_dominant_successor`` (row sorts and run sums) against a plain loop over the
    rows: the successor other than the state itself and dead with the most weight,
    ties to the smallest, -1 if none has positive weight."""
    from jaxcd.automata.lifting import _dominant_successor
    rng = np.random.default_rng(0)
    for _ in range(300):
        Q, C = int(rng.integers(1, 30)), int(rng.integers(1, 12))
        trans = rng.integers(-1, min(Q, 4), size=(Q, C)).astype(np.int32)
        w = rng.integers(0, 3, size=C).astype(float)
        want = np.full(Q, -1)
        for q in range(Q):
            tot: dict = {}
            for c in range(C):
                r = int(trans[q, c])
                if r >= 0 and r != q:
                    tot[r] = tot.get(r, 0) + w[c]
            if tot and max(tot.values()) > 0:
                best = max(tot.values())
                want[q] = min(r for r, t in tot.items() if t == best)
        np.testing.assert_array_equal(_dominant_successor(trans, w), want)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.lists(st.integers(0, 10 ** 9), max_size=200),
       st.lists(st.integers(0, 10 ** 9), max_size=200))
def test_code_bitmap_is_set_membership(num_states, members, queries):
    """The (state, byte) pair set the lift skips with: membership equals ``np.isin``."""
    from jaxcd.automata.lifting import _code_bits, _has_code
    limit = num_states * 256
    members = np.array([m % limit for m in members], np.int64)
    queries = np.array([q % limit for q in queries] + members.tolist(), np.int64)
    bits = _code_bits(members, num_states)
    np.testing.assert_array_equal(_has_code(bits, queries), np.isin(queries, members))
