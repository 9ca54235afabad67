"""GCD sampling from an explicit toy LM equals the locally renormalised distribution
computed by enumeration (chi-square, fixed seed); LCD at a tight budget fails."""

import itertools
import re

import jax
import numpy as np
import pytest
from scipy import stats

from jaxcd import Vocabulary, compile_regex

from jaxcd.decoding.decode import sample, tables_for
from jaxcd.lm import TableLM, pad_prompts

TOKENS = [b"<eos>", b"a", b"b", b"ab", b"ba", b"-"]
EOS = 0
V = len(TOKENS)
VOCAB = Vocabulary.from_token_bytes(TOKENS, eos_id=EOS)
PATTERN = r"(ab|b)*a?-?"


def toy_lm(depth):
    rng = np.random.default_rng(7)
    table = {}

    def fn(prefix):
        if prefix not in table:
            table[prefix] = rng.dirichlet(np.ones(V) * 0.7) + 1e-3
        return table[prefix]

    return TableLM.from_function(fn, V, depth, eos_token_id=EOS)


def is_valid(seq):
    if EOS not in seq:
        return False
    m = seq.index(EOS)
    if any(v != EOS for v in seq[m:]):
        return False
    return re.fullmatch(PATTERN, b"".join(TOKENS[v] for v in seq[:m]).decode()) is not None


def exact_gcd_distribution(lm, n):
    """q(x) = Π_t p(x_t | x_<t) m_t(x_t) / Σ_v p(v | x_<t) m_t(v), masks by enumeration."""
    valid = [s for s in itertools.product(range(V), repeat=n) if is_valid(s)]
    logp, children = (np.asarray(a, np.float64) for a in lm.params)
    children = children.astype(int)
    probs = {}
    for s in valid:
        q, node = 1.0, 0
        for t in range(n):
            allowed = {x[t] for x in valid if x[:t] == s[:t]}
            p = np.exp(logp[node])
            q *= p[s[t]] / sum(p[v] for v in allowed)
            node = children[node, s[t]]
        probs[s] = q
    return probs


def gcd_samples(lm, n, N, seed, temperature=1.0):
    """N GCD samples of budget n from the toy LM (one jitted program)."""
    fa = compile_regex(PATTERN, VOCAB).to_device()
    tables = tables_for(fa, "gcd", n)
    ids, lens = pad_prompts([[0]] * N)
    return sample(jax.random.PRNGKey(seed), lm, lm.params, ids, lens, fa, tables, max_steps=n,
                  constrained=True, temperature=temperature)


def test_gcd_samples_match_enumeration():
    n, N = 4, 40000
    lm = toy_lm(n)
    out = gcd_samples(lm, n, N, seed=0)
    toks = np.asarray(out.tokens)
    assert np.asarray(out.valid).all()
    exact = exact_gcd_distribution(lm, n)
    assert abs(sum(exact.values()) - 1) < 1e-9
    keys = sorted(exact)
    index = {k: i for i, k in enumerate(keys)}
    counts = np.zeros(len(keys))
    for row in map(tuple, toks.tolist()):
        assert row in index, f"sampled an invalid sequence {row}"
        counts[index[row]] += 1
    expected = np.array([exact[k] for k in keys]) * N
    # pool cells with small expectation so the chi-square approximation holds
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    chi2, p = stats.chisquare(obs, exp)
    assert p > 1e-3, (chi2, p, len(obs))
    # and the sequence log-probability returned is the LM's own, the proposal's is q's
    lp = np.asarray(out.logprob)[:50]
    lq = np.asarray(out.proposal_logprob)[:50]
    for row, l, q in zip(toks[:50].tolist(), lp, lq):
        m = row.index(EOS) + 1
        assert abs(lm.sequence_logprob(row[:m]) - l) < 1e-4
        assert abs(np.log(exact[tuple(row)]) - q) < 1e-4


def exact_valid_mass(lm, n):
    """Z = p_lm(x ∈ L_n): Σ over valid length-n (EOS-padded) sequences of p_lm up to EOS."""
    valid = [s for s in itertools.product(range(V), repeat=n) if is_valid(s)]
    return sum(np.exp(lm.sequence_logprob(list(s[:s.index(EOS) + 1]))) for s in valid)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_importance_weights_are_unbiased(temperature):
    """E_q[p(x)/q(x)] = Z exactly for any proposal whose support covers L_n (GCD's
    does): the sample mean of exp(logprob - proposal_logprob) is within 4 standard
    errors of Z computed by enumeration."""
    n, N = 4, 40000
    lm = toy_lm(n)
    out = gcd_samples(lm, n, N, seed=1, temperature=temperature)
    w = np.exp(np.asarray(out.logprob, np.float64) - np.asarray(out.proposal_logprob, np.float64))
    Z = exact_valid_mass(lm, n)
    assert 0 < Z < 1
    se = w.std(ddof=1) / np.sqrt(N)
    assert abs(w.mean() - Z) < 4 * se + 1e-6, (w.mean(), Z, se)
    if temperature == 1.0:   # GCD weights are the kept mass Π_t Σ_v p m_t: at most 1
        assert w.max() <= 1 + 1e-5


def test_lcd_runs_out_of_budget_where_gcd_does_not():
    # the toy LM prefers long outputs; at budget 3, LCD often has no EOS in time
    n, N = 3, 4000
    lm = TableLM.bigram(np.array([0.01, 1, 1, 1, 1, 1.0]),
                        np.tile(np.array([0.01, 1, 1, 1, 1, 0.2]), (V, 1)), eos_token_id=EOS)
    fa = compile_regex(PATTERN, VOCAB).to_device()
    ids, lens = pad_prompts([[0]] * N)
    res = {}
    for method in ("gcd", "lcd"):
        out = sample(jax.random.PRNGKey(3), lm, lm.params, ids, lens, fa,
                     tables_for(fa, method, n), max_steps=n, constrained=True)
        res[method] = np.asarray(out.valid).mean()
        for row, v in zip(np.asarray(out.tokens).tolist(), np.asarray(out.valid)):
            assert v == is_valid(tuple(row))
    assert res["gcd"] == 1.0
    assert res["lcd"] < 0.5
