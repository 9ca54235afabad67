"""GCDLogitsProcessor inside transformers' ``model.generate()`` with the PyTorch SmolLM2:
100% valid outputs within a tight budget, and the masks it applies equal
``jaxcd.allowed_tokens`` (GCD and LCD)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
jsonschema = pytest.importorskip("jsonschema")

from transformers import LogitsProcessor, LogitsProcessorList  # noqa: E402

from jaxcd import (BudgetTooSmallError, allowed_tokens, compile_json_schema,  # noqa: E402
                   compile_regex)
from jaxcd.hf import GCDLogitsProcessor  # noqa: E402

WORKLOAD = Path(__file__).parent / "data" / "workload"
DATE = (WORKLOAD / "regex" / "re_iso_date.regex").read_text().strip()
SCHEMA = json.loads((WORKLOAD / "json_schema" / "js_x_int.json").read_text())
EOS = 2


@pytest.fixture(scope="module")
def hf_model():
    # transformers' own GGUF loader and de-quantisation (the adapter only memoises its
    # GGUF parsing; see jaxcd.lm.torch_adapter.load_hf_model_from_gguf)
    from jaxcd.lm.torch_adapter import load_hf_model_from_gguf
    from jaxcd.model_files import default_gguf_path

    return load_hf_model_from_gguf(default_gguf_path(), dtype=torch.float32)


@pytest.fixture(scope="module")
def date_fa(smol_vocab):
    return compile_regex(DATE, smol_vocab)


@pytest.fixture(scope="module")
def json_fa(smol_vocab):
    return compile_json_schema(SCHEMA, smol_vocab, whitespace_pattern="")


class Recorder(LogitsProcessor):
    """Placed after the GCD processor: records which scores it left finite."""

    def __init__(self):
        self.calls = []

    def __call__(self, input_ids, scores):
        self.calls.append((input_ids.clone(), torch.isfinite(scores).numpy().copy()))
        return scores


def chat_ids(tokenizer, text):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return torch.tensor([list(ids)])


def run_generate(model, tokenizer, fa, prompt, budget, n, seed):
    x = chat_ids(tokenizer, prompt)
    proc = GCDLogitsProcessor(fa, prompt_length=x.shape[1], budget=budget, eos_token_id=EOS)
    rec = Recorder()
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x),
                             logits_processor=LogitsProcessorList([proc, rec]),
                             max_new_tokens=budget, do_sample=True, top_k=0, top_p=1.0,
                             temperature=1.0, num_return_sequences=n, pad_token_id=EOS)
    return x.shape[1], out[:, x.shape[1]:].numpy(), proc, rec


def split_output(row, vocab):
    row = row.tolist()
    assert EOS in row, f"no EOS within the budget: {row}"
    m = row.index(EOS)
    assert all(v == EOS for v in row[m:])
    return vocab.decode_bytes(row[:m]).decode("utf-8")


def check_recorded_masks(rec, fa, P, budget, rows=(0, 1)):
    """Every mask the processor applied during generate == allowed_tokens(prefix)."""
    assert rec.calls
    for input_ids, finite in rec.calls:
        gen = input_ids[:, P:].numpy()
        for b in rows:
            want = allowed_tokens(fa, gen[b].tolist(), budget)
            np.testing.assert_array_equal(finite[b, :fa.vocab_size], want)
            assert not finite[b, fa.vocab_size:].any()


def test_regex_sampling_valid_within_budget_and_masks(hf_model, smol_tokenizer, smol_vocab,
                                                      date_fa):
    budget = date_fa.min_budget + 1
    P, gen, proc, rec = run_generate(hf_model, smol_tokenizer, date_fa,
                                     "When did the Apollo 11 landing happen? Reply with the "
                                     "date only, formatted as YYYY-MM-DD.", budget, n=6, seed=0)
    assert gen.shape[1] <= budget
    for row in gen:
        assert re.fullmatch(DATE, split_output(row, smol_vocab))
    assert proc.num_stuck == 0 and proc.num_resyncs == 0
    assert len(rec.calls) == gen.shape[1]
    check_recorded_masks(rec, date_fa, P, budget)


def test_json_sampling_valid_within_budget_and_masks(hf_model, smol_tokenizer, smol_vocab,
                                                     json_fa):
    budget = json_fa.min_budget + 2
    P, gen, proc, rec = run_generate(hf_model, smol_tokenizer, json_fa,
                                     'Give me a JSON object with one integer field "x".',
                                     budget, n=6, seed=1)
    assert gen.shape[1] <= budget
    for row in gen:
        jsonschema.validate(json.loads(split_output(row, smol_vocab)), SCHEMA)
    assert proc.num_stuck == 0
    check_recorded_masks(rec, json_fa, P, budget)


def _direct_masks(proc, prefixes, P=3, V=None):
    """Call the processor on a batch of given generated prefixes (same length)."""
    V = V or proc.fa.vocab_size
    L = len(prefixes[0])
    ids = torch.full((len(prefixes), P + L), 7, dtype=torch.long)
    if L:
        ids[:, P:] = torch.tensor(prefixes)
    out = proc(ids, torch.zeros(len(prefixes), V))
    return torch.isfinite(out).numpy()


@pytest.mark.parametrize("budget", [None, 12, 14])
def test_direct_masks_equal_allowed_tokens(smol_tokenizer, date_fa, budget):
    target = smol_tokenizer.encode("2024-03-15", add_special_tokens=False)
    other = smol_tokenizer.encode("1999-12-31", add_special_tokens=False)
    assert len(target) == len(other) == 10
    proc = GCDLogitsProcessor(date_fa, prompt_length=3, budget=budget)
    for t in range(len(target) + 1):   # incremental, two rows
        got = _direct_masks(proc, [target[:t], other[:t]])
        for b, seq in enumerate((target, other)):
            np.testing.assert_array_equal(got[b], allowed_tokens(date_fa, seq[:t], budget))
    assert proc.num_resyncs == 0
    # a history that does not extend the previous one is re-walked
    got = _direct_masks(proc, [other[:4], target[:4]])
    np.testing.assert_array_equal(got[0], allowed_tokens(date_fa, other[:4], budget))
    np.testing.assert_array_equal(got[1], allowed_tokens(date_fa, target[:4], budget))
    assert proc.num_resyncs == 2


def test_wider_logits_budget_and_eos_checks(date_fa):
    proc = GCDLogitsProcessor(date_fa, prompt_length=3, budget=11)
    V = date_fa.vocab_size
    got = _direct_masks(proc, [[], []], V=V + 64)        # padded LM head
    assert not got[:, V:].any()
    np.testing.assert_array_equal(got[0, :V], allowed_tokens(date_fa, [], 11))
    with pytest.raises(BudgetTooSmallError) as e:
        GCDLogitsProcessor(date_fa, prompt_length=3, budget=date_fa.min_budget - 1)
    assert e.value.min_budget == date_fa.min_budget
    with pytest.raises(ValueError):
        GCDLogitsProcessor(date_fa, prompt_length=3, budget=11, eos_token_id=[0, 1])
    GCDLogitsProcessor(date_fa, prompt_length=3, budget=11, eos_token_id=[0, EOS])
    # a row that leaves the language only gets EOS (no all -inf row, no NaN in sampling)
    bad = _direct_masks(proc, [[EOS], [33]])
    assert bad[0].sum() == 1 and bad[0, EOS]
    assert proc.num_stuck == 1
