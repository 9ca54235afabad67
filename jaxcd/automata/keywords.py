"""Keyword constraints (CommonGen-style): the text contains every keyword, each in
any of its listed surface forms (e.g. drive/drives/drove/driving), in any order.

The automaton is the product of one "contains one of these forms" DFA per keyword
(``(?s:.*(form_1|form_2|...).*)`` over UTF-8 text), intersected with an optional
``text_pattern`` regex that bounds the text (e.g. one line, letters and punctuation).
Matching is exact and case-sensitive on the surface forms, as substrings (list
capitalised forms explicitly if sentence-initial use should count).
"""

from __future__ import annotations

import re
from typing import Sequence

from ..errors import JaxcdError
from .fsa import DFA, determinize, intersect, minimize
from .regex import regex_to_nfa


class KeywordError(JaxcdError, ValueError):
    """Bad keyword specification (empty list, empty form, wrong type)."""


def normalize_groups(keywords: Sequence[str | Sequence[str]]) -> list[list[str]]:
    if isinstance(keywords, str):
        raise KeywordError("keywords must be a list of words (or lists of surface forms), "
                           "not a single string")
    groups = []
    for i, g in enumerate(keywords):
        forms = [g] if isinstance(g, str) else list(g)
        if not forms:
            raise KeywordError(f"keyword {i} has no surface forms")
        for f in forms:
            if not isinstance(f, str) or not f:
                raise KeywordError(f"keyword {i}: every surface form must be a non-empty string, "
                                   f"got {f!r}")
        groups.append(forms)
    if not groups:
        raise KeywordError("the keyword list is empty: give at least one keyword")
    return groups


def keywords_to_dfa(keywords: Sequence[str | Sequence[str]], text_pattern: str | None = None,
                    max_states: int | None = None) -> DFA:
    groups = normalize_groups(keywords)
    dfa = None
    for forms in groups:
        alt = "|".join(re.escape(f) for f in sorted(set(forms), key=len, reverse=True))
        d = minimize(determinize(regex_to_nfa(f"(?s:.*(?:{alt}).*)")))
        dfa = d if dfa is None else intersect(dfa, d, max_states=max_states)
    if text_pattern is not None:
        dfa = intersect(dfa, minimize(determinize(regex_to_nfa(text_pattern))),
                        max_states=max_states)
    return dfa
