"""Native CPU kernels for decoding, built on first use through XLA's FFI (``jax.ffi``).

:func:`pgcd_scores` is P-GCD's per-step scoring at its ``K·H·V`` floor
(``pgcd_scores.cc``): XLA:CPU has no fast way to pair each token's column of ``B`` with
the ``β^P`` column of its own successor (a gather + multiply + reduce runs scalar code),
so the dense path pays ``K·D'·H·V`` instead. The kernel is built and cached by
:mod:`jaxcd.native_build` (the system C++ compiler, ``$CXX``, about 5 s once per
machine).

:func:`jaxcd.decoding.pgcd.backward`'s ``kernel`` argument chooses, and the choice is
recorded in the tables (static, so part of every jit key): ``"auto"`` (default: the
kernel on CPU when it builds, else the XLA path, with one warning saying why),
``"kernel"`` (the kernel or an error), ``"xla"`` (never the kernel).
``JAXCD_KERNEL_THREADS`` (read by the kernel when it runs) caps its threads (default:
all cores). GPU and TPU use the XLA path.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ...native_build import KernelUnavailable, NativeKernel

__all__ = ["KernelUnavailable", "pgcd_kernel_available", "build_error"]

#: scoring with the token -> out-edge lookup from the nested cumulative mask rows
TARGET = "jaxcd_pgcd_scores"
#: scoring with the lookup from the per-state edge index (``PGCDTables.edge_index``)
TARGET_INDEX = "jaxcd_pgcd_scores_index"
#: building that index (``[S, V]`` int8/int16) from the cumulative mask rows
TARGET_EDGE_INDEX = "jaxcd_pgcd_edge_index"
_KERNEL = NativeKernel(Path(__file__).with_name("pgcd_scores.cc"), "JaxcdPgcdScores", TARGET,
                       "P-GCD uses the XLA scoring path")
_MORE = {TARGET_INDEX: "JaxcdPgcdScoresIndex", TARGET_EDGE_INDEX: "JaxcdPgcdEdgeIndex"}
_more_done = False
_more_lock = threading.Lock()


def build_error() -> str | None:
    """Why the kernel is unavailable (``None`` when it is loaded)."""
    pgcd_kernel_available()
    return _KERNEL.error


def pgcd_kernel_available(required: bool = False) -> bool:
    """Whether P-GCD scoring can use the native kernel (on the CPU): it is built and
    registered (built on the first call; a failure is remembered, warned about once, or
    raised as :class:`KernelUnavailable` when ``required``)."""
    global _more_done
    ok = _KERNEL.available(required=required)
    if ok and not _more_done:       # the other handlers of the same library
        import jax
        with _more_lock:
            if not _more_done:
                for target, symbol in _MORE.items():
                    jax.ffi.register_ffi_target(
                        target, jax.ffi.pycapsule(getattr(_KERNEL.lib, symbol)), platform="cpu")
                _more_done = True
    return ok
