"""HMM checkpoints (safetensors).

Format ``hmm_distill/1``: one ``.safetensors`` file holding

tensors
    ``pi`` float32 ``[H]``, ``A`` float32 ``[H, H]``, ``B`` float32 ``[H, V]``
    (normalised probabilities, exact zeros allowed) and ``rng_key`` uint32 ``[k]``
    (raw ``jax.random.key_data`` of the run's base key);
metadata (safetensors' ``str -> str`` header)
    ``format`` (``"hmm_distill/1"``), ``hidden_size``, ``vocab_size``,
    ``eos_token_id`` (``""`` if unknown), ``vocab_fingerprint`` (tokenizer / vocabulary
    identity string, e.g. :attr:`jaxcd.vocab.Vocabulary.fingerprint`), ``epoch``
    (completed epochs), ``step`` (mini-batch updates done), ``config`` (JSON of the
    training config), ``extra`` (JSON: data identity, last metrics, ...).

The file is written to ``<path>.tmp`` and renamed, so a crash never leaves a
truncated checkpoint. :func:`load_checkpoint` refuses a file whose vocabulary size,
fingerprint or hidden size differs from what the caller expects.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import CheckpointError, CheckpointMismatchError, VocabularyMismatchError
from .hmm import HMMParams

FORMAT = "hmm_distill/1"
_EPOCH_RE = re.compile(r"^ckpt_epoch(\d+)\.safetensors$")


@dataclass
class Checkpoint:
    params: HMMParams  # numpy arrays
    vocab_size: int
    hidden_size: int
    fingerprint: str
    eos_token_id: int | None = None
    epoch: int = 0
    step: int = 0
    rng_key: np.ndarray | None = None
    config: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    path: Path | None = None


def save_checkpoint(path, params: HMMParams, *, fingerprint: str, eos_token_id: int | None = None,
                    epoch: int = 0, step: int = 0, rng_key=None, config: dict | None = None,
                    extra: dict | None = None) -> Path:
    """Write a checkpoint atomically; returns its path."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pi, A, B = (np.ascontiguousarray(np.asarray(x, np.float32)) for x in params)
    tensors = {"pi": pi, "A": A, "B": B}
    if rng_key is not None:
        tensors["rng_key"] = np.ascontiguousarray(np.asarray(rng_key, np.uint32))
    meta = {
        "format": FORMAT,
        "hidden_size": str(A.shape[0]),
        "vocab_size": str(B.shape[1]),
        "eos_token_id": "" if eos_token_id is None else str(int(eos_token_id)),
        "vocab_fingerprint": str(fingerprint),
        "epoch": str(int(epoch)),
        "step": str(int(step)),
        "config": json.dumps(config or {}, sort_keys=True),
        "extra": json.dumps(extra or {}, sort_keys=True),
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path


def load_checkpoint(path, *, expect_vocab_size: int | None = None,
                    expect_fingerprint: str | None = None,
                    expect_hidden_size: int | None = None) -> Checkpoint:
    """Read a checkpoint, checking it against what the caller expects.

    Raises:
      CheckpointError: missing file, not safetensors, not an hmm_distill checkpoint,
        or inconsistent tensors.
      VocabularyMismatchError: vocabulary size or fingerprint differ.
      CheckpointMismatchError: hidden size differs.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint: {e}") from e
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an hmm_distill checkpoint "
                              f"(format {meta.get('format')!r}, expected {FORMAT!r})")
    missing = [k for k in ("pi", "A", "B") if k not in tensors]
    if missing:
        raise CheckpointError(f"{path} lacks tensors {missing}")
    try:
        V, H = int(meta["vocab_size"]), int(meta["hidden_size"])
        config = json.loads(meta.get("config", "{}"))
        extra = json.loads(meta.get("extra", "{}"))
        epoch, step = int(meta.get("epoch", 0)), int(meta.get("step", 0))
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{path}: corrupt metadata ({e})") from e
    pi, A, B = tensors["pi"], tensors["A"], tensors["B"]
    if pi.shape != (H,) or A.shape != (H, H) or B.shape != (H, V):
        raise CheckpointError(f"{path}: tensor shapes pi {pi.shape}, A {A.shape}, B {B.shape} "
                              f"disagree with hidden_size={H}, vocab_size={V}")
    fp = meta.get("vocab_fingerprint", "")
    if expect_vocab_size is not None and V != int(expect_vocab_size):
        raise VocabularyMismatchError(
            f"checkpoint {path} has vocabulary size {V}, expected {expect_vocab_size} "
            f"(it was distilled for another tokenizer/model)")
    if expect_fingerprint is not None and fp != expect_fingerprint:
        raise VocabularyMismatchError(
            f"checkpoint {path} was made for vocabulary {fp!r}, expected {expect_fingerprint!r} "
            f"(it belongs to another tokenizer/model)")
    if expect_hidden_size is not None and H != int(expect_hidden_size):
        raise CheckpointMismatchError(
            f"checkpoint {path} has hidden size {H}, expected {expect_hidden_size}")
    eos = meta.get("eos_token_id", "")
    return Checkpoint(
        params=HMMParams(pi, A, B), vocab_size=V, hidden_size=H, fingerprint=fp,
        eos_token_id=int(eos) if eos != "" else None, epoch=epoch, step=step,
        rng_key=tensors.get("rng_key"), config=config, extra=extra, path=path)


def epoch_checkpoint_path(run_dir, epoch: int) -> Path:
    return Path(run_dir) / f"ckpt_epoch{epoch:04d}.safetensors"


def list_epoch_checkpoints(run_dir) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of ``ckpt_epochNNNN.safetensors`` files in ``run_dir``, ascending."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    out = []
    for p in run_dir.iterdir():
        m = _EPOCH_RE.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def find_latest_checkpoint(run_dir) -> Path | None:
    """The highest-epoch checkpoint of a run directory (None if there is none)."""
    ck = list_epoch_checkpoints(run_dir)
    return ck[-1][1] if ck else None
