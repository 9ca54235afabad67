"""Sample directories: LM continuations as sharded ``.npy`` arrays + ``metadata.json``.

Layout of a sample directory::

    metadata.json          see below
    shard_00000.npy        int32 [n_0, T]  (np.save, no pickle)
    shard_00001.npy        ...

Each row is one continuation of exactly ``T`` tokens: the sampled tokens up to and
including the first EOS, then EOS padding (a row that had not produced EOS after
``T`` tokens is kept truncated; counted in ``num_unfinished``).

``metadata.json`` keys: ``format`` (``"hmm_distill-samples/1"``), ``vocab_size``,
``eos_token_id``, ``length`` (``T``), ``vocab_fingerprint`` (tokenizer identity),
``model`` (LM spec string), ``prompts`` (prompt texts or null), ``prompt_ids``
(token ids of each prompt; sequence ``i`` uses prompt ``i mod #prompts``),
``seed``, ``temperature``, ``shard_size``, ``num_seqs`` (requested),
``shards`` (list of ``{"file", "num_seqs", "num_unfinished", "logprobs"}`` for the
*complete* shards, in order; ``logprobs`` names ``shard_NNNNN.logprobs.npy``, float32
``[n, T]``: the LM's log-probability of each sampled token, 0 after EOS; ``features``
names ``shard_NNNNN.features.npy``, float16 ``[n, T, D]``, when the samples were drawn
with ``features = D``), ``features`` (``D``, 0 for none) and
free-form ``created``/``tokens_per_s``. Chat-prompted sets (``--prompts FILE.jsonl``)
add ``prompt_set`` (file name), ``prompt_set_id`` (SHA-256 of the rendered prompt token
ids), ``chat_template``, ``until_eos``, ``max_length``, ``eos_fraction`` and
``num_cut_off`` (rows that hit the cap without EOS).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import SampleDataError, VocabularyMismatchError

SAMPLES_FORMAT = "hmm_distill-samples/1"
REQUIRED_KEYS = ("vocab_size", "eos_token_id", "length", "vocab_fingerprint", "shards")


@dataclass
class SampleSet:
    tokens: np.ndarray  # int32 [N, T]
    meta: dict
    path: Path
    #: float32 [N, T]: the LM's log-probability of each sampled token (0 after EOS), or None
    logprobs: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eos_token_id(self) -> int:
        return int(self.meta["eos_token_id"])

    @property
    def fingerprint(self) -> str:
        return str(self.meta["vocab_fingerprint"])

    @property
    def length(self) -> int:
        return int(self.meta["length"])


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.npy"


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def read_metadata(directory) -> dict:
    directory = Path(directory)
    if not directory.is_dir():
        raise SampleDataError(f"sample directory not found: {directory}")
    mpath = directory / "metadata.json"
    if not mpath.is_file():
        raise SampleDataError(f"{directory} has no metadata.json (not a sample directory)")
    try:
        meta = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise SampleDataError(f"{mpath} is not valid JSON: {e}") from e
    if not isinstance(meta, dict):
        raise SampleDataError(f"{mpath} must hold a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise SampleDataError(f"{mpath} lacks keys {missing}")
    return meta


def load_shard(path: Path, *, length: int, vocab_size: int, num_seqs: int | None = None) -> np.ndarray:
    """Load and validate one shard (``int [n, length]``, ids in ``[0, vocab_size)``)."""
    if not path.is_file():
        raise SampleDataError(f"shard file missing: {path}")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as e:
        raise SampleDataError(f"cannot read shard {path}: {e}") from e
    if not np.issubdtype(arr.dtype, np.integer):
        raise SampleDataError(f"shard {path} has dtype {arr.dtype}, expected integer token ids")
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise SampleDataError(f"shard {path} has shape {arr.shape}, expected non-empty [n, {length}]")
    if arr.shape[1] != length:
        raise SampleDataError(f"shard {path} has sequences of length {arr.shape[1]}, "
                              f"metadata says T={length}")
    if num_seqs is not None and arr.shape[0] != num_seqs:
        raise SampleDataError(f"shard {path} has {arr.shape[0]} sequences, metadata says {num_seqs}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise VocabularyMismatchError(
            f"shard {path} has token ids in [{lo}, {hi}], outside the vocabulary [0, {vocab_size})")
    return arr.astype(np.int32, copy=False)


def load_samples(directory, *, expect_vocab_size: int | None = None,
                 expect_fingerprint: str | None = None, max_seqs: int | None = None) -> SampleSet:
    """Load every complete shard listed in ``metadata.json``.

    Raises :class:`SampleDataError` for a missing/empty/corrupt directory or shard and
    :class:`VocabularyMismatchError` if the vocabulary differs from the expectation.
    """
    directory = Path(directory)
    meta = read_metadata(directory)
    V, T = int(meta["vocab_size"]), int(meta["length"])
    if expect_vocab_size is not None and V != int(expect_vocab_size):
        raise VocabularyMismatchError(f"samples in {directory} have vocabulary size {V}, "
                                      f"expected {expect_vocab_size}")
    if expect_fingerprint is not None and meta["vocab_fingerprint"] != expect_fingerprint:
        raise VocabularyMismatchError(
            f"samples in {directory} were made with vocabulary {meta['vocab_fingerprint']!r}, "
            f"expected {expect_fingerprint!r}")
    if not 0 <= int(meta["eos_token_id"]) < V:
        raise SampleDataError(f"{directory}/metadata.json: eos_token_id {meta['eos_token_id']} "
                              f"outside the vocabulary (size {V})")
    shards = meta["shards"]
    if not shards:
        raise SampleDataError(f"{directory} has no complete shards (empty sample set)")
    arrays, lps, total = [], [], 0
    for s in shards:
        arr = load_shard(directory / s["file"], length=T, vocab_size=V, num_seqs=s.get("num_seqs"))
        arrays.append(arr)
        if s.get("logprobs"):
            lps.append(load_logprobs(directory / s["logprobs"], arr.shape))
        total += arr.shape[0]
        if max_seqs is not None and total >= max_seqs:
            break
    tokens = np.concatenate(arrays, 0)
    logprobs = np.concatenate(lps, 0) if len(lps) == len(arrays) else None
    if max_seqs is not None:
        tokens = tokens[:max_seqs]
        logprobs = None if logprobs is None else logprobs[:max_seqs]
    return SampleSet(tokens=tokens, meta=meta, path=directory, logprobs=logprobs)


def logprobs_name(index: int) -> str:
    return f"shard_{index:05d}.logprobs.npy"


def features_name(index: int) -> str:
    return f"shard_{index:05d}.features.npy"


def load_features(path: Path, shape, mmap: bool = True) -> np.ndarray:
    """The recorded token features of a shard (float16 ``[n, T, D]``; see
    :func:`hmm_distill.sampler.token_features`), memory-mapped by default."""
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except Exception as e:
        raise SampleDataError(f"cannot read token features {path}: {e}") from e
    if arr.ndim != 3 or arr.shape[:2] != tuple(shape) or not np.issubdtype(arr.dtype, np.floating):
        raise SampleDataError(f"{path} has shape {arr.shape} / dtype {arr.dtype}, expected float "
                              f"{tuple(shape)} + (D,)")
    return arr


def load_logprobs(path: Path, shape) -> np.ndarray:
    """The LM log-probabilities of a shard (float ``[n, T]``, finite, ``<= 0``)."""
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as e:
        raise SampleDataError(f"cannot read log-probabilities {path}: {e}") from e
    if arr.shape != tuple(shape) or not np.issubdtype(arr.dtype, np.floating):
        raise SampleDataError(f"{path} has shape {arr.shape} / dtype {arr.dtype}, expected float {tuple(shape)}")
    return arr.astype(np.float32, copy=False)


def write_samples(directory, tokens: np.ndarray, *, vocab_size: int, eos_token_id: int,
                  fingerprint: str, shard_size: int | None = None, **meta) -> Path:
    """Write an in-memory ``[N, T]`` token array as a sample directory (for tests,
    synthetic data, conversions)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim != 2 or tokens.shape[0] == 0:
        raise SampleDataError(f"write_samples: need non-empty [N, T] tokens, got {tokens.shape}")
    n = tokens.shape[0]
    shard_size = shard_size or n
    shards = []
    for k, s in enumerate(range(0, n, shard_size)):
        part = tokens[s:s + shard_size]
        np.save(directory / shard_name(k), part)
        shards.append({"file": shard_name(k), "num_seqs": int(part.shape[0]),
                       "num_unfinished": int(np.sum(part[:, -1] != eos_token_id))})
    md = {"format": SAMPLES_FORMAT, "vocab_size": int(vocab_size), "eos_token_id": int(eos_token_id),
          "length": int(tokens.shape[1]), "vocab_fingerprint": fingerprint, "shard_size": shard_size,
          "num_seqs": n, "shards": shards}
    md.update(meta)
    write_json_atomic(directory / "metadata.json", md)
    return directory
