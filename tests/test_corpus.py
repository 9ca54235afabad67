"""Real schemas from tests/data/corpus (BFCL, SchemaStore, Kubernetes, ``pattern``
regexes; see its README) compile to byte automata with a pass-rate floor, and every
failure is a clear jaxcd error (never a crash). A fixed subset keeps this fast;
``experiments/bench_coverage.py`` compiles every entry on the real vocabulary.

Each accepted automaton is also checked on a sample: strings drawn from it parse as
JSON and validate with ``jsonschema`` (numbers as ``Decimal``)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from jaxcd.automata.fsa import determinize, minimize
from jaxcd.automata.json_schema import schema_to_nfa
from jaxcd.errors import JaxcdError

from test_json_schema import sample_strings, validates

CORPUS = Path(__file__).parent / "data" / "corpus"
# schemas whose automata take over a few seconds on a shared CPU (run by the benchmark)
SLOW = {"API Builder", "publiccode.yml", "Buildkite", "Cargo Make", "arc.json",
        "sarif-1.0.0.json", "Azure Device Update for IoT Hub import manifest", "Hugo",
        "SauceCTL Configuration", "Ansible Inventory", "statefulset-apps-v1",
        "resourceclaim-resource-v1", "resourceclaimtemplate-resource-v1",
        "volumeattachment-storage-v1",
        # strict=False: uniqueItems on its enum arrays, 110k byte states, ~50 s here
        "JSON Schema Draft 7"}


def load(name):
    return json.loads((CORPUS / f"{name}.json").read_text())


def compile_rate(items, strict=True, validate=0):
    ok, errors = 0, []
    for name, schema in items:
        try:
            nfa, _ = schema_to_nfa(schema, "", strict)
            d = minimize(determinize(nfa))
        except JaxcdError as e:
            assert str(e), name
            errors.append((name, str(e)[:120]))
            continue
        ok += 1
        if validate and d.num_states and d.num_states < 3000:
            for s in sample_strings(d, np.random.default_rng(0), validate, max_len=80):
                assert validates(schema, s.decode("utf-8")), (name, s)
    return ok, errors


def test_bfcl_subset():
    items = [(e["name"], e["schema"]) for e in load("bfcl")]
    items = random.Random(0).sample(items, 60)
    ok, errors = compile_rate(items, validate=3)
    assert ok == len(items), errors          # all 400 compile in the benchmark


def test_schemastore_and_kubernetes_subset():
    items = [(e["name"], e["schema"]) for c in ("schemastore", "kubernetes")
             for e in load(c) if e["name"] not in SLOW]
    ok, errors = compile_rate(items, validate=2)
    # strict: refusals are uniqueItems, look-around, remote $refs
    assert ok >= 10 and ok >= 0.55 * len(items), (ok, len(items), errors)
    refused = {name for name, _ in errors}
    ok2, errors2 = compile_rate([it for it in items if it[0] in refused], strict=False)
    assert ok + ok2 >= len(items) - 1, errors2   # strict=False: only look-around keys remain


def test_pattern_corpus():
    items = [(e["pattern"], {"type": "string", "pattern": e["pattern"]})
             for e in load("patterns")][::2]
    ok, errors = compile_rate(items, validate=2)
    assert ok >= 0.95 * len(items), errors   # look-around and \\b are refused


@pytest.mark.parametrize("name", ["bfcl", "schemastore", "kubernetes", "patterns"])
def test_corpus_files_are_modest(name):
    assert (CORPUS / f"{name}.json").stat().st_size < 1_000_000
