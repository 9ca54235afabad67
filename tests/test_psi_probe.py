"""experiments.psi_probe: ψ at the argument boundaries of BFCL JSON calls.

References: the boundaries against the offsets recorded while the text is assembled
(hypothesis, values with commas, braces, quotes and escapes); the probe's log-odds
against a cache-free forward of the real SmolLM2 (``lm.logprobs_all``), the host-side
GCD mask (``jaxcd.allowed_tokens``) and ψ taken token by token from the next state
(``pgcd.prefix_logpsi`` after ``pgcd.advance``), not from the probe's one pass over the
vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from experiments import psi_probe as P

DATA = Path(__file__).parent / "data" / "bfcl"

values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False,
                                                                       allow_infinity=False)
    | st.text(alphabet=st.sampled_from(list('ab,{}[]":\\ é')), max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(alphabet="xyz,}", max_size=3),
                                                        c, max_size=3),
    max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(alphabet="abc_", min_size=1, max_size=5), values, max_size=4),
       st.booleans())
def test_boundaries_against_assembled_offsets(args, spaced):
    sep, colon = (", ", ": ") if spaced else (",", ":")
    text = '[{"name"' + colon + '"f"' + sep + '"arguments"' + colon + "{"
    want = []
    for n, (k, v) in enumerate(args.items()):
        text += json.dumps(k) + colon + json.dumps(v, ensure_ascii=False)
        want.append((len(text.encode()), "," if n + 1 < len(args) else "}"))
        text += sep if n + 1 < len(args) else ""
    text += "}}]"
    assert json.loads(text)[0]["arguments"] == args
    assert P.arg_boundaries(text) == want


def test_classify():
    from jaxcd.vocab import Vocabulary
    v = Vocabulary.from_token_bytes([b",", b", ", b"}", b"}}]", b" ,", b"a", b"", b"\"}"], eos_id=6)
    assert P.classify(v, np.arange(8)).tolist() == [0, 0, 1, 1, 2, 2, 2, 2]


def test_probe_against_cache_free_forward_and_token_psi(smol):
    import jax.numpy as jnp

    from experiments import bfcl
    from experiments.runner import build_constraint
    from hmm_distill import HMMParams
    from jaxcd import allowed_tokens
    from jaxcd.decoding import pgcd

    ex = next(e for e in bfcl.load_examples(DATA / "questions.jsonl",
                                             DATA / "possible_answer.jsonl")
              if e.id == "simple_python_68")     # years, then the optional include_human_impact
    text = bfcl.render(bfcl.answer_calls(ex), "json")
    budget = 64
    rng = np.random.default_rng(0)
    H, V = 4, smol.vocab.vocab_size
    hmm = HMMParams(*(jnp.asarray(x, jnp.float32) for x in (
        rng.dirichlet(np.ones(H)), rng.dirichlet(np.ones(H), H), rng.dirichlet(np.ones(V), H))))
    rows = P.probe(smol, hmm, ex, text, budget)
    assert [(r["next"], r["choice"]) for r in rows] == [(",", False), (",", True), ("}", False)]
    r = rows[1]

    tok = smol.tokenizer
    c = build_constraint(bfcl.constraint_nfa(ex, "json")[0], smol.vocab)
    fa, fad = c.fa, c.device
    ids = tok.encode(text[:P.arg_boundaries(text)[1][0]], add_special_tokens=False)
    prompt = bfcl.prompt_ids(ex, tok, "json")
    full = np.asarray([prompt + ids], np.int32)
    lp = np.asarray(smol.lm.logprobs_all(smol.params, jnp.asarray(full),
                                         jnp.asarray([full.shape[1]], jnp.int32)))[0, -1]
    lp = lp.astype(np.float64) - np.logaddexp.reduce(lp.astype(np.float64))
    mask = allowed_tokens(fa, ids, budget=budget)
    allowed = np.flatnonzero(mask)
    cls = P.classify(smol.vocab, allowed)
    pt = pgcd.backward(fad, hmm, budget)
    s = pgcd.init_state(fad, hmm)
    for v in ids:
        s = pgcd.advance(fad, hmm, s, jnp.int32(v))
    lpsi = np.array([float(pgcd.prefix_logpsi(fad, hmm, pt, pgcd.advance(fad, hmm, s, jnp.int32(v))))
                     for v in allowed])
    assert r["t"] == len(ids)

    def logodds(a):
        return np.logaddexp.reduce(a[cls == 0]) - np.logaddexp.reduce(a[cls == 1])

    assert (cls == 0).any() and (cls == 1).any()
    np.testing.assert_allclose(r["gcd_logodds"], logodds(lp[allowed]), atol=2e-3)
    np.testing.assert_allclose(r["look_logodds"], logodds(lp[allowed] + lpsi), atol=2e-2)
    # the reported shift against the reference's own (independently computed) shift
    np.testing.assert_allclose(r["shift"], logodds(lp[allowed] + lpsi) - logodds(lp[allowed]),
                               atol=2e-2)


def test_variants():
    """prompt_mix keeps every emission row a distribution and gives each prompt token at
    least w × its prompt share; token_bonus scales B by e^g; neither changes π or A."""
    from hmm_distill import HMMParams
    rng = np.random.default_rng(0)
    H, V = 3, 11
    hmm = HMMParams(rng.dirichlet(np.ones(H)), rng.dirichlet(np.ones(H), H),
                    rng.dirichlet(np.ones(V), H).astype(np.float32))
    assert P.variant(hmm, [1, 2]) is hmm
    m = P.variant(hmm, [4, 4, 7, 4], prompt_mix=0.25)
    np.testing.assert_allclose(np.asarray(m.B).sum(1), 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(m.B)[:, 4], 0.75 * hmm.B[:, 4] + 0.25 * 0.75, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(m.B)[:, 0], 0.75 * hmm.B[:, 0], rtol=1e-6)
    b = P.variant(hmm, [4], token_bonus=2.0)
    np.testing.assert_allclose(np.asarray(b.B), hmm.B * np.exp(2.0), rtol=1e-6)
    assert b.pi is hmm.pi and b.A is hmm.A and m.A is hmm.A
