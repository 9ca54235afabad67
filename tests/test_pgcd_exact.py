"""P-GCD (docs/design.md §5) against brute-force enumeration, in float64.

Reference: a depth-first enumeration of every token sequence ``x_1 … x_m`` (``m ≤ n``,
``x_m = EOS``, no earlier EOS) below a prefix, carrying the HMM's joint forward
vector; ``x`` is valid iff ``bytes(x_1 … x_{m-1})`` fullmatches the regex (Python's
``re`` on the decoded text). Then ``ψ(p) = Σ_{valid x ⊒ p} p_hmm(x) / p_hmm(p)`` — no
automaton and no β recursion is involved.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hmm_distill import HMMParams
from jaxcd import Vocabulary, compile_regex
from jaxcd.decoding import gcd, pgcd

TOKENS = [b"<eos>", b"a", b"b", b"ab", b"ba", b"\xc3", b"\xa9", b"\xc3\xa9", b"-"]
EOS = 0
VOCAB = Vocabulary.from_token_bytes(TOKENS, eos_id=EOS)
V = len(TOKENS)

CASES = [
    (r"(ab|b)*a?", 4, 3),
    (r"[ab]{2,4}", 5, 2),
    (r"é+-?", 4, 4),
    (r"a(é|b)*-", 5, 3),
]


def random_hmm(H, seed, zeros=False):
    rng = np.random.default_rng(seed)
    pi = rng.dirichlet(np.ones(H))
    A = rng.dirichlet(np.ones(H), size=H)
    B = rng.dirichlet(np.ones(V) * 0.7, size=H)
    if zeros:                       # exact zeros in the HMM: ψ must stay exact
        B[0, 1] = 0.0
        B[:, 3] = 0.0               # token "ab" impossible under the HMM
        B /= B.sum(1, keepdims=True)
        A[1, 0] = 0.0
        A /= A.sum(1, keepdims=True)
    return HMMParams(pi, A, B)


def decode(seq):
    try:
        return b"".join(TOKENS[v] for v in seq).decode("utf-8")
    except UnicodeDecodeError:
        return None


class Reference:
    """Brute force: value(p) = Σ over valid completions of the joint p_hmm(p · c)."""

    def __init__(self, pattern, n, hmm):
        self.pattern, self.n = pattern, n
        self.pi, self.A, self.B = (np.asarray(a, np.float64) for a in hmm)

    def member(self, seq):
        text = decode(seq)
        return text is not None and re.fullmatch(self.pattern, text) is not None

    def value(self, prefix, f):
        """f[h] = p(prefix, z_{t+1} = h)."""
        t = len(prefix)
        total = 0.0
        if t >= self.n:
            return 0.0
        total += (f @ self.B[:, EOS]) * self.member(prefix)
        if t + 1 < self.n:
            for v in range(V):
                if v == EOS:
                    continue
                g = (f * self.B[:, v]) @ self.A
                if g.sum() > 0:
                    total += self.value(prefix + (v,), g)
        return total

    def forward(self, prefix):
        f = self.pi.copy()
        for v in prefix:
            f = (f * self.B[:, v]) @ self.A
        return f

    def psi(self, prefix):
        f = self.forward(prefix)
        p = f.sum()
        return self.value(tuple(prefix), f) / p if p > 0 else np.nan

    def token_psi(self, prefix):
        """ψ(prefix · v) for every v (nan where p_hmm(prefix · v) = 0)."""
        f = self.forward(prefix)
        out = np.full(V, np.nan)
        for v in range(V):
            pv = f @ self.B[:, v]
            if pv <= 0:
                continue
            if v == EOS:
                out[v] = float(self.member(tuple(prefix))) if len(prefix) < self.n else 0.0
            elif len(prefix) + 1 >= self.n:
                out[v] = 0.0
            else:
                out[v] = self.value(tuple(prefix) + (v,), (f * self.B[:, v]) @ self.A) / pv
        return out


def prefixes(fa, n, limit=60):
    """Prefixes reachable under the GCD mask (BFS), plus a few dead ones."""
    tables = gcd.backward(fa, n)
    out, frontier = [()], [()]
    while frontier and len(out) < limit:
        nxt = []
        for p in frontier:
            cs = gcd.init_state(fa)
            for v in p:
                cs = gcd.advance_jit(fa, cs, jnp.int32(v))
            m = np.asarray(gcd.mask_jit(fa, tables, cs))
            for v in np.nonzero(m)[0]:
                if v != EOS:
                    nxt.append(p + (int(v),))
        out.extend(nxt)
        frontier = nxt
    return out[:limit]


_advance = jax.jit(pgcd.advance)
_logpsi = jax.jit(pgcd.token_logpsi)
_prefix = jax.jit(pgcd.prefix_logpsi)
_prod = jax.jit(pgcd.product_logprobs)


def run_state(fa, hmm, prefix):
    st = pgcd.init_state(fa, hmm)
    for v in prefix:
        st = _advance(fa, hmm, st, jnp.int32(v))
    return st


@pytest.mark.parametrize("pattern,n,H", CASES)
@pytest.mark.parametrize("zeros", [False, True])
def test_token_psi_and_product_equal_enumeration(pattern, n, H, zeros):
    with jax.enable_x64(True):
        hmm = random_hmm(H, seed=len(pattern) * 7 + n, zeros=zeros)
        hmm = HMMParams(*(jnp.asarray(a, jnp.float64) for a in hmm))
        fa = compile_regex(pattern, VOCAB)
        ref = Reference(pattern, n, hmm)
        tables = pgcd.backward(fa, hmm, n)
        assert tables.mant.dtype == jnp.float64
        gtab = gcd.backward(fa, n)
        checked = 0
        for p in prefixes(fa, n):
            st = run_state(fa, hmm, p)
            want = ref.token_psi(p)
            got = np.exp(np.asarray(_logpsi(fa, hmm, tables, st)))
            assert np.all(got <= 1 + 1e-12) and np.all(got >= 0)
            defined = ~np.isnan(want)
            np.testing.assert_allclose(got[defined], want[defined], rtol=1e-10, atol=1e-14)
            # -inf exactly off the GCD mask
            m = np.asarray(gcd.mask_jit(fa, gtab, st.cs))
            assert np.all(got[~m] == 0.0)
            # prefix value and the normalised product
            psi_p = ref.psi(p)
            lp = float(_prefix(fa, hmm, tables, st))
            if np.isnan(psi_p):                         # p_hmm(prefix) = 0
                assert lp == -np.inf
                continue
            np.testing.assert_allclose(np.exp(lp), psi_p, rtol=1e-10, atol=1e-15)
            if psi_p > 0:
                f = ref.forward(p)
                f = f / f.sum()
                pv = np.array([f @ ref.B[:, v] for v in range(V)])
                want_prod = np.where(np.isnan(want), 0.0, want * pv) / psi_p
                got_prod = np.exp(np.asarray(_prod(fa, hmm, tables, st)))
                np.testing.assert_allclose(got_prod, want_prod, rtol=1e-10, atol=1e-14)
                assert abs(got_prod.sum() - 1) < 1e-12
            checked += 1
        assert checked > 3


@pytest.mark.parametrize("pattern,n,H", CASES[:2])
def test_backward_tables_equal_enumeration(pattern, n, H):
    """β^P_t(h, s) for every reachable (t, s): the probability, from hidden state h at
    time t, that the next tokens complete the prefix validly — enumerated by starting
    the reference at a point mass on h after one transition."""
    with jax.enable_x64(True):
        hmm = HMMParams(*(jnp.asarray(a, jnp.float64) for a in random_hmm(H, seed=3)))
        fa = compile_regex(pattern, VOCAB)
        ref = Reference(pattern, n, hmm)
        beta = np.asarray(pgcd.backward(fa, hmm, n).beta())
        seen = set()
        for p in prefixes(fa, n, limit=200):
            st = run_state(fa, hmm, p)
            s, t = int(st.cs.state), len(p)
            if (s, t) in seen or t == 0:
                continue
            seen.add((s, t))
            for h in range(H):
                f = np.asarray(ref.A[h])              # z_t = h; the next token's hidden law
                want = ref.value(p, f)
                np.testing.assert_allclose(beta[t, s, h], want, rtol=1e-10, atol=1e-15)
        assert len(seen) >= 3


def test_lazy_product_equals_explicit_product_hmm():
    """Second implementation: build the product HMM over hidden states (h, s, s') —
    automaton state before and after the token — and run hmm_distill's forward on every
    valid complete sequence; the sum is ψ(∅)."""
    from hmm_distill.hmm import forward
    pattern, n, H = r"(ab|b)*a?", 4, 2
    with jax.enable_x64(True):
        hmm = random_hmm(H, seed=11)
        fa = compile_regex(pattern, VOCAB)
        S = fa.num_states
        # δ on the host
        delta = np.full((S, V), -1)
        for s in range(S):
            for v in range(V):
                d = fa.next_state(s, v)
                delta[s, v] = -1 if d == fa.dead_state else d
        pi, A, B = (np.asarray(a) for a in hmm)
        idx = lambda h, s, s2: (h * S + s) * S + s2  # noqa: E731
        N = H * S * S
        P_pi, P_A, P_B = np.zeros(N), np.zeros((N, N)), np.zeros((N, V))
        for h in range(H):
            for s in range(S):
                for s2 in range(S):
                    for v in range(V):
                        if delta[s, v] == s2:
                            P_B[idx(h, s, s2), v] = B[h, v]
                    if s == fa.initial_state:
                        P_pi[idx(h, s, s2)] = pi[h]
                    for h2 in range(H):
                        for s3 in range(S):
                            P_A[idx(h, s, s2), idx(h2, s2, s3)] = A[h, h2]
        ref = Reference(pattern, n, hmm)
        seqs = []

        def rec(p):
            if len(p) < n and ref.member(p):
                seqs.append(p + (EOS,))
            if len(p) + 1 < n:
                for v in range(1, V):
                    rec(p + (v,))
        rec(())
        valid = [x for x in seqs]
        assert valid
        # hmm_distill's forward needs row-stochastic-looking arrays only for checks it
        # does not make; it sums over paths, which is the product's mass.
        total = 0.0
        for x in valid:
            toks = jnp.asarray(np.array(x)[None], jnp.int32)
            _, logc = forward(HMMParams(jnp.asarray(P_pi), jnp.asarray(P_A), jnp.asarray(P_B)),
                              toks)
            total += float(np.exp(np.sum(np.asarray(logc))))
        tables = pgcd.backward(fa, HMMParams(*(jnp.asarray(a) for a in hmm)), n)
        st = pgcd.init_state(fa, hmm)
        lz = float(_prefix(fa, hmm, tables, st))
        np.testing.assert_allclose(np.exp(lz), total, rtol=1e-10)
        np.testing.assert_allclose(np.exp(lz), ref.psi(()), rtol=1e-10)


def test_scaling_finite_at_long_budget():
    """Per-state log-scales: at n = 512 the tables stay finite where β^P > 0 (a single
    per-step scale would underflow float32 for states far from ⊥)."""
    rng = np.random.default_rng(0)
    H = 8
    hmm = HMMParams(jnp.asarray(rng.dirichlet(np.ones(H)), jnp.float32),
                    jnp.asarray(rng.dirichlet(np.ones(H), size=H), jnp.float32),
                    jnp.asarray(rng.dirichlet(np.ones(V) * 0.3, size=H), jnp.float32))
    fa = compile_regex(r"[ab]{400}-", VOCAB)      # ≥ 201 tokens from the start
    tables = pgcd.backward(fa, hmm, 512)
    gt = np.asarray(gcd.backward(fa, 512).beta)
    mant, ls = np.asarray(tables.mant), np.asarray(tables.log_scale_by_t())
    assert np.all(np.isfinite(mant))
    assert np.all(np.isfinite(ls[gt]))              # live (t, s): finite scale
    assert np.all(ls[~gt] == -np.inf)                # dead: exactly -inf
    assert ls[0, fa.initial_state] < -150            # exp() of it underflows float32
    st = pgcd.init_state(fa, hmm)
    lp = np.asarray(_logpsi(fa, hmm, tables, st))
    assert np.isfinite(lp).any() and np.all(lp <= 1e-5)
    # bfloat16 storage stays close in log space
    t16 = pgcd.backward(fa, hmm, 512, table_dtype=jnp.bfloat16)
    assert t16.mant.dtype == jnp.bfloat16
    lp16 = np.asarray(pgcd.token_logpsi(fa, hmm, t16, st))
    fin = np.isfinite(lp)
    assert np.array_equal(fin, np.isfinite(lp16))
    np.testing.assert_allclose(lp16[fin], lp[fin], atol=0.05)


def test_hmm_vocabulary_mismatch_is_a_clear_error():
    hmm = HMMParams(np.ones(2) / 2, np.ones((2, 2)) / 2, np.ones((2, V + 1)) / (V + 1))
    fa = compile_regex("ab", VOCAB)
    with pytest.raises(pgcd.HMMMismatchError, match="hmm-distill"):
        pgcd.backward(fa, hmm, 4)


def test_batched_scores_use_live_edges_only_and_stay_exact():
    """batched_scores picks the matmul width from the particles' live out-degree; it must
    equal the full-width per-particle scores for every particle, at every step."""
    pattern, n, H = r"[ab]{1,6}-?", 6, 3
    with jax.enable_x64(True):
        hmm = HMMParams(*(jnp.asarray(a, jnp.float64) for a in random_hmm(H, seed=8)))
        fa = compile_regex(pattern, VOCAB)
        assert fa.out_dst.shape[1] > 2
        tables = pgcd.backward(fa, hmm, n)
        ps = prefixes(fa, n, limit=40)
        sts = [run_state(fa, hmm, p) for p in ps]
        batch = jax.tree.map(lambda *x: jnp.stack(x), *sts)
        got = jax.jit(pgcd.batched_scores)(fa, tables, batch)
        full = jax.jit(jax.vmap(pgcd.scores, in_axes=(None, None, 0)))(fa, tables, batch)
        for g, f in zip(got, full):
            np.testing.assert_array_equal(np.isfinite(g), np.isfinite(f))
            np.testing.assert_allclose(np.where(np.isfinite(g), g, 0), np.where(np.isfinite(f), f, 0),
                                       rtol=1e-12, atol=1e-12)
        # one particle at a time: each takes the branch of its own live degree
        deg = np.asarray(jax.jit(jax.vmap(pgcd.live_degree, in_axes=(None, None, 0)))(
            fa, tables, batch))
        assert len(set(deg.tolist())) >= 3               # several branches exercised
        bs = jax.jit(pgcd.batched_scores)
        for i in range(len(ps)):
            one = jax.tree.map(lambda x: x[i:i + 1], batch)
            for g, f in zip(bs(fa, tables, one), full):
                g, f = np.asarray(g)[0], np.asarray(f)[i]
                np.testing.assert_array_equal(np.isfinite(g), np.isfinite(f))
                np.testing.assert_allclose(np.where(np.isfinite(g), g, 0),
                                           np.where(np.isfinite(f), f, 0), rtol=1e-12, atol=1e-12)
