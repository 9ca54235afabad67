"""Strict mode never silently ignores a keyword: every keyword of JSON Schema draft
2020-12 (core, applicator, unevaluated, validation, meta-data, format-annotation,
content vocabularies) is either enforced -- a schema using it compiles to an automaton
whose language agrees with the jsonschema library (Draft202012Validator) on a small
universe of instances, accepted iff valid -- or refused by name (UnsupportedSchemaError
naming the keyword)."""

import itertools
import json
import re

import jsonschema
import pytest

from jaxcd.automata import determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa
from jaxcd.errors import UnsupportedSchemaError

# every keyword of the draft 2020-12 meta-schemas, by vocabulary
DRAFT_2020_12 = {
    "core": ["$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor",
             "$vocabulary", "$comment", "$defs"],
    "applicator": ["prefixItems", "items", "contains", "additionalProperties",
                   "properties", "patternProperties", "dependentSchemas", "propertyNames",
                   "if", "then", "else", "allOf", "anyOf", "oneOf", "not"],
    "unevaluated": ["unevaluatedItems", "unevaluatedProperties"],
    "validation": ["type", "const", "enum", "multipleOf", "maximum", "exclusiveMaximum",
                   "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern",
                   "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
                   "maxProperties", "minProperties", "required", "dependentRequired"],
    "meta-data": ["title", "description", "default", "deprecated", "readOnly",
                  "writeOnly", "examples"],
    "format-annotation": ["format"],
    "content": ["contentEncoding", "contentMediaType", "contentSchema"],
}
ALL_KEYWORDS = [k for ks in DRAFT_2020_12.values() for k in ks]


def _universe():
    out = [None, True, False, 0, 1, 2, 3, 4, 6, -1, 1.5, 2.5, "", "a", "ab", "abc", "é",
           "x1", "2024-02-29", "2023-02-29", "1.2.3.4"]
    for n in range(4):
        out.extend(list(t) for t in itertools.product([1, 2, "a"], repeat=n))
    for n in range(3):
        for ks in itertools.permutations(["a", "b", "c"], n):
            for vs in itertools.product([1, "a"], repeat=n):
                out.append(dict(zip(ks, vs)))
    out.extend([{"a": None}, {"a": [1]}, {"a": {"b": 1}}, {"b": [1, 2]}])
    return out


UNIVERSE = _universe()

# keyword -> a schema that uses it (compared with jsonschema on UNIVERSE)
ENFORCED = {
    "$schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"},
    "$id": {"$id": "https://example.com/root.json",
            "$defs": {"n": {"$id": "n.json", "type": "integer", "minimum": 2}},
            "$ref": "n.json"},
    "$ref": {"$defs": {"n": {"type": "integer", "maximum": 2}}, "$ref": "#/$defs/n"},
    "$anchor": {"$defs": {"n": {"$anchor": "num", "type": "number", "minimum": 2}},
                "$ref": "#num"},
    "$dynamicAnchor": {"$dynamicAnchor": "node", "type": "string", "maxLength": 1},
    # one $dynamicAnchor of its name in the document: the static target (a dynamic scope
    # that could change it is refused: test_json_schema_enforce.py)
    "$dynamicRef": {"$dynamicAnchor": "node", "type": ["array", "integer"],
                    "items": {"$dynamicRef": "#node"}, "maxItems": 2},
    "$vocabulary": {"$vocabulary": {"https://json-schema.org/draft/2020-12/vocab/core": True},
                    "type": "boolean"},
    "$comment": {"$comment": "a comment", "type": "string", "minLength": 2},
    "$defs": {"$defs": {"s": {"type": "string"}}, "type": "array",
              "items": {"$ref": "#/$defs/s"}},
    "prefixItems": {"prefixItems": [{"type": "integer"}, {"type": "string"}]},
    "items": {"type": "array", "prefixItems": [{"const": 1}], "items": {"const": 2}},
    "contains": {"type": "array", "contains": {"const": "a"}},
    "additionalProperties": {"type": "object", "properties": {"a": {}},
                             "additionalProperties": {"type": "integer"}},
    "properties": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "patternProperties": {"type": "object", "patternProperties": {"^[ab]$": {"type": "string"}}},
    "dependentSchemas": {"type": "object",
                         "dependentSchemas": {"a": {"required": ["b"]}}},
    "propertyNames": {"type": "object", "propertyNames": {"enum": ["a", "c"]}},
    "if": {"if": {"type": "integer"}, "then": {"minimum": 2}, "else": {"type": "string"}},
    "then": {"if": {"type": "string"}, "then": {"maxLength": 1}},
    "else": {"if": {"type": "string"}, "else": {"type": "integer"}},
    "allOf": {"allOf": [{"type": "integer"}, {"minimum": 2}]},
    "anyOf": {"anyOf": [{"type": "integer", "minimum": 3}, {"type": "string"}]},
    "oneOf": {"oneOf": [{"type": "integer"}, {"minimum": 2}]},
    "not": {"not": {"type": ["integer", "string"]}},
    "unevaluatedItems": {"prefixItems": [{"const": 1}], "unevaluatedItems": {"const": "a"}},
    "unevaluatedProperties": {"allOf": [{"properties": {"a": {}}}],
                              "unevaluatedProperties": {"type": "string"}},
    "type": {"type": ["null", "boolean"]},
    "const": {"const": {"a": 1}},
    "enum": {"enum": [1, "a", [1, 2], None]},
    "multipleOf": {"type": "number", "multipleOf": 1.5},
    "maximum": {"type": "number", "maximum": 2},
    "exclusiveMaximum": {"type": "number", "exclusiveMaximum": 2},
    "minimum": {"type": "number", "minimum": 2},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 2},
    "maxLength": {"type": "string", "maxLength": 1},
    "minLength": {"type": "string", "minLength": 2},
    "pattern": {"type": "string", "pattern": "^[a-c]+$"},
    "maxItems": {"type": "array", "maxItems": 1},
    "minItems": {"type": "array", "minItems": 2},
    "uniqueItems": {"type": "array", "items": {"enum": [1, 2, "a"]}, "uniqueItems": True},
    "maxContains": {"type": "array", "contains": {"const": 1}, "maxContains": 1},
    "minContains": {"type": "array", "contains": {"const": 1}, "minContains": 2},
    "maxProperties": {"type": "object", "maxProperties": 1},
    "minProperties": {"type": "object", "minProperties": 2},
    "required": {"type": "object", "required": ["a"]},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["c"]}},
    "title": {"title": "T", "type": "integer"},
    "description": {"description": "D", "type": "integer"},
    "default": {"default": 1, "type": "integer"},
    "deprecated": {"deprecated": True, "type": "integer"},
    "readOnly": {"readOnly": True, "type": "integer"},
    "writeOnly": {"writeOnly": True, "type": "integer"},
    "examples": {"examples": [1], "type": "integer"},
    # jaxcd asserts formats: compared with jsonschema's format checker
    "format": {"type": "string", "format": "date"},
    "contentEncoding": {"contentEncoding": "base64", "type": "string", "maxLength": 2},
    "contentMediaType": {"contentMediaType": "application/json", "type": "string",
                         "maxLength": 2},
}

# keyword -> a schema using it, which strict mode refuses by name
REFUSED = {
    "contentSchema": {"type": "string", "contentMediaType": "application/json",
                      "contentSchema": {"type": "integer"}},
}


def test_every_keyword_is_listed_once():
    assert len(ALL_KEYWORDS) == len(set(ALL_KEYWORDS))
    assert set(ENFORCED) | set(REFUSED) == set(ALL_KEYWORDS)
    assert not set(ENFORCED) & set(REFUSED)


def _text(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("keyword", sorted(ENFORCED))
def test_enforced_keyword_agrees_with_jsonschema(keyword):
    schema = ENFORCED[keyword]
    assert keyword in json.dumps(schema)
    d = minimize(determinize(schema_to_nfa(schema, "", property_order="auto")[0]))
    oracle = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    accepted = rejected = 0
    for v in UNIVERSE:
        ok = d.accepts(_text(v).encode())
        assert ok == oracle.is_valid(v), (keyword, schema, v, ok)
        accepted += ok
        rejected += not ok
    assert accepted and rejected            # the keyword's schema separates the universe


@pytest.mark.parametrize("keyword", sorted(REFUSED))
def test_refused_keyword_is_named(keyword):
    k = re.escape(keyword)
    with pytest.raises(UnsupportedSchemaError, match=rf"'{k}'.* at /{k}"):
        schema_to_nfa(REFUSED[keyword], "")
