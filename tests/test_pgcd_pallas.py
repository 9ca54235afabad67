"""P-GCD's Pallas scoring kernel (:mod:`jaxcd.decoding.pgcd_pallas`), run in Pallas's
interpreter on the CPU, against independent references:

* brute-force enumeration (``test_pgcd_exact.Reference``: every token sequence, Python's
  ``re``, float64);
* the XLA path (``batched_scores(path="xla")``: one ``[K·(1+D'), H] @ [H, V]`` matmul per
  step) on an automaton with out-degree 46 whose edges partly lead to states with
  ``β^P = 0``, with and without the per-state edge index;
* the selection: ``path="auto"`` takes the kernel for tables built on a GPU/TPU platform
  (``PGCDTables.pallas``), ``kernel="xla"`` keeps the XLA path;
* ``smc.run`` through the kernel against ``smc.run`` through the XLA path.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcd import compile_regex
from jaxcd.decoding import pgcd
from jaxcd.decoding import pgcd_pallas

from test_pgcd_exact import CASES, VOCAB, Reference, prefixes, random_hmm
from test_pgcd_kernel import (WIDE, WIDE_PATTERN, _dirichlet_hmm, _f32, _states,
                              assert_scores_equal_enumeration)

_pallas = jax.jit(lambda fa, t, s: pgcd.batched_scores(fa, t, s, path="pallas"))
_xla = jax.jit(lambda fa, t, s: pgcd.batched_scores(fa, t, s, path="xla"))
_batched = jax.jit(pgcd.batched_scores, static_argnames=("path",))
_one = jax.jit(pgcd.scores, static_argnames=("path",))


@pytest.mark.parametrize("pattern,n,H", CASES)
def test_pallas_scores_equal_enumeration(pattern, n, H):
    hmm64 = random_hmm(H, seed=len(pattern) * 7 + n, zeros=True)
    hmm = _f32(hmm64)
    fa = compile_regex(pattern, VOCAB)
    ref = Reference(pattern, n, hmm64)
    tables = pgcd.backward(fa, hmm, n)
    ps = prefixes(fa, n)
    logpsi, logz, lprod = (np.asarray(x) for x in _pallas(fa, tables, _states(fa, hmm, ps)))
    assert_scores_equal_enumeration(ref, ps, logpsi, logz, lprod)


@pytest.mark.parametrize("with_index", [True, False])
def test_pallas_equals_xla_path_at_out_degree_46(with_index):
    fa = compile_regex(WIDE_PATTERN, WIDE)
    assert np.diff(np.asarray(fa.out_start)).max() > 32
    rng = np.random.default_rng(5)
    hmm = _dirichlet_hmm(rng, 24, fa.vocab_size)
    tables = pgcd.backward(fa, hmm, 4)
    if with_index:
        tables = tables._replace(edge_index=pgcd.edge_index(fa))
    else:
        tables = tables._replace(edge_index=None)
    seqs = [(), (1,), (1, 2), (10,), (40,), (47,)]
    sts = _states(fa, hmm, seqs)
    got = [np.asarray(x) for x in _pallas(fa, tables, sts)]
    want = [np.asarray(x) for x in _xla(fa, tables, sts)]
    live = 0
    for g, w in zip(got, want):
        assert np.array_equal(np.isfinite(g), np.isfinite(w))
        f = np.isfinite(w)
        live += int(f.sum())
        np.testing.assert_allclose(g[f], w[f], rtol=2e-5, atol=2e-5)
    assert live > 20


def test_leading_axes_and_single_particle():
    """``batched_scores`` with two leading axes and ``scores`` of one particle take the
    kernel too, and agree with the XLA path (on the flattened particles)."""
    pattern, n, H = CASES[0]
    hmm = _f32(random_hmm(H, seed=1))
    fa = compile_regex(pattern, VOCAB)
    tables = pgcd.backward(fa, hmm, n)
    sts = _states(fa, hmm, [(), (1,), (2,), (3,)])
    sts2 = jax.tree.map(lambda x: x.reshape((2, 2) + x.shape[1:]), sts)
    got = _batched(fa, tables, sts2, path="pallas")
    want = _batched(fa, tables, sts, path="xla")      # the XLA path takes one axis
    for g, w in zip(got, want):
        assert g.shape == (2, 2) + w.shape[1:]
        g = g.reshape(w.shape)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-6)
    one = jax.tree.map(lambda x: x[1], sts)
    g1 = _one(fa, tables, one, path="pallas")
    w1 = _one(fa, tables, one, path="xla")
    for g, w in zip(g1, w1):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-6)


def _interpreted(monkeypatch, calls):
    """Make the kernel run in Pallas's interpreter whatever it is asked (this is the CPU)
    and count its calls."""
    real = pgcd_pallas.pallas_scores

    def fake(*a, **k):
        calls.append(k.get("interpret"))
        return real(*a, **{**k, "interpret": True})

    monkeypatch.setattr(pgcd_pallas, "pallas_scores", fake)


def test_auto_selects_pallas_for_tables_built_on_accelerators(monkeypatch):
    assert pgcd_pallas.default_path("gpu") == "pallas"
    assert pgcd_pallas.default_path("tpu") == "pallas"
    assert pgcd_pallas.default_path("cpu") == "xla"
    assert pgcd_pallas.use_pallas(jnp.bfloat16, "gpu")
    assert not pgcd_pallas.use_pallas(jnp.float64, "gpu")
    assert not pgcd_pallas.use_pallas(jnp.float32, "cpu")
    pattern, n, H = CASES[1]
    hmm = _f32(random_hmm(H, seed=2))
    fa = compile_regex(pattern, VOCAB)
    tables = pgcd.backward(fa, hmm, n)
    assert not tables.pallas                                # built on the CPU platform
    sts = _states(fa, hmm, [(), (1,)])
    assert not pgcd._pallas_ok(tables, sts, "auto")
    assert pgcd._pallas_ok(tables, sts, "pallas") and not pgcd._pallas_ok(tables, sts, "xla")
    # backward on a GPU platform records the kernel: path="auto" then takes it, compiled
    monkeypatch.setattr(pgcd_pallas, "default_path", lambda platform=None: "pallas")
    gpu_tables = pgcd.backward(fa, hmm, n, kernel="auto")
    if gpu_tables.kernel:                    # this CPU has the native kernel: that wins
        gpu_tables = gpu_tables._replace(kernel=False, edge_index=None)
        gpu_tables = gpu_tables._replace(pallas=True)
    assert gpu_tables.pallas
    assert not pgcd.backward(fa, hmm, n, kernel="xla").pallas     # the explicit fallback
    calls = []
    _interpreted(monkeypatch, calls)
    got = jax.jit(lambda f, t, s: pgcd.batched_scores(f, t, s, path="auto"))(
        fa, gpu_tables, sts)
    assert calls == [False], calls          # taken, and asked to run compiled
    want = _batched(fa, tables, sts, path="xla")
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=2e-5, atol=1e-6)
    with pytest.raises(ValueError):
        _batched(fa, tables, sts, path="triton")


def test_kernel_block_padding():
    """A vocabulary that is not a multiple of the block, an out-degree that is not a
    power of two, several block and chunk sizes: the same result as a dense host
    computation of the contract."""
    rng = np.random.default_rng(0)
    K, D, H, V = 3, 5, 16, 300
    Bt = jnp.asarray(rng.random((V, H)), jnp.float32)
    W = jnp.asarray(rng.random((K, D, H)), jnp.float32)
    d = rng.integers(-1, D, (K, V)).astype(np.int32)
    ls = rng.normal(size=(K, D)).astype(np.float32)
    ls[0, 2] = -np.inf
    u = jnp.asarray(rng.random((K, H)), jnp.float32)
    num_w = np.full((K, V), -np.inf)
    for k in range(K):
        for v in range(V):
            if d[k, v] >= 0 and np.isfinite(ls[k, d[k, v]]):
                num_w[k, v] = np.log(np.asarray(W)[k, d[k, v]] @ np.asarray(Bt)[v]) + ls[k, d[k, v]]
    den_w = np.log(np.asarray(u) @ np.asarray(Bt).T)
    for bv, bh in ((128, 128), (64, 8), (512, 4)):
        num, den = pgcd_pallas.log_num_den(Bt, W, jnp.asarray(d), jnp.asarray(ls), u,
                                           block_v=bv, block_h=bh, interpret=True)
        assert np.array_equal(np.isfinite(np.asarray(num)), np.isfinite(num_w))
        f = np.isfinite(num_w)
        np.testing.assert_allclose(np.asarray(num)[f], num_w[f], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(den), den_w, rtol=1e-5, atol=1e-5)


def test_smc_lookahead_through_the_kernel(monkeypatch):
    """``smc.run`` with tables built for the kernel (as on a GPU) takes it through
    ``path="auto"`` and draws what it draws with the XLA path: the same tokens and the
    same log-weights up to float rounding."""
    from jaxcd.decoding import smc
    from test_smc import N, PATTERN, VOCAB as SVOCAB, make_lm

    lm = make_lm()
    fa = compile_regex(PATTERN, SVOCAB)
    rng = np.random.default_rng(7)
    hmm = _dirichlet_hmm(rng, 8, fa.vocab_size)
    ids, lens = jnp.zeros((6, 1), jnp.int32), jnp.ones((6,), jnp.int32)
    xla_tables = pgcd.backward(fa, hmm, N, kernel="xla")
    assert not xla_tables.kernel and not xla_tables.pallas

    def run(ptables):
        return smc.run(jax.random.key(3), lm, lm.params, ids, lens, fa, budget=N,
                       num_particles=4, proposal="lookahead", hmm=hmm, ptables=ptables)

    ref = run(xla_tables)
    calls = []
    _interpreted(monkeypatch, calls)
    got = run(xla_tables._replace(pallas=True))
    assert calls and not any(calls)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
    w, w0 = np.asarray(got.log_weights), np.asarray(ref.log_weights)
    assert np.array_equal(np.isfinite(w), np.isfinite(w0))
    f = np.isfinite(w0)
    assert f.any()
    np.testing.assert_allclose(w[f], w0[f], rtol=1e-4, atol=1e-4)
