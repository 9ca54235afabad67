"""JSON Schema -> regex, with outlines-core's builder (host side).

We delegate to ``outlines_core.json_schema.build_regex_from_schema`` so that JSON
semantics (string escapes, number syntax, property order, ``$ref``) match an
established engine exactly. outlines-core silently ignores keywords it does not
enforce (``minimum``, ``uniqueItems``, ...); we refuse them instead (``strict=True``)
so a user never believes a constraint is enforced when it is not.

Known semantics inherited from outlines-core (documented in the README):
- properties appear in the schema's order; optional ones may be omitted;
- strings exclude control characters U+0000–U+001F and U+007F–U+009F and allow the
  escapes ``\\" \\\\ \\/ \\b \\f \\n \\r \\t`` but not ``\\uXXXX``;
- integers allow ``-0``; numbers allow exponents;
- free whitespace between tokens follows ``whitespace_pattern`` (default ``[ ]?``;
  pass ``""`` for compact JSON).
Shorthand classes in the generated regex (``\\d`` in ``format: date``) are ASCII.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import SchemaError, UnsupportedSchemaError

# Keywords that outlines-core turns into regex structure.
_STRUCTURAL = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
    "minLength", "maxLength", "pattern", "format", "minItems", "maxItems",
}
# Annotations with no effect on the language.
_ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "$anchor",
}
_FORMATS = {"date-time", "date", "time", "uuid", "uri", "email"}
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")


def _check(schema: Any, path: str) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError(f"schema at {path or '/'} must be an object or boolean, "
                          f"got {type(schema).__name__}")
    for key, value in schema.items():
        where = f"{path}/{key}"
        if key not in _STRUCTURAL and key not in _ANNOTATIONS:
            raise UnsupportedSchemaError(
                f"unsupported JSON Schema keyword {key!r} at {where}: it would not be "
                "enforced; remove it (or pass strict=False to ignore it knowingly)")
        if key == "format" and value not in _FORMATS:
            raise UnsupportedSchemaError(
                f"unsupported string format {value!r} at {where} "
                f"(supported: {', '.join(sorted(_FORMATS))})")
        if key in _SUBSCHEMA_MAPS:
            if not isinstance(value, dict):
                raise SchemaError(f"{where} must be an object")
            for name, sub in value.items():
                _check(sub, f"{where}/{name}")
        elif key in _SUBSCHEMA_LISTS:
            if not isinstance(value, list):
                raise SchemaError(f"{where} must be an array")
            for i, sub in enumerate(value):
                _check(sub, f"{where}/{i}")
        elif key in ("items", "additionalProperties") and isinstance(value, (dict, bool)):
            _check(value, where)


def schema_to_regex(schema: dict | str, whitespace_pattern: str | None = None,
                    strict: bool = True) -> tuple[str, str]:
    """Return ``(regex, canonical_schema_json)`` for a JSON Schema (dict or JSON text)."""
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
        raise SchemaError(f"a JSON Schema must be an object, got {type(obj).__name__}")
    if strict:
        _check(obj, "")
    text = json.dumps(obj, sort_keys=False)
    from outlines_core.json_schema import build_regex_from_schema
    try:
        if whitespace_pattern is None:
            regex = build_regex_from_schema(text)
        else:
            regex = build_regex_from_schema(text, whitespace_pattern=whitespace_pattern)
    except Exception as e:  # outlines-core raises ValueError/TypeError with its own text
        raise UnsupportedSchemaError(f"outlines-core could not compile the schema: {e}") from None
    return regex, text
