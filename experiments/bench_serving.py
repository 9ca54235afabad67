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
   calls of 16 rows, one constraint per row (stacked automata);
3. **continuous batching, 16 rows**: the same 200 requests as ONE
   ``generate(..., batching="continuous")`` call (:mod:`jaxcd.decoding.serve`): a row
   whose output ended takes the next request, after a warm-up call of one request per
   automaton bucket.

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
        [--single K] [--modes single,static,continuous]

``--single K`` runs the one-by-one phase on a seeded sample of ``K`` requests (its
throughput is an estimate from that sample; the other phases serve all of them). Each
phase records its wall time, its process CPU time and the load average: on a shared
machine the requests per CPU-second compare more fairly than the wall clock.
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
from jaxcd.decoding.serve import insert_classes, stream_prefix_len  # noqa: E402
from jaxcd.generation import build_constraint, load_model  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "corpus"
WORKLOAD = ROOT / "tests" / "data" / "workload"
RESULTS = ROOT / "experiments" / "results"
#: the automata this benchmark measures: properties in the schema's order, the
#: specification's open objects (generation closes objects by default), and compiled
#: automata cached on disk (<jaxcd cache>/automata) so reruns time the decoding
GEN_OPTIONS = dict(property_order="schema", closed_objects=False, cache=True)


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
    ap.add_argument("--single", type=int, default=0,
                    help="one-by-one phase on a seeded sample of this many requests (0: all)")
    ap.add_argument("--modes", default="single,static,continuous",
                    help="comma-separated phases to run: single, static, continuous")
    ap.add_argument("--split-single", action="store_true",
                    help="run half of the one-by-one sample first and half after the other "
                         "phases (same load drift for both modes)")
    ap.add_argument("--out", default=str(RESULTS / "bench_serving"))
    a = ap.parse_args(argv)
    a.modes = set(a.modes.split(","))
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
            fa = build_constraint(m.vocab, cache=False, property_order="schema", closed_objects=False,
                                  **{c["kind"]: c["spec"]})
        except Exception as e:          # unsupported keyword, size limit, ...
            skipped.append({"name": c["name"], "why": f"{type(e).__name__}: {str(e)[:120]}"})
            continue
        dt = time.perf_counter() - t0
        if fa.min_budget > a.budget:
            skipped.append({"name": c["name"], "why": f"needs {fa.min_budget} > budget tokens"})
            continue
        build_constraint(m.vocab, cache=True, property_order="schema", closed_objects=False,
                         **{c["kind"]: c["spec"]})   # the disk cache
        c.update(automaton_s=dt, bucket=list(automaton_bucket(fa)), states=fa.num_states,
                 min_budget=fa.min_budget)
        reqs.append(c)
    print(f"{len(reqs)} constraints ({sum(r['kind'] == 'schema' for r in reqs)} schemas, "
          f"{sum(r['kind'] == 'regex' for r in reqs)} regexes); {len(skipped)} skipped",
          flush=True)
    N = budget_bucket(a.budget)

    def key_of(r, rows):
        return (tuple(r["bucket"]), N, prompt_bucket(len(m.encode_prompt(r["prompt"]))), rows)

    load = {}
    phases = {}

    def phase(name):
        """Wall, process CPU time and load average around a phase: on a shared machine
        the requests per CPU-second compare more fairly than the wall clock."""
        class _P:
            def __enter__(self):
                load[name + "_start"] = os.getloadavg()
                self.t, self.c = time.perf_counter(), time.process_time()
                return self

            def __exit__(self, *exc):
                phases[name] = {"wall_s": time.perf_counter() - self.t,
                                "cpu_s": time.process_time() - self.c}
                load[name + "_end"] = os.getloadavg()
        return _P()

    res_single = res_batch = res_cont = None
    seen = set()
    # 1. one by one (all requests, or a seeded sample of --single of them)
    single, pick = [], []

    def run_single(part, name):
        """One-by-one calls on ``part`` (request indices), each timed on its own."""
        with phase(name):
            for i in part:
                r = reqs[i]
                k = key_of(r, 1)
                warm = k in seen
                seen.add(k)
                c0 = compile_stats.snapshot()
                t0, p0 = time.perf_counter(), time.process_time()
                out = jaxcd.generate(r["prompt"], **{r["kind"]: r["spec"]}, method="gcd",
                                     budget=a.budget, seed=i, model=m, progress=False,
                                     **GEN_OPTIONS)
                wall, cpu = time.perf_counter() - t0, time.process_time() - p0
                d = compile_stats.snapshot() - c0
                st = out.stats
                single.append({"name": r["name"], "warm": warm, "wall_s": wall, "cpu_s": cpu,
                               "automaton_s": r["automaton_s"], "load_s": st["automaton_s"],
                               "xla_compiles": d.backend_compiles, "traces": d.traces,
                               "xla_compile_s": d.compile_s, "decode_s": st["decode_s"],
                               "setup_s": max(wall - st["decode_s"] - st["automaton_s"], 0.0),
                               "steps": st["steps"], "valid": out.valid[0]})
                if len(single) % 10 == 1:
                    print(f"  one-by-one {len(single)}/{len(pick)}: wall {wall:.2f}s, compiles "
                          f"{d.backend_compiles}", flush=True)

    if "single" in a.modes:
        pick = sorted(random.Random(a.seed + 1).sample(range(len(reqs)), a.single)) \
            if 0 < a.single < len(reqs) else list(range(len(reqs)))
        # --split-single: half of the sample before the other phases, half after (the
        # load of a shared machine drifts; both modes then see the same drift)
        first = pick[: (len(pick) + 1) // 2] if a.split_single else pick
        run_single(first, "single")
    # 2. static mixed batches    # 2. static mixed batches
    if "static" in a.modes:
        batches = []
        with phase("static"):
            for j in range(0, len(reqs), a.batch):
                part = reqs[j:j + a.batch]
                c0 = compile_stats.snapshot()
                t0 = time.perf_counter()
                outs = jaxcd.generate_batch([r["prompt"] for r in part],
                                      constraints=[{r["kind"]: r["spec"]} for r in part],
                                      method="gcd", budget=a.budget, seed=1000 + j, model=m,
                                      batch_size=a.batch, progress=False, **GEN_OPTIONS)
                wall = time.perf_counter() - t0
                d = compile_stats.snapshot() - c0
                st = outs[0].stats
                bk = (tuple(st["bucket"]), N, st["prompt_bucket"], st["batch_rows"])
                batches.append({"size": len(part), "wall_s": wall, "decode_s": st["decode_s"],
                                "xla_compiles": d.backend_compiles, "traces": d.traces,
                                "xla_compile_s": d.compile_s, "steps": st["steps"],
                                "key": list(map(str, bk)),
                                "valid": sum(o.valid[0] for o in outs), "warm": bk in seen})
                seen.add(bk)
                print(f"  batch {j // a.batch}: {len(part)} requests, wall {wall:.2f}s, "
                      f"compiles {d.backend_compiles}, valid {batches[-1]['valid']}/{len(part)}",
                      flush=True)
        ph = phases["static"]
        warm_b = [x for x in batches if x["warm"]]
        res_batch = {
            "requests": len(reqs), **ph, "requests_per_s": len(reqs) / ph["wall_s"],
            "requests_per_cpu_s": len(reqs) / ph["cpu_s"],
            "decode_requests_per_s": len(reqs) / sum(x["decode_s"] for x in batches),
            "xla_compiles": sum(x["xla_compiles"] for x in batches),
            "xla_compiles_warm": sum(x["xla_compiles"] for x in warm_b),
            "warm_batches": len(warm_b), "valid": sum(x["valid"] for x in batches),
            "steps": sum(x["steps"] for x in batches), "batches": batches,
        }

    # 3. continuous batching: one stream of all requests through `batch` rows, after a
    # warm-up call (one request per automaton bucket plus the longest prompt, so that the
    # stream's common bucket and prompt bucket are the same) that compiles its programs
    if "continuous" in a.modes:
        # serve() prefills each insert group by its insert class (after the prompts'
        # shared prefix at the rest's width, or whole at the prompt's bucket; one prefill
        # and one insert program per class): the warm-up holds a group per class of the
        # stream (computed as serve does), the longest prompt (the stream's width), one
        # request per automaton bucket, and prompts of both kinds (so that its shared
        # prefix is the stream's)
        G = max(1, a.batch // 4)
        ids_of = {id(r): m.encode_prompt(r["prompt"]) for r in reqs}
        width = prompt_bucket(max(len(x) for x in ids_of.values()))
        n0 = stream_prefix_len(list(ids_of.values()))
        cls = insert_classes([len(ids_of[id(r)]) for r in reqs], width, n0)
        # per class (narrowest first), a whole group of that class where the stream has
        # one, so that the first fill prefills it alone; the longest prompt first
        longest = max(reqs, key=lambda r: len(ids_of[id(r)]))
        warm_reqs = []
        for want in sorted(set(cls)):
            members = [r for r, c in zip(reqs, cls) if c == want]
            members.sort(key=lambda r: r is not longest)
            # too few of the class for a group: narrower ones of the same path fill it,
            # as in the stream (a wider or other-path request would change its program)
            members += [r for r, c in zip(reqs, cls) if c[0] == want[0] and c[1] < want[1]]
            warm_reqs += [r for r in members if all(r is not x for x in warm_reqs)][:G]
        firsts = {}
        for r in reqs:
            firsts.setdefault(tuple(r["bucket"]), r)
            firsts.setdefault(r["kind"], r)
        warm_reqs += [r for r in firsts.values() if all(r is not x for x in warm_reqs)]
        warm_n0 = stream_prefix_len([ids_of[id(r)] for r in warm_reqs])
        print(f"  continuous: shared prefix {n0} tokens (warm-up: {warm_n0}), insert classes "
              f"{sorted(set(cls))}, warm-up {len(warm_reqs)} requests", flush=True)
        with phase("continuous_warmup"):
            c0 = compile_stats.snapshot()
            jaxcd.generate_batch([r["prompt"] for r in warm_reqs],
                           constraints=[{r["kind"]: r["spec"]} for r in warm_reqs],
                           method="gcd", budget=a.budget, seed=3000, model=m,
                           batch_size=a.batch, progress=False, batching="continuous",
                           **GEN_OPTIONS)
            d_warm = compile_stats.snapshot() - c0
        with phase("continuous"):
            c0 = compile_stats.snapshot()
            outs = jaxcd.generate_batch([r["prompt"] for r in reqs],
                                  constraints=[{r["kind"]: r["spec"]} for r in reqs],
                                  method="gcd", budget=a.budget, seed=2000, model=m,
                                  batch_size=a.batch, progress=False, batching="continuous",
                           **GEN_OPTIONS)
            d_cont = compile_stats.snapshot() - c0
        ph, pw = phases["continuous"], phases["continuous_warmup"]
        st = outs[0].stats
        res_cont = {
            "requests": len(reqs), **ph, "warmup": {**pw, "requests": len(warm_reqs),
                                                    "xla_compiles": d_warm.backend_compiles},
            "requests_per_s": len(reqs) / ph["wall_s"],
            "requests_per_cpu_s": len(reqs) / ph["cpu_s"],
            "requests_per_s_with_warmup": len(reqs) / (ph["wall_s"] + pw["wall_s"]),
            "decode_requests_per_s": len(reqs) / st["decode_s"],
            "xla_compiles": d_cont.backend_compiles, "traces": d_cont.traces,
            "valid": sum(o.valid[0] for o in outs), "steps": st["steps"],
            "row_steps": sum(len(o.token_ids[0]) + int(o.ended[0]) for o in outs),
            "occupancy": st["occupancy"], "inserts": st["inserts"], "chunks": st["chunks"],
            "shifts": st["shifts"], "insert_s": st["insert_s"], "decode_s": st["decode_s"],
            "prefill_tokens": st.get("prefill_tokens"), "prefix_tokens": st.get("prefix_tokens"),
            "padding_rows": st.get("padding_rows"), "insert_classes": sorted(set(cls)),
            "warmup_prefix_tokens": warm_n0,
            "groups": st["buckets"],
        }
        print(f"  continuous: {len(reqs)} requests, wall {ph['wall_s']:.1f}s (+ warm-up "
              f"{pw['wall_s']:.1f}s, {d_warm.backend_compiles} compiles), compiles "
              f"{d_cont.backend_compiles}, valid {res_cont['valid']}, occupancy "
              f"{st['occupancy']:.2f}", flush=True)

    if "single" in a.modes:
        if a.split_single:
            run_single(pick[(len(pick) + 1) // 2:], "single_2")
            for k in ("wall_s", "cpu_s"):
                phases["single"][k] += phases["single_2"][k]
        warm_single = [x for x in single if x["warm"]]
        ph = phases["single"]
        ww, wc = sum(x["wall_s"] for x in warm_single), sum(x["cpu_s"] for x in warm_single)
        res_single = {
            "requests": len(pick), "sampled": len(pick) < len(reqs), **ph,
            "split": bool(a.split_single),
            # all requests, the first of each bucket with its XLA compiles
            "requests_per_s_all": len(pick) / ph["wall_s"],
            "requests_per_cpu_s_all": len(pick) / ph["cpu_s"],
            # warm requests only (the continuous mode's warm-up call is left out too)
            "requests_per_s": len(warm_single) / ww if warm_single else float("nan"),
            "requests_per_cpu_s": len(warm_single) / wc if warm_single else float("nan"),
            "decode_requests_per_s": len(pick) / sum(x["decode_s"] for x in single),
            "xla_compiles": sum(x["xla_compiles"] for x in single),
            "xla_compiles_warm": sum(x["xla_compiles"] for x in warm_single),
            "traces_warm": sum(x["traces"] for x in warm_single),
            "warm_requests": len(warm_single),
            "valid": sum(x["valid"] for x in single),
            "steps": sum(x["steps"] for x in single),
            "steps_warm": sum(x["steps"] for x in warm_single),
            "latency": {k: {"p50": pct([x[k] for x in warm_single], 50),
                            "p95": pct([x[k] for x in warm_single], 95)}
                        for k in ("wall_s", "automaton_s", "xla_compile_s", "setup_s",
                                  "decode_s")},
            "per_request": single,
        }

    buckets = sorted({tuple(r["bucket"]) for r in reqs})
    res = {
        "command": "python -m experiments.bench_serving " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "jax": jax.__version__, "device": str(jax.devices()[0])},
        "model": Path(m.path).name, "budget": a.budget, "budget_bucket": N, "batch": a.batch,
        "n": len(reqs), "skipped": skipped, "persistent_compile_cache": False,
        "load_average": load,
        "automaton_s_all": {"p50": pct([r["automaton_s"] for r in reqs], 50),
                            "p95": pct([r["automaton_s"] for r in reqs], 95)},
        "automaton_buckets": [list(b) for b in buckets],
        "one_by_one": res_single, "mixed_batches": res_batch, "continuous": res_cont,
        "total_s": time.perf_counter() - t_all,
    }
    o, b, cb = res_single, res_batch, res_cont
    for name, x in (("static", b), ("continuous", cb)):
        if o and x:
            res[f"{name}_speedup_requests_per_s"] = x["requests_per_s"] / o["requests_per_s"]
            res[f"{name}_speedup_requests_per_cpu_s"] = \
                x["requests_per_cpu_s"] / o["requests_per_cpu_s"]
    if o and cb:
        res["continuous_speedup_with_warmup"] = cb["requests_per_s_with_warmup"] / o["requests_per_s"]
        # both modes with their compiles: one by one over all its requests (the first
        # request of each bucket compiles), continuous with its warm-up call
        res["continuous_speedup_all_in"] = cb["requests_per_s_with_warmup"] / \
            o["requests_per_s_all"]

    def ld(name):
        st_, en = load.get(name + "_start"), load.get(name + "_end")
        out = f"{st_[0]:.1f}→{en[0]:.1f}" if st_ and en else "–"
        if name == "single" and load.get("single_2_start"):
            out += f", then {ld('single_2')}"
        return out

    lines = [
        "# Serving benchmark: constraints as data", "",
        f"`{res['command']}` — {res['machine']['cpu']}, {res['machine']['cores']} cores, "
        f"{res['model']}, GCD, budget {a.budget} (bucket {N}), persistent compile cache off.", "",
        f"{len(reqs)} distinct constraints ({sum(r['kind'] == 'schema' for r in reqs)} BFCL "
        f"schemas, {sum(r['kind'] == 'regex' for r in reqs)} regexes; {len(skipped)} candidates "
        f"skipped: unsupported or above the budget), **{len(buckets)} automaton buckets**: "
        + ", ".join(f"({', '.join(map(str, x))})" for x in buckets) + ".", "",
        "| mode | requests | requests/s (wall) | requests per CPU-s | XLA compiles | on warm "
        "requests | valid | steps run | 1-min load (start→end) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if o:
        lines.append(
            f"| one by one{' (seeded sample)' if o['sampled'] else ''}"
            f"{', half before and half after the other modes' if o['split'] else ''} | "
            f"{o['requests']} | {o['requests_per_s']:.3f} (warm requests) | "
            f"{o['requests_per_cpu_s']:.3f} | {o['xla_compiles']} | "
            f"{o['xla_compiles_warm']} ({o['warm_requests']} warm) | {o['valid']}/{o['requests']} "
            f"| {o['steps']} | {ld('single')} |")
    if b:
        lines.append(
            f"| static mixed batches of {a.batch} | {b['requests']} | {b['requests_per_s']:.3f} | "
            f"{b['requests_per_cpu_s']:.3f} | {b['xla_compiles']} | {b['xla_compiles_warm']} "
            f"({b['warm_batches']} warm batches) | {b['valid']}/{b['requests']} | {b['steps']} | "
            f"{ld('static')} |")
    if cb:
        lines.append(
            f"| continuous batching, {a.batch} rows | {cb['requests']} | "
            f"{cb['requests_per_s']:.3f} | {cb['requests_per_cpu_s']:.3f} | {cb['xla_compiles']} "
            f"(warm-up call: {cb['warmup']['xla_compiles']}) | {cb['xla_compiles']} (all warm) | "
            f"{cb['valid']}/{cb['requests']} | {cb['steps']} | {ld('continuous')} |")
    lines.append("")
    for name, label in (("static", "Static mixed batches"), ("continuous", "Continuous batching")):
        if f"{name}_speedup_requests_per_s" in res:
            lines.append(f"{label} / one by one: **{res[f'{name}_speedup_requests_per_s']:.2f}×** "
                         f"requests/s (wall), {res[f'{name}_speedup_requests_per_cpu_s']:.2f}× "
                         "requests per CPU-second.")
    if o and cb:
        lines += ["", f"One by one over all {o['requests']} requests (the first of each bucket "
                  f"with its XLA compiles): {o['requests_per_s_all']:.3f} requests/s; against "
                  f"continuous batching with its warm-up call: "
                  f"{res['continuous_speedup_all_in']:.2f}×."]
    if cb:
        lines += ["", f"Continuous batching: occupancy {cb['occupancy']:.2f} (share of row-steps "
                  f"that decoded a live request), {cb['inserts']} insert calls "
                  f"({cb['insert_s']:.1f} s on the host: their prefills run asynchronously and "
                  f"finish inside the next decode call; ServePolicy(sync_inserts=True) waits for them; "
                  f"{cb['prefill_tokens']} prompt tokens prefilled, "
                  f"padding included; the prompts' shared prefix of {cb['prefix_tokens']} "
                  f"tokens prefilled once; {cb['padding_rows']} padding rows), "
                  f"{cb['chunks']} decode calls, {cb['shifts']} cache "
                  f"shifts; its warm-up call ({cb['warmup']['requests']} requests, "
                  f"{cb['warmup']['wall_s']:.1f} s) counted as overhead: "
                  + (f"{res['continuous_speedup_with_warmup']:.2f}×." if o else "–")]
    if o:
        lines += ["", "Per-request latency, one by one, warm requests (seconds):", "",
                  "| part | p50 | p95 |", "|---|---|---|"]
        lines += [f"| {k} | {v['p50']:.4f} | {v['p95']:.4f} |" for k, v in o["latency"].items()]
        lines += ["", f"`automaton_s`: the constraint's cold compile (phase 0; all {len(reqs)}: "
                  f"p50 {res['automaton_s_all']['p50']:.3f}, p95 "
                  f"{res['automaton_s_all']['p95']:.3f} s); `setup_s`: everything else beyond "
                  "decode in the call (loading the cached automaton, padding, β tables, prompt "
                  "encoding); `xla_compile_s`: tracing + compiling."]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out + ".json").write_text(json.dumps(res, indent=1, default=str))
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
