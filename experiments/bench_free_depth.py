"""Benchmark: what deeper free-form JSON values cost. Compiles a seeded sample of
MaskBench schemas with the free-form depth adaptation off, for written free-form values
only, and with open objects' extras too (the default), interleaved per schema in one
process; report compile CPU time and DFA sizes per variant.

    python -m experiments.bench_free_depth --data <jsonschemabench mirror> --n 120

Writes ``experiments/results/bench_free_depth.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# (FREE_DEPTH_BUDGET, IMPLICIT_FREE_DEPTH): the knobs of SchemaBuilder.adaptive_free_depth
VARIANTS = {
    "off": (0, 3),                     # the default depth everywhere
    "written only": (10_240, 3),       # {}, true, additionalProperties: true, ...
    "default": (10_240, 4),            # ... and open objects' extras when few
}


def main(argv=None) -> int:
    from experiments.bench_maskbench import DEFAULT_DATA, Source, select
    from experiments.provenance import provenance
    import jaxcd.automata.schema_builder as sb
    from jaxcd import Vocabulary, compile_json_schema
    from jaxcd.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_free_depth"))
    args = ap.parse_args(argv)

    vocab = Vocabulary.from_tokenizer(load_tokenizer())
    src = Source(Path(args.data))
    names = select(src, "dev", 1000, 0)
    random.Random(args.seed).shuffle(names)
    names = names[:args.n]
    saved = (sb.FREE_DEPTH_BUDGET, sb.IMPLICIT_FREE_DEPTH)
    cpu = {k: [] for k in VARIANTS}
    states = {k: [] for k in VARIANTS}
    try:
        for i, name in enumerate(names):
            schema = src.read(name)["schema"]
            for k, (budget, implicit) in VARIANTS.items():
                sb.FREE_DEPTH_BUDGET, sb.IMPLICIT_FREE_DEPTH = budget, implicit
                c = time.process_time()
                try:
                    n = compile_json_schema(schema, vocab).num_states
                except Exception:          # refused by every variant alike, mostly
                    n = None
                cpu[k].append(time.process_time() - c)
                states[k].append(n)
            if (i + 1) % 20 == 0:
                print(f"[{i + 1}/{len(names)}]", flush=True)
    finally:
        sb.FREE_DEPTH_BUDGET, sb.IMPLICIT_FREE_DEPTH = saved
    both = [j for j in range(len(names)) if all(states[k][j] for k in VARIANTS)]
    rows = []
    for k in VARIANTS:
        a = np.array(cpu[k])
        s = np.array([states[k][j] for j in both])
        rows.append({"variant": k, "cpu_sum_s": float(a.sum()), "cpu_p50_s": float(np.median(a)),
                     "cpu_p95_s": float(np.quantile(a, 0.95)),
                     "dfa_states_median": int(np.median(s)), "dfa_states_mean": float(s.mean())})
    md = ["# Free-form depth: what it costs (experiments/bench_free_depth.py)\n",
          f"{len(names)} MaskBench schemas (dev splits, seed {args.seed}), each compiled by "
          f"every variant in turn (one process); DFA sizes over the {len(both)} that all "
          "compiled.\n",
          "| variant | CPU s (sum) | CPU p50 / p95 s | token DFA states median / mean |",
          "|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['variant']} | {r['cpu_sum_s']:.1f} | {r['cpu_p50_s']:.3f} / "
                  f"{r['cpu_p95_s']:.3f} | {r['dfa_states_median']:,} / "
                  f"{r['dfa_states_mean']:,.0f} |")
    print("\n".join(md))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"meta": provenance("experiments.bench_free_depth", argv, [args.seed]), "files": names, "rows": rows, "cpu": cpu, "states": states},
        indent=1))
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
