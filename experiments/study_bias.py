"""Study 6 — bias, exactly: total-variation distance to the true posterior against k.

Toy problems whose posterior ``p(x | x ∈ L, |x| ≤ n)`` is enumerated by brute force
(every token sequence of at most ``n`` tokens ending in EOS, checked with ``re`` /
``in`` on its text, weighted by the LM's own probability):

* ``regex``: an explicit table LM (:class:`jaxcd.lm.TableLM`, peaked and seeded) over 6
  tokens, the regex ``a{3}b?|b-?|ab-|ba+`` and budget 5;
* ``keywords``: an HMM used as the LM (:class:`jaxcd.lm.hmm_lm.HMMLM`, H=6) over 8 tokens,
  the keyword constraint "contains ``cab`` and ``bc``" (``compile_keywords``), budget 4.

P-GCD's HMM is *distilled* from each LM's own unconstrained samples by EM (H=4 and H=3,
smaller than / different from the LM), as in the real pipeline, so the lookahead is
informative but not exact.

Methods (the output of one run with ``k`` particles is one token sequence):

* ``lcd`` / ``gcd``: unweighted samples of the masked LM; the output is one of the ``k``
  samples drawn uniformly among the valid ones (LCD: "invalid" when none is valid).
  Biased: as ``k`` grows the output tends to the proposal restricted to ``L``, not the
  posterior.
* ``smc-lcd`` / ``smc-gcd`` / ``smc-lookahead`` / ``smc-product``: :func:`jaxcd.decoding.smc.run`
  (systematic resampling at ESS < k/2); the output is one particle drawn from the weighted
  ensemble. Consistent: TV → 0 as ``k`` grows (self-normalised bias ``O(1/k)``).

Each (method, k) is ``seeds × runs`` independent runs; for each seed the ``runs`` outputs
form an empirical distribution whose TV to the posterior is the estimate (mean ± sd over
seeds). Even exact samples give a positive TV: the *noise floor* is the TV of ``runs``
exact posterior samples (many repetitions: mean and 95th percentile). A second, less noisy
estimate ("pooled") averages each run's full output distribution (normalised weights;
uniform over valid samples) instead of drawing one output. The exact TV of unweighted GCD
is enumerated too (the GCD proposal's probability of every sequence, masks by brute force).

    python -m experiments.study_bias                  # CPU, a few minutes
    python -m experiments.study_bias --smoke          # seconds (CI)

Writes ``bias.json``, ``bias.md`` and ``bias.png`` into ``--out``
(default ``experiments/results/bias``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODULE = "experiments.study_bias"
METHODS = ("lcd", "gcd", "smc-lcd", "smc-gcd", "smc-lookahead", "smc-product")
KS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_OUT = ROOT / "experiments" / "results" / "bias"


# ---------------------------------------------------------------------------------------
# the toy problems
# ---------------------------------------------------------------------------------------
@dataclass
class Problem:
    name: str
    description: str
    tokens: list                  # bytes per token id; id `eos` is EOS
    eos: int
    budget: int
    accepts: Callable[[str], bool]
    lm: object                    # a jaxcd LanguageModel
    params: object
    next_probs: Callable[[tuple], np.ndarray]   # host float64 reference p(. | prefix)
    fa: object = None
    hmm: object = None            # distilled proposal HMM (HMMParams)
    hmm_info: dict = field(default_factory=dict)

    @property
    def V(self):
        return len(self.tokens)

    def text(self, body):
        try:
            return b"".join(self.tokens[v] for v in body).decode()
        except UnicodeDecodeError:
            return None


def _seq_prob(prob_fn, seq):
    p = 1.0
    for t in range(len(seq)):
        p *= float(prob_fn(tuple(seq[:t]))[seq[t]])
    return p


REGEX_TOKENS = [b"<eos>", b"a", b"b", b"aa", b"ab", b"-"]
REGEX = r"a{3}b?|b-?|ab-|ba+"


def _regex_lm_probs(prefix):
    """A fixed, peaked LM: strongly prefers 'a' first and is reluctant to finish 'aaa'
    (so the GCD proposal, which renormalises locally, is visibly biased)."""
    V = len(REGEX_TOKENS)
    code = sum((v + 1) * (V + 1) ** i for i, v in enumerate(prefix))
    p = np.random.default_rng([2024, len(prefix), code]).dirichlet(np.full(V, 0.6))
    if len(prefix) == 0:
        p = np.array([0.02, 0.6, 0.18, 0.05, 0.1, 0.05])
    if tuple(prefix) == (1,):
        p = np.array([0.3, 0.02, 0.4, 0.03, 0.05, 0.2])
    return p / p.sum()


def regex_problem(budget=5) -> Problem:
    from jaxcd import Vocabulary, compile_regex
    from jaxcd.lm.interface import TableLM

    V = len(REGEX_TOKENS)
    lm = TableLM.from_function(_regex_lm_probs, V, budget, 0)
    # the host reference reads the same (float32) table the device uses
    logp, children = (np.asarray(a, np.float64) for a in lm.params)
    children = children.astype(int)

    def next_probs(prefix):
        node = 0
        for v in prefix:
            node = children[node, v]
        p = np.exp(logp[node])
        return p / p.sum()

    vocab = Vocabulary.from_token_bytes(REGEX_TOKENS, eos_id=0)
    return Problem("regex", f"TableLM (V={V}, peaked, seeded), regex `{REGEX}`, budget {budget}",
                   REGEX_TOKENS, 0, budget, lambda s: re.fullmatch(REGEX, s) is not None,
                   lm, lm.params, next_probs, fa=compile_regex(REGEX, vocab))


KW_TOKENS = [b"<eos>", b"a", b"b", b"c", b" ", b"ab", b"ca", b"bc"]
KEYWORDS = ("cab", "bc")


def keywords_problem(budget=4, H=6) -> Problem:
    import jax.numpy as jnp

    from hmm_distill import HMMParams
    from jaxcd import Vocabulary, compile_keywords
    from jaxcd.lm.hmm_lm import HMMLM

    V = len(KW_TOKENS)
    rng = np.random.default_rng(7)
    pi = rng.dirichlet(np.full(H, 0.5))
    A = rng.dirichlet(np.full(H, 0.3), size=H)
    B = rng.dirichlet(np.full(V, 0.4), size=H)
    B[:, 0] = 0.03 + 0.25 * rng.random(H)             # every state may end the text
    B /= B.sum(1, keepdims=True)
    pi32, A32, B32 = (np.asarray(x, np.float32) for x in (pi, A, B))
    params = HMMParams(jnp.asarray(pi32), jnp.asarray(A32), jnp.asarray(B32))
    pi64, A64, B64 = (x.astype(np.float64) for x in (pi32, A32, B32))
    pi64, A64, B64 = pi64 / pi64.sum(), A64 / A64.sum(1, keepdims=True), B64 / B64.sum(1, keepdims=True)

    def next_probs(prefix):
        u = pi64
        for v in prefix:
            a = u * B64[:, v]
            u = (a / a.sum()) @ A64
        return u @ B64

    vocab = Vocabulary.from_token_bytes(KW_TOKENS, eos_id=0)
    return Problem("keywords",
                   f"HMM as the LM (H={H}, V={V}, seeded), text contains "
                   f"{' and '.join(repr(k) for k in KEYWORDS)}, budget {budget}",
                   KW_TOKENS, 0, budget, lambda s: all(k in s for k in KEYWORDS),
                   HMMLM(V, 0), params, next_probs,
                   fa=compile_keywords(list(KEYWORDS), vocab))


# ---------------------------------------------------------------------------------------
# exact references (brute force, float64, no jaxcd code)
# ---------------------------------------------------------------------------------------
def enumerate_posterior(pb: Problem):
    """``({padded token tuple: p(x | x ∈ L_n)}, Z)``: every body of at most ``n-1`` tokens
    whose text the constraint accepts, followed by EOS (padded with EOS to ``n``)."""
    n, eos = pb.budget, pb.eos
    others = [v for v in range(pb.V) if v != eos]
    post = {}
    for m in range(n):
        for body in itertools.product(others, repeat=m):
            s = pb.text(body)
            if s is not None and pb.accepts(s):
                seq = body + (eos,)
                post[seq + (eos,) * (n - len(seq))] = _seq_prob(pb.next_probs, seq)
    Z = sum(post.values())
    return {k: v / Z for k, v in post.items()}, Z


def exact_gcd_distribution(pb: Problem, post: dict) -> dict:
    """The unweighted GCD proposal's probability of every valid sequence: at each step
    ``q(v) ∝ p_lm(v | prefix)·m(v)`` with ``m(v) = 1`` iff ``prefix·v`` starts some
    sequence of the enumerated support (after EOS: EOS with probability 1)."""
    n, eos = pb.budget, pb.eos
    allowed = {}
    for seq in post:
        for t in range(n):
            allowed.setdefault(seq[:t], set()).add(seq[t])
    q = {}
    for seq in post:
        prob, done = 1.0, False
        for t in range(n):
            if done:
                continue
            p = pb.next_probs(seq[:t])
            m = np.zeros(pb.V)
            m[list(allowed[seq[:t]])] = 1.0
            prob *= p[seq[t]] * m[seq[t]] / float(p @ m)
            done = seq[t] == eos
        q[seq] = prob
    return q


def tv_dict(p: dict, q: dict) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


# ---------------------------------------------------------------------------------------
# proposal HMM: distilled from the LM's unconstrained samples by EM
# ---------------------------------------------------------------------------------------
def distill_hmm(pb: Problem, H: int, seed: int, num: int, iters: int):
    import jax
    import jax.numpy as jnp

    from hmm_distill import expected_counts, m_step, random_params
    from jaxcd.decoding import decode

    ids = jnp.zeros((num, 1), jnp.int32)
    out = decode.sample(jax.random.key(seed), pb.lm, pb.params, ids, jnp.ones(num, jnp.int32),
                        None, None, max_steps=pb.budget, constrained=False)
    toks = out.tokens
    params = random_params(jax.random.key(seed + 1), H, pb.V, noise=1.0)

    @jax.jit
    def em(p):
        c = expected_counts(p, toks)
        return m_step(c, p, pseudocount=1e-3), c.loglik

    lls = []
    for _ in range(iters):
        params, ll = em(params)
        lls.append(float(ll) / num)
    rows = np.asarray(toks)
    lm_ll = float(np.mean([np.log(_seq_prob(pb.next_probs, tuple(r))) for r in rows[:2000]]))
    return params, {"hidden_size": H, "em_iterations": iters, "train_sequences": num,
                    "train_loglik_per_seq_first": lls[0], "train_loglik_per_seq_last": lls[-1],
                    "lm_loglik_per_seq_same_data": lm_ll}


# ---------------------------------------------------------------------------------------
# running the methods
# ---------------------------------------------------------------------------------------
class Outcomes:
    """Maps EOS-padded token rows to outcome indices: the posterior's support first,
    then ``other`` (valid but outside the enumerated support: must stay 0) and
    ``invalid``."""

    def __init__(self, post: dict, V: int):
        self.keys = sorted(post)
        self.p = np.array([post[k] for k in self.keys] + [0.0, 0.0])
        self.V = V
        codes = np.array([self.code(np.array([k]))[0] for k in self.keys], np.int64)
        self.order = np.argsort(codes)
        self.codes = codes[self.order]
        self.OTHER, self.INVALID = len(self.keys), len(self.keys) + 1

    def code(self, rows):
        rows = np.asarray(rows, np.int64)
        return rows @ (self.V ** np.arange(rows.shape[-1], dtype=np.int64))

    def index(self, rows, valid):
        c = self.code(rows)
        pos = np.clip(np.searchsorted(self.codes, c), 0, len(self.codes) - 1)
        hit = self.codes[pos] == c
        idx = np.where(hit, self.order[pos], self.OTHER)
        return np.where(valid, idx, self.INVALID)

    def tv(self, counts):
        est = counts / counts.sum()
        return 0.5 * float(np.abs(est - self.p).sum())


def draw_outputs(rng, w):
    """One column per row drawn ∝ ``w`` (rows of zeros: -1)."""
    s = w.sum(1)
    ok = s > 0
    cw = np.cumsum(np.where(ok[:, None], w / np.where(ok, s, 1)[:, None], 0), 1)
    u = rng.random(len(w))
    idx = np.minimum((cw < u[:, None]).sum(1), w.shape[1] - 1)
    return np.where(ok, idx, -1)


def summarise(oc: Outcomes, idx, w, seeds: int):
    """Per-seed TV of the drawn outputs and of the pooled (Rao–Blackwellised) ensemble.
    ``idx [S·R, K]`` outcome index per particle, ``w [S·R, K]`` output weights."""
    rng = np.random.default_rng(12345)
    pick = draw_outputs(rng, w)
    n_out = len(oc.p)
    SR = len(idx)
    R = SR // seeds
    tv_draw, tv_pool, inval, other = [], [], [], []
    for s in range(seeds):
        sl = slice(s * R, (s + 1) * R)
        ps, ids = pick[sl], idx[sl]
        chosen = np.where(ps >= 0, ids[np.arange(R), np.maximum(ps, 0)], oc.INVALID)
        cnt = np.bincount(chosen, minlength=n_out).astype(float)
        tv_draw.append(oc.tv(cnt))
        ws = w[sl]
        tot = ws.sum(1, keepdims=True)
        wn = np.where(tot > 0, ws / np.where(tot > 0, tot, 1), 0)
        pooled = np.bincount(ids.ravel(), weights=wn.ravel(), minlength=n_out)
        pooled[oc.INVALID] += float((tot[:, 0] <= 0).sum())
        tv_pool.append(oc.tv(pooled))
        inval.append(float(cnt[oc.INVALID] / R))
        other.append(int(cnt[oc.OTHER]))
    return {"tv": _ms(tv_draw), "tv_pooled": _ms(tv_pool), "invalid_rate": _ms(inval),
            "outside_support": int(sum(other)), "tv_per_seed": tv_draw}


def _ms(x):
    x = np.asarray(x, float)
    return {"mean": float(x.mean()), "sd": float(x.std(ddof=1)) if len(x) > 1 else 0.0}


def run_unweighted(pb, oc, method, ks, seeds, runs, seed):
    import jax
    import jax.numpy as jnp

    from jaxcd.decoding import decode

    Kmax = max(ks)
    M = seeds * runs * Kmax
    fa = pb.fa.to_device()
    tables = decode.tables_for(fa, method, pb.budget)
    t0 = time.perf_counter()
    out = decode.sample(jax.random.key(seed), pb.lm, pb.params, jnp.zeros((M, 1), jnp.int32),
                        jnp.ones(M, jnp.int32), fa, tables, max_steps=pb.budget, constrained=True)
    toks = np.asarray(out.tokens).reshape(seeds * runs, Kmax, pb.budget)
    valid = np.asarray(out.valid).reshape(seeds * runs, Kmax)
    secs = time.perf_counter() - t0
    idx = oc.index(toks, valid)
    res = {}
    for K in ks:
        res[K] = summarise(oc, idx[:, :K], valid[:, :K].astype(float), seeds)
        res[K]["sample_valid_rate"] = float(valid[:, :K].mean())
    return res, secs


def run_smc(pb, oc, proposal, ks, seeds, runs, seed):
    import jax
    import jax.numpy as jnp

    from jaxcd.decoding import smc

    fa = pb.fa.to_device()
    res, secs = {}, 0.0
    B = seeds * runs
    for K in ks:
        t0 = time.perf_counter()
        r = smc.run(jax.random.key(seed * 1000 + K), pb.lm, pb.params, jnp.zeros((B, 1), jnp.int32),
                    jnp.ones(B, jnp.int32), fa, budget=pb.budget, num_particles=K,
                    proposal=proposal, hmm=pb.hmm if proposal in ("lookahead", "product") else None)
        toks = np.asarray(r.tokens)
        lw = np.asarray(r.log_weights, np.float64)
        valid = np.asarray(r.valid)
        secs += time.perf_counter() - t0
        fin = np.isfinite(lw)
        if np.any(fin & ~valid):
            raise AssertionError(f"{proposal}: a particle with positive weight is invalid")
        m = np.where(fin.any(1, keepdims=True), lw.max(1, keepdims=True), 0.0)
        w = np.where(fin, np.exp(lw - m), 0.0)
        res[K] = summarise(oc, oc.index(toks, valid), w, seeds)
        res[K]["mean_log_Z"] = float(np.mean(np.asarray(r.log_Z, np.float64)[np.isfinite(np.asarray(r.log_Z))])) \
            if np.isfinite(np.asarray(r.log_Z)).any() else None
        zhat = np.exp(np.asarray(r.log_Z, np.float64))
        res[K]["Z_hat_mean"] = float(zhat.mean())
        res[K]["Z_hat_se"] = float(zhat.std(ddof=1) / np.sqrt(len(zhat)))
    return res, secs


def noise_floor(oc: Outcomes, runs: int, reps: int, seed: int):
    """TV of the empirical distribution of ``runs`` exact posterior samples."""
    rng = np.random.default_rng(seed)
    tvs = [oc.tv(rng.multinomial(runs, oc.p)) for _ in range(reps)]
    return {"mean": float(np.mean(tvs)), "sd": float(np.std(tvs, ddof=1)),
            "p95": float(np.percentile(tvs, 95)), "samples_per_estimate": runs, "repetitions": reps}


def study_problem(pb: Problem, ks, seeds, runs, seed, hmm_hidden, methods=METHODS, log=print):
    t0 = time.perf_counter()
    post, Z = enumerate_posterior(pb)
    oc = Outcomes(post, pb.V)
    q_gcd = exact_gcd_distribution(pb, post)
    if any(m in ("smc-lookahead", "smc-product") for m in methods):
        pb.hmm, pb.hmm_info = distill_hmm(pb, hmm_hidden, seed + 77, num=8192, iters=40)
    out = {"description": pb.description, "budget": pb.budget, "vocab": [t.decode() for t in pb.tokens],
           "Z": Z, "support_size": len(post), "posterior_sum": float(sum(post.values())),
           "gcd_exact_tv": tv_dict(q_gcd, post), "gcd_exact_mass": float(sum(q_gcd.values())),
           "top_posterior": [{"text": pb.text(k[:k.index(pb.eos)]), "p": post[k]}
                             for k in sorted(post, key=post.get, reverse=True)[:8]],
           "proposal_hmm": pb.hmm_info,
           "noise_floor": noise_floor(oc, runs, 400, seed + 5), "methods": {}, "seconds": {}}
    log(f"[{pb.name}] support {len(post)}, Z = {Z:.4g}, exact TV(GCD) = {out['gcd_exact_tv']:.3f}, "
        f"floor {out['noise_floor']['mean']:.3f}")
    for method in methods:
        i = METHODS.index(method)
        if method.startswith("smc-"):
            res, secs = run_smc(pb, oc, method[4:], ks, seeds, runs, seed + i)
        else:
            res, secs = run_unweighted(pb, oc, method, ks, seeds, runs, seed + i)
        out["methods"][method] = {str(k): v for k, v in res.items()}
        out["seconds"][method] = secs
        log(f"[{pb.name}] {method:14s} " + " ".join(f"k={k}:{res[k]['tv']['mean']:.3f}" for k in ks)
            + f"  ({secs:.1f}s)")
    out["seconds"]["total"] = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------
LABELS = {"lcd": "LCD (unweighted)", "gcd": "GCD (unweighted)", "smc-lcd": "SMC, LCD proposal",
          "smc-gcd": "SMC, GCD proposal", "smc-lookahead": "SMC, P-GCD lookahead",
          "smc-product": "SMC, P-GCD product"}


def markdown(res: dict) -> str:
    st = res["settings"]
    lines = ["# Study 6 — bias, exactly", "",
             f"Command: `{res['provenance']['command']}`  ",
             f"Date (UTC): {res['provenance']['date_utc']}; commit {res['provenance']['git']['commit'][:10]}"
             f"{' (dirty)' if res['provenance']['git']['dirty'] else ''}; "
             f"machine: {res['provenance']['machine']['cpu']}  ",
             f"Seeds: {st['seeds']} × {st['runs']} runs per (method, k); base seed {st['seed']}.", "",
             "TV distance between each method's output distribution (one output per run) and the "
             "enumerated posterior `p(x | x ∈ L, |x| ≤ n)`; mean ± sd over seeds. The noise floor is the "
             "TV of the same number of exact posterior samples.", ""]
    for name, pr in res["problems"].items():
        ks = [str(k) for k in st["ks"]]
        fl = pr["noise_floor"]
        lines += [f"## {name}: {pr['description']}", "",
                  f"Posterior support {pr['support_size']} sequences, Z = p(x ∈ L_n) = {pr['Z']:.4g} "
                  f"(enumerated posterior sums to {pr['posterior_sum']:.12f}). "
                  f"Exact TV of unweighted GCD (enumerated): **{pr['gcd_exact_tv']:.4f}**. "
                  f"Noise floor ({fl['samples_per_estimate']} exact samples): {fl['mean']:.4f} "
                  f"(95th percentile {fl['p95']:.4f}).{_hmm_line(pr['proposal_hmm'])}", "",
                  "| method | " + " | ".join(f"k={k}" for k in ks) + " |",
                  "|---|" + "---|" * len(ks)]
        for m, r in pr["methods"].items():
            lines.append(f"| {LABELS[m]} | " + " | ".join(
                f"{r[k]['tv']['mean']:.3f} ± {r[k]['tv']['sd']:.3f}" for k in ks) + " |")
        lines.append(f"| noise floor | " + " | ".join(f"{fl['mean']:.3f}" for _ in ks) + " |")
        lines += ["", "Pooled estimate (each run's whole weighted ensemble averaged; less noisy):", "",
                  "| method | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
        for m, r in pr["methods"].items():
            lines.append(f"| {LABELS[m]} | " + " | ".join(f"{r[k]['tv_pooled']['mean']:.3f}" for k in ks) + " |")
        lcd = pr["methods"].get("lcd")
        if lcd:
            lines += ["", "LCD outputs with no valid sample among k (share of runs): " + ", ".join(
                f"k={k}: {lcd[k]['invalid_rate']['mean']:.3f}" for k in ks)]
        lines.append("")
    if res.get("figure"):
        lines.append(f"![TV against k]({res['figure']})")
    return "\n".join(lines) + "\n"


def _hmm_line(h: dict) -> str:
    if not h:
        return ""
    return (f" P-GCD HMM: H={h['hidden_size']}, EM on {h['train_sequences']} LM samples (train "
            f"log-lik/seq {h['train_loglik_per_seq_last']:.3f} vs the LM's {h['lm_loglik_per_seq_same_data']:.3f}).")


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probs = res["problems"]
    fig, axes = plt.subplots(1, len(probs), figsize=(6.2 * len(probs), 4.4), squeeze=False)
    styles = {"lcd": ("tab:red", "s--"), "gcd": ("tab:orange", "o--"), "smc-lcd": ("tab:red", "s-"),
              "smc-gcd": ("tab:orange", "o-"), "smc-lookahead": ("tab:blue", "^-"),
              "smc-product": ("tab:green", "v-")}
    ks = res["settings"]["ks"]
    for ax, (name, pr) in zip(axes[0], probs.items()):
        for m, r in pr["methods"].items():
            c, st = styles[m]
            ax.errorbar(ks, [r[str(k)]["tv"]["mean"] for k in ks], yerr=[r[str(k)]["tv"]["sd"] for k in ks],
                        fmt=st, color=c, ms=4, capsize=2, label=LABELS[m])
        fl = pr["noise_floor"]
        ax.axhspan(0, fl["p95"], color="gray", alpha=0.2, label=f"noise floor (≤ 95th pct, {fl['samples_per_estimate']} exact samples)")
        ax.axhline(fl["mean"], color="gray", lw=1)
        ax.axhline(pr["gcd_exact_tv"], color="tab:orange", lw=0.8, ls=":", label="GCD exact TV (enumerated)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks)
        ax.set_xticklabels([str(k) for k in ks])
        ax.set_xlabel("particles / samples k")
        ax.set_ylabel("TV(output distribution, posterior)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: {pr['description']}", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SETTINGS = {"default": dict(ks=list(KS), seeds=5, runs=4000, problems="regex,keywords",
                       methods=",".join(METHODS)),
            "smoke": dict(ks=[16], seeds=2, runs=1000, problems="regex", methods="lcd,gcd,smc-gcd"),
            "full": dict(ks=list(KS), seeds=10, runs=20000, problems="regex,keywords",
                         methods=",".join(METHODS))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny settings (CI)")
    ap.add_argument("--full", action="store_true", help="more runs (a GPU or a patient CPU)")
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=None)
    ap.add_argument("--seeds", type=int, default=None, help="independent repetitions (TV mean ± sd)")
    ap.add_argument("--runs", type=int, default=None, help="runs (outputs) per seed and (method, k)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--problems", default=None, help="comma-separated: regex, keywords")
    ap.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    a = ap.parse_args(argv)
    st = dict(SETTINGS["smoke" if a.smoke else "full" if a.full else "default"])
    for k in ("ks", "seeds", "runs", "problems", "methods"):
        if getattr(a, k) is not None:
            st[k] = getattr(a, k)
    if st["seeds"] < 2:
        ap.error("--seeds must be at least 2 (the sd over seeds is reported)")
    from experiments.provenance import provenance

    builders = {"regex": regex_problem, "keywords": keywords_problem}
    names = [x for x in st["problems"].split(",") if x]
    for n in names:
        if n not in builders:
            ap.error(f"unknown problem {n!r} (choose from {', '.join(builders)})")
    methods = [x for x in st["methods"].split(",") if x]
    for m in methods:
        if m not in METHODS:
            ap.error(f"unknown method {m!r} (choose from {', '.join(METHODS)})")
    from jaxcd.model_files import enable_compile_cache
    enable_compile_cache()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = {"study": "bias", "provenance": provenance(MODULE, argv, [a.seed + i for i in range(st["seeds"])]),
           "settings": {**st, "seed": a.seed, "problems": names, "methods": methods,
                        "mode": "smoke" if a.smoke else "full" if a.full else "default"},
           "problems": {}}
    hidden = {"regex": 4, "keywords": 3}
    for n in names:
        res["problems"][n] = study_problem(builders[n](), st["ks"], st["seeds"], st["runs"], a.seed, hidden[n],
                                           methods)
    res["figure"] = "bias.png"
    try:
        plot(res, out_dir / "bias.png")
    except ImportError:
        res["figure"] = None
        print("matplotlib is not installed (pip install 'jaxcd[plot]'): no figure", file=sys.stderr)
    (out_dir / "bias.json").write_text(json.dumps(res, indent=1))
    (out_dir / "bias.md").write_text(markdown(res))
    print(f"wrote {out_dir}/bias.json, bias.md" + (", bias.png" if res["figure"] else ""))
    return res


if __name__ == "__main__":
    main()
