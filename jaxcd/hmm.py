"""HMM parameters, HMM checkpoints (reading) and HMM builders: what jaxcd needs of an HMM.

P-GCD (:mod:`jaxcd.decoding.pgcd`) and SMC's look-ahead proposals use an HMM ``(π, A, B)``
distilled from the LM. This module holds the pieces of it that jaxcd itself needs, so
that jaxcd never imports the package that *trains* HMMs (``hmm_distill``, which imports
jaxcd):

* :class:`HMMParams`: the parameter type (``pi [H]``, ``A [H, H]``, ``B [H, V]``,
  probabilities). ``hmm_distill.HMMParams`` is this same class.
* :func:`load_checkpoint` / :class:`Checkpoint`: reading a checkpoint of format
  ``hmm_distill/1`` (written by ``hmm_distill.checkpoint.save_checkpoint``; the format
  is described there and in ``docs/hmm_distill.md``) with its errors
  (:class:`CheckpointError`, :class:`CheckpointMismatchError`,
  :class:`VocabularyMismatchError`). ``hmm_distill.checkpoint.load_checkpoint`` is this
  same function.
* :func:`build_hmm`: an HMM that some installed package builds on first use (``--hmm
  default``, the demo's small HMM). Builders are found through the entry point group
  ``jaxcd.hmm_builders`` (:data:`BUILDERS_GROUP`); this distribution declares
  ``default`` and ``demo`` (functions of ``hmm_distill.default``) in its
  ``pyproject.toml``. A builder is called as ``builder(model_path)`` and returns
  ``(HMMParams, info)``, ``info`` a dict with at least ``path`` (the checkpoint),
  ``cached`` (bool) and ``settings`` (the recipe, a dict).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

from .errors import JaxcdError, VocabularyError

Array = jax.Array

FORMAT = "hmm_distill/1"
"""The checkpoint format (the ``format`` metadata entry of every checkpoint file)."""

BUILDERS_GROUP = "jaxcd.hmm_builders"
"""The entry point group of HMM builders (:func:`build_hmm`)."""


class HMMParams(NamedTuple):
    """HMM parameters as probabilities: ``pi [H]``, ``A [H, H]``, ``B [H, V]``."""

    pi: Array
    A: Array
    B: Array

    @property
    def hidden_size(self) -> int:
        return int(self.A.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.B.shape[1])


class CheckpointError(JaxcdError, ValueError):
    """A checkpoint file is missing, not an hmm_distill checkpoint, or corrupt."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint belongs to another model (hidden size, vocabulary, run config)."""


class VocabularyMismatchError(VocabularyError):
    """Vocabulary size or tokenizer fingerprint differs between data / checkpoint / model."""


class HMMBuilderError(JaxcdError, ValueError):
    """No (or no single) installed HMM builder of a name, or it could not be loaded."""


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


def hmm_builder(name: str):
    """The installed HMM builder ``name`` (entry point group :data:`BUILDERS_GROUP`).

    Raises :class:`HMMBuilderError` when none (or several different ones) is installed,
    or when it cannot be loaded.
    """
    from importlib.metadata import entry_points

    found = {ep.value: ep for ep in entry_points(group=BUILDERS_GROUP, name=name)}
    if not found:
        raise HMMBuilderError(
            f"no HMM builder {name!r} is installed (entry point group {BUILDERS_GROUP!r}): "
            "install this distribution with its hmm_distill package (`pip install -e .`), "
            "or pass an HMM checkpoint trained with `hmm-distill train`")
    if len(found) > 1:
        raise HMMBuilderError(f"several HMM builders {name!r} are installed (entry point group "
                              f"{BUILDERS_GROUP!r}): {sorted(found)}")
    (ep,) = found.values()
    try:
        return ep.load()
    except Exception as e:
        raise HMMBuilderError(f"cannot load the HMM builder {name!r} ({ep.value}): {e}") from e


def build_hmm(name: str, model_path=None, **options) -> tuple[HMMParams, dict]:
    """``(params, info)`` of the HMM that the installed builder ``name`` makes for the
    model file ``model_path`` (None: the default model), built on first use and cached
    by the builder. ``options`` go to the builder as keyword arguments."""
    return hmm_builder(name)(model_path, **options)
