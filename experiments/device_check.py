"""One prepared accelerator check (issues 41 and 39): the decode step against its
weight-read floor, P-GCD scoring through Pallas vs XLA, none / GCD / SMC-GCD /
SMC-lookahead at H = 1k / 4k / 16k, for 1B- and 8B-shaped Llama models, and EM
throughput at H = 1k / 4k, in ONE call.

Nothing large is carried to the device: the models are Llama-3.2-1B- and
Llama-3.1-8B-shaped (V = 128,256) with random bfloat16 weights (flax's initialisers)
built on the device in the per-layer layout (:func:`jaxcd.lm.unrolled.
random_unrolled_params`); the HMMs are random (Dirichlet rows); the constraint is the
workload's ``js_tool_call`` schema compiled over a 128,256-token vocabulary here, on the
CPU (``experiments/bench_pgcd_gpu.py build``, 28 MiB gzipped), passed as
``--automaton``.

Parts, in order, results written after each (``OUT.json`` and ``OUT.md``; ``OUT`` =
``--out``):

1. **decode step vs floor** (per model, batch ``--batch``): ms per step over ``--loop``
   consecutive donated steps (the cache updated in place), for the stacked ``scan``
   parameters and the per-layer (``unrolled``) ones, next to the floor, one jitted pass
   reading every weight once (``Σ w`` in float32); plus XLA's cost analysis of the same
   compiled step on the device (bytes accessed / (weights + KV cache),
   :func:`jaxcd.lm.step_traffic.step_traffic`). Goal: unrolled ≤ 1.3× the floor at 8B.
2. **P-GCD scoring** (per H, 16 particles in the states of largest out-degree):
   ``batched_scores`` through the Pallas kernel and the XLA path, timed, and compared
   (same support, max |Δ log ψ|). If the Pallas kernel fails to compile here or
   disagrees, the error is recorded and the SMC programs run with the XLA path (the
   tables' ``pallas`` flag cleared).
3. **decoding** (per model, unrolled parameters): ``none`` and ``gcd``
   (:func:`jaxcd.decoding.decode.sample`, the prompt repeated ``--batch`` times),
   ``smc-gcd`` and ``lookahead H=…`` (the SMC program, 16 particles of one prompt, the
   defensive mixture at its default λ), interleaved over ``--rounds`` rounds; ms/step =
   call time / steps the call ran; slowdown = ratio to ``none`` in the same round.
   Goals: lookahead ≤ 1.05× / 1.1× / 1.3× at H = 1k / 4k / 16k.

4. **EM throughput** (issue 39): one full EM iteration (E-step over every sequence +
   M-step) of :mod:`hmm_distill` on Zipf-distributed tokens, ``T = 128``, at
   ``H = 1024, V = 50,257`` (pyjuice's published anchor: forward + backward at about
   87k tokens/s on an RTX 4090) and at ``H = 4096, V = 128,256`` (a Llama-3 vocabulary);
   tokens per second of the best of three timed iterations, compile excluded.

``--time-limit-s`` (default 420): work not yet started when this much wall time has
passed is skipped and listed in the results (the partial results stay). ``--parts``
runs a subset; ``--layers scan`` runs part 3 with the stacked parameters (one block
compiled per program instead of ``L``: shorter compiles, a slower step).

Usage::

    # here: the automaton (once)
    python experiments/bench_pgcd_gpu.py build --out .gpu/js_tool_call_v128k.npz.gz
    # on the device (carry .gpu)
    PYTHONPATH=. python experiments/device_check.py \
        --automaton .gpu/js_tool_call_v128k.npz.gz --out $OUT/device_check
    # on the CPU: the same program at tiny shapes (tests/test_device_check.py)
    python experiments/device_check.py --smoke --out /tmp/device_check
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.bench_pgcd import best_ms  # noqa: E402  median ms after one warm-up call

RESULTS = ROOT / "experiments" / "results"
GOAL_STEP = 1.3
GOAL_LOOKAHEAD = {1024: 1.05, 4096: 1.1, 16384: 1.3}
PAPER = {1024: 3.11, 4096: 4.87, 16384: 10.2}
#: pyjuice's forward + backward at H = 1024, V = 50,257, T = 128 on an RTX 4090 (issue 39)
PYJUICE = {"H": 1024, "V": 50257, "T": 128, "tokens_per_s": 87_000, "device": "RTX 4090"}
EM_SHAPES = ((1024, 50257), (4096, 128256))
K = 16


def model_config(name: str, V: int, eos: int):
    """``"8b"``: Llama-3.1-8B's shapes (untied head); ``"1b"``: Llama-3.2-1B's (tied);
    ``"tiny"``: 2 layers of width 64 (the smoke run)."""
    from jaxcd.lm.gguf_weights import LlamaConfig

    common = dict(arch="llama", vocab_size=V, rope_theta=500000.0, rms_eps=1e-5,
                  bos_token_id=1, eos_token_id=eos, pad_token_id=0)
    if name == "8b":
        return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_layers=32,
                           num_heads=32, num_kv_heads=8, head_dim=128, context_length=131072,
                           tie_embeddings=False, **common)
    if name == "1b":
        return LlamaConfig(hidden_size=2048, intermediate_size=8192, num_layers=16,
                           num_heads=32, num_kv_heads=8, head_dim=64, context_length=131072,
                           tie_embeddings=True, **common)
    if name == "tiny":
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=16, context_length=4096,
                           tie_embeddings=False, **common)
    raise ValueError(f"unknown model {name!r}")


def smoke_automaton():
    """A small JSON-like constraint over a ~100-token vocabulary (the smoke run)."""
    from jaxcd import Vocabulary, compile_regex

    chars = [bytes([c]) for c in b'{}":, abcdefghijklmnopqrstuvwxyz0123456789']
    pairs = [b'{"', b'":', b'",', b' "', b'"}', b'na', b'me', b'ag', b'e"']
    vocab = Vocabulary.from_token_bytes([b"<eos>"] + chars + pairs + [b"<pad>"] * 8, eos_id=0)
    return compile_regex(r'\{"name": "[a-z]{1,6}", "age": [0-9]{1,2}\}', vocab)


def load_automaton(path: str):
    from jaxcd.automata.tensorized import TensorizedAutomaton

    p = Path(path)
    if not p.is_file():
        sys.exit(f"device_check: no automaton at {p}: build it on a CPU with "
                 f"`python experiments/bench_pgcd_gpu.py build --out {p}` and carry it")
    if p.suffix == ".gz":
        import gzip
        import shutil
        import tempfile
        tmp = Path(tempfile.mkdtemp()) / p.stem
        with gzip.open(p, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        p = tmp
    return TensorizedAutomaton.load(p)


def random_hmm(H: int, V: int, seed: int):
    """Dirichlet(1) rows drawn on the device in float32."""
    import jax
    import jax.numpy as jnp

    from jaxcd.hmm import HMMParams

    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return HMMParams(jax.random.dirichlet(k1, jnp.ones((H,), jnp.float32)),
                     jax.random.dirichlet(k2, jnp.ones((H,), jnp.float32), (H,)),
                     jax.random.dirichlet(k3, jnp.ones((V,), jnp.float32), (H,)))


class Budget:
    """Wall-clock guard: :meth:`ok` is False once ``limit_s`` have passed; skipped work
    is listed."""

    def __init__(self, limit_s: float):
        self.t0, self.limit_s, self.skipped = time.perf_counter(), limit_s, []

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def ok(self, what: str) -> bool:
        if self.elapsed() < self.limit_s:
            return True
        self.skipped.append(what)
        print(f"  skipped (time limit): {what}", flush=True)
        return False


# ----------------------------------------------------------------------------- part 1
def decode_floor(lm, up, batch: int, prompt_len: int, loop: int, repeats: int) -> dict:
    """Part 1 for one model: the floor; for the per-layer (``unrolled``) and the stacked
    (``scan``) parameters, the donated step compiled once (XLA's cost analysis of it) and
    timed over ``loop`` consecutive steps (host loop, the cache updated in place; the
    median of ``repeats`` loops)."""
    import jax
    import jax.numpy as jnp

    from jaxcd.lm.interface import pad_prompts
    from jaxcd.lm.step_traffic import step_traffic, tree_bytes
    from jaxcd.lm.unrolled import stack_params

    rng = np.random.default_rng(0)
    prompt = [1] + [int(x) for x in rng.integers(min(100, lm.vocab_size // 2),
                                                 lm.vocab_size - 1, prompt_len - 1)]
    ids, lens = (jnp.asarray(a) for a in pad_prompts([prompt] * batch, pad_id=0))
    max_len = prompt_len + loop + 1
    out = {"weights_GB": tree_bytes(up) / 1e9, "batch": batch, "prompt_len": prompt_len,
           "loop_steps": loop}
    floor = jax.jit(lambda p: sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(p)))
    out["floor_ms"] = best_ms(lambda: floor(up), repeats)
    out["read_GBps"] = out["weights_GB"] / (out["floor_ms"] / 1e3)

    tok = jnp.full((batch,), 7, jnp.int32)
    state, _ = lm.prefill(up, ids, lens, max_len)
    out["kv_cache_GB"] = tree_bytes((state["k"], state["v"])) / 1e9
    copy = jax.jit(lambda s: jax.tree.map(jnp.copy, s))
    stacked = stack_params(up)
    lps = {}
    for name, params in (("unrolled", up), ("scan", stacked)):
        # one compile per form serves the cost analysis and the timing: the donated step
        t0 = time.perf_counter()
        r = step_traffic(lm, params, state, tok)
        out[f"{name}_compile_s"] = round(time.perf_counter() - t0, 2)
        step = r.pop("compiled")
        out[f"{name}_cost_analysis"] = {k: r[k] for k in (
            "bytes_accessed", "floor", "ratio", "moves", "weight_sized_moves")}
        lps[name] = np.asarray(step(params, copy(state), tok)[1], np.float32)

        def run_loop(step=step, params=params):
            s = copy(state)
            jax.block_until_ready(s)
            t0 = time.perf_counter()
            for _ in range(loop):
                s, lp = step(params, s, tok)      # the state is donated: updated in place
            jax.block_until_ready(lp)
            return time.perf_counter() - t0

        run_loop()
        out[f"{name}_ms"] = 1e3 * float(np.median([run_loop() for _ in range(repeats)])) / loop
    a, b = lps["scan"], lps["unrolled"]
    f = np.isfinite(a) & np.isfinite(b)
    out["unrolled_vs_scan_max_abs_logprob"] = (float(np.max(np.abs(a[f] - b[f]))) if f.any()
                                               else None)
    del stacked
    out["unrolled_over_floor"] = out["unrolled_ms"] / out["floor_ms"]
    out["scan_over_floor"] = out["scan_ms"] / out["floor_ms"]
    out["cost_analysis"] = out["unrolled_cost_analysis"]
    return out


# ----------------------------------------------------------------------------- part 2
def scoring(fa, fa_d, tab, H: int, repeats: int) -> dict:
    """Part 2 for one H: Pallas vs XLA scoring, 16 particles in the states of largest
    out-degree (a random forward vector each)."""
    import jax
    import jax.numpy as jnp

    from jaxcd.decoding import gcd, pgcd

    deg = np.diff(np.asarray(fa.out_start))
    states = np.argsort(-deg, kind="stable")[:K]
    states = np.resize(states, K)
    u = jax.random.dirichlet(jax.random.key(1), jnp.ones((H,), jnp.float32), (K,))
    sts = pgcd.PGCDState(gcd.ConstraintState(jnp.asarray(states, jnp.int32),
                                             jnp.full((K,), 1, jnp.int32)), u)
    f = {p: jax.jit(lambda fa, t, s, p=p: pgcd.batched_scores(fa, t, s, path=p))
         for p in ("xla", "pallas")}
    out = {"out_degree": int(deg[states].max()),
           "live_degree": int(np.max(np.asarray(jax.vmap(
               pgcd.live_degree, in_axes=(None, None, 0))(fa_d, tab, sts))))}
    out["xla_ms"] = best_ms(lambda: f["xla"](fa_d, tab, sts), repeats)
    try:
        out["pallas_ms"] = best_ms(lambda: f["pallas"](fa_d, tab, sts), repeats)
    except Exception as e:          # noqa: BLE001 - recorded; the caller falls back to XLA
        out["pallas_error"] = "".join(traceback.format_exception_only(type(e), e))[-2000:]
        return out
    a = np.asarray(f["xla"](fa_d, tab, sts)[0])
    b = np.asarray(f["pallas"](fa_d, tab, sts)[0])
    fin = np.isfinite(a) & np.isfinite(b)
    out["same_support"] = bool(np.array_equal(np.isfinite(a), np.isfinite(b)))
    out["max_abs_logpsi"] = float(np.max(np.abs(a[fin] - b[fin]))) if fin.any() else 0.0
    out["pallas_over_xla"] = out["pallas_ms"] / out["xla_ms"]
    return out


# ----------------------------------------------------------------------------- part 3
def decoding(lm, up, fa_d, gtables, ptables, hmms, budget: int, batch: int, prompt_len: int,
             rounds: int, guard: Budget, tag: str) -> dict:
    """Part 3 for one model: the interleaved configurations."""
    import inspect

    import jax
    import jax.numpy as jnp

    from jaxcd.decoding import smc
    from jaxcd.decoding.decode import sample
    from jaxcd.lm.interface import pad_prompts

    rng = np.random.default_rng(0)
    prompt = [1] + [int(x) for x in rng.integers(min(100, lm.vocab_size // 2),
                                                 lm.vocab_size - 1, prompt_len - 1)]
    idsB, lensB = (jnp.asarray(a) for a in pad_prompts([prompt] * batch, pad_id=0))
    ids1, lens1 = (jnp.asarray(a) for a in pad_prompts([prompt], pad_id=0))
    sig = inspect.signature(smc._run).parameters

    def smc_call(key, proposal, H=None):
        kw = dict(key=key, lm=lm, params=up, prompt_ids=ids1, prompt_lengths=lens1, fa=fa_d,
                  gtables=gtables, ptables=None, hpi=None, hA=None, hB=None,
                  temperature=jnp.asarray(1.0, jnp.float32), budget=budget, K=K,
                  proposal=proposal, resample="systematic",
                  limit=jnp.asarray(budget, jnp.int32), pre=None,
                  ess_threshold=jnp.asarray(0.5, jnp.float32))
        if "defensive" in sig:
            kw["defensive"] = jnp.asarray(smc.DEFENSIVE, jnp.float32)
        if "psi_power" in sig:
            kw["psi_power"] = jnp.asarray(1.0, jnp.float32)
        if H is not None:
            h = hmms[H]
            kw.update(ptables=ptables[H], hpi=h.pi, hA=h.A, hB=h.B)
        return smc._run(**{k: v for k, v in kw.items() if k in sig})

    def dec_call(key, c):
        return sample(key, lm, up, idsB, lensB, fa_d if c else None, gtables if c else None,
                      budget=budget, constrained=c, temperature=1.0)

    configs = {"none": lambda k: dec_call(k, False), "gcd": lambda k: dec_call(k, True),
               "smc-gcd": lambda k: smc_call(k, "gcd")}
    for H in sorted(hmms, reverse=True):
        configs[f"lookahead H={H}"] = lambda k, H=H: smc_call(k, "lookahead", H)
    compile_s, names = {}, []
    for m, fn in configs.items():
        if not guard.ok(f"{tag} {m} (warm-up)"):
            continue
        t0 = time.perf_counter()
        jax.block_until_ready(fn(jax.random.key(0)))
        compile_s[m] = round(time.perf_counter() - t0, 2)
        names.append(m)
        print(f"  {tag} warm-up {m}: {compile_s[m]} s", flush=True)
    times = {m: [] for m in names}
    steps = {m: [] for m in names}
    for r in range(rounds):
        if r > 0 and not guard.ok(f"{tag} round {r}"):
            break
        order = names[r % max(len(names), 1):] + names[:r % max(len(names), 1)]
        for m in order:
            t0 = time.perf_counter()
            out = jax.block_until_ready(configs[m](jax.random.key(100 + r)))
            times[m].append(time.perf_counter() - t0)
            steps[m].append(max(int(out.steps), 1))
        print(f"  {tag} round {r}: " + ", ".join(
            f"{m} {1e3 * times[m][-1] / steps[m][-1]:.2f}" for m in names) + " ms/step",
            flush=True)
    rows = {}
    for m in names:
        ms = [1e3 * t / s for t, s in zip(times[m], steps[m])]
        row = {"ms_per_step": [float(np.mean(ms)), float(np.std(ms))], "steps": steps[m]}
        if "none" in times and times["none"]:
            base = [1e3 * t / s for t, s in zip(times["none"], steps["none"])]
            sl = [a / b for a, b in zip(ms, base)]
            row["slowdown"] = [float(np.mean(sl)), float(np.std(sl))]
        rows[m] = row
    return {"compile_s": compile_s, "rows": rows, "raw_s": times, "raw_steps": steps}


# ----------------------------------------------------------------------------- part 4
def em_throughput(H: int, V: int, T: int, seqs: int, batch: int, repeats: int) -> dict:
    """Part 4 for one shape: hmm_distill's EM iteration (E-step over ``seqs`` sequences in
    batches of ``batch``, then the M-step), timed as ``experiments/bench_hmm.py`` does."""
    import jax

    from experiments.bench_hmm import time_ours, zipf_tokens
    from hmm_distill.hmm import random_params

    X = zipf_tokens(np.random.default_rng(H), seqs, T, V)
    params = random_params(jax.random.key(H), H, V)
    r = time_ours(params, X, batch, repeats)
    r.update(H=H, V=V, T=T, seqs=seqs, batch=batch)
    if (H, V, T) == (PYJUICE["H"], PYJUICE["V"], PYJUICE["T"]):
        r["vs_pyjuice"] = r["tokens_per_s"] / PYJUICE["tokens_per_s"]
    return r


# ----------------------------------------------------------------------------- report
def to_markdown(res: dict) -> str:
    lines = ["# Device check (issues 41, 39): decode step vs floor, P-GCD scoring, SMC, EM", "",
             f"{res['device']} ({res['backend']}), jax {res['jax']}; command `{res['command']}`;"
             f" wall {res.get('wall_s', '?')} s" + (" (smoke: tiny shapes)" if res["smoke"]
                                                  else ""), ""]
    if res.get("automaton"):
        lines += [f"Constraint: {res['automaton']}.", ""]
    if res.get("decode_floor"):
        lines += ["## Decode step vs the weight-read floor", "",
                  "| model | weights GB | KV GB | floor ms | scan ms | scan / floor | "
                  f"unrolled ms | unrolled / floor (goal ≤ {GOAL_STEP}) | XLA bytes / floor |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m, r in res["decode_floor"].items():
            if "error" in r:
                lines.append(f"| {m} | error: {r['error'][:200]} |||||||")
                continue
            ca = r.get("cost_analysis", {}).get("ratio")
            lines.append(f"| {m} | {r['weights_GB']:.3f} | {r['kv_cache_GB']:.4f} | "
                         f"{r['floor_ms']:.3f} | {r['scan_ms']:.3f} | "
                         f"{r['scan_over_floor']:.2f}× | {r['unrolled_ms']:.3f} | "
                         f"{r['unrolled_over_floor']:.2f}× | "
                         f"{'' if ca is None else f'{ca:.2f}×'} |")
        lines.append("")
    if res.get("scoring"):
        lines += ["## P-GCD scoring, 16 particles (Pallas vs XLA)", "",
                  "| H | out-degree | live degree | XLA ms | Pallas ms | Pallas / XLA | same "
                  "support | max abs Δ log ψ |", "|---|---|---|---|---|---|---|---|"]
        for H, c in res["scoring"].items():
            if "pallas_error" in c:
                lines.append(f"| {H} | {c['out_degree']} | {c['live_degree']} | "
                             f"{c['xla_ms']:.3f} | error | | | |")
                continue
            lines.append(f"| {H} | {c['out_degree']} | {c['live_degree']} | {c['xla_ms']:.3f} |"
                         f" {c['pallas_ms']:.3f} | {c['pallas_over_xla']:.2f}× | "
                         f"{c['same_support']} | {c['max_abs_logpsi']:.2e} |")
        lines += ["", f"SMC scoring path: {res.get('scoring_path')}", ""]
    for m, d in (res.get("decoding") or {}).items():
        lines += [f"## Decoding, {m} ({res.get('layers', 'unrolled')} parameters, "
                  f"{res['rounds']} rounds interleaved)", "", "| method | ms/step | slowdown | goal | paper |",
                  "|---|---|---|---|---|"]
        for name, r in d.get("rows", {}).items():
            H = int(name.split("=")[1]) if name.startswith("lookahead") else None
            sl = r.get("slowdown")
            lines.append(f"| {name} | {r['ms_per_step'][0]:.2f} ± {r['ms_per_step'][1]:.2f} | "
                         f"{'' if sl is None else f'{sl[0]:.3f}× ± {sl[1]:.3f}'} | "
                         f"{'≤ ' + str(GOAL_LOOKAHEAD[H]) + '×' if H in GOAL_LOOKAHEAD else ''}"
                         f" | {str(PAPER[H]) + '×' if H in PAPER else ''} |")
        lines += ["", f"Warm-up (compile + one call) s: {d.get('compile_s')}", ""]
    if res.get("em"):
        lines += ["## EM throughput (one iteration: E-step + M-step)", "",
                  f"pyjuice's anchor: forward + backward at H = {PYJUICE['H']}, V = {PYJUICE['V']:,}, "
                  f"T = {PYJUICE['T']}, about {PYJUICE['tokens_per_s']:,} tokens/s on an "
                  f"{PYJUICE['device']} (an E-step only; the rows below add the M-step).", "",
                  "| H | V | T | tokens | tokens/s | vs pyjuice | compile + first s |",
                  "|---|---|---|---|---|---|---|"]
        for key, r in res["em"].items():
            if "error" in r:
                lines.append(f"| {key} | error: {r['error'][:200]} ||||||")
                continue
            vs = r.get("vs_pyjuice")
            lines.append(f"| {r['H']} | {r['V']:,} | {r['T']} | {r['tokens']:,} | "
                         f"{r['tokens_per_s']:,.0f} | {'' if vs is None else f'{vs:.2f}×'} | "
                         f"{r['compile_plus_first_s']:.1f} |")
        lines.append("")
    if res.get("skipped"):
        lines += [f"Skipped at the time limit: {res['skipped']}", ""]
    if res.get("errors"):
        lines += [f"Errors: {res['errors']}", ""]
    return "\n".join(lines)


def write(res: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=float))
    out.with_suffix(".md").write_text(to_markdown(res))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check)")
    ap.add_argument("--automaton", default=".gpu/js_tool_call_v128k.npz.gz")
    ap.add_argument("--models", nargs="+", default=None, help="default: 8b 1b (smoke: tiny)")
    ap.add_argument("--hidden", type=int, nargs="+", default=None,
                    help="HMM sizes (default 1024 4096 16384; smoke: 16 32)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--margin", type=int, default=16, help="budget = min budget + margin")
    ap.add_argument("--loop", type=int, default=32, help="decode steps per timed call (part 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--time-limit-s", type=float, default=420.0)
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3, 4], choices=[1, 2, 3, 4])
    ap.add_argument("--layers", choices=["unrolled", "scan"], default="unrolled",
                    help="the LM parameters of part 3 (per-layer, or stacked: faster compiles)")
    ap.add_argument("--out", default=str(RESULTS / "device_check"))
    args = ap.parse_args(argv)
    smoke = args.smoke
    models = args.models or (["tiny"] if smoke else ["8b", "1b"])
    hidden = args.hidden or ([16, 32] if smoke else [1024, 4096, 16384])
    if smoke:
        args.batch, args.prompt_len, args.margin = min(args.batch, 4), min(args.prompt_len, 8), 4
        args.loop, args.rounds, args.repeats = min(args.loop, 4), min(args.rounds, 2), 1

    import jax
    import jax.numpy as jnp

    from jaxcd.decoding import pgcd
    from jaxcd.decoding.decode import tables_for
    from jaxcd.lm.llama import JaxLM
    from jaxcd.lm.unrolled import random_unrolled_params, stack_params

    guard = Budget(args.time_limit_s)
    out = Path(args.out)
    dev = jax.devices()[0]
    res = {"command": "python experiments/device_check.py " + " ".join(argv or sys.argv[1:]),
           "device": dev.device_kind, "backend": jax.default_backend(), "jax": jax.__version__,
           "python": platform.python_version(), "smoke": smoke, "models": models,
           "hidden": hidden, "batch": args.batch, "rounds": args.rounds,
           "parts": args.parts, "layers": args.layers,
           "decode_floor": {}, "scoring": {}, "decoding": {}, "em": {}, "skipped": guard.skipped,
           "errors": {}}
    fa = smoke_automaton() if smoke else load_automaton(args.automaton)
    fa_d = fa.to_device()
    V = int(fa.vocab_size)
    budget = int(fa.min_budget) + args.margin
    res["automaton"] = (f"{'smoke regex' if smoke else 'js_tool_call'} over {V} tokens: "
                        f"{fa.num_states} states, {fa.num_edges} edges, out-degree "
                        f"{int(np.shape(fa.out_dst)[1])}, budget {budget}")
    print(res["automaton"], flush=True)

    lms = {}
    for m in models:
        cfg = model_config(m, V, int(fa.eos_id))
        lm = JaxLM(cfg, dtype=jnp.bfloat16, precision=None, attn_block=128, matmul="xla")
        lms[m] = lm
    # ---- part 1
    for m in models if 1 in args.parts else []:
        if not guard.ok(f"decode floor {m}"):
            continue
        try:
            t0 = time.perf_counter()
            up = jax.block_until_ready(random_unrolled_params(lms[m]))
            r = decode_floor(lms[m], up, args.batch, args.prompt_len, args.loop, args.repeats)
            r["params_built_s"] = round(time.perf_counter() - t0, 2)
            res["decode_floor"][m] = r
            del up
            print(f"  decode floor {m}: {json.dumps(r, default=float)[:600]}", flush=True)
        except Exception as e:      # noqa: BLE001 - recorded, the other parts still run
            res["decode_floor"][m] = {"error": repr(e)[-1500:]}
            traceback.print_exc()
        write(res, out)
    # ---- part 2
    gtables = tables_for(fa_d, "gcd", budget)
    hmms, ptables = {}, {}
    for H in hidden:
        hmm = random_hmm(H, V, seed=H)
        ptables[H] = jax.block_until_ready(pgcd.backward(
            fa, hmm, budget, table_dtype=jnp.bfloat16, max_bytes=120 << 30))
        hmms[H] = hmm._replace(B=hmm.B.astype(jnp.bfloat16))
        if 2 not in args.parts or not guard.ok(f"scoring H={H}"):
            continue
        try:
            res["scoring"][str(H)] = scoring(fa, fa_d, ptables[H], H, args.repeats)
        except Exception as e:      # noqa: BLE001
            res["errors"][f"scoring H={H}"] = repr(e)[-1500:]
            traceback.print_exc()
        print(f"  scoring H={H}: {res['scoring'].get(str(H))}", flush=True)
    failed = [H for H, c in res["scoring"].items() if "pallas_error" in c or
              not c.get("same_support", True)]
    if failed:                               # the fallback: tables without the kernel
        ptables = {H: t._replace(pallas=False) for H, t in ptables.items()}
    if jax.default_backend() == "cpu":
        res["scoring_path"] = "the CPU's (native kernel where it builds, else xla)"
    else:
        res["scoring_path"] = ("xla (Pallas failed or disagreed: H=" + ",".join(failed) + ")"
                               if failed else ("pallas" if all(t.pallas for t in ptables.values())
                                               else "xla"))
    write(res, out)
    # ---- part 4 (before part 3, the longest: it is short, and issue 39's only device figure)
    em_shapes = ((16, 512),) if smoke else EM_SHAPES
    em_T, em_seqs, em_batch = (16, 8, 4) if smoke else (128, 512, 256)
    for H, Vem in em_shapes if 4 in args.parts else ():
        if not guard.ok(f"em H={H} V={Vem}"):
            continue
        try:
            r = em_throughput(H, Vem, em_T, em_seqs, em_batch, 1 if smoke else 3)
            res["em"][f"H={H} V={Vem}"] = r
            print(f"  em H={H} V={Vem}: {r['tokens_per_s']:,.0f} tokens/s", flush=True)
        except Exception as e:      # noqa: BLE001
            res["em"][f"H={H} V={Vem}"] = {"error": repr(e)[-1500:]}
            traceback.print_exc()
        write(res, out)
    # ---- part 3
    for m in models if 3 in args.parts else []:
        if not guard.ok(f"decoding {m}"):
            continue
        try:
            up = jax.block_until_ready(random_unrolled_params(lms[m]))
            if args.layers == "scan":
                up = stack_params(up)
            res["decoding"][m] = decoding(lms[m], up, fa_d, gtables, ptables, hmms, budget,
                                          args.batch, args.prompt_len, args.rounds, guard, m)
            del up
        except Exception as e:      # noqa: BLE001
            res["errors"][f"decoding {m}"] = repr(e)[-1500:]
            traceback.print_exc()
        write(res, out)
    res["wall_s"] = round(guard.elapsed(), 1)
    write(res, out)
    print(to_markdown(res), flush=True)
    return res


if __name__ == "__main__":
    main()
