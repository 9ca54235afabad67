"""Regular expressions -> byte-level NFA (host side).

Parser choice: we parse with the standard library's own regex parser
(``re._parser``, a.k.a. ``sre_parse``). It accepts exactly Python's ``re`` syntax,
reports syntax errors with their position, and gives a tree whose meaning is
defined by ``re`` itself — so ``re.fullmatch`` is an exact, independent oracle for
tests. (``interegular`` works on characters with an "anything else" symbol and
needs a separate byte lowering; outlines-core's regex crate follows Rust syntax.)
The private module is stable across CPython 3.11–3.13; we pin behaviour with
property tests against ``re.fullmatch``.

Semantics are those of ``re.fullmatch(pattern, text, flags)`` on ``str``, lowered to
UTF-8 bytes: a character class (``[^"\\\\]``, ``.``, ``\\w``) matches every code
point it contains, whatever its UTF-8 length, so it matches multi-byte characters
however the tokenizer splits them. Surrogates (not encodable in UTF-8) are never
matched. With ``flags=0`` the shorthand classes are Unicode-aware as in Python
(``\\d`` matches ``٣``); pass ``re.ASCII`` for ``[0-9]``-style classes.

Supported: literals, classes, ranges, negation, ``.``, ``\\d \\w \\s`` and
negations, alternation, groups (capturing, non-capturing, named), greedy and lazy
repetition (same language under full match), ``^``/``\\A`` at the very start and
``$``/``\\Z`` at the very end, inline flags ``(?s)`` ``(?a)`` ``(?u)`` ``(?x)``.
Not supported (not regular, or not implemented): back-references, look-around,
conditionals, possessive repeats and atomic groups, ``\\b``/``\\B``, anchors
elsewhere, ``re.IGNORECASE``, ``re.MULTILINE``, ``re.LOCALE``.
"""

from __future__ import annotations

import re
import re._constants as C
import re._parser as P
from functools import lru_cache

from ..errors import RegexSyntaxError, UnsupportedRegexError
from .fsa import NFA
from .utf8 import MAX_CODE_POINT, complement_ranges, normalize_ranges

_ASCII_CATS = {
    "digit": [(0x30, 0x39)],
    "space": [(0x09, 0x0D), (0x20, 0x20)],
    "word": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
}


@lru_cache(maxsize=None)
def _all_code_points() -> str:
    return "".join(chr(i) for i in range(MAX_CODE_POINT + 1) if not 0xD800 <= i <= 0xDFFF)


@lru_cache(maxsize=None)
def _stored_categories() -> dict:
    """Ranges precomputed by :func:`_compute_category` for this Unicode version
    (``jaxcd/data/unicode_classes.json``); empty if the Python's tables differ."""
    import json
    import unicodedata
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "data" / "unicode_classes.json"
    try:
        data = json.loads(path.read_text())
    except OSError:
        return {}
    return data if data.get("unidata_version") == unicodedata.unidata_version else {}


@lru_cache(maxsize=None)
def _unicode_category(name: str) -> tuple[tuple[int, int], ...]:
    """Code-point ranges that Python's ``re`` puts in \\d, \\s or \\w (str patterns)."""
    stored = _stored_categories().get(name)
    if stored is not None:
        return tuple(tuple(r) for r in stored)
    return _compute_category(name)


def _compute_category(name: str) -> tuple[tuple[int, int], ...]:
    pat = {"digit": r"\d+", "space": r"\s+", "word": r"\w+"}[name]
    text = _all_code_points()
    out = []
    for m in re.finditer(pat, text):
        out.append((ord(text[m.start()]), ord(text[m.end() - 1])))
    return tuple(normalize_ranges(out))


def _category(cat, ascii_only: bool) -> list[tuple[int, int]]:
    table = {
        C.CATEGORY_DIGIT: ("digit", False), C.CATEGORY_NOT_DIGIT: ("digit", True),
        C.CATEGORY_SPACE: ("space", False), C.CATEGORY_NOT_SPACE: ("space", True),
        C.CATEGORY_WORD: ("word", False), C.CATEGORY_NOT_WORD: ("word", True),
    }
    if cat not in table:
        raise UnsupportedRegexError(f"unsupported character category {cat}")
    name, neg = table[cat]
    ranges = _ASCII_CATS[name] if ascii_only else list(_unicode_category(name))
    return complement_ranges(ranges) if neg else list(ranges)


_UNSUPPORTED_OPS = {
    C.GROUPREF: "back-reference (\\1, (?P=name)) is not regular",
    C.GROUPREF_EXISTS: "conditional group (?(id)yes|no) is not supported",
    C.ASSERT: "look-ahead/look-behind assertion is not supported",
    C.ASSERT_NOT: "negative look-ahead/look-behind assertion is not supported",
    C.POSSESSIVE_REPEAT: "possessive repetition (*+, ++, ?+, {m,n}+) is not supported",
    C.ATOMIC_GROUP: "atomic group (?>...) is not supported",
}

_SUPPORTED_FLAGS = re.ASCII | re.DOTALL | re.UNICODE | re.VERBOSE


class _Builder:
    def __init__(self, nfa: NFA, pattern: str):
        self.nfa = nfa
        self.pattern = pattern

    def seq(self, items, src: int, flags: int, top: bool = False) -> int:
        """Build the sequence ``items`` from ``src``; return its end state."""
        n = len(items)
        cur = src
        for i, (op, av) in enumerate(items):
            if op is C.AT:
                at_start = top and i == 0
                at_end = top and i == n - 1
                if av in (C.AT_BEGINNING, C.AT_BEGINNING_STRING) and at_start:
                    continue
                if av in (C.AT_END, C.AT_END_STRING) and at_end:
                    continue
                raise UnsupportedRegexError(
                    f"anchor {av} at item {i} of {self.pattern!r}: only ^/\\A at the very start "
                    "and $/\\Z at the very end are supported (\\b, \\B and inner anchors are not)")
            cur = self.node(op, av, cur, flags)
        return cur

    def node(self, op, av, src: int, flags: int) -> int:
        nfa = self.nfa
        if op in _UNSUPPORTED_OPS:
            raise UnsupportedRegexError(f"{_UNSUPPORTED_OPS[op]} (in {self.pattern!r})")
        if op is C.LITERAL:
            dst = nfa.add_state()
            nfa.add_codepoints(src, dst, [(av, av)])
            return dst
        if op is C.NOT_LITERAL:
            dst = nfa.add_state()
            nfa.add_codepoints(src, dst, complement_ranges([(av, av)]))
            return dst
        if op is C.ANY:
            dst = nfa.add_state()
            ranges = [(0, MAX_CODE_POINT)] if flags & re.DOTALL else complement_ranges([(10, 10)])
            nfa.add_codepoints(src, dst, ranges)
            return dst
        if op is C.IN:
            dst = nfa.add_state()
            nfa.add_codepoints(src, dst, self.charset(av, flags))
            return dst
        if op is C.BRANCH:
            _, alternatives = av
            dst = nfa.add_state()
            for alt in alternatives:
                s = nfa.add_state()
                nfa.add_epsilon(src, s)
                e = self.seq(list(alt), s, flags)
                nfa.add_epsilon(e, dst)
            return dst
        if op is C.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            bad = (add_flags | del_flags) & ~_SUPPORTED_FLAGS
            if bad:
                raise UnsupportedRegexError(f"inline flag {re.RegexFlag(bad)!r} is not supported "
                                            f"(in {self.pattern!r})")
            return self.seq(list(sub), src, (flags | add_flags) & ~del_flags)
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, sub = av
            sub = list(sub)
            cur = src
            for _ in range(lo):
                cur = self.seq(sub, cur, flags)
            if hi is C.MAXREPEAT:
                loop = nfa.add_state()
                nfa.add_epsilon(cur, loop)
                body_end = self.seq(sub, loop, flags)
                nfa.add_epsilon(body_end, loop)
                return loop
            end = nfa.add_state()
            nfa.add_epsilon(cur, end)
            for _ in range(hi - lo):
                cur = self.seq(sub, cur, flags)
                nfa.add_epsilon(cur, end)
            return end
        raise UnsupportedRegexError(f"unsupported regex construct {op} (in {self.pattern!r})")

    def charset(self, items, flags: int) -> list[tuple[int, int]]:
        ranges: list[tuple[int, int]] = []
        negate = False
        ascii_only = bool(flags & re.ASCII)
        for op, av in items:
            if op is C.NEGATE:
                negate = True
            elif op is C.LITERAL:
                ranges.append((av, av))
            elif op is C.RANGE:
                ranges.append((av[0], av[1]))
            elif op is C.CATEGORY:
                ranges.extend(_category(av, ascii_only))
            else:
                raise UnsupportedRegexError(f"unsupported item {op} in a character class "
                                            f"(in {self.pattern!r})")
        ranges = normalize_ranges(ranges)
        return complement_ranges(ranges) if negate else ranges


def regex_to_nfa(pattern: str, flags: int = 0) -> NFA:
    """Parse ``pattern`` (Python ``re`` syntax) into a byte-level NFA whose language is
    ``{s.encode('utf-8') : re.fullmatch(pattern, s, flags)}``."""
    if not isinstance(pattern, str):
        raise TypeError(f"regex pattern must be str, got {type(pattern).__name__}")
    flags = int(flags)
    if flags & ~_SUPPORTED_FLAGS:
        raise UnsupportedRegexError(
            f"regex flags {re.RegexFlag(flags & ~_SUPPORTED_FLAGS)!r} are not supported "
            "(supported: ASCII, DOTALL, UNICODE, VERBOSE)")
    try:
        parsed = P.parse(pattern, flags)
    except re.error as e:
        raise RegexSyntaxError(f"invalid regex {pattern!r}: {e.msg} at position {e.pos}") from None
    except (OverflowError, RecursionError) as e:
        raise RegexSyntaxError(f"invalid regex {pattern!r}: {e}") from None
    state_flags = parsed.state.flags
    if state_flags & ~(_SUPPORTED_FLAGS):
        raise UnsupportedRegexError(
            f"regex flags {re.RegexFlag(state_flags & ~_SUPPORTED_FLAGS)!r} are not supported "
            f"(in {pattern!r})")
    nfa = NFA()
    s = nfa.add_state()
    nfa.start = s
    b = _Builder(nfa, pattern)
    end = b.seq(list(parsed), s, state_flags, top=True)
    nfa.accepting = {end}
    return nfa
