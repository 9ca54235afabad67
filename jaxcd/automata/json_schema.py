"""JSON Schema -> byte automaton (host side), with jaxcd's own builder.

:mod:`jaxcd.automata.schema_builder` turns the schema into an expression tree and
builds the NFA directly (linear in the ``$ref``-expanded schema). Supported keywords,
annotations and every deliberate difference from the specification and from other
engines are listed in ``docs/json_schema.md``. In short:

- properties appear in the schema's order; optional ones may be omitted; with
  ``properties`` and no ``additionalProperties`` the object is closed (outlines-core's
  and xgrammar's convention), extra properties (``additionalProperties``,
  ``patternProperties``) come after the declared ones and never repeat a declared key;
- strings exclude control characters U+0000-U+001F and U+007F-U+009F and allow the
  escapes ``\\" \\\\ \\/ \\b \\f \\n \\r \\t`` but not ``\\uXXXX`` (outlines-core's set);
- integers allow ``-0``; numbers allow exponents, except under numeric bounds or a
  decimal ``multipleOf`` where the number text has no exponent (bounds are exact);
- free whitespace between tokens follows ``whitespace_pattern`` (default ``[ ]?``;
  pass ``""`` for compact JSON);
- ``strict=True`` refuses keywords that would not be enforced (``uniqueItems`` past
  its limits, ``$dynamicRef``, ...); annotations (``description``, ``x-*``, ...) are
  always accepted; ``strict=False`` ignores what cannot be enforced.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from ..errors import SchemaError
from .fsa import NFA
from . import schema_builder as _sb
from .schema_builder import (AUTO_DFA_CAP, DEFAULT_MAX_DEPTH, FORMATS, NOT_ENFORCED,
                             LOOSE_ORDER, PROPERTY_ORDERS, STRUCTURAL, Node,
                             UNSUPPORTED_FORMATS, SchemaBuilder, is_annotation, to_nfa,
                             to_regex)

__all__ = ["load_schema", "schema_to_nfa", "schema_to_regex", "strip_unenforced",
           "DEFAULT_MAX_DEPTH"]

_SUB_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SUB_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SUB_ONE = ("additionalProperties", "items", "propertyNames", "additionalItems", "not", "if",
            "then", "else", "unevaluatedProperties", "unevaluatedItems", "contains")


def load_schema(schema: Any) -> tuple[Any, str]:
    """``(schema object, canonical JSON text)`` from a dict, bool or JSON text."""
    if isinstance(schema, (bytes, bytearray)):
        schema = schema.decode("utf-8")
    if isinstance(schema, str):
        try:
            obj = json.loads(schema)
        except json.JSONDecodeError as e:
            raise SchemaError(f"schema is not valid JSON: {e}") from None
    else:
        obj = schema
    if not isinstance(obj, (dict, bool)):
        raise SchemaError(f"a JSON Schema must be an object or boolean, got {type(obj).__name__}")
    bad = _non_json_number(obj)
    if bad is not None:
        raise SchemaError(f"{bad[0] or '/'} is {bad[1]}, which is not a JSON number (JSON has "
                          "no NaN or Infinity): the schema is not JSON")
    return obj, json.dumps(obj, sort_keys=False)


def _non_json_number(obj: Any) -> tuple[str, float] | None:
    """``(JSON pointer, value)`` of the first NaN or infinite float in ``obj`` (Python's
    ``json`` reads and writes them, JSON has none: an ``enum`` of ``NaN`` would make the
    automaton accept the text ``NaN``, a ``minimum`` of ``Infinity`` has no bound), or
    None."""
    stack = [("", obj)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return path, x
        if isinstance(x, dict):
            stack.extend((f"{path}/{k}", v) for k, v in x.items())
        elif isinstance(x, (list, tuple)):
            stack.extend((f"{path}/{i}", v) for i, v in enumerate(x))
    return None


def _builder(obj, whitespace_pattern, strict, max_depth, closed_objects=False,
             property_order="auto") -> SchemaBuilder:
    ws = "[ ]?" if whitespace_pattern is None else whitespace_pattern
    if property_order not in PROPERTY_ORDERS and property_order != LOOSE_ORDER:
        raise ValueError(f"property_order must be one of {PROPERTY_ORDERS}, got "
                         f"{property_order!r}")
    return SchemaBuilder(obj, whitespace=ws, strict=strict, max_depth=max_depth,
                         closed_objects=bool(closed_objects), property_order=property_order)


def schema_to_nfa(schema: dict | str, whitespace_pattern: str | None = None,
                  strict: bool = True, max_depth: int = DEFAULT_MAX_DEPTH, *,
                  closed_objects: bool = False,
                  property_order: str = "schema",
                  repeated_keys: bool = True) -> tuple[NFA, str]:
    """``(byte NFA, canonical schema JSON)`` for a JSON Schema. ``closed_objects``:
    objects that declare properties accept no other key (the default follows the
    specification: extra keys are allowed unless ``additionalProperties: false``).
    ``property_order``: ``"schema"`` (this low-level function's default, which
    experiments/bfcl.py relies on: declared properties in the schema's order, extra ones
    after them), ``"auto"`` (:func:`jaxcd.compile_json_schema`'s default: declared
    properties in any order for objects within a budget, else the schema's order) or
    ``"any"`` (any order; an error past its limits).
    ``repeated_keys`` (``"auto"`` only): as for :func:`jaxcd.compile_json_schema`. See
    docs/json_schema.md."""
    obj, text = load_schema(schema)
    b = _builder(obj, whitespace_pattern, strict, max_depth, closed_objects, property_order)
    b.auto_loose = b.auto_loose and bool(repeated_keys)
    node = b.build()
    return to_nfa(node, b.whitespace), text


def _auto_tree(schema: dict | str, whitespace_pattern, strict, max_depth, closed_objects,
               property_order, string_memo: dict, site_free_depth: tuple | None = None,
               like=None, count_budget: int | None = None, repeated_keys: bool = True):
    """``(tree, whitespace, canonical text, builder)`` for :func:`jaxcd.compile_json_schema`:
    its attempts share ``string_memo`` (string nodes do not depend on the order).
    ``site_free_depth``: the depths of free-form values outside products, written ones
    and open objects' extras, and their tails' object levels
    (:meth:`SchemaBuilder.adaptive_free_depth`); ``like``: an
    earlier builder of the same order and depth whose product nodes are reused
    (products keep the default depth); ``count_budget``: see
    :attr:`SchemaBuilder.count_budget`; ``repeated_keys``: see
    :func:`jaxcd.compile_json_schema` (``SchemaBuilder.auto_loose``)."""
    obj, text = load_schema(schema)
    b = _builder(obj, whitespace_pattern, strict, max_depth, closed_objects, property_order)
    b.count_budget = count_budget
    b.auto_loose = b.auto_loose and bool(repeated_keys)
    b._string_memo = string_memo
    b._shared_products = string_memo.setdefault("shared products", {})
    if site_free_depth is not None:
        b.site_free_depth, b.implicit_free_depth = site_free_depth[:2]
        b.free_tail = site_free_depth[2] if len(site_free_depth) > 2 else 0
    if like is not None:
        b._product_memo = {k: v for k, v in like._product_memo.items()
                           if not isinstance(v, Exception)}
    node = b.build()
    if b.auto_used and AUTO_DFA_CAP:
        # an order-free form past this many DFA states: compile_json_schema falls back
        # to the schema's order (cheaper than determinising on to max_dfa_states)
        # deeper free-form values may add up to FREE_DEPTH_BUDGET DFA states, and their
        # size estimates to the early refusal's thresholds
        cap, extra = AUTO_DFA_CAP, 0
        if site_free_depth is not None:
            cap += _sb.FREE_DEPTH_BUDGET + _sb.IMPLICIT_FREE_BUDGET
            base = b.any_value(b.free_depth).size
            extra = (b.free_sites * (b.any_value(site_free_depth[0], b.free_tail).size - base)
                     + b.implicit_sites * (b.any_value(site_free_depth[1],
                                                       b.free_tail).size - base))
        node = Node("capped", (node, cap, extra), node.size)
    return node, b.whitespace, text, b


def schema_to_regex(schema: dict | str, whitespace_pattern: str | None = None,
                    strict: bool = True, max_depth: int = DEFAULT_MAX_DEPTH, *,
                    closed_objects: bool = False,
                    property_order: str = "schema") -> tuple[str, str]:
    """``(regex, canonical schema JSON)``: a Python regex (use ``re.ASCII``) with the
    language :func:`schema_to_nfa` builds, for schemas that have a printable form
    (``pattern``, ``multipleOf``, numeric bounds on numbers with a decimal step and
    ``minProperties``/``maxProperties`` do not: they raise
    :class:`~jaxcd.automata.schema_builder.NoRegexForm`)."""
    obj, text = load_schema(schema)
    b = _builder(obj, whitespace_pattern, strict, max_depth, closed_objects, property_order)
    return to_regex(b.build(), b.whitespace), text


def strip_unenforced(schema: Any) -> Any:
    """A copy of ``schema`` without the keywords a ``strict=False`` build ignores
    (what ``jaxcd generate --no-strict`` compiles with the default strict check)."""
    if isinstance(schema, (str, bytes, bytearray)):
        schema, _ = load_schema(schema)
    schema = copy.deepcopy(schema)
    if isinstance(schema, dict):
        # references resolved against $id base URIs become pointers (kept below), and
        # unevaluatedProperties/Items become fixed-scope keywords (dropped where a
        # strict=False build ignores them)
        b = SchemaBuilder(schema, strict=False)
        b._absolute_refs()
        b._scope_unevaluated()
        schema = b.root
    return _strip(schema)


def _strip(s: Any) -> Any:
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if is_annotation(k):
            out[k] = v
            continue
        if k in NOT_ENFORCED or (k not in STRUCTURAL and k not in ("$defs", "definitions")):
            continue
        if k == "uniqueItems" and v is True:
            continue
        if k == "format" and v in UNSUPPORTED_FORMATS:
            continue
        if k == "$ref" and isinstance(v, str) and not v.startswith("#"):
            continue                       # outside the document: read as any value
        if k in _SUB_MAPS and isinstance(v, dict):
            v = {name: _strip(sub) for name, sub in v.items()}
        elif k in _SUB_LISTS and isinstance(v, list):
            v = [_strip(sub) for sub in v]
        elif k in _SUB_ONE and isinstance(v, dict):
            v = _strip(v)
        elif k == "items" and isinstance(v, list):
            v = [_strip(sub) for sub in v]
        out[k] = v
    return out


SUPPORTED_FORMATS = sorted(FORMATS)
