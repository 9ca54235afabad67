"""The loose form of ``property_order="auto"`` with repeated keys on
(``compile_json_schema``'s default, ``SchemaBuilder.auto_loose``): an object takes its
declared properties in any order, each any number of times (the required ones at least
once), extra properties anywhere. It is tried first, within the budget (its language
contains every exact form's); the exact forms follow where it is not allowed.

Checked by brute force against ``jsonschema`` on every ordered selection of keys (with
repeats) from a small pool of values: an accepted text must be valid **whichever
occurrence of a repeated key a parser keeps** (every choice is validated), and every
valid text without a repeated key must be accepted. Inside automaton products
(``oneOf``, ``not``) and under ``minProperties`` the form is not used: there a repeated
key could make an invalid instance pass (the counter-examples below).
"""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import pytest

from ascii_vocab import VOCAB, accepts
from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.schema_builder import SchemaBuilder, to_nfa

POOL = [1, "s", None, 7]
TYPES = ["integer", "string", "null"]


def _dfa(schema, **budget):
    b = SchemaBuilder(schema, whitespace="", property_order="auto", **budget)
    node = b.build()
    return node, minimize(determinize(to_nfa(node, "")))


def _text(pairs) -> bytes:
    return ("{" + ",".join(json.dumps(k) + ":" + json.dumps(v) for k, v in pairs)
            + "}").encode().replace(b": ", b":")


def _parses(pairs):
    """Every object a parser may make of ``pairs``: one occurrence of each key kept."""
    by_key: dict = {}
    for k, v in pairs:
        by_key.setdefault(k, []).append(v)
    keys = list(by_key)
    for choice in itertools.product(*(by_key[k] for k in keys)):
        yield dict(zip(keys, choice))


def _universe(keys, max_len, rng, samples=4000):
    """Key sequences of up to ``max_len`` members (repeats allowed) with pool values: all
    of them when few, else a seeded sample plus every permutation without repeats."""
    out = []
    for r in range(len(keys) + 1):
        for perm in itertools.permutations(keys, r):
            for vals in itertools.product([1, "s"], repeat=r):
                out.append(list(zip(perm, vals)))
    for _ in range(samples):
        n = rng.randint(1, max_len)
        out.append([(rng.choice(keys), rng.choice(POOL)) for _ in range(n)])
    return out


def _wide_object(rng, n, required):
    names = [chr(ord("a") + i) for i in range(n)]
    s = {"type": "object", "properties": {k: {"type": rng.choice(TYPES)} for k in names}}
    if required:
        s["required"] = rng.sample(names, required)
    if rng.random() < 0.5:
        s["additionalProperties"] = rng.choice([False, {"type": "integer"}])
    return s


@pytest.mark.parametrize("seed", range(6))
def test_loose_form_is_sound_and_takes_any_order(seed):
    """A small object, within every budget: the loose form comes first. Sound under
    every parse of a repeated key, complete for texts without repeats in any order
    (extra keys anywhere), and it does accept some repeats (it is the loose form, not
    another)."""
    rng = random.Random(seed)
    schema = _wide_object(rng, 4, required=seed % 3)
    node = SchemaBuilder(schema, whitespace="", property_order="auto").build()
    assert node.kind == "objany" and node.args[4], (schema, node.kind)
    d = minimize(determinize(to_nfa(node, "")))
    oracle = jsonschema.Draft202012Validator(schema)
    keys = list(schema["properties"]) + ["z"]
    accepted_repeat = 0
    for pairs in _universe(keys, 6, rng):
        got = d.accepts(_text(pairs))
        repeats = len({k for k, _ in pairs}) < len(pairs)
        if got:
            for obj in _parses(pairs):
                assert oracle.is_valid(obj), (schema, pairs, obj)
            accepted_repeat += repeats
        elif not repeats:
            assert not oracle.is_valid(dict(pairs)), (schema, pairs)
    assert accepted_repeat > 0


def test_loose_form_counts_max_properties_and_skips_min_properties():
    """``maxProperties`` counts occurrences (never fewer than the keys: sound);
    ``minProperties`` above the required count would count a repeated key twice, so the
    object keeps an exact form."""
    props = {k: {"type": "integer"} for k in "abcd"}
    schema = {"type": "object", "properties": props, "maxProperties": 2}
    node, d = _dfa(schema, auto_states=1, auto_root=0)
    assert node.kind == "objany"
    assert d.accepts(b'{"d":1,"a":2}') and d.accepts(b'{"a":1,"a":2}')
    assert not d.accepts(b'{"a":1,"b":2,"c":3}') and not d.accepts(b'{"a":1,"a":2,"a":3}')
    node, d = _dfa({**schema, "minProperties": 2}, auto_states=1, auto_root=0)
    assert node.kind != "objany"
    assert not d.accepts(b'{"a":1,"a":2}')


def test_loose_form_not_inside_products():
    """Under ``oneOf`` a repeated key would defeat the subtraction: with
    ``{"a":1,"a":7}`` in the first branch's language and outside the second's, a parser
    keeping 7 gets an object valid for both branches. Such objects keep an exact form
    (no repeated key), so the text is refused."""
    wide = {k: {"type": "integer"} for k in "abcde"}
    schema = {"oneOf": [{"type": "object", "properties": wide},
                        {"type": "object", "properties": {**wide, "a": {"const": 7}}}]}
    _, d = _dfa(schema, auto_states=1, auto_root=0)
    oracle = jsonschema.Draft202012Validator(schema)
    assert not oracle.is_valid({"a": 7})
    assert not d.accepts(b'{"a":1,"a":7}') and not d.accepts(b'{"a":7}')
    assert d.accepts(b'{"a":1}')


def test_loose_form_can_be_switched_off():
    """``auto_loose=False`` (``AUTO_LOOSE``): past the exact forms, the schema's order."""
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"}}
    node, d = _dfa(schema, auto_states=0, auto_root=0, auto_total=0, auto_loose=False)
    assert node.kind == "obj"
    assert d.accepts(b'{"a":1,"b":2}') and not d.accepts(b'{"b":2,"a":1}')


def test_dfa_cap_fallback_keeps_loose_objects_without_required(monkeypatch):
    """compile_json_schema: past AUTO_DFA_CAP the schema is compiled again in the
    schema's order, except that objects without required properties keep the loose
    form (no larger than their chain); an object with required ones keeps the schema's
    order. Checked against jsonschema on every key order of both objects."""
    import jaxcd.automata.json_schema as js
    import jaxcd.automata.schema_builder as sb
    from jaxcd import compile_json_schema

    opt = {"type": "object", "properties": {k: {"type": "integer"} for k in "abc"},
           "additionalProperties": False}
    req = {"type": "object", "properties": {k: {"type": "integer"} for k in "xyz"},
           "required": ["x", "y", "z"], "additionalProperties": False}
    schema = {"type": "object", "properties": {"o": opt, "r": req}, "required": ["o", "r"],
              "additionalProperties": False}
    vocab = VOCAB
    monkeypatch.setattr(js, "AUTO_DFA_CAP", 5)
    monkeypatch.setattr(sb, "AUTO_REFUSE_TREE", 10**9)
    monkeypatch.setattr(sb, "AUTO_REFUSE_NFA", 10**9)
    capped = compile_json_schema(schema, vocab)
    oracle = jsonschema.Draft202012Validator(schema)
    for po in itertools.permutations("abc", 2):
        for pr in itertools.permutations("xyz"):
            inst = {"o": {k: 1 for k in po}, "r": {k: 1 for k in pr}}
            text = json.dumps(inst, separators=(",", ":"))
            assert oracle.is_valid(inst)
            assert accepts(capped, text) == (pr == tuple("xyz")), text
    assert accepts(capped, '{"o":{"b":1,"b":2},"r":{"x":1,"y":1,"z":1}}')
    assert not accepts(capped, '{"o":{},"r":{"x":1,"y":1,"z":1,"x":1}}')
    assert not accepts(capped, '{"r":{"x":1,"y":1,"z":1},"o":{}}')
    monkeypatch.setattr(sb, "AUTO_LOOSE", False)
    fixed = compile_json_schema(schema, vocab)
    assert not accepts(fixed, '{"o":{"b":1,"a":1},"r":{"x":1,"y":1,"z":1}}')
    assert accepts(fixed, '{"o":{"a":1,"b":1},"r":{"x":1,"y":1,"z":1}}')


def test_loose_order_is_not_a_public_option():
    from jaxcd import compile_json_schema
    vocab = VOCAB
    with pytest.raises(ValueError, match="property_order must be one of"):
        compile_json_schema({"type": "object"}, vocab, property_order="loose")


def test_generation_never_repeats_a_key():
    """``compile_json_schema`` (validation, ``repeated_keys=True``) accepts a repeated key
    with valid values; ``build_constraint`` (generation) and ``repeated_keys=False``
    build an exact form instead: any order, no repeated key."""
    from jaxcd import compile_json_schema
    from jaxcd.generation import build_constraint

    vocab = VOCAB
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abc"}}
    loose = compile_json_schema(schema, vocab)
    assert accepts(loose, '{"b":1,"a":2,"b":3}') and accepts(loose, '{"c":1,"a":2}')
    for fa in (compile_json_schema(schema, vocab, repeated_keys=False),
               build_constraint(vocab, schema=schema, closed_objects=False)):
        assert not accepts(fa, '{"b":1,"a":2,"b":3}') and not accepts(fa, '{"a":1,"a":2}')
        assert accepts(fa, '{"a":1,"c":2}') and accepts(fa, '{"c":1,"a":2}')


_KEYWORD_CASES = [
    {"dependentRequired": {"a": ["b"]}, "properties": {"c": {}}},
    {"dependentSchemas": {"a": {"required": ["c"]}}},
    {"propertyNames": {"maxLength": 1}, "maxProperties": 2},
    {"patternProperties": {"^[ab]$": {"type": ["integer", "string"]}},
     "additionalProperties": False},
    {"unevaluatedProperties": False},
    {"required": ["a"], "if": {"required": ["b"]}, "then": {"properties": {"a": {"const": 1}}}},
    {"allOf": [{"properties": {"a": {"type": "integer"}}},
               {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    {"minProperties": 1, "required": ["a"]},
    {"not": {"required": ["a", "b"]}},
    {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
]


@pytest.mark.parametrize("extra", _KEYWORD_CASES, ids=lambda s: ",".join(s))
def test_default_build_sound_beside_object_keywords(extra):
    """compile_json_schema's default build (the loose form first) beside the object
    keywords that count, name or test keys: every accepted text of up to 4 members (keys
    a, b, c with repeats, values from a pool) is valid under every parse of its repeated
    keys, and every valid text without a repeat is accepted."""
    from jaxcd.automata.json_schema import schema_to_nfa

    schema = {"type": "object", "properties": {"a": {"type": "integer"},
                                               "b": {"type": "string"}}}
    for k, v in extra.items():
        schema[k] = {**schema[k], **v} if k == "properties" else v
    d = minimize(determinize(schema_to_nfa(schema, "", property_order="auto")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    accepted = repeats = 0
    for n in range(5):
        for keys in itertools.product("abc", repeat=n):
            for vals in itertools.product([1, "s", None], repeat=n):
                pairs = list(zip(keys, vals))
                rep = len(set(keys)) < n
                if d.accepts(_text(pairs)):
                    accepted += 1
                    repeats += rep
                    for obj in _parses(pairs):
                        assert oracle.is_valid(obj), (schema, pairs, obj)
                elif not rep:
                    assert not oracle.is_valid(dict(pairs)), (schema, pairs)
    assert accepted > 0
