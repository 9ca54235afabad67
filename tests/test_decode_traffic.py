"""The decode step's memory traffic (issue 41 item 1): with per-layer parameters
(:mod:`jaxcd.lm.unrolled`) the compiled step reads each weight once.

Reference: XLA's own cost analysis of the compiled program (``bytes accessed``) against
the floor = bytes of the weights + the KV cache the step reads (both computed from the
arrays). The stacked-layer ``scan`` (the library's other path on GPU/TPU) is measured the
same way, unrolled by XLA so that the cost analysis sees all its layers (it counts a
``while`` body once), and must exceed the bound: the figure can fail.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from jaxcd.lm.gguf_weights import LlamaConfig
from jaxcd.lm.interface import pad_prompts

CFG = LlamaConfig(arch="llama", vocab_size=512, hidden_size=128, intermediate_size=512,
                  num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=1e4,
                  rms_eps=1e-5, context_length=1024, tie_embeddings=False, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0)
MAX_LEN = 32


def _setup(tag: str = ""):
    from jaxcd.lm.llama import JaxLM
    from jaxcd.lm.unrolled import random_unrolled_params, stack_params

    lm = JaxLM(CFG, dtype=jnp.float32, precision=None, attn_block=128, matmul="xla")
    lm._key = lm._key + (tag,)           # a jit cache entry of its own
    up = random_unrolled_params(lm, seed=3)
    ids, lens = pad_prompts([[1, 5, 9, 200, 7], [3, 4], [8] * 6, [100]], pad_id=0)
    return lm, up, stack_params(up), jnp.asarray(ids), jnp.asarray(lens)


def test_unroll_and_stack_are_inverse():
    from jaxcd.lm.unrolled import stack_params, unroll_params

    _, up, stacked, _, _ = _setup()
    again = unroll_params(stacked)
    assert len(again) == CFG.num_layers
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(up)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(stack_params(again)), jax.tree.leaves(stacked)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unrolled_params_give_the_stacked_results():
    """prefill + donated steps with per-layer parameters equal the stacked scan's
    (log-probabilities and every cache slot)."""
    from jaxcd.lm.llama import step_donated

    lm, up, stacked, ids, lens = _setup()
    s_a, lp_a = lm.prefill(stacked, ids, lens, MAX_LEN)
    s_b, lp_b = lm.prefill(up, ids, lens, MAX_LEN)
    np.testing.assert_allclose(np.asarray(lp_b), np.asarray(lp_a), atol=1e-5)
    for _ in range(4):
        tok = jnp.argmax(lp_a, -1).astype(jnp.int32)
        s_a, lp_a = lm.step(stacked, s_a, tok)
        s_b, lp_b = step_donated(lm, up, s_b, tok)
        np.testing.assert_allclose(np.asarray(lp_b), np.asarray(lp_a), atol=1e-5)
    for key in ("k", "v", "slot", "offset"):
        np.testing.assert_allclose(np.asarray(s_b[key]), np.asarray(s_a[key]), atol=1e-5)


def test_unrolled_step_reads_each_weight_once():
    from jaxcd.lm.step_traffic import step_traffic

    lm, up, stacked, ids, lens = _setup()
    state, _ = lm.prefill(up, ids, lens, MAX_LEN)
    tok = jnp.zeros((ids.shape[0],), jnp.int32)
    r = step_traffic(lm, up, state, tok)
    w = sum(x.nbytes for x in jax.tree.leaves(stacked))
    assert r["weights"] == w and r["kv_cache"] == state["k"].nbytes + state["v"].nbytes
    assert r["bytes_accessed"] >= r["weights"]      # every weight is read at least once
    assert r["ratio"] <= 1.3, r["ratio"]
    # no loop, no weight slice copied, and the cache updated in place (no copy of it)
    assert r["moves"]["while"] == 0 and r["moves"]["dynamic-slice"] == 0
    cache_shape = "f32[" + ",".join(map(str, state["k"].shape)) + "]"
    assert not [ln for ln in r["hlo"].split("\n") if " copy(" in ln and cache_shape in ln]


def test_scan_step_exceeds_the_bound(monkeypatch):
    """The stacked-layer scan (unrolled by XLA so that the cost analysis counts every
    layer) copies each layer's weights out of the stacked arrays: well over the bound."""
    from jaxcd.lm.step_traffic import step_traffic

    scan = jax.lax.scan
    monkeypatch.setattr(jax.lax, "scan", lambda *a, **k: scan(*a, **{**k, "unroll": True}))
    lm, up, stacked, ids, lens = _setup("scan-unrolled-by-xla")
    state, _ = lm.prefill(stacked, ids, lens, MAX_LEN)
    r = step_traffic(lm, stacked, state, jnp.zeros((ids.shape[0],), jnp.int32))
    assert r["ratio"] > 2.0, r["ratio"]
    assert r["weight_sized_moves"]["dynamic-slice"] + r["weight_sized_moves"]["slice"] > 0


def test_hlo_traffic_multiplies_loop_bodies():
    """:func:`hlo_traffic` charges a ``while`` body once per trip (XLA's cost analysis
    charges it once): a loop adding a 64 KiB array to itself 10 times moves about 10x
    (read + write) of it."""
    from jaxcd.lm.step_traffic import hlo_traffic

    x = jnp.ones((16384,), jnp.float32)
    f = jax.jit(lambda x: jax.lax.fori_loop(0, 10, lambda i, y: jnp.sin(y) + x, x))
    c = f.lower(x).compile()
    t = hlo_traffic(c.as_text())
    assert 10 * 2 * x.nbytes <= t <= 10 * 4 * x.nbytes + 4 * x.nbytes, t
