"""Study 6b — the bias on the real model, exactly (issue 23, item 1).

Finite constraints with chat prompts (yes/no and multiple-choice questions, small enums
from BFCL parameters, numbers in a range, short dates). For each constraint and model:

1. **Enumeration, independent of jaxcd's automata.** Every string of the language is
   listed explicitly in Python; every tokenization of it (not only the canonical one) is
   found by a dynamic programme over the tokenizer's byte strings; those of at most
   ``n - 1`` tokens (``n`` = budget, EOS included) followed by EOS form the support. Their
   prefixes form a trie.
2. **Scoring.** The real LM is run teacher-forced (batched: the prompt prefilled once,
   then every root-to-leaf path of the trie stepped through ``lm.step``), which gives the
   model's full next-token distribution (all ``V`` entries) at every trie node. Hence
   ``p_lm(x·EOS | prompt)`` of every sequence, ``Z = p_lm(x ∈ L_n)``, the exact posterior
   over token sequences and over strings, and the exact **GCD** proposal distribution
   (``q(v) ∝ p(v)·1{v is a child of the node}``, masks read off the trie) and **LCD**
   proposal distribution (mask: ``bytes(prefix·v)`` is a prefix of some string of ``L``,
   any length; LCD's missing mass is runs that overrun the budget). The trie masks are
   cross-checked against jaxcd's own GCD tables (``gcd.backward`` + ``gcd.mask`` on the
   automaton ``compile_regex`` builds over the full vocabulary): they must be equal at
   every node.
3. **SMC** (:func:`jaxcd.decoding.smc.run`, unchanged) with the ``gcd``, ``lookahead`` and
   ``product`` proposals at ``K ∈ {1, 2, …, 64}``; ``R`` runs per seed. The ensemble
   estimate pools every run's particles with the weight ``Ẑ_r · w̄_rk`` (``w̄`` the run's
   normalised weights), i.e. the final unnormalised weights pooled over runs: an unbiased
   estimate of ``Z·p(x)`` divided by one of ``Z`` (consistent in ``R`` for any ``K``).
   Its TV to the exact posterior (over strings and over token sequences) is reported with
   a noise floor: the TV of ``R`` exact posterior samples (mean and 95th percentile; the
   floor of ``R·K`` exact samples is listed too, for reference).

**The cached LM (the speed-up, and how it is verified).** The language is finite and
fully enumerated, so the LM's next-token distribution at every node SMC can reach is
already known from step 2. SMC therefore runs against a table LM
(:class:`CachedLM`, a :class:`jaxcd.lm.interface.TableLM`) holding those rows:

* *full-vocabulary table* (``V`` columns, the model's rows as they are): with the same
  seed, ``smc.run`` on the live model and on this table give the same tokens and the same
  weights to float tolerance — checked on two constraints per model (``--verify``, and in
  the test).
* *reduced-vocabulary table*, used for the big runs: the tokens that occur in the trie,
  EOS, one "other" token carrying ``logsumexp`` of the model's remaining logits (a special
  token: no constraint ever allows it) and special padding columns. The automaton is
  compiled over this reduced vocabulary, the HMM's emission columns are restricted the
  same way (the other column gets the remaining mass). Every quantity SMC computes —
  ``log_softmax`` of the row at each allowed token, the GCD mask, ``ψ``, ``p_prod`` — is
  the same number as with the full vocabulary (checked: the reduced rows' log-softmax at
  the trie tokens equals the full rows', the reduced automaton's masks equal the trie's);
  only the random stream differs (the Gumbel draws are over ``V_red`` columns instead of
  ``V``), so equality there is distributional, and it is also checked statistically
  (pooled estimates of the full and the reduced table against each other).

P-GCD's HMM: the model's own ``jaxcd demo`` HMM (H=32, distilled from the model's own
samples of the built-in prompts; :func:`load_hmm_for`), for SmolLM2 and the second model alike.

    python -m experiments.study_bias_real                       # SmolLM2, all constraints
    python -m experiments.study_bias_real --model qwen2.5-coder-0.5b
    python -m experiments.study_bias_real --smoke               # seconds (3 constraints)

Writes ``bias_real.json``, ``bias_real.md`` and ``bias_real.png`` into ``--out``
(default ``experiments/results/bias_real``); a second model's results go to
``bias_real_<model>.json`` etc.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODULE = "experiments.study_bias_real"
KS = (1, 2, 4, 8, 16, 32, 64)
PROPOSALS = ("gcd", "lookahead", "product")
DEFAULT_OUT = ROOT / "experiments" / "results" / "bias_real"
STEPS = 16          # static SMC length (every budget here is at most this)
VRED = 128         # reduced vocabulary size (padded)
NODES = 1024       # table rows (padded)


# ---------------------------------------------------------------------------------------
# the constraints
# ---------------------------------------------------------------------------------------
@dataclass
class Spec:
    name: str
    kind: str
    prompt: str
    strings: list          # the language, listed explicitly (the enumeration's source)
    regex: str             # the same language for jaxcd (cross-checked against the trie)
    budget: int = 8


def _alt(words):
    return "(" + "|".join(re.escape(w) for w in words) + ")"


def _spec(name, kind, prompt, words, regex=None, budget=8):
    return Spec(name, kind, prompt, list(words), regex or _alt(words), budget)


SPECS = [
    _spec("paris", "yes/no", "Is Paris the capital of France? Answer in one word.",
          ["yes", "no", "maybe", "true", "false"]),
    _spec("colour", "choice", "Name a colour.",
          ["red", "green", "blue", "yellow", "purple", "orange"]),
    _spec("number", "range", "Pick a number from one to ten.",
          [str(i) for i in range(1, 11)], r"([1-9]|10)"),
    _spec("sky", "yes/no", "Is the sky green? Answer yes or no.", ["yes", "no"]),
    _spec("penguins", "yes/no", "Can penguins fly? Answer yes or no.", ["yes", "no"]),
    _spec("prime", "yes/no", "Is 7 a prime number? Answer yes or no.", ["yes", "no"]),
    _spec("water", "yes/no", "Is water wet? Answer with Yes or No.", ["Yes", "No"]),
    _spec("planet", "multiple choice",
          "Which planet is closest to the sun? A) Venus B) Mercury C) Mars D) Earth. "
          "Answer with the letter.", ["A", "B", "C", "D"]),
    _spec("arith", "multiple choice", "What is 2+2? Options: 3, 4, 5. Answer with the number.",
          ["3", "4", "5"]),
    _spec("ocean", "multiple choice",
          "What is the largest ocean? Answer with one of: Atlantic, Pacific, Indian, Arctic.",
          ["Atlantic", "Pacific", "Indian", "Arctic"]),
    _spec("shape", "multiple choice", "What shape has three sides?",
          ["triangle", "square", "circle", "hexagon"]),
    _spec("weekday", "multiple choice", "Which day of the week comes after Monday?",
          ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]),
    _spec("unit", "BFCL enum", "Get the current weather in Boston. Which temperature unit "
          "should the call use?", ["celsius", "fahrenheit"]),
    _spec("sort", "BFCL enum", "List the files sorted by date. Which sort order should the "
          "call use?", ["asc", "desc"]),
    _spec("http", "BFCL enum", "Which HTTP method fetches a web page?",
          ["GET", "POST", "PUT", "DELETE"]),
    _spec("mode", "BFCL enum", "Plan a route from my home to the office. Which travel mode "
          "should the call use?", ["driving", "walking", "bicycling", "transit"]),
    _spec("format", "BFCL enum", "Convert the photo for a website. Which image format should "
          "the call use?", ["png", "jpeg", "gif", "webp"]),
    _spec("legs", "range", "How many legs does a spider have? Answer with a number.",
          [str(i) for i in range(1, 13)], r"([1-9]|1[0-2])"),
    _spec("rating", "range", "Rate the movie Titanic from 1 to 5.",
          [str(i) for i in range(1, 6)], r"[1-5]"),
    _spec("age", "range", "How old is a typical first-year university student? Answer "
          "with a number.", [str(i) for i in range(16, 23)], r"(1[6-9]|2[0-2])"),
    _spec("month", "date", "Which month comes after March? Answer with the month number "
          "as two digits.", [f"{i:02d}" for i in range(1, 13)], r"(0[1-9]|1[0-2])"),
    _spec("christmas", "date", "On what date is Christmas Day? Answer as MM-DD.",
          [f"12-{d}" for d in range(20, 30)], r"12-2[0-9]"),
    _spec("ww2", "date", "In what year did World War II end?",
          [f"194{d}" for d in range(10)], r"194[0-9]"),
]
SMOKE = ["paris", "number", "sort"]


# ---------------------------------------------------------------------------------------
# enumeration (independent of jaxcd's automata)
# ---------------------------------------------------------------------------------------
def token_index(vocab):
    """``{bytes: [token ids]}`` over the ordinary (non-special) tokens."""
    idx: dict = {}
    for i, (b, sp) in enumerate(zip(vocab.token_bytes, vocab.is_special)):
        if not sp and b:
            idx.setdefault(b, []).append(i)
    return idx


def tokenizations(s: bytes, idx: dict, max_tokens: int, max_len: int = 64) -> list:
    """Every token sequence whose bytes concatenate to ``s``, with at most ``max_tokens``."""
    memo: dict = {}

    def rec(i, left):
        if i == len(s):
            return [()]
        if left == 0:
            return []
        key = (i, left)
        if key not in memo:
            out = []
            for j in range(i + 1, min(len(s), i + max_len) + 1):
                for v in idx.get(s[i:j], ()):
                    out += [(v,) + rest for rest in rec(j, left - 1)]
            memo[key] = out
        return memo[key]

    return rec(0, max_tokens)


@dataclass
class Trie:
    """The support: ``seqs`` (token tuples without EOS), ``strings[i]`` the text of
    ``seqs[i]``; trie nodes ``prefixes`` (node 0 = empty), ``children[node] = {tok:
    node}``, ``terminal[node]`` = the prefix spells a string of ``L`` (EOS allowed)."""

    seqs: list
    seq_string: list
    prefixes: list
    node_of: dict
    children: list
    terminal: np.ndarray
    seq_node: np.ndarray       # node of each full sequence
    depth: np.ndarray


def build_trie(strings, idx, budget) -> Trie:
    seqs, seq_string = [], []
    for s in strings:
        for seq in tokenizations(s.encode(), idx, budget - 1):
            seqs.append(seq)
            seq_string.append(s)
    node_of = {(): 0}
    prefixes = [()]
    children = [dict()]
    for seq in seqs:
        for t in range(len(seq)):
            p, c = seq[:t], seq[:t + 1]
            if c not in node_of:
                node_of[c] = len(prefixes)
                prefixes.append(c)
                children.append({})
            children[node_of[p]][seq[t]] = node_of[c]
    terminal = np.zeros(len(prefixes), bool)
    seq_node = np.array([node_of[s] for s in seqs])
    terminal[seq_node] = True
    depth = np.array([len(p) for p in prefixes])
    return Trie(seqs, seq_string, prefixes, node_of, children, terminal, seq_node, depth)


PROMPT_WIDTH = 64


def prefill_prompt(model, prompt_ids):
    """The prompt left-padded to :data:`PROMPT_WIDTH` and prefilled once, with room for
    ``STEPS + 1`` tokens (fixed shapes: one compiled prefill and step for every prompt).
    Returns ``(Prefilled, padded ids [1, W])``."""
    import jax.numpy as jnp

    from jaxcd.decoding import decode
    from jaxcd.lm.interface import pad_prompts

    ids, lens = pad_prompts([prompt_ids], pad_id=getattr(model.lm, "pad_token_id", 0),
                            length=PROMPT_WIDTH)
    pre = decode.prefill(model.lm, model.params, jnp.asarray(ids), jnp.asarray(lens),
                         PROMPT_WIDTH + STEPS + 1)
    return pre, ids


def score_trie(model, prompt_ids, trie: Trie, chunk: int = 32) -> np.ndarray:
    """float32 ``[num_nodes, V]``: the LM's next-token log-probabilities at every trie node
    (teacher-forced: the prompt prefilled once, each root-to-leaf path stepped through
    ``lm.step``, ``chunk`` paths at a time)."""
    import jax.numpy as jnp

    from jaxcd.decoding import decode

    lm, params = model.lm, model.params
    leaves = [i for i, ch in enumerate(trie.children) if not ch]
    L = int(trie.depth.max())
    pre, _ = prefill_prompt(model, prompt_ids)
    V = pre.logp.shape[-1]
    rows = np.full((len(trie.prefixes), V), np.nan, np.float32)
    rows[0] = np.asarray(pre.logp[0])
    eos = lm.eos_token_id
    for c0 in range(0, len(leaves), chunk):
        paths = [trie.prefixes[n] for n in leaves[c0:c0 + chunk]]
        toks = np.full((chunk, L), eos, np.int32)
        for i, p in enumerate(paths):
            toks[i, :len(p)] = p
        state, _ = decode.broadcast_prefill((pre.state, pre.logp), chunk)
        for t in range(L):
            if all(len(p) <= t for p in paths):
                break
            state, lp = lm.step(params, state, jnp.asarray(toks[:, t]))
            lp = np.asarray(lp)
            for i, p in enumerate(paths):
                if len(p) > t:
                    rows[trie.node_of[p[:t + 1]]] = lp[i]
    assert not np.isnan(rows).any(), "a trie node was not scored"
    return rows


# ---------------------------------------------------------------------------------------
# exact distributions (float64, from the trie and the scored rows)
# ---------------------------------------------------------------------------------------
def _lse(x):
    m = np.max(x)
    return m + np.log(np.sum(np.exp(x - m)))


def lcd_mask_tokens(trie: Trie, strings, idx, vocab, node) -> list:
    """LCD's allowed tokens at ``node``: ``bytes(prefix·v)`` is a prefix of a string of L
    (any number of tokens), and EOS if the prefix is a string of L."""
    b = b"".join(vocab.token_bytes[v] for v in trie.prefixes[node])
    out = set()
    for s in strings:
        s = s.encode()
        if s.startswith(b) and len(s) > len(b):
            rest = s[len(b):]
            for j in range(1, len(rest) + 1):
                out.update(idx.get(rest[:j], ()))
    if b.decode() in strings:
        out.add(vocab.eos_id)
    return sorted(out)


def exact(trie: Trie, rows: np.ndarray, eos: int, strings, idx, vocab) -> dict:
    """Posterior over sequences and strings, Z, exact GCD and LCD distributions."""
    lp = rows.astype(np.float64)
    lp = lp - np.array([_lse(r) for r in lp])[:, None]      # renormalise in float64
    gcd_norm, lcd_norm = np.zeros(len(lp)), np.zeros(len(lp))
    gcd_masks = []
    for node, ch in enumerate(trie.children):
        toks = list(ch) + ([eos] if trie.terminal[node] else [])
        gcd_masks.append(sorted(toks))
        gcd_norm[node] = _lse(lp[node, toks])
        lcd_norm[node] = _lse(lp[node, lcd_mask_tokens(trie, strings, idx, vocab, node)])
    logp, logq_gcd, logq_lcd = [], [], []
    for seq in trie.seqs:
        a = g = c = 0.0
        node = 0
        for v in seq + (eos,):
            a += lp[node, v]
            g += lp[node, v] - gcd_norm[node]
            c += lp[node, v] - lcd_norm[node]
            node = trie.children[node].get(v, -1)
        logp.append(a)
        logq_gcd.append(g)
        logq_lcd.append(c)
    logp = np.array(logp)
    logZ = _lse(logp)
    post = np.exp(logp - logZ)
    return {"log_p": logp, "logZ": float(logZ), "post": post, "gcd": np.exp(logq_gcd),
            "lcd": np.exp(logq_lcd), "gcd_masks": gcd_masks, "lp": lp}


def by_string(trie: Trie, probs, strings) -> np.ndarray:
    out = np.zeros(len(strings))
    for s, p in zip(trie.seq_string, probs):
        out[strings.index(s)] += p
    return out


def tv(p, q) -> float:
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def check_jaxcd_masks(model, spec: Spec, trie: Trie, gcd_masks) -> dict:
    """jaxcd's GCD masks (``gcd.backward`` + ``gcd.mask`` on ``compile_regex`` over the full
    vocabulary) at every trie node against the trie's children: must be equal."""
    import jax
    import jax.numpy as jnp

    from jaxcd import compile_regex
    from jaxcd.decoding import gcd

    fa = compile_regex(spec.regex, model.vocab)
    fad = fa.to_device()
    tables = gcd.backward(fad, spec.budget)
    states = []
    for p in trie.prefixes:
        s = int(fa.initial_state)
        for v in p:
            s = int(fa.next_state(s, v))
        states.append(s)
    cs = gcd.ConstraintState(jnp.asarray(states, jnp.int32), jnp.asarray(trie.depth, jnp.int32))
    m = np.asarray(jax.vmap(lambda c: gcd.mask(fad, tables, c))(cs))
    bad = [i for i in range(len(states)) if sorted(np.flatnonzero(m[i]).tolist()) != gcd_masks[i]]
    return {"nodes": len(states), "mismatched_nodes": len(bad)}


# ---------------------------------------------------------------------------------------
# the cached (table) LM
# ---------------------------------------------------------------------------------------
@functools.cache
def _table_lm_class():
    """One class for the process: ``jit`` keys a static argument by its type as well as
    its value, so a class made anew per constraint recompiled every SMC program per
    constraint (and each program holds ~200 memory maps of its JIT code, until the
    process's map limit — 65,530 — ended the 23-constraint run at the sixth)."""
    from jaxcd.lm.interface import TableLM

    class CachedLM(TableLM):
        """A :class:`TableLM` whose identity (for ``jit``) is its shape only: the rows live
        in ``params``, so one compiled SMC program serves every constraint."""

        def __init__(self, logprobs, children, eos_token_id):
            super().__init__(logprobs, children, eos_token_id)
            self._key = ("cached-lm", self.vocab_size, self.eos_token_id)

    return CachedLM


def full_table(trie: Trie, rows: np.ndarray, eos: int, pad_nodes: int | None = None):
    """Full-vocabulary table: node ``i`` = trie node ``i``; a sink node (self-loops) for
    every token that leaves the trie (only EOS padding does)."""
    N = len(trie.prefixes)
    T = N + 1 if pad_nodes is None else pad_nodes
    V = rows.shape[1]
    logp = np.zeros((T, V), np.float32)
    logp[:N] = rows
    logp[N:] = rows[0]
    children = np.full((T, V), N, np.int32)
    for node, ch in enumerate(trie.children):
        for v, c in ch.items():
            children[node, v] = c
    return _table_lm_class()(logp, children, eos), logp, children


@dataclass
class Reduced:
    tokens: np.ndarray         # full ids of reduced ids 1..len(tokens)
    vocab: object              # the reduced Vocabulary
    lm: object
    logp: np.ndarray
    children: np.ndarray
    other: int
    full_of: np.ndarray = field(default=None)   # reduced id -> full id (-1: other/padding)


def reduced_table(trie: Trie, rows: np.ndarray, vocab, V_red: int = VRED, T: int = NODES):
    from jaxcd import Vocabulary

    eos = vocab.eos_id
    toks = sorted({v for ch in trie.children for v in ch})
    n = len(toks)
    other = n + 1
    if other >= V_red or len(trie.prefixes) >= T:
        raise ValueError(f"reduced table too small: {n} tokens, {len(trie.prefixes)} nodes")
    tb = [b""] + [vocab.token_bytes[v] for v in toks] + [b"\xff"] * (V_red - n - 1)
    rv = Vocabulary.from_token_bytes(tb, eos_id=0, special_ids=range(other, V_red),
                                     name=f"reduced-{vocab.name}")
    N = len(trie.prefixes)
    rest = np.ones(rows.shape[1], bool)
    rest[toks] = False
    rest[eos] = False
    logp = np.full((T, V_red), -np.inf, np.float32)
    r64 = rows.astype(np.float64)
    logp[:N, 0] = rows[:, eos]
    logp[:N, 1:n + 1] = rows[:, toks]
    m = r64[:, rest].max(1, keepdims=True)
    logp[:N, other] = (m[:, 0] + np.log(np.exp(r64[:, rest] - m).sum(1))).astype(np.float32)
    logp[N:] = logp[0]
    red_of = {v: i + 1 for i, v in enumerate(toks)}
    children = np.full((T, V_red), N, np.int32)
    for node, ch in enumerate(trie.children):
        for v, c in ch.items():
            children[node, red_of[v]] = c
    full_of = np.full(V_red, -1)
    full_of[0] = eos
    full_of[1:n + 1] = toks
    return Reduced(np.array(toks), rv, _table_lm_class()(logp, children, 0), logp, children,
                   other, full_of)


def reduced_hmm(hmm, red: Reduced, eos: int, V_red: int = VRED):
    import jax.numpy as jnp

    from jaxcd.hmm import HMMParams

    B = np.asarray(hmm.B, np.float64)
    Br = np.zeros((B.shape[0], V_red))
    Br[:, 0] = B[:, eos]
    Br[:, 1:len(red.tokens) + 1] = B[:, red.tokens]
    Br[:, red.other] = np.clip(1.0 - Br.sum(1), 0.0, None)
    Br /= Br.sum(1, keepdims=True)
    return HMMParams(jnp.asarray(hmm.pi), jnp.asarray(hmm.A), jnp.asarray(Br.astype(np.float32)))


# ---------------------------------------------------------------------------------------
# SMC and the estimates
# ---------------------------------------------------------------------------------------
ESS_THRESHOLD = 0.5
DEFENSIVE = None    # λ of the P-GCD proposals' defensive mixture (None: smc.run's default)


def run_smc(key, lm, table_params, fa, budget, K, R, proposal, hmm, steps=STEPS,
            prompt=None, prefilled=None, params=None, ess_threshold=None, defensive=None):
    import jax.numpy as jnp

    from jaxcd.decoding import smc

    if prompt is None:
        ids, lens = jnp.zeros((R, 1), jnp.int32), jnp.ones(R, jnp.int32)
    else:                       # padded ids [1, W] of a prefilled prompt (lengths unused)
        ids = jnp.repeat(jnp.asarray(prompt, jnp.int32), R, axis=0)
        lens = jnp.full((R,), ids.shape[1], jnp.int32)
    return smc.run(key, lm, table_params if params is None else params, ids, lens, fa,
                   budget=budget, num_particles=K, proposal=proposal,
                   hmm=hmm if proposal in ("lookahead", "product") else None, max_steps=steps,
                   prefilled=prefilled,
                   ess_threshold=ESS_THRESHOLD if ess_threshold is None else ess_threshold,
                   defensive=_defensive_value(defensive))


def _defensive_value(defensive=None) -> float:
    from jaxcd.decoding import smc
    for d in (defensive, DEFENSIVE):
        if d is not None:
            return float(d)
    return float(smc.DEFENSIVE)


def pooled(trie: Trie, tokens, log_w, full_of, eos) -> tuple[np.ndarray, int]:
    """Pooled estimate over sequences: ``Σ_r Ẑ_r Σ_k w̄_rk 1{x_rk = x}``, normalised
    (= the final unnormalised weights pooled over runs). Returns (estimate, number of
    positive-weight particles outside the support: must be 0)."""
    toks = np.asarray(tokens)
    lw = np.asarray(log_w, np.float64)
    R, K, n = toks.shape
    flat = toks.reshape(R * K, n)
    w = lw.reshape(-1)
    fin = np.isfinite(w)
    m = w[fin].max() if fin.any() else 0.0
    ww = np.where(fin, np.exp(np.where(fin, w, m) - m), 0.0)
    index = {s: i for i, s in enumerate(trie.seqs)}
    est = np.zeros(len(trie.seqs))
    outside = 0
    pos = ww > 0
    if pos.any():
        uniq, inv = np.unique(flat[pos], axis=0, return_inverse=True)
        wsum = np.bincount(inv.reshape(-1), weights=ww[pos], minlength=len(uniq))
        for row, wi in zip(uniq, wsum):
            full = [int(full_of[v]) if full_of is not None else int(v) for v in row]
            seq = tuple(full[:full.index(eos)]) if eos in full else None
            i = index.get(seq)
            if i is None:
                outside += 1
            else:
                est[i] += wi
    s = est.sum()
    return (est / s if s > 0 else est), outside


def noise_floor(post, n_samples, reps=400, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    tvs = [tv(rng.multinomial(n_samples, post) / n_samples, post) for _ in range(reps)]
    return {"mean": float(np.mean(tvs)), "p95": float(np.percentile(tvs, 95)),
            "samples": int(n_samples), "repetitions": reps}


# ---------------------------------------------------------------------------------------
# one constraint
# ---------------------------------------------------------------------------------------
def study_constraint(model, spec: Spec, hmm, ks, seeds, runs, proposals, seed, log=print,
                     bucket=None):
    import jax

    from jaxcd import compile_regex
    from jaxcd.decoding.buckets import bucket_automaton

    t0 = time.perf_counter()
    vocab = model.vocab
    eos = vocab.eos_id
    idx = token_index(vocab)
    prompt = model.encode_prompt(spec.prompt)
    trie = build_trie(spec.strings, idx, spec.budget)
    t_enum = time.perf_counter() - t0
    rows = score_trie(model, prompt, trie)
    t_score = time.perf_counter() - t0 - t_enum
    ex = exact(trie, rows, eos, spec.strings, idx, vocab)
    chk = check_jaxcd_masks(model, spec, trie, ex["gcd_masks"])
    post_s = by_string(trie, ex["post"], spec.strings)
    gcd_s = by_string(trie, ex["gcd"], spec.strings)
    lcd_s = by_string(trie, ex["lcd"], spec.strings)
    canon = [tuple(model.tokenizer.encode(s, add_special_tokens=False)) for s in spec.strings]
    out = {"kind": spec.kind, "prompt": spec.prompt, "regex": spec.regex, "budget": spec.budget,
           "strings": spec.strings, "prompt_tokens": len(prompt),
           "support_sequences": len(trie.seqs), "trie_nodes": len(trie.prefixes),
           "canonical_in_support": sum(c in set(trie.seqs) for c in canon),
           "Z": float(np.exp(ex["logZ"])), "posterior_sum": float(ex["post"].sum()),
           "posterior": dict(zip(spec.strings, post_s.tolist())),
           "gcd_exact": dict(zip(spec.strings, gcd_s.tolist())),
           "gcd_exact_mass": float(ex["gcd"].sum()),
           "lcd_exact": dict(zip(spec.strings, lcd_s.tolist())),
           "lcd_exact_valid_mass": float(ex["lcd"].sum()),
           "tv_gcd_strings": tv(gcd_s, post_s), "tv_gcd_sequences": tv(ex["gcd"], ex["post"]),
           "tv_lcd_strings": tv(lcd_s / max(lcd_s.sum(), 1e-300), post_s),
           "jaxcd_mask_check": chk, "seconds": {"enumerate": t_enum, "score": t_score},
           "smc": {}}
    log(f"[{spec.name}] {len(trie.seqs)} sequences, {len(trie.prefixes)} nodes, Z={out['Z']:.3g}; "
        f"TV(GCD)={out['tv_gcd_strings']:.3f}; masks mismatched at {chk['mismatched_nodes']} nodes; "
        f"post {_top(out['posterior'])} | gcd {_top(out['gcd_exact'])} (score {t_score:.1f}s)")
    if not proposals:
        out["seconds"]["total"] = time.perf_counter() - t0
        return out, trie, rows, ex
    red = reduced_table(trie, rows, vocab)
    fa = compile_regex(spec.regex, red.vocab, cache=False)
    fa = bucket_automaton(fa, bucket) if bucket else fa
    fa = fa.to_device()
    # the reduced rows give the same log-softmax at every allowed token (float32)
    import jax.numpy as jnp
    N = len(trie.prefixes)
    lf = np.asarray(jax.nn.log_softmax(jnp.asarray(rows), axis=-1))
    lr = np.asarray(jax.nn.log_softmax(jnp.asarray(red.logp[:N]), axis=-1))
    diffs = [abs(float(lr[node, i]) - float(lf[node, red.full_of[i]]))
             for node, m in enumerate(ex["gcd_masks"]) for i in
             [0 if v == eos else 1 + int(np.searchsorted(red.tokens, v)) for v in m]]
    out["reduced_logsoftmax_max_abs_diff"] = float(max(diffs))
    hred = reduced_hmm(hmm, red, eos) if hmm is not None else None
    post = ex["post"]
    out["noise_floor"] = {"sequences": noise_floor(post, runs, seed=seed),
                          "strings": noise_floor(post_s, runs, seed=seed)}
    out["noise_floor_RK"] = {str(K): noise_floor(post_s, runs * K, reps=100, seed=seed)
                             for K in ks}
    for prop in proposals:
        if prop in ("lookahead", "product") and hred is None:
            continue
        res = {}
        for K in ks:
            tvs, tvq, outside, secs, lz = [], [], 0, 0.0, []
            for s in range(seeds):
                t1 = time.perf_counter()
                r = run_smc(jax.random.key(seed * 7919 + s * 101 + K), red.lm, red.lm.params, fa,
                            spec.budget, K, runs, prop, hred)
                est, o = pooled(trie, r.tokens, r.log_weights, red.full_of, eos)
                secs += time.perf_counter() - t1
                outside += o
                tvq.append(tv(est, post))
                tvs.append(tv(by_string(trie, est, spec.strings), post_s))
                lz.append(np.asarray(r.log_Z, np.float64))
            lz = np.concatenate(lz)
            zhat = float(np.mean(np.exp(lz - ex["logZ"])))
            res[str(K)] = {"tv_strings": _ms(tvs), "tv_sequences": _ms(tvq), "outside_support": outside,
                           "Zhat_over_Z": zhat, "seconds": secs}
        out["smc"][prop] = res
        out.setdefault("smc_settings", {})[prop] = {
            "seeds": seeds, "ess_threshold": ESS_THRESHOLD,
            "defensive": _defensive_value() if prop in ("lookahead", "product") else None}
        log(f"[{spec.name}] smc-{prop:9s} " + " ".join(f"K={k}:{res[k]['tv_strings']['mean']:.3f}"
                                                   for k in res) +
            f" | floor {out['noise_floor']['strings']['mean']:.3f}"
            f" ({sum(v['seconds'] for v in res.values()):.1f}s)")
    out["seconds"]["total"] = time.perf_counter() - t0
    return out, trie, rows, ex


def _ms(x):
    x = np.asarray(x, float)
    return {"mean": float(x.mean()), "sd": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "per_seed": x.tolist()}


def _top(d, k=3):
    return ", ".join(f"{s} {p:.3f}" for s, p in sorted(d.items(), key=lambda x: -x[1])[:k])


# ---------------------------------------------------------------------------------------
# verification: the cached LM against the live model (same seed)
# ---------------------------------------------------------------------------------------
def verify_cached(model, spec: Spec, trie, rows, hmm, K=4, R=8, seed=0, proposals=("gcd",)):
    """smc.run with the live model and with the full-vocabulary table, same key: tokens
    equal, weights and log Ẑ equal to float tolerance."""
    import jax
    import jax.numpy as jnp

    from jaxcd import compile_regex
    from jaxcd.decoding import decode

    fa = compile_regex(spec.regex, model.vocab).to_device()
    prompt = model.encode_prompt(spec.prompt)
    lm_t, logp, children = full_table(trie, rows, model.vocab.eos_id)
    pre, ids = prefill_prompt(model, prompt)
    out = {}
    for prop in proposals:
        key = jax.random.key(seed)
        live = run_smc(key, model.lm, None, fa, spec.budget, K, R, prop, hmm, prompt=ids,
                       prefilled=pre, params=model.params)
        tab = run_smc(key, lm_t, lm_t.params, fa, spec.budget, K, R, prop, hmm)
        lw_l, lw_t = np.asarray(live.log_weights, np.float64), np.asarray(tab.log_weights, np.float64)
        fin = np.isfinite(lw_l)
        out[prop] = {"K": K, "runs": R,
                     "tokens_equal": bool(np.array_equal(np.asarray(live.tokens), np.asarray(tab.tokens))),
                     "finite_pattern_equal": bool(np.array_equal(fin, np.isfinite(lw_t))),
                     "max_abs_log_weight_diff": float(np.max(np.abs(lw_l[fin] - lw_t[fin]))) if fin.any() else 0.0,
                     "max_abs_logZ_diff": float(np.max(np.abs(np.asarray(live.log_Z, np.float64)
                                                             - np.asarray(tab.log_Z, np.float64))))}
    return out


# ---------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------
LABELS = {"gcd": "SMC, GCD proposal", "lookahead": "SMC, P-GCD lookahead",
          "product": "SMC, P-GCD product"}


def goal_table(res) -> list:
    rows = []
    for name, c in res["constraints"].items():
        if not c.get("smc"):
            continue
        fl = c["noise_floor"]["strings"]["mean"]
        K = str(max(res["settings"]["ks"]))
        flk = c.get("noise_floor_RK", {}).get(K, {}).get("mean")
        row = {"constraint": name, "floor": fl, "floor_RK": flk, "gcd_exact_tv": c["tv_gcd_strings"]}
        for p, r in c["smc"].items():
            if K in r:
                row[p] = r[K]["tv_strings"]["mean"]
                row[p + "_met"] = row[p] <= 2 * fl
                row[p + "_met_RK"] = flk is not None and row[p] <= 2 * flk
        rows.append(row)
    return rows


def markdown(res: dict) -> str:
    st = res["settings"]
    pv = res["provenance"]
    L = [f"# Study 6b — the bias on the real model ({res['model']})", "",
         f"Command: `{pv['command']}`  ",
         *([f"Merged into this file before it ({len(res['provenance_earlier'])} runs, newest "
            "first; `dirty` also counts a results file written by an earlier run): "
            + "; ".join(f"`{q['command']}` ({q['date_utc'][:16]}Z, {q['git']['commit'][:7]}"
                        f"{' dirty' if q['git']['dirty'] else ''})"
                        for q in res["provenance_earlier"]) + "  "]
           if res.get("provenance_earlier") else []),
         f"Date (UTC): {pv['date_utc']}; commit {pv['git']['commit'][:10]}"
         f"{' (dirty)' if pv['git']['dirty'] else ''}; machine: {pv['machine']['cpu']}  ",
         f"SMC: {_seeds_text(st)} × {st['runs']} runs per (constraint, proposal, K); base seed "
         f"{st['seed']}; systematic resampling at ESS < {st.get('ess_threshold', 0.5)}·K; HMM: {res.get('hmm_note', 'none')}.", "",
         "Method. Every string of each finite language is listed; every tokenization of it "
         "(not only the canonical one) of at most budget − 1 tokens, followed by EOS, is scored "
         "by the real model teacher-forced (prompt through the chat template, EOS probability "
         "included). That gives the exact posterior `p(x | prompt, x ∈ L_n)` and the exact "
         "distributions of unweighted GCD and LCD (masks read off the trie; equal to jaxcd's "
         "GCD tables at every node). SMC is jaxcd's `smc.run`, unchanged, run against a "
         "table LM that returns the model's cached next-token rows at each trie node "
         "(reduced to the trie's tokens + EOS + one 'other' token with the remaining mass: "
         "the same log-probabilities at every allowed token; verified against the live model "
         "with the same seed, below). The SMC estimate pools every run's particles weighted "
         "by `Ẑ_r · w̄_rk` (unbiased numerator); TV is over strings (token-sequence TV in the "
         "json). Noise floor: TV of `runs` exact posterior samples (mean, 95th pct).", ""]
    if res.get("verification"):
        L += ["## The cached LM equals the live model (same seed)", "",
              "| constraint | proposal | K × runs | tokens equal | max |Δ log w| | max |Δ log Ẑ| |",
              "|---|---|---|---|---|---|"]
        for name, v in res["verification"].items():
            for p, r in v.items():
                L.append(f"| {name} | {p} | {r['K']} × {r['runs']} | {r['tokens_equal']} | "
                         f"{r['max_abs_log_weight_diff']:.2e} | {r['max_abs_logZ_diff']:.2e} |")
        L.append("")
    L += ["## Exact: posterior against unweighted GCD", "",
          "| constraint | kind | budget | sequences | Z | posterior (top) | exact GCD (top) | TV(GCD) | TV(LCD, valid part) | LCD valid mass |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in res["constraints"].items():
        L.append(f"| {name} | {c['kind']} | {c['budget']} | {c['support_sequences']} | {c['Z']:.3g} | "
                 f"{_top(c['posterior'])} | {_top(c['gcd_exact'])} | **{c['tv_gcd_strings']:.3f}** | "
                 f"{c['tv_lcd_strings']:.3f} | {c['lcd_exact_valid_mass']:.3f} |")
    L.append("")
    ks = [str(k) for k in st["ks"]]
    have = [n for n, c in res["constraints"].items() if c.get("smc")]
    if have:
        L += ["## SMC: TV of the pooled estimate to the exact posterior (strings)", "",
              "Run: the seeds, the P-GCD proposals' defensive mixture weight λ (`smc.run(..., "
              "defensive=λ)`; `λ=0`: the pure P-GCD proposal, as before it existed) and the commit "
              "of each (constraint, proposal)'s runs; runs before commit 141b4e5 resampled "
              "finished and unfinished particles together (no λ recorded: λ = 0).", "",
              "| constraint | proposal | " + " | ".join(f"K={k}" for k in ks) + " | floor (p95) | GCD exact | run |",
              "|---|---|" + "---|" * len(ks) + "---|---|---|"]
        for n in have:
            c = res["constraints"][n]
            fl = c["noise_floor"]["strings"]
            for p, r in c["smc"].items():
                L.append(f"| {n} | {p} | " + " | ".join(
                    f"{r[k]['tv_strings']['mean']:.3f}" if k in r else "–" for k in ks) +
                    f" | {fl['mean']:.3f} ({fl['p95']:.3f}) | {c['tv_gcd_strings']:.3f} | "
                    f"{_run_text(res, c, p)} |")
        Kmax = max(st["ks"])
        L += ["", f"## Goal: at K={Kmax}, TV ≤ 2 × noise floor", "",
              f"Floor: TV of `runs` = {st['runs']} exact posterior samples (one per run pooled; "
              f"mean). Stricter, for reference: the floor of runs × K = {st['runs'] * Kmax} exact "
              "samples (as many as the particles pooled); ✓/✗ first against the runs floor, then "
              "against the runs × K floor.", "",
              "| constraint | floor (runs) | floor (runs × K) | GCD exact | " + " | ".join(PROPOSALS) + " |",
              "|---|---|---|---|" + "---|" * len(PROPOSALS)]
        met_all = {p: [] for p in PROPOSALS}
        met_rk = {p: [] for p in PROPOSALS}
        for g in goal_table(res):
            cells = []
            for p in PROPOSALS:
                if p in g:
                    cells.append(f"{g[p]:.4f} {'✓' if g[p + '_met'] else '✗'}{'✓' if g[p + '_met_RK'] else '✗'}")
                    met_all[p].append(g[p + "_met"])
                    met_rk[p].append(g[p + "_met_RK"])
                else:
                    cells.append("–")
            frk = f"{g['floor_RK']:.4f}" if g["floor_RK"] is not None else "–"
            L.append(f"| {g['constraint']} | {g['floor']:.4f} | {frk} | {g['gcd_exact_tv']:.3f} | "
                     + " | ".join(cells) + " |")
        L += ["", "Met (runs floor): " + ", ".join(f"{p} {sum(v)}/{len(v)}" for p, v in met_all.items() if v)
              + "; met (runs × K floor): " + ", ".join(f"{p} {sum(v)}/{len(v)}" for p, v in met_rk.items() if v), ""]
        costs = res.get("costs", {})
        if costs:
            L += ["Costs (wall seconds on this CPU): " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()), ""]
    if res.get("figure"):
        L.append(f"![TV against K]({res['figure']})")
    return "\n".join(L) + "\n"


def _run_text(res, c, p) -> str:
    """``4 seeds, λ=0.05, 141b4e5`` for one (constraint, proposal)'s runs (older runs, which
    recorded none of it: the file's seed count for the proposal, λ=0, "earlier")."""
    ss = c.get("smc_settings", {}).get(p)
    if ss is None:
        by = res["settings"].get("seeds_by_proposal", {})
        seeds = by.get(p, res["settings"]["seeds"])
        return f"{seeds} seeds{', λ=0' if p != 'gcd' else ''}, earlier"
    lam = f", λ={ss['defensive']:g}" if ss.get("defensive") is not None else ""
    return (f"{ss['seeds']} seeds{lam}, {ss.get('commit', '?')}"
            f"{' (dirty)' if ss.get('dirty') else ''}")


def _seeds_text(st) -> str:
    by = st.get("seeds_by_proposal")
    if not by:
        return f"{st['seeds']} seeds"
    return ", ".join(f"{v} seeds ({k})" for k, v in by.items())


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, c in res["constraints"].items() if c.get("smc")]
    if not names:
        return
    ks = res["settings"]["ks"]
    cols = 6
    rows_ = -(-len(names) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(3.0 * cols, 2.5 * rows_), squeeze=False)
    styles = {"gcd": ("tab:orange", "o-"), "lookahead": ("tab:blue", "^-"), "product": ("tab:green", "v-")}
    for ax, n in zip(axes.flat, names):
        c = res["constraints"][n]
        for p, r in c["smc"].items():
            col, st = styles[p]
            kk = [k for k in ks if str(k) in r]
            ax.errorbar(kk, [r[str(k)]["tv_strings"]["mean"] for k in kk],
                        yerr=[r[str(k)]["tv_strings"]["sd"] for k in kk], fmt=st, color=col, ms=3,
                        capsize=1.5, lw=1, label=LABELS[p])
        fl = c["noise_floor"]["strings"]
        ax.axhspan(0, fl["p95"], color="gray", alpha=0.2)
        ax.axhline(fl["mean"], color="gray", lw=0.8)
        ax.axhline(c["tv_gcd_strings"], color="tab:red", lw=1, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(0, 1)
        ax.set_xticks(ks)
        ax.set_xticklabels([str(k) for k in ks], fontsize=6)
        ax.tick_params(labelsize=6)
        ax.set_title(f"{n} (GCD exact {c['tv_gcd_strings']:.2f})", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    h, l = axes.flat[0].get_legend_handles_labels()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    h += [Line2D([], [], color="tab:red", ls=":"), Patch(color="gray", alpha=0.3)]
    l += ["unweighted GCD, exact TV", "noise floor (mean; band to 95th pct)"]
    fig.legend(h, l, loc="lower center", ncol=5, fontsize=8)
    fig.suptitle(f"{res['model']}: TV(pooled SMC estimate, exact posterior) against K "
                 f"({res['settings']['runs']} runs; {_seeds_text(res['settings'])})", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_study_model(name):
    import jaxcd
    return jaxcd.load_model(name)


def load_hmm_for(model_name):
    """P-GCD's HMM: the model's ``jaxcd demo`` HMM (H=32, distilled from 64 of the model's own
    continuations of the built-in prompts; built on first use — a few minutes — then cached)."""
    from hmm_distill.default import demo_hmm
    from jaxcd.model_files import resolve_gguf
    hmm, info = demo_hmm(resolve_gguf(model_name) if model_name else None, progress=False)
    return hmm, (f"the cached `jaxcd demo` HMM for {model_name or 'SmolLM2'} "
                 f"(H={info.get('hidden_size')})")


SETTINGS = {"default": dict(ks=list(KS), seeds=4, runs=1000),
            "smoke": dict(ks=[1, 8], seeds=2, runs=200)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="None = SmolLM2-135M; e.g. qwen2.5-coder-0.5b")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--constraints", default=None, help="comma-separated names")
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=None)
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--proposals", default=",".join(PROPOSALS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verify", default="paris,number", help="constraints for the live-vs-cached check ('' = none)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--ess-threshold", type=float, default=0.5,
                    help="resample when ESS < this × K (0: plain importance sampling)")
    ap.add_argument("--defensive", type=float, default=None,
                    help="λ, the GCD share of the P-GCD proposals' defensive mixture "
                         "(default: smc.run's, jaxcd.decoding.smc.DEFENSIVE; 0: pure P-GCD)")
    ap.add_argument("--render", action="store_true",
                    help="only rewrite the md and png from the existing json")
    ap.add_argument("--merge", action="store_true",
                    help="add these proposals' SMC results to an existing results file")
    a = ap.parse_args(argv)
    st = dict(SETTINGS["smoke" if a.smoke else "default"])
    for k in ("ks", "seeds", "runs"):
        if getattr(a, k) is not None:
            st[k] = getattr(a, k)
    names = a.constraints.split(",") if a.constraints else (SMOKE if a.smoke else [s.name for s in SPECS])
    specs = {s.name: s for s in SPECS}
    for n in names:
        if n not in specs:
            ap.error(f"unknown constraint {n!r}")
    proposals = [p for p in a.proposals.split(",") if p]
    globals()["ESS_THRESHOLD"] = a.ess_threshold
    globals()["DEFENSIVE"] = a.defensive
    tag = "" if a.model is None else "_" + re.sub(r"[^A-Za-z0-9.]+", "-", a.model)
    if a.render:
        stem = "bias_real" + tag
        res = json.loads((Path(a.out) / f"{stem}.json").read_text())
        _write(res, Path(a.out), stem, figure=True)
        print(f"rewrote {a.out}/{stem}.md, .png")
        return res
    from experiments.provenance import provenance
    from jaxcd.model_files import enable_compile_cache
    enable_compile_cache()
    t0 = time.perf_counter()
    model = load_study_model(a.model)
    hmm, hmm_note = load_hmm_for(a.model) if any(p != "gcd" for p in proposals) else (None, "none")
    t_load = time.perf_counter() - t0
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = {"study": "bias_real", "model": Path(model.path).stem, "hmm_note": hmm_note,
           "provenance": provenance(MODULE, argv, [a.seed]),
           "settings": {**st, "seed": a.seed, "proposals": proposals, "constraints": names,
                        "ess_threshold": a.ess_threshold, "defensive": _defensive_value(a.defensive),
                        "steps": STEPS, "reduced_vocab": VRED, "table_nodes": NODES},
           "constraints": {}, "verification": {}, "costs": {"load_model_and_hmm": t_load}}
    bucket = _common_bucket([specs[n] for n in names], model)
    stem = "bias_real" + tag
    prev = None
    if a.merge and (out_dir / f"{stem}.json").exists():
        prev = json.loads((out_dir / f"{stem}.json").read_text())
        res["provenance_earlier"] = [prev["provenance"]] + prev.get("provenance_earlier", [])
        res["settings"]["proposals"] = sorted(set(prev["settings"]["proposals"]) | set(proposals),
                                              key=PROPOSALS.index)
        res["constraints"] = prev["constraints"]
        if hmm is None and prev.get("hmm_note", "none") != "none":
            res["hmm_note"] = prev["hmm_note"]        # a gcd-only merge keeps the HMM's note
        res["verification"] = prev.get("verification", {})
        res["costs"] = {**prev.get("costs", {}), **res["costs"]}
        res["settings"]["seeds_by_proposal"] = {
            **prev["settings"].get("seeds_by_proposal", {q: prev["settings"]["seeds"]
                                                         for q in prev["settings"]["proposals"]}),
            **{q: st["seeds"] for q in proposals}}
        res["settings"]["seeds"] = prev["settings"]["seeds"]
        res["settings"]["constraints"] = list(prev["constraints"]) + [
            n for n in names if n not in prev["constraints"]]
        for k in ("ks", "runs", "seed"):
            if prev["settings"][k] != res["settings"][k]:
                ap.error(f"--merge: {k} differs from the existing file ({prev['settings'][k]})")
    for n in names:
        out, trie, rows, ex = study_constraint(model, specs[n], hmm, st["ks"], st["seeds"], st["runs"],
                                               proposals, a.seed, bucket=bucket)
        if prev is not None and n in prev["constraints"]:
            old = prev["constraints"][n]
            out["smc"] = {**old.get("smc", {}), **out["smc"]}
            out["smc_settings"] = {**old.get("smc_settings", {}), **out.get("smc_settings", {})}
            out["seconds"] = {**old.get("seconds", {}), **{f"{k}_merge": v for k, v in out["seconds"].items()}}
        for q in proposals:
            if q in out.get("smc_settings", {}):
                out["smc_settings"][q]["commit"] = res["provenance"]["git"]["commit"][:10]
                out["smc_settings"][q]["dirty"] = bool(res["provenance"]["git"]["dirty"])
        res["constraints"][n] = out
        if n in a.verify.split(","):
            t1 = time.perf_counter()
            v = verify_cached(model, specs[n], trie, rows, hmm,
                              proposals=[p for p in proposals if hmm is not None or p == "gcd"])
            res["verification"][n] = {**res["verification"].get(n, {}), **v}
            res["costs"][f"verify_{n}"] = time.perf_counter() - t1
            print(f"[{n}] live vs cached: {res['verification'][n]}", flush=True)
        _write(res, out_dir, stem)
    res["costs"]["total"] = time.perf_counter() - t0
    _write(res, out_dir, stem, figure=True)
    print(f"wrote {out_dir}/{stem}.json, .md, .png")
    return res


def _common_bucket(specs, model):
    """One automaton bucket for every reduced automaton (one compiled SMC program)."""
    from jaxcd import compile_regex
    from jaxcd.decoding.buckets import common_bucket
    idx = token_index(model.vocab)
    fas = []
    for s in specs:
        trie = build_trie(s.strings, idx, s.budget)
        red = reduced_table(trie, np.zeros((len(trie.prefixes), model.vocab.vocab_size), np.float32),
                            model.vocab)
        fas.append(compile_regex(s.regex, red.vocab, cache=False))
    return common_bucket(fas)


def _write(res, out_dir, stem, figure=False):
    if figure:
        try:
            plot(res, out_dir / f"{stem}.png")
            res["figure"] = f"{stem}.png"
        except ImportError:
            res["figure"] = None
    res["summary"] = summary(res)
    (out_dir / f"{stem}.json").write_text(json.dumps(res, indent=1))
    (out_dir / f"{stem}.md").write_text(markdown(res))


def summary(res: dict) -> dict:
    """The figures README.md quotes, from the records: per proposal, on how many
    constraints SMC's TV at the largest K is within 2× the noise floor (of ``runs`` exact
    samples), and unweighted GCD's exact TV over the constraints (median, min, max)."""
    rows = goal_table(res)
    tv = [c["tv_gcd_strings"] for c in res["constraints"].values()]
    return {"K": max(res["settings"]["ks"]), "constraints": len(res["constraints"]),
            "met": {p: int(sum(r[p + "_met"] for r in rows if p + "_met" in r))
                    for p in PROPOSALS if any(p + "_met" in r for r in rows)},
            "gcd_tv": {"median": float(np.median(tv)), "min": float(min(tv)),
                       "max": float(max(tv))} if tv else None}


if __name__ == "__main__":
    main()
