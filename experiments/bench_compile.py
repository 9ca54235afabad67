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

``--bounds [--before REV]``: the issue-10 constraints (UUID, base64 and word-repetition
regexes, the minimised JSON Schemas, the slowest SchemaStore schemas), each compiled
in a fresh child process (SmolLM2 vocabulary loaded and warmed up first, RLIMIT_AS
6 GB, 300 s timeout), once with the working tree and once with the jaxcd package of
git revision ``REV`` (extracted with ``git archive``), in the same run. Per compile:
wall and CPU seconds and the growth of the peak resident set (``VmHWM`` reset through
``/proc/self/clear_refs`` before the compile, minus ``VmRSS`` before it), plus the
automaton's sizes and table bytes. Writes ``experiments/results/bench_compile_bounds.{json,md}``::

    nice python -m experiments.bench_compile --bounds --before 20b5bfb
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
    from jaxcd.automata.fsa import _class_fragment, _fragment_parts
    _class_fragment.cache_clear()
    _fragment_parts.cache_clear()
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


BOUNDS_CASES = [
    ("uuid", "regex", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", 0),
    ("hex32", "regex", "[0-9a-f]{32}", 0),
    ("base64", "regex", "[A-Za-z0-9+/]{16,64}", 0),
    ("words_ascii", "regex", r"(\w{1,12} ){3,8}", 256),                # re.ASCII
    ("words_unicode", "regex", r"(\w{1,12} ){3,8}", 0),
    ("js_date_time", "json_schema", '{"type": "string", "format": "date-time"}', 0),
    ("js_uuid", "json_schema", '{"type": "string", "format": "uuid"}', 0),
    ("js_len32", "json_schema", '{"type": "string", "minLength": 32, "maxLength": 32}', 0),
    ("ss_buildkite", "schemastore", "Buildkite", 0),
    ("ss_api_builder", "schemastore", "API Builder", 0),
    ("ss_ansible_inventory", "schemastore", "Ansible Inventory", 0),
]

_BOUNDS_CHILD = r"""
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (6_000_000_000, 6_000_000_000))
sys.path.insert(0, sys.argv[1])
import jaxcd
from jaxcd import Vocabulary, compile_json_schema, compile_regex
from jaxcd.tokenizer import load_tokenizer
kind, source, flags = sys.argv[2], sys.argv[3], int(sys.argv[4])
assert jaxcd.__file__.startswith(sys.argv[1]), jaxcd.__file__

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024

vocab = Vocabulary.from_tokenizer(load_tokenizer())
compile_regex("[ab]{2}", vocab)
compile_json_schema({"type": "string", "maxLength": 3}, vocab, whitespace_pattern="")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
t0, c0 = time.perf_counter(), time.process_time()
if kind == "regex":
    fa = compile_regex(source, vocab, flags=flags)
else:
    fa = compile_json_schema(source, vocab, whitespace_pattern="")
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_growth_mb": status("VmHWM") - before,
                  "num_states": fa.num_states, "num_edges": fa.num_edges,
                  "mask_rows": int(fa.cum_masks.shape[0]), "table_mb": fa.nbytes / 2**20}))
"""


def _head() -> str:
    import subprocess
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def bounds(before: str | None, out: Path, only=None) -> None:
    import subprocess
    import tempfile
    import shutil
    # both trees are snapshots taken now, so edits during the run change nothing
    after = tempfile.mkdtemp(prefix="jaxcd_after_")
    shutil.copytree(ROOT / "jaxcd", Path(after) / "jaxcd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    trees = {"after": after}
    if before:
        tmp = tempfile.mkdtemp(prefix="jaxcd_before_")
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", before, "jaxcd"],
                              check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=arch, check=True)
        trees = {"before": tmp, "after": after}
    corpus = {x["name"]: x["schema"] for x in
              json.loads((ROOT / "tests/data/corpus/schemastore.json").read_text())}
    rows = []
    for name, kind, source, flags in BOUNDS_CASES:
        if only and name not in only:
            continue
        if kind == "schemastore":
            kind, source = "json_schema", json.dumps(corpus[source])
        row = {"name": name, "kind": kind, "source": source[:200], "flags": flags}
        for label, tree in trees.items():
            try:
                p = subprocess.run([sys.executable, "-c", _BOUNDS_CHILD, tree, kind, source,
                                    str(flags)], capture_output=True, text=True, timeout=300)
                res = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else \
                    {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
            except subprocess.TimeoutExpired:
                res = {"error": "timeout (300 s)"}
            row[label] = res
            print(name, label, res, flush=True)
        rows.append(row)
    import importlib.metadata as md
    meta = {"before": before, "after_head": _head(), "python": platform.python_version(),
            "numpy": md.version("numpy"), "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
            "command": "python -m experiments.bench_compile --bounds"
                       + (f" --before {before}" if before else "")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# Compiler bounds: before/after (experiments/bench_compile.py --bounds)", "",
             f"One fresh process per compile (SmolLM2 vocabulary, 49,152 tokens), same run; "
             f"before = jaxcd at `{before}`, after = the working tree (git `{_head()}` plus "
             f"uncommitted changes at the start of the run). Wall time on a shared "
             f"2-core machine (load average at start {os.getloadavg()[0]:.1f}), CPU time of "
             "the process, and peak-RSS growth during the compile. RLIMIT_AS 6 GB, 300 s "
             "timeout.", "",
             "| constraint | states | edges | mask rows | tables MB | before wall s | before CPU s "
             "| before peak MB | after wall s | after CPU s | after peak MB |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cells(r):
        if r is None:
            return "- | - | -"
        if "error" in r:
            return f"{r['error'][:60]} | | "
        return f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['peak_growth_mb']:.0f}"

    for r in rows:
        a = r["after"]
        sizes = (f"{a['num_states']:,} | {a['num_edges']:,} | {a['mask_rows']:,} | "
                 f"{a['table_mb']:.1f}") if "error" not in a else "- | - | - | -"
        lines.append(f"| {r['name']} | {sizes} | {cells(r.get('before'))} | {cells(a)} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", nargs="*", help="constraint names (default: all)")
    ap.add_argument("--profile", help="cProfile our compile of this constraint and exit")
    ap.add_argument("--no-outlines", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "bench_compile.json"))
    ap.add_argument("--bounds", action="store_true", help="the issue-10 before/after table")
    ap.add_argument("--before", default=None, help="git revision for the 'before' column")
    args = ap.parse_args(argv)
    if args.bounds:
        bounds(args.before, RESULTS / "bench_compile_bounds", args.only)
        return

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
