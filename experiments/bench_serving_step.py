"""Benchmark: where a continuous-batching decode step and an insert call spend their
time (docs/serving.md).

Times jitted pieces in isolation at the shapes ``experiments.bench_serving`` uses (the
stream's common automaton bucket, prompt bucket, budget bucket 64, 16 rows; and the
one-by-one shapes: batch 1, the request's own bucket), with ``block_until_ready``,
``--repeats`` runs after a warm-up, medians. Pieces:

- ``lm.step``: the bare LM step (KV cache of ``P + 2N`` slots, as :mod:`serve` allocates);
- ``mask``: GCD masked logits of every row (``masked_logits`` on the flattened stack);
- ``draw``: the token draw (per-row keys, ``fold_in``, inverse CDF);
- ``advance``: the automaton transition of every row;
- ``select``: mask + draw + advance + bookkeeping (everything but the LM);
- ``full step``: one decode step as ``serve._decode_chunk`` runs it;
- insert pieces: prefill of ``G`` prompts, host stacking of their automata, β tables,
  the ``_insert`` program.

Usage: ``PYTHONPATH=. python experiments/bench_serving_step.py [--repeats 7]``
(prints a table; writes ``experiments/results/bench_serving_step.{md,json}``).

``--ab-gemm ROUNDS``: instead, an interleaved A/B of the layer kernels' schemes
(``JAXCD_GEMM``, read at each kernel call: ``o`` the packed kernel for every row count,
``a`` the default, 2..16 rows through the transposed kernel) on the donated ``lm.step``
at B=16 (cache of 256 slots, a 128-wide prompt) and B=1, alternating the order each
round; per round the min of 4 steps, wall and process CPU; reports the medians and the
median paired ratios a/o (on a shared machine the CPU ratio is the steadier one). Both
schemes give the same bits.

``--ab-stream ROUNDS``: an interleaved A/B of the whole continuous stream of
``bench_serving`` (the first ``--n`` requests, batch 16, GCD, budget 64): ``old`` (whole
insert groups, power-of-two rest widths, ``JAXCD_GEMM=o``)
against ``new`` (the defaults); one warm-up call per variant, then ROUNDS pairs in
alternating order; prints wall and CPU seconds, steps, occupancy and compiles per run and
the new/old ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxcd.decoding import gcd, serve as serve_mod  # noqa: E402
from jaxcd.decoding.buckets import (automaton_bucket, budget_bucket, common_bucket,  # noqa: E402
                                    flatten, prompt_bucket)
from jaxcd.decoding.decode import draw, masked_logits, tables_for  # noqa: E402
from jaxcd.generation import build_constraint, load_model  # noqa: E402
from jaxcd.lm.interface import pad_prompts  # noqa: E402
from jaxcd.lm.llama import step_donated  # noqa: E402

RESULTS = ROOT / "experiments" / "results"


def timeit(fn, repeats):
    """Median and min wall seconds, median process CPU seconds of ``fn()``."""
    jax.block_until_ready(fn())              # warm-up (compile)
    ts, cs = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        ts.append(time.perf_counter() - t0)
        cs.append(time.process_time() - c0)
    return statistics.median(ts), min(ts), statistics.median(cs)


def ab_gemm(rounds: int, modes=("o", "a")) -> None:
    import numpy as np
    m = load_model()
    lm, params = m.lm, m.params
    prompt = m.encode_prompt("Give the JSON arguments for a call to get_weather. "
                             "Returns the weather for a city")
    hold = {}
    for B in (16, 1):
        ids, lens = pad_prompts([prompt] * B, pad_id=0, length=128)
        hold[B] = lm.prefill(params, jnp.asarray(ids), jnp.asarray(lens), 256)[0]
    res = {}
    l0 = os.getloadavg()
    for r in range(rounds):
        for B in (16, 1):
            tok = jnp.zeros((B,), jnp.int32) + 17
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                os.environ["JAXCD_GEMM"] = mode
                ts, cs = [], []
                for _ in range(4):
                    t0, c0 = time.perf_counter(), time.process_time()
                    s2, lp = step_donated(lm, params, hold[B], tok)
                    lp.block_until_ready()
                    ts.append(time.perf_counter() - t0)
                    cs.append(time.process_time() - c0)
                    hold[B] = dict(s2, slot=s2["slot"] - 1)     # same write slot each step
                res.setdefault((B, mode), []).append((1e3 * min(ts), 1e3 * min(cs)))
    os.environ.pop("JAXCD_GEMM", None)
    print(f"lm.step, interleaved A/B of JAXCD_GEMM over {rounds} rounds; 1-min load "
          f"{l0[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    for B in (16, 1):
        base = np.array(res[(B, modes[0])])
        for mode in modes:
            x = np.array(res[(B, mode)])
            print(f"  B={B:2d} {mode}: wall median {np.median(x[:, 0]):7.1f} ms (min "
                  f"{x[:, 0].min():6.1f}), CPU median {np.median(x[:, 1]):7.1f} ms; paired "
                  f"{mode}/{modes[0]}: wall {np.median(x[:, 0] / base[:, 0]):.3f}, CPU "
                  f"{np.median(x[:, 1] / base[:, 1]):.3f}")


def ab_stream(rounds: int, n: int, budget: int) -> None:
    import jaxcd
    from bench_serving import candidates
    from jaxcd.decoding import compile_stats
    m = load_model()
    reqs, fas = [], []
    for c in candidates(0):
        if len(reqs) == n:
            break
        try:
            fa = build_constraint(m.vocab, cache=True, **{c["kind"]: c["spec"]})
        except Exception:
            continue
        if fa.min_budget > budget:
            continue
        reqs.append(c)
        fas.append(fa)
    ids = [m.encode_prompt(r["prompt"]) for r in reqs]
    n0 = serve_mod.stream_prefix_len(ids)
    width = prompt_bucket(max(len(x) for x in ids))
    variants = {"old": (True, True, "o"), "new": (False, False, "a")}

    def use(name):
        serve_mod._WHOLE_GROUPS, serve_mod._POW2_REST, os.environ["JAXCD_GEMM"] = variants[name]

    def run(sel, seed):
        t0, c0 = time.perf_counter(), time.process_time()
        outs = jaxcd.generate([reqs[i]["prompt"] for i in sel],
                              constraints=[{reqs[i]["kind"]: reqs[i]["spec"]} for i in sel],
                              method="gcd", budget=budget, seed=seed, model=m, batch_size=16,
                              progress=False, batching="continuous")
        return outs, time.perf_counter() - t0, time.process_time() - c0

    def warm_set(sel):          # as bench_serving's warm-up: a group per insert class, ...
        cls = dict(zip(sel, serve_mod.insert_classes([len(ids[i]) for i in sel], width, n0)))
        longest = max(sel, key=lambda i: len(ids[i]))
        warm = []
        for want in sorted(set(cls.values())):
            mem = sorted((i for i in sel if cls[i] == want), key=lambda i: i != longest)
            mem += [i for i in sel if cls[i][0] == want[0] and cls[i][1] < want[1]]
            warm += [i for i in mem if i not in warm][:4]
        firsts = {}
        for i in sel:           # ... and a request per automaton bucket and kind
            firsts.setdefault(tuple(automaton_bucket(fas[i])), i)
            firsts.setdefault(reqs[i]["kind"], i)
        return warm + [i for i in firsts.values() if i not in warm]

    sel = list(range(len(reqs)))
    for name in variants:
        use(name)
        run(warm_set(sel), 3000)
    res = {k: [] for k in variants}
    for r in range(rounds):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            use(name)
            c0, l0 = compile_stats.snapshot(), os.getloadavg()[0]
            outs, wall, cpu = run(sel, 2000)
            d = compile_stats.snapshot() - c0
            st = outs[0].stats
            rec = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                   "compiles": d.backend_compiles, "valid": sum(o.valid[0] for o in outs),
                   "load": [round(l0, 2), round(os.getloadavg()[0], 2)],
                   **{k: st[k] for k in ("steps", "occupancy", "inserts", "chunks",
                                         "prefill_tokens")}}
            res[name].append(rec)
            print(name, json.dumps(rec), flush=True)
    os.environ.pop("JAXCD_GEMM", None)
    serve_mod._WHOLE_GROUPS = serve_mod._POW2_REST = False
    for k in ("wall_s", "cpu_s"):
        print(f"new/old {k} per round:", [round(x[k] / y[k], 3)
                                          for x, y in zip(res["new"], res["old"])])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--n", type=int, default=200, help="constraints scanned for the bucket")
    ap.add_argument("--skip-pieces", action="store_true", help="only the loop/LM/prefill rows")
    ap.add_argument("--out", default=str(RESULTS / "bench_serving_step"))
    ap.add_argument("--ab-gemm", type=int, default=0, metavar="ROUNDS",
                    help="interleaved A/B of JAXCD_GEMM=o vs a on lm.step (see the docstring)")
    ap.add_argument("--ab-stream", type=int, default=0, metavar="ROUNDS",
                    help="interleaved A/B of the continuous stream, old vs new scheduling")
    a = ap.parse_args(argv)
    if a.ab_gemm:
        return ab_gemm(a.ab_gemm)
    if a.ab_stream:
        return ab_stream(a.ab_stream, a.n, a.budget)
    from bench_serving import candidates
    m = load_model()
    lm, params = m.lm, m.params
    load0 = os.getloadavg()
    reqs = []
    for c in candidates(0):
        if len(reqs) == a.n:
            break
        try:
            fa = build_constraint(m.vocab, cache=True, **{c["kind"]: c["spec"]})
        except Exception:
            continue
        if fa.min_budget > a.budget:
            continue
        reqs.append((c, fa))
    B, G, N = a.rows, a.group, budget_bucket(a.budget)
    bucket = common_bucket([fa for _, fa in reqs])
    P = prompt_bucket(max(len(m.encode_prompt(c["prompt"])) for c, _ in reqs))
    S_cache = P + 2 * N
    print(f"{len(reqs)} constraints; common bucket {bucket}, prompt bucket {P}, "
          f"cache {S_cache} slots; load {load0}", flush=True)
    rows_here = []

    def rec(name, shape, fn):
        med, mn, cpu = timeit(fn, a.repeats)
        rows_here.append({"piece": name, "shape": shape, "median_ms": 1e3 * med, "min_ms": 1e3 * mn,
                          "cpu_ms": 1e3 * cpu})
        print(f"  {name:<34} {shape:<28} median {1e3 * med:9.2f} ms   min {1e3 * mn:9.2f} ms   "
              f"cpu {1e3 * cpu:9.2f} ms", flush=True)

    temp = jnp.float32(1.0)
    eos = int(lm.eos_token_id)
    for Bx, bk, label in ((B, bucket, f"B={B}, common bucket"),
                          (1, automaton_bucket(reqs[0][1]), "B=1, own bucket")):
        if a.skip_pieces:
            break
        sel = [fa for _, fa in reqs[:Bx]]
        prompts = [m.encode_prompt(c["prompt"]) for c, _ in reqs[:Bx]]
        fa = serve_mod._stack_rows(sel, bk).to_device()      # as serve holds them
        D = int(bk[2])
        tables = tables_for(fa, "gcd", a.budget, N)
        ids, lens = pad_prompts(prompts, pad_id=0, length=P)
        state, logp = lm.prefill(params, jnp.asarray(ids), jnp.asarray(lens), S_cache)
        tok = jnp.zeros((Bx,), jnp.int32) + 17
        # donated, as inside the decode loop (a functional step copies the whole cache)
        hold = {"s": state}

        def st_fn():
            hold["s"], lp = step_donated(lm, params, hold["s"], tok)
            return lp
        rec("lm.step (donated)", label, st_fn)
        state = lm.prefill(params, jnp.asarray(ids), jnp.asarray(lens), S_cache)[0]
        cs = gcd.init_states(flatten(fa), Bx)
        keys = jax.vmap(lambda i: jax.random.key_data(jax.random.PRNGKey(i)))(jnp.arange(Bx))
        tcur = jnp.zeros((Bx,), jnp.int32)

        @jax.jit
        def f_mask(fa, tables, cs, logp):
            return masked_logits(serve_mod._flat_view(fa, D), tables, cs, logp)
        rec("mask (masked_logits)", label, lambda: f_mask(fa, tables, cs, logp))
        ml = f_mask(fa, tables, cs, logp)

        @jax.jit
        def f_draw(keys, t, logits):
            k = jax.vmap(jax.random.fold_in)(keys, t)
            return draw(k, logits / temp, jnp.zeros(logits.shape[0], bool), eos)
        rec("draw (fold_in + sample)", label, lambda: f_draw(keys, tcur, ml))

        @jax.jit
        def f_adv(fa, st, tok):
            return serve_mod._next_state_stacked(serve_mod._flat_view(fa, D), st, tok)
        rec("advance (next_state)", label, lambda: f_adv(fa, cs.state, tok))

        @jax.jit
        def f_select(fa, tables, cs, logp, keys, t):
            ffa = serve_mod._flat_view(fa, D)
            k = jax.vmap(jax.random.fold_in)(keys, t)
            lg = masked_logits(ffa, tables, cs, logp)
            tk, lq, _, empty = draw(k, lg / temp, jnp.zeros(logp.shape[0], bool), eos)
            lp = jnp.take_along_axis(logp, tk[:, None], axis=1)[:, 0]
            nxt = serve_mod._next_state_stacked(ffa, cs.state, tk)
            return tk, lq, lp, nxt
        rec("select (mask+draw+advance)", label, lambda: f_select(fa, tables, cs, logp, keys, tcur))

        from functools import partial as _partial

        @_partial(jax.jit, donate_argnums=(1,))
        def f_full(params, state, fa, tables, cs, logp, keys, t):
            tk, lq, lp, nxt = f_select(fa, tables, cs, logp, keys, t)
            return lm.step(params, state, tk), nxt, lq, lp
        hold["s"] = state

        def full():
            (hold["s"], lp), *rest = f_full(params, hold["s"], fa, tables, cs, logp, keys, tcur)
            return lp
        rec("full step (select + lm.step)", label, full)

    # the real decode loop: serve._decode_chunk running `k` steps for all B rows (limit k),
    # per step; and the bare LM step (donated, as inside the loop) at the cache lengths
    # of prompt widths 64 and 128
    for Pw in (64, P):
        Sc = Pw + 2 * N
        sel = [fa for _, fa in reqs[:B]]
        prompts = [m.encode_prompt(c["prompt"])[-Pw:] for c, _ in reqs[:B]]
        fa = serve_mod._stack_rows(sel, bucket).to_device()
        tables = tables_for(fa, "gcd", a.budget, N)
        ids, lens = pad_prompts(prompts, pad_id=0, length=Pw)
        k = 16

        def chunk():            # a fresh carry (_decode_chunk donates it)
            keys = jax.vmap(lambda i: jax.random.key_data(jax.random.PRNGKey(i)))(jnp.arange(B))
            state, logp = lm.prefill(params, jnp.asarray(ids), jnp.asarray(lens), Sc)
            cst = gcd.init_states(flatten(fa), B)
            c = serve_mod._Carry(state, logp, cst.state, jnp.zeros(B, jnp.int32),
                                 jnp.zeros(B, bool), jnp.ones(B, bool), jnp.zeros(B, jnp.float32),
                                 jnp.zeros(B, jnp.float32), jnp.full((B, N), eos, jnp.int32), keys)
            return jax.block_until_ready(c)

        def run_chunk(c):
            t0, c0 = time.perf_counter(), time.process_time()
            out = serve_mod._decode_chunk(lm, params, fa, tables, c, jnp.zeros(B, bool),
                                          jnp.int32(k), temp, jnp.int32(B), constrained=True,
                                          greedy=False, D=int(bucket[2]))
            jax.block_until_ready(out)
            n = int(out[1])
            return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n

        run_chunk(chunk())
        ts = [run_chunk(chunk()) for _ in range(max(2, a.repeats // 2))]
        rows_here.append({"piece": f"decode loop (_decode_chunk, {k} steps), per step",
                          "shape": f"B={B}, P={Pw}, cache {Sc}",
                          "median_ms": 1e3 * statistics.median(x for x, _ in ts),
                          "min_ms": 1e3 * min(x for x, _ in ts),
                          "cpu_ms": 1e3 * statistics.median(y for _, y in ts)})
        print(f"  decode loop per step  B={B} P={Pw}: {rows_here[-1]['median_ms']:.2f} ms "
              f"(min {rows_here[-1]['min_ms']:.2f}, cpu {rows_here[-1]['cpu_ms']:.2f})", flush=True)
        holder = {"s": lm.prefill(params, jnp.asarray(ids), jnp.asarray(lens), Sc)[0]}
        tk = jnp.full((B,), 17, jnp.int32)

        def st_don():
            holder["s"], lp = step_donated(lm, params, holder["s"], tk)
            return lp
        rec("lm.step donated", f"B={B}, cache {Sc}", st_don)
        ids1, lens1 = pad_prompts(prompts[:1], pad_id=0, length=Pw)
        holder1 = {"s": lm.prefill(params, jnp.asarray(ids1), jnp.asarray(lens1), Pw + N)[0]}
        tk1 = jnp.full((1,), 17, jnp.int32)

        def st_don1():
            holder1["s"], lp = step_donated(lm, params, holder1["s"], tk1)
            return lp
        rec("lm.step donated", f"B=1, cache {Pw + N}", st_don1)
        idsg, lensg = pad_prompts(prompts[:G], pad_id=0, length=Pw)
        rec("lm.prefill", f"G={G}, P={Pw}",
            lambda: lm.prefill(params, jnp.asarray(idsg), jnp.asarray(lensg), Pw))
        rec("lm.prefill", f"B=1, P={Pw}",
            lambda: lm.prefill(params, jnp.asarray(ids1), jnp.asarray(lens1), Pw + N))

    # insert pieces (G requests into the B-row stream)
    take = reqs[B:B + G]
    prompts = [m.encode_prompt(c["prompt"]) for c, _ in take]
    ids, lens = pad_prompts(prompts, pad_id=0, length=P)
    rec("insert: lm.prefill", f"G={G}, P={P}",
        lambda: lm.prefill(params, jnp.asarray(ids), jnp.asarray(lens), P))
    # what serve runs instead for most groups: the shared prefix prefilled once, each
    # group's rest of the prompts after it (JaxLM.prefill_after)
    all_ids = [m.encode_prompt(c["prompt"]) for c, _ in reqs]
    n0 = serve_mod.stream_prefix_len(all_ids)
    if n0:
        PB = prompt_bucket(n0)
        pre = lm.prefill(params, *map(jnp.asarray, pad_prompts([all_ids[0][:n0]], pad_id=0,
                                                               length=PB)), PB)[0]
        T = prompt_bucket(max(len(p) - n0 for p in prompts))
        ids_r, lens_r = pad_prompts([p[n0:] for p in prompts], pad_id=0, length=T)
        rec("insert: lm.prefill_after (shared prefix)", f"G={G}, prefix {n0}, rest T={T}",
            lambda: lm.prefill_after(params, pre, jnp.asarray(ids_r), jnp.asarray(lens_r),
                                     PB + T))
    rec("insert: stack (host, serve._stack_rows) + to_device", f"G={G}, {bucket}",
        lambda: serve_mod._stack_rows([fa for _, fa in take], bucket).to_device())
    new_fa = serve_mod._stack_rows([fa for _, fa in take], bucket).to_device()
    rec("insert: tables_for (beta)", f"G={G}", lambda: tables_for(new_fa, "gcd", a.budget, N))
    new_tables = tables_for(new_fa, "gcd", a.budget, N)
    ids64, lens64 = pad_prompts([p[-64:] for p in prompts], pad_id=0, length=64)
    ns, nl = lm.prefill(params, jnp.asarray(ids64), jnp.asarray(lens64), 64)
    B_fa = serve_mod._stack_rows([fa for _, fa in reqs[:B]], bucket).to_device()
    B_tab = tables_for(B_fa, "gcd", a.budget, N)
    st0, lp0 = serve_mod._empty_state(lm, params, B, P, S_cache)
    live = {"c": serve_mod._Carry(st0, lp0, jnp.zeros(B, jnp.int32), jnp.zeros(B, jnp.int32),
                                  jnp.zeros(B, bool), jnp.zeros(B, bool), jnp.zeros(B, jnp.float32),
                                  jnp.zeros(B, jnp.float32), jnp.full((B, N), eos, jnp.int32),
                                  jnp.zeros((B, 2), jnp.uint32)),
            "fa": B_fa, "t": B_tab}

    def ins():                  # the _insert program (donates the carry, automata, tables)
        live["c"], live["fa"], live["t"] = serve_mod._insert(
            live["c"], live["fa"], live["t"], jnp.arange(G, dtype=jnp.int32), ns, nl, new_fa,
            new_tables, jnp.zeros((G, 2), jnp.uint32), jnp.int32(P), constrained=True, P=64,
            eos=eos)
        return live["c"].logp
    rec("insert: _insert program", f"G={G} into B={B}, P_g=64", ins)

    res = {"command": "PYTHONPATH=. python experiments/bench_serving_step.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "bucket": list(bucket), "prompt_bucket": P,
        "cache_slots": S_cache, "rows": B, "group": G, "load_start": load0,
        "load_end": os.getloadavg(), "pieces": rows_here}
    lines = ["# Where a serving decode step spends its time", "",
             f"`{res['command']}`; common bucket {tuple(bucket)}, prompt bucket {P}, cache "
             f"{S_cache} slots, {a.repeats} repeats after a warm-up (median, min). 1-min load "
             f"{load0[0]:.2f} → {res['load_end'][0]:.2f}.", "",
             "| piece | shape | wall median ms | wall min ms | CPU median ms |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['piece']} | {r['shape']} | {r['median_ms']:.2f} | {r['min_ms']:.2f} | "
              f"{r['cpu_ms']:.2f} |" for r in rows_here]
    Path(a.out + ".json").write_text(json.dumps(res, indent=1))
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
