"""Budget guarantee on the real 49k vocabulary: GCD random walks (uniform over the
mask) on every public-workload constraint always end with EOS within the budget,
and the decoded text is in the language (re.fullmatch; json.loads + jsonschema).

The walks run as ``jaxcd.generate`` decodes: on the automaton padded to its shape bucket,
with tables of the budget's bucket length (``budget_bucket``) and the budget traced (rows
past the budget mask everything, so a walk must have emitted EOS by then). One compiled
program then serves every constraint and budget of a bucket pair, instead of one per
constraint and budget."""

import ast
import json
import re
from pathlib import Path

import jax
import jsonschema
import numpy as np
import pytest

from jaxcd import (BudgetTooSmallError, UnsupportedSchemaError, allowed_tokens,
                   compile_json_schema, compile_keywords, compile_regex, compile_tool_call)
from jaxcd.decoding import gcd
from jaxcd.automata.json_schema import schema_to_regex
from jaxcd.automata.keywords import KeywordError
from jaxcd.decoding.buckets import bucket_automaton, budget_bucket
from jaxcd.errors import SchemaError

DATA = Path(__file__).parent / "data" / "workload"
WORKLOAD = json.loads((DATA / "workload.json").read_text())["constraints"]


def compile_entry(entry, vocab):
    src = (DATA / entry["file"]).read_text()
    if entry["kind"] == "regex":
        return compile_regex(src, vocab), src
    # the schema's property order: the regex oracle below has no form for "auto"'s
    # order-free objects
    return compile_json_schema(src, vocab, whitespace_pattern="", property_order="schema"), src


def walk_texts(fa, vocab, budget, num_walks, seed):
    pfa = bucket_automaton(fa)
    dfa = pfa.to_device()
    steps = budget_bucket(budget)
    tables = gcd.backward(dfa, budget, steps)
    toks, final = gcd.random_walks(jax.random.PRNGKey(seed), dfa, tables, num_walks=num_walks)
    toks, final = np.asarray(toks), np.asarray(final)
    assert toks.shape == (num_walks, steps)
    out = []
    for row, f in zip(toks, final):
        assert vocab.eos_id in row[:budget], "walk did not end with EOS within the budget"
        m = list(row).index(vocab.eos_id)
        assert np.all(row[m:] == vocab.eos_id)
        assert f == pfa.final_state
        out.append(vocab.decode_bytes(row[:m]).decode("utf-8"))
    return out


@pytest.mark.parametrize("entry", WORKLOAD, ids=[e["name"] for e in WORKLOAD])
def test_gcd_walks_are_valid(entry, smol_vocab):
    fa, src = compile_entry(entry, smol_vocab)
    n0 = fa.min_budget
    for budget in (n0, n0 + 3, 2 * n0 + 8):
        texts = walk_texts(fa, smol_vocab, budget, num_walks=8, seed=budget)
        for text in texts:
            if entry["kind"] == "regex":
                assert re.fullmatch(src, text), (entry["name"], budget, text)
            else:
                jsonschema.validate(json.loads(text), json.loads(src))
                regex, _ = schema_to_regex(src, "")
                assert re.fullmatch(regex, text, re.ASCII)
    with pytest.raises(BudgetTooSmallError, match=f"smallest budget that works is {n0}"):
        allowed_tokens(fa, [], budget=n0 - 1)


@pytest.mark.parametrize("entry", WORKLOAD[:6], ids=[e["name"] for e in WORKLOAD[:6]])
def test_target_is_allowed_and_host_equals_jit(entry, smol_vocab, smol_tokenizer):
    fa, _ = compile_entry(entry, smol_vocab)
    ids = smol_tokenizer.encode(entry["target"], add_special_tokens=False) + [smol_vocab.eos_id]
    budget = len(ids) + 2
    pfa = bucket_automaton(fa)                   # device side: padded, as generate runs it
    dfa = pfa.to_device()
    tables = gcd.backward(dfa, budget, budget_bucket(budget))
    cs = gcd.init_state(dfa)
    for t, tok in enumerate(ids):
        host = allowed_tokens(fa, ids[:t], budget=budget)
        dev = np.asarray(gcd.mask_jit(dfa, tables, cs))
        np.testing.assert_array_equal(host, dev)
        assert host[tok]
        assert not host[smol_vocab.is_special & (np.arange(len(host)) != smol_vocab.eos_id)].any()
        cs = gcd.advance_jit(dfa, cs, tok)
    assert int(cs.state) == pfa.final_state
    # and the budget is enforced past the target: nothing is allowed once it is spent
    assert not np.asarray(gcd.mask_jit(dfa, tables, cs._replace(t=jax.numpy.int32(budget)))).any()


def test_keyword_walks_contain_every_keyword(smol_vocab):
    groups = [["drive", "drives", "drove", "driving"], ["dog", "dogs"], ["park"]]
    fa = compile_keywords(groups, smol_vocab, text_pattern=r"[A-Za-z ,.]*")
    for budget in (fa.min_budget, fa.min_budget + 10):
        for text in walk_texts(fa, smol_vocab, budget, num_walks=16, seed=budget):
            assert re.fullmatch(r"[A-Za-z ,.]*", text)
            for forms in groups:
                assert any(f in text for f in forms), (text, forms)


def test_tool_call_walks_parse_and_validate(smol_vocab):
    tool = {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12},
                       "unit": {"enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer"},
                       "hourly": {"type": "boolean"},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                "maxItems": 2}},
        "required": ["city", "days"]}}
    fa = compile_tool_call(tool, smol_vocab)
    for budget in (fa.min_budget, fa.min_budget + 12):
        for text in walk_texts(fa, smol_vocab, budget, num_walks=16, seed=budget):
            call = ast.parse(text, mode="eval").body
            assert isinstance(call, ast.Call) and call.func.id == "get_weather" and not call.args
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            jsonschema.validate(kwargs, tool["parameters"])


def test_front_end_errors(smol_vocab):
    with pytest.raises(UnsupportedSchemaError, match=r"'uniqueItems' .* at /properties/x/uniqueItems"):
        compile_json_schema({"type": "object", "properties": {"x": {
            "type": "array", "prefixItems": [{}], "uniqueItems": True}}}, smol_vocab)
    with pytest.raises(SchemaError, match="not valid JSON"):
        compile_json_schema("{not json", smol_vocab)
    with pytest.raises(KeywordError, match="empty"):
        compile_keywords([], smol_vocab)
    with pytest.raises(KeywordError, match="non-empty"):
        compile_keywords([["dog", ""]], smol_vocab)
    with pytest.raises(SchemaError, match="identifier"):
        compile_tool_call({"name": "bad name", "parameters": {"type": "object"}}, smol_vocab)
    with pytest.raises(UnsupportedSchemaError, match="unsupported type 'object'"):
        compile_tool_call({"name": "f", "parameters": {"type": "object", "properties": {
            "o": {"type": "object"}}}}, smol_vocab)
