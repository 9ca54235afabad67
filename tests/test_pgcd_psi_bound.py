"""ψ stays a probability: P-GCD's ``ψ(x v)``, ``ψ(x)`` and ``β^P`` against brute-force
enumeration (``test_pgcd_exact.Reference``: every token sequence up to the budget, its
HMM probability times acceptance by Python's ``re``) on random HMMs and random regular
languages, never above ``1 + tol`` — in float64 (XLA path), float32 (the native kernel
on CPU, and XLA) and bfloat16 tables — and :func:`jaxcd.pgcd.check_psi`, which must
flag an HMM or tables that make them exceed 1."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hmm_distill import HMMParams
from jaxcd import compile_regex
from jaxcd.decoding import pgcd
from jaxcd.decoding.buckets import bucket_automaton
from jaxcd.errors import BudgetTooSmallError
from test_pgcd_exact import V, VOCAB, Reference, prefixes, random_hmm, run_state

_scores = jax.jit(pgcd.batched_scores, static_argnames=("path",))


def _batch(fa, hmm, ps):
    return jax.tree.map(lambda *x: jnp.stack(x), *[run_state(fa, hmm, p) for p in ps])


def _as(hmm, dtype):
    return HMMParams(*(jnp.asarray(np.asarray(a), dtype) for a in hmm))


# random regular languages over the test vocabulary's characters (a, b, é, -)
_ATOMS = st.sampled_from(["a", "b", "é", "-", "ab", "[ab]", "(a|é)"])


def _regex():
    def extend(inner):
        return st.one_of(
            st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
            st.tuples(inner, inner).map(lambda t: f"({t[0]}|{t[1]})"),
            inner.map(lambda r: f"({r})*"),
            inner.map(lambda r: f"({r})?"),
            st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(
                lambda t: f"({t[0]}){{{t[1]},{t[1] + t[2]}}}"))
    return st.recursive(_ATOMS, extend, max_leaves=5)


def _reference_maxima(ref, ps):
    """The largest ψ(p v) over every token and the largest ψ(p) over the prefixes,
    by enumeration."""
    tok = max(float(np.nanmax(np.r_[ref.token_psi(p), 0.0])) for p in ps)
    pre = max(float(np.nan_to_num(ref.psi(p))) for p in ps)
    return tok, pre


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pattern=_regex(), n=st.integers(3, 5), seed=st.integers(0, 2**16),
       zeros=st.booleans())
def test_psi_equals_enumeration_and_is_at_most_one(pattern, n, seed, zeros):
    """Random languages and 3-state HMMs (with exact zeros or not), budgets 3 to 5: ψ(x v)
    and ψ(x) at up to 12 reachable prefixes equal the enumeration and never exceed 1. The
    automata are padded to one shape bucket and every budget uses tables of 5 steps, so
    the examples share their compiled programs."""
    H = 3
    with jax.enable_x64(True):
        fa = bucket_automaton(compile_regex(pattern, VOCAB))
        hmm = _as(random_hmm(H, seed, zeros=zeros), jnp.float64)
        try:
            tables = pgcd.backward(fa, hmm, n, max_steps=5)
        except BudgetTooSmallError:
            assume(False)                            # no valid output within n tokens
        ref = Reference(pattern, n, hmm)
        ps = prefixes(fa, n, limit=12)
        ps = ps + [ps[-1]] * (12 - len(ps))          # one batch shape for every example
        sts = _batch(fa, hmm, ps)
        logpsi, z, lprod = (np.asarray(x) for x in _scores(fa, tables, sts, path="xla"))
        for i, p in enumerate(ps):
            want = ref.token_psi(p)
            got = np.exp(logpsi[i])
            assert np.all(got <= 1.0 + 1e-12)
            ok = ~np.isnan(want)
            np.testing.assert_allclose(got[ok], want[ok], rtol=1e-9, atol=1e-14)
            psi_p = ref.psi(p)
            if not np.isnan(psi_p):
                np.testing.assert_allclose(np.exp(z[i]), psi_p, rtol=1e-9, atol=1e-15)
                assert np.exp(z[i]) <= 1.0 + 1e-12
        # β^P: a probability for every state, step and hidden state
        beta = np.asarray(tables.beta())[:, :fa.num_states]
        assert beta.max() <= 1.0 + 1e-12 and beta.min() >= 0.0
        # the checker reports the same maxima as the enumeration
        res = pgcd.check_psi(fa, hmm, tables, sts, path="xla")
        tok, pre = _reference_maxima(ref, ps)
        assert res["ok"] and res["tol"] == 1e-9
        np.testing.assert_allclose(res["max_token_psi"], tok, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(res["max_prefix_psi"], pre, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(res["max_beta"], beta.max(), rtol=1e-12)


CASES = [(r"(ab|b)*a?", 5, 3), (r"a(é|b)*-", 6, 3), (r"((a|é)b?)*-", 6, 3)]


@pytest.mark.parametrize("pattern,n,H", CASES)
def test_float32_and_bfloat16_tables_stay_below_one(pattern, n, H):
    """The fast paths (the native kernel on CPU, XLA in float32, bfloat16 tables) against
    the float64 enumeration, on HMMs with peaked and flat emissions: close to it, and
    never above 1 + the dtype's tolerance. (One shape bucket and 6-step tables for every
    case: the cases share their compiled programs.)"""
    fa = bucket_automaton(compile_regex(pattern, VOCAB))
    for seed, conc in [(0, 0.05), (1, 0.7), (2, 5.0)]:
        rng = np.random.default_rng(seed * 31 + n)
        hmm = HMMParams(rng.dirichlet(np.ones(H)), rng.dirichlet(np.ones(H) * conc, size=H),
                        rng.dirichlet(np.ones(V) * conc, size=H))
        ref = Reference(pattern, n, hmm)
        ps = prefixes(fa, n, limit=25)
        want = np.array([ref.token_psi(p) for p in ps])
        h32 = _as(hmm, jnp.float32)
        sts = _batch(fa, h32, ps)
        for table_dtype, path, rtol in [(None, "auto", 2e-4), (None, "xla", 2e-4),
                                        (jnp.bfloat16, "auto", 0.05)]:
            tables = pgcd.backward(fa, h32, n, table_dtype=table_dtype, max_steps=6)
            tol = pgcd.psi_tolerance(tables.mant.dtype)
            got = np.exp(np.asarray(_scores(fa, tables, sts, path=path)[0], np.float64))
            assert np.all(got <= 1.0 + tol), (table_dtype, path, got.max())
            ok = ~np.isnan(want) & (want > 1e-6)
            np.testing.assert_allclose(got[ok], want[ok], rtol=rtol)
            res = pgcd.check_psi(fa, h32, tables, sts, path=path)
            assert res["ok"] and res["max_token_psi"] == pytest.approx(np.nanmax(want), rel=rtol)


def test_check_psi_flags_an_unnormalised_hmm():
    """Emission rows that sum above 1 (the kind of bug that gave Ctrl-G users ψ > 1):
    the enumeration itself then exceeds 1, and check_psi raises, naming B."""
    pattern, n, H = r"[ab]{2,4}", 5, 2
    fa = compile_regex(pattern, VOCAB)
    good = random_hmm(H, seed=5)
    w = np.full(V, 0.05)
    w[[0, 1, 2]] = [1.0, 3.0, 3.0]                      # EOS, a, b: valid outputs likely
    B = np.stack([w * (1 + 0.3 * h) for h in range(H)])
    B /= B.sum(1, keepdims=True)
    good = HMMParams(good.pi, good.A, B)
    bad = HMMParams(good.pi, good.A, B * 3.0)
    ref = Reference(pattern, n, bad)
    ps = prefixes(fa, n, limit=25)
    assert _reference_maxima(ref, ps)[0] > 1.01          # a real violation, by enumeration
    tok, _ = _reference_maxima(ref, ps)
    for x64, dtype in [(False, jnp.float32), (True, jnp.float64)]:
        with jax.enable_x64(x64):
            hmm = _as(bad, dtype)
            tables = pgcd.backward(fa, hmm, n)
            sts = _batch(fa, hmm, ps)
            with pytest.raises(pgcd.PsiBoundError, match="B is not normalised"):
                pgcd.check_psi(fa, hmm, tables, sts)
            res = pgcd.check_psi(fa, hmm, tables, sts, raise_error=False)
            assert not res["ok"] and res["max_beta"] > 1.01 and res["max_token_psi"] > 1.01
            np.testing.assert_allclose(res["max_token_psi"], tok, rtol=1e-4)
    # a transition matrix whose rows sum above 1 is flagged too
    badA = HMMParams(good.pi, np.asarray(good.A) * 1.2, good.B)
    t = pgcd.backward(fa, _as(badA, jnp.float32), n)
    with pytest.raises(pgcd.PsiBoundError, match="A is not normalised"):
        pgcd.check_psi(fa, _as(badA, jnp.float32), t)


def test_check_psi_flags_corrupted_tables():
    """Tables whose β^P exceeds 1 (a scaling bug), with a normalised HMM: the bound on
    the tables and on ψ(x v) fails, and the default start-state check sees it."""
    pattern, n, H = r"(ab|b)*a?", 5, 3
    fa = compile_regex(pattern, VOCAB)
    hmm = _as(random_hmm(H, seed=2), jnp.float32)
    tables = pgcd.backward(fa, hmm, n)
    assert pgcd.check_psi(fa, hmm, tables)["ok"]
    ls = np.asarray(tables.log_scale).copy()
    live = np.isfinite(ls)
    ls[live] += 0.01                                   # every β^P × e^0.01
    broken = tables._replace(log_scale=jnp.asarray(ls))
    res = pgcd.check_psi(fa, hmm, broken, raise_error=False)
    assert not res["ok"] and res["hmm_error"] is None
    assert res["max_beta"] == pytest.approx(np.exp(0.01), rel=1e-6)
    assert res["max_token_psi"] == pytest.approx(np.exp(0.01), rel=1e-5)
    with pytest.raises(pgcd.PsiBoundError, match="max_beta"):
        pgcd.check_psi(fa, hmm, broken)
    # inside the tolerance: accepted
    assert pgcd.check_psi(fa, hmm, broken, tol=0.02)["ok"]


def test_psi_bounds_shapes_and_start_state():
    pattern, n, H = r"a(é|b)*-", 6, 2
    fa = compile_regex(pattern, VOCAB)
    hmm = _as(random_hmm(H, seed=4), jnp.float32)
    tables = pgcd.backward(fa, hmm, n)
    ps = prefixes(fa, n, limit=6)
    sts = _batch(fa, hmm, ps)
    grid = jax.tree.map(lambda x: x.reshape((2, 3) + x.shape[1:]), sts)
    tok, z = pgcd.psi_bounds(fa, tables, grid)
    assert tok.shape == z.shape == (2, 3)
    tok1, z1 = pgcd.psi_bounds(fa, tables, pgcd.init_state(fa, hmm))
    assert tok1.shape == z1.shape == ()
    ref = Reference(pattern, n, random_hmm(H, seed=4))
    np.testing.assert_allclose(np.exp(float(z1)), ref.psi(()), rtol=1e-4)
    np.testing.assert_allclose(np.exp(np.asarray(z)).ravel(), [ref.psi(p) for p in ps], rtol=1e-4)
    assert pgcd.check_psi(fa, hmm, tables)["max_prefix_psi"] == pytest.approx(ref.psi(()), rel=1e-4)
