"""Command line: ``hmm-distill`` / ``python -m hmm_distill``.

Subcommands::

    sample  draw LM continuations into a sample directory (sharded .npy + metadata.json)
    train   Baum–Welch distillation of an HMM from a sample directory
    eval    held-out log-likelihood of a checkpoint on a sample directory
    info    print a checkpoint's metadata
    task    a model's task HMM, the whole recipe (sample with LM features, LVD, streaming EM), cached

Examples::

    python -m hmm_distill sample --lm gguf --out data/smol --num-seqs 2048 --length 64
    python -m hmm_distill sample --lm toy:512 --out data/toy --num-seqs 4000 --length 64
    python -m hmm_distill train --data data/smol --out runs/smol-h128            # resumes if interrupted
    python -m hmm_distill train --config cfg.json --epochs 20                     # flags override the file
    python -m hmm_distill eval --ckpt runs/smol-h128/hmm.safetensors --data data/smol
    python -m hmm_distill task --model qwen2.5-coder-0.5b --profile cpu             # the task HMM recipe

Errors the user can fix (bad files, mismatched vocabularies, bad config) print one
line ``error: ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from .errors import ConfigError, HMMDistillError


def _add_sample(sub):
    p = sub.add_parser("sample", help="sample LM continuations (sharded .npy + metadata.json)")
    p.add_argument("--lm", default="gguf",
                   help="gguf[:PATH] (default SmolLM2-135M), table:PATH.npz, toy:V[:SEED], hmm:CKPT")
    p.add_argument("--out", required=True, help="sample directory (resumed if it exists)")
    p.add_argument("--num-seqs", type=int, default=2048)
    p.add_argument("--length", "-T", type=int, default=64, help="tokens per sequence (EOS-padded)")
    p.add_argument("--shard-size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--prompts", help="FILE.jsonl (or .jsonl.gz) of chat prompts ({\"user\", \"system\"?, "
                   "\"tools\"?} per line; rendered with the chat template of `jaxcd generate`), "
                   "'builtin' (the built-in tool-call / JSON / keyword prompts), 'tools' (the "
                   "BFCL tool-call prompts no study evaluates, hmm_distill/data/tool_prompts.jsonl.gz), "
                   "or a text / ids file with one prompt per line (default: start from BOS)")
    p.add_argument("--prompt-format", choices=("chat", "text", "ids"), default=None,
                   help="default: chat for *.jsonl, *.jsonl.gz, builtin and tools, else text")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="drop the prompts longer than this many tokens once rendered (prefill "
                        "of long prompts is most of the sampling cost on a CPU)")
    p.add_argument("--no-bos", action="store_true", help="do not prepend BOS to text/ids prompts")
    p.add_argument("--until-eos", action="store_true",
                   help="sample each continuation until EOS, capped at --max-length tokens")
    p.add_argument("--max-length", type=int, default=256, help="hard cap with --until-eos")
    p.add_argument("--features", type=int, default=0, metavar="D",
                   help="also record a D-dimensional feature of the LM state behind every sampled "
                        "token, for `train --init lvd` (latent-variable initialisation; D = 64 is "
                        "plenty; costs D x 2 bytes per token on disk)")
    p.add_argument("--continuations-per-prompt", type=int, default=1, metavar="C",
                   help="C consecutive sequences continue the same prompt (prefilled once for them)")
    p.add_argument("--pools", type=int, default=1,
                   help="concurrent sampling pools (threads) of --batch-size rows each")
    p.add_argument("--fingerprint", help="override the vocabulary fingerprint recorded")
    p.add_argument("--no-progress", action="store_true")
    _add_distributed(p)


def _add_distributed(p):
    g = p.add_argument_group("several processes (jax.distributed)")
    g.add_argument("--coordinator", help="HOST:PORT of process 0 (or 'auto' under SLURM / on a TPU pod)")
    g.add_argument("--num-processes", type=int)
    g.add_argument("--process-id", type=int)


def _parse_bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def _add_train(sub):
    from .train import TrainConfig

    p = sub.add_parser("train", help="distil an HMM by EM from a sample directory")
    p.add_argument("--config", help="JSON file of TrainConfig fields (flags override it)")
    helps = {
        "data": "sample directory", "out": "run directory (checkpoints, metrics, plot)",
        "hidden_size": "H", "mode": "minibatch | full", "init": "cluster | lvd | random",
        "step_offset": "k0 in eta_k=(k+k0)^-kappa", "step_kappa": "kappa in (0.5, 1]",
        "devices": "devices for data-parallel EM (default: all)",
    }
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("plot", "progress"):
            continue
        flag = "--" + f.name.replace("_", "-")
        typ = {"int": int, "float": float, "str": str}.get(str(f.type).split(" ")[0], None)
        if str(f.type) == "bool":
            typ = _parse_bool
        if f.name == "memory_limit_gb":
            typ = float
        if f.name in ("max_seqs", "devices"):
            typ = int
        elif f.name == "init_noise":
            typ = float
        p.add_argument(flag, dest=f.name, type=typ, default=None,
                       help=f"{helps.get(f.name, '')} (default {f.default!r})".strip())
    p.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    _add_distributed(p)


def _cmd_sample(a) -> int:
    from .lms import load_lm
    from .sampler import read_prompts, run_sampling

    from .distributed import initialize

    initialize(a.coordinator, a.num_processes, a.process_id)
    loaded = load_lm(a.lm)
    texts, ids, prompt_set, fmt = None, None, None, a.prompt_format
    if a.prompts:
        path = a.prompts
        if path == "builtin":
            from .prompts import builtin_prompts_path

            path = str(builtin_prompts_path())
        elif path == "tools":
            from .prompts import tool_prompts_path

            path = str(tool_prompts_path())
        if fmt is None:
            fmt = "chat" if path.endswith((".jsonl", ".jsonl.gz")) else "text"
        bos = None if a.no_bos else getattr(loaded.lm, "bos_token_id", None)
        if bos is not None and bos < 0:
            bos = None
        texts, ids = read_prompts(path, fmt=fmt, tokenizer_loader=loaded.tokenizer_loader, bos=bos,
                                  max_prompt_tokens=a.max_prompt_tokens)
        prompt_set = Path(path).name
    length = a.max_length if a.until_eos else a.length
    meta = run_sampling(loaded.lm, loaded.params, a.out, num_seqs=a.num_seqs, length=length,
                        shard_size=a.shard_size, batch_size=a.batch_size, seed=a.seed,
                        temperature=a.temperature, prompt_ids=ids, prompt_texts=texts,
                        model_name=loaded.name, fingerprint=a.fingerprint or loaded.fingerprint,
                        progress=not a.no_progress, prompt_set=prompt_set, until_eos=a.until_eos,
                        chat_template=fmt == "chat", features=a.features, pools=a.pools,
                        continuations_per_prompt=a.continuations_per_prompt)
    n = sum(s["num_seqs"] for s in meta["shards"])
    unf = meta.get("num_cut_off", 0)
    ef = meta.get("eos_fraction")
    print(f"{a.out}: {n} sequences of at most {length} tokens in {len(meta['shards'])} shard(s); "
          f"{unf} cut off without EOS (EOS fraction {ef if ef is None else round(ef, 4)}); "
          f"{meta.get('tokens_per_s', 0):.0f} tokens/s")
    return 0


def _cmd_train(a) -> int:
    from .distributed import initialize
    from .train import TrainConfig, train

    initialize(a.coordinator, a.num_processes, a.process_id)
    base = {}
    if a.config:
        try:
            base = json.loads(Path(a.config).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read config file {a.config}: {e}") from e
        if not isinstance(base, dict):
            raise ConfigError(f"config file {a.config} must hold a JSON object")
    for f in dataclasses.fields(TrainConfig):
        v = getattr(a, f.name, None)
        if v is not None:
            base[f.name] = v
    if a.no_plot:
        base["plot"] = False
    if a.no_progress:
        base["progress"] = False
    cfg = TrainConfig.from_dict(base)
    res = train(cfg, resume=not a.no_resume)
    last = res.metrics[-1] if res.metrics else {}
    from .distributed import is_main

    if is_main():
        print(f"done: {res.run_dir}/hmm.safetensors; held-out {last.get('heldout_ll', float('nan')):.4f} "
              f"nats/token vs unigram {last.get('unigram_heldout_ll', float('nan')):.4f}")
    return 0


def _cmd_eval(a) -> int:
    import numpy as np

    from . import hmm as F
    from .checkpoint import load_checkpoint
    from .data import load_samples
    from .em import EM
    from .train import evaluate

    from .priors import first_eos_mask

    s = load_samples(a.data, max_seqs=a.max_seqs)
    ck = load_checkpoint(a.ckpt, expect_vocab_size=s.vocab_size, expect_fingerprint=s.fingerprint)
    # as the training job counts: each row up to and including its first EOS
    mask = first_eos_mask(s.tokens, s.eos_token_id) if not a.all_positions else None
    ll = evaluate(EM(), F.as_params(*ck.params), s.tokens, a.batch_size, mask)
    c = np.bincount(s.tokens.ravel() if mask is None else s.tokens[mask], minlength=s.vocab_size)
    out = {"ckpt": str(a.ckpt), "data": str(a.data), "num_seqs": int(s.tokens.shape[0]),
           "num_tokens": int(c.sum()), "ll_per_token": ll, "num_distinct_tokens": int((c > 0).sum())}
    if s.logprobs is not None and mask is not None:
        out["lm_ll_per_token"] = float(s.logprobs[mask].astype(np.float64).mean())
    if a.unigram_from:
        from .train import gap_share, unigram_logprobs

        tr = load_samples(a.unigram_from)
        uni = unigram_logprobs(tr.tokens, s.vocab_size, 0.1, first_eos_mask(tr.tokens, tr.eos_token_id))
        out["unigram_ll_per_token"] = float(uni[s.tokens[mask] if mask is not None else s.tokens].mean())
        out["gap_share"] = gap_share(ll, out["unigram_ll_per_token"], out.get("lm_ll_per_token"))
    print(json.dumps(out))
    return 0


def _cmd_info(a) -> int:
    from .checkpoint import load_checkpoint

    ck = load_checkpoint(a.ckpt)
    print(json.dumps({"path": str(ck.path), "hidden_size": ck.hidden_size, "vocab_size": ck.vocab_size,
                      "vocab_fingerprint": ck.fingerprint, "eos_token_id": ck.eos_token_id,
                      "epoch": ck.epoch, "step": ck.step, "config": ck.config, "extra": ck.extra},
                     indent=1))
    return 0


def _user_errors() -> tuple:
    errs = [HMMDistillError]
    try:
        from jaxcd.errors import JaxcdError

        errs.append(JaxcdError)
    except Exception:  # pragma: no cover
        pass
    return tuple(errs)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hmm-distill", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_sample(sub)
    _add_train(sub)
    p = sub.add_parser("eval", help="held-out log-likelihood of a checkpoint")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--max-seqs", type=int)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--all-positions", action="store_true",
                   help="count the EOS padding after each row's first EOS too (default: as training does)")
    p.add_argument("--unigram-from", metavar="DIR",
                   help="training samples: also report the add-0.1 unigram baseline and the gap share")
    p = sub.add_parser("info", help="print checkpoint metadata")
    p.add_argument("--ckpt", required=True)
    p = sub.add_parser("task", help="build (or find) a model's task HMM: the whole recipe, cached")
    p.add_argument("--model", default=None, help="GGUF path or model name (default SmolLM2-135M)")
    p.add_argument("--profile", default="cpu", help="settings: cpu (a 2-core CPU; measured costs in docs/hmm_distill.md), accelerator "
                   "(the references' scale), smoke (minutes)")
    p.add_argument("--hidden-size", type=int, default=None, help="override the profile's H")
    p.add_argument("--rebuild", action="store_true", help="discard a cached or partial build")
    p.add_argument("--no-progress", action="store_true")
    return ap


def _cmd_task(a) -> int:
    from .default import task_hmm

    _, info = task_hmm(a.model, profile=a.profile, hidden_size=a.hidden_size, rebuild=a.rebuild,
                       progress=not a.no_progress)
    keep = ("path", "cached", "hidden_size", "vocab_size", "heldout", "checkpoint_sha256",
            "build_wall_seconds_total", "build_cpu_seconds_total", "build_seconds", "settings")
    print(json.dumps({k: info.get(k) for k in keep}, indent=1))
    return 0


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    cmd = {"sample": _cmd_sample, "train": _cmd_train, "eval": _cmd_eval, "info": _cmd_info,
           "task": _cmd_task}[a.cmd]
    try:
        return cmd(a)
    except _user_errors() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
