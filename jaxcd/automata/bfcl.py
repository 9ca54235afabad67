"""BFCL function documents -> JSON Schema (host side).

The Berkeley Function Calling Leaderboard (``bfcl-eval``) writes parameter schemas
with pseudo-types: ``dict``, ``float``, ``tuple``, ``any`` and Java/JavaScript names
(``HashMap``, ``ArrayList``, ``long``, ...). :func:`bfcl_to_json_schema` maps them to
JSON Schema the way BFCL's own OpenAI converter does (``GORILLA_TO_OPENAPI``), with
one deliberate difference by default: ``any`` becomes "any JSON value" (the type is
dropped) instead of BFCL's ``string``; ``any_as_string=True`` keeps BFCL's ``string``
(its AST checker reads ``any`` as Python ``str``, so that is what it scores as right).
Objects that declare properties get ``additionalProperties: false`` unless they say
otherwise: a call's arguments are exactly its parameters.
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


def bfcl_to_json_schema(parameters: Any, any_as_string: bool = False) -> Any:
    """JSON Schema for a BFCL ``parameters`` object (a deep copy; input untouched).
    Unknown type names become ``string`` (as BFCL's converter does); ``any`` becomes
    any JSON value, or ``string`` with ``any_as_string``."""
    return _convert(copy.deepcopy(parameters), any_as_string)


def _convert(s: Any, any_as_string: bool = False) -> Any:
    if not isinstance(s, dict):
        return s
    t = s.get("type")
    if any_as_string and isinstance(t, str) and t in ANY_TYPES:
        t = s["type"] = "string"
    elif any_as_string and isinstance(t, list):
        t = s["type"] = ["string" if x in ANY_TYPES else x for x in t]
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
    sub = lambda v: _convert(v, any_as_string)                       # noqa: E731
    if isinstance(s.get("properties"), dict):
        s["properties"] = {k: sub(v) for k, v in s["properties"].items()}
    if isinstance(s.get("items"), dict):
        s["items"] = sub(s["items"])
    elif isinstance(s.get("items"), list):
        s["items"] = [sub(v) for v in s["items"]]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(s.get(key), list):
            s[key] = [sub(v) for v in s[key]]
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = sub(s["additionalProperties"])
    # BFCL's `optional` flag and a `required` that is not a list are not JSON Schema
    s.pop("optional", None)
    if "required" in s and not isinstance(s["required"], list):
        del s["required"]
    # a tool call's arguments are exactly its parameters: objects that declare
    # properties are closed (JSON Schema's default would allow any other key)
    if s.get("type") == "object" and isinstance(s.get("properties"), dict) \
            and "additionalProperties" not in s:
        s["additionalProperties"] = False
    return s


def function_to_schema(function: dict, any_as_string: bool = False) -> dict:
    """JSON Schema of a BFCL function's arguments object."""
    params = function.get("parameters") or {"type": "dict", "properties": {}}
    return bfcl_to_json_schema(params, any_as_string)
