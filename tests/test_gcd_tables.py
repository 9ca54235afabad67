"""The precomputed live-edge counts of :class:`jaxcd.decoding.gcd.BudgetTables` equal the dense
formula of docs/design.md §3 (``T_out · T_in · β_t``: for each state, the live out-edges), and masks computed with
them equal masks recomputed from ``beta`` at every step."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxcd import BudgetTooSmallError, Vocabulary, compile_regex

from jaxcd.decoding import gcd
from jaxcd.host import HostMasker

VOCAB = Vocabulary.from_token_bytes([b"<eos>", b"a", b"b", b"ab", b"ba", b"\xc3", b"\xa9", b"-"],
                                    eos_id=0)


@pytest.mark.parametrize("pattern", [r"(ab|b)*a?", r"[ab]{2,4}-", r"a(é|b)*-"])
@pytest.mark.parametrize("kind", ["gcd", "lcd"])
def test_live_out_counts(pattern, kind):
    fa = compile_regex(pattern, VOCAB)
    dfa = fa.to_device()
    n = fa.min_budget + 3
    tables = gcd.backward(dfa, n) if kind == "gcd" else gcd.lcd_tables(dfa, n)
    beta = np.asarray(tables.beta).astype(int)
    np.testing.assert_array_equal(np.asarray(tables.live_out), beta @ fa.T_in.T.astype(int) @ fa.T_out.T.astype(int))
    bare = gcd.BudgetTables(tables.beta)
    for s in range(fa.num_states):
        for t in range(n + 1):
            cs = gcd.ConstraintState(jnp.int32(s), jnp.int32(t))
            np.testing.assert_array_equal(np.asarray(gcd.mask_words_jit(dfa, tables, cs)),
                                          np.asarray(gcd.mask_words_jit(dfa, bare, cs)))


@pytest.mark.parametrize("pattern", [r"(ab|b)*a?", r"[ab]{2,4}-", r"a(é|b)*-"])
@pytest.mark.parametrize("kind", ["gcd", "lcd"])
def test_host_masker_equals_jitted(pattern, kind):
    """HostMasker's row table (searchsorted on dist) gives the jitted masks (segment-max
    recursion) for every (state, t), single and batched, past the budget included."""
    fa = compile_regex(pattern, VOCAB)
    dfa = fa.to_device()
    n = fa.min_budget + 3
    tables = gcd.backward(dfa, n) if kind == "gcd" else gcd.lcd_tables(dfa, n)
    host = HostMasker(fa, n if kind == "gcd" else None)
    S, ts = fa.num_states, np.arange(n + 3)
    ss, tt = np.meshgrid(np.arange(S), ts, indexing="ij")
    ss, tt = ss.ravel(), tt.ravel()
    want = np.asarray(gcd.batched_mask_words(
        dfa, tables, gcd.ConstraintState(jnp.asarray(ss, jnp.int32), jnp.asarray(tt, jnp.int32))))
    if kind == "lcd":   # LCD has no budget: the jitted LCD tables only cover max_len steps
        keep = tt < n
        ss, tt, want = ss[keep], tt[keep], want[keep]
    got = host.batch_mask_words(ss, tt)
    np.testing.assert_array_equal(got, want)
    out = np.zeros(fa.num_words, np.uint32)
    for i in range(len(ss)):
        np.testing.assert_array_equal(host.mask_words(ss[i], tt[i]), want[i])
        np.testing.assert_array_equal(host.mask_words(ss[i], tt[i], out=out), want[i])
    with pytest.raises(ValueError):              # masks are views of the shared table
        host.mask_words(0, 0)[0] = 1
    for bad in ((-1, 0), (S, 0), (0, -1)):       # negative indices must not wrap around
        with pytest.raises(ValueError, match="state"):
            host.mask_words(*bad)
        with pytest.raises(ValueError, match="states"):
            host.batch_mask_words(np.array([bad[0]]), np.array([bad[1]]))


def test_host_masker_budget_too_small():
    fa = compile_regex(r"abab", VOCAB)
    with pytest.raises(BudgetTooSmallError) as e:
        HostMasker(fa, fa.min_budget - 1)
    assert str(fa.min_budget) in str(e.value)
