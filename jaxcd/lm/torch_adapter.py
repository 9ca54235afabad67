"""A ``transformers`` PyTorch causal LM behind the :mod:`jaxcd.lm.interface` API.

:class:`TorchLM` lets the decoders run with a PyTorch model (for comparisons and as a
reference). It is a **host-side** adapter: ``prefill``/``step`` call PyTorch eagerly, so
they are NOT traceable and cannot be used inside ``jax.jit``/``lax.scan``; use them from a
Python loop (decoders that are themselves jitted need :class:`jaxcd.lm.llama.JaxLM`).

State (every leaf a numpy array with the batch axis first, so
``jax.tree.map(lambda x: x[ancestors], state)`` reorders it)::

    k, v:            [B, L, n_kv, T, D]  the L layers' keys / values, stacked like
                     JaxLM's cache (layer axis second; T = tokens so far, grows)
    attention_mask:  int64 [B, T]    1 = real token, 0 = left padding
    next_pos:        int64 [B]       position of the next token (0-based, padding excluded)

Each call rebuilds a ``DynamicCache`` from the arrays (a contiguous copy of each
layer's slice, wrapped by ``torch.from_numpy``; the cache then concatenates, as in
transformers' own generation loop). ``params`` is
ignored (the weights live in the torch module); pass ``lm.params`` (``None``).
Log-probabilities are returned as float32 ``jax.Array`` ``[B, V]``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import jax.numpy as jnp

from ..errors import ModelFileError


def load_hf_model_from_gguf(path: str | os.PathLike | None = None, dtype=None):
    """transformers' PyTorch model for a GGUF file, de-quantised by transformers itself.

    Uses ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)`` when ``accelerate``
    is installed (transformers requires it there); otherwise builds the model from
    ``AutoConfig`` and loads the tensors with transformers' own GGUF converter
    (``load_gguf_checkpoint``, which also undoes llama.cpp's Q/K permutation) — the
    same weights either way. Never touches the network (set ``HF_HUB_OFFLINE=1``).
    """
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    from ..model_files import resolve_gguf

    dtype = torch.float32 if dtype is None else dtype
    p = resolve_gguf(path)
    try:
        with _reuse_gguf_reader():
            if importlib.util.find_spec("accelerate") is not None:
                model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                             dtype=dtype)
            else:
                model = _load_without_accelerate(p, dtype)
    except ModelFileError:
        raise
    except Exception as e:
        raise ModelFileError(f"{p}: transformers could not load the GGUF model "
                             f"({type(e).__name__}: {e})") from e
    return model.eval()


def _load_without_accelerate(p: Path, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
    try:  # skip the random initialisation: every weight is overwritten below
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tensors = load_gguf_checkpoint(str(p), return_tensors=True, model_to_load=model,
                                   torch_dtype=dtype)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ModelFileError(f"{p}: transformers could not map tensors "
                             f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    model.tie_weights()
    return model


@contextlib.contextmanager
def _reuse_gguf_reader():
    """transformers opens the GGUF twice (config, then tensors) and each
    ``gguf.GGUFReader`` re-parses the whole vocabulary (seconds); its weight-name map
    also builds ``gguf.get_tensor_name_map(arch, n_blocks)`` once per sub-module (about
    400 times for a 30-layer model, most of the load's time). Within this block, readers
    are memoised per path and name maps per ``(arch, n_blocks)`` (they are read-only
    lookup tables). Restores both ``gguf`` attributes afterwards."""
    import gguf

    from .gguf_weights import _reader_class

    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}
    maps: dict = {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = _reader_class()(path, *args, **kwargs)
        return readers[key]

    def name_map(arch, n_blocks):
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = original_map(arch, n_blocks)
        return maps[arch, n_blocks]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = original_reader, original_map


class TorchLM:
    """Host-side adapter of a ``transformers`` causal LM (see module docstring).

    Hashable by identity. ``vocab_size`` is the width of the model's logits;
    ``eos_token_id`` from the model config unless given.
    """

    def __init__(self, model, eos_token_id: int | None = None, pad_token_id: int | None = None):
        import torch

        self.model = model.eval()
        cfg = model.config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        eos = cfg.eos_token_id if eos_token_id is None else eos_token_id
        if isinstance(eos, (list, tuple)):
            eos = eos[0]
        self.eos_token_id = int(eos) if eos is not None else -1
        pad = cfg.pad_token_id if pad_token_id is None else pad_token_id
        self.pad_token_id = int(pad) if pad is not None else 0
        self.params = None
        self._device = next(model.parameters()).device
        self._torch = torch

    @classmethod
    def from_gguf(cls, path: str | os.PathLike | None = None, dtype=None) -> "TorchLM":
        """Load the GGUF (``None`` = default model) with transformers, float32 by default."""
        return cls(load_hf_model_from_gguf(path, dtype))

    def __repr__(self):
        return f"TorchLM({type(self.model).__name__}, V={self.vocab_size})"

    # -- helpers ----------------------------------------------------------------------
    def _run(self, input_ids, attention_mask, position_ids, cache):
        torch = self._torch
        with torch.inference_mode():
            out = self.model(input_ids=input_ids.to(self._device),
                             attention_mask=attention_mask.to(self._device),
                             position_ids=position_ids.to(self._device),
                             past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1].float()
        logprobs = torch.log_softmax(logits, dim=-1).cpu().numpy()
        cache = out.past_key_values
        ks = np.stack([layer.keys.cpu().numpy() for layer in cache.layers], axis=1)
        vs = np.stack([layer.values.cpu().numpy() for layer in cache.layers], axis=1)
        return ks, vs, jnp.asarray(logprobs, dtype=jnp.float32)

    # -- the interface ------------------------------------------------------------------
    def prefill(self, params: Any, prompt_ids, prompt_lengths, max_len: int):
        """``prompt_ids`` int ``[B, P]`` left-padded, ``prompt_lengths`` ``[B]``.
        Returns ``(state, logprobs [B, V])``. ``max_len`` is only checked (``>= P``)."""
        from transformers import DynamicCache

        torch = self._torch
        ids = np.asarray(prompt_ids).astype(np.int64)
        lens = np.asarray(prompt_lengths).astype(np.int64)
        if ids.ndim != 2 or lens.shape != (ids.shape[0],):
            raise ValueError(f"prompt_ids must be [B, P] and prompt_lengths [B]; got "
                             f"{ids.shape} and {lens.shape}")
        B, P = ids.shape
        if max_len < P:
            raise ValueError(f"max_len={max_len} is smaller than the prompt length {P}")
        if lens.min() < 1 or lens.max() > P:
            raise ValueError(f"prompt_lengths must be in [1, {P}], got {lens.tolist()}")
        mask = (np.arange(P)[None, :] >= (P - lens)[:, None]).astype(np.int64)
        pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        ks, vs, lp = self._run(torch.from_numpy(ids), torch.from_numpy(mask),
                               torch.from_numpy(pos), DynamicCache())
        state = {"k": ks, "v": vs, "attention_mask": mask, "next_pos": lens.copy()}
        return state, lp

    def step(self, params: Any, state: dict, tokens):
        """Append ``tokens`` ``[B]``; returns ``(state', logprobs [B, V])``. The input
        state is not modified."""
        from transformers import DynamicCache

        torch = self._torch
        tok = np.asarray(tokens).astype(np.int64).reshape(-1, 1)
        mask = np.concatenate([np.asarray(state["attention_mask"]),
                               np.ones((tok.shape[0], 1), np.int64)], axis=1)
        pos = np.asarray(state["next_pos"]).astype(np.int64)
        ks, vs = np.asarray(state["k"]), np.asarray(state["v"])     # [B, L, n_kv, T, D]
        cache = DynamicCache([(torch.from_numpy(np.ascontiguousarray(ks[:, l])),
                               torch.from_numpy(np.ascontiguousarray(vs[:, l])))
                              for l in range(ks.shape[1])])
        ks, vs, lp = self._run(torch.from_numpy(tok), torch.from_numpy(mask),
                               torch.from_numpy(pos[:, None]), cache)
        return {"k": ks, "v": vs, "attention_mask": mask, "next_pos": pos + 1}, lp
