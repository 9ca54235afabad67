"""`jaxcd generate` end to end (one test through a subprocess, the rest through
``jaxcd.cli.main`` in this process): outputs are valid and within the budget
(checked with `re.fullmatch` / `jsonschema`, not jaxcd), stdout carries only the text,
and user errors give one clear message, exit status 2 and no traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1")


def jaxcd(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxcd", *args], capture_output=True,
                          text=True, env=ENV, timeout=timeout)


@pytest.fixture
def cli(capsys, monkeypatch):
    """``jaxcd ...`` in this process (``jaxcd.cli.main``; argparse's own errors exit
    with status 2): the model and compiled programs are shared with the rest of the
    worker instead of being loaded again by a subprocess. One test below keeps the real
    ``python -m jaxcd`` entry point."""
    from jaxcd import cli as jcli
    from jaxcd import model_files
    monkeypatch.setattr(model_files, "enable_compile_cache", lambda *a, **k: None)

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = jcli.main(list(args))
        except SystemExit as e:
            code = e.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)
    return run


def assert_user_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout == ""
    for n in needles:
        assert n.lower() in r.stderr.lower(), (n, r.stderr[-2000:])


def test_generate_regex_valid_within_budget(smol_tokenizer):
    pattern = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    budget = 12
    r = jaxcd("generate", "--regex", pattern, "--prompt", "When did Apollo 11 land?",
              "--budget", str(budget), "--num-samples", "3", "--seed", "1", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert re.fullmatch(pattern, row["text"]), row
        # the text re-tokenises to at most budget - 1 tokens plus EOS; the count jaxcd
        # reports is the generated tokens before EOS
        assert row["valid"] and row["ended"] and row["tokens"] <= budget - 1
    assert "ms/step" in r.stderr          # stats go to stderr, not stdout


def test_generate_schema_file(tmp_path, cli):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(schema))
    r = cli("generate", "--schema", str(f), "--prompt", "Give me a JSON object.",
              "--budget", "10", "--num-samples", "2", "--whitespace", "")
    assert r.returncode == 0, r.stderr[-3000:]
    import jsonschema
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        jsonschema.validate(json.loads(line), schema)


@pytest.mark.parametrize("args,needles", [
    (["--regex", "(", "--budget", "8"], ["regex"]),
    (["--regex", r"[0-9]{10}", "--budget", "3"], ["budget", "smallest"]),
    (["--keywords", ",", "--budget", "8"], ["keyword"]),
    (["--schema", "/nonexistent/schema.json"], ["cannot read schema file"]),
    (["--method", "gcd"], ["needs a constraint"]),
    (["--regex", "a", "--budget", "0"], ["budget"]),
    (["--regex", "a", "--num-samples", "0"], ["num_samples"]),
    (["--model", "/nonexistent/model.gguf", "--regex", "a"], ["model.gguf"]),
])
def test_user_errors(args, needles, cli):
    assert_user_error(cli("generate", *args), *needles)


def test_mutually_exclusive_constraints(cli):
    r = cli("generate", "--regex", "a", "--keywords", "b")
    assert r.returncode == 2 and "not allowed with" in r.stderr and "Traceback" not in r.stderr


def test_bad_files(tmp_path, cli):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    assert_user_error(cli("generate", "--schema", str(bad_json)), "not valid JSON")
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(256))
    assert_user_error(cli("generate", "--model", str(corrupt), "--regex", "a"),
                      "corrupt.gguf")
    unsupported = tmp_path / "schema.json"
    unsupported.write_text(json.dumps({"type": "array", "uniqueItems": True,
                                       "prefixItems": [{}]}))
    assert_user_error(cli("generate", "--schema", str(unsupported)), "--no-strict")


def test_prompt_longer_than_context(cli):
    r = cli("generate", "--regex", "a", "--budget", "4", "--prompt", "hello " * 9000)
    assert_user_error(r, "context length")


PREDICATE = '''
import regex
PAT = regex.compile(rb"[0-9]{4}-[0-9]{2}-[0-9]{2}")
def date(prefix: bytes, final: bool) -> bool:
    return (PAT.fullmatch(prefix) if final else PAT.fullmatch(prefix, partial=True)) is not None
'''


def test_generate_smc_and_awrs_json_lines(tmp_path, cli, monkeypatch):
    """--method smc / awrs --json --show-particles: one line per particle, normalised
    weights summing to 1, the same log_Z on every line, every positive-weight text valid
    (checked with re). Without --show-particles: --num-samples lines, each a particle of
    positive weight (a draw from the weighted ensemble). In this process (the entry point
    itself is covered by the subprocess test)."""
    pattern = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    (tmp_path / "datepred.py").write_text(PREDICATE)
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = [("--regex", pattern, "--method", "smc", "--proposal", "gcd"),
            ("--method", "awrs", "--predicate", "datepred:date")]
    for args in runs:
        common = ("generate", *args, "--prompt", "When did Apollo 11 land?", "--budget", "12",
                  "--num-particles", "4", "--json")
        r = cli(*common, "--show-particles")
        assert r.returncode == 0, r.stderr[-3000:]
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(rows) == 4 and [x["particle"] for x in rows] == [0, 1, 2, 3]
        assert abs(sum(x["weight"] for x in rows) - 1) < 1e-6
        assert len({x["log_Z"] for x in rows}) == 1 and rows[0]["log_Z"] < 0
        for x in rows:
            if x["weight"] > 0:
                assert x["valid"] and re.fullmatch(pattern, x["text"]), x
        r = cli(*common, "--num-samples", "3")
        assert r.returncode == 0, r.stderr[-3000:]
        draws = [json.loads(line) for line in r.stdout.splitlines()]
        weighted = {x["text"] for x in rows if x["weight"] > 0}
        assert len(draws) == 3 and all(d["text"] in weighted and d["valid"] for d in draws)


def test_smc_user_errors(tmp_path, cli):
    import numpy as np
    from hmm_distill import HMMParams
    from hmm_distill.checkpoint import save_checkpoint
    r = cli("generate", "--regex", "a+", "--method", "smc", "--proposal", "lookahead")
    assert_user_error(r, "--hmm", "hmm-distill")
    ck = save_checkpoint(tmp_path / "tiny.safetensors",
                         HMMParams(np.ones(2) / 2, np.ones((2, 2)) / 2, np.ones((2, 10)) / 10),
                         fingerprint="tiny", eos_token_id=0)
    r = cli("generate", "--regex", "a+", "--method", "smc", "--proposal", "lookahead",
            "--hmm", str(ck), "--budget", "8")
    assert_user_error(r, "hmm-distill", "vocabulary")
    r = cli("generate", "--method", "awrs", "--predicate", "no_such_module:f")
    assert_user_error(r, "predicate")


def test_requests_file_continuous_batching(tmp_path, cli):
    """--requests FILE.jsonl (continuous batching by default): one JSON line per request,
    in input order, each valid for its own constraint (re / jsonschema)."""
    import jsonschema
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    reqs = [{"prompt": "A year?", "regex": r"(19|20)[0-9]{2}"},
            {"prompt": "Yes or no?", "regex": "yes|no"},
            {"prompt": "A JSON object.", "schema": schema},
            {"prompt": "A number.", "regex": r"[1-9][0-9]{0,3}"},
            {"prompt": "Answer.", "regex": "(maybe|perhaps)!"}]
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in reqs) + "\n")
    r = cli("generate", "--requests", str(f), "--budget", "12", "--batch-size", "2",
            "--whitespace", "")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["id"] for x in rows] == list(range(len(reqs)))
    for req, row in zip(reqs, rows):
        assert row["valid"] == [True], row
        if "regex" in req:
            assert re.fullmatch(req["regex"], row["texts"][0]), row
        else:
            jsonschema.validate(json.loads(row["texts"][0]), schema)
    assert "continuous" in r.stderr
