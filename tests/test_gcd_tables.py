"""The precomputed live-edge counts of :class:`jaxcd.gcd.BudgetTables` equal the dense
formula of DESIGN.md §3 (``T_out · T_in · β_t``: for each state, the live out-edges), and masks computed with
them equal masks recomputed from ``beta`` at every step."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxcd import Vocabulary, compile_regex, gcd

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
