"""AWRS (jaxcd.decoding.awrs): proper weighting E[Ẑ·1{token = v}] = p(v)·1{accept(v)}.

- Exactly, by enumerating every random ordering the sampler can draw (a scripted
  random generator feeds it each permutation; Plackett-Luce probabilities), for every
  accept set of a 5-token vocabulary with a zero-probability token.
- By Monte Carlo with a real generator (tolerance from the sample size), the token
  distribution given acceptance against p restricted (chi-square), and the number of
  checks on a peaked 49152-token distribution.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from scipy import stats

from jaxcd.decoding import awrs
from jaxcd.decoding.awrs import _race_order

P5 = np.array([0.4, 0.3, 0.2, 0.1, 0.0])      # token 4 has probability 0
V5 = len(P5)
with np.errstate(divide="ignore"):
    LP5 = np.log(P5)
POS = [v for v in range(V5) if P5[v] > 0]
ACCEPT_SETS = ([frozenset(s) for r in range(len(POS) + 1) for s in itertools.combinations(POS, r)]
               + [frozenset({4}), frozenset({0, 4}), frozenset({1, 2, 3, 4})])
CONFIGS = [("awrs", None), ("recursive", None), ("recursive", 1), ("recursive", 2),
           ("recursive", 3)]


class ScriptedRNG:
    """Stands in for a numpy Generator: ``standard_exponential`` returns preset arrays
    ``E_v = rank_v · w_v`` so that the sampler's keys ``E_v / w_v`` order the tokens by
    the given permutation."""

    def __init__(self, perms):
        w = np.exp(LP5 - LP5.max())
        self.arrays = []
        for perm in perms:
            e = np.ones(V5)
            for rank, v in enumerate(perm):
                e[v] = (rank + 1) * w[v]
            self.arrays.append(e)

    def standard_exponential(self, size):
        assert size == V5
        return self.arrays.pop(0)


def plackett_luce(perm) -> float:
    prob, left = 1.0, float(sum(P5[v] for v in perm))
    for v in perm:
        prob *= P5[v] / left
        left -= P5[v]
    return prob


class Counter:
    def __init__(self, accept_set):
        self.accept_set = accept_set
        self.calls: list[int] = []

    def __call__(self, v):
        self.calls.append(v)
        return v in self.accept_set


@pytest.mark.parametrize("method,max_checks", CONFIGS)
def test_exact_proper_weighting_by_enumeration(method, max_checks):
    perms = list(itertools.permutations(POS))
    loops = 2 if method == "awrs" else 1
    for A in ACCEPT_SETS:
        target = np.array([P5[v] if v in A else 0.0 for v in range(V5)])
        expect = np.zeros(V5)
        token_prob = np.zeros(V5)
        total_prob = 0.0
        for script in itertools.product(perms, repeat=loops):
            prob = float(np.prod([plackett_luce(s) for s in script]))
            total_prob += prob
            rng = ScriptedRNG(script)
            acc = Counter(A)
            tok, lw, checks = awrs.sample(rng, LP5, acc, method=method, max_checks=max_checks)
            assert checks == len(acc.calls) == len(set(acc.calls))       # each token once
            assert 4 not in acc.calls                                      # p = 0: never
            if max_checks is not None:
                assert checks <= max_checks
            if tok < 0:
                assert lw == -np.inf
                continue
            assert tok in A and np.isfinite(lw) and lw <= 1e-12
            expect[tok] += prob * np.exp(lw)
            token_prob[tok] += prob
        np.testing.assert_allclose(total_prob, 1.0, rtol=1e-12)
        np.testing.assert_allclose(expect, target, rtol=1e-12, atol=1e-15,
                                   err_msg=f"{method} {max_checks} accept={sorted(A)}")
        if max_checks is None and target.sum() > 0:      # exact sampler: token ~ p|A
            np.testing.assert_allclose(token_prob, target / target.sum(), rtol=1e-12,
                                       atol=1e-15)


def _monte_carlo(method, logp, accept_set, n, seed):
    rng = np.random.default_rng(seed)
    V = len(logp)
    prod = np.zeros((n, V))
    tokens = np.full(n, -1)
    for i in range(n):
        tok, lw, _ = awrs.sample(rng, logp, lambda v: v in accept_set, method=method)
        if tok >= 0:
            prod[i, tok] = np.exp(lw)
            tokens[i] = tok
    return prod, tokens


@pytest.mark.parametrize("method", ["awrs", "recursive"])
def test_monte_carlo_with_a_real_generator(method):
    rng = np.random.default_rng(11)
    V = 8
    p = rng.dirichlet(np.ones(V))
    logp = np.log(p)
    n = 3000
    for k, A in enumerate([frozenset(range(V)), frozenset({5}), frozenset(),
                           frozenset({0, 2, 3, 7}), frozenset(np.argsort(p)[:3])]):
        prod, tokens = _monte_carlo(method, logp, A, n, seed=100 + k)
        target = np.array([p[v] if v in A else 0.0 for v in range(V)])
        se = prod.std(0) / np.sqrt(n)
        # 5 standard errors per token (plus float slack where the estimator is constant)
        assert np.all(np.abs(prod.mean(0) - target) <= 5 * se + 1e-12), \
            (sorted(A), (prod.mean(0) - target) / np.maximum(se, 1e-300))
        if not A:
            assert np.all(tokens == -1)
            continue
        # the returned token given acceptance ~ p restricted to A (chi-square, p > 1e-3)
        assert np.all(np.isin(tokens, list(A)))
        if len(A) > 1:
            cells = sorted(A)
            counts = np.array([(tokens == v).sum() for v in cells])
            expected = n * target[cells] / target.sum()
            pval = stats.chisquare(counts, expected).pvalue
            assert pval > 1e-3, (sorted(A), counts, expected)


def test_all_rejected_and_degenerate_inputs():
    rng = np.random.default_rng(0)
    lp = np.log(np.array([0.5, 0.5]))
    for method in awrs.METHODS:
        assert awrs.sample(rng, lp, lambda v: False, method=method) == (-1, -np.inf, 2)
        assert awrs.sample(rng, np.full(3, -np.inf), lambda v: True, method=method) \
            == (-1, -np.inf, 0)
        tok, lw, checks = awrs.sample(rng, np.array([0.0]), lambda v: True, method=method)
        assert (tok, lw, checks) == (0, 0.0, 1)
    # unnormalised log-probabilities: Ẑ estimates Σ exp(logp) 1{accept} on their scale
    tok, lw, _ = awrs.sample(rng, np.array([-1000.0, -np.inf]), lambda v: True)
    assert tok == 0 and lw == pytest.approx(-1000.0, abs=1e-12)
    with pytest.raises(ValueError, match="vector"):
        awrs.sample(rng, np.zeros((2, 2)), lambda v: True)
    with pytest.raises(ValueError, match="NaN"):
        awrs.sample(rng, np.array([0.0, np.nan]), lambda v: True)
    with pytest.raises(ValueError, match="recursive"):
        awrs.sample(rng, lp, lambda v: True, max_checks=3)
    with pytest.raises(ValueError, match="awrs, recursive"):
        awrs.sample(rng, lp, lambda v: True, method="wrs")


def test_checks_far_below_vocab_on_a_peaked_distribution():
    """V = 49152, Zipf(1.5) over a random permutation (top token p = 0.38, like a
    confident LM), constraint rejects a random 70% of the vocabulary (here including
    the top token). Unbiasedness of Ẑ checked too."""
    rng = np.random.default_rng(3)
    V = 49152
    lp = -1.5 * np.log(rng.permutation(V) + 1.0)
    lp -= np.logaddexp.reduce(lp)
    acc = rng.random(V) < 0.3
    acc[np.argmax(lp)] = False
    Z = float(np.exp(lp[acc]).sum())
    n = 300
    results = {}
    for method in awrs.METHODS:
        t0 = time.perf_counter()
        out = [awrs.sample(rng, lp, lambda v: bool(acc[v]), method=method) for _ in range(n)]
        sec = (time.perf_counter() - t0) / n
        checks = np.array([c for _, _, c in out])
        zhat = np.exp([lw for _, lw, _ in out])
        assert all(acc[t] for t, _, _ in out)
        results[method] = (checks.mean(), checks.max(), sec)
        assert checks.mean() < 20 and checks.max() < 200, (method, checks.mean())
        assert abs(zhat.mean() - Z) < 5 * zhat.std() / np.sqrt(n), (method, zhat.mean(), Z)
    print(f"\nV={V} Z={Z:.4f}: " + "; ".join(
        f"{m}: mean checks {c:.2f}, max {mx}, {1e3 * s:.1f} ms/call"
        for m, (c, mx, s) in results.items()))


def test_race_order_is_the_full_sort_of_its_keys():
    """The lazy order (top 16, top 512, then a full sort) equals the full argsort of the
    same exponential-race keys, and is a permutation of the positive-weight tokens."""
    for V, zeros, seed in [(5, 2, 0), (40, 10, 1), (3000, 1000, 2), (600, 0, 3)]:
        rng = np.random.default_rng(seed)
        w = rng.random(V)
        w[rng.choice(V, zeros, replace=False)] = 0.0
        order = list(_race_order(np.random.default_rng(seed + 10), w))
        with np.errstate(divide="ignore"):
            keys = np.random.default_rng(seed + 10).standard_exponential(V) / w
        assert order == np.argsort(keys, kind="stable")[:V - zeros].tolist()
        assert sorted(order) == np.flatnonzero(w > 0).tolist()


def test_long_walks_past_the_sorted_top():
    """One accepted token of low probability in a flat 3000-token distribution: the
    loops walk past the first 16 and 512 sorted keys; Ẑ stays unbiased for p(v*)."""
    rng = np.random.default_rng(5)
    V = 3000
    p = rng.dirichlet(np.ones(V) * 5.0)
    target = int(np.argsort(p)[V // 10])
    logp = np.log(p)
    for method in awrs.METHODS:
        out = [awrs.sample(rng, logp, lambda v: v == target, method=method) for _ in range(150)]
        assert all(t == target for t, _, _ in out)
        checks = np.array([c for _, _, c in out])
        assert checks.max() > 512                       # the full-sort path ran
        z = np.exp([lw for _, lw, _ in out])
        assert abs(z.mean() - p[target]) < 5 * z.std() / np.sqrt(len(z)) + 1e-12, method
