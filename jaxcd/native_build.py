"""Build and load jaxcd's native CPU kernels (XLA FFI custom calls).

Each kernel is one C++ file against the headers that ship with jaxlib
(``jax.ffi.include_dir()``), compiled on first use with the system C++ compiler
(``$CXX``, default ``g++``; a few seconds) into the jaxcd cache (``$JAXCD_CACHE`` or
``~/.cache/jaxcd``, folder ``kernels``), keyed by the source, the jaxlib version, the
compiler and the CPU's flags (and the shared header ``native_include/jaxcd_native.h``),
and registered with ``jax.ffi`` for the CPU platform.
Used by :mod:`jaxcd.decoding.kernels` (P-GCD scoring) and :mod:`jaxcd.lm.kernels`
(the LM's in-place layer matmul and decode attention).
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

FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=c++17", "-pthread", "-w"]
#: Headers shared by the kernels (``jaxcd_native.h``), on the include path.
INCLUDE = Path(__file__).with_name("native_include")


class KernelUnavailable(RuntimeError):
    """A native kernel was required but cannot be built or loaded."""


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


def build(src: Path) -> Path:
    """Compile ``src`` into a shared library in the cache (reused when it exists);
    returns its path. Raises :class:`KernelUnavailable` saying why it cannot."""
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
    code = src.read_bytes() + b"".join(h.read_bytes() for h in sorted(INCLUDE.glob("*.h")))
    key = hashlib.sha256(b"\0".join([code, jaxlib.__version__.encode(), version.encode(),
                                     _cpu_flags().encode(), " ".join(FLAGS).encode()]))
    out = _cache_root() / f"{src.stem}-{key.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        so = Path(tmp) / out.name
        cmd = [exe, *FLAGS, "-I", str(INCLUDE), "-I", jax.ffi.include_dir(), str(src), "-o",
               str(so)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            raise KernelUnavailable(f"compiling {src.name} failed: {e}") from e
        if r.returncode != 0:
            raise KernelUnavailable(f"compiling {src.name} failed ({' '.join(cmd)}):\n"
                                    f"{r.stderr[-2000:]}")
        os.replace(so, out)            # atomic: concurrent builders leave one whole file
    return out


class NativeKernel:
    """One FFI kernel: ``src`` exporting the handler ``symbol``, registered as ``target``.

    :meth:`available` builds and registers it on first call (thread-safe); a failure is
    remembered, warned about once (``RuntimeWarning`` with ``fallback`` and the reason)
    and reported by :attr:`error`; ``required=True`` raises it instead."""

    def __init__(self, src: Path, symbol: str, target: str, fallback: str):
        self.src, self.symbol, self.target, self.fallback = src, symbol, target, fallback
        self._lock = threading.Lock()
        self.lib = None
        self.error: str | None = None

    def _load(self) -> None:
        import jax

        lib = ctypes.cdll.LoadLibrary(str(build(self.src)))
        jax.ffi.register_ffi_target(self.target, jax.ffi.pycapsule(getattr(lib, self.symbol)),
                                    platform="cpu")
        self.lib = lib

    def available(self, required: bool = False, warn: bool = True) -> bool:
        with self._lock:
            if self.lib is None and self.error is None:
                try:
                    self._load()
                except (KernelUnavailable, OSError, AttributeError) as e:
                    self.error = str(e)
                    if warn and not required:
                        warnings.warn(f"jaxcd: {self.fallback} ({e})", RuntimeWarning,
                                      stacklevel=3)
        if self.error is not None and required:
            raise KernelUnavailable(self.error)
        return self.lib is not None
