"""The LM's in-place layer matmul: ``y = x · W[l]`` for a stacked weight ``W [L, K, N]``
and a traced layer index ``l``, as an XLA FFI custom call on CPU (``layer_matmul.cc``).

Why: :class:`jaxcd.lm.llama.LlamaModel` runs its ``L`` blocks as one ``lax.scan`` over
weights stacked ``[L, ...]`` (compile time flat in depth). XLA:CPU's dot cannot read an
operand at a dynamic offset, so the stacked scan first copies each layer's weights, and
its dot fusions at decode shapes (a few rows) run well below this CPU's memory and FMA
limits. The kernel reads layer ``l`` where it lies: a register-blocked GEMM (6 x 16
tiles, weights packed per 256-row block while the next block is prefetched) split over
XLA's intra-op thread pool. Rows accumulate in float32 in ``k`` order, so a row's result
does not depend on how many rows share the call.

``JAXCD_LM_KERNEL`` chooses: ``auto`` (default: the kernel on the CPU backend when it
builds, else XLA's dot with one warning), ``ffi`` (the kernel or an error), ``xla``
(never). GPU/TPU and sharded weights always use XLA's dot. Built and cached by
:mod:`jaxcd.native_build`.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp

from ...native_build import KernelUnavailable, NativeKernel

__all__ = ["layer_matmul", "layer_matmuls", "rows_matmul", "lm_kernel_mode", "lm_kernel_available", "build_error",
           "KernelUnavailable", "MAX_ROWS"]

TARGET = "jaxcd_layer_matmul"
ROWS_TARGET = "jaxcd_rows_matmul"
_KERNEL = NativeKernel(Path(__file__).with_name("layer_matmul.cc"), "JaxcdLayerMatmul", TARGET,
                       "the LM uses XLA's dot for its layer matmuls")
_ROWS = NativeKernel(Path(__file__).with_name("layer_matmul.cc"), "JaxcdRowsMatmul",
                     ROWS_TARGET, "the LM uses XLA's dot for its output projection")

#: Calls with more rows than this (prefill of long prompts) use XLA's dot on the layer's
#: slice instead: the kernel does not block rows for cache, and at these sizes the
#: weight copy is amortised over many rows.
MAX_ROWS = 256


def lm_kernel_mode() -> str:
    mode = os.environ.get("JAXCD_LM_KERNEL", "auto").strip().lower() or "auto"
    if mode not in ("auto", "ffi", "xla"):
        raise ValueError(f"JAXCD_LM_KERNEL={mode!r}: expected 'auto', 'ffi' or 'xla'")
    return mode


def lm_kernel_available() -> bool:
    """Whether the layer matmul may use the kernel here: the mode allows it, the default
    backend is the CPU, and the kernel is built and registered (on first call; a failure
    is warned about once under ``auto`` and raised under ``ffi``)."""
    mode = lm_kernel_mode()
    if mode == "xla":
        return False
    if jax.default_backend() != "cpu":
        if mode == "ffi":
            raise KernelUnavailable(f"JAXCD_LM_KERNEL=ffi: the kernel is CPU-only "
                                    f"(backend {jax.default_backend()!r})")
        return False
    return (_KERNEL.available(required=mode == "ffi")
            and _ROWS.available(required=mode == "ffi", warn=False))


def build_error() -> str | None:
    """Why the kernel is unavailable (``None`` when it is loaded or not asked for)."""
    lm_kernel_available()
    return _KERNEL.error


def _call(x2: jax.Array, layer: jax.Array, *ws: jax.Array) -> tuple[jax.Array, ...]:
    outs = tuple(jax.ShapeDtypeStruct((x2.shape[0], w.shape[2]), jnp.float32) for w in ws)
    return tuple(jax.ffi.ffi_call(TARGET, outs)(x2, layer, *ws))


@jax.custom_batching.custom_vmap
def _matmul(x2, layer, ws):
    return _call(x2, layer, *ws)


@_matmul.def_vmap
def _matmul_vmap(axis_size, in_batched, x2, layer, ws):
    xb, lb, wbs = in_batched
    if not lb and not any(wbs):   # only the rows are batched: fold them into M
        ys = _call(x2.reshape(-1, x2.shape[-1]), layer, *ws)
        return (tuple(y.reshape(axis_size, x2.shape[1], y.shape[-1]) for y in ys),
                (True,) * len(ws))
    bc = lambda a, b: a if b else jnp.broadcast_to(a, (axis_size,) + a.shape)  # noqa: E731
    ys = jax.lax.map(lambda a: _call(a[0], a[1], *a[2]),
                     (bc(x2, xb), bc(layer, lb), tuple(bc(w, b) for w, b in zip(ws, wbs))))
    return ys, (True,) * len(ws)


def _rows_of(x) -> int:
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    return rows


def layer_matmuls(x: jax.Array, ws, layer, precision=jax.lax.Precision.HIGHEST,
                  use_kernel: bool | None = None) -> list[jax.Array]:
    """``[x · w[layer] for w in ws]`` for stacked weights ``w [L, K, N_w]`` (float32 or
    bfloat16) sharing ``x [..., K]`` and an int ``layer`` (traced or not; clamped to
    ``[0, L)`` like a dynamic slice), in ONE kernel call (q/k/v, gate/up). Float32
    ``[..., N_w]`` each, accumulated in float32. Uses the kernel when
    :func:`lm_kernel_available` (or ``use_kernel``) and the rows number at most
    :data:`MAX_ROWS`, else XLA's dot on each ``w[layer]`` at ``precision``."""
    ws = list(ws)
    for w in ws:
        if w.ndim != 3 or x.shape[-1] != w.shape[1]:
            raise ValueError(f"layer_matmul: x {x.shape} and w {w.shape}: expected x [..., K] "
                             f"and w [L, K, N]")
    layer = jnp.asarray(layer, jnp.int32)
    lead, rows = x.shape[:-1], _rows_of(x)
    if use_kernel is None:
        use_kernel = lm_kernel_available()
    if use_kernel and rows <= MAX_ROWS and all(w.dtype in (jnp.float32, jnp.bfloat16)
                                               for w in ws):
        x2 = x.reshape(rows, x.shape[-1]).astype(jnp.float32)
        return [y.reshape(*lead, y.shape[-1]) for y in _matmul(x2, layer, tuple(ws))]
    return [jnp.dot(x, jax.lax.dynamic_index_in_dim(w, layer, 0, keepdims=False),
                    precision=precision, preferred_element_type=jnp.float32) for w in ws]


def layer_matmul(x: jax.Array, w: jax.Array, layer, precision=jax.lax.Precision.HIGHEST,
                 use_kernel: bool | None = None) -> jax.Array:
    """``x [..., K] · w[layer]`` for one stacked weight ``w [L, K, N]``: see
    :func:`layer_matmuls`."""
    return layer_matmuls(x, [w], layer, precision, use_kernel)[0]


def _rows_call(x2: jax.Array, e: jax.Array) -> jax.Array:
    return jax.ffi.ffi_call(ROWS_TARGET, jax.ShapeDtypeStruct((x2.shape[0], e.shape[0]),
                                                              jnp.float32))(x2, e)


@jax.custom_batching.custom_vmap
def _rows(x2, e):
    return _rows_call(x2, e)


@_rows.def_vmap
def _rows_vmap(axis_size, in_batched, x2, e):
    xb, eb = in_batched
    if not eb:
        y = _rows_call(x2.reshape(-1, x2.shape[-1]), e)
        return y.reshape(axis_size, x2.shape[1], e.shape[0]), True
    x2 = x2 if xb else jnp.broadcast_to(x2, (axis_size,) + x2.shape)
    return jax.lax.map(lambda a: _rows_call(*a), (x2, e)), True


def rows_matmul(x: jax.Array, e: jax.Array, precision=jax.lax.Precision.HIGHEST,
                use_kernel: bool | None = None) -> jax.Array:
    """``x [..., K] · e^T`` for ``e [N, K]`` (float32 or bfloat16): the tied output
    projection (``e`` the token embedding). Float32 ``[..., N]``; the kernel under the
    same conditions as :func:`layer_matmul`, else XLA's dot."""
    if e.ndim != 2 or x.shape[-1] != e.shape[1]:
        raise ValueError(f"rows_matmul: x {x.shape} and e {e.shape}: expected x [..., K] "
                         f"and e [N, K]")
    lead, rows = x.shape[:-1], _rows_of(x)
    if use_kernel is None:
        use_kernel = lm_kernel_available()
    if use_kernel and rows <= MAX_ROWS and e.dtype in (jnp.float32, jnp.bfloat16):
        x2 = x.reshape(rows, x.shape[-1]).astype(jnp.float32)
        return _rows(x2, e).reshape(*lead, e.shape[0])
    return jnp.einsum("...h,vh->...v", x.astype(e.dtype), e, precision=precision,
                      preferred_element_type=jnp.float32)
