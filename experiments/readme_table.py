"""The README's results table, rendered from the results files.

Every figure in README.md carries a tag naming where it comes from::

    0.795<!-- results: experiments/results/bias_real/bias_real.json#constraints/paris/posterior/yes -->

The tag is an HTML comment (invisible on GitHub) placed right after the number. The key
path is ``/``-separated (``~1`` stands for a ``/`` inside a key, as in a JSON Pointer); a
segment indexes a list by position (``3``) or selects the one
element whose fields match (``method=gcd,particles=16``). A number followed by ``%`` is
the value × 100. A printed number is checked against the value rounded to the printed
decimals (``tests/test_readme.py``).

The table between the ``results-table`` markers in README.md is this module's output:

    python -m experiments.readme_table            # print it
    python -m experiments.readme_table --write    # replace it in README.md

``make run`` (``jaxcd demo``) prints measured facts beside its own runs: they come from
``jaxcd/data/demo_results.json``, which :func:`demo_facts` renders from the results
files (``--write`` rewrites it too; ``tests/test_readme.py`` checks it is current).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN, END = "<!-- results-table:begin -->", "<!-- results-table:end -->"

#: a tagged number: the number, an optional "%", the tag
TAG = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)(%?)<!-- results: (\S+?)#(\S+?) -->")

R = "experiments/results/"
VALIDITY = R + "validity.json"
BIAS = R + "bias_real/bias_real.json"
BIAS_QWEN = R + "bias_real/bias_real_qwen2.5-coder-0.5b.json"
MASKBENCH = R + "bench_maskbench.json"
MASKBENCH_HELDOUT = R + "maskbench_heldout_speed.json"
RUNTIME = R + "bench_runtime.json"
HMM = R + "bench_hmm.json"
SATISFACTION = R + "satisfaction/satisfaction.json"
SECOND_MODEL = R + "second_model/second_model.json"
SECOND_MODEL_DEFENSIVE = R + "second_model_defensive/paired_runs.json"
DEMO_FACTS = ROOT / "jaxcd" / "data" / "demo_results.json"

#: (what is measured, [(label, file, key, format)], command that writes the file)
ROWS = [
    ("valid outputs at the constraint's smallest budget (11 constraints × 16 samples, "
     "SmolLM2-135M)",
     [("GCD", VALIDITY, "summary/gcd~1min/valid", "{:.0f}"),
      ("LCD", VALIDITY, "summary/lcd~1min/valid", "{:.0f}"),
      ("of", VALIDITY, "summary/gcd~1min/n", "{:.0f}")],
     "python experiments/validity.py"),
    ("Paris question: P(yes) under the model's exact posterior vs unweighted GCD "
     "(SmolLM2-135M)",
     [("posterior", BIAS, "constraints/paris/posterior/yes", "{:.3f}"),
      ("GCD", BIAS, "constraints/paris/gcd_exact/yes", "{:.3f}")],
     "python -m experiments.study_bias_real"),
    ("total variation to the exact posterior, Paris, SMC-GCD with K = 64 (mean of 4 × 1000 "
     "runs)",
     [("SMC", BIAS, "constraints/paris/smc/gcd/64/tv_strings/mean", "{:.3f}"),
      ("GCD", BIAS, "constraints/paris/tv_gcd_strings", "{:.3f}")],
     "python -m experiments.study_bias_real"),
    ("median TV of unweighted GCD over 23 finite constraints: SmolLM2-135M vs "
     "Qwen2.5-Coder-0.5B",
     [("SmolLM2", BIAS, "summary/gcd_tv/median", "{:.3f}"),
      ("Qwen", BIAS_QWEN, "summary/gcd_tv/median", "{:.3f}")],
     "python -m experiments.study_bias_real [--model qwen2.5-coder-0.5b]"),
    ("MaskBench, 1,000 JSON Schemas of the development splits: schemas passing (jaxcd / llguidance / xgrammar)",
     [("jaxcd", MASKBENCH, "overall/jaxcd/passing", "{:.0f}"),
      ("llguidance", MASKBENCH, "overall/llguidance/passing", "{:.0f}"),
      ("xgrammar", MASKBENCH, "overall/xgrammar/passing", "{:.0f}")],
     "python -m experiments.bench_maskbench --n 1000"),
    ("MaskBench: schemas that accepted an invalid instance (jaxcd / llguidance / xgrammar)",
     [("jaxcd", MASKBENCH, "overall/jaxcd/invalid_accepted_schemas", "{:.0f}"),
      ("llguidance", MASKBENCH, "overall/llguidance/invalid_accepted_schemas", "{:.0f}"),
      ("xgrammar", MASKBENCH, "overall/xgrammar/invalid_accepted_schemas", "{:.0f}")],
     "python -m experiments.bench_maskbench --n 1000"),
    ("MaskBench: jaxcd compile time p50 / p95 (s)",
     [("p50", MASKBENCH, "overall/jaxcd/compile_p50_s", "{:.2f}"),
      ("p95", MASKBENCH, "overall/jaxcd/compile_p95_s", "{:.2f}")],
     "python -m experiments.bench_maskbench --n 1000"),
    ("MaskBench held-out splits (1,949 schemas: Kubernetes, SchemaStore, Snowplow, ...; "
     "outside the development splits): schemas passing (jaxcd / llguidance)",
     [("jaxcd", MASKBENCH_HELDOUT, "overall/jaxcd/passing", "{:.0f}"),
      ("llguidance", MASKBENCH_HELDOUT, "overall/llguidance/passing", "{:.0f}")],
     "python -m experiments.bench_maskbench --splits heldout --full"),
    ("MaskBench held-out splits: jaxcd compile time p50 / p95 (s)",
     [("p50", MASKBENCH_HELDOUT, "overall/jaxcd/compile_p50_s", "{:.2f}"),
      ("p95", MASKBENCH_HELDOUT, "overall/jaxcd/compile_p95_s", "{:.2f}")],
     "python -m experiments.bench_maskbench --splits heldout --full"),
    ("time per step, GCD / unconstrained (prefill included), batch 16, SmolLM2 on CPU",
     [("ratio", RUNTIME, "batches/16/methods/gcd/slowdown/0", "{:.2f}")],
     "python experiments/bench_runtime.py"),
    ("BFCL tool calls (200 examples, JSON), valid with SMC-LCD vs SMC-GCD, K = 16 (%)",
     [("SMC-LCD", SATISFACTION, "table/format=json,method=smc-lcd,particles=16/valid_pct",
       "{:.1f}"),
      ("SMC-GCD", SATISFACTION, "table/format=json,method=smc-gcd,particles=16/valid_pct",
       "{:.1f}")],
     "python -m experiments.studies satisfaction"),
    ("EM iteration throughput / hmmlearn's (`log` / `scaling` implementations), "
     "V = 49,152, H = 128",
     [("vs log", HMM, "throughput/V=49152,H=128/speedup_vs_log", "{:.0f}"),
      ("vs scaling", HMM, "throughput/V=49152,H=128/speedup_vs_scaling", "{:.0f}")],
     "python experiments/bench_hmm.py"),
]


def _select(obj: list, segment: str):
    if segment.lstrip("-").isdigit():
        return obj[int(segment)]
    want = dict(kv.split("=", 1) for kv in segment.split(","))
    hits = [x for x in obj if all(str(x.get(k)) == v for k, v in want.items())]
    if len(hits) != 1:
        raise KeyError(f"{segment!r} selects {len(hits)} elements, not 1")
    return hits[0]


def lookup(file: str, key: str, root: Path = ROOT):
    """The value at ``key`` in the JSON results file ``file`` (relative to the repo)."""
    obj = json.loads((root / file).read_text())
    for part in key.split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        obj = _select(obj, part) if isinstance(obj, list) else obj[part]
    return obj


def tagged(value: float, fmt: str, file: str, key: str) -> str:
    return f"{fmt.format(value)}<!-- results: {file}#{key} -->"


def render(root: Path = ROOT) -> str:
    lines = ["| measured | result | results file | command |", "|---|---|---|---|"]
    for what, cells, command in ROWS:
        parts = [f"{label} {tagged(lookup(f, k, root), fmt, f, k)}" for label, f, k, fmt in cells]
        files = sorted({f for _, f, _, _ in cells})
        links = ", ".join(f"[{Path(f).name}]({f})" for f in files)
        lines.append(f"| {what} | {' · '.join(parts)} | {links} | `{command}` |")
    return "\n".join(lines)


def demo_facts(root: Path = ROOT) -> dict:
    """What ``jaxcd demo`` quotes, from the results files: the Paris question's exact
    posterior (SmolLM2, by enumeration) and the P-GCD look-ahead's BFCL accuracy beside
    SMC-GCD's (study 8)."""
    ks = (1, 4, 16)

    def acc(method, k):
        key = f"table/format=json,method={method},particles={k}/accuracy_pct"
        return round(float(lookup(SECOND_MODEL, key, root)), 1)
    sm = json.loads((root / SECOND_MODEL).read_text())
    defensive = [e for e in lookup(SECOND_MODEL_DEFENSIVE, "paired_accuracy", root)
                 if e["a"] == "smc-gcd" and e["b"].startswith("smc-lookahead (defensive")
                 and e["particles"] == 16]
    return {
        "paris": {"source": BIAS, "posterior": {
            w: round(float(v), 3)
            for w, v in lookup(BIAS, "constraints/paris/posterior", root).items()}},
        "lookahead": {
            "source": SECOND_MODEL, "model": sm["model"], "n": int(sm["subset"]["examples"]),
            "hmm_gap_share": round(float(sm["hmm_info"]["heldout"]["gap_share"]), 3),
            "k": list(ks), "smc_gcd_pct": [acc("smc-gcd", k) for k in ks],
            "lookahead_pct": [acc("smc-lookahead", k) for k in ks],
            "defensive_source": SECOND_MODEL_DEFENSIVE,
            "defensive_k16_pct": round(float(defensive[0]["b_pct"]), 1)},
    }


def readme_block(text: str) -> str:
    """The table as it stands in README.md (between the markers)."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true",
                    help="replace the table in README.md and rewrite jaxcd/data/demo_results.json")
    a = ap.parse_args(argv)
    table = render()
    if not a.write:
        print(table)
        return 0
    facts = json.dumps(demo_facts(), indent=1, ensure_ascii=False) + "\n"
    DEMO_FACTS.write_text(facts)
    text = README.read_text()
    old = readme_block(text)
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    README.write_text(text[:start] + "\n" + table + "\n" + text[end:])
    print(f"README.md: results table {'unchanged' if old == table else 'updated'}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
