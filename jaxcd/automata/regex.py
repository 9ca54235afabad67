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
from ..limits import current_limits, too_large
from .fsa import NFA, codepoint_states
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


_CATEGORY_TEXT = {
    C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
    C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W",
}


def _char_text(cp: int, in_class: bool = False) -> str:
    ch = chr(cp)
    if ch.isprintable() and not ch.isspace() or ch == " ":
        special = "^-[]\\" if in_class else ".^$*+?{}[]\\|()"
        return "\\" + ch if ch in special else ch
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def unparse(items) -> str:
    """Regex text of a parsed (sub)pattern, for messages (same language; not
    necessarily the original spelling)."""
    out = []
    for op, av in items:
        if op is C.LITERAL:
            out.append(_char_text(av))
        elif op is C.NOT_LITERAL:
            out.append(f"[^{_char_text(av, True)}]")
        elif op is C.ANY:
            out.append(".")
        elif op is C.IN and len(av) == 1 and av[0][0] is C.CATEGORY:
            out.append(_CATEGORY_TEXT.get(av[0][1], "?"))
        elif op is C.IN:
            parts = []
            for iop, iav in av:
                if iop is C.NEGATE:
                    parts.append("^")
                elif iop is C.LITERAL:
                    parts.append(_char_text(iav, True))
                elif iop is C.RANGE:
                    parts.append(f"{_char_text(iav[0], True)}-{_char_text(iav[1], True)}")
                elif iop is C.CATEGORY:
                    parts.append(_CATEGORY_TEXT.get(iav, "?"))
            out.append("[" + "".join(parts) + "]")
        elif op is C.BRANCH:
            out.append("(?:" + "|".join(unparse(a) for a in av[1]) + ")")
        elif op is C.SUBPATTERN:
            out.append("(" + ("" if av[0] else "?:") + unparse(av[3]) + ")")
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, sub = av
            body = unparse(sub)
            if len(sub) != 1 or sub[0][0] in (C.MAX_REPEAT, C.MIN_REPEAT):
                body = f"(?:{body})"
            hi_t = "" if hi is C.MAXREPEAT else str(hi)
            rep = {(0, ""): "*", (1, ""): "+", (0, "1"): "?"}.get(
                (lo, hi_t), f"{{{lo}}}" if hi_t == str(lo) else f"{{{lo},{hi_t}}}")
            out.append(body + rep + ("?" if op is C.MIN_REPEAT else ""))
        elif op is C.AT:
            out.append("^" if av in (C.AT_BEGINNING, C.AT_BEGINNING_STRING) else "$")
        else:
            out.append("?")
    return "".join(out)


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


_LINE_ANCHORS = {C.AT_BEGINNING: "^", C.AT_BEGINNING_STRING: "^",
                 C.AT_END: "$", C.AT_END_STRING: "$"}


def anchor_product(nfa: NFA, anchor_edges: list, loose_end: bool = False) -> NFA:
    """Resolve anchors anywhere in a pattern (``(^a|b)c``, ``x(y$|z)``) exactly: each
    state is paired with two bits, "a byte was read" and "the end was asserted".
    A ``^`` edge needs no byte read yet; a ``$`` edge asserts the end (no byte may
    follow); a byte sets the first bit. ``$`` is the end of the text (ECMA-262
    semantics, as ``\\Z``). Four copies of the NFA (within ``max_nfa_states``).
    ``loose_end``: a ``$`` asserts nothing (a superset of any reading of ``$``)."""
    trans, eps = nfa.trans, nfa.eps
    N = nfa.num_states
    out = NFA()
    out._grow(4 * N)
    for _ in range(4 * N):
        out.add_state()
    for q in range(N):
        for bits in range(4):
            s = 4 * q + bits
            for d in eps[q]:
                out.add_epsilon(s, 4 * d + bits)
            if not bits & 2:
                for lo, hi, d in trans[q]:
                    out.add_byte_range(s, 4 * d + (bits | 1), lo, hi)
    for src, dst, kind in anchor_edges:
        for bits in range(4):
            if kind == "^" and not bits & 1:
                out.add_epsilon(4 * src + bits, 4 * dst + bits)
            elif kind == "$":
                out.add_epsilon(4 * src + bits, 4 * dst + (bits if loose_end else bits | 2))
    out.start = 4 * nfa.start
    out.accepting = {4 * a + bits for a in nfa.accepting for bits in range(4)}
    return out


class _Builder:
    def __init__(self, nfa: NFA, pattern: str):
        self.nfa = nfa
        self.pattern = pattern
        self._charsets: dict[tuple[int, int], tuple] = {}
        self._sizes: dict[int, int] = {}
        # None: inner anchors raise; a list: they become marked epsilon edges
        # (src, dst, "^" or "$") for the caller to resolve (see anchor_product)
        self.anchor_edges: list | None = None

    # -- size of the NFA before building it ------------------------------------------
    def class_ranges(self, op, av, flags: int) -> tuple:
        """Normalised code-point ranges of a one-character node (cached per node)."""
        k = (id(av), flags) if op is C.IN else (op, av, flags & re.DOTALL)
        r = self._charsets.get(k)
        if r is None:
            if op is C.LITERAL:
                r = ((av, av),)
            elif op is C.NOT_LITERAL:
                r = tuple(complement_ranges([(av, av)]))
            elif op is C.ANY:
                r = ((0, MAX_CODE_POINT),) if flags & re.DOTALL else \
                    tuple(complement_ranges([(10, 10)]))
            else:
                r = tuple(self.charset(av, flags))
            self._charsets[k] = r
        return r

    def size(self, items, flags: int) -> int:
        """Number of states :meth:`seq` adds for ``items`` (exact; repetitions expand)."""
        total = 0
        for op, av in items:
            total += self.node_size(op, av, flags)
        return total

    def node_size(self, op, av, flags: int) -> int:
        k = id(av) if not isinstance(av, int) else None
        if k is not None and (k, flags) in self._sizes:
            return self._sizes[(k, flags)]
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            n = 1 + codepoint_states(self.class_ranges(op, av, flags))
        elif op is C.BRANCH:
            n = 1 + sum(1 + self.size(alt, flags) for alt in av[1])
        elif op is C.SUBPATTERN:
            n = self.size(av[3], (flags | av[1]) & ~av[2])
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, sub = av
            m = self.size(sub, flags)
            n = lo * m + (1 + m if hi is C.MAXREPEAT else 1 + (hi - lo) * m)
        else:
            n = 0                                  # anchors; unsupported ops fail later
        if k is not None:
            self._sizes[(k, flags)] = n
        return n

    def responsible(self, items, flags: int, limit: int) -> tuple[str, int]:
        """The smallest sub-pattern whose NFA alone exceeds ``limit`` states, and its size."""
        while True:
            best = max(items, key=lambda it: self.node_size(it[0], it[1], flags), default=None)
            if best is None or self.node_size(best[0], best[1], flags) <= limit:
                return unparse(items), self.size(items, flags)
            op, av = best
            if op is C.SUBPATTERN:
                items, flags = av[3], (flags | av[1]) & ~av[2]
                continue
            if op in (C.MAX_REPEAT, C.MIN_REPEAT):
                inner = av[2]
            elif op is C.BRANCH:
                inner = max(av[1], key=lambda a: self.size(a, flags))
            else:
                inner = None
            if inner is None or self.size(inner, flags) <= limit:
                return unparse([best]), self.node_size(op, av, flags)
            items = inner

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
                if self.anchor_edges is not None and av in _LINE_ANCHORS:
                    nxt = self.nfa.add_state()
                    self.anchor_edges.append((cur, nxt, _LINE_ANCHORS[av]))
                    cur = nxt
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
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            dst = nfa.add_state()
            nfa.add_codepoints(src, dst, self.class_ranges(op, av, flags))
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
    limits = current_limits()
    if len(pattern) > limits.max_pattern_length:
        raise too_large("max_pattern_length", len(pattern), "characters", "parse regex",
                        part=f"regex {_short(pattern)!r}")
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
    try:
        needed = 1 + b.size(parsed, state_flags)
    except RecursionError:
        raise RegexSyntaxError(f"regex {_short(pattern)!r} is nested too deeply") from None
    if needed > limits.max_nfa_states:
        sub, sub_size = b.responsible(parsed, state_flags, limits.max_nfa_states)
        where = f"regex {_short(pattern)!r}" if sub == unparse(parsed) else \
            f"sub-pattern {_short(sub)!r} ({sub_size:,} NFA states) of regex {_short(pattern)!r}"
        raise too_large("max_nfa_states", needed, "NFA states", "build NFA", part=where)
    end = b.seq(list(parsed), s, state_flags, top=True)
    nfa.accepting = {end}
    return nfa
