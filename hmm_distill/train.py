r"""The distillation training job (``python -m hmm_distill train``).

Data: a sample directory (:mod:`hmm_distill.data`), split once (seeded) into a
training set and a held-out set (``heldout_frac``).

Each epoch:

* ``mode="full"``: one Baum–Welch iteration, ``θ ← M(Σ_batches s_b)``;
* ``mode="minibatch"``: a pass over the shuffled training set in batches of
  ``batch_size`` sequences, ``θ ← (1 - η_k) θ + η_k M_{λ|b|/N}(s_{b_k})`` with
  ``η_k = min(1, (k + k₀)^{-κ})`` (``k`` counts updates over the whole run). The
  pseudocounts of a batch's M-step are scaled by the batch's share ``|b|/N`` of the
  ``N`` training sequences: ``M(s_b + λ|b|/N) = M((N/|b|) s_b + λ)``, the MAP estimate
  as if the whole training set looked like this batch, so mini-batch and full-batch
  EM smooth with the same prior (an unscaled ``λ`` would weigh the prior ``N/|b|``
  times more per update and, at ``V = 49152``, drown a batch's emission counts);

then the held-out per-token log-likelihood (natural log, averaged over all ``T``
positions including EOS padding) is computed and compared with a unigram baseline
(token frequencies of the training set with the same emission pseudocount), a line
is appended to ``metrics.jsonl``, ``training_curve.png`` is redrawn (if matplotlib
is installed) and ``ckpt_epochNNNN.safetensors`` is written.

Resume: a run directory that already has checkpoints continues after the last one
(the model, step counter, and RNG are restored; shuffling of epoch ``e`` depends only
on ``(seed, e)``), so an interrupted run loses at most the epoch in progress and the
resumed run reproduces the uninterrupted one. A checkpoint made for other data,
another vocabulary or another hidden size is refused.

Run directory::

    config.json  metrics.jsonl  training_curve.png  ckpt_epochNNNN.safetensors  hmm.safetensors
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import hmm as F
from .checkpoint import (epoch_checkpoint_path, list_epoch_checkpoints, load_checkpoint,
                         save_checkpoint)
from .data import load_samples
from .em import EM, make_mesh, pad_batch, step_size
from .errors import CheckpointMismatchError, ConfigError, NonFiniteStatisticsError, SampleDataError
from .init import initialise


@dataclass
class TrainConfig:
    """Training configuration (CLI flags / JSON config file use the same names).

    Defaults (H=128, mini-batch EM, 8 epochs) train on the sampling job's default data
    (2048 sequences of 64 tokens, V=49152) in well under a minute on a 2-core CPU
    (~0.2-0.4 M tokens/s per EM pass); sampling that data from SmolLM2-135M takes about
    10 minutes there. On accelerators raise ``hidden_size`` (4096+) and ``batch_size``.
    """

    data: str = ""                     #: sample directory
    out: str = "runs/hmm"              #: run directory
    hidden_size: int = 128             #: H
    epochs: int = 8
    mode: str = "minibatch"            #: "minibatch" or "full"
    batch_size: int = 128              #: sequences per E-step batch
    pseudocount: float = 1e-2          #: λ added to start / transition counts
    emission_pseudocount: float = 1e-2  #: λ_B added to emission counts
    step_offset: float = 2.0           #: k₀ of η_k = (k + k₀)^-κ
    step_kappa: float = 0.7            #: κ ∈ (0.5, 1]
    init: str = "cluster"              #: "cluster" (data-driven) or "random"
    init_noise: float | None = None    #: log-noise of the init (default 1.0 random / 0.1 cluster)
    heldout_frac: float = 0.1
    max_seqs: int | None = None        #: use only the first max_seqs sequences
    seed: int = 0
    devices: int | None = None         #: number of devices for data-parallel EM (None = all)
    keep_checkpoints: int = 3          #: keep the last k epoch checkpoints (0 = all)
    plot: bool = True
    progress: bool = True

    # keys that must agree when resuming
    _RESUME_KEYS = ("hidden_size", "mode", "batch_size", "init", "init_noise", "heldout_frac",
                    "max_seqs", "seed", "step_offset", "step_kappa")

    def validate(self) -> None:
        if not self.data:
            raise ConfigError("no training data: pass --data DIR (a sample directory)")
        if self.mode not in ("minibatch", "full"):
            raise ConfigError(f"mode must be 'minibatch' or 'full', got {self.mode!r}")
        if self.init not in ("cluster", "random"):
            raise ConfigError(f"init must be 'cluster' or 'random', got {self.init!r}")
        if self.hidden_size < 1 or self.epochs < 0 or self.batch_size < 1:
            raise ConfigError("hidden_size and batch_size must be >= 1 and epochs >= 0")
        if self.pseudocount < 0 or self.emission_pseudocount < 0:
            raise ConfigError("pseudocounts must be >= 0")
        if not 0 <= self.heldout_frac < 1:
            raise ConfigError(f"heldout_frac must be in [0, 1), got {self.heldout_frac}")
        step_size(0, self.step_offset, self.step_kappa)  # validates κ, k₀

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown training config keys {unknown}")
        return cls(**d)


@dataclass
class TrainResult:
    params: F.HMMParams
    metrics: list = field(default_factory=list)
    run_dir: Path | None = None


def data_identity(meta: dict, n_used: int) -> str:
    """Hash of what defines the training data (vocabulary, T, shard list, #used)."""
    key = [meta.get("vocab_fingerprint"), meta.get("vocab_size"), meta.get("length"),
           [(s.get("file"), s.get("num_seqs")) for s in meta.get("shards", [])], n_used,
           meta.get("seed"), meta.get("model")]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def split_heldout(tokens: np.ndarray, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    n = tokens.shape[0]
    n_held = int(round(frac * n)) if frac > 0 else 0
    if frac > 0 and n >= 2:
        n_held = min(max(n_held, 1), n - 1)
    perm = np.random.default_rng([seed, 12345]).permutation(n)
    return tokens[perm[n_held:]], tokens[perm[:n_held]]


def unigram_logprobs(tokens: np.ndarray, vocab_size: int, pseudocount: float) -> np.ndarray:
    c = np.bincount(tokens.ravel(), minlength=vocab_size).astype(np.float64) + pseudocount
    with np.errstate(divide="ignore"):
        return np.log(c / c.sum())


def _batches(tokens: np.ndarray, size: int):
    for s in range(0, tokens.shape[0], size):
        yield pad_batch(tokens[s:s + size], None, size)


def evaluate(engine: EM, params: F.HMMParams, tokens: np.ndarray, batch_size: int) -> float:
    """Per-token log-likelihood (nats) of ``tokens`` (all positions)."""
    if tokens.shape[0] == 0:
        return float("nan")
    total = 0.0
    for tok, msk in _batches(tokens, batch_size):
        total += float(jnp.sum(engine.log_likelihood(params, tok, msk)))
    return total / tokens.size


def _plot(run_dir: Path, metrics: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # optional dependency
        return
    ep = [m["epoch"] for m in metrics]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ep, [m["heldout_ll"] for m in metrics], "o-", label="HMM held-out")
    tr = [(m["epoch"], m["train_ll"]) for m in metrics if m.get("train_ll") is not None]
    if tr:
        ax.plot(*zip(*tr), "s--", label="HMM train (during epoch)")
    ax.axhline(metrics[-1]["unigram_heldout_ll"], color="gray", ls=":", label="unigram held-out")
    ax.set_xlabel("epoch")
    ax.set_ylabel("log-likelihood per token (nats)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = run_dir / "training_curve.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(run_dir / "training_curve.png")


def _host(params: F.HMMParamsT) -> F.HMMParams:
    """Token-major device params -> public-layout numpy arrays."""
    pi, A, BT = (np.asarray(x) for x in params)
    return F.HMMParams(pi, A, np.ascontiguousarray(BT.T))


def _read_metrics(path: Path, upto_epoch: int) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("epoch", 10**9) <= upto_epoch:
            out.append(m)
    return out


def train(cfg: TrainConfig, *, resume: bool = True, log=print) -> TrainResult:
    """Run (or resume) a distillation job; see module docstring."""
    cfg.validate()
    samples = load_samples(cfg.data, max_seqs=cfg.max_seqs)
    V, fp, eos = samples.vocab_size, samples.fingerprint, samples.eos_token_id
    H = cfg.hidden_size
    train_tok, held_tok = split_heldout(samples.tokens, cfg.heldout_frac, cfg.seed)
    if train_tok.shape[0] == 0:
        raise SampleDataError(f"{cfg.data}: no training sequences left after the held-out split")
    data_id = data_identity(samples.meta, samples.tokens.shape[0])
    run_dir = Path(cfg.out)
    run_dir.mkdir(parents=True, exist_ok=True)

    mesh = make_mesh(cfg.devices) if (cfg.devices or 1) > 1 or len(jax.devices()) > 1 else None
    engine = EM(mesh)
    D = engine.num_devices
    bs = -(-cfg.batch_size // D) * D

    cfg_dict = cfg.to_dict()
    extra_base = {"data_id": data_id, "data": str(cfg.data), "num_train": int(train_tok.shape[0]),
                  "num_heldout": int(held_tok.shape[0]), "length": samples.length}
    base_key = jax.random.key(cfg.seed)
    metrics_path = run_dir / "metrics.jsonl"

    latest = list_epoch_checkpoints(run_dir)[-1][1] if (resume and list_epoch_checkpoints(run_dir)) else None
    if latest is not None:
        try:
            ck = load_checkpoint(latest, expect_vocab_size=V, expect_fingerprint=fp, expect_hidden_size=H)
        except CheckpointMismatchError as e:
            raise type(e)(f"cannot resume: {e}; use a new --out directory or --no-resume") from e
        diff = [k for k in TrainConfig._RESUME_KEYS if ck.config.get(k) != cfg_dict[k]]
        if diff:
            raise CheckpointMismatchError(
                f"cannot resume from {latest}: config differs in {diff} ("
                + "; ".join(f"{k}: {ck.config.get(k)!r} -> {cfg_dict[k]!r}" for k in diff)
                + "); use a new --out directory or --no-resume")
        if ck.extra.get("data_id") != data_id:
            raise CheckpointMismatchError(
                f"cannot resume from {latest}: it was trained on other data "
                f"({ck.extra.get('data')!r}, id {ck.extra.get('data_id')}) than {cfg.data!r} (id {data_id})")
        params = F.as_params(*ck.params)
        epoch0, step = ck.epoch, ck.step
        metrics = _read_metrics(metrics_path, epoch0)
        log(f"resuming from {latest} (epoch {epoch0}, step {step})")
    else:
        if not resume:
            for _, p in list_epoch_checkpoints(run_dir):
                p.unlink()
        t0 = time.perf_counter()
        params = initialise(cfg.init, train_tok, H, V, seed=cfg.seed, noise=cfg.init_noise)
        F.validate_params(params, what=f"{cfg.init} initialisation")
        epoch0, step = 0, 0
        metrics = []
        log(f"initialised ({cfg.init}) H={H} V={V} in {time.perf_counter() - t0:.1f}s; "
            f"{train_tok.shape[0]} train / {held_tok.shape[0]} held-out sequences of T={samples.length}; "
            f"{D} device(s)")
    metrics_path.write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run_dir / "config.json").write_text(json.dumps(cfg_dict, indent=1, sort_keys=True))

    uni = unigram_logprobs(train_tok, V, cfg.emission_pseudocount)
    uni_held = float(uni[held_tok].mean()) if held_tok.size else float("nan")
    uni_train = float(uni[train_tok].mean())
    params = engine.replicate(F.to_token_major(params))  # EM works on Bᵀ [V, H]
    if epoch0 == 0:
        m0 = {"epoch": 0, "step": 0, "train_ll": None,
              "heldout_ll": evaluate(engine, params, held_tok, bs),
              "unigram_heldout_ll": uni_held, "unigram_train_ll": uni_train, "eta": None,
              "epoch_time_s": 0.0, "tokens_per_s": None}
        metrics = [m0]
        metrics_path.write_text(json.dumps(m0) + "\n")
        log(f"epoch 0: held-out {m0['heldout_ll']:.4f} nats/token (unigram {uni_held:.4f})")

    n_train = train_tok.shape[0]
    n_batches = -(-n_train // bs)
    for epoch in range(epoch0, cfg.epochs):
        t0 = time.perf_counter()
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=n_batches, desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch", leave=False)
        tot_ll, tot_n, eta = 0.0, 0, None
        if cfg.mode == "full":
            total = None
            for b, (tok, msk) in enumerate(_batches(train_tok, bs)):
                c, ok = engine.counts(params, tok, msk)
                if not bool(ok):
                    raise NonFiniteStatisticsError(
                        f"non-finite expected counts in epoch {epoch + 1}, batch {b} of {cfg.data}")
                total = c if total is None else F.add_counts(total, c)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(tok_s=f"{(b + 1) * bs * samples.length / (time.perf_counter() - t0):.0f}")
            tot_ll, tot_n = float(total.loglik), int(total.n_tokens)
            if int(total.n_impossible):
                log(f"warning: {int(total.n_impossible)} training sequences have probability 0 "
                    f"(use a pseudocount > 0)")
            params = engine.m_step(total, params, cfg.pseudocount, cfg.emission_pseudocount)
            step += 1
        else:
            perm = np.random.default_rng([cfg.seed, epoch]).permutation(n_train)
            for b in range(n_batches):
                tok, msk = pad_batch(train_tok[perm[b * bs:(b + 1) * bs]], None, bs)
                eta = step_size(step, cfg.step_offset, cfg.step_kappa)
                share = min(bs, n_train - b * bs) / n_train  # |b| / N (see module docstring)
                params, (ll, nt, nimp), ok = engine.minibatch_step(
                    params, tok, msk, eta, cfg.pseudocount * share, cfg.emission_pseudocount * share)
                if not bool(ok):
                    raise NonFiniteStatisticsError(
                        f"non-finite expected counts in epoch {epoch + 1}, batch {b} of {cfg.data}")
                tot_ll += float(ll)
                tot_n += int(nt)
                step += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(ll=f"{tot_ll / max(tot_n, 1):.3f}", eta=f"{eta:.3f}",
                                    tok_s=f"{(b + 1) * bs * samples.length / (time.perf_counter() - t0):.0f}")
        if bar is not None:
            bar.close()
        train_time = time.perf_counter() - t0
        held = evaluate(engine, params, held_tok, bs)
        m = {"epoch": epoch + 1, "step": step, "train_ll": tot_ll / max(tot_n, 1), "heldout_ll": held,
             "unigram_heldout_ll": uni_held, "unigram_train_ll": uni_train, "eta": eta,
             "epoch_time_s": train_time, "tokens_per_s": n_train * samples.length / train_time}
        if not math.isfinite(m["train_ll"]) or not math.isfinite(held if held_tok.size else 0.0):
            raise NonFiniteStatisticsError(f"non-finite log-likelihood after epoch {epoch + 1}: {m}")
        metrics.append(m)
        with open(metrics_path, "a") as f:
            f.write(json.dumps(m) + "\n")
        host_params = _host(params)
        save_checkpoint(epoch_checkpoint_path(run_dir, epoch + 1), host_params, fingerprint=fp,
                        eos_token_id=eos, epoch=epoch + 1, step=step,
                        rng_key=np.asarray(jax.random.key_data(base_key)), config=cfg_dict,
                        extra={**extra_base, "metrics": m})
        if cfg.keep_checkpoints > 0:
            for _, p in list_epoch_checkpoints(run_dir)[:-cfg.keep_checkpoints]:
                p.unlink()
        if cfg.plot:
            _plot(run_dir, metrics)
        log(f"epoch {epoch + 1}/{cfg.epochs}: train {m['train_ll']:.4f}  held-out {held:.4f} "
            f"(unigram {uni_held:.4f}) nats/token; {m['tokens_per_s']:.0f} tok/s; {train_time:.1f}s")

    final = _host(params)
    save_checkpoint(run_dir / "hmm.safetensors", final, fingerprint=fp, eos_token_id=eos,
                    epoch=max(cfg.epochs, epoch0), step=step,
                    rng_key=np.asarray(jax.random.key_data(base_key)), config=cfg_dict,
                    extra={**extra_base, "metrics": metrics[-1] if metrics else None})
    if cfg.plot and metrics:
        _plot(run_dir, metrics)
    return TrainResult(params=final, metrics=metrics, run_dir=run_dir)
