"""JSON Schema -> byte NFA, built directly (host side). See docs/json_schema.md.

The schema is first turned into a small expression tree (:class:`Node`), which has two
back-ends:

- :meth:`SchemaBuilder.to_nfa` (what :func:`jaxcd.compile_json_schema` uses): a
  Thompson-style NFA in which every subschema appears once per place it is used.
  Objects with optional properties are built as a linear chain (one copy of each
  property, whatever subset is present), arrays and free-form objects as loops, so the
  NFA grows linearly with the (``$ref``-expanded) schema. This is what keeps large real
  schemas small: outlines-core's regex for the same object repeats every optional
  property once per possible predecessor (quadratic per level, exponential with
  nesting).
- :meth:`SchemaBuilder.to_regex`: a Python regex with the same language, for schemas
  small enough to print (the tests use it as an independent ``re`` oracle). Some nodes
  (``pattern``, ``multipleOf``, property counts) have no regex form; it raises.

Conventions follow outlines-core's builder where the semantics coincide (its string
and number regexes, its whitespace placement, closed objects when ``properties`` is
given), so regexes for plain schemas are the ones outlines-core prints.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
from collections import Counter
import re
import sys
import re._constants as C
import re._parser as P
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import numpy as np

from ..errors import (AutomatonTooLargeError, RegexSyntaxError, SchemaError,
                      UnsupportedRegexError, UnsupportedSchemaError)
from ..limits import current_limits, too_large
from .fsa import (DFA, NFA, concat, determinize, difference, intersect, is_empty,
                  minimize, union)
from .numeric import (ceil_int, decimal_range_regex, floor_int, int_range_regex,
                      multiple_of_dfa, decimal_multiple_of_dfa, to_decimal)
from .regex import _Builder, anchor_product, regex_to_nfa
from .utf8 import MAX_CODE_POINT, normalize_ranges

DEFAULT_MAX_DEPTH = 2
# strict mode: a maxLength above max_count is enforced as this tighter bound
TIGHT_MAX_LENGTH = 256
# maxItems: an array automaton holds one copy of the item per counted item; past this
# many NFA states the bound is tightened, to at least TIGHT_MIN_ITEMS items (a
# subtracted operand drops it instead)
MAX_COUNTED_ITEM_STATES = 2048
TIGHT_MIN_ITEMS = 8
DEFAULT_FREE_DEPTH = 3            # containers nested in a free-form value
# compile_json_schema: free-form values outside automaton products are built deeper when
# the schema has few of them: the deepest d <= MAX_FREE_DEPTH with (free-form values) x
# FREE_STATES_PER_LEVEL x 2^d <= FREE_DEPTH_BUDGET (the minimal DFA of a free-form value
# of depth d has ~80 x 2^d states: it remembers whether each open container is an array
# or an object). One such value: depth 7; two: 6; four: 5; eight: 4; more: the default.
MAX_FREE_DEPTH = 7
# ... and the extra properties of open objects (one per object that declares members and
# says nothing of others) one level deeper, when the schema has at most two free-form
# values in all: (free-form values) x FREE_STATES_PER_LEVEL x 2^4 <= IMPLICIT_FREE_BUDGET
IMPLICIT_FREE_DEPTH = 4
IMPLICIT_FREE_BUDGET = 2_560
FREE_STATES_PER_LEVEL = 80
# compile_json_schema: free-form values outside automaton products (written ones and
# open objects' extras) continue below their depth along the path of objects from
# their top, FREE_TAIL_DEPTH object levels more, with arrays of scalars at every level
# and at the depth's cut on every other path (SchemaBuilder.any_value's tail): linear in
# the levels, where each exact level doubles. Built in the adaptive attempt (with the
# deeper free-form values) when (free-form values) x (the tree states a tail adds to
# one) <= FREE_TAIL_BUDGET.
FREE_TAIL_DEPTH = 4
FREE_TAIL_BUDGET = 100_000
FREE_DEPTH_BUDGET = 10_240
DEFAULT_MAX_COUNT = 1000          # largest minLength/maxLength/minItems/... bound built exactly

# JSON Schema assertion/applicator keywords (drafts 4 to 2020-12); any other keyword
# is an annotation (the spec ignores unknown keywords)
SPEC_KEYWORDS = {
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties",
    "required", "dependentRequired", "dependencies", "allOf", "anyOf", "oneOf", "not",
    "if", "then", "else", "dependentSchemas", "prefixItems", "items", "additionalItems",
    "contains", "properties", "patternProperties", "additionalProperties",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "format", "$ref",
    "$dynamicRef", "$recursiveRef", "contentSchema", "disallow", "extends", "divisibleBy",
}

# ---------------------------------------------------------------------------------------
# JSON text pieces (outlines-core's regexes)
# ---------------------------------------------------------------------------------------
STRING_CHAR = r'(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])'
STRING = f'"{STRING_CHAR}*"'
INTEGER = r"(-)?(0|[1-9][0-9]*)"
NUMBER = r"((-)?(0|[1-9][0-9]*))(\.[0-9]+)?([eE][+-][0-9]+)?"
BOOLEAN = "(true|false)"
# a regular superset of every JSON value, of any depth, for free-form values inside a
# subtracted operand (SchemaBuilder._neg): such an operand must contain every value its
# schema accepts, however deep (the positive side may nest deeper than max_free_depth).
# SchemaBuilder.soup_value(d) is exact for d nested containers, and below that level a
# container is "[" or "{", any run of JSON tokens, then "]" or "}" (JSON_SOUP_BODY): a
# superset that stays inside the value unless the text nests deeper than d
_SOUP_TOKENS = r'(?:"(?:[^"\\]|\\["\\/bfnrtu])*"|[-+.0-9a-zA-Z\[\]{},: \t\n\r])*'
JSON_SOUP_BODY = rf'[\[{{]{_SOUP_TOKENS}[\]}}]'
NULL = "null"

# code points a JSON string may contain raw, and the escapes (char -> escape letter)
_RAW = [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E), (0xA0, MAX_CODE_POINT)]
_ESCAPES = {0x22: '"', 0x5C: "\\", 0x2F: "/", 0x08: "b", 0x0C: "f", 0x0A: "n",
            0x0D: "r", 0x09: "t"}

# ---------------------------------------------------------------------------------------
# formats: regexes over the decoded string (ASCII)
# ---------------------------------------------------------------------------------------
# years 0001-9999 (Python's datetime, jsonschema's checker, has no year 0)
_DATE = (r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
         r"-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
         r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
         r"|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
         r"-02-29")
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
# a scheme, ":", anything: every URI and IRI (the checkers want a scheme)
_NEG_URI = r"[A-Za-z][A-Za-z0-9+.\-]*:[\s\S]*"
# any string with an "@": email's and idn-email's checker
_NEG_EMAIL = r"[\s\S]*@[\s\S]*"
_NEG_TIME = r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9a-fA-F]{1,4}"
_IPV6 = "|".join([
    rf"(?:{_H16}:){{7}}{_H16}",
    rf"(?:{_H16}:){{1,7}}:",
    rf"(?:{_H16}:){{1,6}}:{_H16}",
    rf"(?:{_H16}:){{1,5}}(?::{_H16}){{1,2}}",
    rf"(?:{_H16}:){{1,4}}(?::{_H16}){{1,3}}",
    rf"(?:{_H16}:){{1,3}}(?::{_H16}){{1,4}}",
    rf"(?:{_H16}:){{1,2}}(?::{_H16}){{1,5}}",
    rf"{_H16}:(?::{_H16}){{1,6}}",
    rf":(?::{_H16}){{1,7}}",
    "::",
])
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(?:\.{_LABEL})*"
_EMAIL = (r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
          rf"@(?:{_LABEL}\.)+[A-Za-z]{{2,63}}")
# RFC 3986 (what jsonschema's uri / uri-reference checkers validate, with rfc3987 or
# rfc3986-validator), exactly: appendix A's grammar as a regex
_PCT = r"%[0-9A-Fa-f]{2}"
_UNRES_SUB = r"A-Za-z0-9\-._~!$&'()*+,;="                 # unreserved and sub-delims
_IP_LITERAL = rf"\[(?:{_IPV6}|v[0-9A-Fa-f]+\.[{_UNRES_SUB}:]+)\]"


def _uri_grammar(unres_sub: str, ip_literal: str, query_extra: str = "") -> tuple[str, str]:
    """``(URI, relative-ref)`` regexes of RFC 3986's appendix A grammar, with
    ``unres_sub`` as the unreserved and sub-delims characters, ``ip_literal`` for IP
    literals and ``query_extra`` more characters in the query: RFC 3986 itself, or RFC
    3987's IRI grammar (``ucschar`` unreserved, ``iprivate`` in the query)."""
    pchar = rf"(?:[{unres_sub}:@]|{_PCT})"
    authority = (rf"(?:(?:[{unres_sub}:]|{_PCT})*@)?"
                 rf"(?:{ip_literal}|(?:[{unres_sub}]|{_PCT})*)(?::[0-9]*)?")
    path_abempty = rf"(?:/{pchar}*)*"
    path_absolute = rf"/(?:{pchar}+(?:/{pchar}*)*)?"
    query_fragment = (rf"(?:\?(?:{pchar}|[/?{query_extra}])*)?"
                      rf"(?:#(?:{pchar}|[/?])*)?")
    uri = (rf"[A-Za-z][A-Za-z0-9+.\-]*:(?://{authority}{path_abempty}|{path_absolute}"
           rf"|{pchar}+(?:/{pchar}*)*|){query_fragment}")
    relative = (rf"(?://{authority}{path_abempty}|{path_absolute}"
                rf"|(?:[{unres_sub}@]|{_PCT})+(?:/{pchar}*)*|){query_fragment}")
    return uri, relative


_URI, _RELATIVE_REF = _uri_grammar(_UNRES_SUB, _IP_LITERAL)
# RFC 3987 (iri, iri-reference): RFC 3986's grammar with ``ucschar`` among the unreserved
# characters and ``iprivate`` in the query; IPv6 literals in the full eight-group form
# only (jsonschema's iri checker, rfc3987_syntax, refuses most "::" forms)
_UCSCHAR = ("\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef" + "".join(
    f"{chr(p << 16)}-{chr((p << 16) | 0xFFFD)}" for p in range(1, 14))
    + "\U000e1000-\U000efffd")
_IPRIVATE = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"
_IRI, _IRELATIVE_REF = _uri_grammar(
    _UNRES_SUB + _UCSCHAR,
    rf"\[(?:(?:{_H16}:){{7}}{_H16}|v[0-9A-Fa-f]+\.[{_UNRES_SUB}:]+)\]", _IPRIVATE)
# RFC 6570 (uri-template), level 4, where jsonschema's checker (the uri_template package)
# agrees: a variable name starts with a letter, digit or "_" (not "%XX"), a prefix is at
# most 999, no reserved operator ("=,!@|")
_UT_LITERAL = (rf"(?:[\x21\x23\x24\x26\x28-\x3b\x3d\x3f-\x5b\x5d\x5f\x61-\x7a\x7e"
               rf"{_UCSCHAR}{_IPRIVATE}]|{_PCT})")
_UT_VARCHAR = rf"(?:[A-Za-z0-9_]|{_PCT})"
_UT_VARSPEC = rf"[A-Za-z0-9_](?:\.?{_UT_VARCHAR})*(?::[1-9][0-9]{{0,2}}|\*)?"
_URI_TEMPLATE = (rf"(?:{_UT_LITERAL}|\{{[+#./;?&]?{_UT_VARSPEC}"
                 rf"(?:,{_UT_VARSPEC})*\}})*")
# idn-hostname: ASCII labels that idna.encode (jsonschema's checker) takes: 1-62 letters,
# digits and inner "-", not "-" in both the 3rd and 4th place, at most 4 labels (at most
# 251 characters: idna refuses a name over 253); U-labels are not generated
_IDN_LDH = "[A-Za-z0-9-]"
_IDN_LABEL = (rf"[A-Za-z0-9](?:{_IDN_LDH}{{0,2}}[A-Za-z0-9])?"
              rf"|[A-Za-z0-9]{_IDN_LDH}(?:[A-Za-z0-9]{_IDN_LDH}|-[A-Za-z0-9])"
              rf"{_IDN_LDH}{{0,57}}[A-Za-z0-9]")
_IDN_HOSTNAME = rf"(?:{_IDN_LABEL})(?:\.(?:{_IDN_LABEL})){{0,3}}"
# idn-email (RFC 6531): a dot-atom local part whose characters may also be non-ASCII,
# "@", an ASCII domain as for email
_IDN_EMAIL = (r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-\u00a0-\ud7ff\ue000-\U0010ffff]+"
              r"(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-\u00a0-\ud7ff\ue000-\U0010ffff]+)*"
              rf"@(?:{_LABEL}\.)+[A-Za-z]{{2,63}}")
# RFC 6901 (json-pointer); relative-json-pointer: a non-negative integer, then "#" or a
# JSON pointer (draft-handrews-relative-json-pointer-01), the integer without a 0 before
# another digit: jsonschema's checker refuses "100" (it reads every 0 before a digit as a
# leading zero), so the integers both accept
_JSON_POINTER = r"(?:/(?:[^/~]|~[01])*)*"
_RELATIVE_JSON_POINTER = rf"(?:0|[1-9]+0?)(?:#|{_JSON_POINTER})"


def _regex_format(depth: int = 2) -> str:
    """``format: regex``: a regular subset of the regexes that both Python's ``re``
    (jsonschema's checker: ``re.compile``) and ECMA-262 compile: literal characters
    (``\\ ^ $ . | ? * + ( ) [ ] { }`` escaped; an escape is ``\\`` and one of those,
    ``/`` or ``d D w W s S n r t f v``), ``.``, classes ``[...]``/``[^...]`` (those
    escapes, ``\\-``, ``\\b``, ranges of digits in order and ranges from ``a`` or ``A``
    within the letters, a final ``-``; no ``[ & ~ |`` inside), groups ``(...)`` and
    ``(?:...)`` nested at most ``depth`` deep, alternation, anchors ``^ $ \\b \\B``
    (not quantified), and one quantifier per atom (``* + ? {n} {n,}`` with up to 4 digits,
    ``{n,m}`` with ``n <= m`` of one digit each, ``n`` of one digit and ``m`` of two, or
    both of two digits with ``m``'s first digit larger; optionally lazy). The sizes keep
    the automaton small: every level of nesting copies it. Every string it accepts compiles (``tests/test_json_schema_formats.py``);
    the rest of the regex language (back-references, named groups, look-arounds,
    flags, ...) is not accepted."""
    syntax = r"\\\^$.|?*+()[\]{}"
    esc = rf"\\[{syntax}/dDwWsSnrtfv]"
    char = rf"[^{syntax}]"
    ranges = "|".join([f"{a}-[{a}-9]" for a in "0123456789"] + ["a-[a-z]", "A-[A-Z]"])
    cls_char = r"[^\\\]\[&~|\-^]"
    cls_esc = rf"\\[{syntax}/\-dDwWsSnrtfvb]"
    item = f"(?:{ranges}|{cls_char}|{cls_esc})"
    cls = rf"\[\^?{item}(?:{item}|\^)*-?\]"
    two = "|".join(f"{a}[0-9],[{a + 1}-9][0-9]" for a in range(1, 9))
    one = "|".join(f"{a},[{a}-9]" for a in range(10))
    counts = rf"[0-9]{{1,4}}|[0-9]{{1,4}},|{one}|[0-9],[1-9][0-9]|{two}"
    quant = rf"(?:[*+?]|\{{(?:{counts})\}})\??"
    atom = f"{char}|{esc}|\\.|{cls}"
    alt = None
    for _ in range(depth + 1):
        group = "" if alt is None else rf"|\((?:\?:)?{alt}\)"
        # empty alternatives ("a|", "||") are valid in both languages
        alt = rf"(?:(?:{atom}{group})(?:{quant})?|\^|\$|\\[bB]|\|)*"
    return alt


_HEX = "[0-9a-fA-F]"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"(?:{_DATE})T{_TIME}",
    "email": _EMAIL,
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "uri": _URI,
    "uri-reference": f"(?:{_URI})|(?:{_RELATIVE_REF})",
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "hostname": _HOSTNAME,
    "duration": (r"P(?:[0-9]+W|(?:[0-9]+Y)?(?:[0-9]+M)?(?:[0-9]+D)?"
                 r"(?:T(?:[0-9]+H)?(?:[0-9]+M)?(?:[0-9]+S)?)?)"),
    "iri": _IRI,
    "iri-reference": f"(?:{_IRI})|(?:{_IRELATIVE_REF})",
    "uri-template": _URI_TEMPLATE,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": _RELATIVE_JSON_POINTER,
    "regex": _regex_format(),
    "idn-hostname": _IDN_HOSTNAME,
    "idn-email": _IDN_EMAIL,
}
# a format inside a subtracted operand (SchemaBuilder._neg: oneOf's other branches, not,
# the count of contains, ...) must take every string the reference checker (jsonschema's)
# takes, or the difference would keep a string the checker says is of that format:
# these regexes (over the decoded string) are supersets of the checker's language; a
# format not listed is any string there (email's checker only looks for an "@"; uuid's
# takes extra "-" after the fourth group; date-time's and time's take offset minutes
# above 59 and "t"/"z"/" "; a uri or iri has a scheme; date's and ipv4's are the
# formats' own, exact)
NEG_FORMATS = {
    "uri": _NEG_URI,
    "iri": _NEG_URI,
    "email": _NEG_EMAIL,
    "idn-email": _NEG_EMAIL,
    "uuid": r"[\s\S]{8}-[\s\S]{4}-[\s\S]{4}-[\s\S]{4}[\s\S]*",
    "date": _DATE,
    "ipv4": _IPV4,
    "time": _NEG_TIME,
    "date-time": rf"[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}[Tt ]{_NEG_TIME}",
}
# formats whose regexes take characters a JSON string escapes ('"', '\\', control
# characters): always read through the string's escapes (json_string_content_nfa); the
# other formats' regexes are their JSON text as written
DECODED_FORMATS = {"json-pointer", "relative-json-pointer", "regex"}
# formats of other types / vendor formats with no constraint on a string (OpenAPI's
# "byte", base64, included: draft 2020-12 defines no such format and jsonschema checks
# none, so a PEM text there is valid)
ANNOTATION_FORMATS = {"int32", "int64", "float", "double", "password", "binary", "textarea",
                      "color", "markdown", "html", "data-url", "multiline", "string", "text",
                      "byte"}
# formats defined by the JSON Schema spec that are not enforced
UNSUPPORTED_FORMATS: set = set()          # every format of draft 2020-12 is enforced
INT_FORMAT_BOUNDS = {"int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1),
                     "uint32": (0, (1 << 32) - 1), "uint64": (0, (1 << 64) - 1)}

# ---------------------------------------------------------------------------------------
# keywords
# ---------------------------------------------------------------------------------------
ANNOTATIONS = {
    "title", "description", "default", "examples", "example", "$schema", "$id", "id",
    "$comment", "deprecated", "readOnly", "writeOnly", "$anchor", "markdownDescription",
    "markdownEnumDescriptions", "enumDescriptions", "deprecationMessage", "errorMessage",
    "nullable_description", "contentMediaType", "contentEncoding", "$vocabulary",
    "$dynamicAnchor", "$recursiveAnchor", "discriminator", "xml", "externalDocs",
    "defaultSnippets", "doNotSuggest", "suggestSortText", "allowComments",
    "allowTrailingCommas", "patternErrorMessage", "enumSortTexts", "tsType",
}
STRUCTURAL = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "minLength", "maxLength", "pattern", "format", "minItems", "maxItems",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minProperties", "maxProperties", "patternProperties", "propertyNames", "nullable",
    "uniqueItems", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "dependencies", "unevaluatedProperties", "unevaluatedItems", "contains",
    "minContains", "maxContains", "__and", "__patterns", "__refs",
}
# keywords whose values are JSON data, not subschemas
_DATA_KEYWORDS = {"enum", "const", "default", "examples", "example"}
# keywords whose values map names to subschemas
_NAME_MAPS = {"properties", "patternProperties", "$defs", "definitions",
              "dependentSchemas", "dependencies"}
# keywords whose value is not a subschema but which a strict=False build ignores
NOT_ENFORCED = {"$dynamicRef",
                "$recursiveRef", "contentSchema", "disallow", "extends", "divisibleBy"}
# keywords enforced by automaton products (``oneOf``, ``not``, ``if``/``then``/``else``):
# each operand is determinised with at most this many states, and the product too
DEFAULT_MAX_PRODUCT_STATES = 20_000
# all products of one schema together: operand NFAs, their DFAs and the product DFAs,
# in states (a schema past it would spend minutes in them)
MAX_PRODUCT_WORK = 1_000_000
# patternProperties: overlapping patterns split the keys into at most this many sets
# (one per combination of the patterns a key matches)
MAX_PATTERN_REGIONS = 64
# dependentRequired / dependentSchemas / dependencies: each name doubles the cases
MAX_DEPENDENCIES = 8
# contains with minContains/maxContains: one copy of the item per counted match
MAX_CONTAINS = 8
# enum/const object values inside a subtracted operand: every key order is spelled
MAX_NEG_ENUM_KEYS = 4
# not / oneOf / if whose operands only test which keys are present (``required`` under
# not/allOf/anyOf/oneOf): split into at most this many cases of present and absent keys
# (the disjunctive normal form of the test; past it, an automaton product as for others)
MAX_PRESENCE_CASES = 16
PROPERTY_ORDERS = ("auto", "schema", "any")
# internal order of compile_json_schema's fallback when "auto" passes a compile limit:
# the schema's order, except that objects without required properties take the loose
# form (SchemaBuilder._loose_object), whose automaton is no larger than the schema
# order's (one copy of each member, in a loop instead of a chain)
LOOSE_ORDER = "loose"
# property_order="any": the object automaton has one copy of the members per subset of
# the declared properties; at most this many declared properties
MAX_ANY_ORDER_PROPERTIES = 10
# property_order="auto" (the default of compile_json_schema): per object, the declared
# properties in any order (each at most once) when the estimated NFA of that object stays
# within AUTO_ORDER_STATES; else the required ones in any order (each once) with the
# optional ones in the schema's order between them, within the same budget; else the
# schema's order. All objects of a schema together spend at most AUTO_ORDER_TOTAL
# estimated states on this (the inner objects are decided first).
AUTO_ORDER_STATES = 8_000
AUTO_ORDER_TOTAL = 80_000
AUTO_ORDER_ROOT = 1.0
# ... and before those exact forms, an object outside automaton products takes its
# declared properties in any order with a key allowed to repeat (each occurrence a valid
# value: the object is valid whichever value a parser keeps) and the required ones
# tracked, when its 2^required copies fit the same budget (SchemaBuilder._loose_object;
# repeated_keys=False turns it off); False: the exact forms only
AUTO_LOOSE = True
# compile_json_schema: the DFA of a schema with order-free objects is built with at most
# this many states (before minimisation); past it, the schema's order is compiled instead
AUTO_DFA_CAP = 20_000
# ... and refused before determinising (the schema's order is compiled at once) when its
# expression tree's size estimate passes AUTO_REFUSE_TREE x AUTO_DFA_CAP or its NFA
# passes AUTO_REFUSE_NFA x AUTO_DFA_CAP states: a prediction, not a proof. Measured on
# the 1,000-file MaskBench sample (docs/json_schema.md, "MaskBench"): the order-free
# automata that fit the cap have trees of at most 130,851 and NFAs of at most 63,005
# states; 27 of the 56 that pass it are refused early by these two rules.
AUTO_REFUSE_TREE = 8
AUTO_REFUSE_NFA = 4
# subschema paths of the document's own object: through $ref and allOf only
_DOCUMENT_PATH = re.compile(r"(?:/\$ref|/allOf/\d+)*")
# subschema paths below which an object is a value inside the document's object
_VALUE_PATHS = ("/properties/", "/items", "/additionalProperties", "/patternProperties",
                "/prefixItems", "/additionalItems", "/required", "/dependentSchemas",
                "/unevaluatedProperties")
# compile_json_schema: a schema whose recursive $refs were cut at max_depth, and whose
# tree's size estimate is at most REF_DEPTH_TREE, is built again with them expanded
# REF_DEPTH_EXTRA times more; that tree is compiled instead when its size estimate is at
# least the first one's (a smaller one gave up order-free objects) and at most
# REF_DEPTH_GROWTH times it; else, or past a compile limit, the first one (no schema
# that compiled before is refused)
REF_DEPTH_EXTRA = 1
REF_DEPTH_GROWTH = 5.0
REF_DEPTH_TREE = 300_000
#: ``uniqueItems``: the item language must be finite, with at most this many spellings
#: and this many distinct values (the array automaton tracks the subset of values used)
MAX_UNIQUE_SPELLINGS = 256
MAX_UNIQUE_VALUES = 10           # (no longer a limit by itself: see MAX_UNIQUE_STATES)
#: ``uniqueItems``: at most this many (position, set of values used) automaton states
MAX_UNIQUE_STATES = 4096
#: ``uniqueItems`` over items of any language (sorted by a key: see
#: ``SchemaBuilder._sorted_unique_array``): at most this many NFA states
MAX_SORTED_UNIQUE_STATES = 6144
#: ... and in all the arrays of one schema, past which strings share one key
MAX_SORTED_UNIQUE_TOTAL = 9216
#: ``uniqueItems`` over items of any language: the item automaton with the free
#: whitespace between its tokens has at most this many DFA states; past it, items are
#: spelled without whitespace inside them
MAX_SPACED_ITEM_STATES = 20_000
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties",
                   "dependentSchemas")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SUBSCHEMA_ONE = ("additionalProperties", "propertyNames", "not", "if", "then", "else",
                  "contains", "unevaluatedProperties", "unevaluatedItems",
                  "additionalItems")
#: ``oneOf`` branches past a product limit (``SchemaBuilder._one_of_witnessed``): their
#: subset may build this fraction of ``max_product_work`` more
ONE_OF_WITNESS_WORK = 0.25
#: ``oneOf``/``not``/``if``: two operands are shown disjoint (no determinisation needed)
#: by a search over at most this many pairs of their NFA states
MAX_DISJOINT_PAIRS = 50_000
# negated_meet: keywords of the positive side left out of the meet (they restrict values
# without giving them structure)
_MEET_DROPPED = {"required", "minProperties", "maxProperties", "minItems", "maxItems",
                 "contains",
                 "uniqueItems", "minLength", "maxLength", "pattern", "__patterns", "format",
                 "not",
                 "multipleOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                 "dependentRequired", "minContains", "maxContains"}
# keywords enforced by automaton products (see _node)
_PRODUCT_KW = ("__and", "oneOf", "not", "if")
_TYPES = ("null", "boolean", "object", "array", "number", "integer", "string")
# numeric keywords (SchemaBuilder.number: bounded numbers are built without exponent)
_NUMBER_KW = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}


def is_annotation(key: str) -> bool:
    """Annotation keywords (no effect on the language): the spec's, vendor ``x-*``
    extensions, and every keyword that is not a JSON Schema assertion keyword."""
    return key in ANNOTATIONS or (key not in SPEC_KEYWORDS and key not in STRUCTURAL
                                  and key not in ("$defs", "definitions"))


# ---------------------------------------------------------------------------------------
# expression tree
# ---------------------------------------------------------------------------------------
@dataclass
class Node:
    kind: str               # lit, re, seq, alt, rep, dfa, jstr, obj, list, empty
    args: tuple = ()
    size: int = 1           # rough NFA size, for the state limit
    det: bool = field(default=False, compare=False)


EMPTY = Node("empty")
EPS = Node("lit", ("",))


def lit(text: str) -> Node:
    return Node("lit", (text,), len(text.encode()) + 1)


def rx(pattern: str, size: int = 8) -> Node:
    return Node("re", (pattern,), size)


def seq(*parts: Node) -> Node:
    flat = []
    for p in parts:
        if p.kind == "empty":
            return EMPTY
        if p.kind == "lit" and p.args[0] == "":
            continue
        if p.kind == "seq":
            flat.extend(p.args)
        else:
            flat.append(p)
    if not flat:
        return EPS
    if len(flat) == 1:
        return flat[0]
    return Node("seq", tuple(flat), sum(p.size for p in flat))


def alt(*parts: Node) -> Node:
    flat = []
    for p in parts:
        if p.kind == "empty":
            continue
        if p.kind == "alt":
            flat.extend(p.args)
        else:
            flat.append(p)
    if not flat:
        return EMPTY
    if len(flat) == 1:
        return flat[0]
    return Node("alt", tuple(flat), sum(p.size for p in flat) + 2)


@dataclass
class _Member:
    key: Node            # the key text including quotes
    value: Node
    required: bool


def _required_order(members: list, required: list) -> tuple | None:
    """``members`` with the required ones first, in the order of the ``required`` list,
    then the optional ones in the schema's order; None when that is the schema's order
    or none is required."""
    names = {}
    for m in members:
        if m.required:
            names[json.loads(m.key.args[0])] = m
    order = [names[r] for r in dict.fromkeys(x for x in required if isinstance(x, str))
             if r in names]
    if not order or len(order) != len(names):
        return None
    out = tuple(order) + tuple(m for m in members if not m.required)
    if [id(m) for m in out] == [id(m) for m in members]:
        return None
    return out


# ---------------------------------------------------------------------------------------
# JSON-string escaping of a regex over decoded characters
# ---------------------------------------------------------------------------------------
class _JsonCharNFA(NFA):
    """An NFA whose code-point transitions spell each character as JSON string content:
    raw where JSON allows it (outlines-core's set), else as its short escape; characters
    with neither form (other control characters, U+007F-U+009F) are dropped."""

    def add_codepoints(self, src, dst, ranges):
        ranges = normalize_ranges(ranges)
        raw = _intersect_ranges(ranges, _RAW)
        for cp, letter in _ESCAPES.items():
            if any(lo <= cp <= hi for lo, hi in ranges):
                self.add_bytes(src, dst, ("\\" + letter).encode())
        if raw:
            super().add_codepoints(src, dst, raw)


def _intersect_ranges(a, b):
    out = []
    for lo, hi in a:
        for lo2, hi2 in b:
            x, y = max(lo, lo2), min(hi, hi2)
            if x <= y:
                out.append((x, y))
    return normalize_ranges(out)


def json_string_content_nfa(pattern: str, search: bool, flags: int = re.ASCII,
                            dollar: str = "ecma") -> NFA:
    """NFA of the JSON string contents (between the quotes) whose decoded text matches
    ``pattern``: ``re.search`` semantics (JSON Schema's ``pattern``) if ``search``,
    else ``re.fullmatch``. Anchors ``^``/``$`` are honoured at the ends of the pattern
    and of each top-level alternative. ``dollar="ecma"``: ``$`` is the end of the text
    (ECMA-262). Python ``re``'s ``$`` also matches before a final newline: with
    ``dollar="py-sup"`` (a superset of Python's matches) or ``"py-sub"`` (a subset), a
    ``$`` ending an alternative reads exactly so; one elsewhere asserts nothing (sup) or
    the end (sub), and inside ``(?!X)`` the other way round. ``flags``: ``re.ASCII``
    for ECMA-262's ASCII ``\\d``/``\\w``, 0 for Python's Unicode classes."""
    pattern = ecma_to_python(pattern)
    try:
        parsed = P.parse(pattern, flags)
    except re.error as e:
        raise RegexSyntaxError(f"invalid regex {pattern!r}: {e.msg} at position {e.pos}") from None
    except (OverflowError, RecursionError) as e:
        raise RegexSyntaxError(f"invalid regex {pattern!r}: {e}") from None
    sflags = parsed.state.flags
    bad = sflags & ~(re.ASCII | re.DOTALL | re.UNICODE | re.VERBOSE)
    if bad:
        raise UnsupportedRegexError(f"regex flags {re.RegexFlag(bad)!r} are not supported "
                                    f"(in {pattern!r})")
    alternatives = _split_anchored(list(parsed))
    if any(op in (C.ASSERT, C.ASSERT_NOT) for items in alternatives for op, _ in items):
        return _lookahead_content_nfa(alternatives, search, sflags, pattern, dollar)
    nfa = _JsonCharNFA()
    start = nfa.add_state()
    nfa.start = start
    end = nfa.add_state()
    b = _Builder(nfa, pattern)
    b.anchor_edges = []                          # anchors inside groups: anchor_product
    anychar = [(0, MAX_CODE_POINT)]
    for alt_items in alternatives:
        s = nfa.add_state()
        nfa.add_epsilon(start, s)
        anchored_start = bool(alt_items) and alt_items[0] == (C.AT, C.AT_BEGINNING) or \
            bool(alt_items) and alt_items[0] == (C.AT, C.AT_BEGINNING_STRING)
        anchored_end = bool(alt_items) and alt_items[-1][0] is C.AT and \
            alt_items[-1][1] in (C.AT_END, C.AT_END_STRING)
        if search and not anchored_start:
            loop = nfa.add_state()
            nfa.add_epsilon(s, loop)
            nfa.add_codepoints(loop, loop, anychar)
            s = loop
        e = b.seq(alt_items, s, sflags, top=True)
        if anchored_end and dollar != "ecma" and alt_items[-1][1] is C.AT_END:
            e = _optional_newline(nfa, e)
        if search and not anchored_end:
            loop = nfa.add_state()
            nfa.add_epsilon(e, loop)
            nfa.add_codepoints(loop, loop, anychar)
            e = loop
        nfa.add_epsilon(e, end)
    nfa.accepting = {end}
    if b.anchor_edges:
        return anchor_product(nfa, b.anchor_edges, dollar == "py-sup")
    return nfa


def _optional_newline(nfa: NFA, e: int) -> int:
    """Python's ``$`` ending a match at ``e``: the text may go on with one newline.
    The state after it (``e``, then an optional ``\\n``)."""
    out = nfa.add_state()
    nfa.add_epsilon(e, out)
    nfa.add_codepoints(e, out, [(0x0A, 0x0A)])
    return out


# A pattern has two readings that a schema's user may mean: ECMA-262's (JSON Schema's:
# ASCII \d \w \s, $ only at the end) and Python re's (the reference validator's:
# Unicode classes, $ also before a final newline). An accepted string must match in
# both readings where a pattern constrains it, and a subtracted pattern (or one that
# routes a key to a schema) takes what either reading matches.
_CLASS_ESCAPE = re.compile(r"\\[dDwWsS]")
_NEGATED_CLASS = re.compile(r"\\[DWS]|\[\^(?:\\.|[^\]\\])*\\[dws]")


@functools.lru_cache(maxsize=1)
def _agreed_chars_dfa() -> DFA:
    """String contents of the characters that ECMA-262's and Python's readings put in
    the same classes (``\\d \\w \\s``) and without a newline (where the two ``$``
    differ): printable ASCII, tab, CR, VT, FF."""
    return minimize(determinize(json_string_content_nfa(
        "[\\t\\r\\x0b\\x0c -~]*", search=False)))


@functools.lru_cache(maxsize=1)
def _disagreed_chars_dfa() -> DFA:
    """String contents with a character outside :func:`_agreed_chars_dfa`'s."""
    return minimize(determinize(json_string_content_nfa(
        "[^\\t\\r\\x0b\\x0c -~]", search=True)))


def _readings_differ(pattern: str, reading: str) -> bool:
    """Whether ``reading`` of ``pattern`` (see :func:`pattern_content_dfa`) may differ
    from the ECMA-262 reading: only with a ``$`` or a class escape, and for "both" only
    under negation (\\D, [^\\d], (?!...)), since ECMA-262's ``$`` matches less than
    Python's and ASCII ``\\d \\w \\s`` less than the Unicode ones."""
    if "$" not in pattern and not _CLASS_ESCAPE.search(pattern):
        return False
    return reading == "either" or bool(_NEGATED_CLASS.search(pattern)) or "(?!" in pattern


def pattern_content_dfa(pattern: str, reading: str) -> DFA:
    """The minimal DFA of :func:`json_string_content_nfa` (search semantics) in
    ``reading``: ``"both"``, texts that both readings match (a subset of each), or
    ``"either"``, texts that either reading matches (a superset of each). Where the
    exact automaton would be over 4 times the ECMA-262 reading's size (plus 4,096
    states: the readings count apart, as a run of 100 ``\\S+\\s+`` words does, a
    non-ASCII space being ``\\S`` to one and ``\\s`` to the other), the texts of
    :func:`_agreed_chars_dfa`, on which the readings agree, are taken from the ECMA
    reading alone ("both"), and every other text is taken ("either")."""
    if reading not in ("both", "either"):
        raise ValueError(f"reading must be 'both' or 'either', got {reading!r}")
    d = minimize(determinize(json_string_content_nfa(pattern, search=True)))
    if not _readings_differ(pattern, reading):
        return d
    cap = 4 * d.num_states + 4096
    try:
        py = minimize(determinize(json_string_content_nfa(
            pattern, search=True, flags=0, dollar="py-sub" if reading == "both" else "py-sup"),
            cap))
        if reading == "both":
            return minimize(intersect(d, py, cap))
        return minimize(determinize(union(d, py), cap))
    except AutomatonTooLargeError:
        if reading == "both":
            return minimize(intersect(d, _agreed_chars_dfa()))
        return minimize(determinize(union(d, _disagreed_chars_dfa())))


def _items_content_nfa(items, sflags, pattern: str, any_tail: bool,
                       dollar: str = "ecma") -> NFA:
    """JSON string contents whose decoded text starts with a match of the parsed
    ``items`` (anchored at its start), then anything if ``any_tail``, else ends there;
    anchors inside (``$``) resolved by :func:`anchor_product` (``dollar``: as in
    :func:`json_string_content_nfa`)."""
    items = list(items)
    if items and items[-1][0] is C.AT and items[-1][1] in (C.AT_END, C.AT_END_STRING):
        any_tail = False                     # (a top-level $ ends the text)
    nfa = _JsonCharNFA()
    start = nfa.add_state()
    nfa.start = start
    b = _Builder(nfa, pattern)
    b.anchor_edges = []
    e = b.seq(items, start, sflags, top=True)
    if dollar != "ecma" and items and items[-1] == (C.AT, C.AT_END):
        e = _optional_newline(nfa, e)
    if any_tail:
        loop = nfa.add_state()
        nfa.add_epsilon(e, loop)
        nfa.add_codepoints(loop, loop, [(0, MAX_CODE_POINT)])
        e = loop
    nfa.accepting = {e}
    if b.anchor_edges:
        return anchor_product(nfa, b.anchor_edges, dollar == "py-sup")
    return nfa


_OPPOSITE_DOLLAR = {"ecma": "ecma", "py-sup": "py-sub", "py-sub": "py-sup"}


def _lookahead_content_nfa(alternatives, search: bool, sflags, pattern: str,
                           dollar: str = "ecma") -> NFA:
    """:func:`json_string_content_nfa` for a pattern with look-ahead assertions at the
    start of top-level alternatives anchored with ``^`` (``^(?!a-)[a-z-]+$``): a look-ahead
    at the start constrains the whole text, so the alternative is ``R`` intersected
    with ``X.*`` (``(?=X)``) or less ``X.*`` (``(?!X)``), exactly, where ``R`` is the
    rest of the alternative (followed by anything under search semantics unless it
    ends with ``$``). Look-behind, and look-ahead elsewhere, stay unsupported.
    ``dollar``: as in :func:`json_string_content_nfa` (``X`` of a ``(?!X)`` is read in
    the opposite direction: a subset of ``X`` leaves a superset)."""
    parts = []
    for items in alternatives:
        anchored = bool(items) and items[0] in ((C.AT, C.AT_BEGINNING),
                                               (C.AT, C.AT_BEGINNING_STRING))
        body = list(items[1:] if anchored else items)
        asserts = []
        while body and body[0][0] in (C.ASSERT, C.ASSERT_NOT):
            direction, sub = body[0][1]
            if direction != 1:
                raise UnsupportedRegexError(
                    f"look-behind assertion is not supported (in {pattern!r})")
            asserts.append((body[0][0] is C.ASSERT, sub))
            body = body[1:]
        if asserts and not anchored and search:
            raise UnsupportedRegexError(
                "look-ahead assertion is supported only at the start of a pattern (or "
                f"top-level alternative) anchored with ^ (in {pattern!r})")
        if any(op in (C.ASSERT, C.ASSERT_NOT) for op, _ in body):
            raise UnsupportedRegexError(
                "look-ahead assertion is supported only at the start of a pattern (or "
                f"top-level alternative), after ^ (in {pattern!r})")
        anchored_end = bool(body) and body[-1][0] is C.AT and \
            body[-1][1] in (C.AT_END, C.AT_END_STRING)
        rest = _items_content_nfa(body, sflags, pattern, search and not anchored_end,
                                  dollar)
        if not asserts:
            if search and not anchored:
                pre = _items_content_nfa([], sflags, pattern, True)
                rest = concat(pre, rest)
            parts.append(rest)
            continue
        d = minimize(determinize(rest))
        for positive, sub in asserts:
            x_dollar = dollar if positive else _OPPOSITE_DOLLAR[dollar]
            x = minimize(determinize(_items_content_nfa(list(sub), sflags, pattern, True,
                                                        x_dollar)))
            d = minimize(intersect(d, x) if positive else difference(d, x))
        parts.append(d)
    return union(*parts)


def ecma_to_python(pattern: str) -> str:
    """Rewrite the ECMA-262 regex spellings that Python's ``re`` reads differently or
    rejects: ``(?<name>`` (Python: ``(?P<name>``), a class escape next to ``-`` in a
    class (``[\\w-.]``: a literal ``-`` in ECMA), ``[^]`` (any character) and ``[]``
    (nothing)."""
    out = []
    i, n = 0, len(pattern)
    in_class = False
    class_start = False
    while i < n:
        c = pattern[i]
        if c == "\\" and pattern.startswith(("p{", "P{"), i + 1):
            end = pattern.find("}", i + 3)
            if end < 0:
                raise RegexSyntaxError(f"invalid regex {pattern!r}: unterminated "
                                       f"\\{pattern[i + 1]}{{ at position {i}")
            ranges = unicode_property(pattern[i + 3:end])
            if pattern[i + 1] == "P":
                from .utf8 import complement_ranges
                ranges = complement_ranges(ranges)
            body = "".join(_class_char(lo) + ("" if hi == lo else "-" + _class_char(hi))
                           for lo, hi in ranges)
            out.append(body if in_class else f"[{body}]" if body else "(?!)")
            i = end + 1
            class_start = False
            continue
        if c == "\\" and i + 1 < n:
            esc = pattern[i:i + 2]
            out.append(esc)
            i += 2
            if in_class and esc[1] in "dDwWsS" and i < n and pattern[i] == "-" \
                    and i + 1 < n and pattern[i + 1] != "]":
                out.append("\\-")
                i += 1
            class_start = False
            continue
        if in_class:
            if class_start and pattern.startswith("^]", i):
                out[-1] = "[\\s\\S]"
                i += 2
                in_class = False
                continue
            if class_start and c == "]":
                out[-1] = "(?!)"
                i += 1
                in_class = False
                continue
            if c == "]":
                in_class = False
            out.append(c)
            class_start = False
            i += 1
            continue
        if c == "[":
            in_class = True
            class_start = True
            out.append(c)
            i += 1
            continue
        if pattern.startswith("(?<", i) and i + 3 < n and pattern[i + 3] not in "=!":
            out.append("(?P<")
            i += 3
            continue
        out.append(c)
        i += 1
    return "".join(out)


# Unicode General_Category values (short and long names, UAX #44 PropertyValueAliases)
_GC_ALIASES = {
    "Other": "C", "Control": "Cc", "cntrl": "Cc", "Format": "Cf", "Unassigned": "Cn",
    "Private_Use": "Co", "Surrogate": "Cs", "Letter": "L", "Cased_Letter": "LC",
    "Lowercase_Letter": "Ll", "Modifier_Letter": "Lm", "Other_Letter": "Lo",
    "Titlecase_Letter": "Lt", "Uppercase_Letter": "Lu", "Mark": "M",
    "Combining_Mark": "M", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
    "Nonspacing_Mark": "Mn", "Number": "N", "Decimal_Number": "Nd", "digit": "Nd",
    "Letter_Number": "Nl", "Other_Number": "No", "Punctuation": "P", "punct": "P",
    "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Close_Punctuation": "Pe",
    "Final_Punctuation": "Pf", "Initial_Punctuation": "Pi", "Other_Punctuation": "Po",
    "Open_Punctuation": "Ps", "Symbol": "S", "Currency_Symbol": "Sc",
    "Modifier_Symbol": "Sk", "Math_Symbol": "Sm", "Other_Symbol": "So",
    "Separator": "Z", "Line_Separator": "Zl", "Paragraph_Separator": "Zp",
    "Space_Separator": "Zs",
}
_GC_SHORT = {"C", "Cc", "Cf", "Cn", "Co", "Cs", "L", "LC", "Ll", "Lm", "Lo", "Lt", "Lu",
             "M", "Mc", "Me", "Mn", "N", "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf",
             "Pi", "Po", "Ps", "S", "Sc", "Sk", "Sm", "So", "Z", "Zl", "Zp", "Zs"}


@functools.lru_cache(maxsize=None)
def _general_categories() -> dict:
    """Code-point ranges of every two-letter General_Category (Python's unicodedata)."""
    import unicodedata
    out: dict = {}
    prev, start = None, 0
    for cp in range(MAX_CODE_POINT + 2):
        cat = unicodedata.category(chr(cp)) if cp <= MAX_CODE_POINT else None
        if cat != prev:
            if prev is not None:
                out.setdefault(prev, []).append((start, cp - 1))
            prev, start = cat, cp
    return out


@functools.lru_cache(maxsize=None)
def unicode_property(name: str) -> tuple:
    """Code-point ranges of an ECMA-262 ``\\p{name}`` property: a General_Category
    value (``L``, ``Letter``, ``Lu``, ``General_Category=Letter``, ``gc=L``) or ``Any``,
    ``ASCII``, ``Assigned``, from the Unicode database Python ships; other properties
    (scripts, binary properties) raise :class:`~jaxcd.errors.UnsupportedRegexError`
    naming them."""
    key, _, value = name.partition("=")
    if value:
        if key not in ("General_Category", "gc"):
            raise UnsupportedRegexError(
                f"Unicode property \\p{{{name}}} is not supported (only General_Category "
                "values and Any / ASCII / Assigned are)")
        name = value
    if name == "Any":
        return ((0, MAX_CODE_POINT),)
    if name == "ASCII":
        return ((0, 0x7F),)
    gc = _general_categories()
    if name == "Assigned":
        from .utf8 import complement_ranges
        return tuple(complement_ranges(gc.get("Cn", [])))
    short = _GC_ALIASES.get(name, name)
    if short not in _GC_SHORT:
        raise UnsupportedRegexError(
            f"Unicode property \\p{{{name}}} is not supported (only General_Category values "
            "such as L / Letter / Lu and Any / ASCII / Assigned are)")
    if short == "LC":
        cats = ["Lu", "Ll", "Lt"]
    elif len(short) == 1:
        cats = [c for c in gc if c[0] == short]
    else:
        cats = [short]
    return tuple(normalize_ranges([r for c in cats for r in gc.get(c, [])]))


def _class_char(cp: int) -> str:
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 \
        else f"\\U{cp:08x}"


def _split_anchored(items: list, limit: int = 64) -> list[list]:
    """Top-level alternatives of a parsed pattern with ``^``/``$`` moved to the ends:
    a leading or trailing alternation (``^a$|^b$``, ``^(?:$|x)``) is distributed so
    that each alternative starts/ends with its own anchors."""
    work, out = [items], []
    while work:
        it = work.pop()
        if len(out) + len(work) > limit:
            out.append(it)
            continue
        k = 1 if it and it[0][0] is C.AT else 0
        if k < len(it) and _branch_alts(it[k]) is not None and _has_anchor(it[k]):
            for a in _branch_alts(it[k]):
                work.append(it[:k] + a + it[k + 1:])
            continue
        k = len(it) - 2 if len(it) >= 2 and it[-1][0] is C.AT else len(it) - 1
        if k >= 0 and _branch_alts(it[k]) is not None and _has_anchor(it[k]):
            for a in _branch_alts(it[k]):
                work.append(it[:k] + a + it[k + 1:])
            continue
        out.append(it)
    return out[::-1]


def _branch_alts(item):
    op, av = item
    if op is C.BRANCH:
        return [list(a) for a in av[1]]
    if op is C.SUBPATTERN and not av[1] and not av[2] and len(av[3]) == 1:
        return _branch_alts(av[3][0])
    return None


def _has_anchor(item) -> bool:
    op, av = item
    if op is C.AT:
        return True
    if op is C.BRANCH:
        return any(_has_anchor(x) for a in av[1] for x in a)
    if op is C.SUBPATTERN:
        return any(_has_anchor(x) for x in av[3])
    return False


def _any_char_content_nfa(lo: int, hi: int | None) -> NFA:
    """JSON string content of ``lo..hi`` characters (any character JSON can spell)."""
    return regex_to_nfa(f"{STRING_CHAR}{{{lo},{'' if hi is None else hi}}}")


# ---------------------------------------------------------------------------------------
# the builder
# ---------------------------------------------------------------------------------------
class _TooBig(Exception):
    """Internal: the tree under construction already exceeds the state limit
    (``size`` states for the subschema at ``path``)."""

    def __init__(self, size: int, path: str):
        super().__init__(size, path)
        self.size, self.path = size, path


@dataclass
class SchemaBuilder:
    """Turns a JSON Schema into a :class:`Node` tree.

    ``whitespace``: regex of the free whitespace between JSON tokens (outlines-core's
    default ``[ ]?``). ``strict``: refuse keywords that would not be enforced (else
    ignore them). ``max_depth``: how many times a recursive ``$ref`` may be expanded
    inside itself, and the nesting depth of free-form values (``{}``, ``"type":
    "object"`` without properties)."""

    root: Any
    whitespace: str = "[ ]?"
    strict: bool = True
    max_depth: int = DEFAULT_MAX_DEPTH
    max_nfa_states: int = field(default_factory=lambda: current_limits().max_nfa_states)
    max_count: int = DEFAULT_MAX_COUNT
    closed_objects: bool = False
    property_order: str = "schema"
    # compile_json_schema(max_tokens=n): n x the longest token's bytes, an upper bound on
    # every count (characters, items, properties) in an output of at most n tokens;
    # counting keywords past it are decided without a counter (see count_bounds)
    count_budget: int | None = None
    # nesting depth of free-form values ({}, true, extra properties of open objects);
    # None: max(max_depth, DEFAULT_FREE_DEPTH)
    max_free_depth: int | None = None
    # the depth of free-form values outside automaton products (oneOf, not, if, merged
    # allOf, uniqueItems), when deeper than free_depth (see adaptive_free_depth)
    site_free_depth: int | None = None
    # ... and of open objects' extra properties (IMPLICIT_FREE_DEPTH)
    implicit_free_depth: int | None = None
    # ... and the object levels of their tails (any_value), set with them
    free_tail: int = 0
    # set by build(): free-form values built outside automaton products, written in the
    # schema (free_sites) or the extra properties of open objects (implicit_sites)
    free_sites: int = 0
    implicit_sites: int = 0
    # recursive $refs cut at max_depth outside subtracted operands (see REF_DEPTH_EXTRA)
    ref_cuts: int = 0
    _product_level: int = 0
    _implicit_free: int = 0
    # building a subtracted operand that is not met with its positive side (see meet):
    # its free-form values are soup_value, a superset of values of any depth
    _soup_neg: bool = False
    _meet_memo: dict = field(default_factory=dict)
    # the depth of free-form values in subtracted operands (subtrahend)
    _neg_free_depth: int | None = None
    _nesting_memo: dict = field(default_factory=dict)
    _depth_here: int = 0
    _neg_root: int = 0
    _neg_least: int | None = None
    # set by negated()/negated_meet(): the least container depth (below the operand's
    # top) of the depth-bounded free-form values the operand may hold, None if none
    _last_least: int | None = None
    max_product_states: int = DEFAULT_MAX_PRODUCT_STATES
    # automaton states built by products in one build (see _spend)
    max_product_work: int = MAX_PRODUCT_WORK
    product_work: int = 0
    # polarity: True while building an operand that is subtracted (oneOf's other
    # branches, not, the else branch's if): it is built as a superset (properties in
    # any order, recursion cut to any value) so that the difference never keeps an
    # invalid value
    _neg: bool = False
    # property_order="auto": estimated NFA states spent on order-free objects so far
    auto_spent: int = 0
    auto_states: int = field(default_factory=lambda: AUTO_ORDER_STATES)
    auto_total: int = field(default_factory=lambda: AUTO_ORDER_TOTAL)
    auto_root: float = field(default_factory=lambda: AUTO_ORDER_ROOT)
    auto_loose: bool = field(default_factory=lambda: AUTO_LOOSE)
    # uniqueItems sorted by first character: NFA states spent so far (see
    # _sorted_unique_array)
    unique_spent: int = 0
    # positive nodes built smaller than their schema's language in a way that can leave
    # out a whole value type or every value (recursion cuts, oneOf past a product limit):
    # an enclosing oneOf then groups its branches by supersets (see exactly_one)
    narrowings: int = 0
    # set by build(): True if the tree has an order-free object (property_order="auto")
    auto_used: bool = False
    # objects outside values built as "the schema's order or the required ones first"
    root_orders: int = 0
    # True if count_budget decided a counting keyword
    budget_used: bool = False
    # strings are built the same way in every attempt of one compile (property order,
    # depth): their nodes by (schema text, polarity)
    _string_memo: dict = field(default_factory=dict)
    # NFAs emitted by disjoint(), by node id, for a later to_dfa (cleared after each
    # product keyword)
    _nfa_memo: dict = field(default_factory=dict)
    _ref_stack: list = field(default_factory=list)
    # references merged into an allOf (schema key "__refs") whose merged schema is being
    # built: a recursion through allOf alone is cut when one is here max_depth + 1 times
    _merge_stack: list = field(default_factory=list)
    _any_cache: dict = field(default_factory=dict)
    # nodes (or size errors) of subschemas with automaton products, by context (see
    # _memo_product)
    _product_memo: dict = field(default_factory=dict)
    # schema-order product nodes shared by the attempts of one compile (successes
    # only); see _memo_product
    _shared_products: dict = field(default_factory=dict)
    _reach_memo: dict = field(default_factory=dict)

    @property
    def free_depth(self) -> int:
        if self.max_free_depth is not None:
            return self.max_free_depth
        return max(self.max_depth, DEFAULT_FREE_DEPTH)

    def free_value(self) -> Node:
        """Any JSON value: ``free_depth`` containers deep, or ``site_free_depth`` for the
        free-form values the schema writes (``{}``, ``true``, ``additionalProperties:
        true``, an object without members) outside automaton products, counted in
        ``free_sites``. The extra properties of an object that declares members and says
        nothing of them (the specification's open objects) keep ``free_depth``: every
        such object has one, and deepening them all would multiply the automaton."""
        if self._neg:
            # a subtracted operand (see subtrahend): r containers below its top
            self._note_neg_free()
            r = max(self._depth_here - self._neg_root, 0)
            if self._soup_neg:
                return self.soup_value(self.free_depth)      # a superset of any depth
            return self.any_value(max(self.free_depth, (self._neg_free_depth or 0) - r))
        if self._product_level:
            return self.any_value(self.free_depth)
        if self._implicit_free:
            self.implicit_sites += 1
            return self.any_value(max(self.free_depth, self.implicit_free_depth or 0),
                                  self.free_tail)
        self.free_sites += 1
        return self.any_value(max(self.free_depth, self.site_free_depth or 0),
                              self.free_tail)

    def _note_neg_free(self) -> None:
        """A subtracted operand gets (or reuses, from a memo) free-form values here."""
        r = max(self._depth_here - self._neg_root, 0)
        self._neg_least = r if self._neg_least is None else min(self._neg_least, r)

    def adaptive_free_depth(self) -> tuple[int, int, int] | None:
        """``(depth of written free-form values, depth of open objects' extras, object
        levels of their tails)`` that the free-form values of the last build afford
        (``FREE_DEPTH_BUDGET``, ``IMPLICIT_FREE_BUDGET``, ``FREE_TAIL_BUDGET``), or None
        if none is deeper than ``free_depth`` (and no tail)."""
        if self.max_free_depth is not None or \
                getattr(self, "free_depth_used", self.free_depth) < self.free_depth:
            return None
        d = self.free_depth
        while (self.free_sites and d < MAX_FREE_DEPTH
               and self.free_sites * FREE_STATES_PER_LEVEL * 2 ** (d + 1) <= FREE_DEPTH_BUDGET):
            d += 1
        n = self.free_sites + self.implicit_sites
        imp = self.free_depth
        if self.implicit_sites and IMPLICIT_FREE_DEPTH > imp and \
                n * FREE_STATES_PER_LEVEL * 2 ** IMPLICIT_FREE_DEPTH <= IMPLICIT_FREE_BUDGET:
            imp = IMPLICIT_FREE_DEPTH
        tail = 0
        if n and FREE_TAIL_DEPTH > 0:
            grow = max(self.any_value(d, FREE_TAIL_DEPTH).size - self.any_value(d).size,
                       self.any_value(imp, FREE_TAIL_DEPTH).size - self.any_value(imp).size)
            if n * grow <= FREE_TAIL_BUDGET:
                tail = FREE_TAIL_DEPTH
        out = (d, imp, tail)
        return out if out != (self.free_depth, self.free_depth, 0) else None

    # -- errors ----------------------------------------------------------------------
    def unsupported(self, msg: str, path: str) -> None:
        if self.strict:
            raise UnsupportedSchemaError(
                f"{msg} at {path or '/'}: it would not be enforced; remove it (or pass "
                "strict=False / --no-strict to ignore it knowingly)")

    def count_bounds(self, schema: dict, lo_key: str, hi_key: str, path: str):
        """``(lo, hi)`` of a counting keyword pair, checked. A lower bound above
        ``max_count`` raises; an upper one is tightened to ``TIGHT_MAX_LENGTH``
        (``maxLength``, strict) or ``max_count`` (``maxItems``/``maxProperties``, strict),
        or dropped (strict=False, or inside a subtracted
        operand). With ``count_budget`` (a token
        budget), an upper bound at or past it is dropped and a lower one past it gives
        ``hi = -1`` (no value within the budget): both exact for outputs within the
        budget."""
        lo = schema.get(lo_key, 0)
        hi = schema.get(hi_key)
        for k, v in ((lo_key, lo), (hi_key, hi)):
            if v is None:
                continue
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SchemaError(f"{path}/{k} must be a non-negative integer, got {v!r}")
            if k == lo_key:
                lo = v
            else:
                hi = v
        if self.count_budget is not None:
            # no output within the token budget holds more than count_budget characters
            # (so items, properties): a bound at or past it is exact without a counter
            if hi is not None and hi >= self.count_budget:
                hi = None
                self.budget_used = True
            if lo > self.count_budget:
                self.budget_used = True
                return lo, -1            # nothing within the budget: the caller's EMPTY
        if lo > self.max_count:
            raise AutomatonTooLargeError(
                f"{lo_key} {lo} at {path}/{lo_key} needs one automaton state per counted "
                f"element, over the limit of {self.max_count} (raise max_count to build it)")
        if hi is not None and hi > self.max_count:
            if self._neg:
                return lo, None          # a subtracted operand: a superset is enough
            if self.strict:
                # a tighter bound: every value built is valid; valid strings longer than
                # TIGHT_MAX_LENGTH characters (arrays, objects: max_count items,
                # properties) are refused (an exact counter needs ~10 DFA states per
                # character, which the token lifting cannot afford; compile_json_schema's
                # max_tokens makes such bounds exact within a token budget)
                if hi_key == "maxLength":
                    return lo, max(lo, min(self.max_count, TIGHT_MAX_LENGTH))
                return lo, self.max_count
            hi = None
        return lo, hi

    # -- helpers ---------------------------------------------------------------------
    @property
    def ws(self) -> Node:
        # tagged: a compact emission (_node_dfa(..., compact=True)) leaves it out
        return Node("re", (self.whitespace, "ws"), 2) if self.whitespace else EPS

    def resolve(self, ref: str, path: str) -> tuple[Any, str]:
        if not isinstance(ref, str):
            raise SchemaError(f"$ref at {path} must be a string")
        if ref == "#" or ref == "":
            return self.root, "#"
        if ref.startswith("#/"):
            cur = self.root
            for part in ref[2:].split("/"):
                part = unquote(part).replace("~1", "/").replace("~0", "~")
                if isinstance(cur, dict) and part in cur:
                    cur = cur[part]
                elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
                    cur = cur[int(part)]
                else:
                    raise SchemaError(f"$ref {ref!r} at {path} does not resolve")
            return cur, ref
        # $anchor / $id-named subschemas in this document
        target = self._find_anchor(ref)
        if target is not None:
            return target, ref
        if self.strict:
            raise UnsupportedSchemaError(
                f"$ref {ref!r} at {path}: only references inside the schema (#/..., #anchor) "
                "are supported; pass strict=False / --no-strict to read it as any value")
        return True, ref

    def _find_anchor(self, ref: str):
        name = ref[1:] if ref.startswith("#") else ref
        stack = [self.root]
        while stack:
            s = stack.pop()
            if isinstance(s, dict):
                if s.get("$anchor") == name or s.get("$id") in (ref, name) or s.get("id") in (ref, name):
                    return s
                stack.extend(v for v in s.values() if isinstance(v, (dict, list)))
            elif isinstance(s, list):
                stack.extend(v for v in s if isinstance(v, (dict, list)))
        return None

    # -- $id base URIs -----------------------------------------------------------------
    def _absolute_refs(self) -> None:
        """Resolve every ``$ref`` of the document against the base URI in force where it
        is written (``$id`` of the enclosing schema resources, RFC 3986) and rewrite
        those that name a schema of this document into JSON pointers from its root
        (``#/$defs/...``), which :meth:`resolve` reads: relative references (``node``,
        ``./bar.json``), absolute ones (``urn:...``, ``https://...``), anchors in other
        resources (``b.json#foo``) and ``#/...`` fragments inside a subschema with its
        own ``$id`` (relative to that subschema). Other references are left as they
        are."""
        if not isinstance(self.root, dict):
            return
        text = json.dumps(self.root)
        if '"$ref"' not in text and '"$dynamicRef"' not in text:
            return
        dialect = str(self.root.get("$schema", ""))
        draft4 = "draft-04" in dialect or "draft-03" in dialect
        # drafts up to 07: a $ref's siblings are ignored, its $id included
        legacy = draft4 or "draft-06" in dialect or "draft-07" in dialect
        resources: dict = {}          # absolute URI (no fragment) -> pointer
        anchors: dict = {}            # (URI, anchor) -> pointer
        refs: list = []               # (schema dict, base URI)

        def id_of(s):
            # draft-04 (and 03) name the identifier "id"; "$id" is no keyword there and
            # changes no base URI (jsonschema's Draft4Validator ignores it too)
            v = s.get("id") if draft4 else s.get("$id")
            return v if isinstance(v, str) else None

        resources[_DEFAULT_BASE] = ""
        dyn_refs: list = []
        dyn_anchors: dict = {}        # $dynamicAnchor name -> how many schemas declare it
        dyn_at: set = set()           # (URI, name) of each $dynamicAnchor
        stack = [(self.root, "", _DEFAULT_BASE)]
        while stack:
            node, ptr, base = stack.pop()
            if isinstance(node, list):
                stack.extend((x, f"{ptr}/{i}", base) for i, x in enumerate(node))
                continue
            if not isinstance(node, dict):
                continue
            i = id_of(node)
            if legacy and isinstance(node.get("$ref"), str):
                i = None
            if i is not None:
                uri, frag = _split_fragment(_join_uri(base, i))
                if uri is not None:
                    base = uri
                    resources.setdefault(uri, ptr)
                if frag and not frag.startswith("/"):        # draft-07 "$id": "#foo"
                    anchors.setdefault((base, frag), ptr)
            for k in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(k), str):
                    anchors.setdefault((base, node[k]), ptr)
            if isinstance(node.get("$ref"), str):
                refs.append((node, base))
            if isinstance(node.get("$dynamicRef"), str):
                dyn_refs.append((node, base))
            if isinstance(node.get("$dynamicAnchor"), str):
                dyn_anchors[node["$dynamicAnchor"]] = dyn_anchors.get(node["$dynamicAnchor"],
                                                                      0) + 1
                dyn_at.add((base, node["$dynamicAnchor"]))
            for k, v in node.items():
                if k in _DATA_KEYWORDS or not isinstance(v, (dict, list)):
                    continue
                if k in _NAME_MAPS and isinstance(v, dict):
                    # a map of names to subschemas (not itself a schema)
                    stack.extend((x, f"{ptr}/{_escape_pointer(k)}/{_escape_pointer(n)}",
                                  base) for n, x in v.items())
                    continue
                stack.append((v, f"{ptr}/{_escape_pointer(k)}", base))
        def target_of(ref, base):
            uri, frag = _split_fragment(_join_uri(base, ref))
            if uri is None or uri not in resources:
                return None, uri, frag
            at = resources[uri]
            if not frag:
                return at, uri, frag
            if frag.startswith("/"):
                return at + frag, uri, frag
            return anchors.get((uri, unquote(frag))), uri, frag

        for node, base in refs:
            ref = node["$ref"]
            target, _, _ = target_of(ref, base)
            if target is not None and "#" + target != ref:
                node["$ref"] = "#" + target
        # $dynamicRef: resolved like $ref, then, if its fragment names a $dynamicAnchor,
        # replaced by the outermost schema resource in the dynamic scope that declares
        # the same $dynamicAnchor. With one such declaration in the whole document, that
        # is always the static target: then it is a $ref (else it stays, refused)
        for node, base in dyn_refs:
            ref = node["$dynamicRef"]
            target, uri, frag = target_of(ref, base)
            if target is None:
                continue
            name = unquote(frag)
            if frag and not frag.startswith("/") and (uri, name) in dyn_at and \
                    dyn_anchors.get(name, 0) != 1:
                continue
            del node["$dynamicRef"]
            if "$ref" in node:
                node["allOf"] = list(node.get("allOf") or []) + [{"$ref": "#" + target}]
            else:
                node["$ref"] = "#" + target

    # -- unevaluatedProperties / unevaluatedItems ---------------------------------------
    def _scope_unevaluated(self) -> None:
        """Rewrite every ``unevaluatedProperties`` / ``unevaluatedItems`` of the document
        (a copy of it) into keywords with a fixed scope, where that is exact:
        ``unevaluatedProperties: U`` becomes ``additionalProperties: U`` beside
        ``properties`` / ``patternProperties`` naming every property that the schema's
        own keywords, its ``allOf`` parts and its ``$ref`` targets (recursively) evaluate;
        ``unevaluatedItems: U`` becomes ``items: U`` after ``prefixItems`` as long as the
        longest evaluated prefix (``items: {anyOf: [contains..., U]}`` with ``contains``).
        Once rewritten, the keyword no longer sees properties or items of the schemas
        around it (its parent, its siblings in an ``allOf``): the specification's scope.
        Annotations that depend on which branch succeeds (``anyOf``, ``oneOf``, ``if`` /
        ``then`` / ``else``, ``dependentSchemas``) are not tracked: when such a branch
        evaluates a property (or item) that the fixed part does not, the keyword is
        refused by name (strict) or ignored (strict=False)."""
        if not isinstance(self.root, dict) or "unevaluated" not in json.dumps(self.root):
            return
        todo = [(self.root, "")]
        nodes = []
        while todo:
            s, path = todo.pop()
            if isinstance(s, list):
                todo.extend((x, f"{path}/{i}") for i, x in enumerate(s))
                continue
            if not isinstance(s, dict):
                continue
            if "unevaluatedProperties" in s or "unevaluatedItems" in s:
                nodes.append((s, path))
            for k, v in s.items():
                if k in _DATA_KEYWORDS or not isinstance(v, (dict, list)):
                    continue
                if k in _NAME_MAPS and isinstance(v, dict):
                    todo.extend((x, f"{path}/{k}/{n}") for n, x in v.items())
                    continue
                todo.append((v, f"{path}/{k}"))
        # innermost first (a rewritten schema evaluates what its keyword did)
        for s, path in sorted(nodes, key=lambda x: -x[1].count("/")):
            if "unevaluatedProperties" in s:
                self._scope_properties(s, path)
            if "unevaluatedItems" in s:
                self._scope_items(s, path)

    def _annotations(self, s: Any, kind: str, dynamic: bool, out: dict, seen: set,
                     path: str) -> None:
        """Collect in ``out`` what ``s`` evaluates (``kind``: "properties" or "items"):
        ``out["static"]`` / ``out["dynamic"]`` (inside a branch that may fail without
        failing the schema) each a dict ``names``, ``patterns``, ``all``, ``prefix``,
        ``contains``; ``out["groups"]``: the branching keywords met outside branches,
        as ``(keyword, value, path)``."""
        if not isinstance(s, dict) or id(s) in seen:
            return
        seen = seen | {id(s)}
        acc = out["dynamic" if dynamic else "static"]
        if s.get(f"x-jaxcd-evaluates-all-{kind}") is True:
            acc["all"] = True
        if kind == "properties":
            for n in (s.get("properties") or {}) if isinstance(s.get("properties"), dict) \
                    else ():
                acc["names"].append(n)
            for pt in (s.get("patternProperties") or {}) \
                    if isinstance(s.get("patternProperties"), dict) else ():
                acc["patterns"].append(pt)
            if "additionalProperties" in s or "unevaluatedProperties" in s:
                acc["all"] = True
        else:
            items = s.get("items")
            if isinstance(items, list):
                acc["prefix"] = max(acc["prefix"], len(items))
                if "additionalItems" in s:
                    acc["all"] = True
            elif "items" in s:
                acc["all"] = True
            if isinstance(s.get("prefixItems"), list):
                acc["prefix"] = max(acc["prefix"], len(s["prefixItems"]))
            if "unevaluatedItems" in s:
                acc["all"] = True
            if "contains" in s:
                acc["contains"].append(s["contains"])
        for k in ("$dynamicRef", "$recursiveRef"):
            if k in s:
                out["why"].append(f"{k} at {path}/{k}")
        if isinstance(s.get("$ref"), str):
            try:
                target, _ = self.resolve(s["$ref"], f"{path}/$ref")
            except (SchemaError, UnsupportedSchemaError):
                target = None
            self._annotations(target, kind, dynamic, out, seen, f"{path}/$ref")
        for i, sub in enumerate(s.get("allOf") or () if isinstance(s.get("allOf"), list)
                                else ()):
            self._annotations(sub, kind, dynamic, out, seen, f"{path}/allOf/{i}")
        for k in ("anyOf", "oneOf"):
            if isinstance(s.get(k), list):
                if not dynamic:
                    out["groups"].append((k, s[k], f"{path}/{k}"))
                for i, sub in enumerate(s[k]):
                    self._annotations(sub, kind, True, out, seen, f"{path}/{k}/{i}")
        if "if" in s:
            if not dynamic:
                out["groups"].append(("if", s, f"{path}/if"))
            for k in ("if", "then", "else"):
                self._annotations(s.get(k), kind, True, out, seen, f"{path}/{k}")
        for k in ("dependentSchemas", "dependencies"):
            if isinstance(s.get(k), dict):
                for name, sub in s[k].items():
                    if not dynamic and isinstance(sub, (dict, bool)):
                        out["groups"].append((k, (name, sub), f"{path}/{k}/{name}"))
                    self._annotations(sub, kind, True, out, seen, f"{path}/{k}/{name}")

    def _collect(self, s: Any, kind: str, path: str) -> dict:
        out: dict = {"why": [], "groups": []}
        for x in ("static", "dynamic"):
            out[x] = {"names": [], "patterns": [], "all": False, "prefix": 0,
                      "contains": []}
        self._annotations(s, kind, False, out, set(), path)
        return out

    def _uncovered(self, kind: str, more: dict, st: dict) -> str | None:
        """What ``more`` evaluates beyond ``st`` (a reason), or None if nothing."""
        if st["all"]:
            return None
        if more["all"]:
            return ("additionalProperties or unevaluatedProperties" if kind == "properties"
                    else "items or unevaluatedItems")
        if kind == "items":
            if more["prefix"] > st["prefix"]:
                return f"prefixItems of {more['prefix']} items"
            if any(not any(_json_eq(c, d) for d in st["contains"])
                   for c in more["contains"]):
                return "contains"
            return None
        for p in more["patterns"]:
            if p not in st["patterns"]:
                return f"patternProperties {p!r}"
        for n in more["names"]:
            if n in st["names"]:
                continue
            content = json.dumps(n, ensure_ascii=False)[1:-1].encode()
            try:
                covered = any(self._pattern_dfa(p, "either" if self._neg else "both")
                              .accepts(content) for p in st["patterns"])
            except ValueError:
                covered = False
            if not covered:
                return f"property {n!r}"
        return None

    def _branch_cases(self, kind: str, group, st: dict):
        """The cases of a branching keyword for an ``unevaluated*`` keyword:
        ``[(condition schema, what the case evaluates), ...]``, one of which holds
        whenever the keyword does (anyOf: every non-empty subset of branches, which
        may all hold; oneOf: each branch; if: the condition with ``then``, or its
        negation with ``else``; a dependency: its name present with its schema, or
        absent). None if nothing in them is evaluated beyond ``st``; a string (the
        reason) if a branch's own evaluation depends on its branches again."""
        key, value, where = group
        if key in ("anyOf", "oneOf"):
            parts = [(b, [b]) for b in value]
        elif key == "if":
            parts = [(value.get("if", True), [value.get("if", True), value.get("then", True)]),
                     ({"not": value.get("if", True)}, [value.get("else", True)])]
        else:
            name, sub = value
            if key == "dependencies" and isinstance(sub, list):
                return None
            parts = [({"required": [name]}, [sub]),
                     ({"not": {"required": [name]}}, [])]
        infos = []
        for cond, evaluated in parts:
            acc = {"names": [], "patterns": [], "all": False, "prefix": 0, "contains": []}
            for x in evaluated:
                info = self._collect(x, kind, where)
                if info["why"]:
                    return info["why"][0]
                inner = self._uncovered(kind, info["dynamic"], info["static"])
                if inner is not None:
                    return f"{where} has branches that evaluate {inner}"
                b = info["static"]
                acc["names"] += b["names"]
                acc["patterns"] += b["patterns"]
                acc["all"] = acc["all"] or b["all"]
                acc["prefix"] = max(acc["prefix"], b["prefix"])
                acc["contains"] += b["contains"]
            infos.append((cond, acc))
        if all(self._uncovered(kind, a, st) is None for _, a in infos):
            return None
        if key == "anyOf":
            out = []
            for r in range(1, len(infos) + 1):
                for combo in itertools.combinations(infos, r):
                    acc = {"names": [], "patterns": [], "all": False, "prefix": 0,
                           "contains": []}
                    for _, a in combo:
                        acc["names"] += a["names"]
                        acc["patterns"] += a["patterns"]
                        acc["all"] = acc["all"] or a["all"]
                        acc["prefix"] = max(acc["prefix"], a["prefix"])
                        acc["contains"] += a["contains"]
                    out.append(([c for c, _ in combo], acc))
                    if len(out) > MAX_UNEVALUATED_CASES:
                        return out
            return out
        return [([c], a) for c, a in infos]

    def _scope_unevaluated_keyword(self, s: dict, path: str, kind: str) -> None:
        kw = "unevaluatedProperties" if kind == "properties" else "unevaluatedItems"
        u = s.pop(kw)
        where = f"{path}/{kw}"
        info = self._collect(s, kind, path)
        st = info["static"]
        if st["all"]:
            return                   # everything is evaluated: no effect
        why = info["why"][0] if info["why"] else None
        cases: list = [([], {"names": [], "patterns": [], "all": False, "prefix": 0,
                             "contains": []})]
        if why is None and self._uncovered(kind, info["dynamic"], st) is not None:
            # the evaluated set depends on which branches hold: one case per choice
            for group in info["groups"]:
                g = self._branch_cases(kind, group, st)
                if g is None:
                    continue
                if isinstance(g, str):
                    why = g
                    break
                if len(cases) * len(g) > MAX_UNEVALUATED_CASES:
                    why = (f"the branches make more than {MAX_UNEVALUATED_CASES} cases "
                           f"(MAX_UNEVALUATED_CASES)")
                    break
                cases = [(c1 + c2, _union_eval(a1, a2)) for c1, a1 in cases for c2, a2 in g]
        if why is not None:
            self.unsupported(
                f"keyword {kw!r} (which {kind} are evaluated depends on which branch "
                f"succeeds: {why})", where)
            return                   # strict=False: ignored
        if len(cases) == 1:
            self._scoped_keywords(s, kind, st, u, into=s)
            return
        # one of the cases holds whenever the schema does; each case's conditions
        # with the keyword scoped to what is evaluated in it (a larger case evaluates
        # more, so "some case holds" is exact)
        alts = []
        for conds, acc in cases:
            scope: dict = {}
            self._scoped_keywords(scope, kind, _union_eval(st, acc), u, into=scope)
            alts.append({"allOf": list(conds) + [scope]} if conds else scope)
        s["allOf"] = list(s.get("allOf") or []) + [{"anyOf": alts}]
        # (an annotation for the builder) a schema around this one sees every
        # property / item evaluated here, as the keyword did
        s[f"x-jaxcd-evaluates-all-{kind}"] = True

    def _scoped_keywords(self, s: dict, kind: str, st: dict, u: Any, into: dict) -> None:
        """Write into ``into`` (``s`` itself, or a new conjunct) the fixed-scope form of
        ``unevaluated*: u`` after what ``st`` evaluates."""
        if st["all"]:
            return
        if kind == "properties":
            props = into.get("properties")
            props = dict(props) if isinstance(props, dict) else {}
            for n in st["names"]:
                props.setdefault(n, True)
            pats = into.get("patternProperties")
            pats = dict(pats) if isinstance(pats, dict) else {}
            for p in st["patterns"]:
                pats.setdefault(p, True)
            if props:
                into["properties"] = props
            if pats:
                into["patternProperties"] = pats
            into["additionalProperties"] = u
            return
        n = st["prefix"]
        cs = list(st["contains"])
        rest = u if not cs else {"anyOf": cs + [u]}
        if isinstance(into.get("items"), list):
            into["items"] = list(into["items"]) + [True] * (n - len(into["items"]))
            into["additionalItems"] = rest
            return
        if n:
            prefix = list(into.get("prefixItems") or [])
            into["prefixItems"] = prefix + [True] * (n - len(prefix))
        into["items"] = rest

    def _scope_properties(self, s: dict, path: str) -> None:
        self._scope_unevaluated_keyword(s, path, "properties")

    def _scope_items(self, s: dict, path: str) -> None:
        self._scope_unevaluated_keyword(s, path, "items")

    # -- entry -----------------------------------------------------------------------
    def build(self) -> Node:
        """The schema's tree. If expanding recursive ``$ref`` s ``max_depth`` times
        exceeds ``max_nfa_states`` (``CompileLimits.max_nfa_states`` in force), the
        depth is lowered (down to 1) before raising
        :class:`~jaxcd.errors.AutomatonTooLargeError` naming the innermost subschema over it;
        ``self.depth_used`` records the depth built."""
        if not getattr(self, "_scoped", False):
            self._scoped = True
            if isinstance(self.root, dict):
                text = json.dumps(self.root)
                if '"$ref"' in text or '"$dynamicRef"' in text or "unevaluated" in text:
                    self.root = copy.deepcopy(self.root)     # rewritten below
            self._absolute_refs()
            self._scope_unevaluated()
        requested, order, free = self.max_depth, self.property_order, self.max_free_depth
        orders = (order, "schema") if order in ("auto", LOOSE_ORDER) else (order,)
        # last resort (no max_free_depth given): free-form values one container deep
        # (the extra properties of hundreds of open objects, each a free-form value)
        frees = (free,) if free is not None else (None, 1)
        attempts = [(f, d, o) for f in frees for d in range(requested, 0, -1) for o in orders]
        last = None
        skip = None
        try:
            for f, depth, o in attempts:
                if (f, depth) == skip:
                    continue
                self.max_free_depth = f
                self.max_depth, self.property_order = depth, o
                self._any_cache.clear()
                self._ref_stack.clear()
                self._merge_stack.clear()
                self.auto_spent = self.unique_spent = self.root_orders = 0
                self.free_sites = self.implicit_sites = self.ref_cuts = 0
                try:
                    n = self.node(self.root, "")
                except _TooBig as e:
                    # without its traceback: its frames (this one among them) would make
                    # a reference cycle holding this builder for the cyclic GC
                    last = e.with_traceback(None)
                    if o == "auto" and self.auto_spent == 0:
                        # no order-free form was built before the failure: the
                        # schema's order would repeat the same steps to it
                        skip = (f, depth)
                    continue
                self.depth_used = depth
                self.free_depth_used = self.free_depth
                self.auto_used = o == "auto" and self.auto_spent > 0
                return n
        except RecursionError:
            # nested products, dependencies and $refs deeper than Python's stack
            raise AutomatonTooLargeError(
                "build: the JSON Schema's subschemas nest deeper than Python's recursion "
                f"limit ({sys.getrecursionlimit()}) while expanding $refs, dependencies and "
                "products; simplify it (e.g. fewer dependencies inside recursive $refs) or "
                "lower max_depth") from None
        finally:
            self.max_depth, self.property_order, self.max_free_depth = requested, order, free
        raise too_large("max_nfa_states", last.size, "NFA states", "build NFA",
                        part=f"the subschema at {last.path or '/'} of the JSON Schema (with "
                             "recursive $refs expanded once"
                             + (", free-form values one container deep" if free is None
                                else "") + ")", value=self.max_nfa_states)

    def node(self, schema: Any, path: str) -> Node:
        n = self._node(schema, path)
        if n.size > self.max_nfa_states:
            raise _TooBig(n.size, path)
        return n

    def _node(self, schema: Any, path: str) -> Node:
        if schema is True or schema == {}:
            return self.free_value()
        if schema is False:
            return EMPTY
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {path or '/'} must be an object or boolean, "
                              f"got {type(schema).__name__}")
        if all(is_annotation(k) or k in ("$defs", "definitions") for k in schema):
            return self.free_value()         # {"description": ...}: any value
        for key in schema:
            if is_annotation(key) or key in STRUCTURAL or key in ("$defs", "definitions"):
                continue
            if key in NOT_ENFORCED:
                if key == "$dynamicRef":
                    self.unsupported(
                        "keyword '$dynamicRef' (its target depends on the dynamic scope: "
                        "several schemas declare its $dynamicAnchor, or it does not resolve "
                        "inside the document)", f"{path}/{key}")
                elif key == "not":
                    self.unsupported("keyword 'not' (negation is not supported)", f"{path}/not")
                else:
                    self.unsupported(f"keyword {key!r} cannot be enforced by an automaton "
                                     "here", f"{path}/{key}")
            else:
                self.unsupported(f"unsupported JSON Schema keyword {key!r}", f"{path}/{key}")
        if "__refs" in schema:
            keys = list(schema["__refs"])
            rest = {k: v for k, v in schema.items() if k != "__refs"}
            self._merge_stack.extend(keys)
            try:
                return self.node(rest, path)
            finally:
                if keys:
                    del self._merge_stack[-len(keys):]
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref" and not is_annotation(k)
                    and k not in ("$defs", "definitions")}
            target, key = self.resolve(schema["$ref"], f"{path}/$ref")
            if self._ref_stack.count(key) >= self.max_depth:
                # recursion cut: only non-recursive choices remain (any value when the
                # operand is subtracted)
                if self._neg:
                    return self.free_value()
                self.ref_cuts += 1
                self.narrowings += 1
                return EMPTY
            self._ref_stack.append(key)
            try:
                if rest:
                    merged = self.merge([target, rest], path)
                    return self.node(merged, path)
                return self.node(target, f"{path}/$ref")
            finally:
                self._ref_stack.pop()
        if "allOf" in schema:
            subs = schema["allOf"]
            if not isinstance(subs, list):
                raise SchemaError(f"{path}/allOf must be an array")
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            # properties come in the order the schema text gives them: the keywords
            # next to allOf first if "properties" is written before "allOf"
            parts = [rest] + subs if _before(schema, "properties", "allOf") else subs + [rest]
            return self.node(self.merge(parts, f"{path}/allOf"), path)
        if any(k in schema for k in _PRODUCT_KW):
            return self._memo_product(schema, path)
        if self.property_order == "auto" and schema.get("uniqueItems") is True:
            return self._product_node(schema, path)      # uniqueItems' subsets of values
        return self._node_rest(schema, path)

    def _memo_product(self, schema: dict, path: str) -> Node:
        """``_node`` of a subschema with an automaton product (``oneOf``, ``not``,
        ``if``, merged ``allOf``), memoised: the same subschema met again in the same
        context (polarity, property order, depth, the multiset of ``$ref`` s being
        expanded, which decides every recursion cut below it, and whether it lies inside
        a value) gets the same node, or the same size error, without determinising its
        operands again (recursive ``$ref`` s that reach one ``oneOf`` from several
        places)."""
        try:
            text = json.dumps(schema, sort_keys=True)
            reach = self._reachable_refs(schema, text)
            key = (text, self._neg, self.property_order, self.max_depth, self.free_depth,
                   self._neg_free_depth, self._soup_neg,
                   # deeper subtracted free-form values depend on the offset below the
                   # operand's top
                   self._depth_here - self._neg_root if self._neg_free_depth else None,
                   frozenset((k, c) for k, c in Counter(self._ref_stack).items()
                             if k in reach),
                   frozenset((k, c) for k, c in Counter(self._merge_stack).items()
                             if k in reach),
                   any(x in path for x in _VALUE_PATHS))
        except (TypeError, ValueError, SchemaError):
            return self._product_node(schema, path)
        hit = self._product_memo.get(key)
        if hit is not None and self._neg and not isinstance(hit, Exception):
            # a node built before may hold free-form values at or below this depth
            self._note_neg_free()
        if hit is not None:
            if isinstance(hit, Exception):
                raise copy.copy(hit)
            self.auto_spent += hit[1]
            self.narrowings += hit[2]
            return hit[0]
        shared = self._shared_products.get(key)
        if shared is not None:
            if self._neg:
                self._note_neg_free()
            # built by an earlier attempt of this compile (compile_json_schema's
            # schema-order retry after an order-free attempt): the same node
            # (not counted again in product_work: reusing it costs nothing)
            self._product_memo[key] = (shared[0], 0, shared[1])
            self.narrowings += shared[1]
            return shared[0]
        spent, narrowed = self.auto_spent, self.narrowings
        try:
            n = self._product_node(schema, path)
        except AutomatonTooLargeError as e:
            # a copy, without the traceback: its frames hold this builder (a reference
            # cycle keeping the builder's trees for the cyclic GC)
            self._product_memo[key] = copy.copy(e)
            raise
        self._product_memo[key] = (n, self.auto_spent - spent, self.narrowings - narrowed)
        if key[2] == "schema":
            # a schema-order node does not depend on the attempt (auto_spent plays no
            # part in it): later attempts of the same compile may reuse it. Only
            # successes: a product-work error depends on the attempt's earlier work
            self._shared_products[key] = (n, self.narrowings - narrowed)
        return n

    def _reachable_refs(self, schema: Any, text: str) -> frozenset:
        """The ``$ref`` keys (as :meth:`resolve` names them) that building ``schema``
        may expand: those in it and, transitively, in their targets."""
        hit = self._reach_memo.get(text)
        if hit is not None:
            return hit
        seen: set = set()
        stack = [schema]
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                ref = x.get("$ref")
                if isinstance(ref, str):
                    key = "#" if ref in ("", "#") else ref
                    if key not in seen:
                        seen.add(key)
                        try:
                            stack.append(self.resolve(ref, "")[0])
                        except (SchemaError, UnsupportedSchemaError):
                            pass
                stack.extend(v for k, v in x.items() if isinstance(v, (dict, list)))
            elif isinstance(x, list):
                stack.extend(v for v in x if isinstance(v, (dict, list)))
        out = self._reach_memo[text] = frozenset(seen)
        return out

    def _product_node(self, schema: dict, path: str) -> Node:
        # free-form values inside products keep free_depth (their operands are
        # determinised, within max_product_states)
        self._product_level += 1
        try:
            return self._product_node1(schema, path)
        finally:
            self._product_level -= 1

    def _product_node1(self, schema: dict, path: str) -> Node:
        if self.property_order != "auto":
            return self._node_rest(schema, path)
        # if the order-free objects make an operand or product too large, the subschema
        # is built again in the schema's order (unless no order-free form was built in
        # it: the schema's order would fail the same way)
        spent = self.auto_spent
        try:
            return self._node_rest(schema, path)
        except AutomatonTooLargeError:
            if self.auto_spent == spent:
                raise
            self.auto_spent = spent
            self.property_order = "schema"
            try:
                return self._node_rest(schema, path)
            finally:
                self.property_order = "auto"

    def _node_rest(self, schema: dict, path: str) -> Node:
        """``_node`` after ``$ref`` and ``allOf``."""
        try:
            return self._node_rest1(schema, path)
        finally:
            self._nfa_memo.clear()

    def _node_rest1(self, schema: dict, path: str) -> Node:
        if "__and" in schema:            # internal: conjuncts merge() could not combine
            rest = {k: v for k, v in schema.items() if k != "__and"}
            d = self.to_dfa(self.node(rest, path), path, "allOf")
            for i, sub in enumerate(schema["__and"]):
                d = self._product(d, self.to_dfa(self.node(sub, path), path, "allOf"),
                                  path, "allOf", intersect)
            return Node("dfa", (d,), d.num_states + 1)
        deps = self._dependencies(schema, path)
        if deps:
            name, extra = deps[0]
            rest = self._without_dependency(schema, name)
            present = self.merge([rest, {"required": [name]}, extra], path)
            absent = self.merge([rest, {"properties": {name: False}}], path)
            return alt(self.node(present, path), self.node(absent, path))
        split = self._presence_split(schema, path)
        if split is not None:
            spent = self.auto_spent
            try:
                return alt(*(self.node(s, path) for s in split))
            except AutomatonTooLargeError:
                self.auto_spent = spent          # the cases passed a limit: a product
        if "if" in schema:
            cond = schema["if"]
            rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
            then_s = schema.get("then", True)
            else_s = schema.get("else", True)
            yes = self.node(self.merge([rest, cond, then_s], f"{path}/then"), path)
            no_s = self.merge([rest, else_s], f"{path}/else")
            no = self.node(no_s, path)
            self._last_least = None
            neg_cond = (self.negated_or_meet(cond, no_s, f"{path}/if") if no.kind != "empty"
                        else EMPTY)
            least = self._last_least
            if no.kind != "empty" and not self.disjoint(no, neg_cond):
                no_d = self.to_dfa(no, f"{path}/else", "else")
                c = self.subtrahend(cond, no_s, no_d, neg_cond, least, f"{path}/if", "if")
                d = self._product(no_d, c, f"{path}/if", "if/else", difference)
                self._note_difference(no, d)
                no = Node("dfa", (d,), d.num_states + 1)
            return alt(yes, no)
        if "not" in schema:
            rest = {k: v for k, v in schema.items() if k != "not"}
            neg = self.negated_or_meet(schema["not"], rest, f"{path}/not")
            least = self._last_least
            base = self.node(rest, path)
            if neg.kind == "empty" or base.kind == "empty" or self.disjoint(base, neg):
                return base
            bd = self.to_dfa(base, path, "not")
            c = self.subtrahend(schema["not"], rest, bd, neg, least, f"{path}/not", "not")
            d = self._product(bd, c, f"{path}/not", "not", difference)
            self._note_difference(base, d)
            return Node("dfa", (d,), d.num_states + 1)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                subs = schema[key]
                if not isinstance(subs, list):
                    raise SchemaError(f"{path}/{key} must be an array")
                rest = {k: v for k, v in schema.items() if k != key and not is_annotation(k)
                        and k not in ("$defs", "definitions")}
                rest_first = _before(schema, "properties", key)
                opts, merged, narrowed = [], [], []
                for i, sub in enumerate(subs):
                    if rest:
                        sub = self.merge([rest, sub] if rest_first else [sub, rest],
                                         f"{path}/{key}/{i}")
                    merged.append(sub)
                    before = self.narrowings
                    opts.append(self.node(sub, f"{path}/{key}/{i}"))
                    narrowed.append(self.narrowings != before)
                if key == "oneOf":
                    return self.exactly_one(opts, merged, f"{path}/oneOf", narrowed)
                return alt(*opts)
        if "const" in schema:
            values = [schema["const"]]
            if isinstance(schema.get("enum"), list):
                values = [v for v in values if any(_json_eq(v, e) for e in schema["enum"])]
            return self.enum_node(values, schema, path)
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise SchemaError(f"{path}/enum must be an array")
            return self.enum_node(schema["enum"], schema, path)
        types = self.types_of(schema, path)
        return alt(*(self.typed(t, schema, path) for t in types))

    # -- automaton products (oneOf, not, if/then/else) -------------------------------
    def value_node(self, schema: Any, path: str) -> Node:
        """``node`` of a value nested one container deeper (an item, a member's value):
        counted in ``_depth_here`` for the free-form values of subtracted operands."""
        self._depth_here += 1
        try:
            return self.node(schema, path)
        finally:
            self._depth_here -= 1

    def negated(self, schema: Any, path: str) -> Node:
        """``schema``'s node with the polarity flipped (see ``_neg``). Records, for
        :meth:`subtrahend`, the least container depth (below the operand's top) of the
        free-form values it built or reused while subtracted (``_last_least``)."""
        self._neg = not self._neg
        root, least = self._neg_root, self._neg_least
        self._neg_root, self._neg_least = self._depth_here, None
        try:
            n = self.node(schema, path)
        finally:
            self._neg = not self._neg
            found = self._neg_least
            self._neg_root, self._neg_least = root, least
        self._last_least = found
        return n

    def negated_meet(self, positive: Any, schema: Any, path: str) -> Node:
        """A superset of ``positive ∧ schema``, to subtract from ``positive``'s language
        (``positive \\ schema = positive \\ (positive ∧ schema)``). Built from the merged
        schema, a free-form value of ``schema`` lies where ``positive`` has its own value
        (typed, or free-form at the same depth), so the depth-bounded free-form value is
        a superset there; a depth-bounded one alone would miss the positive side's deeper
        values and keep invalid instances. If the two do not merge, ``schema`` alone with
        ``soup_value`` free-form values (any depth)."""
        if isinstance(positive, dict):
            # only positive's structure matters here: its presence, count and scalar
            # restrictions are dropped (still a superset, and the meet's objects track
            # no more required properties than schema's)
            positive = {k: v for k, v in positive.items() if k not in _MEET_DROPPED}
        try:
            met = self.merge([positive, schema], path)
        except (SchemaError, UnsupportedSchemaError):
            met = None
        if met is not None:
            try:
                key = (json.dumps(met, sort_keys=True), self._neg, self._soup_neg,
                       self.property_order, self.max_depth, self.free_depth,
                       self._neg_free_depth,
                       tuple(self._ref_stack), tuple(self._merge_stack))
            except (TypeError, ValueError):
                n = self.negated(met, path)
                self._last_least = None
                return n
            hit = self._meet_memo.get(key)
            if hit is not None:
                self._last_least = None
                return hit
            try:
                hit = self._meet_memo[key] = self.negated(met, path)
                self._last_least = None                     # a superset as it is
                return hit
            except (SchemaError, UnsupportedSchemaError):
                pass            # keywords of the two sides that do not combine (inside)
        soup, self._soup_neg = self._soup_neg, True
        try:
            n = self.negated(schema, path)
        finally:
            self._soup_neg = soup
        self._last_least = None
        return n

    def negated_or_meet(self, schema: Any, positive: Any, path: str) -> Node:
        """``negated(schema)``, or its meet with ``positive`` where that operand alone
        passes a size limit (the meet's objects are often smaller: typed values for
        free-form ones, no more required properties than ``schema``'s)."""
        try:
            return self.negated(schema, path)
        except AutomatonTooLargeError:
            return self.negated_meet(positive, schema, path)

    def to_dfa(self, node: Node, path: str, keyword: str) -> DFA:
        """The minimal DFA of ``node``, with at most ``max_product_states`` states."""
        if node.kind == "dfa":
            return node.args[0]
        if node.size > 40 * self.max_product_states:
            self._product_too_large(node.size, path, keyword, "NFA states")
        hit = self._nfa_memo.pop(id(node), None)
        if hit is not None and hit[0] is node:
            nfa = hit[1]
        else:
            nfa = self._shared_nfa(node)
            self._spend(nfa.virtual_states, path, keyword)
        # determinised once per tree in a compile (its attempts rebuild equal trees)
        memo = self._string_memo.setdefault("operand dfas", {})
        key = (self.digest(node), self.whitespace, self.max_product_states)
        out = memo.get(key)
        if out is None:
            try:
                d = determinize(nfa, max_states=self.max_product_states)
                out = memo[key] = (d.num_states, minimize(d))
            except AutomatonTooLargeError:
                out = memo[key] = (None, None)
        if out[0] is None:
            self._product_too_large(self.max_product_states, path, keyword, "DFA states")
        self._spend(out[0], path, keyword)
        return out[1]

    def _shared_nfa(self, node: Node) -> NFA:
        """``_node_nfa(node, whitespace)``, built once per tree in a compile (shared, never
        modified)."""
        memo = self._string_memo.setdefault("operand nfas", {})
        key = (self.digest(node), self.whitespace)
        nfa = memo.get(key)
        if nfa is None:
            nfa = memo[key] = _node_nfa(node, self.whitespace)
        return nfa

    def _spend(self, states: int, path: str, keyword: str) -> None:
        """Count the automaton states that products build (operand NFAs, their DFAs,
        product DFAs); past ``max_product_work`` the schema is refused (its products
        would take minutes)."""
        self.product_work += states
        if self.product_work > self.max_product_work:
            raise AutomatonTooLargeError(
                f"{keyword!r} at {path or '/'} is enforced by an automaton product, and "
                f"the schema's products have built more than {self.max_product_work:,} "
                "automaton states in all (limit max_product_work); simplify the schema "
                "(e.g. fewer overlapping oneOf branches inside recursive $refs)")

    def _product(self, a: DFA, b: DFA, path: str, keyword: str, op) -> DFA:
        try:
            d = op(a, b, self.max_product_states)
        except AutomatonTooLargeError:
            self._product_too_large(self.max_product_states, path, keyword, "DFA states")
        self._spend(d.num_states, path, keyword)
        return d

    def _product_too_large(self, size, path, keyword, what):
        raise AutomatonTooLargeError(
            f"{keyword!r} at {path or '/'} is enforced by an automaton product, and its "
            f"operand needs more than {size} {what} (limit max_product_states="
            f"{self.max_product_states}); raise it, or simplify the subschema")

    def exactly_one(self, opts: list[Node], schemas: list, path: str,
                    narrowed: list[bool] | None = None) -> Node:
        """``oneOf``: the strings in exactly one of the branches. Branches whose first
        bytes are pairwise disjoint (different JSON types) are a plain union; otherwise
        each branch is determinised and the union of ``L_i \\ ∪_{j≠i} L_j`` is built
        (``L_j`` as a superset: see :meth:`subtrahend`). ``narrowed[i]``: branch ``i``
        was built smaller than its language in a way that may leave out a value type or
        every value (``narrowings``); its first bytes and emptiness are then read on
        its schema (:func:`_schema_first_bytes`, a superset)."""
        if self._neg:                    # a superset is enough: the union
            return alt(*opts)
        narrowed = narrowed or [False] * len(opts)
        firsts = [self._language_first_bytes(sch, f"{path}/{i}") if n else _first_bytes(o)
                  for i, (o, sch, n) in enumerate(zip(opts, schemas, narrowed))]
        live = [i for i, (o, n) in enumerate(zip(opts, narrowed))
                if (firsts[i] if n else o.kind != "empty")]
        if len(live) <= 1:
            return alt(*opts)
        groups: list[list[int]] = []          # branches that share a first byte
        for i, f in enumerate(firsts):
            if i not in live:
                continue
            hit = [g for g in groups if any(firsts[j] & f for j in g)]
            merged = [i] + [j for g in hit for j in g]
            groups = [g for g in groups if g not in hit] + [merged]
        out = []
        for g in groups:
            if len(g) == 1:
                out.append(opts[g[0]])
                continue
            g = sorted(g)
            closed = self._closed_object_cases([schemas[i] for i in g], path)
            if closed is not None:
                out.extend(closed)
                continue
            apart = self._objects_apart([opts[i] for i in g], [schemas[i] for i in g],
                                        [firsts[i] for i in g], path)
            if all(len(a) == len(g) - 1 for a in apart):
                out.extend(opts[i] for i in g)
                continue
            try:
                out.extend(self._exactly_one_product(g, opts, schemas, apart, path))
            except AutomatonTooLargeError:
                if self.property_order == "auto":
                    raise         # _product_node1 first tries the schema's order, exact
                # a subset with its own allowance of product work (the witnesses'
                # small value negations): ONE_OF_WITNESS_WORK of max_product_work
                limit = self.max_product_work
                self.max_product_work = int(limit * (1 + ONE_OF_WITNESS_WORK))
                try:
                    cases = self._one_of_witnessed([firsts[i] for i in g],
                                                   [schemas[i] for i in g], apart, path)
                except AutomatonTooLargeError:
                    cases = None
                finally:
                    self.max_product_work = limit
                if cases is None:
                    raise
                out.extend(cases)
        return alt(*out)

    def _note_difference(self, before: Node, after: DFA) -> None:
        """``after`` is ``before`` minus a superset of what should go, so it may have
        lost values that belong: count a narrowing (``narrowings``) where that shows in
        what an enclosing ``oneOf`` reads, the first bytes or emptiness."""
        if is_empty(after) or \
                _first_bytes(Node("dfa", (after,), after.num_states + 1)) != _first_bytes(before):
            self.narrowings += 1

    def _language_first_bytes(self, schema: Any, path: str, depth: int = 0) -> frozenset:
        """A superset of the first bytes of ``schema``'s values, read on its keywords:
        ``const``/``enum``/``type`` (:func:`_schema_first_bytes`), narrowed by the
        targets of ``$ref`` and the parts of ``allOf`` (each applies) and by the union
        of the branches of ``anyOf``/``oneOf``; every byte where they say nothing."""
        f = _schema_first_bytes(schema)
        if not isinstance(schema, dict) or depth > 8:
            return f
        if isinstance(schema.get("$ref"), str):
            try:
                f &= self._language_first_bytes(self.resolve(schema["$ref"], path)[0],
                                                path, depth + 1)
            except (SchemaError, UnsupportedSchemaError):
                pass
        if isinstance(schema.get("allOf"), list):
            for part in schema["allOf"]:
                f &= self._language_first_bytes(part, path, depth + 1)
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                u = frozenset()
                for part in schema[key]:
                    u |= self._language_first_bytes(part, path, depth + 1)
                f &= u
        return f

    def _exactly_one_product(self, g: list[int], opts: list[Node], schemas: list,
                             apart: list[set], path: str) -> list[Node]:
        """The branches ``g`` of :meth:`exactly_one` (they share a first byte), each
        minus the others it is not shown ``apart`` from (positions in ``g``), by
        automaton products."""
        negs: dict = {}
        leasts: dict = {}

        def neg_of(j: int) -> Node:
            # branch j as a superset (subtracted), built once
            if j not in negs:
                others = [schemas[k] for k in g if k != g[j]]
                negs[j] = self.negated_or_meet(
                    schemas[g[j]], others[0] if len(others) == 1 else {"anyOf": others},
                    f"{path}/{g[j]}")
                leasts[j] = self._last_least
            return negs[j]
        # branch i loses only the (superset) branches j it can share a value with:
        # an NFA product search shows most pairs disjoint, and a branch disjoint
        # from every other one is kept as it is, without determinising anything
        meets = [[j for j in range(len(g)) if j != i and j not in apart[i]
                  and not self.disjoint(opts[g[i]], neg_of(j))] for i in range(len(g))]
        out = []
        pos: dict = {}
        neg: dict = {}
        for i in range(len(g)):
            if not meets[i]:
                out.append(opts[g[i]])
                continue
            if i not in pos:
                pos[i] = self.to_dfa(opts[g[i]], path, "oneOf")
            x = pos[i]
            for j in meets[i]:
                if is_empty(x):
                    break
                # a subtrahend built at the default depth serves every branch; a
                # deeper one (or a meet) is the pair's own
                key = j if leasts[j] is None else (j, i)
                if key not in neg and leasts[j] is not None:
                    neg[key] = self.subtrahend(schemas[g[j]], schemas[g[i]], pos[i],
                                               negs[j], leasts[j], f"{path}/{g[j]}",
                                               "oneOf")
                if key not in neg:
                    neg[key] = self.to_dfa(negs[j], path, "oneOf")
                x = self._product(x, neg[key], path, "oneOf", difference)
            self._note_difference(opts[g[i]], x)
            if not is_empty(x):
                out.append(Node("dfa", (x,), x.num_states + 1))
        return out

    def _objects_apart(self, opts: list[Node], schemas: list, firsts: list[frozenset],
                       path: str) -> list[set]:
        """For each ``oneOf`` branch ``i`` (``opts``, merged ``schemas``, the first
        bytes of its language or a superset of them, ``firsts``), the branches no value
        of it can satisfy, shown on the keywords: ``i`` takes objects only and
        requires a property that the other's ``properties`` refuses outright (``false``)
        or gives values that ``i``'s own schema for it cannot take (``const``/``enum``
        values equal under JSON Schema, or ``type`` s, apart: a discriminator), or the
        other way round. Read on the keywords alone (no automaton). Exact: such pairs
        need no product."""
        n = len(opts)
        facts = [_object_facts(s) for s in schemas]
        objs = [bool(f) and f <= _OPEN_BRACE for f in firsts]
        apart: list[set] = [set() for _ in range(n)]

        def shown(i: int, j: int) -> bool:
            # an object of i has a required property whose value j refuses
            if not objs[i]:
                return False
            return any(name in facts[j][1] and _values_apart(facts[i][1].get(name, True),
                                                             facts[j][1][name])
                       for name in facts[i][0])
        for i in range(n):
            for j in range(i + 1, n):
                if shown(i, j) or shown(j, i):
                    apart[i].add(j)
                    apart[j].add(i)
        return apart

    def _one_of_witnessed(self, firsts: list[frozenset], schemas: list, apart: list[set],
                          path: str) -> list[Node] | None:
        """``oneOf`` branches past a product limit: a subset. Branch ``i`` keeps its
        objects that show, by a property, that they are in no other branch ``j`` it is
        not ``apart`` from: a property ``j`` requires and ``i`` does not is absent, or
        else a property ``j`` gives a ``const``/``enum`` is present with another value;
        a branch without a witness against some ``j`` is left out, and so are values
        other than objects. None if no branch takes an object."""
        if not any(ord("{") in f for f in firsts):
            return None                 # no branch takes an object: no property to show
        facts = [_object_facts(s) for s in schemas]
        out = []
        for i, schema in enumerate(schemas):
            extra: list = [{"type": "object"}]
            for j in range(len(schemas)):
                if j == i or j in apart[i]:
                    continue
                absent = [k for k in facts[j][0] if k not in facts[i][0]]
                if absent:
                    extra.append({"properties": {absent[0]: False}})
                    continue
                named = [k for k, v in facts[j][1].items()
                         if isinstance(v, dict) and ("const" in v or "enum" in v)]
                if not named:
                    extra = None              # no witness against j: branch i left out
                    break
                k = named[0]
                extra.append({"required": [k], "properties": {
                    k: _values_outside(facts[i][1].get(k), facts[j][1][k])}})
            if extra is None:
                continue
            where = f"{path}/{i}"
            try:
                out.append(self.node(self.merge([schema] + extra, where), where))
            except (SchemaError, UnsupportedSchemaError):
                return None
        self.narrowings += 1
        return out

    def _closed_object_cases(self, branches: list, path: str) -> list[Node] | None:
        """``oneOf`` branches that are closed objects (``type: object``,
        ``additionalProperties: false``, only ``properties``/``required``) giving every
        key they share the same schema: an object of branch ``i`` is in branch ``j`` iff
        it has no key ``j`` lacks and every key ``j`` requires, a presence test. So
        branch ``i`` minus the others is branch ``i`` with, for each ``j``, a key of
        ``i`` outside ``j`` or a key ``j`` requires absent: cases of present and absent
        keys (:meth:`_presence_cases`), no product. None if the branches are not of that
        form or the cases pass ``MAX_PRESENCE_CASES``."""
        shapes = []
        for b in branches:
            if not isinstance(b, dict) or b.get("type") not in ("object", ["object"]) or \
                    b.get("additionalProperties") is not False:
                return None
            if any(k not in ("type", "properties", "required", "additionalProperties")
                   and not is_annotation(k) for k in b):
                return None
            props, req = b.get("properties") or {}, b.get("required") or []
            if not isinstance(props, dict) or not isinstance(req, list) or \
                    not all(isinstance(r, str) for r in req):
                return None
            shapes.append((props, req))
        for i, (pi, _) in enumerate(shapes):
            for pj, _ in shapes[i + 1:]:
                if any(not _json_eq(pi[k], pj[k]) for k in pi if k in pj):
                    return None
        out = []
        for i, (pi, _) in enumerate(shapes):
            f: list[dict] | None = [{}]
            for j, (pj, rj) in enumerate(shapes):
                if j == i or f is None:
                    continue
                # not (no key of i outside j, and every key j requires)
                f = _dnf_and(f, [{k: True} for k in pi if k not in pj]
                             + [{k: False} for k in rj])
            if f is None:
                return None
            out.extend(self.node(c, path) for c in self._presence_cases(branches[i], f, path))
        return out

    def subtrahend(self, schema: Any, positive: Any, pos_dfa: DFA, node: Node,
                   least: int | None, path: str, keyword: str) -> DFA:
        """The DFA of a superset of ``schema`` to subtract from ``pos_dfa`` (whose
        schema is ``positive``); ``node``: ``schema`` negated at the default depth, whose
        depth-bounded free-form values lie ``least`` or more containers below its top
        (None: it has none; see ``_last_least``). Those are a
        superset only if the positive side nests no deeper: checked on ``pos_dfa``
        (:func:`_nesting_bound`); if it does, ``schema`` is built again with free-form
        values that deep, else from its meet with ``positive`` (:meth:`negated_meet`).
        Using the default depth whatever the positive side's depth would keep invalid
        instances nested deeper than it."""
        if least is None:                      # no free-form value in the operand
            return self.to_dfa(node, path, keyword)
        hit = self._nesting_memo.get(id(pos_dfa))
        if hit is None or hit[0] is not pos_dfa:
            hit = self._nesting_memo[id(pos_dfa)] = (
                pos_dfa, _nesting_bound(pos_dfa, self.free_depth, MAX_SUBTRAHEND_DEPTH + 3,
                                        self.max_product_states))
        k = hit[1]
        # a free-form value r containers below the operand's top covers the positive
        # side's values there if free_depth >= k - r
        if k is not None and k - least <= self.free_depth:
            return self.to_dfa(node, path, keyword)
        if k is not None and k - least <= MAX_SUBTRAHEND_DEPTH:
            old, self._neg_free_depth = self._neg_free_depth, k
            try:
                return self.to_dfa(self.negated(schema, path), path, keyword)
            except AutomatonTooLargeError:
                pass
            finally:
                self._neg_free_depth = old
        return self.to_dfa(self.negated_meet(positive, schema, path), path, keyword)

    def disjoint(self, a: Node, b: Node) -> bool:
        """True if no string is in both ``a`` and ``b`` (found by a search over pairs of
        their NFA states, at most ``MAX_DISJOINT_PAIRS``); False if one is, or past that
        bound."""
        if a.kind == "empty" or b.kind == "empty":
            return True
        if not (_first_bytes(a) & _first_bytes(b)):
            return True
        if a.size + b.size > 40 * self.max_product_states:
            return False
        na, nb = self._memo_nfa(a), self._memo_nfa(b)
        memo = self._string_memo.setdefault("disjoint", {})
        key = (self.digest(a), self.digest(b), self.whitespace)
        out = memo.get(key)
        if out is None:
            out = memo[key] = _nfa_disjoint(na, nb, MAX_DISJOINT_PAIRS) is True
        return out

    def _memo_nfa(self, node: Node) -> NFA:
        """``node``'s NFA, kept for the ``to_dfa`` that may follow a ``disjoint``."""
        hit = self._nfa_memo.get(id(node))
        if hit is None or hit[0] is not node:
            hit = self._nfa_memo[id(node)] = (node, self._shared_nfa(node))
            self._spend(hit[1].virtual_states, "", "oneOf")
        return hit[1]

    # -- dependentRequired / dependentSchemas / dependencies ----------------------------
    def _dependencies(self, schema: dict, path: str) -> list[tuple[str, Any]]:
        """``[(name, schema that applies when name is present), ...]``."""
        out = []
        for key in ("dependentRequired", "dependentSchemas", "dependencies"):
            deps = schema.get(key)
            if deps is None:
                continue
            if not isinstance(deps, dict):
                raise SchemaError(f"{path}/{key} must be an object")
            for name, d in deps.items():
                if isinstance(d, list):
                    if not all(isinstance(x, str) for x in d):
                        raise SchemaError(f"{path}/{key}/{name} must be an array of strings")
                    if not d:
                        continue
                    out.append((name, {"required": list(d)}))
                elif isinstance(d, (dict, bool)):
                    if d is True or d == {}:
                        continue
                    out.append((name, d))
                else:
                    raise SchemaError(f"{path}/{key}/{name} must be an array or a schema")
        if len(out) > MAX_DEPENDENCIES:
            raise AutomatonTooLargeError(
                f"{len(out)} property dependencies at {path or '/'} (dependentRequired/"
                f"dependentSchemas/dependencies): each doubles the object's cases; the "
                f"limit is {MAX_DEPENDENCIES}")
        return out

    def _presence_split(self, schema: dict, path: str) -> list[dict] | None:
        """``not``, ``oneOf`` or ``if`` whose operands only test which keys an object
        has (``required``, and ``type: "object"``, under ``not``/``allOf``/``anyOf``/
        ``oneOf``), as schemas whose union is ``schema``: the rest of ``schema`` merged
        with each case of the test's disjunctive normal form (``required`` for present
        keys, ``properties: {k: false}`` for absent ones). Exact, and no automaton
        product (whose subtracted operand would carry free-form values at the positive
        side's depth). None if no such keyword, or past ``MAX_PRESENCE_CASES``."""
        if "not" in schema:
            f = _presence_dnf(schema["not"])
            g = None if f is None else _dnf_not(f)
            if g is not None:
                rest = {k: v for k, v in schema.items() if k != "not"}
                return self._presence_cases(rest, g, path)
        if isinstance(schema.get("oneOf"), list) and schema["oneOf"]:
            one = _presence_dnf({"oneOf": schema["oneOf"]})
            if one is not None:
                rest = {k: v for k, v in schema.items() if k != "oneOf"}
                return self._presence_cases(rest, one, path)
        if "if" in schema:
            f = _presence_dnf(schema["if"])
            g = None if f is None else _dnf_not(f)
            if g is not None:
                rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
                return (self._presence_cases(rest, f, f"{path}/then", schema.get("then", True))
                        + self._presence_cases(rest, g, f"{path}/else",
                                               schema.get("else", True)))
        return None

    def _presence_cases(self, rest: dict, dnf: list[dict], path: str,
                        extra: Any = True) -> list[dict]:
        """``rest`` (and ``extra``) merged with each case of ``dnf``. A case holds for a
        value other than an object iff it has only "present" keys and no ``_OBJECT``
        literal (``required`` holds for such values): the other cases get ``type:
        "object"``, and a case "not an object" the other types."""
        cases = []
        for term in dnf:
            obj = term.get(_OBJECT)
            keys = {k: v for k, v in term.items() if k is not _OBJECT}
            if obj is False:
                if all(keys.values()):
                    cases.append({"type": ["null", "boolean", "number", "string", "array"]})
                continue                        # an absent key: no such value
            c: dict = {}
            if any(keys.values()):
                c["required"] = [k for k, v in keys.items() if v]
            if not all(keys.values()):
                c["properties"] = {k: False for k, v in keys.items() if not v}
            if not all(keys.values()) or obj:
                c["type"] = "object"
            cases.append(c)
        return [self.merge([rest, c, extra], path) for c in cases]

    @staticmethod
    def _without_dependency(schema: dict, name: str) -> dict:
        out = dict(schema)
        for key in ("dependentRequired", "dependentSchemas", "dependencies"):
            if isinstance(out.get(key), dict) and name in out[key]:
                d = dict(out[key])
                del d[name]
                if d:
                    out[key] = d
                else:
                    del out[key]
        return out

    # -- allOf -----------------------------------------------------------------------
    def merge(self, subs: list, path: str) -> dict:
        """One schema equivalent to ``allOf: subs`` (refs resolved), for the cases that
        reduce to one automaton: keyword-wise intersection."""
        out: dict = {}
        merged_parts: list = []          # the object parts, for _merge_extras
        arrays: list = []                # (prefix schemas, items schema) of each part
        for i, sub in enumerate(subs):
            where = f"{path}/{i}"
            if sub is True:
                continue
            if sub is False:
                return {"enum": []}
            if not isinstance(sub, dict):
                raise SchemaError(f"schema at {where} must be an object or boolean")
            if "$ref" in sub:
                target, key = self.resolve(sub["$ref"], f"{where}/$ref")
                if self._ref_stack.count(key) >= self.max_depth or \
                        self._merge_stack.count(key) > self.max_depth:
                    if self._neg:
                        continue
                    self.ref_cuts += 1
                    self.narrowings += 1
                    return {"enum": []}
                rest = {k: v for k, v in sub.items() if k != "$ref"}
                self._ref_stack.append(key)
                try:
                    sub = self.merge([target, rest], where)
                finally:
                    self._ref_stack.pop()
                # internal: the references merged in, on _merge_stack while the merged
                # schema is built (_node), so that a recursion through allOf alone is cut
                # (after max_depth + 1 merges: a recursion that also passes a plain $ref
                # reaches that $ref's cut first, as before)
                sub = {**sub, "__refs": list(sub.get("__refs", ())) + [key]}
            if "allOf" in sub:
                rest = {k: v for k, v in sub.items() if k != "allOf"}
                parts = ([rest] + list(sub["allOf"]) if _before(sub, "properties", "allOf")
                         else list(sub["allOf"]) + [rest])
                sub = self.merge(parts, where)
            if "contains" not in sub and ("minContains" in sub or "maxContains" in sub):
                # minContains / maxContains apply to their own schema's contains only
                sub = {k: v for k, v in sub.items() if k not in ("minContains", "maxContains")}
            if any(k in sub for k in _POSITIONAL):
                # prefixItems / items (and the draft-04 tuple form) apply to this part's
                # positions: combined position by position below, so that one part's
                # prefixItems never exempts another part's items
                arrays.append(_positions(sub))
                sub = {k: v for k, v in sub.items() if k not in _POSITIONAL}
            merged_parts.append(sub)
            cont = ("contains", "minContains", "maxContains")
            if "contains" in sub and "contains" in out and not all(
                    _json_eq(out.get(k), sub.get(k)) for k in cont):
                # two contains: both must hold, each with its own counts
                out.setdefault("__and", []).append({k: sub[k] for k in cont if k in sub})
                sub = {k: v for k, v in sub.items() if k not in cont}
            if "if" in sub and any(k in out for k in ("if", "then", "else")):
                out.setdefault("__and", []).append(
                    {k: sub[k] for k in ("if", "then", "else") if k in sub})
                sub = {k: v for k, v in sub.items() if k not in ("if", "then", "else")}
            for k, v in sub.items():
                if is_annotation(k) or k in ("$defs", "definitions"):
                    continue
                if k in ("then", "else") and "if" not in sub:
                    continue               # then/else without if: no effect
                if k == "__and":
                    out["__and"] = list(out.get("__and", [])) + list(v)
                    continue
                if k == "__refs":
                    out["__refs"] = list(out.get("__refs", [])) + list(v)
                    continue
                if k == "__patterns" or (k == "pattern" and k in out and out[k] != v):
                    # internal: more patterns a string must match (all of them)
                    more = [x for x in (v if k == "__patterns" else [v])
                            if x != out.get("pattern") and x not in out.get("__patterns", ())]
                    if more:
                        out["__patterns"] = list(out.get("__patterns", [])) + more
                    continue
                if k in out and k in ("oneOf", "if", "then", "else") and not _json_eq(out[k], v):
                    out.setdefault("__and", []).append({k: v})
                    continue
                if k not in out:
                    out[k] = v
                elif k == "const":
                    if not _json_eq(out[k], v):
                        out["enum"] = []
                else:
                    out[k] = self._merge_kw(k, out[k], v, where)
        if arrays:
            n = max(len(p) for p, _ in arrays)
            at = [_conj([p[i] if i < len(p) else it for p, it in arrays]) for i in range(n)]
            rest = _conj([it for _, it in arrays])
            if n:
                out["prefixItems"] = at
            if rest is not True:
                out["items"] = rest
        return self._merge_extras(out, merged_parts, path)

    def _merge_extras(self, out: dict, parts: list, path: str) -> dict:
        """``allOf`` of objects: a property that one part declares is an extra property
        of another part that does not, so that part's ``additionalProperties`` applies
        to it too (unless one of its ``patternProperties`` matches the name, whose
        schema then applies, as the merged ``patternProperties`` already do). Likewise
        a key that one part's pattern matches gets another part's
        ``additionalProperties`` when that part has no patterns (with patterns on both
        sides the split is not built: an error in strict mode)."""
        if len(parts) < 2 or not any(isinstance(p.get("additionalProperties"), (dict, bool))
                                     and p.get("additionalProperties") is not True
                                     for p in parts):
            return out
        props = out.get("properties")
        pats = out.get("patternProperties")
        new_props = dict(props) if isinstance(props, dict) else None
        for p in parts:
            addl = p.get("additionalProperties")
            if addl is None or addl is True or not isinstance(addl, (dict, bool)):
                continue
            own = p.get("properties") or {}
            own_pats = p.get("patternProperties") or {}
            if new_props is not None:
                for name in list(new_props):
                    if name in own:
                        continue
                    content = json.dumps(name, ensure_ascii=False)[1:-1].encode()
                    try:
                        matched = any(self._pattern_dfa(
                            pt, "either" if self._neg else "both").accepts(content)
                            for pt in own_pats)
                    except ValueError as e:
                        raise UnsupportedSchemaError(
                            f"allOf at {path or '/'}: patternProperties: {e}") from None
                    if matched:
                        continue
                    new_props[name] = {"allOf": [new_props[name], addl]}
            if isinstance(pats, dict):
                # (a pattern that this part also has is not extra to it)
                foreign = [pt for q in parts if q is not p
                           for pt in (q.get("patternProperties") or {})
                           if pt not in own_pats]
                if foreign:
                    if own_pats:
                        if self.strict:
                            raise UnsupportedSchemaError(
                                f"allOf at {path or '/'}: patternProperties of one part "
                                "with patternProperties and additionalProperties of another "
                                "are not combined into one automaton")
                        continue
                    pats = {pt: ({"allOf": [sch, addl]} if pt in foreign else sch)
                            for pt, sch in pats.items()}
        if new_props is not None:
            out["properties"] = new_props
        if isinstance(pats, dict):
            out["patternProperties"] = pats
        return out

    def _pattern_dfa(self, pat: str, reading: str = "both") -> DFA:
        """The DFA of the string contents that a ``pattern`` or ``patternProperties``
        regex matches (search semantics) in ``reading`` (:func:`pattern_content_dfa`:
        ``"both"`` for "the pattern surely matches", ``"either"`` for "it may"), once per
        compile;
        ``ValueError`` for a pattern it cannot build."""
        memo = self._string_memo.setdefault("pattern dfas", {})
        # where the readings agree, one DFA serves both (and `is` tells them apart)
        key = (pat, reading if _readings_differ(pat, reading) else "ecma")
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = pattern_content_dfa(pat, reading)
        return hit

    def _merge_kw(self, k, a, b, path):
        # (not a == b: Python's True == 1 would merge enum [1] with enum [true])
        if k in NOT_ENFORCED or _json_eq(a, b):
            return a          # (a not-enforced keyword is reported by node())
        if k == "not":
            return {"anyOf": [a, b]}
        if k in ("dependentRequired", "dependentSchemas", "dependencies") and \
                isinstance(a, dict) and isinstance(b, dict):
            out = dict(a)
            for name, d in b.items():
                if name not in out:
                    out[name] = d
                elif isinstance(out[name], list) and isinstance(d, list):
                    out[name] = list(dict.fromkeys(out[name] + d))
                else:
                    x = {"required": out[name]} if isinstance(out[name], list) else out[name]
                    y = {"required": d} if isinstance(d, list) else d
                    out[name] = {"allOf": [x, y]}
            return out
        if k == "unevaluatedProperties" and isinstance(a, (dict, bool)) and \
                isinstance(b, (dict, bool)):
            return {"allOf": [a, b]}
        if k == "type":
            ta = set(a) if isinstance(a, list) else {a}
            tb = set(b) if isinstance(b, list) else {b}
            if "number" in ta and "integer" in tb:
                ta.add("integer")
            if "number" in tb and "integer" in ta:
                tb.add("integer")
            return sorted(ta & tb) or ["__none__"]
        if k == "required":
            return list(dict.fromkeys(list(a) + list(b)))
        if k in ("properties", "patternProperties"):
            out = dict(a)
            for name, s in b.items():
                out[name] = {"allOf": [out[name], s]} if name in out else s
            return out
        if k in ("minimum", "minLength", "minItems", "minProperties"):
            return max(a, b)
        if k in ("maximum", "maxLength", "maxItems", "maxProperties"):
            return min(a, b)
        if k in ("exclusiveMinimum",) and not isinstance(a, bool) and not isinstance(b, bool):
            return max(a, b)
        if k in ("exclusiveMaximum",) and not isinstance(a, bool) and not isinstance(b, bool):
            return min(a, b)
        if k == "enum":
            return [x for x in a if any(_json_eq(x, y) for y in b)]
        if k == "multipleOf":
            return self._merge_multiple_of(a, b, path)
        if k in ("items", "additionalProperties", "propertyNames") and \
                isinstance(a, (dict, bool)) and isinstance(b, (dict, bool)):
            return {"allOf": [a, b]}
        if k in ("anyOf", "oneOf"):
            return [{"allOf": [x, y]} for x in a for y in b]
        if self.strict:
            raise UnsupportedSchemaError(
                f"allOf at {path or '/'}: cannot combine two different values of {k!r} into "
                "one automaton")
        return a

    def _merge_multiple_of(self, a, b, path):
        """Two ``multipleOf`` under one ``allOf``: a number is a multiple of both iff it
        is a multiple of their least common multiple (of rationals: ``lcm(p/q, r/s) =
        lcm(p, r) / gcd(q, s)`` in lowest terms), which is again a terminating decimal
        for decimal inputs."""
        from fractions import Fraction
        from math import gcd
        try:
            fa, fb = Fraction(to_decimal(a)), Fraction(to_decimal(b))
        except TypeError:
            raise SchemaError(f"{path}/multipleOf must be a number") from None
        if fa <= 0 or fb <= 0:
            raise SchemaError(f"{path}/multipleOf must be > 0")
        num = fa.numerator * fb.numerator // gcd(fa.numerator, fb.numerator)
        m = Fraction(num, gcd(fa.denominator, fb.denominator))
        if m.denominator == 1:
            return int(m)
        x = float(m)
        if Fraction(to_decimal(x)) != m:
            if self.strict:
                raise UnsupportedSchemaError(
                    f"allOf at {path or '/'}: keyword 'multipleOf': the least common "
                    f"multiple of {a!r} and {b!r} is not a short decimal")
            return a
        return x

    # -- types -----------------------------------------------------------------------
    def types_of(self, schema: dict, path: str) -> list[str]:
        t = schema.get("type")
        if t is None:
            # the specification: without "type" every type is allowed, and each keyword
            # constrains only the values of its own type ("properties" objects, ...)
            types = ["null", "boolean", "object", "array", "number", "string"]
        else:
            types = t if isinstance(t, list) else [t]
            for x in types:
                if x == "__none__":
                    return []
                if x not in _TYPES:
                    raise SchemaError(f"unknown type {x!r} at {path}/type")
            if "number" in types and "integer" in types:
                types = [x for x in types if x != "integer"]
        if schema.get("nullable") is True and "null" not in types:
            types = list(types) + ["null"]
        return list(types)

    def typed(self, t: str, schema: dict, path: str) -> Node:
        if t == "null":
            return lit("null")
        if t == "boolean":
            return rx(BOOLEAN, 10)
        if t == "string":
            return self.string(schema, path)
        if t == "integer":
            return self.integer(schema, path)
        if t == "number":
            return self.number(schema, path)
        if t == "array":
            return self.array(schema, path)
        if t == "object":
            return self.object(schema, path)
        raise AssertionError(t)

    # -- enum / const ----------------------------------------------------------------
    def enum_node(self, values: list, schema: dict, path: str) -> Node:
        types = schema.get("type")
        if types is not None:
            types = set(types if isinstance(types, list) else [types])
        opts = []
        for v in values:
            if types is not None and _json_type(v) not in types and not (
                    _json_type(v) == "integer" and "number" in types):
                continue
            for text in _value_spellings(v):
                if types is not None and "number" not in types and _json_type(v) == "integer" \
                        and not _INTEGER_TEXT.fullmatch(text):
                    continue                   # "2.0" is an integer only from draft 6 on
                opts.append((text, v))
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const", "type")
                and not is_annotation(k) and k not in ("$defs", "definitions")}
        if rest and opts:
            # the listed values must satisfy the other keywords too (in a subtracted
            # operand, those of their superset: still a superset, and the meets of
            # negated_meet, whose positive side often is an enum, stay precise)
            try:
                rest_node = self.node(rest, path)
                check = self.to_dfa(rest_node, path, "enum").accepts
            except (AutomatonTooLargeError, _TooBig):
                # past a limit: a superset keeps every value, a positive side runs the
                # NFA on each spelling (no determinisation)
                if self._neg:
                    check = None
                else:
                    check = _node_nfa(self.node(rest, path), self.whitespace).accepts
            if check is not None:
                opts = [o for o in opts if check(o[0].encode())]
        if self._neg:
            # a subtracted operand holds every spelling of its values (1.0 and 1e0 equal
            # 1, "\/" is "/", object keys in any order, whitespace), else the difference
            # keeps an invalid spelling
            vals = {id(v): v for _, v in opts}.values()       # each value once
            return alt(*(self._spellings(v, path) for v in vals))
        # objects and arrays take the free whitespace between their tokens
        return alt(*(_spaced(t.encode(), self.ws) if t[:1] in "{[" else lit(t)
                     for t, _ in opts))

    def _spellings(self, v: Any, path: str) -> Node:
        """A superset of the spellings of the JSON value ``v`` (in a subtracted operand)."""
        ws = self.ws
        if v is None or isinstance(v, bool):
            return lit(json.dumps(v))
        if isinstance(v, (int, float, Decimal)):
            r = decimal_range_regex(to_decimal(v), to_decimal(v), True, True)
            return alt(rx(r, 4 * len(r) // 3 + 4), rx(_EXPONENT_NUMBER, 30))
        if isinstance(v, str):
            parts = json.dumps(v, ensure_ascii=False).split("/")
            out = lit(parts[0])
            for p in parts[1:]:                  # "/" may be written "\/"
                out = seq(out, alt(lit("/"), lit("\\/")), lit(p))
            return out
        if isinstance(v, list):
            if not v:
                return seq(lit("["), ws, lit("]"))
            body = self._spellings(v[0], path)
            for x in v[1:]:
                body = seq(body, ws, lit(","), ws, self._spellings(x, path))
            return seq(lit("["), ws, body, ws, lit("]"))
        if isinstance(v, dict):
            if not v:
                return seq(lit("{"), ws, lit("}"))
            if len(v) > MAX_NEG_ENUM_KEYS:
                raise AutomatonTooLargeError(
                    f"enum/const at {path or '/'}: an object value of {len(v)} keys inside a "
                    f"subtracted operand (not, oneOf, if) needs every key order; the limit "
                    f"is {MAX_NEG_ENUM_KEYS} keys (MAX_NEG_ENUM_KEYS)")
            members = [seq(self._spellings(k, path), ws, lit(":"), ws,
                           self._spellings(x, path)) for k, x in v.items()]
            orders = []
            for perm in itertools.permutations(members):
                body = perm[0]
                for m in perm[1:]:
                    body = seq(body, ws, lit(","), ws, m)
                orders.append(body)
            return seq(lit("{"), ws, alt(*orders), ws, lit("}"))
        raise SchemaError(f"enum/const at {path or '/'}: not a JSON value: {v!r}")

    # -- scalars ---------------------------------------------------------------------
    def _bounds(self, schema: dict, path: str):
        lo = hi = None
        lo_x = hi_x = False
        if "minimum" in schema:
            lo = self._num(schema["minimum"], f"{path}/minimum")
            if schema.get("exclusiveMinimum") is True:
                lo_x = True
        if "maximum" in schema:
            hi = self._num(schema["maximum"], f"{path}/maximum")
            if schema.get("exclusiveMaximum") is True:
                hi_x = True
        v = schema.get("exclusiveMinimum")
        if v is not None and not isinstance(v, bool):
            x = self._num(v, f"{path}/exclusiveMinimum")
            if lo is None or x >= lo:
                lo, lo_x = x, True
        v = schema.get("exclusiveMaximum")
        if v is not None and not isinstance(v, bool):
            x = self._num(v, f"{path}/exclusiveMaximum")
            if hi is None or x <= hi:
                hi, hi_x = x, True
        return lo, hi, lo_x, hi_x

    @staticmethod
    def _num(v, where) -> Decimal:
        try:
            return to_decimal(v)
        except TypeError:
            raise SchemaError(f"{where} must be a number, got {v!r}") from None

    def integer(self, schema: dict, path: str) -> Node:
        node = self._integer(schema, path)
        if self._neg and node.kind != "empty":
            # a subtracted operand is a superset: the integers spelled as 1.0 or 1e2,
            # which the integer grammar leaves out, are added (all of them)
            node = alt(node, rx(_NONCANONICAL_INTEGER, 30))
        return node

    def _integer(self, schema: dict, path: str) -> Node:
        lo, hi, lo_x, hi_x = self._bounds(schema, path)
        ilo = None if lo is None else ceil_int(lo, lo_x)
        ihi = None if hi is None else floor_int(hi, hi_x)
        fmt = schema.get("format")
        if fmt in INT_FORMAT_BOUNDS:
            a, b = INT_FORMAT_BOUNDS[fmt]
            ilo = a if ilo is None else max(ilo, a)
            ihi = b if ihi is None else min(ihi, b)
        elif fmt is not None:
            self._check_format(fmt, "integer", path)
        if ilo is None and ihi is None:
            base = rx(INTEGER, 6)
        else:
            r = int_range_regex(ilo, ihi)
            if r is None:
                return EMPTY
            base = rx(r, 4 * len(r) // 3 + 4)
        if "multipleOf" in schema:
            m = schema["multipleOf"]
            md = self._num(m, f"{path}/multipleOf")
            if md <= 0:
                raise SchemaError(f"{path}/multipleOf must be > 0")
            if md != md.to_integral_value():
                # an integer is a multiple of p/q (lowest terms) iff it is a multiple of p
                from fractions import Fraction
                md = Decimal(Fraction(md).numerator)
            mi = int(md)
            if mi > 1:
                if mi > 100_000:
                    self.unsupported(f"multipleOf {m} (over 100000 remainder states)",
                                     f"{path}/multipleOf")
                    return base
                dfa = intersect(_dfa_of(base.args[0]), multiple_of_dfa(mi))
                return Node("dfa", (dfa,), dfa.num_states + 1)
        return base

    def number(self, schema: dict, path: str) -> Node:
        node = self._number(schema, path)
        if self._neg and node.kind != "empty" and any(k in schema for k in _NUMBER_KW):
            # a subtracted operand is a superset: numbers under bounds or a decimal
            # multipleOf are built without exponent, so every number with one is added
            node = alt(node, rx(_EXPONENT_NUMBER, 30))
        return node

    def _number(self, schema: dict, path: str) -> Node:
        fmt = schema.get("format")
        if fmt is not None and fmt not in INT_FORMAT_BOUNDS:
            self._check_format(fmt, "number", path)
        lo, hi, lo_x, hi_x = self._bounds(schema, path)
        if "multipleOf" in schema:
            md = self._num(schema["multipleOf"], f"{path}/multipleOf")
            if md <= 0:
                raise SchemaError(f"{path}/multipleOf must be > 0")
            if md == md.to_integral_value():
                return self.integer(schema, path)
            # a decimal m / 10**k (0.25, 0.01, 1.5): the value in units of 10**-k, mod m
            exp = md.normalize().as_tuple()
            k = -exp.exponent
            mi = int(md.scaleb(k))
            r = (decimal_range_regex(lo, hi, not lo_x, not hi_x)
                 if lo is not None or hi is not None else r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
            if r is None:
                return EMPTY
            try:
                mult = decimal_multiple_of_dfa(mi, k)
            except ValueError as e:
                self.unsupported(f"multipleOf {schema['multipleOf']} on a number: {e}",
                                 f"{path}/multipleOf")
            else:
                dfa = intersect(_dfa_of(r), mult)
                return Node("dfa", (dfa,), dfa.num_states + 1)
        if lo is None and hi is None:
            return rx(NUMBER, 12)
        signed = _sign_only_regex(lo, hi, lo_x, hi_x)
        if signed is not None:
            return rx(signed, 40)
        r = decimal_range_regex(lo, hi, not lo_x, not hi_x)
        if r is None:
            return EMPTY
        return rx(r, 4 * len(r) // 3 + 4)

    def _check_format(self, fmt, typ, path):
        if fmt in ANNOTATION_FORMATS or fmt in INT_FORMAT_BOUNDS:
            return
        if fmt in FORMATS:
            return          # a string format on a non-string type: does not apply
        if fmt in UNSUPPORTED_FORMATS:
            self.unsupported(f"string format {fmt!r} (enforced formats: "
                             f"{', '.join(sorted(FORMATS))})", f"{path}/format")

    def string(self, schema: dict, path: str) -> Node:
        if not any(k in schema for k in ("pattern", "format", "__patterns")):
            return self._string(schema, path)
        try:
            key = (json.dumps({k: schema.get(k) for k in ("minLength", "maxLength",
                                                              "pattern", "format",
                                                              "__patterns")},
                              sort_keys=True), self._neg)
        except (TypeError, ValueError):
            return self._string(schema, path)
        hit = self._string_memo.get(key)
        if hit is None:
            hit = self._string_memo[key] = self._string(schema, path)
        return hit

    def _string(self, schema: dict, path: str) -> Node:
        lo, hi = self.count_bounds(schema, "minLength", "maxLength", path)
        if hi is not None and lo > hi:
            return EMPTY
        parts: list[NFA | DFA] = []
        fmt = schema.get("format")
        fmt_re = None
        if fmt is not None:
            if fmt in FORMATS:
                # subtracted: a superset of the reference checker's strings (NEG_FORMATS)
                fmt_re = NEG_FORMATS.get(fmt) if self._neg else FORMATS[fmt]
            elif fmt in UNSUPPORTED_FORMATS:
                self.unsupported(f"string format {fmt!r} (enforced formats: "
                                 f"{', '.join(sorted(FORMATS))})", f"{path}/format")
            # other (vendor) formats are annotations
        pat = schema.get("pattern")
        if pat is not None and not isinstance(pat, str):
            raise SchemaError(f"{path}/pattern must be a string")
        pats = ([pat] if pat is not None else []) + [
            x for x in schema.get("__patterns", ()) if isinstance(x, str)]
        pat = pats[0] if pats else None
        if pat is None and fmt_re is None:
            if lo == 0 and hi is None:
                return rx(STRING, 8)
            q = f"{{{lo},{'' if hi is None else hi}}}" if (lo, hi) != (lo, lo) else f"{{{lo}}}"
            return rx(f'"{STRING_CHAR}{q}"', 8 * (hi if hi is not None else lo) + 8)
        if pat is None and lo == 0 and hi is None and fmt not in DECODED_FORMATS \
                and not self._neg:
            return rx(f'"(?:{fmt_re})"', 8 + len(fmt_re))     # its text is the JSON text
        if fmt_re is not None:
            parts.append(json_string_content_nfa(fmt_re, search=False))
        for pat in pats:                   # allOf's patterns: a string matches every one
            try:
                # subtracted: a string that either reading matches is taken
                parts.append(self._pattern_dfa(pat, "either" if self._neg else "both"))
            except ValueError as e:
                if self.strict:
                    raise UnsupportedSchemaError(f"pattern at {path}/pattern: {e}") from None
        if lo > 0 or hi is not None:
            parts.append(_any_char_content_nfa(lo, hi))
        if not parts:
            return rx(STRING, 8)
        dfas = [p if isinstance(p, DFA) else minimize(determinize(p)) for p in parts]
        dfa = dfas[0]
        for d in dfas[1:]:
            dfa = intersect(dfa, d)
        return seq(lit('"'), Node("dfa", (dfa,), dfa.num_states + 1), lit('"'))

    # -- arrays ----------------------------------------------------------------------
    def array(self, schema: dict, path: str) -> Node:
        lo, hi = self.count_bounds(schema, "minItems", "maxItems", path)
        if hi is not None and lo > hi:
            return EMPTY
        unique = schema.get("uniqueItems") is True and not (hi is not None and hi <= 1)
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        if isinstance(items, list):              # draft-04 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        elif prefix is None and "additionalItems" in schema:
            pass                                 # additionalItems without a tuple: no effect
        prefix = prefix or []
        if items is None:
            items = True
        item_nodes = [self.value_node(s, f"{path}/prefixItems/{i}")
                      for i, s in enumerate(prefix)]
        rest = self.value_node(items, f"{path}/items") if items is not False else EMPTY
        if unique:
            node = self._unique_array(item_nodes, rest, lo, hi, path)
            if node is None:
                node = self._list(item_nodes, rest, lo, hi, "[", "]", ",")
        else:
            node = self._list(item_nodes, rest, lo, hi, "[", "]", ",")
        if "contains" in schema:
            # with prefixItems the product with node gives each item its schema: the
            # contains automaton then takes any value between its matches
            node = self._contains(schema, node, True if item_nodes else items,
                                  self.value_node(True, f"{path}/items") if item_nodes
                                  else rest, bool(item_nodes) or unique or lo > 0
                                  or hi is not None, path)
        return node

    def _contains(self, schema: dict, node: Node, items: Any, rest: Node, counted: bool,
                  path: str) -> Node:
        """``contains`` (with ``minContains``/``maxContains``) on the array ``node`` whose
        items take ``items`` (node ``rest``): arrays of ``rest`` items with the number of
        items matching ``contains`` in range, an NFA that places each counted match
        (``items ∧ contains``) between runs of other items (``rest``, or ``items ∧ ¬
        contains`` under ``maxContains``); intersected with ``node`` (an automaton
        product) when ``counted`` (``prefixItems``, ``uniqueItems``, item counts), except
        in a subtracted operand (a superset is enough there)."""
        c = schema["contains"]
        lo, hi = schema.get("minContains", 1), schema.get("maxContains")
        for k, v in (("minContains", lo), ("maxContains", hi)):
            if isinstance(v, float) and v.is_integer():
                v = int(v)              # an integral number is an integer (2020-12)
                lo, hi = (v, hi) if k == "minContains" else (lo, v)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SchemaError(f"{path}/{k} must be a non-negative integer, got {v!r}")
        if node.kind == "empty" or (lo == 0 and hi is None):
            return node
        if hi is not None and lo > hi:
            return EMPTY
        if max(lo, hi or 0) > MAX_CONTAINS:
            if self._neg:
                return node       # a subtracted operand: a superset is enough
            raise AutomatonTooLargeError(
                f"contains at {path or '/'}: minContains/maxContains {max(lo, hi or 0)} "
                f"needs one copy of the item per counted match; the limit is {MAX_CONTAINS} "
                "(MAX_CONTAINS)")
        item = True if items is None else items
        if rest.kind == "empty":
            item = False
        hit = self.value_node(self.merge([item, c], f"{path}/contains"), f"{path}/contains")
        miss = rest if hi is None else self.value_node(
            {"allOf": [item, {"not": c}]}, f"{path}/contains")
        ws = self.ws
        sep = seq(lit(","), ws)

        def run(x: Node) -> Node:            # x (sep x)*, at least one
            return Node("list", (x, sep, 1, None), 2 * x.size + 4) if x.kind != "empty" \
                else EMPTY
        before = alt(EPS, seq(run(miss), sep))   # (miss sep)*
        after = alt(EPS, seq(sep, run(miss)))    # (sep miss)*
        options = [alt(EPS, run(miss))] if lo == 0 else []
        body = seq(before, hit)
        for k in range(1, (lo if hi is None else hi) + 1):
            if k >= max(lo, 1):
                options.append(seq(body, after))
            body = seq(body, after, sep, hit)
        k_node = seq(lit("["), ws, alt(*options), ws, lit("]"))
        if not counted or self._neg or k_node.kind == "empty":
            return k_node         # (in a subtracted operand, without node's counts)
        d = self._product(self.to_dfa(node, path, "contains"),
                          self.to_dfa(k_node, path, "contains"), path, "contains", intersect)
        return Node("dfa", (d,), d.num_states + 1)

    def _unique_values(self, item: Node, index: dict):
        """The item language as ``{value number: node of its spellings}`` (values
        numbered in ``index``, shared by the positions of one array), or a string
        saying which limit it exceeds."""
        if item.kind == "empty":
            return {}
        # an item language that surely has too many texts (a string body, an unbounded
        # list, an object's extra members) is not determinised just to find that out
        texts = None if _past_spellings(item) else \
            _finite_texts(self._item_dfa(item), MAX_UNIQUE_SPELLINGS)
        if texts is None:
            return (f"the items must take finitely many values, spelled in at most "
                    f"{MAX_UNIQUE_SPELLINGS} ways (MAX_UNIQUE_SPELLINGS)")
        groups: dict = {}
        for t in texts:
            try:
                v = json.loads(t, parse_float=Decimal, parse_int=Decimal)
            except ValueError:
                return "an item spelling is not one JSON value"
            groups.setdefault(index.setdefault(_canon(v), len(index)), []).append(t)
        # the spellings are enumerated without whitespace (one per key order, not one
        # per whitespace choice too); each takes the free whitespace between its tokens
        return {k: alt(*(_spaced(t, self.ws) for t in sorted(g)))
                for k, g in groups.items()}

    def _item_dfa(self, item: Node, spaced: bool = False) -> DFA:
        """The minimal DFA of an item node, without the free whitespace (its values
        spelled once each but for key orders and numbers), or with it (``spaced``); the
        last one of each kind is kept (uniqueItems asks twice)."""
        key = ("item dfa", spaced)
        hit = self._string_memo.get(key)
        if hit is None or hit[0] is not item:
            # past MAX_SPACED_ITEM_STATES, items without whitespace inside: a subset
            dfa = self._spaced_dfa(item) if spaced else None
            if dfa is None:
                dfa = _node_dfa(item, compact=True)
            hit = self._string_memo[key] = (item, dfa)
        return hit[1]

    def _spaced_dfa(self, node: Node) -> DFA | None:
        """The minimal DFA of ``node`` with the free whitespace, or None past
        ``MAX_SPACED_ITEM_STATES`` DFA states (by the node's digest: the same in every
        attempt of one compile)."""
        memo = self._string_memo.setdefault("spaced dfas", {})
        key = (self.digest(node), self.whitespace)
        if key not in memo:
            try:
                memo[key] = minimize(determinize(_node_nfa(node, self.whitespace),
                                                 MAX_SPACED_ITEM_STATES))
            except AutomatonTooLargeError:
                memo[key] = None
        return memo[key]

    def digest(self, node: Node) -> bytes:
        """:func:`_digest` of ``node``, memoised for the whole compile (equal trees have
        equal digests, whichever attempt built them)."""
        return _digest(node, self._string_memo.setdefault("digests", {}))

    def _refuse_unique_keys(self, lo: int, path: str) -> None:
        """``minItems`` asks for more items than the sort key of ``uniqueItems`` keeps
        apart."""
        self.unsupported(
            f"keyword 'uniqueItems' (its items take values that cannot be listed, so "
            f"jaxcd keeps them apart by a sort key: type, first character of a string, "
            f"first digit of an integer; no {lo} items have different keys)",
            f"{path}/uniqueItems")

    def _unique_array(self, head: list[Node], rest: Node, lo: int, hi: int | None,
                      path: str) -> Node | None:
        """``uniqueItems``: arrays whose item at position ``i`` takes ``head[i]`` (then
        ``rest``), ``lo..hi`` items, pairwise distinct values. One NFA state per
        (position, set of values used) reached: the item languages must be finite
        (``MAX_UNIQUE_SPELLINGS``) and the sets of values within
        ``MAX_UNIQUE_STATES``. None (after :meth:`unsupported`) past a limit."""
        index: dict = {}
        per_pos = []
        for n in list(head) + [rest]:
            vals = self._unique_values(n, index)
            if isinstance(vals, str):
                return self._unique_fallback(head, rest, lo, hi, path, vals)
            per_pos.append(vals)
        H = len(head)
        hi = len(index) if hi is None else min(hi, len(index))
        if lo > hi:
            return EMPTY
        # the reachable (position, values used) pairs, before building anything
        seen = {(0, 0)}
        todo = [(0, 0)]
        while todo:
            pos, S = todo.pop()
            if bin(S).count("1") >= hi:
                continue
            for v in per_pos[min(pos, H)]:
                if not S >> v & 1:
                    key = (min(pos + 1, H), S | 1 << v)
                    if key not in seen:
                        if len(seen) >= MAX_UNIQUE_STATES:
                            return self._unique_fallback(
                                head, rest, lo, hi, path,
                                f"the item values ({len(index)}) make more than "
                                f"{MAX_UNIQUE_STATES} sets of values used "
                                "(MAX_UNIQUE_STATES)")
                        seen.add(key)
                        todo.append(key)
        nfa, em, open_, final = self._array_frame(lo)
        state = {key: nfa.add_state() for key in seen if key != (0, 0)}
        for (pos, S), q in state.items():
            c = bin(S).count("1")
            if c >= lo:
                nfa.add_epsilon(em.emit(seq(self.ws, lit("]")), q), final)
        for pos, S in seen:
            src = open_ if (pos, S) == (0, 0) else None
            if bin(S).count("1") >= hi:
                continue
            for v, node in per_pos[min(pos, H)].items():
                key = (min(pos + 1, H), S | 1 << v)
                if S >> v & 1 or key not in state:
                    continue
                if src is None:
                    src = em.emit(seq(self.ws, lit(","), self.ws), state[pos, S])
                nfa.add_epsilon(em.emit(node, src), state[key])
        nfa.accepting = {final}
        dfa = minimize(determinize(nfa))
        return Node("dfa", (dfa,), dfa.num_states + 1)

    def _array_frame(self, lo: int):
        """A new NFA for an array built state by state: ``(nfa, emitter, the state after
        "[" and whitespace, the final state)``, with ``[]`` accepted when ``lo == 0``
        (the caller adds the accepting set)."""
        nfa = NFA()
        em = _NFAEmitter(nfa, "")
        start = nfa.add_state()
        nfa.start = start
        final = nfa.add_state()
        open_ = em.emit(self.ws, em.emit(lit("["), start))
        if lo == 0:
            nfa.add_epsilon(em.emit(lit("]"), open_), final)
        return nfa, em, open_, final

    def _unique_fallback(self, head: list[Node], rest: Node, lo: int, hi: int | None,
                         path: str, why: str) -> Node | None:
        """``uniqueItems`` whose values cannot be kept apart one by one (``why``): in a
        subtracted operand, no constraint (a superset); else the sorted arrays of
        :meth:`_sorted_unique_array` (without ``prefixItems``), or None (after
        :meth:`unsupported`)."""
        if self._neg:
            return None
        if not head:
            return self._sorted_unique_array(rest, lo, hi, path)
        self.unsupported(f"keyword 'uniqueItems' ({why}; beside prefixItems the items "
                         "must take finitely many values)", f"{path}/uniqueItems")
        return None

    def _sorted_unique_array(self, rest: Node, lo: int, hi: int | None,
                             path: str) -> Node | None:
        """``uniqueItems`` over items of any language: the arrays whose items come in
        strictly increasing order of a sort key that tells values apart. The key is the
        type (one key for all numbers, one for objects, one for arrays, one per
        literal), and for a string its first byte (an escape may not start a string in
        such an array: ``"\\u0061"`` is ``"a"``; the strings that start with a non-ASCII
        character share one key), and for numbers, where no fraction or exponent can be
        spelled, their first digit (``0`` and the negative ones share a key: ``-0`` is
        ``0``). Items with different keys are different values, so every such array is
        unique: a subset of the unique arrays (the others are not generated), which keeps
        any number of strings with different first characters, and at most one object,
        one array and one number (one per first digit for integers). Two items may also
        come in decreasing order of their keys (``["node_modules", "dist"]``): a second
        item need only differ from the first (one more copy of the item per key). Without
        that pair past ``MAX_SORTED_UNIQUE_STATES`` NFA states, and one key per type
        (one string) past it again, or past ``MAX_SORTED_UNIQUE_TOTAL`` in the schema's
        arrays (about the item automaton's size then).
        None (after :meth:`unsupported`) where ``minItems`` needs more items than
        there are keys."""
        if rest.kind == "empty":
            return self._list([], rest, lo, hi, "[", "]", ",")
        if _first_bytes(rest) in (frozenset(b"{"), frozenset(b"[")):
            # every item is an object (or every one an array): one key, so at most one
            # item, and no copy of the item per key. Minimised where that fits (the
            # members of an object looped through in the loose order share their
            # continuation: one copy of each value), else the item node as it is
            if lo > 1:
                self._refuse_unique_keys(lo, path)
                return None
            d = self._spaced_dfa(rest)
            if d is not None:
                rest = Node("dfa", (d,), d.num_states + 1)
            return self._list([], rest, lo, 1 if hi is None else min(hi, 1), "[", "]", ",")
        item = self._item_dfa(rest, spaced=True)
        if item.num_states == 0:
            return self._list([], rest, lo, hi, "[", "]", ",")
        table = item.byte_table()
        numbers = set(b"-0123456789")
        # numbers without a fraction or exponent are spelled one way each (but -0): by
        # their first byte then, 0 with the negative ones
        seen, todo = set(), [int(table[0, b]) for b in numbers if table[0, b] >= 0]
        while todo:
            q = todo.pop()
            if q not in seen:
                seen.add(q)
                todo.extend(int(t) for t in table[q] if t >= 0)
        integers = not any(table[q, c] >= 0 for q in seen for c in b".eE")
        runs = []                         # (first byte, last byte, class): runs of bytes
        for b, c in enumerate(item.byte_class.tolist()):
            if runs and runs[-1][2] == c:
                runs[-1][1] = b
            else:
                runs.append([b, b, c])
        # per item state, its byte ranges with a live target (in the order of the runs)
        run_cls = np.array([c for _, _, c in runs], np.int64)
        item_rows = [[(runs[j][0], runs[j][1], t) for j, t in enumerate(row) if t >= 0]
                     for row in item.trans[:, run_cls].tolist()]
        item_acc = item.accepting.tolist()
        # (keys by character, the decreasing pair too): each tier past the limits tries
        # the next; one key per type has no limit
        tiers = ([(False, False)] if self.unique_spent >= MAX_SORTED_UNIQUE_TOTAL else
                 [(True, True), (True, False), (False, False)])
        for by_char, pair in tiers:
            # keys: (sort key, [(prefix bytes, item state after them)])
            keys: dict = {}
            for b in np.nonzero(table[0] >= 0)[0].tolist():
                r = int(table[0, b])
                if b == ord('"') and by_char:
                    # strings by their first byte if ASCII (not an escape), the ones that
                    # start with another character under one key
                    for c in np.nonzero(table[r] >= 0)[0].tolist():
                        if c != ord("\\"):
                            keys.setdefault((2, min(c, 0x80)), []).append(
                                (bytes([b, c]), int(table[r, c])))
                else:
                    if b in numbers:
                        k = (0, b if integers and b in b"123456789" else ord("-"))
                    else:
                        k = (1 if b == ord('"') else 0, b)
                    keys.setdefault(k, []).append((bytes([b]), r))
            order = sorted(keys)
            nfa, em, open_, final = self._array_frame(lo)
            comma, close = seq(self.ws, lit(","), self.ws), seq(self.ws, lit("]"))

            def copy_item(starts, end) -> bool:
                """A copy of the item automaton entered by ``(state, prefix bytes, item
                state)``, ending in ``end``; False past the state limits."""
                copy: dict = {}          # item state -> its copy
                todo: list = []

                def state_of(q: int) -> int:
                    if q not in copy:
                        copy[q] = nfa.add_state()
                        todo.append(q)
                    return copy[q]
                for src, prefix, q in starts:
                    nfa.add_bytes(src, state_of(q), prefix)
                while todo:
                    q = todo.pop()
                    src = copy[q]
                    if item_acc[q]:
                        nfa.add_epsilon(src, end)
                    nfa.add_byte_ranges(src, [(b, e, state_of(t)) for b, e, t in item_rows[q]])
                    if by_char and (nfa.num_states > MAX_SORTED_UNIQUE_STATES or
                                    self.unique_spent + nfa.num_states
                                    > MAX_SORTED_UNIQUE_TOTAL):
                        return False
                return True
            # ge[j]: the next item's key is order[j] or a later one
            ge = [open_] + [nfa.add_state() for _ in order[1:]]
            for j in range(len(order) - 1):
                nfa.add_epsilon(ge[j], ge[j + 1])
            too_big = False
            for j, k in enumerate(order):
                after = nfa.add_state()
                if not copy_item([(ge[j], p_, q) for p_, q in keys[k]], after):
                    too_big = True
                    break
                nfa.add_epsilon(em.emit(close, after), final)
                if j + 1 < len(order):
                    nfa.add_epsilon(em.emit(comma, after), ge[j + 1])
            if pair and not too_big and len(order) > 1:
                # two items whose keys come in decreasing order: a first item (its own
                # copy per key, remembering it), then one of a smaller key, then "]"
                # (the one earlier key is all a second item must differ from)
                lt = [nfa.add_state() for _ in order[:-1]]   # lt[j]: a key up to order[j]
                for j in range(1, len(lt)):
                    nfa.add_epsilon(lt[j], lt[j - 1])
                for j, k in enumerate(order[1:], 1):
                    after = nfa.add_state()
                    if not copy_item([(open_, p_, q) for p_, q in keys[k]], after):
                        too_big = True
                        break
                    nfa.add_epsilon(em.emit(comma, after), lt[j - 1])
                if not too_big:
                    end = nfa.add_state()
                    too_big = not copy_item([(lt[j], p_, q) for j, k in enumerate(order[:-1])
                                             for p_, q in keys[k]], end)
                    nfa.add_epsilon(em.emit(close, end), final)
            if too_big:
                continue
            self._spend(nfa.num_states, path, "uniqueItems")
            if by_char:
                self.unique_spent += nfa.num_states
            nfa.accepting = {final}
            dfa = minimize(determinize(nfa))
            if lo > 1 or hi is not None:
                counts = self.to_dfa(self._list([], rest, lo, hi, "[", "]", ","), path,
                                     "uniqueItems")
                dfa = self._product(dfa, counts, path, "uniqueItems", intersect)
                if is_empty(dfa) and not is_empty(counts):
                    self._refuse_unique_keys(lo, path)
                    return None
            return Node("dfa", (dfa,), dfa.num_states + 1)
        raise AssertionError("unreachable: one key per type has no state limit")

    def _list(self, head: list[Node], rest: Node, lo: int, hi: int | None,
              open_: str, close: str, sep: str) -> Node:
        ws = self.ws
        sep_node = seq(lit(sep), ws)
        # elements: head[0], head[1], ..., then rest*
        # counts: n elements, lo <= n <= hi
        n_head = len(head)
        # the number of leading elements taken from head is min(n, n_head)
        tail_lo = max(lo - n_head, 0)
        tail_hi = None if hi is None else hi - n_head
        if (tail_hi is not None and rest.kind != "empty"
                and rest.size * tail_hi > MAX_COUNTED_ITEM_STATES):
            # one copy of the item per counted element: past the budget the upper bound
            # is dropped in a subtracted operand (a superset) and tightened elsewhere
            # (every array built is valid; longer valid ones are refused)
            tail_hi = None if self._neg else max(
                tail_lo, min(tail_hi, TIGHT_MIN_ITEMS), MAX_COUNTED_ITEM_STATES // rest.size)
        options = []
        if lo == 0:
            options.append(EPS)
        # sequences using k head elements (k < n_head) and no tail
        acc = None
        for k in range(1, n_head + 1):
            acc = head[0] if k == 1 else seq(acc, sep_node, head[k - 1])
            if acc.kind == "empty":
                break
            if k < n_head and lo <= k and (hi is None or k <= hi):
                options.append(acc)
        if rest.kind == "empty":
            tail_hi = 0
        if n_head == 0:
            if tail_hi is None or tail_hi >= 1:
                t_lo = max(tail_lo, 1)
                options.append(Node("list", (rest, sep_node, t_lo, tail_hi),
                                    rest.size * (max(t_lo, tail_hi or 0) + 1) + 4))
        elif acc is not None and acc.kind != "empty" and (hi is None or n_head <= hi):
            if tail_lo == 0:
                options.append(acc)
            if tail_hi is None or tail_hi >= 1:
                t_lo = max(tail_lo, 1)
                lst = Node("list", (rest, sep_node, t_lo, tail_hi),
                           rest.size * (max(t_lo, tail_hi or 0) + 1) + 4)
                options.append(seq(acc, sep_node, lst))
        body = alt(*options)
        if body.kind == "empty":
            return EMPTY
        return seq(lit(open_), ws, body, ws, lit(close))

    # -- objects ---------------------------------------------------------------------
    def object(self, schema: dict, path: str) -> Node:
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            raise SchemaError(f"{path}/properties must be an object")
        required = schema.get("required") or []
        if not isinstance(required, list):
            raise SchemaError(f"{path}/required must be an array")
        addl = schema.get("additionalProperties")
        pprops = schema.get("patternProperties") or {}
        if isinstance(pprops, dict) and list(pprops) == [""] and addl is not None \
                and addl is not True and not self._neg:
            # the empty pattern matches every key, so additionalProperties applies to
            # none; jsonschema finds additional keys with the patterns joined by "|",
            # and an empty join finds every key additional: both schemas apply to every
            # key here (valid either way; a subtracted operand keeps the superset)
            pprops = {"": {"allOf": [pprops[""], addl]}}
        names = schema.get("propertyNames")
        lo, hi = self.count_bounds(schema, "minProperties", "maxProperties", path)
        if hi is not None and lo > hi:
            return EMPTY
        # patternProperties: (pattern, kd, ke, subschema) with the readings of
        # _pattern_dfa: kd, the keys the pattern surely matches (both readings), ke,
        # those it may match (either); in a subtracted operand, where a superset is
        # needed, the other way round. A key of kd goes to the pattern's schema, a key
        # outside ke to additionalProperties
        pats = []
        sure, unsure_r = ("either", "both") if self._neg else ("both", "either")
        for pat, sub in pprops.items():
            try:
                kd, ke = self._pattern_dfa(pat, sure), self._pattern_dfa(pat, unsure_r)
            except ValueError as e:
                if self.strict:
                    raise UnsupportedSchemaError(
                        f"patternProperties at {path}/patternProperties: {e}") from None
                continue            # strict=False: keys of this pattern are not generated
            pats.append((pat, kd, ke, sub))

        def with_patterns(name: str, sub):
            # a key's value satisfies every patternProperties schema whose pattern its
            # name may match, besides its properties schema (JSON Schema: all apply)
            content = json.dumps(name, ensure_ascii=False)[1:-1].encode()
            more = [ps for _, _, ke, ps in pats if ke.accepts(content)]
            if not more:
                return sub
            return {"allOf": ([] if sub is None else [sub]) + more}

        # propertyNames applies to every key: declared names and pattern keys too
        names_key = names_dfa = None
        if names is not None and names is not True:
            names_key = EMPTY if names is False else \
                self.key_node(names, f"{path}/propertyNames")
            if names_key.kind != "empty":
                names_dfa = _node_dfa(names_key)

        def name_ok(name: str) -> bool:
            return names_key is None or (names_dfa is not None and names_dfa.accepts(
                json.dumps(name, ensure_ascii=False).encode()))

        members = []
        for name, sub in props.items():
            v = self.value_node(with_patterns(name, sub), f"{path}/properties/{name}") \
                if name_ok(name) else EMPTY
            members.append(_Member(lit(json.dumps(name, ensure_ascii=False)), v,
                                   name in required))
        for name in required:
            if name not in props and not name_ok(name):
                members.append(_Member(lit(json.dumps(name, ensure_ascii=False)), EMPTY,
                                       True))
            elif name not in props:
                # additionalProperties (or unevaluatedProperties) applies to it unless a
                # pattern surely matches it (a false one too)
                sub = with_patterns(name, None)
                content = json.dumps(name, ensure_ascii=False)[1:-1].encode()
                if not any(kd.accepts(content) for _, kd, _, _ in pats):
                    rest = addl if addl is not None else \
                        schema.get("unevaluatedProperties", True)
                    sub = rest if sub is None else {"allOf": [sub, rest]}
                members.append(_Member(lit(json.dumps(name, ensure_ascii=False)),
                                       self.value_node(sub, f"{path}/required"), True))
        # which extra keys are allowed: the specification's open objects by default;
        # closed_objects=True (tool calls) closes objects that declare properties
        # the specification's default for an object that declares members: its extra
        # values are free-form values at the default depth (not deepened: see free_value)
        implicit = False
        if addl is None:
            uneval = schema.get("unevaluatedProperties")
            if uneval is not None and uneval is not True:
                addl = uneval
            elif self.closed_objects:
                addl = not props and not pprops and not required
            else:
                addl = True
                implicit = bool(props or pprops or required)
        extras = []
        free_key = None              # the keys of free additional values (any value)
        declared = list(props) + [r for r in required if r not in props]
        # keys that some pattern may match but not surely (the readings disagree: a
        # final newline, a non-ASCII digit) are not generated: which schemas apply to
        # them depends on the reading (in a subtracted operand they take both ways)
        unsure = [self._product(ke, kd, path, "patternProperties", difference)
                  for _, kd, ke, _ in pats if ke is not kd and not self._neg]
        unsure = [d for d in unsure if not is_empty(d)]
        pat_keys = [seq(lit('"'), Node("dfa", (ke,), ke.num_states + 2), lit('"'))
                    for _, _, ke, _ in pats]
        for kd, subs, where in self._pattern_regions([(p, kd, s) for p, kd, _, s in pats],
                                                     path):
            for d in unsure:
                kd = self._product(kd, d, path, "patternProperties", difference)
            if is_empty(kd):
                continue
            key = seq(lit('"'), Node("dfa", (kd,), kd.num_states + 2), lit('"'))
            if names_key is not None:
                if names_dfa is None:
                    continue
                d = self._product(_node_dfa(key), names_dfa, path, "propertyNames",
                                  intersect)
                if is_empty(d):
                    continue
                key = Node("dfa", (d,), d.num_states + 1)
            if declared:
                # declared names are members (their values also satisfy the patterns)
                key = self.exclude_keys(key, declared)
                if key.kind == "dfa" and is_empty(key.args[0]):
                    continue
            sub = subs[0] if len(subs) == 1 else {"allOf": list(subs)}
            extras.append((key, self.value_node(sub, where)))
        if addl is not False:
            key = rx(STRING, 8) if names_key is None else names_key
            if declared:
                key = self.exclude_keys(key, declared)
            # additionalProperties applies only to keys that match no patternProperties
            # regex: those keys are left to their pattern's schema
            for pkey in pat_keys:
                if key.kind == "empty":
                    break
                d = self._product(_node_dfa(key), _node_dfa(pkey), path,
                                  "patternProperties", difference)
                key = Node("dfa", (d,), d.num_states + 1)
            self._implicit_free += implicit
            try:
                value = self.value_node(True if addl is True else addl,
                                        f"{path}/additionalProperties")
            finally:
                self._implicit_free -= implicit
            extras.append((key, value))
            if (addl is True or addl == {}) and key.kind != "empty":
                free_key = key
        extra = None
        pairs = [seq(k, self.ws, lit(":"), self.ws, v) for k, v in extras]
        if pairs:
            extra = alt(*pairs)
            if extra.kind == "empty":
                extra = None
        if any(m.required and m.value.kind == "empty" for m in members):
            return EMPTY
        members = [m for m in members if m.value.kind != "empty"]
        # where the order is fixed, the document's own object with a required property
        # takes additional members with scalar values before its declared ones too (a
        # "$schema" or "$id" key first): a prefix of the object, one small copy (free
        # values nest, and a nested object or a branch of a union keeps its extra
        # members after the declared ones only: unions of such copies grow several
        # times when determinised); the required property keeps the prefix's comma
        # from closing the object
        lead = None
        if (free_key is not None and any(m.required for m in members)
                and not lo and hi is None and _DOCUMENT_PATH.fullmatch(path)):
            lead = seq(free_key, self.ws, lit(":"), self.ws, self.any_value(0))  # a scalar
        size = sum(m.value.size + m.key.size + 6 for m in members) + (extra.size if extra else 0)
        if lo or hi is not None:
            cap = max(lo, hi if hi is not None else 0) + 1
            size *= cap
        chain = size + (lead.size if lead is not None else 0) + 8   # an "obj" node's size
        if self._neg and members:
            r = sum(m.required for m in members)
            if r > MAX_ANY_ORDER_PROPERTIES or size * (1 << r) > self.max_nfa_states:
                raise AutomatonTooLargeError(
                    f"object at {path or '/'} under oneOf/not/if: it is matched in any "
                    f"property order, which needs one copy per subset of its {r} required "
                    f"properties; the limits are {MAX_ANY_ORDER_PROPERTIES} and "
                    f"max_nfa_states={self.max_nfa_states}")
            return Node("objany", (tuple(members), extra, lo, hi, True), size * (1 << r) + 8)
        if self.property_order == "any" and (len(members) > 1 or (members and extra)):
            n = len(members)
            if n > MAX_ANY_ORDER_PROPERTIES or size * (1 << n) > self.max_nfa_states:
                raise AutomatonTooLargeError(
                    f"property_order='any' at {path or '/'}: {n} declared properties need "
                    f"one copy of the members per subset ({1 << n} subsets, about "
                    f"{size * (1 << n)} NFA states); the limits are "
                    f"{MAX_ANY_ORDER_PROPERTIES} properties and max_nfa_states="
                    f"{self.max_nfa_states} (use property_order='schema')")
            return Node("objany", (tuple(members), extra, lo, hi, False), size * (1 << n) + 8)
        if self.property_order == LOOSE_ORDER and (len(members) > 1 or (members and extra)):
            node = self._loose_object(members, extra, lo, hi, size, grow=False)
            if node is not None:
                return node
        if self.property_order == "auto" and (len(members) > 1 or (members and extra)):
            # the loose form first where it is allowed (repeated keys on, outside
            # products, no minProperties above the required count): its language
            # contains every exact form's, at 2^required copies of the members where an
            # exact form needs one per subset of its tracked members
            node = self._loose_object(members, extra, lo, hi, size)
            if node is None:
                node = self._auto_object(members, extra, lo, hi, path, lead)
            if node is not None:
                return node
            other = _required_order(members, required)
            root = not any(x in path for x in _VALUE_PATHS)
            deepened = self.site_free_depth is not None or self.implicit_free_depth is not None
            if other is not None and (self.auto_spent + size + 8 <= self.auto_total
                                      or (root and self.auto_root >= 1 and not deepened)):
                # too wide for any order: the schema's order, or the required ones first
                # in the order of `required` (each a valid order, so is their union); the
                # document's own object may double the automaton (as in _auto_object),
                # but not with deeper free-form values (compile_json_schema keeps those
                # only where the document's object keeps this form: `root_orders`)
                self.root_orders += root
                self.auto_spent += size + 8
                return alt(Node("obj", (tuple(members), extra, lo, hi, lead), chain),
                           Node("obj", (other, extra, lo, hi, lead), chain))
        return Node("obj", (tuple(members), extra, lo, hi, lead), chain)

    def _auto_object(self, members, extra, lo, hi, path, lead=None) -> Node | None:
        """``property_order="auto"``: an ``objmix`` node (tracked members in any order,
        each at most once; the others optional, in the schema's order, between them) or
        None (the schema's order) when neither form fits the budget. The budget of the
        document's own object (not inside a property, item or extra value) is at least
        its size in the schema's order: it may double the automaton."""
        root = not any(x in path for x in _VALUE_PATHS)
        cap = (max(lo, hi if hi is not None else 0) + 1) if (lo or hi is not None) else 1
        xs = extra.size if extra is not None else 0
        req = tuple(m.required for m in members)
        every = tuple(True for _ in members)
        # (tracked members, extra members anywhere?): the closest form to the
        # specification first; extra members after the declared ones is one copy of
        # them instead of one per state
        options = [(every, True), (every, False)] if extra is not None else [(every, False)]
        if not all(req) and any(req):
            options.append((req, False))
        for tracked, anywhere in options:
            t = sum(tracked)
            if t > MAX_ANY_ORDER_PROPERTIES:
                continue
            m = len(members) - t
            st = sum(x.value.size + x.key.size + 6 for x, f in zip(members, tracked) if f)
            sc = sum(x.value.size + x.key.size + 6 for x, f in zip(members, tracked) if not f)
            # copies: a tracked member is emitted from every state whose mask lacks
            # it (2^(t-1) masks x (m+1) chain positions), a chain member and the
            # extra members (anywhere) from every state; the budget counts the
            # states beyond the schema order's one copy of each
            full = cap * ((1 << max(t - 1, 0)) * (m + 1) * (st + 8)
                          + (1 << t) * (sc + (xs * (m + 1) if anywhere else 0)))
            est = max(full - cap * (st + sc + (xs if anywhere else 0)), 1)
            base = cap * (st + sc + xs)
            if ((est <= self.auto_states and self.auto_spent + est <= self.auto_total)
                    or (root and est <= self.auto_root * base)):
                self.auto_spent += est
                size = full + (0 if anywhere else 2 * cap * xs) + 8
                if anywhere:
                    lead = None
                return Node("objmix", (tuple(members), extra, lo, hi, tracked, anywhere,
                                       lead), size + (cap * lead.size if lead is not None else 0))
        return None

    def _loose_object(self, members, extra, lo, hi, size: int,
                      grow: bool = True) -> Node | None:
        """``property_order="auto"``, tried before the exact forms: an ``objany`` node whose
        declared properties come in any order, any number of times, the required ones
        at least once (a subset mask: ``2^r`` copies), extra members anywhere; or None. Sound only where every text is judged by itself:
        each occurrence of a key has a valid value, so the object is valid whichever
        occurrence a parser keeps, and no other value shares the text. So never inside
        an automaton product (``oneOf``/``not``/``if``/merged ``allOf``/``uniqueItems``:
        a subtracted operand need not contain a text whose parse it matches) nor in a
        subtracted operand, and not under a ``minProperties`` above the required count
        (repeats would count twice); ``maxProperties`` counts occurrences (at least the
        number of keys). ``grow=False`` (the ``LOOSE_ORDER`` fallback): only objects
        without required properties, whose loop is no larger than the schema order's
        chain."""
        if not self.auto_loose or self._product_level or self._neg:
            return None
        r = sum(m.required for m in members)
        if lo > r or r > MAX_ANY_ORDER_PROPERTIES or (r and not grow):
            return None
        full = size * (1 << r) + 8
        est = max(full - size - 8, 1)
        if est > self.auto_states or self.auto_spent + est > self.auto_total:
            return None
        self.auto_spent += est
        return Node("objany", (tuple(members), extra, 0, hi, True), full)

    def _pattern_regions(self, pats: list, path: str) -> list:
        """``patternProperties`` as disjoint key sets: ``(DFA of key contents, the
        subschemas that apply, path)``, one per non-empty combination of the patterns
        that a key matches (a key matching several patterns must satisfy all their
        schemas). Disjoint patterns (the usual case) stay as they are."""
        regions: list = []                    # (dfa, subs, path)
        for pat, kd, sub in pats:
            where = f"{path}/patternProperties/{pat}"
            out = []
            rest = kd
            for d, subs, w in regions:
                both = self._product(d, kd, path, "patternProperties", intersect)
                if is_empty(both):
                    out.append((d, subs, w))
                    continue
                only = self._product(d, kd, path, "patternProperties", difference)
                if not is_empty(only):
                    out.append((only, subs, w))
                out.append((both, subs + (sub,), f"{path}/patternProperties"))
                if not is_empty(rest):
                    rest = self._product(rest, d, path, "patternProperties", difference)
            if not is_empty(rest):
                out.append((rest, (sub,), where))
            regions = out
            if len(regions) > MAX_PATTERN_REGIONS:
                raise AutomatonTooLargeError(
                    f"patternProperties at {path or '/'}: the patterns overlap in more than "
                    f"{MAX_PATTERN_REGIONS} combinations (a key matching several patterns "
                    "must satisfy all their schemas); simplify the patterns")
        return regions

    def key_node(self, names: Any, path: str) -> Node:
        """Key strings allowed by ``propertyNames`` (a string schema)."""
        if not isinstance(names, dict):
            raise SchemaError(f"{path} must be a schema")
        sub = dict(names)
        sub.setdefault("type", "string")
        n = self.node(sub, path)
        return n

    def exclude_keys(self, key: Node, declared: list[str]) -> Node:
        """Key strings of ``key`` that do not decode to a declared property name."""
        # the same in every attempt of one compile (and for every object declaring the
        # same names): built once per names, and per regex key (extra properties' keys)
        memo = self._string_memo.setdefault("declared keys", {})
        names = tuple(declared)
        hit = memo.get((key.kind, key.args, names)) if key.kind == "re" else None
        if hit is not None:
            return hit
        bad = memo.get(names)
        if bad is None:
            bad = memo[names] = _declared_key_dfa(declared)
        kds = self._string_memo.setdefault("key dfas", {})
        kd = kds.get(key.args) if key.kind == "re" else None
        if kd is None:
            kd = _node_dfa(key)
            if key.kind == "re":
                kds[key.args] = kd
        dfa = _difference(kd, bad)
        out = Node("dfa", (dfa,), dfa.num_states + 1)
        if key.kind == "re":
            memo[(key.kind, key.args, names)] = out
        return out

    # -- free-form values --------------------------------------------------------------
    def soup_value(self, depth: int) -> Node:
        """A superset of all JSON values: exact ``depth`` containers deep, any deeper
        container as a bracketed run of JSON tokens (``JSON_SOUP_BODY``)."""
        return self._free_node(depth, True)

    def any_value(self, depth: int, tail: int = 0) -> Node:
        """Any JSON value with at most ``depth`` containers nested; with ``tail``, also
        the values whose containers below that depth are ``tail`` more objects (each a
        member of the one above, along a path of objects from the top) with arrays of
        scalars anywhere along it (:meth:`tail_value`)."""
        return self._free_node(depth, False, tail)

    def tail_value(self, k: int) -> Node:
        """A scalar, an array of scalars, or (``k >= 1``) an object whose values are
        ``tail_value(k - 1)``: ``k`` object levels, one copy each (linear in ``k``)."""
        key = ("tail", k)
        if key not in self._any_cache:
            scalar = alt(rx(STRING, 8), rx(NUMBER, 12), rx(BOOLEAN, 10), lit("null"))
            leaf = self._list([], scalar, 0, None, "[", "]", ",")
            if k <= 0:
                n = alt(scalar, leaf)
            else:
                inner = self.tail_value(k - 1)
                obj = Node("obj", ((), seq(rx(STRING, 8), self.ws, lit(":"), self.ws, inner),
                                   0, None), inner.size + 30)
                n = alt(scalar, leaf, obj)
            self._any_cache[key] = n
        return self._any_cache[key]

    def _free_node(self, depth: int, soup: bool, tail: int = 0) -> Node:
        key = (soup, depth, tail)
        if key in self._any_cache:
            return self._any_cache[key]
        scalars = [rx(STRING, 8), rx(NUMBER, 12), rx(BOOLEAN, 10), lit("null")]
        if depth <= 0:
            n = alt(*scalars, rx(JSON_SOUP_BODY, 8)) if soup else \
                self.tail_value(max(tail, 0)) if tail else alt(*scalars)
        else:
            inner = self._free_node(depth - 1, soup, tail)
            # the tail continues along objects only: below an array, only arrays of
            # scalars at the cut (tail_value(0): one array automaton per cut point)
            inner_arr = self._free_node(depth - 1, soup, -1 if tail else 0) \
                if tail > 0 else inner
            arr = self._list([], inner_arr, 0, None, "[", "]", ",")
            obj = Node("obj", ((), seq(rx(STRING, 8), self.ws, lit(":"), self.ws, inner), 0, None),
                       inner.size + 30)
            n = alt(*scalars, arr, obj)
        n = Node(n.kind, n.args, n.size, det=True)
        self._any_cache[key] = n
        return n


#: subtrahend: the deepest free-form values built in a subtracted operand to cover a
#: positive side that nests deeper than the default (past it: the meet)
MAX_SUBTRAHEND_DEPTH = 6


@functools.lru_cache(maxsize=32)
def _nesting_dfa(k: int) -> DFA:
    """Byte strings whose brackets outside JSON strings nest at most ``k`` deep (a
    lexer: outside a string, inside one, after a backslash in one; every live state
    accepting)."""
    nfa = NFA()
    st = {(lex, d): nfa.add_state(accepting=True) for lex in range(3) for d in range(k + 1)}

    def other(src, dst, excluded):
        lo = 0
        for b in sorted(excluded) + [256]:
            if lo <= b - 1:
                nfa.add_byte_range(src, dst, lo, b - 1)
            lo = b + 1
    for d in range(k + 1):
        out, instr, esc = st[0, d], st[1, d], st[2, d]
        nfa.add_bytes(out, instr, b'"')
        if d < k:
            nfa.add_bytes(out, st[0, d + 1], b"[")
            nfa.add_bytes(out, st[0, d + 1], b"{")
        if d > 0:
            nfa.add_bytes(out, st[0, d - 1], b"]")
            nfa.add_bytes(out, st[0, d - 1], b"}")
        other(out, out, {ord('"'), ord("["), ord("{"), ord("]"), ord("}")})
        nfa.add_bytes(instr, out, b'"')
        nfa.add_bytes(instr, esc, b"\\")
        other(instr, instr, {ord('"'), ord("\\")})
        other(esc, instr, set())
    return minimize(determinize(nfa))


def _nesting_bound(dfa: DFA, lo: int, hi: int, max_states: int) -> int | None:
    """The least ``k`` in ``[lo, hi]`` such that no string of ``dfa`` nests brackets
    (outside JSON strings) deeper than ``k``; None if none is (or a product passes
    ``max_states``)."""
    for k in range(lo, hi + 1):
        try:
            if is_empty(difference(dfa, _nesting_dfa(k), max_states)):
                return k
        except AutomatonTooLargeError:
            return None
    return None


_POSITIONAL = ("prefixItems", "items", "additionalItems")
#: unevaluatedProperties / unevaluatedItems whose evaluated set depends on branches: at
#: most this many cases (choices of the branches that hold)
MAX_UNEVALUATED_CASES = 16


def _union_eval(a: dict, b: dict) -> dict:
    return {"names": a["names"] + b["names"], "patterns": a["patterns"] + b["patterns"],
            "all": a["all"] or b["all"], "prefix": max(a["prefix"], b["prefix"]),
            "contains": a["contains"] + b["contains"]}
# the base URI of a document without $id (RFC 3986 resolution needs one)
_DEFAULT_BASE = "https://jaxcd.invalid/schema.json"


def _join_uri(base: str, ref: str) -> str:
    """``ref`` resolved against ``base`` (RFC 3986); non-hierarchical bases (``urn:``)
    resolve only fragments and absolute references."""
    from urllib.parse import urljoin, urlsplit
    if urlsplit(ref).scheme:
        return ref
    if ref.startswith("#"):
        return base.split("#", 1)[0] + ref
    if urlsplit(base).scheme in ("http", "https", "file", "ftp", ""):
        return urljoin(base, ref)
    return ref                  # relative to a urn: no defined resolution


def _split_fragment(uri: str) -> tuple[str | None, str]:
    """``(URI without fragment, fragment)``; the URI is None when it is not absolute."""
    from urllib.parse import urlsplit
    base, _, frag = uri.partition("#")
    if not urlsplit(base).scheme:
        return None, frag
    return base, frag


def _escape_pointer(key: str) -> str:
    """A JSON pointer token as a URI fragment writes it (``resolve`` reads it back)."""
    from urllib.parse import quote
    return quote(key.replace("~", "~0").replace("/", "~1"), safe="~$!&'()*+,;=:@")


def _positions(sub: dict) -> tuple[list, Any]:
    """``(schemas of the first positions, schema of the later ones)`` that a schema's
    ``prefixItems`` / ``items`` (or draft-04 ``items`` array / ``additionalItems``)
    give the items of an array."""
    items = sub.get("items", True)
    if isinstance(items, list):
        return list(items), sub.get("additionalItems", True)
    prefix = sub.get("prefixItems")
    if prefix is not None and not isinstance(prefix, list):
        raise SchemaError("prefixItems must be an array")
    return list(prefix or []), items


def _conj(schemas: list) -> Any:
    """One schema for the conjunction of ``schemas`` (``true`` dropped, repeats too)."""
    out: list = []
    for x in schemas:
        if x is True or x == {}:
            continue
        if x is False:
            return False
        if not any(_json_eq(x, y) for y in out):
            out.append(x)
    if not out:
        return True
    return out[0] if len(out) == 1 else {"allOf": out}


def _before(schema: dict, a: str, b: str) -> bool:
    """True if keyword ``a`` is written before keyword ``b`` in ``schema``."""
    keys = list(schema)
    return a in schema and b in schema and keys.index(a) < keys.index(b)


_ALL_BYTES = frozenset(range(256))


_OPEN_BRACE = frozenset(b"{")
_CONTAINER_BYTES = frozenset(b"{[")


def _object_facts(schema: Any) -> tuple[frozenset, dict]:
    """``(required names, properties)`` of a merged ``oneOf`` branch (what every object
    of it has, and the schemas its named properties' values satisfy); empty for a
    schema that is not a dict."""
    if not isinstance(schema, dict):
        return frozenset(), {}
    req = schema.get("required")
    props = schema.get("properties")
    req = frozenset(r for r in req if isinstance(r, str)) if isinstance(req, list) else \
        frozenset()
    return req, props if isinstance(props, dict) else {}


def _listed(s: Any) -> list | None:
    """The values a schema's ``const`` or ``enum`` lists (None without either)."""
    if isinstance(s, dict) and "const" in s:
        return [s["const"]]
    if isinstance(s, dict) and isinstance(s.get("enum"), list):
        return s["enum"]
    return None


def _value_types(s: Any) -> frozenset | None:
    """The JSON types a schema's values can have, from ``const``/``enum``/``type``
    (``integer`` read as ``number``); None if it does not say."""
    vals = _listed(s)
    if vals is not None:
        return frozenset("number" if _json_type(v) == "integer" else _json_type(v)
                         for v in vals)
    t = s.get("type") if isinstance(s, dict) else None
    if isinstance(t, str):
        t = [t]
    if isinstance(t, list) and t and all(x in _TYPE_FIRST_BYTES for x in t):
        return frozenset("number" if x == "integer" else x for x in t)
    return None


def _values_apart(a: Any, b: Any) -> bool:
    """True if no value satisfies both schemas, shown on their keywords: ``b`` is
    ``false``, or both list their values (``const``/``enum``) and none is equal, or
    their types share none."""
    if b is False or a is False:
        return True
    va, vb = _listed(a), _listed(b)
    if va is not None and vb is not None:
        return not ({_canon(v) for v in va} & {_canon(v) for v in vb})
    ta, tb = _value_types(a), _value_types(b)
    return ta is not None and tb is not None and not (ta & tb)


def _values_outside(mine: Any, other: dict) -> dict:
    """A schema for the values of ``mine`` that ``other`` (a ``const``/``enum``) refuses:
    the listed values that are not ``other``'s where ``mine`` lists them too (no
    product), else ``{"not": other}``."""
    ours, theirs = _listed(mine), _listed(other)
    if ours is None or theirs is None:
        return {"not": other}
    keys = {_canon(t) for t in theirs}
    return {"enum": [v for v in ours if _canon(v) not in keys]}


_TYPE_FIRST_BYTES = {"string": frozenset(b'"'), "number": frozenset(b"-0123456789"),
                     "integer": frozenset(b"-0123456789"), "boolean": frozenset(b"tf"),
                     "null": frozenset(b"n"), "object": frozenset(b"{"),
                     "array": frozenset(b"[")}


def _schema_first_bytes(schema: Any) -> frozenset:
    """A superset of the first bytes of the values of ``schema`` (every spelling), read
    on its ``const``, ``enum`` or ``type`` alone: all bytes where none is given."""
    if schema is False:
        return frozenset()
    if not isinstance(schema, dict):
        return _ALL_BYTES
    if "const" in schema:
        return _TYPE_FIRST_BYTES[_json_type(schema["const"])]
    if isinstance(schema.get("enum"), list):
        out = frozenset()
        for v in schema["enum"]:
            out |= _TYPE_FIRST_BYTES[_json_type(v)]
        return out
    t = schema.get("type")
    if isinstance(t, str):
        t = [t]
    if isinstance(t, list) and all(x in _TYPE_FIRST_BYTES for x in t):
        out = frozenset()
        for x in t:
            out |= _TYPE_FIRST_BYTES[x]
        return out
    return _ALL_BYTES


def _first_bytes(node: Node) -> frozenset:
    """The bytes a string of ``node`` can start with (a superset; all bytes if the
    node can be empty or is not analysed)."""
    k = node.kind
    if k == "empty":
        return frozenset()
    if k == "lit":
        t = node.args[0].encode()
        return frozenset(t[:1]) if t else _ALL_BYTES
    if k in ("obj", "objany", "objmix"):
        return frozenset(b"{")
    if k == "seq":
        return _first_bytes(node.args[0])
    if k == "alt":
        out = frozenset()
        for p in node.args:
            out |= _first_bytes(p)
        return out
    if k == "list":
        return _first_bytes(node.args[0])
    if k in ("re", "dfa"):
        d = _dfa_of(node.args[0]) if k == "re" else node.args[0]
        if d.num_states == 0:
            return frozenset()
        if d.accepting[0]:
            return _ALL_BYTES
        row = d.trans[0][d.byte_class]
        return frozenset(int(b) for b in np.nonzero(row >= 0)[0])
    return _ALL_BYTES


def _finite_texts(dfa: DFA, limit: int) -> list[bytes] | None:
    """Every string of ``dfa`` if there are at most ``limit`` (else ``None``)."""
    if dfa.num_states == 0:
        return []
    out: list[bytes] = []
    stack = [(0, b"")]
    bytes_of = [np.nonzero(dfa.byte_class == c)[0].tolist() for c in range(dfa.num_classes)]
    steps = 0
    while stack:
        q, t = stack.pop()
        steps += 1
        if dfa.accepting[q]:
            out.append(t)
            if len(out) > limit:
                return None
        if steps > 64 * limit or len(t) > 4096:          # a loop or a very long item
            return None
        for c in range(dfa.num_classes):
            d = int(dfa.trans[q, c])
            if d >= 0:
                for b in bytes_of[c]:
                    stack.append((d, t + bytes([b])))
                if len(stack) > 64 * limit:
                    return None
    return out


def _canon(v):
    """A hashable key equal for JSON values equal under JSON Schema (1 == 1.0;
    true != 1; object key order ignored); numbers as ``json`` or ``Decimal`` parse
    them."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, (int, float, Decimal)):
        v = to_decimal(v)
        return ("num", v.normalize() if v != 0 else Decimal(0))
    if isinstance(v, list):
        return ("list", tuple(_canon(x) for x in v))
    return ("obj", tuple(sorted((k, _canon(x)) for k, x in v.items())))


_INTEGER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_MAX_PLAIN_NUMBER = 40          # characters of a plain (exponent-free) enum number spelling


def _number_spellings(v) -> list[str]:
    """The spellings of the JSON number ``v`` that an ``enum``/``const`` accepts: its
    compact JSON text (Python's: ``2.0``, ``1e+20``), and where that is not already
    plain, its value without an exponent or a fraction of zeros: ``2`` for ``2.0``
    (JSON Schema compares numbers by value: ``2`` equals ``2.0``),
    ``100000000000000000000`` for ``1e+20``, ``0.00001`` for ``1e-05``. An integer
    written as one (``2``) keeps its one spelling, so integer enums stay as small as
    their texts. Finite (an array of them can be kept apart: ``uniqueItems``)."""
    x = to_decimal(v)
    out = [json.dumps(v)]
    if not x.is_finite() or isinstance(v, int):
        return out
    if x == x.to_integral_value():
        out.append(str(int(x)))
    else:
        out.append(format(x.normalize(), "f"))
    # (the plain form of a huge or tiny value, such as 1e308's 309 digits, is left out)
    return list(dict.fromkeys(t for i, t in enumerate(out)
                              if i == 0 or (len(t) <= _MAX_PLAIN_NUMBER and Decimal(t) == x)))


def _value_spellings(v) -> list[str]:
    """The texts an ``enum``/``const`` value is accepted as: numbers in each of their
    :func:`_number_spellings`, every other value printed compactly."""
    if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool):
        return _number_spellings(v)
    return [json.dumps(v, ensure_ascii=False, separators=(",", ":"))]


def _json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, Decimal):
        return "integer" if v.is_finite() and v == v.to_integral_value() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _json_eq(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@functools.lru_cache(maxsize=256)
def _dfa_of(pattern: str) -> DFA:
    return minimize(determinize(regex_to_nfa(pattern, re.ASCII)))


@functools.lru_cache(maxsize=256)
def _regex_past_spellings(pattern: str) -> bool:
    """Whether the regex ``pattern`` has more than ``MAX_UNIQUE_SPELLINGS`` texts (or
    ones :func:`_finite_texts` gives up on), once per pattern."""
    return _finite_texts(_dfa_of(pattern), MAX_UNIQUE_SPELLINGS) is None


def _past_spellings(node: Node) -> bool:
    """True where ``node`` surely has more than ``MAX_UNIQUE_SPELLINGS`` texts, read off
    the tree: a regex part with that many (string bodies), a list without an upper
    bound, an object with extra members (each part of a sequence non-empty). False says
    nothing."""
    k = node.kind
    if k == "re":
        return _regex_past_spellings(node.args[0])
    if k == "list":
        return node.args[3] is None and node.args[0].kind != "empty"
    if k in ("obj", "objany", "objmix"):
        return node.args[1] is not None
    if k == "alt":
        return any(_past_spellings(p) for p in node.args)
    if k == "seq":
        return (all(p.kind != "empty" for p in node.args)
                and any(_past_spellings(p) for p in node.args))
    return False


def _spaced(text: bytes, ws: Node) -> Node:
    """A compact JSON text as a node that takes the free whitespace ``ws`` between any
    two of its tokens (strings, scalars, ``{}[],:``): the same value in every such
    spelling."""
    parts: list[Node] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == 0x22:                                   # a string, escapes skipped
            j = i + 1
            while text[j] != 0x22:
                j += 2 if text[j] == 0x5C else 1
            j += 1
        elif c in b"{}[],:":
            j = i + 1
        else:                                           # a number or a literal
            j = i
            while j < n and text[j] not in b"{}[],:":
                j += 1
        if parts:
            parts.append(ws)
        parts.append(lit(text[i:j].decode("utf-8")))
        i = j
    return seq(*parts)


def _digest(node: Node, memo: dict) -> bytes:
    """A digest of ``node``'s tree: 16 bytes of BLAKE2b over its kinds and arguments
    (DFAs by their tables), equal for equal trees. ``memo``: digests by id (it holds the
    nodes and DFAs, so their ids stay theirs)."""
    hit = memo.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    h = hashlib.blake2b(node.kind.encode(), digest_size=16)
    _digest_into(h, node.args, memo)
    out = h.digest()
    memo[id(node)] = (node, out)
    return out


def _digest_into(h, x, memo: dict) -> None:
    if isinstance(x, Node):
        h.update(b"N" + _digest(x, memo))
    elif isinstance(x, (tuple, list)):
        h.update(b"(%d" % len(x))
        for y in x:
            _digest_into(h, y, memo)
        h.update(b")")
    elif isinstance(x, _Member):
        h.update(b"M" + _digest(x.key, memo) + _digest(x.value, memo)
                 + (b"1" if x.required else b"0"))
    elif isinstance(x, DFA):
        hit = memo.get(id(x))
        if hit is None or hit[0] is not x:
            d = hashlib.blake2b(digest_size=16)
            for a in (x.trans, x.accepting, x.byte_class):
                d.update(repr(a.shape).encode() + a.dtype.str.encode())
                d.update(np.ascontiguousarray(a).tobytes())
            hit = memo[id(x)] = (x, d.digest())
        h.update(b"D" + hit[1])
    elif x is None or isinstance(x, (str, int, float)):
        h.update(b"S" + repr(x).encode() + b"\0")
    else:
        raise TypeError(f"digest: unexpected node argument {type(x).__name__}")


def _child_nodes(x):
    """The nodes in a node's arguments (members' keys and values, inside tuples)."""
    if isinstance(x, Node):
        yield x
    elif isinstance(x, _Member):
        yield x.key
        yield x.value
    elif isinstance(x, (tuple, list)):
        for y in x:
            yield from _child_nodes(y)


def _has_capped(node: Node, seen: dict) -> bool:
    """Whether ``node``'s tree has a ``capped`` node (``seen``: results by id)."""
    hit = seen.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    out = node.kind == "capped" or any(_has_capped(c, seen)
                                       for c in _child_nodes(node.args))
    seen[id(node)] = (node, out)
    return out


def _node_dfa(node: Node, compact: bool = False) -> DFA:
    """The minimal DFA of ``node`` without whitespace in objects (and, ``compact``,
    without the free whitespace anywhere)."""
    nfa = NFA()
    s = nfa.add_state()
    nfa.start = s
    e = _NFAEmitter(nfa, "", compact).emit(node, s)
    nfa.accepting = {e}
    return minimize(determinize(nfa))


def _node_nfa(node: Node, whitespace: str) -> NFA:
    """``node``'s NFA; ``virtual_states``: the states it would have without the
    emitter's ``det`` copies (what the product budgets count)."""
    nfa = NFA()
    st = nfa.add_state()
    nfa.start = st
    em = _NFAEmitter(nfa, whitespace, det=not _has_capped(node, {}))
    nfa.accepting = {em.emit(node, st)}
    nfa.virtual_states = nfa.num_states + em.saved
    return nfa


# numbers whose only bound is 0 keep the exponent (exact: the sign and whether the
# mantissa has a nonzero digit decide; -0 equals 0)
_ZERO_MANTISSA = r"0(?:\.0+)?"
_NONZERO_MANTISSA = r"(?:0\.[0-9]*[1-9][0-9]*|[1-9][0-9]*(?:\.[0-9]+)?)"
_EXPONENT = r"(?:[eE][+-][0-9]+)?"          # NUMBER's exponent


# supersets for subtracted operands (SchemaBuilder.integer / number): the spellings the
# bounded grammars leave out
_EXPONENT_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?[eE][+-][0-9]+"
_NONCANONICAL_INTEGER = r"-?(?:0|[1-9][0-9]*)(?:\.0+|(?:\.[0-9]+)?[eE][+-][0-9]+)|-0"


def _sign_only_regex(lo, hi, lo_x: bool, hi_x: bool) -> str | None:
    """The numbers ``>= 0``, ``> 0``, ``<= 0`` or ``< 0`` (exponents included) when the
    only bound is 0, else None."""
    if (lo is None) == (hi is None) or (lo if hi is None else hi) != 0:
        return None
    z, n, e = _ZERO_MANTISSA, _NONZERO_MANTISSA, _EXPONENT
    if hi is None:                            # minimum / exclusiveMinimum 0
        return f"{n}{e}" if lo_x else f"(?:{n}|{z}|-{z}){e}"
    return f"-{n}{e}" if hi_x else f"(?:-{n}|-{z}|{z}){e}"


# -- presence tests (SchemaBuilder._presence_split) ---------------------------------------
# a test of which keys an object has, in disjunctive normal form: a list of cases, each a
# dict key -> present (True) or absent (False), and _OBJECT -> whether the value is an
# object; [] is false, [{}] true. On values other than objects every key counts as
# present (``required`` holds for them).
_OBJECT = ("type", "object")
_PRESENCE_KW = {"required", "not", "allOf", "anyOf", "oneOf", "type"}


def _presence_dnf(s: Any, depth: int = 0) -> list[dict] | None:
    """The presence test ``s`` (a schema with only ``required`` and ``type: "object"``
    under ``not``/``allOf``/``anyOf``/``oneOf``) in disjunctive normal form, or None if
    ``s`` tests anything else or the form passes ``MAX_PRESENCE_CASES``."""
    if s is True:
        return [{}]
    if s is False:
        return []
    if not isinstance(s, dict) or depth > 8:
        return None
    keys = [k for k in s if not is_annotation(k)]
    if not set(keys) <= _PRESENCE_KW:
        return None
    out: list[dict] | None = [{}]
    for k in keys:
        v = s[k]
        if k == "type":
            if v not in ("object", ["object"]):
                return None
            f = [{_OBJECT: True}]
        elif k == "required":
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                return None
            f = [{x: True for x in v}]
        elif k == "not":
            f = _presence_dnf(v, depth + 1)
            f = None if f is None else _dnf_not(f)
        else:
            if not isinstance(v, list) or not v:
                return None
            fs = [_presence_dnf(b, depth + 1) for b in v]
            if any(x is None for x in fs):
                return None
            f = [{}] if k == "allOf" else []
            if k == "allOf":
                for x in fs:
                    f = None if f is None else _dnf_and(f, x)
            elif k == "anyOf":
                for x in fs:
                    f = None if f is None else _dnf_or(f, x)
            else:                                 # oneOf: one holds, the others not
                negs = [_dnf_not(x) for x in fs]
                for i, x in enumerate(fs):
                    t = x
                    for j, n in enumerate(negs):
                        if j != i and t is not None:
                            t = None if n is None else _dnf_and(t, n)
                    f = None if t is None or f is None else _dnf_or(f, t)
        if f is None:
            return None
        out = _dnf_and(out, f)
        if out is None:
            return None
    return out


def _dnf_simplify(cases: list[dict]) -> list[dict] | None:
    """Without repeated and subsumed cases; None past ``MAX_PRESENCE_CASES``."""
    kept: list[dict] = []
    for c in sorted(cases, key=len):            # (keys in the order the test names them)
        items = c.items()
        if not any(k.items() <= items for k in kept):
            kept.append(c)
    if len(kept) > MAX_PRESENCE_CASES:
        return None
    return kept


def _dnf_or(a: list[dict], b: list[dict]) -> list[dict] | None:
    return _dnf_simplify(a + b)


def _dnf_and(a: list[dict], b: list[dict]) -> list[dict] | None:
    if len(a) * len(b) > MAX_PRESENCE_CASES ** 2:
        return None
    return _dnf_simplify([{**x, **y} for x in a for y in b
                          if all(y.get(k, v) == v for k, v in x.items())
                          and not _contradicts({**x, **y})])


def _contradicts(term: dict) -> bool:
    """A case "not an object" with an absent key holds for no value."""
    return term.get(_OBJECT) is False and not all(
        v for k, v in term.items() if k is not _OBJECT)


def _dnf_not(a: list[dict]) -> list[dict] | None:
    out: list[dict] | None = [{}]
    for term in a:
        flipped = [{k: not v} for k, v in term.items()]
        out = None if out is None else _dnf_and(out, flipped)
    return out


def _nfa_disjoint(a: NFA, b: NFA, max_pairs: int) -> bool | None:
    """True if ``L(a) ∩ L(b)`` is empty, False if not, None if the search over the
    reachable pairs of states passes ``max_pairs`` pairs (or as much transition work)."""
    ta, tb, ea, eb = a.trans, b.trans, a.eps, b.eps
    acc_a, acc_b = a.accepting, b.accepting
    first = (a.start, b.start)
    seen = {first}
    stack = [first]
    work = 0
    while stack:
        p, q = stack.pop()
        if p in acc_a and q in acc_b:
            return False
        succ = [(e, q) for e in ea[p]]
        succ += [(p, e) for e in eb[q]]
        tp, tq = ta[p], tb[q]
        if tp and tq:
            work += len(tp) * len(tq)
            if work > 8 * max_pairs:
                return None
            for lo, hi, d in tp:
                for lo2, hi2, d2 in tq:
                    if lo <= hi2 and lo2 <= hi:
                        succ.append((d, d2))
        for x in succ:
            if x not in seen:
                if len(seen) >= max_pairs:
                    return None
                seen.add(x)
                stack.append(x)
    return True


def _declared_key_dfa(declared: list[str]) -> DFA:
    """JSON string literals (any spelling, escapes included) that decode to one of
    ``declared``."""
    nfa = _JsonCharNFA()
    s = nfa.add_state()
    f = nfa.add_state(accepting=True)
    nfa.start = s
    for name in declared:
        cur = s
        q = nfa.add_state()
        nfa.add_bytes(cur, q, b'"')
        cur = q
        for ch in name:
            q = nfa.add_state()
            nfa.add_codepoints(cur, q, [(ord(ch), ord(ch))])
            cur = q
        nfa.add_bytes(cur, f, b'"')
    # not minimised: _difference's product is
    return determinize(nfa)


def _difference(a: DFA, b: DFA) -> DFA:
    """L(a) minus L(b)."""
    import numpy as np
    # complete b over a's alphabet, flip acceptance, intersect
    Q = b.num_states
    trans = np.concatenate([b.trans, np.full((1, b.num_classes), Q, np.int32)], axis=0)
    trans = np.where(trans < 0, Q, trans).astype(np.int32)
    acc = np.concatenate([~b.accepting, [True]])
    comp = DFA(trans, acc, b.byte_class)
    return intersect(a, comp)


# ---------------------------------------------------------------------------------------
# back-ends
# ---------------------------------------------------------------------------------------
class _NFAEmitter:
    def __init__(self, nfa: NFA, whitespace: str, compact: bool = False,
                 share: bool = False, det: bool = False):
        """``whitespace``: the regex between an object's tokens; ``compact``: leave out
        the builder's free whitespace elsewhere too (its tagged ``ws`` nodes).
        ``share``: members with equal values and the same continuation share one copy
        of the value (see :meth:`_obj_loose`); ``det``: free-form values emitted again
        are copies of their minimal DFA (see :meth:`emit`). Both make smaller NFAs and
        DFAs of the same language; neither is used in a tree with ``capped`` nodes, whose
        NFA and DFA sizes decide its form. ``saved``: the NFA states that ``det`` saved
        (the states the NFA would have without it: ``num_states + saved``)."""
        self.nfa = nfa
        self.whitespace = whitespace
        self.compact = compact
        self.share = share
        self.det = det
        self.saved = 0
        self._digests: dict = {}
        self._re_cache: dict[str, NFA] = {}
        self._det_memo: dict[int, tuple] = {}
        self._dfa_nfa: dict[int, tuple] = {}

    def emit(self, node: Node, src: int) -> int:
        if node.det and self.det:
            # a free-form value emitted again (the extras of every open object): a copy
            # of its minimal DFA (built once), not of its NFA, whose subsets the
            # determiniser would build again for each copy
            nfa = self.nfa
            hit = self._det_memo.get(id(node))
            if hit is None or hit[0] is not node:
                # its plain size: the states added, and those that copies of the free-form
                # values inside it saved
                n0, saved0 = nfa.num_states, self.saved
                out = self._emit(node, src)
                self._det_memo[id(node)] = (node, None,
                                            nfa.num_states - n0 + self.saved - saved0)
                return out
            if hit[1] is None:
                sub = NFA()
                s = sub.add_state()
                sub.start = s
                em = _NFAEmitter(sub, self.whitespace, self.compact)
                em._dfa_nfa = self._dfa_nfa
                sub.accepting = {em._emit(node, s)}
                hit = self._det_memo[id(node)] = (node, minimize(determinize(sub)).to_nfa(),
                                                  hit[2])
            n0 = nfa.num_states
            out = self._embed(hit[1], src)
            self.saved += hit[2] - (nfa.num_states - n0)
            return out
        return self._emit(node, src)

    def _emit(self, node: Node, src: int) -> int:
        nfa = self.nfa
        k = node.kind
        if k == "lit":
            dst = nfa.add_state()
            nfa.add_string(src, dst, node.args[0])
            return dst
        if k == "re":
            if self.compact and node.args[1:] == ("ws",):
                return src
            frag = self._re_cache.get(node.args[0])
            if frag is None:
                frag = self._re_cache[node.args[0]] = regex_to_nfa(node.args[0], re.ASCII)
            return self._embed(frag, src)
        if k == "dfa":
            d = node.args[0]
            hit = self._dfa_nfa.get(id(d))
            if hit is None:                 # (the DFA kept: its id stays its own)
                hit = self._dfa_nfa[id(d)] = (d, d.to_nfa())
            return self._embed(hit[1], src)
        if k == "seq":
            cur = src
            for p in node.args:
                cur = self.emit(p, cur)
            return cur
        if k == "alt":
            dst = nfa.add_state()
            for p in node.args:
                s = nfa.add_state()
                nfa.add_epsilon(src, s)
                nfa.add_epsilon(self.emit(p, s), dst)
            return dst
        if k == "empty":
            return nfa.add_state()          # unreachable end: no string
        if k == "list":
            item, sep, lo, hi = node.args
            return self._list(item, sep, lo, hi, src)
        if k == "obj":
            return self._obj(node, src)
        if k == "objany":
            return self._obj_any(node, src)
        if k == "objmix":
            return self._obj_mix(node, src)
        if k == "capped":                  # (tree, DFA states, size allowance): NFA.dfa_cap
            tree, cap, extra = node.args
            # refused before it is emitted or determinised when its size says that
            # its DFA would pass the cap anyway (see AUTO_REFUSE_TREE); ``extra``: the
            # size estimates of deeper free-form values (SchemaBuilder.free_value)
            limit = AUTO_REFUSE_TREE * cap + extra
            if tree.size > limit:
                raise _capped_refusal(f"its tree's size estimate {tree.size:,} is over "
                                      f"{limit:,}", cap)
            nfa.dfa_cap = cap if nfa.dfa_cap is None else min(nfa.dfa_cap, cap)
            first = nfa.num_states
            end = self.emit(tree, src)
            limit = AUTO_REFUSE_NFA * cap + extra
            if nfa.num_states - first > limit:
                raise _capped_refusal(f"its NFA has {nfa.num_states - first:,} states, "
                                      f"over {limit:,}", cap)
            return end
        raise AssertionError(k)

    def _obj_mix(self, node: Node, src: int) -> int:
        """Tracked members in any order, each at most once (a subset mask); the other
        members (optional) in the schema's order, each at most once (a position in
        their chain), interleaved anywhere with the tracked ones; extra members anywhere
        (``anywhere``) or after the declared ones (one shared tail; and ``lead``'s
        before them: see :meth:`_lead`). One state per
        (mask, chain position, property count level, whether a member was emitted)."""
        members, extra, lo, hi, tracked, anywhere = node.args[:6]
        lead = node.args[6] if len(node.args) > 6 else None
        nfa = self.nfa
        ws, comma, colon, start, close_in, end = self._obj_frame(src)
        tr = [m for m, f in zip(members, tracked) if f]
        chain = [m for m, f in zip(members, tracked) if not f]
        assert not any(m.required for m in chain)
        counted = bool(lo) or hi is not None
        K = (max(lo, hi if hi is not None else 0) if counted else 0)
        need = sum(1 << i for i, m in enumerate(tr) if m.required)

        def ok_count(c):
            return (not counted) or (c >= lo and (hi is None or c <= hi))

        def can_add(c):
            return not counted or hi is None or c < hi

        tails: dict = {}

        def tail(c, started):
            """Extra members only, then close (required members all present)."""
            if (c, started) not in tails:
                q = tails[c, started] = nfa.add_state()
                if can_add(c):
                    nc = min(c + 1, K) if counted else 0
                    a = self.emit(extra, self.emit(comma if started else ws, q))
                    nfa.add_epsilon(a, tail(nc, True))
                if ok_count(c):
                    nfa.add_epsilon(q, close_in)
            return tails[c, started]

        states: dict = {}
        work = []

        def state(key):
            if key not in states:
                states[key] = nfa.add_state()
                work.append(key)
            return states[key]

        self._lead(lead, start, ws)
        nfa.add_epsilon(start, state((0, 0, 0, False)))
        while work:
            key = work.pop()
            mask, pos, c, started = key
            q = states[key]
            nc = min(c + 1, K) if counted else 0
            if can_add(c):
                b = self.emit(comma if started else ws, q)
                for i, m in enumerate(tr):
                    if not mask >> i & 1:
                        a = self.emit(m.value, self.emit(seq(m.key, colon), b))
                        nfa.add_epsilon(a, state((mask | 1 << i, pos, nc, True)))
                if pos < len(chain):
                    m = chain[pos]
                    a = self.emit(m.value, self.emit(seq(m.key, colon), b))
                    nfa.add_epsilon(a, state((mask, pos + 1, nc, True)))
                if extra is not None and anywhere:
                    nfa.add_epsilon(self.emit(extra, b), state((mask, pos, nc, True)))
            if pos < len(chain):
                nfa.add_epsilon(q, state((mask, pos + 1, c, started)))
            if mask & need == need:
                if extra is not None and not anywhere:
                    nfa.add_epsilon(q, tail(c, started))
                elif ok_count(c):
                    nfa.add_epsilon(q, close_in)
        # ``tail`` calls itself through its closure: a reference cycle that would keep
        # this emitter and its NFA for the cyclic GC (hundreds of thousands of objects)
        del tail
        return end

    def _lead(self, lead: Node | None, start: int, ws: Node) -> None:
        """``lead`` members (the document's object: additional members with scalar
        values) before the declared ones: ``ws lead ws ,`` from ``start`` (the state
        after ``{``) back to ``start``, whose first member follows its whitespace. The object has a required member, so it does not close right
        after that comma."""
        if lead is None:
            return
        nfa = self.nfa
        h = nfa.add_state()
        nfa.add_epsilon(self.emit(ws, start), h)
        nfa.add_epsilon(self.emit(seq(ws, lit(",")), self.emit(lead, h)), start)

    def _obj_frame(self, src: int):
        """The delimiters of an object automaton: ``(ws, comma, colon, start, close_in,
        end)``: ``start`` the state after ``{`` from ``src``, ``close_in`` a new state from
        which ``ws }`` leads to ``end``."""
        ws = Node("re", (self.whitespace,)) if self.whitespace else EPS
        start = self.emit(lit("{"), src)
        close_in = self.nfa.add_state()
        end = self.emit(seq(ws, lit("}")), close_in)
        return ws, seq(ws, lit(","), ws), seq(ws, lit(":"), ws), start, close_in, end

    def _obj_any(self, node: Node, src: int) -> int:
        """Members in any order: one state per (subset of declared members emitted,
        property count level, whether a member was emitted); extra members anywhere.
        ``loose`` (repeats allowed, only the required members tracked): see
        :meth:`_obj_loose`."""
        members, extra, lo, hi, loose = node.args
        if loose:
            return self._obj_loose(node, src)
        nfa = self.nfa
        ws, comma, colon, start, close_in, end = self._obj_frame(src)
        counted = bool(lo) or hi is not None
        K = (max(lo, hi if hi is not None else 0) if counted else 0)
        need = sum(1 << i for i, m in enumerate(members) if m.required)
        states: dict = {}
        work = []

        def state(mask, c):
            key = (mask, c)
            if key not in states:
                states[key] = nfa.add_state()
                work.append(key)
            return states[key]

        nfa.add_epsilon(start, state(0, 0))
        while work:
            mask, c = work.pop()
            q = states[mask, c]
            first = mask == 0 and c == 0
            can_add = not counted or hi is None or c < hi
            nc = min(c + 1, K) if counted else 0
            if can_add:
                b = self.emit(ws if first else comma, q)
                for i, m in enumerate(members):
                    if mask >> i & 1:
                        continue
                    a = self.emit(m.value, self.emit(seq(m.key, colon), b))
                    nfa.add_epsilon(a, state(mask | 1 << i, nc))
                if extra is not None:
                    # an extra member first: the -1 level says "started" (mask 0)
                    nfa.add_epsilon(self.emit(extra, b), state(mask, nc) if counted else
                                    state(mask, c) if not first else state(mask, -1))
            ok = (not counted) or (c >= lo and (hi is None or c <= hi))
            if mask & need == need and ok:
                nfa.add_epsilon(q, close_in)
        return end

    def _obj_loose(self, node: Node, src: int) -> int:
        """Members in any order, any number of times, the required ones tracked (a
        subset mask), extra members anywhere. The state after a member is ``(mask,
        count level)``; a join state per ``(mask, count level)``, reached by the first
        member's whitespace or a later member's comma, emits each member once (one copy
        of the members per mask and level, not one per "started" flag: nested objects
        would double at each level)."""
        members, extra, lo, hi, _ = node.args
        nfa = self.nfa
        ws, comma, colon, start, close_in, end = self._obj_frame(src)
        counted = bool(lo) or hi is not None
        K = (max(lo, hi if hi is not None else 0) if counted else 0)
        # the i-th required member's bit is 1 << i; optional members have none
        rank = itertools.accumulate(m.required for m in members)
        bits = [(1 << (r - 1)) if m.required else 0 for m, r in zip(members, rank)]
        need = sum(bits)

        def ok_count(c):
            return (not counted) or (c >= lo and (hi is None or c <= hi))

        def can_add(c):
            return not counted or hi is None or c < hi

        after: dict = {}
        joins: dict = {}
        work = []

        def join(mask, c):
            if (mask, c) not in joins:
                joins[mask, c] = nfa.add_state()
                work.append((mask, c))
            return joins[mask, c]

        def state(mask, c):
            if (mask, c) not in after:
                q = after[mask, c] = nfa.add_state()
                if can_add(c):
                    nfa.add_epsilon(self.emit(comma, q), join(mask, c))
                if mask & need == need and ok_count(c):
                    nfa.add_epsilon(q, close_in)
            return after[mask, c]

        if can_add(0):
            nfa.add_epsilon(self.emit(ws, start), join(0, 0))
        if need == 0 and ok_count(0):
            nfa.add_epsilon(start, close_in)
        while work:
            mask, c = work.pop()
            b = joins[mask, c]
            nc = min(c + 1, K) if counted else 0
            # with ``share``, members with equal values and bits go on to the same
            # state: their keys lead into one copy of the value (the same language; the
            # DFA would have as many copies until minimisation merged them)
            groups: dict = {}
            for i, (m, bit) in enumerate(zip(members, bits)):
                same = _digest(m.value, self._digests) if self.share else i
                groups.setdefault((same, bit), []).append(m)
            for (_, bit), ms in groups.items():
                v = nfa.add_state() if len(ms) > 1 else None
                for m in ms:
                    k = self.emit(seq(m.key, colon), b)
                    if v is None:
                        v = k
                    else:
                        nfa.add_epsilon(k, v)
                nfa.add_epsilon(self.emit(ms[0].value, v), state(mask | bit, nc))
            if extra is not None:
                nfa.add_epsilon(self.emit(extra, b), state(mask, nc))
        return end

    def _embed(self, frag: NFA, src: int) -> int:
        s, acc = self.nfa.embed(frag)
        self.nfa.add_epsilon(src, s)
        dst = self.nfa.add_state()
        for a in acc:
            self.nfa.add_epsilon(a, dst)
        return dst

    def _list(self, item: Node, sep: Node, lo: int, hi: int | None, src: int) -> int:
        """item (sep item)* with lo..hi items (lo >= 1)."""
        nfa = self.nfa
        if lo <= 1 and hi is None:          # one copy of the item: P -item-> Q -sep-> P
            p = nfa.add_state()
            nfa.add_epsilon(src, p)
            q = self.emit(item, p)
            nfa.add_epsilon(self.emit(sep, q), p)
            return q
        cur = self.emit(item, src)
        n = 1
        while n < lo:
            cur = self.emit(item, self.emit(sep, cur))
            n += 1
        if hi is None:
            loop = nfa.add_state()
            nfa.add_epsilon(cur, loop)
            back = self.emit(item, self.emit(sep, loop))
            nfa.add_epsilon(back, loop)
            return loop
        end = nfa.add_state()
        nfa.add_epsilon(cur, end)
        while n < hi:
            cur = self.emit(item, self.emit(sep, cur))
            nfa.add_epsilon(cur, end)
            n += 1
        return end

    def _obj(self, node: Node, src: int) -> int:
        """Linear chain: F_j (no member yet, next candidate j), C_j (some member emitted,
        next candidate j); count layers when min/maxProperties are set. Extra members
        (keys that are not declared) come after the declared ones, and ``lead``'s before
        them (:meth:`_lead`)."""
        members, extra, lo, hi = node.args[:4]
        lead = node.args[4] if len(node.args) > 4 else None
        nfa = self.nfa
        ws = Node("re", (self.whitespace,)) if self.whitespace else EPS
        comma = seq(ws, lit(","), ws)
        colon = seq(ws, lit(":"), ws)
        start = self.emit(lit("{"), src)      # "{" ws member ... | "{" ws "}" (outlines-core)
        close_in = nfa.add_state()
        end = self.emit(seq(ws, lit("}")), close_in)
        n = len(members)
        counted = bool(lo) or hi is not None
        K = (max(lo, hi if hi is not None else 0) if counted else 0)

        def lvl(c):
            return min(c, K) if counted else 0

        levels = range(K + 1)
        F = {}
        Cs = {}
        for c in levels:
            for j in range(n + 1):
                F[j, c] = nfa.add_state()
                Cs[j, c] = nfa.add_state()
        self._lead(lead, start, ws)
        nfa.add_epsilon(start, F[0, 0])

        def ok_count(c):
            if not counted:
                return True
            if hi is None:
                return c >= lo
            return lo <= c <= hi

        def can_add(c):
            return not counted or hi is None or c < hi

        for c in levels:
            for j, m in enumerate(members):
                if can_add(c):
                    b = nfa.add_state()
                    nfa.add_epsilon(self.emit(ws, F[j, c]), b)
                    nfa.add_epsilon(self.emit(comma, Cs[j, c]), b)
                    a = self.emit(seq(m.key, colon), b)
                    a = self.emit(m.value, a)
                    nfa.add_epsilon(a, Cs[j + 1, lvl(c + 1)])
                if not m.required:
                    nfa.add_epsilon(F[j, c], F[j + 1, c])
                    nfa.add_epsilon(Cs[j, c], Cs[j + 1, c])
            # after the declared members: extra members, then close
            fj, cj = F[n, c], Cs[n, c]
            if extra is not None and can_add(c):
                b = nfa.add_state()
                nfa.add_epsilon(self.emit(ws, fj), b)
                nfa.add_epsilon(self.emit(comma, cj), b)
                a = self.emit(extra, b)
                nfa.add_epsilon(a, Cs[n, lvl(c + 1)])
            if ok_count(c):
                nfa.add_epsilon(fj, close_in)
                nfa.add_epsilon(cj, close_in)
        return end


def _capped_refusal(why: str, cap: int) -> AutomatonTooLargeError:
    return AutomatonTooLargeError(
        f"determinise: the automaton with order-free objects would need more than "
        f"{cap:,} DFA states (AUTO_DFA_CAP; predicted: {why}); compile_json_schema "
        "compiles the schema's property order instead")


def to_nfa(node: Node, whitespace: str) -> NFA:
    nfa = NFA()
    s = nfa.add_state()
    nfa.start = s
    share = not _has_capped(node, {})
    e = _NFAEmitter(nfa, whitespace, share=share, det=share).emit(node, s)
    nfa.accepting = {e}
    return nfa


class NoRegexForm(UnsupportedSchemaError):
    """The schema compiles to an automaton but has no printable regex form."""


def to_regex(node: Node, whitespace: str) -> str:
    ws = whitespace

    def r(n: Node) -> str:
        k = n.kind
        if k == "lit":
            return re.escape(n.args[0]) if n.args[0] else ""
        if k == "re":
            return f"(?:{n.args[0]})"
        if k == "seq":
            return "".join(r(p) for p in n.args)
        if k == "alt":
            return "(?:" + "|".join(r(p) for p in n.args) + ")"
        if k == "empty":
            return "(?!)"
        if k == "list":
            item, sep, lo, hi = n.args
            it = r(item)
            s = r(sep)
            return f"(?:{it}(?:{s}{it}){{{lo - 1},{'' if hi is None else hi - 1}}})"
        if k == "obj":
            members, extra, lo, hi = n.args[:4]
            lead = n.args[4] if len(n.args) > 4 else None
            if lo or hi is not None:
                raise NoRegexForm("minProperties/maxProperties have no regex form")
            w = f"(?:{ws})" if ws else ""
            comma = f"{w},{w}"
            colon = f"{w}:{w}"
            mem = [f"{r(m.key)}{colon}{r(m.value)}" for m in members]
            ex = r(extra) if extra is not None else None
            first_mem = [f"{w}{x}" for x in mem]
            first_ex = f"{w}{ex}" if ex is not None else None

            def tail(j):        # members j.. after at least one emitted (comma-led)
                parts = []
                for i in range(j, len(members)):
                    p = f"{comma}{mem[i]}"
                    parts.append(p if members[i].required else f"(?:{p})?")
                if ex is not None:
                    parts.append(f"(?:{comma}{ex})*")
                return "".join(parts)

            def first(j):       # no member yet, candidates j..
                opts = []
                for i in range(j, len(members)):
                    opts.append(f"{first_mem[i]}{tail(i + 1)}")
                    if members[i].required:
                        return "(?:" + "|".join(opts) + ")"
                if ex is not None:
                    opts.append(f"{first_ex}(?:{comma}{ex})*")
                opts.append("")
                return "(?:" + "|".join(opts) + ")"

            body = first(0)
            if lead is not None:
                # extra members with scalar values first (see SchemaBuilder._lead)
                ld = r(lead)
                body = f"(?:{w}{ld}(?:{comma}{ld})*{w},)*{body}"
            return f"\\{{{body}{w}\\}}"
        raise NoRegexForm(f"this schema uses a construct ({k}) with no regex form")

    return r(node)

