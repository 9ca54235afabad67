"""Reading Llama-family weights and hyper-parameters out of a GGUF file.

GGUF (llama.cpp's format) stores metadata key/values and named tensors, many of
them block-quantised. This module

1. reads the model hyper-parameters from ``{arch}.*`` metadata keys into a hashable
   :class:`LlamaConfig` (``arch`` is ``llama``, ``qwen2``, ``qwen3`` or ``gemma3``;
   Mistral/SmolLM/TinyLlama GGUFs use ``llama``; Hugging Face folders are read by
   :mod:`jaxcd.lm.hf_checkpoint` into the same class);
2. de-quantises each tensor to float32 with :func:`gguf.quants.dequantize` (F32, F16,
   BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants Q2_K..Q6_K, the IQ and TQ types:
   whatever the installed ``gguf`` package implements);
3. renames them to the layout of :mod:`jaxcd.lm.llama` and undoes llama.cpp's
   rotary permutation of the Q/K projections (see :func:`reverse_permute`).

Tensor layout. A GGUF tensor with ``ne = [n_in, n_out]`` de-quantises to a numpy array
``[n_out, n_in]``, the same as a PyTorch ``nn.Linear.weight`` ``W`` in ``y = x W^T``.
Flax's ``nnx.Linear`` uses ``kernel = W^T`` (``[n_in, n_out]``), so projections are
transposed here; the token embedding stays ``[vocab, hidden]``.

Everything wrong with a file (missing, not GGUF, truncated, unknown architecture,
unsupported quantisation, missing tensor, shape mismatch) raises
:class:`jaxcd.errors.ModelFileError` naming the file and the problem.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError

#: Architectures whose GGUF tensors this loader understands.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a Llama-family decoder (hashable; a static jit argument).

    Attributes:
      arch: GGUF ``general.architecture`` (``"llama"`` or ``"qwen2"``).
      vocab_size: ``V``, rows of the token embedding.
      hidden_size: ``H``, the residual-stream width.
      intermediate_size: ``F``, the SwiGLU hidden width.
      num_layers: ``L``, transformer blocks.
      num_heads: ``n_h``, query heads.
      num_kv_heads: ``n_kv``, key/value heads (``n_h % n_kv == 0``; GQA group size
        ``G = n_h / n_kv``).
      head_dim: ``D``, per-head width (usually ``H / n_h``).
      rope_theta: RoPE base ``θ``; frequency ``i`` is ``θ^(-2i/D)``.
      rms_eps: ``ε`` of RMSNorm.
      context_length: the longest sequence the model was trained for.
      tie_embeddings: ``True`` when there is no ``output.weight`` and the output
        projection is the token embedding (``logits = h E^T``).
      attention_bias: ``True`` when Q/K/V projections have biases (Qwen2).
      rope_scaling_factor: linear RoPE scaling (positions divided by it); 1.0 = none.
      rope_freq_factors: per-frequency divisors (``rope_freqs.weight``, Llama-3.1
        style) as a tuple of ``D/2`` floats, or ``None``.
      bos_token_id / eos_token_id / pad_token_id: from ``tokenizer.ggml.*`` (or -1).
    """

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    context_length: int
    tie_embeddings: bool
    attention_bias: bool = False
    rope_scaling_factor: float = 1.0
    rope_freq_factors: tuple[float, ...] | None = None
    bos_token_id: int = -1
    eos_token_id: int = -1
    pad_token_id: int = -1
    # -- architecture variants (Hugging Face checkpoints: see jaxcd.lm.hf_checkpoint) --
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    sliding_window: int | None = None
    layer_sliding: tuple[bool, ...] | None = None
    rope_local_theta: float | None = None
    rope_local_scaling: tuple[tuple[str, Any], ...] | None = None
    qk_norm: bool = False
    o_bias: bool = False
    post_norms: bool = False
    norm_offset: float = 0.0
    mlp_activation: str = "silu"
    embed_scale: float | None = None
    query_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"LlamaConfig: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim={self.head_dim} must be even for RoPE")
        if self.layer_sliding is not None:
            if len(self.layer_sliding) != self.num_layers:
                raise ValueError(f"LlamaConfig: layer_sliding has {len(self.layer_sliding)} "
                                 f"entries for {self.num_layers} layers")
            if any(self.layer_sliding) and not self.sliding_window:
                raise ValueError("LlamaConfig: sliding layers without a sliding_window")
        if self.mlp_activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"LlamaConfig: mlp_activation {self.mlp_activation!r} "
                             "(supported: 'silu', 'gelu_tanh')")
        for sc in (self.rope_scaling, self.rope_local_scaling):
            if sc is not None:
                _rope_scaled(_default_inv_freq(self.rope_theta, self.head_dim), dict(sc), self.head_dim,
                             self.rope_theta, self.context_length)   # validates the type

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer: does it attend over a sliding window of ``sliding_window`` keys?
        (``layer_sliding`` when given; else every layer when ``sliding_window`` is set,
        as in Mistral.)"""
        if self.layer_sliding is not None:
            return tuple(bool(b) for b in self.layer_sliding)
        return (self.sliding_window is not None,) * self.num_layers

    def rope_tables(self) -> list[tuple[np.ndarray, float]]:
        """``[(inv_freq, attention_scaling)]`` for the global layers and, when the
        sliding layers use their own RoPE (Gemma 3's local base), a second entry for
        them. ``cos``/``sin`` are multiplied by ``attention_scaling`` (YaRN)."""
        out = [_rope_scaled(self.rope_inv_freq(), dict(self.rope_scaling or ()), self.head_dim,
                            self.rope_theta, self.context_length)]
        if self.rope_local_theta is not None and any(self.sliding_layers):
            base = _default_inv_freq(self.rope_local_theta, self.head_dim)
            out.append(_rope_scaled(base, dict(self.rope_local_scaling or ()), self.head_dim,
                                    self.rope_local_theta, self.context_length))
        return out

    def rope_inv_freq(self) -> np.ndarray:
        """``inv_freq[i] = 1 / θ^(2i/D)`` (float32 ``[D/2]``), computed as transformers
        does (float32 exponent), divided by ``rope_freq_factors`` and by the linear
        scaling factor when present."""
        inv = _default_inv_freq(self.rope_theta, self.head_dim)
        if self.rope_freq_factors is not None:
            inv = inv / np.asarray(self.rope_freq_factors, dtype=np.float32)
        if self.rope_scaling_factor != 1.0:
            inv = inv / np.float32(self.rope_scaling_factor)
        return inv.astype(np.float32)

    @property
    def num_params(self) -> int:
        """Parameter count (tied embedding counted once)."""
        H, F, D = self.hidden_size, self.intermediate_size, self.head_dim
        attn = H * D * (2 * self.num_heads + 2 * self.num_kv_heads)
        if self.attention_bias:
            attn += D * (self.num_heads + 2 * self.num_kv_heads)
        if self.o_bias:
            attn += H
        if self.qk_norm:
            attn += 2 * D
        per_layer = attn + 3 * H * F + (4 if self.post_norms else 2) * H
        out = 0 if self.tie_embeddings else self.vocab_size * H
        return self.vocab_size * H + self.num_layers * per_layer + H + out


#: RoPE scaling types :func:`_rope_scaled` implements (as transformers' ``rope_type``).
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _default_inv_freq(theta: float, D: int) -> np.ndarray:
    """``1 / θ^(2i/D)`` in float32, as transformers computes it."""
    expo = np.arange(0, D, 2, dtype=np.int64).astype(np.float32) / np.float32(D)
    return (np.float32(1.0) / (np.float32(theta) ** expo)).astype(np.float32)


def _rope_scaled(inv: np.ndarray, params: dict, D: int, theta: float,
                 max_pos: int) -> tuple[np.ndarray, float]:
    """Apply a transformers-style RoPE scaling (``params``: ``rope_type`` and its
    fields) to the default frequencies ``inv``. Returns ``(inv_freq, attention_scaling)``.
    Follows ``transformers.modeling_rope_utils`` (``_compute_{linear_scaling,llama3,
    yarn}_parameters``) in float32 numpy."""
    import math

    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ROPE_TYPES:
        raise ValueError(f"RoPE scaling type {kind!r} is not supported "
                         f"(supported: {', '.join(ROPE_TYPES)})")
    inv = np.asarray(inv, np.float32)
    if kind == "default":
        return inv, 1.0
    factor = params.get("factor")
    if kind == "linear":
        return (inv / np.float32(factor)).astype(np.float32), 1.0
    if kind == "llama3":
        lo, hi = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old = float(params["original_max_position_embeddings"])
        factor = float(factor)
        wavelen = (2 * math.pi / inv).astype(np.float32)
        lo_wl, hi_wl = old / lo, old / hi
        out = np.where(wavelen > lo_wl, inv / np.float32(factor), inv).astype(np.float32)
        smooth = ((old / wavelen - lo) / (hi - lo)).astype(np.float32)
        smoothed = ((1 - smooth) * out / np.float32(factor) + smooth * out).astype(np.float32)
        medium = ~(wavelen < hi_wl) & ~(wavelen > lo_wl)
        return np.where(medium, smoothed, out).astype(np.float32), 1.0
    # yarn
    orig = params.get("original_max_position_embeddings") or max_pos
    if factor is None:
        factor = max_pos / orig
    factor = float(factor)
    attn = params.get("attention_factor")
    mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attn is None:
        attn = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
                if mscale and mscale_all else get_mscale(factor))
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def corr_dim(rot):
        return (D * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, D - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(D // 2, dtype=np.float32) - np.float32(low))
                   / np.float32(high - low), 0, 1).astype(np.float32)
    extra = (1 - ramp).astype(np.float32)
    interp = (inv / np.float32(factor)).astype(np.float32)
    return (interp * (1 - extra) + inv * extra).astype(np.float32), float(attn)


# ----------------------------------------------------------------------------- reading
@functools.lru_cache(maxsize=None)
def _reader_class():
    """``gguf.GGUFReader`` reading through a plain ndarray view of its memory map.

    The reader slices its ``np.memmap`` once per metadata value (two slices per string
    of a vocabulary: ~250,000 for a 49,152-token one), and every memmap slice runs
    ``memmap.__array_finalize__``; a plain view of the same mapping reads the same bytes
    about 4x faster (``tests/test_tokenizer_gguf.py`` checks fields and tensors against
    ``gguf.GGUFReader``). Falls back to ``gguf.GGUFReader`` if its ``_get`` changes."""
    import inspect

    import gguf

    base = gguf.GGUFReader
    try:
        params = list(inspect.signature(base._get).parameters)
    except (AttributeError, TypeError, ValueError):
        return base
    if params != ["self", "offset", "dtype", "count", "override_order"]:
        return base

    class _PlainReader(base):
        def _get(self, offset, dtype, count=1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            dt = np.dtype(dtype)
            arr = plain[offset:offset + dt.itemsize * count].view(dt)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr.view(arr.dtype.newbyteorder(order))

    return _PlainReader


def _open_reader(path: Path):
    try:
        return _reader_class()(str(path), "r")
    except ModelFileError:
        raise
    except Exception as e:  # truncated / corrupt files raise ValueError, IndexError, ...
        size = path.stat().st_size if path.exists() else 0
        raise ModelFileError(f"{path}: cannot read GGUF file, corrupt or truncated? ({size} bytes; "
                             f"{type(e).__name__}: {e})") from e


def _field(reader, key: str, path: Path, default: Any = ModelFileError) -> Any:
    """The value of metadata ``key`` (scalar, string or list); ``default`` if absent
    (or a ModelFileError when no default is given)."""
    f = reader.fields.get(key)
    if f is None:
        if default is ModelFileError:
            raise ModelFileError(f"{path}: GGUF metadata key {key!r} is missing")
        return default
    try:
        return f.contents()
    except Exception as e:
        raise ModelFileError(f"{path}: cannot decode GGUF metadata key {key!r} ({e})") from e


def read_config(reader, path: Path) -> LlamaConfig:
    """Read :class:`LlamaConfig` from the metadata of an open ``gguf.GGUFReader``."""
    arch = _field(reader, "general.architecture", path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(f"{path}: unsupported architecture {arch!r} "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def key(name, default=ModelFileError):
        return _field(reader, f"{arch}.{name}", path, default)

    tensor_names = {t.name for t in reader.tensors}
    hidden = int(key("embedding_length"))
    n_heads = int(key("attention.head_count"))
    n_kv = key("attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):  # per-layer lists (hybrid models): must be uniform here
        if len(set(n_kv)) != 1:
            raise ModelFileError(f"{path}: per-layer kv head counts {n_kv} are not supported")
        n_kv = n_kv[0]
    n_kv = int(n_kv)
    head_dim = int(key("attention.key_length", hidden // n_heads))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise ModelFileError(f"{path}: key_length != value_length is not supported")
    rope_dim = int(key("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ModelFileError(f"{path}: partial rotary embeddings (rope.dimension_count={rope_dim}, "
                             f"head_dim={head_dim}) are not supported")
    scaling_type = key("rope.scaling.type", "none")
    scaling_factor = float(key("rope.scaling.factor", 1.0) or 1.0)
    if scaling_type in ("none", None, "") or scaling_factor == 1.0:
        scaling_factor = 1.0
    elif scaling_type != "linear":
        raise ModelFileError(f"{path}: RoPE scaling type {scaling_type!r} is not supported "
                             "(only 'linear' and rope_freqs.weight factors)")
    vocab = key("vocab_size", None)
    if vocab is None:
        toks = _field(reader, "tokenizer.ggml.tokens", path, None)
        if toks is None:
            emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
            if emb is None:
                raise ModelFileError(f"{path}: cannot determine the vocabulary size")
            vocab = int(emb.shape[-1])
        else:
            vocab = len(toks)

    freq_factors = None
    if "rope_freqs.weight" in tensor_names:
        t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        freq_factors = tuple(float(x) for x in _dequantize(t, path).reshape(-1))
        if len(freq_factors) != head_dim // 2:
            raise ModelFileError(f"{path}: rope_freqs.weight has {len(freq_factors)} entries, "
                                 f"expected head_dim/2 = {head_dim // 2}")

    def tok_id(name):
        v = _field(reader, f"tokenizer.ggml.{name}", path, -1)
        return int(v) if v is not None else -1

    extra: dict = {}
    if arch == "qwen3":
        extra = dict(qk_norm=True)
    elif arch == "gemma3":
        # llama.cpp's Gemma 3: sliding layers all but every 6th, local RoPE base 10000,
        # kq scale 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim, as in all Gemma 3
        # sizes but 27B, whose converter writes attention.scale)
        L = int(key("block_count"))
        window = key("attention.sliding_window", None)
        pattern = 6
        sliding = tuple(bool((i + 1) % pattern) for i in range(L))
        scale = key("attention.scale", None)
        if key("final_logit_softcapping", None) or key("attn_logit_softcapping", None):
            raise ModelFileError(f"{path}: gemma3 soft-capping in GGUF is not supported")
        extra = dict(qk_norm=True, post_norms=True, norm_offset=1.0, mlp_activation="gelu_tanh",
                     embed_scale=float(np.sqrt(hidden)),
                     query_scale=float(scale) if scale else None,
                     sliding_window=int(window) if window and any(sliding) else None,
                     layer_sliding=sliding if window else None,
                     rope_local_theta=10000.0 if window else None)
    try:
        return LlamaConfig(
            **extra,
            arch=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=n_heads,
            num_kv_heads=n_kv,
            head_dim=head_dim,
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            context_length=int(key("context_length", 2048)),
            tie_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            rope_scaling_factor=scaling_factor,
            rope_freq_factors=freq_factors,
            bos_token_id=tok_id("bos_token_id"),
            eos_token_id=tok_id("eos_token_id"),
            pad_token_id=tok_id("padding_token_id"),
        )
    except ValueError as e:
        raise ModelFileError(f"{path}: inconsistent hyper-parameters: {e}") from e


def _dequantize(tensor, path: Path) -> np.ndarray:
    """De-quantise one ``ReaderTensor`` to float32 numpy, shape ``reversed(ne)``."""
    import gguf
    from gguf.quants import dequantize

    qtype = tensor.tensor_type
    try:
        if qtype == gguf.GGMLQuantizationType.F64:
            arr = np.asarray(tensor.data, dtype=np.float64)
        else:
            arr = dequantize(tensor.data, qtype)
    except NotImplementedError as e:
        raise ModelFileError(f"{path}: tensor {tensor.name!r} uses quantisation "
                             f"{qtype.name}, which this gguf package cannot de-quantise") from e
    except Exception as e:
        raise ModelFileError(f"{path}: cannot de-quantise tensor {tensor.name!r} "
                             f"({qtype.name}): {type(e).__name__}: {e}") from e
    expected = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    arr = np.asarray(arr, dtype=np.float32)
    if arr.size != int(np.prod(expected)):
        raise ModelFileError(f"{path}: tensor {tensor.name!r} has {arr.size} values, "
                             f"expected shape {expected}")
    return arr.reshape(expected)


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of a Q or K projection (rows = outputs).

    llama.cpp's converter (``convert_hf_to_gguf.py``, ``LlamaModel.permute``) reorders
    each head's ``D`` output rows from the Hugging Face "rotate-half" layout
    ``[x_0..x_{D/2-1}, x_{D/2}..x_{D-1}]`` to the interleaved layout
    ``[x_0, x_{D/2}, x_1, x_{D/2+1}, ...]`` its RoPE kernel expects::

        w.reshape(n_head, 2, D/2, *rest).swapaxes(1, 2).reshape(w.shape)

    The inverse (identical to transformers' ``LlamaTensorProcessor._reverse_permute_weights``)
    is ``w.reshape(n_head, D/2, 2, *rest).swapaxes(1, 2).reshape(w.shape)``. ``n_head``
    is the number of query heads for Q and of key/value heads for K. Works for weights
    ``[n_head*D, in]`` and biases ``[n_head*D]``.
    """
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _pure_dict_from_tensors(cfg: LlamaConfig, tensors: dict[str, Any], path: Path,
                            dtype) -> dict:
    """Map GGUF tensor names to the nested parameter dict of :class:`jaxcd.lm.llama.LlamaModel`."""
    H, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv = cfg.num_heads, cfg.num_kv_heads
    permute = cfg.arch == "llama"  # qwen2/qwen3/gemma3 use NEOX rope in llama.cpp: no permutation
    gemma = cfg.arch == "gemma3"

    def get(name, shape):
        t = tensors.get(name)
        if t is None:
            raise ModelFileError(f"{path}: tensor {name!r} is missing")
        arr = _dequantize(t, path)
        if arr.shape != tuple(shape):
            if arr.size == int(np.prod(shape)) and len(shape) == 1:
                arr = arr.reshape(shape)
            else:
                raise ModelFileError(f"{path}: tensor {name!r} has shape {arr.shape}, "
                                     f"expected {tuple(shape)}")
        return arr

    def cast(a):
        return np.ascontiguousarray(a).astype(dtype, copy=False)

    def norm(name, shape):
        # llama.cpp's Gemma converter stores norm weights + 1; the model adds the 1 back
        w = get(name, shape)
        return cast(w - np.float32(1.0) if gemma else w)

    out: dict = {"embed": {"embedding": cast(get("token_embd.weight", (cfg.vocab_size, H)))},
                 "norm": {"weight": norm("output_norm.weight", (H,))}}
    if not cfg.tie_embeddings:
        out["lm_head"] = {"kernel": cast(get("output.weight", (cfg.vocab_size, H)).T)}
    layers = {}
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        wq = get(p + "attn_q.weight", (nh * D, H))
        wk = get(p + "attn_k.weight", (nkv * D, H))
        if permute:
            wq, wk = reverse_permute(wq, nh), reverse_permute(wk, nkv)
        attn = {
            "q_proj": {"kernel": cast(wq.T)},
            "k_proj": {"kernel": cast(wk.T)},
            "v_proj": {"kernel": cast(get(p + "attn_v.weight", (nkv * D, H)).T)},
            "o_proj": {"kernel": cast(get(p + "attn_output.weight", (H, nh * D)).T)},
        }
        if cfg.attention_bias:
            bq = get(p + "attn_q.bias", (nh * D,))
            bk = get(p + "attn_k.bias", (nkv * D,))
            if permute:
                bq, bk = reverse_permute(bq, nh), reverse_permute(bk, nkv)
            attn["q_proj"]["bias"] = cast(bq)
            attn["k_proj"]["bias"] = cast(bk)
            attn["v_proj"]["bias"] = cast(get(p + "attn_v.bias", (nkv * D,)))
        if cfg.qk_norm:
            attn["q_norm"] = {"weight": norm(p + "attn_q_norm.weight", (D,))}
            attn["k_norm"] = {"weight": norm(p + "attn_k_norm.weight", (D,))}
        layers[i] = {
            "attn_norm": {"weight": norm(p + "attn_norm.weight", (H,))},
            "attn": attn,
            "mlp_norm": {"weight": norm(p + "ffn_norm.weight", (H,))},
            "mlp": {
                "gate_proj": {"kernel": cast(get(p + "ffn_gate.weight", (F, H)).T)},
                "up_proj": {"kernel": cast(get(p + "ffn_up.weight", (F, H)).T)},
                "down_proj": {"kernel": cast(get(p + "ffn_down.weight", (H, F)).T)},
            },
        }
        if cfg.post_norms:
            layers[i]["post_attn_norm"] = {"weight": norm(p + "post_attention_norm.weight", (H,))}
            layers[i]["post_mlp_norm"] = {"weight": norm(p + "post_ffw_norm.weight", (H,))}
    out["layers"] = layers
    return out


def load_gguf(path: str | os.PathLike | None = None, dtype=np.float32, reader=None
              ) -> tuple[LlamaConfig, dict]:
    """Read a Llama-family GGUF file.

    Args:
      path: the ``.gguf`` file; ``None`` = the default model
        (:func:`jaxcd.model_files.default_gguf_path`).
      dtype: numpy dtype of the returned weights (float32 by default; de-quantisation
        is always done in float32 first).
      reader: an open ``gguf.GGUFReader`` of the same file, to avoid building a second
        one (it parses every metadata string: about a minute for Gemma's 262k tokens).

    Returns:
      ``(config, params)`` where ``params`` is a nested dict of numpy arrays, per layer
      (:meth:`jaxcd.lm.llama.JaxLM.params_from_pure_dict` stacks the layers into the
      layout of :class:`jaxcd.lm.llama.LlamaModel`):
      ``embed.embedding [V, H]``, ``layers[i].attn.{q,k,v,o}_proj.kernel [in, out]``,
      ``layers[i].mlp.{gate,up,down}_proj.kernel``, ``layers[i].{attn,mlp}_norm.weight
      [H]``, ``norm.weight [H]`` and, when not tied, ``lm_head.kernel [H, V]``.

    Raises:
      ModelFileError: missing / non-GGUF / corrupt file, unsupported architecture or
        quantisation, missing tensors or wrong shapes.
    """
    from ..model_files import resolve_gguf

    p = resolve_gguf(path)
    reader = _open_reader(p) if reader is None else reader   # building one takes seconds
    cfg = read_config(reader, p)                             # (a minute for 262k tokens)
    tensors = {t.name: t for t in reader.tensors}
    params = _pure_dict_from_tensors(cfg, tensors, p, dtype)
    return cfg, params


def read_gguf_config(path: str | os.PathLike | None = None) -> LlamaConfig:
    """Only the hyper-parameters of a GGUF file (cheap: tensors are memory-mapped)."""
    from ..model_files import resolve_gguf

    p = resolve_gguf(path)
    return read_config(_open_reader(p), p)
