"""The LM's in-place layer matmul (``jaxcd/lm/kernels/layer_matmul.cc``) against
independent references:

* float64 numpy products, with the tolerance of recursive float32 summation,
  ``|fl(Σ_k x_k w_k) − Σ_k x_k w_k| ≤ γ_K Σ_k |x_k w_k|``, ``γ_K = K u / (1 − K u)``,
  ``u = 2⁻²⁴`` (Higham, Accuracy and Stability, §3.1; an FMA only rounds less);
* bfloat16 weights against the same float64 product of the bf16-rounded weights;
* the row-independence it documents (a row's bits do not depend on the other rows);
* a random tiny Llama/Qwen2 whose decode through the kernel matches XLA's copying scan.

Skipped where the kernel cannot be built (no C++ compiler).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jaxcd.lm import kernels
from jaxcd.native_build import NativeKernel

from native import skip_reason  # noqa: E402

# skipped only where no kernel can exist (no C++ compiler, not the CPU); a kernel that
# fails to build with a compiler present fails here and in test_native_kernels.py
pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@pytest.fixture(autouse=True, scope="module")
def _kernel_built():
    """Build and register the kernel (a build failure fails every test here)."""
    assert kernels.lm_kernel_available(), kernels.build_error()

U32 = 2.0 ** -24


def _bound(x64, w64):
    K = x64.shape[-1]
    gamma = K * U32 / (1 - K * U32)
    return gamma * (np.abs(x64) @ np.abs(w64)) + 1e-30


@pytest.mark.parametrize("M,K,N", [(1, 3, 16), (7, 577, 40), (13, 300, 7), (16, 513, 160)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matches_float64(M, K, N, dtype):
    rng = np.random.default_rng(M * 1000 + K + N)
    L = 3
    w = jnp.asarray(rng.standard_normal((L, K, N), np.float32), dtype)
    x = jnp.asarray(rng.standard_normal((M, K), np.float32))
    f = jax.jit(lambda x, w, l: kernels.layer_matmul(x, w, l, use_kernel=True))
    assert kernels.TARGET in f.lower(x, w, 1).as_text()
    for l in range(L):
        got = np.asarray(f(x, w, l), np.float64)
        w64 = np.asarray(w[l].astype(jnp.float32), np.float64)
        ref = np.asarray(x, np.float64) @ w64
        err = np.abs(got - ref)
        assert (err <= _bound(np.asarray(x, np.float64), w64)).all(), err.max()
        # not trivially within the bound: another layer's weights are far off
        other = np.asarray(x, np.float64) @ np.asarray(w[(l + 1) % L].astype(jnp.float32),
                                                        np.float64)
        assert np.abs(other - ref).max() > 100 * _bound(np.asarray(x, np.float64), w64).max()


@pytest.mark.parametrize("M,K,N", [(1, 5, 3), (4, 576, 517), (16, 130, 260)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_matmul_matches_float64(M, K, N, dtype):
    """The tied output projection ``x · Eᵀ`` (E ``[N, K]``), with the bound of a sum
    split into 8 lanes (each ≤ ⌈K/8⌉ + the tail terms, then 3 levels of pairwise adds:
    γ_{⌈K/8⌉+K%8+3} is within γ_K)."""
    rng = np.random.default_rng(M + K + N)
    e = jnp.asarray(rng.standard_normal((N, K), np.float32), dtype)
    x = jnp.asarray(rng.standard_normal((2, M, K), np.float32))
    f = jax.jit(lambda x: kernels.rows_matmul(x, e, use_kernel=True))
    assert kernels.ROWS_TARGET in f.lower(x).as_text()
    got = np.asarray(f(x), np.float64)
    e64 = np.asarray(e.astype(jnp.float32), np.float64)
    x64 = np.asarray(x, np.float64)
    err = np.abs(got - x64 @ e64.T)
    assert (err <= _bound(x64, e64.T)).all(), err.max()
    np.testing.assert_array_equal(np.asarray(f(x[:, :1])), got[:, :1].astype(np.float32))


def test_several_weights_in_one_call_equal_separate_calls():
    """q/k/v-style calls (one x, one layer, weights of different widths and dtypes, a
    ragged one among them) give each weight's product bit for bit as its own call."""
    rng = np.random.default_rng(5)
    ws = [jnp.asarray(rng.standard_normal((3, 96, n), np.float32), d)
          for n, d in ((64, "float32"), (40, "bfloat16"), (7, "float32"))]
    x = jnp.asarray(rng.standard_normal((9, 96), np.float32))
    f = jax.jit(lambda x, l: kernels.layer_matmuls(x, ws, l, use_kernel=True))
    assert f.lower(x, 2).as_text().count(kernels.TARGET) == 1
    one = jax.jit(lambda x, w, l: kernels.layer_matmul(x, w, l, use_kernel=True))
    for y, w in zip(f(x, 2), ws):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(one(x, w, 2)))


def test_layer_index_clamps_like_a_dynamic_slice():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((4, 32, 32), np.float32))
    x = jnp.asarray(rng.standard_normal((2, 32), np.float32))
    f = jax.jit(lambda l: kernels.layer_matmul(x, w, l, use_kernel=True))
    np.testing.assert_array_equal(np.asarray(f(7)), np.asarray(f(3)))
    np.testing.assert_array_equal(np.asarray(f(-2)), np.asarray(f(0)))


def test_rows_do_not_depend_on_the_batch():
    """Each row's sum runs in k order in float32 whatever M and the tiling: a row alone
    gives the same bits as inside 16 rows (so batching decodes changes nothing)."""
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((2, 576, 400), np.float32))
    x = jnp.asarray(rng.standard_normal((16, 576), np.float32))
    f = jax.jit(lambda x: kernels.layer_matmul(x, w, 1, use_kernel=True))
    full = np.asarray(f(x))
    for r in (0, 5, 6, 11, 15):
        np.testing.assert_array_equal(np.asarray(f(x[r:r + 1]))[0], full[r])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_few_rows_kernel_matches_float64_and_the_packed_kernel(dtype):
    """2..16 rows go through the transposed kernel (x's rows in the vector lanes, W read
    where it lies, the next block prefetched): within the float64 bound, and bit for bit
    the packed kernel's result (``scheme="o"``), whose k order it
    keeps; widths that leave every pass remainder (6/12 columns a pass), a ragged tail,
    K not a multiple of the 128-row block. The output projection's prefetching (M >= 2)
    likewise changes no bit."""
    rng = np.random.default_rng(11)
    for K, N, Ms in ((576, 576, (9, 16)), (300, 200, (2, 5)), (257, 23, (8, 13))):
        w = jnp.asarray(rng.standard_normal((2, K, N), np.float32), dtype)
        e = jnp.asarray(rng.standard_normal((N * 5 + 3, K), np.float32), dtype)
        f, g = {}, {}
        for s in ("auto", "o", "r"):
            f[s] = jax.jit(lambda x, w, s=s: kernels.layer_matmul(x, w, 1, use_kernel=True,
                                                                   scheme=s))
            g[s] = jax.jit(lambda x, e, s=s: kernels.rows_matmul(x, e, use_kernel=True,
                                                                  scheme=s))
        w64 = np.asarray(w[1].astype(jnp.float32), np.float64)
        for M in Ms:
            x = jnp.asarray(rng.standard_normal((M, K), np.float32))
            got, got_e = np.asarray(f["auto"](x, w)), np.asarray(g["auto"](x, e))
            x64 = np.asarray(x, np.float64)
            assert (np.abs(got - x64 @ w64) <= _bound(x64, w64)).all()
            np.testing.assert_array_equal(got, np.asarray(f["o"](x, w)))
            np.testing.assert_array_equal(got_e, np.asarray(g["o"](x, e)))
            np.testing.assert_array_equal(got, np.asarray(f["r"](x, w)))
            np.testing.assert_array_equal(np.asarray(f["auto"](x[-1:], w))[0], got[-1])
    with pytest.raises(ValueError, match="scheme"):
        kernels.layer_matmul(x, w, 1, use_kernel=True, scheme="fast")


def test_vmap_and_scan():
    """Under vmap (rows folded into one call) and inside a scan over layers (the LM's
    use): equal to the unbatched calls."""
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.standard_normal((5, 40, 24), np.float32))
    xs = jnp.asarray(rng.standard_normal((3, 2, 40), np.float32))
    mm = lambda x, l: kernels.layer_matmul(x, w, l, use_kernel=True)   # noqa: E731
    got = np.asarray(jax.jit(jax.vmap(lambda x: mm(x, 2)))(xs))
    for i in range(3):
        np.testing.assert_array_equal(got[i], np.asarray(jax.jit(mm)(xs[i], 2)))
    ls = jnp.arange(5, dtype=jnp.int32)
    got = np.asarray(jax.jit(lambda: jax.lax.scan(lambda c, l: (c, mm(xs[0], l)), 0, ls)[1])())
    for l in range(5):
        np.testing.assert_array_equal(got[l], np.asarray(jax.jit(mm)(xs[0], l)))
    # a batched layer index takes the per-element path
    got = np.asarray(jax.jit(jax.vmap(mm))(xs, jnp.asarray([0, 3, 4])))
    for i, l in enumerate([0, 3, 4]):
        np.testing.assert_array_equal(got[i], np.asarray(jax.jit(mm)(xs[i], l)))


def _tiny_lm(arch: str, matmul: str):
    from jaxcd.lm.gguf_weights import LlamaConfig
    from jaxcd.lm.llama import JaxLM
    from flax import nnx

    cfg = LlamaConfig(arch=arch, vocab_size=64, hidden_size=48, intermediate_size=80,
                      num_layers=3, num_heads=4, num_kv_heads=2, head_dim=12,
                      rope_theta=10000.0, rms_eps=1e-5, context_length=64,
                      tie_embeddings=arch == "llama", attention_bias=arch == "qwen2",
                      eos_token_id=1)
    lm = JaxLM(cfg, matmul=matmul)
    from jaxcd.lm.llama import LlamaModel

    model = LlamaModel(cfg, rngs=nnx.Rngs(3))
    state = nnx.state(model)
    # random biases (nnx initialises them to zero, which would not test their slicing)
    rng = np.random.default_rng(4)
    pure = jax.tree.map(lambda a: np.asarray(a) + 0.1 * rng.standard_normal(a.shape)
                        .astype(np.float32), nnx.to_pure_dict(state))
    return lm, lm.params_from_pure_dict(pure)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lm_decode_through_the_kernel_matches_the_copying_scan(arch):
    from jaxcd.lm.interface import pad_prompts
    from jaxcd.lm.llama import step_donated

    lk, params = _tiny_lm(arch, "kernel")
    lx, _ = _tiny_lm(arch, "xla")
    assert lk.in_place_matmul() and not lx.in_place_matmul()
    ids, lens = pad_prompts([[5, 6, 7, 8, 9], [10, 11]], pad_id=0)
    ids, lens = jnp.asarray(ids), jnp.asarray(lens)
    hlo = jax.jit(lambda p, s, t: lk._step(p, s, t)).lower(
        params, lk.prefill(params, ids, lens, 12)[0], jnp.zeros(2, jnp.int32)).as_text()
    # q/k/v in one call, o, gate/up in one call, down; the output projection: the tied
    # embedding row by row (llama), an untied head as a one-layer stack (qwen2)
    assert hlo.count(kernels.TARGET) == (4 if arch == "llama" else 5)
    assert hlo.count(kernels.ROWS_TARGET) == (1 if arch == "llama" else 0)
    outs = {}
    for name, lm in (("kernel", lk), ("xla", lx)):
        state, lp = lm.prefill(params, ids, lens, 12)
        lps = [lp]
        for t in range(5):
            state, lp = step_donated(lm, params, state, jnp.asarray([3 + t, 20 + t], jnp.int32))
            lps.append(lp)
        outs[name] = np.asarray(jnp.stack(lps))
    assert np.isfinite(outs["xla"]).all()
    np.testing.assert_allclose(outs["kernel"], outs["xla"], atol=2e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(lk.logprobs_all(params, ids, lens)),
                               np.asarray(lx.logprobs_all(params, ids, lens)), atol=2e-5, rtol=0)


def test_mode_and_errors(monkeypatch, tmp_path):
    """The LM's fields decide (the environment does not): ``matmul="xla"`` never takes
    the kernel, ``"auto"`` takes it on the CPU platform only, and the platform is part of
    the LM's identity (its jit key)."""
    from jaxcd.lm.llama import JaxLM

    lm, _ = _tiny_lm("llama", "auto")
    assert lm.in_place_matmul() and lm.attention_kernel()
    monkeypatch.setenv("JAXCD_LM_KERNEL", "xla")           # not a switch: nothing changes
    assert lm.in_place_matmul()
    lx, _ = _tiny_lm("llama", "xla")
    assert not lx.in_place_matmul() and not lx.attention_kernel()
    on_gpu = JaxLM(lm.config, platform="gpu")
    assert not on_gpu.in_place_matmul() and on_gpu != lm and JaxLM(lm.config) == lm
    with pytest.raises(kernels.KernelUnavailable, match="CPU-only"):
        JaxLM(lm.config, matmul="kernel", platform="gpu").in_place_matmul()
    with pytest.raises(kernels.KernelUnavailable, match="in-place"):
        JaxLM(lm.config, matmul="xla", attention="kernel").attention_kernel()
    with pytest.raises(ValueError, match="matmul"):
        _tiny_lm("llama", "fast")
    with pytest.raises(ValueError, match="attention"):
        JaxLM(lm.config, attention="fast")
    with pytest.raises(ValueError, match=r"\[L, K, N\]"):
        kernels.layer_matmul(jnp.ones((2, 3)), jnp.ones((3, 4)), 0)
    # without a compiler: one warning naming the reason, then unavailable
    monkeypatch.setenv("CXX", "jaxcd-no-such-compiler")
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path))
    k = NativeKernel(Path(kernels.__file__).with_name("layer_matmul.cc"), "JaxcdLayerMatmul",
                     "jaxcd_test_unbuilt", "fallback used")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert not k.available() and not k.available()
    msgs = [str(m.message) for m in w]
    assert len(msgs) == 1 and "no C++ compiler" in msgs[0] and "fallback used" in msgs[0]
