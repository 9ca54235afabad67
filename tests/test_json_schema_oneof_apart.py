"""``oneOf`` branches told apart by their keywords, and the subset kept past the product
limits (``SchemaBuilder._objects_apart``, ``SchemaBuilder._one_of_witnessed``). Brute
force against jsonschema on the universe of test_json_schema_products: never an invalid
instance; where the branches are apart, exactly the valid ones (as without the shortcut);
past the limits, every valid object that shows its branch by a property."""

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcd.automata import determinize, minimize
from jaxcd.automata.schema_builder import SchemaBuilder, to_nfa
from jaxcd.errors import AutomatonTooLargeError, JaxcdError

from test_json_schema import _combinator_schema, assert_sound
from test_json_schema_products import UNIVERSE, _texts


def _build(schema, **kw):
    b = SchemaBuilder(schema, whitespace="", property_order="schema", **kw)
    node = b.build()
    return b, minimize(determinize(to_nfa(node, "")))


def _check(schema, d, exact):
    oracle = jsonschema.Draft202012Validator(schema)
    taken = 0
    for v in UNIVERSE:
        ok = d.accepts(_texts(v).encode())
        want = oracle.is_valid(v)
        assert want or not ok, (schema, v)                   # never an invalid instance
        if exact and want and (not isinstance(v, dict) or len(v) < 2):
            assert ok, (schema, v)
        taken += ok
    return taken


_OBJ = {"type": "object"}
APART = [
    # a required discriminator with different consts / types / enums
    {"oneOf": [{**_OBJ, "required": ["k"], "properties": {"k": {"const": "x"}}},
               {**_OBJ, "required": ["k"], "properties": {"k": {"const": "y"}, "a": {}}}]},
    {"oneOf": [{**_OBJ, "required": ["k"], "properties": {"k": {"type": "string"}}},
               {**_OBJ, "required": ["a"], "properties": {"k": {"type": "integer"}}}]},
    {"oneOf": [{**_OBJ, "required": ["k"], "properties": {"k": {"enum": ["x", 1]}}},
               {**_OBJ, "properties": {"k": {"enum": ["y", None]}}},
               {**_OBJ, "required": ["k"], "properties": {"k": {"type": "boolean"}}}]},
    # the other branch forbids the required property
    {"oneOf": [{**_OBJ, "required": ["a"]}, {**_OBJ, "properties": {"a": False}}]},
]
NOT_APART = [
    # the same value spelled two ways, or sharing a value: a product is needed
    {"oneOf": [{**_OBJ, "required": ["k"], "properties": {"k": {"const": 1}}},
               {**_OBJ, "required": ["k"], "properties": {"k": {"const": 1.0}}}]},
    {"oneOf": [{**_OBJ, "required": ["k"], "properties": {"k": {"enum": ["x", "y"]}}},
               {**_OBJ, "required": ["k"], "properties": {"k": {"enum": ["y"]}}}]},
    # not objects only: a scalar satisfies both branches
    {"oneOf": [{"required": ["k"], "properties": {"k": {"const": "x"}}},
               {"properties": {"k": {"const": "y"}}}]},
    # the discriminator is not required: {} is in both
    {"oneOf": [{**_OBJ, "properties": {"k": {"const": "x"}}},
               {**_OBJ, "properties": {"k": {"const": "y"}}}]},
]


def _count_products(monkeypatch, name="_exactly_one_product") -> list:
    calls = []
    real = getattr(SchemaBuilder, name)

    def counted(self, *a, **kw):
        calls.append(1)
        return real(self, *a, **kw)
    monkeypatch.setattr(SchemaBuilder, name, counted)
    return calls


@pytest.mark.parametrize("schema", APART, ids=lambda s: json.dumps(s)[:60])
def test_branches_apart_need_no_product(schema, monkeypatch):
    calls = _count_products(monkeypatch)
    _, d = _build(schema)
    assert not calls
    assert _check(schema, d, exact=True) > 0


@pytest.mark.parametrize("schema", NOT_APART, ids=lambda s: json.dumps(s)[:60])
def test_branches_not_apart_take_the_product(schema, monkeypatch):
    calls = _count_products(monkeypatch)
    _, d = _build(schema)
    assert calls
    _check(schema, d, exact=True)


WITNESSED = [
    # overlapping required keys: the other branch's key absent
    ({"oneOf": [{**_OBJ, "required": ["a"], "properties": {"a": {"type": "integer"}}},
                {**_OBJ, "required": ["b"], "properties": {"k": {"type": "string"}}}]},
     [{"a": 1}, {"b": "x"}, {"a": 1, "k": None}]),
    # a value the other branch refuses is not used as a witness: the key is left out
    ({"oneOf": [{**_OBJ, "required": ["a"], "properties": {"b": {"type": "string"}}},
                {**_OBJ, "required": ["b"]}]},
     [{"a": 1}, {"b": 1}]),
    # no required keys: a property the other gives a const, present with another value
    ({"type": "object", "oneOf": [{"properties": {"k": {"const": "x"}}},
                                  {"properties": {"k": {"const": "y"}}},
                                  {"properties": {"k": {"enum": ["x", "y", 1]}}}]},
     []),
    ({"type": "object", "oneOf": [{"properties": {"k": {"const": "x"}}},
                                  {"properties": {"k": {"const": "y"}}}]},
     [{"k": "x"}, {"k": "y"}]),
    # a branch with no witness against another is left out
    ({"oneOf": [{**_OBJ, "required": ["a"], "properties": {"b": {"type": "string"}}},
                {**_OBJ, "properties": {"a": {"type": "integer"}}}]},
     [{}, {"b": 1}]),
]


@pytest.mark.parametrize("schema, kept", WITNESSED, ids=lambda s: json.dumps(s)[:60])
def test_past_the_product_limit_a_witnessed_subset(schema, kept, monkeypatch):
    calls = _count_products(monkeypatch, "_one_of_witnessed")
    b, d = _build(schema, max_product_work=1)
    assert calls
    _check(schema, d, exact=False)
    for v in kept:
        assert d.accepts(_texts(v).encode()), (schema, v)


def test_past_the_product_limit_other_values_are_refused():
    schema = {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 1}]}
    with pytest.raises(AutomatonTooLargeError, match="max_product_work"):
        _build(schema, max_product_work=1)


def test_past_the_product_limit_values_other_than_objects_are_left_out(monkeypatch):
    calls = _count_products(monkeypatch, "_one_of_witnessed")
    # no type: every non-object is in both branches (refused by oneOf anyway)
    schema = {"oneOf": [{"required": ["a"]},
                        {"required": ["b"], "properties": {"a": {"type": "string"}}}]}
    _, d = _build(schema, max_product_work=1)
    assert calls
    assert _check(schema, d, exact=False) > 0
    assert d.accepts(b'{"a":1}') and d.accepts(b'{"b":1}')
    # a string-or-object branch loses its strings
    schema = {"oneOf": [{"type": ["string", "object"], "required": ["a"]},
                        {"type": "object", "required": ["b"]}]}
    _, d = _build(schema, max_product_work=1)
    assert len(calls) == 2
    _check(schema, d, exact=False)
    assert d.accepts(b'{"a":1}') and not d.accepts(b'"x"')


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(st.lists(_combinator_schema(), min_size=2, max_size=3))
def test_fuzz_one_of_past_the_product_limit(branches):
    """Random oneOf branches (objects, arrays, products, presence tests) built with no
    product work to spare: the witnessed subset (or a size error), never an invalid
    instance: sampled strings and the universe, against jsonschema."""
    schema = {"oneOf": branches}
    try:
        _, d = _build(schema, max_product_work=1)
    except JaxcdError as e:
        assert str(e)
        return
    assert_sound(schema, d)


@pytest.mark.parametrize("schema", [
    # the inner oneOf keeps no branch past the limit (its objects show nothing), yet
    # 0 is valid for it: the outer oneOf must still subtract it from its number branch
    {"oneOf": [{"type": "number", "minimum": 0, "maximum": 2},
               {"oneOf": [{"type": "null"},
                          {"oneOf": [{"type": "null"}, {"type": "integer", "multipleOf": 3},
                                     {"type": "object", "maxProperties": 1}]}]}]},
])
def test_narrowed_branch_is_still_subtracted(schema):
    _, d = _build(schema, max_product_work=1)
    _check(schema, d, exact=False)


def test_enum_values_checked_past_the_product_limit():
    # the other keywords filter an enum's values through their automaton; past a product
    # limit the values are run through its NFA (they used to be kept unchecked)
    schema = {"allOf": [{"type": "number", "minimum": 0.25, "maximum": 0.25},
                        {"enum": [0, 0.25, "x"]}]}
    _, d = _build(schema, max_product_work=1)
    assert d.accepts(b"0.25") and not d.accepts(b"0") and not d.accepts(b'"x"')


@pytest.mark.parametrize("schema", [
    # `not` subtracts a superset of hostnames (every string): its positive side has no
    # string left, yet "08:39:36Z" (not a hostname) satisfies it, so under oneOf the
    # time branch must lose it
    {"oneOf": [{"type": "string", "format": "time"},
               {"not": {"type": "string", "format": "hostname"}}]},
    {"oneOf": [{"type": "string", "format": "time"},
               {"if": {"type": "string"}, "then": {"not": {"format": "hostname"}},
                "else": False}]},
])
def test_branch_narrowed_by_a_difference_is_still_subtracted(schema):
    _, d = _build(schema)
    assert not d.accepts(b'"08:39:36Z"')
    oracle = jsonschema.Draft202012Validator(schema,
                                             format_checker=jsonschema.FormatChecker())
    for t in ['"08:39:36Z"', '"a"', "1", "null"]:
        if d.accepts(t.encode()):
            assert oracle.is_valid(json.loads(t)), t


def test_values_compared_as_json_schema_does():
    from jaxcd.automata.schema_builder import _values_apart, _values_outside
    assert not _values_apart({"const": 1}, {"const": 1.0})           # 1 equals 1.0
    assert _values_apart({"const": 1}, {"const": True})               # true is not 1
    assert not _values_apart({"enum": [{"a": 1, "b": 2}]}, {"enum": [{"b": 2, "a": 1.0}]})
    assert _values_apart({"type": "integer"}, {"type": ["string", "null"]})
    assert not _values_apart({"type": "integer"}, {"type": "number"})
    assert not _values_apart({"const": 2}, {"type": "integer"})
    assert _values_apart({"const": "x"}, {"type": "integer"})
    assert _values_apart(True, False) and not _values_apart(True, {"const": 1})
    assert _values_outside({"enum": [1, 2, 3.5]}, {"enum": [1.0, 3.5]}) == {"enum": [2]}
    assert _values_outside(None, {"const": 1}) == {"not": {"const": 1}}
