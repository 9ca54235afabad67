r"""Dirichlet priors (pseudocounts) for the M-step, scaled to the data.

The M-step is the MAP estimate under Dirichlet priors with parameters ``1 + λ``
(:func:`hmm_distill.hmm.m_step`): ``π ∝ start + λ_π``, ``A_h ∝ trans_h + λ_A``,
``B_h ∝ emit_h + λ_B``. A fixed pseudocount per *entry* puts a prior mass of
``λ_B · V`` on every emission row; at ``V = 49152`` and ``λ_B = 0.01`` that is 491
pseudo-tokens per hidden state, as much as the data per state of a typical
distillation (2,048 × 48 tokens over ``H = 128`` states ≈ 690 tokens), and the prior
drowns the data.

:func:`data_prior` (the default, ``prior="data"``) instead sets the *total* prior mass
of each row to a fraction ``s`` (``prior_strength``, default 0.1) of the average
amount of data per row, and gives the emission prior the shape of the smoothed
unigram of the training data:

* emissions: ``λ_B(v) = s · (n_tokens / H) · u(v)`` with
  ``u(v) = (c_v + β) / (n_tokens + β V)`` (``β = unigram_smoothing``, default 0.1,
  so tokens never seen in training keep a positive probability);
* transitions: ``λ_A = s · (n_transitions / H) / H`` per entry (mass ``s ·
  n_transitions / H`` per row, spread uniformly);
* start: ``λ_π = s · n_seqs / H`` per entry.

So a state with an average share of the data is pulled ``s / (1 + s)`` of the way
toward the unigram (9% at the default), while a state that sees little data falls
back on the unigram instead of on a uniform distribution over 49,152 tokens.
The prior is computed once from the training set and then fixed, so full-batch EM
never decreases the penalised log-likelihood ``log p(X | θ) + log p(θ)``
(:meth:`Prior.log_density`), and at this strength the training log-likelihood
itself does not decrease either (tested at ``V = 49152``). The default 0.1 was chosen
on the SmolLM2 task distillation (``experiments/results/distill_task_prior_sweep.json``:
held-out gap share -0.06 / 0.09 / 0.13 / 0.13 at ``s`` = 0.01 / 0.1 / 0.3 / 1 on 128
sampled continuations; the training log-likelihood rose monotonically up to 0.3, not at 1).

Mini-batch EM uses the prior scaled by the batch's share of the training set
(:meth:`Prior.scaled`; see :mod:`hmm_distill.train`).

``prior="flat"`` reproduces the former fixed pseudocounts (``pseudocount`` for
``π``/``A``, ``emission_pseudocount`` per emission entry).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from .errors import ConfigError


@dataclass(frozen=True)
class Prior:
    """Pseudocounts ``λ_π`` (scalar or ``[H]``), ``λ_A`` (scalar or ``[H, H]``),
    ``λ_B`` (scalar or ``[V]``, shared by every state's row)."""

    start: float | np.ndarray
    trans: float | np.ndarray
    emit: float | np.ndarray

    def scaled(self, factor: float) -> "Prior":
        """The prior times ``factor`` (the share ``|b| / N`` of a mini-batch)."""
        f = float(factor)
        return Prior(*(np.asarray(x, np.float64) * f for x in (self.start, self.trans, self.emit)))

    def m_step_args(self, dtype=jnp.float32):
        """``(pseudocount, emission_pseudocount)`` as :func:`hmm_distill.hmm.m_step` takes them."""
        return ((jnp.asarray(self.start, dtype), jnp.asarray(self.trans, dtype)),
                jnp.asarray(self.emit, dtype))

    def log_density(self, params) -> float:
        """``Σ λ log θ`` over ``π``, ``A`` and ``B``: the log Dirichlet prior density up to
        its normalising constant (terms with ``λ = 0`` are 0 even where ``θ = 0``)."""
        pi, A, B = (np.asarray(x, np.float64) for x in params)
        tot = 0.0
        for lam, x in ((self.start, pi), (self.trans, A), (np.asarray(self.emit)[None] if np.ndim(self.emit)
                                                            else self.emit, B)):
            lam = np.broadcast_to(np.asarray(lam, np.float64), x.shape)
            with np.errstate(divide="ignore", invalid="ignore"):
                tot += float(np.sum(np.where(lam > 0, lam * np.log(x), 0.0)))
        return tot

    def row_mass(self, hidden_size: int, vocab_size: int) -> dict:
        """Total pseudo-counts per row of ``π``, ``A`` and ``B`` (for logs and metadata)."""
        H, V = hidden_size, vocab_size
        return {"start": float(np.sum(np.broadcast_to(self.start, (H,)))),
                "trans_row": float(np.sum(np.broadcast_to(self.trans, (H, H))) / H),
                "emit_row": float(np.sum(np.broadcast_to(self.emit, (V,))))}


def first_eos_mask(tokens: np.ndarray, eos_token_id: int | None) -> np.ndarray:
    """``mask [N, T]``: positions up to and including each row's first EOS (a row with
    no EOS is valid throughout). The EOS padding after the first EOS is masked out."""
    tokens = np.asarray(tokens)
    if eos_token_id is None:
        return np.ones(tokens.shape, bool)
    is_eos = tokens == int(eos_token_id)
    seen_before = np.cumsum(is_eos, axis=1) - is_eos  # EOS strictly before t
    return seen_before == 0


def unigram(tokens: np.ndarray, mask: np.ndarray | None, vocab_size: int, smoothing: float) -> np.ndarray:
    """Add-``β`` unigram ``u(v) = (c_v + β) / (n + β V)`` of the valid positions (float64 ``[V]``)."""
    t = np.asarray(tokens)
    t = t[mask] if mask is not None else t.ravel()
    c = np.bincount(t, minlength=vocab_size).astype(np.float64) + smoothing
    s = c.sum()
    if s <= 0:
        raise ConfigError("unigram of an empty data set with smoothing 0")
    return c / s


def data_prior(tokens: np.ndarray, mask: np.ndarray | None, hidden_size: int, vocab_size: int, *,
               strength: float = 0.01, unigram_smoothing: float = 0.1) -> Prior:
    """The data-scaled prior of the module docstring."""
    if strength < 0:
        raise ConfigError(f"prior_strength must be >= 0, got {strength}")
    if unigram_smoothing <= 0:
        raise ConfigError(f"unigram_smoothing must be > 0 (unseen tokens must stay possible), "
                          f"got {unigram_smoothing}")
    tokens = np.asarray(tokens)
    if mask is None:
        mask = np.ones(tokens.shape, bool)
    lens = mask.sum(1)
    counts = np.bincount(tokens[mask], minlength=vocab_size)
    return data_prior_from_counts(counts, int((lens > 0).sum()), int(np.maximum(lens - 1, 0).sum()),
                                  hidden_size, strength=strength, unigram_smoothing=unigram_smoothing)


def data_prior_from_counts(token_counts: np.ndarray, num_seqs: int, num_transitions: int,
                           hidden_size: int, *, strength: float = 0.01,
                           unigram_smoothing: float = 0.1) -> Prior:
    """:func:`data_prior` from the data's statistics: the count of each token ``[V]`` over
    the valid positions, the number of (non-empty) sequences and of transitions."""
    if strength < 0:
        raise ConfigError(f"prior_strength must be >= 0, got {strength}")
    if unigram_smoothing <= 0:
        raise ConfigError(f"unigram_smoothing must be > 0 (unseen tokens must stay possible), "
                          f"got {unigram_smoothing}")
    c = np.asarray(token_counts, np.float64)
    n_tok = float(c.sum())
    H, V = hidden_size, c.shape[0]
    u = (c + unigram_smoothing) / (n_tok + unigram_smoothing * V)
    return Prior(start=strength * float(num_seqs) / H,
                 trans=strength * (float(num_transitions) / H) / H,
                 emit=strength * (n_tok / H) * u)


def flat_prior(pseudocount: float, emission_pseudocount: float) -> Prior:
    """Fixed pseudocounts per entry (the former default: ``λ = λ_B = 0.01``)."""
    if pseudocount < 0 or emission_pseudocount < 0:
        raise ConfigError("pseudocounts must be >= 0")
    return Prior(float(pseudocount), float(pseudocount), float(emission_pseudocount))
