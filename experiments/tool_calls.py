r"""Function calling on BFCL data: constraint satisfaction and accuracy of LCD, GCD, SMC
and P-GCD (the paper's Tables 1/3, Figure 2, on the Berkeley Function Calling
Leaderboard instead of xLAM).

    python -m experiments.tool_calls --data bfcl:simple_python --format json \
        --methods lcd,gcd,smc-gcd,smc-lookahead --particles 4 --hmm default \
        --budget auto --limit 20 --seed 0 --out experiments/results/tool_calls/sp_json

``--data`` / ``--answers``: JSON Lines files (BFCL's ``BFCL_v4_<category>.json`` and
``possible_answer/BFCL_v4_<category>.json``), or ``bfcl:<category>`` for the files of
the ``bfcl-eval`` wheel (fetched into the jaxcd cache on first use; the answers default
to the category's). Several comma-separated ``--data`` entries are concatenated (and
``--answers`` then lists as many files, or ``auto``). ``--format``: ``json`` (a JSON
array of ``{"name", "arguments"}``) or ``python`` (``[f(a=1, b='x'), ...]``), or
``json,python`` for both. Methods and how the output of a method at K particles is
chosen: :mod:`experiments.runner` (``lcd``/``gcd``: K independent samples, the first
valid one; ``smc-*``/``awrs``: one particle drawn from the weighted ensemble; ``awrs``
uses the example's byte automaton as a black-box prefix oracle and reports the number of
predicate calls).

``--budget auto`` = ``min_budget + margin`` rounded up to a multiple of 16 and capped
at ``--budget-cap`` (256), where ``min_budget`` is the smallest budget of the example's
constraint (``fa.min_budget``: one call with the shortest values) and ``margin`` is
``--margin`` (default 48 tokens; 144 in the ``parallel*`` categories, whose answers hold
several calls). On samples of 12 examples per category the ground-truth answers needed
``min_budget`` + 0–36 tokens in ``simple_python``/``multiple``/``live_multiple`` and
+20–183 in ``parallel``. The budget is recorded per example.

``--limit N``: N examples drawn with ``--seed`` from the data (kept in file order);
``--limit 0``: all of them.

Outputs in ``--out``: ``predictions.jsonl`` (one line per example × format × method × K:
``id, method, particles, output`` (the exact generated text), ``valid``, ``correct``
(BFCL's AST checker; ``null`` without ground truth) and diagnostics: ``format``,
``category``, ``budget``, ``min_budget``, ``seconds``, ``compiled``, ``tokens``,
``n_valid_particles``, ``why``), ``summary.json`` and ``summary.md`` (per format ×
method × K: n, valid %, accuracy % with a bootstrap 95% interval, mean seconds per
example — all calls and the calls that compiled nothing — compiles, output tokens).

Shapes. Each example has its own automaton; every call goes through
:func:`jaxcd.generate` (the path users run), whose jitted programs are specialised on
shape buckets. All automata of a run (per format) are padded to one bucket, the run's
largest state, edge and out-degree counts (powers of two;
:func:`jaxcd.decoding.buckets.bucket_automaton` — masks are one row gather whatever the
size, so padding costs memory, not time); prompts and budgets take ``generate``'s
buckets (:func:`jaxcd.decoding.buckets.prompt_bucket`,
:func:`~jaxcd.decoding.buckets.budget_bucket`): one compiled program per (method, K,
format, prompt bucket, budget bucket) serves every example. ``compiled`` in the predictions and ``compiles`` in the summary say
how many calls paid for a compilation.

``--pad run`` pads both formats' automata to one shape (with ``--budget auto-max``: one
budget, the run's largest auto budget), so that the two formats share every compiled program: on a CPU each program
of SmolLM2-135M (one per method × K) takes about a minute of compile.

Work saved per example (:class:`experiments.runner.Runner`): the prompt is prefilled once
per example and format and shared by every method and K
(:meth:`jaxcd.generation.Model.prefilled`; its time counts in the first call's seconds); a decode step whose rows have ALL emitted EOS skips its LM work (exact: no
output changes); ``lcd``/``gcd`` at several K draw ``max K`` samples once and score each
K on its first K samples (i.i.d. samples: each K's result has its own distribution;
``--independent-k`` runs one call per K). ``--time-limit S`` starts no new example after
S seconds (the examples run are a prefix of the seeded order). ``cpu_s`` (process CPU
seconds of the call) sits next to ``seconds`` in the predictions.

``--shard I/N`` runs every N-th example (from the I-th) of the run's seeded order, with
the shapes planned over all of them (its rows equal the unsharded run's);
``records.jsonl`` gets one line per finished example, and ``--resume`` continues a stopped
run from it (``run.json`` holds the settings it must agree with).
``python -m experiments.merge`` joins shard folders.

CPU defaults are small (``--limit 20``, K = 4). Full settings for a GPU::

    python -m experiments.tool_calls --data bfcl:simple_python,bfcl:multiple,bfcl:parallel,\
bfcl:parallel_multiple,bfcl:live_multiple --answers auto --format json,python \
        --methods lcd,gcd,smc-lcd,smc-gcd,smc-lookahead,smc-product \
        --particles 1,2,4,8,16 --hmm default --budget auto --limit 0 --seed 0 \
        --out experiments/results/tool_calls/full
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from jaxcd.decoding.buckets import prompt_bucket

from . import bfcl
from .runner import (HMM_METHODS, METHODS, Runner, Shapes, append_record, build_constraint,
                     machine_info, parse_shard, read_records, shard_indices, summarize,
                     summary_markdown, write_predictions, write_summary)

DEFAULT_MARGIN = 48
PARALLEL_MARGIN = 144


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.tool_calls",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="JSONL file(s) or bfcl:<category>, comma-separated")
    p.add_argument("--answers", default="auto", help="possible-answer JSONL file(s), or auto")
    p.add_argument("--format", default="json", help="json, python or json,python")
    p.add_argument("--methods", default="lcd,gcd,smc-gcd,smc-lookahead")
    p.add_argument("--particles", default="4", help="K[,K...]")
    p.add_argument("--hmm", default="default", help="CKPT, default, task or none")
    p.add_argument("--defensive", type=float, default=None,
                   help="P-GCD proposals: the GCD share of the defensive mixture (default smc.DEFENSIVE)")
    p.add_argument("--psi-power", type=float, default=1.0,
                   help="P-GCD proposals: propose with psi^alpha (weights stay exact)")
    p.add_argument("--budget", default="auto",
                   help="N, auto (per example) or auto-max (the run's largest auto budget, "
                        "per format: fewer compiles)")
    p.add_argument("--margin", type=int, default=None,
                   help=f"auto budget margin (default {DEFAULT_MARGIN}; {PARALLEL_MARGIN} for "
                        "parallel categories)")
    p.add_argument("--budget-cap", type=int, default=256)
    p.add_argument("--pad", default="format", choices=("format", "run"),
                   help="automaton padding: per format (default), or one shape for all formats "
                        "(with --budget auto-max: one budget) so "
                        "that both formats share every compiled program")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--time-limit", type=float, default=0,
                   help="seconds: start no new example after this much wall time (0 = none); "
                        "the examples run are a prefix of the (seeded) example order")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--independent-k", action="store_true",
                   help="lcd/gcd: one call per K (default: one draw of max K samples, the "
                        "result at K from its first K; see Runner.run_ks)")
    p.add_argument("--model", default=None, help="GGUF path (default: SmolLM2-135M-Instruct)")
    p.add_argument("--shard", default=None,
                   help="I/N: run only shard I of N (every N-th example of the seeded order, "
                        "starting at the I-th); shapes are planned over all examples, so the "
                        "rows equal the unsharded run's; python -m experiments.merge joins them")
    p.add_argument("--resume", action="store_true",
                   help="continue a stopped run in --out: the examples recorded in "
                        "records.jsonl are kept, not rerun (refused if the settings differ)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        a.shard_tuple = parse_shard(a.shard)
    except ValueError as e:
        p.error(str(e))
    a.argv = list(sys.argv[1:] if argv is None else argv)
    a.formats = [f.strip() for f in a.format.split(",") if f.strip()]
    a.method_list = [m.strip() for m in a.methods.split(",") if m.strip()]
    a.ks = [int(k) for k in a.particles.split(",") if k.strip()]
    for f in a.formats:
        if f not in ("json", "python"):
            p.error(f"--format: {f!r} is not json or python")
    for m in a.method_list:
        if m not in METHODS:
            p.error(f"--methods: {m!r} is not one of {', '.join(METHODS)}")
    if not a.ks or min(a.ks) < 1:
        p.error("--particles: positive integers")
    if a.budget not in ("auto", "auto-max") and not (a.budget.isdigit() and int(a.budget) > 0):
        p.error("--budget: a positive integer, auto or auto-max")
    if a.hmm == "none" and any(m in HMM_METHODS for m in a.method_list):
        p.error("smc-lookahead / smc-product need --hmm (default or a checkpoint)")
    return a


def load(a) -> list[bfcl.Example]:
    datas = [d.strip() for d in a.data.split(",") if d.strip()]
    if a.answers == "auto":
        answers = [bfcl.resolve(d, answers=True) if d.startswith("bfcl:") else None
                   for d in datas]
    else:
        answers = [x.strip() for x in a.answers.split(",")]
        if len(answers) != len(datas):
            raise SystemExit(f"--answers lists {len(answers)} files for {len(datas)} --data")
    exs = []
    for d, ans in zip(datas, answers):
        part = bfcl.load_examples(bfcl.resolve(d), ans)
        if a.limit and len(part) > a.limit:
            rng = np.random.default_rng(a.seed)
            keep = sorted(rng.choice(len(part), a.limit, replace=False).tolist())
            part = [part[i] for i in keep]
        exs += part
    return exs


#: arguments that do not change a run's rows: where it writes, which slice it runs, how
#: long it may take, and where the examples were read from (their content is compared)
NON_SETTINGS = ("out", "shard", "shard_tuple", "resume", "time_limit", "argv", "data", "answers",
                "limit")


def _file_key(spec):
    """A checkpoint / model named by content where it is a file (paths differ between
    machines and output folders), else the spec itself."""
    if spec and Path(str(spec)).is_file():
        import hashlib
        h = hashlib.sha256()
        with open(spec, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()[:16]
    return spec


def examples_key(exs) -> str:
    """A hash of the examples (ids, prompts, functions, ground truth) in run order."""
    import dataclasses
    import hashlib
    blob = json.dumps([dataclasses.asdict(e) for e in exs], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_settings(a, exs, model_name: str) -> dict:
    """What must agree between the shards of one run and between a stopped run and its
    resumption: every argument that changes the rows, the examples by content, the
    model file by name and the HMM by content."""
    st = {k: v for k, v in vars(a).items() if k not in NON_SETTINGS}
    st["model"] = model_name
    st["hmm"] = _file_key(a.hmm) if any(m in HMM_METHODS for m in a.method_list) else "unused"
    st["examples"] = examples_key(exs)
    st["n_examples_all"] = len(exs)
    return json.loads(json.dumps(st, default=str))


def auto_budget(a, ex: bfcl.Example, min_budget: int) -> int:
    margin = a.margin if a.margin is not None else (
        PARALLEL_MARGIN if "parallel" in ex.category else DEFAULT_MARGIN)
    return min(a.budget_cap, -(-(min_budget + margin) // 16) * 16)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(a) -> dict:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    exs = load(a)
    runner = Runner(a.model, hmm=a.hmm if any(m in HMM_METHODS for m in a.method_list) else None,
                    temperature=a.temperature, defensive=a.defensive, psi_power=a.psi_power)
    tok, vocab = runner.tokenizer, runner.vocab
    rows: list[dict] = []
    per_example: list[dict] = []
    skipped: list[dict] = []        # (example, format) pairs whose budget < min_budget
    # pass 1: every example's automaton (sizes only) and prompt, so that the run pads the
    # automata of a format to one shape
    t0 = time.perf_counter()
    pow2 = lambda x: 1 << max(int(x) - 1, 0).bit_length()          # noqa: E731
    plan: dict[str, dict] = {}
    for fmt in a.formats:
        sizes, built = [], []
        for ex in exs:
            nfa, info = bfcl.constraint_nfa(ex, fmt)
            c = build_constraint(nfa, vocab, Shapes(min_states=1, min_edges=1, min_degree=1))
            sizes.append((c.info["states"], c.info["edges"], c.info["max_out_degree"],
                          c.min_budget, c.info["mask_rows"]))
            built.append((nfa, info, bfcl.prompt_ids(ex, tok, fmt)))
        S = pow2(max(x[0] for x in sizes) + 1)
        E = pow2(max(x[1] for x in sizes))
        D = pow2(max(x[2] for x in sizes))
        R = pow2(max(x[4] for x in sizes))
        mins = [x[3] for x in sizes]
        plan[fmt] = {"S": S, "E": E, "D": D, "R": R, "built": built,
                     "budget": max(auto_budget(a, ex, mb) for ex, mb in zip(exs, mins))}
        log(f"[{fmt}] {len(exs)} examples; automata padded to {S} states, {E} edges, "
            f"out-degree {D}, {R} mask rows")
    if a.pad == "run":          # one shape and auto-max budget for all formats
        top = {k: max(P[k] for P in plan.values()) for k in ("S", "E", "D", "R", "budget")}
        for P in plan.values():
            P.update(top)
        log(f"--pad run: every format padded to {top['S']} states, {top['E']} edges, out-degree "
            f"{top['D']}, {top['R']} mask rows"
            + (f", budget {top['budget']}" if a.budget == "auto-max" else ""))
    log(f"pass 1: {time.perf_counter() - t0:.1f} s")

    # the examples this process runs (all, or one shard: shapes above were planned over
    # every example, so a shard's rows are the unsharded run's rows for its examples)
    todo = shard_indices(len(exs), a.shard_tuple)
    settings = run_settings(a, exs, Path(runner.model.path).name)
    a.run_info = {"settings": settings, "shard": list(a.shard_tuple) if a.shard_tuple else None,
                  "example_ids": [ex.id for ex in exs], "planned_ids": [exs[i].id for i in todo]}
    records_path, run_json = out / "records.jsonl", out / "run.json"
    resumed: dict[int, dict] = {}
    if a.resume and run_json.exists():
        prev = json.loads(run_json.read_text())
        diff = sorted(k for k in set(prev["settings"]) | set(settings)
                      if prev["settings"].get(k) != settings.get(k))
        if diff or prev.get("shard") != a.run_info["shard"]:
            raise SystemExit(
                f"--resume: {out} holds a run with other settings; refusing to mix them ("
                + ", ".join(f"{k}: {prev['settings'].get(k)!r} there, {settings.get(k)!r} now"
                            for k in diff)
                + (f"; shard {prev.get('shard')} there, {a.run_info['shard']} now"
                   if prev.get("shard") != a.run_info["shard"] else "") + ")")
        resumed = {r["index"]: r for r in read_records(records_path, repair=True)}
        log(f"--resume: {len(resumed)} of {len(todo)} examples already done in {records_path}")
    else:
        if a.resume:
            log(f"--resume: no earlier run in {out}; starting afresh")
        records_path.write_text("")
    run_json.write_text(json.dumps(a.run_info, indent=1) + "\n")
    a.resumed_ids = [exs[i].id for i in todo if i in resumed]

    def flush():
        write_predictions(out / "predictions.jsonl", rows)
        _write_summaries(a, out, rows, per_example, runner, done, t_start, n_planned=len(todo),
                         skipped=skipped)

    done = 0
    for n_run, i in enumerate(todo):
        ex = exs[i]
        if i in resumed:                      # finished before the stop: its rows as recorded
            rec = resumed[i]
            if rec["id"] != ex.id:
                raise SystemExit(f"--resume: record {i} is {rec['id']}, the run's example is {ex.id}")
            rows += rec["rows"]
            per_example += rec["examples"]
            skipped += rec["skipped"]
            done = n_run + 1
            continue
        if a.time_limit and time.perf_counter() - t_start > a.time_limit:
            log(f"time limit {a.time_limit:.0f} s reached after {n_run} of {len(todo)} examples")
            break
        n_rows, n_pe, n_sk = len(rows), len(per_example), len(skipped)
        done = n_run + 1
        for fmt in a.formats:
            P = plan[fmt]
            nfa, info, ids = P["built"][i]
            runner.shapes = Shapes(min_states=P["S"],
                                   min_edges=P["E"], min_degree=P["D"], min_mask_rows=P["R"])
            c = runner.constraint(nfa, key="")
            budget = auto_budget(a, ex, c.min_budget) if a.budget == "auto" else \
                P["budget"] if a.budget == "auto-max" else int(a.budget)
            if budget < c.min_budget:
                log(f"{ex.id}: budget {budget} < min_budget {c.min_budget}; skipped")
                skipped.append({"id": ex.id, "format": fmt, "category": ex.category,
                                "budget": budget, "min_budget": c.min_budget})
                continue
            per_example.append({"id": ex.id, "format": fmt, "category": ex.category,
                                "budget": budget, "min_budget": c.min_budget,
                                "prompt_tokens": len(ids),
                                "prompt_width": prompt_bucket(len(ids)),
                                **{k: c.info[k] for k in ("states", "edges", "max_out_degree",
                                                          "build_s")}, **info})
            for method in a.method_list:
                res = runner.run_ks(method, c, ids, budget, a.ks, a.seed, tag=f"{fmt}|{ex.id}",
                                    share=not a.independent_k)
                for K in a.ks:
                    r = res[K]
                    correct, why = bfcl.score(ex, r.output, fmt)
                    row = {"id": ex.id, "method": method, "particles": K, "output": r.output,
                           "valid": r.output_valid, "correct": correct, "format": fmt,
                           "category": ex.category, "budget": budget,
                           "min_budget": c.min_budget, "seconds": r.seconds, "cpu_s": r.cpu_s,
                           "compiled": r.compiled, "compile_s": r.compile_s, "tables_s": r.tables_s, "tokens": r.tokens,
                           "n_valid_particles": int(sum(r.valid)), "log_Z": r.log_Z,
                           "why": why}
                    if r.num_checks is not None:
                        row["num_checks"] = r.num_checks
                    if r.shared_ks:
                        row["shared_ks"] = r.shared_ks
                    rows.append(row)
                    log(f"[{fmt}] {n_run + 1}/{len(todo)} {ex.id} {method} K={K} budget={budget} "
                        f"valid={r.output_valid} correct={correct} {r.seconds:.1f}s"
                        f"{' (compiled: ' + ','.join(r.compiled) + f', {r.compile_s:.1f}s)' if r.compiled else ''}")
            runner.release(c)
        append_record(records_path, {"index": i, "id": ex.id, "rows": rows[n_rows:],
                                     "examples": per_example[n_pe:], "skipped": skipped[n_sk:]})
        flush()
    write_predictions(out / "predictions.jsonl", rows)
    return _write_summaries(a, out, rows, per_example, runner, done, t_start,
                            n_planned=len(todo), skipped=skipped)


def _write_summaries(a, out, rows, per_example, runner, n_examples, t_start,
                     n_planned: int | None = None, skipped: list | None = None,
                     model_name: str | None = None, extra_meta: dict | None = None) -> dict:
    keys = ("format", "method", "particles")
    summary = summarize(rows, keys, seed=a.seed)
    by_cat = summarize(rows, ("category",) + keys, seed=a.seed)
    meta = {"command": "python -m experiments.tool_calls " + " ".join(a.argv),
            "args": {k: v for k, v in vars(a).items()
                     if k not in ("argv", "run_info", "resumed_ids", "shard_tuple")},
            "machine": machine_info(),
            "model": model_name or Path(runner.model.path).name, "hmm": a.hmm,
            "n_examples": n_examples, "n_planned": n_planned or n_examples,
            # (example, format) pairs not run: the budget is below the constraint's minimum
            "skipped": list(skipped or []),
            "wall_s": round(time.perf_counter() - t_start, 1),
            # shards and resumption (run.json): what must agree for experiments.merge
            **getattr(a, "run_info", {}),
            "resumed_ids": list(getattr(a, "resumed_ids", [])),
            "budget_rule": (f"auto: min_budget + margin ({a.margin if a.margin is not None else f'{DEFAULT_MARGIN}, {PARALLEL_MARGIN} for parallel*'}), "
                            f"rounded up to 16, capped at {a.budget_cap}")
            if a.budget == "auto" else
            (f"auto-max: every example of a format (of the run, with --pad run) gets the largest auto budget of the run's "
             f"examples (min_budget + margin, rounded up to 16, capped at {a.budget_cap}): one "
             f"compiled program per method, K and format")
            if a.budget == "auto-max" else f"fixed {a.budget}",
            "output_choice": "lcd/gcd: first valid of K independent samples; smc-*/awrs: "
                             "one particle drawn from the normalised weights",
            "sharing": ("lcd/gcd: " + ("one call per K" if a.independent_k else
                                       "one draw of max K samples per example, the result at K "
                                       "from its first K (rows carry shared_ks and the shared "
                                       "call's seconds)")
                        + "; prompt prefill: once per example and format, shared by every "
                          "method and K (in the seconds of the example's first call)")}
    meta.update(extra_meta or {})
    md = ["## Function calling on BFCL", "", f"`{meta['command']}`", "",
          f"{meta['machine']['date']}, {meta['machine']['backend']} ({meta['machine']['cpu']}), "
          f"model {meta['model']}, HMM {a.hmm}, seed {a.seed}, {n_examples} examples, "
          f"budget {meta['budget_rule']}; wall {meta['wall_s']} s."
          + (f" Skipped (budget below the constraint's minimum): {len(meta['skipped'])} "
             f"example-formats ({', '.join(sorted({x['id'] for x in meta['skipped']}))})."
             if meta["skipped"] else ""), "",
          summary_markdown(summary, keys)]
    if len({r["category"] for r in rows}) > 1:
        md += ["", summary_markdown(by_cat, ("category",) + keys, "per category")]
    result = {"meta": meta, "summary": summary, "by_category": by_cat,
              "examples": per_example}
    write_summary(out, result, "\n".join(md))
    return result


def main(argv=None):
    a = parse_args(argv)
    from jaxcd.model_files import enable_compile_cache
    enable_compile_cache()
    res = run(a)
    print((Path(a.out) / "summary.md").read_text())
    return res


if __name__ == "__main__":
    main()
