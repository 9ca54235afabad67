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
``block_v`` rows of ``Bt`` and, for each of those tokens, particle ``k``'s weight row of
that token's edge (a gather load by edge index), ``block_h`` hidden units at a time, and
writes ``block_v`` entries of ``log num`` and ``log den``. The token → edge lookup
``d_k(v)`` is made outside it (from :attr:`PGCDTables.edge_index <jaxcd.decoding.pgcd.PGCDTables>` where
built, else by the binary search over the nested cumulative mask rows,
``O(V log D)``), as is the final normalisation (a log-sum-exp over ``V``).

Selected by ``path="pallas"`` in :func:`~jaxcd.decoding.pgcd.batched_scores` /
:func:`~jaxcd.decoding.pgcd.scores`; ``path="auto"`` takes it for tables that
:func:`~jaxcd.decoding.pgcd.backward` built for it (``PGCDTables.pallas``: a GPU or TPU
platform, ``kernel="auto"``; ``kernel="xla"`` keeps the XLA path), and the native C++
kernel on CPU. ``interpret=True`` runs the same kernel in Pallas's interpreter (any
backend; the tests use it on CPU; an explicit ``path="pallas"`` with tables not built
for the compiled kernel runs interpreted).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

#: tokens per program (a multiple of 128 suits both GPU warps and TPU lanes)
BLOCK_V = 128
#: hidden units per inner chunk (the ``[BLOCK_V, BLOCK_H]`` tiles held at once)
BLOCK_H = 128


#: platforms where the kernel is compiled (and ``path="auto"`` takes it)
PLATFORMS = ("gpu", "cuda", "rocm", "tpu")


def default_path(platform: str | None = None) -> str:
    """The scoring path tables built for ``platform`` (default
    ``jax.default_backend()``) get with ``kernel="auto"`` when the native CPU kernel is
    not in use: ``"pallas"`` on GPU/TPU, ``"xla"`` elsewhere. Host side."""
    platform = jax.default_backend() if platform is None else platform
    return "pallas" if platform in PLATFORMS else "xla"


def use_pallas(table_dtype, platform: str | None = None) -> bool:
    """Whether :func:`jaxcd.decoding.pgcd.backward` records the compiled kernel in the
    tables (``PGCDTables.pallas``): on a GPU/TPU platform (:func:`default_path`), tables
    in float32 or bfloat16. Host side, never while tracing."""
    return (default_path(platform) == "pallas"
            and jnp.dtype(table_dtype) in (jnp.float32, jnp.bfloat16))


def _kernel(bt_ref, w_ref, d_ref, ls_ref, u_ref, num_ref, den_ref, *, block_h: int):
    """One program: ``bt_ref [TV, H]``, ``w_ref [1, D, H]``, ``d_ref [1, TV]`` (int32,
    ``-1`` = no edge), ``ls_ref [1, D]``, ``u_ref [1, H]`` -> ``num_ref`` / ``den_ref``
    ``[1, TV]`` (log num, log den; float32). ``H`` is visited in chunks of ``block_h``
    (the tiles held at once are ``[TV, block_h]``); each token's weight row is loaded by
    its edge index (a gather load), so the work is ``2·TV·H`` whatever ``D``."""
    d = d_ref[0]                                               # [TV]
    has = d >= 0
    dc = jnp.maximum(d, 0)
    H = bt_ref.shape[1]

    def body(i, acc):
        num, den = acc
        h = pl.ds(pl.multiple_of(i * block_h, block_h), block_h)
        bt = bt_ref[:, h].astype(jnp.float32)                  # [TV, block_h]
        w = w_ref[0, dc, h].astype(jnp.float32)                # each token's own row
        u = u_ref[0, h].astype(jnp.float32)                    # [block_h]
        return num + jnp.sum(w * bt, axis=-1), den + jnp.sum(u[None, :] * bt, axis=-1)

    z = jnp.zeros(d.shape, jnp.float32)
    num, den = jax.lax.fori_loop(0, H // block_h, body, (z, z))
    l_d = ls_ref[0, dc]                                        # gather load, [TV]
    ok = has & (num > 0) & (l_d > -jnp.inf)
    num_ref[0] = jnp.where(ok, jnp.log(jnp.where(ok, num, 1.0)) + jnp.where(ok, l_d, 0.0),
                           -jnp.inf)
    den_ref[0] = jnp.where(den > 0, jnp.log(jnp.where(den > 0, den, 1.0)), -jnp.inf)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


@functools.partial(jax.jit, static_argnames=("block_v", "block_h", "interpret"))
def log_num_den(Bt, W, d, ls, u, *, block_v: int = BLOCK_V, block_h: int = BLOCK_H,
                interpret: bool = False):
    """The kernel: ``Bt [V, H]``, ``W [K, D, H]`` (particle ``k``'s weight row per
    out-edge), ``d [K, V]`` int32 (each token's out-edge, ``-1`` for none), ``ls [K, D]``
    (the edges' log-scales, ``-inf`` where ``β^P = 0``), ``u [K, H]`` -> ``(log num,
    log den)`` float32 ``[K, V]``. ``V`` is padded to whole blocks of ``block_v``, ``H``
    to whole chunks of ``block_h`` (zeros: they add nothing) and ``D`` to a power of two
    (padded edges are never looked up)."""
    V, H = Bt.shape
    K, D, _ = W.shape
    bh = min(block_h, _pow2(H))
    Vp, Hp, Dp = -(-V // block_v) * block_v, -(-H // bh) * bh, _pow2(D)
    Bt = jnp.pad(Bt, ((0, Vp - V), (0, Hp - H)))
    d = jnp.pad(d.astype(jnp.int32), ((0, 0), (0, Vp - V)), constant_values=-1)
    W = jnp.pad(W.astype(Bt.dtype), ((0, 0), (0, Dp - D), (0, Hp - H)))
    ls = jnp.pad(ls.astype(jnp.float32), ((0, 0), (0, Dp - D)), constant_values=-jnp.inf)
    u = jnp.pad(u.astype(jnp.float32), ((0, 0), (0, Hp - H)))
    out = jax.ShapeDtypeStruct((K, Vp), jnp.float32)
    num, den = pl.pallas_call(
        functools.partial(_kernel, block_h=bh),
        out_shape=(out, out),
        grid=(K, Vp // block_v),
        in_specs=[pl.BlockSpec((block_v, Hp), lambda k, j: (j, 0)),
                  pl.BlockSpec((1, Dp, Hp), lambda k, j: (k, 0, 0)),
                  pl.BlockSpec((1, block_v), lambda k, j: (k, j)),
                  pl.BlockSpec((1, Dp), lambda k, j: (k, 0)),
                  pl.BlockSpec((1, Hp), lambda k, j: (k, 0))],
        out_specs=(pl.BlockSpec((1, block_v), lambda k, j: (k, j)),) * 2,
        interpret=interpret,
    )(Bt, W, d, ls, u)
    return num[:, :V], den[:, :V]


def pallas_scores(fa, tables, sts, *, edge_of_token, interpret: bool = False,
                  block_v: int = BLOCK_V):
    """:func:`jaxcd.decoding.pgcd.batched_scores` through the Pallas kernel, for
    particles with one leading axis (``sts.u [K, H]``): ``(log ψ(x v) [K, V], log ψ(x)
    [K], log p_prod(v | x) [K, V])``, over every out-edge (no out-degree factor).
    ``edge_of_token(fa, state, D) -> (edge [V], has [V])`` finds each token's out-edge
    when the tables carry no edge index; the caller has checked that the tables belong
    to ``fa`` (:func:`jaxcd.decoding.pgcd.check_tables`, which passes its own lookup)."""
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
        dd, has = jax.vmap(lambda st: edge_of_token(fa, st, D))(s)
        d = jnp.where(has, dd, -1).astype(jnp.int32)
    log_num, log_den = log_num_den(tables.Bt, W, d, ls, u, block_v=block_v,
                                   interpret=interpret)
    ok = jnp.isfinite(log_num) & jnp.isfinite(log_den)
    logpsi = jnp.where(ok, log_num - jnp.where(ok, log_den, 0.0), -jnp.inf)
    z = jax.nn.logsumexp(log_num, axis=-1)
    zf = jnp.isfinite(z)[:, None]
    lprod = jnp.where(zf, log_num - jnp.where(zf, z[:, None], 0.0), -jnp.inf)
    return logpsi, z, lprod


__all__ = ["pallas_scores", "log_num_den", "default_path", "use_pallas", "PLATFORMS",
           "BLOCK_V", "BLOCK_H"]
