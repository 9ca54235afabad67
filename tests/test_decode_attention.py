"""The decode-step attention kernel (``jaxcd/lm/kernels/decode_attention.cc``) against
independent references.

Against float64 numpy, with a bound derived from the kernel's float32 steps (u = 2⁻²⁴,
γ_n = n u / (1 − n u)): each score ``t_j = Σ_d q_d k_jd`` is a recursive sum in d order,
``|t̃_j − t_j| ≤ γ_D Σ_d |q_d k_jd|``; scaling, the soft-cap's divide / tanh / multiply
and the subtraction of the maximum add a few roundings, so the exponent of weight j is
off by at most ``δ_j = scale γ_{D+4} Σ_d |q_d k_jd| + 8u |s_j| + u |s_j − m|``
(``s_j`` the exact score, ``m`` its maximum). With the kernel's exp within a relative
``η`` (``η = 4u`` for its polynomial, checked below) and ``Δ = max_j δ_j``, every
normalised weight is within ``p_j ρ``, ``ρ = e^{2Δ}(1 + η)/(1 − η) − 1``, of the exact
one; the weighted sum of the values and the sum of the weights (each ≤ n terms,
float32) and the final reciprocal and product add ``(2γ_n + 2u)(1 + ρ)`` relative to
``Σ_j p_j |v_jd|``::

    |out − ref| ≤ (ρ + (2γ_n + 2u)(1 + ρ)) Σ_j p_j |v_jd|

Against XLA's attention (:func:`attend_decode_blocked`, :func:`attend`), the kernel in a
random tiny Llama / Qwen2 / Gemma-3-style LM (sliding window, soft-cap) decoding past its
window, the vmap rule, and the HLO of a decode step. Skipped where the kernel cannot be
built.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxcd.lm import kernels
from jaxcd.lm.llama import _with_new_slot, attend, attend_decode_blocked

from native import skip_reason  # noqa: E402

# skipped only where no kernel can exist (no C++ compiler, not the CPU); a kernel that
# fails to build with a compiler present fails here and in test_native_kernels.py
pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@pytest.fixture(autouse=True, scope="module")
def _kernel_built():
    """Build and register the kernel (a build failure fails every test here)."""
    assert kernels.decode_attention_available(), "decode attention kernel did not build"

U = 2.0 ** -24


def gamma(n):
    return n * U / (1 - n * U)


def _inputs(rng, B, L, nkv, G, D, S, dtype="float32"):
    nh = nkv * G
    f = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32), dtype)  # noqa: E731
    return (jnp.asarray(rng.standard_normal((B, nh, D), np.float32)), f(B, L, nkv, D, S),
            f(B, L, nkv, S, D), f(B, nkv, D), f(B, nkv, D))


def _reference(q, k, v, kn, vn, lo, slot, layer, scale, softcap):
    """float64 output [B, n_h, D] and the error bound of the module docstring."""
    q, k, v, kn, vn = (np.asarray(jnp.asarray(a, jnp.float32), np.float64) for a in (q, k, v, kn, vn))
    B, nh, D = q.shape
    nkv = k.shape[2]
    G = nh // nkv
    out, bound = np.zeros((B, nh, D)), np.zeros((B, nh, D))
    eta = 4 * U
    for b in range(B):
        lb = min(max(int(lo[b]), 0), slot)
        n = slot - lb + 1
        for h in range(nh):
            K = k[b, layer, h // G].copy()
            V = v[b, layer, h // G].copy()
            K[:, slot], V[slot] = kn[b, h // G], vn[b, h // G]
            K, V = K[:, lb:slot + 1], V[lb:slot + 1]
            s = scale * (q[b, h] @ K)
            if softcap:
                s = softcap * np.tanh(s / softcap)
            m = s.max()
            p = np.exp(s - m)
            p /= p.sum()
            out[b, h] = p @ V
            delta = (scale * gamma(D + 4) * (np.abs(q[b, h]) @ np.abs(K)) + 8 * U * np.abs(s)
                     + U * np.abs(s - m))
            rho = np.exp(2 * delta.max()) * (1 + eta) / (1 - eta) - 1
            bound[b, h] = (rho + (2 * gamma(n) + 2 * U) * (1 + rho)) * (p @ np.abs(V)) + 1e-30
    return out, bound


def _kernel(q, k, v, kn, vn, lo, slot, layer, scale, softcap):
    f = jax.jit(lambda *a: kernels.decode_attention(*a, scale=scale, softcap=softcap))
    return np.asarray(f(q, k, v, kn, vn, jnp.asarray(lo, jnp.int32), slot, layer))


def test_exp_polynomial_within_eta():
    """The η of the bound: the kernel's exp on a dense grid of [-87, 0] (through
    single-slot attention weights: q·k = 0 except one slot, so the output is a known
    function of e^x)."""
    x = np.linspace(-80.0, 0.0, 4001).astype(np.float32)
    # two slots: scores x and 0, values 1 and 0: out = e^x / (1 + e^x)
    B = x.size
    q = np.zeros((B, 1, 8), np.float32)
    q[:, 0, 0] = x
    k = np.zeros((B, 1, 1, 8, 2), np.float32)
    k[:, 0, 0, 0, 0] = 1.0
    v = np.zeros((B, 1, 1, 2, 8), np.float32)
    v[:, 0, 0, 0, :] = 1.0
    kn = np.zeros((B, 1, 8), np.float32)
    got = _kernel(q, k, v, kn, kn, np.zeros(B, np.int32), 1, 0, 1.0, None)[:, 0]
    e = np.exp(x.astype(np.float64))
    ref = e / (1 + e)
    # out = w / (w + 1) with w = e^x (1 + η'): |η'| ≲ |out − ref| / (ref (1 − ref)) − roundings
    rel = np.abs(got - ref) / (ref * (1 - ref))
    assert rel.max() <= 4 * U + 3 * gamma(2) * 2, rel.max() / U


CASES = [  # B, L, nkv, G, D, S, softcap, dtype
    (4, 3, 3, 3, 64, 256, None, "float32"),      # SmolLM2's heads
    (3, 2, 2, 1, 12, 130, None, "float32"),      # G = 1, D not a multiple of 8
    (3, 2, 1, 4, 16, 256, 20.0, "float32"),      # one kv head, soft-capped
    (4, 2, 2, 7, 32, 256, None, "bfloat16"),     # Qwen2.5-style G = 7, bf16 cache
]


@pytest.mark.parametrize("B,L,nkv,G,D,S,softcap,dtype", CASES)
def test_matches_float64(B, L, nkv, G, D, S, softcap, dtype):
    rng = np.random.default_rng(B * 100 + D + S)
    q, k, v, kn, vn = _inputs(rng, B, L, nkv, G, D, S, dtype)
    scale = 1.0 / np.sqrt(D)
    for slot in sorted({0, 127, 128, S - 1}):
        # rows: everything, lo == slot, a random start, a sliding window of 5
        lo = np.array([0, slot, rng.integers(0, slot + 1), max(0, slot - 4)][:B], np.int32)
        for layer in range(L):
            got = _kernel(q, k, v, kn, vn, lo, slot, layer, scale, softcap).reshape(q.shape)
            ref, bound = _reference(q, k, v, kn, vn, lo, slot, layer, scale, softcap)
            err = np.abs(got - ref)
            assert (err <= bound).all(), (slot, layer, (err / bound).max())
            if slot > 0:
                # not trivially within the bound: another layer's result is far off
                other, _ = _reference(q, k, v, kn, vn, lo, slot, (layer + 1) % L, scale,
                                      softcap)
                assert np.abs(other - ref)[0].max() > 100 * bound[0].max()


def _xla(q, k, v, kn, vn, lo, slot, layer, scale, softcap, block):
    """XLA's decode attention as the LM runs it: blocked or over the whole cache."""
    B, nh, D = q.shape
    nkv = k.shape[2]
    knew = kn.reshape(B, nkv, D, 1)
    vnew = vn.reshape(B, nkv, 1, D)
    lo = jnp.asarray(lo, jnp.int32)
    if block is not None:
        return attend_decode_blocked(q[:, None], k, v, lo, slot, block, None, layer=layer,
                                     new_kv=(knew, vnew), scale=scale, softcap=softcap)[:, 0]
    j = jnp.arange(k.shape[-1], dtype=jnp.int32)
    kl = _with_new_slot(k[:, layer], knew, j, slot, 3)
    vl = _with_new_slot(v[:, layer], vnew, j, slot, 2)
    mask = ((j[None, :] >= lo[:, None]) & (j[None, :] <= slot))[:, None, :]
    return attend(q[:, None], kl, vl, mask, None, scale=scale, softcap=softcap)[:, 0]


@pytest.mark.parametrize("block", [128, None])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matches_xla_attention(block, dtype):
    rng = np.random.default_rng(7)
    q, k, v, kn, vn = _inputs(rng, 4, 2, 3, 3, 64, 256, dtype)
    scale, softcap = 0.125, (30.0 if block is None else None)
    f = jax.jit(lambda *a: _xla(*a, scale=scale, softcap=softcap, block=block))
    # XLA's decode attention rounds the weights to the cache dtype before the values'
    # product (bf16: 2^-8 relative); the kernel keeps them in float32
    tol = 2e-5 if dtype == "float32" else 2e-2
    for slot in (0, 127, 128, 255):
        lo = np.array([0, slot, 60 if slot > 60 else 0, max(0, slot - 9)], np.int32)
        got = _kernel(q, k, v, kn, vn, lo, slot, 1, scale, softcap)
        want = np.asarray(f(q, k, v, kn, vn, lo, slot, 1), np.float32)
        np.testing.assert_allclose(got, want, atol=tol, rtol=0)


def test_vmap_and_clamps():
    rng = np.random.default_rng(3)
    A, B = 3, 2
    q, k, v, kn, vn = _inputs(rng, A * B, 3, 2, 2, 16, 40)
    lo = np.array([0, 3, 10, 20, 30, 35], np.int32)
    one = lambda q, k, v, kn, vn, lo, slot, layer: kernels.decode_attention(  # noqa: E731
        q, k, v, kn, vn, lo, slot, layer, scale=0.25)
    r = lambda a: a.reshape((A, B) + a.shape[1:])  # noqa: E731
    flat = np.asarray(jax.jit(one)(q, k, v, kn, vn, lo, 33, 2))
    # rows mapped (folded into one call)
    got = jax.jit(jax.vmap(one, in_axes=(0,) * 6 + (None, None)))(
        r(q), r(k), r(v), r(kn), r(vn), r(lo), 33, 2)
    np.testing.assert_array_equal(np.asarray(got).reshape(flat.shape), flat)
    # the layer index mapped (one call per element) and a cache shared by all
    layers = jnp.asarray([0, 2, 1])
    got = jax.jit(jax.vmap(one, in_axes=(None,) * 7 + (0,)))(q, k, v, kn, vn, lo, 33, layers)
    for i, l in enumerate([0, 2, 1]):
        np.testing.assert_array_equal(np.asarray(got[i]), np.asarray(jax.jit(one)(
            q, k, v, kn, vn, lo, 33, l)))
    # clamps: layer to [0, L), slot to [0, S), lo to [0, slot]
    f = jax.jit(one)
    np.testing.assert_array_equal(np.asarray(f(q, k, v, kn, vn, lo, 33, 9)),
                                  np.asarray(f(q, k, v, kn, vn, lo, 33, 2)))
    np.testing.assert_array_equal(np.asarray(f(q, k, v, kn, vn, lo, 99, 1)),
                                  np.asarray(f(q, k, v, kn, vn, lo, 39, 1)))
    np.testing.assert_array_equal(np.asarray(f(q, k, v, kn, vn, lo + 50, 33, 1)),
                                  np.asarray(f(q, k, v, kn, vn, np.full(6, 33, np.int32), 33, 1)))


def _tiny_lm(arch: str, matmul: str, attn_block):
    from flax import nnx

    from jaxcd.lm.gguf_weights import LlamaConfig
    from jaxcd.lm.llama import JaxLM, LlamaModel

    kw = {}
    if arch == "gemma3":        # sliding layers with their own RoPE base, Gemma's norms
        kw = dict(sliding_window=4, layer_sliding=(True, False, True), rope_local_theta=100.0,
                  qk_norm=True, post_norms=True, norm_offset=1.0, mlp_activation="gelu_tanh",
                  embed_scale=float(np.sqrt(48)), query_scale=0.25, attn_softcap=5.0)
    cfg = LlamaConfig(arch="llama" if arch == "gemma3" else arch, vocab_size=64,
                      hidden_size=48, intermediate_size=80, num_layers=3, num_heads=6,
                      num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_eps=1e-5,
                      context_length=64, tie_embeddings=arch != "qwen2",
                      attention_bias=arch == "qwen2", eos_token_id=1, **kw)
    lm = JaxLM(cfg, matmul=matmul, attn_block=attn_block)
    state = nnx.state(LlamaModel(cfg, rngs=nnx.Rngs(3)))
    rng = np.random.default_rng(4)
    pure = jax.tree.map(lambda a: np.asarray(a) + 0.1 * rng.standard_normal(a.shape)
                        .astype(np.float32), nnx.to_pure_dict(state))
    return lm, lm.params_from_pure_dict(pure)


@pytest.mark.parametrize("arch,attn_block", [("llama", 8), ("qwen2", None), ("gemma3", 8)])
def test_lm_decode_through_the_kernel_matches_xla(arch, attn_block):
    """Prefill then 9 steps (past the window of 4; with attn_block 8 the cache has 24
    slots in 3 blocks), the kernels' LM against the all-XLA LM; and the HLO of the step
    calls the attention kernel once (in the layer scan's body)."""
    from jaxcd.lm.interface import pad_prompts

    lk, params = _tiny_lm(arch, "kernel", attn_block)
    lx, _ = _tiny_lm(arch, "xla", attn_block)
    ids, lens = pad_prompts([[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]], pad_id=0)
    ids, lens = jnp.asarray(ids), jnp.asarray(lens)
    max_len = 6 + 10
    step = {name: jax.jit(lambda p, s, t, lm=lm: lm._step(p, s, t)) for name, lm in
            (("kernel", lk), ("xla", lx))}
    st0 = lk.prefill(params, ids, lens, max_len)[0]
    hlo = step["kernel"].lower(params, st0, jnp.zeros(3, jnp.int32)).as_text()
    assert hlo.count(kernels.ATTN_TARGET) == 1
    assert kernels.ATTN_TARGET not in step["xla"].lower(params, st0,
                                                        jnp.zeros(3, jnp.int32)).as_text()
    outs = {}
    for name, lm in (("kernel", lk), ("xla", lx)):
        state, lp = lm.prefill(params, ids, lens, max_len)
        lps = [lp]
        for t in range(9):
            state, lp = step[name](params, state, jnp.asarray([3 + t, 20 + t, 40 + t], jnp.int32))
            lps.append(lp)
        outs[name] = np.asarray(jnp.stack(lps))
    assert np.isfinite(outs["xla"]).all()
    np.testing.assert_allclose(outs["kernel"], outs["xla"], atol=2e-5, rtol=0)


def test_switch_off():
    """``JaxLM(attention="xla")`` keeps the layer kernels but not this one; it is
    another LM (another jit key) than the default."""
    from jaxcd.lm.llama import JaxLM

    base, params = _tiny_lm("llama", "kernel", None)
    lk = JaxLM(base.config, matmul="kernel", attn_block=None, attention="xla")
    assert lk != base and base.attention_kernel() and not lk.attention_kernel()
    from jaxcd.lm.interface import pad_prompts

    ids, lens = pad_prompts([[5, 6, 7]], pad_id=0)
    st = lk.prefill(params, jnp.asarray(ids), jnp.asarray(lens), 8)[0]
    hlo = jax.jit(lambda p, s, t: lk._step(p, s, t)).lower(
        params, st, jnp.zeros(1, jnp.int32)).as_text()
    assert kernels.ATTN_TARGET not in hlo and kernels.TARGET in hlo


def test_vmapped_lm_step():
    """A decode step vmapped over stacked states (as particle systems do) equals the
    step of each state."""
    from jaxcd.lm.interface import pad_prompts

    lk, params = _tiny_lm("llama", "kernel", 8)
    ids, lens = pad_prompts([[5, 6, 7, 8], [11, 12]], pad_id=0)
    s0 = lk.prefill(params, jnp.asarray(ids), jnp.asarray(lens), 12)[0]
    s1 = lk.step(params, s0, jnp.asarray([3, 4], jnp.int32))[0]
    s1 = dict(s1, slot=s0["slot"])          # another cache content at the same slot
    states = jax.tree.map(lambda a, b: jnp.stack([a, b]), s0, s1)
    toks = jnp.asarray([[9, 10], [30, 31]], jnp.int32)
    step = jax.jit(lambda s, t: lk._step(params, s, t))
    assert kernels.ATTN_TARGET in jax.jit(jax.vmap(step)).lower(states, toks).as_text()
    got = jax.jit(jax.vmap(step))(states, toks)[1]
    for i, s in enumerate((s0, s1)):
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(step(s, toks[i])[1]),
                                   atol=1e-6, rtol=0)
