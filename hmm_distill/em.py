r"""Baum–Welch EM, full-batch and mini-batch, data-parallel over a device mesh.

E-step (per batch): :func:`hmm_distill.hmm.expected_counts`. With a mesh of ``D``
devices the batch axis is sharded (``P('data')``), each device computes the counts
of its ``N/D`` sequences and ``lax.psum`` sums them (``jax.shard_map``); parameters
are replicated. Batches are padded with fully masked rows (which contribute exactly
zero) to a fixed size divisible by ``D``, so one compiled program serves all batches.

M-step: :func:`hmm_distill.hmm.m_step` (normalised counts + pseudocount ``λ``).

* Full-batch EM: counts summed over all batches of the training set, then one
  M-step per epoch: ``θ ← M(Σ_b s_b)``. Never decreases the training likelihood
  (with ``λ = 0``; with ``λ > 0`` it never decreases the penalised likelihood).
* Mini-batch (stochastic) EM: after each batch ``b_k``,
  ``θ ← (1 - η_k) θ + η_k M(s_{b_k})`` with ``η_k = min(1, (k + k₀)^{-κ})``,
  ``κ ∈ (0.5, 1]`` (Robbins–Monro conditions ``Σ η = ∞``, ``Σ η² < ∞``). The
  training job passes the pseudocount scaled by the batch's share of the data,
  ``λ|b|/N`` (see :mod:`hmm_distill.train`).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from . import hmm as F
from .errors import ConfigError
from .hmm import Counts, HMMParams
from .priors import Prior

AXIS = "data"


def _shard_map(f, mesh, in_specs, out_specs):
    """``jax.shard_map`` (jax >= 0.6) or ``jax.experimental.shard_map.shard_map`` (older)."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    from jax.experimental.shard_map import shard_map  # pragma: no cover - old jax

    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def step_size(k: int, k0: float = 2.0, kappa: float = 0.7) -> float:
    """Stochastic-EM step size ``η_k = min(1, (k + k0)^-κ)`` for update ``k = 0, 1, ...``."""
    if not 0.5 < kappa <= 1.0:
        raise ConfigError(f"step-size exponent kappa must be in (0.5, 1], got {kappa}")
    if k0 < 0:
        raise ConfigError(f"step-size offset k0 must be >= 0, got {k0}")
    return float(min(1.0, (k + k0) ** (-kappa))) if k + k0 > 0 else 1.0


def make_mesh(num_devices: int | None = None, devices=None) -> Mesh:
    """1-D mesh ``('data',)`` over the first ``num_devices`` devices (default all)."""
    devs = list(devices if devices is not None else jax.devices())
    if num_devices is not None:
        if num_devices < 1 or num_devices > len(devs):
            raise ConfigError(f"asked for {num_devices} devices, {len(devs)} available")
        devs = devs[:num_devices]
    return Mesh(np.array(devs), (AXIS,))


def pad_batch(tokens: np.ndarray, mask: np.ndarray | None, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pad ``tokens [n, T]`` (and ``mask``) with fully masked rows up to ``size`` rows."""
    tokens = np.asarray(tokens, np.int32)
    n, T = tokens.shape
    if mask is None:
        mask = np.ones((n, T), bool)
    if n > size:
        raise ValueError(f"batch of {n} rows does not fit the compiled batch size {size}")
    if n == size:
        return tokens, np.asarray(mask, bool)
    tok = np.zeros((size, T), np.int32)
    msk = np.zeros((size, T), bool)
    tok[:n], msk[:n] = tokens, mask
    return tok, msk


def prior_args(pseudocount, emission_pseudocount=None):
    """``(λ_π, λ_A), λ_B`` as host arrays from a :class:`~hmm_distill.priors.Prior` or
    from scalars (``λ_B`` defaults to ``λ``)."""
    if isinstance(pseudocount, Prior):
        return ((np.asarray(pseudocount.start, np.float64), np.asarray(pseudocount.trans, np.float64)),
                np.asarray(pseudocount.emit, np.float64))
    lam = np.float64(pseudocount)
    lam_b = lam if emission_pseudocount is None else np.asarray(emission_pseudocount, np.float64)
    return (lam, lam), lam_b


def _from_local(sharding: NamedSharding, global_rows: np.ndarray) -> jax.Array:
    """A batch-sharded global array from the full host batch: this process contributes
    the rows of its addressable devices only."""
    n = global_rows.shape[0]
    idx = sharding.addressable_devices_indices_map(global_rows.shape)
    starts = sorted({(sl[0].start or 0) for sl in idx.values()})
    stops = sorted({(sl[0].stop if sl[0].stop is not None else n) for sl in idx.values()})
    lo, hi = starts[0], stops[-1]
    return jax.make_array_from_process_local_data(sharding, global_rows[lo:hi], global_rows.shape)


def _finite(c: Counts) -> jax.Array:
    return (jnp.all(jnp.isfinite(c.start)) & jnp.all(jnp.isfinite(c.trans))
            & jnp.isfinite(jnp.sum(c.emit_vh)) & jnp.isfinite(c.loglik))


class EM:
    """Compiled EM steps over a mesh (``mesh=None``: the default device, no sharding).

    Methods take host or device arrays ``tokens int32 [N, T]``, ``mask bool [N, T]``
    with ``N`` divisible by the mesh size (see :func:`pad_batch`), and parameters in
    either layout (:class:`~hmm_distill.hmm.HMMParams` or, faster, the token-major
    :class:`~hmm_distill.hmm.HMMParamsT`); results keep the layout given.
    """

    def __init__(self, mesh: Mesh | None = None):
        self.mesh = mesh
        self.num_devices = 1 if mesh is None else int(mesh.size)
        if mesh is None:
            counts_fn = F.expected_counts
            ll_fn = F.log_likelihood
        else:
            def local_counts(params, tokens, mask):
                c = F.expected_counts(params, tokens, mask)
                return jax.tree.map(lambda x: jax.lax.psum(x, AXIS), c)

            counts_fn = _shard_map(local_counts, mesh, (P(), P(AXIS), P(AXIS)), P())
            ll_fn = _shard_map(F.log_likelihood, mesh, (P(), P(AXIS), P(AXIS)), P(AXIS))
        self._counts_fn = counts_fn
        self.multiprocess = mesh is not None and not all(
            d.process_index == jax.process_index() for d in mesh.devices.flat)

        def ll_sum(params, tokens, mask):  # Σ_n log p(x^n) (replicated scalar)
            return counts_fn(params, tokens, mask).loglik

        @jax.jit
        def counts(params, tokens, mask):
            c = counts_fn(params, tokens, mask)
            return c, _finite(c)

        @jax.jit
        def minibatch(params, tokens, mask, eta, lam, lam_b):
            c = counts_fn(params, tokens, mask)
            new = F.m_step(c, params, lam, lam_b)
            mixed = F.mix_params(params, new, eta)
            stats = (c.loglik, c.n_tokens, c.n_impossible)
            return mixed, stats, _finite(c)

        self._counts = counts
        self._minibatch = minibatch
        self._loglik = jax.jit(ll_fn)
        self._ll_sum = jax.jit(ll_sum)
        self._mstep = jax.jit(F.m_step)

    # -- data placement ------------------------------------------------------------------------
    def put(self, tokens, mask):
        """Place a batch on the mesh (batch axis sharded)."""
        tokens = jnp.asarray(tokens, jnp.int32) if self.mesh is None else tokens
        if self.mesh is None:
            return tokens, jnp.asarray(mask, bool)
        if tokens.shape[0] % self.num_devices:
            raise ConfigError(f"batch of {tokens.shape[0]} rows is not divisible by "
                              f"{self.num_devices} devices; pad it with pad_batch")
        sh = NamedSharding(self.mesh, P(AXIS))
        if self.multiprocess:
            # every process holds the global batch; it places only its own rows
            return (_from_local(sh, np.asarray(tokens, np.int32)),
                    _from_local(sh, np.asarray(mask, bool)))
        return (jax.device_put(np.asarray(tokens, np.int32), sh),
                jax.device_put(np.asarray(mask, bool), sh))

    def replicate(self, params: HMMParams) -> HMMParams:
        if self.mesh is None:
            return params
        sh = NamedSharding(self.mesh, P())
        if self.multiprocess:
            return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
                sh, np.asarray(x)), params)
        return jax.device_put(params, sh)

    # -- steps --------------------------------------------------------------------------------
    def counts(self, params: HMMParams, tokens, mask) -> tuple[Counts, jax.Array]:
        """E-step counts of a batch (summed over devices) and an all-finite flag."""
        t, m = self.put(tokens, mask)
        return self._counts(params, t, m)

    def m_step(self, counts: Counts, params: HMMParams, pseudocount,
               emission_pseudocount=None) -> HMMParams:
        """M-step; ``pseudocount``: a :class:`~hmm_distill.priors.Prior` or a scalar
        ``λ`` (with ``emission_pseudocount`` ``λ_B``, a scalar or ``[V]``)."""
        lam, lam_b = prior_args(pseudocount, emission_pseudocount)
        return self._mstep(counts, params, lam, lam_b)

    def minibatch_step(self, params: HMMParams, tokens, mask, eta: float, pseudocount: float,
                       emission_pseudocount: float | None = None):
        """``θ ← (1-η)θ + η M(s_batch)``. Returns ``(params, (loglik, n_tokens, n_impossible),
        finite_flag)``; the log-likelihood is that of the batch before the update."""
        t, m = self.put(tokens, mask)
        lam, lam_b = prior_args(pseudocount, emission_pseudocount)
        return self._minibatch(params, t, m, float(eta), lam, lam_b)

    def log_likelihood(self, params: HMMParams, tokens, mask) -> jax.Array:
        """Per-sequence log-likelihoods (sharded like the batch; single process only)."""
        t, m = self.put(tokens, mask)
        return self._loglik(params, t, m)

    def log_likelihood_sum(self, params: HMMParams, tokens, mask) -> float:
        """``Σ_n log p(x^n)`` over the possible sequences of a batch (all processes)."""
        t, m = self.put(tokens, mask)
        from .distributed import to_host

        return float(to_host(self._ll_sum(params, t, m)))


def full_batch_em(params: HMMParams, batches, *, iterations: int, pseudocount=0.0,
                  emission_pseudocount=None, engine: EM | None = None,
                  callback=None) -> tuple[HMMParams, list[float]]:
    """Run ``iterations`` full-batch EM iterations over ``batches`` (a list of
    ``(tokens, mask)`` already padded to a common size divisible by the mesh size).

    ``pseudocount``: a :class:`~hmm_distill.priors.Prior` or a scalar (see
    :meth:`EM.m_step`). Returns the final parameters and the training log-likelihood
    *before* each iteration (non-decreasing for ``pseudocount = 0``; with a prior the
    penalised log-likelihood is).
    """
    engine = engine or EM()
    public = isinstance(params, HMMParams)
    params = engine.replicate(F.to_token_major(params) if public else params)
    history = []
    for it in range(iterations):
        total = None
        for tok, msk in batches:
            c, ok = engine.counts(params, tok, msk)
            if not bool(ok):
                from .errors import NonFiniteStatisticsError
                raise NonFiniteStatisticsError(f"non-finite expected counts at EM iteration {it}")
            total = c if total is None else F.add_counts(total, c)
        history.append(float(total.loglik))
        params = engine.m_step(total, params, pseudocount, emission_pseudocount)
        if callback is not None:
            callback(it, params, total)
    return (F.from_token_major(params) if public else params), history
