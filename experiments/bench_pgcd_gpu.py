"""P-GCD on a GPU at the paper's scale (issue 21): an LM with Llama-3.1-8B's shapes and
random bf16 weights built on the device (V = 128,256), random HMMs at H = 1k / 4k / 16k,
16 particles; unconstrained decoding, GCD, SMC-GCD and the SMC lookahead proposal, timed
per step actually run, interleaved in rounds.

No model file can be brought to the GPU machine, so two things stand in:

* the LM: :class:`jaxcd.lm.llama.JaxLM` with Llama-3.1-8B's config (32 layers, width
  4096, 32/8 heads, FFN 14,336, V = 128,256, untied head) and random weights
  (flax's initialisers) in bfloat16; what it emits is noise, but a step costs what the
  real model's step costs (the same shapes and the same program);
* the vocabulary: SmolLM2's 49,152 token strings, extended to 128,256 with tokens that
  are concatenations of two SmolLM2 word pieces (letters and digits, seeded): a vocabulary of Llama 3's size whose
  token lengths are longer, as Llama 3's are. The constraint, the workload's
  ``js_tool_call`` schema (compact JSON), is compiled against it here on the CPU
  (``build``) and carried to the GPU as a ``.npz`` (``run --automaton``).

Two steps::

    # here, on the CPU: the automaton over the 128,256-token vocabulary
    PYTHONPATH=. python experiments/bench_pgcd_gpu.py build --out .gpu/js_tool_call_v128k.npz.gz
    # on the GPU
    PYTHONPATH=. python experiments/bench_pgcd_gpu.py run --automaton .gpu/js_tool_call_v128k.npz.gz

``run --tiny`` runs the same program with a 2-layer, width-256 LM (a check on the CPU).

Timed per configuration (one jitted program each, compiled in an untimed warm-up call):
``none`` and ``gcd`` = :func:`jaxcd.decoding.decode.sample` on the prompt repeated 16
times; ``smc-gcd`` and ``lookahead H=…`` = the SMC program (``smc._run``, tables built
beforehand) with 16 particles of one prompt. ms/step = call time / steps the call ran
(the loops stop when every row has emitted EOS); the slowdown is each round's ratio to
``none`` in that round (mean ± sd over rounds). The β^P and GCD table builds are timed
separately, as is the per-step P-GCD scoring (``pgcd.batched_scores``, the XLA path: a
``[K·(1+D'), H] @ [H, V]`` matmul) in the states of largest out-degree, against the
``[K, H] @ [H, V]`` matmul that is its floor's unit.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from experiments.bench_pgcd import best_ms, step_rows  # noqa: E402

WORKLOAD = ROOT / "tests" / "data" / "workload"
RESULTS = ROOT / "experiments" / "results"
V_LLAMA3 = 128256
K = 16
PAPER = {1024: 3.11, 4096: 4.87, 16384: 10.2}
GOAL = {1024: 1.5, 4096: 2.0, 16384: 3.0}


def extended_vocab(V: int = V_LLAMA3, seed: int = 0):
    """SmolLM2's vocabulary extended to ``V`` tokens by concatenating pairs of its ordinary
    tokens (seeded, no duplicates); EOS stays SmolLM2's."""
    from jaxcd.generation import load_model
    from jaxcd.vocab import Vocabulary

    base = load_model().vocab
    toks = list(base.token_bytes)
    # word pieces only (letters/digits, an optional leading space): the added tokens are
    # longer words, as Llama 3's extra tokens mostly are, not fragments of JSON syntax
    word = re.compile(rb"^ ?[A-Za-z0-9]+$")
    ordinary = [t for t, s in zip(base.token_bytes, base.is_special) if not s and word.match(t)]
    seen = set(toks)
    rng = np.random.default_rng(seed)
    while len(toks) < V:
        a, b = rng.integers(0, len(ordinary), 2)
        t = ordinary[a] + ordinary[b].lstrip(b" ")
        if t not in seen:
            seen.add(t)
            toks.append(t)
    special = [i for i, s in enumerate(base.is_special) if s]
    return Vocabulary.from_token_bytes(toks, base.eos_id, special_ids=special,
                                       name=f"SmolLM2+pairs({V})")


def build(out: Path, V: int):
    from jaxcd import compile_json_schema

    t0 = time.perf_counter()
    vocab = extended_vocab(V)
    t1 = time.perf_counter()
    schema = (WORKLOAD / "json_schema" / "js_tool_call.json").read_text()
    fa = compile_json_schema(schema, vocab, whitespace_pattern="", cache=False)
    t2 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".gz":
        import gzip
        import shutil
        raw = out.with_suffix("")
        fa.save(raw)
        with open(raw, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    else:
        fa.save(out)
    print(f"vocabulary {vocab.vocab_size} tokens ({t1 - t0:.1f} s); js_tool_call: "
          f"{fa.num_states} states, {fa.num_edges} edges, out-degree "
          f"{int(np.shape(fa.out_dst)[1])}, min budget {fa.min_budget} ({t2 - t1:.1f} s); "
          f"{out} {out.stat().st_size / 2**20:.1f} MiB")


def llama31_8b_config(V: int, eos: int, tiny: bool = False):
    from jaxcd.lm.gguf_weights import LlamaConfig

    if tiny:
        return LlamaConfig(arch="llama", vocab_size=V, hidden_size=256, intermediate_size=512,
                           num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                           rope_theta=500000.0, rms_eps=1e-5, context_length=8192,
                           tie_embeddings=False, bos_token_id=1, eos_token_id=eos,
                           pad_token_id=0)
    return LlamaConfig(arch="llama", vocab_size=V, hidden_size=4096, intermediate_size=14336,
                       num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                       rope_theta=500000.0, rms_eps=1e-5, context_length=131072,
                       tie_embeddings=False, bos_token_id=1, eos_token_id=eos, pad_token_id=0)


def random_params(lm, seed: int = 0):
    """The LM's weights from flax's initialisers, built on the default device by one jitted
    call (never on the host)."""
    import jax
    from flax import nnx

    from jaxcd.lm.llama import LlamaModel

    @jax.jit
    def make():
        m = LlamaModel(lm.config, dtype=lm.dtype, precision=lm._jax_precision(),
                       rngs=nnx.Rngs(seed))
        return nnx.split(m)[1]

    return make()


def random_hmm(H: int, V: int, seed: int):
    """Random rows (normalised exponentials: Dirichlet(1)), drawn on the device in
    float32."""
    import jax
    import jax.numpy as jnp

    from jaxcd.hmm import HMMParams

    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)

    @jax.jit
    def make():
        pi = jax.random.dirichlet(k1, jnp.ones((H,), jnp.float32))
        A = jax.random.dirichlet(k2, jnp.ones((H,), jnp.float32), (H,))
        g = jax.random.exponential(k3, (H, V), jnp.float32)
        B = g / jnp.sum(g, axis=1, keepdims=True)
        return pi, A, B

    return HMMParams(*make())


#: the H200's memory: P-GCD tables up to 120 GiB (pgcd.backward's default limit is 8 GiB)
MAX_BYTES = 120 * 2**30


def run(args):
    import jax
    import jax.numpy as jnp

    from jaxcd.decoding import gcd, pgcd, smc
    from jaxcd.automata.tensorized import TensorizedAutomaton
    from jaxcd.decoding.decode import sample, tables_for
    from jaxcd.lm.interface import pad_prompts
    from jaxcd.lm.llama import JaxLM

    t_start = time.perf_counter()
    dev = jax.devices()[0]
    path = Path(args.automaton)
    if not path.is_file():
        sys.exit(f"bench_pgcd_gpu: no automaton at {path}: build it first on a CPU "
                 f"(`python experiments/bench_pgcd_gpu.py build --out {path}`) and carry it")
    if path.suffix == ".gz":                 # carried compressed (the device's 64 MiB limit)
        import gzip
        import shutil
        import tempfile
        tmp = Path(tempfile.mkdtemp()) / path.stem
        with gzip.open(path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        path = tmp
    fa = TensorizedAutomaton.load(path)
    fa_d = fa.to_device()
    V, D = int(fa.vocab_size), int(np.shape(fa.out_dst)[1])
    budget = fa.min_budget + args.margin
    cfg = llama31_8b_config(V, fa.eos_id, tiny=args.tiny)
    lm = JaxLM(cfg, dtype=jnp.bfloat16, precision=None, attn_block=128, matmul="xla")
    t0 = time.perf_counter()
    params = jax.block_until_ready(random_params(lm))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    params_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    prompt = [1] + [int(x) for x in rng.integers(100, 40000, args.prompt_len - 1)]
    ids16, lens16 = (jnp.asarray(a) for a in pad_prompts([prompt] * K, pad_id=0))
    ids1, lens1 = (jnp.asarray(a) for a in pad_prompts([prompt], pad_id=0))
    head = (f"{lm!r} ({n_params / 1e9:.2f}B parameters, random, built in {params_s:.1f} s) on "
            f"{dev.device_kind} ({jax.default_backend()}); js_tool_call over {V} tokens: "
            f"{fa.num_states} states, {fa.num_edges} edges, D={D}, budget {budget}; prompt "
            f"{len(prompt)} tokens; K={K}")
    print(head, flush=True)

    # --- tables ---------------------------------------------------------------------------
    dt = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}[args.table_dtype]
    gtables = tables_for(fa_d, "gcd", budget)
    hmms, ptables, tables_s = {}, {}, {}
    for H in args.hidden:
        hmms[H] = random_hmm(H, V, seed=H)
        jax.block_until_ready(pgcd.backward(fa, hmms[H], budget, table_dtype=dt,
                                            max_bytes=MAX_BYTES))  # compile
        t0 = time.perf_counter()
        ptables[H] = jax.block_until_ready(pgcd.backward(fa, hmms[H], budget, table_dtype=dt,
                                                         max_bytes=MAX_BYTES))
        tables_s[H] = round(time.perf_counter() - t0, 3)
        if dt != jnp.float32:      # the HMM update reads B too: keep one copy, in dt
            hmms[H] = hmms[H]._replace(B=hmms[H].B.astype(dt))
        print(f"  β^P H={H}: {tables_s[H]} s warm", flush=True)

    # --- scoring alone (XLA path) against its floor unit -------------------------------------
    deg = np.diff(np.asarray(fa.out_start))
    states = np.argsort(-deg, kind="stable")[:K]
    comps = {}
    for H in args.hidden:
        tab = ptables[H]
        u = jax.random.dirichlet(jax.random.key(1), jnp.ones((H,), jnp.float32), (K,))
        sts = pgcd.PGCDState(gcd.ConstraintState(jnp.asarray(states, jnp.int32),
                                                 jnp.full((K,), 5, jnp.int32)), u)
        f_sc = jax.jit(lambda fa, t, s: pgcd.batched_scores(fa, t, s, path="xla"))
        Bt = tab.Bt
        f_mm = jax.jit(lambda a, b: jax.lax.dot_general(
            a.astype(b.dtype), b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32))
        live = [int(x) for x in np.asarray(jax.vmap(pgcd.live_degree, in_axes=(None, None, 0))(
            fa_d, tab, sts))]
        c = {"out_degree": [int(x) for x in deg[states]], "live_degree": live,
             "scores_xla_ms": best_ms(lambda: f_sc(fa_d, tab, sts), 5),
             "KxH_HxV_ms": best_ms(lambda: f_mm(u, Bt), 5)}
        c["floor_ms"] = 2 * c["KxH_HxV_ms"]
        c["scores_over_floor"] = c["scores_xla_ms"] / c["floor_ms"]
        comps[H] = c
        print(f"  scoring H={H}: {c}", flush=True)
    partial = Path(args.out).with_suffix(".partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text(json.dumps({"head": head, "tables_s": tables_s, "components": comps},
                                  indent=1, default=float))

    # --- programs ---------------------------------------------------------------------------
    def smc_call(key, proposal, H=None):
        kw = dict(key=key, lm=lm, params=params, prompt_ids=ids1, prompt_lengths=lens1,
                  fa=fa_d, gtables=gtables, ptables=None, hpi=None, hA=None, hB=None,
                  temperature=jnp.asarray(1.0, jnp.float32), budget=budget, K=K,
                  proposal=proposal, resample="systematic", limit=jnp.asarray(budget, jnp.int32),
                  pre=None, ess_threshold=jnp.asarray(0.5, jnp.float32))
        if "defensive" in inspect.signature(smc._run).parameters:   # smc.run's default
            kw["defensive"] = jnp.asarray(smc.DEFENSIVE, jnp.float32)
        if H is not None:
            h = hmms[H]
            kw.update(ptables=ptables[H], hpi=h.pi, hA=h.A, hB=h.B)
        return smc._run(**kw)

    def dec_call(key, method):
        c = method != "none"
        return sample(key, lm, params, ids16, lens16, fa_d if c else None,
                      gtables if c else None, max_steps=budget, constrained=c, temperature=1.0)

    prefill = jax.jit(lambda p, i, l: lm.prefill(p, i, l, i.shape[1] + budget)[1])
    configs = {"none": lambda k: dec_call(k, "none"), "gcd": lambda k: dec_call(k, "gcd"),
               "smc-gcd": lambda k: smc_call(k, "gcd"),
               "prefill16": lambda k: prefill(params, ids16, lens16),
               "prefill1": lambda k: prefill(params, ids1, lens1)}
    for H in args.hidden:
        configs[f"lookahead H={H}"] = lambda k, H=H: smc_call(k, "lookahead", H=H)
    names = list(configs)
    compile_s = {}
    for m in names:
        t0 = time.perf_counter()
        jax.block_until_ready(configs[m](jax.random.key(0)))
        compile_s[m] = round(time.perf_counter() - t0, 2)
        print(f"  warm-up {m}: {compile_s[m]} s", flush=True)

    times = {m: [] for m in names}
    steps = {m: [] for m in names}
    from jaxcd.decoding import compile_stats
    c0 = compile_stats.snapshot()       # a compile in the timed rounds would be a bug
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for m in order:
            t0 = time.perf_counter()
            out = jax.block_until_ready(configs[m](jax.random.key(100 + r)))
            times[m].append(time.perf_counter() - t0)
            steps[m].append(int(out.steps) if hasattr(out, "steps") else 1)
        print(f"round {r}: " + ", ".join(
            f"{m} {1e3 * times[m][-1] / steps[m][-1]:.2f}" for m in names) + " ms/step",
            flush=True)
        partial.write_text(json.dumps({"head": head, "tables_s": tables_s, "components": comps,
                                       "compile_s": compile_s, "raw_s": times,
                                       "raw_steps": steps}, indent=1, default=float))

    timed_compiles = (compile_stats.snapshot() - c0).as_dict()
    print(f"compiles during the timed rounds: {timed_compiles}", flush=True)
    rows = step_rows(times, steps)
    for m, r in rows.items():
        r["steps"] = steps[m]
    res = {"command": "python experiments/bench_pgcd_gpu.py " + " ".join(sys.argv[1:]),
           "head": head, "device": dev.device_kind, "backend": jax.default_backend(),
           "jax": jax.__version__, "python": platform.python_version(),
           "lm": repr(lm), "params": n_params, "tiny": args.tiny, "V": V, "D": D,
           "states": int(fa.num_states), "edges": int(fa.num_edges), "budget": budget,
           "K": K, "hidden": args.hidden, "table_dtype": args.table_dtype,
           "tables_s": {str(k): v for k, v in tables_s.items()},
           "components": {str(k): v for k, v in comps.items()}, "compile_s": compile_s,
           "timed_compiles": timed_compiles,
           "rows": rows, "raw_s": times, "raw_steps": steps, "rounds": args.rounds,
           "wall_s": round(time.perf_counter() - t_start, 1)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=float))
    md = to_markdown(res)
    out.with_suffix(".md").write_text(md)
    print(md)


def to_markdown(res):
    f = lambda ms: f"{ms[0]:.2f} ± {ms[1]:.2f}"  # noqa: E731
    g = lambda ms: f"{ms[0]:.3f}× ± {ms[1]:.3f}"  # noqa: E731
    lines = ["# P-GCD on a GPU: Llama-3.1-8B shapes, random bf16 weights (issue 21)", "",
             res["head"] + ".", "", f"Command: `{res['command']}`; jax {res['jax']}; "
             f"wall {res['wall_s']} s; {res['rounds']} rounds, configurations interleaved; "
             f"β^P tables and B in {res['table_dtype']} (f32 accumulation).", "",
             "| method | ms/step | slowdown | decode ms/step | decode slowdown | goal | paper |",
             "|---|---|---|---|---|---|---|"]
    for m, r in res["rows"].items():
        H = int(m.split("=")[1]) if m.startswith("lookahead") else None
        goal = f"≤ {GOAL[H]}×" if H in GOAL else ""
        paper = f"{PAPER[H]}×" if H in PAPER else ""
        lines.append(f"| {m} | {f(r['ms_per_step'])} | {g(r['slowdown'])} | "
                     f"{f(r['decode_ms_per_step'])} | {g(r['decode_slowdown'])} | {goal} | "
                     f"{paper} |")
    lines += ["", "ms/step = call time / steps the call ran (prefill included); decode = the "
              "prefill of the same call shape (batch 16 for `none`/`gcd`, 1 for SMC) "
              "subtracted. Slowdown = ratio to `none` within each round.", "",
              "## Scoring alone (XLA path), 16 particles in the states of largest out-degree",
              "", "| H | β^P build s | out-degree | live degree | scores ms | [K,H]@[H,V] ms | "
              "scores / (2 × that) |", "|---|---|---|---|---|---|---|"]
    for H, c in res["components"].items():
        lines.append(f"| {H} | {res['tables_s'][H]} | {max(c['out_degree'])} | "
                     f"{max(c['live_degree'])} | {c['scores_xla_ms']:.3f} | "
                     f"{c['KxH_HxV_ms']:.3f} | {c['scores_over_floor']:.2f}× |")
    lines += ["", f"Warm-up (compile + one call) s: {res['compile_s']}"]
    if "timed_compiles" in res:
        lines += ["", f"Compiles during the timed rounds (must be 0): {res['timed_compiles']}"]
    lines += [""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the automaton over the extended vocabulary")
    b.add_argument("--out", default=".gpu/js_tool_call_v128k.npz.gz")
    b.add_argument("--vocab-size", type=int, default=V_LLAMA3)
    r = sub.add_parser("run", help="the timed run (on the GPU)")
    r.add_argument("--automaton", default=".gpu/js_tool_call_v128k.npz.gz")
    r.add_argument("--hidden", type=int, nargs="+", default=[1024, 4096, 16384])
    r.add_argument("--margin", type=int, default=16, help="budget = min budget + margin")
    r.add_argument("--prompt-len", type=int, default=64)
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--table-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    r.add_argument("--tiny", action="store_true", help="a 2-layer width-256 LM (CPU check)")
    r.add_argument("--out", default=str(RESULTS / "bench_pgcd_gpu"))
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build(Path(args.out), args.vocab_size)
    else:
        run(args)


if __name__ == "__main__":
    main()
