"""The README's Python examples run as written and give what they say, checked
against independent references (the `regex` module's partial matching for the mask,
`json` + `jsonschema` for the generated JSON)."""

import json
import re
from pathlib import Path

import jsonschema
import pytest
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
    p = out.particles
    assert len(out.texts) == 1 and len(p.texts) == 8
    assert abs(sum(p.weights) - 1) < 1e-6
    assert np.isfinite(out.log_Z) and out.log_Z < 0
    assert out.valid[0] and out.text in {t for t, w in zip(p.texts, p.weights) if w > 0}
    jsonschema.validate(json.loads(out.text), schema)
    for text, valid, w in zip(p.texts, p.valid, p.weights):
        assert valid
        jsonschema.validate(json.loads(text), schema)


# ---------------------------------------------------------------------------------------
# numbers and their sources (issue 23, item 5)
# ---------------------------------------------------------------------------------------
ROOT = README.parent
RESULTS_MD = ROOT / "experiments" / "RESULTS.md"
#: a tagged figure: the number, then ``<!--src FILE KEY/PATH-->`` (invisible when rendered)
#: naming the results file and the JSON key path (``/``-separated) that holds its value
SRC_TAG = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)<!--src (\S+) ([^>]*?)-->")
#: an absolute path: "/" not after a word character, ".", ":", "/", "~", "<", ">" (so not
#: "1/2", "ms/step", "https://", "../x", "<cache>/x"), then at least one "name/" component
ABS_PATH = re.compile(r"(?<![\w.:/~<>])/(?:[\w.+@-]+/)+[\w.+@-]*")


def _json_at(path: Path, key: str):
    obj = json.loads(path.read_text())
    for part in key.split("/"):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def test_readme_tagged_numbers_come_from_named_results_files():
    """Every tagged number in README.md equals (to its printed precision) the value at the
    tagged key of the tagged results file, and that file is named visibly on the same
    line (the reader sees where the number comes from)."""
    text = README.read_text()
    tags = SRC_TAG.findall(text)
    assert len(tags) >= 3
    for line in text.splitlines():
        for num, src, key in SRC_TAG.findall(line):
            f = ROOT / src
            assert f.is_file(), src
            visible = re.sub(r"<!--.*?-->", "", line)
            assert Path(src).name in visible, f"{src} is not named beside {num}"
            v = float(_json_at(f, key))
            nd = len(num.split(".")[1]) if "." in num else 0
            assert round(v, nd) == pytest.approx(float(num.replace(",", ""))), (num, src, key, v)


def test_readme_numbers_that_had_no_source():
    """The figures issue 23 named as unsourced: the jax.random.categorical timing is gone
    or tagged, and the default HMM's build time carries a results file."""
    text = README.read_text()
    for line in text.splitlines():
        if "jax.random.categorical" in line:
            assert not re.search(r"\d ms for `jax\.random\.categorical`", line), line
        if "default HMM" in line and re.search(r"\d+m\d+s wall", line):
            assert SRC_TAG.search(line), line
    cat = [line for line in text.splitlines() if "jaxcd.decoding.sampling.categorical" in line
           or "step breakdown" in line]
    assert cat and any(SRC_TAG.search(x) for x in cat)


def test_results_md_has_no_machine_paths():
    text = RESULTS_MD.read_text()
    found = ABS_PATH.findall(text)
    assert not found, found[:5]


def test_scrub_paths():
    import sys
    sys.path.insert(0, str(ROOT))
    from experiments.make_results import scrub_paths
    s = scrub_paths(f"--hmm /root/.cache/jaxcd/hmm/x/hmm.safetensors --out {ROOT}/experiments/r/a "
                    "--data /tmp/pytest-of-root/pytest-3/shards0/full/data/data.jsonl "
                    "1/2 ms/step https://example.org/a/b ../x/y <cache>/hmm/z")
    assert not ABS_PATH.findall(s), s
    assert "experiments/r/a" in s and "hmm/x/hmm.safetensors" in s and "data/data.jsonl" in s
    assert "1/2 ms/step https://example.org/a/b ../x/y <cache>/hmm/z" in s
