"""Native CPU kernels, built on first use through XLA's FFI (``jax.ffi``).

:func:`pgcd_scores` is P-GCD's per-step scoring at its ``K·H·V`` floor
(``pgcd_scores.cc``): XLA:CPU has no fast way to pair each token's column of ``B`` with
the ``β^P`` column of its own successor (a gather + multiply + reduce runs scalar code),
so the dense path pays ``K·D'·H·V`` instead. The kernel is C++ against the headers that
ship with jaxlib (``jax.ffi.include_dir()``), compiled once per machine with the system
C++ compiler (``$CXX``, default ``g++``; about 5 s) into the jaxcd cache
(``$JAXCD_CACHE`` or ``~/.cache/jaxcd``, folder ``kernels``), keyed by the source, the
jaxlib version, the compiler and the CPU's flags.

``JAXCD_PGCD_KERNEL`` chooses: ``auto`` (default: the kernel on CPU when it builds, else
the XLA path, with one warning saying why), ``ffi`` (the kernel or an error), ``xla``
(never the kernel). ``JAXCD_KERNEL_THREADS`` caps its threads (default: all cores).
GPU and TPU use the XLA path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

__all__ = ["KernelUnavailable", "pgcd_kernel_available", "pgcd_kernel_mode", "build_error"]

_SRC = Path(__file__).with_name("pgcd_scores.cc")
TARGET = "jaxcd_pgcd_scores"
_FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=c++17", "-pthread", "-w"]

_lock = threading.Lock()
_state: dict = {}


class KernelUnavailable(RuntimeError):
    """The native kernel was asked for (``JAXCD_PGCD_KERNEL=ffi``) but cannot be built."""


def pgcd_kernel_mode() -> str:
    mode = os.environ.get("JAXCD_PGCD_KERNEL", "auto").strip().lower() or "auto"
    if mode not in ("auto", "ffi", "xla"):
        raise ValueError(f"JAXCD_PGCD_KERNEL={mode!r}: expected 'auto', 'ffi' or 'xla'")
    return mode


def _cache_root() -> Path:
    root = os.environ.get("JAXCD_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "jaxcd") / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build() -> Path:
    import jax
    import jaxlib

    cxx = os.environ.get("CXX", "g++")
    exe = shutil.which(cxx)
    if exe is None:
        raise KernelUnavailable(f"no C++ compiler ({cxx!r} not on PATH; set $CXX)")
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as e:
        raise KernelUnavailable(f"{cxx} --version failed: {e}") from e
    src = _SRC.read_bytes()
    key = hashlib.sha256(b"\0".join([src, jaxlib.__version__.encode(), version.encode(),
                                     _cpu_flags().encode(), " ".join(_FLAGS).encode()]))
    out = _cache_root() / f"pgcd_scores-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        so = Path(tmp) / out.name
        cmd = [exe, *_FLAGS, "-I", jax.ffi.include_dir(), str(_SRC), "-o", str(so)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            raise KernelUnavailable(f"compiling {_SRC.name} failed: {e}") from e
        if r.returncode != 0:
            raise KernelUnavailable(f"compiling {_SRC.name} failed ({' '.join(cmd)}):\n"
                                    f"{r.stderr[-2000:]}")
        os.replace(so, out)            # atomic: concurrent builders leave one whole file
    return out


def _load() -> None:
    import jax

    path = _build()
    lib = ctypes.cdll.LoadLibrary(str(path))
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.JaxcdPgcdScores),
                                platform="cpu")
    _state["lib"] = lib


def build_error() -> str | None:
    """Why the kernel is unavailable (``None`` when it is loaded)."""
    pgcd_kernel_available()
    return _state.get("error")


def pgcd_kernel_available() -> bool:
    """Whether P-GCD scoring may use the native kernel: the mode allows it and the kernel
    is built and registered (built on the first call; a failure is remembered, warned
    about once under ``auto`` and raised under ``ffi``)."""
    mode = pgcd_kernel_mode()
    if mode == "xla":
        return False
    with _lock:
        if "lib" not in _state and "error" not in _state:
            try:
                _load()
            except (KernelUnavailable, OSError) as e:
                _state["error"] = str(e)
                if mode == "auto":
                    warnings.warn(f"jaxcd: P-GCD uses the XLA scoring path ({e})",
                                  RuntimeWarning, stacklevel=3)
    if "error" in _state and mode == "ffi":
        raise KernelUnavailable(_state["error"])
    return "lib" in _state
