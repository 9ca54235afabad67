"""Scopes of applicators and annotations: ``prefixItems`` / ``items`` / ``contains``
under ``allOf`` / ``anyOf`` / ``oneOf`` / ``$ref``, and ``unevaluatedProperties`` /
``unevaluatedItems`` (which see only the annotations of their own schema, its ``allOf``
parts and ``$ref`` targets, never a parent's or a sibling's). Every schema either
compiles to an automaton whose language agrees with the jsonschema library
(Draft202012Validator) on a brute-force universe of small instances, or is refused by
name (UnsupportedSchemaError naming the keyword)."""

import itertools
import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcd.automata import determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa
from jaxcd.errors import AutomatonTooLargeError, JaxcdError, UnsupportedSchemaError

_ITEM_VALUES = [1, 3, 5, "x", None]
_KEYS = ["a", "b", "k"]


def _universe():
    out = [None, True, 0, 1, 3, 5, 1.5, "", "x"]
    for n in range(4):
        out.extend(list(t) for t in itertools.product(_ITEM_VALUES, repeat=n))
    for n in range(3):
        for ks in itertools.permutations(_KEYS, n):
            for vs in itertools.product(["x", 1], repeat=n):
                out.append(dict(zip(ks, vs)))
    for k in _KEYS:
        out.extend({k: v} for v in (None, [], [1], {"a": 1}))
    return out


UNIVERSE = _universe()


def _text(v):
    return json.dumps(v, separators=(",", ":"))


def _dfa(schema, order="auto"):
    return minimize(determinize(schema_to_nfa(schema, "", property_order=order)[0]))


def check_against_jsonschema(schema, order="auto", exact=True):
    """Compile ``schema`` and compare with jsonschema on the universe: every accepted
    instance is valid; with ``exact``, every valid instance is accepted (objects of two
    or more keys excepted under property_order="schema": their key order)."""
    d = _dfa(schema, order)
    oracle = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator)(schema)
    for v in UNIVERSE:
        ok = d.accepts(_text(v).encode())
        if ok:
            assert oracle.is_valid(v), ("invalid accepted", schema, v)
        elif exact and not (order == "schema" and isinstance(v, dict) and len(v) > 1):
            assert not oracle.is_valid(v), ("valid rejected", schema, v)
    return d


# the two invalid acceptances of issue 40, and the same class of scope leak elsewhere
ISSUE_CASES = [
    {"allOf": [{"prefixItems": [{"minimum": 3}]}], "items": {"minimum": 5}},
    {"$defs": {"A": {"unevaluatedProperties": False}},
     "properties": {"prop1": {"type": "string"}}, "$ref": "#/$defs/A"},
]

SCOPE_CASES = [
    # prefixItems / items in different parts: position by position
    {"items": {"minimum": 3}, "allOf": [{"prefixItems": [{"type": "integer"}]}]},
    {"prefixItems": [{"minimum": 3}], "allOf": [{"items": {"type": "integer"}}]},
    {"allOf": [{"prefixItems": [{"minimum": 3}, {"type": "integer"}]},
               {"prefixItems": [{"maximum": 3}], "items": {"type": "integer"}}]},
    {"allOf": [{"prefixItems": [{}]}, {"items": False}]},
    {"allOf": [{"prefixItems": [{}], "items": False}, {"prefixItems": [{}, {}]}]},
    {"$defs": {"P": {"prefixItems": [{"const": 1}]}}, "$ref": "#/$defs/P",
     "items": {"type": "integer", "minimum": 3}},
    {"anyOf": [{"prefixItems": [{"const": 1}]}, {"prefixItems": [{"const": 3}]}],
     "items": {"minimum": 3}},
    {"oneOf": [{"prefixItems": [{"const": 1}]}, {"items": {"type": "integer"}}],
     "maxItems": 2},
    # minContains / maxContains apply to their own schema's contains only
    {"allOf": [{"contains": {"const": 1}, "maxContains": 2}, {"minContains": 0}]},
    {"allOf": [{"contains": {"const": 1}}, {"maxContains": 0}]},
    {"allOf": [{"contains": {"const": 1}}, {"contains": {"const": 3}, "maxContains": 1}]},
    {"contains": {"const": 1}, "allOf": [{"prefixItems": [{"const": 3}]}]},
    # additionalItems applies beside an items array only
    {"$schema": "http://json-schema.org/draft-07/schema#",
     "allOf": [{"items": [{"const": 1}]}, {"additionalItems": False}]},
    # unevaluatedProperties: its own schema, allOf parts and $ref targets
    {"properties": {"a": {"type": "string"}}, "allOf": [{"unevaluatedProperties": False}]},
    {"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": False},
    {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
     "unevaluatedProperties": {"type": "integer"}},
    {"$defs": {"A": {"properties": {"a": {}}}}, "$ref": "#/$defs/A",
     "unevaluatedProperties": False},
    {"$defs": {"A": {"properties": {"a": {}}, "unevaluatedProperties": False}},
     "$ref": "#/$defs/A", "properties": {"b": {}}},
    {"patternProperties": {"^a": {}}, "allOf": [{"properties": {"b": {}}}],
     "unevaluatedProperties": False},
    {"allOf": [{"additionalProperties": {"type": "integer"}}],
     "unevaluatedProperties": False},
    {"properties": {"a": {}}, "unevaluatedProperties": False,
     "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"properties": {"a": {}, "b": {}}, "unevaluatedProperties": False,
     "oneOf": [{"properties": {"a": {"const": 1}}}, {"properties": {"b": {"const": 1}}}]},
    {"if": {"properties": {"a": {"const": 1}}, "unevaluatedProperties": False},
     "then": {"required": ["a"]}, "else": {"required": ["k"]}},
    {"not": {"properties": {"a": {}}, "unevaluatedProperties": False}},
    # unevaluatedItems
    {"prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
    {"allOf": [{"prefixItems": [{}, {}]}], "unevaluatedItems": {"type": "string"}},
    {"$defs": {"P": {"prefixItems": [{"const": 1}]}}, "$ref": "#/$defs/P",
     "unevaluatedItems": False},
    {"prefixItems": [{}], "allOf": [{"unevaluatedItems": False}]},
    {"contains": {"type": "string"}, "unevaluatedItems": {"type": "integer"}},
    {"allOf": [{"items": {"type": "integer"}}], "unevaluatedItems": False},
    {"anyOf": [{"maxItems": 1}, {"minItems": 3}], "prefixItems": [{}],
     "unevaluatedItems": False},
]

# annotations of the branches that succeed: one case per choice of branches
BRANCH_CASES = [
    {"oneOf": [{"properties": {"a": {"type": "integer"}}},
               {"properties": {"b": {"type": "integer"}}}],
     "unevaluatedProperties": False},
    {"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}],
     "unevaluatedProperties": False},
    {"anyOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]},
               {"properties": {"b": {}}, "required": ["b"]}, {"required": ["k"]}],
     "unevaluatedProperties": {"type": "string"}},
    {"if": {"properties": {"a": {"const": 1}}, "required": ["a"]},
     "then": {"properties": {"b": {}}}, "else": {"properties": {"k": {}}},
     "unevaluatedProperties": False},
    {"if": {"properties": {"a": {"const": 1}}}, "then": {"properties": {"b": {}}},
     "unevaluatedProperties": False},
    {"dependentSchemas": {"a": {"properties": {"b": {}}}}, "properties": {"a": {}},
     "unevaluatedProperties": False},
    {"properties": {"k": {}}, "allOf": [{"oneOf": [{"properties": {"a": {}}, "required": ["a"]},
                                                   {"properties": {"b": {}}}]}],
     "unevaluatedProperties": False},
    {"$defs": {"D": {"anyOf": [{"properties": {"a": {}}}, {"patternProperties": {"^b": {}}}]}},
     "$ref": "#/$defs/D", "unevaluatedProperties": {"const": 1}},
    {"anyOf": [{"prefixItems": [{}]}, {"prefixItems": [{}, {}]}], "unevaluatedItems": False},
    {"oneOf": [{"contains": {"const": 1}}, {"items": {"type": "string"}}],
     "unevaluatedItems": False},
    {"if": {"prefixItems": [{"const": 1}]}, "then": {"prefixItems": [{}, {"const": 3}]},
     "else": {"items": {"type": "string"}}, "unevaluatedItems": {"const": 5}},
]

# a branch whose own evaluation depends on its branches, or too many cases: refused
REFUSED = [
    ({"oneOf": [{"anyOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
                {"type": "string"}],
      "unevaluatedProperties": False}, "unevaluatedProperties"),
    ({"anyOf": [{"properties": {k: {}}} for k in "abcde"],
      "unevaluatedProperties": False}, "unevaluatedProperties"),
    ({"oneOf": [{"anyOf": [{"prefixItems": [{}]}, {"contains": {}}]}, {"type": "string"}],
      "unevaluatedItems": False}, "unevaluatedItems"),
]


@pytest.mark.parametrize("schema", ISSUE_CASES, ids=["prefixItems-allOf", "uneval-ref"])
@pytest.mark.parametrize("order", ["auto", "schema"])
def test_issue_cases_against_jsonschema(schema, order):
    d = check_against_jsonschema(schema, order)
    assert not d.accepts(b"[3,5]") if "allOf" in schema else \
        not d.accepts(b'{"prop1":"match"}')


@pytest.mark.parametrize("schema", SCOPE_CASES, ids=[json.dumps(s)[:60] for s in SCOPE_CASES])
@pytest.mark.parametrize("order", ["auto", "schema"])
def test_scopes_against_jsonschema(schema, order):
    check_against_jsonschema(schema, order)


@pytest.mark.parametrize("schema", BRANCH_CASES,
                         ids=[json.dumps(s)[:60] for s in BRANCH_CASES])
@pytest.mark.parametrize("order", ["auto", "schema"])
def test_branch_annotations_against_jsonschema(schema, order):
    check_against_jsonschema(schema, order)


@pytest.mark.parametrize("schema, keyword", REFUSED,
                         ids=[json.dumps(s)[:60] for s, _ in REFUSED])
def test_branch_annotations_refused_by_name(schema, keyword):
    with pytest.raises(UnsupportedSchemaError, match=rf"'{keyword}' .*branch.*"
                                                     rf"at /{keyword}"):
        _dfa(schema)
    # strict=False ignores the keyword: a superset, so every valid instance is accepted
    d = minimize(determinize(schema_to_nfa(schema, "", strict=False,
                                           property_order="schema")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    for v in UNIVERSE:
        if oracle.is_valid(v) and not (isinstance(v, dict) and len(v) > 1):
            assert d.accepts(_text(v).encode()), (schema, v)


# ---------------------------------------------------------------------------------------
# hypothesis: applicators nested under each other and under $ref
# ---------------------------------------------------------------------------------------
def _leaf():
    return st.one_of(
        st.sampled_from([{}, {"type": "integer"}, {"type": "string"}, {"const": 1},
                         {"minimum": 3}, {"maximum": 3}, {"enum": [1, "x", None]},
                         {"required": ["a"]}, {"type": "array"}, {"type": "object"}]),
        st.builds(lambda n, m: {"minItems": n, "maxItems": n + m}, st.integers(0, 2),
                  st.integers(0, 2)),
    )


def _applicators(inner):
    arr = st.one_of(
        st.lists(inner, min_size=1, max_size=2).map(lambda xs: {"prefixItems": xs}),
        inner.map(lambda x: {"items": x}),
        st.builds(lambda p, i: {"prefixItems": p, "items": i},
                  st.lists(inner, min_size=1, max_size=2), inner),
        st.builds(lambda c, lo, hi: {"contains": c,
                                     **({"minContains": lo} if lo is not None else {}),
                                     **({"maxContains": hi} if hi is not None else {})},
                  inner, st.one_of(st.none(), st.integers(0, 2)),
                  st.one_of(st.none(), st.integers(0, 2))),
        st.sampled_from([{"unevaluatedItems": False},
                         {"unevaluatedItems": {"type": "integer"}}]),
    )
    obj = st.one_of(
        st.builds(lambda ps: {"properties": ps},
                  st.dictionaries(st.sampled_from(_KEYS), inner, min_size=1, max_size=2)),
        st.builds(lambda p, s: {"patternProperties": {p: s}},
                  st.sampled_from(["^a", "^[bk]$"]), inner),
        inner.map(lambda x: {"additionalProperties": x}),
        st.sampled_from([{"unevaluatedProperties": False},
                         {"unevaluatedProperties": {"type": "integer"}}]),
    )
    comb = st.one_of(
        st.lists(inner, min_size=1, max_size=2).map(lambda xs: {"allOf": xs}),
        st.lists(inner, min_size=1, max_size=2).map(lambda xs: {"anyOf": xs}),
        st.lists(inner, min_size=2, max_size=2).map(lambda xs: {"oneOf": xs}),
        inner.map(lambda x: {"not": x}),
        st.builds(lambda c, t, e: {"if": c, "then": t, "else": e}, inner, inner, inner),
        st.just({"$ref": "#/$defs/D"}),
    )
    # a schema object combines up to three of these keyword groups; often an array or
    # object keyword beside an applicator (where scopes leak)
    return st.one_of(
        st.lists(st.one_of(arr, obj, comb), min_size=1, max_size=3).map(_join),
        st.tuples(st.one_of(arr, obj), comb).map(_join),
        st.tuples(st.one_of(arr, obj), arr.map(lambda x: {"allOf": [x]})).map(_join),
        st.tuples(st.one_of(arr, obj), obj.map(lambda x: {"allOf": [x]})).map(_join))


def _join(parts):
    out = {}
    for p in parts:
        for k, v in p.items():
            out.setdefault(k, v)
    return out


def _with_ids(doc):
    """The same document with $id base URIs: D becomes the resource d.json, referred
    to by a relative reference."""
    if not isinstance(doc.get("$defs", {}).get("D"), dict):
        return doc
    doc = json.loads(json.dumps(doc).replace('"#/$defs/D"', '"d.json"'))
    doc["$id"] = "http://example.com/s/root.json"
    doc["$defs"]["D"]["$id"] = "d.json"
    return doc


def _doc():
    inner = st.recursive(_leaf(), _applicators, max_leaves=6)
    return st.builds(lambda root, d, ids: (_with_ids if ids else (lambda x: x))(
        {**root, "$defs": {"D": d}}) if isinstance(root, dict) else root,
        inner, inner, st.booleans())


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_doc())
def test_fuzz_nested_applicators_against_jsonschema(schema):
    """Nested prefixItems/items/contains/properties/unevaluated* under allOf/anyOf/oneOf/
    not/if and $ref: no invalid instance of the universe accepted (refusals must name a
    keyword or a limit)."""
    try:
        d = _dfa(schema)
    except UnsupportedSchemaError as e:
        assert "keyword" in str(e) or "at /" in str(e), str(e)
        return
    except (AutomatonTooLargeError, JaxcdError) as e:
        assert str(e)
        return
    oracle = jsonschema.Draft202012Validator(schema)
    for v in UNIVERSE:
        if d.accepts(_text(v).encode()):
            try:
                valid = oracle.is_valid(v)
            except RecursionError:
                return       # a $ref cycle without an instance step: no meaning
            assert valid, ("invalid accepted", schema, v)


def test_strip_unenforced_resolves_ids_and_drops_refused_unevaluated():
    """``strip_unenforced`` (the CLI's --no-strict) gives a schema that a strict build
    accepts: references through $id base URIs kept (as pointers), an
    unevaluatedProperties that a branch's annotations would decide dropped; the
    input is not modified."""
    from jaxcd.automata.json_schema import strip_unenforced
    s = {"$id": "http://e.com/r.json", "$defs": {"a": {"$id": "a.json", "type": "integer"}},
         "properties": {"x": {"$ref": "a.json"}}, "unevaluatedProperties": False,
         "oneOf": [{"anyOf": [{"properties": {"y": {}}}, {"required": ["z"]}]},
                   {"type": "string"}]}
    before = json.dumps(s)
    t = strip_unenforced(s)
    assert json.dumps(s) == before
    assert "unevaluatedProperties" not in t
    d = _dfa(t)
    assert d.accepts(b'{"x":1}') and not d.accepts(b'{"x":"a"}')
    with pytest.raises(UnsupportedSchemaError, match="unevaluatedProperties"):
        _dfa(s)


@pytest.mark.parametrize("schema", [
    # property names that are keywords: the maps of names are not schemas
    {"properties": {"unevaluatedProperties": {"type": "integer"},
                    "$ref": {"type": "string"}, "$id": {"const": 1}},
     "unevaluatedProperties": False},
    {"$defs": {"unevaluatedItems": {"type": "integer"}},
     "items": {"$ref": "#/$defs/unevaluatedItems"}},
    # an inner unevaluatedProperties over branches evaluates everything for an outer one
    {"allOf": [{"oneOf": [{"properties": {"a": {}}, "required": ["a"]},
                          {"properties": {"b": {}}, "required": ["b"]}],
                "unevaluatedProperties": {"type": "integer"}}],
     "anyOf": [{"properties": {"k": {}}}, {"properties": {"b": {}}}, {"required": ["a"]},
               {"required": ["b"]}, {"required": ["k"]}],
     "unevaluatedProperties": False},
], ids=["keyword-names", "defs-named-like-keywords", "inner-cases-evaluate-all"])
def test_keyword_names_and_nested_unevaluated(schema):
    check_against_jsonschema(schema)
