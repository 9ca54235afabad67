"""Initialisations compared at equal EM iterations on held-out log-likelihood.

For each hidden size and initialisation (``cluster``: bigram clustering; ``lvd``:
latent-variable initialisation from the LM features recorded while sampling;
``random``), one training job on the same sample directory, the same held-out split and
the same EM settings; the held-out nats/token and gap share after every iteration are
tabulated (iteration 0 = the initialisation itself).

    python -m hmm_distill sample --lm gguf --prompts builtin --until-eos --max-length 128 \\
        --num-seqs 1536 --features 64 --out runs/smol_f64
    python -m experiments.compare_init --data runs/smol_f64 --hidden 128 256 --epochs 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _portable(text: str) -> str:
    """``text`` with this machine's jaxcd cache directory written as ``<cache>``."""
    from jaxcd.model_files import cache_dir

    return text.replace(str(cache_dir()), "<cache>")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="sample directory recorded with --features")
    ap.add_argument("--hidden", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--inits", nargs="+", default=["cluster", "lvd"])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--mode", default="full", choices=["full", "minibatch"])
    ap.add_argument("--max-seqs", type=int, default=None)
    ap.add_argument("--work", default=None, help="run directories (default: a temporary one)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "compare_init"))
    a = ap.parse_args(argv)

    import tempfile

    from hmm_distill.data import read_metadata
    from hmm_distill.train import TrainConfig, train

    meta = read_metadata(a.data)
    work = Path(a.work or tempfile.mkdtemp(prefix="compare_init_"))
    runs = []
    for H in a.hidden:
        for init in a.inits:
            t0 = time.perf_counter()
            c0 = sum(os.times()[:2])
            cfg = TrainConfig(data=a.data, out=str(work / f"{init}_h{H}"), hidden_size=H, epochs=a.epochs,
                              mode=a.mode, init=init, max_seqs=a.max_seqs, batch_size=128, plot=False,
                              progress=False)
            res = train(cfg, resume=False, log=lambda *x: None)
            curve = [{"epoch": m["epoch"], "heldout_ll": m["heldout_ll"], "gap_share": m["gap_share"]}
                     for m in res.metrics]
            runs.append({"hidden_size": H, "init": init, "curve": curve,
                         "wall_s": time.perf_counter() - t0, "cpu_s": sum(os.times()[:2]) - c0,
                         "unigram_heldout_ll": res.metrics[-1]["unigram_heldout_ll"],
                         "lm_heldout_ll": res.metrics[-1]["lm_heldout_ll"],
                         "num_train": None})
            print(f"H={H} {init}: " + " ".join(f"{m['heldout_ll']:.3f}" for m in curve)
                  + f"  (gap share {curve[-1]['gap_share']})", flush=True)
    res = {"data": _portable(str(a.data)), "model": meta.get("model"), "prompt_set": meta.get("prompt_set"),
           "num_seqs": sum(s["num_seqs"] for s in meta["shards"]) if a.max_seqs is None else a.max_seqs,
           "features": meta.get("features"), "epochs": a.epochs, "mode": a.mode, "runs": runs,
           "cpus": os.cpu_count(), "loadavg_end": list(os.getloadavg()),
           "command": _portable("python -m experiments.compare_init "
                                + " ".join(sys.argv[1:] if argv is None else argv))}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    ep = list(range(a.epochs + 1))
    lines = [f"# Initialisations at equal EM iterations ({res['model']})", "",
             f"{res['num_seqs']} continuations of `{res['prompt_set']}` (features D = {res['features']}), "
             f"{a.mode}-batch EM, held-out nats/token after each iteration (0 = the initialisation). "
             f"Unigram {runs[0]['unigram_heldout_ll']:.3f}, LM {runs[0]['lm_heldout_ll']:.3f}. "
             f"Command: `{res['command']}`.", "",
             "| H | init | " + " | ".join(f"it {e}" for e in ep) + " | gap share (last) | CPU s |",
             "|---|---|" + "---|" * (len(ep) + 2)]
    for r in runs:
        c = {m["epoch"]: m["heldout_ll"] for m in r["curve"]}
        gs = r["curve"][-1]["gap_share"]
        lines.append(f"| {r['hidden_size']} | {r['init']} | " + " | ".join(
            f"{c[e]:.3f}" if e in c else "" for e in ep) + f" | {gs:.3f} | {r['cpu_s']:.0f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
