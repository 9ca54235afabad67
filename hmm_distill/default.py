r"""The default HMM: distilled for the default model from the built-in task prompts.

:func:`default_hmm` returns an HMM for SmolLM2-135M-Instruct (or any GGUF model),
distilled from continuations of the built-in tool-call / JSON / keyword prompts
(:mod:`hmm_distill.prompts`), rendered with the chat template of ``jaxcd generate``
and sampled until EOS. It is built on first use (sampling, then EM, with progress
bars) and cached under ``<jaxcd cache>/hmm/<key>/`` (``$JAXCD_CACHE`` or
``~/.cache/jaxcd``, see :func:`jaxcd.model_files.cache_dir`); the key hashes the
model file, the prompt set and the settings, so another model, prompt set or
setting builds another HMM. An interrupted build resumes (sample shards and EM
checkpoints are kept). A lock file serialises concurrent builds of the same key.

The HMM's vocabulary is the LM's (49,152 for SmolLM2) and its EOS is the LM's EOS.
Its ``π`` is the hidden-state distribution *after the prompt* (the HMM models the
continuation only), as P-GCD and SMC use it.

Example::

    from hmm_distill.default import default_hmm
    params, info = default_hmm()          # HMMParams(pi [H], A [H,H], B [H,V]) as jax arrays
    info["eos_token_id"], info["path"], info["heldout"]["gap_share"]

jaxcd reaches :func:`default_hmm` (``--hmm default``) and :func:`demo_hmm` (``jaxcd demo``'s
small HMM) through the entry points ``default`` and ``demo`` of the group
``jaxcd.hmm_builders`` (declared in ``pyproject.toml``; :func:`jaxcd.hmm.build_hmm`), so
jaxcd never imports hmm_distill.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from .checkpoint import load_checkpoint
from .errors import ConfigError
from .hmm import HMMParams

VERSION = 4  # bump when the recipe changes (invalidates cached HMMs)
# 2: one sample shard (prompts prefilled once each), EM with early stopping (patience)
# 3: the pooled sampler moves the cache left in the tail too (v2's long tail rows could
#    write past the cache's last slot, which silently changed their context)
# 4: sampling in two concurrent pools of 64 rows (threads; sequences split by prompt) so that
#    both cores of a 2-core CPU are used; same per-sequence keys and distribution, other
#    float rounding (cache placement, batch), so some draws differ from v3's


@dataclass(frozen=True)
class DefaultSettings:
    """The recipe of the default HMM (all of it is part of the cache key)."""

    hidden_size: int = 128
    num_seqs: int = 512          #: continuations (prompt i mod 154)
    max_length: int = 128        #: hard cap of a continuation (until EOS)
    batch_size: int = 64         #: sampling batch (rows of each pool)
    pools: int = 2               #: concurrent sampling pools (threads), sequences split by prompt
    temperature: float = 1.0
    seed: int = 0
    epochs: int = 30             #: full-batch EM iterations at most
    patience: int = 4            #: stop 4 iterations after the best held-out log-likelihood
    mode: str = "full"
    prior_strength: float = 0.1
    heldout_frac: float = 0.1


@dataclass(frozen=True)
class TaskSettings(DefaultSettings):
    """The recipe of a *task* HMM: the default recipe plus the prompt set, the recorded
    LM features and latent-variable initialisation, streaming EM and token dropout
    (all part of the cache key). :data:`TASK_PROFILES` holds the named settings."""

    prompt_set: str = "tools"    #: "tools" (tool-call prompts, hmm_distill.prompts) or "builtin"
    features: int = 64           #: LM feature dimension recorded while sampling (for init "lvd")
    init: str = "lvd"            #: "lvd", "cluster" or "random"
    token_dropout: float = 0.01  #: token-dropout smoothing
    stream: bool = True          #: EM reads the sample shards one at a time
    shard_size: int = 2048       #: continuations per sample shard (the unit of resume)
    continuations_per_prompt: int = 8   #: consecutive sequences per prompt (one prefill each)
    max_prompt_tokens: int = 1024       #: prompts longer than this (rendered) are left out
    mode: str = "minibatch"
    em_batch_size: int = 256     #: sequences per E-step batch
    step_schedule: str = "power"


TASK_PROFILES = {
    # sized for a 2-core CPU (the measured costs: docs/hmm_distill.md, "The task HMM")
    "cpu": TaskSettings(hidden_size=256, num_seqs=8192, max_length=96, batch_size=64, pools=2,
                        epochs=6, patience=2, max_prompt_tokens=512),
    # the references' scale on an accelerator (GeLaTo / Ctrl-G: millions of sequences, H = 4096)
    "accelerator": TaskSettings(hidden_size=4096, num_seqs=2_000_000, max_length=128, batch_size=512,
                                pools=1, epochs=4, patience=1, shard_size=65536, em_batch_size=2048,
                                max_prompt_tokens=2048),
    # a few minutes anywhere: for tests and smoke runs
    "smoke": TaskSettings(hidden_size=16, num_seqs=64, max_length=24, batch_size=32, pools=1, epochs=2,
                          patience=0, shard_size=32, features=16, em_batch_size=32),
}
"""Named :class:`TaskSettings` of :func:`task_hmm` (``profile=``)."""


def _file_digest(path: Path, full: bool = False) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest() if full else h.hexdigest()[:16]


def cache_key(model_file: Path, settings: DefaultSettings, prompt_hash: str) -> str:
    key = {"version": VERSION, "model": _file_digest(model_file), "prompts": prompt_hash,
           "settings": asdict(settings)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _lock(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def default_hmm_dir(model_path=None, settings: DefaultSettings | None = None) -> Path:
    """The cache directory of the default HMM for ``model_path`` (default model if None)."""
    from jaxcd.model_files import cache_dir, resolve_gguf

    from .prompts import builtin_prompt_set_hash

    settings = settings or DefaultSettings()
    model_file = resolve_gguf(model_path)
    return cache_dir() / "hmm" / f"{model_file.stem}-{cache_key(model_file, settings, builtin_prompt_set_hash())}"


def default_hmm(model_path: str | os.PathLike | None = None, *, hidden_size: int | None = None,
                settings: DefaultSettings | None = None, progress: bool = True, rebuild: bool = False,
                log=None) -> tuple[HMMParams, dict]:
    """The default HMM for ``model_path`` (a GGUF file; None = the default model).

    Args:
      hidden_size: overrides ``settings.hidden_size`` (default 128).
      settings: the recipe (:class:`DefaultSettings`); part of the cache key.
      progress: progress bars on stderr while building.
      rebuild: ignore a cached HMM and build it again.
    Returns:
      ``(params, info)``: :class:`~hmm_distill.hmm.HMMParams` of float32 jax arrays
      (``pi [H]``, ``A [H, H]``, ``B [H, V]``, rows normalised) and a dict with ``path``
      (the checkpoint), ``cached`` (bool), ``eos_token_id``, ``vocab_size``,
      ``vocab_fingerprint``, ``hidden_size``, ``prompt_set_id`` (hash of the rendered
      prompt tokens), ``prompt_set_hash`` (hash of the prompt file), ``model``,
      ``settings``, ``heldout`` (HMM / unigram / LM held-out log-likelihood per token
      and the gap share), ``eos_fraction`` and ``build_seconds`` per phase.
    """
    settings = settings or DefaultSettings()
    if hidden_size is not None:
        settings = DefaultSettings(**{**asdict(settings), "hidden_size": int(hidden_size)})
    return _cached(default_hmm_dir(model_path, settings), model_path, settings, progress, rebuild, log)


def _cached(root: Path, model_path, settings, progress: bool, rebuild: bool, log) -> tuple[HMMParams, dict]:
    """The HMM cached in ``root`` (built first if it is not there, or with ``rebuild``;
    a lock file serialises concurrent builds of one key) and its info."""
    say = log or (lambda msg: print(f"hmm_distill: {msg}", file=sys.stderr, flush=True))
    final, info_path = root / "hmm.safetensors", root / "info.json"
    with _lock(root.parent / f".{root.name}.lock"):
        if rebuild and root.exists():
            shutil.rmtree(root)
        cached = final.exists() and info_path.exists()
        if not cached:
            _build(model_path, settings, root, progress, say)
        info = json.loads(info_path.read_text())
    ck = load_checkpoint(final, expect_vocab_size=info["vocab_size"],
                         expect_fingerprint=info["vocab_fingerprint"])
    info.update(path=str(final), cached=cached)
    return HMMParams(*(jnp.asarray(x) for x in ck.params)), info


DEMO_SETTINGS = DefaultSettings(hidden_size=32, num_seqs=64, max_length=32, batch_size=64, epochs=10)
"""The recipe of ``jaxcd demo``'s small HMM (64 short continuations: a minute or two on a CPU)."""


def demo_hmm(model_path: str | os.PathLike | None = None, **kwargs) -> tuple[HMMParams, dict]:
    """The small HMM of ``jaxcd demo`` (:data:`DEMO_SETTINGS`), built on first use and
    cached like :func:`default_hmm` (whose keyword arguments ``kwargs`` are)."""
    return default_hmm(model_path, settings=DEMO_SETTINGS, **kwargs)


def _cpu_seconds() -> float:
    """User + system CPU time of this process (all threads) and its finished children."""
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def _prompt_file(settings: DefaultSettings) -> Path:
    from .prompts import builtin_prompts_path, tool_prompts_path

    name = getattr(settings, "prompt_set", "builtin")
    if name == "builtin":
        return builtin_prompts_path()
    if name == "tools":
        return tool_prompts_path()
    raise ConfigError(f"unknown prompt set {name!r} (expected 'tools' or 'builtin')")


def _build(model_path, settings: DefaultSettings, root: Path, progress: bool, say) -> None:
    from .lms import load_lm
    from .sampler import read_prompts, run_sampling
    from .train import TrainConfig, train

    root.mkdir(parents=True, exist_ok=True)
    s = settings
    task = isinstance(s, TaskSettings)
    prompt_file = _prompt_file(s)
    say(f"building the {'task' if task else 'default'} HMM (H={s.hidden_size}) in {root}: sampling "
        f"{s.num_seqs} continuations of {prompt_file.name}, then EM (done once, then cached; an "
        f"interrupted build resumes)")
    times, cpu = {}, {}
    load0 = os.getloadavg()
    t0, c0 = time.perf_counter(), _cpu_seconds()
    from jaxcd.model_files import resolve_gguf

    model_file = resolve_gguf(model_path)
    loaded = load_lm(f"gguf:{model_file}")
    texts, ids = read_prompts(prompt_file, fmt="chat", tokenizer_loader=loaded.tokenizer_loader)
    cpp = 1
    if task:  # the prompts the run needs: a seeded sample of those within the length limit
        cpp = s.continuations_per_prompt
        ok = [j for j, p in enumerate(ids) if len(p) <= s.max_prompt_tokens]
        if not ok:
            raise ConfigError(f"no prompt of {prompt_file.name} has at most {s.max_prompt_tokens} tokens")
        pick = np.random.default_rng([s.seed, 0x7A5C]).permutation(ok)[: -(-s.num_seqs // cpp)]
        texts, ids = [texts[j] for j in pick], [ids[j] for j in pick]
        say(f"{len(ids)} of {len(ok)} prompts with at most {s.max_prompt_tokens} tokens "
            f"({np.mean([len(p) for p in ids]):.0f} on average), "
            f"{cpp} continuations each")
    times["load"], cpu["load"] = time.perf_counter() - t0, _cpu_seconds() - c0
    t0, c0 = time.perf_counter(), _cpu_seconds()
    meta = run_sampling(loaded.lm, loaded.params, root / "samples", num_seqs=s.num_seqs,
                        length=s.max_length, shard_size=s.shard_size if task else s.num_seqs,
                        batch_size=s.batch_size, seed=s.seed,
                        temperature=s.temperature, prompt_ids=ids, prompt_texts=texts,
                        model_name=f"gguf:{model_file.name}", fingerprint=loaded.fingerprint,
                        progress=progress, prompt_set=prompt_file.name, until_eos=True,
                        chat_template=True, pools=s.pools, features=s.features if task else 0,
                        continuations_per_prompt=cpp)
    times["sample"], cpu["sample"] = time.perf_counter() - t0, _cpu_seconds() - c0
    say(f"sampled: EOS fraction {meta['eos_fraction']:.3f}, {meta['num_cut_off']} cut off at "
        f"{s.max_length} tokens, {meta.get('tokens_per_s', 0):.0f} tokens/s")
    t0, c0 = time.perf_counter(), _cpu_seconds()
    extra = {}
    if task:
        extra = dict(init=s.init, token_dropout=s.token_dropout, stream=s.stream,
                     step_schedule=s.step_schedule)
    cfg = TrainConfig(data=str(root / "samples"), out=str(root / "run"), hidden_size=s.hidden_size,
                      epochs=s.epochs, mode=s.mode, prior_strength=s.prior_strength,
                      heldout_frac=s.heldout_frac, seed=s.seed,
                      batch_size=s.em_batch_size if task else 256, plot=False,
                      progress=progress, patience=s.patience, **extra)
    res = train(cfg, log=(say if task else (lambda *a: None)))
    times["train"], cpu["train"] = time.perf_counter() - t0, _cpu_seconds() - c0
    last = res.best
    gs = last.get("gap_share")
    say(f"trained: held-out {last['heldout_ll']:.3f} nats/token (unigram {last['unigram_heldout_ll']:.3f}, "
        f"LM {last['lm_heldout_ll']:.3f}; gap share {gs if gs is None else round(gs, 3)}) at EM iteration "
        f"{last['epoch']} of {res.metrics[-1]['epoch']} run; {sum(times.values()):.0f} s in all "
        f"({sum(cpu.values()):.0f} CPU s)")
    ck = load_checkpoint(res.run_dir / "hmm.safetensors")
    info = {"model": str(model_file), "settings": asdict(s), "version": VERSION,
            "kind": "task" if task else "default", "prompt_set_file": prompt_file.name,
            "vocab_size": ck.vocab_size, "vocab_fingerprint": ck.fingerprint, "hidden_size": ck.hidden_size,
            "eos_token_id": ck.eos_token_id, "prompt_set_id": meta["prompt_set_id"],
            "prompt_set_hash": _file_digest(prompt_file), "eos_fraction": meta["eos_fraction"],
            "num_cut_off": meta["num_cut_off"], "sampling_tokens_per_s": meta.get("tokens_per_s"),
            "heldout": {k: last.get(k) for k in ("heldout_ll", "unigram_heldout_ll", "lm_heldout_ll",
                                                 "gap_share")},
            "best_epoch": last["epoch"], "epochs_run": res.metrics[-1]["epoch"],
            "curve": [{k: m.get(k) for k in ("epoch", "heldout_ll", "gap_share", "tokens_per_s")}
                      for m in res.metrics],
            "build_seconds": times, "build_cpu_seconds": cpu,
            "build_wall_seconds_total": sum(times.values()), "build_cpu_seconds_total": sum(cpu.values()),
            "build_machine": {"cpus": os.cpu_count(), "loadavg_start": list(load0),
                              "loadavg_end": list(os.getloadavg())},
            "sampling_prefill_tokens": meta.get("prefill_tokens"),
            "sampling_decode_row_steps": meta.get("decode_row_steps"),
            "checkpoint_sha256": _file_digest(res.run_dir / "hmm.safetensors", full=True)}
    shutil.copyfile(res.run_dir / "hmm.safetensors", root / "hmm.safetensors.tmp")
    os.replace(root / "hmm.safetensors.tmp", root / "hmm.safetensors")
    tmp = root / "info.json.tmp"
    tmp.write_text(json.dumps(info, indent=1, sort_keys=True))
    os.replace(tmp, root / "info.json")


def task_hmm_dir(model_path=None, settings: TaskSettings | None = None) -> Path:
    """The cache directory of the task HMM for ``model_path`` and ``settings``."""
    from jaxcd.model_files import cache_dir, resolve_gguf

    settings = settings or TASK_PROFILES["cpu"]
    model_file = resolve_gguf(model_path)
    key = cache_key(model_file, settings, _file_digest(_prompt_file(settings)))
    return cache_dir() / "hmm" / f"{model_file.stem}-task-{key}"


def task_hmm(model_path: str | os.PathLike | None = None, *, profile: str = "cpu",
             settings: TaskSettings | None = None, hidden_size: int | None = None, progress: bool = True,
             rebuild: bool = False, log=None) -> tuple[HMMParams, dict]:
    """The task HMM for ``model_path`` (a GGUF file or model name; None = the default
    model): distilled from the model's own answers to the tool-call prompt set
    (:func:`hmm_distill.prompts.tool_prompts_path`), with LM features recorded while
    sampling, latent-variable initialisation, streaming mini-batch EM and token dropout.

    ``profile`` names the settings (:data:`TASK_PROFILES`: ``"cpu"``, ``"accelerator"``,
    ``"smoke"``); ``settings`` overrides it; ``hidden_size`` overrides its H. Built on
    first use (progress bars; an interrupted build resumes from its sample shards and EM
    checkpoints) and cached under ``<jaxcd cache>/hmm/<model>-task-<key>/``, the key
    hashing the model file, the prompt file and the settings. Returns ``(params, info)``
    as :func:`default_hmm` (``info["checkpoint_sha256"]`` identifies the result)."""
    if settings is None:
        if profile not in TASK_PROFILES:
            raise ConfigError(f"unknown task HMM profile {profile!r} (expected one of {sorted(TASK_PROFILES)})")
        settings = TASK_PROFILES[profile]
    if hidden_size is not None:
        settings = TaskSettings(**{**asdict(settings), "hidden_size": int(hidden_size)})
    return _cached(task_hmm_dir(model_path, settings), model_path, settings, progress, rebuild, log)


def main(argv=None) -> int:
    """``python -m hmm_distill.default [--hidden-size H] [--model PATH] [--rebuild]``: build
    (or find) the default HMM and print its info."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m hmm_distill.default", description=main.__doc__)
    ap.add_argument("--model")
    ap.add_argument("--hidden-size", type=int)
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    _, info = default_hmm(a.model, hidden_size=a.hidden_size, rebuild=a.rebuild, progress=not a.no_progress)
    info["wall_seconds_this_call"] = time.perf_counter() - t0
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
