"""Join the shards of a run into one results folder, as if it had run on one machine.

    python -m experiments.merge DIR1 DIR2 ... --out DIR [--partial]

Each ``DIR`` is either

- a folder written by ``python -m experiments.tool_calls ... --shard I/N`` (its
  ``run.json``, ``records.jsonl``): the merged folder gets ``records.jsonl``,
  ``predictions.jsonl`` (rows in the seeded example order, as an unsharded run writes
  them), ``summary.json`` and ``summary.md``; or
- a folder written by ``python -m experiments.studies NAME ... --shard I/N`` (its
  ``NAME.json`` and the tool_calls folders ``*run/`` inside): every ``*run/`` is merged
  as above, and the study's tables, figure, ``NAME.json`` and ``NAME.md`` are rebuilt from
  the merged rows (the study code takes the merged rows; nothing is recomputed).

Refused: shards whose settings differ (every argument that changes a row, the examples
by content, the model file, the HMM by content; ``--time-limit``, ``--resume`` and the
output folder may differ), shards of different N, the same shard twice, and — unless
``--partial`` — a missing shard or a shard stopped before its last example. With
``--partial`` the merged folder holds the examples that were finished and says which
were planned (``n_planned``, ``missing_ids``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: study settings that may differ between the shards of one study
STUDY_NON_SETTINGS = ("shard", "resume", "time_limit")


class MergeError(SystemExit):
    """The folders cannot be merged (the message says why)."""

    def __init__(self, msg: str):
        super().__init__(f"experiments.merge: {msg}")


def _diff(a: dict, b: dict, skip=()) -> list[str]:
    keys = sorted((set(a) | set(b)) - set(skip))
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]


def load_run(d: Path) -> dict:
    from experiments.runner import read_records
    if not (d / "run.json").exists():
        raise MergeError(f"{d} has no run.json (not a tool_calls run folder of this version)")
    info = json.loads((d / "run.json").read_text())
    recs = read_records(d / "records.jsonl")
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
    return {"dir": d, "info": info, "records": recs, "meta": summary.get("meta", {})}


def check_runs(runs: list[dict], partial: bool) -> dict:
    """The checks of the module docstring; returns ``{"n": N, "missing_shards": [...],
    "missing_ids": [...]}``."""
    first = runs[0]
    for r in runs[1:]:
        d = _diff(first["info"]["settings"], r["info"]["settings"])
        if d:
            raise MergeError(f"{r['dir']} was run with other settings than {first['dir']}: "
                             + "; ".join(d))
        if r["info"]["example_ids"] != first["info"]["example_ids"]:
            raise MergeError(f"{r['dir']} and {first['dir']} ran different example lists")
    shards = [tuple(r["info"]["shard"]) if r["info"].get("shard") else None for r in runs]
    if None in shards:
        if len(runs) > 1:
            raise MergeError("an unsharded run cannot be merged with others: "
                             + ", ".join(str(r["dir"]) for r, s in zip(runs, shards) if s is None))
        N = 1
    else:
        Ns = {n for _, n in shards}
        if len(Ns) > 1:
            raise MergeError(f"shards of different N: {sorted(Ns)}")
        N = Ns.pop()
        seen: dict = {}
        for r, (i, _) in zip(runs, shards):
            if i in seen:
                raise MergeError(f"shard {i}/{N} given twice: {seen[i]} and {r['dir']}")
            seen[i] = r["dir"]
    present = {s[0] for s in shards if s} if N > 1 else {1}
    missing_shards = sorted(set(range(1, N + 1)) - present)
    done = {rec["id"] for r in runs for rec in r["records"]}
    planned = [i for r in runs for i in r["info"]["planned_ids"]]
    missing_ids = [i for i in planned if i not in done]
    if (missing_shards or missing_ids) and not partial:
        raise MergeError(
            "incomplete: "
            + (f"shards {missing_shards} of {N} not given; " if missing_shards else "")
            + (f"{len(missing_ids)} planned examples not finished ("
               + ", ".join(f"{r['dir']}: {len(r['records'])} of {len(r['info']['planned_ids'])}"
                           for r in runs) + "); " if missing_ids else "")
            + "finish them (--resume) or pass --partial")
    return {"n": N, "missing_shards": missing_shards, "missing_ids": missing_ids}


def merge_runs(dirs: list[Path], out: Path, partial: bool = False, argv=None,
               data: Path | None = None, answers: Path | None = None) -> dict:
    """Merge tool_calls shard folders ``dirs`` into ``out``; returns the summary."""
    from experiments import tool_calls as tc
    from experiments.provenance import command
    from experiments.runner import append_record, write_predictions

    runs = [load_run(Path(d)) for d in dirs]
    chk = check_runs(runs, partial)
    first = runs[0]
    order = {i: n for n, i in enumerate(first["info"]["example_ids"])}
    recs = sorted((rec for r in runs for rec in r["records"]), key=lambda rec: order[rec["id"]])
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.jsonl").write_text("")
    for rec in recs:
        append_record(out / "records.jsonl", rec)
    rows = [x for rec in recs for x in rec["rows"]]
    per_example = [x for rec in recs for x in rec["examples"]]
    skipped = [x for rec in recs for x in rec["skipped"]]
    planned = [i for i in first["info"]["example_ids"]
               if any(i in r["info"]["planned_ids"] for r in runs)] if chk["missing_shards"] \
        else list(first["info"]["example_ids"])
    info = {"settings": first["info"]["settings"], "shard": None,
            "example_ids": first["info"]["example_ids"], "planned_ids": planned}
    (out / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    write_predictions(out / "predictions.jsonl", rows)
    # the arguments of the first shard, without the slice (what an unsharded run records)
    args = dict(first["meta"].get("args") or {})
    args.update(shard=None, out=str(out), resume=False)
    if data is not None:
        args["data"] = str(data)
    if answers is not None:
        args["answers"] = str(answers)
    a = SimpleNamespace(**args)
    a.argv = []
    machines = [r["meta"].get("machine") for r in runs]
    extra = dict(info, command=command("experiments.merge", argv),
                 machine=machines[0] or {}, machines=machines,
                 wall_s=round(sum(r["meta"].get("wall_s") or 0.0 for r in runs), 1),
                 merged_from=[{"dir": str(r["dir"]), "shard": r["info"].get("shard"),
                               "command": r["meta"].get("command"),
                               "examples": len(r["records"])} for r in runs],
                 n_shards=chk["n"], missing_shards=chk["missing_shards"],
                 missing_ids=chk["missing_ids"], resumed_ids=[])
    return tc._write_summaries(a, out, rows, per_example, None, len(recs), 0.0,
                               n_planned=len(planned), skipped=skipped,
                               model_name=first["meta"].get("model"), extra_meta=extra)


def merge_studies(dirs: list[Path], out: Path, partial: bool = False, argv=None) -> dict:
    """Merge ``experiments.studies`` shard folders: their tool_calls runs, then the
    study's tables from the merged rows."""
    from experiments import studies

    found = []
    for d in dirs:
        js = [p for p in d.glob("*.json") if p.stem in studies.STUDIES]
        if len(js) != 1:
            raise MergeError(f"{d}: expected one STUDY.json (found {[p.name for p in js]})")
        found.append(json.loads(js[0].read_text()))
    first = found[0]
    name, mode = first["study"], first["mode"]
    if name not in studies.SHARDABLE:
        raise MergeError(f"study {name} is not sharded (only {', '.join(studies.SHARDABLE)})")
    for d, res in zip(dirs[1:], found[1:]):
        if res["study"] != name or res["mode"] != mode:
            raise MergeError(f"{d} holds study {res['study']} ({res['mode']}), "
                             f"{dirs[0]} study {name} ({mode})")
        diff = _diff(first["settings"], res["settings"], STUDY_NON_SETTINGS)
        if res["provenance"].get("seeds") != first["provenance"].get("seeds"):
            diff.append(f"seeds: {first['provenance'].get('seeds')} vs {res['provenance'].get('seeds')}")
        if Path(str(res.get("model"))).name != Path(str(first.get("model"))).name:
            diff.append(f"model: {first.get('model')} vs {res.get('model')}")
        if diff:
            raise MergeError(f"{d} was run with other settings than {dirs[0]}: " + "; ".join(diff))
        if (d / "data" / "data.jsonl").read_bytes() != (dirs[0] / "data" / "data.jsonl").read_bytes():
            raise MergeError(f"{d} and {dirs[0]} drew different example subsets")
    out.mkdir(parents=True, exist_ok=True)
    if (out / "data").resolve() != (dirs[0] / "data").resolve():
        shutil.copytree(dirs[0] / "data", out / "data", dirs_exist_ok=True)
    subs = sorted(p.name for p in dirs[0].glob("*run") if (p / "run.json").exists())
    if not subs:
        raise MergeError(f"{dirs[0]} has no tool_calls run folder (*run/run.json)")
    studies._RUNS.clear()
    merged = {}
    for sub in subs:
        merged[sub] = merge_runs([d / sub for d in dirs], out / sub, partial, argv,
                                 data=out / "data" / "data.jsonl",
                                 answers=out / "data" / "answers.jsonl")
        studies.register_run(out / sub)
    st = {k: v for k, v in first["settings"].items() if k not in ("shard", "resume")}
    model = first.get("model")
    model = None if model is None or str(model).startswith("default (") else model
    seed = (first["provenance"].get("seeds") or [0])[0]
    record = {"merged_from": [{"dir": str(d), "shard": r["settings"].get("shard"),
                               "command": r["provenance"]["command"],
                               "date_utc": r["provenance"]["date_utc"],
                               "machine": r["provenance"]["machine"],
                               "git": r["provenance"]["git"],
                               "seconds": r.get("seconds"), "cpu_s": r.get("cpu_s")}
                              for d, r in zip(dirs, found)],
              "shards": {sub: {"n_shards": m["meta"]["n_shards"],
                               "missing_shards": m["meta"]["missing_shards"],
                               "missing_ids": m["meta"]["missing_ids"]}
                         for sub, m in merged.items()}}
    studies._REUSE_ONLY = True
    try:
        res = studies.run_study(name, mode, out, seed, st.get("limit"), model, argv,
                                overrides=st, module="experiments.merge", record=record)
    finally:
        studies._REUSE_ONLY = False
    # the study's own cost is its shards' (the merge computes nothing)
    res["seconds"] = round(sum(r.get("seconds") or 0.0 for r in found), 1)
    res["cpu_s"] = round(sum(r.get("cpu_s") or 0.0 for r in found), 1)
    # the machine's load while the shards ran, not while merging (several shards: the first's)
    if found[0].get("load_avg"):
        res["load_avg"] = found[0]["load_avg"]
    else:
        res.pop("load_avg", None)
    (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.merge",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="the shards' output folders (tool_calls or studies)")
    ap.add_argument("--out", required=True, help="the merged folder")
    ap.add_argument("--partial", action="store_true",
                    help="merge even if shards are missing or stopped early (recorded)")
    a = ap.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    dirs = [Path(d) for d in a.dirs]
    for d in dirs:
        if not d.is_dir():
            ap.error(f"{d} is not a folder")
    out = Path(a.out)
    if any(out.resolve() == d.resolve() for d in dirs):
        ap.error("--out must be a new folder, not one of the shards")
    if (dirs[0] / "run.json").exists():
        s = merge_runs(dirs, out, a.partial, argv)
        print(f"merged {len(dirs)} folders: {s['meta']['n_examples']} examples -> {out}")
    else:
        res = merge_studies(dirs, out, a.partial, argv)
        print(f"merged {len(dirs)} shards of study {res['study']}: "
              f"{res.get('subset', {}).get('examples')} examples -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
