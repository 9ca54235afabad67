"""BFCL function documents -> JSON Schema (host side).

The Berkeley Function Calling Leaderboard (``bfcl-eval``) writes parameter schemas
with pseudo-types: ``dict``, ``float``, ``tuple``, ``any`` and Java/JavaScript names
(``HashMap``, ``ArrayList``, ``long``, ...). :func:`bfcl_to_json_schema` maps them to
JSON Schema the way BFCL's own OpenAI converter does (``GORILLA_TO_OPENAPI``), with
one deliberate difference: ``any`` becomes "any JSON value" (the type is dropped)
instead of BFCL's ``string``.
"""

from __future__ import annotations

import copy
from typing import Any

TYPE_MAP = {
    "integer": "integer", "number": "number", "float": "number", "double": "number",
    "string": "string", "String": "string", "char": "string",
    "boolean": "boolean", "bool": "boolean", "Boolean": "boolean",
    "array": "array", "list": "array", "tuple": "array", "ArrayList": "array",
    "Array": "array", "Queue": "array", "Stack": "array",
    "dict": "object", "object": "object", "HashMap": "object", "Hashtable": "object",
    "byte": "integer", "short": "integer", "long": "integer", "Bigint": "integer",
    "null": "null",
}
ANY_TYPES = {"any", "Any"}


def bfcl_to_json_schema(parameters: Any) -> Any:
    """JSON Schema for a BFCL ``parameters`` object (a deep copy; input untouched).
    Unknown type names become ``string`` (as BFCL's converter does)."""
    return _convert(copy.deepcopy(parameters))


def _convert(s: Any) -> Any:
    if not isinstance(s, dict):
        return s
    t = s.get("type")
    if isinstance(t, str):
        if t in ANY_TYPES:
            del s["type"]
        else:
            s["type"] = TYPE_MAP.get(t, "string")
    elif isinstance(t, list):
        mapped = [TYPE_MAP.get(x, "string") for x in t if x not in ANY_TYPES]
        if len(mapped) < len(t):
            del s["type"]
        else:
            s["type"] = list(dict.fromkeys(mapped))
    if isinstance(s.get("properties"), dict):
        s["properties"] = {k: _convert(v) for k, v in s["properties"].items()}
    if isinstance(s.get("items"), dict):
        s["items"] = _convert(s["items"])
    elif isinstance(s.get("items"), list):
        s["items"] = [_convert(v) for v in s["items"]]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(s.get(key), list):
            s[key] = [_convert(v) for v in s[key]]
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = _convert(s["additionalProperties"])
    # BFCL's `optional` flag and a `required` that is not a list are not JSON Schema
    s.pop("optional", None)
    if "required" in s and not isinstance(s["required"], list):
        del s["required"]
    return s


def function_to_schema(function: dict) -> dict:
    """JSON Schema of a BFCL function's arguments object."""
    params = function.get("parameters") or {"type": "dict", "properties": {}}
    return bfcl_to_json_schema(params)
