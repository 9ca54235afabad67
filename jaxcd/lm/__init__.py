"""Language models behind one interface (see :mod:`jaxcd.lm.interface`)."""

from .interface import LanguageModel, TableLM, pad_prompts

__all__ = ["LanguageModel", "TableLM", "pad_prompts"]
