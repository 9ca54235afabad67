"""Reading Hugging Face checkpoint folders (``config.json`` + safetensors), no torch.

A folder as written by ``transformers``' ``save_pretrained``::

    config.json                       hyper-parameters (``model_type`` picks the family)
    model.safetensors                 the weights, or
    model-0000k-of-0000n.safetensors + model.safetensors.index.json  (shards)
    tokenizer.json, tokenizer_config.json (chat template), generation_config.json

:func:`read_hf_config` maps ``config.json`` to :class:`~jaxcd.lm.gguf_weights.LlamaConfig`
for the families below; anything this module does not implement (another
``model_type``, a RoPE scaling type, a bias, an activation, partial rotary embeddings,
a quantisation config, ...) is a :class:`~jaxcd.errors.ModelFileError` naming the field,
never a silent difference.

=============  ================================================================
``llama``      RoPE scaling ``linear``, ``llama3``, ``yarn``; ``attention_bias``
               (Q/K/V/O biases)
``mistral``    sliding window over all layers (``sliding_window``)
``qwen2``      Q/K/V biases, tied embeddings, sliding layers (``use_sliding_window``)
``qwen3``      per-head RMSNorm of queries and keys (``q_norm``/``k_norm``)
``gemma3_text`` embeddings times √H, ``(1 + w)`` RMSNorms, q/k norms, four norms per
               block, GeGLU (tanh GELU), ``sliding_attention`` / ``full_attention``
               layers with their own RoPE bases, ``query_pre_attn_scalar``, attention
               and final-logit soft-capping
=============  ================================================================

Weights are read lazily, one shard at a time: tensors are memory-mapped from each file
(``safetensors.safe_open(framework="numpy")``; bfloat16 tensors, which numpy cannot
represent, through a memory map of the same file with ``ml_dtypes.bfloat16``), converted
to the target dtype and copied into preallocated per-layer-stacked arrays, so the peak
host memory is the converted weights plus one tensor.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..errors import ModelFileError
from .gguf_weights import ROPE_TYPES, LlamaConfig

#: ``model_type`` values this loader understands.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")

_LOCAL, _GLOBAL = "sliding_attention", "full_attention"


def is_hf_folder(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def _hashable(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _rope(params: dict | None, where: str, what: str) -> tuple[float | None, tuple | None]:
    """``(theta, scaling)`` from a rope dict (``rope_type`` / ``type`` and its fields);
    ``scaling`` is ``None`` for the default type."""
    if not params:
        return None, None
    params = dict(params)
    theta = params.pop("rope_theta", None)
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ROPE_TYPES:
        raise ModelFileError(f"{where}: {what} RoPE type {kind!r} is not supported "
                             f"(supported: {', '.join(ROPE_TYPES)})")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelFileError(f"{where}: partial_rotary_factor="
                             f"{params['partial_rotary_factor']} (partial rotary embeddings) "
                             "is not supported")
    params.pop("partial_rotary_factor", None)
    if kind == "default":
        return theta, None
    params["rope_type"] = kind
    params.pop("type", None)
    need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings"),
            "yarn": ()}[kind]
    missing = [k for k in need if params.get(k) is None]
    if missing:
        raise ModelFileError(f"{where}: {what} RoPE scaling {kind!r} lacks {missing}")
    return theta, _hashable(params)


def read_hf_config(folder: str | os.PathLike) -> LlamaConfig:
    """:class:`LlamaConfig` from a checkpoint folder's ``config.json`` (see the module
    docstring for the families). Raises :class:`ModelFileError` for anything else."""
    folder = Path(folder)
    where = str(folder / "config.json")
    try:
        d = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ModelFileError(f"{folder}: no config.json (not a Hugging Face checkpoint folder)") from e
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{where}: cannot read ({type(e).__name__}: {e})") from e
    return config_from_dict(d, where, folder)


def config_from_dict(d: dict, where: str = "config.json", folder: Path | None = None
                     ) -> LlamaConfig:
    mt = d.get("model_type")
    if mt == "gemma3" and isinstance(d.get("text_config"), dict):
        raise ModelFileError(
            f"{where}: model_type 'gemma3' is the multimodal Gemma 3 "
            "(Gemma3ForConditionalGeneration); only the text-only 'gemma3_text' "
            "checkpoints are supported")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ModelFileError(f"{where}: unsupported model_type {mt!r} "
                             f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    gemma = mt == "gemma3_text"

    def bad(field, value, why="is not supported"):
        raise ModelFileError(f"{where}: {field}={value!r} {why}")

    if d.get("quantization_config"):
        bad("quantization_config", (d["quantization_config"] or {}).get("quant_method", "?"),
            "(quantised checkpoints are not supported; use a float checkpoint or a GGUF)")
    if d.get("mlp_bias"):
        bad("mlp_bias", True)
    if float(d.get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
        bad("partial_rotary_factor", d["partial_rotary_factor"], "(partial rotary embeddings) "
            "is not supported")
    if d.get("attention_chunk_size"):
        bad("attention_chunk_size", d["attention_chunk_size"])
    if d.get("use_bidirectional_attention"):
        bad("use_bidirectional_attention", True)
    if gemma and d.get("attn_logit_softcapping"):
        # transformers' Gemma3Attention stores it but never applies it (Gemma 2 did):
        # which of the two the checkpoint means is ambiguous, so refuse
        bad("attn_logit_softcapping", d["attn_logit_softcapping"],
            "is not supported for gemma3_text (transformers' Gemma 3 ignores it; "
            "set it to null)")
    act = d.get("hidden_activation") if gemma else d.get("hidden_act", "silu")
    if gemma:
        act = act or d.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            bad("hidden_activation", act, "is not supported (only gelu_pytorch_tanh)")
    elif act != "silu":
        bad("hidden_act", act, "is not supported (only silu)")
    for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
              "vocab_size"):
        if not isinstance(d.get(k), int):
            raise ModelFileError(f"{where}: {k} is missing or not an integer")
    L, H, nh = d["num_hidden_layers"], d["hidden_size"], d["num_attention_heads"]
    nkv = d.get("num_key_value_heads") or nh
    D = d.get("head_dim") or H // nh
    max_pos = int(d.get("max_position_embeddings") or 2048)

    # --- RoPE: "rope_parameters" (transformers 5) or rope_theta + rope_scaling (4.x)
    rp = d.get("rope_parameters")
    local_theta = local_scaling = None
    if isinstance(rp, dict) and (_GLOBAL in rp or _LOCAL in rp):
        theta, scaling = _rope(rp.get(_GLOBAL), where, "full_attention")
        local_theta, local_scaling = _rope(rp.get(_LOCAL), where, "sliding_attention")
    elif isinstance(rp, dict):
        theta, scaling = _rope(rp, where, "rope_parameters")
    else:
        theta = d.get("rope_theta")
        _, scaling = _rope(d.get("rope_scaling"), where, "rope_scaling")
        if gemma:
            local_theta = d.get("rope_local_base_freq", 10000.0)
    if theta is None:
        theta = d.get("rope_theta") or (1_000_000.0 if gemma else 10000.0)
    if gemma and local_theta is None:
        local_theta = d.get("rope_local_base_freq", 10000.0)

    # --- sliding windows
    window = d.get("sliding_window")
    layer_types = d.get("layer_types")
    if mt == "llama":
        window, sliding = None, None
        if layer_types and any(t != _GLOBAL for t in layer_types):
            bad("layer_types", sorted(set(layer_types)), "for a llama model is not supported")
    elif mt == "mistral":        # MistralModel applies sliding_window to every layer
        sliding = (window is not None,) * L
    elif mt in ("qwen2", "qwen3"):
        if not d.get("use_sliding_window", False):
            window = None
        if layer_types is None:
            mwl = d.get("max_window_layers", L)
            layer_types = [_LOCAL if window is not None and i >= mwl else _GLOBAL
                           for i in range(L)]
        sliding = None
    else:                        # gemma3_text
        if layer_types is None:
            pattern = d.get("sliding_window_pattern", 6)
            layer_types = [_LOCAL if (i + 1) % pattern else _GLOBAL for i in range(L)]
        sliding = None
    if sliding is None and layer_types is not None:
        unknown = sorted(set(layer_types) - {_LOCAL, _GLOBAL})
        if unknown:
            bad("layer_types", unknown, "(attention types other than full_attention and "
                "sliding_attention) are not supported")
        if len(layer_types) != L:
            bad("layer_types", f"{len(layer_types)} entries", f"for {L} layers")
        sliding = tuple(t == _LOCAL for t in layer_types)
    if sliding is not None and any(sliding) and not window:
        bad("sliding_window", window, "with sliding_attention layers")
    if sliding is None or not any(sliding):
        sliding, window = None, None
    if not gemma or not any(sliding or ()):
        local_theta, local_scaling = None, None

    def tok(name):
        v = d.get(name)
        if isinstance(v, list):
            v = v[0] if v else None
        return int(v) if v is not None else -1

    tie = d.get("tie_word_embeddings")
    if tie is None:          # the config classes' defaults
        tie = gemma
    bias = bool(d.get("attention_bias", False))
    try:
        return LlamaConfig(
            arch=mt,
            vocab_size=int(d["vocab_size"]),
            hidden_size=H,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=L,
            num_heads=nh,
            num_kv_heads=int(nkv),
            head_dim=int(D),
            rope_theta=float(theta),
            rms_eps=float(d.get("rms_norm_eps", 1e-6)),
            context_length=max_pos,
            tie_embeddings=bool(tie),
            attention_bias=True if mt == "qwen2" else bias,
            o_bias=False if mt == "qwen2" else bias,
            rope_scaling=scaling,
            sliding_window=int(window) if window else None,
            layer_sliding=sliding,
            rope_local_theta=float(local_theta) if local_theta is not None else None,
            rope_local_scaling=local_scaling,
            qk_norm=mt in ("qwen3", "gemma3_text"),
            post_norms=gemma,
            norm_offset=1.0 if gemma else 0.0,
            mlp_activation="gelu_tanh" if gemma else "silu",
            embed_scale=math.sqrt(H) if gemma else None,
            query_scale=(float(d.get("query_pre_attn_scalar") or D) ** -0.5) if gemma else None,
            final_softcap=(float(d["final_logit_softcapping"]) if d.get("final_logit_softcapping")
                           else None),
            bos_token_id=tok("bos_token_id"),
            eos_token_id=tok("eos_token_id"),
            pad_token_id=tok("pad_token_id"),
        )
    except ValueError as e:
        raise ModelFileError(f"{where}: inconsistent hyper-parameters: {e}") from e


# ----------------------------------------------------------------------------- safetensors
class _Shard:
    """One ``.safetensors`` file: its header (names, dtypes, shapes, byte ranges) and
    lazy access to each tensor."""

    _NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64}

    def __init__(self, path: Path):
        self.path = path
        try:
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if not 0 < n < 1 << 30:
                    raise ValueError(f"header length {n}")
                header = json.loads(f.read(n))
        except (OSError, ValueError) as e:
            raise ModelFileError(f"{path}: not a readable safetensors file ({e})") from e
        header.pop("__metadata__", None)
        self.header, self.base = header, 8 + n
        self._handle = None

    def names(self):
        return list(self.header)

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        dt, shape = info["dtype"], tuple(info["shape"])
        if dt in self._NP:
            if self._handle is None:
                from safetensors import safe_open

                self._handle = safe_open(str(self.path), framework="numpy")
            return self._handle.get_tensor(name)
        if dt == "BF16":   # numpy has no bfloat16: map the bytes as ml_dtypes.bfloat16
            import ml_dtypes

            start, end = info["data_offsets"]
            if end - start != 2 * int(np.prod(shape, dtype=np.int64)):
                raise ModelFileError(f"{self.path}: tensor {name!r} has a wrong byte size")
            return np.memmap(self.path, dtype=ml_dtypes.bfloat16, mode="r",
                             offset=self.base + start, shape=shape)
        raise ModelFileError(f"{self.path}: tensor {name!r} has dtype {dt}, which is not "
                             "supported (F32, F16, BF16)")


def _shards(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelFileError(f"{index}: cannot read the weight map ({e})") from e
        files = sorted(set(wm.values()))
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise ModelFileError(f"{folder}: shards {missing} listed in {index.name} are missing")
        return [folder / f for f in files]
    if single.is_file():
        return [single]
    if list(folder.glob("*.bin")) or list(folder.glob("*.pt")):
        raise ModelFileError(f"{folder}: only PyTorch .bin weights; jaxcd reads safetensors "
                             "(convert with save_pretrained(..., safe_serialization=True))")
    raise ModelFileError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def _hf_names(cfg: LlamaConfig) -> dict[str, tuple[tuple, bool, tuple]]:
    """HF tensor name (without the ``model.`` prefix, ``{i}`` for the layer) ->
    (our parameter path, transpose?, HF shape)."""
    H, F, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv = cfg.num_heads, cfg.num_kv_heads
    gemma = cfg.post_norms
    m = {
        "self_attn.q_proj.weight": (("attn", "q_proj", "kernel"), True, (nh * D, H)),
        "self_attn.k_proj.weight": (("attn", "k_proj", "kernel"), True, (nkv * D, H)),
        "self_attn.v_proj.weight": (("attn", "v_proj", "kernel"), True, (nkv * D, H)),
        "self_attn.o_proj.weight": (("attn", "o_proj", "kernel"), True, (H, nh * D)),
        "mlp.gate_proj.weight": (("mlp", "gate_proj", "kernel"), True, (F, H)),
        "mlp.up_proj.weight": (("mlp", "up_proj", "kernel"), True, (F, H)),
        "mlp.down_proj.weight": (("mlp", "down_proj", "kernel"), True, (H, F)),
        "input_layernorm.weight": (("attn_norm", "weight"), False, (H,)),
    }
    if gemma:
        m["post_attention_layernorm.weight"] = (("post_attn_norm", "weight"), False, (H,))
        m["pre_feedforward_layernorm.weight"] = (("mlp_norm", "weight"), False, (H,))
        m["post_feedforward_layernorm.weight"] = (("post_mlp_norm", "weight"), False, (H,))
    else:
        m["post_attention_layernorm.weight"] = (("mlp_norm", "weight"), False, (H,))
    if cfg.attention_bias:
        m["self_attn.q_proj.bias"] = (("attn", "q_proj", "bias"), False, (nh * D,))
        m["self_attn.k_proj.bias"] = (("attn", "k_proj", "bias"), False, (nkv * D,))
        m["self_attn.v_proj.bias"] = (("attn", "v_proj", "bias"), False, (nkv * D,))
    if cfg.o_bias:
        m["self_attn.o_proj.bias"] = (("attn", "o_proj", "bias"), False, (H,))
    if cfg.qk_norm:
        m["self_attn.q_norm.weight"] = (("attn", "q_norm", "weight"), False, (D,))
        m["self_attn.k_norm.weight"] = (("attn", "k_norm", "weight"), False, (D,))
    return m


def load_hf_weights(folder: str | os.PathLike, cfg: LlamaConfig, dtype=np.float32) -> dict:
    """The weights of a checkpoint folder as the nested dict
    :meth:`jaxcd.lm.llama.JaxLM.params_from_pure_dict` takes, layers stacked (every
    ``layers`` leaf ``[L, ...]``), in numpy ``dtype`` (``np.float32``,
    ``np.float16`` or ``ml_dtypes.bfloat16``). Reads one shard at a time."""
    folder = Path(folder)
    L, H, V = cfg.num_layers, cfg.hidden_size, cfg.vocab_size
    per_layer = _hf_names(cfg)
    top = {"embed_tokens.weight": (("embed", "embedding"), False, (V, H)),
           "norm.weight": (("norm", "weight"), False, (H,))}
    out: dict = {}
    stacked: dict = {}
    seen: set = set()

    def put(tree, path, value):
        for k in path[:-1]:
            tree = tree.setdefault(k, {})
        tree[path[-1]] = value

    def convert(a, transpose):
        a = np.asarray(a)
        if transpose:
            a = a.T
        return np.ascontiguousarray(a).astype(dtype, copy=False)

    unexpected = []
    for shard_path in _shards(folder):
        shard = _Shard(shard_path)
        for name in shard.names():
            key = name
            for prefix in ("model.language_model.", "language_model.model.", "model."):
                if key.startswith(prefix):
                    key = key[len(prefix):]
                    break
            if name == "lm_head.weight":
                if cfg.tie_embeddings:
                    seen.add(name)
                    continue
                spec = (("lm_head", "kernel"), True, (V, H))
            elif key in top:
                spec = top[key]
            elif key.startswith("layers."):
                _, i, rest = key.split(".", 2)
                spec = per_layer.get(rest)
                if rest.endswith("rotary_emb.inv_freq"):
                    continue
                if spec is None or not i.isdigit() or int(i) >= L:
                    unexpected.append(name)
                    continue
            elif key.endswith("rotary_emb.inv_freq"):
                continue
            else:
                unexpected.append(name)
                continue
            path, transpose, shape = spec
            arr = shard.get(name)
            if tuple(arr.shape) != shape:
                raise ModelFileError(f"{shard_path}: tensor {name!r} has shape "
                                     f"{tuple(arr.shape)}, expected {shape}")
            if key.startswith("layers."):
                i = int(key.split(".")[1])
                buf = stacked.get(path)
                if buf is None:
                    tshape = shape[::-1] if transpose else shape
                    buf = stacked[path] = np.empty((L,) + tshape, dtype)
                buf[i] = arr.T if transpose else arr
                seen.add(("layers", i, path))
            else:
                put(out, path, convert(arr, transpose))
                seen.add(path)
        del shard
    if unexpected:
        raise ModelFileError(f"{folder}: tensors this loader does not know (an unsupported "
                             f"variant of {cfg.arch!r}?): {unexpected[:6]}"
                             + (" ..." if len(unexpected) > 6 else ""))
    need = [spec[0] for spec in top.values()]
    if not cfg.tie_embeddings:
        need.append(("lm_head", "kernel"))
    missing = [".".join(p) for p in need if p not in seen]
    missing += [f"layers.{i}.{'.'.join(spec[0])}" for spec in per_layer.values()
                for i in range(L) if ("layers", i, spec[0]) not in seen]
    if missing:
        raise ModelFileError(f"{folder}: missing tensors {missing[:6]}"
                             + (" ..." if len(missing) > 6 else ""))
    layers: dict = {}
    for path, buf in stacked.items():
        put(layers, path, buf)
    out["layers"] = layers
    return out


# ----------------------------------------------------------------------------- tokenizer
def load_hf_tokenizer(folder: str | os.PathLike):
    """The checkpoint's fast tokenizer (``tokenizer.json`` + ``tokenizer_config.json``,
    chat template included) as a ``transformers.PreTrainedTokenizerFast`` with
    ``local_files_only`` (no hub). Not through ``AutoTokenizer``: that imports
    transformers' configuration module, which imports torch when it is installed; the
    ``tokenizer_class`` named in ``tokenizer_config.json`` is not needed, as
    ``tokenizer.json`` fixes the normalizer, pre-tokenizer, model, post-processor and
    decoder."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise ModelFileError(f"{folder}: no tokenizer.json (jaxcd needs the fast tokenizer "
                             "file next to the weights)")
    try:
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise ModelFileError(f"{folder}: cannot load the tokenizer "
                             f"({type(e).__name__}: {e})") from e
    if not getattr(tok, "is_fast", False):
        raise ModelFileError(f"{folder}: the tokenizer is not a fast (tokenizers) tokenizer")
    return tok


def generation_eos_ids(folder: str | os.PathLike) -> list[int]:
    """``eos_token_id`` of ``generation_config.json`` (a list; empty when absent)."""
    p = Path(folder) / "generation_config.json"
    try:
        v = json.loads(p.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if v is None:
        return []
    return [int(x) for x in (v if isinstance(v, list) else [v])]
