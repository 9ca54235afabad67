"""jaxcd's JSON Schema builder against independent references.

- numeric ranges: brute force over integer/decimal texts (``Decimal`` comparison);
- every keyword: instances that ``jsonschema`` (with its format checker, numbers read
  as ``Decimal``) accepts/rejects are accepted/rejected by the byte DFA;
- plain schemas: the same language as outlines-core's regex (DFA equivalence);
- GCD random walks on the real vocabulary: every output validates with ``jsonschema``;
- strict/non-strict behaviour, annotations, clear errors; a hypothesis fuzzer.
"""

from __future__ import annotations

import json
import re
import decimal
from decimal import Decimal

import jax
import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcd import compile_json_schema

from jaxcd.decoding import gcd
from jaxcd.automata.bits import unpack_bits
from jaxcd.automata.fsa import DFA, determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa, schema_to_regex, strip_unenforced
from jaxcd.automata.numeric import decimal_range_regex, int_range_regex, multiple_of_dfa
from jaxcd.automata.regex import regex_to_nfa
from jaxcd.automata.schema_builder import _difference, ecma_to_python
from jaxcd.errors import AutomatonTooLargeError, JaxcdError, SchemaError, UnsupportedSchemaError

FORMAT_CHECKER = jsonschema.FormatChecker()
decimal.getcontext().Emax = decimal.MAX_EMAX      # sampled numbers may have huge exponents
decimal.getcontext().Emin = decimal.MIN_EMIN


# formats whose jsonschema checkers need optional packages: independent stdlib checks
@FORMAT_CHECKER.checks("date-time", raises=ValueError)
def _date_time(s):
    import datetime
    if not isinstance(s, str):
        return True
    return re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", s) \
        is not None and datetime.datetime.fromisoformat(s) is not None


@FORMAT_CHECKER.checks("time", raises=ValueError)
def _time(s):
    import datetime
    if not isinstance(s, str):
        return True
    return re.fullmatch(r"\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", s) is not None and \
        datetime.time.fromisoformat(s) is not None


@FORMAT_CHECKER.checks("hostname")
def _hostname(s):
    if not isinstance(s, str):
        return True
    return all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x)
               for x in s.split("."))


@FORMAT_CHECKER.checks("uri")
def _uri(s):
    from urllib.parse import urlsplit
    if not isinstance(s, str):
        return True
    return bool(urlsplit(s).scheme) and not re.search(r"\s", s)


def dfa_of(schema, ws="", strict=True, **kw) -> DFA:
    nfa, _ = schema_to_nfa(schema, ws, strict, **kw)
    return minimize(determinize(nfa))


def validates(schema, text: str) -> bool | None:
    """jsonschema's verdict on ``text`` (numbers as ``Decimal``); None where it cannot
    give one (``multipleOf`` of a number whose quotient needs over 100,000 digits)."""
    try:
        inst = json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError:
        return False
    except decimal.InvalidOperation:      # exponent beyond Decimal's range (no bounds here)
        inst = json.loads(text)
    schema = json.loads(json.dumps(schema), parse_float=Decimal)   # exact comparisons
    cls = jsonschema.validators.validator_for(schema) if isinstance(schema, dict) else \
        jsonschema.Draft202012Validator
    try:
        return cls(schema, format_checker=FORMAT_CHECKER).is_valid(inst)
    except decimal.InvalidOperation:
        # multipleOf of a number with a huge exponent: its quotient passes the default
        # 28 digits; exact again with enough digits, else the reference cannot judge it
        with decimal.localcontext() as ctx:
            ctx.prec = 100_000
            try:
                return cls(schema, format_checker=FORMAT_CHECKER).is_valid(inst)
            except decimal.InvalidOperation:
                return None


# ---------------------------------------------------------------------------------------
# numeric ranges (brute force)
# ---------------------------------------------------------------------------------------
def _int_texts():
    out = [str(i) for i in range(-1100, 1101)] + ["-0", "00", "01", "-01", "+1", "1.0", ""]
    return out


@pytest.mark.parametrize("lo,hi", [(None, None), (0, None), (None, 0), (5, 5), (-7, 13),
                                   (-100, -3), (1, 999), (10, 1000), (0, 0), (-1, -1),
                                   (123, None), (None, -45), (7, 6), (-999, 1000)])
def test_int_range_regex_brute_force(lo, hi):
    r = int_range_regex(lo, hi)
    for s in _int_texts():
        canonical = re.fullmatch(r"-?(0|[1-9][0-9]*)", s) is not None
        expect = canonical and (lo is None or int(s) >= lo) and (hi is None or int(s) <= hi)
        got = r is not None and re.fullmatch(r, s) is not None
        assert got == expect, (lo, hi, s, r)


def test_int_range_regex_random():
    rng = np.random.default_rng(0)
    texts = _int_texts()
    for _ in range(150):
        lo = int(rng.integers(-3000, 3000))
        hi = lo + int(rng.integers(-3, 4000))
        r = int_range_regex(lo, hi)
        for s in list(rng.choice(texts, 100)) + [str(lo), str(hi), str(lo - 1), str(hi + 1)]:
            expect = re.fullmatch(r"-?(0|[1-9][0-9]*)", s) is not None and lo <= int(s) <= hi
            assert (r is not None and re.fullmatch(r, s) is not None) == expect, (lo, hi, s)


def _decimal_texts():
    vals = set()
    for i in list(range(0, 14)) + [99, 100, 101]:
        for f in ["", ".0", ".5", ".05", ".25", ".123", ".9", ".99", ".10", ".001", ".50"]:
            vals.add(f"{i}{f}")
    vals = sorted(vals)
    return vals + ["-" + v for v in vals] + ["01", "1.", ".5", "1e5", "--1"]


_BOUNDS = ["0", "0.5", "1", "2.75", "-1", "-0.25", "10", "0.05", "12.5", "-12.5", "0.001",
           "100"]


@pytest.mark.parametrize("lo", _BOUNDS + [None])
def test_decimal_range_regex_brute_force(lo):
    texts = _decimal_texts()
    for hi in _BOUNDS + [None]:
        for li in (True, False):
            for hii in (True, False):
                r = decimal_range_regex(None if lo is None else Decimal(lo),
                                        None if hi is None else Decimal(hi), li, hii)
                for s in texts:
                    ok = re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", s) is not None
                    if ok:
                        v = Decimal(s)
                        ok = (lo is None or (v >= Decimal(lo) if li else v > Decimal(lo))) and \
                             (hi is None or (v <= Decimal(hi) if hii else v < Decimal(hi)))
                    got = r is not None and re.fullmatch(r, s) is not None
                    assert got == ok, (lo, hi, li, hii, s, r)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 10, 12, 25])
def test_multiple_of_dfa_brute_force(m):
    d = multiple_of_dfa(m)
    for s in _int_texts():
        expect = re.fullmatch(r"-?(0|[1-9][0-9]*)", s) is not None and int(s) % m == 0
        assert d.accepts(s.encode()) == expect, (m, s)


# ---------------------------------------------------------------------------------------
# every keyword: DFA membership == jsonschema validity on hand-picked instances
# ---------------------------------------------------------------------------------------
KEYWORD_CASES = [
    ({"type": "integer", "minimum": -5, "exclusiveMaximum": 100},
     ["-5", "0", "-0", "99"], ["-6", "100", "5.0", "1e2"]),
    ({"type": "integer", "exclusiveMinimum": 2.5, "maximum": 1000},
     ["3", "1000"], ["2", "1001"]),
    ({"type": "integer", "minimum": 0, "maximum": 0, "exclusiveMaximum": True},
     [], ["0", "1"]),
    ({"type": "integer", "format": "int32"}, ["2147483647", "-2147483648"],
     ["2147483648", "-2147483649"]),
    ({"type": "number", "minimum": 0, "maximum": 1}, ["0", "0.5", "1", "1.000", "0.999"],
     ["-0.01", "1.01", "2", "5e-1"]),
    ({"type": "number", "exclusiveMinimum": -1.5, "exclusiveMaximum": 0},
     ["-1.4999", "-1", "-0.0001"], ["-1.5", "0", "-0", "0.1"]),
    ({"type": "number", "multipleOf": 0.01, "minimum": 0}, ["0", "1.25", "3.1"],
     ["1.255", "-1"]),
    ({"type": "integer", "multipleOf": 7, "minimum": -20, "maximum": 50},
     ["-14", "0", "49"], ["-21", "1", "56", "8"]),
    ({"type": "integer", "multipleOf": 3}, ["-3", "0", "123456789"], ["1", "100"]),
    ({"type": "string", "format": "date"}, ['"2024-02-29"', '"2023-12-31"'],
     ['"2023-02-29"', '"2023-04-31"', '"2023-13-01"', '"23-01-01"']),
    ({"type": "string", "format": "time"}, ['"23:59:59Z"', '"08:00:00.5+02:00"'],
     ['"24:00:00Z"', '"12:00:00"']),
    ({"type": "string", "format": "date-time"}, ['"2024-01-31T12:30:00Z"'],
     ['"2024-01-31 12:30:00Z"', '"2024-02-30T00:00:00Z"']),
    ({"type": "string", "format": "email"}, ['"a.b@example.com"'], ['"a@b"', '"ab.com"']),
    ({"type": "string", "format": "uuid"}, ['"123e4567-e89b-12d3-a456-426614174000"'],
     ['"123e4567e89b12d3a456426614174000"', '"123e4567-e89b-12d3-a456-42661417400"']),
    ({"type": "string", "format": "uri"}, ['"https://x.org/a?b=c#d"', '"urn:isbn:123"'],
     ['"no scheme"', '"/relative"']),
    ({"type": "string", "format": "ipv4"}, ['"192.168.0.1"', '"0.0.0.0"'],
     ['"256.1.1.1"', '"01.2.3.4"', '"1.2.3"']),
    ({"type": "string", "format": "ipv6"}, ['"::1"', '"2001:db8::ff00:42:8329"', '"::"'],
     ['"1:2:3:4:5:6:7:8:9"', '"12345::"', '"1::2::3"']),
    ({"type": "string", "format": "hostname"}, ['"example.com"', '"a-b.c"'],
     ['"-a.com"', '"a..b"']),
    ({"type": "string", "pattern": "^a\"b+$"}, ['"a\\"bb"'], ['"ab"', '"xa\\"b"']),
    ({"type": "string", "pattern": "[0-9]{3}"}, ['"a123b"', '"123"'], ['"12"']),
    ({"type": "string", "pattern": "^(\\\\|/)+$"}, ['"\\\\"', '"\\/"', '"/\\\\"'], ['"a"']),
    ({"type": "string", "pattern": "^$|^x$"}, ['""', '"x"'], ['"y"']),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ['"ab"', '"é\\n"', '"\\u00e9"'[0:0] + '"abc"'],
     ['"a"', '"abcd"']),
    ({"type": "string", "minLength": 1, "pattern": "^[a-z]*$"}, ['"a"'], ['""', '"A"']),
    ({"enum": ["a", 1, None, {"x": [1, 2]}, [True]]},
     ['"a"', "1", "null", '{"x":[1,2]}', "[true]"], ['"b"', "2", "[false]"]),
    ({"const": {"k": "v"}}, ['{"k":"v"}'], ['{"k":"w"}']),
    ({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]},
     ["1", '"x"'], ['"xy"', "true"]),
    ({"oneOf": [{"type": "boolean"}, {"type": "null"}]}, ["true", "null"], ["0"]),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                 "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     ['{"a":1,"b":"x"}'], ['{"a":1}', '{"b":"x"}']),
    ({"$defs": {"pos": {"type": "integer", "minimum": 1}},
      "type": "array", "items": {"$ref": "#/$defs/pos"}}, ["[1,2]", "[]"], ["[0]"]),
    ({"definitions": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"$ref": "#/definitions/node"}},
        "required": ["v"]}}, "$ref": "#/definitions/node"},
     ['{"v":1}', '{"v":1,"next":{"v":2}}'], ['{"next":{"v":2}}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": {"type": "boolean"}},
     ['{"a":1,"c":true}', '{"c":false}', "{}"], ['{"a":1,"c":1}', '{"a":1,"a":true}']),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": False}, ['{"a":1}', "{}"], ['{"a":1,"b":2}']),
    ({"type": "object", "properties": {"a": {}, "b": {}, "c": {}},
      "minProperties": 1, "maxProperties": 2},
     ['{"a":1}', '{"a":1,"c":2}'], ["{}", '{"a":1,"b":2,"c":3}']),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
     ["[1]", "[1,2,3]"], ["[]", "[1,2,3,4]"]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
      "items": False}, ['["a",1]', '["a"]', "[]"], ['["a",1,2]', "[1]"]),
    ({"type": "object", "patternProperties": {"^x-": {"type": "integer"}},
      "additionalProperties": False}, ['{"x-a":1}', "{}"], ['{"y":1}', '{"x-a":"s"}']),
    ({"type": ["string", "null"]}, ['"s"', "null"], ["1"]),
    ({"description": "anything", "x-vendor": 1, "markdownDescription": "m", "id": "x",
      "deprecated": True, "readOnly": True, "$comment": "c", "examples": [1]},
     ["1", '"s"', "[1,{\"a\":null}]", "null"], ["nul", "[1,"]),
    ({"type": "array", "uniqueItems": True, "maxItems": 1}, ["[]", "[1]"], ["[1,2]"]),
]


@pytest.mark.parametrize("schema,good,bad", KEYWORD_CASES,
                         ids=[json.dumps(c[0])[:60] for c in KEYWORD_CASES])
def test_keyword_membership(schema, good, bad):
    d = dfa_of(schema)
    for text in good:
        assert validates(schema, text), f"bad test case: {text} should validate"
        assert d.accepts(text.encode()), (schema, text)
    for text in bad:
        assert not d.accepts(text.encode()), (schema, text)


# ---------------------------------------------------------------------------------------
# same language as outlines-core where the semantics coincide
# ---------------------------------------------------------------------------------------
PLAIN = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                      "c": {"type": "boolean"}}, "required": ["b"]},
    {"type": "object", "properties": {"p": {"type": "number"}, "q": {"type": "null"},
                                      "r": {"type": "array", "items": {"type": "integer"}}}},
    {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1,
     "maxItems": 3},
    {"anyOf": [{"type": "integer"}, {"enum": ["x", "y"]}]},
    {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"],
     "$defs": {"n": {"type": ["string", "null"]}}},
    {"type": "string", "format": "uuid"},
]


@pytest.mark.parametrize("ws", ["", None])
@pytest.mark.parametrize("schema", PLAIN, ids=[json.dumps(s)[:50] for s in PLAIN])
def test_same_language_as_outlines_core(schema, ws):
    from outlines_core.json_schema import build_regex_from_schema
    text = json.dumps(schema)
    theirs = build_regex_from_schema(text, whitespace_pattern=ws) if ws is not None else \
        build_regex_from_schema(text)
    if "uuid" in text:           # outlines-core: lowercase hex only; ours also uppercase
        theirs = theirs.replace("[0-9a-f]", "[0-9a-fA-F]")
    t = minimize(determinize(regex_to_nfa(theirs, re.ASCII)))
    # outlines-core closes objects that declare properties: closed_objects=True
    ours = dfa_of(schema, ws, closed_objects=True, property_order="schema")
    mine = minimize(determinize(regex_to_nfa(
        schema_to_regex(schema, ws, closed_objects=True)[0], re.ASCII)))
    for a, b in ((ours, t), (t, ours), (mine, ours), (ours, mine)):
        assert _difference(a, b).num_states == 0


# ---------------------------------------------------------------------------------------
# GCD random walks on the real vocabulary: everything produced validates
# ---------------------------------------------------------------------------------------
_WALK_PARTS = [
    {"type": "object", "properties": {
        "i": {"type": "integer", "minimum": -20, "exclusiveMaximum": 30, "multipleOf": 3},
        "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5},
        "d": {"type": "string", "format": "date"},
        "u": {"type": "string", "format": "uuid"},
        "ip": {"type": "string", "format": "ipv4"},
        "e": {"enum": ["a\"b", 3, None, {"k": [1]}]},
    }, "required": ["i", "x", "d", "ip", "e"], "additionalProperties": False},
    {"type": "object", "properties": {
        "s": {"type": "string", "minLength": 2, "maxLength": 5},
        "p": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"},
        "t": {"type": "string", "format": "date-time"},
        "h": {"type": "string", "format": "hostname", "maxLength": 20},
        "arr": {"type": "array", "items": {"anyOf": [{"type": "boolean"},
                                                     {"$ref": "#/$defs/small"}]},
                "minItems": 1, "maxItems": 3},
    }, "required": ["s", "p", "t", "arr"], "additionalProperties": {"type": "integer"},
        "maxProperties": 6},
    {"type": "object", "properties": {
        "tree": {"$ref": "#/$defs/tree"},
        "m": {"type": "string", "format": "email", "maxLength": 24},
        "v6": {"type": "string", "format": "ipv6", "maxLength": 16},
        "tm": {"type": "string", "format": "time"},
        "uri": {"type": "string", "format": "uri", "maxLength": 24},
        "any": {"description": "any JSON value"},
    }, "required": ["tree", "m", "v6", "tm", "uri", "any"]},
]
# one schema (one jit of the walks): the parts above as required properties A, B, C
WALK_SCHEMA = {
    "type": "object", "properties": dict(zip("ABC", _WALK_PARTS)), "required": ["A", "B", "C"],
    "$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 9},
              "tree": {"type": "object", "properties": {
                  "v": {"type": "integer"}, "kids": {"type": "array", "maxItems": 2,
                                                    "items": {"$ref": "#/$defs/tree"}}},
                  "required": ["v"]}}}



def walk_texts(fa, vocab, budget, num_walks, seed):
    dev = fa.to_device()
    tables = gcd.backward(dev, budget)
    toks, final = gcd.random_walks(jax.random.PRNGKey(seed), dev, tables, num_walks=num_walks)
    out = []
    for row, f in zip(np.asarray(toks), np.asarray(final)):
        assert vocab.eos_id in row and f == fa.final_state
        m = list(row).index(vocab.eos_id)
        out.append(vocab.decode_bytes(row[:m]).decode("utf-8"))
    return out


def test_gcd_walks_validate(smol_vocab):
    """GCD walks (uniform over the mask, jaxcd.decoding.gcd on device arrays) at a loose budget,
    and host-side walks (mask rows of the tensorized automaton) at the tightest one."""
    schema = WALK_SCHEMA
    fa = compile_json_schema(schema, smol_vocab, whitespace_pattern="")
    # the byte DFA of every form compile_json_schema may choose (order-free objects,
    # recursive $refs one level deeper): a superset of the automaton walked
    import jaxcd.automata.schema_builder as sb
    d = dfa_of(schema, property_order="auto",
               max_depth=sb.DEFAULT_MAX_DEPTH + sb.REF_DEPTH_EXTRA)
    texts = walk_texts(fa, smol_vocab, fa.min_budget + 30, num_walks=32, seed=1)
    rng = np.random.default_rng(2)
    for _ in range(8):                 # tight budget: host masks, same GCD semantics
        s, ids = fa.initial_state, []
        for left in range(fa.min_budget, 0, -1):
            m = unpack_bits(fa.mask_words(s, left), fa.vocab_size)
            tok = int(rng.choice(np.nonzero(m)[0]))
            if tok == smol_vocab.eos_id:
                break
            ids.append(tok)
            s = fa.next_state(s, tok)
        assert tok == smol_vocab.eos_id
        texts.append(smol_vocab.decode_bytes(ids).decode("utf-8"))
    for text in texts:
        assert validates(schema, text), text
        assert d.accepts(text.encode())


# ---------------------------------------------------------------------------------------
# strictness, annotations, errors
# ---------------------------------------------------------------------------------------
def test_strict_refuses_and_non_strict_ignores():
    s = {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "integer"},
         "uniqueItems": True}             # infinite items beside prefixItems
    with pytest.raises(UnsupportedSchemaError, match=r"'uniqueItems' .* at /uniqueItems.*"
                                                     r"strict=False / --no-strict"):
        dfa_of(s)
    assert dfa_of(s, strict=False).accepts(b"[1,1]")
    assert dfa_of(strip_unenforced(s)).accepts(b"[1,1]")
    # unevaluatedItems whose evaluated items depend on a branch: refused by name, and
    # ignored by a strict=False build
    s = {"type": "array", "unevaluatedItems": False,
         "oneOf": [{"anyOf": [{"prefixItems": [{}]}, {"contains": {}}]}, {"minItems": 3}]}
    with pytest.raises(UnsupportedSchemaError, match=r"'unevaluatedItems' .*branch.*"
                                                     r"at /unevaluatedItems"):
        dfa_of(s)
    assert dfa_of(s, strict=False).accepts(b"[1,1]")
    for bad in ({"type": "array", "items": {"type": "object"}, "uniqueItems": True,
                 "minItems": 2},
                {"$ref": "https://example.com/other.json"}):
        with pytest.raises(UnsupportedSchemaError):
            dfa_of(bad)
        dfa_of(bad, strict=False)
        dfa_of(strip_unenforced(bad))
    with pytest.raises(SchemaError, match="does not resolve"):
        dfa_of({"$ref": "#/$defs/missing"})
    with pytest.raises(SchemaError, match="not valid JSON"):
        dfa_of("{nope")


def test_annotations_are_annotations():
    # BFCL's `any`, vendor extensions, draft-04 id, int64 as bounds, float formats
    s = {"type": "object", "properties": {
        "a": {"description": "BFCL any"},
        "b": {"type": "integer", "format": "int64", "x-go-type": "int64"},
        "c": {"type": "number", "format": "double", "markdownDescription": "**c**"},
        "d": {"type": "string", "id": "draft4-id", "deprecated": True, "readOnly": True,
              "writeOnly": False, "title": "t", "default": "x", "$comment": "c"},
    }, "required": ["a", "b", "c", "d"], "$schema": "http://json-schema.org/draft-04/schema#",
        "$id": "urn:x", "fileMatch": ["*.json"]}
    d = dfa_of(s)
    assert d.accepts(b'{"a":[1,{"x":null}],"b":-9223372036854775808,"c":1.5e+3,"d":"s"}')
    assert not d.accepts(b'{"a":1,"b":9223372036854775808,"c":1,"d":"s"}')


@pytest.mark.parametrize("fmt", ["byte", "password", "color", "<app> <your args>"])
def test_formats_without_a_checker_are_annotations(fmt):
    """A format that draft 2020-12 does not define (OpenAPI's ``byte``, vendor formats)
    constrains nothing, as in jsonschema (which has no checker for it): a PEM text is a
    valid ``byte`` string."""
    s = {"type": "string", "format": fmt}
    d = dfa_of(s)
    checker = jsonschema.Draft202012Validator(s, format_checker=jsonschema.FormatChecker())
    for v in ["-----BEGIN CERTIFICATE-----\nMIIDdTCC==\n-----END CERTIFICATE-----", "", "QUJD",
              "#fff", "a b"]:
        assert checker.is_valid(v)
        assert d.accepts(json.dumps(v).encode()), (fmt, v)


def test_recursion_depth_and_limits():
    tree = {"$defs": {"t": {"type": "object", "properties": {"k": {"$ref": "#/$defs/t"}}}},
            "$ref": "#/$defs/t"}
    d1 = dfa_of(tree, max_depth=1)
    d3 = dfa_of(tree, max_depth=3)
    assert d1.accepts(b"{}") and not d1.accepts(b'{"k":{}}')
    assert d3.accepts(b'{"k":{"k":{}}}') and not d3.accepts(b'{"k":{"k":{"k":{}}}}')
    # strict: maxItems over max_count (1000) is tightened to it (then to the item budget)
    d = dfa_of({"type": "array", "items": {"const": 0}, "maxItems": 5000})
    assert d.accepts(b"[" + b",".join([b"0"] * 1000) + b"]")
    assert not d.accepts(b"[" + b",".join([b"0"] * 1001) + b"]")
    with pytest.raises(AutomatonTooLargeError, match=r"minLength 5000 at /minLength"):
        dfa_of({"type": "string", "minLength": 5000})
    # strict: a maxLength over max_count (1000) is tightened to 256 characters
    d = dfa_of({"type": "string", "maxLength": 5000})
    assert d.accepts(b'"' + b"a" * 256 + b'"') and not d.accepts(b'"' + b"a" * 257 + b'"')
    assert dfa_of({"type": "string", "maxLength": 5000}, strict=False).accepts(b'"' + b"a" * 6000 + b'"')


def test_ecma_patterns():
    assert ecma_to_python(r"^[\w-.]+$") == r"^[\w\-.]+$"
    assert ecma_to_python(r"(?<y>\d{4})") == r"(?P<y>\d{4})"
    d = dfa_of({"type": "string", "pattern": r"^[\w-.]+$"})
    assert d.accepts(b'"a-b.c"') and not d.accepts(b'"a b"')
    d = dfa_of({"type": "string", "pattern": r"^\d+$"})      # ECMA \d is ASCII
    assert d.accepts(b'"12"') and not d.accepts('"١٢"'.encode())


def test_cli_strict_flag():
    from jaxcd.cli import build_parser
    p = build_parser()
    assert p.parse_args(["generate", "--schema", "f.json"]).strict is True
    assert p.parse_args(["generate", "--schema", "f.json", "--no-strict"]).strict is False


# ---------------------------------------------------------------------------------------
# fuzzer: small random schemas; compile finishes or raises a clear error, and strings
# sampled from the automaton validate
# ---------------------------------------------------------------------------------------
def sample_strings(d: DFA, rng, n: int, max_len: int = 120) -> list[bytes]:
    """Random accepted strings of a trimmed DFA: uniform live bytes, stopping at an
    accepting state with probability 0.3, heading to the nearest accepting state after
    ``max_len`` bytes."""
    from collections import deque
    Q = d.num_states
    table = d.byte_table()
    # bytes to the nearest accepting state: breadth-first over the reversed transitions
    src, _ = np.nonzero(table >= 0)
    dst = table[table >= 0]
    order = np.argsort(dst, kind="stable")
    preds_of = np.split(src[order], np.searchsorted(dst[order], np.arange(1, Q)))
    dist = np.full(Q, 1 << 30)
    todo = deque(np.flatnonzero(d.accepting).tolist())
    dist[list(todo)] = 0
    while todo:
        q = todo.popleft()
        for p in preds_of[q]:
            if dist[p] > dist[q] + 1:
                dist[p] = dist[q] + 1
                todo.append(p)
    out = []
    for _ in range(n):
        q, buf = 0, bytearray()
        while True:
            live = np.nonzero(table[q] >= 0)[0]
            if d.accepting[q] and (not len(live) or rng.random() < 0.3 or len(buf) > max_len):
                break
            if len(buf) > max_len:
                live = live[dist[table[q][live]] < dist[q]]
            b = int(rng.choice(live))
            buf.append(b)
            q = int(table[q][b])
        out.append(bytes(buf))
    return out


def _leaf():
    return st.one_of(
        st.just({"type": "null"}), st.just({"type": "boolean"}),
        st.builds(lambda lo, w, xl, xh: {"type": "integer", "minimum": lo,
                                         "maximum": lo + w,
                                         **({"exclusiveMinimum": lo} if xl else {}),
                                         **({"exclusiveMaximum": lo + w} if xh else {})},
                  st.integers(-50, 50), st.integers(0, 200), st.booleans(), st.booleans()),
        st.builds(lambda lo, w: {"type": "number", "minimum": lo / 4, "maximum": (lo + w) / 4},
                  st.integers(-20, 20), st.integers(0, 40)),
        st.builds(lambda m: {"type": "integer", "multipleOf": m}, st.integers(1, 12)),
        st.builds(lambda a, b: {"type": "string", "minLength": a, "maxLength": a + b},
                  st.integers(0, 3), st.integers(0, 4)),
        st.sampled_from([{"type": "string", "format": f} for f in
                         ("date", "time", "uuid", "ipv4", "email", "hostname")]),
        st.sampled_from([{"type": "string", "pattern": p} for p in
                         ("^[a-c]+$", "x", "^(ab|c)*$", '^"?$', "[0-9]{2}")]),
        st.lists(st.one_of(st.integers(-3, 3), st.text("ab\"\\é", max_size=3), st.none()),
                 min_size=1, max_size=4).map(lambda v: {"enum": v}),
    )


def _schema():
    return st.recursive(_leaf(), lambda inner: st.one_of(
        st.builds(lambda props, req, addl: {
            "type": "object", "properties": props,
            "required": [k for k, r in zip(props, req) if r],
            **({"additionalProperties": addl} if addl is not None else {})},
            st.dictionaries(st.sampled_from(["a", "b", "c\"", "dé"]), inner, max_size=3),
            st.lists(st.booleans(), min_size=3, max_size=3),
            st.one_of(st.none(), st.just(False), st.just({"type": "integer"}))),
        st.builds(lambda it, lo, w, u: {"type": "array", "items": it, "minItems": lo,
                                        "maxItems": lo + w,
                                        **({"uniqueItems": True} if u else {})},
                  inner, st.integers(0, 2), st.integers(0, 2), st.booleans()),
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: {"anyOf": xs}),
    ), max_leaves=5)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(_schema())
def test_fuzz_schemas(schema):
    try:
        d = dfa_of(schema)
    except JaxcdError as e:
        assert str(e)
        return
    if d.num_states == 0:
        return                      # empty language (e.g. exclusive bounds meeting)
    rng = np.random.default_rng(0)
    for s in sample_strings(d, rng, 8):
        # None: a number the reference cannot judge (multipleOf past 100,000 digits)
        assert validates(schema, s.decode("utf-8")) is not False, (schema, s)


def test_generate_strict_flag():
    """``jaxcd.generate(strict=...)`` is ``compile_json_schema``'s: ``True`` refuses
    ``uniqueItems`` over 21 item values beside ``prefixItems`` (past
    ``MAX_UNIQUE_STATES``), ``False`` ignores it and every output still validates
    against the rest of the schema (``jsonschema``)."""
    import jaxcd
    from jaxcd import generation as G
    model = G.load_model()
    schema = {"type": "object", "additionalProperties": False, "required": ["tags"],
              "properties": {"tags": {"type": "array", "maxItems": 6, "uniqueItems": True,
                                      "prefixItems": [{"type": "integer", "minimum": 0,
                                                       "maximum": 20}],
                                      "items": {"type": "integer", "minimum": 0,
                                                "maximum": 20}}}}
    with pytest.raises(UnsupportedSchemaError, match="uniqueItems"):
        jaxcd.generate("Pick colours.", schema=schema, budget=24, model=model)
    out = jaxcd.generate("Pick colours as JSON.", schema=schema, strict=False, budget=24,
                         num_samples=4, seed=1, model=model, progress=False)
    relaxed = json.loads(json.dumps(schema))
    del relaxed["properties"]["tags"]["uniqueItems"]
    assert all(out.valid)
    for text in out.texts:
        jsonschema.validate(json.loads(text), relaxed)


def test_builder_state_limit_is_compile_limits():
    """The schema builder's state bound is ``CompileLimits.max_nfa_states``: between the
    sizes of the depth-1 and depth-2 expansions of a recursive schema, the depth is
    lowered to 1 (the language loses the deeper nesting); below the depth-1 size,
    ``AutomatonTooLargeError`` names the limit and the subschema."""
    from jaxcd import CompileLimits, Vocabulary
    from jaxcd.automata.schema_builder import SchemaBuilder
    from jaxcd.limits import use_limits
    tree = {"$defs": {"t": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "kids": {"type": "array", "maxItems": 3,
                                                            "items": {"$ref": "#/$defs/t"}}}}},
            "$ref": "#/$defs/t"}
    sizes = {d: SchemaBuilder(tree, max_depth=d).build().size for d in (1, 2)}
    assert sizes[1] < sizes[2]
    assert SchemaBuilder(tree).max_nfa_states == CompileLimits().max_nfa_states
    with use_limits(CompileLimits(max_nfa_states=(sizes[1] + sizes[2]) // 2)):
        b = SchemaBuilder(tree, max_depth=2)
        b.build()
        assert b.depth_used == 1
        assert not dfa_of(tree, max_depth=2).accepts(b'{"kids":[{"kids":[]}]}')
    assert dfa_of(tree, max_depth=2).accepts(b'{"kids":[{"kids":[]}]}')
    vocab = Vocabulary.from_token_bytes([b"<eos>"] + [bytes([c]) for c in range(32, 127)], eos_id=0)
    # below the depth-1 size: free-form values one container deep, the last resort,
    # then the error
    flat = SchemaBuilder(tree, max_depth=1, max_free_depth=1).build().size
    assert flat < sizes[1]
    with use_limits(CompileLimits(max_nfa_states=sizes[1] - 1)):
        b = SchemaBuilder(tree, max_depth=2)
        b.build()
        deep_flat = SchemaBuilder(tree, max_depth=2, max_free_depth=1).build().size
        assert (b.depth_used, b.free_depth_used) == (2 if deep_flat < sizes[1] else 1, 1)
    with pytest.raises(AutomatonTooLargeError) as e:
        compile_json_schema(tree, vocab, limits=CompileLimits(max_nfa_states=flat - 1),
                            property_order="schema")
    assert e.value.limit == "max_nfa_states" and e.value.value == flat - 1
    assert "max_nfa_states" in str(e.value) and "subschema at" in str(e.value)


# ---------------------------------------------------------------------------------------
# decimal multipleOf (0.25, 0.01, 1.5, ...) against jsonschema with exact decimals
# ---------------------------------------------------------------------------------------
def _dfa_accepts(dfa, text: str) -> bool:
    q = dfa.run(text.encode())
    return q >= 0 and bool(dfa.accepting[q])


@pytest.mark.parametrize("step", [0.25, 0.01, 1.5, 0.05, 0.125, 2.5, 0.3])
@pytest.mark.parametrize("bounds", [{}, {"minimum": -3, "exclusiveMaximum": 7.5}])
def test_decimal_multiple_of_equals_jsonschema(step, bounds):
    """Every number text of a sample (multiples, rounded floats, random decimals with
    trailing zeros) is accepted iff jsonschema, reading the schema and the instance as
    exact decimals, says it is valid."""
    import random
    schema = {"type": "number", "multipleOf": step, **bounds}
    nfa, _ = schema_to_nfa(schema, "")
    dfa = minimize(determinize(nfa))
    ref = jsonschema.Draft202012Validator(json.loads(json.dumps(schema), parse_float=Decimal))
    rng = random.Random(hash(step) & 0xFFFF)
    texts = set()
    for _ in range(1500):
        u = rng.random()
        if u < 0.4:
            texts.add(json.dumps(rng.randint(-60, 60) * step))
        elif u < 0.7:
            texts.add(json.dumps(round(rng.uniform(-10, 10), rng.randint(0, 4))))
        else:
            texts.add(f"{rng.randint(-99, 99)}." + "".join(
                rng.choice("0123456789") for _ in range(rng.randint(1, 4))))
    n_valid = 0
    for t in texts:
        want = ref.is_valid(json.loads(t, parse_float=Decimal))
        n_valid += want
        assert _dfa_accepts(dfa, t) == want, (schema, t)
    assert n_valid >= 5


def test_decimal_multiple_of_limit():
    with pytest.raises(UnsupportedSchemaError, match=r"multipleOf 1\.234567e-05.*limit is 100000"):
        compile_json_schema({"type": "number", "multipleOf": 1.234567e-5}, None)


# ---------------------------------------------------------------------------------------
# ^ / $ anchors inside pattern groups, against re.search
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", [r"(^a|b)c", r"x(y$|z)", r"(^|-)ab($|-)", r"((^a)|b)+",
                                     r"(a$)?", r"^(a|^b)c$", r"(^$)", r"a(^b)", r"(a|$)(b|^)",
                                     r"(?:^| )a(?: |$)"])
def test_pattern_inner_anchors_equal_re_search(pattern):
    """Every string of up to 4 characters over a small alphabet (no newline, where
    Python's ``$`` and ECMA's agree): the schema accepts it iff ``re.search`` finds the
    pattern; a string schema compiled end to end agrees on a few."""
    import itertools
    from jaxcd.automata.schema_builder import json_string_content_nfa
    dfa = minimize(determinize(json_string_content_nfa(pattern, True)))
    n = 0
    for k in range(5):
        for t in itertools.product("abcxyz- ", repeat=k):
            s = "".join(t)
            want = re.search(pattern, s, re.ASCII) is not None
            n += want
            assert dfa.accepts(json.dumps(s)[1:-1].encode()) == want, (pattern, s)
    assert n > 0 or pattern == "a(^b)"                     # a(^b) matches nothing
    nfa, _ = schema_to_nfa({"type": "string", "pattern": pattern}, "")
    full = minimize(determinize(nfa))
    for s in ["ac", "bc", "xac", "xy", "xyz", "-ab-", "a", "", "ab"]:
        assert full.accepts(json.dumps(s).encode()) == (re.search(pattern, s) is not None)


def test_pattern_word_boundary_still_refused():
    with pytest.raises(UnsupportedSchemaError, match=r"anchor .* only \^/\\A at the very start"):
        schema_to_nfa({"type": "string", "pattern": r"(a\b)"}, "")


# ---------------------------------------------------------------------------------------
# uniqueItems over a finite, small item language, against jsonschema
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("schema, pool", [
    ({"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
     ["a", "b", "c", "d"]),
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3},
      "uniqueItems": True, "minItems": 2}, [0, 1, 2, 3, 4]),
    ({"type": "array", "items": {"enum": [1, 1.0, True, None, {"x": 1}]}, "uniqueItems": True},
     [1, 1.0, True, None, {"x": 1}, 2]),
    ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "maxItems": 5},
     [True, False]),
])
def test_unique_items_equal_jsonschema(schema, pool):
    """Every array of up to 4 items from ``pool``, in both separator styles: accepted iff
    the schema without ``uniqueItems`` accepts it and jsonschema (with it) finds it valid
    (so exactly the arrays with equal items, 1 == 1.0, are removed)."""
    import itertools
    nfa, _ = schema_to_nfa(schema)
    dfa = minimize(determinize(nfa))
    plain_nfa, _ = schema_to_nfa({k: v for k, v in schema.items() if k != "uniqueItems"})
    plain = minimize(determinize(plain_nfa))
    ref = jsonschema.Draft202012Validator(schema)
    n_dup = n_ok = 0
    for k in range(5):
        for arr in itertools.product(pool, repeat=k):
            for sep in (None, (",", ":")):
                t = json.dumps(list(arr), separators=sep).encode()
                want = plain.accepts(t) and ref.is_valid(list(arr))
                n_ok += want
                n_dup += plain.accepts(t) and not ref.is_valid(list(arr))
                assert dfa.accepts(t) == want, (schema, t)
    assert n_ok > 5 and n_dup > 5


@pytest.mark.parametrize("items, limit", [
    ({"prefixItems": [{"type": "string"}], "items": {"type": "string"}},
     "MAX_UNIQUE_SPELLINGS.*beside prefixItems"),
    ({"prefixItems": [{"type": "integer", "minimum": 0, "maximum": 20}],
      "items": {"type": "integer", "minimum": 0, "maximum": 20}},
     r"21\) make more than 4096 sets.*beside prefixItems"),
    ({"items": {"type": "object"}, "minItems": 2}, "sort key.*no 2 items have different keys")])
def test_unique_items_limits(items, limit):
    schema = {"type": "array", **items, "uniqueItems": True}
    with pytest.raises(UnsupportedSchemaError, match=rf"uniqueItems.*{limit}.*at /uniqueItems"):
        schema_to_nfa(schema)
    schema_to_nfa(schema, strict=False)                   # ignored knowingly


def _keys():
    return st.sampled_from(["a", "b", "k"])


def _combinator_schema():
    """Object and array keywords with the product ones (not, oneOf, if/then/else),
    presence tests, dependencies, propertyNames, patternProperties, contains and
    uniqueItems."""
    leaf = st.one_of(
        _leaf(),
        st.lists(_keys(), min_size=1, max_size=2, unique=True).map(
            lambda r: {"required": r}),
        st.just({}),
    )

    def grow(inner):
        return st.one_of(
            st.builds(lambda props, req, addl, names: {
                "type": "object", "properties": props, "required": req,
                **({"additionalProperties": addl} if addl is not None else {}),
                **({"propertyNames": names} if names is not None else {})},
                st.dictionaries(_keys(), inner, max_size=2),
                st.lists(_keys(), max_size=2, unique=True),
                st.one_of(st.none(), st.just(False), st.just({"type": "integer"})),
                st.one_of(st.none(), st.just({"pattern": "^[ab]$"}),
                          st.just({"enum": ["a", "k"]}))),
            st.builds(lambda pat, sub, n: {"type": "object", "patternProperties": {pat: sub},
                                           "additionalProperties": False,
                                           "minProperties": n},
                      st.sampled_from(["^a", "^[bk]$", "b"]), inner, st.integers(0, 1)),
            st.builds(lambda it, c, lo, hi, u: {
                "type": "array", "items": it, "contains": c, "minContains": lo,
                **({"maxContains": hi} if hi is not None else {}),
                **({"uniqueItems": True} if u else {})},
                      inner, inner, st.integers(0, 2), st.one_of(st.none(), st.integers(1, 2)),
                      st.booleans()),
            st.builds(lambda x: {"not": x}, inner),
            st.lists(inner, min_size=2, max_size=3).map(lambda xs: {"oneOf": xs}),
            st.builds(lambda c, t, e: {"if": c, "then": t, "else": e}, inner, inner, inner),
            st.builds(lambda k, r: {"type": "object", "dependentRequired": {k: r}},
                      _keys(), st.lists(_keys(), min_size=1, max_size=2, unique=True)),
            st.lists(inner, min_size=1, max_size=2).map(lambda xs: {"allOf": xs}),
        )
    return st.recursive(leaf, grow, max_leaves=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(_combinator_schema())
def test_fuzz_combinator_schemas(schema):
    # soundness of the products, presence tests, contains and propertyNames:
    # every sampled string of the automaton validates
    try:
        d = dfa_of(schema, max_depth=2)
    except JaxcdError as e:
        assert str(e)
        return
    assert_sound(schema, d)


def assert_sound(schema, d: DFA) -> None:
    """Every sampled string of ``d`` validates against ``schema``, and so does every
    value of the products tests' universe that ``d`` accepts."""
    if d.num_states == 0:
        return
    rng = np.random.default_rng(0)
    for s in sample_strings(d, rng, 8):
        # None: a number the reference cannot judge (multipleOf past 100,000 digits)
        assert validates(schema, s.decode("utf-8")) is not False, (schema, s)
    # and every accepted value of a fixed universe (formats are assertions here, which
    # the jsonschema oracle does not check: left out)
    if '"format"' not in json.dumps(schema):
        from test_json_schema_products import UNIVERSE, _texts
        oracle = jsonschema.Draft202012Validator(schema)
        for v in UNIVERSE:
            if d.accepts(_texts(v).encode()):
                assert oracle.is_valid(v), (schema, v)


_NON_JSON = (float("nan"), float("inf"), float("-inf"))


def test_nan_and_infinity_are_refused_by_pointer():
    # Python's json reads and writes NaN/Infinity; JSON has neither: an enum of NaN would
    # otherwise accept the text `NaN` (not JSON), a bound of Infinity crashed the builder
    for x in _NON_JSON:
        for schema, where in [({"enum": [1, x]}, "/enum/1"), ({"const": x}, "/const"),
                              ({"type": "number", "minimum": x}, "/minimum"),
                              ({"maximum": x}, "/maximum"),
                              ({"exclusiveMinimum": x}, "/exclusiveMinimum"),
                              ({"multipleOf": x}, "/multipleOf"),
                              ({"maxLength": x}, "/maxLength"),
                              ({"properties": {"a": {"items": {"const": [x]}}}},
                               "/properties/a/items/const/0"),
                              ({"$defs": {"d": {"default": x}}, "$ref": "#/$defs/d"},
                               "/$defs/d/default")]:
            with pytest.raises(SchemaError, match=f"{re.escape(where)} is .*not a JSON number"):
                schema_to_nfa(schema)
    for text in ('{"enum": [NaN, 2]}', '{"const": Infinity}', '{"minimum": -Infinity}'):
        with pytest.raises(SchemaError, match="not a JSON number"):
            schema_to_nfa(text)
    with pytest.raises(SchemaError, match="not a JSON number"):
        compile_json_schema({"enum": [float("nan")]}, None)     # before the vocabulary


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3),
                       st.floats(allow_nan=True, allow_infinity=True),
                       st.sampled_from(_NON_JSON))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.recursive(_json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=8), st.sampled_from(["enum", "const", "default"]))
def test_non_json_numbers_refused_exactly_when_json_refuses_them(value, keyword):
    # reference: the standard library's JSON compliance check (allow_nan=False)
    schema = {keyword: [value] if keyword == "enum" else value}
    try:
        json.dumps(schema, allow_nan=False)
        compliant = True
    except ValueError:
        compliant = False
    try:
        nfa, _ = schema_to_nfa(schema)
    except SchemaError as e:
        assert not compliant and "not a JSON number" in str(e)
        return
    assert compliant
    if keyword != "default":
        # and the automaton accepts the value's own JSON text (enum/const values are
        # spelled compactly)
        d = minimize(determinize(nfa))
        assert d.accepts(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
