"""docs/own_model.md: the Flax NNX model adapted to LanguageModel, decoded with GCD and
SMC, runs as written; its outputs are checked against the regular expression (Python's
``re``, independent of jaxcd's automaton) and the SMC weights against their definition."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

DOC = Path(__file__).resolve().parents[1] / "docs" / "own_model.md"


def test_own_nnx_model_decodes_with_gcd_and_smc():
    import jax

    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    ns: dict = {"__name__": "__own_model__"}
    exec(compile(block, str(DOC), "exec"), ns)
    lang = re.compile(r"-?[1-9][0-9]{2}")
    out, texts = ns["out"], ns["texts"]
    assert bool(np.all(np.asarray(out.valid))) and len(texts) == 8
    for t in texts:                                    # every GCD sample is in the language
        assert lang.fullmatch(t), t
    res, particles, weights = ns["res"], ns["particles"], np.asarray(ns["weights"])
    assert len(particles) == 16 and abs(weights.sum() - 1) < 1e-5
    for p, v in zip(particles, np.asarray(res.valid)[0]):
        assert bool(v) == bool(lang.fullmatch(p)), p
    assert np.isfinite(float(res.log_Z[0])) and float(res.log_Z[0]) < 0
    # the adapter's prefill is the step applied token by token (left padding skipped)
    lm, params = ns["lm"], ns["params"]
    import jax.numpy as jnp
    h, logp = lm.prefill(params, jnp.array([[5, 0, 1, 2]]), jnp.array([3]), 8)
    h2 = jnp.zeros((1, 16))
    for t in (0, 1, 2):
        h2, logp2 = lm.step(params, h2, jnp.array([t]))
    np.testing.assert_allclose(np.asarray(h), np.asarray(h2), atol=1e-6)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(logp2), atol=1e-6)
    assert jax.tree.leaves(params)                     # the weights travel as a pytree
