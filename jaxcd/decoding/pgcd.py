r"""P-GCD: the HMM × automaton product as a lazy circuit — docs/design.md §5.

An HMM ``(π, A, B)`` (probabilities, :class:`hmm_distill.HMMParams`; hidden size
``H``, vocabulary ``V``) is multiplied with the token-level DFA ``fa`` (``S`` states,
``E`` edges) of a constraint. Nothing of size ``H·S`` per token or ``S·V`` is built:

**Edge masses** ``C = B·B_fᵀ ∈ R^{H×E}`` (:func:`edge_masses`): each edge's label set
is read from the packed masks, identical label sets are computed once, small sets as a
gather-sum of ``B``'s columns, large ones as a matmul with their indicator, and sets
covering more than half the vocabulary as ``1 − B·1_{V∖L}`` (so a near-full edge is
not a difference of two nearly equal sums). EOS edges carry ``B[:, EOS]``; the EOS
self-loop of ``⊥`` carries mass 1 (**padding is free**: once EOS is emitted the
outcome is known, ``ψ(x·EOS) = 1{x ∈ L}``).

**Backward tables** (:func:`backward`; one ``lax.scan``)::

    β^P_n(h, s) = 1{s = ⊥}
    β^P_t(h, s) = Σ_h' A[h, h'] Σ_{e: src e = s} C[h', e] β^P_{t+1}(h', dst e)

``β^P_t(h, s)`` is the HMM probability that the next ``n − t`` tokens, counted up to
their first EOS, complete a valid output from automaton state ``s`` given ``z_t = h``.
Each state's vector is stored as a mantissa (max 1 over ``h``) and a **per-step,
per-state log-scale** (a per-step scale alone underflows for states far from ``⊥``);
a state with ``β^P = 0`` has mantissa 0 and log-scale ``−inf`` exactly (no epsilon).
Cost per step: ``E·H`` (edge products and segment sums) + ``S·H²`` (one matmul).

**Per step**, with the HMM predictive vector ``u = p(z_{t+1} | x_{1:t})`` (``u = π``
first) and automaton state ``s`` after ``t`` tokens, for the ``D`` out-edges ``e_d`` of
``s``::

    num(v) = Σ_h' u[h'] B[h', v] β^P_{t+1}(h', dst e_d)      (v ∈ L_{e_d}; 0 off every edge)
    den(v) = Σ_h' u[h'] B[h', v]                             (= p_hmm(v | x_{1:t}))
    ψ(x_{1:t} v) = num(v) / den(v),     p_prod(v | x_{1:t}) = num(v) / Σ_v num(v)

Each token has one successor, so the floor is ``H·V`` per particle for ``num`` (and as
much for ``den``). On CPU the native kernel (:mod:`jaxcd.decoding.kernels`) reaches it:
each allowed token's row of ``Bt`` is paired with the ``β^P`` column of its own
successor, ``B`` read once per block of tokens for all particles. The XLA path (GPU/TPU,
float64, or no C++ compiler) runs ``[K·(1+D'), H] @ [H, V]`` and keeps one column per
token (``D'``: the batch's largest live out-degree); see ``docs/pgcd.md``. Never
``S·H·V``. ``ψ`` is a probability (``0 ≤ ψ ≤ 1``), ``−inf`` in log space exactly
where ``β^P = 0`` — in particular off the GCD mask — and also where the HMM gives ``v``
probability 0 (``den = 0``; a distilled HMM has pseudocounts, so this does not occur).
``Σ_v num(v) = ψ(x_{1:t})``. After emitting ``v``: ``u ← normalise(u ∘ B[:, v]) · A``.

Everything runs in the dtype of the HMM's arrays (float64 with ``jax_enable_x64``;
float32 by default); ``table_dtype=jnp.bfloat16`` stores ``β^P`` (and the per-step
copy of ``B``) in bfloat16 with float32 accumulation.

Example::

    tables = pgcd.backward(fa, hmm, budget=32)
    st = pgcd.init_state(fa, hmm)
    logpsi = pgcd.token_logpsi(fa, hmm, tables, st)       # [V]
    st = pgcd.advance(fa, hmm, st, token)
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..automata.tensorized import TensorizedAutomaton
from ..errors import JaxcdError
from . import gcd

__all__ = ["PGCDTables", "PGCDState", "HMMMismatchError", "TablesTooLargeError",
           "backward_nbytes", "edge_masses", "edge_index", "backward",
           "init_state", "advance", "token_logpsi", "product_logprobs", "prefix_logpsi",
           "check_hmm", "tables_nbytes", "check_psi", "psi_bounds", "table_log_max",
           "PsiBoundError", "psi_tolerance"]


#: every matmul here at full precision: float32 is float32 on GPU/TPU too (XLA's default
#: there is TF32 / one bfloat16 pass, about 1e-4 relative, as seen on an H200);
#: bfloat16 tables are unchanged by it (bfloat16 products, float32 accumulation)
_HIGHEST = jax.lax.Precision.HIGHEST


class HMMMismatchError(JaxcdError, ValueError):
    """The HMM does not fit the automaton or LM it is combined with (vocabulary size,
    EOS, budget of the tables)."""


class TablesTooLargeError(JaxcdError, MemoryError):
    """The ``β^P`` tables (and the work to build them) would exceed the memory limit
    (``max_bytes=``, default :data:`DEFAULT_MAX_BYTES`)."""


#: default limit on :func:`backward`'s memory estimate (``max_bytes=``)
DEFAULT_MAX_BYTES = 8 << 30


@partial(jax.tree_util.register_dataclass,
         data_fields=["mant", "log_scale", "Bt", "n", "edge_index"],
         meta_fields=["kernel", "pallas"])
@dataclasses.dataclass(frozen=True)
class PGCDTables:
    """``β^P`` for budget ``n``, stored by **remaining steps** ``r = n − t`` (so one table
    of static length ``N ≥ n`` serves every budget up to ``N``, and building it writes
    each row once): ``mant [N+1, S, H]`` (max 1 per state, or all 0) and ``log_scale
    [N+1, S]`` (``−inf`` where ``β^P = 0``), so ``β^P_t(h, s) = mant[r, s, h] ·
    exp(log_scale[r, s])`` with ``r = n − t`` (:meth:`row`). ``Bt`` is the HMM emission
    matrix, transposed (``Bt [V, H]``: a token's emission column is a contiguous row), in
    the tables' storage dtype (bfloat16 when asked), for the per-step scores.

    ``edge_index [S, V]`` (int8, or int16 past out-degree 127; ``None`` where it is not
    built): the out-edge of state ``s`` whose label holds token ``v``, ``−1`` for none —
    the native kernel's token → out-edge lookup, one byte per (state, token) instead of
    the state's ``D`` cumulative mask rows (:func:`edge_index`).

    ``kernel`` (static, so part of the jit key of every program that takes the tables):
    whether the per-step scores use the native CPU kernel (:func:`backward` decides it
    from its ``kernel`` argument and the platform, on the host). ``pallas`` (static too):
    whether ``path="auto"`` scores with the compiled Pallas kernel
    (:mod:`jaxcd.decoding.pgcd_pallas`; :func:`backward` sets it on GPU/TPU platforms
    with ``kernel="auto"``)."""

    mant: jax.Array
    log_scale: jax.Array
    Bt: jax.Array
    n: jax.Array | None = None      # the budget (int32, may be traced); None: N = rows - 1
    edge_index: jax.Array | None = None
    kernel: bool = False
    pallas: bool = False            # score with the compiled Pallas kernel (GPU/TPU)

    def _replace(self, **changes) -> "PGCDTables":
        """A copy with ``changes`` (as a NamedTuple's ``_replace``)."""
        return dataclasses.replace(self, **changes)

    @property
    def max_steps(self) -> int:
        """Static length ``N`` (a budget bucket; rows ``0..N``)."""
        return int(self.mant.shape[0]) - 1

    @property
    def budget(self) -> int:
        return self.max_steps if self.n is None else int(self.n)

    def limit(self):
        return self.max_steps if self.n is None else self.n

    def row(self, t):
        """The stored row of step ``t`` for budget ``n``: ``r = n − t`` (clipped)."""
        return jnp.clip(self.limit() - t, 0, self.max_steps)

    def log_scale_by_t(self) -> jax.Array:
        """``log_scale`` indexed by step ``t = 0..n`` (``[n+1, S]``; tests, reports)."""
        return self.log_scale[self.row(jnp.arange(self.budget + 1))]

    def beta(self) -> jax.Array:
        """Dense ``β^P`` by step, ``[n+1, S, H]`` (tests; may underflow in float32)."""
        idx = self.row(jnp.arange(self.budget + 1))
        m = self.mant[idx].astype(self.log_scale.dtype)
        return jnp.where(m > 0, m * jnp.exp(self.log_scale[idx])[..., None], 0.0)


class PGCDState(NamedTuple):
    """What a P-GCD particle carries: the automaton state and step count, and the HMM
    predictive vector ``u = p(z_{t+1} | x_{1:t})`` (sums to 1; ``π`` at the start)."""

    cs: gcd.ConstraintState
    u: jax.Array            # [H]


# ---------------------------------------------------------------------------------------
# checks (host side)
# ---------------------------------------------------------------------------------------
def check_hmm(fa: TensorizedAutomaton, hmm, *, lm=None) -> None:
    """Raise :class:`HMMMismatchError` if the HMM, automaton and LM disagree."""
    H = int(np.shape(hmm.A)[0])
    if np.shape(hmm.pi) != (H,) or np.shape(hmm.A) != (H, H) or np.ndim(hmm.B) != 2 \
            or np.shape(hmm.B)[0] != H:
        raise HMMMismatchError(
            f"HMM arrays have inconsistent shapes: pi {np.shape(hmm.pi)}, A {np.shape(hmm.A)}, "
            f"B {np.shape(hmm.B)} (expected [H], [H, H], [H, V])")
    V = int(np.shape(hmm.B)[1])
    if V != fa.vocab_size:
        raise HMMMismatchError(
            f"the HMM has a vocabulary of {V} tokens but the constraint's automaton has "
            f"{fa.vocab_size}: distil an HMM for this model's tokenizer with `hmm-distill`")
    if lm is not None:
        if int(lm.eos_token_id) != int(fa.eos_id):
            raise HMMMismatchError(f"the LM's EOS id {lm.eos_token_id} differs from the "
                                   f"automaton's {fa.eos_id}")


def tables_nbytes(fa: TensorizedAutomaton, hidden_size: int, budget: int,
                  table_dtype=jnp.float32) -> int:
    """Bytes of :class:`PGCDTables` for these sizes (for memory reports; ``budget``: the
    tables' length, i.e. the budget bucket when one is used)."""
    item = jnp.dtype(table_dtype).itemsize
    S = int(np.prod(np.shape(fa.dist)))
    return ((budget + 1) * S * hidden_size * item
            + (budget + 1) * S * 4 + hidden_size * fa.vocab_size * item)


def backward_nbytes(fa: TensorizedAutomaton, hidden_size: int, budget: int,
                    table_dtype=jnp.float32, work_dtype=jnp.float32, *, kernel: str = "auto",
                    index_max_bytes: int | None = None) -> dict[str, int]:
    """Memory estimate of :func:`backward` before it allocates anything (bytes on top of
    the HMM), from the shapes alone. :func:`backward` runs in three phases, each waited
    for, so that the largest arrays are never alive together:

    1. ``masses``: the edge masses (:func:`edge_masses`): ``C`` or its per-label rows
       (``E·H``), one piece of gathered columns of ``B`` (at most ``max(4E, 64)·H``) and
       its segment sums (``E·H``), or one indicator matmul (``128·V``);
    2. the recursion: the ``tables`` (rows ``0..budget`` of ``S·H`` mantissas in the
       storage dtype and ``S`` float32 log-scales) and its ``work`` (``C [H, E]``, one
       ``[E, H]`` product, four ``[S, H]`` carries/temporaries);
    3. the ``tables`` with ``Bt`` (``V·H`` in the storage dtype; ``C`` freed) and then the
       kernel's per-state edge ``index`` where it is built (:func:`edge_index`; ``S·V``
       bytes, and ``index_work``: a copy of the mask rows while it is built).

    ``total`` is the peak: ``max(masses, tables + max(work, Bt + index + index_work))``.
    Keys: ``tables``, ``Bt``, ``work``, ``index``, ``index_work``, ``masses``,
    ``total``."""
    item, w = jnp.dtype(table_dtype).itemsize, jnp.dtype(work_dtype).itemsize
    S = int(np.prod(np.shape(fa.dist)))
    E = int(np.prod(np.shape(fa.edge_src)))
    H, V = int(hidden_size), int(fa.vocab_size)
    idx = _edge_index_dtype(fa, table_dtype, use_kernel(kernel, table_dtype), index_max_bytes)
    out = {"tables": (budget + 1) * S * (H * item + 4), "Bt": V * H * item,
           "work": 2 * E * H * w + 4 * S * H * w,
           "index": 0 if idx is None else S * V * jnp.dtype(idx).itemsize,
           "index_work": 0 if idx is None else int(np.prod(np.shape(fa.cum_masks))) * 4,
           "masses": max((2 * E + _small_piece(E)) * H * w,
                         (E + _DENSE_CHUNK) * H * w + _DENSE_CHUNK * V * (1 + w))}
    out["total"] = max(out["masses"], out["tables"] + max(
        out["work"], out["Bt"] + out["index"] + out["index_work"]))
    return out


def _gib(x: int) -> str:
    return f"{x / 2**30:.2f} GiB"


def check_memory(fa: TensorizedAutomaton, hidden_size: int, steps: int, table_dtype,
                 work_dtype, max_bytes: int | None = None, *, kernel: str = "auto",
                 index_max_bytes: int | None = None) -> dict[str, int]:
    """Raise :class:`TablesTooLargeError` (with the estimate, the limit and what to
    change) if :func:`backward_nbytes` exceeds ``max_bytes`` (default
    :data:`DEFAULT_MAX_BYTES`); return the estimate."""
    if max_bytes is None:
        max_bytes = DEFAULT_MAX_BYTES
    est = backward_nbytes(fa, hidden_size, steps, table_dtype, work_dtype, kernel=kernel,
                          index_max_bytes=index_max_bytes)
    if est["total"] > max_bytes:
        S = int(np.prod(np.shape(fa.dist)))
        hint = ""
        if jnp.dtype(table_dtype).itemsize > 2:
            bf = backward_nbytes(fa, hidden_size, steps, jnp.bfloat16, work_dtype)["total"]
            hint = f"table_dtype=jnp.bfloat16 (about {_gib(bf)}), "
        raise TablesTooLargeError(
            f"P-GCD tables for H={hidden_size}, {steps} steps and {S} automaton states need "
            f"about {_gib(est['total'])} at the peak (tables {_gib(est['tables'])}, then "
            f"B {_gib(est['Bt'])} or work {_gib(est['work'])}), above the limit of "
            f"{_gib(max_bytes)} (max_bytes=): use {hint}a smaller "
            "budget or a smaller HMM")
    return est


# ---------------------------------------------------------------------------------------
# C = B · B_fᵀ from the packed label sets
# ---------------------------------------------------------------------------------------
_SPARSE_MAX = 64          # label sets up to this size: gather-sum of B's columns
_DENSE_CHUNK = 128        # label sets per indicator matmul
_PLAN_BYTES = 32 << 20    # host scratch per planning chunk (unpacked label bits)


def _edge_label_rows(fa: TensorizedAutomaton) -> tuple[np.ndarray, np.ndarray]:
    """Per edge ``e`` (out-edge ``k`` of its source ``s``), the distinct mask rows
    ``(hi[e], lo[e])`` whose XOR is ``L_e``: ``hi = row_index[base[s] + k + 1]``,
    ``lo = row_index[base[s] + k]`` (``base[s] = out_start[s] + s``)."""
    src = np.asarray(fa.edge_src).astype(np.int64)
    out_start = np.asarray(fa.out_start).astype(np.int64)
    ri = np.asarray(fa.row_index).astype(np.int64)
    rows = out_start[src] + src + (np.arange(len(src)) - out_start[src]) + 1
    return ri[rows], ri[rows - 1]


def _small_piece(E: int) -> int:
    """(label, token) pairs per :func:`_small_sums` call: ``max(4E, _SPARSE_MAX)``."""
    return max(4 * int(E), _SPARSE_MAX)


@partial(jax.jit, donate_argnums=0)
def _small_sums(Cu, B, v, seg, idx):
    s = jax.ops.segment_sum(jnp.take(B, v, axis=1).T, seg, num_segments=idx.shape[0])
    return Cu.at[idx].set(s, mode="drop")


@partial(jax.jit, donate_argnums=0)
def _large_sums(Cu, B, ind, comp, idx):
    m = jnp.matmul(ind.astype(B.dtype), B.T, precision=_HIGHEST)            # [chunk, H]
    m = jnp.where(comp[:, None], 1.0 - m, m)
    return Cu.at[idx].set(m, mode="drop")


@jax.jit
def _gather_edges(Cu, label, loop):
    C = Cu[label].T                                                        # [H, E]
    return jnp.where(loop[None, :], jnp.ones((), C.dtype), C)


def edge_masses(fa: TensorizedAutomaton, B: jax.Array) -> jax.Array:
    """``C [H, E]``: ``C[h, e] = Σ_{v ∈ L_e} B[h, v]``, except the ``⊥`` self-loop, which
    gets 1 (padding is free). Host-side planning (NumPy on the packed labels), device
    matmuls; ``B_f`` is never built densely.

    Labels come from the deduplicated mask rows: ``L_e = cum_masks[hi] XOR
    cum_masks[lo]`` for a pair of distinct rows (:func:`_edge_label_rows`). Edges with
    the same pair (every copy of a counter) share one label; each distinct pair's label
    is unpacked once, in chunks of at most ``_PLAN_BYTES`` bytes, and equal labels of
    different pairs are summed once. Host memory: ``O(P · W)`` for the ``P`` distinct
    pairs, never ``E · W``; the sums are the dense ones (no differences of cumulative
    masses, which would lose the relative precision of small masses)."""
    B = jnp.asarray(B)
    H, V = B.shape
    cum = np.asarray(fa.cum_masks)
    R, W = cum.shape
    hi, lo = _edge_label_rows(fa)
    pair_u, pair_inv = np.unique(hi * R + lo, return_inverse=True)
    pair_inv = pair_inv.reshape(-1)
    p_hi, p_lo = pair_u // R, pair_u % R
    # equal labels of different pairs: one sum each (hash of the packed row, exact bytes)
    first: dict[bytes, int] = {}
    label_of_pair = np.empty(len(pair_u), np.int64)
    sizes = []                                    # per distinct label: its size
    small_r, small_v = [], []
    large_bits: dict[int, np.ndarray] = {}
    per = max(1, _PLAN_BYTES // max(V, 1))
    for c0 in range(0, len(pair_u), per):
        words = cum[p_hi[c0:c0 + per]] ^ cum[p_lo[c0:c0 + per]]            # [n, W]
        new_rows = []
        for i in range(len(words)):
            j = first.setdefault(words[i].tobytes(), len(first))
            label_of_pair[c0 + i] = j
            if j == len(sizes):
                sizes.append(-1)
                new_rows.append((i, j))
        if not new_rows:
            continue
        ii = np.array([i for i, _ in new_rows], np.int64)
        jj = np.array([j for _, j in new_rows], np.int64)
        bits = np.unpackbits(np.ascontiguousarray(words[ii]).view(np.uint8), axis=1,
                             bitorder="little")[:, :V]                        # [n, V] u8
        size = bits.sum(1, dtype=np.int64)
        for k, j in enumerate(jj.tolist()):
            sizes[j] = int(size[k])
        sm = size <= _SPARSE_MAX
        if sm.any():
            r, v = np.nonzero(bits[sm])
            small_r.append(jj[sm][r])
            small_v.append(v)
        for k in np.nonzero(~sm)[0].tolist():
            large_bits[int(jj[k])] = words[ii[k]].copy()                    # W words
        del bits, words
    first.clear()
    U = len(sizes)
    # Device work in fixed-size pieces, so that constraints of one bucket reuse the
    # compiled programs: the distinct labels are at most the edges E (a bucket size), the
    # (label, token) pairs of small labels are padded to max(4E, a power of two), large
    # labels go in whole chunks; padding entries add 0 or write out of range (dropped).
    E_all = int(np.shape(fa.edge_src)[-1])
    U2 = max(E_all, U)
    Cu = jnp.zeros((U2, H), B.dtype)
    small = np.nonzero(np.array(sizes, np.int64) <= _SPARSE_MAX)[0]
    if small_r and len(small):
        r = np.concatenate(small_r)                          # a label's pairs: contiguous
        v = np.concatenate(small_v)
        # pieces of n2 (label, token) pairs, a label never split: the gather is at most
        # [n2, H] whatever the number of pairs (backward_nbytes' "masses")
        n2, m2 = _small_piece(E_all), E_all + 1
        first_pair = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        i = 0
        while i < len(r):
            j = len(r) if i + n2 >= len(r) else int(
                first_pair[np.searchsorted(first_pair, i + n2, side="right") - 1])
            labels, seg = np.unique(r[i:j], return_inverse=True)
            v_pad = np.zeros(n2, np.int32)
            v_pad[:j - i] = v[i:j]
            seg_pad = np.full(n2, m2 - 1, np.int32)          # padding -> a spare segment
            seg_pad[:j - i] = seg.reshape(-1)
            idx_pad = np.full(m2, U2, np.int32)              # spare rows -> dropped
            idx_pad[:len(labels)] = labels
            Cu = _small_sums(Cu, B, jnp.asarray(v_pad), jnp.asarray(seg_pad),
                             jnp.asarray(idx_pad))
            i = j
    # large sets: indicator matmuls; over half the vocabulary: 1 − B·1_{V∖L}
    large = sorted(large_bits)
    for i in range(0, len(large), _DENSE_CHUNK):
        idx = np.array(large[i:i + _DENSE_CHUNK], np.int64)
        packed = np.stack([large_bits[j] for j in idx.tolist()])
        bits = np.unpackbits(packed.view(np.uint8), axis=1, bitorder="little")[:, :V]
        comp = np.array([sizes[j] for j in idx.tolist()]) * 2 > V
        ind = np.zeros((_DENSE_CHUNK, V), np.uint8)
        ind[:len(idx)] = np.where(comp[:, None], 1 - bits, bits)
        comp_pad = np.zeros(_DENSE_CHUNK, bool)
        comp_pad[:len(idx)] = comp
        idx_pad = np.full(_DENSE_CHUNK, U2, np.int32)
        idx_pad[:len(idx)] = idx
        Cu = _large_sums(Cu, B, jnp.asarray(ind), jnp.asarray(comp_pad), jnp.asarray(idx_pad))
    src, dst = np.asarray(fa.edge_src), np.asarray(fa.edge_dst)
    loop = (src == dst) & (np.asarray(fa.dist)[src] == 0)      # ⊥'s self-loop(s)
    C = _gather_edges(Cu, jnp.asarray(label_of_pair[pair_inv].astype(np.int32)),
                      jnp.asarray(loop))
    return C


# ---------------------------------------------------------------------------------------
# the kernel's token -> out-edge index
# ---------------------------------------------------------------------------------------
#: default limit on the edge index (``S·V`` bytes; ``index_max_bytes=``)
DEFAULT_INDEX_MAX_BYTES = 256 << 20


def use_kernel(kernel: str, table_dtype, platform: str | None = None) -> bool:
    """Whether tables in ``table_dtype`` score with the native kernel: ``kernel`` is
    ``"auto"`` (on the CPU platform, tables in float32/bfloat16, the kernel built),
    ``"kernel"`` (the same conditions, or an error saying which fails) or ``"xla"``
    (never). ``platform``: default ``jax.default_backend()``. Host side: called by
    :func:`backward`, never while tracing."""
    if kernel not in ("auto", "kernel", "xla"):
        raise ValueError(f"kernel={kernel!r}: expected 'auto', 'kernel' or 'xla'")
    if kernel == "xla":
        return False
    from . import kernels
    platform = platform or jax.default_backend()
    why = None
    if platform != "cpu":
        why = f"the kernel is CPU-only (platform {platform!r})"
    elif jnp.dtype(table_dtype) not in (jnp.float32, jnp.bfloat16):
        why = f"the kernel takes float32/bfloat16 tables (got {jnp.dtype(table_dtype)})"
    elif not kernels.pgcd_kernel_available(required=kernel == "kernel"):
        why = f"the kernel is unavailable: {kernels.build_error()}"
    if why is not None and kernel == "kernel":
        raise JaxcdError(why)
    return why is None


def _edge_index_dtype(fa: TensorizedAutomaton, table_dtype, kernel: bool,
                      index_max_bytes: int | None = None):
    """The dtype of :func:`edge_index` for ``fa`` (int8 up to out-degree 127, else int16),
    or ``None`` where :func:`backward` does not build it: the native kernel is not in use
    (``kernel`` false) or the index would exceed ``index_max_bytes`` (default
    :data:`DEFAULT_INDEX_MAX_BYTES`). Decided from shapes only, so every automaton of a
    bucket gets the same."""
    if not kernel:
        return None
    D = int(np.shape(fa.out_dst)[-1])
    if D > 32767:
        return None
    dt = jnp.int8 if D <= 127 else jnp.int16
    S = int(np.prod(np.shape(fa.dist)))
    limit = DEFAULT_INDEX_MAX_BYTES if index_max_bytes is None else int(index_max_bytes)
    if S * int(fa.vocab_size) * jnp.dtype(dt).itemsize > limit:
        return None
    return dt


@partial(jax.jit, static_argnames=("D", "V", "dtype"))
def _edge_index_jit(cum, row_index, out_start, *, D: int, V: int, dtype):
    from .kernels import TARGET_EDGE_INDEX
    S = out_start.shape[0] - 1
    s = jnp.arange(S)
    deg = jnp.minimum(out_start[1:] - out_start[:-1], D).astype(jnp.int32)
    rows = row_index[jnp.minimum(out_start[:-1, None] + s[:, None] + 1 + jnp.arange(D),
                                 row_index.shape[0] - 1)].astype(jnp.int32)
    return jax.ffi.ffi_call(TARGET_EDGE_INDEX, jax.ShapeDtypeStruct((S, V), dtype))(
        cum.astype(jnp.uint32), rows, deg)


def edge_index(fa: TensorizedAutomaton, dtype=jnp.int8) -> jax.Array:
    """``[S, V]``: the out-edge ``d`` (``0 ≤ d < deg(s)``, in ``fa.out_dst[s]``'s order)
    whose label holds token ``v`` in state ``s``, or ``−1`` where no out-edge does (the
    dead state's tokens). Built by the native kernel from the nested cumulative mask rows
    (``O(Σ_s deg(s) · V/32)`` word operations, a few ms); ``fa`` must not be a stack
    (flatten it first). ``dtype``: int8 (out-degree ≤ 127) or int16."""
    D = int(np.shape(fa.out_dst)[-1])
    return _edge_index_jit(jnp.asarray(fa.cum_masks), jnp.asarray(fa.row_index),
                           jnp.asarray(fa.out_start), D=D, V=int(fa.vocab_size),
                           dtype=jnp.dtype(dtype))


# ---------------------------------------------------------------------------------------
# backward tables
# ---------------------------------------------------------------------------------------
def _normalise_rows(Z, L):
    """``Z [S, H] · exp(L [S])`` -> (mantissa with max 1, log-scale); exact zeros stay
    zero with log-scale ``−inf``."""
    m = jnp.max(Z, axis=1)
    pos = m > 0
    mant = jnp.where(pos[:, None], Z / jnp.where(pos, m, 1.0)[:, None], 0.0)
    ls = jnp.where(pos, L + jnp.log(jnp.where(pos, m, 1.0)), -jnp.inf)
    return mant, ls


@partial(jax.jit, static_argnames=("budget", "table_dtype"))
def _backward(fa, A, C, *, budget: int, table_dtype):
    S = fa.num_states
    H = A.shape[0]
    dt = C.dtype
    src, dst = fa.edge_src, fa.edge_dst
    final = fa.dist == 0
    mant_n = jnp.where(final[:, None], jnp.ones((S, H), dt), 0.0)
    ls_n = jnp.where(final, 0.0, -jnp.inf).astype(dt)

    def step(carry, _):
        mant, ls = carry
        l_e = ls[dst]                                                  # [E]
        l_max = jax.ops.segment_max(l_e, src, num_segments=S)          # -inf if no live edge
        l_max = jnp.where(jnp.isfinite(l_max), l_max, -jnp.inf)
        live = jnp.isfinite(l_e)
        f = jnp.where(live, jnp.exp(jnp.where(live, l_e - l_max[src], 0.0)), 0.0)
        x = C.T * mant[dst] * f[:, None]                               # [E, H]
        y = jax.ops.segment_sum(x, src, num_segments=S)                # [S, H]
        z = jnp.matmul(y, A.T, precision=_HIGHEST)                     # [S, H]
        mant2, ls2 = _normalise_rows(z, jnp.where(jnp.isfinite(l_max), l_max, 0.0))
        # ⊥: β^P = 1 exactly (the recursion gives Σ_h' A[h, h'] = 1 up to rounding)
        mant2 = jnp.where(final[:, None], 1.0, mant2)
        ls2 = jnp.where(final, 0.0, ls2)
        # emit the rows before the step: row r = the carry after r steps (r = 0: ⊥ only)
        return (mant2, ls2), (mant.astype(table_dtype), ls)

    # rows by remaining steps r = 0..N, written once into the scan's output (no
    # concatenation or reindexing copy: the tables are the largest arrays of P-GCD); the
    # last step's result is not needed
    _, (mant, ls) = jax.lax.scan(step, (mant_n, ls_n), None, length=budget + 1)
    return mant, ls


@partial(jax.jit, static_argnames=("dtype",))
def _transpose(B, *, dtype):
    """``Bt [V, H]`` in the tables' storage dtype (one pass over ``B``, no temporary)."""
    return B.T.astype(dtype)


def backward(fa: TensorizedAutomaton, hmm, budget: int, *, table_dtype=None,
             max_steps: int | None = None, max_bytes: int | None = None, kernel: str = "auto",
             index_max_bytes: int | None = None) -> PGCDTables:
    """``β^P`` tables for budget ``n`` (one jitted ``lax.scan`` over ``max_steps`` steps,
    default ``n``; with a larger ``max_steps`` — a budget bucket — the compiled program
    serves every budget up to it). ``fa`` may be a stack of automata (one per prompt
    row; the tables are those of :func:`jaxcd.decoding.buckets.flatten` of it).

    Checks first (host side): the HMM's vocabulary equals the automaton's, and the budget
    can be met (:class:`~jaxcd.errors.BudgetTooSmallError` naming the smallest budget).
    ``table_dtype``: storage dtype of the tables (default: the HMM's dtype;
    ``jnp.bfloat16`` halves their memory, see :func:`tables_nbytes`).

    Memory: the estimate of :func:`backward_nbytes` is checked against ``max_bytes``
    (default :data:`DEFAULT_MAX_BYTES`, 8 GiB) before anything is allocated:
    :class:`TablesTooLargeError` names the estimate and what to change.

    ``kernel`` (``"auto"``, ``"kernel"``, ``"xla"``; :func:`use_kernel`): whether the
    per-step scores use the native CPU kernel, recorded in the tables
    (``PGCDTables.kernel``); on a GPU/TPU platform ``"auto"`` records the Pallas kernel
    instead (``PGCDTables.pallas``) and ``"xla"`` keeps the XLA path. With the kernel, the per-state edge index is built when it
    takes at most ``index_max_bytes`` (default :data:`DEFAULT_INDEX_MAX_BYTES`)."""
    from .buckets import flatten
    check_hmm(fa, hmm)
    gcd.check_budget(fa, budget)
    steps = int(budget) if max_steps is None else int(max_steps)
    gcd.check_steps(budget, steps)
    dt = jnp.result_type(*(jax.dtypes.canonicalize_dtype(                 # x64 off: f32
        getattr(x, "dtype", None) or np.asarray(x).dtype) for x in (hmm.A, hmm.B, hmm.pi)))
    check_memory(fa, int(np.shape(hmm.A)[0]), steps, jnp.dtype(table_dtype or dt), dt,
                 max_bytes, kernel=kernel, index_max_bytes=index_max_bytes)
    fa = flatten(jax.device_get(fa))
    A = jnp.asarray(hmm.A)
    B = jnp.asarray(hmm.B)
    dt = jnp.result_type(A.dtype, B.dtype, jnp.asarray(hmm.pi).dtype)
    A, B = A.astype(dt), B.astype(dt)
    tdt = jnp.dtype(table_dtype or dt)
    # Three phases, so that the largest arrays are never alive together (the peak is the
    # tables plus the larger of the recursion's work and Bt + the index; see
    # backward_nbytes): the recursion with the edge masses C, then — C freed — Bt, then
    # the index. Each phase is waited for, so the next one's buffers are allocated only
    # after the previous one's temporaries (and C) are released.
    mant, ls = _backward(fa, A, edge_masses(fa, B), budget=steps, table_dtype=tdt)
    jax.block_until_ready((mant, ls))
    Bt = jax.block_until_ready(_transpose(B, dtype=tdt))
    kern = use_kernel(kernel, tdt)
    idx = _edge_index_dtype(fa, tdt, kern, index_max_bytes)
    from .pgcd_pallas import use_pallas
    return PGCDTables(mant, ls, Bt, jnp.asarray(budget, jnp.int32),
                      None if idx is None else edge_index(fa, idx), kernel=kern,
                      pallas=kernel == "auto" and not kern and use_pallas(tdt))


# ---------------------------------------------------------------------------------------
# forward: state, scores
# ---------------------------------------------------------------------------------------
def init_state(fa: TensorizedAutomaton, hmm) -> PGCDState:
    """Start state: automaton at ``s_0``, ``t = 0``, ``u = π`` (one automaton; for a
    stack, see :func:`jaxcd.decoding.gcd.init_states`)."""
    pi = jnp.asarray(hmm.pi)
    return PGCDState(gcd.init_state(fa), pi / jnp.sum(pi))


def advance(fa: TensorizedAutomaton, hmm, st: PGCDState, token: jax.Array) -> PGCDState:
    """After emitting ``token``: ``δ`` on the automaton, ``u ← normalise(u ∘ B[:, v])·A``.
    (If the HMM gives the token probability 0, ``u`` becomes 0 and every later ``ψ`` is
    ``−inf``.)"""
    return PGCDState(gcd.advance(fa, st.cs, token), hmm_update(hmm.A, hmm.B, st.u, token))


def hmm_update(A: jax.Array, B: jax.Array, u: jax.Array, token: jax.Array) -> jax.Array:
    """``normalise(u ∘ B[:, token]) · A`` (0 if the token has probability 0)."""
    alpha = u * jnp.asarray(B)[:, token].astype(u.dtype)
    z = jnp.sum(alpha)
    alpha = jnp.where(z > 0, alpha / jnp.where(z > 0, z, 1.0), 0.0)
    return jnp.matmul(alpha, jnp.asarray(A).astype(u.dtype), precision=_HIGHEST)


def _edge_of_token(fa: TensorizedAutomaton, state: jax.Array, D: int
                   ) -> tuple[jax.Array, jax.Array]:
    """For every token: the index ``d < D`` of the out-edge of ``state`` whose label set
    holds it, and whether one of the first ``D' = min(deg, D)`` out-edges does.

    The cumulative rows of a state are nested (row ``i`` is ``L_0 ∪ … ∪ L_i``), so a
    token's edge is the first row that holds it: a binary search, ``⌈log₂(D+1)⌉`` rounds
    of one bit read per token — ``O(V log D)``, never the ``[D, V]`` unpacked rows."""
    V = fa.vocab_size
    start = fa.out_start[state]
    deg = jnp.minimum(fa.out_start[state + 1] - start, D)
    rows = fa.row_index[jnp.minimum(start + state + 1 + jnp.arange(D),
                                    fa.row_index.shape[0] - 1)]         # [D]
    v = jnp.arange(V, dtype=jnp.int32)
    word, sh = v >> 5, (v & 31).astype(jnp.uint32)
    lo = jnp.zeros((V,), jnp.int32)
    hi = jnp.broadcast_to(deg.astype(jnp.int32), (V,))
    for _ in range(max(int(D), 1).bit_length()):     # invariant: answer in [lo, hi]
        mid = (lo + hi) >> 1
        row = rows[jnp.minimum(mid, D - 1)]
        bit = ((fa.cum_masks[row, word] >> sh) & jnp.uint32(1)) > 0
        go = lo < hi
        hi = jnp.where(go & bit, mid, hi)
        lo = jnp.where(go & ~bit, mid + 1, lo)
    has = lo < deg
    return jnp.minimum(lo, D - 1), has


def check_tables(fa: TensorizedAutomaton, tables: PGCDTables) -> None:
    """Raise :class:`HMMMismatchError` if ``tables`` were not built for ``fa`` (shapes are
    static, so this also works while tracing)."""
    S = int(np.prod(np.shape(fa.dist)))              # a stack's flattened size
    if tables.mant.shape[1] != S or tables.Bt.shape[0] != fa.vocab_size:
        raise HMMMismatchError(
            f"P-GCD tables for {tables.mant.shape[1]} states and {tables.Bt.shape[0]} tokens "
            f"do not fit this automaton ({S} states, {fa.vocab_size} tokens): "
            "build them with pgcd.backward(fa, hmm, budget)")


def _log_num_den(fa, tables: PGCDTables, st: PGCDState, D: int | None = None):
    """``log num(v)`` and ``log den(v)`` (float ``[V]``) for one particle, over its first
    ``D`` out-edges (default: all; exact whenever the edges past ``D`` have ``β^P = 0``,
    see :func:`live_degree`)."""
    check_tables(fa, tables)
    D = fa.out_dst.shape[1] if D is None else D
    n = tables.limit()
    s, t = st.cs.state, st.cs.t
    r = tables.row(t + 1)
    dsts = fa.out_dst[s, :D]                                             # [D]
    mant = tables.mant[r, dsts]                                          # [D, H]
    ls = tables.log_scale[r, dsts]                                       # [D]
    acc = st.u.dtype
    sd = tables.Bt.dtype
    rows = jnp.concatenate([st.u[None].astype(sd), (st.u[None] * mant.astype(acc)).astype(sd)])
    P = jax.lax.dot_general(rows, tables.Bt, (((1,), (1,)), ((), ())), precision=_HIGHEST,
                            preferred_element_type=acc)                  # [1 + D, V]
    den = P[0]
    d, has = _edge_of_token(fa, s, D)
    Pn = jnp.take_along_axis(P[1:], d[None], axis=0)[0]                 # [V]
    l_d = ls[d]
    ok = has & (Pn > 0) & jnp.isfinite(l_d) & (t < n)
    log_num = jnp.where(ok, jnp.log(jnp.where(ok, Pn, 1.0)) + jnp.where(ok, l_d, 0.0), -jnp.inf)
    log_den = jnp.where(den > 0, jnp.log(jnp.where(den > 0, den, 1.0)), -jnp.inf)
    return log_num, log_den


def _pallas_ok(tables: PGCDTables, sts: PGCDState, path: str) -> bool:
    """Whether this call takes the Pallas kernel (:mod:`jaxcd.decoding.pgcd_pallas`;
    decided at trace time from static facts only): ``path="pallas"`` always;
    ``path="auto"`` when the tables were built for it (``tables.pallas``: GPU/TPU,
    :func:`backward`) and the particles' ``u`` is float32 (float64 runs take the XLA
    path). ``path="xla"`` is the fallback everywhere."""
    if path == "pallas":
        return True
    return path == "auto" and tables.pallas and sts.u.dtype == jnp.float32


def _pallas_batch(fa, tables, sts):
    """:func:`~jaxcd.decoding.pgcd_pallas.pallas_scores`: compiled for tables built for
    it (``tables.pallas``), else in Pallas's interpreter (an explicit ``path="pallas"``
    on a platform without a compiled lowering, e.g. the CPU)."""
    from . import pgcd_pallas
    check_tables(fa, tables)
    return pgcd_pallas.pallas_scores(fa, tables, sts, edge_of_token=_edge_of_token,
                                     interpret=not tables.pallas)


def _kernel_ok(tables: PGCDTables, sts: PGCDState, path: str) -> bool:
    """Whether this call takes the native kernel (decided at trace time from static
    facts only): the tables were built for it (``tables.kernel``, :func:`backward`),
    ``B`` is float32/bfloat16 and the particles' ``u`` float32. ``path``: ``"auto"``,
    ``"kernel"`` (or an error saying why not), ``"pallas"`` or ``"xla"`` (both: no)."""
    if path not in ("auto", "kernel", "xla", "pallas"):
        raise ValueError(f"path={path!r}: expected 'auto', 'kernel', 'pallas' or 'xla'")
    if path in ("xla", "pallas"):
        return False
    why = None
    if not tables.kernel:
        why = "the tables were built without the kernel (backward(kernel=...))"
    elif tables.Bt.dtype not in (jnp.float32, jnp.bfloat16) or sts.u.dtype != jnp.float32:
        why = (f"the kernel takes float32/bfloat16 B and float32 u (got {tables.Bt.dtype}, "
               f"{sts.u.dtype})")
    if why is not None and path == "kernel":
        raise JaxcdError(why)
    return why is None


def _kernel_scores(fa: TensorizedAutomaton, tables: PGCDTables, sts: PGCDState):
    """:func:`scores` for particles with leading axes (``sts.u [..., H]``) through the
    native kernel (``kernels/pgcd_scores.cc``): each allowed token's column of ``B`` times
    the ``β^P`` column of its own successor, ``2·H`` multiply-adds per (particle, allowed
    token), the token → edge lookup word by word over the nested cumulative rows."""
    from .kernels import TARGET, TARGET_INDEX
    check_tables(fa, tables)
    D = fa.out_dst.shape[1]
    V, H = tables.Bt.shape
    n = tables.limit()
    s, t, u = sts.cs.state, sts.cs.t, sts.u
    lead = u.shape[:-1]
    r = tables.row(t + 1)
    start = fa.out_start[s]
    deg = jnp.minimum(fa.out_start[s + 1] - start, D).astype(jnp.int32)      # [...]
    k = jnp.arange(D)
    rows = fa.row_index[jnp.minimum(start[..., None] + s[..., None] + 1 + k,
                                    fa.row_index.shape[0] - 1)].astype(jnp.int32)
    dsts = fa.out_dst[s]                                                    # [..., D]
    mant = tables.mant[r[..., None], dsts].astype(jnp.float32)              # [..., D, H]
    ls = tables.log_scale[r[..., None], dsts].astype(jnp.float32)           # [..., D]
    ls = jnp.where((k < deg[..., None]) & (t < n)[..., None], ls, -jnp.inf)
    W = u[..., None, :] * mant
    out = (jax.ShapeDtypeStruct(lead + (V,), jnp.float32),) * 2 + (
        jax.ShapeDtypeStruct(lead, jnp.float32),)
    if tables.edge_index is not None:       # token -> edge from the per-state index
        log_num, logpsi, z = jax.ffi.ffi_call(TARGET_INDEX, out, vmap_method="expand_dims")(
            tables.Bt, tables.edge_index, s.astype(jnp.int32), W, ls, u)
    else:                                   # from the nested cumulative mask rows
        log_num, logpsi, z = jax.ffi.ffi_call(TARGET, out, vmap_method="expand_dims")(
            tables.Bt, fa.cum_masks.astype(jnp.uint32), W, ls, u, rows, deg)
    zf = jnp.isfinite(z)[..., None]
    lprod = jnp.where(zf, log_num - jnp.where(zf, z[..., None], 0.0), -jnp.inf)
    return logpsi, z, lprod


def live_degree(fa: TensorizedAutomaton, tables: PGCDTables, st: PGCDState) -> jax.Array:
    """``1 +`` the index of the last out-edge of ``st``'s state whose destination has
    ``β^P_{t+1} > 0`` (0 if none): the out-edges past it contribute nothing. Edges are
    sorted by their destination's distance to ``⊥``, so these are usually the first
    few."""
    n = tables.limit()
    D = fa.out_dst.shape[1]
    deg = fa.out_start[st.cs.state + 1] - fa.out_start[st.cs.state]
    live = jnp.isfinite(tables.log_scale[tables.row(st.cs.t + 1), fa.out_dst[st.cs.state]]) \
        & (jnp.arange(D) < deg) & (st.cs.t < n)
    return jnp.max(jnp.where(live, jnp.arange(1, D + 1), 0))


def token_logpsi(fa: TensorizedAutomaton, hmm, tables: PGCDTables, st: PGCDState) -> jax.Array:
    """``log ψ(x_{1:t} v)`` for every token ``v``: float ``[V]``; ``−inf`` off the GCD
    mask, where ``β^P = 0``, and where the HMM gives ``v`` probability 0."""
    return scores(fa, tables, st)[0]


def product_logprobs(fa: TensorizedAutomaton, hmm, tables: PGCDTables, st: PGCDState) -> jax.Array:
    """``log p_prod(v | x_{1:t})``: float ``[V]``, normalised (all ``−inf`` if
    ``ψ(x_{1:t}) = 0``)."""
    return scores(fa, tables, st)[2]


def prefix_logpsi(fa: TensorizedAutomaton, hmm, tables: PGCDTables, st: PGCDState) -> jax.Array:
    """``log ψ(x_{1:t}) = log Σ_v num(v)``: the HMM probability that the prefix is
    completed validly within the budget (``log ψ(∅)`` at the start)."""
    return scores(fa, tables, st)[1]


def scores(fa: TensorizedAutomaton, tables: PGCDTables, st: PGCDState, D: int | None = None,
           *, path: str = "auto"):
    """``(log ψ(x v) [V], log ψ(x) [], log p_prod(v|x) [V])`` from one pass, over the
    first ``D`` out-edges (default: all). ``path``: ``"kernel"`` (the native ``K·H·V``
    kernel, :func:`_kernel_scores`), ``"pallas"`` (the Pallas ``K·H·V`` kernel,
    :mod:`jaxcd.decoding.pgcd_pallas`; the default on GPU/TPU), ``"xla"`` (a ``[1 + D, H] @ [H, V]`` matmul, one
    column kept per token) or ``"auto"`` (the kernel where it runs; see
    :func:`_kernel_ok`)."""
    if D is None and _pallas_ok(tables, st, path):
        logpsi, z, lprod = _pallas_batch(fa, tables, jax.tree.map(lambda x: x[None], st))
        return logpsi[0], z[0], lprod[0]
    if D is None and _kernel_ok(tables, st, path):
        return _kernel_scores(fa, tables, st)
    log_num, log_den = _log_num_den(fa, tables, st, D)
    ok = jnp.isfinite(log_num) & jnp.isfinite(log_den)
    logpsi = jnp.where(ok, log_num - jnp.where(ok, log_den, 0.0), -jnp.inf)
    z = jax.nn.logsumexp(log_num)
    zf = jnp.isfinite(z)
    lprod = jnp.where(zf, log_num - jnp.where(zf, z, 0.0), -jnp.inf)
    return logpsi, z, lprod


def batched_scores(fa: TensorizedAutomaton, tables: PGCDTables, sts: PGCDState, *,
                   path: str = "auto"):
    """:func:`scores` for a batch of particles (``sts`` with a leading axis ``K``).

    On CPU (``path="auto"``, the kernel built) one call of the native kernel:
    ``O(K·H·V)`` whatever the out-degree. On GPU/TPU (``path="auto"``, float32) or with
    ``path="pallas"``: the Pallas kernel (:mod:`jaxcd.decoding.pgcd_pallas`), also
    ``O(K·H·V)``. Otherwise (``path="xla"``, GPU/TPU, float64) one
    ``[K·(1+D'), H] @ [H, V]`` matmul, where ``D'`` is the smallest power of two (or the
    automaton's largest out-degree) that covers every particle's :func:`live_degree` —
    chosen at run time with ``lax.switch``, so a step pays for the out-edges that can
    still lead to a valid output, not for the automaton's worst state. Exact: edges past
    a particle's live degree have ``β^P = 0``."""
    if _pallas_ok(tables, sts, path):
        lead = sts.u.shape[:-1]
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[len(lead):]), sts)
        return jax.tree.map(lambda x: x.reshape(lead + x.shape[1:]),
                            _pallas_batch(fa, tables, flat))
    if _kernel_ok(tables, sts, path):
        return _kernel_scores(fa, tables, sts)
    D = fa.out_dst.shape[1]
    caps = sorted({min(1 << i, D) for i in range(max(D, 1).bit_length() + 1)})
    need = jnp.max(jax.vmap(live_degree, in_axes=(None, None, 0))(fa, tables, sts))
    branch = jnp.sum(jnp.asarray(caps) < need)
    fns = [partial(lambda c, sts: jax.vmap(partial(scores, path="xla"), in_axes=(
        None, None, 0, None))(fa, tables, sts, c), c) for c in caps]
    return jax.lax.switch(branch, fns, sts)


# ---------------------------------------------------------------------------------------
# soundness: ψ is a probability
# ---------------------------------------------------------------------------------------
class PsiBoundError(JaxcdError, ArithmeticError):
    """A quantity that is a probability — ``β^P``, ``ψ(x v)``, ``ψ(x)`` — exceeds 1 by
    more than the tolerance, or the HMM is not a probability model (:func:`check_psi`)."""


#: default tolerance of :func:`check_psi` on ``ψ ≤ 1 + tol``, by the tables' storage dtype
#: (float32: a few hundred roundings of 6e-8 in the sums over ``H`` and the budget's steps;
#: bfloat16: the mantissa and ``B`` each rounded to 8 bits, 2⁻⁹ relative, twice, with room)
PSI_TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 2.0 ** -6}


def psi_tolerance(dtype) -> float:
    """The default tolerance of :func:`check_psi` for tables stored in ``dtype``."""
    return PSI_TOLERANCE.get(jnp.dtype(dtype).name, 1e-4)


def table_log_max(tables: PGCDTables) -> jax.Array:
    """``log max β^P`` over the rows a budget uses, every state and hidden state
    (``−inf`` if every entry is 0). ``β^P`` is a probability, so this is ``≤ 0`` up to
    rounding. Jittable, one pass over the tables."""
    idx = tables.row(jnp.arange(tables.mant.shape[0]))                   # rows n..0
    mmax = jnp.max(tables.mant[idx].astype(jnp.float32), axis=-1)          # [N+1, S]
    ls = tables.log_scale[idx].astype(jnp.float32)
    ok = (mmax > 0) & jnp.isfinite(ls)
    return jnp.max(jnp.where(ok, ls + jnp.log(jnp.where(ok, mmax, 1.0)), -jnp.inf))


def psi_bounds(fa: TensorizedAutomaton, tables: PGCDTables, sts: PGCDState, *,
               path: str = "auto") -> tuple[jax.Array, jax.Array]:
    """``(max_v log ψ(x v), log ψ(x))`` per particle (``sts`` with leading axes, or one
    particle): both are ``≤ 0`` up to rounding. Jittable; it computes the scores
    :func:`batched_scores` computes, so it costs one P-GCD step."""
    one = sts.u.ndim == 1
    if one:
        sts = jax.tree.map(lambda x: x[None], sts)
    lead = sts.u.shape[:-1]
    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[len(lead):]), sts)
    logpsi, z, _ = batched_scores(fa, tables, flat, path=path)
    tok = jnp.max(logpsi, axis=-1).reshape(lead)
    z = z.reshape(lead)
    return (tok[0], z[0]) if one else (tok, z)


_table_log_max_jit = jax.jit(table_log_max)
_psi_bounds_jit = jax.jit(psi_bounds, static_argnames=("path",))


def _hmm_error(hmm, tol: float) -> str | None:
    """Why the HMM is not a probability model (negative entries, ``π`` or a row of ``A``
    or ``B`` not summing to 1 within ``tol``), or ``None``."""
    for name, x in (("pi", hmm.pi), ("A", hmm.A), ("B", hmm.B)):
        x = np.asarray(jax.device_get(x))
        if x.dtype.kind != "f":
            x = x.astype(np.float64)
        s = x.sum(axis=-1, dtype=np.float64)         # accumulated in float64, no copy
        if not np.all(np.isfinite(s)) or x.min() < 0:
            return f"{name} has negative or non-finite entries"
        bad = np.abs(s - 1.0) > tol
        if np.any(bad):
            where = "" if x.ndim == 1 else f" (row {int(np.argmax(np.abs(s - 1.0)))})"
            worst = float(np.ravel(s)[int(np.argmax(np.abs(np.ravel(s) - 1.0)))])
            return (f"{name} is not normalised: a sum is {worst:.9g}{where}, "
                    f"{int(np.sum(bad))} off 1 by more than {tol:g}")
    return None


def check_psi(fa: TensorizedAutomaton, hmm, tables: PGCDTables, sts: PGCDState | None = None,
              *, tol: float | None = None, path: str = "auto", raise_error: bool = True) -> dict:
    """Check that P-GCD's probabilities are probabilities: the HMM is normalised
    (``π``, every row of ``A`` and ``B`` sums to 1 within ``tol``; an HMM whose rows sum
    above 1 makes ``β^P`` and ``ψ`` exceed 1), ``β^P ≤ 1 + tol`` in the tables and, for
    the particles ``sts`` (one, or a batch with leading axes; default: the start state),
    ``ψ(x v) ≤ 1 + tol`` for every token and ``ψ(x) ≤ 1 + tol``.

    A debugging and validation helper, run on the host outside the decoding loop (one
    reduction over the tables and one P-GCD step). ``tol`` defaults to
    :func:`psi_tolerance` of the tables' dtype. Returns ``{"max_beta", "max_token_psi",
    "max_prefix_psi", "tol", "hmm_error", "ok"}`` (maxima as floats, ``0.0`` where every
    value is 0); with ``raise_error`` (default) a failed check raises
    :class:`PsiBoundError` saying which bound failed."""
    check_tables(fa, tables)
    tol = psi_tolerance(tables.mant.dtype) if tol is None else float(tol)
    if sts is None:
        sts = init_state(fa, hmm)
    max_beta = float(np.exp(jax.device_get(_table_log_max_jit(tables))))
    tok, z = jax.device_get(_psi_bounds_jit(fa, tables, sts, path=path))
    res = {"max_beta": max_beta,
           "max_token_psi": float(np.exp(np.max(tok))),
           "max_prefix_psi": float(np.exp(np.max(z))),
           "tol": tol, "hmm_error": _hmm_error(hmm, max(tol, 1e-5))}
    bad = [f"{k} = {res[k]:.9g}" for k in ("max_beta", "max_token_psi", "max_prefix_psi")
           if not res[k] <= 1.0 + tol]
    res["ok"] = not bad and res["hmm_error"] is None
    if raise_error and not res["ok"]:
        why = "; ".join(bad + ([f"the HMM: {res['hmm_error']}"] if res["hmm_error"] else []))
        raise PsiBoundError(f"P-GCD probabilities above 1 + {tol:g}: {why}. Normalise the "
                            "HMM (hmm_distill checkpoints are), or store the tables in a "
                            "wider dtype")
    return res
