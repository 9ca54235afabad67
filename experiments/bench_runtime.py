"""Runtime of unconstrained decoding, LCD and GCD (the seed paper's Table 2 rows) on
this machine with SmolLM2-135M-Instruct (JAX, float32).

Setup (paper: Llama-3.1-8B on an H100, xLAM, batch 16, 100 examples, 3 seeds):

- constraint: the workload's ``js_tool_call`` JSON schema (compact JSON), budget 48
  tokens (its minimum is 30); "none" runs the same 48 steps without a mask;
- prompts: ``--prompts`` (default 20 at batch 1, 32 = two batches at batch 16) distinct
  weather tool-call requests (chat template), left-padded to one width;
- decoding: the jitted one-program :func:`jaxcd.decoding.decode.sample` (prefill + ``lax.scan``
  over the 48 steps), temperature 1, one program per (method, batch size) — LCD and
  GCD even share one compiled program (same shapes; only the β table differs);
- compilation excluded: every configuration is warmed up once; a jitted prefill-only
  call is timed too, so the decode-only cost per token can be reported;
- interleaving: for every (prompt or batch, seed) the configurations run back to back
  in a rotating order, so machine noise hits them alike.

``ms/token`` = wall time of one ``sample`` call / the steps it actually ran (the loop
stops once every row has emitted EOS, so dividing by the budget would make a method that
finishes early look cheaper; end to end, prefill included); ``decode ms/token``
subtracts the prefill time measured in the same round.
Mean ± sd across the 3 seeds (each seed: the mean over prompts); the slowdown is the
ratio of means to "none" (± sd across seeds), plus the median of per-round paired
ratios. A component breakdown (LM step, mask, sampling, automaton advance; each a
separately jitted function, timed in the same process) shows where GCD's time goes.

Usage::

    HF_HUB_OFFLINE=1 python experiments/bench_runtime.py [--quick] [--budget 48]

Writes ``experiments/results/bench_runtime.json`` and ``bench_runtime.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from machine import cpu_model  # noqa: E402

WORKLOAD = ROOT / "tests" / "data" / "workload"
RESULTS = ROOT / "experiments" / "results"
METHODS = ("none", "lcd", "gcd")

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Toronto", "Sydney", "Berlin",
          "Nairobi", "Seoul", "Madrid", "Denver", "Hanoi", "Dublin", "Quito", "Perth"]


def make_prompts(n: int) -> list[str]:
    out = []
    for i in range(n):
        city = CITIES[i % len(CITIES)]
        unit = ("celsius", "fahrenheit")[(i // len(CITIES)) % 2]
        days = 1 + (i * 3) % 7
        hourly = ", hourly" if i % 3 == 0 else ""
        out.append(f"Weather in {city} for the next {days} days, in {unit}{hourly}? Reply with "
                   "a get_weather tool call as JSON only.")
    return out


def mean_sd(xs):
    xs = list(xs)
    return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def timeit(fn, repeats: int, inner: int):
    import jax
    jax.block_until_ready(fn())
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            r = fn()
        jax.block_until_ready(r)
        best.append((time.perf_counter() - t0) / inner * 1e3)
    return float(np.median(best))


def per_step(times, steps, prefill: float = 0.0) -> float:
    """Mean over calls of (call time - prefill) / steps actually run."""
    return statistics.fmean([(t - prefill) / max(n, 1) for t, n in zip(times, steps)])


def components(model, fa, tables, ids, lens, budget):
    """ms per call of each per-step piece at this batch size (jitted separately)."""
    import jax
    import jax.numpy as jnp

    from jaxcd.decoding import gcd
    from jaxcd.decoding.decode import _init_cs, _lm_step_donated, _select, masked_logits

    lm, params = model.lm, model.params
    B = ids.shape[0]
    state, logp = lm.prefill(params, ids, lens, ids.shape[1] + budget)
    box = [state]
    tok = jnp.full((B,), 90, jnp.int32)

    def lm_step():
        box[0], lp = _lm_step_donated(lm, params, box[0], tok)
        return lp

    cs = _init_cs(fa, B, True)
    key = jax.random.PRNGKey(0)
    done, total = jnp.zeros(B, bool), (jnp.zeros(B, jnp.float32), jnp.zeros(B, jnp.float32))
    f_mask = jax.jit(masked_logits)
    from jaxcd.decoding.sampling import categorical
    f_cat = jax.jit(categorical)
    f_adv = jax.jit(jax.vmap(gcd.advance, in_axes=(None, 0, 0)))
    f_sel = {c: jax.jit(lambda k, l, f, t, s, d, tt, c=c: _select(
        k, l, f, t, s, d, tt, 1.0, lm.eos_token_id, constrained=c, greedy=False))
        for c in (False, True)}
    inner = 20 if B == 1 else 4
    res = {
        "lm_step": timeit(lm_step, 3, max(2, inner // 4)),
        "mask (packed words -> -inf)": timeit(lambda: f_mask(fa, tables, cs, logp), 5, inner * 5),
        "categorical sample": timeit(lambda: f_cat(key, logp), 5, inner),
        "advance (vmapped)": timeit(lambda: f_adv(fa, cs, tok), 5, inner * 5),
        "select, unconstrained": timeit(lambda: f_sel[False](key, logp, fa, tables, cs, done,
                                                             total), 5, inner),
        "select, GCD": timeit(lambda: f_sel[True](key, logp, fa, tables, cs, done, total), 5,
                              inner),
    }
    return {k: round(v, 4) for k, v in res.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=48)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--prompts1", type=int, default=20, help="prompts at batch 1")
    ap.add_argument("--prompts16", type=int, default=32, help="prompts at batch 16 (x16)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--quick", action="store_true", help="4 prompts at batch 1, one batch of "
                    "16, 1 seed (smoke test; numbers are not meaningful)")
    ap.add_argument("--no-components", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "bench_runtime"))
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.prompts1, args.prompts16 = 1, 4, 16

    import jax
    import jax.numpy as jnp

    from jaxcd.decoding.decode import sample, tables_for
    from jaxcd.generation import build_constraint, load_model
    from jaxcd.lm.interface import pad_prompts

    t_start = time.perf_counter()
    load_start = os.getloadavg()
    model = load_model()
    lm, params = model.lm, model.params
    schema = (WORKLOAD / "json_schema" / "js_tool_call.json").read_text()
    fa = build_constraint(model.vocab, closed_objects=False, schema=schema, whitespace_pattern="",
                          property_order="schema").to_device()
    budget = args.budget
    tables = {m: tables_for(fa, m, budget) if m != "none" else None for m in METHODS}
    texts = make_prompts(max(args.prompts1, args.prompts16))
    enc = [model.encode_prompt(t) for t in texts]
    P = max(len(e) for e in enc)
    pad = getattr(lm, "pad_token_id", 0)
    print(f"{lm!r}; constraint js_tool_call (min budget {fa.min_budget}, {fa.num_states} "
          f"states); budget {budget}; prompt width {P}; backend {jax.default_backend()}, "
          f"{os.cpu_count()} cpus", flush=True)

    prefill_jit = jax.jit(lambda p, i, l: lm.prefill(p, i, l, P + budget)[1])

    def run(method, ids, lens, key):
        c = method != "none"
        out = sample(key, lm, params, ids, lens, fa if c else None, tables[method],
                     max_steps=budget, constrained=c, temperature=1.0)
        return out

    results = {"setup": {}, "batches": {}}
    for B in args.batches:
        n_prompts = args.prompts1 if B == 1 else args.prompts16
        groups = []
        for g in range(max(1, n_prompts // B)):
            sel = [enc[(g * B + j) % len(enc)] for j in range(B)]
            groups.append(pad_prompts(sel, pad_id=pad, length=P))
        # warm-up (compilation) of every configuration, excluded from the timings
        compile_s = {}
        ids0, lens0 = (jnp.asarray(a) for a in groups[0])
        for m in METHODS:
            t0 = time.perf_counter()
            jax.block_until_ready(run(m, ids0, lens0, jax.random.PRNGKey(0)).tokens)
            compile_s[m] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        jax.block_until_ready(prefill_jit(params, ids0, lens0))
        compile_s["prefill"] = round(time.perf_counter() - t0, 2)
        print(f"batch {B}: warm-up (compile + 1 run) s: {compile_s}", flush=True)

        times = {m: [[] for _ in range(args.seeds)] for m in METHODS}
        steps = {m: [[] for _ in range(args.seeds)] for m in METHODS}   # steps run per call
        prefill = [[] for _ in range(args.seeds)]
        valid = {m: 0 for m in METHODS if m != "none"}
        ended = {m: 0 for m in METHODS}
        rnd = 0
        for seed in range(args.seeds):
            for gi, (ids, lens) in enumerate(groups):
                ids, lens = jnp.asarray(ids), jnp.asarray(lens)
                key = jax.random.PRNGKey(1000 * seed + gi)
                order = list(METHODS[rnd % 3:] + METHODS[:rnd % 3]) + ["prefill"]
                order = order[rnd % 4:] + order[:rnd % 4]
                rnd += 1
                for m in order:
                    t0 = time.perf_counter()
                    if m == "prefill":
                        jax.block_until_ready(prefill_jit(params, ids, lens))
                        prefill[seed].append(time.perf_counter() - t0)
                        continue
                    out = run(m, ids, lens, key)
                    jax.block_until_ready(out.tokens)
                    times[m][seed].append(time.perf_counter() - t0)
                    steps[m][seed].append(int(out.steps))
                    ended[m] += int(np.asarray(out.ended).sum())
                    if m != "none":
                        valid[m] += int(np.asarray(out.valid).sum())
            print(f"batch {B} seed {seed}: " + ", ".join(
                f"{m} {1e3 * per_step(times[m][seed], steps[m][seed]):.2f}" for m in METHODS)
                + f" ms/token; prefill {1e3 * statistics.fmean(prefill[seed]):.1f} ms", flush=True)

        n_runs = args.seeds * len(groups)
        rows = {}
        for m in METHODS:
            # per step actually run (the decoders stop once every row has emitted EOS)
            per_seed = [1e3 * per_step(t, n) for t, n in zip(times[m], steps[m])]
            dec_seed = [1e3 * per_step(t, n, statistics.fmean(p))
                        for t, n, p in zip(times[m], steps[m], prefill)]
            base = [1e3 * per_step(t, n) for t, n in zip(times["none"], steps["none"])]
            base_dec = [1e3 * per_step(t, n, statistics.fmean(p))
                        for t, n, p in zip(times["none"], steps["none"], prefill)]
            paired = [(a / na) / (b / nb) for s in range(args.seeds)
                      for a, na, b, nb in zip(times[m][s], steps[m][s], times["none"][s],
                                              steps["none"][s])]
            rows[m] = {
                "ms_per_token": mean_sd(per_seed),
                "ms_per_token_per_seq": mean_sd([x / B for x in per_seed]),
                "decode_ms_per_token": mean_sd(dec_seed),
                "slowdown": mean_sd([a / b for a, b in zip(per_seed, base)]),
                "decode_slowdown": mean_sd([a / b for a, b in zip(dec_seed, base_dec)]),
                "paired_ratio_median": float(np.median(paired)),
                "sd_across_runs_ms": statistics.stdev([1e3 * x / k for t, n in zip(times[m], steps[m])
                                                       for x, k in zip(t, n)]) if n_runs > 1 else 0.0,
                "ended": ended[m], "valid": valid.get(m), "sequences": n_runs * B,
                "mean_steps_run": statistics.fmean([k for n in steps[m] for k in n]),
            }
        results["batches"][str(B)] = {
            "prompts": len(groups) * B, "runs_per_method": n_runs, "compile_s": compile_s,
            "prefill_ms": mean_sd([1e3 * statistics.fmean(p) for p in prefill]),
            "methods": rows,
            "raw_s": {m: times[m] for m in METHODS} | {"prefill": prefill},
            "raw_steps": {m: steps[m] for m in METHODS}}
        if not args.no_components:
            ids0, lens0 = (jnp.asarray(a) for a in groups[0])
            results["batches"][str(B)]["components_ms"] = components(
                model, fa, tables["gcd"], ids0, lens0, budget)
            print(f"batch {B} components (ms/call): "
                  f"{results['batches'][str(B)]['components_ms']}", flush=True)

    results["setup"] = {
        "model": repr(lm), "constraint": "js_tool_call (compact JSON)", "budget": budget,
        "min_budget": fa.min_budget, "num_states": fa.num_states, "prompt_width": P,
        "seeds": args.seeds, "quick": args.quick, "temperature": 1.0,
        "machine": platform.platform(), "processor": cpu_model(),
        "cpus": os.cpu_count(), "jax": jax.__version__, "backend": jax.default_backend(),
        "load_avg_at_start": load_start, "load_avg_at_end": os.getloadavg(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "device": str(jax.devices()[0]),
        "device_kind": getattr(jax.devices()[0], "device_kind", ""),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "wall_s": round(time.perf_counter() - t_start, 1)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    md = to_markdown(results)
    out.with_suffix(".md").write_text(md)
    print()
    print(md)


def to_markdown(results):
    s = results["setup"]
    la = s.get("load_avg_at_start"), s.get("load_avg_at_end")
    load = (f"; load average {la[0][0]:.1f} at the start, {la[1][0]:.1f} at the end"
            if la[0] and la[1] else "")
    where = ("a small CPU shared with other processes; timings are noisy" if s["backend"] == "cpu"
             else "a dedicated machine")
    lines = ["# Runtime: unconstrained vs LCD vs GCD (seed paper Table 2 rows)", "",
             f"{s['model']} on {s['backend']} ({s.get('device', '')}, {s['cpus']} cpus"
             f"{', ' + s['processor'] if s.get('processor') else ''}, "
             f"{where}{load}), "
             f"constraint {s['constraint']}, {s['budget']} steps per call, temperature "
             f"{s['temperature']}, {s['seeds']} seeds; jitted one-program `sample`. "
             "ms/token = call time / steps actually run (prefill included; per step of the whole batch); "
             "/seq = divided by the batch size (the seed paper's per-token view); decode = "
             "prefill subtracted. mean ± sd across seeds; slowdown = ratio to `none` (the "
             "configurations are interleaved within one run).", ""]
    if s.get("command"):
        lines += [f"Command: `python experiments/{s['command']}`; device kind: "
                  f"{s.get('device_kind', '')}; wall time {s['wall_s']} s.", ""]
    if s.get("note"):
        lines += [s["note"], ""]
    lines += ["| batch | method | ms/token | ms/token/seq | slowdown | decode ms/token | "
              "decode slowdown | median paired ratio | valid |",
              "|---|---|---|---|---|---|---|---|---|"]
    for B, d in results["batches"].items():
        for m, r in d["methods"].items():
            v = "" if r["valid"] is None else f"{r['valid']}/{r['sequences']}"
            lines.append(
                f"| {B} | {m} | {r['ms_per_token'][0]:.2f} ± {r['ms_per_token'][1]:.2f} | "
                f"{r['ms_per_token_per_seq'][0]:.2f} ± {r['ms_per_token_per_seq'][1]:.2f} | "
                f"{r['slowdown'][0]:.3f}× ± {r['slowdown'][1]:.3f} | "
                f"{r['decode_ms_per_token'][0]:.2f} ± {r['decode_ms_per_token'][1]:.2f} | "
                f"{r['decode_slowdown'][0]:.3f}× ± {r['decode_slowdown'][1]:.3f} | "
                f"{r['paired_ratio_median']:.3f}× | {v} |")
    lines += [""]
    for B, d in results["batches"].items():
        lines.append(f"- batch {B}: {d['prompts']} prompts, {d['runs_per_method']} runs per "
                     f"method; prefill {d['prefill_ms'][0]:.1f} ± {d['prefill_ms'][1]:.1f} ms; "
                     f"warm-up s {d['compile_s']}")
        if "components_ms" in d:
            lines.append(f"  - per-step components (ms/call): " + ", ".join(
                f"{k} {v:.3f}" for k, v in d["components_ms"].items()))
    lines += ["", "Goal (issue 3): GCD ≤ 1.05× unconstrained: " + "; ".join(
        f"batch {B}: {d['methods']['gcd']['slowdown'][0]:.3f}× "
        f"({'met' if d['methods']['gcd']['slowdown'][0] <= 1.05 else 'NOT met'})"
        for B, d in results["batches"].items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
