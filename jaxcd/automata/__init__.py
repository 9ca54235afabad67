"""Host-side automata (NumPy): byte NFAs/DFAs, constraint front-ends, and the token-level
tensorized automaton that the device-side decoding (:mod:`jaxcd.decoding`) reads.

- :mod:`~jaxcd.automata.fsa`, :mod:`~jaxcd.automata.utf8`: byte NFAs/DFAs and their
  operations;
- front-ends: :mod:`~jaxcd.automata.regex`, :mod:`~jaxcd.automata.json_schema` (with
  :mod:`~jaxcd.automata.schema_builder`, :mod:`~jaxcd.automata.numeric`),
  :mod:`~jaxcd.automata.keywords`, :mod:`~jaxcd.automata.pycall`,
  :mod:`~jaxcd.automata.bfcl`;
- :mod:`~jaxcd.automata.lifting`: lifts a byte DFA over a vocabulary
  (:func:`~jaxcd.automata.lifting.tensorize`);
- :mod:`~jaxcd.automata.tensorized`: the resulting
  :class:`~jaxcd.automata.tensorized.TensorizedAutomaton`, its save / load and padding;
- :mod:`~jaxcd.automata.bits`: bit-packed token sets.
"""

from .fsa import DFA, NFA, concat, determinize, intersect, literal_dfa, minimize, trim, union
from .regex import regex_to_nfa

__all__ = ["NFA", "DFA", "determinize", "minimize", "trim", "intersect", "union", "concat",
           "literal_dfa", "regex_to_nfa"]
