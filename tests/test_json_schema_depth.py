"""Free-form values' depth (issue 22, "Depth"): compile_json_schema builds free-form values
({}, true, the extra properties of open objects) outside automaton products deeper when
a schema has few of them (SchemaBuilder.adaptive_free_depth), and falls back to the
default depth past a compile limit.

The reference is ``jsonschema``: every accepted instance validates (soundness), and the
depth that a schema with n free-form values affords follows from the budget formula
(recomputed here from the constants, not read from the builder)."""

from __future__ import annotations

import json

import jsonschema
import pytest

import jaxcd.automata.schema_builder as sb
from ascii_vocab import VOCAB, accepts
from jaxcd import CompileLimits, compile_json_schema
from jaxcd.automata.json_schema import _auto_tree



def nested(k: int):
    """A value with ``k`` containers nested (alternating objects and arrays, the
    innermost an object: past the exact depth no tail takes it, see
    test_json_schema_free_tail.py)."""
    v = 1
    for i in range(k):
        v = {"k": v, "n": None} if i % 2 == 0 else [v, "x"]
    return v


def expected_depth(sites: int) -> int:
    d = sb.DEFAULT_FREE_DEPTH
    while d < sb.MAX_FREE_DEPTH and \
            sites * sb.FREE_STATES_PER_LEVEL * 2 ** (d + 1) <= sb.FREE_DEPTH_BUDGET:
        d += 1
    return d


def deepest_accepted(fa, wrap, schema, upto=10) -> int:
    """The deepest ``nested(k)`` accepted in the slot ``wrap`` puts it in; every accepted
    instance validates."""
    oracle = jsonschema.Draft202012Validator(schema)
    best = -1
    for k in range(upto + 1):
        inst = wrap(nested(k))
        assert oracle.is_valid(inst)
        ok = accepts(fa, json.dumps(inst, separators=(",", ":")))
        if ok:
            assert best == k - 1, "accepted depths are a prefix"
            best = k
    return best


@pytest.mark.parametrize("sites", [1, 2, 3, 4, 8, 16])
def test_depth_follows_the_number_of_free_values(sites):
    names = [f"p{i}" for i in range(sites)]
    schema = {"type": "object", "properties": {n: {} for n in names}, "required": names,
              "additionalProperties": False}
    _, _, _, b = _auto_tree(schema, None, True, 2, False, "schema", {})
    assert b.free_sites == sites
    fa = compile_json_schema(schema, VOCAB, property_order="schema")
    want = expected_depth(sites)
    assert want >= sb.DEFAULT_FREE_DEPTH
    for slot in (names[0], names[-1]):
        def wrap(v, slot=slot):
            return {n: (v if n == slot else 0) for n in names}
        assert deepest_accepted(fa, wrap, schema) == want, (sites, slot)


def test_a_free_document_is_deep():
    """``{}`` and an object that only says ``additionalProperties: true``: one free-form
    value, the deepest depth."""
    assert deepest_accepted(compile_json_schema({}, VOCAB), lambda v: v, {}) == \
        sb.MAX_FREE_DEPTH
    schema = {"type": "object", "additionalProperties": True}
    fa = compile_json_schema(schema, VOCAB)
    # the document is the object: one level, its extra value the rest
    assert deepest_accepted(fa, lambda v: {"a": v}, schema) == sb.MAX_FREE_DEPTH


def test_inside_products_the_default_depth():
    """A free-form value inside a oneOf branch keeps DEFAULT_FREE_DEPTH (the product's
    operands are determinised within max_product_states); one outside it goes deeper."""
    schema = {"type": "object", "properties": {
        "inner": {"oneOf": [{"type": "object", "properties": {"v": {}}, "required": ["v"],
                             "additionalProperties": False},
                            {"type": "string"}]},
        "outer": {}}, "required": ["inner", "outer"], "additionalProperties": False}
    fa = compile_json_schema(schema, VOCAB, property_order="schema")
    got_in = deepest_accepted(fa, lambda v: {"inner": {"v": v}, "outer": 0}, schema)
    got_out = deepest_accepted(fa, lambda v: {"inner": "s", "outer": v}, schema)
    assert got_in == sb.DEFAULT_FREE_DEPTH
    assert got_out == expected_depth(1)


def test_past_a_limit_the_default_depth():
    """The deeper attempt passes max_dfa_states: the default depth is compiled instead
    (not an error), and the error still comes where the default depth is over it too."""
    schema = {"type": "array", "items": {}}
    limits = CompileLimits(max_dfa_states=2000)
    fa = compile_json_schema(schema, VOCAB, limits=limits)
    assert fa.num_states < 2000
    assert deepest_accepted(fa, lambda v: [v], schema) == sb.DEFAULT_FREE_DEPTH
    from jaxcd.errors import AutomatonTooLargeError
    with pytest.raises(AutomatonTooLargeError, match="max_dfa_states"):
        compile_json_schema(schema, VOCAB, limits=CompileLimits(max_dfa_states=300))


def test_recursion_error_is_a_clear_error():
    """A build deeper than Python's stack raises AutomatonTooLargeError naming the limit
    (a metaschema with dependencies inside recursive $refs hit it with strict=False)."""
    import sys
    from jaxcd.errors import AutomatonTooLargeError
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}, "b": {"$ref": "#"}},
              "dependencies": {"a": ["b"], "b": {"required": ["a"]}}}
    import inspect
    old = sys.getrecursionlimit()
    _auto_tree(schema, None, True, 2, False, "schema", {})     # fine with the default
    sys.setrecursionlimit(len(inspect.stack()) + 60)
    try:
        with pytest.raises(AutomatonTooLargeError, match="recursion limit"):
            _auto_tree(schema, None, True, 2, False, "schema", {})
    finally:
        sys.setrecursionlimit(old)


def test_last_resort_free_values_one_deep():
    """Many open objects over max_nfa_states at the default depth: the builder tries
    free-form values one container deep before refusing; the automaton accepts extra
    properties holding flat containers, refuses nested ones, and every accepted
    instance validates."""
    from jaxcd.automata.schema_builder import SchemaBuilder
    from jaxcd.errors import AutomatonTooLargeError
    props = {f"o{i}": {"type": "object", "properties": {"x": {"type": "integer"}}}
             for i in range(12)}
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    default = SchemaBuilder(schema).build().size
    flat = SchemaBuilder(schema, max_free_depth=1).build().size
    assert flat < default
    limit = (flat + default) // 2
    b = SchemaBuilder(schema, max_nfa_states=limit)
    b.build()
    assert b.free_depth_used == 1
    with pytest.raises(AutomatonTooLargeError, match="free-form values one container deep"):
        SchemaBuilder(schema, max_nfa_states=flat - 1).build()
    fa = compile_json_schema(schema, VOCAB, property_order="schema",
                             limits=CompileLimits(max_nfa_states=limit))
    got = deepest_accepted(fa, lambda v: {"o3": {"x": 1, "extra": v}}, schema)
    assert got == 1


@pytest.mark.parametrize("keyword", ["not", "oneOf", "if"])
def test_subtracted_free_values_cover_any_depth(keyword):
    """A free-form value inside a subtracted operand (not, another oneOf branch, the
    condition of if/else) must contain values of any depth: the positive side can nest
    deeper than the free-form depth. Found on MaskBench's Github_ultra---o65673 (with
    raised product limits): ``not: {allOf: [{required: [site]}, {required: [app]}]}``
    accepted an instance with both keys whose other values nested 4 deep."""
    deep = {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {
        "type": "array", "items": {"type": "array", "items": {"type": "integer"}}}}}}
    base = {"type": "object", "properties": {"a": deep, "b": {"type": "integer"},
                                             "c": {"type": "integer"}},
            "additionalProperties": False}
    both = {"required": ["b", "c"]}          # an object with any other values
    if keyword == "not":
        schema = dict(base, **{"not": both})
    elif keyword == "oneOf":
        schema = dict(base, oneOf=[{"required": ["a"]}, both])
    else:
        schema = dict(base, **{"if": both, "then": False})
    oracle = jsonschema.Draft202012Validator(schema)
    fa = compile_json_schema(schema, VOCAB, property_order="schema")
    for k in range(6):
        v = 1
        for _ in range(k):
            v = [v]
        for inst in ({"a": v, "b": 1, "c": 2}, {"a": v, "b": 1}, {"a": v, "c": 2}):
            if k < 5 and inst.keys() != {"a", "b", "c"} and keyword != "oneOf":
                continue
            text = json.dumps(inst, separators=(",", ":"))
            if accepts(fa, text):
                assert oracle.is_valid(inst), (keyword, text)
    # the invalid deep instance itself
    v = [[[[[1]]]]]
    inst = {"a": v, "b": 1, "c": 2}
    assert not oracle.is_valid(inst)
    assert not accepts(fa, json.dumps(inst, separators=(",", ":")))


@pytest.mark.parametrize("objects", [1, 2, 3])
def test_open_objects_extras_one_level_deeper_when_few(objects):
    """The extra properties of open objects (declared members, no word on others) go
    IMPLICIT_FREE_DEPTH deep when the schema has at most IMPLICIT_FREE_BUDGET's worth of
    free-form values, else the default depth."""
    inner = {f"o{i}": {"type": "object", "properties": {"x": {"type": "integer"}}}
             for i in range(objects - 1)}
    schema = {"type": "object", "properties": dict(inner, x={"type": "integer"})}
    fa = compile_json_schema(schema, VOCAB, property_order="schema")
    n = objects
    want = (sb.IMPLICIT_FREE_DEPTH if n * sb.FREE_STATES_PER_LEVEL * 2 ** sb.IMPLICIT_FREE_DEPTH
            <= sb.IMPLICIT_FREE_BUDGET else sb.DEFAULT_FREE_DEPTH)
    assert deepest_accepted(fa, lambda v: {"x": 1, "extra": v}, schema) == want
    if objects > 1:
        got = deepest_accepted(fa, lambda v: {"o0": {"extra": v}, "x": 1}, schema)
        assert got == want


def test_subtracted_operand_that_does_not_merge():
    """When the positive side and the subtracted schema do not merge (here: tuple
    ``items`` against ``items`` as one schema), the subtracted schema alone is built
    with soup_value free-form values, a superset of any depth: no invalid instance is
    accepted (against jsonschema, draft 7 for the tuple form)."""
    deep = {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {
        "type": "array", "items": {"type": "array", "items": {"type": "integer"}}}}}}
    schema = {"type": "array", "items": [{"type": "integer"}, deep],
              "not": {"type": "array", "items": {"type": "integer"}, "minItems": 1}}
    oracle = jsonschema.Draft7Validator(schema)
    fa = compile_json_schema(schema, VOCAB)
    cases = [[], [1], [1, [[[[[1]]]]]], [1, [[[[[]]]]]], [1, []], [1, [[1]]], ["a"]]
    for inst in cases:
        text = json.dumps(inst, separators=(",", ":"))
        if accepts(fa, text):
            assert oracle.is_valid(inst), text
    assert not oracle.is_valid([1]) and not accepts(fa, "[1]")


def test_subtracted_operand_reused_from_the_memo():
    """A subtracted operand whose product comes from the memo (the same `oneOf` under
    two `not`s) may hold free-form values that were not built again: it is checked like
    a new one (before, the second object accepted its invalid deep instance)."""
    deep = {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {
        "type": "array", "items": {"type": "array", "items": {"type": "integer"}}}}}}
    x = {"oneOf": [{"required": ["b"]}, {"type": "string"}]}

    def obj(name):
        return {"type": "object", "properties": {name: deep, "b": {"type": "integer"}},
                "not": x}
    schema = {"type": "object", "properties": {"p": obj("a"), "q": obj("c")},
              "additionalProperties": False}
    oracle = jsonschema.Draft202012Validator(schema)
    fa = compile_json_schema(schema, VOCAB, property_order="schema")
    cases = [{"p": {"a": [[[[[1]]]]], "b": 1}}, {"q": {"c": [[[[[1]]]]], "b": 1}},
             {"q": {"c": [[[[[1]]]]]}}, {"p": {"a": [[1]]}}, {"q": {"c": [[1]], "b": 1}}]
    for inst in cases:
        text = json.dumps(inst, separators=(",", ":"))
        assert accepts(fa, text) == oracle.is_valid(inst), text


# ---------------------------------------------------------------------------------------
# recursive $refs: one expansion more where the tree stays small (REF_DEPTH_EXTRA)
# ---------------------------------------------------------------------------------------
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "id": {"type": "integer"},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["id"], "additionalProperties": False}},
    "$ref": "#/$defs/node"}


def chain(k: int, kids: int = 1, leaf=0):
    """A tree of ``k`` nodes nested below the root (each with ``kids`` children), its
    leaves' id ``leaf``."""
    v = {"id": leaf}
    for i in range(k):
        v = {"id": i, "kids": [v] * kids}
    return v


def test_recursive_refs_one_level_deeper():
    """The default max_depth expands the recursive $ref twice inside itself; a small
    recursive schema gets one expansion more; every accepted instance validates and the
    deepest accepted one is exactly one level deeper than max_depth gives."""
    _, _, _, b = _auto_tree(TREE, None, True, sb.DEFAULT_MAX_DEPTH, False, "auto", {})
    assert b.ref_cuts > 0
    oracle = jsonschema.Draft202012Validator(TREE)
    deepest = {}
    for extra in (0, sb.REF_DEPTH_EXTRA):
        old = sb.REF_DEPTH_EXTRA
        sb.REF_DEPTH_EXTRA = extra
        try:
            fa = compile_json_schema(TREE, VOCAB)
        finally:
            sb.REF_DEPTH_EXTRA = old
        best = -1
        for k in range(8):
            for kids, leaf in ((1, 0), (2, 0), (1, "x"), (2, 1.5)):
                inst = chain(k, kids, leaf)
                ok = accepts(fa, json.dumps(inst, separators=(",", ":")))
                if ok:
                    assert oracle.is_valid(inst), inst          # sound
                assert oracle.is_valid(inst) == (leaf == 0)
                if ok and kids == 1:
                    best = max(best, k)
        deepest[extra] = best
    assert deepest[0] >= 1
    assert deepest[sb.REF_DEPTH_EXTRA] == deepest[0] + sb.REF_DEPTH_EXTRA


def test_recursive_refs_deeper_only_within_the_growth():
    """Past REF_DEPTH_GROWTH (here 1: any growth) the max_depth tree is compiled; past
    a compile limit at the deeper depth too (no schema that compiled before is
    refused)."""
    deep = compile_json_schema(TREE, VOCAB)
    old = sb.REF_DEPTH_EXTRA
    sb.REF_DEPTH_EXTRA = 0
    try:
        plain = compile_json_schema(TREE, VOCAB)
    finally:
        sb.REF_DEPTH_EXTRA = old
    assert plain.num_states < deep.num_states
    old = sb.REF_DEPTH_GROWTH
    sb.REF_DEPTH_GROWTH = 1.0
    try:
        assert compile_json_schema(TREE, VOCAB).num_states == plain.num_states
    finally:
        sb.REF_DEPTH_GROWTH = old
    # a limit under the deeper automaton: a smaller one (max_depth, here in the
    # schema's order as well), not an error
    got = compile_json_schema(TREE, VOCAB, limits=CompileLimits(
        max_dfa_states=plain.num_states + 1))
    assert got.num_states <= plain.num_states
    assert accepts(got, json.dumps(chain(1), separators=(",", ":")))


def test_empty_language_at_the_recursion_cut_names_max_depth():
    """A schema whose values all nest deeper than the recursion is expanded (here: none
    stops, every node requires a child) is an empty language, and the error says that
    the cut did it and which max_depth it was."""
    from jaxcd.errors import EmptyLanguageError
    schema = {"$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}},
                              "required": ["c"]}}, "$ref": "#/$defs/n"}
    with pytest.raises(EmptyLanguageError, match=r"recursive \$refs were expanded at most "
                                                  r"max_depth=\d+ times"):
        compile_json_schema(schema, VOCAB)
    with pytest.raises(EmptyLanguageError) as e:          # no recursion: the plain message
        compile_json_schema({"type": "string", "minLength": 3, "maxLength": 2,
                             "allOf": [{"minLength": 3}]}, VOCAB)
    assert "max_depth" not in str(e.value)
