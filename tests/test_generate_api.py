"""The user API of :mod:`jaxcd.generation`: one prompt -> one result, a list -> a list;
SMC options in one :class:`jaxcd.SMCConfig`; samples mean the same for every method (for
SMC, draws from the weighted particle ensemble); nothing written to disk by default."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

import jaxcd
from jaxcd.generation import _posterior


def test_smc_config_validates():
    assert jaxcd.SMCConfig().num_particles == 16
    from jaxcd.decoding.smc import DEFENSIVE
    assert jaxcd.SMCConfig().defensive == DEFENSIVE
    for bad, match in ((dict(num_particles=0), "num_particles"),
                       (dict(proposal="beam"), "proposal"),
                       (dict(resample="best"), "resample"),
                       (dict(ess_threshold=1.5), "ess_threshold"),
                       (dict(defensive=-0.1), "defensive")):
        with pytest.raises(ValueError, match=match):
            jaxcd.SMCConfig(**bad)
    with pytest.raises(Exception):
        jaxcd.SMCConfig().num_particles = 4          # frozen: hashable, no hidden edits


class _Vocab:
    def decode_bytes(self, row):
        return bytes(row)


def test_posterior_draws_follow_the_weights():
    """``num_samples`` draws from the ensemble have the normalised weights' frequencies
    (multinomial: each count within 4.5 standard deviations), zero-weight particles are
    never drawn, and with every weight 0 the draws are uniform."""
    m = SimpleNamespace(lm=SimpleNamespace(eos_token_id=0), vocab=_Vocab())
    tokens = np.array([[97, 0, 0], [98, 0, 0], [99, 0, 0], [100, 0, 0]])
    lw = np.array([np.log(0.5), np.log(0.3), np.log(0.2), -np.inf])
    n = 20000
    texts, ids, valid, ended, parts = _posterior(m, tokens, lw, [1, 1, 1, 0], seed=3,
                                                 num_samples=n, keep=True)
    counts = np.array([texts.count(t) for t in "abcd"])
    p = np.array([0.5, 0.3, 0.2, 0.0])
    assert counts[3] == 0 and all(valid) and all(ended)
    assert np.all(np.abs(counts - n * p) <= 4.5 * np.sqrt(n * p * (1 - p)) + 1e-9), counts
    np.testing.assert_allclose(parts.weights, p, atol=1e-12)
    assert parts.texts == ["a", "b", "c", "d"] and ids[0] in ([97], [98], [99])
    texts, *_ = _posterior(m, tokens, np.full(4, -np.inf), [0, 0, 0, 0], seed=1,
                           num_samples=4000, keep=False)
    counts = np.array([texts.count(t) for t in "abcd"])
    assert np.all(np.abs(counts - 1000) <= 4.5 * np.sqrt(4000 * 0.25 * 0.75)), counts


def test_one_prompt_one_result_and_clear_errors(smol):
    with pytest.raises(TypeError, match="generate_batch"):
        jaxcd.generate(["a", "b"], regex="x", model=smol)
    with pytest.raises(TypeError, match="generate for one"):
        jaxcd.generate_batch("a", regex="x", model=smol)
    with pytest.raises(ValueError, match="smc= is for"):
        jaxcd.generate("a", regex="x", smc=jaxcd.SMCConfig(), model=smol)
    with pytest.raises(TypeError, match="SMCConfig"):
        jaxcd.generate("a", regex="x", method="smc", smc={"num_particles": 4}, model=smol)
    with pytest.raises(ValueError, match="hmm"):
        jaxcd.generate("a", regex="x", method="smc", model=smol,
                       smc=jaxcd.SMCConfig(proposal="lookahead"))


def test_compiled_automaton_and_token_id_prompts_equal_the_spec_and_text(smol):
    """A constraint compiled once (``automaton=``) and a prompt given as its token ids
    draw exactly what the regex and the text draw (same seed); an automaton for another
    vocabulary or a stack is refused, naming why."""
    rx = "(yes|no|maybe)"
    fa = jaxcd.compile_regex(rx, smol.vocab)
    ids = smol.encode_prompt("Is Paris the capital of France?")
    for method, extra in (("gcd", {}), ("smc", {"smc": jaxcd.SMCConfig(num_particles=4)})):
        a = jaxcd.generate("Is Paris the capital of France?", regex=rx, method=method,
                           budget=6, num_samples=4, seed=3, model=smol, **extra)
        b = jaxcd.generate(ids, automaton=fa, method=method, budget=6, num_samples=4, seed=3,
                           model=smol, **extra)
        assert a.texts == b.texts and a.valid == b.valid, method
        assert all(re.fullmatch(rx, t) for t in b.texts)
    c = jaxcd.generate_batch([ids, "A colour?"], constraints=[{"automaton": fa},
                             {"regex": "red|blue"}], budget=6, seed=1, model=smol)
    assert re.fullmatch(rx, c[0].text) and c[1].text in ("red", "blue")
    other = jaxcd.compile_regex(rx, jaxcd.Vocabulary.from_token_bytes(
        [bytes([i]) for i in range(256)], eos_id=2))
    with pytest.raises(ValueError, match="vocabulary of 256"):
        jaxcd.generate(ids, automaton=other, budget=6, model=smol)
    with pytest.raises(TypeError, match="TensorizedAutomaton"):
        jaxcd.generate(ids, automaton=rx, budget=6, model=smol)
    with pytest.raises(ValueError, match="at most one"):
        jaxcd.generate(ids, automaton=fa, regex=rx, budget=6, model=smol)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 49152\)"):
        jaxcd.generate([5, 49152, -1], automaton=fa, budget=6, model=smol)


def test_smc_samples_are_posterior_draws_and_nothing_is_written(smol, tmp_path, monkeypatch):
    """SMC's ``num_samples`` texts are particles of positive weight; the particles come
    back only on request; generate writes no automaton to the cache directory unless
    asked (``cache=True``)."""
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path))
    rx = "(yes|no|maybe)"
    out = jaxcd.generate("Is Paris the capital of France?", regex=rx, method="smc",
                         budget=6, num_samples=5, seed=2, model=smol,
                         smc=jaxcd.SMCConfig(num_particles=8, return_particles=True))
    assert len(out.texts) == 5 and out.stats["num_particles"] == 8
    p = out.particles
    assert len(p.texts) == 8 and abs(sum(p.weights) - 1) < 1e-6
    positive = {t for t, w in zip(p.texts, p.weights) if w > 0}
    assert set(out.texts) <= positive and all(re.fullmatch(rx, t) for t in out.texts)
    assert np.isfinite(out.log_Z) and out.log_Z <= 0
    assert not (tmp_path / "automata").exists()
    again = jaxcd.generate("Is Paris the capital of France?", regex=rx, method="smc",
                           budget=6, num_samples=5, seed=2, model=smol,
                           smc=jaxcd.SMCConfig(num_particles=8), cache=True)
    assert again.particles is None and again.texts == out.texts
    assert list((tmp_path / "automata").glob("*.npz"))
