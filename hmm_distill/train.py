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
  ``step_schedule`` picks ``η_k``: that power law, or optax's cosine / linear decay
  from 1 to ``step_final`` over the run's updates (:func:`hmm_distill.em.step_schedule`);

then the held-out per-token log-likelihood (natural log, averaged over all ``T``
positions including EOS padding) is computed and compared with a unigram baseline
(token frequencies of the training set with the same emission pseudocount), a line
is appended to ``metrics.jsonl``, ``training_curve.png`` is redrawn (if matplotlib
is installed) and ``ckpt_epochNNNN.safetensors`` is written.

Initialisation (``init``): ``"cluster"`` (bigram clustering, :mod:`hmm_distill.init`),
``"lvd"`` (latent-variable initialisation from the LM features recorded while sampling,
:mod:`hmm_distill.lvd`) or ``"random"``.

Smoothing: besides the prior, ``token_dropout = p`` marginalises each valid non-EOS
training token with probability ``p`` in every E-step (its emission probability is 1 in
every state, so the transitions around it are learnt without it), redrawn each epoch.

Data that does not fit in memory: ``stream=True`` reads the shards one at a time
(:mod:`hmm_distill.stream`); the held-out set, the token statistics and every
full-batch iteration are those of the in-memory job, mini-batches are drawn shard by
shard.

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
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np

from . import hmm as F
from .checkpoint import (epoch_checkpoint_path, list_epoch_checkpoints, load_checkpoint,
                         save_checkpoint)
from .em import EM, check_memory, make_mesh, pad_batch, step_schedule
from .errors import CheckpointMismatchError, ConfigError, NonFiniteStatisticsError
from .distributed import barrier, broadcast_int, is_main, to_host
from .init import initialise
from .lvd import lvd_init
from .stream import TrainData, heldout_split, trim_batch
from .priors import Prior, data_prior_from_counts, flat_prior


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
    prior: str = "data"                #: "data" (scaled to the data, hmm_distill.priors) or "flat"
    prior_strength: float = 0.1        #: prior="data": prior mass per row / data per row
    unigram_smoothing: float = 0.1     #: β of the add-β unigram (prior mean and baseline)
    pseudocount: float = 1e-2          #: prior="flat": λ added to start / transition counts
    emission_pseudocount: float = 1e-2  #: prior="flat": λ_B added to each emission count
    mask_after_eos: bool = True        #: model each row up to its first EOS (padding masked)
    length_bucket: int = 16            #: batches are trimmed to their longest row (rounded up)
    step_schedule: str = "power"       #: mini-batch step sizes: "power" (η_k = (k + k₀)^-κ) or
                                       #: optax's "cosine" / "linear" decay to step_final
    step_final: float = 0.01           #: last step size of the cosine / linear schedules
    step_offset: float = 2.0           #: k₀ of η_k = (k + k₀)^-κ
    step_kappa: float = 0.7            #: κ ∈ (0.5, 1]
    init: str = "cluster"              #: "cluster" (bigram clustering), "lvd" (k-means of the LM's
                                       #: recorded token features, hmm_distill.lvd) or "random"
    init_noise: float | None = None    #: log-noise of the init (default 1.0 random / 0.1 cluster)
    heldout_frac: float = 0.1
    max_seqs: int | None = None        #: use only the first max_seqs sequences
    stream: bool = False               #: read the training shards one at a time (hmm_distill.stream)
                                       #: instead of loading them all: memory of one shard
    init_max_seqs: int = 20000         #: stream=True, init="cluster": cluster the first rows only
    token_dropout: float = 0.0         #: token-dropout smoothing: each valid non-EOS training token
                                       #: is marginalised (emission 1) with this probability
    seed: int = 0
    devices: int | None = None         #: number of devices for data-parallel EM (None = all)
    model_shards: int = 1              #: split B [H, V] over this many devices (vocabulary axis)
    memory_limit_gb: float | None = None  #: override the detected free memory per device
    keep_checkpoints: int = 3          #: keep the last k epoch checkpoints (0 = all)
    patience: int = 0                  #: early stopping: stop after this many epochs without a new
                                       #: best held-out log-likelihood; the result is the best epoch's
                                       #: parameters (0 = off: run all epochs, keep the last)
    plot: bool = True
    progress: bool = True

    # keys that must agree when resuming
    _RESUME_KEYS = ("hidden_size", "mode", "batch_size", "init", "init_noise", "heldout_frac", "stream",
                    "token_dropout", "step_schedule", "step_final",
                    "max_seqs", "seed", "step_offset", "step_kappa", "prior", "prior_strength",
                    "unigram_smoothing", "mask_after_eos")

    def validate(self) -> None:
        if not self.data:
            raise ConfigError("no training data: pass --data DIR (a sample directory)")
        if self.mode not in ("minibatch", "full"):
            raise ConfigError(f"mode must be 'minibatch' or 'full', got {self.mode!r}")
        if self.init not in ("cluster", "random", "lvd"):
            raise ConfigError(f"init must be 'cluster', 'random' or 'lvd', got {self.init!r}")
        if self.hidden_size < 1 or self.epochs < 0 or self.batch_size < 1:
            raise ConfigError("hidden_size and batch_size must be >= 1 and epochs >= 0")
        if self.pseudocount < 0 or self.emission_pseudocount < 0:
            raise ConfigError("pseudocounts must be >= 0")
        if self.prior not in ("data", "flat"):
            raise ConfigError(f"prior must be 'data' or 'flat', got {self.prior!r}")
        if self.prior_strength < 0 or self.unigram_smoothing <= 0:
            raise ConfigError("prior_strength must be >= 0 and unigram_smoothing > 0")
        if self.length_bucket < 1:
            raise ConfigError(f"length_bucket must be >= 1, got {self.length_bucket}")
        if not 0 <= self.heldout_frac < 1:
            raise ConfigError(f"heldout_frac must be in [0, 1), got {self.heldout_frac}")
        if not 0 <= self.token_dropout < 1:
            raise ConfigError(f"token_dropout must be in [0, 1), got {self.token_dropout}")
        if self.init_max_seqs < 1:
            raise ConfigError(f"init_max_seqs must be >= 1, got {self.init_max_seqs}")
        if self.patience < 0:
            raise ConfigError(f"patience must be >= 0, got {self.patience}")
        if self.patience and self.heldout_frac == 0:
            raise ConfigError("early stopping (patience > 0) needs a held-out set (heldout_frac > 0)")
        step_schedule(self.step_schedule, 1, k0=self.step_offset, kappa=self.step_kappa,
                      final=self.step_final)  # validates

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
    #: the metrics line of the epoch whose parameters are the result (the last epoch, or
    #: the best held-out epoch with early stopping)
    best: dict | None = None


def data_identity(meta: dict, n_used: int) -> str:
    """Hash of what defines the training data (vocabulary, T, shard list, #used, prompts)."""
    key = [meta.get("vocab_fingerprint"), meta.get("vocab_size"), meta.get("length"),
           [(s.get("file"), s.get("num_seqs")) for s in meta.get("shards", [])], n_used,
           meta.get("seed"), meta.get("model")]
    if meta.get("prompt_set_id"):
        key.append(meta["prompt_set_id"])
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def split_heldout(tokens: np.ndarray, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    tr, ho = heldout_split(tokens.shape[0], frac, seed)
    return tokens[tr], tokens[ho]


def unigram_logprobs(tokens: np.ndarray, vocab_size: int, pseudocount: float,
                     mask: np.ndarray | None = None) -> np.ndarray:
    t = tokens[mask] if mask is not None else tokens.ravel()
    c = np.bincount(t, minlength=vocab_size).astype(np.float64) + pseudocount
    with np.errstate(divide="ignore"):
        return np.log(c / c.sum())


def _batches(tokens: np.ndarray, size: int, mask: np.ndarray | None = None, bucket: int = 0):
    for s in range(0, tokens.shape[0], size):
        tok, msk = pad_batch(tokens[s:s + size], None if mask is None else mask[s:s + size], size)
        yield trim_batch(tok, msk, bucket) if bucket else (tok, msk)


def evaluate(engine: EM, params: F.HMMParams, tokens: np.ndarray, batch_size: int,
             mask: np.ndarray | None = None, bucket: int = 0) -> float:
    """Per-token log-likelihood (nats) of ``tokens`` (the valid positions of ``mask``;
    all positions if None)."""
    if tokens.shape[0] == 0:
        return float("nan")
    total = 0.0
    for tok, msk in _batches(tokens, batch_size, mask, bucket):
        total += engine.log_likelihood_sum(params, tok, msk)
    return total / (tokens.size if mask is None else int(mask.sum()))


def gap_share(hmm_ll: float, unigram_ll: float, lm_ll: float | None) -> float | None:
    """Share of the unigram→LM gap the HMM closes: ``(ℓ_HMM - ℓ_uni) / (ℓ_LM - ℓ_uni)``."""
    if lm_ll is None or not math.isfinite(lm_ll) or lm_ll == unigram_ll:
        return None
    return (hmm_ll - unigram_ll) / (lm_ll - unigram_ll)


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
    if metrics[-1].get("lm_heldout_ll") is not None:
        ax.axhline(metrics[-1]["lm_heldout_ll"], color="black", ls="--", label="LM held-out")
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
    pi, A, BT = (to_host(x) for x in params)
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


def make_prior(cfg: TrainConfig, data: TrainData) -> Prior:
    if cfg.prior == "flat":
        return flat_prior(cfg.pseudocount, cfg.emission_pseudocount)
    return data_prior_from_counts(data.token_counts, data.num_train_seqs, data.num_train_transitions,
                                  cfg.hidden_size, strength=cfg.prior_strength,
                                  unigram_smoothing=cfg.unigram_smoothing)


def train(cfg: TrainConfig, *, resume: bool = True, log=print) -> TrainResult:
    """Run (or resume) a distillation job; see module docstring.

    With several processes (:mod:`hmm_distill.distributed` initialised) every process
    calls this with the same configuration; process 0 writes the run directory."""
    cfg.validate()
    main = is_main()
    if not main:
        log = lambda *a, **k: None  # noqa: E731
    data = TrainData(cfg.data, heldout_frac=cfg.heldout_frac, seed=cfg.seed, max_seqs=cfg.max_seqs,
                     mask_eos=cfg.mask_after_eos, stream=cfg.stream)
    V, fp, eos = data.vocab_size, data.fingerprint, data.eos_token_id
    H = cfg.hidden_size
    held_tok, held_msk = data.held_tok, data.held_msk
    data_id = data_identity(data.meta, data.num_seqs)
    run_dir = Path(cfg.out)
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)

    n_dev = len(jax.devices())
    mesh = (make_mesh(cfg.devices, model_shards=cfg.model_shards)
            if (cfg.devices or 1) > 1 or n_dev > 1 or cfg.model_shards > 1 else None)
    engine = EM(mesh)
    D = engine.num_devices
    bs = -(-cfg.batch_size // D) * D
    check_memory(H, V, bs, data.length, data_shards=D, model_shards=engine.model_shards,
                 limit_bytes=None if cfg.memory_limit_gb is None else int(cfg.memory_limit_gb * (1 << 30)),
                 log=log)
    bucket = cfg.length_bucket
    full = cfg.mode == "full"

    cfg_dict = cfg.to_dict()
    prior = make_prior(cfg, data)
    extra_base = {"data_id": data_id, "data": str(cfg.data), "num_train": int(data.num_train),
                  "num_heldout": int(held_tok.shape[0]), "length": data.length,
                  "prior_row_mass": prior.row_mass(H, V), "processes": jax.process_count(),
                  "prompt_set_id": data.meta.get("prompt_set_id"),
                  "sample_meta": {k: data.meta.get(k) for k in
                                  ("model", "prompt_set", "prompt_set_id", "temperature", "until_eos",
                                   "eos_fraction", "chat_template")}}
    base_key = jax.random.key(cfg.seed)
    metrics_path = run_dir / "metrics.jsonl"

    cks = list_epoch_checkpoints(run_dir) if resume else []
    latest_epoch = broadcast_int(cks[-1][0] if cks else -1)
    latest = epoch_checkpoint_path(run_dir, latest_epoch) if latest_epoch >= 0 else None
    if latest is not None:
        try:
            ck = load_checkpoint(latest, expect_vocab_size=V, expect_fingerprint=fp, expect_hidden_size=H)
        except CheckpointMismatchError as e:
            raise type(e)(f"cannot resume: {e}; use a new --out directory or --no-resume") from e
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        diff = [k for k in TrainConfig._RESUME_KEYS if ck.config.get(k, defaults[k]) != cfg_dict[k]]
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
        if not resume and main:
            for _, p in list_epoch_checkpoints(run_dir):
                p.unlink()
        barrier("hmm_distill_start")
        t0 = time.perf_counter()
        if cfg.init == "lvd":
            params, lvd_info = lvd_init(data.feature_chunks(), H, V, seed=cfg.seed, log=log)
            extra_base["lvd"] = lvd_info
        elif cfg.init == "cluster":
            init_tok, _ = data.train_tokens(None if not cfg.stream else cfg.init_max_seqs)
            params = initialise(cfg.init, init_tok, H, V, seed=cfg.seed, noise=cfg.init_noise)
        else:
            params = initialise(cfg.init, None, H, V, seed=cfg.seed, noise=cfg.init_noise)
        F.validate_params(params, what=f"{cfg.init} initialisation")
        epoch0, step = 0, 0
        metrics = []
        pm = prior.row_mass(H, V)
        log(f"initialised ({cfg.init}) H={H} V={V} in {time.perf_counter() - t0:.1f}s; "
            f"{data.num_train} train / {held_tok.shape[0]} held-out sequences of T≤{data.length} "
            f"({data.num_train_tokens} train tokens{', streamed' if cfg.stream else ''}); {D} device(s), "
            f"{jax.process_count()} process(es); "
            f"prior ({cfg.prior}) per row: emissions {pm['emit_row']:.3g}, transitions "
            f"{pm['trans_row']:.3g} pseudo-counts")
    if main:
        metrics_path.write_text("".join(json.dumps(m) + "\n" for m in metrics))
        (run_dir / "config.json").write_text(json.dumps(cfg_dict, indent=1, sort_keys=True))
    best_path = run_dir / "best.safetensors"
    best = None  # (metrics line, host params) of the best held-out epoch so far (early stopping)
    if cfg.patience and metrics:
        bm = max(metrics, key=lambda m: m["heldout_ll"])
        if bm["epoch"] == epoch0:
            best = (bm, None)  # the resumed parameters themselves
        else:
            try:
                bck = load_checkpoint(best_path, expect_vocab_size=V, expect_fingerprint=fp,
                                      expect_hidden_size=H)
                best = (bm, F.HMMParams(*bck.params)) if bck.epoch == bm["epoch"] else None
            except Exception:  # noqa: BLE001 - missing / other run: restart the count here
                best = None
            if best is None:
                log(f"warning: the best epoch {bm['epoch']} has no best.safetensors; early stopping "
                    f"counts from epoch {epoch0}")
                best = (metrics[-1], None)

    c = data.token_counts.astype(np.float64) + cfg.unigram_smoothing
    with np.errstate(divide="ignore"):
        uni = np.log(c / c.sum())
    uni_held = float(uni[held_tok[held_msk]].mean()) if held_msk.any() else float("nan")
    uni_train = float((data.token_counts * uni).sum() / max(data.num_train_tokens, 1))
    lm_held = None
    if data.held_lp is not None and held_msk.any():
        lm_held = float(data.held_lp[held_msk].astype(np.float64).mean())
    params = engine.replicate(F.to_token_major(params))  # EM works on Bᵀ [V, H]
    if best is not None and best[1] is None:
        # the best epoch so far is the resumed one: keep its parameters, which are the
        # answer if no later epoch beats them
        best = (best[0], _host(params))

    def held_metrics(params):
        h = evaluate(engine, params, held_tok, bs, held_msk, bucket)
        return {"heldout_ll": h, "unigram_heldout_ll": uni_held, "lm_heldout_ll": lm_held,
                "gap_share": gap_share(h, uni_held, lm_held)}

    if epoch0 == 0:
        m0 = {"epoch": 0, "step": 0, "train_ll": None, **held_metrics(params),
              "unigram_train_ll": uni_train, "eta": None, "epoch_time_s": 0.0, "tokens_per_s": None}
        metrics = [m0]
        best = (m0, _host(params)) if cfg.patience else None
        if main:
            metrics_path.write_text(json.dumps(m0) + "\n")
        log(f"epoch 0: held-out {m0['heldout_ll']:.4f} nats/token (unigram {uni_held:.4f}, "
            f"LM {lm_held if lm_held is None else round(lm_held, 4)})")

    n_batches = data.num_batches(bs, full)
    eta_of = step_schedule(cfg.step_schedule, cfg.epochs * n_batches, k0=cfg.step_offset,
                           kappa=cfg.step_kappa, final=cfg.step_final)
    n_train_tok = data.num_train_tokens
    def stop_now() -> bool:
        return bool(cfg.patience) and best is not None and metrics[-1]["epoch"] - best[0]["epoch"] >= cfg.patience

    for epoch in range(epoch0, cfg.epochs):
        if stop_now():
            break
        t0 = time.perf_counter()
        bar = None
        if cfg.progress and main:
            from tqdm.auto import tqdm

            bar = tqdm(total=n_batches, desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch", leave=False)
        tot_ll, tot_n, eta, done_tok = 0.0, 0, None, 0
        if full:
            total = None
            for b, (tok, msk) in enumerate(data.epoch_batches(epoch, bs, full=True, bucket=bucket, seed=cfg.seed,
                                                              dropout=cfg.token_dropout)):
                c, ok = engine.counts(params, tok, msk)
                if not bool(to_host(ok)):
                    raise NonFiniteStatisticsError(
                        f"non-finite expected counts in epoch {epoch + 1}, batch {b} of {cfg.data}")
                total = c if total is None else F.add_counts(total, c)
                done_tok += int(msk.sum())
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(tok_s=f"{done_tok / (time.perf_counter() - t0):.0f}")
            tot_ll, tot_n = float(to_host(total.loglik)), int(to_host(total.n_tokens))
            if int(to_host(total.n_impossible)):
                log(f"warning: {int(to_host(total.n_impossible))} training sequences have probability 0 "
                    f"(use a pseudocount > 0)")
            params = engine.m_step(total, params, prior)
            step += 1
        else:
            for b, (tok, msk) in enumerate(data.epoch_batches(epoch, bs, full=False, bucket=bucket,
                                                              seed=cfg.seed, dropout=cfg.token_dropout)):
                eta = eta_of(step)
                share = int(msk.any(1).sum()) / data.num_train  # |b| / N (see module docstring)
                params, (ll, nt, nimp), ok = engine.minibatch_step(params, tok, msk, eta, prior.scaled(share))
                if not bool(to_host(ok)):
                    raise NonFiniteStatisticsError(
                        f"non-finite expected counts in epoch {epoch + 1}, batch {b} of {cfg.data}")
                tot_ll += float(to_host(ll))
                tot_n += int(to_host(nt))
                done_tok += int(msk.sum())
                step += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(ll=f"{tot_ll / max(tot_n, 1):.3f}", eta=f"{eta:.3f}",
                                    tok_s=f"{done_tok / (time.perf_counter() - t0):.0f}")
        if bar is not None:
            bar.close()
        train_time = time.perf_counter() - t0
        hm = held_metrics(params)
        m = {"epoch": epoch + 1, "step": step, "train_ll": tot_ll / max(tot_n, 1), **hm,
             "unigram_train_ll": uni_train, "eta": eta,
             "epoch_time_s": train_time, "tokens_per_s": n_train_tok / train_time}
        if not math.isfinite(m["train_ll"]) or not math.isfinite(hm["heldout_ll"] if held_tok.size else 0.0):
            raise NonFiniteStatisticsError(f"non-finite log-likelihood after epoch {epoch + 1}: {m}")
        metrics.append(m)
        host_params = _host(params)
        improved = cfg.patience and m["heldout_ll"] > best[0]["heldout_ll"]
        if improved:
            best = (m, host_params)
        if main:
            if improved:
                save_checkpoint(best_path, host_params, fingerprint=fp, eos_token_id=eos, epoch=epoch + 1,
                                step=step, rng_key=np.asarray(jax.random.key_data(base_key)),
                                config=cfg_dict, extra={**extra_base, "metrics": m})
            with open(metrics_path, "a") as f:
                f.write(json.dumps(m) + "\n")
            save_checkpoint(epoch_checkpoint_path(run_dir, epoch + 1), host_params, fingerprint=fp,
                            eos_token_id=eos, epoch=epoch + 1, step=step,
                            rng_key=np.asarray(jax.random.key_data(base_key)), config=cfg_dict,
                            extra={**extra_base, "metrics": m})
            if cfg.keep_checkpoints > 0:
                for _, p in list_epoch_checkpoints(run_dir)[:-cfg.keep_checkpoints]:
                    p.unlink()
            if cfg.plot:
                _plot(run_dir, metrics)
        barrier(f"hmm_distill_epoch_{epoch + 1}")  # the checkpoint of this epoch is on disk
        if os.environ.get("HMM_DISTILL_TEST_KILL_AFTER_EPOCH") == str(epoch + 1):  # tests: a killed process
            os.kill(os.getpid(), signal.SIGKILL)
        gs = "" if m["gap_share"] is None else f", gap share {m['gap_share']:.3f}"
        log(f"epoch {epoch + 1}/{cfg.epochs}: train {m['train_ll']:.4f}  held-out {hm['heldout_ll']:.4f} "
            f"(unigram {uni_held:.4f}{gs}) nats/token; {m['tokens_per_s']:.0f} tok/s; {train_time:.1f}s")

    final = _host(params)
    chosen = metrics[-1] if metrics else None
    last_epoch = metrics[-1]["epoch"] if metrics else epoch0
    if cfg.patience and best is not None:
        chosen = best[0]
        if best[1] is not None:
            final = best[1]
        if chosen["epoch"] != last_epoch or last_epoch < cfg.epochs:
            log(f"early stopping: best held-out {chosen['heldout_ll']:.4f} at epoch {chosen['epoch']} "
                f"(ran {last_epoch} of {cfg.epochs} epochs, patience {cfg.patience})")
    if main:
        save_checkpoint(run_dir / "hmm.safetensors", final, fingerprint=fp, eos_token_id=eos,
                        epoch=chosen["epoch"] if chosen else epoch0, step=step,
                        rng_key=np.asarray(jax.random.key_data(base_key)), config=cfg_dict,
                        extra={**extra_base, "metrics": chosen, "epochs_run": last_epoch})
        if cfg.plot and metrics:
            _plot(run_dir, metrics)
    barrier("hmm_distill_done")
    return TrainResult(params=final, metrics=metrics, run_dir=run_dir, best=chosen)
