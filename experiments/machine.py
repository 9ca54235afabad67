"""What the benchmark scripts record about the machine they ran on."""

from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for results files: speed ratios
    between implementations differ between CPUs."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
