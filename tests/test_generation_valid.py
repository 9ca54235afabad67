"""`valid` means "constraint met" for every method, including `--method none` (no
masks: the text is checked afterwards) — compared with `re.fullmatch`; greedy decoding
reports no fake proposal log-probability."""

import re

import numpy as np

import jaxcd
from jaxcd import generation as G


def test_method_none_valid_is_constraint_met():
    model = G.load_model()
    pattern = r"[0-9]{2}"
    out = jaxcd.generate("Pick a number from 10 to 99. Answer with the number only.",
                         regex=pattern, method="none", budget=4, num_samples=8, seed=3,
                         temperature=1.5, model=model)
    want = [bool(e and re.fullmatch(pattern, t)) for t, e in zip(out.texts, out.ended)]
    assert out.valid == want
    assert not all(want)              # the check can fail: unconstrained text goes astray
    gcd = jaxcd.generate("Pick a number from 10 to 99.", regex=pattern, method="gcd", budget=4,
                         num_samples=4, seed=3, model=model)
    assert all(gcd.valid) and all(re.fullmatch(pattern, t) for t in gcd.texts)


def test_greedy_reports_no_proposal_logprob():
    import jax
    from jaxcd import decode
    from jaxcd.lm.interface import TableLM
    lm = TableLM.bigram(np.ones(4), np.ones((4, 4)), eos_token_id=0)
    ids, lens = np.zeros((2, 1), np.int32), np.ones(2, np.int32)
    out = decode.sample(jax.random.key(0), lm, lm.params, ids, lens, None, None, budget=3,
                        constrained=False, greedy=True)
    assert np.all(np.isnan(np.asarray(out.proposal_logprob)))
    assert np.all(np.isfinite(np.asarray(out.logprob)))
