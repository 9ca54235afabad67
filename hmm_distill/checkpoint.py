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

Reading (:func:`load_checkpoint`, :class:`Checkpoint`, :data:`FORMAT`) lives in
:mod:`jaxcd.hmm`, so that jaxcd reads checkpoints without importing hmm_distill; the
names here are the same objects. Writing and run directories are hmm_distill's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from jaxcd.hmm import FORMAT, Checkpoint, load_checkpoint

from .hmm import HMMParams

__all__ = ["FORMAT", "Checkpoint", "save_checkpoint", "load_checkpoint", "epoch_checkpoint_path",
           "list_epoch_checkpoints", "find_latest_checkpoint"]

_EPOCH_RE = re.compile(r"^ckpt_epoch(\d+)\.safetensors$")


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
