"""Study 6b (experiments/study_bias_real.py) on the real SmolLM2-135M, smoke-sized.

Checked against references that do not share its code paths:

* the LM's conditionals: ``lm.logprobs_all`` (a full forward over prompt + sequence, no KV
  cache) instead of the study's prefill + ``lm.step`` scoring;
* the masks: ``jaxcd.allowed_tokens`` (the host-side mask words) instead of the trie;
* the token sequences: the tokenizer's own canonical encoding must be in the support.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jax")

from experiments import study_bias_real as S  # noqa: E402

NAMES = ("number", "sky")


@pytest.fixture(scope="module")
def studied(smol):
    specs = {s.name: s for s in S.SPECS}
    idx = S.token_index(smol.vocab)
    out = {}
    for n in NAMES:
        spec = specs[n]
        trie = S.build_trie(spec.strings, idx, spec.budget)
        prompt = smol.encode_prompt(spec.prompt)
        rows = S.score_trie(smol, prompt, trie)
        ex = S.exact(trie, rows, smol.vocab.eos_id, spec.strings, idx, smol.vocab)
        out[n] = (spec, trie, prompt, rows, ex)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_support_and_posterior(smol, studied, name):
    spec, trie, prompt, rows, ex = studied[name]
    # every string of the language is in the support, with its canonical tokenization,
    # and every sequence spells a string of the language (within budget - 1 tokens)
    canon = {tuple(smol.tokenizer.encode(s, add_special_tokens=False)) for s in spec.strings}
    assert canon <= set(trie.seqs)
    for seq, s in zip(trie.seqs, trie.seq_string):
        assert smol.vocab.decode_bytes(seq).decode() == s and len(seq) <= spec.budget - 1
    assert len(set(trie.seqs)) == len(trie.seqs)
    assert abs(ex["post"].sum() - 1) < 1e-12
    assert 0 < ex["gcd"].sum() <= 1 + 1e-9 and abs(ex["gcd"].sum() - 1) < 1e-6
    assert ex["lcd"].sum() <= 1 + 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_scores_and_gcd_against_brute_force(smol, studied, name):
    """log p(x·EOS | prompt) and the GCD proposal's probability of every sequence, from
    a cache-free forward and jaxcd.allowed_tokens, equal the study's."""
    import jax.numpy as jnp

    from jaxcd import allowed_tokens, compile_regex

    spec, trie, prompt, rows, ex = studied[name]
    eos = smol.vocab.eos_id
    fa = compile_regex(spec.regex, smol.vocab)
    seqs = [s + (eos,) for s in trie.seqs]
    # one fixed shape for every constraint (one compile): rows padded to 16, prompt +
    # sequence + EOS padding left-padded to 64 slots
    W, L, rows_n = 64, spec.budget, 16
    assert len(seqs) <= rows_n and len(prompt) + L <= W
    ids = np.zeros((rows_n, W), np.int32)
    base = W - len(prompt) - L              # slot of the prompt's first token
    for i, s in enumerate(seqs):
        ids[i, base:] = prompt + list(s) + [eos] * (L - len(s))
    lp = np.asarray(smol.lm.logprobs_all(smol.params, jnp.asarray(ids),
                                         jnp.full(rows_n, len(prompt) + L, jnp.int32)), np.float64)
    P = base + len(prompt)                  # lp[:, P - 1 + t] predicts token t
    logp, logq = [], []
    for i, s in enumerate(seqs):
        a = q = 0.0
        for t, v in enumerate(s):
            row = lp[i, P - 1 + t]
            row = row - np.logaddexp.reduce(row)
            m = allowed_tokens(fa, s[:t], budget=spec.budget)
            assert m[v]
            a += row[v]
            q += row[v] - np.logaddexp.reduce(row[m])
        logp.append(a)
        logq.append(q)
    np.testing.assert_allclose(ex["log_p"], logp, atol=2e-3)
    np.testing.assert_allclose(ex["gcd"], np.exp(logq), rtol=5e-3, atol=1e-6)
    # and jaxcd's GCD tables (gcd.backward + gcd.mask) equal the trie's masks at every node
    assert S.check_jaxcd_masks(smol, spec, trie, ex["gcd_masks"])["mismatched_nodes"] == 0


def test_cached_lm_equals_live_model(smol, studied):
    """smc.run on the live model and on the full-vocabulary table of its cached rows,
    same key: same tokens, same weights."""
    spec, trie, prompt, rows, ex = studied["number"]
    v = S.verify_cached(smol, spec, trie, rows, None, K=2, R=4, seed=3, proposals=("gcd",))["gcd"]
    assert v["tokens_equal"] and v["finite_pattern_equal"]
    assert v["max_abs_log_weight_diff"] < 1e-4 and v["max_abs_logZ_diff"] < 1e-4


def test_reduced_smc_is_unbiased_and_corrects_gcd(smol, studied):
    """SMC (gcd proposal) on the reduced table: the mean of Ẑ/Z is 1 within 4 standard
    errors, no positive-weight particle leaves the support, and the pooled estimate is
    much closer to the posterior than unweighted GCD (TV within 4 × the noise floor of
    the same number of exact samples)."""
    import jax

    from jaxcd import compile_regex

    spec, trie, prompt, rows, ex = studied["number"]
    eos = smol.vocab.eos_id
    red = S.reduced_table(trie, rows, smol.vocab)
    # the reduced table gives the same log-softmax at every token the constraint allows
    lf = rows.astype(np.float64) - np.logaddexp.reduce(rows.astype(np.float64), axis=1)[:, None]
    lr = red.logp[:len(trie.prefixes)].astype(np.float64)
    lr = lr - np.logaddexp.reduce(lr, axis=1)[:, None]
    for node, m in enumerate(ex["gcd_masks"]):
        for v in m:
            i = 0 if v == eos else 1 + int(np.searchsorted(red.tokens, v))
            assert red.full_of[i] == v and abs(lr[node, i] - lf[node, v]) < 1e-4
    fa = compile_regex(spec.regex, red.vocab, cache=False).to_device()
    R, K = 400, 4
    r = S.run_smc(jax.random.key(0), red.lm, red.lm.params, fa, spec.budget, K, R, "gcd", None)
    z = np.exp(np.asarray(r.log_Z, np.float64) - ex["logZ"])
    assert abs(z.mean() - 1) < 4 * z.std(ddof=1) / np.sqrt(R)
    est, outside = S.pooled(trie, r.tokens, r.log_weights, red.full_of, eos)
    assert outside == 0
    tv_smc = S.tv(est, ex["post"])
    floor = S.noise_floor(ex["post"], R, reps=200, seed=1)["mean"]
    tv_gcd = S.tv(ex["gcd"], ex["post"])
    assert tv_gcd > 0.5                   # the bias this study is about
    assert tv_smc < 4 * floor < tv_gcd, (tv_smc, floor, tv_gcd)


def test_markdown_shows_each_runs_settings():
    """The SMC table names each (constraint, proposal)'s seeds, λ and commit (runs that
    recorded none: λ=0, "earlier"), and --defensive reaches smc.run."""
    row = {str(k): {"tv_strings": {"mean": 0.01, "sd": 0.0}} for k in S.KS}
    c = {"kind": "k", "budget": 8, "support_sequences": 1, "Z": 1.0, "posterior": {"a": 1.0},
         "gcd_exact": {"a": 1.0}, "tv_gcd_strings": 0.0, "tv_lcd_strings": 0.0,
         "lcd_exact_valid_mass": 1.0, "noise_floor": {"strings": {"mean": 0.02, "p95": 0.03}},
         "smc": {"gcd": row, "lookahead": row},
         "smc_settings": {"lookahead": {"seeds": 2, "defensive": 0.05, "commit": "abc1234567"}}}
    res = {"model": "m", "constraints": {"x": c},
           "settings": {"ks": list(S.KS), "seeds": 4, "runs": 10, "seed": 0,
                        "seeds_by_proposal": {"gcd": 4, "lookahead": 2}},
           "provenance": {"command": "c", "date_utc": "d", "git": {"commit": "0" * 10, "dirty": False},
                          "machine": {"cpu": "cpu"}}}
    md = S.markdown(res)
    assert "| 2 seeds, λ=0.05, abc1234567 |" in md
    assert "| 4 seeds, earlier |" in md
    S.DEFENSIVE = None
    from jaxcd.decoding import smc
    assert S._defensive_value() == smc.DEFENSIVE
    assert S._defensive_value(0.2) == 0.2


def test_one_smc_program_serves_every_constraint(smol):
    """The SMC program compiled for the first constraint serves the next: the table LM is
    a static argument of ``smc._run``, and ``jit`` keys it by its type as well as its
    value. A table-LM class made anew per constraint recompiled every program per
    constraint, and their JIT code exhausted the process's memory maps at the sixth
    constraint of the second model's run ("LLVM compilation error: Cannot allocate
    memory", then a segfault)."""
    from jaxcd.decoding import smc

    specs = {s.name: s for s in S.SPECS}
    two = [specs[n] for n in NAMES]
    bucket = S._common_bucket(two, smol)
    sizes = []
    for spec in two:
        S.study_constraint(smol, spec, None, [2], 1, 8, ["gcd"], 0, log=lambda *a: None,
                           bucket=bucket)
        sizes.append(smc._run._cache_size())
    assert sizes[1] == sizes[0], sizes
    assert S._table_lm_class() is S._table_lm_class()


def test_summary_counts_the_goal_table():
    """``summary`` (the figures README.md tags) against counts made here from the same
    records: a constraint meets the goal when TV at the largest K ≤ 2 × the runs floor."""
    import json
    from pathlib import Path
    res = json.loads((Path(S.DEFAULT_OUT) / "bias_real.json").read_text())
    s = S.summary(res)
    K = str(max(res["settings"]["ks"]))
    for p in s["met"]:
        want = sum(c["smc"][p][K]["tv_strings"]["mean"] <= 2 * c["noise_floor"]["strings"]["mean"]
                   for c in res["constraints"].values() if p in c.get("smc", {}))
        assert s["met"][p] == want
    tv = sorted(c["tv_gcd_strings"] for c in res["constraints"].values())
    assert s["gcd_tv"]["min"] == tv[0] and s["gcd_tv"]["max"] == tv[-1]
    assert s["constraints"] == len(tv) == 23
