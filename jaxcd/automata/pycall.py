"""Python-style function calls from a tool's JSON Schema: ``name(arg=value, ...)``.

Accepted tool formats: ``{"name": ..., "parameters": {...}}`` (OpenAI function),
``{"type": "function", "function": {...}}``, or a bare object schema with a
``title`` used as the name. Arguments appear in the order of ``properties``,
separated by ``", "``; required ones must appear, optional ones may be omitted.
Values are Python literals:

- string: ``'...'`` (no raw control characters; escapes ``\\' \\\\ \\n \\t``),
  honouring ``minLength``/``maxLength`` (in characters);
- integer: ``-?(0|[1-9][0-9]*)``; number: integer with optional fraction/exponent;
- boolean: ``True``/``False``; null: ``None``;
- ``enum``/``const``: the ``repr`` of each value;
- array: ``[v, v, ...]`` of a supported item type, honouring ``minItems``/``maxItems``;
- ``anyOf`` / a list of types: alternatives.
Nested objects are not supported (raise :class:`UnsupportedSchemaError`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import SchemaError, UnsupportedSchemaError
from .fsa import NFA
from .regex import regex_to_nfa

_STR_CHAR = r"(?:[^'\\\x00-\x1f\x7f]|\\['\\nt])"
_INT = r"-?(?:0|[1-9][0-9]*)"
_NUM = _INT + r"(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ALLOWED = {"type", "enum", "const", "minLength", "maxLength", "items", "minItems",
            "maxItems", "anyOf", "title", "description", "default", "examples"}


def _repeat(lo: int | None, hi: int | None) -> str:
    lo = int(lo or 0)
    return f"{{{lo},}}" if hi is None else f"{{{lo},{int(hi)}}}"


def value_regex(schema: Any, where: str) -> str:
    if schema is True or schema == {}:
        raise UnsupportedSchemaError(f"{where}: an unconstrained value cannot be written as a "
                                     "regular Python literal; give it a type")
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: schema must be an object")
    for k in schema:
        if k not in _ALLOWED:
            raise UnsupportedSchemaError(f"unsupported keyword {k!r} at {where} in a Python-style "
                                         "call argument")
    if "const" in schema:
        return re.escape(repr(schema["const"]))
    if "enum" in schema:
        return "(?:" + "|".join(re.escape(repr(v)) for v in schema["enum"]) + ")"
    if "anyOf" in schema:
        return "(?:" + "|".join(value_regex(s, f"{where}/anyOf/{i}")
                                for i, s in enumerate(schema["anyOf"])) + ")"
    t = schema.get("type")
    if isinstance(t, list):
        return "(?:" + "|".join(value_regex({**schema, "type": x}, where) for x in t) + ")"
    if t == "string":
        return "'" + _STR_CHAR + _repeat(schema.get("minLength"), schema.get("maxLength")) + "'"
    if t == "integer":
        return _INT
    if t == "number":
        return _NUM
    if t == "boolean":
        return "(?:True|False)"
    if t == "null":
        return "None"
    if t == "array":
        if "items" not in schema:
            raise UnsupportedSchemaError(f"{where}: arrays need an 'items' schema")
        item = value_regex(schema["items"], f"{where}/items")
        lo, hi = int(schema.get("minItems", 0)), schema.get("maxItems")
        if hi is not None and int(hi) == 0:
            return r"\[\]"
        tail_lo = max(lo - 1, 0)
        tail_hi = None if hi is None else int(hi) - 1
        body = f"{item}(?:, {item}){_repeat(tail_lo, tail_hi)}"
        return rf"\[{body}\]" if lo >= 1 else rf"\[(?:{body})?\]"
    raise UnsupportedSchemaError(f"{where}: unsupported type {t!r} for a Python-style call "
                                 "argument (supported: string, integer, number, boolean, null, "
                                 "array, enum, const, anyOf)")


def parse_tool(tool: dict | str) -> tuple[str, dict]:
    if isinstance(tool, str):
        try:
            tool = json.loads(tool)
        except json.JSONDecodeError as e:
            raise SchemaError(f"tool schema is not valid JSON: {e}") from None
    if not isinstance(tool, dict):
        raise SchemaError("a tool must be a JSON object")
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        tool = tool["function"]
    if "parameters" in tool:
        name, params = tool.get("name"), tool["parameters"]
    else:
        name, params = tool.get("title"), tool
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise SchemaError(f"tool name {name!r} is not a Python identifier")
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise SchemaError(f"tool {name!r}: parameters must be an object schema")
    return name, params


def tool_call_nfa(tool: dict | str) -> NFA:
    name, params = parse_tool(tool)
    props = params.get("properties", {})
    required = set(params.get("required", []))
    unknown = required - set(props)
    if unknown:
        raise SchemaError(f"tool {name!r}: required arguments {sorted(unknown)} have no schema")
    nfa = NFA()
    start = nfa.add_state()
    nfa.start = start
    cur = nfa.add_state()
    nfa.add_string(start, cur, name + "(")
    # states[i][e]: before argument i, e = whether an argument was written already
    states = [[cur, nfa.add_state()]] + [[nfa.add_state(), nfa.add_state()] for _ in props]
    for i, (arg, sub) in enumerate(props.items()):
        if not _IDENT.fullmatch(arg):
            raise SchemaError(f"tool {name!r}: argument name {arg!r} is not a Python identifier")
        val = regex_to_nfa(value_regex(sub, f"/properties/{arg}"))
        for e in (0, 1):
            src = states[i][e]
            if arg not in required:
                nfa.add_epsilon(src, states[i + 1][e])
            mid = nfa.add_state()
            nfa.add_string(src, mid, (", " if e else "") + arg + "=")
            vs, vacc = nfa.embed(val)
            nfa.add_epsilon(mid, vs)
            for a in vacc:
                nfa.add_epsilon(a, states[i + 1][1])
    end = nfa.add_state(accepting=True)
    for e in (0, 1):
        nfa.add_string(states[-1][e], end, ")")
    return nfa
