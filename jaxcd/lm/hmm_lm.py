"""An HMM as a language model (for exact tests of P-GCD and SMC).

``HMMLM`` implements :class:`~jaxcd.lm.interface.LanguageModel` over
``hmm_distill.HMMParams`` passed as ``params``: the state of a sequence is the
predictive hidden vector ``u = p(z_{t+1} | x_{1:t})`` (``π`` after the prompt, which is
ignored), and the next-token log-probabilities are ``log(u · B)``. When the LM *is*
the HMM that P-GCD uses, the ``lookahead`` proposal is the exact posterior and every
SMC weight equals ``log Z`` (the zero-variance check).
"""

from __future__ import annotations

import jax.numpy as jnp


class HMMLM:
    """``HMMLM(vocab_size, eos_token_id)``; params: ``HMMParams(pi, A, B)``."""

    def __init__(self, vocab_size: int, eos_token_id: int):
        self.vocab_size = int(vocab_size)
        self.eos_token_id = int(eos_token_id)

    def __hash__(self):
        return hash(("HMMLM", self.vocab_size, self.eos_token_id))

    def __eq__(self, other):
        return isinstance(other, HMMLM) and (self.vocab_size, self.eos_token_id) == \
            (other.vocab_size, other.eos_token_id)

    @staticmethod
    def _logp(params, u):
        p = u @ params.B
        return jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), -jnp.inf)

    def prefill(self, params, prompt_ids, prompt_lengths, max_len):
        u = jnp.broadcast_to(params.pi / jnp.sum(params.pi), (prompt_ids.shape[0],) + params.pi.shape)
        return u, self._logp(params, u)

    def step(self, params, state, tokens):
        alpha = state * params.B[:, tokens].T
        z = jnp.sum(alpha, axis=1, keepdims=True)
        alpha = jnp.where(z > 0, alpha / jnp.where(z > 0, z, 1.0), 0.0)
        u = alpha @ params.A
        return u, self._logp(params, u)
