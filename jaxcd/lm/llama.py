"""A Llama-family decoder (Llama / SmolLM / Mistral-style, Qwen2 with Q/K/V biases) in
Flax NNX, with a preallocated KV cache, behind :class:`jaxcd.lm.interface.LanguageModel`.

The model
---------
For tokens ``x_1..x_T`` with hidden width ``H``, ``L`` blocks, ``n_h`` query heads,
``n_kv`` key/value heads (group size ``G = n_h / n_kv``) and head width ``D``::

    h_0 = E[x]                                         E: [V, H] token embedding
    a   = h + Attn(RMSNorm(h))                         per block
    h'  = a + W_down (silu(W_gate n) * (W_up n)),  n = RMSNorm(a)
    logits = RMSNorm(h_L) W_out,  W_out = E^T when the embedding is tied

    RMSNorm(h) = w * h / sqrt(mean(h^2) + eps)          (in float32)

Attention (grouped-query): ``q = h W_q (+b_q)`` ``[T, n_h, D]``, ``k, v`` ``[T, n_kv, D]``;
query head ``j`` reads key/value head ``j // G``. Rotary embeddings ("rotate-half"
form, as in transformers) at integer position ``p``::

    θ_i = inv_freq_i = rope_theta^(-2i/D),  i < D/2
    rope(u, p) = u * cos(p θ) + rotate_half(u) * sin(p θ),
    rotate_half([u1, u2]) = [-u2, u1],   cos/sin repeated to length D

    Attn = softmax(q k^T / sqrt(D) + mask) v, then W_o.

Variants (fields of :class:`LlamaConfig`, set from Hugging Face configs by
:mod:`jaxcd.lm.hf_checkpoint` and from GGUF metadata by :mod:`jaxcd.lm.gguf_weights`):
``qk_norm`` (Qwen3 / Gemma 3: RMSNorm of each q/k head before RoPE), ``o_bias``,
``post_norms`` (Gemma: ``a = h + N_post(Attn(N(h)))``, ``h' = a + N'_post(MLP(N'(a)))``),
``norm_offset`` (Gemma: ``RMSNorm(h) = (1 + w) * ĥ`` in float32), ``mlp_activation``
(``gelu_tanh``: GeGLU), ``embed_scale`` (Gemma: ``√H``), ``query_scale`` (replaces
``1/sqrt(D)``), ``attn_softcap`` / ``final_softcap`` (``c tanh(s / c)`` on scores /
logits), RoPE scaling (``rope_scaling``: ``linear``, ``llama3``, ``yarn``; YaRN scales
cos/sin by its attention factor), and sliding windows: layer ``l`` with
``sliding_layers[l]`` lets a query at position ``i`` attend keys ``i - W < j <= i``
(``W = sliding_window``) and may use its own RoPE base (``rope_local_theta``, Gemma 3).
Inside the layer ``scan`` each layer picks its mask and its cos/sin table by index
(``_pick``); the cache layout does not change (windowed layers keep every slot).

Positions and padding
---------------------
Prompts are LEFT-padded to ``[B, P]``. Row ``b`` has ``offset_b = P - len_b`` padding
slots; a token at slot ``s`` has position ``s - offset_b`` (so the first real token has
position 0, whatever the padding). A query at slot ``i`` may attend key slot ``j`` iff
``offset_b <= j <= i`` (pad queries attend only themselves, which keeps everything
finite; their outputs are never used).

The cache
---------
``max_len`` (static) slots per row. The state is a dict whose leaves all have the batch
axis first (so particle systems can reorder rows with ``x[ancestors]``); the caches of
the ``L`` layers are stacked in one array each, layer axis second::

    k:      [B, L, n_kv, D, S]   keys (transposed: S = cache slots), cache dtype
    v:      [B, L, n_kv, S, D]   values
    slot:   int32 [B]  next slot to write (equal across rows; = P after prefill)
    offset: int32 [B]  padding slots of each row

(layer ``l``'s keys are ``k[:, l]``). The cache dtype is the LM's ``dtype``.

Prefill writes slots ``[0, P)``; each :meth:`JaxLM.step` writes slot ``slot`` of every
layer with one ``lax.dynamic_update_slice`` after the layer loop (in place under jit
when the state is a loop carry or is donated; inside the loop layer ``l`` reads its old
cache ``k[:, l]`` with this step's key substituted at ``slot`` by a ``where``: writing
the cache inside the loop would make XLA copy the whole cache per layer) and attends
over the whole cache under the mask above (costs ``O(max_len)``
per token, negligible for the short contexts of constrained decoding; caches longer than
``attn_block`` slots are instead visited block by block up to the current slot only, see
:func:`attend_decode_blocked`). Keys are stored transposed so that both attention
products are plain batched matrix products (no per-step transposes; about 2x faster
attention on CPU than the ``[S, D]`` layout). ``S = max_len`` (rounded up to a multiple
of ``attn_block`` when larger than it). On CPU, with the native kernels (below), a
decode step attends through :func:`jaxcd.lm.kernels.decode_attention` instead: it reads
layer ``l``'s slots ``offset_b .. slot`` of each row where they lie (skipping the left
padding), with this step's key/value standing in for slot ``slot`` as above, and gives
the same result up to float rounding. A write past the last slot is clamped by XLA
(it overwrites the last slot), so ``max_len`` must cover prompt + new tokens.

Depth
-----
The ``L`` blocks are one :class:`Block` whose parameters are stored stacked, with a
leading layer axis (``params["layers"]["attn"]["q_proj"]["kernel"]`` is
``[L, H, n_h D]``), and prefill, decode step and :meth:`JaxLM.logprobs_all` run them
as one ``lax.scan`` over that axis. XLA compiles a single block whatever the depth, so
compile time does not grow with ``L`` (``experiments/bench_lm_compile.py``).

XLA:CPU's dot cannot read its weight at a dynamic offset of the stacked array, so a
plain scan over the stacked weights first copies each layer's slice, and XLA's dot
fusions at decode shapes (a few rows) run well below this CPU's limits. On CPU the
projections therefore go through native kernels (:mod:`jaxcd.lm.kernels`, XLA FFI):
:meth:`LlamaModel.run_layers` in its ``in_place`` mode closes over the stacked kernels
and each :class:`Dense` multiplies by layer ``l`` where it lies
(:func:`~jaxcd.lm.kernels.layer_matmul`); the tied output projection reads the
embedding row by row (:func:`~jaxcd.lm.kernels.rows_matmul`). ``JaxLM(matmul=...)``:
``"auto"`` (default: the kernels on the CPU backend when they build), ``"kernel"``,
``"xla"`` (the copying scan: GPU/TPU, and weights sharded over a mesh). Calls with more
than :data:`~jaxcd.lm.kernels.MAX_ROWS` rows (long prefills) use XLA's dot on the
layer's slice. ``experiments/bench_lm.py`` times both forms side by side
(``jax-step`` and ``jax-step (xla dots)``).

Called eagerly (outside a caller's jit), :meth:`JaxLM.step` cannot update the cache in
place and copies it; host loops should use :func:`step_donated`, which donates the
state. Inside a jitted decoder loop the cache is updated in place either way.

Precision: float32 by default (matmuls at ``Precision.HIGHEST``, so GPUs do not
silently use TF32); ``dtype=jnp.bfloat16`` stores weights and activations in bfloat16
while RMSNorm, softmax and log-probabilities stay float32.
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np
import jax
import jax.numpy as jnp
from flax import nnx

from .gguf_weights import LlamaConfig, read_gguf_config

PyTree = Any

#: How many times each jitted entry point has been traced (tests check for recompiles).
TRACE_COUNTS: collections.Counter = collections.Counter()

_NEG = -1e30  # finite "minus infinity" for masked attention scores


# ----------------------------------------------------------------------------- modules
class RMSNorm(nnx.Module):
    """``y = w * x / sqrt(mean(x^2, -1) + eps)``, computed in float32, returned in
    ``x.dtype``. ``x``: ``[..., H]``."""

    def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32, offset: float = 0.0):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = float(eps)
        self.offset = float(offset)

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        if self.offset:   # Gemma: y * (1 + w) in float32, then cast
            return (y * (self.offset + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return y.astype(x.dtype) * self.weight[...].astype(x.dtype)


def _rotate_half(u: jax.Array) -> jax.Array:
    half = u.shape[-1] // 2
    return jnp.concatenate([-u[..., half:], u[..., :half]], axis=-1)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """``positions`` int ``[B, T]`` -> ``(cos, sin)`` float32 ``[B, T, D]`` with angles
    ``positions * inv_freq`` repeated twice along the last axis."""
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(u: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``u`` ``[B, T, heads, D]``, ``cos/sin`` ``[B, T, D]`` -> rotated ``u`` (same dtype)."""
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    uf = u.astype(jnp.float32)
    return (uf * c + _rotate_half(uf) * s).astype(u.dtype)


def _qk_small(qg: jax.Array, k: jax.Array) -> jax.Array:
    """Decode-step scores ``s[b,k,g,j] = sum_d qg[b,k,g,d] k[b,k,d,j]`` (float32) as a
    broadcast multiply + reduction instead of a ``dot_general``.

    With one query token the attention "matmuls" are ``B * n_kv`` tiny products
    (``G x D`` times ``D x S``, G = 3 for SmolLM2); XLA:CPU runs such batched dots through
    its generic dot path at a cost out of all proportion to their size (at batch 16 the
    two attention dots took ~20% of a decode step), while the same arithmetic as a
    fused elementwise reduction is a single cheap loop. ``qg`` ``[B, n_kv, G, D]``, ``k``
    ``[B, n_kv, D, S]``."""
    return jnp.sum(qg.astype(jnp.float32)[..., None] * k.astype(jnp.float32)[:, :, None],
                   axis=-2)


def _pv_small(p: jax.Array, v: jax.Array) -> jax.Array:
    """``o[b,k,g,d] = sum_j p[b,k,g,j] v[b,k,j,d]`` (float32) for a decode step, the
    second product of :func:`_qk_small`. ``p`` ``[B, n_kv, G, S]``, ``v``
    ``[B, n_kv, S, D]``."""
    return jnp.sum(p.astype(jnp.float32)[..., None] * v.astype(jnp.float32)[:, :, None],
                   axis=-2)


def mask_bias(mask: jax.Array) -> jax.Array:
    """A bool attention mask as a float32 additive bias: 0 where True, ``-1e30`` where
    False. :func:`attend` gives the same result with either (a masked score ``s +
    (-1e30)`` rounds to ``-1e30`` exactly, as ``|s| << 1e30``). The layer loops take the
    bias: XLA:CPU hoists the loop-invariant mask out of the loop into a kernel of its
    own, and LLVM takes seconds to compile such a kernel when its output is ``bool``
    (about 3 s for a ``[4, 32, 32]`` causal mask) but not when it is float32."""
    return jnp.where(mask, 0.0, _NEG).astype(jnp.float32)


def _softcap(scores: jax.Array, cap: float | None) -> jax.Array:
    """``cap * tanh(scores / cap)`` (Gemma's logit soft-capping); identity for ``None``."""
    return scores if not cap else jnp.tanh(scores / cap) * cap


def _apply_mask(scores: jax.Array, mask: jax.Array) -> jax.Array:
    if mask.dtype == jnp.bool_:
        return jnp.where(mask, scores, _NEG)
    return scores + mask.astype(scores.dtype)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, precision,
           scale: float | None = None, softcap: float | None = None) -> jax.Array:
    """Grouped-query attention.

    Args:
      q: ``[B, T, n_h, D]``; k: ``[B, n_kv, D, S]`` (transposed, the cache layout);
        v: ``[B, n_kv, S, D]``; mask: bool ``[B, T, S]`` (True = may attend), or the
        equivalent float32 additive bias (0 = may attend, ``-1e30`` = masked; see
        :func:`mask_bias`).
    Returns:
      ``[B, T, n_h * D]``: ``softmax(q k^T * scale masked) v`` per head (``scale``
      defaults to ``1/sqrt(D)``; with ``softcap`` the scaled scores pass through
      ``softcap * tanh(s / softcap)`` first), head ``j`` using key/value head ``j // G``.
      Scores and softmax in float32.
    """
    B, T, nh, D = q.shape
    nkv = k.shape[1]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    if T == 1:        # decode step: elementwise products (see _qk_small)
        qg = q.reshape(B, nkv, nh // nkv, D)
        scores = _softcap(_qk_small(qg, k) * scale, softcap)           # [B, k, g, S]
        scores = _apply_mask(scores, mask[:, :, None, :])              # mask [B, 1, S]
        probs = jax.nn.softmax(scores, axis=-1)
        return _pv_small(probs, v).astype(v.dtype).reshape(B, 1, nh * D)
    qg = q.reshape(B, T, nkv, nh // nkv, D)
    scores = jnp.einsum("btkgd,bkds->bkgts", qg, k, precision=precision,
                        preferred_element_type=jnp.float32) * scale
    scores = _apply_mask(_softcap(scores, softcap), mask[:, None, None, :, :])
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v, precision=precision)
    return out.reshape(B, T, nh * D)


def _with_new_slot(c: jax.Array, new: jax.Array, j: jax.Array, slot, axis: int) -> jax.Array:
    """``c`` with slot ``slot`` replaced by ``new`` (size 1 on the slot axis ``axis``);
    ``j`` holds the slot index of each position of ``c`` along ``axis``. A ``where``
    instead of a ``dynamic_update_slice``, so that XLA fuses it into the reader."""
    shape = [1] * c.ndim
    shape[axis] = j.shape[0]
    return jnp.where((j == slot).reshape(shape), new.astype(c.dtype), c)


def attend_decode_blocked(q: jax.Array, k: jax.Array, v: jax.Array, offset: jax.Array,
                          slot: jax.Array, block: int, precision, layer=None,
                          new_kv: tuple[jax.Array, jax.Array] | None = None,
                          scale: float | None = None, softcap: float | None = None) -> jax.Array:
    """Single-token attention over only the filled part of a long cache.

    Same result as :func:`attend` with ``mask[b, 0, j] = offset_b <= j <= slot``, but
    visits the cache in blocks of ``block`` slots and stops after the block holding
    ``slot`` (a ``fori_loop`` with a dynamic trip count, fixed shapes), combining blocks
    with the online-softmax recurrence::

        m' = max(m, max_j s_j),  l' = l e^{m - m'} + sum_j e^{s_j - m'},
        acc' = acc e^{m - m'} + sum_j e^{s_j - m'} v_j,   out = acc / l

    so a step costs O(slot) instead of O(S). Args: ``q`` ``[B, 1, n_h, D]``; ``k``
    ``[B, n_kv, D, S]``, ``v`` ``[B, n_kv, S, D]`` with ``S % block == 0``; ``offset``
    ``[B]``; ``slot`` scalar. With ``layer`` (int32 scalar) given, ``k`` / ``v`` are the
    stacked caches of all layers, ``[B, L, n_kv, D, S]`` / ``[B, L, n_kv, S, D]``, and
    layer ``layer``'s blocks are read from them. With ``new_kv = (k_new [B, n_kv, D, 1],
    v_new [B, n_kv, 1, D])``, slot ``slot`` of the cache is read as ``k_new`` / ``v_new``
    (the cache itself need not hold them yet). ``offset`` is the first slot each row
    may attend (a sliding window passes ``max(offset, slot - window + 1)``); ``scale`` /
    ``softcap`` as in :func:`attend`.
    Returns ``[B, 1, n_h * D]``.
    """
    B, T, nh, D = q.shape
    nkv = k.shape[1] if layer is None else k.shape[2]
    G = nh // nkv
    qg = q.reshape(B, nkv, G, D)
    scale = 1.0 / np.sqrt(D) if scale is None else scale

    def blocks(start):
        if layer is None:
            return (jax.lax.dynamic_slice_in_dim(k, start, block, axis=3),
                    jax.lax.dynamic_slice_in_dim(v, start, block, axis=2))
        z = jnp.zeros((), jnp.int32)
        kb = jax.lax.dynamic_slice(k, (z, layer, z, z, start), (B, 1, nkv, D, block))
        vb = jax.lax.dynamic_slice(v, (z, layer, z, start, z), (B, 1, nkv, block, D))
        return kb[:, 0], vb[:, 0]

    def body(i, carry):
        m, l, acc = carry
        start = i * block
        kb, vb = blocks(start)
        j = start + jnp.arange(block, dtype=jnp.int32)
        if new_kv is not None:
            kb = _with_new_slot(kb, new_kv[0], j, slot, 3)
            vb = _with_new_slot(vb, new_kv[1], j, slot, 2)
        s = _softcap(_qk_small(qg, kb) * scale, softcap)
        valid = ((j[None, :] >= offset[:, None]) & (j[None, :] <= slot))[:, None, None, :]
        s = jnp.where(valid, s, _NEG)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(valid, jnp.exp(s - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        l = l * corr + p.sum(-1)
        acc = acc * corr[..., None] + _pv_small(p.astype(vb.dtype), vb)
        return m_new, l, acc

    init = (jnp.full((B, nkv, G), _NEG, jnp.float32), jnp.zeros((B, nkv, G), jnp.float32),
            jnp.zeros((B, nkv, G, D), jnp.float32))
    _, l, acc = jax.lax.fori_loop(0, slot // block + 1, body, init)
    return (acc / l[..., None]).astype(q.dtype).reshape(B, 1, nh * D)


class Dense(nnx.Linear):
    """``nnx.Linear`` that also runs on a weight stacked over layers.

    Outside the layer scan (or in the copying scan) its kernel is ``[K, N]`` and it is
    ``nnx.Linear``. In :meth:`LlamaModel.run_layers`'s in-place mode its kernel is the
    whole stacked ``[L, K, N]`` array and ``self.layer`` (set by ``run_layers``) the
    traced layer index: the product goes through :func:`jaxcd.lm.kernels.layer_matmul`,
    which reads layer ``l`` where it lies (the bias is scanned over like the norms, so
    it is layer ``l``'s ``[N]``)."""

    layer = None

    def __call__(self, x, out_sharding=None):
        if self.kernel[...].ndim != 3:
            return super().__call__(x, out_sharding)
        return Dense.many([self], x)[0]

    @staticmethod
    def many(projs: Sequence["Dense"], x: jax.Array) -> list[jax.Array]:
        """``[p(x) for p in projs]``; in the in-place mode as one kernel call for all of
        them (q/k/v, gate/up: they share ``x`` and the layer)."""
        if projs[0].kernel[...].ndim != 3:
            return [p(x) for p in projs]
        from .kernels import layer_matmuls

        p0 = projs[0]
        ys = layer_matmuls(x, [p.kernel[...] for p in projs], p0.layer, precision=p0.precision,
                           use_kernel=True)     # the in-place mode: the LM chose the kernel
        out = []
        for p, y in zip(projs, ys):
            if p.bias is not None:       # already layer l's (run_layers scans the biases)
                y = y + p.bias[...].astype(jnp.float32)
            out.append(y.astype(p.dtype or x.dtype))
        return out


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary embeddings (see module docstring)."""

    def __init__(self, cfg: LlamaConfig, *, dtype, precision, rngs: nnx.Rngs):
        H, D = cfg.hidden_size, cfg.head_dim
        kw = dict(dtype=dtype, param_dtype=dtype, precision=precision, rngs=rngs)
        self.q_proj = Dense(H, cfg.num_heads * D, use_bias=cfg.attention_bias, **kw)
        self.k_proj = Dense(H, cfg.num_kv_heads * D, use_bias=cfg.attention_bias, **kw)
        self.v_proj = Dense(H, cfg.num_kv_heads * D, use_bias=cfg.attention_bias, **kw)
        self.o_proj = Dense(cfg.num_heads * D, H, use_bias=cfg.o_bias, **kw)
        if cfg.qk_norm:      # Qwen3 / Gemma 3: RMSNorm over each head's D features
            self.q_norm = RMSNorm(D, cfg.rms_eps, param_dtype=dtype, offset=cfg.norm_offset)
            self.k_norm = RMSNorm(D, cfg.rms_eps, param_dtype=dtype, offset=cfg.norm_offset)
        self.qk_norm = cfg.qk_norm
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, D
        self.precision = precision
        self.scale = cfg.query_scale
        self.softcap = cfg.attn_softcap

    def qkv(self, x, cos, sin):
        """``x`` ``[B, T, H]`` -> rotated ``q`` ``[B, T, n_h, D]``; ``k`` ``[B, n_kv, D, T]``
        and ``v`` ``[B, n_kv, T, D]`` (the cache layouts)."""
        B, T, _ = x.shape
        q, k, v = Dense.many([self.q_proj, self.k_proj, self.v_proj], x)
        q = q.reshape(B, T, self.num_heads, self.head_dim)
        k = k.reshape(B, T, self.num_kv_heads, self.head_dim)
        v = v.reshape(B, T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        k = apply_rope(k, cos, sin)
        return apply_rope(q, cos, sin), k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, ``[.., H] -> [.., H]`` via width ``F``."""

    def __init__(self, cfg: LlamaConfig, *, dtype, precision, rngs: nnx.Rngs):
        H, F = cfg.hidden_size, cfg.intermediate_size
        kw = dict(use_bias=False, dtype=dtype, param_dtype=dtype, precision=precision, rngs=rngs)
        self.gate_proj = Dense(H, F, **kw)
        self.up_proj = Dense(H, F, **kw)
        self.down_proj = Dense(F, H, **kw)
        self.activation = cfg.mlp_activation

    def __call__(self, x):
        g, u = Dense.many([self.gate_proj, self.up_proj], x)
        g = jax.nn.gelu(g, approximate=True) if self.activation == "gelu_tanh" else jax.nn.silu(g)
        return self.down_proj(g * u)


class Block(nnx.Module):
    """Pre-norm transformer block. :meth:`__call__` returns the new hidden states and
    the (possibly updated) key/value tensors that the caller keeps as cache."""

    def __init__(self, cfg: LlamaConfig, *, dtype, precision, rngs: nnx.Rngs):
        norm = dict(param_dtype=dtype, offset=cfg.norm_offset)
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **norm)
        self.attn = Attention(cfg, dtype=dtype, precision=precision, rngs=rngs)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **norm)
        self.mlp = MLP(cfg, dtype=dtype, precision=precision, rngs=rngs)
        if cfg.post_norms:   # Gemma: norms on the attention and MLP outputs too
            self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **norm)
            self.post_mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **norm)
        self.post_norms = cfg.post_norms

    def _decode_kernel(self, kc, vc) -> bool:
        """Whether a decode step may attend through the native kernel
        (:func:`jaxcd.lm.kernels.decode_attention`): in the in-place mode of
        :meth:`LlamaModel.run_layers` (the CPU kernels, not a mesh), with a float32 or
        bfloat16 cache (the LM decides whether it is available:
        :meth:`JaxLM.attention_kernel`)."""
        return (self.attn.q_proj.kernel[...].ndim == 3 and kc.dtype == vc.dtype
                and kc.dtype in (jnp.float32, jnp.bfloat16))

    def __call__(self, x, cos, sin, mask, cache=None, layer=None, slot=None, offset=None,
                 block=None, past=None, attn_kernel: bool = False):
        """Two modes.

        * ``cache is None`` (prefill / full recompute): ``x`` ``[B, T, H]``; attends over
          its own ``T`` keys with ``mask`` ``[B, T, T]``; returns ``(x', k, v)`` with
          ``k`` ``[B, n_kv, D, T]``, ``v`` ``[B, n_kv, T, D]``.
        * ``cache = (k_cache [B, L, n_kv, D, S], v_cache [B, L, n_kv, S, D])`` (decode of
          ONE token, ``T == 1``; the stacked caches of all layers, as before this step;
          this block is layer ``layer``, an int32 scalar): attends over layer
          ``layer``'s ``S`` slots, slot ``slot`` (scalar int32) holding this step's key
          and value, with ``mask`` ``[B, 1, S]``; returns ``(x', k [B, n_kv, D, 1],
          v [B, n_kv, 1, D])``, which the caller writes at ``slot`` once all layers ran
          (the cache is only read here: writing it inside the layer loop would make XLA
          copy the whole cache per layer). With ``block`` set, uses
          :func:`attend_decode_blocked` with ``offset`` ``[B]`` (the first slot each
          row may attend) instead of ``mask``. In the in-place (CPU kernel) mode, with
          ``offset`` given, both use the native kernel instead
          (:func:`jaxcd.lm.kernels.decode_attention`: slots ``offset_b .. slot`` read in
          place; ``mask`` must then be the mask those bounds define) when ``attn_kernel``.

        ``past = (k_past [B, n_kv, D, P0], v_past [B, n_kv, P0, D])`` (prefill mode only):
        keys and values of earlier tokens that ``x``'s tokens also attend to, before their
        own (``mask`` is then ``[B, T, P0 + T]``); the returned ``k`` / ``v`` are ``x``'s
        own.
        """
        a = self.attn
        akw = dict(scale=a.scale, softcap=a.softcap)
        q, k, v = self.attn.qkv(self.attn_norm(x), cos, sin)
        if cache is not None:
            kc, vc = cache
            if x.shape[1] != 1:
                raise ValueError("Block: decoding with a cache takes one token per row")
            k, v = k.astype(kc.dtype), v.astype(vc.dtype)
            if attn_kernel and offset is not None and self._decode_kernel(kc, vc):
                from .kernels import decode_attention

                B, _, nh, D = q.shape
                h = decode_attention(q[:, 0], kc, vc, k, v, offset, slot, layer,
                                     scale=1.0 / np.sqrt(D) if a.scale is None else a.scale,
                                     softcap=a.softcap)
                h = h.astype(q.dtype).reshape(B, 1, nh * D)
            elif block is not None:
                h = attend_decode_blocked(q, kc, vc, offset, slot, block, self.attn.precision,
                                          layer=layer, new_kv=(k, v), **akw)
            else:
                j = jnp.arange(kc.shape[-1], dtype=jnp.int32)
                kl = _with_new_slot(jax.lax.dynamic_index_in_dim(kc, layer, 1, keepdims=False),
                                    k, j, slot, 3)
                vl = _with_new_slot(jax.lax.dynamic_index_in_dim(vc, layer, 1, keepdims=False),
                                    v, j, slot, 2)
                h = attend(q, kl, vl, mask, self.attn.precision, **akw)
        elif past is not None:
            kp, vp = past
            h = attend(q, jnp.concatenate([kp.astype(k.dtype), k], axis=-1),
                       jnp.concatenate([vp.astype(v.dtype), v], axis=-2), mask,
                       self.attn.precision, **akw)
        else:
            h = attend(q, k, v, mask, self.attn.precision, **akw)
        h = self.attn.o_proj(h)
        if self.post_norms:
            h = self.post_attn_norm(h)
        x = x + h
        h = self.mlp(self.mlp_norm(x))
        if self.post_norms:
            h = self.post_mlp_norm(h)
        return x + h, k, v


def _is_dense_kernel(path, value) -> bool:
    """nnx filter: the ``kernel`` parameters of the :class:`Dense` projections."""
    return bool(path) and path[-1] == "kernel" and len(path) >= 2 and path[-2] in (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LlamaModel(nnx.Module):
    """Embedding, ``L`` :class:`Block` s, final RMSNorm and output projection.

    ``layers`` is ONE :class:`Block` whose parameters carry a leading layer axis ``[L,
    ...]`` (built with ``nnx.vmap``, each layer with its own random init);
    :meth:`run_layers` runs the ``L`` blocks as one ``lax.scan`` over that axis, so XLA
    compiles one block whatever the depth."""

    def __init__(self, cfg: LlamaConfig, *, dtype=jnp.float32, precision=None,
                 rngs: nnx.Rngs):
        self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, param_dtype=dtype,
                               rngs=rngs)

        @nnx.split_rngs(splits=cfg.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=cfg.num_layers)
        def make_layers(rngs):
            return Block(cfg, dtype=dtype, precision=precision, rngs=rngs)

        self.layers = make_layers(rngs)
        self.num_layers = cfg.num_layers
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, param_dtype=dtype,
                            offset=cfg.norm_offset)
        self.embed_scale = cfg.embed_scale
        self.final_softcap = cfg.final_softcap
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Linear(cfg.hidden_size, cfg.vocab_size, use_bias=False,
                                      dtype=dtype, param_dtype=dtype, precision=precision,
                                      rngs=rngs)
        self.tie_embeddings = cfg.tie_embeddings
        self.precision = precision

    def run_layers(self, fn, carry, in_place: bool = False):
        """``carry, y_l = fn(block, l, carry)`` for ``l = 0 .. L-1`` as one ``lax.scan``
        over the stacked layer parameters (``block`` is layer ``l``'s :class:`Block`,
        ``l`` an int32 scalar). Returns ``(carry, ys)``, the ``y_l`` stacked
        (``[L, ...]``).

        ``in_place``: the projection kernels are not scanned over (which copies each
        layer's slice) but closed over whole, and each :class:`Dense` reads layer ``l``
        through :func:`jaxcd.lm.kernels.layer_matmul`; norms and biases are still
        sliced (they are small)."""
        ls = jnp.arange(self.num_layers, dtype=jnp.int32)
        if not in_place:
            graphdef, stacked = nnx.split(self.layers)

            def body(c, xs):
                st, l = xs
                return fn(nnx.merge(graphdef, st), l, c)

            return jax.lax.scan(body, carry, (stacked, ls))
        graphdef, kernels, rest = nnx.split(self.layers, _is_dense_kernel, ...)

        def body_in_place(c, xs):
            st, l = xs
            block = nnx.merge(graphdef, kernels, st)
            for _, m in nnx.iter_modules(block):
                if isinstance(m, Dense):
                    m.layer = l
            return fn(block, l, c)

        return jax.lax.scan(body_in_place, carry, (rest, ls))

    def embed_tokens(self, ids: jax.Array) -> jax.Array:
        """Token embedding, times ``embed_scale`` (Gemma: ``sqrt(H)`` rounded to the
        weight dtype, as transformers does) when set."""
        x = self.embed(ids)
        if self.embed_scale is not None:
            x = x * jnp.asarray(self.embed_scale, x.dtype)
        return x

    def logits(self, h: jax.Array, in_place: bool = False) -> jax.Array:
        """Final norm and output projection: ``h`` ``[..., H]`` -> float32 ``[..., V]``.
        ``in_place``: through the native kernels (:mod:`jaxcd.lm.kernels`; the tied
        embedding read row by row, an untied head as a one-layer stack)."""
        n = self.norm(h)
        if in_place:
            from .kernels import layer_matmul, rows_matmul

            if self.tie_embeddings:
                out = rows_matmul(n, self.embed.embedding[...], precision=self.precision,
                                  use_kernel=True)
            else:
                out = layer_matmul(n, self.lm_head.kernel[...][None], 0,
                                   precision=self.precision, use_kernel=True)
        elif self.tie_embeddings:
            emb = self.embed.embedding[...]
            out = jnp.einsum("...h,vh->...v", n.astype(emb.dtype), emb,
                             precision=self.precision, preferred_element_type=jnp.float32)
        else:
            out = self.lm_head(n)
        return _softcap(out.astype(jnp.float32), self.final_softcap)


# ----------------------------------------------------------------------------- JaxLM
def _np_dtype(dtype):
    """The numpy dtype for a JAX float dtype (``ml_dtypes.bfloat16`` for bfloat16)."""
    return np.dtype(jnp.dtype(dtype))


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


class JaxLM:
    """A Llama-family LM implementing :class:`jaxcd.lm.interface.LanguageModel`.

    Args:
      config: the hyper-parameters (:class:`LlamaConfig`).
      dtype: compute/storage dtype of weights, activations and cache (float32 default;
        bfloat16 halves memory traffic; norms, softmax and log-probs stay float32).
      precision: matmul precision (``"highest"`` default: true float32 on GPU/TPU too).
      attn_block: when the cache holds more than this many slots, a decode step attends
        block by block over the filled slots only (:func:`attend_decode_blocked`);
        ``None`` = always attend over the whole cache.
      matmul: the layer projections: ``"auto"`` (the native kernels of
        :mod:`jaxcd.lm.kernels` on the CPU platform when they build, else XLA's dot),
        ``"kernel"`` (the kernels, or an error saying why not) or ``"xla"``.
      attention: a decode step's attention, under the same three choices (the kernel
        needs the in-place layer scan, so ``matmul="xla"`` means XLA's attention too).
      platform: the platform the LM's programs run on (``"cpu"``, ``"gpu"``, ``"tpu"``);
        ``None`` = ``jax.default_backend()`` when the LM is built. The kernels are
        CPU-only.

    Every choice above is decided from these fields, never from the environment or the
    backend at trace time, and the fields are the LM's jit key.

    Hashable and comparable by ``(config, dtype, precision, attn_block, matmul,
    attention, platform)`` only: it is a static jit
    argument, and it holds the architecture and these choices only: the weights travel
    separately as the traced ``params`` (the ``nnx.State`` of a :class:`LlamaModel`;
    :func:`jaxcd.lm.loading.load_lm` returns both), so the compiled programs that jit
    caches keep (with a reference to their static LM) never keep weights alive.

    ``prefill`` / ``step`` are jitted (and traceable, so they can be called inside a
    decoder's own ``jit``/``scan``). Use :meth:`generate_greedy` for host-side tests.

    Parameters: ``params["layers"]`` holds the ``L`` blocks stacked (every leaf has a
    leading ``[L]`` axis: ``params["layers"]["attn"]["q_proj"]["kernel"]`` is
    ``[L, H, n_h D]``); :meth:`params_from_pure_dict` also takes the per-layer layout of
    :func:`load_gguf` (``layers[l]`` = block ``l``) and stacks it. The blocks run as one
    ``lax.scan`` (see the module docstring, "Depth").

    State (a dict; every leaf has the batch axis first, ``L`` = layers, ``S`` =
    :meth:`cache_slots` ``(max_len)``)::

        k:      [B, L, n_kv, D, S]  keys of every layer, transposed, dtype ``dtype``
        v:      [B, L, n_kv, S, D]  values of every layer
        slot:   int32 [B]           next slot to write (equal across rows)
        offset: int32 [B]           left-padding slots of each row
    """

    def __init__(self, config: LlamaConfig, dtype=jnp.float32,
                 precision: str | None = "highest", attn_block: int | None = 128,
                 matmul: str = "auto", attention: str = "auto", platform: str | None = None):
        if attn_block is not None and attn_block < 1:
            raise ValueError(f"JaxLM: attn_block must be >= 1 or None, got {attn_block}")
        for name, value in (("matmul", matmul), ("attention", attention)):
            if value not in ("auto", "kernel", "xla"):
                raise ValueError(f"JaxLM: {name} must be 'auto', 'kernel' or 'xla', "
                                 f"got {value!r}")
        self.matmul = matmul
        self.attention = attention
        self.platform = str(platform or jax.default_backend())
        self.attn_block = attn_block
        self.config = config
        self.dtype = jnp.dtype(dtype)
        if self.dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            raise ValueError(f"JaxLM: dtype must be float32, bfloat16 or float16, got {self.dtype}")
        self.precision = precision
        self.vocab_size = config.vocab_size
        self.eos_token_id = config.eos_token_id
        self.bos_token_id = config.bos_token_id
        self.pad_token_id = config.pad_token_id if config.pad_token_id >= 0 else 0
        self.inv_freq = config.rope_inv_freq()
        #: [(inv_freq, cos/sin scaling)]: global layers, then (Gemma 3) sliding layers
        self.rope_tables = config.rope_tables()
        self.sliding = np.asarray(config.sliding_layers, bool)      # [L] per layer
        #: per layer: which rope table (0 global, 1 local) and which mask (0 full, 1 window)
        self._rope_kind = (self.sliding.astype(np.int32) if len(self.rope_tables) > 1
                           else np.zeros(config.num_layers, np.int32))
        self._mask_kind = self.sliding.astype(np.int32)
        self.window = int(config.sliding_window) if self.sliding.any() else None
        abstract = nnx.eval_shape(lambda: LlamaModel(
            config, dtype=self.dtype, precision=self._jax_precision(), rngs=nnx.Rngs(0)))
        self.graphdef, self._abstract_state = nnx.split(abstract)
        self._key = (config, self.dtype.name, precision, attn_block, matmul, attention,
                     self.platform)

    def in_place_matmul(self) -> bool:
        """Whether the layer scan reads each layer's projection weights in place through
        the native kernel (:mod:`jaxcd.lm.kernels`): ``matmul="auto"`` when the kernel
        runs on this LM's ``platform`` (CPU, a C++ compiler), ``"kernel"`` always (or an
        error saying why not), ``"xla"`` never (the copying scan; sharded weights use
        it)."""
        if self.matmul == "xla":
            return False
        from . import kernels

        return kernels.lm_kernel_available(self.platform, required=self.matmul == "kernel")

    def attention_kernel(self) -> bool:
        """Whether a decode step attends through the native kernel
        (:func:`jaxcd.lm.kernels.decode_attention`): with the in-place layer scan
        (:meth:`in_place_matmul`), ``attention="auto"`` when the kernel runs on this
        platform, ``"kernel"`` always (or an error), ``"xla"`` never."""
        if self.attention == "xla":
            return False
        from . import kernels

        required = self.attention == "kernel"
        if not self.in_place_matmul():
            if required:
                raise kernels.KernelUnavailable(
                    "JaxLM(attention='kernel') needs the in-place layer scan (matmul='auto' "
                    "or 'kernel' on the CPU platform)")
            return False
        return kernels.decode_attention_available(self.platform, required=required)

    def _jax_precision(self):
        if self.precision is None:
            return None
        if isinstance(self.precision, str):
            return jax.lax.Precision[self.precision.upper()]
        return self.precision

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, JaxLM) and self._key == other._key

    def __repr__(self):
        c = self.config
        return (f"JaxLM({c.arch}, L={c.num_layers}, H={c.hidden_size}, heads={c.num_heads}/"
                f"{c.num_kv_heads}, V={c.vocab_size}, dtype={self.dtype.name})")

    # -- construction ------------------------------------------------------------------
    def params_from_pure_dict(self, pure: dict) -> nnx.State:
        """Turn a nested dict of arrays into the ``nnx.State`` pytree this LM's functions
        take, checking every shape. ``pure["layers"]`` may be stacked (every leaf
        ``[L, ...]``: the layout of ``nnx.to_pure_dict(params)``) or per layer (the
        layout of :func:`load_gguf`: ``{0: {...}, 1: {...}, ...}`` or a list), which is
        stacked here."""
        pure = dict(pure)
        L = self.config.num_layers
        layers = pure.get("layers")
        if isinstance(layers, (list, tuple)):
            layers = dict(enumerate(layers))
        if isinstance(layers, dict) and layers and all(
                isinstance(i, int) or (isinstance(i, str) and i.isdigit()) for i in layers):
            per = {int(i): v for i, v in layers.items()}
            if sorted(per) != list(range(L)):
                raise ValueError(f"params_from_pure_dict: layers {sorted(per)[:5]}..., "
                                 f"expected 0..{L - 1}")
            flat = [dict(nnx.traversals.flatten_mapping(per[i])) for i in range(L)]
            if any(set(f) != set(flat[0]) for f in flat):
                raise ValueError("params_from_pure_dict: the layers have different parameters")
            pure["layers"] = nnx.traversals.unflatten_mapping(
                {k: np.stack([np.asarray(f[k]) for f in flat]) for k in flat[0]})
        state = jax.tree.map(lambda x: x, self._abstract_state)  # fresh copy

        def conv(path, abstract, value):
            value = np.asarray(value)
            if value.shape != abstract.shape:
                raise ValueError(f"parameter {'/'.join(map(str, path))}: shape {value.shape}, "
                                 f"expected {abstract.shape}")
            return jnp.asarray(value, dtype=abstract.dtype)

        flat_abs = dict(nnx.traversals.flatten_mapping(nnx.to_pure_dict(state)))
        flat_val = dict(nnx.traversals.flatten_mapping(pure))
        missing = set(flat_abs) - set(flat_val)
        extra = set(flat_val) - set(flat_abs)
        if missing or extra:
            raise ValueError(f"params_from_pure_dict: missing {sorted(map(str, missing))[:5]}, "
                             f"unexpected {sorted(map(str, extra))[:5]}")
        conv_flat = {k: conv(k, flat_abs[k], flat_val[k]) for k in flat_abs}
        nnx.replace_by_pure_dict(state, nnx.traversals.unflatten_mapping(conv_flat))
        return state

    def model(self, params: PyTree) -> LlamaModel:
        """The NNX module with ``params`` merged in (inside or outside jit). Per-layer
        parameters (:class:`jaxcd.lm.unrolled.UnrolledParams`) give a model whose layers
        run unrolled, each reading its own weights in place."""
        if getattr(params, "is_unrolled_params", False):
            return params.model(self.graphdef)
        return nnx.merge(self.graphdef, params)

    # -- pure implementations ------------------------------------------------------------
    def _check_prompt(self, prompt_ids, prompt_lengths, max_len):
        if prompt_ids.ndim != 2:
            raise ValueError(f"prompt_ids must be [batch, prompt_len], got shape {prompt_ids.shape}")
        B, P = prompt_ids.shape
        if tuple(prompt_lengths.shape) != (B,):
            raise ValueError(f"prompt_lengths must have shape [{B}], got {prompt_lengths.shape}")
        if P < 1:
            raise ValueError("prompt_ids must have at least one column")
        if max_len < P:
            raise ValueError(f"max_len={max_len} is smaller than the prompt length {P}")
        if max_len > self.config.context_length:
            raise ValueError(f"max_len={max_len} exceeds the model's context length "
                             f"{self.config.context_length}")
        if _is_concrete(prompt_lengths):
            lens = np.asarray(prompt_lengths)
            if lens.min() < 1 or lens.max() > P:
                raise ValueError(f"prompt_lengths must be in [1, {P}], got {lens.tolist()}")

    def _cos_sin(self, positions):
        """``(cos, sin)`` ``[K, B, T, D]`` for the ``K`` rope tables (see
        :attr:`rope_tables`)."""
        cs = []
        for inv, att in self.rope_tables:
            c, s_ = rope_cos_sin(positions, inv)
            if att != 1.0:
                c, s_ = c * att, s_ * att
            cs.append((c, s_))
        return jnp.stack([c for c, _ in cs]), jnp.stack([s_ for _, s_ in cs])

    @staticmethod
    def _pick(stacked, kinds: np.ndarray, l):
        """``stacked[kinds[l]]`` (``stacked[0]`` when there is only one)."""
        if stacked.shape[0] == 1:
            return stacked[0]
        return stacked[jnp.asarray(kinds)[l]]

    def _forward_prompt(self, params, prompt_ids, prompt_lengths, cache_slots=None):
        """Full causal forward over left-padded prompts. Returns ``(model, x, cache,
        offset)``: hidden states ``x`` ``[B, P, H]``, ``offset`` ``[B]`` and, when
        ``cache_slots`` (``S >= P``) is given, the stacked caches ``(k [B, L, n_kv, D, S],
        v [B, L, n_kv, S, D])`` (dtype ``self.dtype``) with slots ``[0, P)`` filled and
        the rest zero (else ``cache`` is ``None``)."""
        model = self.model(params)
        B, P = prompt_ids.shape
        offset = (P - prompt_lengths).astype(jnp.int32)
        slots = jnp.arange(P, dtype=jnp.int32)
        positions = jnp.maximum(slots[None, :] - offset[:, None], 0)
        cos_k, sin_k = self._cos_sin(positions)
        i, j = slots[:, None], slots[None, :]
        full = (j <= i)[None] & ((j[None] >= offset[:, None, None]) | (i == j)[None])
        masks = [full]
        if self.window is not None:      # sliding layers: keys less than `window` back
            masks.append(full & (i - j < self.window)[None])
        masks = mask_bias(jnp.stack(masks))                      # [1 or 2, B, P, P]
        x = model.embed_tokens(prompt_ids.astype(jnp.int32))

        def run(layer, l, x):
            return layer(x, self._pick(cos_k, self._rope_kind, l),
                         self._pick(sin_k, self._rope_kind, l),
                         self._pick(masks, self._mask_kind, l))

        if cache_slots is None:
            x, _ = model.run_layers(lambda layer, l, x: (run(layer, l, x)[0], None), x,
                                    in_place=self.in_place_matmul())
            return model, x, None, offset

        def body(layer, l, x):
            x, k, v = run(layer, l, x)
            return x, (k.astype(self.dtype), v.astype(self.dtype))

        # [L, B, n_kv, D, P], [L, B, n_kv, P, D]
        x, (ks, vs) = model.run_layers(body, x, in_place=self.in_place_matmul())
        extra = cache_slots - P
        kc = jnp.pad(jnp.moveaxis(ks, 0, 1), ((0, 0),) * 4 + ((0, extra),))
        vc = jnp.pad(jnp.moveaxis(vs, 0, 1), ((0, 0),) * 3 + ((0, extra), (0, 0)))
        return model, x, (kc, vc), offset

    def cache_slots(self, max_len: int) -> int:
        """Slots actually allocated for ``max_len``: ``max_len`` itself when it is at most
        ``attn_block``, else rounded up to a multiple of ``attn_block`` (decode then
        attends block by block over the filled slots only)."""
        b = self.attn_block
        if b is None or max_len <= b:
            return max_len
        return -(-max_len // b) * b

    def _prefill(self, params, prompt_ids, prompt_lengths, max_len: int):
        TRACE_COUNTS["prefill"] += 1
        model, x, (kc, vc), offset = self._forward_prompt(params, prompt_ids, prompt_lengths,
                                                          self.cache_slots(max_len))
        B, P = prompt_ids.shape
        state = {
            "k": kc,
            "v": vc,
            "slot": jnp.full((B,), P, jnp.int32),
            "offset": offset,
        }
        logits = model.logits(x[:, -1], self.in_place_matmul())
        return state, jax.nn.log_softmax(logits, axis=-1)

    def _prefill_after(self, params, prefix, prompt_ids, prompt_lengths, max_len: int):
        """See :meth:`prefill_after`."""
        TRACE_COUNTS["prefill_after"] += 1
        model = self.model(params)
        pk, pv, poff = prefix["k"], prefix["v"], prefix["offset"][0]
        P0 = pk.shape[-1]                               # the prefix's width (bucket)
        G, T = prompt_ids.shape
        W = P0 + T
        n0 = P0 - poff                                  # the prefix's tokens (traced)
        off = (T - prompt_lengths).astype(jnp.int32)    # suffix offsets [G]
        j = jnp.arange(T, dtype=jnp.int32)
        # absolute positions: the suffix's tokens follow the prefix's n0 tokens
        qpos = n0 + jnp.maximum(j[None, :] - off[:, None], 0)                 # [G, T]
        cos_k, sin_k = self._cos_sin(qpos)
        p = jnp.arange(P0, dtype=jnp.int32)
        kpos = jnp.concatenate([jnp.broadcast_to(p - poff, (G, P0)), qpos], axis=1)  # [G, W]
        kreal = jnp.concatenate([jnp.broadcast_to(p >= poff, (G, P0)),
                                 j[None, :] >= off[:, None]], axis=1)             # [G, W]
        kslot = jnp.concatenate([p - P0, j])            # suffix slot of each key (prefix < 0)
        full = kreal[:, None, :] & (kslot[None, None, :] <= j[None, :, None])      # [G, T, W]
        # a padding query row attends to the prefix (never to nothing)
        masks = [full]
        if self.window is not None:
            masks.append(full & (qpos[:, :, None] - kpos[:, None, :] < self.window))
        masks = mask_bias(jnp.stack(masks))                                      # [K, G, T, W]
        x = model.embed_tokens(prompt_ids.astype(jnp.int32))

        def body(layer, l, x):
            kp = jnp.broadcast_to(jax.lax.dynamic_index_in_dim(pk, l, 1, keepdims=False),
                                  (G,) + pk.shape[2:])
            vp = jnp.broadcast_to(jax.lax.dynamic_index_in_dim(pv, l, 1, keepdims=False),
                                  (G,) + pv.shape[2:])
            x, k, v = layer(x, self._pick(cos_k, self._rope_kind, l),
                            self._pick(sin_k, self._rope_kind, l),
                            self._pick(masks, self._mask_kind, l), past=(kp, vp))
            return x, (k.astype(self.dtype), v.astype(self.dtype))

        x, (ks, vs) = model.run_layers(body, x, in_place=self.in_place_matmul())
        # the layout of a stand-alone prefill of prefix + suffix at width W: row g's
        # tokens right-aligned, offset F = W - n0 - len; slot w < F is padding
        F = (W - n0 - prompt_lengths).astype(jnp.int32)                          # [G]
        w = jnp.arange(W, dtype=jnp.int32)[None, :]
        src = jnp.where(w < F[:, None] + n0, poff + (w - F[:, None]),            # prefix slot
                        P0 + off[:, None] + (w - F[:, None] - n0))               # suffix slot
        src = jnp.clip(src, 0, W - 1)                                            # [G, W]
        kc = jnp.concatenate([jnp.broadcast_to(pk, (G,) + pk.shape[1:]),
                              jnp.moveaxis(ks, 0, 1)], axis=-1)                  # [G, L, nkv, D, W]
        vc = jnp.concatenate([jnp.broadcast_to(pv, (G,) + pv.shape[1:]),
                              jnp.moveaxis(vs, 0, 1)], axis=-2)                  # [G, L, nkv, W, D]
        kc = jnp.take_along_axis(kc, src[:, None, None, None, :], axis=-1)
        vc = jnp.take_along_axis(vc, src[:, None, None, :, None], axis=-2)
        extra = self.cache_slots(max_len) - W
        kc = jnp.pad(kc, ((0, 0),) * 4 + ((0, extra),))
        vc = jnp.pad(vc, ((0, 0),) * 3 + ((0, extra), (0, 0)))
        state = {"k": kc, "v": vc, "slot": jnp.full((G,), W, jnp.int32), "offset": F}
        logits = model.logits(x[:, -1], self.in_place_matmul())
        return state, jax.nn.log_softmax(logits, axis=-1)

    def _step(self, params, state, tokens):
        TRACE_COUNTS["step"] += 1
        model = self.model(params)
        slot_b, offset = state["slot"], state["offset"]
        slot = slot_b[0]
        S = state["v"].shape[3]
        cos_k, sin_k = self._cos_sin((slot_b - offset)[:, None])
        blk = self.attn_block if self.attn_block is not None and S > self.attn_block \
            and S % self.attn_block == 0 else None
        # first slot each row may attend, per mask kind (sliding layers: the window)
        lo = [offset]
        if self.window is not None:
            lo.append(jnp.maximum(offset, slot - self.window + 1))
        lo = jnp.stack(lo)                                        # [1 or 2, B]
        if blk is None:
            j = jnp.arange(S, dtype=jnp.int32)[None, None, None, :]
            masks = mask_bias((j >= lo[:, :, None, None]) & (j <= slot))   # [K, B, 1, S]
        else:
            masks = None
        x = model.embed_tokens(tokens.astype(jnp.int32)[:, None])
        kc, vc = state["k"], state["v"]
        attn_kernel = self.attention_kernel()

        def body(layer, l, x):
            mask = None if masks is None else self._pick(masks, self._mask_kind, l)
            x, k, v = layer(x, self._pick(cos_k, self._rope_kind, l),
                            self._pick(sin_k, self._rope_kind, l), mask, cache=(kc, vc),
                            layer=l, slot=slot, offset=self._pick(lo, self._mask_kind, l),
                            block=blk, attn_kernel=attn_kernel)
            return x, (k, v)

        # the layers only read the cache; this step's keys/values [L, B, n_kv, D, 1] /
        # [L, B, n_kv, 1, D] are written at `slot` afterwards, in place
        x, (ks, vs) = model.run_layers(body, x, in_place=self.in_place_matmul())
        z = jnp.zeros((), jnp.int32)
        kc = jax.lax.dynamic_update_slice(kc, jnp.moveaxis(ks, 0, 1), (z, z, z, z, slot))
        vc = jax.lax.dynamic_update_slice(vc, jnp.moveaxis(vs, 0, 1), (z, z, z, slot, z))
        new_state = {"k": kc, "v": vc, "slot": slot_b + 1, "offset": offset}
        return new_state, jax.nn.log_softmax(model.logits(x[:, 0], self.in_place_matmul()),
                                             axis=-1)

    # -- the interface ----------------------------------------------------------------------
    def prefill(self, params: PyTree, prompt_ids: jax.Array, prompt_lengths: jax.Array,
                max_len: int) -> tuple[PyTree, jax.Array]:
        """Run the left-padded prompts ``[B, P]`` (lengths ``[B]``) through the model and
        allocate a cache of ``max_len`` (static) slots. Returns ``(state, logprobs
        [B, V] float32)`` of the token after each prompt."""
        prompt_ids = jnp.asarray(prompt_ids)
        prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32) if _is_concrete(prompt_lengths) \
            else prompt_lengths
        self._check_prompt(prompt_ids, prompt_lengths, int(max_len))
        if not isinstance(prompt_ids, jax.core.Tracer):
            self._check_cache_memory(prompt_ids.shape[0], int(max_len))
        return _prefill_jit(self, params, prompt_ids, prompt_lengths, int(max_len))

    def prefill_after(self, params: PyTree, prefix: PyTree, prompt_ids: jax.Array,
                      prompt_lengths: jax.Array, max_len: int) -> tuple[PyTree, jax.Array]:
        """Prefill prompts that all begin with one shared prefix, running only their own
        tokens through the model: ``prefix`` is the state of ``prefill`` of ONE row
        ``[1, P0]`` (the prefix, left-padded, with ``max_len = P0``); ``prompt_ids``
        ``[G, T]`` (left-padded) and ``prompt_lengths`` ``[G]`` (each ``>= 1``) the rest
        of each prompt. Returns what ``prefill`` of the whole prompts (prefix + rest,
        left-padded to width ``P0 + T``) returns, up to float rounding: the cache laid out
        at width ``P0 + T`` with ``max_len`` slots, and the log-probabilities ``[G, V]``
        of the token after each prompt. The rest's tokens attend to the prefix's cached
        keys and values and to their own."""
        prompt_ids = jnp.asarray(prompt_ids)
        prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
        if not (isinstance(prefix, dict) and {"k", "v", "offset"} <= set(prefix)) or \
                prefix["k"].shape[0] != 1:
            raise ValueError("prefill_after: prefix must be the state of a one-row prefill")
        width = prefix["k"].shape[-1] + prompt_ids.shape[1]
        if _is_concrete(prefix["slot"]) and int(np.asarray(prefix["slot"])[0]) != \
                prefix["k"].shape[-1]:
            raise ValueError("prefill_after: prefill the prefix with max_len = its width "
                             "(a cache with no empty slot)")
        self._check_prompt(prompt_ids, prompt_lengths, int(max_len))
        if max_len < width:
            raise ValueError(f"max_len={max_len} is smaller than prefix + prompt width {width}")
        if not isinstance(prompt_ids, jax.core.Tracer):
            self._check_cache_memory(prompt_ids.shape[0], int(max_len))
        return _prefill_after_jit(self, params, prefix, prompt_ids, prompt_lengths, int(max_len))

    def cache_bytes(self, batch: int, max_len: int) -> int:
        """Bytes of the KV cache :meth:`prefill` allocates for ``batch`` rows."""
        c = self.config
        return (2 * batch * c.num_layers * c.num_kv_heads * c.head_dim
                * self.cache_slots(max_len) * self.dtype.itemsize)

    def _check_cache_memory(self, batch: int, max_len: int) -> None:
        """Refuse (``ModelFileError`` with the figures) a KV cache that will not fit
        (checked for caches over 64 MiB, or always under a memory limit:
        :func:`jaxcd.lm.memory.memory_limit`). Checked where the call is eager; a caller
        that traces ``prefill`` inside its own program checks before tracing."""
        from .memory import check_memory, memory_limit

        need = self.cache_bytes(batch, max_len)
        if need > 64 << 20 or memory_limit() is not None:

            check_memory(f"the KV cache ({batch} rows x {self.cache_slots(max_len)} slots x "
                         f"{self.config.num_layers} layers, {self.dtype.name})", need)

    def step(self, params: PyTree, state: PyTree, tokens: jax.Array) -> tuple[PyTree, jax.Array]:
        """Append ``tokens`` ``[B]`` at the next slot. Returns ``(state', logprobs [B, V])``.
        The caller must not step more than ``max_len - P`` times. Functional (the input
        state stays valid); eager host loops may prefer :func:`step_donated`."""
        return _step_jit(self, params, state, jnp.asarray(tokens))

    # -- extras ---------------------------------------------------------------------------
    def logprobs_all(self, params: PyTree, prompt_ids, prompt_lengths) -> jax.Array:
        """Full recompute without a cache: float32 ``[B, P, V]`` next-token
        log-probabilities after every slot of the left-padded ``prompt_ids`` (rows at
        padding slots are meaningless)."""
        prompt_ids = jnp.asarray(prompt_ids)
        prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
        self._check_prompt(prompt_ids, prompt_lengths, prompt_ids.shape[1])
        return _all_jit(self, params, prompt_ids, prompt_lengths)

    def _logprobs_all(self, params, prompt_ids, prompt_lengths):
        TRACE_COUNTS["all"] += 1
        model, x, _, _ = self._forward_prompt(params, prompt_ids, prompt_lengths)
        return jax.nn.log_softmax(model.logits(x, self.in_place_matmul()), axis=-1)

    def generate_greedy(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                        params: PyTree, stop_at_eos: bool = True,
                        max_len: int | None = None) -> list[list[int]]:
        """Greedy continuation of each token list (host loop around the jitted, buffer-
        donating step). Returns the new tokens per prompt, cut after EOS when
        ``stop_at_eos``."""
        from .interface import pad_prompts

        if params is None:
            raise ValueError("generate_greedy: params is None (jaxcd.lm.loading.load_lm "
                             "returns the LM and its params)")
        if max_new_tokens < 1:
            return [[] for _ in prompts]
        ids, lens = pad_prompts(prompts, pad_id=self.pad_token_id)
        max_len = ids.shape[1] + max_new_tokens if max_len is None else max_len
        if max_len < ids.shape[1] + max_new_tokens - 1:
            raise ValueError(f"max_len={max_len} cannot hold {ids.shape[1]} prompt slots and "
                             f"{max_new_tokens} new tokens")
        state, lp = self.prefill(params, ids, lens, max_len)
        tok = jnp.argmax(lp, axis=-1).astype(jnp.int32)
        out = [tok]
        for _ in range(max_new_tokens - 1):
            state, lp = _step_jit_donate(self, params, state, tok)
            tok = jnp.argmax(lp, axis=-1).astype(jnp.int32)
            out.append(tok)
        toks = np.asarray(jnp.stack(out, axis=1))
        result = []
        for row in toks.tolist():
            if stop_at_eos and self.eos_token_id in row:
                row = row[: row.index(self.eos_token_id) + 1]
            result.append(row)
        return result

    def generate_greedy_scan(self, params: PyTree, prompt_ids, prompt_lengths,
                             max_new_tokens: int) -> jax.Array:
        """Greedy decoding as ONE jitted program (prefill + ``lax.scan`` over steps).
        Returns int32 ``[B, max_new_tokens]`` (no EOS handling)."""
        prompt_ids = jnp.asarray(prompt_ids)
        prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
        self._check_prompt(prompt_ids, prompt_lengths, prompt_ids.shape[1] + max_new_tokens)
        return _scan_jit(self, params, prompt_ids, prompt_lengths, int(max_new_tokens))

    def _generate_scan(self, params, prompt_ids, prompt_lengths, n: int):
        TRACE_COUNTS["scan"] += 1
        state, lp = self._prefill(params, prompt_ids, prompt_lengths, prompt_ids.shape[1] + n)
        tok = jnp.argmax(lp, axis=-1).astype(jnp.int32)

        def body(carry, _):
            state, tok = carry
            state, lp = self._step(params, state, tok)
            nxt = jnp.argmax(lp, axis=-1).astype(jnp.int32)
            return (state, nxt), tok

        (_, last), toks = jax.lax.scan(body, (state, tok), None, length=n - 1)
        return jnp.concatenate([toks.T, last[:, None]], axis=1) if n > 1 else tok[:, None]


# module-level jitted entry points (LM static; params/state/tokens traced)
_prefill_jit = jax.jit(lambda lm, p, ids, lens, max_len: lm._prefill(p, ids, lens, max_len),
                       static_argnums=(0, 4))
_step_jit = jax.jit(lambda lm, p, s, t: lm._step(p, s, t), static_argnums=0)
_prefill_after_jit = jax.jit(
    lambda lm, p, pre, ids, lens, max_len: lm._prefill_after(p, pre, ids, lens, max_len),
    static_argnums=(0, 5))
_step_jit_donate = jax.jit(lambda lm, p, s, t: lm._step(p, s, t), static_argnums=0,
                           donate_argnums=2)
_all_jit = jax.jit(lambda lm, p, ids, lens: lm._logprobs_all(p, ids, lens), static_argnums=0)
_scan_jit = jax.jit(lambda lm, p, ids, lens, n: lm._generate_scan(p, ids, lens, n),
                    static_argnums=(0, 4))


def step_donated(lm: JaxLM, params: PyTree, state: PyTree, tokens: jax.Array):
    """Like ``lm.step`` but donates ``state`` so the cache is updated in place (the
    passed-in ``state`` must not be used afterwards)."""
    return _step_jit_donate(lm, params, state, jnp.asarray(tokens))


__all__ = ["JaxLM", "LlamaModel", "LlamaConfig", "TRACE_COUNTS", "step_donated",
           "read_gguf_config", "rope_cos_sin", "apply_rope", "attend"]
