"""Exceptions raised by :mod:`hmm_distill`.

All are ``ValueError`` subclasses of :class:`jaxcd.errors.JaxcdError` and their
messages name the file or quantity that is wrong. The checkpoint errors
(:class:`CheckpointError`, :class:`CheckpointMismatchError`) and
:class:`VocabularyMismatchError` are :mod:`jaxcd.hmm`'s, which reads checkpoints (they
are not :class:`HMMDistillError` subclasses).
"""

from __future__ import annotations

from jaxcd.errors import JaxcdError as _Base
from jaxcd.hmm import CheckpointError, CheckpointMismatchError, VocabularyMismatchError

__all__ = ["HMMDistillError", "InvalidParamsError", "SampleDataError", "SampleDirMismatchError",
           "VocabularyMismatchError", "CheckpointError", "CheckpointMismatchError",
           "NonFiniteStatisticsError", "ConfigError", "MemoryEstimateError"]


class HMMDistillError(_Base, ValueError):
    """Base class of every error hmm_distill raises on purpose."""


class InvalidParamsError(HMMDistillError):
    """HMM parameters with wrong shapes, negative/NaN entries or rows not summing to 1."""


class SampleDataError(HMMDistillError):
    """A sample directory / shard is missing, empty, corrupt or inconsistent."""


class SampleDirMismatchError(SampleDataError):
    """An existing sample directory was made with different settings (seed, T, model...)."""


class NonFiniteStatisticsError(HMMDistillError):
    """EM expected counts (or parameters) contain NaN / inf."""


class ConfigError(HMMDistillError):
    """A training / sampling configuration value is invalid."""


class MemoryEstimateError(ConfigError):
    """The estimated memory of an EM step exceeds what the devices have."""
