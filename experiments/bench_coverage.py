"""JSON Schema coverage benchmark in the style of JSONSchemaBench.

Per corpus (tests/data/corpus: BFCL function schemas, a SchemaStore sample, a
Kubernetes sample, ``pattern`` regexes from real schemas as ``{"type": "string",
"pattern": p}``) and per engine (jaxcd strict, jaxcd ``strict=False``, outlines-core,
xgrammar, llguidance), in one run:

- status counts: compiled / unsupported (the engine refused with an error) / crash
  (any other exception, or the worker died) / timeout / out-of-memory;
- median and p95 compile time (compiled schemas only) and peak memory (RSS high-water
  mark of the worker during the compile, above its RSS before);
- mask agreement with llguidance where both compile (jaxcd only): along a seeded walk
  (uniform over jaxcd's LCD mask), at each step the fraction of the vocabulary on which
  the two masks agree, and the fraction of steps with identical masks.

Every compile runs in a worker process (one per engine, restarted after a crash,
timeout or OOM) under ``RLIMIT_AS`` and a wall-clock timeout, so failures are
counted, never fatal. All engines compile compact JSON (no free whitespace), on the
SmolLM2 vocabulary. jaxcd ``strict=False`` is only run where strict jaxcd refused (it
is the same build otherwise, and its result is copied).

    python experiments/bench_coverage.py                 # default subset (~20 min on 2 shared cores)
    python experiments/bench_coverage.py --full          # every corpus entry

Writes experiments/results/bench_coverage.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import select
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "corpus"
RESULTS = ROOT / "experiments" / "results"
ENGINES = ("jaxcd", "jaxcd_nonstrict", "outlines_core", "xgrammar", "llguidance")
CORPORA = ("bfcl", "schemastore", "kubernetes", "patterns")
DEFAULT_SUBSET = {"bfcl": 60, "schemastore": None, "kubernetes": None, "patterns": 60}
SEED = 0


# ---------------------------------------------------------------------------------------
# worker
# ---------------------------------------------------------------------------------------
def _rss_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def worker(engine: str, mem_gb: float) -> None:
    lim = int(mem_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    sys.path.insert(0, str(ROOT / "tests"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    from jaxcd import Vocabulary
    from jaxcd.tokenizer import load_tokenizer
    tok = load_tokenizer()
    vocab = Vocabulary.from_tokenizer(tok)
    eng = llg = None
    if engine.startswith("jaxcd"):
        from jaxcd import allowed_tokens, compile_json_schema
        from jaxcd.errors import JaxcdError
        try:
            from engines import make_engine, unpack_words
            llg = make_engine("llguidance", tok, vocab)
        except Exception:
            llg = None
    else:
        from engines import make_engine
        eng = make_engine(engine, tok, vocab)
    out = sys.stdout
    sys.stdout = sys.stderr                   # engines' chatter must not corrupt the pipe
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        task = json.loads(line)
        source = task["source"]
        res = {"id": task["id"]}
        base = _rss_kb("VmRSS:")
        _reset_peak()
        t0 = time.perf_counter()
        try:
            if eng is None:
                fa = compile_json_schema(source, vocab, whitespace_pattern="",
                                         strict=(engine == "jaxcd"))
            else:
                eng.compile("json_schema", source)
            res["status"] = "compiled"
        except MemoryError:
            res["status"] = "oom"
        except Exception as e:                       # noqa: BLE001
            if eng is None:
                res["status"] = "unsupported" if isinstance(e, JaxcdError) else "crash"
            else:
                res["status"] = "unsupported"
            res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        res["time_s"] = time.perf_counter() - t0
        res["peak_mb"] = max(_rss_kb("VmHWM:") - base, 0) / 1024
        if res["status"] == "compiled" and eng is None:
            res["states"] = int(fa.num_states)
            if llg is not None and task.get("agree_steps"):
                try:
                    res["agreement"] = _agreement(fa, llg, source, vocab, task["agree_steps"],
                                                  allowed_tokens, unpack_words, np)
                except Exception as e:              # noqa: BLE001
                    res["agreement_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        out.write(json.dumps(res) + "\n")
        out.flush()


def _agreement(fa, llg, source, vocab, steps, allowed_tokens, unpack_words, np):
    """Seeded walk uniform over jaxcd's LCD mask (EOS excluded while other tokens are
    allowed); compare with llguidance's mask at every step."""
    try:
        compiled = llg.compile("json_schema", source)
    except Exception:
        return None
    m = llg.matcher(compiled)
    V = vocab.vocab_size
    W = (V + 31) // 32
    rng = np.random.default_rng(SEED)
    ids: list[int] = []
    fracs, same = [], 0
    for _ in range(steps):
        ours = allowed_tokens(fa, ids)
        words = np.zeros(W, np.int32)
        m.fill(words)
        theirs = unpack_words(words, V)
        agree = ours == theirs
        fracs.append(float(agree.mean()))
        same += bool(agree.all())
        choices = np.nonzero(ours)[0]
        non_eos = choices[choices != vocab.eos_id]
        if len(non_eos) == 0:
            break
        t = int(rng.choice(non_eos))
        ids.append(t)
        if not m.consume(t):
            break
    return {"steps": len(fracs), "token_agreement": float(np.mean(fracs)) if fracs else None,
            "identical_steps": same}


# ---------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------
class Worker:
    def __init__(self, engine: str, mem_gb: float):
        self.engine, self.mem_gb = engine, mem_gb
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", self.engine, "--mem-gb", str(self.mem_gb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=str(ROOT), bufsize=1)
        line = self._read(600)
        if line is None or not json.loads(line).get("ready"):
            raise RuntimeError(f"worker {self.engine} did not start: {self._stderr()}")

    def _read(self, timeout):
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None
        return self.proc.stdout.readline() or None

    def _stderr(self) -> str:
        try:
            self.proc.kill()
            return self.proc.stderr.read()[-2000:]
        except Exception:
            return ""

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, task: dict, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        t0 = time.perf_counter()
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()
        line = self._read(timeout)
        if line is None:
            alive = self.proc.poll() is None
            err = self._stderr()
            self.proc.wait()
            self.proc = None
            dt = time.perf_counter() - t0
            if alive:
                return {"id": task["id"], "status": "timeout", "time_s": dt}
            oom = "memory allocation" in err or "MemoryError" in err or "std::bad_alloc" in err
            return {"id": task["id"], "status": "oom" if oom else "crash", "time_s": dt,
                    "error": err[-300:]}
        return json.loads(line)


def load_corpus(name: str, limit: int | None) -> list[dict]:
    data = json.loads((CORPUS / f"{name}.json").read_text())
    if name == "patterns":
        items = [{"name": e["pattern"], "source": json.dumps({"type": "string",
                                                              "pattern": e["pattern"]})}
                 for e in data]
    else:
        items = [{"name": e["name"], "source": json.dumps(e["schema"])} for e in data]
    if limit is not None and limit < len(items):
        items = sorted(random.Random(SEED).sample(items, limit), key=lambda e: e["name"])
    return items


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[k]


def summarize(rows: list[dict]) -> dict:
    out = {k: 0 for k in ("compiled", "unsupported", "crash", "timeout", "oom")}
    for r in rows:
        out[r["status"]] += 1
    t = [r["time_s"] for r in rows if r["status"] == "compiled"]
    m = [r.get("peak_mb", 0.0) for r in rows if r["status"] == "compiled"]
    out.update(total=len(rows), median_s=pct(t, 0.5), p95_s=pct(t, 0.95),
               median_peak_mb=pct(m, 0.5), max_peak_mb=max(m) if m else None)
    ag = [r["agreement"] for r in rows if r.get("agreement")]
    if ag:
        out["agreement_schemas"] = len(ag)
        out["token_agreement"] = sum(a["token_agreement"] for a in ag) / len(ag)
        out["identical_steps"] = sum(a["identical_steps"] for a in ag)
        out["steps"] = sum(a["steps"] for a in ag)
    return out


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mem-gb", type=float, default=6.0, help="RLIMIT_AS per worker (GiB)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per compile")
    ap.add_argument("--full", action="store_true", help="every corpus entry")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--corpora", default=",".join(CORPORA))
    ap.add_argument("--agree-schemas", type=int, default=10,
                    help="schemas per corpus with a mask-agreement walk")
    ap.add_argument("--agree-steps", type=int, default=12)
    ap.add_argument("--out", default=str(RESULTS / "bench_coverage"))
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.mem_gb)
        return
    engines = args.engines.split(",")
    corpora = args.corpora.split(",")
    results: dict = {"config": {"timeout_s": args.timeout, "mem_gb": args.mem_gb,
                                "full": args.full, "seed": SEED,
                                "subset": None if args.full else DEFAULT_SUBSET},
                     "corpora": {}}
    sys.path.insert(0, str(ROOT / "experiments"))
    from machine import cpu_model
    results["machine"] = {"cpu": cpu_model(), "cpus": os.cpu_count()}
    versions = {}
    for mod in ("outlines_core", "xgrammar", "llguidance"):
        try:
            from importlib.metadata import version
            versions[mod] = version(mod.replace("_", "-"))
        except Exception:
            versions[mod] = None
    results["versions"] = versions
    t_start = time.time()
    for corpus in corpora:
        items = load_corpus(corpus, None if args.full else DEFAULT_SUBSET.get(corpus))
        results["corpora"][corpus] = {"n": len(items), "engines": {}}
        strict_rows = {}
        for engine in engines:
            w = Worker(engine, args.mem_gb)
            rows = []
            for i, it in enumerate(items):
                if engine == "jaxcd_nonstrict" and strict_rows.get(it["name"], {}).get(
                        "status") == "compiled":
                    r = dict(strict_rows[it["name"]])
                    r.pop("agreement", None)
                else:
                    task = {"id": i, "source": it["source"],
                            "agree_steps": args.agree_steps
                            if engine == "jaxcd" and i < args.agree_schemas else 0}
                    r = w.run(task, args.timeout)
                r["name"] = it["name"]
                rows.append(r)
                if engine == "jaxcd":
                    strict_rows[it["name"]] = r
                print(f"[{time.time() - t_start:7.1f}s] {corpus:11s} {engine:15s} "
                      f"{i + 1:3d}/{len(items)} {r['status']:11s} {r.get('time_s', 0):6.2f}s "
                      f"{it['name'][:50]}", flush=True)
            w.stop()
            results["corpora"][corpus]["engines"][engine] = {"summary": summarize(rows),
                                                             "rows": rows}
    results["wall_s"] = time.time() - t_start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    md = render(results)
    out.with_suffix(".md").write_text(md)
    print(md)


def render(results: dict) -> str:
    lines = ["# JSON Schema coverage (experiments/bench_coverage.py)", "",
             f"Timeout {results['config']['timeout_s']:.0f} s and RLIMIT_AS "
             f"{results['config']['mem_gb']:.0f} GiB per compile (worker processes); "
             f"{'all entries' if results['config']['full'] else 'seeded subsets'}; "
             f"wall time {results['wall_s'] / 60:.1f} min. Engine versions: "
             + ", ".join(f"{k} {v}" for k, v in results["versions"].items()) + ".", "",
             "| corpus | engine | compiled | unsupported | crash | timeout | OOM | "
             "median s | p95 s | median peak MB | max peak MB | llg mask agreement |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for corpus, c in results["corpora"].items():
        for engine, e in c["engines"].items():
            s = e["summary"]
            ag = "-"
            if s.get("token_agreement") is not None:
                ag = (f"{100 * s['token_agreement']:.3f}% tokens, {s['identical_steps']}/"
                      f"{s['steps']} steps identical ({s['agreement_schemas']} schemas)")
            lines.append(
                f"| {corpus} ({c['n']}) | {engine} | {s['compiled']} | {s['unsupported']} | "
                f"{s['crash']} | {s['timeout']} | {s['oom']} | {fmt(s['median_s'], '.3f')} | "
                f"{fmt(s['p95_s'], '.2f')} | {fmt(s['median_peak_mb'], '.0f')} | "
                f"{fmt(s['max_peak_mb'], '.0f')} | {ag} |")
    lines += ["", "jaxcd times include tensorization over the 49,152-token vocabulary; "
              "llguidance compiles lazily (its time is grammar parsing and matcher creation, "
              "masks are computed during decoding). Peak memory is the rise of the worker's "
              "RSS high-water mark (reset before each compile) above its RSS before the "
              "compile: memory the process already held from earlier compiles is not "
              "counted, so it is a lower bound (0 = served from memory already held)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
