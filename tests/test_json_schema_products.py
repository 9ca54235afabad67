"""oneOf / not / if-else: operands shown disjoint by a search over NFA state pairs are
kept without determinising (schema_builder.SchemaBuilder.disjoint). Brute force: every
small instance of a fixed universe against the jsonschema library, and the pair search
against the emptiness of the DFA intersection."""

import itertools
import json
import random

import jsonschema
import pytest

from jaxcd.errors import AutomatonTooLargeError

from jaxcd.automata import determinize, intersect, minimize
from jaxcd.automata.fsa import is_empty
from jaxcd.automata.json_schema import schema_to_nfa
from jaxcd.automata.regex import regex_to_nfa
from jaxcd.automata.schema_builder import MAX_DISJOINT_PAIRS, _nfa_disjoint

# instances: scalars, and objects over keys a/b/k with a few values, in both key orders
_SCALARS = [None, True, 0, 1, -2, 1.5, "", "x", "y", "ab"]
_VALUES = [None, 0, 1, "x", "y", True, [], [1], {"a": 1}]


def _universe():
    out = list(_SCALARS) + [[], [1], ["x", 1]]
    keys = ["a", "b", "k"]
    for n in range(3):
        for ks in itertools.permutations(keys, n):
            for vs in itertools.product(["x", 1, None], repeat=n):
                out.append(dict(zip(ks, vs)))
    for k in keys:
        for v in _VALUES:
            out.append({k: v})
    return out


UNIVERSE = _universe()


def _texts(v):
    # dict key order matters to the automaton: keep it
    return json.dumps(v, separators=(",", ":"))


SCHEMAS = [
    # disjoint by a discriminating const (kept as a union, no product)
    {"oneOf": [{"type": "object", "properties": {"k": {"const": "x"}, "a": {"type": "integer"}},
                "required": ["k"]},
               {"type": "object", "properties": {"k": {"const": "y"}, "b": {}},
                "required": ["k"]}]},
    # overlapping branches (the difference is needed)
    {"oneOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]},
    {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}, {"type": "string"}]},
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
               {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"type": "object", "properties": {"b": {}}, "required": ["b"],
                "additionalProperties": False}]},
    # a branch disjoint from one and overlapping another
    {"oneOf": [{"const": "x"}, {"type": "string", "maxLength": 1}, {"type": "integer"}]},
    # not: disjoint (base kept) and overlapping
    {"type": "string", "not": {"type": "integer"}},
    {"type": "object", "properties": {"a": {}}, "not": {"required": ["b"]}},
    {"type": "object", "not": {"properties": {"k": {"const": "x"}}, "required": ["k"]}},
    # if/then/else: else disjoint from if, and overlapping
    {"type": "object", "properties": {"k": {"type": "string"}},
     "if": {"properties": {"k": {"const": "x"}}, "required": ["k"]},
     "then": {"required": ["a"]}, "else": {"required": ["b"]}},
    {"if": {"type": "integer"}, "then": {"minimum": 1}, "else": {"type": "string"}},
    # oneOf inside an object property and items
    {"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}, {"type": "null"},
                                                      {"type": "object", "required": ["a"]}]}}},
]


@pytest.mark.parametrize("order", ["auto", "schema"])
@pytest.mark.parametrize("schema", SCHEMAS)
def test_products_against_jsonschema(schema, order):
    d = minimize(determinize(schema_to_nfa(schema, "", property_order=order)[0]))
    oracle = jsonschema.validators.validator_for(schema)(schema)
    for v in UNIVERSE:
        ok = d.accepts(_texts(v).encode())
        if ok:                                   # never an invalid instance
            assert oracle.is_valid(v), (schema, v)
        elif not isinstance(v, dict) or len(v) < 2:
            # objects of two or more keys may be refused for their key order (extra keys
            # before declared ones, docs/json_schema.md); nothing else is refused
            assert not oracle.is_valid(v), (schema, v)


def test_nfa_disjoint_against_dfa_intersection():
    rng = random.Random(5)
    atoms = ["a", "b", "c", "[ab]", "[^a]", ".", "(ab)*", "a{2,4}", "[a-c]+", "é", "x?", ""]

    def rr(d=0):
        k = rng.randrange(4 if d < 3 else 1)
        if k == 0:
            return rng.choice(atoms)
        if k == 1:
            return rr(d + 1) + rr(d + 1)
        if k == 2:
            return "(" + rr(d + 1) + "|" + rr(d + 1) + ")"
        return "(" + rr(d + 1) + ")*"
    seen = {True: 0, False: 0}
    for _ in range(400):
        x, y = rr(), rr()
        a, b = regex_to_nfa(x), regex_to_nfa(y)
        got = _nfa_disjoint(a, b, MAX_DISJOINT_PAIRS)
        want = is_empty(intersect(minimize(determinize(a)), minimize(determinize(b))))
        assert got is want, (x, y)
        seen[got] += 1
    assert seen[True] >= 20 and seen[False] >= 20
    # past the pair bound: no answer
    assert _nfa_disjoint(regex_to_nfa("[ab]{30}c"), regex_to_nfa("[ab]{30}d"), 10) is None


def test_max_items_past_the_item_budget():
    """A maxItems whose counter would copy the item past MAX_COUNTED_ITEM_STATES is
    tightened (every array accepted is valid) and, in a subtracted operand, dropped (so
    the difference never keeps an invalid array)."""
    from jaxcd.automata.schema_builder import MAX_COUNTED_ITEM_STATES
    item = {"type": "string", "pattern": "^[a-f]{24}$"}
    word = "abcdef" * 4
    cases = [{"type": "array", "items": item, "maxItems": 1000},
             {"type": "array", "items": item, "minItems": 2, "maxItems": 900},
             {"type": "array", "items": item, "not": {"maxItems": 1000}},
             {"type": "array", "items": item, "not": {"items": item, "maxItems": 800}}]
    for schema in cases:
        d = minimize(determinize(schema_to_nfa(schema, "")[0]))
        oracle = jsonschema.validators.validator_for(schema)(schema)
        for n in list(range(6)) + [200, 799, 800, 801, 899, 900, 901, 999, 1000, 1001]:
            v = [word] * n
            ok = d.accepts(_texts(v).encode())
            if ok:
                assert oracle.is_valid(v), (schema, n)
            elif n < 6 and "not" not in schema:
                assert not oracle.is_valid(v), (schema, n)     # short arrays are exact
            assert not d.accepts(_texts(v + ["x"]).encode())
    # the tightened bound keeps the automaton small
    d = minimize(determinize(schema_to_nfa(cases[0], "")[0]))
    assert d.num_states < 2 * MAX_COUNTED_ITEM_STATES


_REC = {"definitions": {"f": {"oneOf": [
    {"type": "object", "properties": {"a": {"type": "integer"}, "sub": {"$ref": "#/definitions/f"}},
     "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"b": {"type": ["string", "integer"]},
                                      "sub": {"$ref": "#/definitions/f"}},
     "required": ["b"], "additionalProperties": {"type": "integer"}}]}},
    "type": "object",
    "properties": {"x": {"$ref": "#/definitions/f"}, "y": {"$ref": "#/definitions/f"}}}


def _rec_universe():
    leaf = [{}, {"a": 1}, {"a": "s"}, {"b": "s"}, {"a": 1, "b": "s"}, {"b": 1}, {"b": None},
            {"a": 1, "b": 2}, 1, None]
    one = leaf + [{"a": 1, "sub": v} for v in leaf] + [{"b": "s", "sub": v} for v in leaf]
    out = [{"x": v} for v in one] + [{"y": v} for v in one]
    out += [{"x": v, "y": w} for v in leaf for w in leaf]
    return out


def test_product_memo_recursive_oneof(monkeypatch):
    """A oneOf reached through a recursive $ref from several places is determinised once
    per context (SchemaBuilder._memo_product): the same language as without the memo,
    fewer determinisations, and no instance accepted that jsonschema rejects (every
    valid one within the recursion depth accepted).""" 
    from jaxcd.automata import schema_builder as sb
    from jaxcd.automata.fsa import difference

    calls = []
    real = sb.determinize

    def counting(nfa, *a, **k):
        calls.append(nfa.num_states)
        return real(nfa, *a, **k)
    monkeypatch.setattr(sb, "determinize", counting)
    # equal trees share their operand DFAs by digest (SchemaBuilder.to_dfa): every tree
    # its own digest here, so that only _memo_product saves determinisations
    fresh = itertools.count()
    monkeypatch.setattr(sb.SchemaBuilder, "digest", lambda self, n: next(fresh))
    with_memo = minimize(determinize(schema_to_nfa(_REC, "", max_depth=1, property_order="auto")[0]))
    n_memo = len(calls)
    calls.clear()
    monkeypatch.setattr(sb.SchemaBuilder, "_memo_product", sb.SchemaBuilder._product_node)
    plain = minimize(determinize(schema_to_nfa(_REC, "", max_depth=1, property_order="auto")[0]))
    assert len(calls) > n_memo
    assert is_empty(difference(with_memo, plain)) and is_empty(difference(plain, with_memo))
    oracle = jsonschema.Draft7Validator(_REC)
    n_valid = 0
    for v in _rec_universe():
        ok = with_memo.accepts(_texts(v).encode())
        if ok or "sub" not in json.dumps(v):       # max_depth=1: no nested "sub"
            assert ok == oracle.is_valid(v), v
        n_valid += ok
    assert n_valid >= 10


def test_product_work_limit():
    """All products of one schema together build at most max_product_work automaton
    states; past it the schema is refused with a size error (not minutes of work).
    Branches that are objects keep a subset instead (test_json_schema_oneof_apart)."""
    from jaxcd.automata.schema_builder import SchemaBuilder
    from jaxcd.errors import AutomatonTooLargeError
    schema = SCHEMAS[2]                          # overlapping oneOf: needs products
    b = SchemaBuilder(schema, whitespace="")
    b.build()
    assert b.product_work > 0
    with pytest.raises(AutomatonTooLargeError, match="max_product_work"):
        SchemaBuilder(schema, whitespace="", max_product_work=b.product_work // 2).build()


_ALLOF_EXTRAS = [
    # a property one part declares is an extra property of the other part
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                "additionalProperties": False},
               {"properties": {"b": {"type": "string"}}}]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                "additionalProperties": {"type": "integer"}},
               {"properties": {"b": {"type": ["string", "integer"]}}, "required": ["b"]}]},
    # ... unless the other part's pattern matches it
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                "patternProperties": {"^b": {"type": "string"}},
                "additionalProperties": False},
               {"properties": {"b": {"type": "string"}, "c": {"type": "string"}}}]},
    # a key one part's pattern matches is an extra of the other part
    {"allOf": [{"type": "object", "patternProperties": {"^x": {"type": ["integer", "string"]}}},
               {"properties": {"a": {"type": "integer"}},
                "additionalProperties": {"type": "integer"}}]},
    # the same through oneOf (negated_meet merges the branches)
    {"type": "object", "oneOf": [
        {"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}},
        {"properties": {"b": {"type": ["string", "integer"]}}, "required": ["b"],
         "additionalProperties": {"type": "integer"}}]},
]


def _extras_universe():
    vals = [1, "s", None, [1], {"a": 1}]
    keys = ["a", "b", "c", "xy"]
    out = [{}]
    for k in keys:
        out += [{k: v} for v in vals]
    for k1, k2 in itertools.combinations(keys, 2):
        out += [{k1: v1, k2: v2} for v1 in vals[:3] for v2 in vals[:3]]
    return out + [1, "s", None]


@pytest.mark.parametrize("i", range(len(_ALLOF_EXTRAS)))
def test_allof_additional_properties_reach_other_parts_properties(i):
    """allOf merging: a part's additionalProperties applies to the properties that only
    other parts declare (so {"b": "x"} is refused for the first schema, as jsonschema
    refuses it). Every instance of a small universe: accepted iff valid."""
    schema = _ALLOF_EXTRAS[i]
    d = minimize(determinize(schema_to_nfa(schema, "", property_order="auto")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    n_valid = 0
    for v in _extras_universe():
        ok = d.accepts(_texts(v).encode())
        assert ok == oracle.is_valid(v), (i, v)
        n_valid += ok
    assert n_valid >= 2


@pytest.mark.parametrize("schema", [
    {"allOf": [{"enum": [1]}, {"enum": [True]}]},
    {"allOf": [{"const": [0]}, {"enum": [[False], [0]]}]},
    {"allOf": [{"enum": [{"a": 1.0}]}, {"not": {"enum": [{"a": True}]}}]},
])
def test_allof_merge_tells_true_from_one(schema):
    """allOf merging compared keyword values with Python's == (True == 1), so enum [1]
    merged with enum [true] kept 1: every value of a small universe, against jsonschema."""
    d = minimize(determinize(schema_to_nfa(schema, "")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    for v in [1, 1.0, True, False, 0, [0], [False], {"a": 1.0}, {"a": True}, None]:
        assert d.accepts(_texts(v).encode()) == oracle.is_valid(v), (schema, v)


# presence tests (SchemaBuilder._presence_split): not / oneOf / if whose operands only
# test which keys are present become cases of present and absent keys, no product
def _presence_formula(rng, depth=0):
    r = rng.random()
    if depth >= 2 or r < 0.4:
        leaf = {"required": rng.sample(["a", "b", "k"], rng.randint(1, 2))}
        if rng.random() < 0.3:
            leaf["type"] = "object"
        return leaf
    kw = rng.choice(["not", "allOf", "anyOf", "oneOf"])
    if kw == "not":
        return {"not": _presence_formula(rng, depth + 1)}
    return {kw: [_presence_formula(rng, depth + 1) for _ in range(rng.randint(2, 3))]}


def _presence_schemas(n=24, seed=0):
    rng = random.Random(seed)
    rests = [{}, {"type": "object"}, {"type": ["object", "string"]},
             {"type": "object", "properties": {"a": {"type": "string"}, "b": {}},
              "additionalProperties": False},
             {"properties": {"k": {"type": "integer"}}, "required": ["k"]}]
    out = []
    for i in range(n):
        rest = dict(rests[i % len(rests)])
        kind = ("not", "oneOf", "if", "nested")[i % 4]
        if kind == "not":
            out.append({**rest, "not": _presence_formula(rng)})
        elif kind == "oneOf":
            out.append({**rest, "oneOf": [_presence_formula(rng) for _ in range(rng.randint(2, 3))]})
        elif kind == "if":
            out.append({**rest, "if": _presence_formula(rng),
                        "then": rng.choice([{"required": ["b"]}, {"maxProperties": 1}, True]),
                        "else": rng.choice([{"properties": {"a": {"type": "integer"}}},
                                            {"type": "string"}, False])})
        else:      # a presence test inside a subtracted operand (a product)
            out.append({**rest, "not": {"properties": {"a": {"type": "integer"}},
                                        "oneOf": [_presence_formula(rng), _presence_formula(rng)]}})
    return out


PRESENCE_SCHEMAS = _presence_schemas()


@pytest.mark.parametrize("order", ["auto", "schema"])
@pytest.mark.parametrize("i", range(len(PRESENCE_SCHEMAS)))
def test_presence_tests_against_jsonschema_and_products(i, order, monkeypatch):
    from jaxcd.automata.fsa import difference
    from jaxcd.automata.schema_builder import SchemaBuilder
    schema = PRESENCE_SCHEMAS[i]
    d = minimize(determinize(schema_to_nfa(schema, "", max_depth=1, property_order=order)[0]))
    oracle = jsonschema.validators.validator_for(schema)(schema)
    for v in UNIVERSE:
        ok = d.accepts(_texts(v).encode())
        if ok:
            assert oracle.is_valid(v), (schema, v)
        elif not isinstance(v, dict) or len(v) < 2:
            assert not oracle.is_valid(v), (schema, v)
    # the same language as the automaton products build without the split (in any
    # property order: in the schema's, the cases may order required keys differently);
    # the products are slow to build, so on every third schema (every kind of case still
    # meets them: the kinds cycle with period 4)
    if order != "auto" or i % 3:
        return
    monkeypatch.setattr(SchemaBuilder, "_presence_split", lambda self, s, p: None)
    try:
        ref = minimize(determinize(schema_to_nfa(schema, "", max_depth=1,
                                                 property_order=order)[0]))
    except AutomatonTooLargeError:
        return          # free-form operands: the products pass their limits
    # free-form values may nest deeper without the products (docs/json_schema.md,
    # "Depth adapts"): compared on values nested at most as deep as {}'s
    shallow = minimize(determinize(schema_to_nfa({}, "", max_depth=1)[0]))
    d, ref = intersect(d, shallow), intersect(ref, shallow)
    # texts accepted by one of the two only (one per state of the difference automaton
    # it reaches) are valid; the split loses none, up to key order (extra keys before
    # declared ones, docs/json_schema.md); the products may lose more (they subtract
    # supersets)
    for text in _bfs_texts(difference(d, ref), 64):
        assert oracle.is_valid(json.loads(text)), (schema, text)
    for text in _bfs_texts(difference(ref, d), 64):
        v = json.loads(text)
        assert oracle.is_valid(v), (schema, text)
        assert isinstance(v, dict) and any(
            d.accepts(_texts(dict(p)).encode())
            for p in itertools.permutations(v.items())), (schema, text)


def _bfs_texts(dfa, limit):
    """Accepted texts of ``dfa``: the breadth-first path to each accepting state."""
    if dfa.num_states == 0:
        return []
    reps = {}
    for byte in range(256):
        reps.setdefault(int(dfa.byte_class[byte]), byte)
    seen, frontier, out = {0}, [(0, b"")], []
    while frontier and len(out) < limit:
        nxt = []
        for q, text in frontier:
            if dfa.accepting[q]:
                out.append(text)
            for c, byte in reps.items():
                t = int(dfa.trans[q, c])
                if t >= 0 and t not in seen:
                    seen.add(t)
                    nxt.append((t, text + bytes([byte])))
        frontier = nxt
    return out


def test_presence_split_is_used_and_bounded():
    from jaxcd.automata.json_schema import _builder
    from jaxcd.automata.schema_builder import MAX_PRESENCE_CASES, SchemaBuilder
    b = _builder({}, "", True, 3, False, "schema")
    schema = {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    cases = b._presence_split(schema, "")
    assert [c.get("required") for c in cases] == [["a"], ["b"]]
    assert [c["properties"] for c in cases] == [{"b": False}, {"a": False}]
    # oneOf of n single keys: n cases; past MAX_PRESENCE_CASES the product path is used
    n = MAX_PRESENCE_CASES + 1
    big = {"type": "object", "oneOf": [{"required": [f"p{i}"]} for i in range(n)]}
    assert SchemaBuilder._presence_split(b, big, "") is None
    # a branch that tests more than presence is not split
    assert b._presence_split({"oneOf": [{"required": ["a"]}, {"type": "string"}]}, "") is None


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {}}, "additionalProperties": False,
     "required": ["k"]},
    {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"},
     "required": ["k"]},
    {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False,
     "required": ["a", "k"]},
    {"type": "object", "patternProperties": {"^k": {"type": "integer"}},
     "additionalProperties": False, "required": ["k"]},
])
def test_required_key_outside_properties_takes_additional_properties(schema):
    # a required key that properties does not declare takes the additionalProperties
    # schema (not any value), so additionalProperties: false makes the object impossible
    d = minimize(determinize(schema_to_nfa(schema, "")[0]))
    oracle = jsonschema.validators.validator_for(schema)(schema)
    for v in UNIVERSE + [{"k": "x", "a": 1}, {"a": None, "k": 1}]:
        if d.accepts(_texts(v).encode()):
            assert oracle.is_valid(v), (schema, v)
        elif not isinstance(v, dict) or len(v) < 2:
            assert not oracle.is_valid(v), (schema, v)


# contains / minContains / maxContains: every array of up to 4 items over a few values
_ITEMS = [0, 1, 5, "x", None, [1], {"a": 1}]
_ARRAYS = [list(t) for n in range(5) for t in itertools.product(_ITEMS, repeat=n)
           if n < 4 or len(set(map(json.dumps, t))) <= 2]
CONTAINS_SCHEMAS = [
    {"type": "array", "contains": {"const": 1}},
    {"contains": {"type": "string"}},                                  # arrays only
    {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 1}},
    {"type": "array", "contains": {"type": "integer"}, "minContains": 2},
    {"type": "array", "contains": {"type": "integer"}, "minContains": 0, "maxContains": 1},
    {"type": "array", "items": {"type": ["integer", "null"]}, "contains": {"const": 1},
     "minContains": 1, "maxContains": 2},
    {"type": "array", "contains": {"const": 5}, "maxItems": 2},        # a product with counts
    {"type": "array", "contains": {"const": 1}, "minItems": 3},
    {"type": "array", "prefixItems": [{"type": "string"}], "contains": {"const": 0}},
    {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"},
     "contains": {"const": 1}, "maxContains": 1},
    {"type": "array", "items": {"enum": [0, 1, 5]}, "uniqueItems": True,
     "contains": {"const": 5}},
    {"type": "array", "contains": {"const": 1}, "maxContains": 0},     # minContains 1: none
    {"type": "array", "allOf": [{"contains": {"const": 1}}, {"contains": {"const": 5}}]},
    {"type": "array", "not": {"contains": {"const": 1}}},              # a subtracted operand
    {"type": "array", "contains": {"type": "array", "contains": {"const": 1}}},
]


@pytest.mark.parametrize("i", range(len(CONTAINS_SCHEMAS)))
def test_contains_against_jsonschema(i):
    schema = CONTAINS_SCHEMAS[i]
    d = minimize(determinize(schema_to_nfa(schema, "", max_depth=2)[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    n_valid = 0
    for v in _ARRAYS + _SCALARS:
        ok = d.accepts(_texts(v).encode())
        assert ok == oracle.is_valid(v), (schema, v)
        n_valid += ok
    assert n_valid > 0 or schema.get("maxContains") == 0


def test_contains_limit():
    from jaxcd.automata.schema_builder import MAX_CONTAINS
    with pytest.raises(AutomatonTooLargeError, match="MAX_CONTAINS"):
        schema_to_nfa({"type": "array", "contains": {"const": 1},
                       "minContains": MAX_CONTAINS + 1}, "")


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {}, "k": {"type": "string"}},
     "propertyNames": {"pattern": "^[ab]$"}},
    {"type": "object", "properties": {"k": {}}, "required": ["k"],
     "propertyNames": {"enum": ["a", "b"]}},
    {"type": "object", "patternProperties": {"^[ak]": {"type": "integer"}},
     "additionalProperties": False, "propertyNames": {"pattern": "^[bk]"}},
    {"type": "object", "properties": {"a": {}}, "propertyNames": False},
    {"properties": {"b": {}}, "required": ["a"], "propertyNames": {"const": "b"}},
])
def test_property_names_apply_to_declared_and_pattern_keys(schema):
    # propertyNames applies to every key, declared and pattern keys included
    d = minimize(determinize(schema_to_nfa(schema, "")[0]))
    oracle = jsonschema.validators.validator_for(schema)(schema)
    for v in UNIVERSE:
        if d.accepts(_texts(v).encode()):
            assert oracle.is_valid(v), (schema, v)
        elif not isinstance(v, dict) or len(v) < 2:
            assert not oracle.is_valid(v), (schema, v)


@pytest.mark.parametrize("schema, texts", [
    ({"not": {"type": "number", "minimum": 0, "maximum": 0}}, ["0e-9", "0.0E+3", "1e+0", "-0"]),
    ({"not": {"type": "integer"}}, ["1.0", "1e+2", "-0.00", "1.5", "15E-1"]),
    ({"not": {"enum": [0, 1.5]}}, ["0e+0", "-0", "0.00", "1.50", "15e-1", "2"]),
    ({"not": {"const": "a/b"}}, ['"a\\/b"', '"a/b"', '"a\\\\/b"']),
    ({"not": {"const": {"a": 1, "b": [2, "x"]}}},
     ['{"b": [2, "x"], "a": 1}', '{ "a":1.0,"b":[2,"x"] }', '{"a":1,"b":[2,"y"]}']),
    ({"type": "object", "properties": {"k": {"type": "number"}},
      "oneOf": [{"properties": {"k": {"const": 1}}}, {"properties": {"k": {"maximum": 0}}}]},
     ['{"k":1.0}', '{"k":1e+0}', '{"k":-1e+0}', '{"k":5}']),
])
def test_subtracted_operands_hold_every_spelling(schema, texts):
    # a subtracted operand must hold every spelling of its values, not only those the
    # positive grammars write (exponents under bounds, 1.0 for integers, any text of an
    # enum value), else `not` keeps the others and accepts invalid instances
    d = minimize(determinize(schema_to_nfa(schema, "[ ]?")[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    for t in texts:
        if d.accepts(t.encode()):
            assert oracle.is_valid(json.loads(t)), (schema, t)


_IF = {"type": ["string", "null"]}


@pytest.mark.parametrize("schema", [
    # Buildkite's notify items: closed objects sharing an optional key
    {"oneOf": [{"type": "object", "properties": {"a": {}, "k": _IF}, "additionalProperties": False},
               {"type": "object", "properties": {"b": {}, "k": _IF}, "additionalProperties": False},
               {"enum": ["x"]}]},
    # required keys, one branch's keys inside another's, a branch with no keys
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}, "k": {}},
                "required": ["k"], "additionalProperties": False},
               {"type": "object", "properties": {"k": {}}, "additionalProperties": False},
               {"type": "object", "properties": {"b": {}, "k": {}}, "required": ["b"],
                "additionalProperties": False}]},
    {"oneOf": [{"type": "object", "additionalProperties": False},
               {"type": "object", "properties": {"a": {}}, "additionalProperties": False}]},
    # a shared key with different schemas: the automaton product as before
    {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                "additionalProperties": False},
               {"type": "object", "properties": {"a": {"type": "string"}, "b": {}},
                "additionalProperties": False}]},
])
@pytest.mark.parametrize("order", ["auto", "schema"])
def test_oneof_of_closed_objects_by_key_presence(schema, order):
    d = minimize(determinize(schema_to_nfa(schema, "", property_order=order)[0]))
    oracle = jsonschema.Draft202012Validator(schema)
    for v in UNIVERSE:
        ok = d.accepts(_texts(v).encode())
        if ok:
            assert oracle.is_valid(v), (schema, v)
        elif not isinstance(v, dict) or len(v) < 2 or order == "auto":
            assert not oracle.is_valid(v), (schema, v)
