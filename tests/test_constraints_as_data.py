"""Constraints are data (issue 19): bucketed automata and budgets share compiled
programs, stacks give each row its own constraint, and padding changes nothing.

References: the unpadded automaton's own tables and masks (padding must not change a
single bit), Python's ``re`` for validity, and the single-constraint decoders (a row of
a mixed batch must decode exactly as it does alone: the draws of a row depend only on
its own logits and the step's key)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcd import Vocabulary, compile_regex

from jaxcd.decoding import gcd, pgcd, smc
from jaxcd.decoding import compile_stats
from jaxcd.decoding.buckets import (automaton_bucket, bucket_automaton, budget_bucket,
                                    flatten, stack_automata)
from jaxcd.decoding.decode import prefill, sample, tables_for
from jaxcd.lm import TableLM, pad_prompts

TOKENS = [b"<eos>", b"a", b"b", b"ab", b"ba", b"-", b"0", b"1", b"01", b"x"]
EOS = 0
V = len(TOKENS)
VOCAB = Vocabulary.from_token_bytes(TOKENS, eos_id=EOS)
PATTERNS = [r"(ab|b)*a?-?", r"[01]{2,5}", r"x(a|b)+x", r"-?(0|1(0|1)*)"]


def toy_lm(depth=3, seed=3):
    rng = np.random.default_rng(seed)
    table = {}

    def fn(prefix):
        if prefix not in table:
            table[prefix] = rng.dirichlet(np.ones(V) * 0.7) + 1e-3
        return table[prefix]

    return TableLM.from_function(fn, V, depth, eos_token_id=EOS)


@pytest.fixture(scope="module")
def fas():
    return [compile_regex(p, VOCAB) for p in PATTERNS]


def text_of(row):
    row = list(row)
    row = row[: row.index(EOS)] if EOS in row else row
    return b"".join(TOKENS[v] for v in row).decode()


def test_state_ids_are_leaves_and_key_is_not_static(fas):
    leaves, treedef = jax.tree_util.tree_flatten(fas[0])
    assert len(leaves) == 10                                   # 7 arrays + 3 state ids
    a, b = bucket_automaton(fas[0], (64, 256, 16, 64)), bucket_automaton(fas[1], (64, 256, 16, 64))
    assert a.key != b.key
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    assert [x.shape for x in jax.tree_util.tree_leaves(a)] == \
        [x.shape for x in jax.tree_util.tree_leaves(b)]


def test_padding_keeps_every_mask_and_beta(fas):
    """β of every real state and every budget, and the packed masks, are those of the
    unpadded automaton."""
    for fa in fas:
        pfa = bucket_automaton(fa)
        assert automaton_bucket(fa) == pfa.bucket
        from jaxcd.automata.tensorized import pad_automaton
        _, new_id = pad_automaton(fa, *pfa.bucket)
        for n in (3, 7, 11):
            N = budget_bucket(n)
            ref = np.asarray(gcd.backward(fa.to_device(), n).beta)
            got = np.asarray(gcd.backward(pfa.to_device(), n, N).beta)
            np.testing.assert_array_equal(got[: n + 1, new_id], ref)
            for s in range(fa.num_states):
                for t in range(n):
                    np.testing.assert_array_equal(
                        pfa.mask_words(int(new_id[s]), n - t), fa.mask_words(s, n - t))


def _decode(lm, fa, n, key=0, B=8, steps=None, method="gcd"):
    ids, lens = pad_prompts([[1]] * B)
    steps = steps or n
    tables = tables_for(fa, method, n, steps)
    return sample(jax.random.key(key), lm, lm.params, ids, lens, fa, tables, max_steps=steps,
                  budget=n, constrained=True)


def test_second_constraint_and_budget_in_a_bucket_compile_nothing(fas):
    lm = toy_lm()
    bucket = (64, 256, 16, 64)
    a = bucket_automaton(fas[0], bucket).to_device()
    b = bucket_automaton(fas[1], bucket).to_device()
    jax.block_until_ready(_decode(lm, a, 9, steps=16))        # warm-up of the bucket
    c0 = compile_stats.snapshot()
    out_b = jax.block_until_ready(_decode(lm, b, 9, steps=16))
    out_c = jax.block_until_ready(_decode(lm, a, 13, steps=16))   # another budget
    d = compile_stats.snapshot() - c0
    assert (d.traces, d.backend_compiles) == (0, 0), d
    for row in np.asarray(out_b.tokens):
        assert re.fullmatch(PATTERNS[1], text_of(row))
    assert np.asarray(out_b.valid).all() and np.asarray(out_c.valid).all()
    assert int(out_b.steps) <= 9 and int(out_c.steps) <= 13


def test_budget_bucket_gives_the_tokens_of_the_exact_budget(fas):
    lm = toy_lm()
    for fa in fas:
        pfa = bucket_automaton(fa).to_device()
        for n in (5, 9):
            exact = _decode(lm, fa.to_device(), n, key=n, B=16)
            bucketed = _decode(lm, pfa, n, key=n, B=16, steps=budget_bucket(n))
            np.testing.assert_array_equal(np.asarray(bucketed.tokens)[:, :n], np.asarray(exact.tokens))
            assert (np.asarray(bucketed.tokens)[:, n:] == EOS).all()
            np.testing.assert_allclose(np.asarray(bucketed.logprob), np.asarray(exact.logprob),
                                       rtol=1e-6)
            assert int(bucketed.steps) == int(exact.steps) <= n


@pytest.mark.parametrize("method", ["gcd", "lcd"])
def test_mixed_batch_rows_decode_as_alone(fas, method):
    """Row b of a mixed batch gets exactly the tokens it gets in a batch where every row
    has its constraint, and its output matches its own regex (GCD). The constraint alone
    is the unpadded automaton for the first pattern, and for the others the automaton
    padded to the stack's bucket (one program for them, shared with the test above;
    padding changes no draw: the first pattern here, every pattern above)."""
    lm = toy_lm()
    B, n = 16, 9
    which = [i % len(fas) for i in range(B)]
    stack = stack_automata([fas[i] for i in which]).to_device()
    mixed = _decode(lm, stack, n, key=1, B=B, steps=16, method=method)
    toks = np.asarray(mixed.tokens)
    for i, fa in enumerate(fas):
        one = fa if i == 0 else bucket_automaton(fa, stack.bucket)
        alone = _decode(lm, one.to_device(), n, key=1, B=B, steps=16, method=method)
        rows = [r for r in range(B) if which[r] == i]
        np.testing.assert_array_equal(toks[rows], np.asarray(alone.tokens)[rows])
        np.testing.assert_array_equal(np.asarray(mixed.valid)[rows], np.asarray(alone.valid)[rows])
        if method == "gcd":
            for r in rows:
                assert re.fullmatch(PATTERNS[i], text_of(toks[r])), (PATTERNS[i], text_of(toks[r]))
    # the rows really differ in constraint: some output is invalid for another row's regex
    assert any(not re.fullmatch(PATTERNS[(which[r] + 1) % 4], text_of(toks[r])) for r in range(B))


def test_stacked_tables_are_each_rows_tables(fas):
    stack = stack_automata(fas)
    S = stack.num_states
    tab = gcd.backward(stack.to_device(), 7, 16)
    for b, fa in enumerate(fas):
        from jaxcd.automata.tensorized import pad_automaton
        _, new_id = pad_automaton(fa, *stack.bucket)
        ref = np.asarray(gcd.backward(fa.to_device(), 7).beta)
        np.testing.assert_array_equal(np.asarray(tab.beta)[:8, b * S + new_id], ref)
    flat = flatten(stack)
    assert flat.num_states == len(fas) * S
    np.testing.assert_array_equal(np.asarray(flat.initial_state), np.arange(len(fas)) * S)


def _random_hmm(H, seed=0):
    rng = np.random.default_rng(seed)
    from types import SimpleNamespace
    pi = rng.dirichlet(np.ones(H))
    A = rng.dirichlet(np.ones(H), size=H)
    B = rng.dirichlet(np.ones(V), size=H)
    return SimpleNamespace(pi=jnp.asarray(pi, jnp.float32), A=jnp.asarray(A, jnp.float32),
                           B=jnp.asarray(B, jnp.float32))


def test_stacked_pgcd_tables_are_each_rows_tables(fas):
    hmm = _random_hmm(4)
    stack = stack_automata(fas)
    S = stack.num_states
    tab = pgcd.backward(stack, hmm, 7, max_steps=16)
    from jaxcd.automata.tensorized import pad_automaton
    for b, fa in enumerate(fas):
        _, new_id = pad_automaton(fa, *stack.bucket)
        ref = pgcd.backward(fa, hmm, 7)
        np.testing.assert_allclose(np.asarray(tab.beta())[:8, b * S + new_id],
                                   np.asarray(ref.beta()), rtol=2e-5, atol=1e-30)


@pytest.mark.parametrize("proposal", ["gcd", "lookahead"])
def test_smc_mixed_batch_prompts_run_as_alone(fas, proposal):
    lm = toy_lm()
    hmm = _random_hmm(4) if proposal == "lookahead" else None
    B, K, n = 4, 8, 9
    ids, lens = pad_prompts([[1]] * B)
    kw = dict(budget=n, num_particles=K, proposal=proposal, hmm=hmm, max_steps=16)
    stack = stack_automata(fas)
    mixed = smc.run(jax.random.key(5), lm, lm.params, ids, lens, stack, **kw)
    for b, fa in enumerate(fas):
        # alone: unpadded for the first prompt (so padding is checked to change nothing),
        # padded to the stack's bucket for the others (one program for the three)
        one = fa if b == 0 else bucket_automaton(fa, stack.bucket)
        alone = smc.run(jax.random.key(5), lm, lm.params, ids, lens, one, **kw)
        np.testing.assert_array_equal(np.asarray(mixed.tokens)[b], np.asarray(alone.tokens)[b])
        np.testing.assert_allclose(np.asarray(mixed.log_weights)[b],
                                   np.asarray(alone.log_weights)[b], rtol=1e-5)
        for row in np.asarray(mixed.tokens)[b]:
            assert re.fullmatch(PATTERNS[b], text_of(row))
    assert int(mixed.steps) <= n


def test_prefill_once_decode_many(fas):
    lm = toy_lm()
    ids, lens = pad_prompts([[1, 2], [3]])
    fa = fas[0].to_device()
    pre = prefill(lm, lm.params, ids, lens, ids.shape[1] + 16)
    tab = tables_for(fa, "gcd", 9, 16)
    a = sample(jax.random.key(2), lm, lm.params, ids, lens, fa, tab, max_steps=16, constrained=True)
    b = sample(jax.random.key(2), lm, lm.params, ids, lens, fa, tab, max_steps=16, constrained=True,
               prefilled=pre)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    r1 = smc.run(jax.random.key(3), lm, lm.params, ids, lens, fas[0], budget=9, max_steps=16,
                 num_particles=4)
    r2 = smc.run(jax.random.key(3), lm, lm.params, ids, lens, fas[0], budget=9, max_steps=16,
                 num_particles=4, prefilled=pre)
    np.testing.assert_array_equal(np.asarray(r1.tokens), np.asarray(r2.tokens))
    with pytest.raises(ValueError, match="cache of"):
        sample(jax.random.key(2), lm, lm.params, ids, lens, fa, tables_for(fa, "gcd", 9, 32),
               max_steps=32, constrained=True, prefilled=pre)


def test_stack_errors(fas):
    with pytest.raises(ValueError, match="no automata"):
        stack_automata([])
    other = compile_regex("a", Vocabulary.from_token_bytes(TOKENS + [b"z"], eos_id=EOS))
    with pytest.raises(ValueError, match="another vocabulary"):
        stack_automata([fas[0], other])
    lm = toy_lm()
    ids, lens = pad_prompts([[1]] * 3)
    with pytest.raises(ValueError, match="one automaton per row"):
        smc.run(jax.random.key(0), lm, lm.params, ids, lens, stack_automata(fas), budget=9,
                num_particles=2)


def test_smc_never_resamples_a_finished_prompt():
    """The jitted SMC's rule is run_blackbox's: once every particle of a prompt has
    emitted EOS, that prompt is not resampled, even while another prompt decodes."""
    lm = toy_lm()
    # one token of four, then EOS: done after 2 steps, with unequal weights (the GCD
    # increment at EOS is log p(EOS | prefix)), so its ESS is below K from then on
    fa_short = compile_regex("a|b|x|-", VOCAB)
    fa_long = compile_regex(r"[01ab]{6,9}", VOCAB)
    ids, lens = pad_prompts([[1]] * 2)
    res = smc.run(jax.random.key(0), lm, lm.params, ids, lens,
                  stack_automata([fa_short, fa_long]), budget=12, num_particles=16,
                  ess_threshold=1.0)
    rs = np.asarray(res.resampled)
    assert not rs[0].any()
    assert rs[1].any()                                   # the live prompt does resample
    assert int(res.steps) > 2
    assert float(np.asarray(res.ess)[0, -1]) < 16 - 1e-3
    for row in np.asarray(res.tokens)[0]:
        assert text_of(row) in {"a", "b", "x", "-"}


def test_pgcd_second_constraint_in_a_bucket_compiles_nothing(fas):
    """The P-GCD path (edge masses, β^P tables, the SMC program) is shape-stable too."""
    lm = toy_lm()
    hmm = _random_hmm(4)
    ids, lens = pad_prompts([[1]] * 2)
    bucket = (64, 256, 16, 64)
    kw = dict(budget=9, max_steps=16, num_particles=4, proposal="lookahead", hmm=hmm)
    jax.block_until_ready(smc.run(jax.random.key(0), lm, lm.params, ids, lens,
                                  bucket_automaton(fas[0], bucket), **kw))
    c0 = compile_stats.snapshot()
    res = jax.block_until_ready(smc.run(jax.random.key(1), lm, lm.params, ids, lens,
                                        bucket_automaton(fas[2], bucket), **kw))
    d = compile_stats.snapshot() - c0
    assert (d.traces, d.backend_compiles) == (0, 0), d
    for row in np.asarray(res.tokens).reshape(-1, 16):
        assert re.fullmatch(PATTERNS[2], text_of(row))
