"""The P-GCD proposals' defensive mixture (``smc.run(..., defensive=λ)``) against an
independent reference, on an HMM that gives a token probability 0.

The HMM never emits ``b`` (``B[:, b] = 0``), so ``ψ = 0`` for every prefix that contains
it: the pure P-GCD proposal (``λ = 0``) never draws ``b``, and the part of the posterior
behind it (``b``, ``b-``) is lost whatever the number of runs — the failure study 6b
showed on SmolLM2 with the demo HMM, where unseen tokens got a pseudocount and a 1e-5
share instead of 0. With ``λ > 0`` the proposal ``q = (1 − λ)·q_P + λ·q_GCD`` covers the GCD
support, and the weighted ensemble converges to the enumerated posterior.

The reference recomputes everything in float64 numpy from the tables and the HMM by brute
force (``ψ`` as a sum over every valid completion under the HMM's forward filter, the GCD
mask as "some valid output of at most ``n`` tokens extends this prefix"), not from
:mod:`jaxcd.decoding.pgcd`: with ``K = 1`` and no resampling a particle's final log-weight
is ``log p_lm(x) − log q(x)``, which is compared to the reference ``q`` sequence by
sequence.
"""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmm_distill import HMMParams
from jaxcd import compile_regex
from jaxcd.decoding import smc
from test_smc import EOS, N, PATTERN, R, V, VOCAB, decode, exact_posterior, key_of, make_lm

B_TOKEN = 2                       # "b": the HMM never emits it
LAM = 0.05


def zero_hmm(H=3, seed=4):
    rng = np.random.default_rng(seed)
    B = rng.dirichlet(np.ones(V), size=H)
    B[:, B_TOKEN] = 0.0
    B /= B.sum(1, keepdims=True)
    return HMMParams(rng.dirichlet(np.ones(H)), rng.dirichlet(np.ones(H), size=H), B)


def bodies():
    """Every token sequence of at most ``N − 1`` non-EOS tokens (EOS follows)."""
    for m in range(N):
        yield from itertools.product(range(1, V), repeat=m)


def is_valid(body):
    text = decode(body)
    return text is not None and re.fullmatch(PATTERN, text) is not None


VALID = [b for b in bodies() if is_valid(b)]


def hmm_filter(hmm, prefix):
    """(P_hmm(prefix), predictive u after it) by the forward recursion (float64)."""
    pi, A, B = (np.asarray(a, np.float64) for a in hmm)
    u, p = pi / pi.sum(), 1.0
    for v in prefix:
        a = u * B[:, v]
        p *= a.sum()
        if p == 0:
            return 0.0, np.zeros_like(u)
        u = (a / a.sum()) @ A
    return p, u


def psi(hmm, prefix):
    """``ψ(prefix)``: the HMM probability that the prefix is completed validly within the
    budget, given the prefix (0 where the HMM gives the prefix probability 0);
    ``ψ(x·EOS) = 1{x ∈ L}``."""
    if prefix and prefix[-1] == EOS:
        return float(is_valid(prefix[:-1]) and hmm_filter(hmm, prefix)[0] > 0)
    p0 = hmm_filter(hmm, prefix)[0]
    if p0 == 0:
        return 0.0
    tot = sum(hmm_filter(hmm, b + (EOS,))[0] for b in VALID if b[:len(prefix)] == prefix)
    return tot / p0


def gcd_allows(prefix, v):
    if v == EOS:
        return is_valid(prefix)
    return any(b[:len(prefix) + 1] == prefix + (v,) for b in VALID)


def reference_logq(lm, hmm, body, proposal, lam, alpha=1.0):
    """log q(body·EOS) of the defensive mixture ``(1 − λ)·q_P + λ·q_GCD``, ``q_P ∝
    p_lm·score^α`` (score ψ or p_prod; ``α = 1`` untempered), by the reference."""
    lp = np.asarray(lm.params[0], np.float64)
    children = np.asarray(lm.params[1])
    node, total, prefix = 0, 0.0, ()
    for tok in body + (EOS,):
        p = np.exp(lp[node] - np.logaddexp.reduce(lp[node]))
        m = np.array([gcd_allows(prefix, v) for v in range(V)], float)
        if proposal == "lookahead":
            w = np.array([psi(hmm, prefix + (v,)) for v in range(V)]) * m
        else:           # product: p_prod(v) ∝ P_hmm(v, valid completion | prefix) = p_hmm(v)·ψ(v)
            _, u = hmm_filter(hmm, prefix)
            ph = u @ np.asarray(hmm.B, np.float64)
            w = ph * np.array([psi(hmm, prefix + (v,)) for v in range(V)]) * m
        w = np.where(w > 0, w ** alpha, 0.0)   # a constant factor in w cancels in q_P
        qg = p * m / (p * m).sum()
        qp = p * w
        q = qg if qp.sum() == 0 else (1 - lam) * qp / qp.sum() + lam * qg
        total += np.log(q[tok]) if q[tok] > 0 else -np.inf
        prefix += (tok,)
        node = int(children[node, tok])
    return total


def run(lm, fa, hmm, K, proposal, lam, seed, ess_threshold=0.5):
    ids, lens = jnp.zeros((R, 1), jnp.int32), jnp.ones((R,), jnp.int32)
    return smc.run(jax.random.key(seed), lm, lm.params, ids, lens, fa, budget=N,
                   num_particles=K, proposal=proposal, hmm=hmm, defensive=lam,
                   ess_threshold=ess_threshold)


@pytest.fixture(scope="module")
def problem():
    lm = make_lm()
    fa = compile_regex(PATTERN, VOCAB)
    post, Z = exact_posterior(lm)
    return lm, fa, zero_hmm(), post, Z


@pytest.mark.parametrize("proposal", ["lookahead", "product"])
def test_support_and_exact_weights_against_reference(problem, proposal):
    lm, fa, hmm, post, _ = problem
    lost = {b for b in VALID if B_TOKEN in b}
    assert sum(post.get(b, 0.0) for b in lost) > 0.1          # the zeros matter here
    # the reference: λ = 0 gives every sequence through "b" probability 0, λ > 0 none
    for b in VALID:
        lq0 = reference_logq(lm, hmm, b, proposal, 0.0)
        lq = reference_logq(lm, hmm, b, proposal, LAM)
        assert np.isfinite(lq), b
        assert np.isfinite(lq0) == (b not in lost), b
    # K = 1, no resampling: each final log-weight is log p(x) − log q(x) of the mixture
    res = run(lm, fa, hmm, 1, proposal, LAM, seed=11, ess_threshold=0.0)
    toks, lw = np.asarray(res.tokens), np.asarray(res.log_weights, np.float64)
    assert np.asarray(res.valid).all() and np.isfinite(lw).all()
    seen = set()
    for r in range(R):
        body = key_of(toks[r, 0])
        seen.add(body)
        ref = lm.sequence_logprob(body + (EOS,)) - reference_logq(lm, hmm, body, proposal, LAM)
        np.testing.assert_allclose(lw[r, 0], ref, atol=2e-4, rtol=0)
    assert seen & lost                      # the defended proposal does draw through "b"
    # and the pure P-GCD proposal never does
    res0 = run(lm, fa, hmm, 1, proposal, 0.0, seed=11, ess_threshold=0.0)
    assert not {key_of(t) for t in np.asarray(res0.tokens)[:, 0]} & lost


def pooled(res):
    """Σ_r Σ_k w_rk δ(x_rk), normalised: every run's final unnormalised weights (each run's
    ensemble weighted by its Ẑ), as study 6b pools them."""
    toks, lw = np.asarray(res.tokens), np.asarray(res.log_weights, np.float64)
    m = np.max(lw[np.isfinite(lw)])
    est = {}
    for r, k in zip(*np.nonzero(np.isfinite(lw))):
        est[key_of(toks[r, k])] = est.get(key_of(toks[r, k]), 0.0) + np.exp(lw[r, k] - m)
    s = sum(est.values())
    return {k: v / s for k, v in est.items()}


def tv(p, q):
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


@pytest.mark.parametrize("proposal", ["lookahead", "product"])
def test_pooled_estimate_converges_with_zeros_in_the_hmm(problem, proposal):
    """R runs × K = 8 particles (resampling at ESS < K/2): the Ẑ-weighted pooled estimate is
    within 3× the noise floor of R exact posterior samples (the floor's mean and the
    bound's slack are computed here from the same R); Ẑ is unbiased. With λ = 0 the lost
    mass alone puts it far outside."""
    lm, fa, hmm, post, Z = problem
    rng = np.random.default_rng(0)
    p = np.array(list(post.values()))
    floor = np.mean([0.5 * np.abs(rng.multinomial(R, p) / R - p).sum() for _ in range(200)])
    lost_mass = sum(v for k, v in post.items() if B_TOKEN in k)
    res = run(lm, fa, hmm, 8, proposal, LAM, seed=5)
    d = tv(pooled(res), post)
    assert d < 3 * floor, (d, floor)
    zhat = np.exp(np.asarray(res.log_Z, np.float64))
    se = zhat.std(ddof=1) / np.sqrt(R)
    assert abs(zhat.mean() - Z) < 4 * se, (zhat.mean(), Z, se)
    res0 = run(lm, fa, hmm, 8, proposal, 0.0, seed=5)
    assert tv(pooled(res0), post) > 0.9 * lost_mass > 3 * floor


def test_defensive_one_is_gcd_and_bad_values_are_errors(problem):
    """λ = 1 is GCD: the GCD proposal (same tokens as ``proposal="gcd"`` from the same key)
    and GCD's potential 1 (the same final weights); λ outside [0, 1] is a clear error."""
    lm, fa, hmm, _, _ = problem
    a = run(lm, fa, hmm, 1, "lookahead", 1.0, seed=3, ess_threshold=0.0)
    b = run(lm, fa, None, 1, "gcd", 0.0, seed=3, ess_threshold=0.0)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.log_weights), np.asarray(b.log_weights), atol=2e-5)
    with pytest.raises(ValueError, match="defensive"):
        run(lm, fa, hmm, 1, "lookahead", 1.5, seed=0)


def finish_early_lm(V, EOS):
    """Next-token probabilities (token 1 = "a", 2 = "b", 5 = "-") under which ``b·EOS``
    finishes early with a small EOS factor (1e-4) while ``a·-`` pays its own (1e-3) later:
    the problem of the two "finished particles are not resampled" tests (also
    ``test_smc_blackbox.py``)."""

    def fn(prefix):
        p = np.full(V, 1e-3)
        if prefix == ():
            p[1], p[2] = 0.15, 0.45               # "a", "b"
        elif prefix == (2,):
            p[:] = 1.0
            p[EOS] = 1e-4                         # "b" then EOS: rarely
        elif prefix == (1,):
            p[5] = 0.99                           # "a" then "-"
        elif prefix == (1, 5):
            p[:] = 1.0
            p[EOS] = 1e-3
        return p / p.sum()

    return fn


def assert_near_posterior(estimate, post, log_Z, Z):
    """The pooled estimate of ``R = len(log_Z)`` runs is within 4× the noise floor of R exact
    posterior samples (TV), and the mean of the runs' Ẑ within 4 standard errors of ``Z``."""
    R = len(log_Z)
    rng = np.random.default_rng(0)
    p = np.array(list(post.values()))
    floor = np.mean([0.5 * np.abs(rng.multinomial(R, p) / R - p).sum() for _ in range(200)])
    d = tv(estimate, post)
    assert d < 4 * floor, (d, floor, estimate, post)
    zhat = np.exp(np.asarray(log_Z, np.float64))
    assert abs(zhat.mean() - Z) < 4 * zhat.std(ddof=1) / np.sqrt(R) + 1e-12


def test_finished_particles_are_not_resampled_against_unfinished_ones():
    """``b·EOS`` finishes at step 2 with its small EOS probability (1e-4) paid, while ``a``
    is still waiting for ``-`` and its own EOS factor (1e-3): at step 2 the finished
    particles' weights are ~1e-4 of the unfinished ones', though the posterior gives ``b``
    0.23. Resampling across the two (the old rule: ESS ≈ the unfinished count ≈ K/4 < K/2)
    kept ``b`` in almost no run (TV 0.2); resampling
    only the unfinished particles leaves the pooled estimate within 4× the noise floor of
    R exact samples, and Ẑ unbiased. (Study 6b's ``ocean`` with the GCD proposal.)"""
    from jaxcd.lm.interface import TableLM

    fn = finish_early_lm(V, EOS)
    lm = TableLM.from_function(fn, V, N, EOS)
    fa = compile_regex(r"b|a-", VOCAB)
    post, Z = exact_posterior(lm, r"b|a-")
    assert 0.15 < post[(2,)] < 0.3
    ids, lens = jnp.zeros((R, 1), jnp.int32), jnp.ones((R,), jnp.int32)
    res = smc.run(jax.random.key(2), lm, lm.params, ids, lens, fa, budget=N, num_particles=32,
                  proposal="gcd")
    assert_near_posterior(pooled(res), post, res.log_Z, Z)



@pytest.mark.parametrize("proposal", ["lookahead", "product"])
def test_resampling_does_not_starve_what_psi_underrates(proposal):
    """``b|a-`` where the HMM gives ``-`` probability 1e-9 (not 0): ``ψ(a)`` is ~1e-9 of
    ``ψ(b)``, though the posterior puts ~0.8 on ``a-``. The proposal's defensive part still
    draws ``a``; with ``ψ`` itself as the potential the next resampling step (here every
    step: ESS threshold 1) weighs those particles by ~1e-9 and kills them, and ``a-`` is
    lost in almost every run — study 6b's ``mode`` on Qwen2.5-Coder, where the demo HMM
    rates "b" (of b·icy·cling) e^-12.7 below the start and "walking" e^13.9 above it (TV
    0.085 at K = 64, ``Ẑ/Z`` 0.89). The defensive potential (each step's factor at least
    ``λ``) keeps them: the pooled estimate is within 4× the noise floor of R exact samples
    and ``Ẑ`` unbiased."""
    from jaxcd.lm.interface import TableLM

    lm = TableLM.from_function(finish_early_lm(V, EOS), V, N, EOS)
    fa = compile_regex(r"b|a-", VOCAB)
    post, Z = exact_posterior(lm, r"b|a-")
    assert post[(1, 5)] > 0.5
    rng = np.random.default_rng(4)
    H = 3
    B = rng.dirichlet(np.ones(V), size=H)
    B[:, 5] = 1e-9
    B /= B.sum(1, keepdims=True)
    hmm = HMMParams(rng.dirichlet(np.ones(H)), rng.dirichlet(np.ones(H), size=H), B)
    res = run(lm, fa, hmm, 8, proposal, LAM, seed=7, ess_threshold=1.0)
    assert_near_posterior(pooled(res), post, res.log_Z, Z)
