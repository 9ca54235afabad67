"""Why the Llama-3.1-8B-shaped decode step (bench_pgcd_gpu) is slower than reading its
weights once: one batch-16 ``lm.step`` timed three ways on the GPU, next to the bandwidth
floor (one jitted pass that reads every weight once).

* ``scan``: :class:`~jaxcd.lm.llama.JaxLM` as the library runs it on a GPU (the layer
  ``lax.scan`` over the stacked weights, ``matmul="xla"``);
* ``in-place``: the same step, but the stacked projection kernels are closed over and each
  layer's matrix is read with a dynamic index inside the scan body (the path the CPU
  kernel uses, here through XLA's dot);
* the floor: ``sum(w.astype(f32))`` over every weight, one pass.

Usage (on the GPU): ``PYTHONPATH=. python experiments/bench_lm_step_gpu.py --out DIR``.
Writes ``DIR/bench_lm_step_gpu.json`` and, with ``--hlo``, the optimised HLO of the
``scan`` step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/bench_lm_step_gpu")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--hlo", action="store_true")
    ap.add_argument("--tag", default="default")
    ap.add_argument("--vocab-size", type=int, default=128256)
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from bench_pgcd import best_ms
    from bench_pgcd_gpu import llama31_8b_config, random_params
    from jaxcd.lm.interface import pad_prompts
    from jaxcd.lm.llama import JaxLM

    cfg = llama31_8b_config(args.vocab_size, 2, tiny=args.tiny)
    lm = JaxLM(cfg, dtype=jnp.bfloat16, precision=None, attn_block=128, matmul="xla")
    params = jax.block_until_ready(random_params(lm))
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    rng = np.random.default_rng(0)
    prompt = [1] + [int(x) for x in rng.integers(100, 40000, 63)]
    ids, lens = (jnp.asarray(a) for a in pad_prompts([prompt] * 16, pad_id=0))
    state, _ = lm.prefill(params, ids, lens, 64 + 48)
    tok = jnp.full((16,), 7, jnp.int32)
    out = {"tag": args.tag, "xla_flags": os.environ.get("XLA_FLAGS", ""),
           "device": jax.devices()[0].device_kind, "weights_GB": nbytes / 1e9}

    floor = jax.jit(lambda p: sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(p)))
    out["read_weights_ms"] = best_ms(lambda: floor(params), 20)
    out["read_GBps"] = nbytes / (out["read_weights_ms"] / 1e3) / 1e9
    out["step_scan_ms"] = best_ms(lambda: lm.step(params, state, tok), 20)

    lm2 = JaxLM(cfg, dtype=jnp.bfloat16, precision=None, attn_block=128, matmul="xla")
    lm2._key = lm2._key + ("in-place",)            # its own jit cache entry
    lm2.in_place_matmul = lambda: True              # XLA's dot on w[layer], closed over
    from jaxcd.lm import llama as _llama
    _logits = _llama.LlamaModel.logits              # the head as usual (no CPU kernel)
    _llama.LlamaModel.logits = lambda self, h, in_place=False: _logits(self, h, False)
    try:
        out["step_in_place_ms"] = best_ms(lambda: lm2.step(params, state, tok), 20)
        a = np.asarray(lm.step(params, state, tok)[1], np.float32)
        b = np.asarray(lm2.step(params, state, tok)[1], np.float32)
        fin = np.isfinite(a) & np.isfinite(b)
        out["in_place_vs_scan_max_abs_logprob"] = (float(np.max(np.abs(a - b)[fin]))
                                                   if fin.any() else None)
        out["same_support"] = bool(np.array_equal(np.isfinite(a), np.isfinite(b)))
    except Exception as e:      # noqa: BLE001 - a diagnostic: report and go on
        out["step_in_place_error"] = repr(e)[:500]
    if args.hlo:
        from jaxcd.lm.llama import _step_jit
        txt = _step_jit.lower(lm, params, state, tok).compile().as_text()
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"step_hlo_{args.tag}.txt").write_text(txt[:15_000_000])
        out["hlo_copies"] = txt.count(" copy(") + txt.count("copy-start")
        out["hlo_dynamic_slices"] = txt.count("dynamic-slice")
    print(json.dumps(out, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"bench_lm_step_gpu_{args.tag}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
