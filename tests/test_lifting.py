"""Token lifting (DESIGN.md §2) equals a brute-force reference.

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

from jaxcd import Vocabulary
from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.json_schema import schema_to_regex
from jaxcd.automata.regex import regex_to_nfa
from jaxcd.tensorize import lift_transitions

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
