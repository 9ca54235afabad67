"""Language models behind one interface (see :mod:`jaxcd.lm.interface`).

``JaxLM`` (Flax NNX Llama-family model loaded from GGUF, :mod:`jaxcd.lm.llama`) and
``TorchLM`` (host-side adapter of a transformers PyTorch model,
:mod:`jaxcd.lm.torch_adapter`) are imported lazily, on first attribute access.
"""

from .interface import LanguageModel, TableLM, pad_prompts

__all__ = ["LanguageModel", "TableLM", "pad_prompts", "JaxLM", "TorchLM", "LlamaConfig"]

_LAZY = {
    "JaxLM": ("jaxcd.lm.llama", "JaxLM"),
    "TorchLM": ("jaxcd.lm.torch_adapter", "TorchLM"),
    "LlamaConfig": ("jaxcd.lm.gguf_weights", "LlamaConfig"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxcd.lm' has no attribute {name!r}")
