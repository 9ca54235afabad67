"""``sample_stepwise`` (host loop around the LM's compiled step + one small jitted
mask/sample/advance function) draws exactly the tokens of the one-program ``sample``
with the same key, and reuses one compiled LM step across constraints and budgets."""

import jax
import numpy as np
import pytest

from jaxcd import Vocabulary, compile_regex
from jaxcd.decoding.decode import _lm_step_donated, sample, sample_stepwise, tables_for
from jaxcd.lm import TableLM, pad_prompts

TOKENS = [b"<eos>", b"a", b"b", b"ab", b"ba", b"-"]
EOS = 0
V = len(TOKENS)
VOCAB = Vocabulary.from_token_bytes(TOKENS, eos_id=EOS)
PATTERN = r"(ab|b)*a?-?"


def toy_lm(depth, seed=7):
    rng = np.random.default_rng(seed)
    table = {}

    def fn(prefix):
        if prefix not in table:
            table[prefix] = rng.dirichlet(np.ones(V) * 0.7) + 1e-3
        return table[prefix]

    return TableLM.from_function(fn, V, depth, eos_token_id=EOS)


@pytest.fixture(scope="module")
def lm():
    return toy_lm(6)


@pytest.fixture(scope="module")
def fa():
    return compile_regex(PATTERN, VOCAB).to_device()


def assert_same(a, b):
    """Tokens and flags bit-identical; float sums up to XLA's rounding of differently
    fused programs (a few float32 ulps)."""
    for name, x, y in zip(a._fields, a, b):
        if name == "steps":          # steps run: compared where both stop when done
            continue
        x, y = np.asarray(x), np.asarray(y)
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize("method", ["gcd", "lcd", "none"])
@pytest.mark.parametrize("budget,temperature,greedy", [(4, 1.0, False), (6, 0.7, False),
                                                       (5, 1.0, True)])
def test_stepwise_equals_sample(lm, fa, method, budget, temperature, greedy):
    N = 400
    ids, lens = pad_prompts([[1]] * N)
    c = method != "none"
    tables = tables_for(fa, method, budget)
    kw = dict(budget=budget, constrained=c, temperature=temperature, greedy=greedy)
    ref = sample(jax.random.PRNGKey(11), lm, lm.params, ids, lens, fa if c else None, tables,
                 **kw)
    for stop in (True, False):
        out = sample_stepwise(jax.random.PRNGKey(11), lm, lm.params, ids, lens,
                              fa if c else None, tables, max_len=1 + budget,
                              stop_when_done=stop, **kw)
        assert_same(ref, out)
        if stop:
            assert int(out.steps) == int(ref.steps) <= budget
    if method == "gcd":
        assert np.asarray(out.valid).all()


def test_early_stop_pads_with_eos(fa):
    # an LM that always wants EOS: every row ends at step 1, the loop stops there
    lm = TableLM.bigram(np.array([10.0, 1, 1, 1, 1, 1]), np.tile(np.array([10.0, 1, 1, 1, 1, 1]),
                                                                 (V, 1)), eos_token_id=EOS)
    ids, lens = pad_prompts([[1]] * 64)
    tables = tables_for(fa, "gcd", 8)
    a = sample(jax.random.PRNGKey(0), lm, lm.params, ids, lens, fa, tables, max_steps=8,
               constrained=True)
    b = sample_stepwise(jax.random.PRNGKey(0), lm, lm.params, ids, lens, fa, tables, budget=8,
                        max_len=9, constrained=True)
    assert_same(a, b)
    assert np.asarray(b.tokens).shape == (64, 8)


def test_lm_step_compiled_once_across_constraints_and_budgets(lm, fa):
    ids, lens = pad_prompts([[1]] * 32)
    fa2 = compile_regex(r"(a|b)+-", VOCAB).to_device()
    before = _lm_step_donated._cache_size()
    for f, budgets in ((fa, (3, 5, 6)), (fa2, (4, 6))):
        for n in budgets:
            for method in ("gcd", "lcd"):
                out = sample_stepwise(jax.random.PRNGKey(n), lm, lm.params, ids, lens, f,
                                      tables_for(f, method, n), budget=n, max_len=8,
                                      constrained=True, stop_when_done=False)
                if method == "gcd":
                    assert np.asarray(out.valid).all()
    assert _lm_step_donated._cache_size() - before <= 1


def test_argument_checks(lm, fa):
    ids, lens = pad_prompts([[1]] * 4)
    with pytest.raises(ValueError, match="max_len"):
        sample_stepwise(jax.random.PRNGKey(0), lm, lm.params, ids, lens, fa,
                        tables_for(fa, "gcd", 6), budget=6, max_len=5, constrained=True)
    with pytest.raises(ValueError, match="tables"):
        sample_stepwise(jax.random.PRNGKey(0), lm, lm.params, ids, lens, fa,
                        tables_for(fa, "gcd", 4), budget=6, max_len=8, constrained=True)
