"""compile_json_schema(max_tokens=n): counting keywords past what an output of n tokens can
hold are decided without a counter. Brute force: on a toy vocabulary, every token sequence
that fits the budget, against jsonschema and against the exact counter."""

import itertools
import json

import jsonschema
import pytest

from jaxcd import Vocabulary, compile_json_schema
from jaxcd.api import _longest_token
from jaxcd.errors import EmptyLanguageError

# no whitespace tokens: compact JSON only (whitespace_pattern="")
TOKENS = [b"", b'"', b"a", b"ab", b'a"', b'"ab', b"[", b"]", b"0", b",0", b"0,", b"{", b"}",
          b'"k"', b":", b"0}", b"0]"]
VOCAB = Vocabulary.from_token_bytes(TOKENS, eos_id=0)
N = 4                                    # budget, EOS included: at most 3 tokens before it


def _accepts(fa, ids, vocab=VOCAB):
    s = fa.initial_state
    for t in list(ids) + [vocab.eos_id]:
        s = fa.next_state(s, t)
        if s == fa.dead_state:
            return False
    return s == fa.final_state


def _valid(schema, ids):
    try:
        v = json.loads(b"".join(TOKENS[i] for i in ids))
    except ValueError:
        return False
    return jsonschema.validators.validator_for(schema)(schema).is_valid(v)


# count budget: 4 tokens x 3 bytes = 12 characters
SCHEMAS = [
    {"type": "string", "maxLength": 12},                  # dropped: exact within the budget
    {"type": "string", "minLength": 13},                  # impossible within the budget
    {"type": "string", "minLength": 3, "maxLength": 4},   # below it: the counter as always
    {"type": "array", "items": {"const": 0}, "maxItems": 12},
    {"type": "array", "items": {"const": 0}, "minItems": 13},
    {"type": "array", "items": {"const": 0}, "minItems": 2, "maxItems": 2},
    {"type": "object", "maxProperties": 20},
    {"type": ["string", "array"], "minLength": 40, "maxItems": 3},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_budget_bounds_exact_within_the_budget(schema):
    assert _longest_token(VOCAB) == 3
    exact = compile_json_schema(schema, VOCAB, whitespace_pattern="")
    if schema["type"] == "string" and schema.get("minLength", 0) > 12 or \
            schema.get("minItems", 0) > 12:
        # nothing fits in the budget: said so (the exact automaton has no such output)
        with pytest.raises(EmptyLanguageError, match="max_tokens=4"):
            compile_json_schema(schema, VOCAB, whitespace_pattern="", max_tokens=N)
        fa = None
    else:
        fa = compile_json_schema(schema, VOCAB, whitespace_pattern="", max_tokens=N)
    ordinary = [int(i) for i in VOCAB.ordinary_ids]
    n_valid = 0
    for k in range(N):
        for ids in itertools.product(ordinary, repeat=k):
            ok = _accepts(exact, ids)
            assert ok == _valid(schema, ids), (schema, [TOKENS[i] for i in ids])
            if fa is not None:
                assert _accepts(fa, ids) == ok, (schema, [TOKENS[i] for i in ids])
            n_valid += ok
    assert (n_valid > 0) == (fa is not None)


def test_budget_makes_long_bounds_compile(smol_vocab):
    # maxLength 65535 and minLength 5000: past max_count (1000), so tightened to 256 and
    # refused without a budget; with one they need no counter at all
    from jaxcd.errors import AutomatonTooLargeError
    schema = {"type": "object", "properties": {"key": {"type": "string", "maxLength": 65535},
                                               "pad": {"type": "string", "minLength": 50000}},
              "required": ["key"]}
    with pytest.raises(AutomatonTooLargeError, match="minLength 50000"):
        compile_json_schema(schema, smol_vocab)
    assert _longest_token(smol_vocab) == 81   # (the figure docs/json_schema.md quotes)
    n = 256                                # 256 x 81 bytes = 20,736 < 50,000 and 65,535
    fa = compile_json_schema(schema, smol_vocab, max_tokens=n)
    text = json.dumps({"key": "x" * 700})   # longer than the 256 a tightened bound keeps
    ids = smol_vocab_encode(smol_vocab, text)
    assert len(ids) < n and _accepts(fa, ids, smol_vocab)
    # "pad" is impossible within the budget: a text with it is refused at its key
    ids = smol_vocab_encode(smol_vocab, json.dumps({"key": "x", "pad": "y" * 10}))
    assert not _accepts(fa, ids, smol_vocab)
    with pytest.raises(ValueError, match="max_tokens"):
        compile_json_schema(schema, smol_vocab, max_tokens=0)


def smol_vocab_encode(vocab, text):
    # greedy longest-match over the vocabulary's bytes: some tokenization of the text
    data, out, i = text.encode(), [], 0
    by_bytes = {}
    for t in vocab.ordinary_ids:
        by_bytes.setdefault(vocab.token_bytes[int(t)], int(t))
    longest = max(map(len, by_bytes))
    while i < len(data):
        for L in range(min(longest, len(data) - i), 0, -1):
            t = by_bytes.get(data[i:i + L])
            if t is not None:
                out.append(t)
                i += L
                break
        else:
            raise AssertionError(f"no token for {data[i:i + 1]!r}")
    return out


@pytest.mark.parametrize("bound", [{"minimum": 0}, {"exclusiveMinimum": 0}, {"maximum": 0},
                                   {"exclusiveMaximum": 0}, {"minimum": 0.0},
                                   {"minimum": 0, "exclusiveMinimum": True}])
def test_sign_only_bounds_keep_exponents(bound):
    # a number whose only bound is 0 keeps its exponent (1e-06 >= 0), exactly: against
    # decimal arithmetic on every spelling of a small universe (-0 equals 0)
    from decimal import Decimal

    from jaxcd.automata import determinize, minimize
    from jaxcd.automata.json_schema import schema_to_nfa
    schema = {"type": "number", **bound}
    d = minimize(determinize(schema_to_nfa(schema, "")[0]))
    v = jsonschema.Draft4Validator if bound.get("exclusiveMinimum") is True else \
        jsonschema.Draft202012Validator
    oracle = v(schema)
    mantissas = ["0", "0.0", "0.00", "1", "10", "0.5", "0.05", "1.0", "12.34", "0.000"]
    exponents = ["", "e+0", "e-6", "E+2", "e-400", "e+400", "E-01"]
    n_in = 0
    for sign, m, e in itertools.product(["", "-"], mantissas, exponents):
        text = sign + m + e
        want = oracle.is_valid(json.loads(text, parse_float=Decimal))
        assert d.accepts(text.encode()) == want, (bound, text)
        n_in += want
    assert 0 < n_in < 2 * len(mantissas) * len(exponents)
    assert not d.accepts(b"1e5")          # (the exponent's sign is written, as in NUMBER)
