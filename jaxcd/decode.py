"""Constrained sampling from a language model: unconstrained, LCD and GCD.

One jitted program per (LM, number of sequences, budget, method): a ``lax.scan``
over exactly ``budget`` steps with fixed shapes and a ``done`` mask (a finished
sequence keeps emitting EOS). Per step and sequence::

    logp  = lm.step(...)                        # [V] next-token log-probabilities
    m     = mask(fa, tables, cs)                # GCD: β_{t+1}-live tokens; LCD: β_∞
    x     ~ softmax((logp + log m) / temperature)
    cs    = advance(fa, cs, x)

With GCD tables, every sampled sequence ends in ``⊥`` within the budget (DESIGN.md
§3); LCD may run out of budget mid-output (``valid = False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import gcd
from .tensorize import TensorizedAutomaton

METHODS = ("none", "lcd", "gcd")


class SampleOutput(NamedTuple):
    tokens: jax.Array        # int32 [B, n]  (EOS-padded)
    valid: jax.Array         # bool [B]     ended in ⊥ (constraint met, EOS emitted)
    ended: jax.Array         # bool [B]     emitted EOS within the budget
    logprob: jax.Array       # float32 [B]  Σ log p_lm of the sampled tokens up to EOS


@partial(jax.jit, static_argnames=("lm", "budget", "constrained", "greedy"))
def sample(key: jax.Array, lm, params: Any, prompt_ids: jax.Array, prompt_lengths: jax.Array,
           fa: TensorizedAutomaton | None, tables: gcd.BudgetTables | None, *, budget: int,
           constrained: bool, temperature: float = 1.0, greedy: bool = False) -> SampleOutput:
    """Sample ``budget`` tokens for every prompt (left-padded ``[B, P]``)."""
    B = prompt_ids.shape[0]
    max_len = prompt_ids.shape[1] + budget
    lm_state, logp = lm.prefill(params, prompt_ids, prompt_lengths, max_len)
    eos = lm.eos_token_id
    if constrained:
        cs = jax.vmap(lambda _: gcd.init_state(fa))(jnp.arange(B))
    else:
        cs = gcd.ConstraintState(jnp.zeros(B, jnp.int32), jnp.zeros(B, jnp.int32))

    def step(carry, k):
        lm_state, logp, cs, done, total = carry
        if constrained:
            m = jax.vmap(gcd.mask, in_axes=(None, None, 0))(fa, tables, cs)
            m = m[:, :logp.shape[1]] if m.shape[1] >= logp.shape[1] else jnp.pad(
                m, ((0, 0), (0, logp.shape[1] - m.shape[1])))
            masked = jnp.where(m, logp, -jnp.inf)
        else:
            masked = logp
        if greedy:
            tok = jnp.argmax(masked, axis=-1)
        else:
            tok = jax.random.categorical(k, masked / temperature, axis=-1)
        tok = jnp.where(done, eos, tok).astype(jnp.int32)
        lp = jnp.take_along_axis(logp, tok[:, None], axis=1)[:, 0]
        total = total + jnp.where(done, 0.0, lp)
        if constrained:
            cs = jax.vmap(gcd.advance, in_axes=(None, 0, 0))(fa, cs, tok)
        done = done | (tok == eos)
        lm_state, logp = lm.step(params, lm_state, tok)
        return (lm_state, logp, cs, done, total), tok

    init = (lm_state, logp, cs, jnp.zeros(B, bool), jnp.zeros(B, jnp.float32))
    (_, _, cs, done, total), toks = jax.lax.scan(step, init, jax.random.split(key, budget))
    valid = (cs.state == fa.final_state) if constrained else done
    return SampleOutput(toks.T, valid, done, total)


def tables_for(fa: TensorizedAutomaton, method: str, budget: int) -> gcd.BudgetTables | None:
    """β tables for ``method`` ('gcd' checks the budget first and names the minimum)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "gcd":
        gcd.check_budget(fa, budget)
        return gcd.backward(fa, budget)
    if method == "lcd":
        return gcd.lcd_tables(fa, budget)
    return None
