"""Public compile functions and the host-side mask query."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Sequence

import numpy as np

from .automata.bits import unpack_bits
from .automata.fsa import DFA, NFA, determinize, minimize
from .automata.json_schema import DEFAULT_MAX_DEPTH, _auto_tree
from .automata import schema_builder as _sb
from .automata.schema_builder import to_nfa
from .automata.keywords import keywords_to_dfa, normalize_groups
from .automata.lifting import tensorize
from .automata.pycall import tool_call_nfa
from .automata.regex import regex_to_nfa
from .automata.tensorized import TensorizedAutomaton, cache_key
from .errors import (AutomatonTooLargeError, BudgetTooSmallError, EmptyLanguageError,
                     PrefixRejectedError)
from .limits import CompileLimits, constraint_part, use_limits
from .vocab import Vocabulary

__all__ = ["compile_regex", "compile_json_schema", "compile_keywords", "compile_tool_call",
           "compile_automaton", "allowed_tokens", "walk_prefix", "compile_stats"]

#: CPU seconds per compile stage while a :func:`compile_stats` block is open (else None)
_STATS: ContextVar[dict | None] = ContextVar("jaxcd_compile_stats", default=None)
#: the stages :func:`compile_stats` times, in pipeline order
STAGES = ("tree", "nfa", "determinize", "minimize", "tensorize")


@contextlib.contextmanager
def compile_stats():
    """Where compile time goes: a dict of CPU seconds per stage, summed over the
    compiles run inside the ``with`` block (this thread or task).

    Stages: ``"tree"`` (a JSON Schema's expression tree, its automaton products for
    ``oneOf``/``not``/``if``/merged ``allOf`` included), ``"nfa"`` (the whole
    constraint's byte NFA), ``"determinize"``, ``"minimize"`` (the whole constraint's
    DFA), ``"tensorize"`` (lifting over the vocabulary and the tables); ``"failed"``:
    the part of the last four spent in attempts given up past a compile limit
    (``compile_json_schema``'s order-free attempts before the schema's order), and
    ``"attempts"``: how many whole-constraint attempts ran (an int). A stage a compile
    does not go through is absent (``compile_keywords`` builds its DFA directly: only
    ``"tensorize"``; a cache hit: nothing).

    >>> with compile_stats() as st:                                 # doctest: +SKIP
    ...     fa = compile_json_schema(schema, vocab)
    >>> st                                                          # doctest: +SKIP
    {'tree': 0.21, 'nfa': 0.04, 'determinize': 0.3, 'minimize': 0.2, 'tensorize': 0.5,
     'attempts': 1}
    """
    d: dict = {}
    token = _STATS.set(d)
    try:
        yield d
    finally:
        _STATS.reset(token)


def _timed(stage: str, f, *args, **kw):
    d = _STATS.get()
    if d is None:
        return f(*args, **kw)
    t = time.process_time()
    try:
        return f(*args, **kw)
    finally:
        d[stage] = d.get(stage, 0.0) + time.process_time() - t


def _dfa_of(nfa_fn):
    """``minimize(determinize(nfa_fn()))``, each stage timed (see :func:`compile_stats`)."""
    nfa = _timed("nfa", nfa_fn)
    return _timed("minimize", minimize, _timed("determinize", determinize, nfa))


@contextlib.contextmanager
def _gc_paused():
    """Compilation allocates many short-lived sets; with a large heap (tokenizer,
    vocabulary) Python's cyclic GC would rescan it over and over (measured: 120 ms of
    a 130 ms determinisation). Nothing built here is cyclic, so pause it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _cached(kind: str, source: str, options: dict, vocab: Vocabulary, build, cache):
    """Build ``tensorize(build(), vocab)``, or load it from the on-disk cache.

    ``cache``: ``False``/``None`` (no cache), ``True`` (``cache_dir()/automata``) or a
    directory. The key covers the constraint, its options, the vocabulary
    fingerprint and the storage format.
    """
    key = cache_key(kind, source, options, vocab)
    path = None
    if cache:
        from .model_files import cache_dir
        root = Path(cache) if not isinstance(cache, bool) else cache_dir() / "automata"
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{key}.npz"
        if path.exists():
            try:
                fa = TensorizedAutomaton.load(path)
                os.utime(path)                       # recently used: kept by the eviction
                return fa
            except Exception:
                path.unlink(missing_ok=True)
    stats = _STATS.get()
    t = time.process_time()
    if stats is not None:
        stats["attempts"] = stats.get("attempts", 0) + 1
    try:
        with _gc_paused():
            fa = _timed("tensorize", tensorize, build(), vocab, key=f"{kind}:{source[:80]}")
    except AutomatonTooLargeError:
        if stats is not None:
            stats["failed"] = stats.get("failed", 0.0) + time.process_time() - t
        raise
    if path is not None:
        fa.save(path)
        _evict(path.parent, AUTOMATON_CACHE_MAX_BYTES)
    return fa


#: Bound of the on-disk automaton cache; least recently used files go first.
AUTOMATON_CACHE_MAX_BYTES = int(os.environ.get("JAXCD_AUTOMATON_CACHE_BYTES", 1 << 30))


def _evict(root: Path, max_bytes: int) -> None:
    """Delete the least recently used ``*.npz`` of ``root`` until it holds at most
    ``max_bytes`` (files that vanish meanwhile — another process — are skipped)."""
    files = []
    for f in root.glob("*.npz"):
        try:
            st = f.stat()
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, f))
    total = sum(x[1] for x in files)
    for _, size, f in sorted(files):
        if total <= max_bytes:
            break
        f.unlink(missing_ok=True)
        total -= size


def _part(kind: str, text: str) -> str:
    return f"{kind} {text[:80] + '...' if len(text) > 80 else text!r}"


def compile_regex(pattern: str, vocab: Vocabulary, flags: int = 0,
                  cache: bool | str | Path = False,
                  limits: CompileLimits | None = None) -> TensorizedAutomaton:
    """Compile a regular expression (Python ``re`` syntax, full-match semantics on
    UTF-8 text) into a tensorized automaton over ``vocab``.

    Every ``compile_*`` function takes ``limits`` (:class:`jaxcd.CompileLimits`;
    default ``DEFAULT_LIMITS``): a stage that would exceed one raises
    :class:`~jaxcd.errors.AutomatonTooLargeError` before allocating (``docs/limits.md``).

    >>> fa = compile_regex(r"-?(0|[1-9][0-9]*)", vocab)            # doctest: +SKIP
    """
    with use_limits(limits), constraint_part(_part("regex", str(pattern))):
        return _cached("regex", pattern, {"flags": int(flags)}, vocab,
                       lambda: _dfa_of(lambda: regex_to_nfa(pattern, flags)), cache)


def compile_json_schema(schema: dict | str, vocab: Vocabulary,
                        whitespace_pattern: str | None = None, strict: bool = True,
                        cache: bool | str | Path = False,
                        max_depth: int = DEFAULT_MAX_DEPTH,
                        limits: CompileLimits | None = None, *,
                        closed_objects: bool = False,
                        property_order: str = "auto",
                        max_tokens: int | None = None,
                        repeated_keys: bool = True) -> TensorizedAutomaton:
    """Compile a JSON Schema (dict or JSON text) with jaxcd's schema builder
    (keywords and deliberate differences: ``docs/json_schema.md``).

    ``whitespace_pattern``: regex for the free whitespace between JSON tokens
    (default outlines-core's ``[ ]?``; ``""`` for compact JSON). ``strict``: refuse
    keywords that would not be enforced (``False`` ignores them). ``max_depth``: how
    many times a recursive ``$ref`` is expanded inside itself, and the nesting depth
    of free-form values (``{}``, objects without ``properties``). ``closed_objects``:
    objects that declare properties take no other key (default: the specification's
    open objects). ``property_order``: ``"auto"`` (the default: properties in any order
    where that fits a budget, else in the schema's order; see ``repeated_keys``), ``"schema"``
    or ``"any"`` (docs/json_schema.md). With ``"auto"``, a schema whose automaton passes a
    compile limit is compiled again with ``"schema"`` before the error is raised.
    ``repeated_keys`` (``"auto"`` only): an object outside automaton products takes its
    declared properties in any order with a key allowed to repeat, every occurrence valid
    for its schema (the object is valid whichever occurrence a parser keeps); this form is
    tried first, within the budget, as its language contains the exact any-order forms'
    at no more copies of the members. ``False`` never accepts a repeated declared key
    (the exact forms only). Generation passes ``False``
    (:func:`jaxcd.generation.build_constraint`): a generated object never repeats a
    declared key.

    ``max_tokens``: the automaton need only be exact for outputs of at most this many
    tokens (a GCD budget, EOS included, or any generation that stops there): such an
    output has at most ``max_tokens`` × (the vocabulary's longest token, in bytes)
    characters, so a ``maxLength``/``maxItems``/``maxProperties`` at or past that count is
    enforced without a counter (no output within the budget reaches it) and a
    ``minLength``/``minItems``/``minProperties`` past it makes its value impossible.
    Long bounds (``maxLength: 65535``) are then exact where a counter would pass the
    compile limits (without ``max_tokens``, a ``maxLength`` above ``max_count`` is
    tightened to 256 and a lower bound above it is refused). Decoding with a budget above
    ``max_tokens`` can break such a bound.
    """
    if property_order not in _sb.PROPERTY_ORDERS:
        raise ValueError(f"property_order must be one of {_sb.PROPERTY_ORDERS}, got "
                         f"{property_order!r}")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens must be a positive integer or None, got {max_tokens!r}")
    count_budget = None if max_tokens is None else max_tokens * _longest_token(vocab)
    src = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True, default=str)
    with _gc_paused(), use_limits(limits), constraint_part(_part("JSON Schema", src)):
        memo: dict = {}

        def build(order, depth, free=None, like=None):
            # the tree: an error here is final for "auto" (the builder already tried the
            # schema's order wherever an order-free object made a subschema too large)
            node, ws, text, b = _timed("tree", _auto_tree, schema, whitespace_pattern,
                                       strict, depth, closed_objects, order, memo, free,
                                       like, count_budget, repeated_keys)
            return b, node.size, text, lambda: _dfa_of(lambda: to_nfa(node, ws))

        def finish(b, depth, order, text, make, free=None):
            # ``b``: the attempt's builder (whether a max_tokens bound was used)
            try:
                return _cached("json_schema", text,
                               {"ws": whitespace_pattern, "strict": bool(strict),
                                "depth": int(depth), "closed": bool(closed_objects),
                                "order": order, "free": free, "builder": 7,
                                "repeated_keys": bool(repeated_keys),
                                "count_budget": count_budget if b.budget_used else None},
                               vocab, make, cache)
            except EmptyLanguageError as e:
                if not b.budget_used:
                    if b.ref_cuts:
                        raise EmptyLanguageError(
                            f"{e}: recursive $refs were expanded at most max_depth={depth} "
                            "times inside themselves and no value of the schema stops "
                            "within that depth (a larger max_depth may admit one)") from None
                    raise
                raise EmptyLanguageError(
                    f"{e}: no value of the schema fits in max_tokens={max_tokens} tokens (at "
                    f"most {count_budget} characters; a minLength/minItems/minProperties "
                    "asks for more)") from None

        def rest(b, depth, text, make):
            used = b.auto_used
            deep = b.adaptive_free_depth()
            later = None
            if deep is not None:
                # few free-form values: first deeper ones (docs/json_schema.md, "Depth");
                # past a limit, the default depth below
                try:
                    b2, _, text2, make2 = build(property_order, depth, deep, b)
                    if (b2.depth_used, b2.free_depth_used, b2.auto_used) == \
                            (b.depth_used, b.free_depth_used, used):
                        if b2.root_orders >= b.root_orders:
                            return finish(b, depth, property_order, text2, make2, deep)
                        # the document's object lost its second order: the default
                        # depth first, this one if that passes a limit
                        later = (text2, make2)
                except AutomatonTooLargeError:
                    pass
            if property_order != "auto" or not used:
                # no order-free object: the schema's order, whatever the option (past a
                # limit, "auto" tries the loose form below)
                try:
                    return finish(b, depth, property_order, text, make)
                except AutomatonTooLargeError:
                    if property_order != "auto" or not (_sb.AUTO_LOOSE and repeated_keys):
                        raise
                _, _, text, make = build(_sb.LOOSE_ORDER, depth)
                return finish(b, depth, _sb.LOOSE_ORDER, text, make)
            try:
                return finish(b, depth, "auto", text, make)
            except AutomatonTooLargeError:
                pass
            if later is not None:
                try:
                    return finish(b, depth, property_order, *later, deep)
                except AutomatonTooLargeError:
                    pass
            if _sb.AUTO_LOOSE and repeated_keys:
                # the schema's order, objects without required properties in the loose
                # form (no larger); past a limit, the schema's order everywhere
                _, _, text, make = build(_sb.LOOSE_ORDER, depth)
                try:
                    return finish(b, depth, _sb.LOOSE_ORDER, text, make)
                except AutomatonTooLargeError:
                    pass
            _, _, text, make = build("schema", depth)
            return finish(b, depth, "schema", text, make)

        b, size, text, make = build(property_order, max_depth)
        if b.ref_cuts and _sb.REF_DEPTH_EXTRA and size <= _sb.REF_DEPTH_TREE:
            # recursive $refs cut at max_depth: one level deeper where the tree stays
            # within REF_DEPTH_GROWTH times its size (docs/json_schema.md, "Depth"); past
            # a compile limit, max_depth as before
            deeper = max_depth + _sb.REF_DEPTH_EXTRA
            try:
                b3, size3, text3, make3 = build(property_order, deeper)
                if (b3.depth_used == deeper and b3.auto_used == b.auto_used
                        and size <= size3 <= _sb.REF_DEPTH_GROWTH * size):
                    return rest(b3, deeper, text3, make3)
            except AutomatonTooLargeError:
                pass
        return rest(b, max_depth, text, make)


def _longest_token(vocab: Vocabulary) -> int:
    """Bytes of the vocabulary's longest token (an output of ``n`` tokens has at most
    ``n`` times this many bytes, so characters)."""
    return max((len(vocab.token_bytes[int(i)]) for i in vocab.ordinary_ids), default=1)


def compile_keywords(keywords: Sequence[str | Sequence[str]], vocab: Vocabulary,
                     text_pattern: str | None = None,
                     cache: bool | str | Path = False,
                     limits: CompileLimits | None = None) -> TensorizedAutomaton:
    """Text that contains every keyword (each in any of its surface forms), in any
    order; optionally bounded by ``text_pattern`` (a regex the whole text must match)."""
    groups = normalize_groups(keywords)
    with use_limits(limits), constraint_part(_part("keywords", json.dumps(groups))):
        return _cached("keywords", json.dumps(groups), {"text": text_pattern}, vocab,
                       lambda: keywords_to_dfa(groups, text_pattern), cache)


def compile_tool_call(tool: dict | str, vocab: Vocabulary,
                      cache: bool | str | Path = False,
                      limits: CompileLimits | None = None) -> TensorizedAutomaton:
    """A Python-style call ``name(arg=value, ...)`` from a tool's JSON Schema."""
    text = tool if isinstance(tool, str) else json.dumps(tool, sort_keys=True)
    with use_limits(limits), constraint_part(_part("tool", text)):
        return _cached("tool_call", text, {}, vocab,
                       lambda: _dfa_of(lambda: tool_call_nfa(tool)), cache)


def compile_automaton(automaton: NFA | DFA, vocab: Vocabulary,
                      limits: CompileLimits | None = None) -> TensorizedAutomaton:
    """Tensorize a hand-built byte-level automaton (see :class:`jaxcd.automata.NFA`)."""
    with _gc_paused(), use_limits(limits), constraint_part("the hand-built automaton"):
        dfa = automaton if isinstance(automaton, DFA) else \
            _timed("determinize", determinize, automaton)
        return _timed("tensorize", tensorize, _timed("minimize", minimize, dfa), vocab,
                      key="automaton")


def walk_prefix(fa: TensorizedAutomaton, prefix_token_ids: Sequence[int],
                budget: int | None = None, vocab: Vocabulary | None = None) -> int:
    """Automaton state after ``prefix_token_ids``; raises :class:`PrefixRejectedError`
    naming the first token that leaves the language (or the budget)."""
    s = fa.initial_state
    for i, tok in enumerate(prefix_token_ids):
        tok = int(tok)
        nxt = fa.next_state(s, tok)
        if nxt == fa.dead_state:
            shown = f" ({vocab.token_bytes[tok]!r})" if vocab is not None and 0 <= tok < len(vocab) else ""
            raise PrefixRejectedError(
                f"token {tok}{shown} at position {i} of the prefix is not allowed by "
                f"the constraint {fa.key!r}")
        if budget is not None and int(fa.dist[nxt]) > budget - (i + 1):
            raise PrefixRejectedError(
                f"token {tok} at position {i}: the prefix can no longer be completed within "
                f"the budget of {budget} tokens")
        s = nxt
    return s


def allowed_tokens(fa: TensorizedAutomaton, prefix_token_ids: Sequence[int] = (),
                   budget: int | None = None) -> np.ndarray:
    """Tokens allowed after ``prefix_token_ids``: numpy bool ``[vocab_size]``.

    ``budget=None`` is LCD (any continuation length); with a budget ``n`` (tokens,
    EOS included) it is the GCD mask: a token is allowed iff some valid output
    ending in EOS within ``n`` tokens starts with ``prefix + token``.
    """
    if budget is not None:
        if not isinstance(budget, (int, np.integer)) or budget < 1:
            raise ValueError(f"budget must be a positive integer, got {budget!r}")
        if fa.min_budget > budget:
            raise BudgetTooSmallError(int(budget), fa.min_budget,
                                      f"constraint {fa.key!r}" if fa.key else "the constraint")
    s = walk_prefix(fa, prefix_token_ids, budget)
    if budget is not None:
        left = budget - len(prefix_token_ids)
        if left <= 0:
            return np.zeros(fa.vocab_size, bool)
        return unpack_bits(fa.mask_words(s, left), fa.vocab_size)
    return unpack_bits(fa.mask_words(s, None), fa.vocab_size)
