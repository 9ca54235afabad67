"""Soundness sweep over real schemas: strings drawn from the automaton that
``compile_json_schema`` builds (its byte DFA, before the lift over a vocabulary) must
validate with jsonschema.

MaskBench's invalid instances test a few hand-made cases per schema; this draws
``--samples`` random accepted strings per schema instead (uniform live bytes, stopping
at an accepting state with probability 0.3, heading to the nearest one after 300 bytes;
the sampler and the reference are the test suite's: ``tests/test_json_schema.py``'s
``sample_strings`` and ``validates``, jsonschema with ``Decimal`` numbers and its format
checker, stdlib checkers added for the formats whose packages are optional). A string
the reference cannot judge (``multipleOf`` of a number whose quotient needs over 100,000
digits) is counted apart, never as valid.

    python -m experiments.sweep_soundness --data MIRROR --splits heldout --n 300 --seed 7 \\
        --out experiments/results/maskbench_soundness_sweep_heldout

Writes ``OUT.json`` (per file: compiled or the error class, samples, invalid ones with
their text) and ``OUT.md`` (the summary).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from experiments.bench_maskbench import Source, _scrub, select  # noqa: E402


class _Built(Exception):
    """Raised once the DFA of the build that compile_json_schema keeps is known."""


def _compiled_dfa(schema):
    """The byte DFA that ``compile_json_schema(schema, vocab)`` lifts (after its
    fallbacks), without the lift."""
    import jaxcd.api as api
    got = {}
    orig = api._cached

    def keep(kind, source, options, vocab, build, cache):
        got["dfa"] = build()
        raise _Built

    api._cached = keep
    try:
        api.compile_json_schema(schema, None)
    except _Built:
        pass
    finally:
        api._cached = orig
    return got["dfa"]


def sweep(src: Source, names: list[str], samples: int) -> list[dict]:
    from jaxcd.errors import JaxcdError
    from test_json_schema import sample_strings, validates
    rows = []
    for i, name in enumerate(names):
        schema = src.read(name)["schema"]
        row = {"file": Path(name).name}
        t = time.process_time()
        try:
            d = _compiled_dfa(schema)
        except JaxcdError as e:
            row["error"] = type(e).__name__
            rows.append(row)
            continue
        row["states"] = d.num_states
        invalid, unjudged, n = [], 0, 0
        if d.num_states:
            for s in sample_strings(d, np.random.default_rng(i), samples, max_len=300):
                n += 1
                verdict = validates(schema, s.decode("utf-8"))
                if verdict is None:
                    unjudged += 1
                elif not verdict:
                    invalid.append(s.decode("utf-8")[:2000])
        row.update(samples=n, invalid=invalid, unjudged=unjudged,
                   cpu_s=round(time.process_time() - t, 2))
        rows.append(row)
        print(f"{i + 1}/{len(names)} {name}: {n} samples, {len(invalid)} invalid",
              flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="MaskBench data directory or git mirror")
    ap.add_argument("--splits", choices=("dev", "heldout", "all"), default="dev")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--files", metavar="LIST",
                    help="a file of MaskBench names (one a line, base names or paths): "
                         "sweep these instead of a sample of --splits")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    src = Source(Path(args.data))
    if args.files:
        wanted = {Path(x).name for x in Path(args.files).read_text().split()}
        names = [x for x in src.names if Path(x).name in wanted]
        missing = wanted - {Path(x).name for x in names}
        if missing:
            raise SystemExit(f"--files: not in the data: {', '.join(sorted(missing)[:5])}")
    else:
        names = select(src, args.splits, args.n, args.seed)
    t0 = time.time()
    rows = sweep(src, names, args.samples)
    compiled = [r for r in rows if "error" not in r]
    bad = [r for r in compiled if r["invalid"]]
    summary = {"files": len(rows), "compiled": len(compiled),
               "samples": sum(r["samples"] for r in compiled),
               "invalid_samples": sum(len(r["invalid"]) for r in compiled),
               "files_with_invalid": len(bad),
               "unjudged_samples": sum(r["unjudged"] for r in compiled),
               "wall_s": round(time.time() - t0)}
    meta = _scrub({"data": args.data, "argv": sys.argv[1:] if argv is None else argv})
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "rows": rows}, indent=1))
    what = (f"the {len(rows)} files of `{Path(args.files).name}`" if args.files else
            f"{args.splits} splits, {len(rows)} files (seed {args.seed})")
    md = [f"# Soundness sweep: MaskBench {what}", "",
          "Strings drawn from the byte automaton `compile_json_schema` builds, each "
          "validated with jsonschema (`experiments/sweep_soundness.py`).", "",
          f"`python -m experiments.sweep_soundness {' '.join(meta['argv'])}`", "",
          "| files | compiled | samples | invalid samples | files with one | unjudged |",
          "|---|---|---|---|---|---|",
          f"| {summary['files']} | {summary['compiled']} | {summary['samples']} | "
          f"{summary['invalid_samples']} | {summary['files_with_invalid']} | "
          f"{summary['unjudged_samples']} |", ""]
    for r in bad:
        md.append(f"- `{r['file']}`: `{r['invalid'][0][:200]}`")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(json.dumps(summary))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
