"""Bulk lifting of runs with multi-byte characters (``lifting._fragment_run``).

Reference: the plain trie walk (no run shortcut at all: ``min_run_bytes=257``) and, on
small vocabularies, brute force (``DFA.run`` of every token from every reachable
state). The lifted transitions — individual ones plus bulk rows — must be exactly that
set, each transition once; and the fragment path must actually be taken (fewer
individual transitions than the plain walk).
"""

import functools

import numpy as np
import pytest

from jaxcd import Vocabulary
from jaxcd.automata.bits import unpack_bits
from jaxcd.automata.fsa import (DFA, _class_dfa_direct, _class_fragment, _normalized,
                                determinize, minimize)
from jaxcd.automata.lifting import _fragment_of, _run_groups, lift_transitions
from jaxcd.automata.regex import regex_to_nfa


def dfa_of(pattern, flags=0):
    return minimize(determinize(regex_to_nfa(pattern, flags)))


def triples(lifted, V):
    """All transitions as a sorted int64 [3, n] array (bulk rows expanded)."""
    rows = [np.nonzero(unpack_bits(r, V))[0] for r in lifted.rows]
    src, tok, dst = [lifted.src], [lifted.tok], [lifted.dst]
    for s, d, r in zip(lifted.bulk_src.tolist(), lifted.bulk_dst.tolist(),
                       lifted.bulk_row.tolist()):
        src.append(np.full(len(rows[r]), s))
        tok.append(rows[r])
        dst.append(np.full(len(rows[r]), d))
    st = lifted.states
    t = np.stack([st[np.concatenate(src).astype(np.int64)], np.concatenate(tok).astype(np.int64),
                  st[np.concatenate(dst).astype(np.int64)]])
    return t[:, np.lexsort(t[::-1])]


def brute_force(dfa, vocab):
    toks = [(i, t) for i, t in enumerate(vocab.token_bytes) if not vocab.is_special[i]]
    reach, todo, out = {0}, [0], []
    while todo:
        q = todo.pop()
        for i, t in toks:
            d = dfa.run(t, q)
            if d >= 0:
                out.append((q, i, d))
                if d not in reach:
                    reach.add(d)
                    todo.append(d)
    t = np.array(sorted(out), np.int64).T
    return t, reach


def toy_vocab(seed, n=160):
    """Tokens over ASCII letters, a space, and multi-byte characters — whole, split
    into their bytes, and glued to letters (as byte-level BPE vocabularies have)."""
    rng = np.random.default_rng(seed)
    pieces = [b"a", b"b", b"z", b"1", b" ", b"-", b'"', "é".encode(), "中".encode(),
              "€".encode(), "😀".encode(), b"\xc3", b"\xa9", b"\xe4", b"\xb8\xad", b"\x82\xac",
              b"\xf0\x9f", b"\x98\x80"]
    toks = {b"<eos>"} | {bytes([b]) for b in range(0x20, 0x7f)}
    while len(toks) < n:
        k = int(rng.integers(1, 5))
        toks.add(b"".join(pieces[int(j)] for j in rng.integers(0, len(pieces), k)))
    toks = [b"<eos>"] + sorted(toks - {b"<eos>"})
    return Vocabulary.from_token_bytes(toks, eos_id=0)


TOY = [
    r"(\w{1,3} ){1,3}",                 # the word counter, Unicode \w
    r'"[^"\\]{0,5}"',                   # a JSON-like string with a length bound
    r"(é|中|€|a)+-?",
    r"[^a-z]{2,4}",                     # a negated class: every multi-byte character
    r"(?s:.){1,4}z",
    r"\w+( \w+)*",                      # unbounded runs (self-loops)
    # key tries over a string body: walks enter the body's run below the first byte
    r'\{"(kind|name)":"[^"]{0,6}"\}|\{"[^"]{1,8}":1\}',
    r"(zz|za1|\w{0,4})-",
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("pattern", TOY)
def test_fragment_lifting_equals_brute_force(pattern, seed):
    vocab = toy_vocab(seed)
    dfa = dfa_of(pattern)
    ref, reach = brute_force(dfa, vocab)
    for kw in ({}, {"min_fragment_members": 1},
               {"min_run_bytes": 1, "min_run_tokens": 1, "min_fragment_members": 1},
               {"min_run_bytes": 1, "min_run_tokens": 1, "min_fragment_members": 1,
                "max_pairs": 5}):
        lifted = lift_transitions(dfa, vocab, **kw)
        got = triples(lifted, vocab.vocab_size)
        assert set(lifted.states.tolist()) == reach, kw
        assert got.shape == ref.shape and np.array_equal(got, ref), kw     # each once


@pytest.mark.parametrize("pattern", [r"(\w{1,3} ){1,2}", r'"[^"\\]{0,6}"', r"[^a-z]{1,3}",
                                     r'\{"(kind|name|type)":"[^"]{0,6}"\}|\{"[^"]{1,8}":1\}'])
def test_fragment_lifting_equals_plain_walk_smol(smol_vocab, pattern):
    dfa = dfa_of(pattern)
    # the run really has multi-byte characters and the fragment path is taken
    Q = dfa.num_states
    table = np.full((Q + 1, 256), Q, np.int32)
    table[:Q] = dfa.trans[:, dfa.byte_class]
    table[table < 0] = Q
    byte_rep = np.unique(dfa.byte_class, return_index=True)[1]
    assert any(_fragment_of(dfa, table, Q, s, int(m[0]), byte_rep) is not None
               for s, m in _run_groups(dfa, 8))
    plain = lift_transitions(dfa, smol_vocab, min_run_bytes=257)
    fast = lift_transitions(dfa, smol_vocab, min_fragment_members=1)
    assert len(plain.bulk_src) == 0 and len(fast.bulk_src) > 0
    assert len(fast.src) < len(plain.src) // 3
    assert np.array_equal(plain.states, fast.states)
    a, b = triples(plain, smol_vocab.vocab_size), triples(fast, smol_vocab.vocab_size)
    assert a.shape == b.shape and np.array_equal(a, b)


def _utf8_all():
    """UTF-8 encodings of every code point except surrogates: bytes [n, 4], lengths."""
    cp = np.arange(0x110000)
    cp = cp[(cp < 0xD800) | (cp > 0xDFFF)]
    n = 1 + (cp > 0x7F) + (cp > 0x7FF) + (cp > 0xFFFF)
    b = np.zeros((len(cp), 4), np.int64)
    for i, (mark, shift) in enumerate(((0, 0), (0xC0, 6), (0xE0, 12), (0xF0, 18))):
        sel = n == i + 1
        b[sel, 0] = mark + (cp[sel] >> shift) if i else cp[sel]
        for j in range(1, i + 1):
            b[sel, j] = 0x80 | ((cp[sel] >> (shift - 6 * j)) & 0x3F)
    return cp, b, n


def _accepted_code_points(dfa: DFA) -> np.ndarray:
    """Code points (no surrogates) whose UTF-8 encoding ``dfa`` accepts (vectorised run)."""
    cp, b, n = _utf8_all()
    table = np.vstack([dfa.byte_table(), np.full((1, 256), -1)])
    q = np.zeros(len(cp), np.int64)
    for j in range(4):
        step = table[q, b[:, j]]
        q = np.where(j < n, step, q)
    ok = (q >= 0) & np.append(dfa.accepting, False)[q]
    return cp[ok]


@functools.lru_cache(maxsize=1)
def _word_code_points() -> np.ndarray:
    import re
    return np.array([re.match(r"\w", chr(c)) is not None for c in range(0x110000)])


@pytest.mark.parametrize("name", ["word", "not_word", "edges"])
def test_direct_class_dfa_equals_subset_construction(name):
    r"""The bottom-up class DFA accepts exactly the class's code points (Python's ``re``
    decides ``\w``), is minimal like the subset construction, and accepts no invalid
    UTF-8."""
    from jaxcd.automata.fsa import _class_nfa
    if name == "edges":
        ranges = _normalized(((0x7F, 0x80), (0x7FF, 0x800), (0xD7FF, 0xE000), (0xFFFF, 0x10000),
                              (0x10FFFF, 0x10FFFF), (0x1F600, 0x1F64F)))
        want = np.zeros(0x110000, bool)
        for lo, hi in ranges:
            want[lo:hi + 1] = True
    else:
        want = _word_code_points().copy()
        if name == "not_word":
            want = ~want
        d = np.diff(np.concatenate([[0], want.astype(np.int8), [0]]))
        ranges = _normalized(tuple(zip(np.nonzero(d == 1)[0].tolist(),
                                       (np.nonzero(d == -1)[0] - 1).tolist())))
    want[0xD800:0xE000] = False
    direct = minimize(_class_dfa_direct(ranges))
    assert np.array_equal(_accepted_code_points(direct), np.nonzero(want)[0])
    ref = minimize(determinize(_class_nfa(ranges)))
    assert direct.num_states == ref.num_states            # both minimal
    assert np.array_equal(_accepted_code_points(ref), np.nonzero(want)[0])
    for bad in (b"\xc0\x80", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf0\x80\x80\x80",
                b"\xf4\x90\x80\x80", b"", b"ab", b"\xc3"):
        assert not direct.accepts(bad)
    assert _class_fragment(ranges)[1] == ref.num_states
