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
    from jaxcd.decoding import decode
    from jaxcd.lm.interface import TableLM
    lm = TableLM.bigram(np.ones(4), np.ones((4, 4)), eos_token_id=0)
    ids, lens = np.zeros((2, 1), np.int32), np.ones(2, np.int32)
    out = decode.sample(jax.random.key(0), lm, lm.params, ids, lens, None, None, max_steps=3,
                        constrained=False, greedy=True)
    assert np.all(np.isnan(np.asarray(out.proposal_logprob)))
    assert np.all(np.isfinite(np.asarray(out.logprob)))


def test_mixed_constraints_one_batch_each_row_its_own():
    """generate(list of prompts, one constraint each) on the real model: every output is
    valid for its OWN regex / schema (checked with re and jsonschema), and a second batch
    of new constraints in the same buckets compiles nothing."""
    import json

    import jsonschema

    from jaxcd.decoding import compile_stats
    model = G.load_model()
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    reqs = [("A year?", {"regex": r"(19|20)[0-9]{2}"}),
            ("A city as JSON.", {"schema": schema}),
            ("Yes or no?", {"regex": "yes|no"}),
            ("A date.", {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"})]
    outs = jaxcd.generate_batch([p for p, _ in reqs], constraints=[c for _, c in reqs],
                                method="gcd", budget=24, num_samples=2, seed=1, model=model)
    assert len(outs) == len(reqs)
    for (p, c), out in zip(reqs, outs):
        assert len(out.texts) == 2 and all(out.valid)
        for t in out.texts:
            if "regex" in c:
                assert re.fullmatch(c["regex"], t), (c, t)
            else:
                jsonschema.validate(json.loads(t), c["schema"])
    # new constraints (and another budget) in the warm buckets: no tracing, no XLA compile
    schema2 = {"type": "object", "properties": {"town": {"type": "string", "maxLength": 12}},
               "required": ["town"], "additionalProperties": False}
    new = [{"regex": r"[a-c]{3}"}, {"schema": schema2}, {"regex": "red|green|blue"},
           {"regex": r"[0-9]{3}"}]
    assert jaxcd.decoding.buckets.common_bucket(
        [G.build_constraint(model.vocab, **c) for c in new]) == tuple(outs[0].stats["bucket"])
    c0 = compile_stats.snapshot()
    again = jaxcd.generate_batch([p for p, _ in reqs], constraints=new, method="gcd",
                                 budget=20, num_samples=2, seed=2, model=model)
    d = compile_stats.snapshot() - c0
    assert (d.traces, d.backend_compiles) == (0, 0), d
    for out, c in zip(again, new):
        for t in out.texts:
            if "regex" in c:
                assert re.fullmatch(c["regex"], t), (c, t)
            else:
                jsonschema.validate(json.loads(t), c["schema"])
        assert out.stats["xla_compiles"] == 0 and out.stats["steps"] <= 20
