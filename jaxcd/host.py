"""Host-side (NumPy) masks for one budget: a table lookup and a row copy per step.

The jitted masks of :mod:`jaxcd.decoding.gcd` are meant to be fused into a jitted decoding
step (the LM, the mask and the sampler in one XLA program). Code that decodes from
Python one step at a time — a PyTorch ``transformers`` model through
:class:`jaxcd.hf.GCDLogitsProcessor`, a server loop, a CPU benchmark — would pay
JAX's per-call dispatch (a few µs on CPU) for what is a table lookup. A
:class:`HostMasker` precomputes, for one budget ``n``, the row of ``cum_masks`` that
holds the GCD mask of every ``(t, state)``:

    rows[t, s] = base[s] + Σ_{e: src(e)=s} β_{t+1}(dst e)       t = 0 … n-1
    rows[n, s] = base[s]                                         (budget spent: empty)

with ``β_{t+1}(s') = 1{dist[s'] ≤ n - t - 1}`` (docs/design.md §3; see
:mod:`jaxcd.automata.tensorized` for why the live out-edges form a prefix), so a mask is
``cum_masks[rows[t, s]]``: two index operations (the table holds rows of
``cum_masks``, i.e. the logical rows above already mapped through ``fa.row_index``). For LCD (``budget=None``) the row is
``base[s] + outdeg(s)`` whatever ``t``. The table costs ``4 (n + 1) S`` bytes.

``t`` counts the tokens generated so far (EOS padding included), like
:class:`jaxcd.decoding.gcd.ConstraintState`; the mask is the one for token ``t + 1``.
"""

from __future__ import annotations

import jax
import numpy as np

from .automata.bits import unpack_bits
from .automata.tensorized import TensorizedAutomaton
from .decoding.gcd import check_budget

__all__ = ["HostMasker"]


class HostMasker:
    """GCD (``budget=n``) or LCD (``budget=None``) masks of one automaton on the host.

    Args:
      fa: the constraint (NumPy or device arrays; a host copy is used).
      budget: tokens, EOS included; raises
        :class:`~jaxcd.errors.BudgetTooSmallError` if the constraint needs more.
        ``None`` = LCD (no budget).
    """

    def __init__(self, fa: TensorizedAutomaton, budget: int | None):
        fa = jax.device_get(fa)
        self.fa = fa
        S = fa.num_states
        out_start = np.asarray(fa.out_start, np.int64)
        base = out_start[:-1] + np.arange(S)
        if budget is None:
            self.budget = None
            rows = (base + np.diff(out_start))[None, :]
        else:
            check_budget(fa, budget)
            self.budget = n = int(budget)
            dist = np.asarray(fa.dist, np.int64)
            # edges are sorted by (src, dist[dst]): count those with dist <= n-t-1 by
            # one searchsorted on the key src * M + dist
            M = n + 2
            d = np.minimum(dist[np.asarray(fa.edge_dst)], M - 1)
            key = np.asarray(fa.edge_src, np.int64) * M + d
            assert np.all(np.diff(key) >= 0), "edges must be sorted by (src, dist[dst])"
            limit = np.arange(n - 1, -2, -1)                      # n-t-1 for t = 0..n
            q = np.arange(S)[None, :] * M + limit[:, None]        # [n + 1, S]
            live = np.searchsorted(key, q, side="right") - out_start[None, :-1]
            rows = base[None, :] + live
            assert np.all(rows[n] == base)
        self.rows = np.ascontiguousarray(np.asarray(fa.row_index)[rows], np.int32)
        cum = np.asarray(fa.cum_masks).view()
        cum.flags.writeable = False        # masks handed out are views of the table
        self.cum_masks = cum
        self.num_words = int(cum.shape[1])
        self._last = self.rows.shape[0] - 1
        self._num_states = S

    @property
    def nbytes(self) -> int:
        """Bytes of the row table (the masks are shared with ``fa``)."""
        return int(self.rows.nbytes)

    def mask_words(self, state: int, t: int = 0, out: np.ndarray | None = None) -> np.ndarray:
        """Packed mask, uint32 ``[W]``, of the token after ``t`` generated tokens from
        ``state``. Without ``out``: a read-only view into the table (no copy)."""
        if not (0 <= state < self._num_states and t >= 0):
            raise ValueError(f"HostMasker.mask_words: need 0 <= state < {self._num_states} "
                             f"and t >= 0, got state={state}, t={t}")
        row = self.rows[min(t, self._last), state]
        if out is None:
            return self.cum_masks[row]
        out[...] = self.cum_masks[row]
        return out

    def batch_mask_words(self, states, ts, out: np.ndarray | None = None) -> np.ndarray:
        """Packed masks, uint32 ``[B, W]``, for rows in ``states`` after ``ts`` tokens
        (arrays of length ``B``); one gather."""
        states, ts = np.asarray(states), np.asarray(ts)
        if states.shape != ts.shape or states.ndim != 1:
            raise ValueError(f"HostMasker.batch_mask_words: states and ts must be 1-D of one "
                             f"length, got shapes {states.shape} and {ts.shape}")
        if states.size and (states.min() < 0 or states.max() >= self._num_states or ts.min() < 0):
            raise ValueError(f"HostMasker.batch_mask_words: need 0 <= states < "
                             f"{self._num_states} and ts >= 0")
        rows = self.rows[np.minimum(ts, self._last), states]
        return np.take(self.cum_masks, rows, axis=0, out=out)

    def mask(self, state: int, t: int = 0) -> np.ndarray:
        """Bool ``[vocab_size]`` mask (see :meth:`mask_words`)."""
        return unpack_bits(self.mask_words(state, t), self.fa.vocab_size)
