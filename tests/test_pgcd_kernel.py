"""P-GCD's native scoring kernel (``jaxcd/decoding/kernels/pgcd_scores.cc``) against
independent references:

* brute-force enumeration in float64 (``test_pgcd_exact.Reference``: every token
  sequence, Python's ``re``), for the float32 kernel;
* a host-side product over ``δ`` (``fa.next_state``, one token at a time, dense float64
  ``β^P``) on an automaton whose states have up to 46 out-edges, several of them
  leading to states with ``β^P = 0``;
* the bfloat16 error bound derived below, against the same tables in float32.

Skipped where the kernel cannot be built (no C++ compiler); the fallback itself is
tested in a subprocess with the compiler hidden.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcd import Vocabulary, compile_regex

from jaxcd.decoding import pgcd
from jaxcd.decoding import kernels
from jaxcd.errors import JaxcdError
from jaxcd.hmm import HMMParams

from test_pgcd_exact import CASES, VOCAB, Reference, prefixes, random_hmm

from native import skip_reason  # noqa: E402

# skipped only where no kernel can exist (no C++ compiler, not the CPU); a kernel that
# fails to build with a compiler present fails here and in test_native_kernels.py
pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@pytest.fixture(autouse=True, scope="module")
def _kernel_built():
    """Build and register the kernel (a build failure fails every test here)."""
    assert kernels.pgcd_kernel_available(), kernels.build_error()

_kernel = jax.jit(lambda fa, t, s: pgcd.batched_scores(fa, t, s, path="kernel"))
_xla = jax.jit(lambda fa, t, s: pgcd.batched_scores(fa, t, s, path="xla"))
_advance = jax.jit(pgcd.advance)


def _f32(hmm):
    return HMMParams(*(jnp.asarray(np.asarray(a), jnp.float32) for a in hmm))


def _dirichlet_hmm(rng, H, V):
    """A float32 HMM with Dirichlet rows (emissions with concentration 0.5)."""
    return HMMParams(jnp.asarray(rng.dirichlet(np.ones(H)), jnp.float32),
                     jnp.asarray(rng.dirichlet(np.ones(H), size=H), jnp.float32),
                     jnp.asarray(rng.dirichlet(np.ones(V) * 0.5, size=H), jnp.float32))


def _states(fa, hmm, seqs):
    out = []
    for p in seqs:
        st = pgcd.init_state(fa, hmm)
        for v in p:
            st = _advance(fa, hmm, st, jnp.int32(v))
        out.append(st)
    return jax.tree.map(lambda *x: jnp.stack(x), *out)


# H a multiple of 16 (and out-degree ≤ 64) takes the kernel's AVX-512 path where the CPU
# has AVX-512 (tokens in the vector lanes, the edge weights looked up in registers);
# other H the 8-lane path. Both are checked against the same references.
_CASES16 = [(p, n, 16) for p, n, _ in CASES[:2]] + [(CASES[2][0], CASES[2][1], 48)]


def assert_scores_equal_enumeration(ref, ps, logpsi, logz, lprod):
    """Scores of the prefixes ``ps`` (``log ψ(x v) [P, V]``, ``log ψ(x) [P]``,
    ``log p_prod [P, V]``) against float64 enumeration: relative 1e-4 where ψ > 0,
    exactly −inf where it is 0, ``p_prod`` normalised."""
    for i, p in enumerate(ps):
        want = ref.token_psi(p)
        pos = np.nan_to_num(want) > 0
        assert np.all(logpsi[i][~pos] == -np.inf), p
        np.testing.assert_allclose(np.exp(logpsi[i][pos]), want[pos], rtol=1e-4)
        psi_p = ref.psi(p)
        if np.nan_to_num(psi_p) > 0:
            np.testing.assert_allclose(np.exp(logz[i]), psi_p, rtol=1e-4)
            assert abs(np.exp(lprod[i]).sum() - 1) < 1e-4
        else:
            assert logz[i] == -np.inf and np.all(lprod[i] == -np.inf)


@pytest.mark.parametrize("pattern,n,H", CASES + _CASES16)
@pytest.mark.parametrize("zeros", [False, True])
def test_float32_kernel_equals_enumeration(pattern, n, H, zeros):
    """ψ(x·v) for every reachable prefix x and token v, float32 kernel vs float64
    enumeration: relative 1e-4 where ψ > 0, and exactly −inf where ψ = 0 or the HMM
    gives the token probability 0."""
    hmm64 = random_hmm(H, seed=len(pattern) * 7 + n, zeros=zeros)
    hmm = _f32(hmm64)
    fa = compile_regex(pattern, VOCAB)
    ref = Reference(pattern, n, hmm64)
    tables = pgcd.backward(fa, hmm, n)
    ps = prefixes(fa, n)
    logpsi, logz, lprod = (np.asarray(x) for x in _kernel(fa, tables, _states(fa, hmm, ps)))
    assert_scores_equal_enumeration(ref, ps, logpsi, logz, lprod)


# an automaton of large out-degree: tokens a, aa, …, a^45, b, c, EOS; "a{40,44}c?" (a run
# of a's is one state per length, so the start state has 45 out-edges by token length),
# and with a short budget many of those edges lead to states that cannot finish: β^P = 0.
_A = [b"a" * k for k in range(1, 46)]
WIDE = Vocabulary.from_token_bytes([b"<eos>"] + _A + [b"b", b"c"], eos_id=0)
WIDE_PATTERN = "a{40,44}c?"


def _host_scores(fa, hmm, beta, st, n):
    """log ψ(x·v) from δ on the host: num(v) = Σ_h u B[h, v] β_{t+1}(h, δ(s, v))."""
    A_, B = (np.asarray(a, np.float64) for a in (hmm.A, hmm.B))
    del A_
    s, t = int(st.cs.state), int(st.cs.t)
    u = np.asarray(st.u, np.float64)
    out = np.full(B.shape[1], -np.inf)
    for v in range(B.shape[1]):
        d = fa.next_state(s, v)
        if d == fa.dead_state or t >= n:
            continue
        num = float(u @ (B[:, v] * beta[min(t + 1, n), d]))
        den = float(u @ B[:, v])
        if num > 0 and den > 0:
            out[v] = np.log(num) - np.log(den)
    return out


@pytest.mark.parametrize("H", [8, 16, 48])
def test_wide_out_degree_and_dead_successors(H):
    """Budgets 3 and 4 through one table length (``steps=4``: the programs compile once).
    Out-degree 46: on the AVX-512 path (H = 16, 48) tokens on edges ≥ 32 need the second
    pair of weight tables."""
    fa = compile_regex(WIDE_PATTERN, WIDE)
    deg = np.diff(np.asarray(fa.out_start))
    assert deg.max() > 32                                 # above any one-word shortcut
    assert (np.asarray(pgcd.edge_index(fa)) >= 32).any()
    rng = np.random.default_rng(3)
    V = fa.vocab_size
    hmm = _dirichlet_hmm(rng, H, V)
    for n in (3, 4):
        tables = pgcd.backward(fa, hmm, n, max_steps=4)
        with jax.enable_x64(True):
            hmm64 = HMMParams(*(jnp.asarray(np.asarray(a), jnp.float64) for a in hmm))
            beta = np.asarray(pgcd.backward(fa, hmm64, n, max_steps=4).beta())
        seqs = [(), (1,), (20,), (39,), (40,), (43,), (44,), (30, 9), (1, 1), (10, 10)]
        seqs = [p for p in seqs if len(p) < n - 1]
        seqs = (seqs * 2)[:10]               # one batch shape for both budgets: one compile
        sts = _states(fa, hmm, seqs)
        got = np.asarray(_kernel(fa, tables, sts)[0])
        xla = np.asarray(_xla(fa, tables, sts)[0])
        dead_succ = 0
        for i, p in enumerate(seqs):
            st = jax.tree.map(lambda x: x[i], sts)
            want = _host_scores(fa, hmm, beta, st, n)
            fin = np.isfinite(want)
            np.testing.assert_array_equal(np.isfinite(got[i]), fin)
            np.testing.assert_array_equal(np.isfinite(xla[i]), fin)
            np.testing.assert_allclose(got[i][fin], want[fin], rtol=0, atol=2e-5)
            np.testing.assert_allclose(xla[i][fin], want[fin], rtol=0, atol=2e-5)
            s = int(st.cs.state)
            dead_succ += sum(1 for v in range(V)
                             if fa.next_state(s, v) != fa.dead_state and not fin[v])
        assert dead_succ > 0                 # allowed by the automaton, β^P = 0 within n


# out-degree 81: past 64 the AVX-512 path gathers the weights of passes with edges ≥ 64
_A80 = [b"a" * k for k in range(1, 81)]
WIDE80 = Vocabulary.from_token_bytes([b"<eos>"] + _A80 + [b"b", b"c"], eos_id=0)


@pytest.mark.parametrize("H,dtype", [(16, jnp.float32), (32, jnp.float32), (8, jnp.float32),
                                     (16, jnp.bfloat16)])
def test_out_degree_above_64(H, dtype):
    """Out-degree 81 (edges 0..80): the kernel against the host product over δ (float32),
    and bfloat16 tables within the bound of ``test_bfloat16_error_bound``."""
    fa = compile_regex("a{70,79}c?", WIDE80)
    deg = np.diff(np.asarray(fa.out_start))
    assert deg.max() > 64 and (np.asarray(pgcd.edge_index(fa)) >= 64).any()
    rng = np.random.default_rng(5)
    V = fa.vocab_size
    hmm = _dirichlet_hmm(rng, H, V)
    n = 3
    tables = pgcd.backward(fa, hmm, n, max_steps=4, table_dtype=dtype)
    with jax.enable_x64(True):
        hmm64 = HMMParams(*(jnp.asarray(np.asarray(a), jnp.float64) for a in hmm))
        beta = np.asarray(pgcd.backward(fa, hmm64, n, max_steps=4).beta())
    seqs = [(), (1,), (40,), (69,), (70,), (79,)]
    sts = _states(fa, hmm, seqs)
    got = np.asarray(_kernel(fa, tables, sts)[0])
    atol = 2e-5 if dtype == jnp.float32 else -3 * np.log1p(-2.0 ** -9) + 1e-5
    n_fin = 0
    for i, p in enumerate(seqs):
        st = jax.tree.map(lambda x: x[i], sts)
        want = _host_scores(fa, hmm, beta, st, n)
        fin = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got[i]), fin)
        np.testing.assert_allclose(got[i][fin], want[fin], rtol=0, atol=atol)
        n_fin += fin.sum()
    assert n_fin > 20


def test_bfloat16_error_bound():
    """With ``table_dtype=bfloat16``, ``B`` and the ``β^P`` mantissas are float32 values
    rounded to nearest bfloat16: relative error ≤ u = 2⁻⁹ each. Every term of ``num(v) =
    Σ_h u_h B[h,v] β[h]`` is nonnegative, so ``num`` is off by a factor in
    ``[(1−u)², (1+u)²]`` and ``den`` in ``[1−u, 1+u]``: ``|Δ log ψ| ≤ −3·log(1−u)``
    (≈ 0.00587), plus float32 accumulation (≤ H·2⁻²⁴ relative, here < 1e-5)."""
    fa = compile_regex(WIDE_PATTERN, WIDE)
    rng = np.random.default_rng(0)
    H = 32
    V = fa.vocab_size
    hmm = _dirichlet_hmm(rng, H, V)
    n = 6
    t32 = pgcd.backward(fa, hmm, n)
    t16 = pgcd.backward(fa, hmm, n, table_dtype=jnp.bfloat16)
    assert t16.Bt.dtype == jnp.bfloat16 and t16.mant.dtype == jnp.bfloat16
    seqs = [(), (1,), (20,), (39,), (30, 9), (10, 10, 10)]
    sts = _states(fa, hmm, seqs)
    a = np.asarray(_kernel(fa, t32, sts)[0])
    b = np.asarray(_kernel(fa, t16, sts)[0])
    fin = np.isfinite(a)
    assert fin.sum() > 20
    np.testing.assert_array_equal(fin, np.isfinite(b))
    u = 2.0 ** -9
    bound = -3 * np.log1p(-u) + 1e-5
    err = np.abs(a[fin] - b[fin]).max()
    assert err <= bound, (err, bound)
    assert err > 1e-4                      # the bfloat16 path really rounds


def test_vmap_of_single_particle_scores_uses_one_kernel_call():
    """``pgcd.scores`` vmapped over particles (vmap's expand_dims rule) equals the batched
    call, and the single-particle API agrees with it."""
    pattern, n, H = CASES[3]
    hmm = _f32(random_hmm(H, seed=5))
    fa = compile_regex(pattern, VOCAB)
    tables = pgcd.backward(fa, hmm, n)
    sts = _states(fa, hmm, prefixes(fa, n, limit=12))
    batched = _kernel(fa, tables, sts)
    vm = jax.jit(jax.vmap(pgcd.scores, in_axes=(None, None, 0)))(fa, tables, sts)
    hlo = jax.jit(jax.vmap(pgcd.scores, in_axes=(None, None, 0))).lower(
        fa, tables, sts).as_text()
    assert tables.edge_index is not None
    assert hlo.count(f"@{kernels.TARGET_INDEX}(") == 1 and f"@{kernels.TARGET}(" not in hlo
    for x, y in zip(batched, vm):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    one = jax.tree.map(lambda x: x[2], sts)
    np.testing.assert_array_equal(np.asarray(pgcd.token_logpsi(fa, hmm, tables, one)),
                                  np.asarray(batched[0][2]))


def test_path_argument_and_mode():
    pattern, n, H = CASES[0]
    hmm = _f32(random_hmm(H, seed=1))
    fa = compile_regex(pattern, VOCAB)
    tables = pgcd.backward(fa, hmm, n)
    sts = _states(fa, hmm, [()])
    with pytest.raises(ValueError, match="path="):
        pgcd.batched_scores(fa, tables, sts, path="gpu")
    with jax.enable_x64(True):                 # float64 particles: the kernel says why not
        sts64 = sts._replace(u=sts.u.astype(jnp.float64))
        with pytest.raises(JaxcdError, match="float32"):
            pgcd.batched_scores(fa, tables, sts64, path="kernel")


_FALLBACK = textwrap.dedent("""
    import warnings, numpy as np, jax.numpy as jnp
    from jaxcd import compile_regex
    from jaxcd.decoding import pgcd
    from jaxcd.decoding import kernels
    from jaxcd.hmm import HMMParams
    from test_pgcd_exact import VOCAB, random_hmm
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        hmm = HMMParams(*(jnp.asarray(np.asarray(a), jnp.float32) for a in random_hmm(3, 2)))
        fa = compile_regex("[ab]{2,4}", VOCAB)
        tables = pgcd.backward(fa, hmm, 5)
        lp = pgcd.token_logpsi(fa, hmm, tables, pgcd.init_state(fa, hmm))
        lp = pgcd.token_logpsi(fa, hmm, tables, pgcd.init_state(fa, hmm))
    msgs = [str(x.message) for x in w if "XLA scoring path" in str(x.message)]
    assert len(msgs) == 1, msgs
    assert "no C++ compiler" in msgs[0], msgs
    assert not kernels.pgcd_kernel_available()
    print("ok", float(np.max(np.asarray(lp))))
""")


def test_without_a_compiler_falls_back_with_one_warning(tmp_path):
    env = dict(os.environ, CXX="jaxcd-no-such-compiler", JAXCD_CACHE=str(tmp_path),
               JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _FALLBACK], env=env, capture_output=True,
                       text=True, cwd=os.path.dirname(__file__), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok")


def test_memory_estimate_and_limit():
    """The estimate's table part is exactly the bytes the tables take (rows 0..N by
    remaining steps, written once); past ``max_bytes`` the error names the estimate, the
    limit and the bfloat16 alternative, before anything is allocated."""
    pattern, n, H = CASES[1]
    hmm = _f32(random_hmm(H, seed=4))
    fa = compile_regex(pattern, VOCAB)
    tables = pgcd.backward(fa, hmm, n, max_steps=16)
    est = pgcd.backward_nbytes(fa, H, 16)
    assert tables.mant.shape[0] == 17
    assert est["tables"] == tables.mant.nbytes + tables.log_scale.nbytes
    assert est["Bt"] == tables.Bt.nbytes
    with pytest.raises(pgcd.TablesTooLargeError, match=r"bfloat16 \(about .* GiB\)"):
        pgcd.backward(fa, hmm, n, max_steps=16, max_bytes=est["total"] - 1)
    pgcd.backward(fa, hmm, n, max_steps=16, max_bytes=est["total"])          # at the limit: ok


@pytest.mark.parametrize("table_dtype", [jnp.float32, jnp.bfloat16])
def test_memory_estimate_bounds_each_phase(table_dtype):
    """``backward_nbytes`` bounds XLA's own accounting of each phase of the build: the
    recursion writes exactly the tables with at most ``work`` beside them (``C`` and the
    temporaries), ``Bt`` is made in its own program with no temporary, and ``total`` is
    the peak ``max(masses, tables + max(work, Bt + index + index_work))``."""
    from jaxcd.decoding import pgcd as impl
    from jaxcd.decoding.buckets import flatten
    pattern, n, _ = CASES[1]
    H = 64
    fa = compile_regex(pattern, VOCAB)
    est = pgcd.backward_nbytes(fa, H, 16, table_dtype)
    assert est["total"] == max(est["masses"], est["tables"] + max(
        est["work"], est["Bt"] + est["index"] + est["index_work"]))
    f = flatten(jax.device_get(fa))
    E, V = int(np.shape(f.edge_src)[-1]), fa.vocab_size
    sd = jax.ShapeDtypeStruct
    m = impl._backward.lower(f, sd((H, H), jnp.float32), sd((H, E), jnp.float32), budget=16,
                             table_dtype=jnp.dtype(table_dtype)).compile().memory_analysis()
    assert 0 <= m.output_size_in_bytes - est["tables"] <= 64          # + the tuple's pointers
    assert H * E * 4 + m.temp_size_in_bytes <= est["work"]
    m = impl._transpose.lower(sd((H, V), jnp.float32),
                              dtype=jnp.dtype(table_dtype)).compile().memory_analysis()
    assert m.output_size_in_bytes == est["Bt"] and m.temp_size_in_bytes == 0
    n2 = impl._small_piece(E)                  # one piece of the small labels' sums
    m = impl._small_sums.lower(sd((E, H), jnp.float32), sd((H, V), jnp.float32),
                               sd((n2,), jnp.int32), sd((n2,), jnp.int32),
                               sd((E + 1,), jnp.int32)).compile().memory_analysis()
    assert E * H * 4 + m.temp_size_in_bytes <= est["masses"]


# --- the per-state edge index (PGCDTables.edge_index) --------------------------------------
def test_edge_index_is_the_transition_function():
    """``edge_index[s, v]`` is the out-edge of ``s`` that holds ``v`` (its destination is
    ``δ(s, v)``), ``−1`` exactly where ``δ(s, v)`` is the dead state; int8 and int16
    agree. Out-degree above 32 (one mask word) included."""
    fa = compile_regex(WIDE_PATTERN, WIDE)
    deg = np.diff(np.asarray(fa.out_start))
    assert deg.max() > 32
    idx8 = np.asarray(pgcd.edge_index(fa, jnp.int8))
    idx16 = np.asarray(pgcd.edge_index(fa, jnp.int16))
    assert idx8.dtype == np.int8 and idx16.dtype == np.int16
    np.testing.assert_array_equal(idx8.astype(np.int16), idx16)
    out_dst = np.asarray(fa.out_dst)
    for s in range(fa.num_states):
        for v in range(fa.vocab_size):
            d = fa.next_state(s, v)
            if d == fa.dead_state:
                assert idx8[s, v] == -1, (s, v)
            else:
                assert 0 <= idx8[s, v] < deg[s] and out_dst[s, idx8[s, v]] == d, (s, v)


def _wide_case(n=4, H=8, seed=3):
    fa = compile_regex(WIDE_PATTERN, WIDE)
    hmm = _dirichlet_hmm(np.random.default_rng(seed), H, fa.vocab_size)
    tables = pgcd.backward(fa, hmm, n, max_steps=4)
    seqs = [(), (1,), (20,), (39,), (40,), (43,), (44,), (1, 1), (10, 10)]
    return fa, hmm, tables, _states(fa, hmm, seqs)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int16])
def test_index_and_mask_lookups_give_identical_scores(dtype):
    """The kernel with the edge index (int8, int16) and with the cumulative mask rows (the
    fallback) run the same arithmetic: bitwise equal outputs, at out-degree 46 with
    successors whose β^P is 0, for float32 and bfloat16 tables."""
    fa, hmm, tables, sts = _wide_case()
    for tab in (tables, pgcd.backward(fa, hmm, 4, max_steps=4, table_dtype=jnp.bfloat16)):
        assert tab.edge_index is not None and tab.edge_index.dtype == jnp.int8
        with_idx = tab._replace(edge_index=pgcd.edge_index(fa, dtype))
        a = _kernel(fa, with_idx, sts)
        b = _kernel(fa, tab._replace(edge_index=None), sts)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert np.isfinite(np.asarray(a[0])).sum() > 20


def test_index_limit_falls_back_to_the_masks():
    """Past ``index_max_bytes`` the tables carry no index and the kernel reads the mask
    rows; the memory estimate counts the index only when it is built."""
    fa, hmm, tables, sts = _wide_case()
    S, V = fa.num_states, fa.vocab_size
    assert pgcd.backward_nbytes(fa, 8, 4)["index"] == S * V == tables.edge_index.nbytes
    assert pgcd.backward_nbytes(fa, 8, 4, index_max_bytes=S * V - 1)["index"] == 0
    small = pgcd.backward(fa, hmm, 4, max_steps=4, index_max_bytes=S * V - 1)
    assert small.edge_index is None
    for x, y in zip(_kernel(fa, small, sts), _kernel(fa, tables, sts)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
