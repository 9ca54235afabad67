"""Numeric bounds as regular expressions over JSON number text (host side).

Everything here works on the decimal text, never on floats, so bounds are exact:

- :func:`int_range_regex` — canonical integers ``-?(0|[1-9][0-9]*)`` in ``[lo, hi]``
  (either end may be ``None``); ``-0`` is accepted when ``0`` is in range (it is the
  JSON integer zero; outlines-core's integer regex accepts it too).
- :func:`decimal_range_regex` — decimals ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?`` (no
  exponent) whose exact value lies in an interval with inclusive or exclusive ends.
- :func:`multiple_of_dfa` — canonical integers divisible by ``m`` (a DFA with ``m``
  remainder states), to be intersected with a range.

Regexes use only ASCII classes (``[0-9]``) so they mean the same with or without
``re.ASCII``.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np

from .fsa import DFA, minimize

_D = "[0-9]"


def _cls(lo: int, hi: int) -> str:
    if lo > hi:
        raise AssertionError("empty digit class")
    if lo == hi:
        return str(lo)
    if lo == 0 and hi == 9:
        return _D
    return f"[{lo}-{hi}]"


def _alt(parts: list[str]) -> str | None:
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return "(?:" + "|".join(parts) + ")"


def _same_len(a: str, b: str) -> str | None:
    """Digit strings of length ``len(a) == len(b)`` between ``a`` and ``b`` inclusive
    (leading zeros allowed; the caller handles the leading digit)."""
    if a > b:
        return None
    if not a:
        return ""
    if a[0] == b[0]:
        rest = _same_len(a[1:], b[1:])
        return None if rest is None else a[0] + rest
    n = len(a) - 1
    da, db = int(a[0]), int(b[0])
    parts = []
    tail_all = _D + (f"{{{n}}}" if n > 1 else "") if n else ""
    if a[1:] == "0" * n:
        lo_full = da
    else:
        lo_full = da + 1
        parts.append(a[0] + _same_len(a[1:], "9" * n))
    if b[1:] == "9" * n:
        hi_full = db
    else:
        hi_full = db - 1
    if lo_full <= hi_full:
        parts.append(_cls(lo_full, hi_full) + tail_all)
    if b[1:] != "9" * n:
        parts.append(b[0] + _same_len("0" * n, b[1:]))
    # keep ascending order of first digits (cosmetic)
    return _alt(parts)


def _nonneg_int_range(lo: int, hi: int | None) -> str | None:
    """Canonical non-negative integers ``0|[1-9][0-9]*`` in ``[lo, hi]``."""
    if lo < 0:
        raise AssertionError
    if hi is not None and lo > hi:
        return None
    parts = []
    if lo == 0:
        parts.append("0")
        lo = 1
        if hi is not None and hi < 1:
            return _alt(parts)
    ls = str(lo)
    top = len(str(hi)) if hi is not None else len(ls)
    for n in range(len(ls), top + 1):
        a = ls if n == len(ls) else "1" + "0" * (n - 1)
        if hi is None or n < len(str(hi)):
            b = "9" * n
        else:
            b = str(hi)
        r = _same_len(a, b)
        if r is not None:
            parts.append(r)
    if hi is None:
        parts.append(f"[1-9]{_D}{{{len(ls)},}}")
    return _alt(parts)


def int_range_regex(lo: int | None, hi: int | None) -> str | None:
    """Regex of the integers in ``[lo, hi]`` (``None`` = unbounded); ``None`` if empty."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts = []
    # non-negative part
    if hi is None or hi >= 0:
        parts.append(_nonneg_int_range(max(lo, 0) if lo is not None else 0, hi))
    # negative part: -y with y in [max(-hi, 1), -lo]  (and -0 when 0 is in range)
    if lo is None or lo < 0:
        ylo = max(-hi, 1) if hi is not None else 1
        yhi = -lo if lo is not None else None
        r = _nonneg_int_range(ylo, yhi)
        zero = (hi is None or hi >= 0)
        if r is not None and zero:
            parts.append(f"-(?:0|{r})" if r != "0" else "-0")
        elif r is not None:
            parts.append(f"-{r}" if r.startswith("(") or len(r) == 1 else f"-(?:{r})")
        elif zero:
            parts.append("-0")
    elif lo == 0:
        parts.append("-0")
    return _alt(parts)


# ---------------------------------------------------------------------------------------
# decimals
# ---------------------------------------------------------------------------------------
def _frac(lo: str, hi: str | None, li: bool, hi_incl: bool) -> tuple[bool, str | None]:
    """Fraction digit strings ``t`` (``0.t`` read as a decimal, empty ``t`` = 0) with
    ``lo <= 0.t <= hi`` (strict where ``li``/``hi_incl`` is False). ``lo``/``hi`` are
    digit strings without trailing zeros; ``hi=None`` is "below 1" (no upper bound).
    Returns (empty t allowed, regex of the non-empty t or None)."""
    if lo == "" and hi is None:
        return li, (f"{_D}+" if li else f"{_D}*[1-9]{_D}*")
    if lo == "" and hi == "":
        ok = li and hi_incl
        return ok, ("0+" if ok else None)
    empty_ok = lo == "" and li          # 0 >= lo; 0 <= hi holds since hi > 0 here
    l0, lrest = (int(lo[0]), lo[1:]) if lo else (0, "")
    if hi is None:
        h0, hrest = 9, None
    else:
        h0, hrest = int(hi[0]), hi[1:]
    parts = []

    def after(sub):                      # regex of t' (possibly empty)
        e, r = sub
        if r is None:
            return "" if e else None
        return f"(?:{r})?" if e else r

    lo_eff = l0 if lo else 0
    if hi is None:
        if lo:
            t = after(_frac(lrest, None, li, True))
            if t is not None:
                parts.append(f"{l0}{t}")
            if l0 + 1 <= 9:
                parts.append(_cls(l0 + 1, 9) + f"{_D}*")
        else:
            raise AssertionError
        return empty_ok, _alt(parts)
    if lo_eff == h0:
        if lo:
            t = after(_frac(lrest, hrest, li, hi_incl))
        else:
            t = after(_frac("", hrest, li, hi_incl))
        if t is not None:
            parts.append(f"{h0}{t}")
        return empty_ok, _alt(parts)
    # lo_eff < h0
    if lo:
        t = after(_frac(lrest, None, li, True))
    else:
        t = after(_frac("", None, li, True))
    if t is not None:
        parts.append(f"{lo_eff}{t}")
    if lo_eff + 1 <= h0 - 1:
        parts.append(_cls(lo_eff + 1, h0 - 1) + f"{_D}*")
    t = after(_frac("", hrest, True, hi_incl))
    if t is not None:
        parts.append(f"{h0}{t}")
    return empty_ok, _alt(parts)


def _split(x: Decimal) -> tuple[int, str]:
    """Non-negative decimal -> (integer part, fraction digits without trailing zeros)."""
    s = format(x, "f")
    if "." in s:
        i, f = s.split(".")
    else:
        i, f = s, ""
    return int(i), f.rstrip("0")


def _frac_regex(sub: tuple[bool, str | None]) -> str | None:
    e, r = sub
    if r is None:
        return "" if e else None
    return f"(?:\\.{r})?" if e else f"\\.{r}"


def _nonneg_decimal(lo: Decimal, hi: Decimal | None, li: bool, hi_incl: bool) -> str | None:
    """Decimals ``(0|[1-9][0-9]*)(\\.[0-9]+)?`` with value in the interval (lo >= 0)."""
    if hi is not None and (lo > hi or (lo == hi and not (li and hi_incl))):
        return None
    A, fa = _split(lo)
    anyf = f"(?:\\.{_D}+)?"
    parts = []
    if hi is None:
        f = _frac_regex(_frac(fa, None, li, True))
        if f is not None:
            parts.append(_nonneg_int_range(A, A) + f)
        r = _nonneg_int_range(A + 1, None)
        parts.append(f"{r}{anyf}" if len(r) == 1 or r.startswith("(") else f"(?:{r}){anyf}")
        return _alt(parts)
    B, fb = _split(hi)
    if A == B:
        f = _frac_regex(_frac(fa, fb, li, hi_incl))
        return None if f is None else _nonneg_int_range(A, A) + f
    f = _frac_regex(_frac(fa, None, li, True))
    if f is not None:
        parts.append(_nonneg_int_range(A, A) + f)
    if A + 1 <= B - 1:
        r = _nonneg_int_range(A + 1, B - 1)
        parts.append(f"(?:{r}){anyf}")
    f = _frac_regex(_frac("", fb, True, hi_incl))
    if f is not None:
        parts.append(_nonneg_int_range(B, B) + f)
    return _alt(parts)


def decimal_range_regex(lo: Decimal | None, hi: Decimal | None,
                        lo_inclusive: bool = True, hi_inclusive: bool = True) -> str | None:
    """Decimal texts ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?`` (no exponent) whose exact value is
    in the interval; ``None`` for an unbounded end. ``None`` if the set is empty.
    ``-0``, ``-0.0`` are zero (allowed when 0 is in the interval)."""
    lo = None if lo is None else Decimal(lo)
    hi = None if hi is None else Decimal(hi)
    parts = []
    zero = Decimal(0)
    # non-negative part: [max(lo, 0), hi]
    if hi is None or hi > 0 or (hi == 0 and hi_inclusive):
        if lo is None or lo < 0:
            r = _nonneg_decimal(zero, hi, True, hi_inclusive)
        else:
            r = _nonneg_decimal(lo, hi, lo_inclusive, hi_inclusive)
        if r is not None:
            parts.append(r)
    # negative part: -y, y in [max(-hi, 0), -lo]
    if lo is None or lo < 0 or (lo == 0 and lo_inclusive):
        if hi is None or hi > 0 or (hi == 0 and hi_inclusive):
            ylo, yli = zero, True
            if lo is not None and lo == 0:
                yhi, yhi_incl = zero, True
            else:
                yhi, yhi_incl = (None if lo is None else -lo), lo_inclusive
        else:
            ylo, yli = -hi, hi_inclusive
            yhi, yhi_incl = (None if lo is None else -lo), lo_inclusive
        r = _nonneg_decimal(ylo, yhi, yli, yhi_incl)
        if r is not None:
            parts.append(f"-(?:{r})")
    return _alt(parts)


def to_decimal(x) -> Decimal:
    """A JSON number (int/float as parsed by ``json``) as the decimal the user wrote."""
    if isinstance(x, bool):
        raise TypeError("boolean is not a number")
    if isinstance(x, int):
        return Decimal(x)
    if isinstance(x, float):
        return Decimal(repr(x))
    if isinstance(x, Decimal):
        return x
    raise TypeError(f"not a number: {x!r}")


def ceil_int(x: Decimal, exclusive: bool) -> int:
    """Smallest integer ``>= x`` (``> x`` if exclusive)."""
    f = Fraction(x)
    c = -((-f.numerator) // f.denominator)
    if exclusive and c == f:
        c += 1
    return int(c)


def floor_int(x: Decimal, exclusive: bool) -> int:
    f = Fraction(x)
    c = f.numerator // f.denominator
    if exclusive and c == f:
        c -= 1
    return int(c)


def multiple_of_dfa(m: int) -> DFA:
    """Canonical integer text ``-?(0|[1-9][0-9]*)`` whose value is divisible by ``m``."""
    m = abs(int(m))
    if m < 1:
        raise ValueError("multipleOf must be positive")
    # states: 0 start, 1 after '-', 2 after a leading '0' (accept), 3 + r remainder r
    Q = 3 + m
    byte_class = np.zeros(256, np.int32)       # class 0: other bytes
    byte_class[ord("-")] = 1
    for d in range(10):
        byte_class[ord("0") + d] = 2 + d
    trans = np.full((Q, 12), -1, np.int32)
    trans[0, 1] = 1
    for s in (0, 1):
        trans[s, 2] = 2
        for d in range(1, 10):
            trans[s, 2 + d] = 3 + d % m
    for r in range(m):
        for d in range(10):
            trans[3 + r, 2 + d] = 3 + (10 * r + d) % m
    acc = np.zeros(Q, bool)
    acc[2] = True
    acc[3] = True
    return minimize(DFA(trans, acc, byte_class))


#: Largest ``M * (k + 2)`` of :func:`decimal_multiple_of_dfa` (its state count).
MAX_DECIMAL_MULTIPLE_STATES = 100_000


def decimal_multiple_of_dfa(m: int, k: int) -> DFA:
    """Canonical decimal text ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?`` whose value is a multiple
    of ``m / 10**k`` (``multipleOf: 0.25`` is ``m=25, k=2``). The state is the value in
    units of ``10**-k`` modulo ``m`` (the integer part, then each fraction digit); past
    ``k`` fraction digits only zeros can follow. Raises ``ValueError`` past
    :data:`MAX_DECIMAL_MULTIPLE_STATES` states."""
    m, k = int(m), int(k)
    if m < 1 or k < 1:
        raise ValueError("decimal_multiple_of_dfa needs m >= 1 and k >= 1 fraction digits")
    if m * (k + 2) > MAX_DECIMAL_MULTIPLE_STATES:
        raise ValueError(f"multipleOf {m}e-{k} needs {m * (k + 2)} states (the limit is "
                         f"{MAX_DECIMAL_MULTIPLE_STATES})")
    # states: 0 start, 1 after '-', 2 after a leading '0', 3 + r: integer part = r (mod m),
    # 3 + m + j*m + r: j fraction digits read (j = 0 .. k), value r (mod m)
    Q = 3 + m + (k + 1) * m
    byte_class = np.zeros(256, np.int32)       # class 0: other bytes
    byte_class[ord("-")] = 1
    byte_class[ord(".")] = 12
    for d in range(10):
        byte_class[ord("0") + d] = 2 + d
    trans = np.full((Q, 13), -1, np.int32)

    def frac(j, r):
        return 3 + m + j * m + r

    trans[0, 1] = 1
    for s in (0, 1):
        trans[s, 2] = 2
        for d in range(1, 10):
            trans[s, 2 + d] = 3 + d % m
    trans[2, 12] = frac(0, 0)
    acc = np.zeros(Q, bool)
    acc[2] = True
    for r in range(m):
        for d in range(10):
            trans[3 + r, 2 + d] = 3 + (10 * r + d) % m
        trans[3 + r, 12] = frac(0, r)
        acc[3 + r] = (r * 10 ** k) % m == 0
        for j in range(k):
            for d in range(10):
                trans[frac(j, r), 2 + d] = frac(j + 1, (10 * r + d) % m)
        trans[frac(k, r), 2] = frac(k, r)                   # trailing zeros
        for j in range(1, k + 1):
            acc[frac(j, r)] = (r * 10 ** (k - j)) % m == 0
    return minimize(DFA(trans, acc, byte_class))
