"""Compile time (cold) of every public-workload constraint: jaxcd vs outlines-core.

"Compile" is the whole path from the constraint's text to an object that can produce
token masks over the 49,152-token SmolLM2 vocabulary:

- jaxcd: ``compile_regex`` / ``compile_json_schema(..., whitespace_pattern="")`` (regex
  parse, byte DFA construction and minimisation, lifting over the vocabulary, edge
  grouping and packing; on-disk cache off);
- outlines-core: ``outlines_core.Index(regex, vocabulary)`` (JSON schemas first go
  through ``build_regex_from_schema(..., whitespace_pattern="")``, timed too).

Both run in this one process, interleaved per repeat (so machine noise hits them
alike), on warm vocabularies (our byte trie and outlines-core's ``Vocabulary`` are
built once before timing: both are per-tokenizer, not per-constraint costs). Each
measurement is "cold" for the constraint: nothing of it is cached (our per-class
UTF-8 fragment cache is cleared before each run). We report the median of
``--repeats`` runs (ms) and the ratio ours/outlines-core.

Usage::

    flock /tmp/jaxcd_bench.lock nice .venv/bin/python experiments/bench_compile.py [--repeats 5]
    ... --profile js_recipe     # cProfile one constraint instead

Writes ``experiments/results/bench_compile.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORKLOAD = ROOT / "tests" / "data" / "workload"
RESULTS = ROOT / "experiments" / "results"


def load_constraints(names=None):
    spec = json.loads((WORKLOAD / "workload.json").read_text())
    out = []
    for c in spec["constraints"]:
        if names and c["name"] not in names:
            continue
        out.append((c["name"], c["kind"], (WORKLOAD / c["file"]).read_text().strip()))
    return out


def outlines_vocabulary(vocab):
    import outlines_core as oc
    by_bytes: dict[bytes, list[int]] = {}
    for i, t in enumerate(vocab.token_bytes):
        if not vocab.is_special[i] and t:
            by_bytes.setdefault(t, []).append(i)
    return oc.Vocabulary(vocab.eos_id, by_bytes)


def ours(kind, source, vocab):
    from jaxcd import compile_json_schema, compile_regex
    from jaxcd.automata.fsa import _class_fragment
    _class_fragment.cache_clear()
    if kind == "regex":
        return compile_regex(source, vocab)
    return compile_json_schema(source, vocab, whitespace_pattern="")


def theirs(kind, source, ovocab):
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema
    regex = source if kind == "regex" else build_regex_from_schema(source, whitespace_pattern="")
    return oc.Index(regex, ovocab)


def timed(fn, *args):
    gc.collect()
    t0 = time.perf_counter()
    out = fn(*args)
    return (time.perf_counter() - t0) * 1e3, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="constraint names (default: all)")
    ap.add_argument("--profile", help="cProfile our compile of this constraint and exit")
    ap.add_argument("--no-outlines", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "bench_compile.json"))
    args = ap.parse_args(argv)

    from jaxcd import Vocabulary
    from jaxcd.tokenizer import load_tokenizer
    vocab = Vocabulary.from_tokenizer(load_tokenizer())
    _ = vocab.trie
    constraints = load_constraints(args.only or ([args.profile] if args.profile else None))

    if args.profile:
        import cProfile
        import pstats
        name, kind, source = constraints[0]
        ours(kind, source, vocab)
        pr = cProfile.Profile()
        pr.enable()
        ours(kind, source, vocab)
        pr.disable()
        pstats.Stats(pr).sort_stats("cumulative").print_stats(30)
        return

    ovocab = None if args.no_outlines else outlines_vocabulary(vocab)
    # warm-up (imports, outlines-core's lazy statics)
    name, kind, source = constraints[0]
    ours(kind, source, vocab)
    if ovocab is not None:
        theirs(kind, source, ovocab)

    rows = []
    for name, kind, source in constraints:
        t_ours, t_theirs = [], []
        fa = None
        for _ in range(args.repeats):
            t, fa = timed(ours, kind, source, vocab)
            t_ours.append(t)
            if ovocab is not None:
                t, _ = timed(theirs, kind, source, ovocab)
                t_theirs.append(t)
        row = {"name": name, "kind": kind, "ours_ms": statistics.median(t_ours),
               "ours_all_ms": t_ours, "num_states": fa.num_states, "num_edges": fa.num_edges}
        if t_theirs:
            row["outlines_ms"] = statistics.median(t_theirs)
            row["outlines_all_ms"] = t_theirs
            row["ratio"] = row["ours_ms"] / row["outlines_ms"]
        rows.append(row)
        r = f"{row['outlines_ms']:9.1f} {row['ratio']:6.2f}" if t_theirs else ""
        print(f"{name:22s} S={fa.num_states:5d} E={fa.num_edges:6d} {row['ours_ms']:9.1f} {r}",
              flush=True)

    print()
    print("| constraint | states | edges | jaxcd ms | outlines-core ms | jaxcd / outlines |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        o = f"{r['outlines_ms']:.1f} | {r['ratio']:.2f}" if "outlines_ms" in r else "- | -"
        print(f"| {r['name']} | {r['num_states']} | {r['num_edges']} | {r['ours_ms']:.1f} | {o} |")
    if len(constraints) == len(load_constraints()):
        import importlib.metadata as md
        meta = {"repeats": args.repeats, "python": platform.python_version(),
                "machine": platform.machine(), "numpy": md.version("numpy"),
                "outlines_core": md.version("outlines-core"),
                "command": "python experiments/bench_compile.py " + " ".join(argv or sys.argv[1:])}
        RESULTS.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
