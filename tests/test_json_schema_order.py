"""Property order (issue 22): ``property_order="auto"`` (the default of
``compile_json_schema``), ``"schema"`` and ``"any"``, checked by
brute force against independent references:

- ``jsonschema`` decides validity of every instance of a small enumeration (each subset
  of the keys in every order, values from a small pool, plus texts that repeat a key);
- the order rule is restated here independently of the builder: under ``"auto"`` an
  object within the budget takes its declared properties in any order, and past it the
  required ones in any order with the optional ones in the schema's order between them;
- no text that repeats a declared key is ever accepted (generation must not write
  ``{"a":1,"a":2}``).

These are the exact forms, built with ``repeated_keys=False`` (what generation passes);
the loose form that ``repeated_keys=True`` builds first is checked in
``test_json_schema_loose_order.py``.

Seeded random schemas; the whole file takes a few seconds.
"""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import numpy as np
import pytest

import jaxcd.automata.schema_builder as sb

from ascii_vocab import VOCAB, accepts
from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa
from jaxcd.automata.schema_builder import SchemaBuilder, to_nfa

VALUES = {"integer": [1, "s"], "string": ["s", None], "null": [None, 1]}
POOL = [1, "s", None]


def _dfa(schema, **kw):
    kw.setdefault("property_order", "auto")        # compile_json_schema's default
    kw.setdefault("repeated_keys", False)          # the exact forms (generation's)
    return minimize(determinize(schema_to_nfa(schema, "", **kw)[0]))


def _text(pairs) -> bytes:
    return ("{" + ",".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":"))
                           for k, v in pairs) + "}").encode()


def _instances(props, extra_key="z", dup_samples=30, rng=None):
    """(pairs, has_duplicate) for every ordered subset of the keys (+ an extra key) with
    one value of the declared type and one of another type each, and a sample of texts
    that repeat a key."""
    ks = list(props) + [extra_key]
    pool = {k: VALUES[props[k]["type"]] if k in props else [1, None] for k in ks}
    out = []
    for r in range(len(ks) + 1):
        for perm in itertools.permutations(ks, r):
            for vals in itertools.product(*(pool[k] for k in perm)):
                out.append((list(zip(perm, vals)), False))
    rng = rng or random.Random(0)
    for _ in range(dup_samples):
        # a declared key twice (an extra key may repeat: its language is infinite, so
        # no automaton tracks it; the schema order does the same)
        k = rng.choice(list(props))
        rest = rng.sample(ks, rng.randint(0, len(ks) - 1))
        seq = rest + [k, k] if k not in rest else rest + [k]
        rng.shuffle(seq)
        out.append(([(x, rng.choice(POOL)) for x in seq], True))
    return out


def _random_object(rng, n):
    names = [chr(ord("a") + i) for i in range(n)]
    props = {k: {"type": rng.choice(list(VALUES))} for k in names}
    req = [k for k in names if rng.random() < 0.5]
    s = {"type": "object", "properties": props}
    if req:
        s["required"] = req
    if rng.random() < 0.4:
        s["additionalProperties"] = False
    return s


def _form(schema, **budget):
    """(tracked property names, extra keys anywhere?) of the top object as built, or
    (set(), False) for the schema's order."""
    b = SchemaBuilder(schema, whitespace="", property_order="auto", auto_loose=False, **budget)
    node = b.build()
    names = list(schema.get("properties", {}))
    if node.kind != "objmix":
        return set(), False
    return {k for k, f in zip(names, node.args[4]) if f}, node.args[5]


def _order_ok(schema, keys, tracked, anywhere) -> bool:
    """The order rule restated: declared properties that are not tracked keep the
    schema's order among themselves; unless extra keys may come anywhere, they come
    after every declared key, or (the document's object with a required property,
    extra values scalars here) before every one."""
    declared = list(schema.get("properties", {}))
    chain = [k for k in declared if k not in tracked]
    seen = [k for k in keys if k in chain]
    if seen != sorted(seen, key=chain.index):
        return False
    if not anywhere:
        pos = [i for i, k in enumerate(keys) if k in declared]
        ext = [i for i, k in enumerate(keys) if k not in declared]
        if pos and any(min(pos) < e < max(pos) for e in ext):
            return False
        if pos and ext and min(ext) < min(pos) and not schema.get("required"):
            return False
    return True


@pytest.mark.parametrize("seed", range(8))
def test_auto_order_brute_force_against_jsonschema(seed):
    """Objects of 1-4 properties: exactly the valid instances without a repeated key
    that follow the order rule of the form built; objects this small track every
    declared property (any order)."""
    rng = random.Random(seed)
    schema = _random_object(rng, rng.randint(1, 4))
    tracked, anywhere = _form(schema)
    if len(schema["properties"]) > 1:
        assert tracked == set(schema["properties"]), schema
    d = _dfa(schema)                                   # "auto"
    fixed = _dfa(schema, property_order="schema")
    oracle = jsonschema.Draft202012Validator(schema)
    n_valid = 0
    for pairs, dup in _instances(schema["properties"], rng=rng):
        keys = [k for k, _ in pairs]
        got = d.accepts(_text(pairs))
        want = (not dup and oracle.is_valid(dict(pairs))
                and _order_ok(schema, keys, tracked, anywhere))
        assert got == want, (schema, pairs)
        n_valid += want
        if fixed.accepts(_text(pairs)):                # schema order: a subset of auto
            assert got, (schema, pairs)
    assert n_valid > 0


@pytest.mark.parametrize("seed", range(4))
def test_auto_order_past_budget_keeps_optional_in_schema_order(seed):
    """A small budget forces the mixed form: required properties in any order, optional
    ones in the schema's order among themselves; still sound and no repeated key."""
    rng = random.Random(100 + seed)
    schema = _random_object(rng, 4)
    schema["required"] = ["a", "c"]
    # the smallest budget that takes the mixed form: it exists, below the budget of
    # the full any-order form
    budget = next({"auto_states": n, "auto_root": 0} for n in range(0, 5000, 10)
                  if _form(schema, auto_states=n, auto_root=0)[0])
    tracked, anywhere = _form(schema, **budget)
    assert tracked == {"a", "c"} and not anywhere
    b = SchemaBuilder(schema, whitespace="", property_order="auto", auto_loose=False, **budget)
    d = minimize(determinize(to_nfa(b.build(), "")))
    oracle = jsonschema.Draft202012Validator(schema)
    for pairs, dup in _instances(schema["properties"], rng=rng):
        got = d.accepts(_text(pairs))
        keys = [k for k, _ in pairs]
        want = (not dup and oracle.is_valid(dict(pairs))
                and _order_ok(schema, keys, tracked, anywhere))
        assert got == want, (schema, pairs)


def test_auto_order_budget_zero_is_schema_order():
    """No budget at all (per object, root and in total: the required-first form counts
    in the total): the schema's order."""
    rng = random.Random(7)
    schema = _random_object(rng, 3)
    b = SchemaBuilder(schema, whitespace="", property_order="auto", auto_loose=False, auto_states=0,
                      auto_root=0, auto_total=0)
    d = minimize(determinize(to_nfa(b.build(), "")))
    fixed = _dfa(schema, property_order="schema")
    for pairs, _ in _instances(schema["properties"], rng=rng):
        assert d.accepts(_text(pairs)) == fixed.accepts(_text(pairs))


def test_auto_order_total_budget_falls_back_per_object():
    """Inner objects are decided first; once the schema-wide budget is spent the outer
    object keeps the schema's order (sound: a subset of the valid instances)."""
    inner = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
             "required": ["x", "y"], "additionalProperties": False}
    schema = {"type": "object", "properties": {"p": inner, "q": {"type": "integer"}},
              "required": ["p", "q"], "additionalProperties": False}
    b = SchemaBuilder(schema, whitespace="", property_order="auto", auto_loose=False)
    node = b.build()
    assert node.kind == "objmix"
    d = minimize(determinize(to_nfa(node, "")))
    assert d.accepts(b'{"q":1,"p":{"y":2,"x":1}}')
    assert not d.accepts(b'{"q":1,"p":{"y":2,"x":1},"q":1}')
    inner_cost = SchemaBuilder(inner, whitespace="", property_order="auto", auto_loose=False)
    inner_cost.build()
    b2 = SchemaBuilder(schema, whitespace="", property_order="auto", auto_loose=False,
                       auto_total=inner_cost.auto_spent, auto_root=0)
    node2 = b2.build()
    assert node2.kind == "obj"                # the outer object: schema order
    d2 = minimize(determinize(to_nfa(node2, "")))
    assert d2.accepts(b'{"p":{"y":2,"x":1},"q":1}')
    assert not d2.accepts(b'{"q":1,"p":{"y":2,"x":1}}')


def test_auto_order_root_object_may_double():
    """The document's own object may double the automaton to take its properties in
    any order (two members with large values); the same object as a property value
    keeps the schema's order when past the per-object budget."""
    big = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(6)}}
    schema = {"type": "object", "properties": {"p": big, "q": {"type": "integer"}},
              "required": ["p", "q"]}
    small = {"auto_states": 10, "auto_total": 10}
    assert _form(schema, **small)[0] == {"p", "q"}
    assert _form(schema, auto_root=0, **small)[0] == set()
    b = SchemaBuilder({"type": "object", "properties": {"w": schema}}, whitespace="",
                      property_order="auto", auto_loose=False, **small)
    assert b.build().args[0][0].value.kind == "obj"
    d = _dfa(schema)
    assert d.accepts(b'{"q":1,"p":{"k5":"x","k0":"y"}}')
    assert not d.accepts(b'{"q":1,"p":{},"q":2}')


def test_auto_order_min_max_properties():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                               "c": {"type": "integer"}},
              "minProperties": 2, "maxProperties": 3, "additionalProperties": False}
    d = _dfa(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    for r in range(4):
        for perm in itertools.permutations("abc", r):
            pairs = [(k, 1) for k in perm]
            assert d.accepts(_text(pairs)) == oracle.is_valid(dict(pairs)), perm
    assert not d.accepts(b'{"a":1,"a":1}')


def test_auto_order_one_of_falls_back_when_products_are_too_large(monkeypatch):
    """Under oneOf/not/if the operands are determinised; if the order-free objects make
    an operand or product too large, the subschema is rebuilt in the schema's order.
    (Simulated: the product refuses every operand built while the order is "auto".)"""
    from jaxcd.errors import AutomatonTooLargeError
    a = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
         "required": ["x", "y"], "additionalProperties": False}
    b = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
         "additionalProperties": False}
    schema = {"oneOf": [a, b]}
    real = SchemaBuilder._product

    def product(self, *args):
        if self.property_order == "auto":
            raise AutomatonTooLargeError("simulated")
        return real(self, *args)

    monkeypatch.setattr(SchemaBuilder, "_product", product)
    # the branches are disjoint, which the builder would see without a product: make it
    # take the product path
    monkeypatch.setattr(SchemaBuilder, "disjoint", lambda self, a, b: False)
    # (closed objects whose shared keys agree are split by key presence, no product)
    monkeypatch.setattr(SchemaBuilder, "_closed_object_cases", lambda self, b, p: None)
    builder = SchemaBuilder(schema, whitespace="", property_order="auto", auto_loose=False)
    d = minimize(determinize(to_nfa(builder.build(), "")))
    assert builder.property_order == "auto"
    assert d.accepts(b'{"x":1,"y":2}') and d.accepts(b'{"x":1}')
    assert not d.accepts(b'{"y":2,"x":1}')          # rebuilt in the schema's order
    monkeypatch.setattr(SchemaBuilder, "_product", real)
    d2 = _dfa(schema)
    assert d2.accepts(b'{"y":2,"x":1}') and d2.accepts(b'{"x":1}')
    assert not d2.accepts(b'{"x":1,"y":2,"x":1}')


def test_auto_dfa_cap_falls_back_to_schema_order(monkeypatch):
    """compile_json_schema: an order-free automaton is determinised up to AUTO_DFA_CAP
    states only; past it the schema's order is compiled instead (a subset of the valid
    instances), checked against jsonschema on every key order."""
    import jaxcd.automata.json_schema as js
    from jaxcd import compile_json_schema
    from jaxcd.errors import AutomatonTooLargeError

    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"},
              "required": list("abcd"), "additionalProperties": False}
    vocab = VOCAB
    free = compile_json_schema(schema, vocab)
    monkeypatch.setattr(js, "AUTO_DFA_CAP", 5)
    # the determinisation's cap itself, not the early refusals (next test)
    monkeypatch.setattr(sb, "AUTO_REFUSE_TREE", 10**9)
    monkeypatch.setattr(sb, "AUTO_REFUSE_NFA", 10**9)
    node, ws, _, _ = js._auto_tree(schema, None, True, 2, False, "auto", {})
    nfa = to_nfa(node, ws)
    assert nfa.dfa_cap == 5
    with pytest.raises(AutomatonTooLargeError):
        determinize(nfa)
    capped = compile_json_schema(schema, vocab)
    oracle = jsonschema.Draft202012Validator(schema)
    for perm in itertools.permutations("abcd"):
        inst = {k: 1 for k in perm}
        text = json.dumps(inst, separators=(",", ":"))
        assert oracle.is_valid(inst) and accepts(free, text)
        assert accepts(capped, text) == (perm == tuple("abcd")), perm
    assert not accepts(capped, '{"a":1,"b":1,"c":1}')


@pytest.mark.parametrize("rule", ["tree", "nfa"])
def test_auto_refused_before_determinising(monkeypatch, rule):
    """An order-free automaton whose tree size estimate (AUTO_REFUSE_TREE x
    AUTO_DFA_CAP) or NFA (AUTO_REFUSE_NFA x AUTO_DFA_CAP states) predicts a DFA past
    the cap is refused before it is determinised: compile_json_schema then compiles the
    schema's order, the same automaton as when the determinisation passes the cap."""
    import jaxcd.automata.json_schema as js
    from jaxcd import compile_json_schema
    from jaxcd.errors import AutomatonTooLargeError

    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"},
              "required": list("abcd"), "additionalProperties": False}
    vocab = VOCAB
    node, ws, _, _ = js._auto_tree(schema, None, True, 2, False, "auto", {})
    tree_size = node.args[0].size
    nfa_states = to_nfa(node, ws).num_states
    # a cap that the DFA passes, with the refusals off: the reference fallback
    monkeypatch.setattr(js, "AUTO_DFA_CAP", 5)
    monkeypatch.setattr(sb, "AUTO_REFUSE_TREE", 10**9)
    monkeypatch.setattr(sb, "AUTO_REFUSE_NFA", 10**9)
    ref = compile_json_schema(schema, vocab)
    # the same cap, refused early by one rule (the other off)
    if rule == "tree":
        monkeypatch.setattr(sb, "AUTO_REFUSE_TREE", (tree_size - 1) / 5)
    else:
        monkeypatch.setattr(sb, "AUTO_REFUSE_NFA", (nfa_states - 2) / 5)
    node, ws, _, _ = js._auto_tree(schema, None, True, 2, False, "auto", {})
    with pytest.raises(AutomatonTooLargeError, match="AUTO_DFA_CAP"):
        to_nfa(node, ws)
    got = compile_json_schema(schema, vocab)
    for name in ("edge_src", "edge_dst", "out_start", "out_dst"):
        assert np.array_equal(np.asarray(getattr(ref, name)), np.asarray(getattr(got, name)))
    # just under the limits: not refused, determinised up to the cap
    monkeypatch.setattr(sb, "AUTO_REFUSE_TREE", tree_size / 5)
    monkeypatch.setattr(sb, "AUTO_REFUSE_NFA", nfa_states / 5)
    nfa = to_nfa(node, ws)
    assert nfa.dfa_cap == 5
    with pytest.raises(AutomatonTooLargeError, match="max_dfa_states"):
        determinize(nfa)


def _in_order(keys, order) -> bool:
    """``keys`` follow ``order`` (keys not in ``order`` anywhere)."""
    seen = [k for k in keys if k in order]
    return seen == sorted(seen, key=order.index)


@pytest.mark.parametrize("seed", range(8))
def test_auto_order_past_budget_takes_the_required_ones_first(seed):
    """Past every any-order budget, an object takes its properties in the schema's
    order or with the required ones first (in the order of the ``required`` list), the
    optional ones after them in the schema's order: exactly the valid instances without
    a repeated key in one of the two orders, by brute force against jsonschema."""
    rng = random.Random(300 + seed)
    names = list("abcd")
    props = {k: {"type": rng.choice(list(VALUES))} for k in names}
    req = rng.sample(names, rng.randint(1, 3))
    while req == names[:len(req)]:
        rng.shuffle(req)
    schema = {"type": "object", "properties": props, "required": req}
    if rng.random() < 0.5:
        schema["additionalProperties"] = False
    budget = {"auto_states": 0, "auto_root": 0}
    assert _form(schema, **budget)[0] == set()
    b = SchemaBuilder(schema, whitespace="", property_order="auto", auto_loose=False, **budget)
    node = b.build()
    assert node.kind == "alt"
    d = minimize(determinize(to_nfa(node, "")))
    second = req + [k for k in names if k not in req]
    oracle = jsonschema.Draft202012Validator(schema)
    n_second = 0
    for pairs, dup in _instances(props, rng=rng):
        keys = [k for k, _ in pairs]
        declared = [k for k in keys if k in props]
        # as in the schema's order: extra keys after the declared ones, or (scalar
        # values, a required property) before them
        ext = [i for i, k in enumerate(keys) if k not in props]
        pos = [i for i, k in enumerate(keys) if k in props]
        tail = not pos or all(e < min(pos) or e > max(pos) for e in ext)
        by_schema = _in_order(declared, names)
        by_req = _in_order(declared, second)
        want = not dup and oracle.is_valid(dict(pairs)) and tail and (by_schema or by_req)
        assert d.accepts(_text(pairs)) == want, (schema, pairs)
        n_second += want and not by_schema
    assert n_second > 0


def test_auto_order_wide_object_in_required_order():
    """Eleven required properties listed in another order than ``properties`` (too many
    to track in any order): the schema's order and the required ones first are
    accepted, other orders and repeated keys not."""
    names = [f"k{i:02d}" for i in range(12)]
    req = names[1:][::-1]
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in names},
              "required": req, "additionalProperties": False}
    from jaxcd.automata.json_schema import schema_to_nfa
    d = minimize(determinize(schema_to_nfa(schema, "", property_order="auto")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    n = 0
    for keys in (names[1:], names, req, req + ["k00"], ["k00"] + req, req[1:] + req[:1],
                 req + [req[0]]):
        pairs = [(k, 1) for k in keys]
        want = len(set(keys)) == len(keys) and oracle.is_valid(dict(pairs)) and (
            _in_order(keys, names) or _in_order(keys, req + ["k00"]))
        assert d.accepts(_text(pairs)) == want, keys
        n += want
    assert n == 4


_SCALARS = (int, str, float, bool, type(None))


def _fixed_order_ok(obj_pairs, props, lead: bool) -> bool:
    """The schema's order restated: declared keys in the order of ``props``; an extra
    key after every declared one, or (``lead``: the document's object with a required
    property) before every one with a scalar value."""
    declared = [k for k, _ in obj_pairs if k in props]
    if declared != sorted(declared, key=list(props).index):
        return False
    pos = [i for i, (k, _) in enumerate(obj_pairs) if k in props]
    for i, (k, v) in enumerate(obj_pairs):
        if k in props or not pos or i > max(pos):
            continue
        if not (lead and i < min(pos) and isinstance(v, _SCALARS)):
            return False
    return True


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
     "required": ["b"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
    {"$ref": "#/$defs/r", "$defs": {"r": {"type": "object", "required": ["b"],
                                          "properties": {"a": {"type": "integer"},
                                                         "b": {"type": "string"}}}}},
    {"type": "object", "required": ["b"], "minProperties": 1,
     "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
    {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"},
                                                 "b": {"type": "string"}},
                "required": ["b"]}, {"type": "string"}]},
], ids=lambda s: json.dumps(s)[:50])
def test_schema_order_takes_scalar_extras_first_in_the_document_object(schema):
    """In the schema's order the document's own object (through ``$ref``/``allOf``
    only) with a required property also takes additional members with scalar values
    before its declared ones (``{"$schema": "...", ...}``): by brute force against
    jsonschema and the order rule restated; not with counts, not in a branch of a
    union, never a non-scalar extra first, never a dangling comma."""
    d = _dfa(schema, property_order="schema")
    oracle = jsonschema.Draft202012Validator(schema)
    target = schema.get("$defs", {}).get("r") or (schema.get("anyOf") or [schema])[0]
    props = target["properties"]
    lead = (bool(target.get("required")) and "minProperties" not in target
            and "anyOf" not in schema)
    pool = {"a": [1, "s"], "b": ["s"], "z": [1, None, "t", {"q": 1}, [1]], "y": [2]}
    n = 0
    for r in range(4):
        for keys in itertools.permutations("abzy", r):
            for vals in itertools.product(*(pool[k] for k in keys)):
                pairs = list(zip(keys, vals))
                want = oracle.is_valid(dict(pairs)) and _fixed_order_ok(pairs, props, lead)
                assert d.accepts(_text(pairs)) == want, (schema, pairs)
                n += want
                if pairs:
                    assert not d.accepts(_text(pairs)[:-1] + b",}"), (schema, pairs)
    assert n > 10


@pytest.mark.parametrize("order", ["auto"])
def test_document_object_keeps_the_required_order_past_every_budget(order):
    """The document's own object takes the schema's order or the required ones first
    even when every any-order budget is spent (one more copy of the document); a
    nested object does not. Brute force against jsonschema and the two orders
    restated."""
    names = list("abcd")
    inner = {"type": "object", "properties": {k: {"type": "integer"} for k in names},
             "required": ["c", "a"], "additionalProperties": False}
    schema = {**inner, "properties": {**inner["properties"], "n": inner}}
    b = SchemaBuilder(schema, whitespace="", property_order=order, auto_loose=False,
                      auto_states=0, auto_total=0)
    node = b.build()
    assert node.kind == "alt"
    d = minimize(determinize(to_nfa(node, "")))
    oracle = jsonschema.Draft202012Validator(schema)
    top, second = names + ["n"], ["c", "a", "b", "d", "n"]
    n_second = 0
    for r in range(2, 5):
        for keys in itertools.permutations(top, r):
            inner_keys = ("a", "c") if "n" in keys else ()
            pairs = [(k, dict.fromkeys(inner_keys, 1) if k == "n" else 1) for k in keys]
            want = oracle.is_valid(dict(pairs)) and (_in_order(keys, top)
                                                     or _in_order(keys, second))
            assert d.accepts(_text(pairs)) == want, pairs
            n_second += want and not _in_order(keys, top)
    assert n_second > 0
    # the nested object: the schema's order only
    for inner_keys, want in ((("a", "c"), True), (("c", "a"), False)):
        pairs = [("c", 1), ("a", 1), ("n", dict.fromkeys(inner_keys, 1))]
        assert d.accepts(_text(pairs)) == want, pairs


def test_deeper_free_values_do_not_cost_the_document_its_second_order(monkeypatch):
    """compile_json_schema compiles few free-form values deeper only where the document's
    object keeps "the schema's order or the required ones first": with the any-order
    budget spent, the deeper tree drops that form, so the default depth is kept and an
    instance in the order of ``required`` is accepted."""
    from jaxcd import compile_json_schema
    monkeypatch.setattr(sb, "AUTO_ORDER_TOTAL", 10)
    schema = {"type": "object", "required": ["version", "crypto"],
              "properties": {"crypto": {"type": "object", "properties": {
                  "x": {"type": "integer"}, "y": {"type": "integer"}}},
                  "meta": {"type": "object"}, "version": {"type": "integer"}}}
    fa = compile_json_schema(schema, VOCAB)
    oracle = jsonschema.Draft202012Validator(schema)
    for text, want in (('{"version":1,"crypto":{"y":1,"x":2}}', True),
                       ('{"crypto":{"x":2},"version":1}', True),
                       ('{"crypto":{},"meta":{},"version":1}', True),
                       ('{"meta":{},"version":1,"crypto":{}}', False)):
        assert oracle.is_valid(json.loads(text))
        assert accepts(fa, text) == want, text
