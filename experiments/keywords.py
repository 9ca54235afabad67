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
* **BLEU-4**: sacrebleu's corpus BLEU (13a tokenisation, case-sensitive, no smoothing)
  against the one reference sentence per concept set; the interval resamples examples
  and recomputes corpus BLEU from sacrebleu's per-sentence statistics;
* **seconds per example** (decode only) and, separately, compile time (automaton,
  tables and jit tracing).

``--budget auto`` is the constraint's smallest budget (``fa.min_budget``) plus
:data:`AUTO_MARGIN` tokens.

CPU defaults are small (``--limit 20``, ``--particles 4``); the full study (≥ 200
concept sets, K ∈ {1, 2, 4, 8, 16}, every method) is for a GPU::

    python -m experiments.keywords --methods lcd,gcd,smc-gcd,smc-lookahead,smc-product \\
        --particles 1,2,4,8,16 --hmm default --budget auto --limit 200 --seed 0 \\
        --out experiments/results/keywords
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
METHODS = ("lcd", "gcd", "smc-gcd", "smc-lookahead", "smc-product")


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


def bootstrap_ci(values, stat=np.mean, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of ``stat`` over examples resampled with replacement."""
    values = np.asarray(values)
    if len(values) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n, len(values)))
    reps = np.array([stat(values[i]) for i in idx], np.float64)
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return float(lo), float(hi)


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
        comp = np.array([p.get("compile_seconds", np.nan) for p in ps], np.float64)
        out.append({
            "method": method, "particles": k, "n": len(ps),
            "valid_pct": float(valid.mean()), "valid_ci": bootstrap_ci(valid, seed=seed),
            "coverage_pct": float(cov.mean()), "coverage_ci": bootstrap_ci(cov, seed=seed),
            "bleu": corpus_bleu(hyps, refs),
            "bleu_ci": bootstrap_ci(stats, stat=bleu_from_stats, seed=seed),
            "seconds_per_example": float(np.nanmean(secs)) if np.isfinite(secs).any() else None,
            "compile_seconds_per_example": (float(np.nanmean(comp)) if np.isfinite(comp).any()
                                            else None),
        })
    order = {m: i for i, m in enumerate(METHODS)}
    out.sort(key=lambda r: (order.get(r["method"], 99), r["particles"]))
    return out


def markdown(summary: list[dict], meta: dict) -> str:
    lines = [f"# Keyword-constrained generation (WordNet concept sets)", "",
             f"`{meta.get('command', '')}`", "",
             f"{meta.get('n_examples')} concept sets from `{meta.get('data')}`, model "
             f"`{meta.get('model')}`, budget {meta.get('budget')}, seed {meta.get('seed')}, "
             f"HMM {meta.get('hmm')}; {meta.get('machine', '')}", "",
             "| method | K | n | constraint satisfied % | coverage % | BLEU-4 | s/example | compile s/example |",
             "|---|---:|---:|---|---|---|---:|---:|"]

    def ci(v, c):
        return f"{v:.1f} [{c[0]:.1f}, {c[1]:.1f}]"

    for r in summary:
        sec = "" if r["seconds_per_example"] is None else f"{r['seconds_per_example']:.2f}"
        comp = ("" if r["compile_seconds_per_example"] is None
                else f"{r['compile_seconds_per_example']:.2f}")
        lines.append(f"| {r['method']} | {r['particles']} | {r['n']} | "
                     f"{ci(r['valid_pct'], r['valid_ci'])} | {ci(r['coverage_pct'], r['coverage_ci'])} | "
                     f"{ci(r['bleu'], r['bleu_ci'])} | {sec} | {comp} |")
    lines += ["", "Brackets: bootstrap 95% intervals over examples "
              f"({BOOTSTRAP} resamples). Coverage counts whole words (case-insensitive); the "
              "constraint accepts substrings. BLEU: sacrebleu corpus BLEU-4 against one "
              "reference per set (CommonGen has several, so these are lower)."]
    return "\n".join(lines) + "\n"
