"""The compile cache across clones (issue 19): a program compiled by one copy of jaxcd is
loaded from the cache by another copy at another path, with its native kernels built in
another folder, from a copy of the cache directory at another path (JAX's default put
``<cache dir>/xla_gpu_per_fusion_autotune_cache_dir`` into every key, so a cache reached
by another path missed on every program); and the cache stays fast when its directory
holds many entries (JAX's own bounded cache scanned the whole directory under a lock on
every write, and reads that waited more than 10 s for that lock became misses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROG = r"""
import json, sys
import jax, jax.numpy as jnp
import jaxcd
from jaxcd.model_files import enable_compile_cache
from jaxcd.lm.kernels import layer_matmul, lm_kernel_available, _KERNEL
from jax._src import compilation_cache as cc
events = []
jax.monitoring.register_event_listener(lambda e, **k: events.append(e))
enable_compile_cache(min_compile_s=0.0, path=sys.argv[1])
assert lm_kernel_available()
f = jax.jit(lambda x, w, l: jnp.tanh(layer_matmul(x, w, l, use_kernel=True)) * 2.0)
x = jnp.arange(12.0).reshape(3, 4) / 7
w = jnp.arange(2 * 4 * 5.0).reshape(2, 4, 5) / 11
y = f(x, w, 1)
print(json.dumps({"pkg": jaxcd.__file__, "lib": _KERNEL.lib._name,
                  "cache_class": type(cc._cache).__name__, "value": y.tolist(),
                  "hits": events.count("/jax/compilation_cache/cache_hits"),
                  "misses": events.count("/jax/compilation_cache/cache_misses")}))
"""


def _copy_package(dst: Path) -> Path:
    shutil.copytree(ROOT / "jaxcd", dst / "jaxcd",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return dst


def _run(where: Path, cc: Path, jaxcd_cache: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAXCD_COMPILE_CACHE_MIN_S", "PYTHONPATH",
                         "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES")}
    env.update(PYTHONPATH=str(where), JAXCD_COMPILE_CACHE="1")
    if jaxcd_cache is not None:
        env["JAXCD_CACHE"] = str(jaxcd_cache)
    out = subprocess.run([sys.executable, "-c", PROG, str(cc)], cwd=where, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_another_clone_with_other_paths_hits_the_cache(tmp_path):
    """Two copies of the package at two paths; the second builds (here: copies) its
    native kernel library into another cache folder and reads a copy of the first one's
    compile cache at another path. The second process compiles nothing: every program is
    a hit on the entries the first one wrote."""
    from native import skip_reason
    if skip_reason() is not None:                   # no compiler, or not the CPU
        pytest.skip(skip_reason())
    from jaxcd.lm.kernels import build_error, lm_kernel_available
    assert lm_kernel_available(), build_error()    # with a compiler, the kernel must build
    from jaxcd.native_build import _cache_root
    a, b, cc = tmp_path / "clone_a", tmp_path / "clone_b", tmp_path / "xla_cache"
    cc2 = tmp_path / "elsewhere" / "xla_cache"
    _copy_package(a), _copy_package(b)
    other = tmp_path / "other_jaxcd_cache"
    (other / "kernels").mkdir(parents=True)
    for so in _cache_root().glob("*.so"):           # same library, another path
        shutil.copy2(so, other / "kernels" / so.name)
    first = _run(a, cc, None)
    entries = sorted(p.name for p in cc.glob("*-cache"))
    shutil.copytree(cc, cc2)
    second = _run(b, cc2, other)
    assert first["pkg"].startswith(str(a)) and second["pkg"].startswith(str(b))
    assert first["lib"] != second["lib"] and second["lib"].startswith(str(other))
    assert first["cache_class"] == second["cache_class"] == "JaxcdCompileCache"
    assert entries and first["hits"] == 0
    assert second["misses"] == 0 and second["hits"] >= 1, (first, second)
    assert sorted(p.name for p in cc2.glob("*-cache")) == entries   # nothing new written
    assert second["value"] == first["value"]


def _filled(d: Path, n: int, size: int = 100) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"jit_f-{i:064x}-cache").write_bytes(b"x" * size)
        (d / f"jit_f-{i:064x}-atime").write_bytes((1000 + i).to_bytes(8, "little"))


def test_writes_do_not_scan_a_large_directory_and_reads_take_no_lock(tmp_path, monkeypatch):
    from jaxcd import model_files
    cls = model_files._compile_cache_class()
    d = tmp_path / "cc"
    _filled(d, 2000)
    cache = cls(str(d), max_size=1 << 30)
    scans = []
    real_scandir = os.scandir
    monkeypatch.setattr(model_files.os, "scandir", lambda p: scans.append(p) or real_scandir(p))
    n = model_files.COMPILE_CACHE_RESCAN_WRITES - 1
    for i in range(n):
        cache.put(f"new-{i}", b"y" * 1000)
    assert len(scans) == 1                          # the first write's, not one per write
    # a reader does not wait for the lock (JAX's waited up to 10 s, then missed)
    import filelock
    holder = filelock.FileLock(str(d / ".lockfile"))
    holder.acquire()
    try:
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("v", cache.get("new-3")))
        t0 = time.perf_counter()
        t.start()
        t.join(5)
        assert box.get("v") == b"y" * 1000 and time.perf_counter() - t0 < 5
        assert cache.get("absent") is None
    finally:
        holder.release()
    assert not list(d.glob(".*.tmp"))               # written whole, renamed into place


def test_eviction_keeps_the_bound_and_the_recently_used(tmp_path):
    from jaxcd import model_files
    cls = model_files._compile_cache_class()
    d = tmp_path / "cc"
    _filled(d, 50, size=1000)                       # 50 kB, oldest first
    (d / f"jit_f-{7:064x}-atime").unlink()          # an entry without its stamp
    cache = cls(str(d), max_size=40_000)
    assert cache.get(f"jit_f-{0:064x}") is not None          # read now: most recent
    cache.put("new", b"z" * 1000)
    total = sum(p.stat().st_size for p in d.glob("*-cache"))
    assert total <= 40_000 * model_files.COMPILE_CACHE_LOW_WATER
    assert (d / f"jit_f-{0:064x}-cache").exists() and (d / "new-cache").exists()
    assert not (d / f"jit_f-{1:064x}-cache").exists()        # least recently used: gone
    assert not (d / f"jit_f-{1:064x}-atime").exists()
    assert (d / f"jit_f-{49:064x}-cache").exists()
