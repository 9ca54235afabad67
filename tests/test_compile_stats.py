"""``jaxcd.compile_stats``: CPU seconds per compile stage, scoped to the ``with`` block."""

from __future__ import annotations

import time

import pytest

from ascii_vocab import VOCAB
from jaxcd import compile_json_schema, compile_regex, compile_stats
from jaxcd.automata import schema_builder as sb

SCHEMA = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"},
          "required": list("abcd"), "additionalProperties": False}


def test_stages_of_one_schema_within_its_cpu_time():
    t = time.process_time()
    with compile_stats() as st:
        compile_json_schema(SCHEMA, VOCAB)
    total = time.process_time() - t
    assert {"tree", "nfa", "determinize", "minimize", "tensorize"} <= set(st)
    assert st["attempts"] >= 1 and "failed" not in st
    secs = [v for k, v in st.items() if k != "attempts"]
    assert all(v >= 0 for v in secs)
    assert sum(secs) <= total + 1e-3              # disjoint stages of the timed compile


def test_collects_only_inside_the_block_and_sums_compiles():
    compile_regex("x[0-9]{3}", VOCAB)             # outside any block: nothing collected
    with compile_stats() as st:
        compile_regex("a[0-9]{2}", VOCAB)
        one = dict(st)
        compile_regex("b[0-9]{2}", VOCAB)
    assert set(one) == {"nfa", "determinize", "minimize", "tensorize", "attempts"}
    assert st["attempts"] == 2 and one["attempts"] == 1
    assert all(st[k] >= one[k] for k in one)
    with compile_stats() as fresh:
        pass
    assert fresh == {}


def test_order_free_attempt_past_its_cap_is_counted_as_failed(monkeypatch):
    """An order-free automaton past AUTO_DFA_CAP is given up for the schema's order: two
    whole-constraint attempts, the first one's time under "failed"."""
    import jaxcd.automata.json_schema as js
    monkeypatch.setattr(js, "AUTO_DFA_CAP", 5)
    monkeypatch.setattr(sb, "AUTO_REFUSE_TREE", 10**9)
    monkeypatch.setattr(sb, "AUTO_REFUSE_NFA", 10**9)
    with compile_stats() as st:
        compile_json_schema(SCHEMA, VOCAB, repeated_keys=False)
    assert st["attempts"] == 2
    assert 0 < st["failed"] <= st["nfa"] + st["determinize"] + st.get("minimize", 0) + \
        st["tensorize"] + 1e-3


def test_nested_blocks_are_separate():
    with compile_stats() as outer:
        with compile_stats() as inner:
            compile_regex("c[0-9]", VOCAB)
        compile_regex("d[0-9]", VOCAB)
    assert inner["attempts"] == 1 and outer["attempts"] == 1


@pytest.mark.parametrize("bad", ["(", "a{3,2}"])
def test_a_failing_compile_leaves_the_block_usable(bad):
    with compile_stats() as st:
        with pytest.raises(Exception):
            compile_regex(bad, VOCAB)
        compile_regex("e[0-9]", VOCAB)
    assert st["attempts"] >= 1
