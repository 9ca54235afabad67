"""Adapters for the reference constrained-decoding engines (llguidance, xgrammar,
outlines-core), used by ``tests/test_engine_parity.py`` and
``experiments/bench_masks.py``. Test/benchmark code only: none of these engines is a
dependency of ``jaxcd``.

Every engine is driven through the same small interface::

    eng = make_engine("xgrammar", tokenizer, vocab)      # once per vocabulary
    compiled = eng.compile("regex", pattern)            # or ("json_schema", schema_text)
    m = eng.matcher(compiled)
    m.fill(words)          # words: int32 [W] (W = ceil(V / 32)), bit v % 32 of word v // 32
    m.consume(token_id)    # False if the engine rejects the token

Each engine is set up the way its own documentation does it for a Hugging Face
tokenizer, so that its defaults are the ones a user gets:

- llguidance: ``llguidance.hf.from_tokenizer``; a Lark grammar ``start: /regex/`` or
  ``start: %json {schema}`` (with ``x-guidance`` ``whitespace_flexible=false``, the
  Lark form of ``grammar_from_json_schema``) headed by ``%llguidance {"no_forcing":
  true}``: without that option llguidance allows only the canonical token where the
  text is forced, so its mask is not the byte-exact allowed set.
- xgrammar: ``TokenizerInfo.from_huggingface``; ``compile_regex``, and
  ``compile_json_schema(any_whitespace=False, separators=(",", ":"))``.
- outlines-core: a ``Vocabulary`` built as ``Vocabulary.from_pretrained`` builds it
  (every token but EOS, byte-level pieces decoded to bytes; special tokens keep their
  text), ``Index(regex, vocabulary)``; JSON goes through
  ``json_schema.build_regex_from_schema(schema, whitespace_pattern="")``.
"""

from __future__ import annotations

import importlib
import json
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

ENGINE_NAMES = ("llguidance", "xgrammar", "outlines_core")
_MODULES = {"llguidance": "llguidance", "xgrammar": "xgrammar", "outlines_core": "outlines_core"}


def unavailable_reason(name: str) -> str | None:
    """``None`` if the engine imports, else why not (for ``pytest.skip``)."""
    try:
        importlib.import_module(_MODULES[name])
    except Exception as e:  # ImportError, or a broken binary wheel
        return f"{name} is not importable ({type(e).__name__}: {e})"
    return None


def unpack_words(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """int32/uint32 ``[..., W]`` -> bool ``[..., vocab_size]`` (bit ``v % 32`` of word ``v // 32``)."""
    w = np.ascontiguousarray(words).view("<u4")
    bits = np.unpackbits(w.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


@dataclass
class Compiled:
    engine: str
    handle: Any            # the engine's compiled object
    nbytes: int | None     # memory of the compiled constraint, if the engine can say


# ---------------------------------------------------------------------------------------
# llguidance
# ---------------------------------------------------------------------------------------
class _LLGuidanceMatcher:
    def __init__(self, matcher):
        self.m = matcher

    def fill(self, words: np.ndarray) -> None:
        assert words.dtype == np.int32 and words.flags["C_CONTIGUOUS"]
        self.m.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)

    def consume(self, token: int) -> bool:
        ok = self.m.consume_token(int(token))
        return bool(ok) and not self.m.is_error()


class LLGuidanceEngine:
    name = "llguidance"

    def __init__(self, tokenizer, vocab):
        import llguidance
        import llguidance.hf
        self.llg = llguidance
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab.vocab_size,
                                                eos_token=vocab.eos_id)
        self.vocab_size = vocab.vocab_size

    def grammar(self, kind: str, source: str) -> str:
        """A Lark grammar with the ``no_forcing`` option (the option is read from the
        ``%llguidance`` header; set on the JSON grammar object it is ignored)."""
        head = '%llguidance {"no_forcing": true}\n'
        if kind == "regex":
            # use_ascii="": keep Python/Rust semantics of \d, \w, \s (Unicode)
            return head + "start: /" + self.llg.regex_to_lark(source, "") + "/\n"
        schema = json.loads(source)
        schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ",",
                                "key_separator": ":"}
        return head + "start: %json " + json.dumps(schema) + "\n"

    def compile(self, kind: str, source: str) -> Compiled:
        # llguidance compiles lazily: the matcher owns the lexer/parser; building it is
        # the compile step (the grammar text is only parsed there).
        g = self.llg.LLMatcher.grammar_from_lark(self.grammar(kind, source))
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise ValueError(f"llguidance rejected the grammar: {m.get_error()}")
        return Compiled(self.name, (g, m), None)

    def matcher(self, compiled: Compiled) -> _LLGuidanceMatcher:
        g, first = compiled.handle
        return _LLGuidanceMatcher(first.deep_copy())

    def batch_fill(self, matchers, words2d: np.ndarray) -> None:
        """All masks of a batch at once with llguidance's parallel executor."""
        if not hasattr(self, "_executor"):
            self._executor = self.llg.LLExecutor()
        from llguidance.numpy import fill_next_token_bitmask_par
        fill_next_token_bitmask_par(self._executor, [(m.m, i) for i, m in enumerate(matchers)],
                                    words2d)


# ---------------------------------------------------------------------------------------
# xgrammar
# ---------------------------------------------------------------------------------------
class _XGrammarMatcher:
    def __init__(self, matcher):
        self.m = matcher

    def fill(self, words: np.ndarray) -> None:
        self.m.fill_next_token_bitmask(words.reshape(1, -1), 0)

    def consume(self, token: int) -> bool:
        return bool(self.m.accept_token(int(token)))


class XGrammarEngine:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab):
        import xgrammar
        self.xgr = xgrammar
        self.info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab.vocab_size, stop_token_ids=[vocab.eos_id])
        self.vocab_size = vocab.vocab_size

    def compile(self, kind: str, source: str) -> Compiled:
        # a fresh compiler without cache: a cold compile every time
        comp = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        if kind == "regex":
            cg = comp.compile_regex(source)
        else:
            cg = comp.compile_json_schema(source, any_whitespace=False, separators=(",", ":"),
                                          strict_mode=True)
        return Compiled(self.name, cg, int(cg.memory_size_bytes))

    def matcher(self, compiled: Compiled) -> _XGrammarMatcher:
        return _XGrammarMatcher(self.xgr.GrammarMatcher(compiled.handle))

    def batch_fill(self, matchers, words2d: np.ndarray) -> None:
        """All masks of a batch at once with xgrammar's ``BatchGrammarMatcher``."""
        if not hasattr(self, "_batch"):
            self._batch = self.xgr.BatchGrammarMatcher()
        self._batch.batch_fill_next_token_bitmask([m.m for m in matchers], words2d)


# ---------------------------------------------------------------------------------------
# outlines-core
# ---------------------------------------------------------------------------------------
class _OutlinesMatcher:
    def __init__(self, guide):
        self.g = guide
        self.dead = False

    def fill(self, words: np.ndarray) -> None:
        if self.dead:
            words[:] = 0
            return
        self.g.write_mask_into(words.ctypes.data, words.size, 4)

    def consume(self, token: int) -> bool:
        if self.dead:
            return False
        try:
            self.g.advance(int(token), return_tokens=False)
        except Exception:
            self.dead = True
            return False
        return True


class OutlinesCoreEngine:
    name = "outlines_core"

    def __init__(self, tokenizer, vocab):
        import outlines_core
        self.oc = outlines_core
        mapping: dict[bytes, list[int]] = {}
        for i in range(vocab.vocab_size):
            if i == vocab.eos_id:
                continue
            b = vocab.token_bytes[i]
            if vocab.is_special[i]:
                # from_pretrained keeps special tokens of the BPE vocabulary as their text
                piece = tokenizer.convert_ids_to_tokens(i)
                if piece is None:
                    continue
                b = piece.encode("utf-8")
            mapping.setdefault(b, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(vocab.eos_id, mapping)
        self.vocab_size = vocab.vocab_size

    def regex(self, kind: str, source: str) -> str:
        if kind == "regex":
            return source
        return self.oc.json_schema.build_regex_from_schema(source, whitespace_pattern="")

    def compile(self, kind: str, source: str) -> Compiled:
        index = self.oc.Index(self.regex(kind, source), self.vocabulary)
        # outlines-core has no size query; its serialised index is the stored table
        return Compiled(self.name, index, len(pickle.dumps(index)))

    def matcher(self, compiled: Compiled) -> _OutlinesMatcher:
        return _OutlinesMatcher(self.oc.Guide(compiled.handle))

    batch_fill = None   # no batch API: the benchmark loops over single calls


_ENGINES = {"llguidance": LLGuidanceEngine, "xgrammar": XGrammarEngine,
            "outlines_core": OutlinesCoreEngine}


def make_engine(name: str, tokenizer, vocab):
    return _ENGINES[name](tokenizer, vocab)
