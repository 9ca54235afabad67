"""How does an HMM's held-out quality grow with its data? EM on nested subsets of one
sample set's training rows, every variant evaluated on the SAME held-out rows.

The default HMM's cost is almost all sampling (512 continuations, cap 128; EM is ~20 CPU
s), so its cheaper recipes are fewer continuations; for the task HMM the question is the
other way round: how much more data the gap-share goal needs. Each run re-runs the
recipe's EM on the first N training rows of the seeded split and places the held-out
rows where the job's split puts them (``heldout_frac = held-out / rows``), so the full
subset reproduces the built HMM.

    python experiments/hmm_recipe_subsets.py 461 345 230     # the built default HMM
    python experiments/hmm_recipe_subsets.py 1843 921 460 230 --samples <task samples> \
        --hidden-size 256 --init lvd --mode minibatch --epochs 6 --patience 2 \
        --out experiments/results/hmm_task_data_scaling.json

Writes ``experiments/results/hmm_recipe_subsets.json`` (``--out`` to change).
``gap_share`` uses the job's own unigram baseline (from the subset's training rows);
``gap_share_vs_full_unigram`` the baseline of all training rows, so the variants share
one scale. With several sizes, ``fit`` is the least-squares line of gap share against
log2(training tokens) (the share gained per doubling of the data).
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hmm_distill.data import (features_name, load_features, load_samples, logprobs_name,  # noqa: E402
                              write_samples)
from hmm_distill.default import DefaultSettings, default_hmm_dir  # noqa: E402
from hmm_distill.priors import first_eos_mask  # noqa: E402
from hmm_distill.train import TrainConfig, heldout_split, train  # noqa: E402


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _parse(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sizes", nargs="*", type=int, help="training rows per run")
    ap.add_argument("--samples", help="sample directory (default: the built default HMM's)")
    ap.add_argument("--hidden-size", type=int)
    ap.add_argument("--init", default=None, help="cluster | lvd | random (default: the recipe's)")
    ap.add_argument("--mode", default=None, help="full | minibatch")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--patience", type=int)
    ap.add_argument("--token-dropout", type=float, default=None)
    ap.add_argument("--prior-strength", type=float, default=None,
                    help="prior mass per row / data per row (default: the recipe's)")
    ap.add_argument("--batch-size", type=int, default=256, help="rows per mini-batch E-step")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "hmm_recipe_subsets.json"))
    return ap.parse_args(argv)


def _shown(path) -> str:
    home = str(Path.home() / ".cache" / "jaxcd")
    return str(path).replace(home, "<cache>")


def main(argv=None) -> None:
    a = _parse(argv if argv is not None else sys.argv[1:])
    s = DefaultSettings()
    src = Path(a.samples) if a.samples else default_hmm_dir(None, s) / "samples"
    H = a.hidden_size or s.hidden_size
    mode, epochs = a.mode or s.mode, a.epochs or s.epochs
    patience = s.patience if a.patience is None else a.patience
    S = load_samples(src)
    X, LP, meta = S.tokens, S.logprobs, S.meta
    V, eos = meta["vocab_size"], meta["eos_token_id"]
    F = None
    if int(meta.get("features") or 0):
        F = np.concatenate([np.asarray(load_features(src / sh["features"],
                                                     (sh["num_seqs"], X.shape[1])))
                            for sh in meta["shards"]], 0)
    tr, ho = heldout_split(X.shape[0], s.heldout_frac, s.seed)
    sizes = a.sizes or [len(tr)]
    # the EM settings of the runs (the samples' own settings are in their metadata)
    settings = dict(hidden_size=H, mode=mode, epochs=epochs, patience=patience,
                    init=a.init or "cluster", token_dropout=a.token_dropout,
                    prior_strength=a.prior_strength if a.prior_strength is not None
                    else s.prior_strength, batch_size=a.batch_size,
                    heldout_frac=s.heldout_frac, seed=s.seed)
    out = {"command": "python experiments/hmm_recipe_subsets.py "
                      + " ".join(_shown(x) for x in (argv if argv is not None else sys.argv[1:])),
           "samples": _shown(src), "num_seqs": int(X.shape[0]), "heldout_rows": int(len(ho)),
           "settings": settings, "runs": {}}
    full_unigram = None
    with tempfile.TemporaryDirectory() as tmp:
        for n_tr in sizes:
            n = len(ho) + n_tr
            frac = len(ho) / n
            tr2, ho2 = heldout_split(n, frac, s.seed)
            assert len(ho2) == len(ho)
            rows = np.empty(n, int)
            rows[ho2], rows[tr2] = ho, tr[:n_tr]
            d = Path(tmp) / f"data{n_tr}"
            write_samples(d, X[rows], vocab_size=V, eos_token_id=eos, fingerprint=meta["vocab_fingerprint"])
            m = json.loads((d / "metadata.json").read_text())
            if LP is not None:
                np.save(d / logprobs_name(0), LP[rows])
                m["shards"][0]["logprobs"] = logprobs_name(0)
            if F is not None:
                np.save(d / features_name(0), F[rows])
                m["shards"][0]["features"] = features_name(0)
                m["features"] = int(F.shape[-1])
            (d / "metadata.json").write_text(json.dumps(m))
            c0, t0 = _cpu_s(), time.perf_counter()
            cfg = TrainConfig(data=str(d), out=str(Path(tmp) / f"run{n_tr}"), hidden_size=H,
                              epochs=epochs, mode=mode, prior_strength=settings["prior_strength"],
                              heldout_frac=frac, seed=s.seed, batch_size=a.batch_size, plot=False,
                              progress=False, patience=patience,
                              **({"init": a.init} if a.init else {}),
                              **({"token_dropout": a.token_dropout}
                                 if a.token_dropout is not None else {}))
            res = train(cfg, log=lambda *a: None)
            b = res.best
            if n_tr == len(tr):
                full_unigram = b["unigram_heldout_ll"]
            out["runs"][str(n_tr)] = {
                "train_rows": n_tr, "train_tokens": int(first_eos_mask(X[rows][tr2], eos).sum()),
                "best_epoch": b["epoch"], "epochs_run": res.metrics[-1]["epoch"], "heldout_ll": b["heldout_ll"],
                "unigram_heldout_ll": b["unigram_heldout_ll"], "lm_heldout_ll": b["lm_heldout_ll"],
                "gap_share": b["gap_share"], "em_cpu_s": _cpu_s() - c0, "em_wall_s": time.perf_counter() - t0}
            print(json.dumps(out["runs"][str(n_tr)]), flush=True)
    if full_unigram is not None:
        for r in out["runs"].values():
            r["gap_share_vs_full_unigram"] = ((r["heldout_ll"] - full_unigram)
                                              / (r["lm_heldout_ll"] - full_unigram))
    runs = [r for r in out["runs"].values() if r.get("gap_share") is not None]
    if len(runs) >= 2:
        x = np.log2([r["train_tokens"] for r in runs])
        y = np.array([r.get("gap_share_vs_full_unigram", r["gap_share"]) for r in runs])
        slope, icpt = np.polyfit(x, y, 1)
        out["fit"] = {"per_doubling": float(slope), "intercept_log2_tokens": float(icpt),
                      "tokens_for_0.6": float(2 ** ((0.6 - icpt) / slope)) if slope > 0 else None}
        print(json.dumps(out["fit"]), flush=True)
    path = Path(a.out)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
