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

``sizes``: per schema (slowest first), its compile CPU time, the sizes of what it
compiles to (states, edges, distinct mask rows and their bytes), its ``$ref``
expansions and the whole-constraint attempts; a markdown table (``--out``: also JSON;
``--property-order``: that option of ``compile_json_schema``, default ``auto``).

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


def _ref_counts(schema) -> tuple[int, int, str | None]:
    """``$ref`` expansions of the schema's expression tree (schema order, ``max_depth``
    3), distinct references, and the error's name where the tree fails (counted up to
    it)."""
    from jaxcd.automata import schema_builder as sb
    from jaxcd.automata.json_schema import _auto_tree
    orig = sb.SchemaBuilder.node
    seen: list = []
    error = None

    def node(self, sub, path):
        if isinstance(sub, dict) and isinstance(sub.get("$ref"), str):
            seen.append(sub["$ref"])
        return orig(self, sub, path)

    sb.SchemaBuilder.node = node
    try:
        _auto_tree(schema, "[ ]?", True, 3, False, "schema", {})
    except Exception as e:
        error = type(e).__name__
    finally:
        sb.SchemaBuilder.node = orig
    return len(seen), len(set(seen)), error


def refs(names: list[str], data: str) -> None:
    from experiments.bench_maskbench import Source
    src = Source(Path(data))
    for n in names:
        expansions, distinct, error = _ref_counts(src.read("maskbench/data/" + n)["schema"])
        if error:
            print(n, error)
        else:
            print(f"{n}: {expansions} $ref expansions of {distinct} distinct references")


def sizes(names: list[str], data: str, out: str | None = None,
          property_order: str = "auto") -> list[dict]:
    import numpy as np
    from experiments.bench_maskbench import Source
    from jaxcd import Vocabulary, compile_json_schema, compile_stats
    from jaxcd.tokenizer import load_tokenizer
    src = Source(Path(data))
    vocab = Vocabulary.from_tokenizer(load_tokenizer())
    compile_json_schema({"type": "object"}, vocab)                    # warm-up
    rows = []
    for n in names:
        schema = src.read("maskbench/data/" + n)["schema"]
        expansions, distinct, _ = _ref_counts(schema)
        row = {"file": n, "ref_expansions": expansions, "distinct_refs": distinct}
        with compile_stats() as st:
            t = time.process_time()
            try:
                fa = compile_json_schema(schema, vocab, property_order=property_order)
            except Exception as e:
                row["error"] = type(e).__name__
                fa = None
            row["cpu_s"] = round(time.process_time() - t, 3)
        row["attempts"] = st.get("attempts")
        if fa is not None:
            masks = np.asarray(fa.cum_masks)
            row.update(states=fa.num_states, edges=int(len(np.asarray(fa.edge_src))),
                       mask_rows=int(masks.shape[0]), mask_mib=round(masks.nbytes / 2**20, 1))
        rows.append(row)
    rows.sort(key=lambda r: -r["cpu_s"])
    cols = ["file", "cpu_s", "states", "edges", "mask_rows", "mask_mib", "ref_expansions",
            "distinct_refs", "attempts"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, r.get("error", "-") if c == "states" else "-"))
                                for c in cols) + " |")
    ok = [r for r in rows if "states" in r]
    if len(ok) > 1:
        t, q, e, m = (np.array([r[k] for r in ok], float)
                      for k in ("cpu_s", "states", "edges", "mask_mib"))
        print(f"\n{len(ok)} compiled: correlation of CPU time with states "
              f"{np.corrcoef(t, q)[0, 1]:.2f}, with edges {np.corrcoef(t, e)[0, 1]:.2f}; "
              f"states median {np.median(q):,.0f}, largest {q.max():,.0f}; mask MiB median "
              f"{np.median(m):.1f}, largest {m.max():.1f}; CPU s in all {t.sum():.1f}")
    if out:
        Path(out).write_text(json.dumps(rows, indent=1))
    return rows


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
    p = sub.add_parser("sizes")
    p.add_argument("list")
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--out")
    p.add_argument("--property-order", default="auto")
    args = ap.parse_args(argv)
    if args.cmd == "ab":
        ab(args.root, _names(args.list), args.reps, args.data, args.out)
    elif args.cmd == "compare":
        compare(args.a, args.b)
    elif args.cmd == "refs":
        refs(_names(args.list), args.data)
    else:
        sizes(_names(args.list), args.data, args.out, args.property_order)
    return 0


if __name__ == "__main__":
    sys.exit(main())
