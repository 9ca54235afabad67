"""jaxcd.model_files.enable_compile_cache: a second process loads the program that the
first one compiled (JAX's own cache-hit event), the switch turns it off, and
``JAXCD_COMPILE_CACHE=DIR`` / ``JAXCD_COMPILE_CACHE_MIN_S`` choose its directory and
threshold (inherited by child processes, e.g. the experiment runs the tests start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROG = r"""
import json, sys, jax, jax.numpy as jnp
from jaxcd.model_files import enable_compile_cache
events = []
jax.monitoring.register_event_listener(lambda e, **k: events.append(e))
d = enable_compile_cache(min_compile_s=0.0, path=None if sys.argv[1] == "-" else sys.argv[1])
f = jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T + 3.0)
y = f(jnp.ones((7, 5)))
print(json.dumps({"dir": None if d is None else str(d), "value": float(y[0, 0]),
                  "hits": events.count("/jax/compilation_cache/cache_hits")}))
"""


def _run(path, **env):
    out = subprocess.run([sys.executable, "-c", PROG, str(path)], capture_output=True,
                         text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items()
                                 if k != "JAXCD_COMPILE_CACHE_MIN_S"}, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_cache(tmp_path):
    """The second process finds the directory through JAXCD_COMPILE_CACHE=DIR (not
    <JAXCD_CACHE>/xla_cache), as a child of a test run does."""
    d, home = tmp_path / "cc", tmp_path / "home"
    first = _run(d, JAXCD_COMPILE_CACHE="1")
    assert first["dir"] == str(d) and first["hits"] == 0
    assert any(p.name.endswith("-cache") for p in d.iterdir())     # an entry was written
    second = _run("-", JAXCD_COMPILE_CACHE=str(d), JAXCD_CACHE=str(home))
    assert second["dir"] == str(d) and not (home / "xla_cache").exists()
    assert second["hits"] >= 1 and second["value"] == first["value"]


def test_switched_off_and_threshold(tmp_path):
    d = tmp_path / "cc"
    r = _run(d, JAXCD_COMPILE_CACHE="0")
    assert r["dir"] is None and not d.exists()
    # JAXCD_COMPILE_CACHE_MIN_S raises the write threshold over min_compile_s=0
    r = _run("-", JAXCD_COMPILE_CACHE=str(d), JAXCD_COMPILE_CACHE_MIN_S="1e9")
    assert r["dir"] == str(d) and r["hits"] == 0 and not list(d.glob("*-cache"))


def test_entry_without_access_time_is_repaired(tmp_path):
    """A process killed between JAX's two writes leaves an entry without its -atime file;
    JAX's eviction would then fail every later write. enable_compile_cache restores it,
    and new entries are written again."""
    d = tmp_path / "cc"
    _run(d, JAXCD_COMPILE_CACHE="1")
    entries = sorted(d.glob("*-cache"))
    assert entries
    for e in entries:
        e.with_name(e.name[:-len("-cache")] + "-atime").unlink()
    (d / "orphan-cache").write_bytes(b"x")                 # and a foreign entry, too
    other = PROG.replace("+ 3.0", "+ 4.0")                # a new program: needs a write
    out = subprocess.run([sys.executable, "-c", other, str(d)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "JAXCD_COMPILE_CACHE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Error writing persistent compilation cache" not in out.stderr
    assert len(list(d.glob("*-cache"))) == len(entries) + 2
    assert all(e.with_name(e.name[:-len("-cache")] + "-atime").exists() for e in d.glob("*-cache"))


def test_bad_settings_name_the_variable(tmp_path, monkeypatch):
    """A non-numeric JAXCD_COMPILE_CACHE_MIN_S, or a cache directory that cannot be
    created (here: a path below a regular file), is a ValueError naming the setting."""
    import pytest

    from jaxcd.model_files import enable_compile_cache

    monkeypatch.setenv("JAXCD_COMPILE_CACHE_MIN_S", "soon")
    with pytest.raises(ValueError, match="JAXCD_COMPILE_CACHE_MIN_S='soon'"):
        enable_compile_cache(path=tmp_path / "cc")
    monkeypatch.delenv("JAXCD_COMPILE_CACHE_MIN_S")
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setenv("JAXCD_COMPILE_CACHE", str(f / "cc"))
    with pytest.raises(ValueError, match="JAXCD_COMPILE_CACHE.*cannot be created"):
        enable_compile_cache()


def test_prefer_fast_cpu_compiles_sets_the_flag_once_and_only_before_a_backend():
    """The `jaxcd` command's XLA setting: appended to XLA_FLAGS in a fresh process, kept as
    the user wrote it, off with JAXCD_XLA_EMITTERS=default, and never changed once a
    backend exists (XLA reads its flags once)."""
    import subprocess
    import sys
    code = ("import os, jax\n"
            "from jaxcd.model_files import prefer_fast_cpu_compiles as p\n"
            "print(p(), os.environ.get('XLA_FLAGS', ''))\n")
    after = ("import os, jax\n"
             "jax.devices()\n"
             "from jaxcd.model_files import prefer_fast_cpu_compiles as p\n"
             "print(p(), os.environ.get('XLA_FLAGS', ''))\n")

    def run(src, **env):
        e = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXCD_XLA_EMITTERS")}
        e.update(env, JAX_PLATFORMS="cpu")
        return subprocess.run([sys.executable, "-c", src], env=e, capture_output=True,
                              text=True, check=True).stdout.strip()

    from jaxcd.model_files import FAST_CPU_COMPILE_FLAG, xla_flag_supported
    if xla_flag_supported(FAST_CPU_COMPILE_FLAG):
        assert run(code) == "True --xla_cpu_use_fusion_emitters=false"
        assert run(code, XLA_FLAGS="--xla_force_host_platform_device_count=2") == \
            "True --xla_force_host_platform_device_count=2 --xla_cpu_use_fusion_emitters=false"
    else:                      # a jaxlib whose XLA dropped the flag (0.11): never set
        assert run(code) == "False"
    assert run(code, XLA_FLAGS="--xla_cpu_use_fusion_emitters=true") == \
        "False --xla_cpu_use_fusion_emitters=true"
    assert run(code, JAXCD_XLA_EMITTERS="default") == "False"
    assert run(after) == "False"


def test_xla_flag_supported_tries_the_flag_in_a_child(tmp_path, monkeypatch):
    """XLA aborts a process on an unknown XLA_FLAGS entry (jaxlib 0.11 aborted on
    --xla_cpu_use_fusion_emitters, which jaxlib 0.10 knows): the probe runs the flag in a
    child, says False for a flag no XLA has, True for one every XLA has, and keeps the
    answers per jaxlib version."""
    import json

    from jaxcd.model_files import xla_flag_supported
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path))
    assert xla_flag_supported("--xla_jaxcd_no_such_flag=1") is False
    assert xla_flag_supported("--xla_force_host_platform_device_count=2") is True
    kept = json.loads((tmp_path / "xla_flags.json").read_text())
    assert sorted(v for v in kept.values()) == [False, True]
    assert all(k.endswith(("--xla_jaxcd_no_such_flag=1",
                           "--xla_force_host_platform_device_count=2")) for k in kept)
