"""The token vocabulary as byte strings (host side).

Every ordinary token ``v`` has an exact byte string ``bytes(v)``: for byte-level BPE
(GPT-2, Llama-3, SmolLM2, Qwen) the token text is mapped back through the
byte<->unicode table; for SentencePiece vocabularies ``▁`` is a space and byte
fallback tokens ``<0xNN>`` are the byte ``NN``. We never compare decoded Python
strings: a multi-byte UTF-8 character may be split across tokens.

Special tokens (BOS, chat markers, padding, ...) are never allowed under a
constraint. EOS is the one special token a constraint uses: it ends a generation.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Iterable, Sequence

import numpy as np

from .errors import VocabularyError


@lru_cache(maxsize=None)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _decoder_kind(tokenizer) -> str:
    """'byte_level' or 'sentencepiece', from the fast tokenizer's decoder config."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise VocabularyError(
            f"{type(tokenizer).__name__} is not a fast (Rust-backed) tokenizer; "
            "load it with use_fast=True")
    cfg = json.loads(backend.to_str())
    dec = json.dumps(cfg.get("decoder")) + json.dumps(cfg.get("pre_tokenizer"))
    if "ByteLevel" in dec:
        return "byte_level"
    if "ByteFallback" in dec or "Metaspace" in dec or "\u2581" in dec:
        return "sentencepiece"
    raise VocabularyError(
        "cannot tell how tokens map to bytes: the tokenizer's decoder is neither "
        f"ByteLevel nor SentencePiece-style ({cfg.get('decoder')!r})")


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """Byte strings of a tokenizer's tokens.

    Attributes:
      token_bytes: ``bytes`` of every token id (``b""`` for special tokens).
      is_special: bool ``[vocab_size]``; special tokens are never allowed by a
        constraint (EOS is special too, but is handled by the automaton's EOS edges).
      eos_id: the token that ends a generation.
      name: a human-readable identity (e.g. the tokenizer's name).
    """

    token_bytes: tuple[bytes, ...]
    is_special: np.ndarray
    eos_id: int
    name: str = "vocabulary"
    _extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        V = len(self.token_bytes)
        if V == 0:
            raise VocabularyError("empty vocabulary")
        if self.is_special.shape != (V,):
            raise VocabularyError(f"is_special must have shape ({V},), got {self.is_special.shape}")
        if not 0 <= self.eos_id < V:
            raise VocabularyError(f"eos_id {self.eos_id} is outside the vocabulary (size {V})")

    # -- constructors --------------------------------------------------------------------
    @classmethod
    def from_token_bytes(cls, token_bytes: Sequence[bytes], eos_id: int,
                         special_ids: Iterable[int] = (), name: str = "custom") -> "Vocabulary":
        """A vocabulary from explicit byte strings (``eos_id`` is made special)."""
        toks = [bytes(t) for t in token_bytes]
        special = np.zeros(len(toks), bool)
        for i in list(special_ids) + [eos_id]:
            if not 0 <= i < len(toks):
                raise VocabularyError(f"special id {i} is outside the vocabulary (size {len(toks)})")
            special[i] = True
        toks = [b"" if special[i] else t for i, t in enumerate(toks)]
        for i, t in enumerate(toks):
            if not special[i] and not t:
                raise VocabularyError(f"token {i} is empty but not special")
        return cls(tuple(toks), special, int(eos_id), name)

    @classmethod
    def from_tokenizer(cls, tokenizer, eos_id: int | None = None,
                       vocab_size: int | None = None) -> "Vocabulary":
        """Read the exact byte string of every token of a ``transformers`` fast tokenizer.

        Args:
          tokenizer: a ``PreTrainedTokenizerFast`` (byte-level BPE or SentencePiece).
          eos_id: the token that ends a generation (default ``tokenizer.eos_token_id``).
          vocab_size: pad to the model's logits size (extra ids are special) when the
            embedding matrix is larger than the tokenizer.
        """
        kind = _decoder_kind(tokenizer)
        n = len(tokenizer)
        V = n if vocab_size is None else int(vocab_size)
        if V < n:
            raise VocabularyError(f"vocab_size {V} is smaller than the tokenizer ({n} tokens)")
        eos = tokenizer.eos_token_id if eos_id is None else eos_id
        if eos is None:
            raise VocabularyError("the tokenizer has no EOS token; pass eos_id=")
        special = np.zeros(V, bool)
        special[n:] = True
        for i in tokenizer.all_special_ids:
            special[i] = True
        added = {}
        for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
            if tok.special:
                special[i] = True
            else:
                added[i] = tok.content
        special[eos] = True
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        u2b = _unicode_to_byte()
        out: list[bytes] = []
        for i, piece in enumerate(pieces):
            if special[i] or piece is None:
                out.append(b"")
                special[i] = True
                continue
            if i in added:
                out.append(added[i].encode("utf-8"))
            elif kind == "byte_level":
                try:
                    out.append(bytes(u2b[c] for c in piece))
                except KeyError:
                    out.append(piece.encode("utf-8"))
            else:
                m = _BYTE_FALLBACK.match(piece)
                out.append(bytes([int(m.group(1), 16)]) if m else
                           piece.replace("\u2581", " ").encode("utf-8"))
            if not out[-1]:
                special[i] = True
        out.extend(b"" for _ in range(V - n))
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        return cls(tuple(out), special, int(eos), str(name))

    # -- derived ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def __len__(self) -> int:
        return self.vocab_size

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the byte strings, the special set and EOS: the cache key."""
        h = hashlib.sha256()
        for t in self.token_bytes:
            h.update(len(t).to_bytes(4, "little"))
            h.update(t)
        h.update(np.packbits(self.is_special).tobytes())
        h.update(int(self.eos_id).to_bytes(8, "little"))
        return h.hexdigest()[:32]

    @cached_property
    def ordinary_ids(self) -> np.ndarray:
        """int32 ids of the non-special tokens."""
        return np.nonzero(~self.is_special)[0].astype(np.int32)

    @cached_property
    def byte_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """``(bytes uint8 [N, Lmax], lengths int32 [N])`` of :attr:`ordinary_ids`, padded."""
        ids = self.ordinary_ids
        lens = np.array([len(self.token_bytes[i]) for i in ids], np.int32)
        L = int(lens.max()) if len(lens) else 1
        mat = np.zeros((len(ids), L), np.uint8)
        flat = b"".join(self.token_bytes[i] for i in ids)
        buf = np.frombuffer(flat, np.uint8)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        for j in range(L):
            sel = lens > j
            mat[sel, j] = buf[starts[sel] + j]
        return mat, lens

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenated bytes of ordinary tokens (EOS and other specials are skipped)."""
        return b"".join(self.token_bytes[int(i)] for i in ids)
