"""jaxcd.model_files.enable_compile_cache: a second process loads the program that the
first one compiled (JAX's own cache-hit event), and the switch turns it off."""

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
d = enable_compile_cache(min_compile_s=0.0, path=sys.argv[1])
f = jax.jit(lambda x: jnp.sin(x) @ jnp.cos(x).T + 3.0)
y = f(jnp.ones((7, 5)))
print(json.dumps({"dir": None if d is None else str(d), "value": float(y[0, 0]),
                  "hits": events.count("/jax/compilation_cache/cache_hits")}))
"""


def _run(path, **env):
    out = subprocess.run([sys.executable, "-c", PROG, str(path)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_cache(tmp_path):
    d = tmp_path / "cc"
    first = _run(d, JAXCD_COMPILE_CACHE="1")
    assert first["dir"] == str(d) and first["hits"] == 0
    assert any(p.name.endswith("-cache") for p in d.iterdir())     # an entry was written
    second = _run(d, JAXCD_COMPILE_CACHE="1")
    assert second["hits"] >= 1 and second["value"] == first["value"]


def test_switched_off(tmp_path):
    d = tmp_path / "cc"
    r = _run(d, JAXCD_COMPILE_CACHE="0")
    assert r["dir"] is None and not d.exists()
