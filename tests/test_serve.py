"""Continuous batching (:func:`jaxcd.decoding.serve.serve`).

References:
- exact: with :class:`TableLM` (log-probabilities independent of the other rows) every
  request gets bit-for-bit the tokens and log-probability that ``decode.sample`` gives it
  alone with the same key — GCD, LCD and unconstrained, across refills and two automaton
  buckets;
- a real transformer (a tiny random llama): each request's accumulated log-probability
  equals a full recompute of ``prompt + output`` without a cache
  (:meth:`JaxLM.logprobs_all`), which checks that inserted rows' keys, values, offsets
  and positions are those of a stand-alone prefill, across cache shifts and blocked
  attention; every output is valid for its own regex (Python's ``re``);
- compiles counted with ``jax.monitoring``: a second stream of new constraints in the
  same buckets compiles nothing.
"""

import re

import jax
import numpy as np
import pytest

from jaxcd import Vocabulary, compile_regex
from jaxcd.decoding import compile_stats
from jaxcd.decoding.buckets import automaton_bucket, bucket_automaton, budget_bucket
from jaxcd.decoding.decode import sample, tables_for
from jaxcd.decoding.serve import Request, ServeStats, serve, stack_bytes
from jaxcd.lm import pad_prompts

from test_constraints_as_data import EOS, TOKENS, V, VOCAB, toy_lm  # noqa: E402

PATTERNS = [r"(ab|b)*a?-?", r"[01]{2,5}", r"x(a|b)+x", r"-?(0|1(0|1)*)", r"-[01]{0,80}"]


def text_of(row, tokens=TOKENS, eos=EOS):
    row = list(row)
    row = row[: row.index(eos)] if eos in row else row
    return b"".join(tokens[v] for v in row).decode()


@pytest.fixture(scope="module")
def fas():
    return [compile_regex(p, VOCAB) for p in PATTERNS]


@pytest.mark.parametrize("method,groups", [("gcd", 1), ("gcd", 2), ("lcd", 1), ("none", 1)])
def test_each_request_decodes_exactly_as_alone(fas, method, groups):
    """One stream at the common bucket, or (``max_automata_bytes`` too small for it) one
    stream per automaton bucket."""
    lm = toy_lm()
    n = 12
    assert len({automaton_bucket(fa) for fa in fas}) == 2
    reqs = [Request([1] * (1 + i % 3), fas[i % len(fas)], jax.random.PRNGKey(100 + i))
            for i in range(23)]
    if method == "none":
        reqs = [r._replace(fa=None) for r in reqs]
    st = ServeStats()
    limit = 1 << 30 if groups == 1 else stack_bytes(automaton_bucket(fas[-1]), V, 4) - 1
    out = serve(lm, lm.params, reqs, budget=n, rows=4, group=2, method=method, stats=st,
                max_automata_bytes=limit)
    assert st.inserts >= 23 // 2 and st.chunks > 5 and len(st.groups) == groups
    assert 0.5 < st.occupancy <= 1.0
    N = budget_bucket(n)
    for i, (r, o) in enumerate(zip(reqs, out)):
        # one prompt width for every reference (TableLM ignores the prompt): one program
        # per method and automaton bucket
        ids, lens = pad_prompts([r.prompt_ids], length=3)
        fa = bucket_automaton(r.fa) if r.fa is not None else None
        tables = tables_for(fa, method, n, N) if fa is not None else None
        ref = sample(r.key, lm, lm.params, ids, lens, fa, tables, max_steps=N, budget=n,
                     constrained=method != "none")
        np.testing.assert_array_equal(o.tokens, np.asarray(ref.tokens[0]), err_msg=f"request {i}")
        assert o.logprob == pytest.approx(float(ref.logprob[0]), abs=1e-5)
        assert o.proposal_logprob == pytest.approx(float(ref.proposal_logprob[0]), abs=1e-5)
        assert o.valid == bool(ref.valid[0]) and o.ended == bool(ref.ended[0])
        if method == "gcd":
            assert o.valid and re.fullmatch(PATTERNS[i % len(PATTERNS)], text_of(o.tokens))


def test_budget_too_small_names_the_request(fas):
    from jaxcd.errors import BudgetTooSmallError
    lm = toy_lm()
    reqs = [Request([1], fas[2], jax.random.PRNGKey(0))]
    with pytest.raises(BudgetTooSmallError):
        serve(lm, lm.params, reqs, budget=2, rows=2)
    with pytest.raises(ValueError, match="more than max_automata_bytes"):
        serve(lm, lm.params, reqs, budget=8, rows=2, max_automata_bytes=1000)
    with pytest.raises(ValueError, match="no automaton"):
        serve(lm, lm.params, [Request([1], None, jax.random.PRNGKey(0))], budget=4, rows=2)


# --------------------------------------------------------------------- a real transformer
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from test_lm_llama import write_tiny_gguf

    from jaxcd.lm.llama import JaxLM

    from jaxcd.lm.loading import load_lm
    path = tmp_path_factory.mktemp("serve") / "tiny.gguf"
    write_tiny_gguf(path, "llama", tied=True, seed=1)
    base, base_params = load_lm(path, tokenizer=False)[:2]
    lm = JaxLM(base.config, attn_block=8)                 # blocked decode attention
    toks = [bytes([i]) if 32 <= i < 127 else b"<%d>" % i for i in range(base.vocab_size)]
    vocab = Vocabulary.from_token_bytes(toks, eos_id=base.eos_token_id)
    return lm, base_params, vocab, toks


def test_real_lm_rows_match_a_full_recompute(tiny):
    """KV entries of inserted rows, offsets and positions across refills and cache
    shifts: each request's log-probability equals a cache-free recompute."""
    lm, params, vocab, toks = tiny
    pats = [r"[0-9]{1,6}", r"(yes|no)", r"[a-f]+z", r"x[0-9a-c]{2,9}y"]
    fas = [compile_regex(p, vocab) for p in pats]
    rng = np.random.default_rng(0)
    # prompts of two prompt buckets (32 and 64): insert groups are prefilled at their own
    # width and written at [s - P_g, s) of a cache laid out for the longest
    reqs = [Request(rng.integers(3, 250, size=int(rng.integers(33, 50) if i % 5 == 2 else
                                                   rng.integers(1, 30))).tolist(),
                    fas[i % 4], jax.random.PRNGKey(i)) for i in range(14)]
    st = ServeStats()
    n = 12
    out = serve(lm, params, reqs, budget=n, rows=4, group=2, stats=st)
    assert st.shifts >= 1                                     # the cache was shifted
    assert 2 * 32 * st.prefills < st.prefill_tokens < 2 * 64 * st.prefills   # both widths
    assert st.inserts > st.prefills       # groups entered over several inserts (held)
    assert_valid_and_recomputed(lm, params, reqs, out, pats, toks)


def assert_valid_and_recomputed(lm, params, reqs, out, pats, toks, width=96):
    """Every output ended, is valid for its own regex, and its log-probability equals a
    cache-free recompute of prompt + output. The recompute runs every request in one
    left-padded batch of ``width`` slots (one program for the tests of this file; padded
    rows equal one-by-one rows: test_lm_llama.test_batched_left_padded_equals_one_by_one)."""
    eos = lm.eos_token_id
    gens = []
    for i, (r, o) in enumerate(zip(reqs, out)):
        assert o.valid and o.ended
        gens.append(list(o.tokens[: list(o.tokens).index(eos) + 1]))
        assert re.fullmatch(pats[i % 4], text_of(gens[-1], toks, eos)), i
    seqs = [list(r.prompt_ids) + g for r, g in zip(reqs, gens)]
    ids, lens = pad_prompts(seqs, length=width)
    lp_all = np.asarray(lm.logprobs_all(params, ids, lens))                # [B, width, V]
    for i, (r, o, gen) in enumerate(zip(reqs, out, gens)):
        P = width - len(seqs[i]) + len(r.prompt_ids)          # the prompt's end in the row
        ref = sum(lp_all[i, P - 1 + j, gen[j]] for j in range(len(gen)))
        assert o.logprob == pytest.approx(float(ref), abs=2e-3), i


def test_new_constraints_in_warm_buckets_compile_nothing(fas):
    lm = toy_lm()
    small = [f for f in fas if automaton_bucket(f) == automaton_bucket(fas[0])]

    def run(pats, seed):
        reqs = [Request([1, 2][: 1 + i % 2], compile_regex(p, VOCAB), jax.random.PRNGKey(seed + i))
                for i, p in enumerate(pats)]
        return serve(lm, lm.params, reqs, budget=10, rows=4, group=2)

    run(PATTERNS[:4] * 2, 0)
    assert small
    c0 = compile_stats.snapshot()
    out = run([r"a+b?", r"(0|1){1,3}-", r"x?b*", r"0-1", r"ba(ab)*", r"1+", r"b", r"-a"], 50)
    d = compile_stats.snapshot() - c0
    assert d.backend_compiles == 0 and d.traces == 0, d
    assert all(o.valid for o in out)


def test_stack_rows_and_next_state_match_stack_automata(fas):
    """serve's host stack (no ``out_dst``; each automaton padded straight into it) holds
    the same arrays as ``stack_automata``, and its transition (target read from
    ``edge_dst``) is ``gcd.next_state`` of the flattened ``stack_automata`` stack, for
    every state and token."""
    import jax.numpy as jnp

    from jaxcd.decoding import gcd
    from jaxcd.decoding.buckets import common_bucket, flatten, stack_automata
    from jaxcd.decoding.serve import _flat_view, _next_state_stacked, _stack_rows
    rows = [fas[i % len(fas)] for i in range(7)]
    bucket = common_bucket(rows)
    ref = stack_automata(rows, bucket)
    got = _stack_rows(rows, bucket)
    for k in ("edge_src", "edge_dst", "out_start", "cum_masks", "row_index", "dist",
              "initial_state", "final_state", "dead_state"):
        np.testing.assert_array_equal(getattr(got, k), getattr(ref, k), err_msg=k)
    assert got.out_dst.shape == (7, bucket[0], 0)
    fref = flatten(ref.to_device())
    fgot = _flat_view(got.to_device(), int(bucket[2]))
    states = jnp.repeat(jnp.arange(7 * bucket[0], dtype=jnp.int32), V)
    toks = jnp.tile(jnp.arange(V, dtype=jnp.int32), 7 * bucket[0])
    want = jax.vmap(gcd.next_state, in_axes=(None, 0, 0))(fref, states, toks)
    np.testing.assert_array_equal(np.asarray(jax.jit(_next_state_stacked)(fgot, states, toks)),
                                  np.asarray(want))
    assert int(jnp.sum(want != fref.dead_state)) > 7          # real transitions among them


def test_inserts_are_whole_groups_of_one_prompt_bucket(fas):
    """Only the stream's last prefill group may hold padding rows, and a long prompt is
    grouped with the other long ones (prefill tokens = groups × width). A group's rows
    may enter the batch over several insert calls (as rows free up)."""
    lm = toy_lm()
    # 3 long prompts (bucket 64) among 13 short ones (bucket 32)
    reqs = [Request([1] * (40 if i in (2, 7, 11) else 1 + i % 3), fas[i % len(fas)],
                    jax.random.PRNGKey(i)) for i in range(16)]
    st = ServeStats()
    out = serve(lm, lm.params, reqs, budget=10, rows=4, group=2, stats=st)
    assert st.padding_rows == 0 and st.prefills == 8 and st.inserts >= 8
    # two groups hold the 3 long prompts (one of them with a short one): 2 x 2 x 64
    assert st.prefill_tokens == 2 * 2 * 64 + 6 * 2 * 32
    assert all(o.valid for o in out)
    st = ServeStats()
    serve(lm, lm.params, reqs[:7], budget=10, rows=4, group=2, stats=st)
    assert st.padding_rows == 1 and st.prefills == 4 and st.inserts >= 4


def test_prefill_after_a_shared_prefix_is_a_full_prefill(tiny):
    """``JaxLM.prefill_after`` (a prefix prefilled once, each prompt's rest attending to
    its cache) gives the cache and log-probabilities of ``prefill`` on the whole prompts,
    and decoding from it gives the same steps."""
    import jax.numpy as jnp
    lm, params, _, _ = tiny
    rng = np.random.default_rng(3)
    prefix = rng.integers(3, 250, size=11).tolist()
    rests = [rng.integers(3, 250, size=int(n)).tolist() for n in (1, 7, 16, 4)]
    P0, T, max_len = 16, 16, 48
    pre = lm.prefill(params, *map(jnp.asarray, pad_prompts([prefix], length=P0)), P0)[0]
    ids, lens = pad_prompts(rests, length=T)
    st, lp = lm.prefill_after(params, pre, jnp.asarray(ids), jnp.asarray(lens), max_len)
    fids, flens = pad_prompts([prefix + r for r in rests], length=P0 + T)
    st_ref, lp_ref = lm.prefill(params, jnp.asarray(fids), jnp.asarray(flens), max_len)
    np.testing.assert_allclose(np.asarray(lp), np.asarray(lp_ref), atol=2e-4)
    np.testing.assert_array_equal(np.asarray(st["offset"]), np.asarray(st_ref["offset"]))
    np.testing.assert_array_equal(np.asarray(st["slot"]), np.asarray(st_ref["slot"]))
    for b, off in enumerate(np.asarray(st_ref["offset"])):       # the filled slots
        np.testing.assert_allclose(np.asarray(st["k"])[b, ..., off:P0 + T],
                                   np.asarray(st_ref["k"])[b, ..., off:P0 + T], atol=2e-4)
        np.testing.assert_allclose(np.asarray(st["v"])[b, :, :, off:P0 + T],
                                   np.asarray(st_ref["v"])[b, :, :, off:P0 + T], atol=2e-4)
    tok = jnp.asarray([5, 9, 17, 33], jnp.int32)
    for _ in range(3):
        st, lp = lm.step(params, st, tok)
        st_ref, lp_ref = lm.step(params, st_ref, tok)
        np.testing.assert_allclose(np.asarray(lp), np.asarray(lp_ref), atol=5e-4)


def test_shared_prefix_rows_match_a_full_recompute(tiny):
    """Prompts that share a prefix (a chat template's system turn): the prefix is
    prefilled once and the inserts run only the rest; each request's log-probability
    still equals a cache-free recompute of its whole prompt + output, across refills,
    cache shifts and a group too long for the prefix path (prefilled whole)."""
    lm, params, vocab, toks = tiny
    pats = [r"[0-9]{1,6}", r"(yes|no)", r"[a-f]+z", r"x[0-9a-c]{2,9}y"]
    fas = [compile_regex(p, vocab) for p in pats]
    rng = np.random.default_rng(5)
    head = rng.integers(3, 250, size=13).tolist()
    # rests of 1-20 tokens (width 32 after the prefix) and some of 40-50 (prompt
    # bucket 64: prefix 32 + rest 64 > 64, so those are prefilled whole)
    reqs = [Request(head + rng.integers(3, 250, size=int(rng.integers(40, 51) if i % 6 == 1
                                                          else rng.integers(1, 21))).tolist(),
                    fas[i % 4], jax.random.PRNGKey(i)) for i in range(14)]
    st, st_off = ServeStats(), ServeStats()
    out = serve(lm, params, reqs, budget=12, rows=4, group=2, stats=st)
    serve(lm, params, reqs, budget=12, rows=4, group=2, stats=st_off, share_prefix=False)
    assert st.prefix_tokens == 13 and st_off.prefix_tokens == 0
    assert st.prefill_tokens < st_off.prefill_tokens
    assert st.shifts >= 1
    assert_valid_and_recomputed(lm, params, reqs, out, pats, toks)
