"""GCD / LCD inside ``transformers``' ``model.generate()`` (PyTorch causal LMs).

:class:`GCDLogitsProcessor` is a ``transformers.LogitsProcessor``: at every decoding
step it sets the score of every token outside the constraint's mask to ``-inf``.
With a ``budget`` the mask is the GCD mask (docs/design.md §3): a token is allowed iff some
valid output that ends in EOS within ``budget`` new tokens starts with the tokens so
far plus that token — so every sampled output is valid **and** ends within the
budget. Without a budget (``budget=None``) it is the step-local LCD mask (any
continuation length; outputs may be cut off by ``max_new_tokens``).

Usage::

    from transformers import LogitsProcessorList
    from jaxcd import compile_json_schema
    from jaxcd.hf import GCDLogitsProcessor

    fa = compile_json_schema(schema, vocab)             # vocab of the model's tokenizer
    enc = tokenizer(prompts, return_tensors="pt", padding=True)   # left padding
    proc = GCDLogitsProcessor(fa, prompt_length=enc.input_ids.shape[1], budget=48)
    out = model.generate(**enc, logits_processor=LogitsProcessorList([proc]),
                         max_new_tokens=48,             # = budget (see below)
                         do_sample=True, top_k=0)

**Pass** ``max_new_tokens=budget``: the processor guarantees that EOS comes within
``budget`` tokens; a smaller ``max_new_tokens`` can cut outputs off, a larger one is
never used (every row has ended by then).

Details:

- ``prompt_length`` is the width of the (left-padded) ``input_ids`` given to
  ``generate``; the constraint applies to ``input_ids[:, prompt_length:]``.
- Each row's automaton state is tracked incrementally. If a row's history is not an
  extension of what the processor saw last time (a new ``generate`` call, beam
  search reordering rows, a different batch size), that row is re-walked from the
  start.
- The model's logits may be wider than the tokenizer's vocabulary (padded LM heads):
  ids ``>= fa.vocab_size`` are always disallowed.
- After a row has emitted EOS (the automaton's ``⊥``), later tokens (``generate``'s
  padding) are ignored and only EOS is allowed. If a row's mask is ever empty (its
  history left the language, e.g. a token forced by another processor, or the
  budget ran out), only EOS is allowed so that sampling does not fail on an all
  ``-inf`` row; :attr:`GCDLogitsProcessor.num_stuck` counts such steps.

Requirements: this module imports without PyTorch (the class is then a plain
callable); *calling* the processor needs ``torch``, which is imported lazily. When
``transformers`` and ``torch`` are installed the class subclasses
``transformers.LogitsProcessor``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import jax
import numpy as np

from .automata.bits import unpack_bits
from .automata.tensorized import TensorizedAutomaton
from .host import HostMasker

try:  # transformers' logits_process imports torch at module level
    from transformers.generation.logits_process import LogitsProcessor as _LogitsProcessorBase
except Exception:  # torch or transformers missing: keep the module importable
    _LogitsProcessorBase = object

__all__ = ["GCDLogitsProcessor"]


@dataclass
class _Row:
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    state: int = 0


class GCDLogitsProcessor(_LogitsProcessorBase):
    """Constrain ``model.generate()`` to a :class:`~jaxcd.automata.tensorized.TensorizedAutomaton`.

    Args:
      fa: the constraint, compiled over the model tokenizer's vocabulary (its arrays
        may be NumPy or JAX; a host copy is kept).
      prompt_length: width of the ``input_ids`` passed to ``generate`` (left-padded
        batch); generated tokens are ``input_ids[:, prompt_length:]``.
      budget: GCD budget in new tokens, EOS included (pass ``max_new_tokens=budget``
        to ``generate``); ``None`` = LCD. A budget below ``fa.min_budget`` raises
        :class:`~jaxcd.errors.BudgetTooSmallError` here, before any decoding.
      eos_token_id: the model's EOS id(s), only checked: the automaton's EOS
        (``fa.eos_id``) must be one of them.
    """

    def __init__(self, fa: TensorizedAutomaton, prompt_length: int, budget: int | None = None,
                 eos_token_id: int | Sequence[int] | None = None):
        if not isinstance(fa, TensorizedAutomaton):
            raise TypeError(f"fa must be a TensorizedAutomaton, got {type(fa).__name__}")
        fa = jax.device_get(fa)
        self.fa = fa
        if not isinstance(prompt_length, (int, np.integer)) or prompt_length < 0:
            raise ValueError(f"prompt_length must be a non-negative integer, got {prompt_length!r}")
        self.prompt_length = int(prompt_length)
        self._masker = HostMasker(fa, budget)   # checks the budget; one row lookup per step
        self.budget = self._masker.budget
        if eos_token_id is not None:
            ids = [int(eos_token_id)] if isinstance(eos_token_id, (int, np.integer)) else \
                [int(e) for e in eos_token_id]
            if fa.eos_id not in ids:
                raise ValueError(f"the automaton's EOS id is {fa.eos_id} but the model's EOS "
                                 f"id(s) are {ids}: compile the constraint with the model's "
                                 "vocabulary")
        self.eos_token_id = fa.eos_id
        self._rows: list[_Row] = []
        self.num_resyncs = 0   # rows re-walked from the start (history not an extension)
        self.num_stuck = 0     # row-steps whose mask was empty (only EOS allowed)

    # -- state tracking ------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every row (the next call re-walks all histories)."""
        self._rows = []

    @property
    def states(self) -> list[int]:
        """Automaton state of each row after the tokens seen by the last call (the
        token ``generate`` samples last is never shown to a processor)."""
        return [r.state for r in self._rows]

    def _sync(self, b: int, hist: np.ndarray) -> _Row:
        fa = self.fa
        r = self._rows[b]
        n = len(r.tokens)
        if len(hist) >= n and np.array_equal(hist[:n], r.tokens):
            new = hist[n:]
        else:
            r.state = fa.initial_state
            new = hist
            self.num_resyncs += 1
        s = r.state
        for tok in new.tolist():
            if s == fa.final_state or s == fa.dead_state:
                break          # after EOS: generate's padding; after dead: nothing to track
            s = fa.next_state(s, tok)
        r.state = s
        r.tokens = hist.copy()
        return r

    def allowed(self, state: int, num_generated: int) -> np.ndarray:
        """Bool ``[fa.vocab_size]`` mask for a row in ``state`` after ``num_generated``
        new tokens (GCD with the budget, LCD without; empty once the budget is spent
        or from the dead state)."""
        return self._masker.mask(state, num_generated)

    # -- the processor -------------------------------------------------------------------
    def __call__(self, input_ids, scores):
        import torch

        B, V = scores.shape
        gen = input_ids[:, self.prompt_length:].detach().to("cpu").numpy().astype(np.int64)
        if gen.shape[0] != B:
            raise ValueError(f"input_ids has {gen.shape[0]} rows but scores has {B}")
        if len(self._rows) != B:
            self._rows = [_Row(state=self.fa.initial_state) for _ in range(B)]
        Vc = min(V, self.fa.vocab_size)
        states = np.array([self._sync(b, gen[b]).state for b in range(B)], np.int64)
        words = self._masker.batch_mask_words(states, np.full(B, gen.shape[1]))
        mask = np.zeros((B, V), bool)
        mask[:, :Vc] = unpack_bits(words, self.fa.vocab_size)[:, :Vc]
        empty = ~mask.any(axis=1)
        if empty.any():
            # only EOS, so that sampling never sees an all -inf row
            self.num_stuck += int(np.count_nonzero(empty & (states != self.fa.final_state)))
            if self.fa.eos_id < Vc:
                mask[empty, self.fa.eos_id] = True
        allowed = torch.from_numpy(mask).to(scores.device)
        return scores.masked_fill(~allowed, float("-inf"))
