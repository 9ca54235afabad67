"""patternProperties that overlap each other or a declared property: a key matching
several patterns, or a declared name matching a pattern, must satisfy every schema that
applies to it (JSON Schema applies ``properties`` and all matching
``patternProperties``; ``additionalProperties`` only to keys matching none).
Checked against ``jsonschema`` on every object of a small universe (keys x values, up
to two keys, both orders), for random schemas: no invalid object accepted, and every
valid one accepted where the property order plays no part."""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import pytest

from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa

KEYS = ["a", "ab", "b", "ba", "x", "bab"]
VALUES = [0, 4, 7, 2.5, "s", True, None]
PATTERNS = ["^a", "b", "a$", "^b.*a", "x|ab", "^.$"]
SUBS = [True, False, {"type": "integer"}, {"minimum": 3}, {"type": "string"},
        {"maximum": 5}, {"type": ["integer", "string"]}, {"enum": [0, "s", None]}]


def _universe():
    out = [{}]
    for k in KEYS:
        out += [{k: v} for v in VALUES]
    for k1, k2 in itertools.permutations(KEYS, 2):
        for v1 in (0, 4, "s", 7):
            for v2 in (0, 7, "s"):
                out.append({k1: v1, k2: v2})
    return out


UNIVERSE = _universe()


def _check(schema, order="auto"):
    d = minimize(determinize(schema_to_nfa(schema, whitespace_pattern="",
                                           property_order=order)[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    for inst in UNIVERSE:
        text = json.dumps(inst, separators=(",", ":"))
        got, want = d.accepts(text.encode()), oracle.is_valid(inst)
        assert not (got and not want), (schema, text)          # never an invalid one
        if len(inst) <= 1 or order == "auto" and "additionalProperties" not in schema:
            # exact where no property order is involved (one key, or declared and
            # pattern keys in any order)
            assert got == want, (schema, text)


def test_overlapping_patterns_and_declared_names():
    # the MaskBench case (Synthesized ... patternProperties_id21_subschema1_not_2)
    _check({"allOf": [{"enum": [{"foobar": 1}]},
                      {"not": {"patternProperties": {"b.*": False, "f.*": True}}}]})
    _check({"patternProperties": {"b": {"type": "integer"}, "a": {"minimum": 3}}})
    _check({"properties": {"ab": {"type": "integer"}},
            "patternProperties": {"a": {"type": "string"}}})
    _check({"properties": {"ab": {"type": ["integer", "string"]}}, "required": ["ba"],
            "patternProperties": {"b": {"minimum": 3}, "^b": {"maximum": 5}},
            "additionalProperties": {"type": "string"}})


@pytest.mark.parametrize("seed", range(12))
def test_random_patterns_against_jsonschema(seed):
    rng = random.Random(seed)
    for _ in range(3):
        schema: dict = {"type": "object"}
        pats = rng.sample(PATTERNS, rng.randint(1, 3))
        schema["patternProperties"] = {p: rng.choice(SUBS) for p in pats}
        if rng.random() < 0.6:
            names = rng.sample(KEYS, rng.randint(1, 2))
            schema["properties"] = {k: rng.choice(SUBS) for k in names}
            if rng.random() < 0.5:
                schema["required"] = rng.sample(KEYS, 1)
        if rng.random() < 0.5:
            schema["additionalProperties"] = rng.choice(SUBS)
        _check(schema, rng.choice(["auto", "schema"]))


# ---------------------------------------------------------------------------------------
# look-ahead at the start of an anchored pattern: R intersected with / less X.*
# ---------------------------------------------------------------------------------------
LOOKAHEAD = ["^(?!io\\.papermc\\.)[a-z.]+$", "^(?!ab)", "^(?=a)(?!ab).*b$",
             "^(?!a|b$)..?|c", "^(?!.*a$)[ab]+", "^(?=.*a)(?=.*b)",
             "^(?!(a|b)$)[abc]*$", "^(?![ab]*c)", "^(?!a$)(?:a|b)$",
             "^(?!.*\\.\\.)[a-c.]+$", "^(?=(a|bc))", "^(?!\\.)(?=.*c)[^b]{1,3}"]


@pytest.mark.parametrize("pattern", LOOKAHEAD)
def test_lookahead_patterns_against_re(pattern):
    """Every text over a small alphabet (a, b, c, ., ", é) up to 5 characters: the
    JSON string content is accepted iff ``re.search`` (jsonschema's pattern test)
    finds the pattern in the decoded text."""
    import re
    from jaxcd.automata.schema_builder import json_string_content_nfa
    d = minimize(determinize(json_string_content_nfa(pattern, True)))
    n = 0
    for k in range(6):
        for t in itertools.product('abc."é', repeat=k):
            s = "".join(t)
            want = re.search(pattern, s) is not None
            assert d.accepts(json.dumps(s, ensure_ascii=False)[1:-1].encode()) == want, s
            n += want
    assert n > 0


def test_lookahead_in_a_schema_against_jsonschema():
    """``pattern`` and ``patternProperties`` with a negative look-ahead, by
    ``jsonschema`` on a universe of strings and one-key objects."""
    schema = {"type": "object",
              "properties": {"id": {"type": "string", "pattern": "^(?!io\\.)[a-z.]+$"}},
              "patternProperties": {"^(?!x)": {"type": "integer"}},
              "additionalProperties": False}
    d = minimize(determinize(schema_to_nfa(schema, "")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    texts = ["io.x", "io", "ia.b", "", "a.io.", "IO.x", "i.o"]
    n = 0
    for t in texts:
        for inst in ({"id": t}, {t: 1}, {t: "s"}, {"id": t, "xa": 1}):
            want = oracle.is_valid(inst)
            assert d.accepts(json.dumps(inst, separators=(",", ":")).encode()) == want, inst
            n += want
    assert n > 4


@pytest.mark.parametrize("pattern, what", [("(?!a)b", "anchored with \\^"),
                                           ("^a(?!b)", "at the start"),
                                           ("^(?<=a)b", "look-behind")])
def test_lookahead_elsewhere_is_refused(pattern, what):
    from jaxcd.errors import UnsupportedSchemaError
    with pytest.raises((UnsupportedSchemaError, ValueError), match=what):
        schema_to_nfa({"type": "string", "pattern": pattern}, "")


_CLASS_CHARS = ["1", "٣", "a", "é", "ǅ", "_", "-", " ", "\u00a0", "\u2003", "K", "\t", "\n"]


@pytest.mark.parametrize("pat", [r"^\d+$", r"^\w+$", r"^\s$", r"^\D$", r"^[\w-]+$", r"^\W+$",
                                 r"\d", r"^[^\d]$", r"^\S\s?$", r"^[a-z\d]+$", r"^.+$",
                                 r"a$", r"^(?!1$)[^K]+$", r"^(?!\d)\w+$", r"(a$|1)\s",
                                 r"^$|(^(?:\S+\s+){0,99}\S+$)"])
def test_pattern_readings_against_jsonschema(pat):
    """A pattern has two readings: ECMA-262's (ASCII ``\\d \\w \\s``, ``$`` only at the
    end) and Python ``re``'s, jsonschema's (Unicode classes, ``$`` also before a final
    newline). A string a pattern constrains must match in both; a subtracted pattern
    (``not``, ``oneOf``'s other branches) takes a string either reading matches; a key
    that the readings route to different schemas is not generated. Brute force over
    strings and keys of one and two characters against jsonschema: nothing invalid is
    accepted, and strings both readings agree on (ASCII, no newline) are exact, except
    for a ``$`` inside a group where either reading is taken (as no assertion there)."""
    from test_json_schema import dfa_of, validates

    # (a $ inside a group: the "either" reading takes it as no assertion; the last
    # pattern also takes the readings' fallback: the characters they class alike)
    inner_dollar = pat in (r"(a$|1)\s", r"^$|(^(?:\S+\s+){0,99}\S+$)")

    def wrap_str(s):
        return json.dumps(s, ensure_ascii=False)

    keyed = {"patternProperties": {pat: {"type": "integer"}},
             "additionalProperties": {"type": "string"}}
    cases = [({"type": "string", "pattern": pat}, [wrap_str]),
             ({"not": {"type": "string", "pattern": pat}}, [wrap_str]),
             ({"oneOf": [{"type": "string"}, {"type": "string", "pattern": pat}]}, [wrap_str]),
             (keyed, [lambda s: "{%s:1}" % wrap_str(s), lambda s: '{%s:"v"}' % wrap_str(s)]),
             ({"not": keyed}, [lambda s: "{%s:1}" % wrap_str(s)])]
    for schema, spell in cases:
        d = dfa_of(schema)
        exact = not inner_dollar or schema is cases[0][0]
        agree = 0
        for n in (1, 2):
            for chars in itertools.product(_CLASS_CHARS, repeat=n):
                s = "".join(chars)
                for f in spell:
                    text = f(s)
                    got, want = d.accepts(text.encode()), validates(schema, text)
                    assert want or not got, (schema, text)
                    if s.isascii() and "\n" not in s and exact:
                        agree += 1
                        assert got == want, (schema, text)
        assert agree > 0 or not exact


@pytest.mark.parametrize("schema", [
    {"type": "object", "patternProperties": {"": {"type": "integer"}},
     "additionalProperties": False},
    {"type": "object", "patternProperties": {"": {"type": "integer"}},
     "additionalProperties": {"minimum": 3}},
    {"type": "object", "properties": {"a": {"type": "string"}},
     "patternProperties": {"": {"minLength": 1}}, "additionalProperties": {"maximum": 4}},
    {"not": {"type": "object", "patternProperties": {"": {"type": "integer"}},
             "additionalProperties": {"minimum": 3}}}])
def test_empty_pattern_beside_additional_properties(schema):
    """The empty pattern matches every key, so by the specification
    ``additionalProperties`` applies to none; jsonschema joins the patterns with ``|``
    to find additional keys, and an empty join makes every key additional. jaxcd
    applies both schemas to every key (valid both ways): nothing jsonschema refuses is
    accepted, on the small universe."""
    d = minimize(determinize(schema_to_nfa(schema, whitespace_pattern="")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    taken = 0
    for inst in UNIVERSE + [{"k": 5}, {"a": "s", "b": 4}, {"a": "", "b": 9}]:
        text = json.dumps(inst, separators=(",", ":"))
        got = d.accepts(text.encode())
        assert oracle.is_valid(inst) or not got, (schema, text)
        taken += got
    assert taken > 0
