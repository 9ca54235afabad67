"""A small real distillation on CPU (issue #4): SmolLM2-135M -> HMM.

1. Sample ``--num-seqs`` continuations of ``--length`` tokens from the JAX LM
   (:class:`jaxcd.lm.JaxLM`, default GGUF) from BOS with the real sampling job
   (:func:`hmm_distill.sampler.run_sampling`; resumable, so re-running reuses the
   shards already in ``--samples``).
2. Train HMMs with the real training job (:func:`hmm_distill.train.train`), one run
   per ``--configs`` entry ``INIT:MODE:EMISSION_PSEUDOCOUNT`` (default: the job's
   defaults -- mini-batch EM, λ_B = 1e-2 -- with both initialisations, full-batch EM
   with both, and mini-batch with a 100x smaller λ_B); everything else equal.
3. Evaluate on the held-out split the training job made (same seed):

   * ``*_ll_per_text_token``: log-likelihood of the LM's own text, i.e. each row up to
     and including its first EOS (the whole row if it has none), divided by the number
     of such tokens. LM: ``Σ log p_LM(x_i | BOS, x_{<i})``; HMM: ``log p_HMM(x_{1:n})``
     (prefix marginal, masked forward pass); unigram: ``Σ log p_uni(x_i)``.
   * ``*_ll_per_padded_token``: the training job's metric, all ``T`` positions of the
     EOS-padded rows (the LM gives the padding probability 1, so its value is its
     text log-likelihood divided by ``T``).

Writes ``experiments/results/distill_small.json`` and, when matplotlib is installed,
``experiments/results/distill_small_curve.png`` (copied from the run directory).

    flock /tmp/jaxcd_bench.lock nice python experiments/distill_small.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from hmm_distill import hmm as F  # noqa: E402
from hmm_distill.data import load_samples  # noqa: E402
from hmm_distill.lms import load_lm  # noqa: E402
from hmm_distill.sampler import run_sampling  # noqa: E402
from hmm_distill.train import TrainConfig, split_heldout, train, unigram_logprobs  # noqa: E402


def text_lengths(tokens: np.ndarray, eos: int) -> np.ndarray:
    """Tokens up to and including the first EOS (T if none)."""
    is_eos = tokens == eos
    first = np.where(is_eos.any(1), is_eos.argmax(1) + 1, tokens.shape[1])
    return first.astype(np.int64)


def lm_text_loglik(loaded, held: np.ndarray, lengths: np.ndarray, bos: int, chunk: int) -> np.ndarray:
    """``Σ_{i≤n} log p_LM(x_i | BOS, x_{<i})`` per row (full recompute, no cache)."""
    lm, params = loaded.lm, loaded.params
    out = np.zeros(held.shape[0])
    T = held.shape[1]
    for s in range(0, held.shape[0], chunk):
        rows = held[s:s + chunk]
        ids = np.concatenate([np.full((rows.shape[0], 1), bos, np.int32), rows[:, :-1]], 1)
        lens = np.full(rows.shape[0], T, np.int32)
        lp = np.asarray(lm.logprobs_all(params, ids, lens))  # [b, T, V]: p(x_i | BOS, x_<i)
        tok_lp = np.take_along_axis(lp, rows[:, :, None].astype(np.int64), 2)[..., 0]
        valid = np.arange(T)[None] < lengths[s:s + chunk, None]
        out[s:s + chunk] = np.where(valid, tok_lp, 0.0).sum(1)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm", default="gguf")
    ap.add_argument("--samples", default=str(ROOT / "runs" / "distill_small" / "samples"))
    ap.add_argument("--runs", default=str(ROOT / "runs" / "distill_small"))
    ap.add_argument("--num-seqs", type=int, default=2048)
    ap.add_argument("--length", type=int, default=48)
    ap.add_argument("--shard-size", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--train-batch", type=int, default=128)
    ap.add_argument("--configs", nargs="+",
                    default=["cluster:minibatch:1e-2", "random:minibatch:1e-2",
                             "cluster:full:1e-2", "random:full:1e-2",
                             "cluster:minibatch:1e-4", "random:minibatch:1e-4"],
                    help="INIT:MODE:EMISSION_PSEUDOCOUNT per training run")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "distill_small.json"))
    args = ap.parse_args(argv)

    t_all = time.perf_counter()
    loaded = load_lm(args.lm)
    # 1. sampling (resumable: complete shards already on disk are kept)
    t0 = time.perf_counter()
    meta = run_sampling(loaded.lm, loaded.params, args.samples, num_seqs=args.num_seqs,
                        length=args.length, shard_size=args.shard_size, batch_size=args.batch_size,
                        seed=args.seed, model_name=loaded.name, fingerprint=loaded.fingerprint,
                        progress=True)
    sample_wall = time.perf_counter() - t0
    samples = load_samples(args.samples)
    eos, V = samples.eos_token_id, samples.vocab_size
    bos = getattr(loaded.lm, "bos_token_id", None)
    bos = eos if bos is None or bos < 0 else int(bos)

    # 2. training (the real job), one run per initialisation
    runs = {}
    for spec in args.configs:
        init, mode, lam_b = spec.split(":")
        name = f"{init}-{mode}-lamB{float(lam_b):g}"
        cfg = TrainConfig(data=args.samples, out=str(Path(args.runs) / f"h{args.hidden_size}-{name}"),
                          hidden_size=args.hidden_size, epochs=args.epochs, mode=mode,
                          batch_size=args.train_batch, init=init, seed=args.seed,
                          emission_pseudocount=float(lam_b), progress=False)
        t0 = time.perf_counter()
        res = train(cfg, resume=False)
        runs[name] = {"config": cfg.to_dict(), "train_seconds": time.perf_counter() - t0,
                      "metrics": res.metrics, "params": res.params, "run_dir": str(res.run_dir)}

    # 3. held-out evaluation (same split as the training job)
    train_tok, held = split_heldout(samples.tokens, 0.1, args.seed)
    lengths = text_lengths(held, eos)
    n_text = int(lengths.sum())
    mask = np.arange(held.shape[1])[None] < lengths[:, None]
    t0 = time.perf_counter()
    lm_ll = lm_text_loglik(loaded, held, lengths, bos, chunk=16)
    lm_eval_s = time.perf_counter() - t0
    # unigram baselines, add-λ smoothed, for a grid of λ (the training job's baseline is the
    # one with λ = the run's emission pseudocount); the best λ is picked on held-out itself
    grid = [1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0]
    uni_by_lam = {}
    for lam in grid:
        u = unigram_logprobs(train_tok, V, lam)
        uni_by_lam[f"{lam:g}"] = {"ll_per_text_token": float(np.where(mask, u[held], 0.0).sum()) / n_text,
                                  "ll_per_padded_token": float(u[held].mean())}
    best_lam = max(uni_by_lam, key=lambda k: uni_by_lam[k]["ll_per_text_token"])
    best_uni = uni_by_lam[best_lam]["ll_per_text_token"]
    result = {
        "lm": loaded.name, "vocab_size": V, "length": samples.length,
        "num_seqs": int(samples.tokens.shape[0]), "num_train": int(train_tok.shape[0]),
        "num_heldout": int(held.shape[0]), "heldout_text_tokens": n_text,
        "heldout_padded_tokens": int(held.size),
        "sampling": {"tokens_per_s": meta.get("tokens_per_s"), "wall_s_this_call": sample_wall,
                     # the run that made the shards (possibly an earlier, resumed call)
                     "seconds_total": (samples.tokens.size / meta["tokens_per_s"]
                                       if meta.get("tokens_per_s") else None),
                     "unfinished": int(sum(s["num_unfinished"] for s in meta["shards"])),
                     "temperature": meta["temperature"], "from": "BOS", "batch_size": args.batch_size},
        "hidden_size": args.hidden_size, "epochs": args.epochs, "train_batch": args.train_batch,
        "lm_ll_per_text_token": float(lm_ll.sum()) / n_text,
        "lm_ll_per_padded_token": float(lm_ll.sum()) / held.size,
        "lm_eval_seconds": lm_eval_s,
        "unigram_by_lambda": uni_by_lam,
        "unigram_best_lambda_on_heldout": float(best_lam), "unigram_best_ll_per_text_token": best_uni,
        "hmm": {},
    }
    for name, r in runs.items():
        p = F.as_params(*r["params"])
        ll_text = float(jnp.sum(F.log_likelihood(p, held, mask))) / n_text
        ll_pad = float(jnp.sum(F.log_likelihood(p, held))) / held.size
        result["hmm"][name] = {
            "config": {k: r["config"][k] for k in ("init", "mode", "emission_pseudocount",
                                                   "pseudocount", "batch_size", "epochs")},
            "train_seconds": r["train_seconds"], "ll_per_text_token": ll_text,
            "ll_per_padded_token": ll_pad,
            "heldout_ll_per_epoch": [m["heldout_ll"] for m in r["metrics"]],
            "train_ll_per_epoch": [m["train_ll"] for m in r["metrics"]],
            "tokens_per_s_per_epoch": [m["tokens_per_s"] for m in r["metrics"]],
            "run_dir": r["run_dir"],
        }
    result["total_seconds_this_call"] = time.perf_counter() - t_all
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    png = Path(next(iter(runs.values()))["run_dir"]) / "training_curve.png"
    if png.exists():
        shutil.copy(png, out.with_name(out.stem + "_curve.png"))

    print(f"\nSmolLM2-135M -> HMM(H={args.hidden_size}), {result['num_train']} train / "
          f"{result['num_heldout']} held-out sequences of T={samples.length} "
          f"({result['sampling']['unfinished']} without EOS); sampling {meta.get('tokens_per_s', 0):.0f} tok/s")
    print(f"held-out log-likelihood, nats per token ({n_text} text tokens / {held.size} padded):")
    print(f"  {'model':28s} {'per text token':>15s} {'per padded token':>17s}")
    print(f"  {'LM itself':28s} {result['lm_ll_per_text_token']:15.4f} {result['lm_ll_per_padded_token']:17.4f}")
    for name, h in result["hmm"].items():
        best = max(h["heldout_ll_per_epoch"])
        print(f"  {'HMM ' + name:28s} {h['ll_per_text_token']:15.4f} {h['ll_per_padded_token']:17.4f}"
              f"   (train {h['train_seconds']:.0f}s; best epoch {best:.4f} padded)")
    for lam, u in uni_by_lam.items():
        print(f"  {'unigram, add-' + lam:28s} {u['ll_per_text_token']:15.4f} {u['ll_per_padded_token']:17.4f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
