"""Benchmark of hmm_distill (issue #4).

1. EM throughput: tokens per second of one full Baum–Welch iteration (E-step over
   all sequences + M-step) of hmm_distill vs hmmlearn's ``CategoricalHMM`` (``fit``
   with ``n_iter=1``, both its ``log`` (default) and ``scaling`` implementations)
   on the same token stream (Zipf-distributed tokens, T=128), for V=49152 and
   V=4096, H ∈ {32, 64, 128, 256}, from the same initial parameters. hmmlearn runs
   on the first ``--hl-seqs`` sequences of the same data (it is slow; past a fixed
   per-``fit`` overhead its cost per token does not depend on the number of
   sequences), hmm_distill on ``--seqs`` sequences in E-step batches of ``--batch``.
   Compile time is excluded (reported separately). Both log-likelihoods of the
   shared sequences are recorded as a sanity check (``loglik_rel_diff``).
2. LM sampling throughput: the JAX LM (SmolLM2-135M from the default GGUF) through
   the sampler's jitted program, batch 64, from BOS.
3. Initialisation: random vs data-driven (bigram clustering) on a small distillation
   problem: continuations sampled from a random bigram toy LM (V=512, EOS-padded,
   T=64) through the real sampler, mini-batch EM with the real training job; held-out
   per-token log-likelihood per epoch, with the unigram baseline and the source LM's
   own log-likelihood as references.

Prints tables and writes ``experiments/results/bench_hmm.json`` and ``.md``.

    flock /tmp/jaxcd_bench.lock nice python experiments/bench_hmm.py   # ~5 min on 2 CPU cores
    python experiments/bench_hmm.py --quick                            # smoke run
    python experiments/bench_hmm.py --impls --skip init --hidden 256 1024 4096   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from hmm_distill import hmm as F  # noqa: E402
from hmm_distill.em import EM, pad_batch  # noqa: E402


def zipf_tokens(rng, n, T, V, a=1.1):
    ranks = np.arange(1, V + 1, dtype=np.float64)
    p = ranks ** -a
    p /= p.sum()
    perm = rng.permutation(V)
    return perm[rng.choice(V, size=(n, T), p=p)].astype(np.int32)


def time_ours(params, X, batch, repeats):
    engine = EM()
    p = F.to_token_major(params)
    batches = [pad_batch(X[s:s + batch], None, batch) for s in range(0, len(X), batch)]

    def iteration(p):
        total = None
        for t, m in batches:
            c, _ = engine.counts(p, t, m)
            total = c if total is None else F.add_counts(total, c)
        new = engine.m_step(total, p, 0.0)
        jax.block_until_ready(new)
        return new, total

    t0 = time.perf_counter()
    iteration(p)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, total = iteration(p)
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {"tokens": int(X.size), "seconds": best, "tokens_per_s": X.size / best,
            "compile_plus_first_s": compile_s, "all_s": times}


def time_hmmlearn(params, X, impl):
    import logging

    from hmmlearn.hmm import CategoricalHMM

    logging.getLogger("hmmlearn").setLevel(logging.ERROR)  # "degenerate solution" notices

    pi, A, B = (np.asarray(x, np.float64) for x in params)
    H, V = B.shape
    m = CategoricalHMM(n_components=H, n_features=V, n_iter=1, init_params="", params="ste",
                       implementation=impl, tol=-np.inf)
    m.startprob_, m.transmat_, m.emissionprob_ = pi / pi.sum(), A / A.sum(1, keepdims=True), \
        B / B.sum(1, keepdims=True)
    flat = X.reshape(-1, 1)
    lengths = [X.shape[1]] * X.shape[0]
    score = m.score(flat, lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        m.fit(flat, lengths)
        dt = time.perf_counter() - t0
    return {"tokens": int(X.size), "seconds": dt, "tokens_per_s": X.size / dt, "loglik": float(score)}


def bench_throughput(args, V):
    rng = np.random.default_rng(0)
    T = 128
    X = zipf_tokens(rng, args.seqs, T, V)
    rows = []
    print(f"\nEM throughput, one full-batch iteration (E+M), V={V}, T={T}; ours float32 on "
          f"{args.seqs} seqs, hmmlearn float64 on {args.hl_seqs} seqs", flush=True)
    for H in args.hidden:
        params = F.random_params(jax.random.key(H), H, V)
        ours = time_ours(params, X, args.batch, args.repeats)
        n_hl = args.hl_seqs if H <= 128 else max(args.hl_seqs // 2, 4)
        ll_ours = float(F.log_likelihood(params, X[:n_hl]).sum()) if args.impls else None
        row = {"H": H, "V": V, "T": T, "ours": ours, "ours_loglik_shared": ll_ours}
        for impl in args.impls:
            hl = time_hmmlearn(params, X[:n_hl], impl)
            hl["loglik_rel_diff"] = abs(hl["loglik"] - ll_ours) / abs(hl["loglik"])
            row[f"hmmlearn_{impl}"] = hl
            row[f"speedup_vs_{impl}"] = ours["tokens_per_s"] / hl["tokens_per_s"]
        rows.append(row)
        line = f"V={V} H={H:4d}  ours {ours['tokens_per_s']:>10,.0f} tok/s"
        for impl in args.impls:
            line += (f" | hmmlearn[{impl}] {row[f'hmmlearn_{impl}']['tokens_per_s']:>8,.0f} tok/s"
                     f" ({row[f'speedup_vs_{impl}']:.0f}x)")
        print(line, flush=True)
    return rows


def bench_lm_sampling(args):
    """Tokens/s of :func:`hmm_distill.sampler.sample_continuations` with the JAX LM
    (default GGUF, SmolLM2-135M, float32) at batch ``--lm-batch``, from BOS,
    ``--lm-length`` tokens per row (compile excluded: the second call is timed)."""
    from hmm_distill.lms import load_lm
    from hmm_distill.sampler import sample_continuations, sequence_keys

    loaded = load_lm("gguf")
    lm, params = loaded.lm, loaded.params
    B, T = args.lm_batch, args.lm_length
    ids = jnp.full((B, 1), lm.bos_token_id, jnp.int32)
    lens = jnp.ones((B,), jnp.int32)
    t0 = time.perf_counter()
    jax.block_until_ready(sample_continuations(lm, params, ids, lens, sequence_keys(0, np.arange(B)),
                                               length=T))
    first = time.perf_counter() - t0
    times = []
    for r in range(args.lm_repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(sample_continuations(
            lm, params, ids, lens, sequence_keys(r + 1, np.arange(B)), length=T))
        times.append(time.perf_counter() - t0)
    out = {"model": repr(lm), "batch": B, "length": T, "seconds": min(times),
           "tokens_per_s": B * T / min(times), "compile_plus_first_s": first, "all_s": times}
    print(f"\nLM sampling ({out['model']}): batch {B}, {T} tokens/row: "
          f"{out['tokens_per_s']:,.0f} tokens/s (compile+first call {first:.1f}s)", flush=True)
    return out


def _cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _task_sample_one(lm, params, prompts, seq, which, T, B, m):
    """One sampler of :func:`bench_task_sampling`: (timings and counters, tokens)."""
    from hmm_distill.sampler import sample_continuations_with_logprobs, sample_pool, sequence_keys
    from jaxcd.lm.interface import pad_prompts

    n = len(seq)
    l0, w0, c0 = os.getloadavg()[0], time.perf_counter(), _cpu_s()
    st = {}
    if m == "padded":  # consecutive batches, fully padded prompts
        mat, lens = pad_prompts(prompts, pad_id=0)
        got = []
        for s in range(0, n, B):
            bi = seq[s:s + B]
            t, _ = sample_continuations_with_logprobs(lm, params, jnp.asarray(mat[which[bi]]),
                                                      jnp.asarray(lens[which[bi]]), sequence_keys(0, bi),
                                                      length=T)
            got.append(np.asarray(t))
        got = np.concatenate(got)
    else:  # continuous batching (sequences ordered by prompt length, prompt)
        order = np.lexsort((seq, which, np.array([len(prompts[w]) for w in which])))
        got = np.full((n, T), -1, np.int32)

        def put(j, tk, _):
            got[order[j]] = tk

        st = sample_pool(lm, params, prompts, seq[order], which[order], 0, length=T, batch_size=B,
                         on_done=put, refill=m)
    return {"wall_s": time.perf_counter() - w0, "cpu_s": _cpu_s() - c0,
            "load_start": l0, "load_end": os.getloadavg()[0], **st}, got


def bench_task_sampling(args):
    """Sampling on the built-in task prompts, several samplers, each in a fresh process.

    The same sequences (sequence ``i`` continues prompt ``i mod K`` of every
    ``--task-stride``-th built-in chat prompt, key ``fold_in(key(0), i)``, until EOS with a
    cap of ``--task-length`` tokens) are drawn by (``--task-methods``)

    * ``padded`` (the first sampler): consecutive batches of ``--task-batch`` rows, every
      prompt left-padded to the longest prompt of the set, prefilled per row, each batch
      decoding until all its rows have ended;
    * ``copy`` (:func:`hmm_distill.sampler.sample_pool` with ``refill="copy"``): rows
      ordered by prompt, each distinct prompt prefilled once per group, finished rows
      refilled with the next sequence, each refill rebuilding the whole KV cache;
    * ``rows`` (``sample_pool``'s default): the same, each refill writing only the
      refilled rows of the cache in place.

    Each sampler runs in its own process (so each pays its own compilation: wall and
    CPU (user+sys) seconds include it; loading the model does not count); the load
    average is recorded. The generated tokens are compared with those of the first
    method (``same_tokens_rows``)."""
    from hmm_distill.lms import load_lm
    from hmm_distill.priors import first_eos_mask
    from hmm_distill.prompts import builtin_prompts_path
    from hmm_distill.sampler import read_prompts

    loaded = load_lm("gguf")
    lm, params = loaded.lm, loaded.params
    _, ids = read_prompts(builtin_prompts_path(), fmt="chat", tokenizer_loader=loaded.tokenizer_loader)
    prompts = ids[::args.task_stride]
    n, T, B = args.task_seqs, args.task_length, args.task_batch
    seq = np.arange(n)
    which = seq % len(prompts)
    eos = lm.eos_token_id
    if args.task_child is not None:
        r, got = _task_sample_one(lm, params, prompts, seq, which, T, B, args.task_child)
        print("RESULT " + json.dumps({**r, "tokens": got.tolist()}), flush=True)
        return None
    res = {"model": repr(lm), "num_prompts": len(prompts), "num_seqs": n, "cap": T, "batch": B,
           "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
           "prompt_tokens_max": max(len(p) for p in prompts), "methods": list(args.task_methods)}
    first = None
    for m in args.task_methods:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--skip", "throughput", "lm", "init",
               "--task-child", m, "--task-seqs", str(n), "--task-stride", str(args.task_stride),
               "--task-length", str(T), "--task-batch", str(B), "--out", os.devnull]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"task sampling child [{m}] failed:\n{proc.stderr[-3000:]}")
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        res[m] = json.loads(line[len("RESULT "):])
        got = np.asarray(res[m].pop("tokens"), np.int32)
        if first is None:
            first = got
            ntok = int(first_eos_mask(got, eos).sum())
            res["generated_tokens"] = ntok
            res["eos_fraction"] = float((got == eos).any(1).mean())
        res[m]["same_tokens_rows"] = int((first == got).all(1).sum())
        r = res[m]
        r["tokens_per_s"], r["tokens_per_cpu_s"] = ntok / r["wall_s"], ntok / r["cpu_s"]
        print(f"task sampling [{m}] ({n} continuations of {len(prompts)} prompts, cap {T}, batch {B}): "
              f"{r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} CPU s, {r['tokens_per_s']:.1f} tok/s; "
              f"identical rows {r['same_tokens_rows']}/{n}", flush=True)
    ms = args.task_methods
    if len(ms) > 1:
        res["speedup_cpu"] = res[ms[-2]]["cpu_s"] / res[ms[-1]]["cpu_s"]
        res["speedup_wall"] = res[ms[-2]]["wall_s"] / res[ms[-1]]["wall_s"]
    return res


def bench_init(args):
    from hmm_distill.lms import table_fingerprint, toy_bigram_lm
    from hmm_distill.sampler import run_sampling
    from hmm_distill.data import load_samples
    from hmm_distill.train import TrainConfig, split_heldout, train

    V, T = args.init_vocab, 64
    lm = toy_bigram_lm(V, seed=1)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "samples"
        t0 = time.perf_counter()
        meta = run_sampling(lm, lm.params, d, num_seqs=args.init_seqs, length=T, shard_size=1000,
                            batch_size=250, seed=0, model_name=f"toy:{V}:1",
                            fingerprint=table_fingerprint(V, lm.eos_token_id), progress=False)
        out["sampling"] = {"seconds": time.perf_counter() - t0, "tokens_per_s": meta["tokens_per_s"],
                           "unfinished": sum(s["num_unfinished"] for s in meta["shards"])}
        # the source LM's own held-out log-likelihood (padding after EOS is free for it)
        tokens = load_samples(d).tokens
        _, held = split_heldout(tokens, 0.1, 0)
        src = 0.0
        for row in held:
            eos = np.nonzero(row == lm.eos_token_id)[0]
            n = eos[0] + 1 if len(eos) else T
            src += lm.sequence_logprob(row[:n].tolist())
        out["source_lm_heldout_ll"] = src / held.size
        for init in ("random", "cluster"):
            cfg = TrainConfig(data=str(d), out=str(Path(tmp) / init), hidden_size=args.init_hidden,
                              epochs=args.init_epochs, batch_size=128, init=init, plot=False,
                              progress=False, seed=0)
            t0 = time.perf_counter()
            res = train(cfg, log=lambda *a: None)
            out[init] = {"seconds": time.perf_counter() - t0,
                         "heldout_ll": [m["heldout_ll"] for m in res.metrics],
                         "train_ll": [m["train_ll"] for m in res.metrics]}
            out["unigram_heldout_ll"] = res.metrics[-1]["unigram_heldout_ll"]
    print(f"\ninit comparison: toy bigram LM V={V}, {args.init_seqs} seqs x T={T}, "
          f"HMM H={args.init_hidden}, mini-batch EM")
    print(f"  references: unigram {out['unigram_heldout_ll']:.4f}, source LM "
          f"{out['source_lm_heldout_ll']:.4f} nats/token")
    print("  epoch  " + "  ".join(f"{e:>7d}" for e in range(args.init_epochs + 1)))
    for init in ("random", "cluster"):
        print(f"  {init:7s}" + "  ".join(f"{x:7.4f}" for x in out[init]["heldout_ll"])
              + f"   ({out[init]['seconds']:.0f}s)")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vocabs", type=int, nargs="+", default=[49152, 4096])
    ap.add_argument("--hidden", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--seqs", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hl-seqs", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--impls", nargs="*", default=["log", "scaling"],
                    help="hmmlearn implementations to compare with (none: skip hmmlearn)")
    ap.add_argument("--lm-batch", type=int, default=64)
    ap.add_argument("--lm-length", type=int, default=32)
    ap.add_argument("--lm-repeats", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], choices=["throughput", "lm", "init", "task"])
    ap.add_argument("--task-seqs", type=int, default=64)
    ap.add_argument("--task-stride", type=int, default=8, help="every k-th built-in prompt")
    ap.add_argument("--task-length", type=int, default=64)
    ap.add_argument("--task-batch", type=int, default=32)
    ap.add_argument("--task-methods", nargs="+", default=["copy", "rows"], choices=["padded", "copy", "rows"],
                    help="samplers to compare (the last two: before / after), each in a fresh process")
    ap.add_argument("--task-child", choices=["padded", "copy", "rows"], help=argparse.SUPPRESS)
    ap.add_argument("--init-vocab", type=int, default=512)
    ap.add_argument("--init-seqs", type=int, default=3000)
    ap.add_argument("--init-hidden", type=int, default=64)
    ap.add_argument("--init-epochs", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_hmm.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.hidden, args.seqs, args.batch, args.hl_seqs, args.repeats = [32, 64], 64, 64, 8, 1
        args.init_seqs, args.init_epochs, args.init_hidden = 400, 2, 16
        args.lm_length, args.lm_repeats = 8, 1
    hl_version = None
    if args.impls:
        import hmmlearn

        hl_version = hmmlearn.__version__
    dev = jax.devices()[0]
    print(f"hmm_distill benchmark on {dev.platform} ({getattr(dev, 'device_kind', '')}; "
          f"{os.cpu_count()} CPU cores visible), jax {jax.__version__}, hmmlearn {hl_version}")
    t0 = time.perf_counter()
    rows = [] if "throughput" in args.skip else [r for V in args.vocabs for r in bench_throughput(args, V)]
    lm = None if "lm" in args.skip else bench_lm_sampling(args)
    init = None if "init" in args.skip else bench_init(args)
    task = None if "task" in args.skip else bench_task_sampling(args)
    if args.task_child is not None:
        return
    result = {
        "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "device": f"{dev.platform}:{getattr(dev, 'device_kind', '')}", "jax": jax.__version__,
        "hmmlearn": hl_version, "args": vars(args), "throughput": rows, "lm_sampling": lm,
        "init_comparison": init, "task_sampling": task, "load_average": list(os.getloadavg()),
        "total_seconds": time.perf_counter() - t0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(to_markdown(result))
    print(f"\nwrote {out} and {out.with_suffix('.md')}")


def to_markdown(r: dict) -> str:
    a = r["args"]
    lines = [f"# hmm_distill benchmark", "",
             f"Device `{r['device']}`, {r['cpu_count']} CPU cores visible, jax {r['jax']}, "
             f"hmmlearn {r['hmmlearn']}. Generated by `experiments/bench_hmm.py` "
             f"(total {r['total_seconds']:.0f} s).", ""]
    if r["throughput"]:
        impls = a["impls"]
        lines += ["## EM throughput (tokens/s, one full-batch Baum–Welch iteration, E + M step)", "",
                  f"Zipf(1.1) tokens, T=128. Ours: float32, {a['seqs']} sequences in E-step batches "
                  f"of {a['batch']}, best of {a['repeats']} (compile excluded)."
                  + (f" hmmlearn `CategoricalHMM.fit(n_iter=1)`: float64, first {a['hl_seqs']} "
                     f"sequences (half that at H=256), same initial parameters; its log-likelihood "
                     f"of those sequences agrees with ours (max relative difference "
                     f"{max(row[f'hmmlearn_{i}']['loglik_rel_diff'] for row in r['throughput'] for i in impls):.1e})."
                     if impls else " (hmmlearn not run.)"), ""]
        head = "| V | H | ours tok/s |" + "".join(f" hmmlearn[{i}] tok/s | speed-up vs {i} |" for i in impls)
        lines += [head, "|" + "---|" * (3 + 2 * len(impls))]
        for row in r["throughput"]:
            line = f"| {row['V']} | {row['H']} | {row['ours']['tokens_per_s']:,.0f} |"
            for i in impls:
                line += (f" {row[f'hmmlearn_{i}']['tokens_per_s']:,.0f} |"
                         f" {row[f'speedup_vs_{i}']:.0f}x |")
            lines.append(line)
        lines.append("")
    if r.get("lm_sampling"):
        s = r["lm_sampling"]
        lines += ["## LM sampling throughput", "",
                  f"`{s['model']}`, `sample_continuations` (prefill + scanned steps, one jitted "
                  f"program), batch {s['batch']}, {s['length']} tokens per row from BOS: "
                  f"**{s['tokens_per_s']:,.0f} tokens/s** (compile + first call "
                  f"{s['compile_plus_first_s']:.1f} s, excluded).", ""]
    if r.get("task_sampling"):
        s = r["task_sampling"]
        ms = s.get("methods", ["padded_batches", "continuous"])
        names = {"padded": "padded batches", "padded_batches": "padded batches",
                 "copy": "continuous batching, whole-cache refill", "continuous": "continuous batching",
                 "rows": "continuous batching, row-local refill"}
        p, c = s[ms[0]], s[ms[-1]]
        lines += ["## Sampling on the task prompts (one run)", "",
                  f"`{s['model']}`; {s['num_seqs']} continuations of {s['num_prompts']} built-in chat "
                  f"prompts ({s['prompt_tokens_mean']:.0f} tokens on average, at most "
                  f"{s['prompt_tokens_max']}), until EOS with a cap of {s['cap']} tokens, batch "
                  f"{s['batch']}; {s['generated_tokens']} generated tokens (EOS fraction "
                  f"{s['eos_fraction']:.2f}). Each sampler in its own process, its compilation included. Load average during the run: "
                  f"{p['load_start']:.1f}–{c['load_end']:.1f} on {r['cpu_count']} cores, so the CPU time is "
                  f"the comparable number.", "",
                  "| sampler | wall s | CPU s (user+sys) | tokens/s | tokens per CPU s | rows identical to the first |",
                  "|---|---|---|---|---|---|"]
        for m in ms:
            x = s[m]
            lines.append(f"| {names.get(m, m)} | {x['wall_s']:.0f} | {x['cpu_s']:.0f} | {x['tokens_per_s']:.1f} | "
                         f"{x['tokens_per_cpu_s']:.1f} | {x.get('same_tokens_rows', s.get('same_tokens_rows'))}"
                         f"/{s['num_seqs']} |")
        lines.append("")
        if "speedup_cpu" in s:
            lines.append(f"Last vs the one before: {s['speedup_cpu']:.2f}x in CPU time, {s['speedup_wall']:.2f}x "
                         f"in wall time.")
        if "prefill_tokens" in c:
            lines.append(f"Continuous batching: {c['prefill_tokens']} prompt tokens prefilled, "
                         f"{c['decode_row_steps']} decode row-steps ({c['chunks']} chunks, {c['shifts']} cache "
                         f"moves" + (f", {c['refills']} rows refilled in {c['refill_calls']} refill calls"
                                     if "refills" in c else "") + ").")
        lines.append("")
    if r.get("init_comparison"):
        c = r["init_comparison"]
        n_ep = len(c["random"]["heldout_ll"])
        lines += ["## Initialisation: random vs data-driven (bigram clustering)", "",
                  f"Toy bigram LM V={a['init_vocab']}, {a['init_seqs']} sequences of T=64 through "
                  f"the sampler, HMM H={a['init_hidden']}, mini-batch EM (training job defaults). "
                  f"Held-out nats/token per epoch; references: unigram "
                  f"{c['unigram_heldout_ll']:.4f}, source LM {c['source_lm_heldout_ll']:.4f}.", "",
                  "| init | " + " | ".join(f"ep {e}" for e in range(n_ep)) + " | time |",
                  "|---|" + "---|" * (n_ep + 1)]
        for init in ("random", "cluster"):
            lines.append(f"| {init} | " + " | ".join(f"{x:.4f}" for x in c[init]["heldout_ll"])
                         + f" | {c[init]['seconds']:.1f} s |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
