"""Result type shared by the particle samplers (:mod:`jaxcd.decoding.smc`)."""

from __future__ import annotations

from typing import NamedTuple

import jax


class SMCResult(NamedTuple):
    """What :func:`jaxcd.decoding.smc.run` and :func:`jaxcd.decoding.smc.run_blackbox` return.

    ``B`` prompts, ``K`` particles each, budget ``n``:

    - ``tokens``: int32 ``[B, K, n]``, EOS-padded.
    - ``log_weights``: float ``[B, K]``, final unnormalised log-weights: the weighted
      ensemble ``Σ_k w_k δ(x_k) / Σ_k w_k`` approximates ``p(x | prompt, x ∈ L_n)``.
    - ``log_Z``: float ``[B]``, log of an unbiased estimate of ``p_lm(x ∈ L_n | prompt)``
      (``-inf`` when every particle has weight 0).
    - ``valid``: bool ``[B, K]``, the particle's output meets the constraint.
    - ``ess``: float ``[B, n]``, effective sample size ``(Σw)²/Σw²`` after each step's
      reweighting (before any resampling).
    - ``resampled``: bool ``[B, n]``, whether that prompt's particles were resampled
      after step ``t``.
    - ``num_checks``: int ``[B, K]`` constraint checks spent (AWRS; ``None`` otherwise).
    - ``steps``: int ``[]``, decoding steps actually run (the loop stops once every
      particle has emitted EOS): divide timings by this, not by the budget.
    """

    tokens: jax.Array
    log_weights: jax.Array
    log_Z: jax.Array
    valid: jax.Array
    ess: jax.Array
    resampled: jax.Array
    num_checks: jax.Array | None = None
    steps: jax.Array | None = None
