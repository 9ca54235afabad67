"""The language-model interface the decoders (GCD, LCD, P-GCD, SMC) use.

A language model is a *hashable* object (so it can be a static argument of a
jitted decoder) with pure, traceable functions over an explicit parameter pytree:

    state, logprobs = lm.prefill(params, prompt_ids, prompt_lengths, max_len)
    state, logprobs = lm.step(params, state, tokens)

- ``prompt_ids``: int32 ``[batch, prompt_len]``, LEFT-padded (real tokens at the end);
  ``prompt_lengths``: int32 ``[batch]``; ``max_len``: static int, total positions the
  cache must hold (prompt_len + max_new_tokens).
- ``tokens``: int32 ``[batch]``, the tokens just chosen.
- ``logprobs``: float32 ``[batch, vocab_size]``, normalised log-probabilities of the
  next token.
- ``state``: any pytree whose every leaf has the batch axis first, so a particle
  system can reorder it with ``jax.tree.map(lambda x: x[ancestors], state)``.

``params`` is passed explicitly (never closed over) so that jit does not bake
weights into the program as constants.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
import jax
import jax.numpy as jnp

from ..decoding.buckets import pad_prompts

PyTree = Any


@runtime_checkable
class LanguageModel(Protocol):
    vocab_size: int
    eos_token_id: int

    def prefill(self, params: PyTree, prompt_ids: jax.Array, prompt_lengths: jax.Array,
                max_len: int) -> tuple[PyTree, jax.Array]: ...

    def step(self, params: PyTree, state: PyTree, tokens: jax.Array) -> tuple[PyTree, jax.Array]: ...


class TableLM:
    """An explicit toy LM for exact tests: next-token log-probabilities stored per
    prefix in a trie.

    ``logprobs[node]`` (float32 ``[num_nodes, vocab_size]``) is the next-token
    distribution after the prefix that ``node`` stands for; ``children[node, v]``
    (int32) is the node of ``prefix + v``. Prefixes deeper than the table keep
    using their last node (``children`` may point a node to itself), so the LM is
    defined for any length. Node 0 is the empty prefix; the prompt is ignored.

    Build one from any function of the prefix with :meth:`from_function` (it
    enumerates every prefix up to ``depth`` tokens), or a bigram model with
    :meth:`bigram`.
    """

    def __init__(self, logprobs: np.ndarray, children: np.ndarray, eos_token_id: int,
                 dtype=np.float32):
        logprobs = np.asarray(logprobs, dtype=dtype)   # float64 for exact tests (x64 on)
        children = np.asarray(children, dtype=np.int32)
        if logprobs.ndim != 2 or children.shape != logprobs.shape:
            raise ValueError("TableLM: logprobs and children must both be [num_nodes, vocab_size]")
        self.vocab_size = int(logprobs.shape[1])
        self.eos_token_id = int(eos_token_id)
        self.params = (jnp.asarray(logprobs), jnp.asarray(children))
        self._key = (logprobs.tobytes(), children.tobytes(), self.eos_token_id)

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, TableLM) and self._key == other._key

    # -- constructors ------------------------------------------------------------------
    @classmethod
    def from_function(cls, fn, vocab_size: int, depth: int, eos_token_id: int,
                      dtype=np.float32) -> "TableLM":
        """``fn(prefix: tuple[int, ...]) -> probs [vocab_size]`` (need not be normalised;
        zeros allowed). Enumerates every prefix of at most ``depth`` tokens."""
        logps, children = [], []
        index = {(): 0}
        order = [()]
        i = 0
        while i < len(order):
            prefix = order[i]
            p = np.asarray(fn(prefix), dtype=np.float64)
            if p.shape != (vocab_size,) or np.any(p < 0) or p.sum() <= 0:
                raise ValueError(f"TableLM.from_function: bad probabilities for prefix {prefix}")
            with np.errstate(divide="ignore"):
                logps.append(np.log(p / p.sum()))
            row = np.full(vocab_size, i, dtype=np.int32)
            if len(prefix) < depth:
                for v in range(vocab_size):
                    child = prefix + (v,)
                    index[child] = len(order)
                    order.append(child)
                    row[v] = index[child]
            children.append(row)
            i += 1
        return cls(np.stack(logps), np.stack(children), eos_token_id, dtype=dtype)

    @classmethod
    def bigram(cls, initial: np.ndarray, transition: np.ndarray, eos_token_id: int) -> "TableLM":
        """Node 0 = start (``initial`` probs); node ``1 + v`` = last token ``v``."""
        initial = np.asarray(initial, dtype=np.float64)
        transition = np.asarray(transition, dtype=np.float64)
        V = initial.shape[0]
        probs = np.concatenate([initial[None], transition], 0)
        probs = probs / probs.sum(-1, keepdims=True)
        with np.errstate(divide="ignore"):
            logp = np.log(probs)
        children = np.tile(1 + np.arange(V, dtype=np.int32), (V + 1, 1))
        return cls(logp, children, eos_token_id)

    # -- the interface --------------------------------------------------------------------
    def prefill(self, params, prompt_ids, prompt_lengths, max_len):
        logprobs, _ = params
        batch = prompt_ids.shape[0]
        node = jnp.zeros((batch,), jnp.int32)
        return node, logprobs[node]

    def step(self, params, state, tokens):
        logprobs, children = params
        node = children[state, tokens]
        return node, logprobs[node]

    def sequence_logprob(self, tokens: Sequence[int]) -> float:
        """log p(tokens) computed on the host (float64), for references in tests."""
        logprobs, children = (np.asarray(a) for a in self.params)
        node, total = 0, 0.0
        for v in tokens:
            total += float(logprobs[node, v])
            node = int(children[node, v])
        return total
