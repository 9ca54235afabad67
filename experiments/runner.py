"""Shared machinery of the real-data experiments (function calling, keywords).

- :class:`Runner` loads the model (and an HMM) once and runs one *method* at one
  particle count ``K`` on one prompt + constraint through :func:`jaxcd.generate` (the
  path users run), returning the texts, validity, weights, the chosen output and timings
  (:class:`RunResult`).
- Constraints are compiled once per example (:func:`build_constraint`) and **padded to
  the library's buckets** (:func:`jaxcd.decoding.buckets.bucket_automaton`, raised to the
  run's planned floors, :class:`Shapes`), which ``generate`` keeps; prompts and budgets
  take ``generate``'s buckets. So the jitted programs are compiled once per bucket
  instead of once per example; :class:`RunResult` says whether a call compiled so that
  compile and run time can be reported apart.
- Work saved per example without changing any output's distribution: the prompt is
  prefilled once and shared by every method and K
  (:meth:`jaxcd.generation.Model.prefilled`), the decoders stop once every row has
  emitted EOS, and :meth:`Runner.run_ks` draws ``lcd``/``gcd`` samples once for all K.
- :func:`bootstrap_ci`, :func:`summarize`, :func:`write_predictions`,
  :func:`write_summary`: the result files.

Methods (:data:`METHODS`)
-------------------------
=================  =====================================================================
``none``           unconstrained sampling (the model alone): ``K`` independent samples;
                   a sample is valid when its bytes are accepted by the example's byte
                   DFA and it ended with EOS within the budget; the output is the first
                   valid sample (sample 0 if none is)
``lcd``, ``gcd``   unweighted sampling: ``K`` independent samples (one batch) from the
                   LCD / GCD sampler; the output is the first *valid* sample (sample 0 if
                   none is). ``K = 1`` is plain LCD / GCD decoding; for ``gcd`` every
                   sample is valid, so the output's distribution does not depend on ``K``.
``smc-lcd``        SMC with ``K`` particles and the LCD / GCD proposal (the paper's use of
``smc-gcd``        LCD and GCD: proposals inside SMC; :mod:`jaxcd.decoding.smc`)
``smc-lookahead``  SMC with the P-GCD proposals (need an HMM: ``hmm=``)
``smc-product``
``awrs``           SMC with AWRS proposals and a black-box predicate (the example's byte
                   automaton, queried as an oracle on byte prefixes; no budget awareness
                   beyond "EOS only at the last step"), counting predicate calls
=================  =====================================================================

For the SMC methods the output is one particle **drawn from the weighted ensemble**
(weights normalised; a seeded NumPy draw per example × method × K); when every weight
is 0 (possible with LCD and AWRS) the output is particle 0 and it is invalid.
"""

from __future__ import annotations

import json
import time
import zlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np

METHODS = ("none", "lcd", "gcd", "smc-lcd", "smc-gcd", "smc-lookahead", "smc-product", "awrs")
HMM_METHODS = ("smc-lookahead", "smc-product")


# ---------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shapes:
    """The smallest automaton bucket of a run (powers of two): every example's automaton is
    padded at least to these sizes, so that a run shares one compiled program."""

    min_states: int = 128          #: automaton states: a power of two, at least this
    min_edges: int = 512           #: edges: a power of two, at least this
    min_degree: int = 16           #: out-degree (columns of ``out_dst``): power of two
    min_mask_rows: int = 1         #: rows of ``cum_masks``: a power of two, at least this


def _pow2(x: int, lo: int) -> int:
    return max(int(lo), 1 << max(int(x) - 1, 0).bit_length())


_CONSTRAINT_UIDS = itertools.count()


@dataclass
class Constraint:
    """A compiled constraint: ``fa`` padded (host arrays), ``dfa`` the byte DFA (for the
    AWRS oracle), ``info`` sizes and build time."""

    fa: Any
    dfa: Any
    info: dict
    _dev: Any = None
    #: a serial number: the runner's table cache is keyed on it (an ``id()`` can be reused
    #: by a later constraint once this one is garbage-collected)
    uid: int = field(default_factory=lambda: next(_CONSTRAINT_UIDS))

    @property
    def min_budget(self) -> int:
        return self.fa.min_budget

    @property
    def device(self):
        if self._dev is None:
            self._dev = self.fa.to_device()
        return self._dev


def build_constraint(nfa, vocab, shapes: Shapes = Shapes(), key: str = "") -> Constraint:
    """Determinise, minimise, tensorize over ``vocab`` and pad to the library's shape
    bucket (:func:`jaxcd.decoding.buckets.bucket_automaton`), at least ``shapes``."""
    from jaxcd.automata.fsa import determinize, minimize
    from jaxcd.automata.lifting import tensorize
    from jaxcd.decoding.buckets import automaton_bucket, bucket_automaton
    t0 = time.perf_counter()
    dfa = minimize(determinize(nfa))
    fa = tensorize(dfa, vocab, key=key)
    S, E, D = fa.num_states, fa.num_edges, int(fa.out_dst.shape[1])
    R = int(fa.cum_masks.shape[0])
    # the library's bucket (what generate pads to), raised to the run's planned minimum
    # shapes so that every example of a run shares one compiled program
    planned = (_pow2(S + 1, shapes.min_states), _pow2(E, shapes.min_edges),
               _pow2(D, shapes.min_degree), _pow2(R, shapes.min_mask_rows))
    pfa = bucket_automaton(fa, tuple(max(a, b) for a, b in zip(automaton_bucket(fa), planned)))
    info = {"byte_states": dfa.num_states, "states": S, "edges": E, "max_out_degree": D,
            "mask_rows": R,
            "padded": [pfa.num_states, pfa.num_edges, int(pfa.out_dst.shape[1]),
                       int(pfa.cum_masks.shape[0])],
            "min_budget": fa.min_budget, "build_s": round(time.perf_counter() - t0, 4)}
    return Constraint(pfa, dfa, info)


def dfa_predicate(dfa):
    """The black-box predicate for AWRS: ``prefix`` can still be completed (the byte DFA
    is trimmed, so every live state reaches acceptance); with ``final``, ``prefix`` is
    itself accepted."""
    def check(prefix: bytes, final: bool) -> bool:
        q = dfa.run(prefix)
        return q >= 0 and (bool(dfa.accepting[q]) if final else True)
    return check


def _accepted(dfa, vocab, row: list[int], eos: int) -> bool:
    """An unconstrained sample is valid when it ended with EOS and its bytes (EOS
    excluded) are a string of the constraint's language (the byte DFA)."""
    return eos in row and dfa_predicate(dfa)(vocab.decode_bytes(row[: row.index(eos)]), True)


# ---------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------
@dataclass
class RunResult:
    texts: list[str]
    valid: list[bool]
    output: str                   # the method's answer
    output_valid: bool
    chosen: int | None
    weights: list[float] | None
    seconds: float                # wall time of the call (tables included)
    compiled: list[str]           # ["xla"] when the call spent >= 1 s compiling; empty = none
    tokens: int                   # tokens of the output, EOS included
    log_Z: float | None = None
    num_checks: int | None = None
    tables_s: float = 0.0         # generate's setup_s: padding, and lcd/gcd's tables
    compile_s: float = 0.0        # of ``seconds``: tracing + lowering + XLA compile
    lengths: list[int] | None = None   # tokens of every sample / particle, EOS included
    shared_ks: list[int] | None = None  # lcd/gcd: the K's served by one shared draw
    cpu_s: float | None = None    # process CPU seconds of the call (all threads)


def stable_seed(*parts) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode()) & 0x7FFFFFFF


class Runner:
    """The model (and HMM) loaded once; :meth:`run` one method × K on one prompt,
    :meth:`run_ks` one method at several K.

    Every call goes through :func:`jaxcd.generate` — the path users run: its shape
    buckets (an automaton padded here to the run's planned bucket keeps it), its
    decoders and its posterior draws. The prompt is passed as token ids; the model
    remembers its prefill (:meth:`jaxcd.generation.Model.prefilled`), so the methods and
    K's of one example run the prompt through the LM once."""

    def __init__(self, model=None, hmm=None, temperature: float = 1.0,
                 resample: str = "systematic", ess: float = 0.5, shapes: Shapes = Shapes(),
                 defensive: float | None = None, psi_power: float = 1.0):
        from jaxcd.generation import Model, load_hmm, load_model
        self.model = model if isinstance(model, Model) else load_model(model)
        self.hmm_spec = hmm
        self._hmm = None
        if hmm not in (None, "none"):
            self._hmm = load_hmm(hmm, self.model)
        self.temperature = float(temperature)
        self.resample = resample
        self.ess = float(ess)
        from jaxcd.decoding.smc import DEFENSIVE
        #: the P-GCD proposals' GCD share and ψ exponent (SMCConfig's defensive / psi_power)
        self.defensive = DEFENSIVE if defensive is None else float(defensive)
        self.psi_power = float(psi_power)
        self.shapes = shapes

    @property
    def vocab(self):
        return self.model.vocab

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def constraint(self, nfa, key: str = "") -> Constraint:
        return build_constraint(nfa, self.vocab, self.shapes, key)

    def release(self, c: Constraint) -> None:
        """Forget the prompt prefills remembered for the example of ``c``."""
        self.model._prefills.clear()

    def run_ks(self, method: str, c: Constraint, prompt_ids: Sequence[int], budget: int,
               ks: Sequence[int], seed: int, tag: str = "", share: bool = True) -> dict:
        """``{K: RunResult}`` for every K in ``ks``.

        ``lcd`` / ``gcd`` with ``share`` (and several K): ONE call draws ``max(ks)``
        independent samples and the result at K uses its first K samples (the first valid
        one of them). The samples of a batch are i.i.d., so the first K of them are
        distributed exactly as K samples of a separate call: every K's output has the
        distribution it would have alone (the K's are coupled, not independent of each
        other). Those results carry ``shared_ks`` and the shared call's time and compile
        record. SMC methods (and ``share=False``) run once per K: SMC's particles
        interact through resampling, so K particles are not a subset of 16."""
        ks = [int(k) for k in ks]
        if method not in ("none", "lcd", "gcd") or not share or len(set(ks)) < 2:
            return {K: self.run(method, c, prompt_ids, budget, K, seed, tag) for K in ks}
        full = self.run(method, c, prompt_ids, budget, max(ks), seed, tag)
        out = {}
        for K in ks:
            valid = full.valid[:K]
            chosen = next((i for i, v in enumerate(valid) if v), 0)
            out[K] = RunResult(full.texts[:K], valid, full.texts[chosen], bool(valid[chosen]),
                               chosen, None, full.seconds, full.compiled,
                               full.lengths[chosen], None, None, full.tables_s, full.compile_s,
                               lengths=full.lengths[:K], shared_ks=sorted(set(ks)),
                               cpu_s=full.cpu_s)
        return out

    def run(self, method: str, c: Constraint, prompt_ids: Sequence[int], budget: int,
            particles: int, seed: int, tag: str = "") -> RunResult:
        """Run ``method`` with ``particles`` = K on one prompt through
        :func:`jaxcd.generate`; ``tag`` (e.g. the example id) enters the seed so that
        examples get independent randomness."""
        from jaxcd.generation import SMCConfig, generate
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method in HMM_METHODS and self._hmm is None:
            raise ValueError(f"method {method!r} needs an HMM (hmm='default' or a checkpoint)")
        K = int(particles)
        s = stable_seed(seed, tag, method, K)
        common = dict(budget=int(budget), temperature=self.temperature, seed=s,
                      model=self.model, progress=False)
        ids = [int(t) for t in prompt_ids]
        t0 = time.perf_counter()
        p0 = time.process_time()
        if method in ("none", "lcd", "gcd"):
            # K independent samples in one batch; the output is the first valid one
            out = generate(ids, automaton=c.fa, method=method, num_samples=K,
                           batch_size=K, batching="static", **common)
            rows, valid = out.token_ids, list(out.valid)
            ended = list(out.ended)
            chosen = next((i for i, v in enumerate(valid) if v), 0)
            weights, log_Z, checks = None, None, None
            texts = list(out.texts)
            output, output_valid = texts[chosen], bool(valid[chosen])
            n_out = len(rows[chosen]) + int(ended[chosen])
        else:
            cfg = SMCConfig(num_particles=K, resample=self.resample, ess_threshold=self.ess,
                            return_particles=True, defensive=self.defensive,
                            psi_power=self.psi_power,
                            proposal="gcd" if method == "awrs" else method[4:],
                            hmm=self._hmm if method in HMM_METHODS else None)
            if method == "awrs":
                out = generate(ids, predicate=dfa_predicate(c.dfa), method="awrs", smc=cfg,
                               **common)
            else:
                out = generate(ids, automaton=c.fa, method="smc", smc=cfg, **common)
            # the output: one draw from the weighted ensemble (generate's posterior draw)
            ps = out.particles
            texts, valid, ended, rows = ps.texts, list(ps.valid), ps.ended, ps.token_ids
            weights = [float(w) for w in ps.weights]
            chosen = None if not any(weights) else next(
                i for i in range(K) if ps.token_ids[i] == out.token_ids[0] and weights[i] > 0)
            log_Z = out.log_Z
            checks = out.stats.get("constraint_checks")
            output = out.texts[0]
            output_valid = bool(out.valid[0]) and chosen is not None
            n_out = len(out.token_ids[0]) + int(out.ended[0])
        dt = time.perf_counter() - t0
        cpu = time.process_time() - p0
        compile_s = float(out.stats.get("xla_compile_s", 0.0))
        compiled = ["xla"] if compile_s >= 1.0 else []
        lengths = [len(r) + int(e) for r, e in zip(rows, ended)]
        return RunResult(list(texts), valid, output, output_valid, chosen, weights,
                         round(dt, 4), compiled, n_out, log_Z, checks,
                         round(float(out.stats.get("setup_s", 0.0)), 4), round(compile_s, 4),
                         lengths=lengths, cpu_s=round(cpu, 3))


# ---------------------------------------------------------------------------------------
# statistics and files
# ---------------------------------------------------------------------------------------
def bootstrap_ci(values: Sequence[float], reps: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (resampling the examples);
    ``(nan, nan)`` for no values."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (reps, x.size))].mean(axis=1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def summarize(rows: list[dict], keys: Sequence[str] = ("method", "particles"),
              seed: int = 0) -> list[dict]:
    """One entry per distinct ``keys``: n, valid %, accuracy % (over rows with a ground
    truth) with a bootstrap 95% interval, mean seconds per example (all calls, and
    calls that did not compile), compiles and total compile seconds, mean output tokens."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    out = []
    for g, rs in groups.items():
        acc = [float(r["correct"]) for r in rs if r.get("correct") is not None]
        lo, hi = bootstrap_ci(acc, seed=seed)
        vlo, vhi = bootstrap_ci([float(r["valid"]) for r in rs], seed=seed)
        warm = [r["seconds"] for r in rs if not r.get("compiled")]
        ent = dict(zip(keys, g))
        ent.update({
            "n": len(rs), "valid_pct": 100 * float(np.mean([r["valid"] for r in rs])),
            "valid_ci": [100 * vlo, 100 * vhi],
            "n_scored": len(acc),
            "accuracy_pct": 100 * float(np.mean(acc)) if acc else None,
            "accuracy_ci": [100 * lo, 100 * hi] if acc else None,
            "seconds_mean": float(np.mean([r["seconds"] for r in rs])),
            "seconds_warm_mean": float(np.mean(warm)) if warm else None,
            "compiles": int(sum(bool(r.get("compiled")) for r in rs)),
            "compile_s_total": float(sum(r.get("compile_s", 0.0) for r in rs)),
            "tokens_mean": float(np.mean([r.get("tokens", 0) for r in rs])),
        })
        checks = [r["num_checks"] for r in rs if r.get("num_checks") is not None]
        if checks:
            ent["checks_mean"] = float(np.mean(checks))
        out.append(ent)
    return out


def write_predictions(path: str | Path, rows: list[dict]) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def _fmt(x, nd=1):
    return "–" if x is None else f"{x:.{nd}f}"


def summary_markdown(summary: list[dict], keys: Sequence[str], title: str = "") -> str:
    checks = any("checks_mean" in e for e in summary)
    head = [k for k in keys] + ["n", "valid %", "accuracy %", "95% CI", "s/example",
                                "s/example (warm)", "compiles", "compile s", "tokens"] + (
        ["checks/example"] if checks else [])
    lines = ([f"### {title}", ""] if title else []) + [
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in summary:
        ci = e.get("accuracy_ci")
        lines.append("| " + " | ".join(
            [str(e[k]) for k in keys]
            + [str(e["n"]), _fmt(e["valid_pct"]), _fmt(e["accuracy_pct"]),
               f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "–",
               _fmt(e["seconds_mean"], 2), _fmt(e["seconds_warm_mean"], 2),
               str(e["compiles"]), _fmt(e.get("compile_s_total"), 0), _fmt(e["tokens_mean"])]
            + ([_fmt(e.get("checks_mean"), 0)] if checks else [])) + " |")
    return "\n".join(lines) + "\n"


def write_summary(out_dir: str | Path, summary: dict, markdown: str) -> None:
    out_dir = Path(out_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out_dir / "summary.md").write_text(markdown)


# ---------------------------------------------------------------------------------------
# runs split over machines (shards) and continued after a stop (records)
# ---------------------------------------------------------------------------------------
def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``"I/N"`` (1 <= I <= N) as ``(I, N)``; ``None`` or ``"1/1"``: no sharding."""
    if spec in (None, "", "1/1"):
        return None
    try:
        i, n = (int(x) for x in str(spec).split("/"))
    except ValueError:
        raise ValueError(f"--shard: expected I/N (e.g. 2/8), got {spec!r}") from None
    if not 1 <= i <= n:
        raise ValueError(f"--shard: I/N needs 1 <= I <= N, got {spec!r}")
    return i, n


def shard_indices(n: int, shard: tuple[int, int] | None) -> list[int]:
    """The positions (in the run's seeded example order) that shard ``(I, N)`` runs:
    every N-th example starting at the I-th (``I-1, I-1+N, ...``). Interleaved, so that
    each shard — and each prefix of a shard stopped early — spreads over the whole
    order (BFCL subsets are drawn round-robin over categories); the N shards partition
    the examples."""
    if shard is None:
        return list(range(n))
    i, k = shard
    return list(range(i - 1, n, k))


def append_record(path: str | Path, record: dict) -> None:
    """Append one JSON line and flush it to disk (a record per finished example: a run
    killed at any point loses at most the example in flight)."""
    import os
    with open(path, "a") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_records(path: str | Path, repair: bool = False) -> list[dict]:
    """The complete records of an append-only JSON Lines file; a torn last line (the
    process was killed while writing it) is dropped, and with ``repair`` cut from the
    file so that appends continue after the last complete record."""
    path = Path(path)
    if not path.exists():
        return []
    out, good = [], 0
    with open(path, "rb") as f:
        data = f.read()
    for line in data.splitlines(True):
        if not line.endswith(b"\n"):
            break
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
        good += len(line)
    if repair and good != len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
    return out


def machine_info() -> dict:
    import os
    import platform
    try:
        from experiments.machine import cpu_model
        model = cpu_model()
    except ImportError:
        model = None
    return {"python": platform.python_version(), "jax": jax.__version__,
            "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()], "cpu": platform.processor() or
            platform.machine(), "cpu_model": model, "cpu_count": os.cpu_count(),
            "load_avg": [round(x, 2) for x in os.getloadavg()],
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


__all__ = ["METHODS", "HMM_METHODS", "Shapes", "Constraint", "build_constraint",
           "dfa_predicate", "RunResult", "Runner", "bootstrap_ci", "summarize",
           "write_predictions", "summary_markdown", "write_summary", "machine_info",
           "stable_seed", "parse_shard", "shard_indices", "append_record", "read_records"]
