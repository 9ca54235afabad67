"""Enforce what users write: integral numbers where the specification takes an integer
(``minContains: 2.0``), ``multipleOf`` combined under ``allOf`` (the least common
multiple), ``$id`` base-URI resolution, Unicode property classes in patterns, and
``uniqueItems`` beside ``prefixItems``; each against the jsonschema library."""

import itertools
import json
from decimal import Decimal

import jsonschema
import pytest

from jaxcd.automata import determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa
from jaxcd.errors import UnsupportedSchemaError


def _dfa(schema, **kw):
    return minimize(determinize(schema_to_nfa(schema, "", property_order="auto", **kw)[0]))


def _text(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _agree(schema, universe, skip=lambda v: False):
    d = _dfa(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    n = 0
    for v in universe:
        if skip(v):
            continue
        ok = d.accepts(_text(v).encode())
        assert ok == oracle.is_valid(v), (schema, v, ok)
        n += ok
    assert n, schema
    return d


_ARRAYS = [list(t) for n in range(5) for t in itertools.product([1, 2, "a"], repeat=n)]
_SCALARS = [None, True, 0, 1, 2, "", "a", "ab", "abc", "abcd"]
_OBJECTS = [dict(zip("abc", range(n))) for n in range(4)]


@pytest.mark.parametrize("schema", [
    {"type": "array", "contains": {"const": 1}, "minContains": 2.0},
    {"type": "array", "contains": {"const": 1}, "minContains": 0.0, "maxContains": 1.0},
    {"type": "string", "minLength": 2.0, "maxLength": 3.0},
    {"type": "array", "minItems": 1.0, "maxItems": 2.0},
    {"type": "object", "minProperties": 1.0, "maxProperties": 2.0},
    {"type": "array", "items": {"enum": [1, 2, "a"]}, "uniqueItems": True, "maxItems": 2.0},
    {"allOf": [{"type": "array", "minItems": 2.0}, {"maxItems": 3}]},
], ids=json.dumps)
def test_integral_numbers_are_integers(schema):
    _agree(schema, _ARRAYS + _SCALARS + _OBJECTS)


def _numbers():
    out = [str(i) for i in range(-40, 41)]
    out += [f"{i / 4}" for i in range(-40, 41) if i % 4]
    out += [f"{i / 10:.1f}" for i in range(-60, 61) if i % 10]
    out += [f"{i / 100:.2f}" for i in range(-300, 301, 7) if i % 10]
    return out


@pytest.mark.parametrize("a, b, typ", [(2, 3, "integer"), (4, 6, "integer"), (2, 3, "number"),
                                       (0.5, 3, "number"), (0.25, 0.1, "number"),
                                       (1.5, 2, "number"), (0.3, 0.2, "number"),
                                       (2, 0.5, "integer"), (0.75, 0.5, "number"),
                                       (0.01, 0.3, "number")])
def test_multiple_of_under_all_of_is_the_lcm(a, b, typ):
    """Against jsonschema on exact decimals (schema and instances parsed as Decimal, so
    its multipleOf is exact rather than float division)."""
    schema = {"type": typ, "allOf": [{"multipleOf": a}, {"multipleOf": b}]}
    d = _dfa(schema)
    exact = json.loads(json.dumps(schema), parse_float=Decimal)
    oracle = jsonschema.Draft202012Validator(exact)
    n = 0
    for t in _numbers():
        ok = d.accepts(t.encode())
        assert ok == oracle.is_valid(json.loads(t, parse_float=Decimal)), (schema, t)
        n += ok
    assert n > 1


def test_multiple_of_lcm_past_a_float_is_refused():
    # lcm(1.2345678901234567, 0.3) needs more digits than a float holds: refused by name
    s = {"type": "number", "allOf": [{"multipleOf": 1.2345678901234567}, {"multipleOf": 0.3}]}
    with pytest.raises(UnsupportedSchemaError, match=r"'multipleOf'.*least common multiple"):
        _dfa(s)
