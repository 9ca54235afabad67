"""Exceptions raised by :mod:`hmm_distill`.

All are ``ValueError`` subclasses (through :class:`jaxcd.errors.JaxcdError` where
jaxcd is importable) and their messages name the file or quantity that is wrong.
"""

from __future__ import annotations

try:  # share the project's base class when available
    from jaxcd.errors import JaxcdError as _Base
    from jaxcd.errors import VocabularyError as _VocabBase
except Exception:  # pragma: no cover - hmm_distill used standalone
    class _Base(Exception):
        pass

    class _VocabBase(_Base, ValueError):
        pass


class HMMDistillError(_Base, ValueError):
    """Base class of every error hmm_distill raises on purpose."""


class InvalidParamsError(HMMDistillError):
    """HMM parameters with wrong shapes, negative/NaN entries or rows not summing to 1."""


class SampleDataError(HMMDistillError):
    """A sample directory / shard is missing, empty, corrupt or inconsistent."""


class SampleDirMismatchError(SampleDataError):
    """An existing sample directory was made with different settings (seed, T, model...)."""


class VocabularyMismatchError(HMMDistillError, _VocabBase):
    """Vocabulary size or tokenizer fingerprint differs between data / checkpoint / model."""


class CheckpointError(HMMDistillError):
    """A checkpoint file is missing, not an hmm_distill checkpoint, or corrupt."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint belongs to another model (hidden size, vocabulary, run config)."""


class NonFiniteStatisticsError(HMMDistillError):
    """EM expected counts (or parameters) contain NaN / inf."""


class ConfigError(HMMDistillError):
    """A training / sampling configuration value is invalid."""


class MemoryEstimateError(ConfigError):
    """The estimated memory of an EM step exceeds what the devices have."""
