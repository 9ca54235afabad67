"""A/B of the native P-GCD scoring kernel: an earlier commit's ``pgcd_scores.cc`` (built
under other FFI target names) against this checkout's, interleaved in ONE process, with
the floor's unit (the jitted ``[K, H] @ [H, V]`` matmul) timed beside them; 16 particles
in the states of largest out-degree, as ``bench_pgcd.pgcd_components`` times them.

Usage::

    PYTHONPATH=. python experiments/ab_pgcd_kernel.py [--old-rev ab5c1a5] [--hidden 64 256 1024]
        [--schema tests/data/workload/json_schema/js_recipe.json] [--repeats 15] [--out FILE]

Prints, per H, the medians (ms) of old, new and the matmul, ``old / floor``, ``new /
floor`` (floor = 2 × the matmul: ``num`` and ``den`` are each a ``K·H·V`` product) and
``new / old``, and how far the two kernels' outputs differ.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from experiments.bench_pgcd import K, interleaved_ms, random_hmm  # noqa: E402

SRC = "jaxcd/decoding/kernels/pgcd_scores.cc"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-rev", default="ab5c1a5",
                    help="the commit whose kernel is 'old' (default: before the AVX-512 path)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--schema", default=str(ROOT / "tests/data/workload/json_schema/js_tool_call.json"))
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from jaxcd.decoding import gcd, pgcd
    from jaxcd.decoding import kernels
    from jaxcd.generation import build_constraint, load_model
    from jaxcd.native_build import build

    if not kernels.pgcd_kernel_available():
        sys.exit(f"ab_pgcd_kernel: the kernel is unavailable here: {kernels.build_error()}")
    old_src = Path(tempfile.mkdtemp()) / f"pgcd_scores_{args.old_rev}.cc"
    old_src.write_bytes(subprocess.run(["git", "show", f"{args.old_rev}:{SRC}"], cwd=ROOT,
                                       check=True, capture_output=True).stdout)
    lib = ctypes.cdll.LoadLibrary(str(build(old_src)))
    jax.ffi.register_ffi_target("jaxcd_ab_old_index",
                                jax.ffi.pycapsule(lib.JaxcdPgcdScoresIndex), platform="cpu")
    jax.ffi.register_ffi_target("jaxcd_ab_old_masks",
                                jax.ffi.pycapsule(lib.JaxcdPgcdScores), platform="cpu")

    def with_old_targets(fn):            # traced with the old kernel's targets
        def g(*a):
            saved = kernels.TARGET_INDEX, kernels.TARGET
            kernels.TARGET_INDEX, kernels.TARGET = "jaxcd_ab_old_index", "jaxcd_ab_old_masks"
            try:
                return fn(*a)
            finally:
                kernels.TARGET_INDEX, kernels.TARGET = saved
        return g

    model = load_model()
    fa = build_constraint(model.vocab, schema=Path(args.schema).read_text(),
                          whitespace_pattern="", property_order="schema")
    fa_d, V = fa.to_device(), fa.vocab_size
    budget = fa.min_budget + 16
    deg = np.diff(np.asarray(fa.out_start))
    states = np.argsort(-deg, kind="stable")[:K]
    load0 = os.getloadavg()
    out = {"old_rev": args.old_rev, "schema": Path(args.schema).name, "K": K,
           "repeats": args.repeats, "rows": {}}
    for H in args.hidden:
        hmm = random_hmm(H, V, seed=H)
        tables = jax.block_until_ready(pgcd.backward(fa, hmm, budget))
        u = jnp.asarray(np.random.default_rng(1).dirichlet(np.ones(H), size=K), jnp.float32)
        sts = pgcd.PGCDState(gcd.ConstraintState(jnp.asarray(states, jnp.int32),
                                                 jnp.full((K,), 5, jnp.int32)), u)
        full = lambda fa, t, s: pgcd.batched_scores(fa, t, s, path="kernel")  # noqa: E731
        f_new, f_old = jax.jit(full), jax.jit(with_old_targets(full))
        f_mm = jax.jit(lambda a, b: a @ b)
        new, old = f_new(fa_d, tables, sts), f_old(fa_d, tables, sts)
        diff = {}
        for nm, x, y in zip(("logpsi", "z", "lprod"), new, old):
            x, y = np.asarray(x), np.asarray(y)
            fin = np.isfinite(y)
            diff[nm] = {"same_support": bool(np.array_equal(np.isfinite(x), fin)),
                        "max_abs": float(np.max(np.abs(x[fin] - y[fin]))) if fin.any() else 0.0}
        t = interleaved_ms({"old": lambda: f_old(fa_d, tables, sts),
                            "new": lambda: f_new(fa_d, tables, sts),
                            "matmul": lambda: f_mm(u, hmm.B)}, args.repeats)
        floor = 2 * t["matmul"]
        row = {**{f"{k}_ms": v for k, v in t.items()}, "floor_ms": floor,
               "old_over_floor": t["old"] / floor, "new_over_floor": t["new"] / floor,
               "new_over_old": t["new"] / t["old"], "outputs": diff}
        out["rows"][str(H)] = row
        print(f"H={H}: old {t['old']:.2f} ms, new {t['new']:.2f} ms, floor {floor:.2f} ms: "
              f"old/floor {row['old_over_floor']:.2f}x, new/floor {row['new_over_floor']:.2f}x, "
              f"new/old {row['new_over_old']:.2f}; outputs {diff}", flush=True)
    out["load"] = [load0, os.getloadavg()]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
