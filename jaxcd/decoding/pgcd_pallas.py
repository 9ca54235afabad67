"""P-GCD per-step scores as a Pallas kernel: ``O(K·H·V)`` whatever the out-degree.

The same contract as the CPU kernel (``kernels/pgcd_scores.cc``): for particle ``k``
(forward vector ``u_k [H]``, automaton state ``s_k``) and token ``v`` on out-edge
``d = d_k(v)`` of ``s_k``::

    num_k(v) = Σ_h W_k[d, h] Bt[v, h],   W_k[d] = u_k ∘ mant[r, dst(s_k, d)]
    den_k(v) = Σ_h u_k[h] Bt[v, h]
    log ψ(x v) = log num + log_scale[r, dst] − log den    (−inf where no edge / β^P = 0)

Each token's column of ``B`` is multiplied by the ONE weight row of its own edge
(looked up per token, never one product per edge), so a step costs ``2·K·H·V``
multiply-adds for any live out-degree, where the XLA path
(:func:`jaxcd.decoding.pgcd.batched_scores`, ``path="xla"``) pays ``K·(1+D')·H·V``.

The kernel runs on a grid of ``(K, ⌈V / block_v⌉)`` programs; program ``(k, j)`` reads
``block_v`` rows of ``Bt`` and particle ``k``'s ``D`` weight rows and writes ``block_v``
entries of ``log num`` and ``log den``. The token → edge lookup ``d_k(v)`` is made
outside it (from :attr:`PGCDTables.edge_index <jaxcd.decoding.pgcd.PGCDTables>` where
built, else by the binary search over the nested cumulative mask rows,
``O(V log D)``), as is the final normalisation (a log-sum-exp over ``V``).

Selected by ``path="pallas"`` in :func:`~jaxcd.decoding.pgcd.batched_scores` /
:func:`~jaxcd.decoding.pgcd.scores`; ``path="auto"`` takes it on GPU and TPU (see
:func:`default_path`) and the native C++ kernel on CPU. ``interpret=True`` runs the same
kernel in Pallas's interpreter (any backend; the tests use it on CPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

#: tokens per program (a multiple of 128 suits both GPU warps and TPU lanes)
BLOCK_V = 128


def default_path(backend: str | None = None) -> str:
    """The scoring path ``path="auto"`` resolves to off the CPU: ``"pallas"`` on
    ``"gpu"``/``"cuda"``/``"rocm"``/``"tpu"``, ``"xla"`` elsewhere. (On CPU the native
    kernel, when it builds, is chosen before this is asked.)"""
    backend = jax.default_backend() if backend is None else backend
    return "pallas" if backend in ("gpu", "cuda", "rocm", "tpu") else "xla"


def _kernel(bt_ref, w_ref, d_ref, ls_ref, u_ref, num_ref, den_ref):
    """One program: ``bt_ref [TV, H]``, ``w_ref [1, D, H]``, ``d_ref [1, TV]`` (int32,
    ``-1`` = no edge), ``ls_ref [1, D]``, ``u_ref [1, H]`` -> ``num_ref`` / ``den_ref``
    ``[1, TV]`` (log num, log den; float32)."""
    bt = bt_ref[...].astype(jnp.float32)                       # [TV, H]
    d = d_ref[0]                                               # [TV]
    has = d >= 0
    dc = jnp.maximum(d, 0)
    w = w_ref[0].astype(jnp.float32)                           # [D, H]
    wt = jnp.take(w, dc, axis=0)                               # [TV, H]: each token's row
    num = jnp.sum(wt * bt, axis=-1)                            # [TV]
    den = jnp.sum(u_ref[0].astype(jnp.float32)[None, :] * bt, axis=-1)
    l_d = jnp.take(ls_ref[0], dc, axis=0)
    ok = has & (num > 0) & jnp.isfinite(l_d)
    num_ref[0] = jnp.where(ok, jnp.log(jnp.where(ok, num, 1.0)) + jnp.where(ok, l_d, 0.0),
                           -jnp.inf)
    den_ref[0] = jnp.where(den > 0, jnp.log(jnp.where(den > 0, den, 1.0)), -jnp.inf)


@functools.partial(jax.jit, static_argnames=("block_v", "interpret"))
def log_num_den(Bt, W, d, ls, u, *, block_v: int = BLOCK_V, interpret: bool = False):
    """The kernel: ``Bt [V, H]``, ``W [K, D, H]`` (particle ``k``'s weight row per
    out-edge), ``d [K, V]`` int32 (each token's out-edge, ``-1`` for none), ``ls [K, D]``
    (the edges' log-scales, ``-inf`` where ``β^P = 0``), ``u [K, H]`` -> ``(log num,
    log den)`` float32 ``[K, V]``."""
    from jax.experimental import pallas as pl

    V, H = Bt.shape
    K, D, _ = W.shape
    Vp = -(-V // block_v) * block_v
    if Vp != V:                                  # pad the vocabulary to whole blocks
        Bt = jnp.pad(Bt, ((0, Vp - V), (0, 0)))
        d = jnp.pad(d, ((0, 0), (0, Vp - V)), constant_values=-1)
    out = jax.ShapeDtypeStruct((K, Vp), jnp.float32)
    num, den = pl.pallas_call(
        _kernel,
        out_shape=(out, out),
        grid=(K, Vp // block_v),
        in_specs=[pl.BlockSpec((block_v, H), lambda k, j: (j, 0)),
                  pl.BlockSpec((1, D, H), lambda k, j: (k, 0, 0)),
                  pl.BlockSpec((1, block_v), lambda k, j: (k, j)),
                  pl.BlockSpec((1, D), lambda k, j: (k, 0)),
                  pl.BlockSpec((1, H), lambda k, j: (k, 0))],
        out_specs=(pl.BlockSpec((1, block_v), lambda k, j: (k, j)),) * 2,
        interpret=interpret,
    )(Bt, W.astype(Bt.dtype), d.astype(jnp.int32), ls.astype(jnp.float32),
      u.astype(jnp.float32))
    return num[:, :V], den[:, :V]


def pallas_scores(fa, tables, sts, *, interpret: bool = False, block_v: int = BLOCK_V):
    """:func:`jaxcd.decoding.pgcd.batched_scores` through the Pallas kernel, for
    particles with one leading axis (``sts.u [K, H]``): ``(log ψ(x v) [K, V], log ψ(x)
    [K], log p_prod(v | x) [K, V])``, over every out-edge (no out-degree factor)."""
    from .pgcd import _edge_of_token, check_tables

    check_tables(fa, tables)
    D = fa.out_dst.shape[1]
    n = tables.limit()
    s, t, u = sts.cs.state, sts.cs.t, sts.u
    r = tables.row(t + 1)                                                # [K]
    deg = jnp.minimum(fa.out_start[s + 1] - fa.out_start[s], D)          # [K]
    k = jnp.arange(D)
    dsts = fa.out_dst[s]                                                 # [K, D]
    mant = tables.mant[r[:, None], dsts]                                 # [K, D, H]
    ls = tables.log_scale[r[:, None], dsts].astype(jnp.float32)          # [K, D]
    ls = jnp.where((k < deg[:, None]) & (t < n)[:, None], ls, -jnp.inf)
    W = u[:, None, :].astype(jnp.float32) * mant.astype(jnp.float32)
    if tables.edge_index is not None:
        d = tables.edge_index[s].astype(jnp.int32)                       # [K, V], -1 none
    else:
        dd, has = jax.vmap(lambda st: _edge_of_token(fa, st, D))(s)
        d = jnp.where(has, dd, -1).astype(jnp.int32)
    log_num, log_den = log_num_den(tables.Bt, W, d, ls, u, block_v=block_v,
                                   interpret=interpret)
    ok = jnp.isfinite(log_num) & jnp.isfinite(log_den)
    logpsi = jnp.where(ok, log_num - jnp.where(ok, log_den, 0.0), -jnp.inf)
    z = jax.nn.logsumexp(log_num, axis=-1)
    zf = jnp.isfinite(z)[:, None]
    lprod = jnp.where(zf, log_num - jnp.where(zf, z[:, None], 0.0), -jnp.inf)
    return logpsi, z, lprod


__all__ = ["pallas_scores", "log_num_den", "default_path", "BLOCK_V"]
