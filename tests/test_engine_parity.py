"""LCD masks on the real 49k vocabulary against the language and three reference engines.

For every public-workload constraint (JSON schemas with ``whitespace_pattern=""``: the
targets are compact) we walk the target's tokenization and a few seeded random walks
(uniform over our LCD mask) and, at every step, compare ``allowed_tokens(fa, prefix)``
over all tokens (ordinary ones, EOS and the other special tokens) with:

1. **the language** — ``regex.fullmatch(pattern, text, partial=True)`` (the ``regex``
   module, which shares no code with jaxcd or the engines) decides whether the text
   after a token can still be completed; EOS is allowed iff ``regex.fullmatch`` holds.
   For JSON the pattern is ``schema_to_regex(schema, "")``: jaxcd's schema builder
   reads the schema into an expression tree, printed once as the NFA jaxcd compiles
   and once as this regex, so for JSON the oracle checks the automaton, the lifting
   and the masks, not the builder's reading of the schema (that is checked against
   outlines-core's regex and ``jsonschema`` in ``tests/test_json_schema.py``). Our
   mask must equal this oracle on every token whose text is complete UTF-8 (or can
   never become UTF-8).
   Tokens that end inside a multi-byte character are checked by enumerating the
   characters they can start wherever we allow them or any engine disagrees.
2. **llguidance** (``no_forcing``), **xgrammar** and **outlines-core**: every token on
   which an engine disagrees with us is put in one of the documented categories of
   ``docs/engine_differences.md`` (:data:`CATEGORIES`), each with a rule that uses
   the oracle to say which side the language supports. An unclassified disagreement
   fails the test.

``test_documented_difference`` checks the minimal example of every category.
"""

from __future__ import annotations

import json
import re
import unicodedata
import zlib
from pathlib import Path

import numpy as np
import pytest

regex = pytest.importorskip("regex", reason="the regex module is the language oracle")

from engines import ENGINE_NAMES, make_engine, unavailable_reason, unpack_words  # noqa: E402
from language_oracle import Oracle, split_text  # noqa: E402

from jaxcd import allowed_tokens, compile_json_schema, compile_regex  # noqa: E402
from jaxcd.automata.json_schema import schema_to_regex  # noqa: E402

DATA = Path(__file__).parent / "data" / "workload"
WORKLOAD = json.loads((DATA / "workload.json").read_text())["constraints"]
NUM_WALKS = 3
WALK_LEN = 10

# ---------------------------------------------------------------------------------------
# documented categories (docs/engine_differences.md); "who" is the side the language
# (the regex oracle) supports
# ---------------------------------------------------------------------------------------
CATEGORIES = {
    "special_token_as_text": "engine allows a special token (<|im_start|>, ...) whose surface "
                             "text fits; jaxcd never allows special tokens (docs/design.md §1)",
    "ascii_digit": r"engine reads \d as [0-9]; Python's re (and the oracle) read it as any "
                   "Unicode decimal digit",
    "unicode_version": "a character unassigned in Python's Unicode database (jaxcd follows "
                       "Python's re) but a digit/letter in the newer Unicode of the engine "
                       "and of the regex module",
    "dropped_continuation": "outlines-core drops continuations out of a state that is already "
                            "a complete match",
    "json_minus_zero": "engine rejects the integer -0 (valid JSON; the oracle allows it)",
    "json_del_c1_in_string": "engine allows U+007F-U+009F unescaped in a JSON string "
                             "(jaxcd keeps outlines-core's string set, which excludes them)",
    "json_control_in_maxlength_string": "engine allows raw control characters U+0000-U+001F "
                                        "in a string with maxLength (invalid JSON)",
    "json_no_escape_in_maxlength_string": "engine rejects escape sequences in a string with "
                                          "maxLength",
    "json_unicode_escape": r"engine allows \uXXXX escapes (jaxcd and outlines-core's string "
                           "regex do not)",
    "json_escaped_slash": r"engine rejects the escape \/ (valid JSON; the oracle allows it)",
    "json_exponent_without_sign": "engine allows an exponent without sign (1e5); jaxcd and "
                                  "outlines-core's number grammar require [eE][+-]",
}


def _chars(s: str, lo: int, hi: int) -> bool:
    return any(lo <= ord(c) <= hi for c in s)


def _unassigned_in_python(s: str) -> bool:
    return any(unicodedata.category(c) == "Cn" for c in s)


class Case:
    """One constraint: our automaton, the oracle and the regex source, built once."""

    def __init__(self, name: str, kind: str, source: str, vocab, target: str | None = None):
        self.name, self.kind, self.source, self.target = name, kind, source, target
        if kind == "regex":
            self.fa = compile_regex(source, vocab)
            self.pattern, flags = source, 0
        else:
            # closed objects: the regex oracle has no form for open objects' extra keys;
            # the schema's property order: nor for "auto"'s order-free objects
            self.fa = compile_json_schema(source, vocab, whitespace_pattern="",
                                          closed_objects=True, property_order="schema")
            self.pattern, _ = schema_to_regex(source, "", closed_objects=True)
            flags = regex.ASCII      # jaxcd compiles the JSON regex with re.ASCII
        self.oracle = Oracle(self.pattern, flags, vocab.token_bytes, ~vocab.is_special,
                             vocab.eos_id)
        self.vocab = vocab
        self._verdicts: dict = {}

    @classmethod
    def from_entry(cls, entry, vocab) -> "Case":
        return cls(entry["name"], entry["kind"], (DATA / entry["file"]).read_text(), vocab,
                   entry["target"])

    def verdict(self, prefix: bytes, token: int) -> bool:
        key = (prefix, token)
        if key not in self._verdicts:
            self._verdicts[key] = self.oracle.token_allowed(prefix, token)
        return self._verdicts[key]

    def paths(self, tokenizer):
        """The target's tokenization and NUM_WALKS seeded walks, uniform over our LCD mask
        (EOS excluded so a walk keeps going; it stops early if nothing else is allowed)."""
        if hasattr(self, "_paths"):
            return self._paths
        out = [("target", tokenizer.encode(self.target, add_special_tokens=False))]
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        for w in range(NUM_WALKS):
            ids: list[int] = []
            for _ in range(WALK_LEN):
                m = allowed_tokens(self.fa, ids)
                m[self.vocab.eos_id] = False
                choices = np.nonzero(m)[0]
                if len(choices) == 0:
                    break
                ids.append(int(rng.choice(choices)))
            out.append((f"walk{w}", ids))
        self._paths = out
        return out


@pytest.fixture(scope="module")
def cases(smol_vocab):
    store: dict[str, Case] = {}

    def get(entry) -> Case:
        if entry["name"] not in store:
            store[entry["name"]] = Case.from_entry(entry, smol_vocab)
        return store[entry["name"]]
    return get


@pytest.fixture(scope="module")
def engines(smol_tokenizer, smol_vocab):
    store: dict[str, object] = {}

    def get(name):
        reason = unavailable_reason(name)
        if reason:
            pytest.skip(reason)
        if name not in store:
            store[name] = make_engine(name, smol_tokenizer, smol_vocab)
        return store[name]
    return get


def classify(engine: str, case: Case, prefix: bytes, token: int, engine_allows: bool,
             ours: bool) -> str | None:
    """The documented category of one disagreement, or ``None``."""
    v = case.vocab
    if v.is_special[token] and token != v.eos_id:
        return "special_token_as_text" if engine_allows and not ours else None
    truth = case.verdict(prefix, token)
    sp_pre = split_text(prefix)
    pre_text = sp_pre[0] if sp_pre else ""
    sp = split_text(prefix + v.token_bytes[token]) if token != v.eos_id else None
    # the characters the token adds (for a token ending mid-character: the characters it
    # can still become that keep the text viable, by enumeration)
    new = ""
    if sp is not None:
        text, pending = sp
        new = text[len(pre_text):] if text.startswith(pre_text) else text
        if pending and truth:
            new += "".join(case.oracle.completion_chars(text, pending))
    if truth != ours:
        # only one category may excuse our mask: a newer Unicode than Python's
        if truth and engine_allows and _unassigned_in_python(new):
            return "unicode_version"
        return None
    # from here the language agrees with us; the engine is the odd one out
    if case.kind == "regex":
        if (engine == "xgrammar" and not engine_allows and r"\d" in case.pattern
                and any(unicodedata.category(c) == "Nd" and not c.isascii() for c in new)):
            return "ascii_digit"
        if (engine == "outlines_core" and not engine_allows and sp_pre and not sp_pre[1]
                and case.oracle.complete(pre_text)):
            return "dropped_continuation"
        return None
    around = pre_text[-2:] + new
    if engine_allows:
        if engine in ("xgrammar", "llguidance") and _chars(new, 0x7F, 0x9F):
            return "json_del_c1_in_string"
        if engine == "xgrammar" and _chars(new, 0x00, 0x1F):
            return "json_control_in_maxlength_string"
        if "u" in new and re.search(r"(?<!\\)(\\\\)*\\u", pre_text[-8:] + new):
            return "json_unicode_escape"
        if re.search(r"[0-9][eE][0-9]", around):
            return "json_exponent_without_sign"
    else:
        if engine == "xgrammar" and "-0" in around:
            return "json_minus_zero"
        if engine == "xgrammar" and "\\" in new:
            return "json_no_escape_in_maxlength_string"
        if engine == "llguidance" and re.search(r"\\/", around):
            return "json_escaped_slash"
    return None


def _oracle_mismatch(case: Case, prefix: bytes, ours: np.ndarray) -> list[str]:
    """Tokens where our mask differs from the language (excused: newer-Unicode characters)."""
    om = case.oracle.mask(prefix)
    sp_pre = split_text(prefix)
    pre_len = len(sp_pre[0]) if sp_pre else 0
    bad = []
    for i in np.nonzero(om.decided & (om.allowed != ours))[0]:
        sp = split_text(prefix + case.vocab.token_bytes[i])
        if om.allowed[i] and sp and _unassigned_in_python(sp[0][pre_len:]):
            continue
        shown = "EOS" if i == case.vocab.eos_id else repr(case.vocab.token_bytes[i])
        bad.append(f"token {i} {shown}: ours={bool(ours[i])} "
                   f"language={bool(om.allowed[i])}")
    # tokens ending mid-character that we allow: some character must complete them
    for i in om.pending:
        if ours[i] and not case.verdict(prefix, int(i)):
            bad.append(f"token {i} {case.vocab.token_bytes[i]!r} (ends mid-character): "
                       "ours=True, no character completes it")
    return bad


@pytest.mark.parametrize("entry", WORKLOAD, ids=[e["name"] for e in WORKLOAD])
def test_masks_equal_language(entry, cases, smol_tokenizer, smol_vocab):
    """(a) our LCD mask equals the regex oracle at every step of every path."""
    case = cases(entry)
    v = smol_vocab
    special = v.is_special.copy()
    special[v.eos_id] = False
    steps = 0
    for path, ids in case.paths(smol_tokenizer):
        for t in range(len(ids) + 1):
            ours = allowed_tokens(case.fa, ids[:t])
            assert not ours[special].any(), f"{path} step {t}: a special token is allowed"
            prefix = v.decode_bytes(ids[:t])
            bad = _oracle_mismatch(case, prefix, ours)
            assert not bad, f"{case.name} {path} step {t} after {prefix[-40:]!r}:\n" + \
                "\n".join(bad[:20])
            if path == "target" and t < len(ids):
                assert ours[ids[t]], f"target token {t} is not allowed"
            steps += 1
        if path == "target":
            assert allowed_tokens(case.fa, ids)[v.eos_id], "EOS not allowed after the target"
    assert steps >= len(case.paths(smol_tokenizer)[0][1]) + 1


@pytest.mark.parametrize("engine_name", ENGINE_NAMES)
@pytest.mark.parametrize("entry", WORKLOAD, ids=[e["name"] for e in WORKLOAD])
def test_engine_disagreements_are_documented(entry, engine_name, cases, engines,
                                             smol_tokenizer, smol_vocab, request):
    """(b) every token on which an engine disagrees with us is a documented difference."""
    engine = engines(engine_name)
    case = cases(entry)
    v = smol_vocab
    W = (v.vocab_size + 31) // 32
    compiled = engine.compile(case.kind, case.source)
    unclassified, counts = [], {}
    compared = 0
    for path, ids in case.paths(smol_tokenizer):
        m = engine.matcher(compiled)
        for t in range(len(ids) + 1):
            ours = allowed_tokens(case.fa, ids[:t])
            words = np.zeros(W, np.int32)
            m.fill(words)
            theirs = unpack_words(words, v.vocab_size)
            prefix = v.decode_bytes(ids[:t])
            compared += 1
            for i in np.nonzero(theirs != ours)[0]:
                cat = classify(engine_name, case, prefix, int(i), bool(theirs[i]), bool(ours[i]))
                if cat is None:
                    unclassified.append(
                        f"{path} step {t} after {prefix[-30:]!r}: token {i} "
                        f"{v.token_bytes[i]!r} engine={bool(theirs[i])} ours={bool(ours[i])} "
                        f"language={case.verdict(prefix, int(i))}")
                else:
                    counts[cat] = counts.get(cat, 0) + 1
            if t < len(ids) and not m.consume(ids[t]):
                # the engine refuses a token we allow: it must have been masked out (a
                # disagreement classified above), and the engine is dead from here on
                assert not theirs[ids[t]], f"{engine_name} masked in token {ids[t]} but refused it"
                break
    request.node.user_properties.append(("categories", counts))
    assert compared > 0
    assert not unclassified, (f"{engine_name} on {case.name}: {len(unclassified)} "
                              "unclassified disagreements:\n" + "\n".join(unclassified[:20]))


# ---------------------------------------------------------------------------------------
# minimal examples of docs/engine_differences.md
# ---------------------------------------------------------------------------------------
_S = '{"type":"object","properties":{"s":{"type":"string"}},"required":["s"]}'
_S3 = '{"type":"object","properties":{"s":{"type":"string","maxLength":3}},"required":["s"]}'
_I = '{"type":"object","properties":{"i":{"type":"integer"}},"required":["i"]}'
_N = '{"type":"object","properties":{"n":{"type":"number"}},"required":["n"]}'

# (category, engine, kind, source, prefix (str or bytes pieces), token, engine allows it)
EXAMPLES = [
    ("special_token_as_text", "xgrammar", "json_schema", _S, ['{"s":"'], "<|im_start|>", True),
    ("special_token_as_text", "outlines_core", "regex", r"[a-z<>|_]+", [""], "<|endoftext|>", True),
    ("ascii_digit", "xgrammar", "regex", r"\d{4}", [""], b"\xd9", False),
    ("unicode_version", "llguidance", "regex", r"\d{4}", ["", b"\xf0"], b"\x9c", True),
    ("unicode_version", "outlines_core", "regex", r"\d{4}", ["", b"\xf0"], b"\x9c", True),
    ("dropped_continuation", "outlines_core", "regex", r"[a-z]+(\.[a-z]+)*\.[a-z]+",
     ["ab.cd"], b".", False),
    ("dropped_continuation", "outlines_core", "regex", r"\d{1,2}:\d{2}( ?(AM|PM))?",
     ["12:34"], b" ", False),
    ("json_minus_zero", "xgrammar", "json_schema", _I, ['{"i":-'], b"0", False),
    ("json_del_c1_in_string", "xgrammar", "json_schema", _S, ['{"s":"'], b"\x7f", True),
    ("json_del_c1_in_string", "llguidance", "json_schema", _S, ['{"s":"', b"\xc2"], b"\x85", True),
    ("json_del_c1_in_string", "xgrammar", "json_schema", _S, ['{"s":"', b"\xc2"], b"\x85", True),
    ("json_control_in_maxlength_string", "xgrammar", "json_schema", _S3, ['{"s":"'], b"\x00", True),
    ("json_no_escape_in_maxlength_string", "xgrammar", "json_schema", _S3, ['{"s":"'], b"\\", False),
    ("json_unicode_escape", "llguidance", "json_schema", _S, ['{"s":"', b"\\"], b"u", True),
    ("json_unicode_escape", "xgrammar", "json_schema", _S, ['{"s":"', b"\\"], b"u", True),
    ("json_escaped_slash", "llguidance", "json_schema", _S, ['{"s":"', b"\\"], b"/", False),
    ("json_exponent_without_sign", "llguidance", "json_schema", _N, ['{"n":1e'], b"5", True),
    ("json_exponent_without_sign", "xgrammar", "json_schema", _N, ['{"n":1e'], b"5", True),
]


@pytest.mark.parametrize("example", EXAMPLES,
                         ids=[f"{e[0]}-{e[1]}-{i}" for i, e in enumerate(EXAMPLES)])
def test_documented_difference(example, engines, smol_tokenizer, smol_vocab):
    cat, engine_name, kind, source, prefix_parts, token, engine_allows = example
    assert cat in CATEGORIES
    engine = engines(engine_name)
    v = smol_vocab
    by_bytes = {b: i for i, b in enumerate(v.token_bytes) if b}
    ids: list[int] = []
    for p in prefix_parts:
        ids += [by_bytes[p]] if isinstance(p, bytes) else \
            smol_tokenizer.encode(p, add_special_tokens=False)
    tok = by_bytes[token] if isinstance(token, bytes) else \
        int(smol_tokenizer.convert_tokens_to_ids(token))
    case = Case(cat, kind, source, v)
    ours = bool(allowed_tokens(case.fa, ids)[tok])
    m = engine.matcher(engine.compile(kind, source))
    assert all(m.consume(i) for i in ids), "the engine must accept the example's prefix"
    words = np.zeros((v.vocab_size + 31) // 32, np.int32)
    m.fill(words)
    theirs = bool(unpack_words(words, v.vocab_size)[tok])
    assert theirs == engine_allows, f"{engine_name} changed its behaviour: update the docs"
    assert ours != theirs
    assert classify(engine_name, case, v.decode_bytes(ids), tok, theirs, ours) == cat
