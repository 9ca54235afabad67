"""Host-side automaton toolkit (NumPy): byte NFAs/DFAs and constraint front-ends."""

from .fsa import DFA, NFA, concat, determinize, intersect, literal_dfa, minimize, trim, union
from .regex import regex_to_nfa

__all__ = ["NFA", "DFA", "determinize", "minimize", "trim", "intersect", "union", "concat",
           "literal_dfa", "regex_to_nfa"]
