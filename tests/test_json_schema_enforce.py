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


# ---------------------------------------------------------------------------------------
# $id base URIs: references resolved against the base URI where they are written
# ---------------------------------------------------------------------------------------
_ID_UNIVERSE = [None, 1, 2, "a", "", [], [1], ["a"], [1, [2]], [[1]], [["a"]],
                {"a": 1}, {"a": "x"}, {"a": {"a": 1}}, {"v": 1}, {"v": 1, "n": [{"v": 2}]},
                {"v": "x"}, {"v": 1, "n": [{"v": "x"}]}, {"v": 1, "n": [{"v": 2, "n": []}]}]

ID_CASES = [
    # relative reference to an embedded resource
    {"$id": "http://example.com/root.json",
     "$defs": {"A": {"$id": "node", "type": "integer"}}, "$ref": "node"},
    {"$id": "http://example.com/root.json",
     "$defs": {"A": {"$id": "./bar.json", "type": "string"}}, "$ref": "bar.json"},
    # urn: identifiers, absolute and fragment-only
    {"$id": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed",
     "$defs": {"bar": {"type": "string"}},
     "$ref": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed#/$defs/bar"},
    {"$id": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed",
     "$defs": {"bar": {"type": "string"}}, "$ref": "#/$defs/bar"},
    # "#/$defs/..." inside a subschema with its own $id: that subschema's $defs
    {"$id": "http://ex.com/root",
     "properties": {"a": {"$id": "http://ex.com/sub", "$defs": {"x": {"type": "integer"}},
                          "$ref": "#/$defs/x"}},
     "$defs": {"x": {"type": "string"}}},
    # an anchor in another resource
    {"$id": "http://ex.com/r",
     "$defs": {"B": {"$id": "b.json", "$defs": {"c": {"$anchor": "foo", "type": "integer"}}}},
     "$ref": "b.json#foo"},
    # a document without $id referring to an embedded absolute $id
    {"$defs": {"A": {"$id": "http://x/a.json", "type": "integer"}}, "$ref": "http://x/a.json"},
    # recursion through relative references
    {"$id": "http://example.com/tree", "type": "object",
     "properties": {"v": {"type": "integer"},
                    "n": {"type": "array", "items": {"$ref": "node"}}},
     "$defs": {"node": {"$id": "http://example.com/node", "$ref": "tree"}}},
    # base URI changes along the way (folders)
    {"$id": "http://localhost:1234/draft2020-12/",
     "items": {"$id": "baseUriChange/", "items": {"$ref": "folderInteger.json"}},
     "$defs": {"x": {"$id": "baseUriChange/folderInteger.json", "type": "integer"}}},
    # pointer tokens that need escaping
    {"$id": "http://ex.com/e", "$defs": {"a/b": {"$id": "t", "$defs": {"c d": {"const": 2}}}},
     "$ref": "t#/$defs/c%20d"},
]


@pytest.mark.parametrize("schema", ID_CASES, ids=[json.dumps(s)[:50] for s in ID_CASES])
def test_id_base_uris_against_jsonschema(schema):
    _agree(schema, _ID_UNIVERSE)


_D4 = "http://json-schema.org/draft-04/schema#"
D4_ID_CASES = [
    # "$id" is no keyword in draft-04: "#/definitions/x" is the document's (SchemaStore's
    # cryproj schemas write "$id" paths on every subschema of a draft-04 schema)
    {"$schema": _D4, "id": "http://ex.com/root", "definitions": {"x": {"type": "integer"}},
     "properties": {"a": {"$id": "/elsewhere", "properties": {"v": {"$ref": "#/definitions/x"}}}}},
    {"$schema": _D4, "definitions": {"x": {"type": "string"}},
     "items": {"$id": "/items", "properties": {"v": {"$ref": "#/definitions/x"}}}},
    # draft-04's own "id" does change the base URI
    {"$schema": _D4, "id": "http://ex.com/root",
     "definitions": {"A": {"id": "node", "type": "integer"}},
     "properties": {"v": {"$ref": "node"}}},
    {"$schema": _D4, "id": "http://ex.com/root", "definitions": {"x": {"type": "integer"}},
     "properties": {"a": {"id": "http://ex.com/sub", "definitions": {"x": {"type": "string"}},
                          "properties": {"v": {"$ref": "#/definitions/x"}}}}},
]


@pytest.mark.parametrize("schema", D4_ID_CASES, ids=[json.dumps(s)[45:95] for s in D4_ID_CASES])
def test_draft4_ids_against_jsonschema(schema):
    d = _dfa(schema)
    oracle = jsonschema.Draft4Validator(schema)
    universe = _ID_UNIVERSE + [{"a": {"v": 1}}, {"a": {"v": "x"}}, [{"v": "x"}], [{"v": 1}]]
    results = [d.accepts(_text(v).encode()) for v in universe]
    assert results == [oracle.is_valid(v) for v in universe]
    assert any(results) and not all(results)


def test_reference_outside_the_document_still_refused():
    with pytest.raises(UnsupportedSchemaError, match=r"\$ref 'other.json'"):
        _dfa({"$id": "http://example.com/root.json", "$ref": "other.json"})


# ---------------------------------------------------------------------------------------
# Unicode property classes (ECMA-262 \p{..} / \P{..}) in pattern and patternProperties,
# against jsonschema with the third-party ``regex`` module for those keywords (Python's
# ``re``, which jsonschema uses, has no \p)
# ---------------------------------------------------------------------------------------
def _regex_validator():
    regex = pytest.importorskip("regex")

    def pattern(v, p, inst, s):
        if v.is_type(inst, "string") and not regex.search(p, inst):
            yield jsonschema.ValidationError(f"{inst!r} does not match {p!r}")

    def pattern_properties(v, pp, inst, s):
        if v.is_type(inst, "object"):
            for p, sub in pp.items():
                for k, x in inst.items():
                    if regex.search(p, k):
                        yield from v.descend(x, sub, path=k)
    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        {"pattern": pattern, "patternProperties": pattern_properties})


# characters assigned since early Unicode versions, of many categories
_CHARS = ["a", "Z", "é", "ß", "Σ", "中", "1", "٣", "_", "-", " ", "!", "ǅ", "ʰ", "Ⅻ", "½",
          "€", "\u0301", "+", "(", "\u2028", "\t"]
_STRINGS = [""] + _CHARS + [a + b for a in _CHARS[:12] for b in _CHARS[:12]]


@pytest.mark.parametrize("pattern", [
    r"^\p{Letter}+$", r"^\p{L}+$", r"^\P{L}+$", r"^[\p{Lu}\p{Nd}]*$", r"\p{Sc}",
    r"^[^\p{L}\p{N}]+$", r"^\p{gc=Ll}$", r"^\p{General_Category=Number}+$",
    r"^\p{Lt}|\p{Lm}$", r"^[\P{L}a]+$", r"^\p{Zs}$", r"^\p{Mn}"])
def test_unicode_property_classes_in_pattern(pattern):
    schema = {"type": "string", "pattern": pattern}
    d = _dfa(schema)
    oracle = _regex_validator()(schema)
    n = 0
    for v in _STRINGS:
        ok = d.accepts(json.dumps(v, ensure_ascii=False).encode())
        assert ok == oracle.is_valid(v), (pattern, v, ok)
        n += ok
    assert 0 < n < len(_STRINGS)


def test_unicode_property_classes_in_pattern_properties():
    schema = {"type": "object", "patternProperties": {r"^\p{Lu}": {"type": "integer"}}}
    d = _dfa(schema)
    oracle = _regex_validator()(schema)
    for v in [{}, {"A": 1}, {"A": "x"}, {"a": "x"}, {"É": 1}, {"É": "x"}, {"1": "x"},
              {"Σ": None}]:
        ok = d.accepts(_text(v).encode())
        assert ok == oracle.is_valid(v), (v, ok)


@pytest.mark.parametrize("pattern", [r"\p{Script=Greek}", r"\p{Alphabetic}", r"\p{Foo}"])
def test_other_unicode_properties_refused_by_name(pattern):
    with pytest.raises(UnsupportedSchemaError, match=r"pattern at /pattern.*Unicode property"):
        _dfa({"type": "string", "pattern": pattern})


# ---------------------------------------------------------------------------------------
# uniqueItems beside prefixItems, and over bounded integers / strings within
# MAX_UNIQUE_STATES (sets of values used), against jsonschema
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("schema, pool", [
    ({"type": "array", "prefixItems": [{"enum": ["a", "b"]}, {"const": "c"}],
      "items": {"enum": ["a", "c", "d"]}, "uniqueItems": True}, ["a", "b", "c", "d"]),
    ({"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 2}],
      "items": False, "uniqueItems": True}, [0, 1, 2, 3]),
    # 1 (first position) equals 1.0 (later ones); enum values keep their spelling, so
    # 1.0 is not offered first (a separate convention, left out below)
    ({"type": "array", "prefixItems": [{"enum": [1, 2]}], "items": {"enum": [1.0, 2, 3]},
      "uniqueItems": True, "minItems": 2}, [1, 1.0, 2, 3]),
    # 21 values, at most 3 items: 1 562 sets of values used
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 20},
      "uniqueItems": True, "maxItems": 3}, [0, 1, 7, 20, 21]),
    ({"type": "array", "items": {"type": "string", "pattern": "^[ab]{1,2}$"},
      "uniqueItems": True, "maxItems": 3}, ["a", "b", "ab", "ba", "c"]),
], ids=lambda x: json.dumps(x)[:60])
def test_unique_items_with_prefix_items_and_bounded_values(schema, pool):
    d = _dfa(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    n_dup = n_ok = 0
    for k in range(5):
        for arr in itertools.product(pool, repeat=k):
            v = list(arr)
            if any(isinstance(x, float) for x in pool) and (
                    any(isinstance(x, float) for x in v[:1])
                    or any(x == 1 and not isinstance(x, float) for x in v[1:])):
                continue
            ok = d.accepts(_text(v).encode())
            assert ok == oracle.is_valid(v), (schema, v, ok)
            n_ok += ok
            n_dup += not ok and len(set(map(json.dumps, v))) < len(v)
    assert n_ok > 3 and n_dup > 3


def test_unique_items_past_the_state_limit_names_it():
    """Past ``MAX_UNIQUE_STATES`` the values are kept apart by the sort key (integers
    by first digit: ``[12, 3]``, and as a pair ``[3, 12]``, but not ``[3, 12, 20]`` or
    ``[1, 12]``); beside ``prefixItems`` that is refused, naming the limit."""
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 20},
              "uniqueItems": True, "maxItems": 6}
    d = _dfa(schema)
    assert d.accepts(b"[0,12,3]") and d.accepts(b"[12,3]") and d.accepts(b"[3,12]")
    assert not d.accepts(b"[3,12,20]") and not d.accepts(b"[1,12]")
    assert not d.accepts(b"[3,3]")
    with pytest.raises(UnsupportedSchemaError,
                       match=r"'uniqueItems'.*MAX_UNIQUE_STATES.*at /uniqueItems"):
        _dfa({**schema, "prefixItems": [schema["items"]]})


def test_draft7_ref_ignores_a_sibling_id():
    """Draft 7: ``$ref`` ignores its siblings, ``$id`` included (the base URI stays the
    enclosing one); 2020-12: the sibling ``$id`` changes it. Against jsonschema."""
    defs = {"foo": {"$id": "http://localhost:1234/sibling_id/foo.json", "type": "string"},
            "base_foo": {"$id": "foo.json", "type": "number"}}
    for dialect, key in (("http://json-schema.org/draft-07/schema#", "definitions"),
                         ("https://json-schema.org/draft/2020-12/schema", "$defs")):
        schema = {"$schema": dialect, "$id": "http://localhost:1234/sibling_id/base/",
                  key: defs,
                  "allOf": [{"$id": "http://localhost:1234/sibling_id/", "$ref": "foo.json"}]}
        d = _dfa(schema)
        oracle = jsonschema.validators.validator_for(schema)(schema)
        for v in ["a", 1, 1.5, None]:
            assert d.accepts(_text(v).encode()) == oracle.is_valid(v), (dialect, v)


# ---------------------------------------------------------------------------------------
# $dynamicRef: a $ref when its target cannot depend on the dynamic scope
# ---------------------------------------------------------------------------------------
_TREE_UNIVERSE = [None, 1, "a", [], [1], ["a"], [[1]], [["a"]], {"v": 1}, {"v": "x"},
                  {"v": 1, "c": [{"v": 2}]}, {"v": 1, "c": [{"v": "x"}]},
                  {"v": 1, "c": [{"v": 2, "c": []}]}, {"v": 1, "c": [{"v": 2, "w": 1}]}]


@pytest.mark.parametrize("schema", [
    {"$id": "https://ex.com/tree", "$dynamicAnchor": "node", "type": "object",
     "properties": {"v": {"type": "integer"},
                    "c": {"type": "array", "items": {"$dynamicRef": "#node"}}}},
    {"$defs": {"x": {"type": "integer"}}, "type": "array", "items": {"$dynamicRef": "#/$defs/x"}},
    {"$defs": {"x": {"$anchor": "i", "type": "integer"}}, "type": "array",
     "items": {"$dynamicRef": "#i"}},
], ids=["one-dynamic-anchor", "pointer", "plain-anchor"])
def test_dynamic_ref_with_a_static_target(schema):
    _agree(schema, _TREE_UNIVERSE)


def test_dynamic_ref_with_a_dynamic_scope_refused_by_name():
    # the strict tree: two schemas declare $dynamicAnchor "node" (the extension point)
    schema = {"$id": "https://ex.com/strict-tree", "$dynamicAnchor": "node", "$ref": "tree",
              "unevaluatedProperties": False,
              "$defs": {"tree": {"$id": "tree", "$dynamicAnchor": "node", "type": "object",
                                 "properties": {"v": {}, "c": {
                                     "type": "array", "items": {"$dynamicRef": "#node"}}}}}}
    with pytest.raises(UnsupportedSchemaError, match=r"'\$dynamicRef'.*dynamic scope"):
        _dfa(schema)


_AB1_STRINGS = ["".join(t) for n in range(5) for t in itertools.product("ab1", repeat=n)]


@pytest.mark.parametrize("schema", [
    {"allOf": [{"pattern": "^a"}, {"pattern": "b$"}]},
    {"type": "string", "pattern": "^a", "allOf": [{"pattern": "1"}, {"pattern": "^a"},
                                                  {"pattern": "b$", "maxLength": 3}]},
    {"allOf": [{"properties": {"a": {"pattern": "^1"}}},
               {"properties": {"a": {"type": "string", "pattern": "b"}}}]},
    {"type": "object", "propertyNames": {"allOf": [{"pattern": "^[ab]+$"},
                                                   {"pattern": "^.{1,2}$"}]}},
    {"anyOf": [{"allOf": [{"pattern": "^a"}, {"pattern": "^ab"}]}, {"pattern": "^b$"}]},
    {"not": {"allOf": [{"pattern": "^a"}, {"pattern": "b$"}]}},
], ids=json.dumps)
def test_patterns_under_all_of_all_hold(schema):
    """Two different ``pattern``s under one ``allOf``: a string matches both (their
    automata intersected), for values, property values and property names."""
    objects = [{k: v} for k in _AB1_STRINGS[:13] for v in ("1b", "ab", 1)] + _OBJECTS
    _agree(schema, _AB1_STRINGS + _SCALARS + objects)


def _trees(depth):
    """Nested ``{"v": ..., "c": [...]}`` values up to ``depth`` levels, some invalid."""
    if depth == 0:
        return []
    inner = _trees(depth - 1)
    out = [{"v": "x", "c": []}, {"v": 1, "c": []}, {"v": "x"}]
    out += [{"v": "x", "c": [t]} for t in inner[:6]]
    out += [{"v": "x", "c": [inner[0], t]} for t in inner[:3]] if inner else []
    return out


@pytest.mark.parametrize("wrap", ["allOf", "allOf+sibling", "nested allOf"])
def test_recursion_through_all_of_is_cut_like_a_ref(wrap):
    """A recursive reference reached only through ``allOf`` (``"items": {"allOf":
    [{"$ref": ...}]}``) is expanded ``max_depth`` times like a plain ``$ref`` (it used
    to recurse until Python's stack ran out): every accepted value is valid, and every
    value accepted with ``"items": {"$ref": ...}`` is accepted (the document's own
    ``$ref`` counts as a plain expansion, the ``allOf`` ones apart and one more of
    them is allowed, so deeper here)."""
    ref = {"$ref": "#/$defs/node"}
    item = {"allOf": [ref]} if wrap == "allOf" else \
        {"allOf": [ref], "description": "a child"} if wrap == "allOf+sibling" else \
        {"allOf": [{"allOf": [ref]}]}

    def schema(it):
        return {"$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "string"}, "c": {"type": "array", "items": it}},
            "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}

    d, plain = _dfa(schema(item)), _dfa(schema(ref))
    oracle = jsonschema.Draft202012Validator(schema(item))
    accepted = 0
    for v in _trees(4):
        ok = d.accepts(_text(v).encode())
        assert ok or not plain.accepts(_text(v).encode()), v
        if ok:
            assert oracle.is_valid(v), v
            accepted += 1
    assert accepted >= 4


# every spelling of a few numbers: plain, trailing zeros, exponents, signs of zero
_NUMBER_TEXTS = sorted({t for i in range(-3, 4) for t in (
    str(i), f"{i}.0", f"{i}.00", f"{i}e0", f"{i}E+0", f"{i * 10}e-1")} | {
    "-0", "-0.0", "0.5", "0.50", "5e-1", "2.5", "2.50", "25e-1", "1e+20", "1e20", "1E20",
    "100000000000000000000", "100000000000000000000.0", "1e-05", "0.00001", "1e-5"})


@pytest.mark.parametrize("schema, must", [
    ({"enum": [2.0]}, ["2", "2.0"]),
    ({"const": 2}, ["2"]),
    ({"const": -0.0}, ["0", "-0.0"]),
    ({"enum": [0.5, 2.5, "a"]}, ["0.5", "2.5"]),
    ({"enum": [1e20, 1e-05]}, ["1e+20", "100000000000000000000", "1e-05", "0.00001"]),
    ({"type": "integer", "enum": [2.0, 2.5, 3]}, ["2", "3"]),
    ({"type": "number", "enum": [2.0]}, ["2", "2.0"]),
    ({"enum": [1, 2.0, 3.0], "minimum": 2}, ["2", "3", "2.0", "3.0"]),
    ({"not": {"const": 2}, "type": "number", "maximum": 3}, ["3", "1.0"]),
    ({"oneOf": [{"const": 2}, {"const": 2.0}, {"const": 3.0}]}, ["3", "3.0"]),
], ids=lambda x: json.dumps(x)[:60])
def test_enum_numbers_in_their_plain_spelling_too(schema, must):
    """An enum/const number is its value (``2`` equals ``2.0``): a number written with
    an exponent or a fraction of zeros is accepted in its plain spelling too, and
    nothing that jsonschema finds invalid is."""
    d = _dfa(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    for t in _NUMBER_TEXTS:
        if d.accepts(t.encode()):
            assert oracle.is_valid(json.loads(t)), (schema, t)
    for t in must:
        assert d.accepts(t.encode()), (schema, t)


def test_unique_items_over_enum_numbers_counts_values_not_spellings():
    schema = {"type": "array", "items": {"enum": [1.0, 2.0, 3]}, "uniqueItems": True}
    d = _dfa(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    texts = ["1", "1.0", "2", "2.0", "3"]                   # every spelling it accepts
    n = 0
    for k in range(4):
        for items in itertools.product(texts, repeat=k):
            t = "[" + ",".join(items) + "]"
            ok = d.accepts(t.encode())
            assert ok == oracle.is_valid(json.loads(t)), t
            n += ok
    assert n > 20
    assert not d.accepts(b"[3.0]")           # an integer written as one keeps its spelling


@pytest.mark.parametrize("schema", [
    {"const": {"a": [1, 2], "b": {"c": None}}},
    {"enum": [[1, {"b": 2}], "q", {}, [], {"a": "x, y: z"}]},
    {"type": "object", "properties": {"x": {"enum": [{"k": [True]}, [None, 1.5]]}}},
], ids=lambda x: json.dumps(x)[:60])
def test_enum_objects_and_arrays_take_the_free_whitespace(schema):
    """A listed object or array is accepted with the free whitespace between its tokens
    (default ``[ ]?``), as ``json.dumps`` prints it, not only compactly; the same
    texts with another value, or another key order, are refused as jsonschema says."""
    d = minimize(determinize(schema_to_nfa(schema, property_order="auto")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    values = list(schema.get("enum", [schema.get("const")]))
    if "properties" in schema:
        values = [{"x": v} for v in schema["properties"]["x"]["enum"]]
    others = [{"a": [1, 3], "b": {"c": None}}, [1, {"b": 3}], {"a": "x,y:z"}, {"k": [False]},
              {"x": [None, 2.5]}, [[1, 2]], {"b": {"c": None}, "a": [1, 2]}]
    for i, v in enumerate(values + others):
        for t in (_text(v), json.dumps(v), json.dumps(v, separators=(", ", ":"))):
            if d.accepts(t.encode()):
                assert oracle.is_valid(v), (schema, t)
            else:
                assert i >= len(values), (schema, t)     # a listed value, as listed
