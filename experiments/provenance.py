"""What every study records about how its results were made: the command, the date
(UTC), the machine, the seeds and the git commit (issue 12: RESULTS.md cites them)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from experiments.machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]


def git_commit() -> dict:
    """``{"commit": sha, "dirty": bool}`` of the working tree (``dirty``: tracked files
    under jaxcd/, hmm_distill/ or experiments/ differ from the commit)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--",
                         "jaxcd", "hmm_distill", "experiments"))
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": sha or "unknown", "dirty": dirty}


def machine() -> dict:
    """CPU model, core count, OS, and the JAX backend with its devices."""
    out = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
           "python": platform.python_version()}
    try:
        import jax

        devs = jax.devices()
        out["jax_backend"] = jax.default_backend()
        out["jax_devices"] = [getattr(d, "device_kind", str(d)) for d in devs]
        out["jax_version"] = jax.__version__
    except Exception as e:                                # noqa: BLE001 - recorded, not fatal
        out["jax_backend"] = f"unavailable ({type(e).__name__})"
    return out


def command(module: str | None, argv) -> str:
    """The command line that reproduces a run: ``python -m MODULE ARGS``."""
    args = list(sys.argv[1:] if argv is None else argv)
    head = ["python", "-m", module] if module else ["python"] + sys.argv[:1]
    return " ".join(shlex.quote(x) for x in head + args)


def provenance(module: str | None, argv, seeds) -> dict:
    """The record a results file starts with."""
    return {"command": command(module, argv),
            "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": machine(), "seeds": list(seeds) if seeds is not None else None,
            "git": git_commit()}
