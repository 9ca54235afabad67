"""Unicode code-point ranges -> UTF-8 byte-range sequences (host side).

A character class over code points becomes a union of byte sequences
``[(lo_1, hi_1), ..., (lo_k, hi_k)]`` (each element a byte range), the same
decomposition as Rust's ``regex-syntax::utf8``. Surrogates (U+D800..U+DFFF) have no
UTF-8 encoding and are dropped.
"""

from __future__ import annotations

MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_LENGTH_LIMITS = (0x7F, 0x7FF, 0xFFFF, 0x10FFFF)


def normalize_ranges(ranges) -> list[tuple[int, int]]:
    """Sort and merge inclusive ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def complement_ranges(ranges) -> list[tuple[int, int]]:
    """Complement within [0, MAX_CODE_POINT]."""
    out, nxt = [], 0
    for lo, hi in normalize_ranges(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return out


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose union encodes exactly the code points [lo, hi]."""
    out: list[list[tuple[int, int]]] = []
    stack = [(lo, hi)]
    while stack:
        s, e = stack.pop()
        if s > e:
            continue
        # Drop surrogates.
        if s <= _SURROGATES[1] and e >= _SURROGATES[0]:
            stack.append((s, _SURROGATES[0] - 1))
            stack.append((_SURROGATES[1] + 1, e))
            continue
        # Split at encoded-length boundaries.
        split = False
        for limit in _LENGTH_LIMITS[:-1]:
            if s <= limit < e:
                stack.append((s, limit))
                stack.append((limit + 1, e))
                split = True
                break
        if split:
            continue
        n = len(_encode(s))
        # Split so that every continuation byte spans a full or aligned range.
        for i in range(1, n):
            m = (1 << (6 * i)) - 1
            if (s & ~m) != (e & ~m):
                if (s & m) != 0:
                    stack.append((s, s | m))
                    stack.append(((s | m) + 1, e))
                    split = True
                    break
                if (e & m) != m:
                    stack.append((s, (e & ~m) - 1))
                    stack.append((e & ~m, e))
                    split = True
                    break
        if split:
            continue
        a, b = _encode(s), _encode(e)
        out.append([(x, y) for x, y in zip(a, b)])
    return out
