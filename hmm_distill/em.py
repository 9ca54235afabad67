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


import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from . import hmm as F
from .errors import ConfigError
from .hmm import Counts, HMMParams
from .priors import Prior

AXIS = "data"
MODEL = "model"


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


def step_schedule(kind: str, total_steps: int, *, k0: float = 2.0, kappa: float = 0.7,
                  final: float = 0.01):
    """The step sizes ``η_k`` of stepwise (mini-batch) EM as a function of the update ``k``.

    * ``"power"``: :func:`step_size`, ``min(1, (k + k₀)^-κ)`` (Robbins–Monro: the
      iterates converge for ``κ ∈ (0.5, 1]``; no horizon needed);
    * ``"cosine"`` / ``"linear"``: optax's cosine / linear decay from 1 to ``final`` over
      ``total_steps`` updates (a fixed budget of passes over a data set too large to
      revisit often).
    """
    import optax

    if kind == "power":
        step_size(0, k0, kappa)  # validates
        return lambda k: step_size(int(k), k0, kappa)
    if not 0 < final <= 1:
        raise ConfigError(f"final step size must be in (0, 1], got {final}")
    steps = max(int(total_steps), 1)
    if kind == "cosine":
        sched = optax.cosine_decay_schedule(1.0, steps, alpha=final)
    elif kind == "linear":
        sched = optax.linear_schedule(1.0, final, steps)
    else:
        raise ConfigError(f"step schedule must be 'power', 'cosine' or 'linear', got {kind!r}")
    return lambda k: float(sched(int(k)))


def make_mesh(num_devices: int | None = None, devices=None, model_shards: int = 1) -> Mesh:
    """Mesh over the first ``num_devices`` devices (default all): 1-D ``('data',)``, or
    with ``model_shards > 1`` 2-D ``('data', 'model')`` of shape
    ``(num_devices / model_shards, model_shards)`` (``B`` split over ``model``)."""
    devs = list(devices if devices is not None else jax.devices())
    if num_devices is not None:
        if num_devices < 1 or num_devices > len(devs):
            raise ConfigError(f"asked for {num_devices} devices, {len(devs)} available")
        devs = devs[:num_devices]
    if model_shards > 1:
        if len(devs) % model_shards:
            raise ConfigError(f"{len(devs)} devices cannot be split into {model_shards} model shards")
        return Mesh(np.array(devs).reshape(-1, model_shards), (AXIS, MODEL))
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


def _vocab_sharded_counts(mesh: Mesh):
    """E-step with ``Bᵀ [V, H]`` split over the ``model`` axis and the batch over ``data``.

    Each device holds the rows ``[m V/M, (m+1) V/M)`` of ``Bᵀ``. Emission columns
    ``B[:, x]`` are gathered where the token falls in the local range (zero elsewhere)
    and summed over ``model`` (exactly one shard contributes), so every device of a
    data group runs the same forward/backward; each device then scatter-adds the
    posteriors of its own vocabulary rows, and all counts are summed over ``data``.
    """
    def local(params, tokens, mask):
        Vl, H = params.BT.shape
        off = jax.lax.axis_index(MODEL) * Vl
        idx = jnp.asarray(tokens, jnp.int32).T - off  # [T, N]
        inr = (idx >= 0) & (idx < Vl)
        E = jnp.where(inr[..., None], jnp.take(params.BT, jnp.clip(idx, 0, Vl - 1), axis=0), 0.0)
        # a dropped token (id < 0) is marginalised: emission probability 1
        logE = jnp.where((jnp.asarray(tokens).T < 0)[..., None], 0.0, jnp.log(jax.lax.psum(E, MODEL)))

        def emit_rows(tok_flat, g_flat):
            li = tok_flat - off
            ok = (li >= 0) & (li < Vl)
            return jnp.zeros((Vl, H), g_flat.dtype).at[jnp.where(ok, li, Vl)].add(g_flat, mode="drop")

        c = F._counts(params, tokens, mask, logE=logE, emit_rows=emit_rows)
        return jax.tree.map(lambda x: jax.lax.psum(x, AXIS), c)

    pspec = F.HMMParamsT(P(), P(), P(MODEL, None))
    cspec = Counts(P(), P(), P(MODEL, None), P(), P(), P(), P())
    return _shard_map(local, mesh, (pspec, P(AXIS), P(AXIS)), cspec)


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
        #: size of the data axis (batches must be divisible by it)
        self.num_devices = 1 if mesh is None else int(mesh.shape[AXIS])
        #: size of the model (vocabulary) axis: B and its counts are split over it
        self.model_shards = 1 if mesh is None or MODEL not in mesh.axis_names else int(mesh.shape[MODEL])
        if mesh is None:
            counts_fn = F.expected_counts
            ll_fn = F.log_likelihood
        elif self.model_shards > 1:
            counts_fn = _vocab_sharded_counts(mesh)
            ll_fn = None
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
        self._loglik = jax.jit(ll_fn) if ll_fn is not None else None
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
        """Place parameters on the mesh: replicated, except that with a model axis ``Bᵀ``
        is split over the vocabulary (token-major layout required then)."""
        if self.mesh is None:
            return params
        rep = NamedSharding(self.mesh, P())
        if self.model_shards > 1:
            if not isinstance(params, F.HMMParamsT):
                params = F.to_token_major(params)
            V = params.BT.shape[0]
            if V % self.model_shards:
                raise ConfigError(f"vocabulary size {V} is not divisible by the {self.model_shards} "
                                  f"model shards")
            shs = F.HMMParamsT(rep, rep, NamedSharding(self.mesh, P(MODEL, None)))
        else:
            shs = jax.tree.map(lambda _: rep, params)
        if self.multiprocess:
            def put(x, sh):
                x = np.asarray(x)
                idx = sh.addressable_devices_indices_map(x.shape)
                return jax.make_array_from_single_device_arrays(
                    x.shape, sh, [jax.device_put(x[i], d) for d, i in idx.items()])
            return jax.tree.map(put, params, shs)
        return jax.tree.map(jax.device_put, params, shs)

    # -- steps --------------------------------------------------------------------------------
    def counts(self, params: HMMParams, tokens, mask) -> tuple[Counts, jax.Array]:
        """E-step counts of a batch (summed over devices) and an all-finite flag."""
        t, m = self.put(tokens, mask)
        return self._counts(self._tm(params), t, m)

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
        if self._loglik is None:
            raise ConfigError("per-sequence log-likelihoods are not available with a model axis; "
                              "use log_likelihood_sum")
        t, m = self.put(tokens, mask)
        return self._loglik(params, t, m)

    def log_likelihood_sum(self, params: HMMParams, tokens, mask) -> float:
        """``Σ_n log p(x^n)`` over the possible sequences of a batch (all processes)."""
        t, m = self.put(tokens, mask)
        from .distributed import to_host

        return float(to_host(self._ll_sum(self._tm(params), t, m)))

    def _tm(self, params):
        """With a model axis the sharded E-step needs the token-major layout on the mesh."""
        if self.model_shards > 1 and not isinstance(params, F.HMMParamsT):
            return self.replicate(params)
        return params


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


def memory_estimate(hidden_size: int, vocab_size: int, batch_rows: int, length: int, *,
                    data_shards: int = 1, model_shards: int = 1, bytes_per: int = 4) -> dict:
    """Estimated peak bytes per device of an EM step (float32).

    ``H·V/M`` tables: the parameters ``Bᵀ``, the emission counts, the smoothed counts and
    the new ``Bᵀ`` of the M-step and the mixed ``Bᵀ`` of a mini-batch step (5 copies);
    the E-step's ``[T, N/D, H]`` activations (``log E``, ``log α``, ``log β``, ``γ``,
    ``X``, ``Y``, ``v`` and a temporary: 8 copies); ``A`` and its counts.
    """
    H, V = int(hidden_size), int(vocab_size)
    tables = 5 * H * (-(-V // model_shards)) * bytes_per
    rows = -(-int(batch_rows) // data_shards)
    acts = 8 * int(length) * rows * H * bytes_per
    small = 4 * H * H * bytes_per
    return {"tables": tables, "activations": acts, "small": small, "total": tables + acts + small}


def available_memory_bytes(device=None) -> int | None:
    """Free memory of ``device`` (default: the first local device): the accelerator's
    ``bytes_limit - bytes_in_use``; on CPU the host's ``MemAvailable`` divided by the
    number of local CPU devices (they share it). None if unknown."""
    device = device or jax.local_devices()[0]
    try:
        st = device.memory_stats()
    except Exception:
        st = None
    if st and "bytes_limit" in st:
        return int(st["bytes_limit"]) - int(st.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // max(1, len(jax.local_devices()))
    except OSError:
        pass
    return None


def check_memory(hidden_size: int, vocab_size: int, batch_rows: int, length: int, *, data_shards: int = 1,
                 model_shards: int = 1, limit_bytes: int | None = None, log=print) -> dict:
    """Print the estimate and raise :class:`MemoryEstimateError` when it exceeds the
    free memory per device (``limit_bytes`` overrides the detected amount)."""
    from .errors import MemoryEstimateError

    est = memory_estimate(hidden_size, vocab_size, batch_rows, length, data_shards=data_shards,
                          model_shards=model_shards)
    avail = limit_bytes if limit_bytes is not None else available_memory_bytes()
    gib = 1 << 30
    log(f"memory estimate per device: {est['total'] / gib:.2f} GiB (H x V tables "
        f"{est['tables'] / gib:.2f} GiB over {model_shards} model shard(s), E-step "
        f"{est['activations'] / gib:.2f} GiB for {batch_rows} rows of T={length} over {data_shards} "
        f"data shard(s)); available {'unknown' if avail is None else f'{avail / gib:.2f} GiB'}")
    if avail is not None and est["total"] > avail:
        need = -(-est["tables"] // max(1, avail - est["activations"] - est["small"])) if avail > est[
            "activations"] + est["small"] else None
        hint = (f"shard B over >= {need * model_shards} devices (--model-shards)" if need else
                "lower --batch-size")
        raise MemoryEstimateError(
            f"EM with H={hidden_size}, V={vocab_size}, batch {batch_rows} x T={length} needs about "
            f"{est['total'] / gib:.2f} GiB per device but {avail / gib:.2f} GiB are available: {hint}, "
            f"or lower --hidden-size")
    return est
