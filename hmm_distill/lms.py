"""Language models the sampler can draw from, named by a spec string.

``--lm`` specs:

``gguf`` / ``gguf:PATH``
    :class:`jaxcd.lm.JaxLM` loaded from a GGUF file (default SmolLM2-135M-Instruct);
    tokenizer from :func:`jaxcd.tokenizer.load_tokenizer` (same file); fingerprint
    :attr:`jaxcd.vocab.Vocabulary.fingerprint`. Imported lazily.
``table:PATH.npz``
    :class:`jaxcd.lm.TableLM` from an ``.npz`` with ``logprobs``, ``children``,
    ``eos_token_id``.
``toy:V[:SEED]``
    a random bigram :class:`~jaxcd.lm.TableLM` over ``V`` tokens, EOS = ``V-1`` with
    ``p(EOS) ≈ 1/16`` per step (demos, smoke tests).
``hmm:CKPT``
    an HMM checkpoint used as a language model (:class:`HMMLanguageModel`), e.g. to
    sample from a planted HMM.

Every LM implements :class:`jaxcd.lm.interface.LanguageModel`; the sampler only
uses ``prefill``/``step``/``vocab_size``/``eos_token_id`` (and ``bos_token_id`` if any).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from .errors import ConfigError
from .hmm import HMMParams


class HMMLanguageModel:
    """An HMM behind the LM interface (the prompt is ignored: the HMM models
    continuations from their start).

    State: ``u [batch, H]`` = ``p(h_t | x_{<t})``; ``logprobs = log(u B)``; after token
    ``x``: ``u ← normalise(u ⊙ B[:, x]) A`` (0/0 guarded: an impossible token gives
    ``u = 0`` and all ``-inf`` log-probabilities)."""

    def __init__(self, params: HMMParams, eos_token_id: int):
        self.params = HMMParams(*(jnp.asarray(x) for x in params))
        self.vocab_size = int(self.params.B.shape[1])
        self.eos_token_id = int(eos_token_id)

    # hashed by identity: a static jit argument whose tables travel in ``params``
    def prefill(self, params, prompt_ids, prompt_lengths, max_len):
        u = jnp.broadcast_to(params.pi, (prompt_ids.shape[0], params.pi.shape[0]))
        return u, jnp.log(u @ params.B)

    def step(self, params, state, tokens):
        post = state * params.B[:, tokens].T
        s = post.sum(-1, keepdims=True)
        post = jnp.where(s > 0, post / jnp.where(s > 0, s, 1.0), 0.0)
        u = post @ params.A
        return u, jnp.log(u @ params.B)


@dataclass
class LoadedLM:
    lm: Any
    params: Any
    name: str
    fingerprint: str
    #: returns a tokenizer with ``encode`` (for text prompts); None if the LM has none
    tokenizer_loader: Callable[[], Any] | None = None


def table_fingerprint(vocab_size: int, eos_token_id: int) -> str:
    """Vocabulary identity of a toy LM without a tokenizer: only ``V`` and EOS matter."""
    return f"toy-vocab-V{int(vocab_size)}-eos{int(eos_token_id)}"


def toy_bigram_lm(vocab_size: int, seed: int = 0, eos_prob: float = 1 / 16):
    """A random bigram TableLM (EOS = ``V - 1``)."""
    from jaxcd.lm.interface import TableLM

    if vocab_size < 2:
        raise ConfigError(f"toy LM needs vocab_size >= 2, got {vocab_size}")
    rng = np.random.default_rng(seed)
    V = vocab_size
    eos = V - 1

    def rows(n):
        r = rng.dirichlet(np.full(V - 1, 0.3), n) * (1 - eos_prob)
        return np.concatenate([r, np.full((n, 1), eos_prob)], 1)

    initial = rows(1)[0]
    initial[eos] = 0.0
    initial /= initial.sum()
    return TableLM.bigram(initial, rows(V), eos)


def vocabulary_fingerprint(tokenizer, vocab_size: int | None = None) -> str:
    """:attr:`jaxcd.vocab.Vocabulary.fingerprint` of a tokenizer (fallback: a hash of its
    vocabulary dict if jaxcd cannot read it)."""
    try:
        from jaxcd.vocab import Vocabulary

        return Vocabulary.from_tokenizer(tokenizer, vocab_size=vocab_size).fingerprint
    except Exception:
        items = sorted(tokenizer.get_vocab().items())
        return "vocab-sha256-" + hashlib.sha256(repr(items).encode()).hexdigest()[:32]


def load_lm(spec: str) -> LoadedLM:
    """Resolve an ``--lm`` spec (see module docstring)."""
    kind, _, arg = spec.partition(":")
    if kind == "gguf":
        from jaxcd.lm.loading import load_lm as load_jax_lm  # lazy: heavy

        path = arg or None
        lm, params = load_jax_lm(path, tokenizer=False)[:2]

        def tok_loader():
            from jaxcd.tokenizer import load_tokenizer

            return load_tokenizer(path)

        fp = getattr(lm, "vocab_fingerprint", None) or vocabulary_fingerprint(tok_loader(), lm.vocab_size)
        return LoadedLM(lm, params, f"gguf:{path or 'default'}", fp, tok_loader)
    if kind == "table":
        from jaxcd.lm.interface import TableLM

        if not arg:
            raise ConfigError("--lm table:PATH.npz needs a path")
        with np.load(arg) as z:
            missing = [k for k in ("logprobs", "children", "eos_token_id") if k not in z]
            if missing:
                raise ConfigError(f"{arg} lacks arrays {missing} (need logprobs, children, eos_token_id)")
            lm = TableLM(z["logprobs"], z["children"], int(z["eos_token_id"]))
        return LoadedLM(lm, lm.params, f"table:{arg}", table_fingerprint(lm.vocab_size, lm.eos_token_id))
    if kind == "toy":
        parts = arg.split(":") if arg else ["64"]
        try:
            V = int(parts[0])
            seed = int(parts[1]) if len(parts) > 1 else 0
        except ValueError as e:
            raise ConfigError(f"bad toy LM spec {spec!r} (expected toy:V[:SEED])") from e
        lm = toy_bigram_lm(V, seed)
        return LoadedLM(lm, lm.params, f"toy:{V}:{seed}", table_fingerprint(V, lm.eos_token_id))
    if kind == "hmm":
        from .checkpoint import load_checkpoint

        ck = load_checkpoint(arg)
        if ck.eos_token_id is None:
            raise ConfigError(f"checkpoint {arg} records no eos_token_id; cannot sample from it")
        lm = HMMLanguageModel(ck.params, ck.eos_token_id)
        return LoadedLM(lm, lm.params, f"hmm:{arg}", ck.fingerprint)
    raise ConfigError(f"unknown --lm spec {spec!r} (expected gguf[:PATH], table:PATH.npz, "
                      f"toy:V[:SEED] or hmm:CKPT)")
