"""The LM's in-place layer matmul: ``y = x · W[l]`` for a stacked weight ``W [L, K, N]``
and a traced layer index ``l``, as an XLA FFI custom call on CPU (``layer_matmul.cc``).

Why: :class:`jaxcd.lm.llama.LlamaModel` runs its ``L`` blocks as one ``lax.scan`` over
weights stacked ``[L, ...]`` (compile time flat in depth). XLA:CPU's dot cannot read an
operand at a dynamic offset, so the stacked scan first copies each layer's weights, and
its dot fusions at decode shapes (a few rows) run well below this CPU's memory and FMA
limits. The kernel reads layer ``l`` where it lies: a register-blocked GEMM (6 x 16
tiles, weights packed per 256-row block while the next block is prefetched; 2..16 rows,
a batched decode step, with x transposed into the vector lanes and W broadcast from where
it lies) split over XLA's intra-op thread pool. Rows accumulate in float32 in ``k`` order, so a row's result
does not depend on how many rows share the call.

:class:`jaxcd.lm.llama.JaxLM`'s ``matmul`` field chooses: ``"auto"`` (default: the
kernel on the CPU platform when it builds, else XLA's dot with one warning), ``"kernel"``
(the kernel or an error), ``"xla"`` (never). GPU/TPU and sharded weights always use
XLA's dot. Built and cached by :mod:`jaxcd.native_build`.

:func:`decode_attention` (``decode_attention.cc``) is the decode step's attention over
the stacked KV cache, read in place from each row's first attended slot; the LM's
``attention`` field chooses it the same way.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

import jax
import jax.numpy as jnp

from ...native_build import KernelUnavailable, NativeKernel

__all__ = ["layer_matmul", "layer_matmuls", "rows_matmul", "lm_kernel_available", "build_error",
           "KernelUnavailable", "MAX_ROWS", "decode_attention", "decode_attention_available"]

TARGET = "jaxcd_layer_matmul"
ROWS_TARGET = "jaxcd_rows_matmul"
_KERNEL = NativeKernel(Path(__file__).with_name("layer_matmul.cc"), "JaxcdLayerMatmul", TARGET,
                       "the LM uses XLA's dot for its layer matmuls")
_ROWS = NativeKernel(Path(__file__).with_name("layer_matmul.cc"), "JaxcdRowsMatmul",
                     ROWS_TARGET, "the LM uses XLA's dot for its output projection")
ATTN_TARGET = "jaxcd_decode_attention"
_ATTN = NativeKernel(Path(__file__).with_name("decode_attention.cc"), "JaxcdDecodeAttention",
                     ATTN_TARGET, "the LM uses XLA's decode attention")

#: Calls with more rows than this (prefill of long prompts) use XLA's dot on the layer's
#: slice instead: the kernel does not block rows for cache, and at these sizes the
#: weight copy is amortised over many rows.
MAX_ROWS = 256


def _check_platform(platform: str, required: bool, what: str) -> bool:
    if platform == "cpu":
        return True
    if required:
        raise KernelUnavailable(f"{what} is CPU-only (platform {platform!r})")
    return False


def lm_kernel_available(platform: str = "cpu", required: bool = False) -> bool:
    """Whether the layer matmul can use the kernel on ``platform``: the CPU, with the
    kernel built and registered (on first call; a failure is warned about once, or raised
    as :class:`KernelUnavailable` when ``required``)."""
    if not _check_platform(platform, required, "the layer kernel"):
        return False
    return (_KERNEL.available(required=required)
            and _ROWS.available(required=required, warn=False))


def build_error() -> str | None:
    """Why the kernel is unavailable (``None`` when it is loaded)."""
    lm_kernel_available()
    return _KERNEL.error


#: The kernels' GEMM schemes (``scheme=``; every one gives the same bits): ``"auto"`` (what
#: the LM runs: one row as ``"o"``, 2..16 rows as ``"t"``, more as ``"r"``), ``"o"``
#: (packed, each tile prefetching its rows of the next block), ``"r"`` (packed, the next
#: block prefetched in row order), ``"t"`` (2..16 rows through the transposed kernel).
SCHEMES = {"auto": 0, "o": ord("o"), "r": ord("r"), "t": ord("t")}


def _scheme_code(scheme: str) -> np.int32:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}: expected one of {tuple(SCHEMES)}")
    return np.int32(SCHEMES[scheme])


def _call(x2: jax.Array, layer: jax.Array, *ws: jax.Array, scheme: str = "auto"
          ) -> tuple[jax.Array, ...]:
    outs = tuple(jax.ShapeDtypeStruct((x2.shape[0], w.shape[2]), jnp.float32) for w in ws)
    return tuple(jax.ffi.ffi_call(TARGET, outs)(x2, layer, *ws, scheme=_scheme_code(scheme)))


@functools.lru_cache(maxsize=None)
def _matmul_fn(scheme: str):
    """The layer kernel call for one ``scheme``, with its vmap rule: a mapped axis over
    the rows only is folded into ``M``; otherwise one call per element (``lax.map``)."""

    @jax.custom_batching.custom_vmap
    def f(x2, layer, ws):
        return _call(x2, layer, *ws, scheme=scheme)

    @f.def_vmap
    def f_vmap(axis_size, in_batched, x2, layer, ws):
        xb, lb, wbs = in_batched
        if not lb and not any(wbs):   # only the rows are batched: fold them into M
            ys = _call(x2.reshape(-1, x2.shape[-1]), layer, *ws, scheme=scheme)
            return (tuple(y.reshape(axis_size, x2.shape[1], y.shape[-1]) for y in ys),
                    (True,) * len(ws))
        bc = lambda a, b: a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)  # noqa: E731
        ys = jax.lax.map(lambda a: _call(a[0], a[1], *a[2], scheme=scheme),
                         (bc(x2, xb), bc(layer, lb), tuple(bc(w, b) for w, b in zip(ws, wbs))))
        return ys, (True,) * len(ws)

    return f


def _rows_of(x) -> int:
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    return rows


def layer_matmuls(x: jax.Array, ws, layer, precision=jax.lax.Precision.HIGHEST,
                  use_kernel: bool = False, scheme: str = "auto") -> list[jax.Array]:
    """``[x · w[layer] for w in ws]`` for stacked weights ``w [L, K, N_w]`` (float32 or
    bfloat16) sharing ``x [..., K]`` and an int ``layer`` (traced or not; clamped to
    ``[0, L)`` like a dynamic slice), in ONE kernel call (q/k/v, gate/up). Float32
    ``[..., N_w]`` each, accumulated in float32. Uses the kernel when ``use_kernel``
    (the caller checked :func:`lm_kernel_available`) and the rows number at most
    :data:`MAX_ROWS`, else XLA's dot on each ``w[layer]`` at ``precision``. ``scheme``:
    the kernel's GEMM scheme (:data:`SCHEMES`; the same bits whichever)."""
    ws = list(ws)
    for w in ws:
        if w.ndim != 3 or x.shape[-1] != w.shape[1]:
            raise ValueError(f"layer_matmul: x {x.shape} and w {w.shape}: expected x [..., K] "
                             f"and w [L, K, N]")
    layer = jnp.asarray(layer, jnp.int32)
    lead, rows = x.shape[:-1], _rows_of(x)
    if use_kernel and rows <= MAX_ROWS and all(w.dtype in (jnp.float32, jnp.bfloat16)
                                               for w in ws):
        x2 = x.reshape(rows, x.shape[-1]).astype(jnp.float32)
        return [y.reshape(*lead, y.shape[-1]) for y in _matmul_fn(scheme)(x2, layer, tuple(ws))]
    return [jnp.dot(x, jax.lax.dynamic_index_in_dim(w, layer, 0, keepdims=False),
                    precision=precision, preferred_element_type=jnp.float32) for w in ws]


def layer_matmul(x: jax.Array, w: jax.Array, layer, precision=jax.lax.Precision.HIGHEST,
                 use_kernel: bool = False, scheme: str = "auto") -> jax.Array:
    """``x [..., K] · w[layer]`` for one stacked weight ``w [L, K, N]``: see
    :func:`layer_matmuls`."""
    return layer_matmuls(x, [w], layer, precision, use_kernel, scheme)[0]


def _rows_call(x2: jax.Array, e: jax.Array, scheme: str = "auto") -> jax.Array:
    return jax.ffi.ffi_call(ROWS_TARGET, jax.ShapeDtypeStruct((x2.shape[0], e.shape[0]),
                                                              jnp.float32))(
        x2, e, scheme=_scheme_code(scheme))


@functools.lru_cache(maxsize=None)
def _rows_fn(scheme: str):
    """The output-projection kernel call for one ``scheme``, with its vmap rule."""

    @jax.custom_batching.custom_vmap
    def f(x2, e):
        return _rows_call(x2, e, scheme)

    @f.def_vmap
    def f_vmap(axis_size, in_batched, x2, e):
        xb, eb = in_batched
        if not eb:
            y = _rows_call(x2.reshape(-1, x2.shape[-1]), e, scheme)
            return y.reshape(axis_size, x2.shape[1], e.shape[0]), True
        x2 = x2 if xb else jnp.broadcast_to(x2, (axis_size,) + x2.shape)
        return jax.lax.map(lambda a: _rows_call(*a, scheme), (x2, e)), True

    return f


def rows_matmul(x: jax.Array, e: jax.Array, precision=jax.lax.Precision.HIGHEST,
                use_kernel: bool = False, scheme: str = "auto") -> jax.Array:
    """``x [..., K] · e^T`` for ``e [N, K]`` (float32 or bfloat16): the tied output
    projection (``e`` the token embedding). Float32 ``[..., N]``; the kernel under the
    same conditions as :func:`layer_matmul` (and its ``scheme``), else XLA's dot."""
    if e.ndim != 2 or x.shape[-1] != e.shape[1]:
        raise ValueError(f"rows_matmul: x {x.shape} and e {e.shape}: expected x [..., K] "
                         f"and e [N, K]")
    lead, rows = x.shape[:-1], _rows_of(x)
    if use_kernel and rows <= MAX_ROWS and e.dtype in (jnp.float32, jnp.bfloat16):
        x2 = x.reshape(rows, x.shape[-1]).astype(jnp.float32)
        return _rows_fn(scheme)(x2, e).reshape(*lead, e.shape[0])
    return jnp.einsum("...h,vh->...v", x.astype(e.dtype), e, precision=precision,
                      preferred_element_type=jnp.float32)


# ----------------------------------------------------------------------------- attention
def decode_attention_available(platform: str = "cpu", required: bool = False) -> bool:
    """Whether the decode step can use the attention kernel on ``platform``: the CPU,
    with the kernel built (a failure warned about once, or raised when ``required``)."""
    if not _check_platform(platform, required, "the attention kernel"):
        return False
    return _ATTN.available(required=required)


def _attn_call(q, k, v, kn, vn, lo, slot, layer, scale, softcap):
    B, nh, D = q.shape
    return jax.ffi.ffi_call(ATTN_TARGET, jax.ShapeDtypeStruct((B, nh * D), jnp.float32))(
        q, k, v, kn, vn, lo, slot, layer, scale=np.float32(scale), softcap=np.float32(softcap))


@functools.lru_cache(maxsize=None)
def _attn_fn(scale: float, softcap: float):
    """The kernel call for one (scale, softcap), with its vmap rule: a mapped axis over
    the rows is folded into ``B`` (operands not mapped are broadcast); a mapped slot or
    layer index runs one call per element (``lax.map``)."""

    @jax.custom_batching.custom_vmap
    def f(q, k, v, kn, vn, lo, slot, layer):
        return _attn_call(q, k, v, kn, vn, lo, slot, layer, scale, softcap)

    @f.def_vmap
    def f_vmap(axis_size, in_batched, q, k, v, kn, vn, lo, slot, layer):
        *rows_b, slot_b, layer_b = in_batched
        bc = lambda a, b: a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)  # noqa: E731
        rows = [bc(a, b) for a, b in zip((q, k, v, kn, vn, lo), rows_b)]
        if not slot_b and not layer_b:
            flat = [a.reshape((-1,) + a.shape[2:]) for a in rows]
            out = f(*flat, slot, layer)
            return out.reshape(axis_size, q.shape[-3], -1), True
        out = jax.lax.map(lambda a: f(*a), (*rows, bc(slot, slot_b), bc(layer, layer_b)))
        return out, True

    return f


def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, k_new: jax.Array,
                     v_new: jax.Array, lo: jax.Array, slot, layer, scale: float,
                     softcap: float | None = None) -> jax.Array:
    """One decode token's grouped-query attention through the native kernel.

    ``q`` ``[B, n_h, D]`` (any float; used as float32); ``k`` ``[B, L, n_kv, D, S]`` and
    ``v`` ``[B, L, n_kv, S, D]`` the stacked caches (float32 or bfloat16), read at layer
    ``layer`` in place; ``k_new`` / ``v_new`` (any shape with ``B * n_kv * D`` elements
    in ``[B, n_kv, D]`` order; cast to the caches' dtype) stand in for slot ``slot``;
    ``lo`` int ``[B]`` the first slot each row attends. Returns float32 ``[B, n_h * D]``:
    ``softmax_j(softcap(scale q·k_j)) v_j`` over ``j = lo_b .. slot``, query head ``h``
    using key/value head ``h // (n_h / n_kv)``. ``slot`` is clamped to ``[0, S)``,
    ``layer`` to ``[0, L)`` and ``lo_b`` to ``[0, slot]``."""
    B, nh, D = q.shape
    if k.ndim != 5 or v.ndim != 5 or k.shape[3] != D or v.shape[4] != D:
        raise ValueError(f"decode_attention: q {q.shape}, k {k.shape}, v {v.shape}: expected "
                         f"[B, n_h, D], [B, L, n_kv, D, S], [B, L, n_kv, S, D]")
    _ATTN.available(required=True)       # built and registered (or KernelUnavailable)
    nkv = k.shape[2]
    kn = k_new.astype(k.dtype).reshape(B, nkv, D)
    vn = v_new.astype(v.dtype).reshape(B, nkv, D)
    f = _attn_fn(float(scale), float(softcap or 0.0))
    return f(q.astype(jnp.float32), k, v, kn, vn, jnp.asarray(lo, jnp.int32).reshape(B),
             jnp.asarray(slot, jnp.int32).reshape(()), jnp.asarray(layer, jnp.int32).reshape(()))
