"""``uniqueItems`` over items whose values cannot be listed (strings, numbers, objects):
the arrays whose items come in strictly increasing order of a sort key that tells
values apart (the type; for a string, its first byte as spelled). Checked against
jsonschema on every array of up to three items from a pool of values: no invalid array
is accepted, and every valid array whose items are in that order is (where the schema
without ``uniqueItems`` takes its spelling)."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest

from jaxcd.automata import schema_builder as sb
from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa
from jaxcd.errors import UnsupportedSchemaError

POOL = ["a", "b", "ab", "ba", "", "B", "1", "é", "éa", "ü", 1, 2, 1.0, 0, -1, 2.5, True,
        False, None, {}, {"a": 1}, {"a": 2}, [], [1], [1, 1]]
ITEMS = [{"type": "string"}, True, {"type": "integer"}, {"type": "number"},
         {"type": "object"}, {"type": ["string", "integer"]},
         {"type": "string", "pattern": "^[a-z]+$"}, {"type": "string", "minLength": 1},
         {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]}]


def spell(v) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def sort_key(text: str, integers: bool):
    """The documented key: numbers (by their first digit, 0 with the negative ones,
    where the items cannot spell a fraction or exponent), then the other types by
    their first byte, then strings by the byte after the quote (one key for a
    non-ASCII one)."""
    b = text.encode()
    if text[0] in "-0123456789":
        return (0, b[0] if integers and text[0] in "123456789" else ord("-"))
    if text[0] != '"':
        return (0, b[0])
    return (2, min(b[1], 0x80))


def arrays():
    for n in range(4):
        for items in itertools.product(POOL, repeat=n):
            yield list(items)


ARRAYS = list(arrays())


def _dfa(schema):
    return minimize(determinize(schema_to_nfa(schema, whitespace_pattern="")[0]))


@pytest.mark.parametrize("items", ITEMS, ids=lambda s: json.dumps(s))
@pytest.mark.parametrize("extra", [{}, {"minItems": 2}, {"maxItems": 2},
                                   {"contains": {"type": "string"}}])
def test_sorted_unique_arrays_against_jsonschema(items, extra):
    schema = {"type": "array", "items": items, "uniqueItems": True, **extra}
    try:
        d = _dfa(schema)
    except UnsupportedSchemaError as e:
        # refused (naming the keyword) only where the subset has no array at all
        assert "'uniqueItems'" in str(e) and "minItems" in extra
        d = None
    plain = _dfa({k: v for k, v in schema.items() if k != "uniqueItems"})
    item = _dfa(items)
    integers = not any(item.accepts(t) for t in (b"1.5", b"1e5", b"1.0"))
    oracle = jsonschema.Draft202012Validator(schema)
    taken = valid = 0
    for arr in ARRAYS:
        texts = [spell(v) for v in arr]
        text = "[" + ",".join(texts) + "]"
        got, want = d is not None and d.accepts(text.encode()), oracle.is_valid(arr)
        assert want or not got, (schema, text)               # never an invalid array
        keys = [sort_key(t, integers) for t in texts]
        in_order = all(a < b for a, b in zip(keys, keys[1:]))
        escaped_start = any(t.startswith('"\\') for t in texts)
        if want and in_order and not escaped_start and plain.accepts(text.encode()):
            assert got, (schema, text)                       # the documented subset
        taken += got
        valid += want
    assert taken > 1 or d is None or not valid


@pytest.mark.parametrize("schema", [
    {"not": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    {"oneOf": [{"type": "array"}, {"type": "array", "uniqueItems": True}]},
    {"type": "array", "items": {"not": {"type": "array", "uniqueItems": True}}}])
def test_subtracted_unique_items_against_jsonschema(schema):
    """In a subtracted operand uniqueItems over any items is not narrowed (the sorted
    subset would make ``not`` accept unique arrays out of order): exact there."""
    d = _dfa(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    for arr in ARRAYS:
        text = spell(arr)
        got, want = d.accepts(text.encode()), oracle.is_valid(arr)
        assert want or not got, (schema, text)
        if len(arr) <= 1 and not schema.get("type"):
            assert got == want, (schema, text)


def test_prefix_items_with_unlisted_values_is_refused():
    schema = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "string"},
              "uniqueItems": True}
    with pytest.raises(UnsupportedSchemaError,
                       match=r"'uniqueItems'.*beside prefixItems.*at /uniqueItems"):
        schema_to_nfa(schema, "")


@pytest.mark.parametrize("items", [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array"}}},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"enum": [{"a": 1}, {"a": [1, 2]}, [1, {"b": None}], "x"]},
    {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 2}],
    ids=lambda s: json.dumps(s))
@pytest.mark.parametrize("item_cap", [None, 1], ids=["minimised", "past-item-cap"])
def test_unique_items_take_the_free_whitespace(items, item_cap, monkeypatch):
    """Items of a ``uniqueItems`` array take the free whitespace inside them (default
    ``[ ]?``) as any other value does, whether their values are listed (finite items)
    or kept apart by the sort key: each array is judged the same in its compact and its
    spaced spelling, and an array of one valid item (always in order) is taken. Past
    ``MAX_SPACED_ITEM_STATES`` an object or array item is kept as a node (one item at
    most, as under the sort key)."""
    if item_cap is not None:
        monkeypatch.setattr(sb, "MAX_SPACED_ITEM_STATES", item_cap)
    schema = {"type": "array", "items": items, "uniqueItems": True}
    d = minimize(determinize(schema_to_nfa(schema, property_order="any")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    pool = [{}, {"a": 1}, {"a": 2}, {"b": [1, 2]}, {"a": 1, "b": []}, {"b": [], "a": 1},
            {"a": [1, 2]}, [1, {"b": None}], [1], [2], [1, 2], [2, 1], [1, 1], "x", 1]
    finite = "enum" in items or "maxItems" in items
    taken = 0
    for n in range(3):
        for arr in itertools.product(pool, repeat=n):
            arr = list(arr)
            want = oracle.is_valid(arr)
            got = [d.accepts(t.encode()) for t in (spell(arr), json.dumps(arr))]
            assert want or not any(got), (schema, arr)           # never an invalid array
            assert got[0] == got[1], (schema, arr)               # whitespace is free
            if want and (finite or n <= 1):
                assert all(got), (schema, arr)
            taken += got[1]
    assert taken > 3


@pytest.mark.parametrize("items", [{"type": "string"}, {"type": "string", "minLength": 1},
                                   {"type": "integer"}, {"type": ["string", "null"]}],
                         ids=lambda s: json.dumps(s))
@pytest.mark.parametrize("ws", ["", None])
def test_two_items_in_decreasing_key_order(items, ws):
    """Two items whose keys differ are taken in either order (the second need only
    differ from the first); from three items on, the keys increase. Checked on every
    array of up to three items of the pool against jsonschema and that rule restated."""
    schema = {"type": "array", "items": items, "uniqueItems": True}
    d = minimize(determinize(schema_to_nfa(schema, ws)[0]))
    item = _dfa(items)
    integers = not any(item.accepts(t) for t in (b"1.5", b"1e5", b"1.0"))
    oracle = jsonschema.Draft202012Validator(schema)
    n_pairs = 0
    for arr in ARRAYS:
        texts = [spell(v) for v in arr]
        for sep in ([","] if ws == "" else [",", ", "]):
            text = "[" + sep.join(texts) + "]"
            got, want = d.accepts(text.encode()), oracle.is_valid(arr)
            assert want or not got, (schema, text)
            if not want or any(t.startswith('"\\') for t in texts) or \
                    not all(item.accepts(t.encode()) for t in texts):
                continue
            keys = [sort_key(t, integers) for t in texts]
            rule = all(a < b for a, b in zip(keys, keys[1:])) or (
                len(keys) == 2 and keys[0] > keys[1])
            assert got == rule, (schema, text)
            n_pairs += rule and len(keys) == 2 and keys[0] > keys[1]
    assert n_pairs > 3
