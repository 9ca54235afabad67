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

    @cached_property
    def trie(self) -> "TokenTrie":
        """Byte trie of the ordinary tokens (for vectorised token lifting)."""
        return TokenTrie.build(self)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenated bytes of ordinary tokens (EOS and other specials are skipped)."""
        return b"".join(self.token_bytes[int(i)] for i in ids)


@dataclass(frozen=True, eq=False)
class TokenTrie:
    """Byte trie of the ordinary tokens, stored level by level as flat arrays.

    Nodes are numbered so that the nodes of depth ``j`` (prefixes of ``j + 1`` bytes)
    are ``level_start[j] .. level_start[j + 1] - 1`` and the children of a node are
    contiguous: ``child_start[n] .. child_start[n + 1] - 1``. ``node_byte[n]`` is the
    last byte of the prefix; ``first_node[b]`` is the depth-0 node of byte ``b``
    (``-1`` if no token starts with ``b``). Tokens ending at node ``n`` are
    ``end_tokens[end_start[n] : end_start[n + 1]]`` (token ids).
    """

    node_byte: np.ndarray
    child_start: np.ndarray
    level_start: np.ndarray
    first_node: np.ndarray
    end_start: np.ndarray
    end_tokens: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.node_byte.shape[0])

    @cached_property
    def parent(self) -> np.ndarray:
        """int64 ``[N]``: parent node (``-1`` at depth 0)."""
        parent = np.full(self.num_nodes, -1, np.int64)
        counts = np.diff(self.child_start)
        parent[self.child_start[0]:] = np.repeat(np.arange(self.num_nodes), counts)
        return parent

    @cached_property
    def depth(self) -> np.ndarray:
        """int64 ``[N]``: bytes before the node's last byte (0 for depth-0 nodes)."""
        return np.repeat(np.arange(len(self.level_start) - 1), np.diff(self.level_start))

    @cached_property
    def end_token(self) -> np.ndarray:
        """int64 ``[N]``: the token ending at each node, ``-1`` if none; ``-2`` where
        several tokens share the byte string (see ``end_start``/``end_tokens``)."""
        count = np.diff(self.end_start)
        out = np.where(count == 0, -1, -2).astype(np.int64)
        one = count == 1
        out[one] = self.end_tokens[self.end_start[:-1][one]]
        return out

    @cached_property
    def tokens_by_first_byte(self) -> np.ndarray:
        """int64 ``[256]``: number of tokens whose first byte is ``b``."""
        count = np.diff(self.end_start)
        # every node's subtree is a contiguous range of each deeper level; sum level by
        # level from the leaves up
        sub = count.astype(np.int64)
        ls = self.level_start
        for j in range(len(ls) - 2, 0, -1):
            a, b = ls[j], ls[j + 1]
            np.add.at(sub, self.parent[a:b], sub[a:b])
        out = np.zeros(256, np.int64)
        out[self.node_byte[:ls[1]]] = sub[:ls[1]]
        return out

    @cached_property
    def child_count(self) -> np.ndarray:
        """int64 ``[N]``: number of children of each node."""
        return np.diff(self.child_start)

    @classmethod
    def build(cls, vocab: "Vocabulary") -> "TokenTrie":
        mat, lens = vocab.byte_matrix
        ids = vocab.ordinary_ids
        L = mat.shape[1]
        node_of_tok = np.full(len(ids), -1, np.int64)   # node of the prefix so far
        node_bytes, parents, level_start = [], [], [0]
        total = 0
        for j in range(L):
            sel = np.nonzero(lens > j)[0]
            parent = node_of_tok[sel] if j else np.zeros(len(sel), np.int64)
            key = parent * 256 + mat[sel, j]
            uniq, inv = np.unique(key, return_inverse=True)   # sorted by parent, then byte
            node_of_tok[sel] = total + inv
            node_bytes.append((uniq % 256).astype(np.uint8))
            parents.append(uniq // 256 if j else np.full(len(uniq), -1, np.int64))
            total += len(uniq)
            level_start.append(total)
        node_byte = np.concatenate(node_bytes)
        parent = np.concatenate(parents)
        N = len(node_byte)
        # children are contiguous because each level is sorted by parent
        counts = np.bincount(parent[parent >= 0], minlength=N)
        child_start = np.zeros(N + 1, np.int64)
        child_start[1:] = np.cumsum(counts)
        child_start += level_start[1] if N else 0
        # child_start must point into the global numbering: children of level-j nodes
        # live in level j+1, in parent order, so a running sum works from level_start[1].
        first_node = np.full(256, -1, np.int64)
        first_node[node_byte[:level_start[1]]] = np.arange(level_start[1])
        end_node = node_of_tok
        order = np.argsort(end_node, kind="stable")
        end_start = np.searchsorted(end_node[order], np.arange(N + 1))
        return cls(node_byte, child_start, np.asarray(level_start, np.int64), first_node,
                   end_start.astype(np.int64), ids[order].astype(np.int64))
