"""Old path of the tensorized automaton, kept importable for users.

``jaxcd/tensorize.py`` was split along its seams into :mod:`jaxcd.automata.lifting`
(:func:`lift_transitions`, :func:`tensorize`), :mod:`jaxcd.automata.tensorized` (the
:class:`TensorizedAutomaton` type, its save / load, :func:`pad_automaton`,
:func:`cache_key`) and :mod:`jaxcd.automata.bits` (:func:`pack_bits`,
:func:`unpack_bits`); this module re-exports their names. New code imports from there.
"""

from .automata.bits import pack_bits, unpack_bits
from .automata.lifting import (Lifted, _bfs_dist, _dedupe_rows, _fragment_of, _fragment_run,
                               _materialize_rows, _run_groups, _second_level, lift_transitions,
                               tensorize)
from .automata.tensorized import (_ARRAY_FIELDS, _DATA_FIELDS, _ID_FIELDS, _META_FIELDS,
                                  FORMAT_VERSION, INF_DIST, TensorizedAutomaton, cache_key,
                                  pad_automaton)

__all__ = ["TensorizedAutomaton", "Lifted", "lift_transitions", "tensorize", "pad_automaton",
           "cache_key", "pack_bits", "unpack_bits", "INF_DIST", "FORMAT_VERSION"]
