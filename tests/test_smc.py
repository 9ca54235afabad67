"""SMC (docs/design.md §6) against the exact posterior of a toy LM, by enumeration.

The LM is an explicit table (:class:`~jaxcd.lm.interface.TableLM`) over a 6-token
vocabulary; the posterior ``p(x | x ∈ L_n)`` and ``Z = p(x ∈ L_n)`` are enumerated.
The GCD proposal is visibly biased on this problem (checked below), so the tests can
tell a weighted ensemble that converges from one that does not.

Independent runs are the ``B`` prompts of one call (the table LM ignores its prompt).
"""

import itertools
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmm_distill import HMMParams
from jaxcd import Vocabulary, compile_regex
from jaxcd.decoding import pgcd, smc
from jaxcd.lm.hmm_lm import HMMLM
from jaxcd.lm.interface import TableLM

TOKENS = [b"<eos>", b"a", b"b", b"aa", b"ab", b"-"]
EOS = 0
V = len(TOKENS)
VOCAB = Vocabulary.from_token_bytes(TOKENS, eos_id=EOS)
PATTERN = r"a{3}b?|b-?|ab-"
N = 4
R = 300         # independent runs (the B prompts of one call); one shape for every test


def lm_probs(prefix):
    """A fixed, peaked LM: strongly prefers "a" first, and is reluctant to finish "aaa"."""
    rng = np.random.default_rng(abs(hash(tuple(prefix))) % (2 ** 32))
    p = rng.dirichlet(np.ones(V) * 0.6)
    if len(prefix) == 0:
        p = np.array([0.02, 0.6, 0.18, 0.05, 0.1, 0.05])
    if tuple(prefix) == (1,):
        p = np.array([0.3, 0.02, 0.4, 0.03, 0.05, 0.2])
    return p


def make_lm(dtype=np.float32):
    return TableLM.from_function(lm_probs, V, N, EOS, dtype=dtype)


def decode(seq):
    try:
        return b"".join(TOKENS[v] for v in seq).decode()
    except UnicodeDecodeError:
        return None


def exact_posterior(lm, pattern=PATTERN, n=N):
    post = {}
    for m in range(1, n + 1):
        for body in itertools.product(range(1, V), repeat=m - 1):
            text = decode(body)
            if text is not None and re.fullmatch(pattern, text):
                post[body] = np.exp(lm.sequence_logprob(body + (EOS,)))
    Z = sum(post.values())
    return {k: v / Z for k, v in post.items()}, Z


def key_of(row):
    row = list(row)
    return tuple(row[:row.index(EOS)]) if EOS in row else tuple(row)


def pooled(res, weighted=True):
    toks = np.asarray(res.tokens)
    lw = np.asarray(res.log_weights, np.float64)
    R, K, _ = toks.shape
    est = {}
    for r in range(R):
        if weighted:
            if not np.isfinite(lw[r]).any():
                continue
            w = np.exp(lw[r] - lw[r].max())
            w /= w.sum()
        else:
            w = np.full(K, 1.0 / K)
        for k in range(K):
            est[key_of(toks[r, k])] = est.get(key_of(toks[r, k]), 0.0) + w[k] / R
    return est


def tv(p, q):
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def random_hmm(H, seed):
    rng = np.random.default_rng(seed)
    return HMMParams(rng.dirichlet(np.ones(H)), rng.dirichlet(np.ones(H), size=H),
                     rng.dirichlet(np.ones(V), size=H))


def run(lm, fa, R, K, proposal, hmm=None, seed=0, **kw):
    ids = jnp.zeros((R, 1), jnp.int32)
    lens = jnp.ones((R,), jnp.int32)
    return smc.run(jax.random.key(seed), lm, lm.params, ids, lens, fa, budget=N,
                   num_particles=K, proposal=proposal, hmm=hmm, **kw)


@pytest.fixture(scope="module")
def problem():
    lm = make_lm()
    fa = compile_regex(PATTERN, VOCAB)
    post, Z = exact_posterior(lm)
    return lm, fa, post, Z


@pytest.mark.parametrize("proposal", ["gcd", "lcd", "lookahead", "product"])
def test_weighted_ensemble_converges_to_posterior(problem, proposal):
    lm, fa, post, Z = problem
    hmm = random_hmm(3, seed=1) if proposal in ("lookahead", "product") else None
    tvs = {}
    for K in (2, 32):
        res = run(lm, fa, R, K, proposal, hmm=hmm, seed=K)
        toks = np.asarray(res.tokens)
        valid = np.asarray(res.valid)
        lw = np.asarray(res.log_weights)
        # every positive-weight particle is valid and its text is in the language
        assert np.all(valid[np.isfinite(lw)])
        if proposal != "lcd":
            assert valid.all()
        for r, k in zip(*np.nonzero(valid)):
            assert re.fullmatch(PATTERN, decode(key_of(toks[r, k])))
        tvs[K] = tv(pooled(res), post)
        # unbiased evidence: mean of Ẑ over R runs within 4 standard errors of Z
        zhat = np.exp(np.asarray(res.log_Z, np.float64))
        se = zhat.std(ddof=1) / np.sqrt(R)
        assert abs(zhat.mean() - Z) < 4 * se + 1e-6, (K, zhat.mean(), Z, se)
    # self-normalised bias O(1/K) plus Monte-Carlo error: small at K = 32 and falling
    assert tvs[32] < 0.03, tvs
    assert tvs[32] < tvs[2], tvs


def test_unweighted_gcd_and_lcd_samples_stay_biased(problem):
    lm, fa, post, _ = problem
    for proposal in ("gcd", "lcd"):
        res = run(lm, fa, R, 32, proposal, ess_threshold=0.0)
        toks = np.asarray(res.tokens)
        valid = np.asarray(res.valid)
        emp = {}
        cnt = int(valid.sum())
        for r, k in zip(*np.nonzero(valid)):
            emp[key_of(toks[r, k])] = emp.get(key_of(toks[r, k]), 0) + 1 / cnt
        assert tv(emp, post) > 0.15, (proposal, tv(emp, post))
        # and the weighted ensemble of the same particles fixes it
        assert tv(pooled(res), post) < 0.05


def test_zero_variance_when_the_lm_is_the_hmm():
    """LM = HMM: the pure lookahead proposal (``defensive=0``) is the exact posterior and
    every particle's final log-weight equals log Z (enumerated) to 1e-9. (The default
    defensive mixture gives up this zero variance: ``tests/test_smc_defensive.py``.)"""
    with jax.enable_x64(True):
        hmm = HMMParams(*(jnp.asarray(a, jnp.float64) for a in random_hmm(4, seed=5)))
        lm = HMMLM(V, EOS)
        fa = compile_regex(PATTERN, VOCAB)
        # exact Z by enumeration under the HMM
        pi, A, B = (np.asarray(a) for a in hmm)
        Z = 0.0
        for m in range(1, N + 1):
            for body in itertools.product(range(1, V), repeat=m - 1):
                text = decode(body)
                if text is not None and re.fullmatch(PATTERN, text):
                    f = pi.copy()
                    for v in body:
                        f = (f * B[:, v]) @ A
                    Z += f @ B[:, EOS]
        ids = jnp.zeros((3, 1), jnp.int32)
        res = smc.run(jax.random.key(0), lm, hmm, ids, jnp.ones(3, jnp.int32), fa, budget=N,
                      num_particles=8, proposal="lookahead", hmm=hmm, defensive=0.0)
        lw = np.asarray(res.log_weights)
        assert lw.dtype == np.float64
        np.testing.assert_allclose(lw, np.log(Z), atol=1e-9, rtol=0)
        np.testing.assert_allclose(np.asarray(res.log_Z), np.log(Z), atol=1e-9, rtol=0)
        assert np.asarray(res.valid).all()
        assert not np.asarray(res.resampled).any()       # ESS = K throughout


def test_resampling_bookkeeping(problem):
    lm, fa, _, _ = problem
    res = run(lm, fa, R, 32, "gcd", ess_threshold=1.0, resample="multinomial")
    assert np.asarray(res.resampled)[:, :-1].any()
    ess = np.asarray(res.ess)
    assert np.all((ess >= 1 - 1e-4) & (ess <= 32 + 1e-4))
    never = run(lm, fa, R, 32, "gcd", ess_threshold=0.0)
    assert not np.asarray(never.resampled).any()


def test_impossible_constraint_gives_minus_inf_evidence():
    """An LM that never emits 'b' under a constraint that needs one: every weight is 0,
    no resampling, log Z = -inf, and no exception."""
    def fn(prefix):
        p = np.ones(V)
        p[2] = 0.0
        p[4] = 0.0
        return p
    lm = TableLM.from_function(fn, V, N, EOS)
    fa = compile_regex(r"b-?", VOCAB)
    res = run(lm, fa, 4, 8, "gcd")
    assert np.all(np.asarray(res.log_Z) == -np.inf)
    assert not np.asarray(res.resampled).any()


def test_clear_errors(problem):
    lm, fa, _, _ = problem
    with pytest.raises(ValueError, match="needs an HMM"):
        run(lm, fa, 2, 4, "lookahead")
    with pytest.raises(ValueError, match="proposal must be one of"):
        run(lm, fa, 2, 4, "magic")
    bad = HMMParams(np.ones(2) / 2, np.ones((2, 2)) / 2, np.ones((2, V + 3)) / (V + 3))
    with pytest.raises(ValueError, match="hmm-distill"):
        run(lm, fa, 2, 4, "lookahead", hmm=bad)
    other = Vocabulary.from_token_bytes(TOKENS[1:] + [b"<eos>"], eos_id=V - 1)
    with pytest.raises(ValueError, match="EOS"):
        run(lm, compile_regex(PATTERN, other), 2, 4, "gcd")
    with pytest.raises(ValueError, match="smallest budget"):
        smc.run(jax.random.key(0), lm, lm.params, jnp.zeros((1, 1), jnp.int32),
                jnp.ones(1, jnp.int32), compile_regex("aaaaaa", VOCAB), budget=2,
                num_particles=2)


def test_particles_sharded_over_forced_host_devices(tmp_path):
    """Four forced host devices: the particle axis is sharded and the result equals the
    one-device result from the same key."""
    code = textwrap.dedent(f"""
        import os, sys, json
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import jax, jax.numpy as jnp, numpy as np
        import test_smc as T
        lm = T.make_lm(); fa = T.compile_regex(T.PATTERN, T.VOCAB)
        res = T.run(lm, fa, 4, 8, "lookahead", hmm=T.random_hmm(3, 1), seed=3)
        np.savez(sys.argv[1], tokens=np.asarray(res.tokens), lw=np.asarray(res.log_weights),
                 n=len(jax.devices()))
    """)
    assert len(jax.devices()) == 1                 # the reference: this process, one device
    res = run(make_lm(), compile_regex(PATTERN, VOCAB), 4, 8, "lookahead",
              hmm=random_hmm(3, 1), seed=3)
    outs = [{"tokens": np.asarray(res.tokens), "lw": np.asarray(res.log_weights)}]
    # the child compiles with XLA's defaults (XLA_FLAGS replaced: default CPU emitters and
    # optimisation level), this process with the suite's flags (tests/conftest.py): the same
    # results check those flags, too
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    f = tmp_path / "r4.npz"
    subprocess.run([sys.executable, "-c", code, str(f)], check=True, env=env, timeout=300)
    outs.append(np.load(f))
    assert int(outs[1]["n"]) == 4
    np.testing.assert_array_equal(outs[0]["tokens"], outs[1]["tokens"])
    np.testing.assert_allclose(outs[0]["lw"], outs[1]["lw"], rtol=1e-5, atol=1e-5)


def test_mismatched_tables_and_eos_are_clear_errors(problem):
    """Where automaton, tables and LM meet, a mismatch is a clear error, not a silent
    out-of-range gather."""
    from jaxcd.decoding import decode, gcd
    lm, fa, _, _ = problem
    other = compile_regex(r"a{5}", VOCAB)
    hmm = random_hmm(2, seed=0)
    tables = pgcd.backward(other, hmm, 8)
    st = pgcd.init_state(fa, hmm)
    with pytest.raises(pgcd.HMMMismatchError, match="do not fit"):
        pgcd.token_logpsi(fa.to_device(), hmm, tables, st)
    ids, lens = jnp.zeros((1, 1), jnp.int32), jnp.ones(1, jnp.int32)
    with pytest.raises(ValueError, match="fewer than budget"):
        decode.sample(jax.random.key(0), lm, lm.params, ids, lens, fa.to_device(),
                      gcd.backward(fa.to_device(), 3), max_steps=N, constrained=True)
    swapped = Vocabulary.from_token_bytes(TOKENS[1:] + [b"<eos>"], eos_id=V - 1)
    fa2 = compile_regex(PATTERN, swapped).to_device()
    with pytest.raises(ValueError, match="EOS"):
        decode.sample(jax.random.key(0), lm, lm.params, ids, lens, fa2, gcd.backward(fa2, N),
                      max_steps=N, constrained=True)


def test_prebuilt_tables_give_the_same_run(problem):
    from jaxcd.decoding import gcd
    lm, fa, _, _ = problem
    hmm = random_hmm(3, seed=1)
    a = run(lm, fa, R, 32, "lookahead", hmm=hmm, seed=7)
    b = run(lm, fa, R, 32, "lookahead", hmm=hmm, seed=7, tables=gcd.backward(fa.to_device(), N),
            ptables=pgcd.backward(fa, hmm, N))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.log_weights), np.asarray(b.log_weights))
    with pytest.raises(ValueError, match="budget"):
        run(lm, fa, R, 32, "lookahead", hmm=hmm, ptables=pgcd.backward(fa, hmm, N + 2))
