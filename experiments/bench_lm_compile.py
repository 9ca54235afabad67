"""XLA compile time of the JAX Llama's prefill and decode step, and its growth with depth.

For each implementation of :mod:`jaxcd.lm.llama` (``after`` = the working tree;
``before`` = ``jaxcd/lm/llama.py`` at git revision ``--before``, default ``HEAD``, read
with ``git show`` into a temporary file and imported as a sibling module) and each model

* ``default``: the default GGUF (SmolLM2-135M-Instruct, 30 layers,
  :func:`jaxcd.lm.gguf_weights.load_gguf`),
* ``rand2`` / ``rand30``: its config with 2 / 30 layers and random weights
  (``LlamaModel(cfg, rngs=nnx.Rngs(0))``),

a FRESH child process (nothing compiled yet; the persistent compilation cache is off:
``JAXCD_COMPILE_CACHE=0`` and never enabled) loads the model, then times

* the first ``prefill`` (B=4, P=32, ``max_len``=64) and the first ``step`` (wall time
  of the call incl. tracing, lowering and compiling, ``block_until_ready``),
* the XLA compiles during each call: count and summed seconds of the
  ``/jax/core/compile/backend_compile_duration`` events
  (``jax.monitoring.register_event_duration_secs_listener``),
* the warm prefill / step time (median of ``--warm`` calls),
* for ``default`` also the decode step at B=16 (prompt 32, a 96-slot cache, a loop of
  ``--steps`` calls of the buffer-donating :func:`step_donated`; median ms/step).

Children run one at a time, ``before``/``after`` interleaved per model, ``--repeats``
rounds (medians reported). Then one more child loads BOTH implementations with the
default model and times their decode steps interleaved in the same process (``--rounds``
rounds of 6 steps each, per batch size of ``--step-batches``; median and min ms/step),
the fair comparison of decode speed on a shared machine. Usage::

    JAXCD_COMPILE_CACHE=0 .venv/bin/python experiments/bench_lm_compile.py [--repeats 2]

Writes ``experiments/results/bench_lm_compile.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["JAXCD_COMPILE_CACHE"] = "0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
B, P, MAX_LEN = 4, 32, 64
B_DEC, DEC_SLOTS = 16, 96


def _load_impl(path: str | None):
    """The llama module: the installed one, or the file ``path`` imported as a sibling
    of it (so its relative imports resolve to this tree's ``jaxcd.lm``)."""
    if not path:
        import jaxcd.lm.llama as m
        return m
    import importlib.util

    import jaxcd.lm  # noqa: F401
    spec = importlib.util.spec_from_file_location("jaxcd.lm._bench_llama_impl", path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
    return m


def child(impl: str | None, model: str, warm: int, steps: int) -> dict:
    import dataclasses

    import numpy as np
    import jax
    import jax.numpy as jnp
    from flax import nnx

    events: list[tuple[str, float]] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: events.append((name, secs)))
    llama = _load_impl(impl)

    t0 = time.perf_counter()
    if model == "default":
        from jaxcd.lm.gguf_weights import load_gguf

        cfg, pure = load_gguf(None)
        lm = llama.JaxLM(cfg)
        params = lm.params_from_pure_dict(pure)
    else:
        from jaxcd.lm.gguf_weights import read_gguf_config

        cfg = dataclasses.replace(read_gguf_config(), num_layers=int(model[len("rand"):]))
        lm = llama.JaxLM(cfg)
        params = nnx.split(llama.LlamaModel(cfg, dtype=lm.dtype, precision=lm._jax_precision(),
                                            rngs=nnx.Rngs(0)))[1]
        params = jax.tree.map(lambda x: x.astype(lm.dtype), params)
    jax.block_until_ready(params)
    load_s = time.perf_counter() - t0

    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(100, 40000, size=(B, P)).astype(np.int32))
    lens = jnp.asarray(np.array([P, P - 3, P - 10, 5], np.int32))
    tok = jnp.asarray(np.arange(B, dtype=np.int32) + 100)
    jax.block_until_ready((ids, lens, tok))

    def timed_first(fn):
        n0 = len(events)
        t = time.perf_counter()
        out = jax.block_until_ready(fn())
        wall = time.perf_counter() - t
        comp = [s for name, s in events[n0:] if name == COMPILE_EVENT]
        return out, {"wall_s": wall, "compiles": len(comp), "compile_s": sum(comp)}

    (state, lp), first_prefill = timed_first(lambda: lm.prefill(params, ids, lens, MAX_LEN))
    (state2, lp2), first_step = timed_first(lambda: lm.step(params, state, tok))

    def median_time(fn, n):
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            jax.block_until_ready(fn())
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    res = {"impl": "before" if impl else "after", "model": model,
           "num_layers": lm.config.num_layers, "load_s": load_s,
           "first_prefill": first_prefill, "first_step": first_step,
           "warm_prefill_ms": 1e3 * median_time(lambda: lm.prefill(params, ids, lens, MAX_LEN), warm),
           "warm_step_ms": 1e3 * median_time(lambda: lm.step(params, state, tok), warm),
           "k_cache_shape": list(np.shape(state["k"])) if not isinstance(state["k"], tuple)
           else [len(state["k"])] + list(state["k"][0].shape)}

    if model == "default" and steps > 0:
        ids16 = jnp.asarray(rng.integers(100, 40000, size=(B_DEC, P)).astype(np.int32))
        lens16 = jnp.full((B_DEC,), P, jnp.int32)
        st, lp = lm.prefill(params, ids16, lens16, DEC_SLOTS)
        t16 = jnp.argmax(lp, -1).astype(jnp.int32)
        st, lp = llama.step_donated(lm, params, st, t16)    # compile
        jax.block_until_ready(lp)
        ts = []
        for _ in range(steps):
            t = time.perf_counter()
            st, lp = llama.step_donated(lm, params, st, t16)
            jax.block_until_ready(lp)
            ts.append(time.perf_counter() - t)
        res["step_b16_ms"] = 1e3 * statistics.median(ts)
        res["step_b16_ms_min"] = 1e3 * min(ts)
    return res


def child_steps(before: str, batches: list[int], rounds: int) -> dict:
    """Decode step time of both implementations, interleaved in this one process."""
    import numpy as np
    import jax
    import jax.numpy as jnp

    from jaxcd.lm.gguf_weights import load_gguf

    impls = {"before": _load_impl(before), "after": _load_impl(None)}
    cfg, pure = load_gguf(None)
    lms = {}
    for name, m in impls.items():
        lm = m.JaxLM(cfg)
        lms[name] = (m, lm, lm.params_from_pure_dict(pure))
    out = {}
    for B in batches:
        rng = np.random.default_rng(0)
        ids = jnp.asarray(rng.integers(100, 40000, size=(B, P)).astype(np.int32))
        lens = jnp.full((B,), P, jnp.int32)
        states, ts = {}, {name: [] for name in lms}
        for name, (m, lm, p) in lms.items():
            st, lp = lm.prefill(p, ids, lens, DEC_SLOTS)
            tok = jnp.argmax(lp, -1).astype(jnp.int32)
            st, lp = m.step_donated(lm, p, st, tok)          # compile
            jax.block_until_ready(lp)
            states[name] = (st, tok)
        for _ in range(rounds):
            for name, (m, lm, p) in lms.items():
                st, tok = states[name]
                for _ in range(6):
                    t = time.perf_counter()
                    st, lp = m.step_donated(lm, p, st, tok)
                    jax.block_until_ready(lp)
                    ts[name].append(time.perf_counter() - t)
                states[name] = (st, tok)
        out[str(B)] = {name: {"median_ms": 1e3 * statistics.median(v), "min_ms": 1e3 * min(v),
                              "n": len(v)} for name, v in ts.items()}
    return out


def layer_forms(depths: list[int], batches: list[int], rounds: int) -> dict:
    """Prototype for the decode step's weight copy (issue 20): a stack of ``L`` blocks at
    SmolLM2-135M's matmul shapes (H=576, q/k/v/o 576x576/192/192/576, SwiGLU F=1536; the
    attention over the cache left out, it is the same in every form), one token per row,
    in three formulations:

    * ``stacked-scan``: weights stacked ``[L, ...]``, ``lax.scan`` over them as ``xs``
      (what :mod:`jaxcd.lm.llama` does; XLA:CPU copies each layer's slice before its dot);
    * ``switch-dot``: weights stored per layer (``L`` separate arrays), a ``lax.scan`` over
      the layer index, each matmul a ``lax.switch`` over ``L`` one-dot branches (the
      branch reads its operand in place: no copy; the branches are single dots, so the
      compile grows only by ``L`` tiny computations per matmul);
    * ``unrolled``: a Python loop over per-layer arrays (the pre-scan reference; compile
      grows with ``L``).

    Reports the first-call (trace + compile) time per depth and the warm ms per call,
    interleaved rounds, per batch size at depth 30."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    H, F, QD, KD = 576, 1536, 576, 192
    shapes = {"q": (H, QD), "k": (H, KD), "v": (H, KD), "o": (QD, H), "gate": (H, F),
              "up": (H, F), "down": (F, H)}

    def block(x, mm):
        h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5)
        q, k, v = mm("q", h), mm("k", h), mm("v", h)
        a = q + jnp.tile(k + v, (1, QD // KD))          # stands in for attention
        x = x + mm("o", a)
        h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5)
        return x + mm("down", jax.nn.silu(mm("gate", h)) * mm("up", h))

    def stacked_scan(x, W):
        def body(x, w):
            return block(x, lambda n, h: h @ w[n]), None
        return jax.lax.scan(body, x, W)[0]

    def switch_dot(x, Wl):
        L = len(Wl["q"])

        def mm(l):
            def f(n, h):
                return jax.lax.switch(l, [lambda h, ws, i=i: h @ ws[i] for i in range(L)],
                                      h, Wl[n])
            return f

        def body(x, l):
            return block(x, mm(l)), None
        return jax.lax.scan(body, x, jnp.arange(L, dtype=jnp.int32))[0]

    def unrolled(x, Wl):
        for i in range(len(Wl["q"])):
            x = block(x, lambda n, h, i=i: h @ Wl[n][i])
        return x

    forms = {"stacked-scan": stacked_scan, "switch-dot": switch_dot, "unrolled": unrolled}
    rng = np.random.default_rng(0)

    def weights(L):
        W = {n: jnp.asarray(rng.standard_normal((L, *sh), np.float32) * 0.03)
             for n, sh in shapes.items()}
        Wl = {n: [jnp.array(np.asarray(w[i])) for i in range(L)] for n, w in W.items()}
        return W, Wl

    out = {"compile_s": {}, "warm_ms": {}}
    keep = {}
    for L in depths:
        W, Wl = weights(L)
        x = jnp.asarray(rng.standard_normal((1, H), np.float32))
        ref = None
        for name, f in forms.items():
            jf = jax.jit(f)
            t = time.perf_counter()
            y = jf(x, W if name == "stacked-scan" else Wl).block_until_ready()
            out["compile_s"].setdefault(name, {})[L] = time.perf_counter() - t
            ref = y if ref is None else ref
            assert float(jnp.abs(y - ref).max()) < 1e-3, (name, L)
            if L == 30:
                keep[name] = (jf, W if name == "stacked-scan" else Wl)
        print("  depth", L, {n: round(v[L], 2) for n, v in out["compile_s"].items()}, flush=True)
    for B in batches:
        x = jnp.asarray(rng.standard_normal((B, H), np.float32))
        runs = {n: [] for n in keep}
        for n, (jf, w) in keep.items():
            jf(x, w).block_until_ready()
        for r in range(rounds):
            names = list(keep)[r % len(keep):] + list(keep)[:r % len(keep)]
            for n in names:
                jf, w = keep[n]
                t = time.perf_counter()
                for _ in range(4):
                    y = jf(x, w)
                y.block_until_ready()
                runs[n].append((time.perf_counter() - t) / 4 * 1000)
        out["warm_ms"][B] = {n: {"median": statistics.median(v), "min": min(v), "runs": v}
                             for n, v in runs.items()}
        print(f"  B={B}: " + ", ".join(f"{n} {statistics.median(v):.1f} ms (min {min(v):.1f})"
                                      for n, v in runs.items()), flush=True)
    return out


def run_child(impl: str | None, model: str, warm: int, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--child", "--model", model, "--warm", str(warm),
           "--steps", str(steps)] + (["--impl", impl] if impl else [])
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{model} {impl or 'after'} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="default")
    ap.add_argument("--before", default="HEAD", help="git revision of the 'before' llama.py")
    ap.add_argument("--models", default="rand2,rand30,default")
    ap.add_argument("--impls", default="before,after")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40, help="B=16 decode steps timed (default model)")
    ap.add_argument("--step-batches", default="16,1", help="batch sizes of the interleaved step timing")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of the interleaved step timing")
    ap.add_argument("--child-steps", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_lm_compile.json"))
    ap.add_argument("--layer-forms", action="store_true",
                    help="only the layer-formulation prototype (stacked scan / per-layer "
                    "switch / unrolled): compile time per depth, warm ms per batch size")
    a = ap.parse_args()
    if a.layer_forms:
        import platform
        t0 = time.time()
        load0 = os.getloadavg()
        res = layer_forms([8, 30, 60], [int(b) for b in a.step_batches.split(",")], a.rounds)
        res.update(command="python experiments/bench_lm_compile.py --layer-forms",
                   load_avg_start=load0, load_avg_end=os.getloadavg(),
                   cpus=os.cpu_count(), machine=platform.machine(),
                   date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)))
        dst = Path(a.out).with_name("bench_lm_layer_forms.json")
        dst.write_text(json.dumps(res, indent=1))
        print(f"wrote {dst}")
        return
    if a.child:
        print(json.dumps(child(a.impl, a.model, a.warm, a.steps)))
        return
    if a.child_steps:
        print(json.dumps(child_steps(a.impl, [int(b) for b in a.step_batches.split(",")], a.rounds)))
        return

    impls = a.impls.split(",")
    before_file = before_rev = None
    if "before" in impls:
        before_rev = subprocess.run(["git", "rev-parse", a.before], cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout.strip()
        src = subprocess.run(["git", "show", f"{before_rev}:jaxcd/lm/llama.py"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        before_file = Path(tempfile.mkdtemp()) / "llama_before.py"
        before_file.write_text(src)
    runs: list[dict] = []
    for r in range(a.repeats):
        for model in a.models.split(","):
            for impl in impls:
                res = run_child(str(before_file) if impl == "before" else None, model, a.warm, a.steps)
                res["repeat"] = r
                runs.append(res)
                print(f"  [{r}] {impl:6s} {model:8s} prefill {res['first_prefill']['wall_s']:6.2f}s "
                      f"step {res['first_step']['wall_s']:6.2f}s", flush=True)

    def med(xs):
        return statistics.median(xs) if xs else None

    summary = []
    for model in a.models.split(","):
        for impl in impls:
            rs = [x for x in runs if x["model"] == model and x["impl"] == impl]
            row = {"model": model, "impl": impl, "num_layers": rs[0]["num_layers"], "n": len(rs)}
            for call in ("first_prefill", "first_step"):
                for f in ("wall_s", "compile_s", "compiles"):
                    row[f"{call}_{f}"] = med([x[call][f] for x in rs])
            for f in ("warm_prefill_ms", "warm_step_ms", "step_b16_ms"):
                row[f] = med([x[f] for x in rs if f in x])
            summary.append(row)

    hdr = (f"{'model':8s} {'impl':6s} {'L':>3s} | {'prefill wall':>12s} {'compile':>8s} {'#':>3s} | "
           f"{'step wall':>9s} {'compile':>8s} {'#':>3s} | {'warm pre ms':>11s} {'warm step ms':>12s} "
           f"{'B16 step ms':>11s}")
    print(hdr)
    print("-" * len(hdr))
    for s in summary:
        b16 = f"{s['step_b16_ms']:11.1f}" if s["step_b16_ms"] is not None else f"{'':11s}"
        print(f"{s['model']:8s} {s['impl']:6s} {s['num_layers']:3d} | {s['first_prefill_wall_s']:11.2f}s "
              f"{s['first_prefill_compile_s']:7.2f}s {s['first_prefill_compiles']:3.0f} | "
              f"{s['first_step_wall_s']:8.2f}s {s['first_step_compile_s']:7.2f}s "
              f"{s['first_step_compiles']:3.0f} | {s['warm_prefill_ms']:11.1f} {s['warm_step_ms']:12.1f} {b16}")

    step_cmp = None
    if before_file is not None and "after" in impls and a.rounds > 0:
        cmd = [sys.executable, __file__, "--child-steps", "--impl", str(before_file),
               "--step-batches", a.step_batches, "--rounds", str(a.rounds)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"step comparison failed:\n{out.stderr[-4000:]}")
        step_cmp = json.loads(out.stdout.strip().splitlines()[-1])
        print("decode step, both implementations interleaved in one process (default model, "
              f"{DEC_SLOTS}-slot cache):")
        for B, r in step_cmp.items():
            b, f = r["before"], r["after"]
            print(f"  B={B:>3s}: before {b['median_ms']:7.1f} ms (min {b['min_ms']:6.1f})   after "
                  f"{f['median_ms']:7.1f} ms (min {f['min_ms']:6.1f})   after/before "
                  f"{f['median_ms'] / b['median_ms']:.2f} (min {f['min_ms'] / b['min_ms']:.2f})")

    import platform

    import jax

    out = {"what": "first-call (compile) and warm times of JaxLM prefill (B=4, P=32, max_len=64) "
                   "and step; decode step at B=16 (96-slot cache); persistent compile cache off",
           "before_rev": before_rev,
           "jax": jax.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
           "device": str(jax.devices()[0]), "summary": summary,
           "step_interleaved": step_cmp, "runs": runs}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
