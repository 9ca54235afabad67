"""Distillation sampling against a bare batched decode loop of the same model.

``hmm-distill sample`` draws continuations until EOS by continuous batching
(:func:`hmm_distill.sampler.sample_pool`): rows whose continuation has ended are
refilled with the next sequence, prompts are prefilled in groups, and the features for
latent-variable initialisation can be recorded on the way. The reference is the
cheapest loop that produces the same number of tokens per step: one prefill of
``batch`` prompts, then ``length`` steps of draw + ``lm.step`` for every row, with no
EOS logic, no refills and no bookkeeping (one jitted program).

Both run in one process, interleaved round by round after a warm-up round that
compiles them. Throughput is divided by the work done: tokens generated (up to and
including EOS) for the sampler, ``batch × length`` for the bare loop; the sampler's
figure includes its prompt prefills, the bare loop's its one prefill. Reported: per
round tokens/s and their ratio, and the ratio of medians.

    python -m experiments.bench_distill_sampling --batch 64 --length 64 --seqs 256 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@partial(jax.jit, static_argnames=("lm", "length"))
def bare_loop(lm, params, prompt_ids, prompt_lengths, key, *, length: int):
    """Prefill, then ``length`` steps of categorical draw + ``lm.step`` for every row."""
    state, logp = lm.prefill(params, prompt_ids, prompt_lengths, prompt_ids.shape[1] + length)

    def body(carry, k):
        state, logp = carry
        tok = jax.random.categorical(k, logp.astype(jnp.float32), axis=-1).astype(jnp.int32)
        state, logp = lm.step(params, state, tok)
        return (state, logp), tok

    _, toks = jax.lax.scan(body, (state, logp), jax.random.split(key, length))
    return toks.T


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF path or model name (default SmolLM2-135M)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=64, help="cap of a continuation / bare loop steps")
    ap.add_argument("--seqs", type=int, default=256, help="continuations the sampler draws per round")
    ap.add_argument("--features", type=int, default=0, help="also record LVD features (D)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_distill_sampling"))
    a = ap.parse_args(argv)

    from jaxcd.decoding.buckets import pad_prompts
    from jaxcd.model_files import resolve_gguf
    from hmm_distill.lms import load_lm
    from hmm_distill.prompts import builtin_prompts_path
    from hmm_distill.sampler import read_prompts, run_sampling

    model = resolve_gguf(a.model)
    loaded = load_lm(f"gguf:{model}")
    lm, params = loaded.lm, loaded.params
    _, prompts = read_prompts(builtin_prompts_path(), fmt="chat", tokenizer_loader=loaded.tokenizer_loader)
    bare_prompts = [prompts[i % len(prompts)] for i in range(a.batch)]
    ids, lens = pad_prompts(bare_prompts)
    ids, lens = jnp.asarray(ids), jnp.asarray(lens)

    def run_bare(r):
        t0 = time.perf_counter()
        toks = bare_loop(lm, params, ids, lens, jax.random.key(r), length=a.length)
        jax.block_until_ready(toks)
        dt = time.perf_counter() - t0
        return {"seconds": dt, "tokens": a.batch * a.length, "tokens_per_s": a.batch * a.length / dt}

    def run_sampler(r):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            meta = run_sampling(lm, params, Path(d) / "s", num_seqs=a.seqs, length=a.length,
                                shard_size=a.seqs, batch_size=a.batch, seed=r, prompt_ids=prompts,
                                progress=False, until_eos=True, chat_template=True, features=a.features)
            dt = time.perf_counter() - t0
            from hmm_distill.data import load_samples
            from hmm_distill.priors import first_eos_mask

            tok = load_samples(Path(d) / "s").tokens
            n = int(first_eos_mask(tok, lm.eos_token_id).sum())
        return {"seconds": dt, "tokens": n, "tokens_per_s": n / dt,
                "prefill_tokens": meta.get("prefill_tokens"), "decode_row_steps": meta.get("decode_row_steps")}

    print(f"model {model.name}, batch {a.batch}, length {a.length}, sampler {a.seqs} continuations "
          f"of {len(prompts)} prompts, features {a.features}; warm-up round (compiles)", flush=True)
    warm = {"bare": run_bare(0), "sampler": run_sampler(0)}
    rounds = []
    for r in range(1, a.rounds + 1):
        b, s = run_bare(r), run_sampler(r)
        rounds.append({"bare": b, "sampler": s, "ratio": s["tokens_per_s"] / b["tokens_per_s"]})
        print(f"round {r}: bare {b['tokens_per_s']:.1f} tok/s, sampler {s['tokens_per_s']:.1f} tok/s "
              f"({s['tokens']} tokens), ratio {rounds[-1]['ratio']:.3f}", flush=True)
    med = lambda k: float(np.median([x[k]["tokens_per_s"] for x in rounds]))  # noqa: E731
    res = {"model": model.name, "batch": a.batch, "length": a.length, "seqs": a.seqs, "features": a.features,
           "cpus": os.cpu_count(), "loadavg": list(os.getloadavg()), "jax": jax.__version__,
           "device": str(jax.devices()[0]), "warmup": warm, "rounds": rounds,
           "median_tokens_per_s": {"bare": med("bare"), "sampler": med("sampler")},
           "ratio_of_medians": med("sampler") / med("bare"),
           "median_paired_ratio": float(np.median([x["ratio"] for x in rounds])),
           "command": "python -m experiments.bench_distill_sampling " + " ".join(sys.argv[1:] if argv is None else argv)}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    lines = [f"# Distillation sampling vs a bare decode loop ({model.name})", "",
             f"Batch {a.batch}, length {a.length}; the sampler draws {a.seqs} continuations of the built-in "
             f"task prompts until EOS (continuous batching, features {a.features}); the bare loop runs "
             f"{a.length} steps of {a.batch} rows. Interleaved rounds after a compiling warm-up; tokens/s "
             f"= tokens generated / wall time. {os.cpu_count()} CPUs, load average at the end "
             f"{res['loadavg'][0]:.1f}. Command: `{res['command']}`.", "",
             "| round | bare tok/s | sampler tok/s | sampler / bare |", "|---|---|---|---|"]
    for i, x in enumerate(rounds, 1):
        lines.append(f"| {i} | {x['bare']['tokens_per_s']:.1f} | {x['sampler']['tokens_per_s']:.1f} | "
                     f"{x['ratio']:.3f} |")
    lines += ["", f"Ratio of medians: **{res['ratio_of_medians']:.3f}** (median of paired ratios "
              f"{res['median_paired_ratio']:.3f}).", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
