"""hmm_distill: a Flax HMM distilled from language-model samples by EM.

Pure functions over ``(π, A, B)`` (:mod:`hmm_distill.hmm`), the NNX module
(:class:`HMM`), Baum–Welch EM with data parallelism (:mod:`hmm_distill.em`),
initialisations (:mod:`hmm_distill.init`), checkpoints
(:mod:`hmm_distill.checkpoint`), LM sampling (:mod:`hmm_distill.sampler`) and the
training job (:mod:`hmm_distill.train`), data-scaled priors (:mod:`hmm_distill.priors`),
the built-in task prompts (:mod:`hmm_distill.prompts`), the default HMM
(:func:`hmm_distill.default.default_hmm`) and several processes
(:mod:`hmm_distill.distributed`). CLI: ``python -m hmm_distill`` /
``hmm-distill`` (:mod:`hmm_distill.cli`).

The parameter type (:class:`HMMParams`), checkpoint reading (:func:`load_checkpoint`,
:class:`Checkpoint`) and the checkpoint errors are :mod:`jaxcd.hmm`'s, re-exported here
(the same objects): jaxcd uses them without importing hmm_distill. hmm_distill builds the
default and the demo HMMs for jaxcd through the ``jaxcd.hmm_builders`` entry points
(:func:`hmm_distill.default.default_hmm`, :func:`hmm_distill.default.demo_hmm`).
"""

from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .errors import (CheckpointError, CheckpointMismatchError, ConfigError, HMMDistillError,
                     InvalidParamsError, MemoryEstimateError, NonFiniteStatisticsError,
                     SampleDataError, SampleDirMismatchError, VocabularyMismatchError)
from .hmm import (Counts, HMMParams, backward, expected_counts, forward, log_likelihood, m_step,
                  mix_params, posteriors, predictive_logprobs, random_params, sample)
from .model import HMM
from .priors import Prior, data_prior, flat_prior

__all__ = [
    "HMM", "HMMParams", "Counts", "forward", "backward", "log_likelihood", "posteriors",
    "expected_counts", "m_step", "mix_params", "predictive_logprobs", "sample", "random_params",
    "Checkpoint", "save_checkpoint", "load_checkpoint",
    "HMMDistillError", "InvalidParamsError", "SampleDataError", "SampleDirMismatchError",
    "VocabularyMismatchError", "CheckpointError", "CheckpointMismatchError",
    "NonFiniteStatisticsError", "ConfigError", "MemoryEstimateError",
    "Prior", "data_prior", "flat_prior",
]
