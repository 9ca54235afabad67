"""Study 5 (issue 12): keyword-constrained generation on the WordNet concept sets.

A CommonGen substitute (see :mod:`experiments.wordnet`): each example is a set of 3–5
noun/verb lemmas taken from a WordNet 3.0 example sentence, which is the reference.
The model is asked, through its chat template (:func:`jaxcd.generation.format_prompt`,
what ``jaxcd generate`` does)::

    Write one short sentence using all of these words: ball, catch, dog.

and decoding is constrained by :func:`jaxcd.compile_keywords` with every concept's
surface forms (lemma, inflections, capitalised; forms that contain another form of
the same concept are dropped — the language is the same) and ``text_pattern``
:data:`TEXT_PATTERN` (one line of printable ASCII): the output must contain every
concept in some listed form, as a substring, in any order.

Scores per method × K (bootstrap 95% intervals over examples, :data:`BOOTSTRAP`
resamples, seeded):

* **constraint satisfied %**: the decoder's ``valid`` (EOS within the budget and the
  automaton in its final state; checked again in Python in the tests);
* **concept coverage %**: mean over examples of the share of concepts present as a
  *whole word* (case-insensitive) in one of their forms — stricter than the
  constraint, which accepts substrings (``dog`` in ``dogma``);
* **BLEU-4**: sacrebleu's corpus BLEU (13a tokenisation, case-sensitive, sacrebleu's default ``exp``
  smoothing of zero n-gram precisions)
  against the one reference sentence per concept set; the interval resamples examples
  and recomputes corpus BLEU from sacrebleu's per-sentence statistics;
* **seconds per example** (decode only) and, separately, compile time (automaton,
  tables and jit tracing).

Methods and how the output of a method at K particles is chosen are
:mod:`experiments.runner`'s: ``lcd`` / ``gcd`` draw K independent samples from the LCD /
GCD sampler and answer the first valid one; ``smc-lcd``, ``smc-gcd``, ``smc-lookahead``,
``smc-product`` (P-GCD; need ``--hmm``) and ``awrs`` answer one particle drawn from the
normalised SMC weights.

``--budget auto`` is the constraint's smallest budget (``fa.min_budget``: 4–6 tokens
on the 20 sets of the CPU run) plus ``--margin`` (:data:`AUTO_MARGIN` = 24 tokens), rounded up to a multiple of
16: 32 for almost every set (the references are 7–29 tokens long, median 10, so
every reference fits its budget).

Shapes: every concept set has its own automaton. A run first compiles all of them
(cached on disk under the jaxcd cache, so a rerun skips this), then pads each to the
run's largest state, edge, out-degree and mask-row counts (powers of two;
:func:`jaxcd.decoding.buckets.bucket_automaton`); every call goes through
:func:`jaxcd.generate`, whose prompt and budget buckets make one compiled program per
(method, K, budget bucket, prompt bucket) serve every example. ``compiled`` in the predictions and ``compiles`` / ``compile s`` in the summary
separate compilation from decoding.

Outputs in ``--out``: ``predictions.jsonl`` (one line per concept set × method × K:
``id, method, particles, output`` (the exact generated text), ``valid``, ``coverage``
(0–1), ``bleu`` (sacrebleu sentence BLEU, for inspection; the summary's BLEU is the
corpus score) and diagnostics: ``budget``, ``min_budget``, ``seconds``, ``compiled``,
``tables_s``, ``tokens``, ``n_valid_particles``, ``log_Z``), ``summary.json`` (``meta``:
command, machine, data, settings; ``summary``: one entry per method × K; ``examples``:
per-set budget and automaton sizes) and ``summary.md``.

CPU defaults are small (``--limit 20``, K = 4, lcd,gcd,smc-gcd,smc-lookahead): 30 min
wall on this shared 2-core CPU at load ~10, of which 3.5 min compiled the 20 automata
(cached for later runs) and ~2.3 min was jit compilation. The full study (≥ 200 concept
sets, K ∈ {1, 2, 4, 8, 16}, every method) is for a GPU::

    python -m experiments.keywords --methods lcd,gcd,smc-lcd,smc-gcd,smc-lookahead,smc-product \\
        --particles 1,2,4,8,16 --hmm default --budget auto --limit 200 --seed 0 \\
        --out experiments/results/keywords_full
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

TEXT_PATTERN = r"[ -~]+"
AUTO_MARGIN = 24
BOOTSTRAP = 1000
PROMPT = "Write one short sentence using all of these words: {words}."
METHODS = ("lcd", "gcd", "smc-lcd", "smc-gcd", "smc-lookahead", "smc-product", "awrs")  # table order


# --------------------------------------------------------------------------- constraint
def prune_forms(forms) -> list[str]:
    """Drop forms that contain another form as a substring (the "contains one of these
    forms" language is unchanged); order: shortest first, then as given."""
    keep: list[str] = []
    for f in sorted(dict.fromkeys(forms), key=len):
        if not any(k in f for k in keep):
            keep.append(f)
    return keep


def constraint_groups(row: dict) -> list[list[str]]:
    return [prune_forms(f) for f in row["forms"]]


def satisfies(text: str, row: dict) -> bool:
    """The keyword constraint in plain Python (the automaton's language, without EOS):
    every concept has a form as a substring and the text matches :data:`TEXT_PATTERN`."""
    return (re.fullmatch(TEXT_PATTERN, text) is not None
            and all(any(f in text for f in forms) for forms in row["forms"]))


def prompt_text(row: dict) -> str:
    return PROMPT.format(words=", ".join(row["concepts"]))


# --------------------------------------------------------------------------- scoring
def coverage(text: str, row: dict) -> float:
    """Share of concepts with one of their forms as a whole word (case-insensitive)."""
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", text)}
    hits = [any(f.lower() in words for f in forms) for forms in row["forms"]]
    return sum(hits) / len(hits)


def _bleu():
    from sacrebleu.metrics import BLEU
    return BLEU()


def bleu_stats(hyps: list[str], refs: list[str]) -> np.ndarray:
    """sacrebleu's sufficient statistics per sentence: ``[N, 10]`` (hyp length, ref
    length, matching n-grams n=1..4, hypothesis n-grams n=1..4)."""
    return np.asarray(_bleu()._extract_corpus_statistics(list(hyps), [list(refs)]), np.int64)


def bleu_from_stats(stats: np.ndarray) -> float:
    """Corpus BLEU of the summed statistics (= ``sacrebleu.corpus_bleu`` on those rows)."""
    return float(_bleu()._compute_score_from_stats([int(x) for x in np.asarray(stats).sum(0)]).score)


def corpus_bleu(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu
    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score)


def bootstrap_ci(values, stat=np.mean, n: int = BOOTSTRAP, seed: int = 0) -> list[float]:
    """Percentile 95% interval of ``stat`` over examples resampled with replacement."""
    values = np.asarray(values)
    if len(values) == 0:
        return [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n, len(values)))
    reps = np.array([stat(values[i]) for i in idx], np.float64)
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return [float(lo), float(hi)]


def summarize(preds: list[dict], rows_by_id: dict, seed: int = 0) -> list[dict]:
    """One summary row per (method, particles) from prediction records."""
    groups: dict[tuple, list[dict]] = {}
    for p in preds:
        groups.setdefault((p["method"], p["particles"]), []).append(p)
    out = []
    for (method, k), ps in groups.items():
        hyps = [p["output"] for p in ps]
        refs = [rows_by_id[p["id"]]["reference"] for p in ps]
        valid = np.array([p["valid"] for p in ps], np.float64) * 100
        cov = np.array([p["coverage"] for p in ps], np.float64) * 100
        stats = bleu_stats(hyps, refs)
        secs = np.array([p.get("seconds", np.nan) for p in ps], np.float64)
        compiled = np.array([bool(p.get("compiled")) for p in ps])
        warm = secs[~compiled]
        warm_mean = float(np.nanmean(warm)) if np.isfinite(warm).any() else None
        out.append({
            "method": method, "particles": k, "n": len(ps),
            "valid_pct": float(valid.mean()), "valid_ci": bootstrap_ci(valid, seed=seed),
            "coverage_pct": float(cov.mean()), "coverage_ci": bootstrap_ci(cov, seed=seed),
            "bleu": corpus_bleu(hyps, refs),
            "bleu_ci": bootstrap_ci(stats, stat=bleu_from_stats, seed=seed),
            "seconds_per_example": float(np.nanmean(secs)) if np.isfinite(secs).any() else None,
            "seconds_warm": warm_mean,
            "compiles": int(compiled.sum()),
            # time of the calls that compiled, beyond a warm call's: the jit compile cost
            "compile_seconds": (float(np.nansum(secs[compiled]) - compiled.sum() * warm_mean)
                                if warm_mean is not None and compiled.any() else None),
            "tokens_mean": float(np.mean([p.get("tokens", 0) for p in ps])),
        })
    order = {m: i for i, m in enumerate(METHODS)}
    out.sort(key=lambda r: (order.get(r["method"], 99), r["particles"]))
    return out


def _f(x, nd=2):
    return "–" if x is None else f"{x:.{nd}f}"


def markdown(summary: list[dict], meta: dict) -> str:
    lines = ["## Keyword-constrained generation (WordNet concept sets)", "",
             f"`{meta.get('command', '')}`", "",
             f"{meta.get('n_examples')} concept sets from `{meta.get('data')}`, model "
             f"`{meta.get('model')}`, budget {meta.get('budget')}, seed {meta.get('seed')}, "
             f"HMM {meta.get('hmm')}"
             + (f" (H={meta['hmm_hidden_size']})" if meta.get("hmm_hidden_size") else "")
             + f"; {meta.get('machine_str', '')}", "",
             "| method | K | n | constraint satisfied % | coverage % | BLEU-4 | s/example | "
             "s/example (warm) | compiles | compile s (total) | tokens |",
             "|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|"]

    def ci(v, c):
        return f"{v:.1f} [{c[0]:.1f}, {c[1]:.1f}]"

    for r in summary:
        lines.append(f"| {r['method']} | {r['particles']} | {r['n']} | "
                     f"{ci(r['valid_pct'], r['valid_ci'])} | {ci(r['coverage_pct'], r['coverage_ci'])} | "
                     f"{ci(r['bleu'], r['bleu_ci'])} | {_f(r.get('seconds_per_example'))} | "
                     f"{_f(r.get('seconds_warm'))} | {r.get('compiles', '–')} | "
                     f"{_f(r.get('compile_seconds'), 1)} | {_f(r.get('tokens_mean'), 1)} |")
    lines += ["", "Brackets: bootstrap 95% intervals over concept sets "
              f"({BOOTSTRAP} resamples). Coverage counts whole words (case-insensitive); the "
              "constraint accepts substrings. BLEU: sacrebleu corpus BLEU-4 against one "
              "reference per set (CommonGen has several, so scores are lower than there). "
              "s/example: decode wall time per example (tables included); warm: calls that "
              "compiled nothing; compile s: the extra time of the calls that compiled (near 0 "
              "or negative when the call only compiled small tables: within the noise). "
              f"Output choice: {meta.get('output_choice', '')}."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- decoding
def _pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def compile_row(row: dict, vocab):
    """The example's token automaton (unpadded; cached on disk under the jaxcd cache)."""
    from jaxcd import compile_keywords
    return compile_keywords(constraint_groups(row), vocab, text_pattern=TEXT_PATTERN, cache=True)


def fa_sizes(fa) -> tuple[int, int, int, int]:
    return (int(fa.num_states), int(fa.num_edges), int(np.asarray(fa.out_dst).shape[1]),
            int(np.asarray(fa.cum_masks).shape[0]))


def padded_constraint(fa, row: dict, shape: tuple[int, int, int, int], need_dfa: bool = False):
    """``fa`` padded to ``shape`` = (states, edges, out-degree, mask rows) as a
    :class:`experiments.runner.Constraint` (with the byte DFA only for AWRS)."""
    from jaxcd.automata.keywords import keywords_to_dfa
    from jaxcd.decoding.buckets import bucket_automaton

    from .runner import Constraint
    pfa = bucket_automaton(fa, shape)
    dfa = keywords_to_dfa(constraint_groups(row), TEXT_PATTERN) if need_dfa else None
    s0 = fa_sizes(fa)
    info = {"states": s0[0], "edges": s0[1], "max_out_degree": s0[2], "mask_rows": s0[3],
            "padded": list(shape), "min_budget": int(fa.min_budget)}
    return Constraint(pfa, dfa, info)


def auto_budget(min_budget: int, margin: int = AUTO_MARGIN, multiple: int = 16) -> int:
    """``min_budget + margin`` rounded up to a multiple of ``multiple`` (one compiled
    program serves every example with the same budget)."""
    return -(-(int(min_budget) + int(margin)) // multiple) * multiple


def sentence_bleu(hyp: str, ref: str) -> float:
    import sacrebleu
    return float(sacrebleu.sentence_bleu(hyp, [ref]).score)


def load_rows(a) -> tuple[list[dict], str]:
    from . import wordnet
    path = Path(a.data) if a.data else wordnet.default_dataset(seed=0)
    rows = wordnet.read_jsonl(path)
    for i, r in enumerate(rows):
        missing = [k for k in ("id", "concepts", "forms", "reference") if k not in r]
        if missing:
            raise SystemExit(f"{path}: line {i + 1} lacks {', '.join(missing)}")
    if a.limit and len(rows) > a.limit:
        rng = np.random.default_rng(a.seed)
        keep = sorted(rng.choice(len(rows), a.limit, replace=False).tolist())
        rows = [rows[i] for i in keep]
    return rows, str(path)


def parse_args(argv=None):
    from .runner import HMM_METHODS, METHODS as RUNNER_METHODS
    p = argparse.ArgumentParser(prog="python -m experiments.keywords",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None,
                   help="concept-set JSONL (default: the WordNet set, built on first use)")
    p.add_argument("--methods", default="lcd,gcd,smc-gcd,smc-lookahead")
    p.add_argument("--particles", default="4", help="K[,K...]")
    p.add_argument("--hmm", default="default", help="CKPT, default or none")
    p.add_argument("--budget", default="auto", help="N or auto")
    p.add_argument("--margin", type=int, default=AUTO_MARGIN,
                   help=f"auto budget: min_budget + margin, rounded up to 16 (default {AUTO_MARGIN})")
    p.add_argument("--limit", type=int, default=20, help="N concept sets drawn with --seed; 0: all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--model", default=None, help="GGUF path (default: SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    a.method_list = [m.strip() for m in a.methods.split(",") if m.strip()]
    try:
        a.ks = [int(k) for k in a.particles.split(",") if k.strip()]
    except ValueError:
        p.error("--particles: comma-separated positive integers")
    for m in a.method_list:
        if m not in RUNNER_METHODS:
            p.error(f"--methods: {m!r} is not one of {', '.join(RUNNER_METHODS)}")
    if not a.ks or min(a.ks) < 1:
        p.error("--particles: positive integers")
    if a.budget != "auto" and not (a.budget.isdigit() and int(a.budget) > 0):
        p.error("--budget: a positive integer or auto")
    if a.hmm == "none" and any(m in HMM_METHODS for m in a.method_list):
        p.error("smc-lookahead / smc-product need --hmm (default or a checkpoint)")
    if a.limit < 0:
        p.error("--limit: 0 (all) or a positive integer")
    return a


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(a, model=None, hmm=None) -> dict:
    """Run the study for parsed arguments ``a``; ``model`` (a
    :class:`jaxcd.generation.Model`) and ``hmm`` (``HMMParams``) override ``--model`` /
    ``--hmm`` (tests)."""
    from jaxcd.generation import format_prompt

    from .runner import HMM_METHODS, Runner, machine_info, write_predictions, write_summary
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    rows, data_path = load_rows(a)
    need_hmm = any(m in HMM_METHODS for m in a.method_list)
    runner = Runner(model if model is not None else a.model,
                    hmm=(hmm if hmm is not None else a.hmm) if need_hmm else None,
                    temperature=a.temperature)
    tok, vocab = runner.tokenizer, runner.vocab
    # pass 1: every example's automaton (cached on disk), so the run pads to one shape
    t0 = time.perf_counter()
    fas, build_s = [], []
    for r in rows:
        tb = time.perf_counter()
        fas.append(compile_row(r, vocab))
        build_s.append(time.perf_counter() - tb)
    sizes = np.array([fa_sizes(fa) for fa in fas])
    shape = (_pow2(sizes[:, 0].max() + 1), _pow2(sizes[:, 1].max()), _pow2(sizes[:, 2].max()),
             _pow2(sizes[:, 3].max()))
    log(f"{len(rows)} concept sets from {data_path}; automata compiled in "
        f"{time.perf_counter() - t0:.1f} s, padded to {shape[0]} states, {shape[1]} edges, "
        f"out-degree {shape[2]}, {shape[3]} mask rows")
    preds, per_example = [], []
    for i, (r, fa) in enumerate(zip(rows, fas)):
        c = padded_constraint(fa, r, shape, need_dfa="awrs" in a.method_list)
        ids = format_prompt(tok, prompt_text(r))
        budget = auto_budget(fa.min_budget, a.margin) if a.budget == "auto" else int(a.budget)
        if budget < fa.min_budget:
            log(f"{r['id']}: budget {budget} < min_budget {fa.min_budget}; skipped")
            continue
        per_example.append({"id": r["id"], "concepts": r["concepts"], "budget": budget,
                            "min_budget": int(fa.min_budget), "prompt_tokens": len(ids),
                            "build_s": round(build_s[i], 3), **c.info})
        for method in a.method_list:
            for K in a.ks:
                res = runner.run(method, c, ids, budget, K, a.seed, tag=r["id"])
                cov = coverage(res.output, r)
                bleu = sentence_bleu(res.output, r["reference"])
                preds.append({"id": r["id"], "method": method, "particles": K,
                              "output": res.output, "valid": res.output_valid,
                              "coverage": cov, "bleu": bleu, "budget": budget,
                              "min_budget": int(fa.min_budget), "seconds": res.seconds,
                              "compiled": res.compiled, "tables_s": res.tables_s,
                              "tokens": res.tokens, "n_valid_particles": int(sum(res.valid)),
                              "log_Z": res.log_Z, **({"num_checks": res.num_checks}
                                                     if res.num_checks is not None else {})})
                log(f"{i + 1}/{len(rows)} {r['id']} {method} K={K} budget={budget} "
                    f"valid={res.output_valid} coverage={cov:.2f} {res.seconds:.1f}s"
                    f"{' (compiled)' if res.compiled else ''}: {res.output!r}")
        runner.release(c)
        write_predictions(out / "predictions.jsonl", preds)
    summary = summarize(preds, {r["id"]: r for r in rows}, seed=a.seed)
    meta = {"command": "python -m experiments.keywords " + " ".join(
                sys.argv[1:] if model is None else ["(in-process)"]),
            "args": {k: v for k, v in vars(a).items()}, "machine": machine_info(),
            "model": Path(runner.model.path).name if runner.model.path else "custom",
            "hmm": a.hmm if need_hmm else None,
            "hmm_hidden_size": (int(np.shape(runner._hmm.A)[0])
                                if need_hmm and runner._hmm is not None else None),
            "data": data_path, "n_examples": len(rows),
            "seed": a.seed, "wall_s": round(time.perf_counter() - t_start, 1),
            "budget": (f"auto: min_budget + {a.margin}, rounded up to 16"
                       if a.budget == "auto" else f"fixed {a.budget}"),
            "padded_shape": list(shape), "prompt": PROMPT, "text_pattern": TEXT_PATTERN,
            "output_choice": "lcd/gcd: first valid of K independent samples; smc-*/awrs: "
                             "one particle drawn from the normalised weights"}
    meta["machine_str"] = (f"{meta['machine']['date']}, {meta['machine']['backend']} "
                           f"({meta['machine']['cpu']}), wall {meta['wall_s']} s")
    result = {"meta": meta, "summary": summary, "examples": per_example}
    write_summary(out, result, markdown(summary, meta))
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
