"""ψ^α tempering of the P-GCD proposals (``smc.run(..., psi_power=α)``): the weights stay
exact. With ``K = 1`` and no resampling each final log-weight is ``log p_lm(x) − log q(x)``,
compared sequence by sequence to a float64 reference of the tempered, defended proposal
built by brute force (``ψ`` as a sum over every valid completion under the HMM's forward
filter; ``test_smc_defensive``'s reference with the score raised to ``α``), not from
:mod:`jaxcd.decoding.pgcd`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcd import compile_regex
from jaxcd.decoding import smc
from test_smc import EOS, N, PATTERN, R, VOCAB, key_of, make_lm
from test_smc_defensive import VALID, reference_logq, zero_hmm


@pytest.fixture(scope="module")
def problem():
    return make_lm(), compile_regex(PATTERN, VOCAB), zero_hmm()


def run(lm, fa, hmm, proposal, lam, alpha, seed=11):
    ids, lens = jnp.zeros((R, 1), jnp.int32), jnp.ones((R,), jnp.int32)
    return smc.run(jax.random.key(seed), lm, lm.params, ids, lens, fa, budget=N,
                   num_particles=1, proposal=proposal, hmm=hmm, defensive=lam,
                   psi_power=alpha, ess_threshold=0.0)


@pytest.mark.parametrize("proposal", ["lookahead", "product"])
@pytest.mark.parametrize("alpha,lam", [(0.4, 0.05), (2.5, 0.05), (0.4, 0.0)])
def test_tempered_weights_are_exact(problem, proposal, alpha, lam):
    lm, fa, hmm = problem
    # tempering changes the proposal: the reference q differs from the untempered one
    diff = max(abs(reference_logq(lm, hmm, b, proposal, lam, alpha)
                   - reference_logq(lm, hmm, b, proposal, lam, 1.0))
               for b in VALID if np.isfinite(reference_logq(lm, hmm, b, proposal, lam, 1.0)))
    assert diff > 0.05
    res = run(lm, fa, hmm, proposal, lam, alpha)
    toks, lw = np.asarray(res.tokens), np.asarray(res.log_weights, np.float64)
    assert np.asarray(res.valid).all() and np.isfinite(lw).all()
    seen = set()
    for r in range(R):
        body = key_of(toks[r, 0])
        seen.add(body)
        ref = lm.sequence_logprob(body + (EOS,)) - reference_logq(lm, hmm, body, proposal, lam, alpha)
        np.testing.assert_allclose(lw[r, 0], ref, atol=2e-4, rtol=0)
    assert len(seen) >= 4


def test_power_one_is_the_default_and_bad_powers_are_errors(problem):
    lm, fa, hmm = problem
    ids, lens = jnp.zeros((R, 1), jnp.int32), jnp.ones((R,), jnp.int32)
    base = smc.run(jax.random.key(3), lm, lm.params, ids, lens, fa, budget=N, num_particles=2,
                   proposal="lookahead", hmm=hmm)
    one = smc.run(jax.random.key(3), lm, lm.params, ids, lens, fa, budget=N, num_particles=2,
                  proposal="lookahead", hmm=hmm, psi_power=1.0)
    np.testing.assert_array_equal(np.asarray(base.tokens), np.asarray(one.tokens))
    np.testing.assert_array_equal(np.asarray(base.log_weights), np.asarray(one.log_weights))
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="psi_power"):
            smc.run(jax.random.key(3), lm, lm.params, ids, lens, fa, budget=N, num_particles=2,
                    proposal="lookahead", hmm=hmm, psi_power=bad)
