"""The README's Python examples run as written and give what they say, checked
against independent references (the `regex` module's partial matching for the mask,
`json` + `jsonschema` for the generated JSON)."""

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import regex

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_api_and_generate_examples():
    blocks = python_blocks()
    assert len(blocks) >= 2
    ns: dict = {}
    exec(compile(blocks[0], "README block 1", "exec"), ns)     # compile + allowed_tokens
    tok, mask = ns["tok"], ns["mask"]
    assert mask.shape == (49152,)
    # after '{"x":' (compact JSON, budget 8) the allowed tokens are exactly the ordinary
    # tokens that keep the text a prefix of {"x":<integer>}; the one-token continuations
    # here are all short, so the budget never binds
    prefix = '{"x":'
    specials = set(tok.all_special_ids)
    lang = regex.compile(r'\{"x":-?(0|[1-9][0-9]*)\}')
    allowed = set(np.flatnonzero(mask).tolist())
    assert allowed and not allowed & specials
    for v in range(len(tok)):
        if v in specials:
            continue
        text = prefix + tok.decode([v])
        ok = lang.fullmatch(text, partial=True) is not None
        assert ok == (v in allowed), (v, tok.decode([v]))
    exec(compile(blocks[1], "README block 2", "exec"), ns)     # jaxcd.generate with GCD
    out, schema = ns["out"], ns["schema"]
    assert len(out.texts) == 4
    for text in out.texts:                                    # independent of jaxcd's flag
        jsonschema.validate(json.loads(text), schema)
    assert all(out.valid)


def _block(marker: str) -> str:
    (b,) = [b for b in python_blocks() if marker in b]
    return b


def test_mixed_batch_example():
    """The README's mixed-constraint batch: every output valid for its own constraint."""
    blocks = python_blocks()
    ns: dict = {}
    exec(compile(blocks[0], "README block 1", "exec"), ns)
    exec(compile(blocks[1].split("out = jaxcd.generate")[0], "README block 2 (schema)", "exec"), ns)
    exec(compile(_block("constraints=["), "README mixed batch", "exec"), ns)
    outs, schema = ns["outs"], ns["schema"]
    assert len(outs) == 3 and all(len(o.texts) == 1 and o.valid[0] for o in outs)
    assert re.fullmatch(r"(19|20)\d\d", outs[0].texts[0])
    jsonschema.validate(json.loads(outs[1].texts[0]), schema)
    assert outs[2].texts[0] in ("yes", "no")


def test_smc_example():
    blocks = python_blocks()
    ns: dict = {}
    exec(compile(blocks[0], "README block 1", "exec"), ns)
    exec(compile(blocks[1].split("out = jaxcd.generate")[0], "README block 2 (schema)", "exec"), ns)
    exec(compile(_block('method="smc"'), "README SMC block", "exec"), ns)     # SMC
    out, schema = ns["out"], ns["schema"]
    assert len(out.texts) == 8 and out.chosen is not None
    assert abs(sum(out.weights) - 1) < 1e-6
    assert np.isfinite(out.log_Z) and out.log_Z < 0
    jsonschema.validate(json.loads(out.text), schema)
    for text, valid, w in zip(out.texts, out.valid, out.weights):
        assert valid
        jsonschema.validate(json.loads(text), schema)
