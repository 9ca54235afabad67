"""The compiler is bounded: everyday regexes that used to exhaust memory compile fast
and small, and a constraint over a limit fails early with a clear error.

Time and memory are measured in a child process (real SmolLM2 vocabulary, loaded and
warmed up first): wall time of ``compile_regex`` and the growth of the peak resident
set (``VmHWM`` reset through ``/proc/self/clear_refs`` before each compile, minus the
resident set before it). The child runs under a 6 GB address-space limit, so a
regression fails the test instead of taking the machine down. Languages are checked
against ``re.fullmatch`` on members and near-misses (tests/regex_samples.py).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxcd import AutomatonTooLargeError, CompileLimits, compile_regex
from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.regex import regex_to_nfa
from jaxcd.limits import use_limits

from regex_samples import Sampler, token_automaton_accepts, tokenize_randomly

# The regexes of issue 10 (before the fix: the UUID one was killed at 24 GiB, the
# others raised MemoryError asking 0.5-11.5 GiB). The word repetition once with ASCII
# \w (re.ASCII) and once with Unicode \w: ~310 byte-DFA states per character
# position, 29,673 states, 1.1 million token transitions (see docs/limits.md).
WORDS = r"(\w{1,12} ){3,8}"
BOUNDED = [
    ("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", 0),
    ("[0-9a-f]{32}", 0),
    ("[A-Za-z0-9+/]{16,64}", 0),
    (WORDS, re.ASCII),
    (WORDS, 0),
]
# (seconds, MB of peak-RSS growth). Measured on a loaded 2-core machine: < 0.1 s and
# < 10 MB for the first three; the word repetition ~0.5 s (2.6 million (state, token)
# transitions, most of them space-prefixed word tokens lifted in bulk).
# Unicode words: 2.3 CPU seconds and 115 MB measured (a 2-core machine at load ~14: wall
# 14 s); 600 MB of mask tables before the rows were deduplicated. The time bound is
# the issue's goal missed (docs/limits.md), the memory bound is the issue's.
BOUNDS: dict = {(WORDS, 0): (60.0, 200)}
DEFAULT_BOUND = (1.0, 200)

_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (6_000_000_000, 6_000_000_000))
    from jaxcd import Vocabulary, compile_regex
    from jaxcd.tokenizer import load_tokenizer

    def status(field):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024          # MB

    def reset_peak():
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    vocab = Vocabulary.from_tokenizer(load_tokenizer())
    compile_regex("[ab]{2}", vocab)                      # warm-up: trie, imports
    out = []
    for pattern, flags in json.loads(sys.argv[1]):
        exact = reset_peak()
        before = status("VmRSS")
        t0 = time.perf_counter()
        fa = compile_regex(pattern, vocab, flags=flags)
        dt = time.perf_counter() - t0
        peak = status("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out.append({"pattern": pattern, "flags": flags, "seconds": dt, "extra_mb": peak - before,
                    "states": fa.num_states, "exact_peak": exact})
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def measured():
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(BOUNDED)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {(r["pattern"], r["flags"]): r for r in json.loads(proc.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("pattern,flags", BOUNDED)
def test_issue_regexes_compile_fast_and_small(measured, pattern, flags):
    r = measured[(pattern, flags)]
    max_seconds, max_mb = BOUNDS.get((pattern, flags), DEFAULT_BOUND)
    assert r["seconds"] < max_seconds, r
    assert r["extra_mb"] < max_mb, r


@pytest.mark.parametrize("pattern,flags", BOUNDED)
def test_issue_regexes_language(smol_vocab, pattern, flags):
    """Byte DFA and token automaton (random segmentations into real tokens) agree with
    ``re.fullmatch`` on members and near-misses."""
    dfa = minimize(determinize(regex_to_nfa(pattern, flags)))
    fa = compile_regex(pattern, smol_vocab, flags=flags)
    sampler = Sampler(pattern, flags, seed=7)
    rng = random.Random(7)
    n_in = 0
    for s in sampler.samples(150, 150):
        want = re.fullmatch(pattern, s, flags) is not None
        n_in += want
        data = s.encode("utf-8")
        assert dfa.accepts(data) == want, (pattern, s)
        toks = tokenize_randomly(data, smol_vocab, rng)
        assert token_automaton_accepts(fa, toks) == want, (pattern, s, toks)
    assert 150 <= n_in < 300          # the members are members, some near-misses are not


def test_minimal_state_counts():
    """Known minimal DFA sizes (no dead state): a chain of 32 hex digits has 33 states;
    the UUID 37 (32 digits + 4 dashes + start)."""
    assert minimize(determinize(regex_to_nfa("[0-9a-f]{32}"))).num_states == 33
    uuid = BOUNDED[0][0]
    assert minimize(determinize(regex_to_nfa(uuid))).num_states == 37


_RNG = random.Random(10)


@pytest.mark.parametrize("limit,value,pattern", [
    ("max_nfa_states", 500, "(?:x[0-9a-f]{40}){20}"),          # 1,621 NFA states
    ("max_dfa_states", 500, "(a|b)*a(a|b){9}"),                 # 2^10 DFA states
    ("max_pattern_length", 100, "abc" * 50),
    ("max_subset_entries", 2000, "(a|b)*a(a|b){9}"),
    # a 300-character literal: ~390 distinct mask rows x 6 kB (a counter like
    # [0-9a-f]{300} repeats its rows, which are stored once: ~0.2 MB)
    ("max_table_bytes", 1 << 20, "".join(_RNG.choice("abcdefghijklmnopqrstuvwxyz ")
                                         for _ in range(300))),
    ("max_token_transitions", 300, "[a-z]{1,5}( [a-z]{1,5}){0,20}"),   # ~600
])
def test_limit_exceeded_raises_then_raising_it_compiles(smol_vocab, limit, value, pattern):
    small = CompileLimits(**{limit: value})
    with pytest.raises(AutomatonTooLargeError, match=limit) as e:
        compile_regex(pattern, smol_vocab, limits=small)
    err = e.value
    assert err.limit == limit and err.value == value and err.needed > value
    assert isinstance(err, ValueError)
    assert "regex" in str(err)                   # names the constraint part
    fa = compile_regex(pattern, smol_vocab, limits=CompileLimits())
    assert fa.num_states > 2
    # the limits were only in force inside the call
    fa2 = compile_regex(pattern, smol_vocab)
    assert fa2.num_states == fa.num_states


def test_error_names_the_responsible_sub_pattern():
    with use_limits(CompileLimits(max_nfa_states=1000)):
        with pytest.raises(AutomatonTooLargeError) as e:
            regex_to_nfa(r"id-(?:ab|(?:c{100}){20})\d")
    msg = str(e.value)
    assert "max_nfa_states=1,000" in msg and "'(?:c{100}){20}' (2,021 NFA states)" in msg
    assert "needs 2,052 NFA states" in msg
    # the whole pattern when no single part is too large
    with use_limits(CompileLimits(max_nfa_states=100)):
        with pytest.raises(AutomatonTooLargeError, match=re.escape("regex 'a{60}b{60}'")):
            regex_to_nfa("a{60}b{60}")


def test_huge_counted_repetition_fails_before_building():
    """(x{1000}){1000}){1000}: 10^9 states; refused from the parse tree at once."""
    import time
    t0 = time.perf_counter()
    with pytest.raises(AutomatonTooLargeError, match="max_nfa_states"):
        regex_to_nfa("(?:(?:x{1000}){1000}){1000}")
    assert time.perf_counter() - t0 < 1.0


def test_limits_validation():
    with pytest.raises(ValueError, match="max_dfa_states"):
        CompileLimits(max_dfa_states=0)
    with pytest.raises(TypeError):
        compile_regex("a", None, limits={"max_dfa_states": 5})


def test_second_level_run_shortcut_equals_brute_force(monkeypatch):
    """Tokens ``" " + word`` from an in-word state into the next word, and tokens whose
    first byte leads a state outside a run (or in another run) into a run, are lifted in
    bulk (lifting._into_run); the transitions equal a brute-force lift on toy
    vocabularies, and the bulk path is really taken."""
    import jaxcd.automata.lifting as T
    from test_lifting import dfa_of, lifted_set, reference_set, toy_vocab
    used = []
    real = T._into_run

    def spy(*a, **k):
        r = real(*a, **k)
        used.append(r is not None and len(r[3]) > 0)
        return r
    monkeypatch.setattr(T, "_into_run", spy)
    for pattern in [r"(?:[abc]{1,4} ){1,4}", r"(\w{1,3} ){2,3}\d?", r"( [a-c12]+)+,",
                    r'\[(?:"a[a-z ]*"|"b[0-9a-z]*")(?:,"c[a-z]*")?\]',
                    r"(?:x[a-z]+|y[0-9a-c]+|z)+", r"[0-9]{2}(?:a[a-z ]*|b[a-c 1]*)"]:
        for seed in (0, 1, 2):
            vocab = toy_vocab(seed, n=120)
            dfa = dfa_of(pattern, re.ASCII)
            ref, ref_states = reference_set(dfa, vocab)
            for kw in ({"min_run_bytes": 1, "min_run_tokens": 1},
                       {"min_run_bytes": 1, "min_run_tokens": 1, "max_pairs": 3}):
                got, states = lifted_set(dfa, vocab, **kw)
                assert states == ref_states and got == ref, (pattern, seed, kw)
    assert any(used)


def test_limits_reach_every_compile_function(smol_vocab):
    """``limits=`` is in force in every front-end; the error names the constraint."""
    from jaxcd import (compile_automaton, compile_json_schema, compile_keywords,
                       compile_tool_call)
    small = CompileLimits(max_dfa_states=5)
    tool = {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"]}}
    nfa = regex_to_nfa("[0-9a-f]{8}")
    calls = {
        "JSON Schema": lambda: compile_json_schema({"type": "string", "format": "uuid"},
                                                   smol_vocab, limits=small),
        "keywords": lambda: compile_keywords(["apple", "banana"], smol_vocab, limits=small),
        "tool": lambda: compile_tool_call(tool, smol_vocab, limits=small),
        "hand-built automaton": lambda: compile_automaton(nfa, smol_vocab, limits=small),
    }
    for what, call in calls.items():
        with pytest.raises(AutomatonTooLargeError, match="max_dfa_states=5") as e:
            call()
        assert what in str(e.value), (what, str(e.value))
    # the default limits compile them all
    assert compile_json_schema({"type": "string", "format": "uuid"}, smol_vocab).num_states > 30
    assert compile_automaton(nfa, smol_vocab).num_states > 8


BATCHED = [r"(\w{1,3} ){1,2}", r"a{0,400}", r"(ab|c){0,200}d", r"x{300}|(a|b)*a(a|b){6}",
           r"(?s:.){0,40}x", r"(é|ü|\w)+ x", r"[\u0100-\uffff]{2,5}z|q{300}"]


@pytest.mark.parametrize("pattern", BATCHED)
def test_batched_determinisation_equals_plain(pattern):
    """NFAs over 256 states are determinised level by level with NumPy; the plain
    state-by-state construction gives the same minimal DFA (same language)."""
    from jaxcd.automata import fsa
    nfa = regex_to_nfa(pattern)
    assert nfa.num_states > fsa._SMALL_NFA
    lim = CompileLimits()
    a = minimize(fsa._determinize_python(nfa, lim.max_dfa_states, lim.max_subset_entries))
    b = minimize(fsa._determinize_batched(nfa, lim.max_dfa_states, lim.max_subset_entries))
    assert np.array_equal(a.trans, b.trans) and np.array_equal(a.accepting, b.accepting)
    assert np.array_equal(a.byte_class, b.byte_class)


@pytest.mark.parametrize("limit,value", [("max_dfa_states", 500), ("max_subset_entries", 3000)])
def test_batched_determinisation_limits(limit, value):
    """The batched construction checks the same limits before adding states."""
    pattern = r"x{300}|(a|b)*a(a|b){9}"                  # > 256 NFA states, 2^10 DFA states
    with use_limits(CompileLimits(**{limit: value})):
        with pytest.raises(AutomatonTooLargeError, match=limit) as e:
            determinize(regex_to_nfa(pattern))
    assert e.value.limit == limit and e.value.needed > value
