"""Fuzzing the regex compiler: hypothesis-generated regexes (classes incl. Unicode
ranges and \\d \\w \\s, counted repetitions, alternations, nesting, non-ASCII and
4-byte literals, ASCII/DOTALL flags).

For every regex: compilation under (small) limits either succeeds or raises
:class:`AutomatonTooLargeError` naming the limit; on success the byte DFA and the
token automaton (random segmentations of the text into tokens) accept exactly what
``re.fullmatch`` accepts, on members generated from the regex's structure and on
near-misses (tests/regex_samples.py). Minimisation is checked against a textbook
Moore refinement; peak memory and time of a seeded batch are measured in a child
process under an address-space limit.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcd import AutomatonTooLargeError, CompileLimits, Vocabulary, compile_regex
from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.regex import regex_to_nfa
from jaxcd.limits import use_limits

from regex_samples import (OracleTimeout, Sampler, fullmatch, token_automaton_accepts,
                           tokenize_randomly)

LITERALS = list("abxz09-_ .") + ["é", "ß", "ÿ", "日", "本", "ж", "😀", "€", "\n", "\t", "+", "(",
                                  "[", "\\", "|", "{"]
CLASS_ITEMS = ["a-f", "0-9", "x", "_", "\\-", "à-ÿ", "α-ω", "一-龥", "\U0001F600-\U0001F64F",
               "\\d", "\\w", "\\s", "\\W", " ", "é", "\\]", "\u0100-\u07ff"]
SHORTHANDS = [".", r"\d", r"\w", r"\s", r"\D", r"\W", r"\S"]
FLAGS = [0, 0, re.ASCII, re.DOTALL, re.ASCII | re.DOTALL]

LIMITS = CompileLimits(max_nfa_states=20_000, max_dfa_states=4_000, max_subset_entries=400_000,
                       max_token_transitions=1_000_000, max_table_bytes=32 << 20)


def gen_regex(pick, depth: int) -> str:
    """A random regex; ``pick(kind, arg)`` chooses (hypothesis ``draw`` or ``random``)."""
    if depth == 0 or pick("int", (0, 3)) == 0:
        kind = pick("int", (0, 3))
        if kind == 0:
            return re.escape(pick("choice", LITERALS))
        if kind == 1:
            items = [pick("choice", CLASS_ITEMS) for _ in range(pick("int", (1, 3)))]
            return "[" + ("^" if pick("int", (0, 3)) == 0 else "") + "".join(items) + "]"
        if kind == 2:
            return pick("choice", SHORTHANDS)
        return "".join(re.escape(pick("choice", LITERALS)) for _ in range(pick("int", (2, 4))))
    kind = pick("int", (0, 3))
    if kind == 0:                                              # concatenation
        return "".join(gen_regex(pick, depth - 1) for _ in range(pick("int", (2, 3))))
    if kind == 1:                                              # alternation
        alts = "|".join(gen_regex(pick, depth - 1) for _ in range(pick("int", (2, 3))))
        return ("(" if pick("int", (0, 1)) else "(?:") + alts + ")"
    sub = gen_regex(pick, depth - 1)
    lo = pick("int", (0, 4))
    op = pick("choice", ["*", "+", "?", "{m}", "{m,n}", "{m,}", "{big}"])
    if op == "{m}":
        q = f"{{{lo}}}"
    elif op == "{m,n}":
        q = f"{{{lo},{lo + pick('int', (0, 5))}}}"
    elif op == "{m,}":
        q = f"{{{lo},}}"
    elif op == "{big}":                                        # a long counter
        q = f"{{{pick('int', (5, 40))}}}" if depth == 1 else "{2,3}"
    else:
        q = op
    lazy = "?" if pick("int", (0, 4)) == 0 else ""
    return f"(?:{sub}){q}{lazy}"


@st.composite
def regexes(draw, depth=3):
    def pick(kind, arg):
        if kind == "int":
            return draw(st.integers(*arg))
        return draw(st.sampled_from(arg))
    return gen_regex(pick, depth), draw(st.sampled_from(FLAGS))


def seeded_regexes(n: int, seed: int, depth: int = 3) -> list[tuple[str, int]]:
    rng = random.Random(seed)

    def pick(kind, arg):
        return rng.randint(*arg) if kind == "int" else rng.choice(arg)
    return [(gen_regex(pick, depth), rng.choice(FLAGS)) for _ in range(n)]


def synthetic_vocab() -> Vocabulary:
    """All 256 single bytes, pieces of text (ASCII, Latin-1, CJK, emoji, partial
    UTF-8 sequences, space-prefixed words) and EOS."""
    pieces = [bytes([b]) for b in range(256)]
    words = ["ab", "abc", "xz", "09", "00", "a-", "-_", " a", " ab", " x", "é", "ée", "aé", "日本",
             "本", "ж", "жж", "😀", "€", "\n\n", " \t", "ff", "ba", "0a", "[\\", "ÿ", "ß ", "αβ",
             "一二", "aaaa", "____", "    ", "..", "a.b", "(+", "|{"]
    pieces += [w.encode() for w in words]
    pieces += [b"\xe6\x97", b"\xf0\x9f", b"\xf0\x9f\x98", b"\xc3", b"\xa9a", b"\x80\x80"]
    seen, toks = set(), []
    for p in pieces:
        if p not in seen:
            seen.add(p)
            toks.append(p)
    return Vocabulary.from_token_bytes(toks + [b"<eos>"], eos_id=len(toks), name="fuzz")


VOCAB = synthetic_vocab()


def check_language(pattern: str, flags: int, vocab, fa, dfa, n: int, seed: int) -> int:
    """Compare on ``n`` members and ``n`` near-misses; returns how many were decided (the
    oracle gives up on a pattern after one sample backtracks for over 0.25 s)."""
    sampler = Sampler(pattern, flags, seed=seed)
    rng = random.Random(seed)
    decided = 0
    for s in sampler.samples(n, n):
        try:
            want = fullmatch(pattern, s, flags)
        except OracleTimeout:
            return decided
        decided += 1
        data = s.encode("utf-8")
        assert dfa.accepts(data) == want, (pattern, flags, s)
        toks = tokenize_randomly(data, vocab, rng)
        assert token_automaton_accepts(fa, toks) == want, (pattern, flags, s, toks)
    return decided


@settings(max_examples=70, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(case=regexes())
def test_fuzz_regex_language_small_vocab(case):
    pattern, flags = case
    try:
        fa = compile_regex(pattern, VOCAB, flags=flags, limits=LIMITS)
    except AutomatonTooLargeError as e:
        assert e.limit in {f for f in LIMITS.__dataclass_fields__}, e
        assert e.limit in str(e) and e.needed > e.value
        return
    with use_limits(LIMITS):
        dfa = minimize(determinize(regex_to_nfa(pattern, flags)))
    check_language(pattern, flags, VOCAB, fa, dfa, n=12, seed=len(pattern))


def moore_reference(dfa) -> int:
    """Number of states of the minimal trim DFA: textbook Moore refinement (all states
    every round) on the reachable and co-reachable part, in plain Python."""
    Q = dfa.num_states
    if Q == 0:
        return 0
    table = dfa.byte_table().tolist()
    reach, todo = {0}, [0]
    while todo:
        q = todo.pop()
        for t in table[q]:
            if t >= 0 and t not in reach:
                reach.add(t)
                todo.append(t)
    rev: dict[int, set[int]] = {}
    for q in range(Q):
        for t in table[q]:
            if t >= 0:
                rev.setdefault(t, set()).add(q)
    live = {q for q in range(Q) if dfa.accepting[q]}
    todo = list(live)
    while todo:
        q = todo.pop()
        for p in rev.get(q, ()):
            if p not in live:
                live.add(p)
                todo.append(p)
    states = sorted(reach & live)
    if 0 not in live:
        return 0
    block = {q: int(dfa.accepting[q]) for q in states}
    n_blocks = len(set(block.values()))
    while True:
        sig = {q: (block[q],) + tuple(block.get(t, -1) for t in table[q]) for q in states}
        ids: dict = {}
        new = {q: ids.setdefault(sig[q], len(ids)) for q in states}
        if len(ids) == n_blocks:
            return n_blocks
        block, n_blocks = new, len(ids)


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(case=regexes(depth=3))
def test_fuzz_minimize_is_minimal(case):
    pattern, flags = case
    try:
        with use_limits(LIMITS):
            d = determinize(regex_to_nfa(pattern, flags))
    except AutomatonTooLargeError:
        return
    if d.num_states > 600:
        return                                            # keep the Python reference fast
    m = minimize(d)
    assert m.num_states == moore_reference(d), pattern
    assert minimize(m).num_states == m.num_states         # idempotent


@pytest.mark.parametrize("pattern,flags", seeded_regexes(4, seed=11, depth=2) + [
    (r"[^\W\d_]{2,5}(?:-[\w€]{1,3})?", 0), (r"(?:日本|ж+)\s?\d{1,3}😀?", 0)])
def test_fuzz_regex_language_real_vocab(smol_vocab, pattern, flags):
    try:
        fa = compile_regex(pattern, smol_vocab, flags=flags, limits=LIMITS)
    except AutomatonTooLargeError as e:
        assert e.limit in str(e)
        return
    dfa = minimize(determinize(regex_to_nfa(pattern, flags)))
    assert check_language(pattern, flags, smol_vocab, fa, dfa, n=40, seed=3) >= 20


_CHILD = textwrap.dedent("""
    import json, re, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (4_000_000_000, 4_000_000_000))
    sys.path.insert(0, sys.argv[2])
    from test_regex_fuzz import LIMITS, VOCAB
    from jaxcd import AutomatonTooLargeError, compile_regex

    def status(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024

    def reset_peak():
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    compile_regex("ab", VOCAB)
    out = []
    for pattern, flags in json.loads(sys.argv[1]):
        exact = reset_peak()
        before = status("VmRSS")
        t0 = time.perf_counter()
        try:
            compile_regex(pattern, VOCAB, flags=flags, limits=LIMITS)
            res = "ok"
        except AutomatonTooLargeError as e:
            res = e.limit
        peak = status("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out.append([pattern, res, time.perf_counter() - t0, peak - before])
    print(json.dumps(out))
""")


def test_fuzz_batch_time_and_memory_bounded():
    """A seeded batch of deeper regexes (depth 4: counters of counters), each compiled
    in a child under a 4 GB address-space limit: every one compiles or raises the
    limit error, each within 10 s and 300 MB of peak-RSS growth (the limits above bound
    the DFA to 4,000 states and the tables to 32 MB; measured: < 2 s, < 60 MB)."""
    import os
    cases = seeded_regexes(20, seed=2026, depth=4)
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases),
                           os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(rows) == len(cases)
    for pattern, res, seconds, extra_mb in rows:
        assert res == "ok" or res in LIMITS.__dataclass_fields__, (pattern, res)
        assert seconds < 10.0, (pattern, seconds)
        assert extra_mb < 300, (pattern, extra_mb)
    assert sum(r[1] == "ok" for r in rows) >= len(rows) // 2    # most of them compile
