"""Unconstrained vs GCD on BFCL per model (issue 20, item 8): one table from the
``experiments.tool_calls`` runs of each model, read from their ``records.jsonl`` (so a
stopped run is reported with the examples it finished, and says so).

    python -m experiments.tool_calls --data bfcl:simple_python --format json \\
        --methods none,gcd --particles 1 --hmm none --budget auto --limit 32 --seed 0 \\
        [--model NAME] --out experiments/results/accuracy_models/NAME
    python -m experiments.accuracy_models      # -> experiments/results/accuracy_models.{json,md}

Columns: ``valid`` = the output is in the constraint's language (the JSON call format of
the prompt, its whitespace rules included; for ``none`` checked on the sampled text by
the byte DFA); ``parses`` = BFCL's parser reads calls from it (any JSON whitespace);
``accuracy`` =
BFCL's AST checker on the output. An unconstrained model often answers inside a Markdown
code fence (```json ... ```), which the format does not allow; ``accuracy, fence
stripped`` scores ``none`` again after removing one surrounding fence, to separate "wrong
call" from "right call, wrong wrapping". Intervals: percentile bootstrap over examples.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from . import bfcl
from .runner import bootstrap_ci

ROOT = Path(__file__).resolve().parent / "results"
_FENCE = re.compile(r"^\s*```[A-Za-z]*\s*\n(.*?)\n?\s*```\s*$", re.S)


def strip_fence(text: str) -> str:
    """``text`` without one Markdown code fence around all of it (else unchanged)."""
    m = _FENCE.match(text)
    return m.group(1) if m else text


def _parses(text: str, fmt: str) -> bool:
    try:
        bfcl.parse_output(text, fmt)
        return True
    except ValueError:
        return False


def _pct(xs) -> tuple[float, float, float]:
    lo, hi = bootstrap_ci([float(x) for x in xs])
    return 100 * float(np.mean(xs)), 100 * lo, 100 * hi


def model_rows(run: Path) -> list[dict]:
    settings = json.loads((run / "run.json").read_text())
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()
               if line.strip()]
    planned = len(settings.get("example_ids") or []) or None
    exs = {ex.id: ex for ex in bfcl.load_examples(bfcl.resolve("bfcl:simple_python"),
                                                  bfcl.resolve("bfcl:simple_python",
                                                               answers=True))}
    by_method: dict[str, list[dict]] = {}
    for rec in records:
        for row in rec["rows"]:
            by_method.setdefault(row["method"], []).append(row)
    out = []
    for method, rows in by_method.items():
        r = {"model": run.name, "method": method, "n": len(rows),
             "planned": planned, "model_file": settings["settings"].get("model"),
             "valid": _pct([bool(x["valid"]) for x in rows]),
             "parses": _pct([_parses(x["output"], x.get("format", "json")) for x in rows]),
             "accuracy": _pct([bool(x["correct"]) for x in rows])}
        if method == "none":
            ok = [bool(bfcl.score(exs[x["id"]], strip_fence(x["output"]), x.get("format", "json"))[0])
                  for x in rows]
            r["accuracy_fence_stripped"] = _pct(ok)
        out.append(r)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.accuracy_models")
    ap.add_argument("--runs", default=str(ROOT / "accuracy_models"))
    ap.add_argument("--out", default=str(ROOT / "accuracy_models"))
    a = ap.parse_args(argv)
    runs = sorted(p for p in Path(a.runs).iterdir() if (p / "records.jsonl").exists())
    rows = [r for run in runs for r in model_rows(run)]
    f = lambda t: f"{t[0]:.1f} [{t[1]:.1f}, {t[2]:.1f}]"  # noqa: E731
    md = ["# Unconstrained vs GCD on BFCL simple_python (JSON calls, K = 1, seed 0)", "",
          "`python -m experiments.accuracy_models` over the `experiments.tool_calls` runs in "
          "`results/accuracy_models/<model>/` (their `summary.md` holds the commands).", "",
          "| model | method | n (of planned) | valid % [95% CI] | parses % | accuracy % [95% CI] | "
          "accuracy %, fence stripped |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['model_file']} | {r['method']} | {r['n']} (of {r['planned']}) | {f(r['valid'])} | "
                  f"{r['parses'][0]:.1f} | {f(r['accuracy'])} | {f(r['accuracy_fence_stripped']) if 'accuracy_fence_stripped' in r else '–'} |")
    Path(a.out).with_suffix(".md").write_text("\n".join(md) + "\n")
    Path(a.out).with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
