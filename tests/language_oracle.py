"""An independent oracle for "can this text still be completed into the language?".

The ``regex`` module's ``fullmatch(pattern, text, partial=True)`` succeeds iff ``text``
is a full match or a prefix of one: it shares no code with jaxcd's automata (nor with
any engine), so it decides who is right when masks disagree. Used by
``tests/test_engine_parity.py``.

The language is a set of Unicode strings, written as UTF-8. A token may end in the
middle of a multi-byte character: then the text is "pending" and the question is
whether *some* character starting with those bytes continues the match
(:meth:`Oracle.exists_completion`, by enumeration: affordable only for a few tokens,
so the parity test calls it only where masks disagree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import regex

def _utf8_len(lead: int) -> int:
    """Length of a UTF-8 sequence from its lead byte (0: not a lead byte)."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def split_text(data: bytes) -> tuple[str, bytes] | None:
    """``(text, pending)``: the decoded text and an incomplete (but so far valid) last
    character; ``None`` if ``data`` is not a prefix of any UTF-8 text."""
    try:
        return data.decode("utf-8"), b""
    except UnicodeDecodeError as e:
        if e.reason != "unexpected end of data":
            return None
        head, tail = data[:e.start], data[e.start:]
        return head.decode("utf-8"), tail


def completions(pending: bytes):
    """Every character whose UTF-8 encoding starts with ``pending`` (in code point order)."""
    n = _utf8_len(pending[0])
    if n == 0 or len(pending) >= n:
        return
    lo = {2: 0x80, 3: 0x800, 4: 0x10000}[n]
    hi = {2: 0x7FF, 3: 0xFFFF, 4: 0x10FFFF}[n]
    # code points sharing the prefix: fix the known bits, enumerate the rest
    free = 6 * (n - len(pending))
    # the known bits: the lead byte carries 7 - n of them, each continuation byte 6
    bits = pending[0] & (0x7F >> n)
    for b in pending[1:]:
        bits = (bits << 6) | (b & 0x3F)
    base = bits << free
    for low in range(1 << free):
        cp = base | low
        if lo <= cp <= hi and not 0xD800 <= cp <= 0xDFFF:
            ch = chr(cp)
            if ch.encode("utf-8")[:len(pending)] == pending:
                yield ch


@dataclass
class OracleMask:
    """The oracle's verdict for every token after one prefix.

    ``decided``: bool ``[V]`` — the verdict is exact (the text after the token is
    complete UTF-8, or can never become UTF-8). ``allowed``: bool ``[V]`` — the
    verdict where decided. ``pending``: ids whose text ends inside a character (decide
    them with :meth:`Oracle.token_allowed`).
    """

    decided: np.ndarray
    allowed: np.ndarray
    pending: np.ndarray


class Oracle:
    """``regex``-module oracle for one pattern over one vocabulary.

    Args:
      pattern, flags: the constraint's regular expression (full-match semantics).
      token_bytes: bytes of every token (``b""`` for special tokens).
      ordinary: bool ``[V]``, the tokens that are text (EOS and specials are not).
      eos_id: EOS is allowed iff the text so far is a full match.
    """

    def __init__(self, pattern: str, flags: int, token_bytes, ordinary: np.ndarray, eos_id: int):
        self.cp = regex.compile(pattern, flags)
        self.token_bytes = token_bytes
        self.V = len(token_bytes)
        self.eos_id = eos_id
        self.ordinary = np.asarray(ordinary, bool)
        self.calls = 0
        # Tokens that decode alone, grouped by their first one and two characters:
        # viability is prefix-closed (a prefix of a viable text is viable), so a group
        # whose common start is not viable is rejected with one call.
        groups: dict[str, dict[str, list[tuple[int, str]]]] = {}
        self.raw: list[int] = []
        for i in np.nonzero(self.ordinary)[0]:
            b = token_bytes[i]
            try:
                s = b.decode("utf-8")
            except UnicodeDecodeError:
                self.raw.append(int(i))
                continue
            groups.setdefault(s[0], {}).setdefault(s[:2], []).append((int(i), s))
        self.groups = groups

    # -- the two questions ----------------------------------------------------------
    def viable(self, text: str) -> bool:
        self.calls += 1
        return self.cp.fullmatch(text, partial=True) is not None

    def complete(self, text: str) -> bool:
        self.calls += 1
        return self.cp.fullmatch(text) is not None

    def exists_completion(self, text: str, pending: bytes) -> bool:
        """Does some character starting with ``pending`` keep ``text + char`` viable?"""
        if not self.viable(text):
            return False
        return any(self.viable(text + ch) for ch in completions(pending))

    def completion_chars(self, text: str, pending: bytes, limit: int = 8) -> list[str]:
        """A few characters starting with ``pending`` that keep ``text`` viable."""
        out = []
        for ch in completions(pending):
            if self.viable(text + ch):
                out.append(ch)
                if len(out) >= limit:
                    break
        return out

    # -- verdicts ---------------------------------------------------------------------
    def token_allowed(self, prefix: bytes, token: int) -> bool:
        """Exact verdict for one token (enumerates completions if it ends mid-character)."""
        if token == self.eos_id:
            sp = split_text(prefix)
            return sp is not None and sp[1] == b"" and self.complete(sp[0])
        if not self.ordinary[token]:
            return False
        sp = split_text(prefix + self.token_bytes[token])
        if sp is None:
            return False
        text, pending = sp
        return self.exists_completion(text, pending) if pending else self.viable(text)

    def mask(self, prefix: bytes) -> OracleMask:
        V = self.V
        decided = np.zeros(V, bool)
        allowed = np.zeros(V, bool)
        pending_ids: list[int] = []
        sp = split_text(prefix)
        if sp is None:
            decided[:] = True
            return OracleMask(decided, allowed, np.zeros(0, np.int64))
        text, pend = sp
        decided[self.eos_id] = True
        allowed[self.eos_id] = (pend == b"") and self.complete(text)
        if pend:
            todo = np.nonzero(self.ordinary)[0].tolist()
        else:
            if not self.viable(text):
                decided[self.ordinary] = True
                return OracleMask(decided, allowed, np.zeros(0, np.int64))
            todo = self.raw
            for c, sub in self.groups.items():
                if not self.viable(text + c):
                    for lst in sub.values():
                        for i, _ in lst:
                            decided[i] = True
                    continue
                for cc, lst in sub.items():
                    ok2 = cc == c or self.viable(text + cc)
                    for i, s in lst:
                        decided[i] = True
                        if ok2:
                            allowed[i] = s == cc or self.viable(text + s)
        for i in todo:
            sp2 = split_text(prefix + self.token_bytes[i])
            if sp2 is None:
                decided[i] = True
            elif sp2[1]:
                pending_ids.append(i)
            else:
                decided[i] = True
                allowed[i] = self.viable(sp2[0])
        return OracleMask(decided, allowed, np.asarray(pending_ids, np.int64))
