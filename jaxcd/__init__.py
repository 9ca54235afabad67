"""jaxcd: JAX-native globally constrained decoding.

Constraints (regex, JSON Schema, keywords, Python-style tool calls, explicit
automata) compile on the host to tensorized automata over the LM's vocabulary;
GCD/LCD masks and state updates are pure jitted JAX functions (:mod:`jaxcd.decoding.gcd`).

The package is layered: :mod:`jaxcd.automata` (host-side automata) -> :mod:`jaxcd.decoding`
(jitted decoders) -> :mod:`jaxcd.lm` (language models, loading) -> the user API here
(:func:`generate`, :func:`generate_batch`, :func:`load_model`, the ``compile_*``
functions). Importing jaxcd changes no process state; the application opts in to the
persistent compile cache (:func:`enable_compile_cache`) and XLA's faster CPU compiles
(:func:`prefer_fast_cpu_compiles`), as the ``jaxcd`` command does.
"""

from . import errors
from .api import (allowed_tokens, compile_automaton, compile_json_schema, compile_keywords,
                  compile_regex, compile_stats, compile_tool_call, walk_prefix)
from .automata.fsa import DFA, NFA
from .automata.tensorized import TensorizedAutomaton
from .decoding.buckets import bucket_automaton, stack_automata
from .errors import (AutomatonTooLargeError, BudgetTooSmallError, EmptyLanguageError, JaxcdError,
                     PrefixRejectedError, RegexSyntaxError, SchemaError, UnsupportedRegexError,
                     UnsupportedSchemaError)
from .generation import (GenerationResult, Model, Particles, SMCConfig, generate, generate_batch,
                         load_model)
from .limits import DEFAULT_LIMITS, CompileLimits
from .model_files import enable_compile_cache, prefer_fast_cpu_compiles
from .vocab import Vocabulary

__version__ = "0.1.0"

__all__ = [
    "Vocabulary", "compile_regex", "compile_json_schema", "compile_keywords",
    "compile_tool_call", "compile_automaton", "allowed_tokens", "walk_prefix", "compile_stats",
    "TensorizedAutomaton", "NFA", "DFA", "errors", "generate", "generate_batch", "SMCConfig",
    "GenerationResult", "Particles",
    "JaxcdError", "BudgetTooSmallError", "EmptyLanguageError", "PrefixRejectedError",
    "RegexSyntaxError", "SchemaError", "UnsupportedRegexError", "UnsupportedSchemaError",
    "AutomatonTooLargeError", "CompileLimits", "DEFAULT_LIMITS",
    "load_model", "Model", "stack_automata", "enable_compile_cache", "prefer_fast_cpu_compiles",
    "bucket_automaton",
]
