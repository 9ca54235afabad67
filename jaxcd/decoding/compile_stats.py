"""Counting JAX compiles (``jax.monitoring``): how many programs were traced and
XLA-compiled, and the seconds spent, process-wide.

:func:`snapshot` returns the running totals; the difference of two snapshots is what a
piece of code cost. ``backend_compiles`` counts XLA compiles (a program loaded from the
persistent compilation cache is not one; it counts in ``cache_hits``); ``traces`` counts
jit cache misses (every new shape or static argument traces once), so "a second
constraint in a warm bucket compiles nothing" reads ``traces == backend_compiles == 0``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import jax

_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_BACKEND = "/jax/core/compile/backend_compile_duration"
_HIT = "/jax/compilation_cache/cache_hits"

_lock = threading.Lock()
_totals = {"traces": 0, "backend_compiles": 0, "cache_hits": 0, "compile_s": 0.0,
           "trace_s": 0.0, "lower_s": 0.0, "backend_s": 0.0}
_PART = {_TRACE: "trace_s", _LOWER: "lower_s", _BACKEND: "backend_s"}


@dataclass(frozen=True)
class CompileStats:
    traces: int = 0
    backend_compiles: int = 0
    cache_hits: int = 0
    compile_s: float = 0.0        # tracing + lowering + XLA compiling
    trace_s: float = 0.0          # the three parts of compile_s
    lower_s: float = 0.0
    backend_s: float = 0.0

    def __sub__(self, other: "CompileStats") -> "CompileStats":
        return CompileStats(self.traces - other.traces,
                            self.backend_compiles - other.backend_compiles,
                            self.cache_hits - other.cache_hits,
                            self.compile_s - other.compile_s,
                            self.trace_s - other.trace_s,
                            self.lower_s - other.lower_s,
                            self.backend_s - other.backend_s)

    def as_dict(self) -> dict:
        return {"traces": self.traces, "xla_compiles": self.backend_compiles,
                "compile_cache_hits": self.cache_hits, "xla_compile_s": round(self.compile_s, 4)}


def _on_duration(event: str, duration: float, **_) -> None:
    if event in (_TRACE, _LOWER, _BACKEND):
        with _lock:
            _totals["compile_s"] += float(duration)
            _totals[_PART[event]] += float(duration)
            if event == _TRACE:
                _totals["traces"] += 1
            elif event == _BACKEND:
                _totals["backend_compiles"] += 1


def _on_event(event: str, **_) -> None:
    if event == _HIT:
        with _lock:
            _totals["cache_hits"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def snapshot() -> CompileStats:
    """The process's totals so far."""
    with _lock:
        return CompileStats(_totals["traces"], _totals["backend_compiles"],
                            _totals["cache_hits"], _totals["compile_s"], _totals["trace_s"],
                            _totals["lower_s"], _totals["backend_s"])


__all__ = ["CompileStats", "snapshot"]
