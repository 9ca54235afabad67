"""When the native-kernel tests may skip: only where a kernel cannot exist (no C++
compiler, or a backend other than the CPU). Where a compiler is present, a kernel that
does not build must fail the suite (``tests/test_native_kernels.py``), not turn its
tests into skips."""

from __future__ import annotations

import os
import shutil

import jax


def compiler() -> str | None:
    """The C++ compiler jaxcd.native_build would use, or None."""
    return shutil.which(os.environ.get("CXX", "g++"))


def skip_reason() -> str | None:
    """Why native-kernel tests cannot run here, or None when they must."""
    if jax.default_backend() != "cpu":
        return f"native kernels are CPU-only (backend {jax.default_backend()!r})"
    if compiler() is None:
        return f"no C++ compiler ({os.environ.get('CXX', 'g++')!r} not on PATH)"
    return None
