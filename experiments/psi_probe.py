"""Why the P-GCD lookahead closes tool calls early: ψ at the argument boundaries.

At each point of a BFCL JSON call where an argument value has just ended, the automaton
allows two things: another argument (``,``) or closing the arguments (``}``). This probe
takes correct outputs of a study (``predictions.jsonl``), cuts each at every such
boundary (the prefix tokenized canonically, walked through the automaton), and compares
how two proposals split their mass between "continue" and "close":

* GCD: ``q(v) ∝ p_lm(v)·m(v)`` (the LM's own split, masked);
* the P-GCD lookahead (``λ = 0``): ``q(v) ∝ p_lm(v)·ψ(x v)``.

``shift = log-odds(lookahead) − log-odds(GCD)`` (continue : close) is what ψ adds. The
hypothesis it tests: the HMM never sees the prompt, so the argument names that only
the prompt makes likely cost ψ their small HMM probability, while closing costs one
EOS, and ψ pushes toward closing by several nats per argument. A strongly negative shift
at boundaries where the correct call continues supports it.

Tokens whose first byte is neither ``,`` nor ``}`` (whitespace, if the format allows it)
are reported as "other" mass. The prefix is the canonical tokenization of the text up to
the boundary, which may differ from the tokens the sampler drew; both proposals see the
same LM row there, so ``shift`` is ψ's effect either way.

Usage::

    python -m experiments.psi_probe --run experiments/results/second_model \\
        --model qwen2.5-coder-0.5b --limit 40
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def arg_boundaries(text: str) -> list[tuple[int, str]]:
    """Byte offsets of the ``,`` / ``}`` that end each value of the (first) call's
    ``"arguments"`` object, with that byte: ``[(offset, "," or "}"), ...]``."""
    b = text.encode()
    key = b'"arguments"'
    i = b.find(key)
    if i < 0:
        return []
    i = b.find(b"{", i + len(key))
    if i < 0:
        return []
    out, depth, in_str, esc = [], 0, False, False
    for j in range(i, len(b)):
        c = b[j:j + 1]
        if in_str:
            if esc:
                esc = False
            elif c == b"\\":
                esc = True
            elif c == b'"':
                in_str = False
            continue
        if c == b'"':
            in_str = True
        elif c in (b"{", b"["):
            depth += 1
        elif c in (b"}", b"]"):
            if depth == 1 and c == b"}":
                if b[i + 1:j].strip():                 # a non-empty object
                    out.append((j, "}"))
                return out
            depth -= 1
        elif c == b"," and depth == 1:
            out.append((j, ","))
    return out


def classify(vocab, ids: np.ndarray) -> np.ndarray:
    """0 = continue (first byte ``,``), 1 = close (``}``), 2 = other, per token id."""
    cls = np.full(len(ids), 2, np.int8)
    for k, v in enumerate(ids):
        t = vocab.token_bytes[int(v)]
        if t[:1] == b",":
            cls[k] = 0
        elif t[:1] == b"}":
            cls[k] = 1
    return cls


def _lse(x):
    x = np.asarray(x, np.float64)
    if x.size == 0 or not np.isfinite(x).any():
        return -np.inf
    m = np.max(x[np.isfinite(x)])
    return float(m + np.log(np.sum(np.exp(x - m))))


def variant(hmm, prompt_ids, prompt_mix: float = 0.0, token_bonus: float = 0.0):
    """Two changes of ψ tried against the early closing (each keeps SMC exact: ψ is only
    the twist): ``prompt_mix`` ``w`` mixes every state's emissions with the prompt's token
    frequencies, ``B' = (1 − w)·B + w·u_prompt`` (a copy component: the argument names and
    values the prompt holds become likely); ``token_bonus`` ``g`` multiplies every emission
    by ``e^g`` (a completion of ``L`` tokens gains ``e^(g·L)``: ``g`` = the HMM's held-out
    gap to the LM in nats per token would make lengths comparable)."""
    from jaxcd.hmm import HMMParams
    if not (prompt_mix or token_bonus):
        return hmm
    B = np.asarray(hmm.B)
    if prompt_mix:
        u = np.bincount(np.asarray(prompt_ids), minlength=B.shape[1]) / len(prompt_ids)
        B = (1 - prompt_mix) * B + (prompt_mix * u)[None, :].astype(B.dtype)
    if token_bonus:
        B = B * np.float32(np.exp(token_bonus))
    return HMMParams(hmm.pi, hmm.A, B.astype(np.asarray(hmm.B).dtype))


def probe(model, hmm, ex, output: str, budget: int, fmt: str = "json",
          prompt_mix: float = 0.0, token_bonus: float = 0.0) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from experiments import bfcl
    from experiments.runner import build_constraint
    from jaxcd.decoding import decode, gcd, pgcd
    from jaxcd.lm.interface import pad_prompts

    tok, vocab = model.tokenizer, model.vocab
    nfa, _ = bfcl.constraint_nfa(ex, fmt)
    fa = build_constraint(nfa, vocab).device
    prompt = bfcl.prompt_ids(ex, tok, fmt)
    hmm = variant(hmm, prompt, prompt_mix, token_bonus)
    gt = gcd.backward(fa, budget)
    pt = pgcd.backward(fa, hmm, budget)
    lm, params = model.lm, model.params
    rows = []
    bounds = arg_boundaries(output)
    for n_b, (off, nxt) in enumerate(bounds):
        prefix = output.encode()[:off]
        ids = tok.encode(prefix.decode(), add_special_tokens=False)
        if vocab.decode_bytes(ids) != prefix:
            continue
        st = pgcd.init_state(fa, hmm)
        for v in ids:
            st = pgcd.advance(fa, hmm, st, jnp.int32(v))
        if int(st.cs.t) >= budget:
            continue
        full = list(prompt) + list(ids)
        pid, lens = pad_prompts([full], pad_id=getattr(lm, "pad_token_id", 0), length=len(full))
        _, lp = lm.prefill(params, jnp.asarray(pid, jnp.int32), jnp.asarray(lens, jnp.int32),
                           len(full) + 1)
        lt = jax.nn.log_softmax(lp.astype(jnp.float32), axis=-1)
        cs1 = jax.tree_util.tree_map(lambda x: x[None], st.cs)
        a_gcd = np.asarray(decode.masked_logits(fa, gt, cs1, lt))[0]
        logpsi, _, _ = pgcd.scores(fa, pt, st)
        logpsi = np.full(a_gcd.shape, -np.inf) if logpsi is None else np.asarray(logpsi)
        if logpsi.shape[0] < a_gcd.shape[0]:
            logpsi = np.pad(logpsi, (0, a_gcd.shape[0] - logpsi.shape[0]),
                            constant_values=-np.inf)
        allowed = np.flatnonzero(np.isfinite(a_gcd))
        if allowed.size == 0:
            continue
        cls = classify(vocab, allowed)
        a_look = a_gcd[allowed] + logpsi[allowed]
        g = {c: _lse(a_gcd[allowed][cls == c]) - _lse(a_gcd[allowed]) for c in range(3)}
        q = {c: _lse(a_look[cls == c]) - _lse(a_look) for c in range(3)}
        if not (np.isfinite(g[0]) and np.isfinite(g[1])):
            # no choice here (required arguments come in a fixed order; the last one closes)
            rows.append({"id": ex.id, "boundary": n_b, "of": len(bounds), "next": nxt,
                         "t": int(st.cs.t), "choice": False})
            continue
        lo_g, lo_q = g[0] - g[1], q[0] - q[1]
        rows.append({"id": ex.id, "boundary": n_b, "of": len(bounds), "next": nxt,
                     "t": int(st.cs.t), "choice": True, "gcd_logodds": lo_g, "look_logodds": lo_q,
                     "shift": lo_q - lo_g, "gcd_other": float(np.exp(g[2])),
                     "look_other": float(np.exp(q[2])),
                     "psi_continue_minus_close": _lse(logpsi[allowed][cls == 0])
                     - _lse(logpsi[allowed][cls == 1])})
    return rows


def summarize(rows: list[dict]) -> dict:
    out = {"boundaries": len(rows), "with_choice": sum(x["choice"] for x in rows)}
    for nxt, name in ((",", "continues"), ("}", "closes")):
        r = [x for x in rows if x["choice"] and x["next"] == nxt and not np.isnan(x["shift"])]
        if not r:
            continue
        sh = np.array([x["shift"] for x in r])
        pg = np.array([1 / (1 + np.exp(-x["gcd_logodds"])) for x in r])
        pq = np.array([1 / (1 + np.exp(-x["look_logodds"])) for x in r])
        out[name] = {"n": len(r), "examples": len({x["id"] for x in r}),
                     "shift_median": float(np.median(sh)), "shift_mean": float(np.mean(sh)),
                     "shift_q25": float(np.quantile(sh, 0.25)),
                     "shift_q75": float(np.quantile(sh, 0.75)),
                     "frac_shift_below_minus_2.3": float(np.mean(sh < -np.log(10))),
                     "p_continue_gcd_mean": float(pg.mean()),
                     "p_continue_lookahead_mean": float(pq.mean())}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a study's results folder (run/, data/)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--hmm", default="default")
    ap.add_argument("--method", default="smc-gcd")
    ap.add_argument("--particles", type=int, default=16)
    ap.add_argument("--format", default="json")
    ap.add_argument("--limit", type=int, default=40, help="correct outputs probed")
    ap.add_argument("--prompt-mix", type=float, default=0.0,
                    help="w of jaxcd.hmm.prompt_mix: the HMM's emissions mixed with the prompt's "
                         "token frequencies (0: the HMM as distilled)")
    ap.add_argument("--token-bonus", type=float, default=0.0,
                    help="g: every HMM emission times e^g (ψ of a completion of L tokens times e^(gL))")
    ap.add_argument("--out", default=None, help="default: <run>/psi_probe.json")
    a = ap.parse_args(argv)
    from experiments import bfcl
    from jaxcd.generation import load_hmm, load_model
    from jaxcd.model_files import enable_compile_cache
    enable_compile_cache()
    run = Path(a.run)
    model = load_model(a.model)
    hmm = load_hmm(a.hmm, model)
    exs = {e.id: e for e in bfcl.load_examples(run / "data" / "data.jsonl",
                                                 run / "data" / "answers.jsonl")}
    preds = [json.loads(x) for x in (run / "run" / "predictions.jsonl").read_text().splitlines()]
    sel = [r for r in preds if r["method"] == a.method and r["particles"] == a.particles
           and r["format"] == a.format and r["correct"]][:a.limit]
    t0 = time.perf_counter()
    rows = []
    for n, r in enumerate(sel):
        got = probe(model, hmm, exs[r["id"]], r["output"], r["budget"], a.format,
                    a.prompt_mix, a.token_bonus)
        rows += got
        print(f"{n + 1}/{len(sel)} {r['id']}: " + ", ".join(
            f"{x['next']} shift {x['shift']:+.1f} (gcd {x['gcd_logodds']:+.1f})" if x["choice"]
            else f"{x['next']} forced" for x in got),
            flush=True)
    res = {"command": "python -m experiments.psi_probe " + " ".join(argv or []),
           "model": Path(model.path).name, "hmm": a.hmm, "prompt_mix": a.prompt_mix, "token_bonus": a.token_bonus, "source": f"{a.method} K={a.particles} "
           "correct outputs", "outputs": len(sel), "seconds": time.perf_counter() - t0,
           "summary": summarize(rows), "rows": rows}
    out = Path(a.out) if a.out else run / "psi_probe.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res["summary"], indent=1))
    return res


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
