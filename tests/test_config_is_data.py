"""Configuration is data, and importing jaxcd changes nothing global.

- The environment and ``jax.default_backend()`` are read only by host-side functions
  that set up a process (cache directories, the compile cache, XLA flags, memory limits,
  building native code) or that build an object whose fields then decide (an LM's
  platform, P-GCD tables' kernel choice): never inside a function that is traced. The
  scan is of the source (AST): every read must sit in a function of :data:`HOST_SIDE`.
- ``import jaxcd`` (in a fresh process, with the default configuration users get: no
  ``XLA_FLAGS``) leaves ``os.environ``, JAX's private compilation-cache function and the
  GC as they were; :func:`jaxcd.prefer_fast_cpu_compiles` and
  :func:`jaxcd.enable_compile_cache` change them when called.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "jaxcd"

#: ``module: {function qualname}`` allowed to read the environment or the default
#: backend. Each runs on the host, outside any trace: process setup, file locations,
#: memory limits, object construction. ``<module>`` is import time.
HOST_SIDE = {
    "jaxcd.model_files": {"cache_dir", "compile_cache_setting", "enable_compile_cache",
                          "prefer_fast_cpu_compiles", "xla_flag_supported"},
    "jaxcd.native_build": {"_cache_root", "build"},
    "jaxcd.lm.memory": {"memory_limit"},
    "jaxcd.lm.loading": {"default_dtype", "_check_load"},
    "jaxcd.lm.llama": {"JaxLM.__init__"},
    "jaxcd.decoding.pgcd": {"use_kernel"},
    "jaxcd.decoding.pgcd_pallas": {"default_path"},
    "jaxcd.api": {"<module>"},
    "jaxcd.cli": {"<module>"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _reads(tree: ast.AST):
    """``(qualname, line, what)`` of every environment / default-backend read."""
    out = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, scope + [child.name])
                continue
            what = None
            if isinstance(child, ast.Attribute):
                text = ast.unparse(child)
                if text in ("os.environ", "os.getenv", "jax.default_backend"):
                    what = text
            elif isinstance(child, ast.Name) and child.id in ("environ", "getenv",
                                                               "default_backend"):
                what = child.id
            if what:
                out.append((".".join(scope) or "<module>", child.lineno, what))
            visit(child, scope)

    visit(tree, [])
    return out


def test_scanner_finds_reads():
    src = ("import os, jax\nX = os.environ.get('A')\n"
           "def f():\n    return jax.default_backend()\n"
           "class C:\n    def g(self):\n        return os.getenv('B')\n")
    found = {(q, w) for q, _, w in _reads(ast.parse(src))}
    assert found == {("<module>", "os.environ"), ("f", "jax.default_backend"),
                     ("C.g", "os.getenv")}


def test_environment_and_backend_read_only_on_the_host_side():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        mod = _module_name(path)
        for qual, line, what in _reads(ast.parse(path.read_text())):
            if qual not in HOST_SIDE.get(mod, set()):
                bad.append(f"{path.relative_to(ROOT)}:{line} {qual}: {what}")
    assert not bad, "environment / backend read outside the host-side functions:\n" + \
        "\n".join(bad)


def test_host_side_functions_exist():
    """The allow-list names real functions (a renamed one must be re-checked)."""
    for mod, names in HOST_SIDE.items():
        path = PKG.joinpath(*mod.split(".")[1:]).with_suffix(".py")
        tree = ast.parse(path.read_text())
        quals = {"<module>"}

        def visit(node, scope):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                    quals.add(".".join(scope + [child.name]))
                    visit(child, scope + [child.name])

        visit(tree, [])
        assert names <= quals, (mod, names - quals)


_PROBE = r"""
import gc, json, os, sys
before = dict(os.environ)
from jax._src import compilation_cache as cc
get_file_cache = cc.get_file_cache
gc_on = gc.isenabled()
import jaxcd, jaxcd.generation, jaxcd.lm.llama, jaxcd.decoding.smc, jaxcd.decoding.serve
from jaxcd import compile_regex, Vocabulary
voc = Vocabulary.from_token_bytes([b"a", b"b", b"<eos>"], eos_id=2)
fa = compile_regex("(ab)+", voc)
# a GCD decode compiled and run with XLA's default flags (the configuration users get)
import jax, numpy as np
from jaxcd.decoding.decode import sample, tables_for
from jaxcd.lm import TableLM, pad_prompts
lm = TableLM.bigram(np.ones(3), np.ones((3, 3)), eos_token_id=2)
ids, lens = pad_prompts([[0]] * 8)
out = sample(jax.random.key(0), lm, lm.params, ids, lens, fa, tables_for(fa, "gcd", 7),
             budget=7, constrained=True)
texts = {bytes(voc.decode_bytes([t for t in row if t != 2])) for row in
         np.asarray(out.tokens).tolist()}
after_import = {"env_same": dict(os.environ) == before,
                "cache_fn_same": cc.get_file_cache is get_file_cache,
                "gc_same": gc.isenabled() == gc_on,
                "decoded_valid": bool(np.asarray(out.valid).all())
                and all(t in (b"ab", b"abab", b"ababab") for t in texts),
                "flags_before": os.environ.get("XLA_FLAGS", "")}
import tempfile
flag = jaxcd.prefer_fast_cpu_compiles()
d = jaxcd.enable_compile_cache(path=tempfile.mkdtemp())
print(json.dumps({**after_import, "flags": os.environ.get("XLA_FLAGS", ""),
                  "flag": flag, "cache_dir": str(d) if d else None,
                  "cache_fn_after": cc.get_file_cache is not get_file_cache}))
"""


def test_import_changes_nothing_global(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "JAXCD_XLA_EMITTERS", "JAXCD_COMPILE_CACHE")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), JAXCD_CACHE=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["env_same"] and out["cache_fn_same"] and out["gc_same"], out
    assert out["decoded_valid"] and out["flags_before"] == "", out
    # the explicit calls do what they say (the flag only where this jaxlib knows it)
    assert out["flag"] == ("--xla_cpu_use_fusion_emitters=false" in out["flags"].split())
    assert out["cache_dir"] and out["cache_fn_after"], out
