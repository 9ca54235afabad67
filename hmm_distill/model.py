"""The HMM as a Flax NNX module.

:class:`HMM` holds ``π [H]``, ``A [H, H]``, ``B [H, V]`` as :class:`HMMProb`
variables (an ``nnx.Param`` subclass) that always store *normalised probability
arrays* (exact zeros allowed): EM replaces them with closed-form normalised
M-step estimates or convex combinations of normalised arrays, so they never drift
off the simplex. The maths lives in the pure functions of :mod:`hmm_distill.hmm`
(``forward``, ``backward``, ``posteriors``, ``log_likelihood``, ``predictive_logprobs``,
``sample``, ``expected_counts``), which take an :class:`~hmm_distill.hmm.HMMParams`
tuple: :attr:`HMM.params` returns one, so code that multiplies the HMM with an
automaton can work on plain arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from . import hmm as F
from .hmm import HMMParams


class HMMProb(nnx.Param):
    """A probability table (rows on the simplex). Not meant for gradient updates."""


class HMM(nnx.Module):
    """Discrete HMM over a token vocabulary.

    Args:
      hidden_size: ``H``.
      vocab_size: ``V``.
      rngs: used for a random initialisation (see :func:`hmm_distill.hmm.random_params`)
        when ``params`` is not given.
      params: explicit :class:`HMMParams` (validated).
      noise: log-scale noise of the random initialisation.
      dtype: float dtype of the tables.
    """

    def __init__(self, hidden_size: int, vocab_size: int, *, rngs: nnx.Rngs | None = None,
                 params: HMMParams | None = None, noise: float = 1.0, dtype=jnp.float32):
        if params is None:
            key = (rngs if rngs is not None else nnx.Rngs(0)).params()
            params = F.random_params(key, hidden_size, vocab_size, noise=noise, dtype=dtype)
        else:
            params = F.as_params(*params, dtype=dtype)
            if params.A.shape != (hidden_size, hidden_size) or params.B.shape != (hidden_size, vocab_size):
                raise F.InvalidParamsError(
                    f"HMM(hidden_size={hidden_size}, vocab_size={vocab_size}) got params of shapes "
                    f"pi {params.pi.shape}, A {params.A.shape}, B {params.B.shape}")
            F.validate_params(params)
        self.hidden_size = int(hidden_size)
        self.vocab_size = int(vocab_size)
        self.pi = HMMProb(params.pi)
        self.A = HMMProb(params.A)
        self.B = HMMProb(params.B)

    # -- parameters -----------------------------------------------------------------------
    @property
    def params(self) -> HMMParams:
        return HMMParams(self.pi[...], self.A[...], self.B[...])

    def set_params(self, params: HMMParams) -> None:
        """Replace the tables (shapes must match; values are assumed normalised)."""
        for name, new in zip(("pi", "A", "B"), params):
            var = getattr(self, name)
            if tuple(new.shape) != tuple(var[...].shape):
                raise F.InvalidParamsError(
                    f"set_params: {name} has shape {tuple(new.shape)}, expected {tuple(var[...].shape)}")
            var[...] = jnp.asarray(new, var[...].dtype)

    @classmethod
    def from_params(cls, params: HMMParams, dtype=jnp.float32) -> "HMM":
        return cls(int(params.A.shape[0]), int(params.B.shape[1]), params=params, dtype=dtype)

    # -- inference ------------------------------------------------------------------------
    def log_likelihood(self, tokens, mask=None):
        """``log p(x^n)``, float ``[N]``."""
        return F.log_likelihood(self.params, tokens, mask)

    def forward(self, tokens, mask=None):
        return F.forward(self.params, tokens, mask)

    def backward(self, tokens, mask=None):
        return F.backward(self.params, tokens, mask)

    def posteriors(self, tokens, mask=None):
        return F.posteriors(self.params, tokens, mask)

    def predictive_logprobs(self, tokens, mask=None):
        """``log p(next token | prefix)``, float ``[N, V]``."""
        return F.predictive_logprobs(self.params, tokens, mask)

    def sample(self, key, num: int, length: int):
        return F.sample(self.params, key, num, length)

    def __call__(self, tokens, mask=None):
        return self.log_likelihood(tokens, mask)

    # -- EM -------------------------------------------------------------------------------
    def em_step(self, tokens, mask=None, *, pseudocount: float = 0.0, eta: float = 1.0) -> jax.Array:
        """One (full-batch if ``eta = 1``) EM update in place on ``tokens``; returns the
        log-likelihood of the batch under the parameters *before* the update."""
        counts = F.expected_counts_jit(self.params, tokens, mask)
        new = F.m_step(counts, self.params, pseudocount)
        self.set_params(F.mix_params(self.params, new, eta) if eta != 1.0 else new)
        return counts.loglik
