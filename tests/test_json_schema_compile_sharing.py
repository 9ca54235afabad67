"""What a compile shares must not change a language: loose members with equal values
sharing one copy of the value, free-form values emitted as copies of their minimal DFA,
and work shared across attempts by a structural digest. Each is checked against the
plain construction (the same tree, nothing shared): equal minimal DFAs, and the product
budgets counting the plain NFA's states. A compile leaves nothing for the cyclic GC."""

import gc

import pytest

from jaxcd import CompileLimits, compile_json_schema
from jaxcd.automata import determinize, minimize
from jaxcd.automata.fsa import NFA, difference, is_empty
from jaxcd.automata import json_schema as js
from jaxcd.automata import schema_builder as sb

_STR = {"type": ["string", "null"], "maxLength": 6}
_LOOSE = {"type": "object", "additionalProperties": False, "required": ["a", "c"],
          "properties": {"a": _STR, "b": _STR, "c": _STR, "d": _STR,
                         "e": {"type": "integer"}, "f": {"type": "integer"}, "g": _STR}}
# (a value's object: the loose form, members in any order)
_LOOSE_IN = {"type": "object", "properties": {"v": _LOOSE}}
# open objects: each has extra members whose values are free-form (the same node)
_OPEN = {"type": "object", "properties": {
    "x": {"type": "object", "properties": {"p": {"type": "string"}}},
    "y": {"type": "object", "properties": {"q": {"type": "integer"}}},
    "z": {"type": "array", "items": {"type": "object", "properties": {"r": {"type": "boolean"}}}}}}


def _plain_nfa(node, ws):
    nfa = NFA()
    s = nfa.add_state()
    nfa.start = s
    nfa.accepting = {sb._NFAEmitter(nfa, ws).emit(node, s)}
    return nfa


def _same(a, b):
    return is_empty(difference(a, b)) and is_empty(difference(b, a))


@pytest.mark.parametrize("order", ["loose", "schema"])
@pytest.mark.parametrize("schema", [_LOOSE_IN, _OPEN], ids=["loose-members", "open-objects"])
def test_shared_nfa_same_language(schema, order):
    node, ws, _, _ = js._auto_tree(schema, "[ ]?", True, 2, False, order, {})
    assert not sb._has_capped(node, {})
    shared = sb.to_nfa(node, ws)
    plain = _plain_nfa(node, ws)
    d_shared, d_plain = minimize(determinize(shared)), minimize(determinize(plain))
    assert _same(d_shared, d_plain)
    assert d_shared.num_states == d_plain.num_states
    assert shared.num_states <= plain.num_states


def test_loose_members_share_values():
    node, ws, _, _ = js._auto_tree(_LOOSE_IN, "[ ]?", True, 2, False, "loose", {})
    shared, plain = sb.to_nfa(node, ws), _plain_nfa(node, ws)
    # five members with equal string values share one copy of it per join state
    assert shared.num_states < plain.num_states
    # without sharing the determinised DFA has a copy per member, merged by minimisation
    assert determinize(shared).num_states < determinize(plain).num_states


def test_free_value_copies_count_as_plain():
    """``_node_nfa`` embeds a free-form value's minimal DFA from its second emission on;
    its ``virtual_states`` are the plain NFA's state count (what the budgets spend)."""
    node, ws, _, _ = js._auto_tree(_OPEN, "[ ]?", True, 2, False, "schema", {})
    nfa = sb._node_nfa(node, ws)
    plain = _plain_nfa(node, ws)
    assert nfa.num_states < plain.num_states
    assert nfa.virtual_states == plain.num_states
    assert _same(minimize(determinize(nfa)), minimize(determinize(plain)))


def test_digest_structural():
    b1, b2 = js._builder(_LOOSE, "[ ]?", True, 2), js._builder(_LOOSE, "[ ]?", True, 2)
    n1, n2 = b1.build(), b2.build()
    assert n1 is not n2
    assert b1.digest(n1) == b2.digest(n2)
    other = dict(_LOOSE, properties=dict(_LOOSE["properties"],
                                         g={"type": ["string", "null"], "maxLength": 7}))
    b3 = js._builder(other, "[ ]?", True, 2)
    assert b3.digest(b3.build()) != b1.digest(n1)
    assert b1.digest(sb.lit("a")) != b1.digest(sb.lit("b"))
    assert b1.digest(sb.alt(sb.lit("a"), sb.lit("b"))) == b2.digest(sb.alt(sb.lit("a"),
                                                                             sb.lit("b")))


@pytest.mark.parametrize("schema,limits", [
    # schema-order objects with extra members (_obj_mix's tail)
    ({"type": "object", "required": ["a"], "properties": {
        "a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean"}},
      "patternProperties": {"^x": {"type": "integer"}}}, None),
    # a build attempt over the NFA limit (build() keeps its _TooBig)
    (_OPEN, CompileLimits(max_nfa_states=3_000)),
], ids=["obj-mix", "too-big"])
def test_compile_leaves_no_cycles(smol_vocab, schema, limits):
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            compile_json_schema(schema, smol_vocab, limits=limits)
        except Exception:       # (a refusal under a tight limit is fine here)
            pass
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()


def test_product_error_memo_leaves_no_cycle(monkeypatch):
    """``_memo_product`` keeps a product's size error for later uses: kept with its
    traceback, whose frames hold the builder, it would make a cycle."""
    from jaxcd.errors import AutomatonTooLargeError

    def too_large(self, schema, path):
        raise AutomatonTooLargeError("operand over its bound")
    monkeypatch.setattr(sb.SchemaBuilder, "_product_node", too_large)
    schema = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        b = js._builder(schema, "[ ]?", True, 2)
        for _ in range(2):                          # built, then raised from the memo
            with pytest.raises(AutomatonTooLargeError, match="operand over its bound"):
                b._memo_product(schema, "")
        del b
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()
