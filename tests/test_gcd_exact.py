"""GCD/LCD masks equal brute-force enumeration on a toy vocabulary (docs/design.md §3, §7).

Reference: enumerate every sequence of exactly ``n`` tokens; it is valid iff it is
``x_1 … x_m`` followed by EOS padding with ``bytes(x_1 … x_{m-1}) ∈ L`` (checked with
``re.fullmatch`` on the decoded text). The GCD mask after a prefix ``p`` is the set
of tokens ``v`` such that some valid sequence starts with ``p + v``.
"""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcd import (BudgetTooSmallError, EmptyLanguageError, PrefixRejectedError, Vocabulary,
                   allowed_tokens, compile_regex)
from jaxcd.decoding import gcd
from jaxcd.host import HostMasker

TOKENS = [b"<eos>", b"a", b"b", b"ab", b"ba", b"\xc3", b"\xa9", b"\xc3\xa9", b"-"]
EOS = 0
VOCAB = Vocabulary.from_token_bytes(TOKENS, eos_id=EOS)
V = len(TOKENS)

CASES = [
    (r"(ab|b)*a?", 5),
    (r"[ab]{2,4}", 5),
    (r"é+-?", 5),
    (r"a(é|b)*-", 6),
    (r"(?s:.)b", 4),        # '.' = any character: é split over two tokens counts as one
]


def decode(seq):
    try:
        return b"".join(TOKENS[v] for v in seq).decode("utf-8")
    except UnicodeDecodeError:
        return None


def valid_sequences(pattern, n):
    out = set()
    for seq in itertools.product(range(V), repeat=n):
        if EOS not in seq:
            continue
        m = seq.index(EOS)
        if any(v != EOS for v in seq[m:]):
            continue
        text = decode(seq[:m])
        if text is not None and re.fullmatch(pattern, text):
            out.add(seq)
    return out


@pytest.mark.parametrize("pattern,n", CASES)
def test_gcd_masks_equal_enumeration(pattern, n):
    fa = compile_regex(pattern, VOCAB)
    valid = valid_sequences(pattern, n)
    assert valid, "test case must have valid outputs"
    dfa = fa.to_device()
    tables = gcd.backward(dfa, n)
    # β_t(s) = 1{dist(s) ≤ n − t}: the recursion agrees with shortest paths
    dist = np.asarray(fa.dist)
    expect_beta = dist[None, :] <= (n - np.arange(n + 1))[:, None]
    np.testing.assert_array_equal(np.asarray(tables.beta), expect_beta)
    # dense formulas of docs/design.md §3
    T_out, T_in, B_f = fa.T_out.astype(int), fa.T_in.astype(int), fa.B_f.astype(int)
    beta = np.asarray(tables.beta).astype(int)
    for t in range(n):
        np.testing.assert_array_equal(beta[t] > 0, (T_out @ ((T_in @ beta[t + 1]) * (B_f.sum(1) > 0))) > 0)

    prefixes = {seq[:t] for seq in valid for t in range(n)}
    host = HostMasker(fa, n)
    for p in sorted(prefixes):
        expect = np.zeros(V, bool)
        for seq in valid:
            if seq[:len(p)] == p:
                expect[seq[len(p)]] = True
        got = allowed_tokens(fa, list(p), budget=n)
        np.testing.assert_array_equal(got, expect, err_msg=f"{pattern!r} prefix {p}")
        s = fa.initial_state
        for v in p:
            s = fa.next_state(s, v)
        np.testing.assert_array_equal(host.mask(s, len(p)), expect)
        # jitted path, and the dense formula m = 1{w^T B_f}
        cs = gcd.init_state(dfa)
        for v in p:
            cs = gcd.advance_jit(dfa, cs, jnp.int32(v))
        np.testing.assert_array_equal(np.asarray(gcd.mask_jit(dfa, tables, cs)), expect)
        a = np.eye(fa.num_states, dtype=int)[int(cs.state)]
        w = (T_out.T @ a) * (T_in @ beta[len(p) + 1])
        np.testing.assert_array_equal((w @ B_f) > 0, expect)


@pytest.mark.parametrize("pattern,n", CASES)
def test_lcd_mask_is_viability(pattern, n):
    """LCD: allowed iff some continuation (here of ≤ 4 more tokens, enough for these
    patterns) reaches a valid output; checked by enumeration from each prefix."""
    fa = compile_regex(pattern, VOCAB)
    valid = valid_sequences(pattern, n)
    prefixes = {seq[:t] for seq in valid for t in range(n)}
    host = HostMasker(fa, None)
    for p in sorted(prefixes)[:40]:
        expect = np.zeros(V, bool)
        if EOS in p:                      # after EOS: padding only
            expect[EOS] = True
            np.testing.assert_array_equal(allowed_tokens(fa, list(p)), expect)
            continue
        for v in range(V):
            for k in range(0, 4):
                for c in itertools.product(range(1, V), repeat=k):
                    if v == EOS:
                        text = decode(p)
                        ok = k == 0 and text is not None and re.fullmatch(pattern, text)
                    else:
                        text = decode(p + (v,) + c)
                        ok = text is not None and re.fullmatch(pattern, text)
                    if ok:
                        expect[v] = True
                        break
                if expect[v]:
                    break
        np.testing.assert_array_equal(allowed_tokens(fa, list(p)), expect,
                                      err_msg=f"{pattern!r} prefix {p}")
        s = fa.initial_state
        for v in p:
            s = fa.next_state(s, v)
        np.testing.assert_array_equal(host.mask(s, len(p)), expect)


def test_vmap_and_jit_agree_with_host():
    fa = compile_regex(r"(ab|b)*a?", VOCAB)
    dfa = fa.to_device()
    n = 6
    tables = gcd.backward(dfa, n)
    toks, final = gcd.random_walks(jax.random.PRNGKey(1), dfa, tables, num_walks=32)
    toks = np.asarray(toks)
    for row in toks:
        for t in range(n):
            m = allowed_tokens(fa, list(row[:t]), budget=n)
            assert m[row[t]]
        m = list(row).index(EOS)
        assert re.fullmatch(r"(ab|b)*a?", decode(row[:m]))
    assert np.all(np.asarray(final) == fa.final_state)
    # no retracing across calls with the same shapes
    traces = []

    def counted(fa_, tables_, cs_):
        traces.append(1)
        return gcd.mask(fa_, tables_, cs_)

    f = jax.jit(counted)
    cs = gcd.init_state(dfa)
    f(dfa, tables, cs)
    cs = gcd.advance_jit(dfa, cs, jnp.int32(2))
    f(dfa, tables, cs)
    f(dfa, tables, gcd.advance_jit(dfa, cs, jnp.int32(1)))
    assert len(traces) == 1


def test_budget_and_prefix_errors():
    fa = compile_regex(r"abab", VOCAB)   # needs 'ab','ab',EOS = 3 tokens at best
    assert fa.min_budget == 3
    with pytest.raises(BudgetTooSmallError, match="smallest budget that works is 3"):
        allowed_tokens(fa, [], budget=2)
    with pytest.raises(BudgetTooSmallError):
        gcd.check_budget(fa, 2)
    with pytest.raises(PrefixRejectedError, match="position 1"):
        allowed_tokens(fa, [3, 2])
    with pytest.raises(PrefixRejectedError, match="budget"):
        allowed_tokens(fa, [1, 2, 1], budget=4)    # 'a','b','a' then 'b',EOS needs 5
    with pytest.raises(EmptyLanguageError):
        compile_regex(r"c", VOCAB)                  # no token spells 'c'
