"""Bit-packed token sets (NumPy): a set of tokens of a vocabulary of size ``V`` is
uint32 ``[..., ceil(V / 32)]``, token ``v`` being bit ``v % 32`` of word ``v // 32``
(little-endian). The mask rows of :class:`~jaxcd.automata.tensorized.TensorizedAutomaton`
(``cum_masks``) and the bulk label rows of lifting use this layout."""

from __future__ import annotations

import numpy as np


def unpack_bits(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """uint32 ``[..., W]`` -> bool ``[..., vocab_size]`` (little-endian bit order)."""
    words = np.ascontiguousarray(words, dtype="<u4")
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


def pack_bits(mask: np.ndarray) -> np.ndarray:
    """bool ``[..., V]`` -> uint32 ``[..., ceil(V/32)]``."""
    mask = np.asarray(mask, bool)
    V = mask.shape[-1]
    W = (V + 31) // 32
    pad = np.zeros(mask.shape[:-1] + (W * 32 - V,), bool)
    packed = np.packbits(np.concatenate([mask, pad], -1), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4").astype(np.uint32)
