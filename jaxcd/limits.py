"""Size limits of the host-side compiler (parse → NFA → DFA → minimal DFA → token
automaton → tables), checked *before* the memory is allocated.

Every stage does work that grows with the size of its input and output automata; the
limits bound those sizes, so a constraint whose automaton would be too large fails
fast with :class:`~jaxcd.errors.AutomatonTooLargeError` (naming the limit, its value,
the size that would be needed and the constraint part responsible) instead of taking
the machine down. Raise a limit by passing ``limits=CompileLimits(max_dfa_states=...)``
to any ``compile_*`` function. ``docs/limits.md`` lists them with what each bounds.

The limits in force are carried by a context variable, so helpers deep inside the
front-ends (regex, JSON Schema, keywords) read them without threading arguments::

    with use_limits(CompileLimits(max_dfa_states=1_000_000)):
        dfa = minimize(determinize(regex_to_nfa(pattern)))

:func:`constraint_part` names the part of a constraint being compiled (a regex, a
JSON pointer); errors raised inside it say which part was too large.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from dataclasses import dataclass

from .errors import AutomatonTooLargeError

__all__ = ["CompileLimits", "DEFAULT_LIMITS", "current_limits", "use_limits", "constraint_part",
           "current_part", "too_large"]


@dataclass(frozen=True, kw_only=True)
class CompileLimits:
    """Upper bounds on the sizes of the compiler's intermediate and final objects.

    Attributes (defaults in brackets; see ``docs/limits.md``):
      max_pattern_length: characters of one regular expression handed to the parser
        (CPython's parser takes ~3 s per million characters) [1_000_000].
      max_nfa_states: states of one byte-level NFA (counted repetitions are expanded:
        ``(x{100}){100}`` is 10,000 copies of ``x``); estimated from the parse tree
        before anything is built [1_000_000].
      max_dfa_states: states of a determinised or product DFA (checked before each new
        state is added) [200_000].
      max_subset_entries: total size of the NFA-state subsets that determinisation
        keeps (its memory: ~40 bytes each) [20_000_000].
      max_token_transitions: individual (state, token) transitions found while lifting
        the byte DFA over the vocabulary (24 bytes each; tokens handled in bulk by run
        shortcuts are not counted) [20_000_000].
      max_table_bytes: bytes of the tensorized automaton's tables (dominated by
        ``cum_masks``: ``R * ceil(vocab_size / 32) * 4`` for the ``R`` distinct
        cumulative mask rows, checked after the rows are counted and before they are
        built) [1 GiB].
    """

    max_pattern_length: int = 1_000_000
    max_nfa_states: int = 1_000_000
    max_dfa_states: int = 200_000
    max_subset_entries: int = 20_000_000
    max_token_transitions: int = 20_000_000
    max_table_bytes: int = 1 << 30

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"CompileLimits.{f.name} must be a positive integer, got {v!r}")

    def replace(self, **changes) -> "CompileLimits":
        return dataclasses.replace(self, **changes)


DEFAULT_LIMITS = CompileLimits()

_LIMITS: contextvars.ContextVar[CompileLimits] = contextvars.ContextVar(
    "jaxcd_compile_limits", default=DEFAULT_LIMITS)
_PART: contextvars.ContextVar[str] = contextvars.ContextVar("jaxcd_constraint_part", default="")


def current_limits() -> CompileLimits:
    """The limits in force (``DEFAULT_LIMITS`` outside any :func:`use_limits`)."""
    return _LIMITS.get()


@contextlib.contextmanager
def use_limits(limits: CompileLimits | None):
    """Put ``limits`` in force inside the ``with`` block (``None``: leave them as they are)."""
    if limits is None:
        yield current_limits()
        return
    if not isinstance(limits, CompileLimits):
        raise TypeError(f"limits must be a jaxcd.CompileLimits, got {type(limits).__name__}")
    token = _LIMITS.set(limits)
    try:
        yield limits
    finally:
        _LIMITS.reset(token)


def _short(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


@contextlib.contextmanager
def constraint_part(description: str):
    """Name the constraint part compiled inside the block (innermost wins in errors)."""
    token = _PART.set(_short(description, 200))
    try:
        yield
    finally:
        _PART.reset(token)


def current_part() -> str:
    return _PART.get()


def too_large(limit: str, needed: int, unit: str, stage: str, part: str | None = None,
              at_least: bool = False, value: int | None = None) -> AutomatonTooLargeError:
    """The error for ``limit`` (a :class:`CompileLimits` field) exceeded at ``stage``
    (``value``: the limit's value where the caller overrode the one in force)."""
    if value is None:
        value = getattr(current_limits(), limit)
    return AutomatonTooLargeError(limit=limit, value=value, needed=int(needed), unit=unit,
                                  stage=stage, at_least=at_least,
                                  part=part if part is not None else current_part())
