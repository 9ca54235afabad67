"""Free-form values' tails: below its exact depth, a free-form value outside automaton
products continues along the path of objects from its top (``FREE_TAIL_DEPTH`` object
levels), with arrays of scalars at every level of that path and at the cut of every
other path (``SchemaBuilder.any_value(depth, tail)``).

References: the acceptance rule restated here independently of the builder, checked
exactly on a seeded universe of JSON values; every accepted text parses as JSON
(random walks through the automaton); ``jsonschema`` validates every instance that
``compile_json_schema`` accepts.
"""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

import jaxcd.automata.schema_builder as sb
from ascii_vocab import VOCAB, accepts
from jaxcd import compile_json_schema
from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.schema_builder import SchemaBuilder, to_nfa



def _is_scalar(v) -> bool:
    return not isinstance(v, (dict, list))


def _tail_ok(v, k: int) -> bool:
    """A scalar, an array of scalars, or (k >= 1) an object of tail_ok(k - 1) values."""
    if _is_scalar(v):
        return True
    if isinstance(v, list):
        return all(map(_is_scalar, v))
    return k >= 1 and all(_tail_ok(x, k - 1) for x in v.values())


def fits(v, depth: int, tail: int) -> bool:
    """The rule restated: ``tail`` is the object levels left on the all-object path
    (0: none, -1: off that path, arrays of scalars at the cut only)."""
    if _is_scalar(v):
        return True
    if depth == 0:
        return tail != 0 and _tail_ok(v, max(tail, 0))
    if isinstance(v, list):
        return all(fits(x, depth - 1, -1 if tail else 0) for x in v)
    return all(fits(x, depth - 1, tail) for x in v.values())


def _random_value(rng, depth):
    r = rng.random()
    if depth == 0 or r < 0.25:
        return rng.choice([1, "s", None, True])
    if r < 0.6:
        return {f"k{i}": _random_value(rng, depth - 1) for i in range(rng.randint(0, 2))}
    return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 2))]


def _chain(levels: int, leaf=1):
    v = leaf
    for i in range(levels):
        v = {f"k{i}": v}
    return v


@pytest.mark.parametrize("depth,tail", [(1, 2), (2, 3), (3, 4), (2, 0)])
def test_tail_rule_exactly_on_a_universe(depth, tail):
    b = SchemaBuilder({}, whitespace="")
    d = minimize(determinize(to_nfa(b.any_value(depth, tail), "")))
    rng = random.Random(depth * 10 + tail)
    values = [_random_value(rng, depth + tail + 2) for _ in range(3000)]
    values += [_chain(n) for n in range(depth + tail + 3)]
    values += [_chain(n, leaf=[1, "s"]) for n in range(depth + tail + 3)]
    n_deep = 0
    for v in values:
        want = fits(v, depth, tail)
        assert d.accepts(json.dumps(v, separators=(",", ":")).encode()) == want, v
        n_deep += want and not fits(v, depth, 0)
    if tail:
        assert n_deep > 0                 # the tail does accept values past the depth
        assert d.accepts(json.dumps(_chain(depth + tail, [1])).replace(" ", "").encode())
        assert not d.accepts(json.dumps(_chain(depth + tail + 1)).replace(" ", "").encode())


def test_every_accepted_text_is_json():
    """Random walks through the automaton of a tailed free-form value: each accepted
    text parses as JSON."""
    b = SchemaBuilder({}, whitespace="[ ]?")
    d = minimize(determinize(to_nfa(b.any_value(2, 3), "[ ]?")))
    rng = np.random.default_rng(0)
    reps = np.unique(d.byte_class, return_index=True)[1]
    found = 0
    for _ in range(2000):
        q, out = 0, []
        for _ in range(60):
            if d.accepting[q] and rng.random() < 0.15:
                break
            nxt = [(c, int(d.trans[q, c])) for c in range(d.trans.shape[1])
                   if d.trans[q, c] >= 0]
            if not nxt:
                break
            c, q = nxt[rng.integers(len(nxt))]
            out.append(int(reps[c]))
        if d.accepting[q]:
            json.loads(bytes(out).decode("utf-8", errors="strict"))
            found += 1
    assert found > 200


def _expected(sites: int) -> tuple[int, int]:
    """(exact depth, tail levels) of ``sites`` written free-form values, recomputed from
    the budget rules (the sizes are the builder's tree estimates)."""
    d = sb.DEFAULT_FREE_DEPTH
    while d < sb.MAX_FREE_DEPTH and \
            sites * sb.FREE_STATES_PER_LEVEL * 2 ** (d + 1) <= sb.FREE_DEPTH_BUDGET:
        d += 1
    b = SchemaBuilder({}, whitespace="[ ]?")
    grow = b.any_value(d, sb.FREE_TAIL_DEPTH).size - b.any_value(d).size
    return d, sb.FREE_TAIL_DEPTH if sites * grow <= sb.FREE_TAIL_BUDGET else 0


@pytest.mark.parametrize("sites", [1, 4, 8])
def test_compile_json_schema_free_values_take_tails(sites):
    """Written free-form values (Kubernetes' RawExtension and FieldsV1 are such objects):
    the exact depth the budget affords, then the tail's object levels where its budget
    allows; a longer chain of objects is refused, and jsonschema validates whatever is
    accepted. Tails are built for some of these counts (the test would not see them
    otherwise)."""
    names = [f"p{i}" for i in range(sites)]
    schema = {"type": "object", "properties": {n: {"type": "object"} for n in names},
              "required": names, "additionalProperties": False}
    fa = compile_json_schema(schema, VOCAB)
    oracle = jsonschema.Draft202012Validator(schema)
    d, tail = _expected(sites)
    # the object of the property is the schema's; its member values are the free ones
    for n in range(0, d + tail + 3):
        v = _chain(n, leaf=["a", 1])                        # n objects, then an array
        inst = {k: ({"m": v} if k == names[-1] else {}) for k in names}
        assert oracle.is_valid(inst)
        ok = accepts(fa, json.dumps(inst, separators=(",", ":")))
        # the free value: n objects and the array; exact up to d containers, else the
        # tail's objects along the all-object path with the array at its end
        assert ok == (n + 1 <= d or (tail > 0 and n <= d + tail)), (sites, n, ok, d, tail)


def test_some_counts_take_tails():
    assert any(_expected(s)[1] for s in (1, 4, 8))


def test_no_tail_inside_products():
    """A free-form value inside a oneOf branch keeps the default depth, no tail."""
    schema = {"type": "object", "properties": {
        "inner": {"oneOf": [{"type": "object", "properties": {"v": {}}, "required": ["v"],
                             "additionalProperties": False},
                            {"type": "string"}]}},
        "required": ["inner"], "additionalProperties": False}
    fa = compile_json_schema(schema, VOCAB)
    d = sb.DEFAULT_FREE_DEPTH
    assert accepts(fa, json.dumps({"inner": {"v": _chain(d)}}, separators=(",", ":")))
    assert not accepts(fa, json.dumps({"inner": {"v": _chain(d + 1)}},
                                       separators=(",", ":")))
