"""Loading a model from any source: a GGUF file, a Hugging Face checkpoint folder or a
model name; dtypes, memory checks and tensor-parallel sharding.

:func:`load_lm` is the one loader: :func:`jaxcd.load_model` calls it, and so does code
that needs only the LM (``load_lm(path, tokenizer=False)``). See docs/models.md.

Dtypes. ``dtype=None`` picks bfloat16 on GPU and TPU (weights, activations and KV cache
in bf16; RMSNorm, softmax, attention scores and log-probabilities in float32, matmuls
accumulating in float32) and float32 on CPU, where bf16 matmuls are slow.

Memory. Before any weight is converted, :func:`~jaxcd.lm.memory.estimate_memory` counts the weights
(``num_params`` x dtype size) and :func:`~jaxcd.lm.memory.check_memory` refuses with the figures when
they exceed the available memory (device memory on GPU/TPU, per device of the mesh's
``model`` axis; ``MemAvailable`` on CPU, where loading holds a host copy and the device
copy at once). ``JAXCD_MEMORY_LIMIT_GB`` overrides the available figure. The KV cache
is checked the same way when it is allocated (:meth:`jaxcd.lm.llama.JaxLM.prefill`).

Sharding. With ``mesh=`` (a ``jax.sharding.Mesh`` with a ``model`` axis), weights are
placed tensor-parallel: Q/K/V projections and the MLP's gate/up split their output
columns (attention heads, MLP hidden units), O and down projections their input rows,
the embedding and the LM head the vocabulary; norms and anything not divisible by the
axis size are replicated. jit's sharding propagation does the rest (the results are
those of one device, up to float summation order). Prompt rows / particles go on the
mesh's ``data`` axis when the caller places the inputs there
(:func:`data_sharding`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import ModelFileError
from .memory import check_memory, estimate_memory


def default_dtype(backend: str | None = None) -> str:
    """``"bfloat16"`` on GPU/TPU, ``"float32"`` on CPU (read when loading, not tracing)."""
    import jax

    backend = backend or jax.default_backend()
    return "float32" if backend == "cpu" else "bfloat16"


# ----------------------------------------------------------------------------- sharding
def _spec_for(path: tuple, shape: tuple, axis_size: int):
    """The ``PartitionSpec`` of one parameter (see the module docstring)."""
    from jax.sharding import PartitionSpec as P

    names = [str(p) for p in path]
    leaf, mod = names[-1], names[-2] if len(names) > 1 else ""
    dim = None
    if mod == "embed":
        dim = 0                                         # [V, H]: vocabulary
    elif mod == "lm_head":
        dim = 1                                         # [H, V]
    elif mod in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        dim = len(shape) - 1                            # output columns (heads / hidden)
    elif mod in ("o_proj", "down_proj") and leaf == "kernel":
        dim = len(shape) - 2                            # input rows
    if dim is None or shape[dim] % axis_size:
        return P()
    spec = [None] * len(shape)
    spec[dim] = "model"
    return P(*spec)


def shard_params(params, mesh):
    """``params`` (an ``nnx.State``) placed on ``mesh`` tensor-parallel over its
    ``model`` axis (replicated over the others)."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding

    if "model" not in mesh.axis_names:
        raise ValueError(f"mesh axes {mesh.axis_names} have no 'model' axis")
    n = mesh.shape["model"]
    pure = nnx.to_pure_dict(params)
    flat = dict(nnx.traversals.flatten_mapping(pure))
    placed = {k: jax.device_put(v, NamedSharding(mesh, _spec_for(k, tuple(v.shape), n)))
              for k, v in flat.items()}
    state = jax.tree.map(lambda x: x, params)
    nnx.replace_by_pure_dict(state, nnx.traversals.unflatten_mapping(placed))
    return state


def data_sharding(mesh):
    """A ``NamedSharding`` that splits the first (row) axis over the mesh's ``data``
    axis (replicated when it has none): for prompt ids ``[B, P]`` and the like."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    return NamedSharding(mesh, P("data") if "data" in mesh.axis_names else P())


# ----------------------------------------------------------------------------- loading
def model_kind(path) -> str:
    """``"default"``, ``"name"``, ``"hf"`` or ``"gguf"`` for a :func:`load_lm` argument."""
    from ..model_files import DEFAULT_MODEL_NAMES, NAMED_MODELS
    from .hf_checkpoint import is_hf_folder

    if path is None:
        return "default"
    p = Path(path)
    if p.is_dir():
        if is_hf_folder(p):
            return "hf"
        raise ModelFileError(f"{p} is a folder without config.json (not a Hugging Face "
                             "checkpoint folder)")
    if not p.exists() and (str(path) in NAMED_MODELS or str(path) in DEFAULT_MODEL_NAMES):
        return "name"
    return "gguf"


class LoadedLM(NamedTuple):
    """What :func:`load_lm` returns: the LM (architecture and config), its weights,
    the tokenizer and vocabulary (``None`` with ``tokenizer=False``) and the file or
    folder the model came from."""

    lm: Any
    params: Any
    tokenizer: Any
    vocab: Any
    path: str


def load_lm(path=None, *, dtype=None, mesh=None, attn_block: int | None = 128,
            tokenizer: bool = True) -> LoadedLM:
    """Load a model from a GGUF file, a Hugging Face folder, a model name or ``None``
    (the default model, SmolLM2-135M-Instruct).

    Args:
      path: a ``.gguf`` file, a Hugging Face checkpoint folder (``config.json`` +
        safetensors + ``tokenizer.json``), a name of :data:`jaxcd.model_files.NAMED_MODELS`
        or ``None``.
      dtype: weights, activations and KV cache; ``None`` = :func:`default_dtype`
        (float32 on CPU, bfloat16 on GPU/TPU).
      mesh: a ``jax.sharding.Mesh`` with a ``model`` axis: weights placed tensor-parallel
        (:func:`shard_params`).
      attn_block: the LM's attention block (:class:`~jaxcd.lm.llama.JaxLM`).
      tokenizer: also load the tokenizer and build the vocabulary. A Hugging Face
        folder's tokenizer is read either way (it names the EOS token when
        ``config.json`` does not).

    Before any weight is converted the weights' memory is checked
    (:func:`~jaxcd.lm.memory.check_memory`). Raises :class:`~jaxcd.errors.ModelFileError`
    for a missing or malformed file and for weights that will not fit.
    """
    import jax.numpy as jnp

    from ..model_files import resolve_gguf
    from .llama import JaxLM, _np_dtype

    dtype = jnp.dtype(dtype or default_dtype())
    kind = model_kind(path)
    shards = mesh.shape["model"] if mesh is not None and "model" in mesh.axis_names else 1
    device = None if mesh is None else mesh.devices.flat[0]
    matmul = "xla" if mesh is not None else "auto"
    tok = None
    if kind == "hf":
        from .hf_checkpoint import load_hf_tokenizer, load_hf_weights, read_hf_config

        folder = Path(path)
        cfg = read_hf_config(folder)
        tok = load_hf_tokenizer(folder)
        eos = tok.eos_token_id if tok.eos_token_id is not None else cfg.eos_token_id
        if eos is None or eos < 0:
            raise ModelFileError(f"{folder}: neither the tokenizer nor config.json names an "
                                 "EOS token")
        changes: dict[str, Any] = {"eos_token_id": int(eos)}
        if cfg.bos_token_id < 0 and tok.bos_token_id is not None:
            changes["bos_token_id"] = int(tok.bos_token_id)
        if cfg.pad_token_id < 0 and tok.pad_token_id is not None:
            changes["pad_token_id"] = int(tok.pad_token_id)
        cfg = dataclasses.replace(cfg, **changes)
        _check_load(cfg, dtype, device, shards, folder)
        lm = JaxLM(cfg, dtype=dtype, attn_block=attn_block, matmul=matmul)
        params = lm.params_from_pure_dict(load_hf_weights(folder, cfg, _np_dtype(dtype)))
        where = str(folder)
    else:
        from .gguf_weights import _open_reader, load_gguf, read_config

        p = resolve_gguf(path)
        reader = _open_reader(p)          # once: gguf's reader is slow on big vocabularies
        _check_load(read_config(reader, p), dtype, device, shards, p)
        if tokenizer:
            from ..tokenizer import load_tokenizer

            tok = load_tokenizer(p)
        cfg, pure = load_gguf(p, dtype=np.float32, reader=reader)
        del reader
        lm = JaxLM(cfg, dtype=dtype, attn_block=attn_block, matmul=matmul)
        params = lm.params_from_pure_dict(pure)
        del pure
        where = str(p)
    if mesh is not None:
        params = shard_params(params, mesh)
    vocab = None
    if tokenizer:
        from ..vocab import Vocabulary

        vocab = Vocabulary.from_tokenizer(tok, eos_id=lm.eos_token_id,
                                          vocab_size=max(lm.vocab_size, len(tok)))
    else:
        tok = None
    return LoadedLM(lm, params, tok, vocab, where)


def _check_load(cfg, dtype, device, shards, where) -> None:
    import jax

    est = estimate_memory(cfg, dtype)["weights"]
    on_cpu = (device.platform if device is not None else jax.default_backend()) == "cpu"
    # on CPU the host copy (float32 for GGUF de-quantisation) and the device copy coexist
    need = est + (cfg.num_params * 4 if on_cpu else 0)
    check_memory(f"{where}: the weights ({cfg.num_params / 1e6:.0f}M parameters in "
                 f"{np.dtype(dtype).name if not hasattr(dtype, 'name') else dtype.name})",
                 need, device, shards=1 if on_cpu else shards)
