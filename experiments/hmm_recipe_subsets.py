"""Would a cheaper default-HMM recipe keep its quality? (issue #11)

The default HMM's cost is almost all sampling (512 continuations, cap 128; EM is ~20 CPU s),
so the cheaper recipes are fewer continuations. This re-runs the recipe's EM (H=128,
full batch, data prior 0.1, at most 30 iterations, patience 4) on subsets of the built
default HMM's training rows and evaluates every variant on the SAME 51 held-out
continuations (placed where the job's seeded split puts its held-out rows, with
``heldout_frac = 51 / rows``). The full subset reproduces the built HMM exactly.

    python experiments/hmm_recipe_subsets.py 461 345 230     # needs the built default HMM

Writes ``experiments/results/hmm_recipe_subsets.json``. ``gap_share`` uses the job's
own unigram baseline (from the subset's training rows); ``gap_share_vs_full_unigram``
the baseline of all 461 training rows, so the variants share one scale.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hmm_distill.data import load_samples, logprobs_name, write_samples  # noqa: E402
from hmm_distill.default import DefaultSettings, default_hmm_dir  # noqa: E402
from hmm_distill.priors import first_eos_mask  # noqa: E402
from hmm_distill.train import TrainConfig, heldout_split, train  # noqa: E402


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None) -> None:
    sizes = [int(a) for a in (argv if argv is not None else sys.argv[1:])] or [461, 345, 230]
    s = DefaultSettings()
    src = default_hmm_dir(None, s) / "samples"
    S = load_samples(src)
    X, LP, meta = S.tokens, S.logprobs, S.meta
    V, eos = meta["vocab_size"], meta["eos_token_id"]
    tr, ho = heldout_split(X.shape[0], s.heldout_frac, s.seed)
    out = {"samples": str(src), "num_seqs": int(X.shape[0]), "heldout_rows": int(len(ho)), "settings": asdict(s),
           "runs": {}}
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
            np.save(d / logprobs_name(0), LP[rows])
            m = json.loads((d / "metadata.json").read_text())
            m["shards"][0]["logprobs"] = logprobs_name(0)
            (d / "metadata.json").write_text(json.dumps(m))
            c0, t0 = _cpu_s(), time.perf_counter()
            cfg = TrainConfig(data=str(d), out=str(Path(tmp) / f"run{n_tr}"), hidden_size=s.hidden_size,
                              epochs=s.epochs, mode=s.mode, prior_strength=s.prior_strength, heldout_frac=frac,
                              seed=s.seed, batch_size=256, plot=False, progress=False, patience=s.patience)
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
    path = ROOT / "experiments" / "results" / "hmm_recipe_subsets.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
