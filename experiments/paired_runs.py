"""Paired comparison of rows from two runs of the BFCL entry point on the same examples.

For an A/B of one method across code versions: a study's merged ``predictions.jsonl``
(``--base``) and a second run of some of its methods (``--new``, e.g. after a change in
``smc.run``) whose method names get ``--suffix``. Only the examples both runs hold are
compared; every pair of methods at the same (format, k) gets the paired tests of
:func:`experiments.studies.paired_tests` (paired bootstrap CI, exact McNemar) and the
proposal diagnostics of :func:`experiments.studies.proposal_diagnostics`.

    python -m experiments.paired_runs --base experiments/results/second_model/run \\
        --new experiments/results/second_model_defensive/run --suffix " (defensive φ)" \\
        --out experiments/results/second_model_defensive
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load_rows(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "predictions.jsonl").read_text().splitlines() if x]


def combine(base: list[dict], new: list[dict], suffix: str) -> list[dict]:
    """The base rows of the examples the new run holds, and the new rows with their
    method renamed ``method + suffix``."""
    ids = {r["id"] for r in new}
    return [r for r in base if r["id"] in ids] + [{**r, "method": r["method"] + suffix}
                                                   for r in new]


def main(argv=None):
    from experiments.provenance import provenance
    from experiments.studies import (LABELS, diagnostics_md, paired_md, paired_tests,
                                     proposal_diagnostics)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="a run folder with predictions.jsonl")
    ap.add_argument("--new", required=True, action="append",
                    help="run folder(s) of the second run (repeatable: shards)")
    ap.add_argument("--suffix", default=" (new)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    new = [r for f in a.new for r in load_rows(Path(f))]
    rows = combine(load_rows(Path(a.base)), new, a.suffix)
    for m in {r["method"] for r in new}:
        LABELS.setdefault(m + a.suffix, LABELS.get(m, m) + a.suffix)
    acc = paired_tests(rows, "correct", a.seed)
    val = paired_tests(rows, "valid", a.seed)
    diag = proposal_diagnostics(rows)
    n = len({r["id"] for r in new})
    res = {"provenance": provenance("experiments.paired_runs", argv or [], [a.seed]),
           "base": a.base, "new": a.new, "suffix": a.suffix, "examples": n,
           "example_ids": sorted({r["id"] for r in new}),
           "paired_accuracy": acc, "paired_valid": val, "diagnostics": diag}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "paired_runs.json").write_text(json.dumps(res, indent=1) + "\n")
    md = [f"# Paired runs: {a.base} against {', '.join(a.new)}", "",
          f"{n} examples held by both; methods of the second run carry the suffix "
          f"`{a.suffix}`.", "", paired_md(acc, "BFCL accuracy"), "",
          diagnostics_md(diag)]
    (out / "paired_runs.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return res


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
