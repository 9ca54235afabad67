"""Sample strings for checking a compiled regex against ``re.fullmatch``.

Members are generated from the pattern's structure (Python's own parse tree:
literals, classes, alternations, repetitions); near-misses are small edits of members
(a character dropped, inserted, replaced, duplicated; two swapped; a prefix). Whether a
sample is in the language is always decided by ``re.fullmatch``, never by this module:
a sampler mistake costs coverage, not correctness. Class members come from a fixed pool
of ASCII, Latin-1, Greek, Cyrillic, CJK, emoji and Unicode digits/spaces (filtered by
``re``), so classes like ``\\w`` and ``\\d`` are exercised with non-ASCII characters.
"""

from __future__ import annotations

import random
import re
import signal
import re._constants as C
import re._parser as P

POOL = ("".join(chr(c) for c in range(0x20, 0x7F)) + "\t\n\r\x0b\x0c\x00\x7f"
        + "éèüßÀÿ¡¿×÷µ" + "αβγΩω" + "жЯё" + "日本語中文字" + "٣३๓" + "\u00a0\u2003\u3000"
        + "😀🎉𝔸" + "€‰™" + "\u0300\u200b\ufeff")

_CAT = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
        C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W"}


def _class_regex(op, av) -> str:
    """A one-character regex for a parse-tree node (for filtering the pool with ``re``)."""
    if op is C.LITERAL:
        return re.escape(chr(av))
    if op is C.NOT_LITERAL:
        return "[^" + re.escape(chr(av)) + "]"
    if op is C.ANY:
        return "."
    parts = []
    for iop, iav in av:
        if iop is C.NEGATE:
            parts.append("^")
        elif iop is C.LITERAL:
            parts.append(re.escape(chr(iav)))
        elif iop is C.RANGE:
            parts.append(re.escape(chr(iav[0])) + "-" + re.escape(chr(iav[1])))
        elif iop is C.CATEGORY:
            parts.append(_CAT[iav])
    return "[" + "".join(parts) + "]"


class Sampler:
    """Members and near-misses of one pattern (``max_repeat`` caps unbounded repeats)."""

    def __init__(self, pattern: str, flags: int = 0, seed: int = 0, max_repeat: int = 4):
        self.pattern = pattern
        self.flags = flags
        self.tree = P.parse(pattern, flags)
        self.state_flags = self.tree.state.flags
        self.rng = random.Random(seed)
        self.max_repeat = max_repeat
        self._pools: dict = {}

    def _chars(self, op, av, flags) -> str:
        key = (op, av if not isinstance(av, list) else id(av), flags)
        pool = self._pools.get(key)
        if pool is None:
            cre = re.compile(_class_regex(op, av), flags & (re.ASCII | re.DOTALL | re.UNICODE))
            pool = "".join(c for c in POOL if cre.fullmatch(c))
            if not pool:                               # rare: probe random code points
                for _ in range(2000):
                    c = chr(self.rng.randrange(0x20, 0x30000))
                    if not 0xD800 <= ord(c) <= 0xDFFF and cre.fullmatch(c):
                        pool += c
                        if len(pool) >= 8:
                            break
            self._pools[key] = pool
        return pool

    def _gen(self, items, flags, out: list) -> None:
        rng = self.rng
        for op, av in items:
            if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
                pool = self._chars(op, av, flags)
                if pool:
                    out.append(rng.choice(pool))
            elif op is C.BRANCH:
                self._gen(rng.choice(av[1]), flags, out)
            elif op is C.SUBPATTERN:
                self._gen(av[3], (flags | av[1]) & ~av[2], out)
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
                lo, hi, sub = av
                hi = lo + self.max_repeat if hi is C.MAXREPEAT else hi
                # favour the bounds, where off-by-one mistakes live
                n = rng.choice([lo, hi, rng.randint(lo, hi)]) if hi > lo else lo
                for _ in range(n):
                    self._gen(sub, flags, out)

    def member(self) -> str:
        out: list[str] = []
        self._gen(self.tree, self.state_flags, out)
        return "".join(out)

    def near_miss(self, s: str) -> str:
        rng = self.rng
        c = rng.choice(POOL)
        i = rng.randrange(len(s) + 1)
        j = rng.randrange(len(s)) if s else 0
        kind = rng.randrange(6)
        if kind == 0 or not s:
            return s[:i] + c + s[i:]                   # insert
        if kind == 1:
            return s[:j] + s[j + 1:]                   # drop
        if kind == 2:
            return s[:j] + c + s[j + 1:]               # replace
        if kind == 3:
            return s[:j] + s[j] + s[j:]                # duplicate
        if kind == 4 and len(s) > 1:
            j = min(j, len(s) - 2)
            return s[:j] + s[j + 1] + s[j] + s[j + 2:]  # swap
        return s[:j]                                   # prefix

    def samples(self, n_members: int, n_misses: int) -> list[str]:
        members = [self.member() for _ in range(n_members)]
        misses = [self.near_miss(self.rng.choice(members)) for _ in range(n_misses)] \
            if members else []
        return members + misses


_INDEX: dict = {}


def _token_index(vocab):
    key = id(vocab)
    hit = _INDEX.get(key)
    if hit is None or hit[0] is not vocab:
        by_bytes: dict[bytes, int] = {}
        for i, t in enumerate(vocab.token_bytes):
            if not vocab.is_special[i] and t:
                by_bytes.setdefault(t, i)
        hit = _INDEX[key] = (vocab, by_bytes, max(len(t) for t in by_bytes))
    return hit[1], hit[2]


class OracleTimeout(Exception):
    """``re.fullmatch`` backtracked for too long (nested quantifiers): no verdict."""


def _alarm(*_):
    raise OracleTimeout


def fullmatch(pattern: str, text: str, flags: int = 0, seconds: float = 0.25) -> bool:
    """``re.fullmatch`` as the oracle, interrupted after ``seconds`` (CPython's matcher
    checks for signals; main thread only) with :class:`OracleTimeout`."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return re.fullmatch(pattern, text, flags) is not None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def tokenize_randomly(data: bytes, vocab, rng: random.Random) -> list[int]:
    """A random segmentation of ``data`` into tokens of ``vocab`` (every byte must be
    a token on its own or start one; used with vocabularies that have all 256 bytes)."""
    by_bytes, max_len = _token_index(vocab)
    out, pos = [], 0
    while pos < len(data):
        options = [by_bytes[data[pos:pos + k]] for k in range(1, max_len + 1)
                   if data[pos:pos + k] in by_bytes and pos + k <= len(data)]
        tok = rng.choice(options)
        out.append(tok)
        pos += len(vocab.token_bytes[tok])
    return out


def token_automaton_accepts(fa, token_ids) -> bool:
    """Does the tensorized automaton accept ``token_ids`` followed by EOS?"""
    s = fa.initial_state
    for t in token_ids:
        s = fa.next_state(s, int(t))
        if s == fa.dead_state:
            return False
    return fa.next_state(s, fa.eos_id) == fa.final_state
