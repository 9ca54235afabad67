"""README.md runs as written, and its numbers come from the results files.

- The ```python blocks are executed in order, in one namespace, as a reader would paste
  them; what they print is then checked against independent references (the `regex`
  module's partial matching for the mask, `json` + `jsonschema` for generated JSON).
- The ```bash blocks: every command is recognised and parsed by the program it names
  (`jaxcd` and `hmm-distill` through their own argument parsers, `make` targets against
  the Makefile, `python -m`/`python FILE` against the repository); the HMM distillation
  commands are also run, on the toy LM the README names for a quick run.
- Every tagged number (``<!-- results: FILE#KEY -->``, see experiments/readme_table.py)
  equals the value at KEY in FILE to its printed precision; every decimal or percentage
  in the prose carries a tag; the results table is what experiments/readme_table.py
  renders from the results files.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import regex

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS_MD = ROOT / "experiments" / "RESULTS.md"
sys.path.insert(0, str(ROOT))

from experiments import readme_table  # noqa: E402

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: an absolute path: "/" not after a word character, ".", ":", "/", "~", "<", ">" (so not
#: "1/2", "ms/step", "https://", "../x", "<cache>/x"), then at least one "name/" component
ABS_PATH = re.compile(r"(?<![\w.:/~<>])/(?:[\w.+@-]+/)+[\w.+@-]*")


def blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(README.read_text()) if kind == lang]


def prose() -> str:
    """README.md without its code blocks and inline code."""
    text = BLOCK.sub("", README.read_text())
    assert text.count("`") % 2 == 0, "unbalanced inline code in README.md"
    return re.sub(r"`[^`]*`", "", text)                      # inline code may wrap lines


# ---------------------------------------------------------------------------------------
# Python blocks
# ---------------------------------------------------------------------------------------
def _check_mask(ns):
    """After '{"x":' (compact JSON, budget 8) the allowed tokens are exactly the ordinary
    tokens that keep the text a prefix of {"x":<integer>} (the budget does not bind for
    these one-token continuations)."""
    tok, mask = ns["tok"], ns["mask"]
    assert mask.shape == (49152,)
    prefix = '{"x":'
    specials = set(tok.all_special_ids)
    lang = regex.compile(r'\{"x":-?(0|[1-9][0-9]*)\}')
    allowed = set(np.flatnonzero(mask).tolist())
    assert allowed and not allowed & specials
    for v in range(len(tok)):
        if v in specials:
            continue
        ok = lang.fullmatch(prefix + tok.decode([v]), partial=True) is not None
        assert ok == (v in allowed), (v, tok.decode([v]))
    phone = regex.compile(r"\(\d{3}\) \d{3}-\d{4}")
    assert ns["phone"].min_budget >= 1 and phone.fullmatch("(555) 123-4567")


def _check_gcd(ns):
    out, schema = ns["out"], ns["schema"]
    assert len(out.texts) == 4 and all(out.valid)
    for text in out.texts:                                    # independent of jaxcd's flag
        jsonschema.validate(json.loads(text), schema)
        assert set(json.loads(text)) <= set(schema["properties"])   # closed objects


def _check_smc(ns):
    out, schema = ns["out"], ns["schema"]
    parts = out.particles
    assert len(out.texts) == 1 and out.valid[0]              # one draw from the ensemble
    assert len(parts.texts) == 8 and abs(sum(parts.weights) - 1) < 1e-6
    assert out.text in [t for t, w in zip(parts.texts, parts.weights) if w > 0]
    assert np.isfinite(out.log_Z) and out.log_Z < 0
    for text in [out.text] + list(parts.texts):
        obj = json.loads(text)
        jsonschema.validate(obj, schema)
        assert set(obj) <= set(schema["properties"])            # generation closes objects


def _check_batch(ns):
    outs, schema = ns["outs"], ns["schema"]
    assert len(outs) == 3 and all(len(o.texts) == 1 and o.valid[0] for o in outs)
    assert re.fullmatch(r"(19|20)\d\d", outs[0].texts[0])
    jsonschema.validate(json.loads(outs[1].texts[0]), schema)
    assert outs[2].texts[0] in ("yes", "no")


def _check_model(ns):
    assert ns["out"].texts[0] in ("yes", "no") and ns["out"].valid[0]


def _check_bigram(ns):
    state, logp = ns["state"], ns["logp"]
    assert logp.shape == (1, 8) and np.allclose(np.exp(np.asarray(logp)).sum(-1), 1, atol=1e-6)
    assert int(state[0]) == 2                                 # the prompt's last token


#: (a string that identifies the block, the check run right after it)
PYTHON_CHECKS = [
    ("allowed_tokens(", _check_mask),
    ('method="gcd",\n                     budget=48, num_samples=4', _check_gcd),
    ('method="smc"', _check_smc),
    ("constraints=[", _check_batch),
    ("jaxcd.load_model()", _check_model),
    ("class Bigram", _check_bigram),
]


def test_every_python_block_has_a_check():
    for body in blocks("python"):
        assert sum(marker in body for marker, _ in PYTHON_CHECKS) == 1, body[:200]


def test_python_blocks_run_in_order(capsys):
    """All python blocks, in README order, in one namespace; each one's outputs checked."""
    ns: dict = {"__name__": "__readme__"}
    for i, body in enumerate(blocks("python"), 1):
        exec(compile(body, f"README.md python block {i}", "exec"), ns)
        (check,) = [c for marker, c in PYTHON_CHECKS if marker in body]
        check(ns)
    printed = capsys.readouterr().out
    assert "(49152,)" in printed                              # the first block's print


# ---------------------------------------------------------------------------------------
# shell blocks
# ---------------------------------------------------------------------------------------
def shell_commands() -> list[list[str]]:
    """Every command of every bash block, continuation lines joined, comments dropped."""
    cmds = []
    for body in blocks("bash"):
        for line in body.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                cmds.append(argv)
    return cmds


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([\w-]+):", text, flags=re.M))


def check_command(argv: list[str]) -> None:
    """Raise unless ``argv`` is a command this repository provides, with valid arguments."""
    from hmm_distill.cli import build_parser as hmm_parser
    from jaxcd.cli import build_parser as jaxcd_parser

    prog, args = argv[0], argv[1:]
    if prog == "make":
        assert set(args) <= _makefile_targets(), args
    elif prog == "jaxcd" or argv[:3] == ["python", "-m", "jaxcd"]:
        jaxcd_parser().parse_args(args if prog == "jaxcd" else argv[3:])
    elif prog == "hmm-distill":
        hmm_parser().parse_args(args)
    elif argv[:2] == ["python", "-m"]:
        assert importlib.util.find_spec(argv[2]) is not None, argv[2]
    elif prog == "python":
        assert (ROOT / args[0]).is_file(), args[0]
    elif argv[:2] == ["pip", "install"]:
        extras = re.findall(r"\[(\w+)\]", " ".join(args))
        pyproject = (ROOT / "pyproject.toml").read_text()
        for e in extras:
            assert re.search(rf"^{e} = \[", pyproject, flags=re.M), e
    else:
        raise AssertionError(f"README command not recognised: {shlex.join(argv)}")


def test_shell_commands_parse():
    cmds = shell_commands()
    assert [c[:2] for c in cmds if c[0] == "make"] == [["make", "run"], ["make", "test"]]
    for argv in cmds:
        check_command(argv)


def test_check_command_rejects_what_does_not_exist():
    for bad in (["make", "bench-all"], ["jaxcd", "generate", "--no-such-flag"],
                ["jaxcd", "serve"], ["hmm-distill", "train", "--bogus"],
                ["python", "-m", "experiments.nope"],
                ["python", "experiments/nope.py"], ["curl", "x"]):
        with pytest.raises((AssertionError, SystemExit)):
            check_command(bad)


def test_make_targets_run_what_the_readme_says():
    """`make run` runs the demo and `make test` the test suite (what .ci/run calls)."""
    text = (ROOT / "Makefile").read_text()
    run = re.search(r"^run:.*\n((?:\t.*\n)+)", text, flags=re.M).group(1)
    test = re.search(r"^test:.*\n((?:\t.*\n)+)", text, flags=re.M).group(1)
    assert "-m jaxcd demo" in run
    assert "-m pytest" in test and "tests" in test


def test_hmm_distill_commands_run_on_the_toy_lm(tmp_path, monkeypatch):
    """The README's three hmm-distill commands, as written but on `--lm toy:64` (the
    README's own quick variant) and under a temporary folder: sample, train, eval."""
    from hmm_distill.cli import main as hmm_main

    monkeypatch.chdir(tmp_path)
    cmds = [c for c in shell_commands() if c[0] == "hmm-distill"]
    assert [c[1] for c in cmds] == ["sample", "train", "eval"]
    for argv in cmds:
        args = ["toy:64" if a == "gguf" else a for a in argv[1:]]
        assert hmm_main(args) == 0, argv
    ckpt = tmp_path / "runs/smol/h128/hmm.safetensors"
    assert ckpt.is_file()
    from jaxcd.hmm import load_checkpoint
    load_checkpoint(ckpt, expect_vocab_size=64, expect_hidden_size=128)


# ---------------------------------------------------------------------------------------
# numbers and their sources
# ---------------------------------------------------------------------------------------
def test_tagged_numbers_match_their_results_files():
    text = README.read_text()
    tags = readme_table.TAG.findall(text)
    assert len(tags) >= 10
    for num, pct, file, key in tags:
        assert (ROOT / file).is_file(), file
        v = float(readme_table.lookup(file, key))
        if pct:
            v *= 100
        nd = len(num.split(".")[1]) if "." in num else 0
        assert round(v, nd) == pytest.approx(float(num.replace(",", ""))), (num, file, key, v)


def test_tags_point_at_results_files_only():
    for _, _, file, _ in readme_table.TAG.findall(README.read_text()):
        assert file.startswith("experiments/results/") and file.endswith(".json"), file


def test_no_untagged_measurements_in_the_prose():
    """Every decimal number and every percentage outside code carries a results tag."""
    text = readme_table.TAG.sub("", prose())
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)                  # link targets
    found = re.findall(r"(?<![\w.-])\d+\.\d+(?!\w)|\d+(?:\.\d+)?\s?%", text)
    versions = {"3.11"}                                         # "Python ≥ 3.11"
    assert not [f for f in found if f not in versions], found


def test_results_table_is_generated_from_the_results_files():
    assert readme_table.readme_block(README.read_text()) == readme_table.render(), (
        "run `python -m experiments.readme_table --write`")


def test_demo_quotes_the_results_files():
    """What `make run` quotes (jaxcd/data/demo_results.json) is what the results files
    say now, and the demo's lines print those numbers."""
    from jaxcd.cli import _demo_facts
    facts = _demo_facts()
    assert facts == readme_table.demo_facts(), "run `python -m experiments.readme_table --write`"
    la = facts["lookahead"]
    assert len(la["k"]) == len(la["lookahead_pct"]) == len(la["smc_gcd_pct"]) == 3
    assert abs(sum(facts["paris"]["posterior"].values()) - 1) < 0.01


def test_lookup_selectors_and_escapes(tmp_path):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"a/b": {"c": 1}, "rows": [{"m": "x", "k": 1, "v": 2.5},
                                                        {"m": "x", "k": 2, "v": 3.5}]}))
    assert readme_table.lookup("r.json", "a~1b/c", tmp_path) == 1
    assert readme_table.lookup("r.json", "rows/m=x,k=2/v", tmp_path) == 3.5
    assert readme_table.lookup("r.json", "rows/0/v", tmp_path) == 2.5
    with pytest.raises(KeyError):
        readme_table.lookup("r.json", "rows/m=x/v", tmp_path)   # two elements match


def test_readme_is_short_and_has_no_history():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"session\s*\d|_s\d+\b", text, flags=re.I)
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link


# ---------------------------------------------------------------------------------------
# machine paths
# ---------------------------------------------------------------------------------------
def test_results_md_has_no_machine_paths():
    found = ABS_PATH.findall(RESULTS_MD.read_text())
    assert not found, found[:5]


def test_results_files_have_no_machine_paths():
    """No results file names a path of the machine it ran on (repository paths are
    relative, the cache is <cache>, temporary folders <tmp>)."""
    machine = re.compile(r"(?<![\w.:/~<>])/(?:work|tmp|root|home|Users)/[\w.+@-]")
    bad = []
    for p in sorted((ROOT / "experiments" / "results").rglob("*")):
        if p.is_file() and p.suffix in (".json", ".jsonl", ".md", ".txt"):
            if machine.search(p.read_text(errors="replace")):
                bad.append(str(p.relative_to(ROOT)))
    assert not bad, bad


def test_scrub_paths():
    from experiments.make_results import scrub_paths
    s = scrub_paths(f"--hmm /root/.cache/jaxcd/hmm/x/hmm.safetensors --out {ROOT}/experiments/r/a "
                    "--data /tmp/pytest-of-root/pytest-3/shards0/full/data/data.jsonl "
                    "1/2 ms/step https://example.org/a/b ../x/y <cache>/hmm/z")
    assert not ABS_PATH.findall(s), s


def test_results_file_names_carry_no_work_period():
    bad = [str(p.relative_to(ROOT)) for p in (ROOT / "experiments" / "results").rglob("*")
           if re.search(r"_s\d+(?![\w])|_s\d+_|session", p.name, flags=re.I)]
    assert not bad, bad
