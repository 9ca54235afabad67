"""Compile CPU time of MaskBench schemas under two checkouts of jaxcd, side by side, and
how often each schema's ``$ref`` s are expanded.

``ab``: each checkout (a directory holding a ``jaxcd`` package, e.g. a ``git worktree``)
compiles the listed schemas ``--reps`` times in its own process; run the two at once, one
per core, so that machine noise hits both alike, then ``compare`` (best of the repetitions
per file, ratio of the sums)::

    git worktree add /tmp/old REV
    python -m experiments.compile_ab ab /tmp/old LIST --reps 2 --out old.json &
    python -m experiments.compile_ab ab . LIST --reps 2 --out new.json; wait
    python -m experiments.compile_ab compare old.json new.json

``refs``: per schema, how many ``$ref`` expansions the expression tree makes (schema
order, ``max_depth`` 3) against how many distinct references there are.

``LIST``: one MaskBench file name per line (``Github_hard---o12337.json``); ``--data``: the
MaskBench data (``experiments.bench_maskbench.Source``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _names(path: str) -> list[str]:
    return [ln.split()[0] for ln in Path(path).read_text().splitlines() if ln.strip()]


def ab(root: str, names: list[str], reps: int, data: str, out: str) -> None:
    sys.path.insert(0, str(Path(root).resolve()))
    import jaxcd
    from jaxcd import Vocabulary, compile_json_schema
    from jaxcd.tokenizer import load_tokenizer
    assert Path(jaxcd.__file__).resolve().is_relative_to(Path(root).resolve()), jaxcd.__file__
    from experiments.bench_maskbench import Source
    src = Source(Path(data))
    vocab = Vocabulary.from_tokenizer(load_tokenizer())
    compile_json_schema({"type": "object"}, vocab)                    # warm-up
    times: dict[str, list[float]] = {}
    for _ in range(reps):
        for n in names:
            doc = src.read("maskbench/data/" + n)
            t = time.process_time()
            try:
                compile_json_schema(doc["schema"], vocab)
            except Exception:                   # a refusal takes its time too
                pass
            times.setdefault(n, []).append(time.process_time() - t)
    Path(out).write_text(json.dumps(times))


def compare(a: str, b: str) -> None:
    import numpy as np
    x, y = json.loads(Path(a).read_text()), json.loads(Path(b).read_text())
    ta = np.array([min(x[k]) for k in x])
    tb = np.array([min(y[k]) for k in x])
    r = tb / ta
    print(f"files {len(x)}: {a} {ta.sum():.1f} s, {b} {tb.sum():.1f} s, ratio "
          f"{tb.sum() / ta.sum():.3f}; per file median {np.median(r):.3f}")


def refs(names: list[str], data: str) -> None:
    from experiments.bench_maskbench import Source
    from jaxcd.automata import schema_builder as sb
    from jaxcd.automata.json_schema import _auto_tree
    src = Source(Path(data))
    orig = sb.SchemaBuilder.node
    seen: list = []

    def node(self, schema, path):
        if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            seen.append(schema["$ref"])
        return orig(self, schema, path)

    sb.SchemaBuilder.node = node
    try:
        for n in names:
            seen.clear()
            try:
                _auto_tree(src.read("maskbench/data/" + n)["schema"], "[ ]?", True, 3, False,
                           "schema", {})
            except Exception as e:
                print(n, type(e).__name__)
                continue
            print(f"{n}: {len(seen)} $ref expansions of {len(set(seen))} distinct references")
    finally:
        sb.SchemaBuilder.node = orig


def main(argv=None) -> int:
    from experiments.bench_maskbench import DEFAULT_DATA
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ab")
    p.add_argument("root")
    p.add_argument("list")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p = sub.add_parser("refs")
    p.add_argument("list")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    args = ap.parse_args(argv)
    if args.cmd == "ab":
        ab(args.root, _names(args.list), args.reps, args.data, args.out)
    elif args.cmd == "compare":
        compare(args.a, args.b)
    else:
        refs(_names(args.list), args.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
