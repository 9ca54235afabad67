"""Distil SmolLM2-135M-Instruct on the built-in task prompts (issue #11).

Phases, each timed:

1. sample: continuations of the built-in tool-call / JSON / keyword prompts
   (``hmm_distill/data/task_prompts.jsonl``), rendered with the chat template of
   ``jaxcd generate``, sampled until EOS with a hard cap (the default HMM's recipe,
   :class:`hmm_distill.default.DefaultSettings`; the samples live in the default HMM's
   cache directory, so a built default HMM's samples are reused and vice versa).
   Records the EOS fraction, the rows cut off, sampling tokens/s and the LM's
   log-probability of every sampled token.
2. train: full-batch EM at each ``H`` (default 64 and 256) with the data-scaled prior;
   EM tokens/s per iteration.
3. report: held-out log-likelihood per token (HMM, add-β unigram, the LM itself on the
   same held-out continuations) and the share of the unigram→LM gap the HMM closes;
   curves in ``distill_task_curve.png``.

    python experiments/distill_task.py                       # CPU: H = 64, 256
    python experiments/distill_task.py --hidden 1024 4096    # on a GPU
    python experiments/distill_task.py --plot-only experiments/results/distill_task.json

Writes ``experiments/results/distill_task.json`` and ``distill_task_curve.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu_s() -> float:
    """User + system CPU seconds of this process so far (the machine may be shared)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def early_stop(curve, patience: int) -> tuple[int, int]:
    """``(chosen epoch, last epoch run)`` of early stopping with ``patience`` on a held-out
    curve ``[(epoch, heldout_ll, ...), ...]`` (the rule of ``TrainConfig.patience``: stop
    ``patience`` epochs after the best held-out log-likelihood, keep the best)."""
    best_e, best = curve[0][0], curve[0][1]
    for e, h, *_ in curve[1:]:
        if e - best_e > patience:
            return best_e, best_e + patience
        if h > best:
            best_e, best = e, h
    return best_e, curve[-1][0]


def plot(res: dict, path: Path) -> None:
    """Held-out curves of every H with the unigram and LM levels, and the epoch early
    stopping (the default HMM's patience) would keep (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    pat = res.get("patience", 4)
    r0 = next(iter(res["runs"].values()))
    for H, r in res["runs"].items():
        ep, ho, _ = zip(*r["curve"])
        line, = ax.plot(ep, ho, "o-", ms=3, label=f"HMM H={H} held-out (gap share {r['gap_share']:.2f} "
                                                   f"at iteration {ep[-1]})")
        be, stop = early_stop(r["curve"], pat)
        bh = dict((e, h) for e, h, _ in r["curve"])[be]
        g = (bh - r0["unigram_heldout_ll"]) / (r0["lm_heldout_ll"] - r0["unigram_heldout_ll"])
        ax.plot([be], [bh], "*", ms=12, color=line.get_color(),
                label=f"early stopping (patience {pat}): iteration {be}, gap share {g:.2f}")
    ax.axhline(r0["unigram_heldout_ll"], color="gray", ls=":", label="unigram (add-0.1)")
    ax.axhline(r0["lm_heldout_ll"], color="black", ls="--", label="SmolLM2-135M (LM)")
    ax.set_xlabel("EM iteration")
    ax.set_ylabel("held-out log-likelihood per token (nats)")
    st = res["settings"]
    ax.set_title(f"HMM distilled on the built-in task prompts ({st['num_seqs']} continuations, "
                 f"cap {st['max_length']})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plot-only", metavar="JSON", help="only redraw the curves of a results file")
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--epochs", type=int, default=30,
                    help="EM iterations (all are run; the plot marks where early stopping would stop)")
    ap.add_argument("--num-seqs", type=int, default=None, help="default: the default HMM's")
    ap.add_argument("--max-length", type=int, default=None)
    ap.add_argument("--work", default=None, help="run directory (default: under the default HMM's cache dir)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "distill_task.json"))
    a = ap.parse_args(argv)
    if a.plot_only:
        p = Path(a.plot_only)
        plot(json.loads(p.read_text()), p.with_name(p.stem + "_curve.png"))
        return
    import jax
    import numpy as np

    from hmm_distill.default import DefaultSettings, default_hmm_dir
    from hmm_distill.lms import load_lm
    from hmm_distill.prompts import builtin_prompt_set_hash, builtin_prompts_path
    from hmm_distill.sampler import read_prompts, run_sampling
    from hmm_distill.train import TrainConfig, train

    s = DefaultSettings()
    if a.num_seqs or a.max_length:
        s = DefaultSettings(**{**asdict(s), "num_seqs": a.num_seqs or s.num_seqs,
                               "max_length": a.max_length or s.max_length})
    work = Path(a.work) if a.work else default_hmm_dir(None, s)
    res = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "cpu_count": os.cpu_count(), "device": str(jax.devices()[0]),
                       "jax": jax.__version__,
                       "note": "shared machine: other jobs ran on the same 2 cores"},
           "settings": asdict(s), "prompt_set": builtin_prompts_path().name,
           "prompt_set_hash": builtin_prompt_set_hash(), "phases": {}, "patience": s.patience}
    t0, c0 = time.perf_counter(), _cpu_s()
    from jaxcd.model_files import resolve_gguf

    model_file = resolve_gguf(None)
    loaded = load_lm(f"gguf:{model_file}")  # as hmm_distill.default builds it (same sample dir)
    texts, ids = read_prompts(builtin_prompts_path(), fmt="chat", tokenizer_loader=loaded.tokenizer_loader)
    res["phases"]["load_s"], res["phases"]["load_cpu_s"] = time.perf_counter() - t0, _cpu_s() - c0
    t0, c0 = time.perf_counter(), _cpu_s()
    meta = run_sampling(loaded.lm, loaded.params, work / "samples", num_seqs=s.num_seqs,
                        length=s.max_length, shard_size=s.num_seqs, batch_size=s.batch_size, seed=s.seed,
                        temperature=s.temperature, prompt_ids=ids, prompt_texts=texts,
                        model_name=f"gguf:{model_file.name}",
                        fingerprint=loaded.fingerprint, progress=True,
                        prompt_set=builtin_prompts_path().name, until_eos=True, chat_template=True)
    res["phases"]["sample_s_this_call"] = time.perf_counter() - t0
    res["phases"]["sample_cpu_s_this_call"] = _cpu_s() - c0
    res["sampling"] = {k: meta.get(k) for k in ("num_seqs", "max_length", "eos_fraction", "num_cut_off",
                                                "tokens_per_s", "prompt_set_id", "temperature", "prefill_tokens",
                                                "decode_row_steps")}
    del loaded
    res["runs"] = {}
    for H in a.hidden:
        t0, c0 = time.perf_counter(), _cpu_s()
        cfg = TrainConfig(data=str(work / "samples"), out=str(work / f"task_h{H}"), hidden_size=H,
                          epochs=a.epochs, mode="full", prior_strength=s.prior_strength,
                          heldout_frac=s.heldout_frac, seed=s.seed, batch_size=256, plot=False)
        r = train(cfg)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
        last = r.metrics[-1]
        em_tok_s = [m["tokens_per_s"] for m in r.metrics[1:]]
        be, stop = early_stop([(m["epoch"], m["heldout_ll"]) for m in r.metrics], s.patience)
        bm = r.metrics[be]
        res["runs"][str(H)] = {
            "early_stopping": {"patience": s.patience, "best_epoch": be, "would_stop_after": stop,
                               "heldout_ll": bm["heldout_ll"], "gap_share": bm["gap_share"]},
            "heldout_ll": last["heldout_ll"], "unigram_heldout_ll": last["unigram_heldout_ll"],
            "lm_heldout_ll": last["lm_heldout_ll"], "gap_share": last["gap_share"],
            "train_ll": last["train_ll"], "epochs": a.epochs,
            "em_tokens_per_s_median": float(np.median(em_tok_s)) if em_tok_s else None,
            "em_tokens_per_s_first": em_tok_s[0] if em_tok_s else None,
            "train_wall_s": wall, "train_cpu_s": cpu, "curve": [(m["epoch"], m["heldout_ll"], m["train_ll"]) for m in r.metrics]}
        print(json.dumps({H: {k: v for k, v in res["runs"][str(H)].items() if k != "curve"}}), flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    try:
        plot(res, out.with_name(out.stem + "_curve.png"))
    except ImportError:
        print("matplotlib not installed: no curve (pip install 'jaxcd[plot]'; or --plot-only JSON later)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
