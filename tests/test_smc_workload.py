"""SMC on the public workload with the real model (issue 9's acceptance line "every
proposal with a budget: 100% valid within budget on the public workload with SmolLM2").

SmolLM2-135M-Instruct (the default GGUF), six of the smaller workload constraints (three
regexes, three JSON schemas), budget = the constraint's smallest budget + 4, ``K = 4``
particles, each budgeted proposal once, alternating regexes and schemas: ``gcd``,
``lookahead`` and ``product`` (the P-GCD proposals with a random HMM, ``H = 16`` over the
model's 49152 tokens). The experiments' smoke test (``test_experiments_smoke.py``) runs the
same proposals on real BFCL and WordNet constraints. ``lcd`` is left out: it has no budget guarantee. Every particle must end in the automaton's final
state (``res.valid``), with EOS within the budget, and its decoded text must be in the
language by an independent check: ``re.fullmatch`` for the regexes, ``json.loads`` +
``jsonschema.validate`` for the schemas. The importance weights of valid particles must be
finite (``> 0``), and ``log_Z`` finite.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

from hmm_distill import HMMParams
from jaxcd.decoding import smc
from jaxcd.generation import build_constraint, load_model
from jaxcd.lm.interface import pad_prompts

DATA = Path(__file__).parent / "data" / "workload"
WORKLOAD = {e["name"]: e for e in json.loads((DATA / "workload.json").read_text())["constraints"]}

# (constraint, proposal, prompt): every budgeted proposal once, on regexes and a JSON
# schema (the smaller workload constraints). Each pair is one compiled SMC program (the
# automaton's sizes are static, so programs cannot be shared across constraints).
CASES = [
    ("js_person_optional", "gcd", "Describe Ada Lovelace as a JSON object."),
    ("re_email", "lookahead", "Write an example email address for Jane Doe."),
    ("re_phone", "product", "Give a US phone number for a pizza place."),
]
MARGIN = 4
K = 4
H = 16


@pytest.fixture(scope="module")
def model():
    return load_model()


@pytest.fixture(scope="module")
def hmm(model):
    """A random HMM (Dirichlet rows) over the model's vocabulary; float32."""
    V = model.vocab.vocab_size
    rng = np.random.default_rng(0)
    return HMMParams(pi=jnp.asarray(rng.dirichlet(np.ones(H)), jnp.float32),
                     A=jnp.asarray(rng.dirichlet(np.ones(H), size=H), jnp.float32),
                     B=jnp.asarray(rng.dirichlet(np.full(V, 0.5), size=H), jnp.float32))


def in_language(entry, src, text):
    if entry["kind"] == "regex":
        return re.fullmatch(src, text) is not None
    try:
        jsonschema.validate(json.loads(text), json.loads(src))
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("name,proposal,prompt", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_smc_particles_valid_within_budget(name, proposal, prompt, model, hmm):
    entry = WORKLOAD[name]
    src = (DATA / entry["file"]).read_text()
    if entry["kind"] == "regex":
        fa = build_constraint(model.vocab, regex=src)
    else:
        fa = build_constraint(model.vocab, schema=src, whitespace_pattern="")
    budget = fa.min_budget + MARGIN
    fa = fa.to_device()
    eos = model.lm.eos_token_id
    ids, lens = pad_prompts([model.encode_prompt(prompt)], pad_id=getattr(model.lm, "pad_token_id", 0))
    for seed in (0,):
        res = smc.run(jax.random.key(seed), model.lm, model.params, jnp.asarray(ids),
                      jnp.asarray(lens), fa, budget=budget, num_particles=K, proposal=proposal,
                      hmm=hmm if proposal != "gcd" else None)
        toks = np.asarray(res.tokens)
        assert toks.shape == (1, K, budget)
        valid = np.asarray(res.valid)
        assert valid.all(), (name, proposal, valid)
        for row in toks[0]:
            assert eos in row, (name, proposal, "no EOS within the budget", row)
            m = list(row).index(eos)
            assert np.all(row[m:] == eos)
            text = model.vocab.decode_bytes(row[:m]).decode("utf-8")
            assert in_language(entry, src, text), (name, proposal, text)
        assert np.all(np.isfinite(np.asarray(res.log_weights))), (name, proposal, res.log_weights)
        assert np.isfinite(float(res.log_Z[0])), (name, proposal)
