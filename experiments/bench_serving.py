"""Serving many constraints with one set of compiled programs (issue 19's benchmark).

200 distinct constraints — BFCL function-parameter schemas (``tests/data/corpus/bfcl.json``)
and regexes (the public workload's plus real-world patterns from
``tests/data/corpus/patterns.json``), a seeded selection — are served by
:func:`jaxcd.generate` with the default model (SmolLM2-135M-Instruct), GCD, temperature 1,
one sample per request:

0. **automaton compile** of each constraint, cold and in process (``cache=False``); the
   automata are then stored in the on-disk automaton cache, so both serving modes below
   load them in milliseconds and differ only in how they decode;
1. **one by one**: each request is its own ``generate`` call (batch of 1);
2. **mixed batches of 16**: the same 200 requests as ``generate(prompts, constraints=...)``
   calls of 16 rows, one constraint per row (stacked automata).

XLA compiles are counted with ``jax.monitoring`` (:mod:`jaxcd.decoding.compile_stats`); JAX's
persistent compilation cache is **off**, so every new program is a real compile. A
request whose program key (automaton bucket, budget bucket, prompt bucket, rows) was seen
before is *warm*; the goal is 0 compiles on warm requests, so the number of buckets bounds
the number of compiles.

Reported (table + ``experiments/results/bench_serving.{json,md}``): buckets used, compiles
(all / on warm requests), per-request latency p50/p95 split into automaton compile, XLA
compile, other setup (tables, padding) and decode, decode steps actually run, and
throughput (requests/s, end to end and decode only) of the two modes on the same
requests.

Usage::

    python -m experiments.bench_serving [--n 200] [--budget 64] [--batch 16] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from machine import cpu_model  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxcd  # noqa: E402
from jaxcd.decoding import compile_stats  # noqa: E402
from jaxcd.decoding.buckets import automaton_bucket, budget_bucket, prompt_bucket  # noqa: E402
from jaxcd.generation import build_constraint, load_model  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "corpus"
WORKLOAD = ROOT / "tests" / "data" / "workload"
RESULTS = ROOT / "experiments" / "results"


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return float(np.percentile(np.asarray(xs, float), q))


def candidates(seed: int) -> list[dict]:
    """Requests in a seeded order: BFCL schemas and regexes interleaved (about 70:30)."""
    rng = random.Random(seed)
    bfcl = json.loads((CORPUS / "bfcl.json").read_text())
    rng.shuffle(bfcl)
    regexes = [(f"workload:{p.stem}", p.read_text().strip())
               for p in sorted((WORKLOAD / "regex").glob("*.regex"))]
    pats = json.loads((CORPUS / "patterns.json").read_text())
    rng.shuffle(pats)
    seen = {r for _, r in regexes}
    for p in pats:
        if p["pattern"] not in seen:
            seen.add(p["pattern"])
            regexes.append((p["source"], p["pattern"]))
    out = []
    bi, ri = iter(bfcl), iter(regexes)
    while True:
        try:
            for _ in range(7):
                e = next(bi)
                name = e["name"].split(":")[-1]
                desc = (e["schema"].get("description") or "")[:120]
                out.append({"name": e["name"], "kind": "schema", "spec": e["schema"],
                            "prompt": f"Give the JSON arguments for a call to {name}. {desc}"})
            for _ in range(3):
                src, pat = next(ri)
                out.append({"name": src, "kind": "regex", "spec": pat,
                            "prompt": f"Write a string matching the pattern {pat[:80]}"})
        except StopIteration:
            return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.bench_serving")
    ap.add_argument("--n", type=int, default=200, help="distinct constraints")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="24 constraints, batch 8")
    ap.add_argument("--out", default=str(RESULTS / "bench_serving"))
    a = ap.parse_args(argv)
    if a.quick:
        a.n, a.batch = 24, 8
    m = load_model()
    t_all = time.perf_counter()

    # 0. automaton compile, cold; keep constraints that compile and fit the budget
    reqs, skipped = [], []
    for c in candidates(a.seed):
        if len(reqs) == a.n:
            break
        t0 = time.perf_counter()
        try:
            fa = build_constraint(m.vocab, cache=False, **{c["kind"]: c["spec"]})
        except Exception as e:          # unsupported keyword, size limit, ...
            skipped.append({"name": c["name"], "why": f"{type(e).__name__}: {str(e)[:120]}"})
            continue
        dt = time.perf_counter() - t0
        if fa.min_budget > a.budget:
            skipped.append({"name": c["name"], "why": f"needs {fa.min_budget} > budget tokens"})
            continue
        build_constraint(m.vocab, cache=True, **{c["kind"]: c["spec"]})   # the disk cache
        c.update(automaton_s=dt, bucket=list(automaton_bucket(fa)), states=fa.num_states,
                 min_budget=fa.min_budget)
        reqs.append(c)
    print(f"{len(reqs)} constraints ({sum(r['kind'] == 'schema' for r in reqs)} schemas, "
          f"{sum(r['kind'] == 'regex' for r in reqs)} regexes); {len(skipped)} skipped",
          flush=True)
    N = budget_bucket(a.budget)

    def key_of(r, rows):
        return (tuple(r["bucket"]), N, prompt_bucket(len(m.encode_prompt(r["prompt"]))), rows)

    # 1. one by one
    seen, single = set(), []
    load = {"phase1_start": os.getloadavg()}      # the two phases compare fairly only at equal load
    t1 = time.perf_counter()
    for i, r in enumerate(reqs):
        k = key_of(r, 1)
        warm = k in seen
        seen.add(k)
        c0 = compile_stats.snapshot()
        t0 = time.perf_counter()
        out = jaxcd.generate(r["prompt"], **{r["kind"]: r["spec"]}, method="gcd",
                             budget=a.budget, seed=i, model=m, progress=False)
        wall = time.perf_counter() - t0
        d = compile_stats.snapshot() - c0
        s = out.stats
        single.append({"name": r["name"], "warm": warm, "wall_s": wall,
                       "automaton_s": r["automaton_s"], "load_s": s["automaton_s"],
                       "xla_compiles": d.backend_compiles, "traces": d.traces,
                       "xla_compile_s": d.compile_s, "decode_s": s["decode_s"],
                       "setup_s": max(wall - s["decode_s"] - s["automaton_s"], 0.0),
                       "steps": s["steps"], "valid": out.valid[0]})
        if i % 20 == 0:
            print(f"  one-by-one {i}/{len(reqs)}: wall {wall:.2f}s, compiles {d.backend_compiles}",
                  flush=True)
    t_single = time.perf_counter() - t1

    # 2. mixed batches
    load["phase1_end"] = load["phase2_start"] = os.getloadavg()
    batches = []
    t2 = time.perf_counter()
    for j in range(0, len(reqs), a.batch):
        part = reqs[j:j + a.batch]
        c0 = compile_stats.snapshot()
        t0 = time.perf_counter()
        outs = jaxcd.generate([r["prompt"] for r in part],
                              constraints=[{r["kind"]: r["spec"]} for r in part],
                              method="gcd", budget=a.budget, seed=1000 + j, model=m,
                              batch_size=a.batch, progress=False)
        wall = time.perf_counter() - t0
        d = compile_stats.snapshot() - c0
        s = outs[0].stats
        bk = (tuple(s["bucket"]), N, s["prompt_bucket"], s["batch_rows"])
        batches.append({"size": len(part), "wall_s": wall, "decode_s": s["decode_s"],
                        "xla_compiles": d.backend_compiles, "traces": d.traces,
                        "xla_compile_s": d.compile_s, "steps": s["steps"], "key": list(map(str, bk)),
                        "valid": sum(o.valid[0] for o in outs), "warm": bk in seen})
        seen.add(bk)
        print(f"  batch {j // a.batch}: {len(part)} requests, wall {wall:.2f}s, compiles "
              f"{d.backend_compiles}, valid {batches[-1]['valid']}/{len(part)}", flush=True)
    t_batch = time.perf_counter() - t2
    load["phase2_end"] = os.getloadavg()

    warm_single = [x for x in single if x["warm"]]
    warm_batches = [x for x in batches if x["warm"]]
    buckets = sorted({tuple(r["bucket"]) for r in reqs})
    res = {
        "command": "python -m experiments.bench_serving " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "jax": jax.__version__, "device": str(jax.devices()[0])},
        "model": Path(m.path).name, "budget": a.budget, "budget_bucket": N, "batch": a.batch,
        "n": len(reqs), "skipped": skipped, "persistent_compile_cache": False,
        "load_average": load,
        "automaton_buckets": [list(b) for b in buckets],
        "program_keys": len(seen),
        "one_by_one": {
            "wall_s": t_single, "requests_per_s": len(reqs) / t_single,
            "decode_requests_per_s": len(reqs) / sum(x["decode_s"] for x in single),
            "xla_compiles": sum(x["xla_compiles"] for x in single),
            "xla_compiles_warm": sum(x["xla_compiles"] for x in warm_single),
            "traces_warm": sum(x["traces"] for x in warm_single),
            "warm_requests": len(warm_single),
            "valid": sum(x["valid"] for x in single),
            "steps": sum(x["steps"] for x in single),
            "latency": {k: {"p50": pct([x[k] for x in warm_single], 50),
                            "p95": pct([x[k] for x in warm_single], 95)}
                        for k in ("wall_s", "automaton_s", "xla_compile_s", "setup_s", "decode_s")},
            "automaton_s_all": {"p50": pct([r["automaton_s"] for r in reqs], 50),
                                "p95": pct([r["automaton_s"] for r in reqs], 95)},
            "requests": single,
        },
        "mixed_batches": {
            "wall_s": t_batch, "requests_per_s": len(reqs) / t_batch,
            "decode_requests_per_s": len(reqs) / sum(x["decode_s"] for x in batches),
            "xla_compiles": sum(x["xla_compiles"] for x in batches),
            "xla_compiles_warm": sum(x["xla_compiles"] for x in warm_batches),
            "warm_batches": len(warm_batches),
            "valid": sum(x["valid"] for x in batches),
            "steps": sum(x["steps"] for x in batches),
            "batches": batches,
        },
        "total_s": time.perf_counter() - t_all,
    }
    o, b = res["one_by_one"], res["mixed_batches"]
    res["speedup_requests_per_s"] = b["requests_per_s"] / o["requests_per_s"]
    res["speedup_decode_requests_per_s"] = b["decode_requests_per_s"] / o["decode_requests_per_s"]
    lat = o["latency"]
    lines = [
        "# Serving benchmark: constraints as data", "",
        f"`{res['command']}` — {res['machine']['cpu']}, {res['machine']['cores']} cores, "
        f"{res['model']}, GCD, budget {a.budget} (bucket {N}), persistent compile cache off; "
        f"1-min load average at the phases' start/end: one by one "
        f"{load['phase1_start'][0]:.1f}/{load['phase1_end'][0]:.1f}, batches "
        f"{load['phase2_start'][0]:.1f}/{load['phase2_end'][0]:.1f}.", "",
        f"{len(reqs)} distinct constraints ({sum(r['kind'] == 'schema' for r in reqs)} BFCL "
        f"schemas, {sum(r['kind'] == 'regex' for r in reqs)} regexes; {len(skipped)} candidates "
        f"skipped: unsupported or above the budget), **{len(buckets)} automaton buckets**: "
        + ", ".join(f"({', '.join(map(str, x))})" for x in buckets)
        + f"; {len(seen)} program keys (automaton × budget × prompt bucket × rows).", "",
        "| mode | requests/s | decode-only requests/s | XLA compiles (all) | on warm requests | "
        "valid | steps run |", "|---|---|---|---|---|---|---|",
        f"| one by one | {o['requests_per_s']:.3f} | {o['decode_requests_per_s']:.3f} | "
        f"{o['xla_compiles']} | {o['xla_compiles_warm']} ({o['warm_requests']} warm) | "
        f"{o['valid']}/{len(reqs)} | {o['steps']} |",
        f"| mixed batches of {a.batch} | {b['requests_per_s']:.3f} | "
        f"{b['decode_requests_per_s']:.3f} | {b['xla_compiles']} | {b['xla_compiles_warm']} "
        f"({b['warm_batches']} warm) | {b['valid']}/{len(reqs)} | {b['steps']} |", "",
        f"Mixed batches / one by one: **{res['speedup_requests_per_s']:.2f}×** requests/s end to "
        f"end, {res['speedup_decode_requests_per_s']:.2f}× decode only.", "",
        "Per-request latency, one by one, warm requests (seconds):", "",
        "| part | p50 | p95 |", "|---|---|---|",
    ] + [f"| {k} | {v['p50']:.4f} | {v['p95']:.4f} |" for k, v in lat.items()] + [
        "",
        f"`automaton_s`: the constraint's cold compile (phase 0; all {len(reqs)}: p50 "
        f"{o['automaton_s_all']['p50']:.3f}, p95 {o['automaton_s_all']['p95']:.3f} s); "
        "`setup_s`: everything else beyond decode in the call (loading the cached automaton, "
        "padding, β tables, prompt encoding); `xla_compile_s`: tracing + compiling.",
    ]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out + ".json").write_text(json.dumps(res, indent=1, default=str))
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
