"""Decode speed of the JAX (Flax NNX) Llama vs the transformers PyTorch model.

Both load the same GGUF (default: SmolLM2-135M-Instruct Q4_1; ``--models`` takes a
comma-separated list, e.g. ``default,qwen2.5-coder-0.5b,gemma-3-270m``, benchmarked one
after the other in the same run, the results files rewritten after each model),
de-quantised to float32, on this machine. Per model: the load time of each (GGUF ->
weights in memory), and for batch sizes 1 and 16, a ~32-token prompt and 64 new tokens
(greedy), we time

* ``torch (Nt)``: transformers' model, manual greedy loop ``model(tok, past_key_values=
  cache)`` (DynamicCache, ``torch.inference_mode``), i.e. what ``generate`` does minus
  its logits-processor overhead; with torch's default thread count and with 1 thread
  (on a small shared CPU OpenMP oversubscription can make the default much slower);
* ``jax-step``: a Python loop around the jitted, buffer-donating ``JaxLM`` decode step
  (+ ``jnp.argmax``), i.e. how a host-driven decoder calls the LM;
* ``jax-scan``: the whole greedy loop as one jitted program (prefill + ``lax.scan``),
  i.e. how a jitted decoder uses it; its decode time is (total - prefill);
* ``jax-step (xla dots)``: ``jax-step`` with ``JaxLM(matmul="xla")``, the layer scan
  copying each layer's weights into XLA's dots (what ran before the native layer
  kernel, :mod:`jaxcd.lm.kernels`; still what GPU/TPU and sharded weights run).

Decode ms/token = decode wall time / 63 steps (the first new token comes from the
prefill, which is timed separately). One warm-up run per implementation (compilation)
is excluded; then ``--repeats`` rounds, each running every implementation once
(interleaved, so background load hits all alike), reported as mean ± sd and min.
``agree`` = fraction of greedy tokens equal to torch's.

On this small shared CPU torch's default thread count can be pathologically slow
(OpenMP threads spin against other processes); an implementation whose warm-up decode
is more than ``--slow-factor`` times slower than the fastest one gets only one timed
timed run — its warm-up run (torch has nothing to compile) — marked in the table, so
the run stays short; its number is still measured.

Where JAX's time goes (batch 16, profiled with ``jax.profiler`` and
``XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true``): the weight matmuls (YNNPACK
fusions) dominate as in torch; the two attention products of a decode step, done as
``dot_general`` over ``B * n_kv`` tiny ``3 x 64 x S`` matrices, took ~20% of the step
on XLA:CPU, so :mod:`jaxcd.lm.llama` now computes them as fused multiply-reductions
(about 0.8x the step time at batch 16, unchanged at batch 1; also faster on the GPU).
XLA:CPU flags tried without a gain beyond noise: ``--xla_cpu_use_onednn``,
``--xla_cpu_experimental_{onednn,xnn,ynn}_fusion_type=dot``,
``--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY``.

``ms/token`` is per decode step of the whole batch (what a user waits per token);
``ms/token/seq`` divides it by the batch size (throughput view, as in the seed paper's
Table 2).

Usage::

    HF_HUB_OFFLINE=1 python experiments/bench_lm.py [--gguf PATH | --models A,B,C]
        [--repeats 5] [--new-tokens 64] [--no-scan] [--quick]

``prefill tok/s`` = batch x prompt tokens / prefill wall time (the first new token's
argmax included).

Writes ``experiments/results/bench_lm.json`` and ``bench_lm.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))
from machine import cpu_model  # noqa: E402


def make_prompts(batch: int, length: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Deterministic prompts: BOS then ``length - 1`` ordinary token ids."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(100, min(vocab, 40000), size=(batch, length)).astype(np.int32)
    ids[:, 0] = 1
    return ids


def torch_runner(model, ids: np.ndarray, new_tokens: int, threads: int):
    """One greedy run of transformers' model -> (prefill_s, decode_s, tokens [B, n])."""
    import torch
    from transformers import DynamicCache

    x = torch.from_numpy(ids.astype(np.int64))

    def run():
        torch.set_num_threads(threads)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model(input_ids=x, past_key_values=DynamicCache(), use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            t1 = time.perf_counter()
            toks = [tok]
            cache = out.past_key_values
            for _ in range(new_tokens - 1):
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                toks.append(tok)
            t2 = time.perf_counter()
        return t1 - t0, t2 - t1, torch.cat(toks, 1).numpy()

    return run


def jax_step_runner(lm, params, ids: np.ndarray, new_tokens: int):
    """Host loop over the jitted, state-donating decode step."""
    import jax
    import jax.numpy as jnp

    from jaxcd.lm.llama import step_donated

    lens = np.full((ids.shape[0],), ids.shape[1], np.int32)
    max_len = ids.shape[1] + new_tokens
    argmax = jax.jit(lambda lp: jnp.argmax(lp, -1).astype(jnp.int32))

    def run():
        t0 = time.perf_counter()
        state, lp = lm.prefill(params, ids, lens, max_len)
        tok = argmax(lp)
        tok.block_until_ready()
        t1 = time.perf_counter()
        toks = [tok]
        for _ in range(new_tokens - 1):
            state, lp = step_donated(lm, params, state, tok)
            tok = argmax(lp)
            toks.append(tok)
        tok.block_until_ready()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, np.stack([np.asarray(t) for t in toks], 1)

    return run


def jax_scan_runner(lm, params, ids: np.ndarray, new_tokens: int):
    """The whole greedy loop as one jitted program; prefill timed separately (same
    jitted prefill) and subtracted."""
    import jax.numpy as jnp

    lens = np.full((ids.shape[0],), ids.shape[1], np.int32)
    max_len = ids.shape[1] + new_tokens

    def run():
        t0 = time.perf_counter()
        _, lp = lm.prefill(params, ids, lens, max_len)
        jnp.argmax(lp, -1).block_until_ready()
        t1 = time.perf_counter()
        out = lm.generate_greedy_scan(params, ids, lens, new_tokens)
        out.block_until_ready()
        t2 = time.perf_counter()
        return t1 - t0, max((t2 - t1) - (t1 - t0), 0.0), np.asarray(out)

    return run


def fmt(xs, scale=1.0):
    m = statistics.mean(xs) * scale
    sd = (statistics.stdev(xs) if len(xs) > 1 else 0.0) * scale
    return m, sd


def bench_model(args, model_name, lm, params, hf, torch_threads):
    """Interleaved rounds of every implementation at each batch size -> rows."""
    rows = []
    for B in [int(b) for b in args.batches.split(",")]:
        ids = make_prompts(B, args.prompt_len, lm.vocab_size, seed=B)
        n = args.new_tokens
        runners = {
            f"torch ({torch_threads}t)": torch_runner(hf, ids, n, torch_threads),
            "torch (1t)": torch_runner(hf, ids, n, 1),
            "jax-step": jax_step_runner(lm, params, ids, n),
            "jax-scan": jax_scan_runner(lm, params, ids, n),
        }
        if lm.in_place_matmul():     # the copying layer scan (XLA's dots), for comparison
            from jaxcd.lm.llama import JaxLM

            lm_x = JaxLM(lm.config, dtype=lm.dtype, precision=lm.precision,
                         attn_block=lm.attn_block, matmul="xla")
            runners["jax-step (xla dots)"] = jax_step_runner(lm_x, params, ids, n)
        if torch_threads == 1:
            runners.pop("torch (1t)")
        if args.no_scan:
            runners.pop("jax-scan")
        results = {name: [] for name in runners}
        tokens = {}
        warm_dec = {}
        warm = {}
        for name, run in runners.items():  # warm-up: compilation, allocator, caches
            if name.startswith("jax"):
                run()                        # compile; the second call is the warm timing
            warm[name] = run()
            _, warm_dec[name], tokens[name] = warm[name]
        fastest = min(warm_dec.values())
        slow = {name for name, d in warm_dec.items() if d > args.slow_factor * fastest}
        if slow:
            print(f"batch {B}: {sorted(slow)} > {args.slow_factor}x slower than the fastest "
                  "in warm-up: its warm-up run is its one timed run", flush=True)
        for name in slow:
            results[name].append(warm[name][:2])
        for rep in range(args.repeats):    # interleaved, so load changes hit all alike
            names = list(runners)
            names = names[rep % len(names):] + names[:rep % len(names)]   # rotate the order
            for name in names:
                if name in slow:
                    continue
                run = runners[name]
                pre, dec, toks = run()
                results[name].append((pre, dec))
                tokens[name] = toks
        ref = tokens[f"torch ({torch_threads}t)"]
        for name in runners:
            pre = [r[0] for r in results[name]]
            dec = [r[1] for r in results[name]]
            dm, ds = fmt(dec, 1000.0 / (n - 1))
            pm, psd = fmt(pre, 1000.0)
            rows.append({"model": model_name, "impl": name, "batch": B, "prompt_len": args.prompt_len, "new_tokens": n,
                         "timed_runs": len(dec), "slow_timed_once": name in slow,
                         "decode_ms_per_token_mean": dm,
                         "decode_ms_per_token_per_seq": dm / B, "decode_ms_per_token_sd": ds,
                         "decode_ms_per_token_min": min(dec) * 1000.0 / (n - 1),
                         "decode_ms_per_token_runs": [x * 1000.0 / (n - 1) for x in dec],
                         "tokens_per_s_mean": B * 1000.0 / dm if dm > 0 else None,
                         "prefill_ms_mean": pm, "prefill_ms_sd": psd,
                         "prefill_tokens_per_s": B * args.prompt_len * 1000.0 / pm,
                         "greedy_token_agreement_with_torch": float((tokens[name] == ref).mean())})

    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="GGUF file or model name (qwen2.5-coder-0.5b, "
                    "gemma-3-270m; default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--models", default=None,
                    help="comma-separated models (names or GGUF paths; 'default' = SmolLM2), "
                    "each benchmarked in turn; overrides --gguf")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--no-scan", action="store_true",
                    help="skip the jax-scan implementation (whole greedy loop as one program)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--slow-factor", type=float, default=4.0,
                    help="implementations slower than this x the fastest (warm-up) get 1 repeat")
    ap.add_argument("--quick", action="store_true",
                    help="1 repeat, 16 new tokens (smoke test; numbers are not meaningful)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_lm"))
    ap.add_argument("--render", metavar="JSON", default=None,
                    help="only re-render the summary and the .md of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.render:
        src = Path(args.render)
        result = json.loads(src.read_text())
        result["summary"] = summarize(result["rows"])
        src.write_text(json.dumps(result, indent=2))
        src.with_suffix(".md").write_text(to_markdown(result))
        print(to_markdown(result))
        return
    if args.quick:
        args.repeats, args.new_tokens = 1, 16
    t_start = time.perf_counter()
    load_start = os.getloadavg()

    import jax
    import torch

    from jaxcd.lm.llama import JaxLM

    from jaxcd.lm.loading import load_lm
    from jaxcd.lm.torch_adapter import load_hf_model_from_gguf
    from jaxcd.model_files import resolve_gguf

    def write():
        """Results so far (rewritten after each model, so a stopped run keeps its models)."""
        summary = summarize(rows)

        meta = {"models": names, "dtype": "float32", "repeats": args.repeats, "quick": args.quick,
                "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                "jax": jax.__version__, "jax_backend": jax.default_backend(),
                "torch": torch.__version__, "torch_default_threads": torch_threads,
                "cpu_count": os.cpu_count(), "platform": platform.platform(),
                "processor": cpu_model(), "load_s": loads,
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "load_avg_start": load_start, "load_avg_end": os.getloadavg(),
                "wall_s": round(time.perf_counter() - t_start, 1),
                "command": "python experiments/bench_lm.py " + " ".join(sys.argv[1:] if argv is None else argv)}
        result = {"meta": meta, "rows": rows, "summary": summary}
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=2))
        md = to_markdown(result)
        out.with_suffix(".md").write_text(md)
        print()
        print(md)
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")

    models = [m.strip() for m in (args.models.split(",") if args.models else [args.gguf or ""])]
    rows, loads, names = [], {}, []
    torch_threads = torch.get_num_threads()
    for model_arg in models:
        path = resolve_gguf(None if model_arg in ("", "default") else model_arg)
        names.append(path.name)
        t = time.perf_counter()
        lm, params = load_lm(path, tokenizer=False)[:2]
        jax_load = time.perf_counter() - t
        t = time.perf_counter()
        hf = load_hf_model_from_gguf(path, torch.float32)
        torch_load = time.perf_counter() - t
        loads[path.name] = {"jax": jax_load, "torch": torch_load}
        print(f"model: {path.name}  ({lm!r})")
        print(f"load: jax {jax_load:.1f}s, torch {torch_load:.1f}s; jax {jax.__version__} "
              f"backend={jax.default_backend()}, torch {torch.__version__} "
              f"threads={torch_threads}, cpus={os.cpu_count()}", flush=True)
        rows += bench_model(args, path.name, lm, params, hf, torch_threads)
        del lm, hf
        write()



def summarize(rows):
    """Per model and batch size: the faster torch setting (lower MEDIAN decode time: one
    stalled run on a shared CPU should not pick the winner) and JAX's speed-up over it, as
    a ratio of medians and as the median of per-round paired ratios."""
    summary = {}
    for model in dict.fromkeys(r.get("model", "") for r in rows):
        per = summary.setdefault(model, {})
        for B in sorted({r["batch"] for r in rows if r.get("model", "") == model}):
            sub = {r["impl"]: r for r in rows if r["batch"] == B and r.get("model", "") == model}
            med = {k: float(np.median(r["decode_ms_per_token_runs"])) for k, r in sub.items()}
            best = min((k for k in sub if k.startswith("torch")), key=med.get)
            jx = [k for k in ("jax-step", "jax-scan", "jax-step (xla dots)") if k in sub]
            per[str(B)] = {
                "best_torch": best,
                "median_ms": med,
                **{f"speedup_{k}_vs_best_torch": med[best] / med[k] for k in jx},
                # paired per-round ratios (same round, so the same background load)
                **{f"paired_median_{k}": float(np.median(
                    [t / j for t, j in zip(sub[best]["decode_ms_per_token_runs"],
                                            sub[k]["decode_ms_per_token_runs"])]))
                   for k in jx}}
    return summary


def to_markdown(result):
    m = result["meta"]
    lines = ["# Decode speed: jaxcd (JAX, Flax NNX) vs transformers PyTorch, per model", "",
             f"Models de-quantised to {m['dtype']}, {m['cpu_count']} CPUs "
             f"({m.get('processor') or 'CPU model not recorded'}) "
             f"(shared with other processes: load average {m['load_avg_start'][0]:.1f} at the "
             f"start, {m['load_avg_end'][0]:.1f} at the end), jax {m['jax']} "
             f"({m['jax_backend']}), torch {m['torch']}. Greedy, prompt {m['prompt_len']} tokens, "
             f"{m['new_tokens']} new tokens; decode ms/token = decode wall time / "
             f"{m['new_tokens'] - 1} steps (per step of the whole batch); /seq = divided by "
             f"the batch size; prefill tok/s = batch x prompt tokens / prefill time. "
             f"{m['repeats']} interleaved rounds after a warm-up, mean ± sd "
             "(min, median). `agree` = greedy tokens equal to torch's. "
             f"Command: `{m.get('command', '')}`.", "",
             "Load time (s, GGUF -> float32 weights in memory):", "",
             "| model | jaxcd | torch |", "|---|---|---|"]
    for name, ld in m["load_s"].items():
        lines.append(f"| {name} | {ld['jax']:.1f} | {ld['torch']:.1f} |")
    lines += ["", "| model | batch | impl | decode ms/token | min | median | ms/token/seq | "
              "tokens/s | prefill ms | prefill tok/s | agree | runs |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(
            f"| {r.get('model', '')} | {r['batch']} | {r['impl']} | "
            f"{r['decode_ms_per_token_mean']:.2f} ± "
            f"{r['decode_ms_per_token_sd']:.2f} | {r['decode_ms_per_token_min']:.2f} | "
            f"{float(np.median(r['decode_ms_per_token_runs'])):.2f} | "
            f"{r['decode_ms_per_token_per_seq']:.2f} | {r['tokens_per_s_mean']:.1f} | "
            f"{r['prefill_ms_mean']:.1f} ± {r['prefill_ms_sd']:.1f} | "
            f"{r.get('prefill_tokens_per_s', float('nan')):.0f} | "
            f"{r['greedy_token_agreement_with_torch']:.3f} | {r['timed_runs']}"
            + (" (slow: warm-up run only)" if r["slow_timed_once"] else "") + " |")
    lines += ["", "Decode speed-up of jaxcd over the faster torch setting (ratio of medians; "
              "paired per-round median in brackets; >1 means jaxcd is faster; goal at "
              "batch 16: >= 1.5):", ""]
    for model, per in result["summary"].items():
        for B, s in per.items():
            parts = [f"{k} ×{s[f'speedup_{k}_vs_best_torch']:.2f} "
                     f"(paired ×{s[f'paired_median_{k}']:.2f})"
                     for k in ("jax-step", "jax-scan", "jax-step (xla dots)")
                     if f"speedup_{k}_vs_best_torch" in s]
            lines.append(f"- {model}, batch {B} (vs {s['best_torch']}): " + ", ".join(parts))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
