"""MaskBench (JSONSchemaBench's mask benchmark) as an acceptance test of JSON Schema
engines: jaxcd, llguidance and xgrammar side by side (issue 22).

MaskBench (``guidance-ai/jsonschemabench``, ``maskbench/data/*.json``) gives each schema
valid and invalid instances. An engine **passes** a schema when it compiles it, accepts
every valid instance and rejects every invalid one.

Acceptance of an instance: the instance is printed with ``json.dumps(ensure_ascii=False)``
twice, with the default separators (``", "``, ``": "``) and compact ones (``","``,
``":"``); each text is tokenized with the SmolLM2 tokenizer; the instance is *accepted*
if, for at least one of the two texts, every token is allowed and the engine accepts
at the end (jaxcd: EOS leads to the final state; llguidance: ``is_accepting()``;
xgrammar: EOS accepted and terminated). A valid instance is *rejected* if neither text
is accepted; an invalid one is *accepted* if either is.

The parent builds each engine's per-tokenizer data once (jaxcd: it compiles one small
schema, ``WARM_SCHEMA``, which builds the vocabulary's token trie and hash tables; the
others: their tokenizer objects), so a compile time is that of a process that has
compiled before. Every compile runs in a forked child with an address-space limit of
4 GiB above the parent's size at the fork (``RLIMIT_AS``) and a 60 s wall-clock limit;
the child also checks the instances. Results: crash (the child died), timeout, OOM (a
``MemoryError`` or death under the memory limit), compile error (the engine refused the
schema).

Engines:
- ``jaxcd``: ``compile_json_schema(schema, vocab)`` with the defaults (strict, open
  objects, ``property_order="auto"``, whitespace ``[ ]?``);
- ``jaxcd_schema``: the same with ``property_order="schema"``;
- ``jaxcd_any``: the same with ``property_order="any"``;
- ``jaxcd_nonstrict``: ``strict=False``;
- ``llguidance``: ``LLMatcher.grammar_from_json_schema(schema)`` with its defaults;
- ``xgrammar``: ``GrammarCompiler(...).compile_json_schema(schema)`` with its defaults.

Data: ``--data PATH`` (or ``JAXCD_MASKBENCH``) is a directory of MaskBench ``*.json``
files or a git mirror of the repository (read with ``git show``); the default is the
copy in ``tests/data/maskbench``. Only the development splits (Github_*, Glaiveai2K,
Synthesized, BFCL_*, JME) are sampled unless ``--splits heldout|all`` is given.

    python -m experiments.bench_maskbench --data /path/to/mirror --n 1000 --seed 0
    python -m experiments.bench_maskbench --full --engines jaxcd

A fresh sample, disjoint from earlier ones (``--exclude-rows`` takes their results, rows
logs or data directories), and the held-out splits in one results file
(``--combine``; ``experiments/results/maskbench_generalisation.md``):

    python -m experiments.bench_maskbench --data MIRROR --n 500 --seed 11 \
        --exclude-rows experiments/results/bench_maskbench.json tests/data/maskbench ... \
        --engines jaxcd,llguidance --out DEV
    python -m experiments.bench_maskbench --data MIRROR --splits heldout --full \
        --engines jaxcd,llguidance --out HELDOUT
    python -m experiments.bench_maskbench --combine dev=DEV.json heldout=HELDOUT.json \
        --note NOTE.md --out experiments/results/maskbench_generalisation

A file of the splits that cannot be read (a blob absent from a partial mirror) is left
out of the sample and named in the results (``meta.unreadable``).

Writes ``experiments/results/bench_maskbench.{json,md}`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "tests" / "data" / "maskbench"
DEV_PREFIXES = ("Github_", "Glaiveai2K", "Synthesized", "BFCL_", "JME")
HELDOUT_PREFIXES = ("Kubernetes", "Snowplow", "JsonSchemaStore", "WashingtonPost", "MCPspec",
                    "Handwritten")
ENGINES = ("jaxcd", "jaxcd_schema", "jaxcd_any", "jaxcd_nonstrict", "llguidance", "xgrammar")
MEM_LIMIT = 4 << 30
TIME_LIMIT = 60.0
ROWS_LOG: str | None = None        # --rows-log: one JSON line per (engine, file) as it ends
UNREADABLE: list[str] = []         # files of the splits that could not be read (select)


def split_of(name: str) -> str:
    base = os.path.basename(name)
    return base.split("---")[0] if "---" in base else base.rsplit("_", 1)[0]


def is_dev(name: str) -> bool:
    return split_of(name).startswith(DEV_PREFIXES)


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------
class Source:
    """MaskBench files from a directory or from a git mirror of jsonschemabench."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.git = (self.path / "HEAD").exists() and (self.path / "objects").exists()
        if self.git:
            out = subprocess.run(["git", f"--git-dir={self.path}", "ls-tree", "--name-only",
                                  "HEAD", "maskbench/data/"], check=True,
                                 capture_output=True, text=True).stdout
            self.names = sorted(x for x in out.split() if x.endswith(".json"))
        else:
            self.names = sorted(str(p.relative_to(self.path)) for p in self.path.glob("*.json"))

    def read(self, name: str) -> dict:
        """The file's JSON; ``OSError`` when it cannot be read (a blob absent from a
        partial mirror)."""
        if self.git:
            r = subprocess.run(["git", f"--git-dir={self.path}", "show", f"HEAD:{name}"],
                               capture_output=True)
            if r.returncode:
                raise OSError(f"{name}: {r.stderr.decode(errors='replace').strip()[:200]}")
            return json.loads(r.stdout)
        return json.loads((self.path / name).read_text())


def excluded_names(paths) -> set[str]:
    """Base names of MaskBench files named by earlier runs: results ``.json`` files (their
    rows), rows logs (``.jsonl``), plain lists (one name a line) or data directories (their
    ``*.json`` files)."""
    out: set[str] = set()
    for p in map(Path, paths or ()):
        if p.is_dir():
            out.update(x.name for x in p.glob("*.json"))
        elif p.suffix == ".jsonl":
            for line in p.read_text().splitlines():
                if line.strip():
                    out.add(os.path.basename(json.loads(line)["file"]))
        elif p.suffix == ".json":
            d = json.loads(p.read_text())
            # rows by engine, or (a --combine file) by run, then by engine
            groups = [g for v in d["rows"].values()
                      for g in (v.values() if isinstance(v, dict) else [v])]
            out.update(os.path.basename(r["file"]) for rs in groups for r in rs)
        else:
            out.update(os.path.basename(x.strip()) for x in p.read_text().splitlines()
                       if x.strip())
    return out


def select(src: Source, splits: str, n: int | None, seed: int,
           exclude: set[str] = frozenset()) -> list[str]:
    """Names of the files (with tests) in ``splits``, less those in ``exclude`` (base
    names): all (``n=None``) or a seeded sample of ``n``."""
    def keep(name):
        if os.path.basename(name) in exclude:
            return False
        s = split_of(name)
        if splits == "dev":
            return s.startswith(DEV_PREFIXES)
        if splits == "heldout":
            return s.startswith(HELDOUT_PREFIXES)
        return True
    names = [x for x in src.names if keep(x)]
    rng = random.Random(seed)
    rng.shuffle(names)
    out = []
    for x in names:
        if n is not None and len(out) >= n:
            break
        try:
            doc = src.read(x)
        except OSError as e:
            # reported in the results (meta "unreadable"), not silently dropped
            UNREADABLE.append(os.path.basename(x))
            print(f"unreadable, left out: {e}", file=sys.stderr)
            continue
        if doc.get("tests"):
            out.append(x)
    return sorted(out)


def texts_of(instance) -> list[str]:
    a = json.dumps(instance, ensure_ascii=False)
    b = json.dumps(instance, ensure_ascii=False, separators=(",", ":"))
    return [a] if a == b else [a, b]


# ---------------------------------------------------------------------------------------
# engines (set up once in the parent; compiled in forked children)
# ---------------------------------------------------------------------------------------
#: compiled once in the parent before any timed compile (see Setup)
WARM_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"},
                                                "b": {"type": "array", "items": {"type": "number"}}}}


class Setup:
    def __init__(self, engines):
        from jaxcd import Vocabulary
        from jaxcd.tokenizer import load_tokenizer
        self.tok = load_tokenizer()
        self.vocab = Vocabulary.from_tokenizer(self.tok)
        self.eos = self.vocab.eos_id
        if any(e.startswith("jaxcd") for e in engines):
            # per-tokenizer tables (the token trie, the mask-row hash table) and the
            # library's caches, built once in the parent as llguidance's and xgrammar's
            # tokenizer data are: compile times are those of a process that has
            # compiled before
            from jaxcd import compile_json_schema
            compile_json_schema(WARM_SCHEMA, self.vocab)
        self.llg_tok = None
        self.xgr_info = None
        if "llguidance" in engines:
            import llguidance
            import llguidance.hf
            self.llg = llguidance
            self.llg_tok = llguidance.hf.from_tokenizer(self.tok, n_vocab=self.vocab.vocab_size,
                                                        eos_token=self.eos)
        if "xgrammar" in engines:
            import xgrammar
            self.xgr = xgrammar
            self.xgr_info = xgrammar.TokenizerInfo.from_huggingface(
                self.tok, vocab_size=self.vocab.vocab_size, stop_token_ids=[self.eos])
        self._enc = {}

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    # each returns (compile seconds, accept(text) -> bool)
    def compile(self, engine: str, schema):
        if engine.startswith("jaxcd"):
            from jaxcd import compile_json_schema
            kw = {}
            if engine == "jaxcd_any":
                kw["property_order"] = "any"
            if engine == "jaxcd_schema":
                kw["property_order"] = "schema"
            if engine == "jaxcd_nonstrict":
                kw["strict"] = False
            from jaxcd import compile_stats
            with compile_stats() as stages:
                t, c = time.perf_counter(), time.process_time()
                fa = compile_json_schema(schema, self.vocab, **kw)
                dt = time.perf_counter() - t
                self.last_cpu_s = time.process_time() - c
            self.last_stages = {k: round(v, 4) for k, v in stages.items()}

            def accept(text):
                q = int(fa.initial_state)
                dead = int(fa.dead_state)
                for tok in self.encode(text):
                    q = fa.next_state(q, tok)
                    if q == dead:
                        return False
                return fa.next_state(q, self.eos) == int(fa.final_state)
            return dt, accept
        if engine == "llguidance":
            llg = self.llg
            t = time.perf_counter()
            g = llg.LLMatcher.grammar_from_json_schema(schema)
            m0 = llg.LLMatcher(self.llg_tok, g, log_level=0)
            if m0.is_error():
                raise ValueError(f"llguidance: {m0.get_error()}")
            dt = time.perf_counter() - t

            def accept(text):
                m = m0.deep_copy()
                for tok in self.encode(text):
                    if not m.consume_token(tok) or m.is_error():
                        return False
                return bool(m.is_accepting())
            return dt, accept
        if engine == "xgrammar":
            xgr = self.xgr
            t = time.perf_counter()
            comp = xgr.GrammarCompiler(self.xgr_info, max_threads=1, cache_enabled=False)
            cg = comp.compile_json_schema(json.dumps(schema))
            dt = time.perf_counter() - t

            def accept(text):
                m = xgr.GrammarMatcher(cg)
                for tok in self.encode(text):
                    if not m.accept_token(tok):
                        return False
                return bool(m.accept_token(self.eos)) and bool(m.is_terminated())
            return dt, accept
        raise ValueError(engine)


def _child(setup: Setup, engine: str, doc: dict, w) -> None:
    base = _vm_size()
    try:
        resource.setrlimit(resource.RLIMIT_AS, (base + MEM_LIMIT, base + MEM_LIMIT))
    except (ValueError, OSError):
        pass
    res = {"status": "ok"}
    try:
        setup.last_cpu_s = None
        setup.last_stages = None
        c = time.process_time()
        dt, accept = setup.compile(engine, doc["schema"])
        res["compile_s"] = dt
        if setup.last_stages:
            # jaxcd: CPU seconds per compile stage (jaxcd.compile_stats)
            res["stages"] = setup.last_stages
        # CPU seconds of the compile (the child's own): less sensitive than the wall
        # time to other jobs on a shared machine (the peers' compile includes their
        # setup, measured the same way around the whole call)
        res["compile_cpu_s"] = (setup.last_cpu_s if setup.last_cpu_s is not None
                                else time.process_time() - c)
        vr = va = ir = ia = 0
        for case in doc["tests"]:
            ok = any(accept(t) for t in texts_of(case["data"]))
            if case["valid"]:
                va += 1
                vr += not ok
            else:
                ir += 1
                ia += ok
        res.update(valid=va, valid_rejected=vr, invalid=ir, invalid_accepted=ia)
    except MemoryError:
        res = {"status": "oom"}
    except Exception as e:                         # the engine refused the schema
        res = {"status": "error", "error": f"{type(e).__name__}: {str(e)[:300]}"}
        if not _expected_error(e):
            res["status"] = "crash"
            res["traceback"] = traceback.format_exc()[-1500:]
    os.write(w, json.dumps(res).encode())
    os.close(w)
    os._exit(0)


def _expected_error(e: Exception) -> bool:
    from jaxcd.errors import JaxcdError
    if isinstance(e, JaxcdError):
        return True
    # the peers report unsupported schemas with ValueError/RuntimeError
    return isinstance(e, (ValueError, RuntimeError, TypeError))


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_one(setup: Setup, engine: str, doc: dict, time_limit: float = TIME_LIMIT) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _child(setup, engine, doc, w)
        finally:
            os._exit(1)
    os.close(w)
    t0 = time.monotonic()
    chunks = []
    os.set_blocking(r, False)
    status = None
    while True:
        try:
            b = os.read(r, 1 << 16)
            if b:
                chunks.append(b)
            elif b == b"":
                pass
        except BlockingIOError:
            pass
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        if time.monotonic() - t0 > time_limit:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return {"status": "timeout"}
        time.sleep(0.005)
    while True:
        try:
            b = os.read(r, 1 << 16)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
    os.close(r)
    if chunks:
        try:
            return json.loads(b"".join(chunks))
        except json.JSONDecodeError:
            pass
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    # death under the address-space limit shows as SIGSEGV/SIGABRT/SIGKILL
    return {"status": "oom" if sig in (signal.SIGKILL, signal.SIGABRT, signal.SIGSEGV) else
            "crash", "signal": sig}


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------
def _pct(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "-"


def summarize(rows: list[dict]) -> dict:
    import numpy as np
    n = len(rows)
    comp = [r for r in rows if r["status"] == "ok"]
    passing = [r for r in comp if r["valid_rejected"] == 0 and r["invalid_accepted"] == 0]
    ts = np.array([r["compile_s"] for r in comp]) if comp else np.zeros(0)
    # rows merged from older runs may have no CPU seconds
    cs = (np.array([r["compile_cpu_s"] for r in comp])
          if comp and all("compile_cpu_s" in r for r in comp) else np.zeros(0))
    return {
        "files": n, "compiled": len(comp), "passing": len(passing),
        "valid_rejected_schemas": sum(r["valid_rejected"] > 0 for r in comp),
        "valid_rejected_instances": sum(r["valid_rejected"] for r in comp),
        "valid_instances": sum(r["valid"] for r in comp),
        "invalid_accepted_schemas": sum(r["invalid_accepted"] > 0 for r in comp),
        "invalid_accepted_instances": sum(r["invalid_accepted"] for r in comp),
        "invalid_instances": sum(r["invalid"] for r in comp),
        "compile_error": sum(r["status"] == "error" for r in rows),
        "crash": sum(r["status"] == "crash" for r in rows),
        "timeout": sum(r["status"] == "timeout" for r in rows),
        "oom": sum(r["status"] == "oom" for r in rows),
        "compile_p50_s": float(np.percentile(ts, 50)) if len(ts) else None,
        "compile_p95_s": float(np.percentile(ts, 95)) if len(ts) else None,
        "compile_cpu_p50_s": float(np.percentile(cs, 50)) if len(cs) else None,
        "compile_cpu_p95_s": float(np.percentile(cs, 95)) if len(cs) else None,
    }


def stage_table(rows: dict) -> list[str]:
    """Markdown: where each jaxcd engine's compile CPU time goes (``jaxcd.compile_stats``),
    summed over all compiled files and over those at or above the CPU p90; "failed" is
    the part of the stages spent in attempts given up (not added again to the total)."""
    import numpy as np
    from jaxcd.api import STAGES
    out = []
    for e, rs in rows.items():
        ok = [r for r in rs if r["status"] == "ok" and r.get("stages")]
        if not ok:
            continue
        cpu = np.array([r["compile_cpu_s"] for r in ok])
        p90 = float(np.percentile(cpu, 90))
        out += [f"### {e}: where compile CPU time goes (jaxcd.compile_stats)", "",
                "| files | n | CPU s | " + " | ".join(STAGES) + " | other | failed attempts |",
                "|---|---|---|" + "---|" * (len(STAGES) + 2)]
        for label, sel in (("all compiled", ok),
                           (f"CPU ≥ p90 ({p90:.2f} s)",
                            [r for r in ok if r["compile_cpu_s"] >= p90])):
            tot = sum(r["compile_cpu_s"] for r in sel)
            per = [sum(r["stages"].get(k, 0.0) for r in sel) for k in STAGES]
            fail = sum(r["stages"].get("failed", 0.0) for r in sel)
            cells = [f"{100 * x / tot:.0f}%" if tot else "-" for x in per]
            other = tot - sum(per)
            out.append(f"| {label} | {len(sel)} | {tot:.1f} | " + " | ".join(cells) +
                       f" | {100 * other / tot:.0f}% | {100 * fail / tot:.0f}% |"
                       if tot else f"| {label} | {len(sel)} | 0 |")
        out.append("")
    return out


def _compile_cells(s: dict) -> tuple[str, str, str, str]:
    """Compile wall p50 / p95 and CPU p50 / p95 of one engine's summary, as table cells."""
    f = lambda k: "-" if s.get(k) is None else f"{s[k]:.2f}"          # noqa: E731
    return (f("compile_p50_s"), f("compile_p95_s"), f("compile_cpu_p50_s"),
            f("compile_cpu_p95_s"))


def table(summary: dict, title: str) -> str:
    lines = [f"### {title}", "",
             "| engine | files | compiled | passing | valid rejected (schemas / instances) | "
             "invalid accepted (schemas / instances) | compile error | crash / timeout / OOM | "
             "compile p50 / p95 | compile CPU p50 / p95 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for eng, s in summary.items():
        p50, p95, c50, c95 = _compile_cells(s)
        lines.append(
            f"| {eng} | {s['files']} | {_pct(s['compiled'], s['files'])} | "
            f"**{_pct(s['passing'], s['files'])}** ({s['passing']}) | "
            f"{s['valid_rejected_schemas']} / {s['valid_rejected_instances']} | "
            f"{s['invalid_accepted_schemas']} / {s['invalid_accepted_instances']} | "
            f"{s['compile_error']} | {s['crash']} / {s['timeout']} / {s['oom']} | "
            f"{p50} / {p95} s | {c50} / {c95} s |")
    return "\n".join(lines) + "\n"


def _loop(setup, src, names, engines, timeout, t0, tag=""):
    rows = {e: [] for e in engines}
    for i, name in enumerate(names):
        doc = src.read(name)
        for e in engines:
            r = run_one(setup, e, doc, timeout)
            r["file"] = os.path.basename(name)
            r["split"] = split_of(name)
            r["load1"] = round(os.getloadavg()[0], 2)      # the machine is shared
            rows[e].append(r)
            if ROWS_LOG:                                   # kept if the run is cut short
                with open(ROWS_LOG, "a") as f:
                    f.write(json.dumps({"engine": e, **r}) + "\n")
        if (i + 1) % 25 == 0 or i + 1 == len(names):
            done = {e: sum(x["status"] == "ok" and x["valid_rejected"] == 0 and
                           x["invalid_accepted"] == 0 for x in rows[e]) for e in engines}
            print(f"[{tag}{i + 1}/{len(names)} {time.time() - t0:.0f}s] passing: {done}",
                  file=sys.stderr, flush=True)
    return rows


def run_all(setup, src, names, engines, timeout, jobs, t0):
    """Rows per engine, in the order of ``names``; ``jobs`` forked workers."""
    if jobs == 1:
        return _loop(setup, src, names, engines, timeout, t0)
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="maskbench_"))
    pids = []
    for k in range(jobs):
        shard = names[k::jobs]
        pid = os.fork()
        if pid == 0:
            try:
                out = _loop(setup, src, shard, engines, timeout, t0, tag=f"w{k} ")
                (tmp / f"{k}.json").write_text(json.dumps(out))
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    parts = [json.loads((tmp / f"{k}.json").read_text()) for k in range(jobs)]
    order = {os.path.basename(n): i for i, n in enumerate(names)}
    return {e: sorted([r for p in parts for r in p[e]], key=lambda r: order[r["file"]])
            for e in engines}


def _scrub(meta: dict) -> dict:
    """A run's ``meta`` without machine paths (repository paths relative, its MaskBench
    data outside the repository ``<maskbench>``, temporary files ``<tmp>``)."""
    from experiments.make_results import scrub_paths
    text = json.dumps(meta)
    for d in filter(None, [os.environ.get("JAXCD_MASKBENCH"), meta.get("data")]):
        if not str(Path(d).resolve()).startswith(str(ROOT)):
            text = text.replace(d.rstrip("/"), "<maskbench>")
    return json.loads(scrub_paths(text))


def combine(specs: list[str], out: str, note: str | None = None,
            title: str | None = None) -> int:
    """One results file (``out``.json/.md) with the runs ``LABEL=RESULTS.json`` side by
    side: per engine and run the overall figures, then each run's per-split tables and
    compile errors."""
    runs = {}
    for spec in specs:
        label, _, path = spec.partition("=")
        runs[label] = json.loads(Path(path).read_text())
    engines = list(next(iter(runs.values()))["rows"])
    for label, d in runs.items():
        if list(d["rows"]) != engines:
            raise SystemExit(f"--combine: {label} has engines {list(d['rows'])}, not {engines}")
    doc = {"meta": {label: _scrub(d["meta"]) for label, d in runs.items()},
           "overall": {label: d["overall"] for label, d in runs.items()},
           "per_split": {label: d["per_split"] for label, d in runs.items()},
           "rows": {label: d["rows"] for label, d in runs.items()}}
    outp = Path(out)
    outp.parent.mkdir(parents=True, exist_ok=True)
    outp.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    md = [f"# {title or 'MaskBench generalisation: development and held-out splits side by side'}"
          " (experiments/bench_maskbench.py)", ""]
    if note:
        md += [Path(note).read_text().rstrip(), ""]
    md += ["## Runs", ""]
    for label, d in runs.items():
        m = _scrub(d["meta"])
        wall = "" if m.get("wall_s") is None else f", wall {m['wall_s']:.0f} s"
        md.append(f"- **{label}**: `python -m experiments.bench_maskbench "
                  f"{' '.join(m.get('argv') or [])}`: {m['files']} files{wall} on "
                  f"{m.get('cpus')} CPUs" + (f"; unreadable in the data (left out): "
                                            f"{', '.join(m['unreadable'])}"
                                            if m.get("unreadable") else ""))
    md += ["", "## Side by side", "",
           "| engine | run | files | passing | compiled | valid rejected (schemas) | "
           "invalid accepted (schemas / instances) | compile error | crash / timeout / OOM "
           "| compile p50 / p95 | compile CPU p50 / p95 |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in engines:
        for label in runs:
            x = runs[label]["overall"][e]
            p50, p95, c50, c95 = _compile_cells(x)
            md.append(
                f"| {e} | {label} | {x['files']} | **{_pct(x['passing'], x['files'])}** "
                f"({x['passing']}) | {_pct(x['compiled'], x['files'])} | "
                f"{x['valid_rejected_schemas']} | {x['invalid_accepted_schemas']} / "
                f"{x['invalid_accepted_instances']} | {x['compile_error']} | "
                f"{x['crash']} / {x['timeout']} / {x['oom']} | {p50} / {p95} s | "
                f"{c50} / {c95} s |")
    md.append("")
    for label, d in runs.items():
        md += [f"## {label}", ""]
        md.append(table(d["overall"], f"{label}: overall"))
        md.extend(x.replace("### ", f"### {label}, ", 1) if x.startswith("### ") else x
                  for x in stage_table(d["rows"]))
        for sp in sorted(d["per_split"]):
            md.append(table(d["per_split"][sp], f"{label}: {sp}"))
        for e in engines:
            errs: dict[str, int] = {}
            vr: dict[str, int] = {}
            for r in d["rows"][e]:
                if r["status"] != "ok":
                    k = r.get("error", r["status"])[:110]
                    errs[k] = errs.get(k, 0) + 1
                elif r["valid_rejected"]:
                    vr[r["split"]] = vr.get(r["split"], 0) + 1
            if errs:
                md.append(f"### {label}, {e}: compile errors and failures\n")
                md.extend(f"- {v} × `{k}`" for k, v in
                          sorted(errs.items(), key=lambda x: -x[1])[:25])
                md.append("")
            if vr:
                md.append(f"{label}, {e}: schemas with a valid instance rejected, by split: "
                          + ", ".join(f"{k} {v}" for k, v in sorted(vr.items())) + "\n")
    outp.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md[:40]))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("JAXCD_MASKBENCH", str(DEFAULT_DATA)),
                    help="MaskBench data directory or git mirror (default: tests/data/maskbench)")
    ap.add_argument("--n", type=int, default=1000, help="files in the seeded sample")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="every file with tests of the splits")
    ap.add_argument("--splits", choices=("dev", "heldout", "all"), default="dev")
    ap.add_argument("--engines", default="jaxcd,llguidance,xgrammar")
    ap.add_argument("--timeout", type=float, default=TIME_LIMIT)
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "bench_maskbench"))
    ap.add_argument("--files", nargs="*", help="only these file names (debugging)")
    ap.add_argument("--exclude-rows", nargs="+", metavar="PATH", default=(),
                    help="leave out of the sample the files of earlier runs: results .json "
                         "files, rows logs (.jsonl), name lists or data directories")
    ap.add_argument("--from-rows", nargs="+", metavar="RESULTS.json",
                    help="run nothing: write the tables from the per-file rows of earlier "
                         "results files (an engine's rows from the last file that has it; "
                         "every engine must cover the same files), e.g. a new jaxcd run "
                         "beside the earlier llguidance/xgrammar rows of the same sample")
    ap.add_argument("--combine", nargs="+", metavar="LABEL=RESULTS.json",
                    help="run nothing: write one results file (--out) with the runs side by "
                         "side, e.g. dev=<a>.json heldout=<b>.json (same engines)")
    ap.add_argument("--title", help="with --combine: the results file's title")
    ap.add_argument("--note", metavar="NOTE.md",
                    help="with --combine: markdown put under the title (how the runs were "
                         "made)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="worker processes, each with its own forked child per compile "
                         "(compile times then include the contention)")
    ap.add_argument("--rows-log", metavar="PATH.jsonl",
                    help="write each row (with its engine) to this file as soon as it is "
                         "measured, so that a run cut short keeps what it measured (the file "
                         "is emptied when the run starts)")
    args = ap.parse_args(argv)
    global ROWS_LOG
    ROWS_LOG = args.rows_log
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r} (choose from {', '.join(ENGINES)})")
    if args.splits != "dev":
        print("note: held-out splits are for an outside check; do not tune on them",
              file=sys.stderr)
    sources = []
    exclude: set[str] = set()
    if args.combine:
        return combine(args.combine, args.out, args.note, args.title)
    if args.from_rows:
        rows = {}
        for f in args.from_rows:
            d = json.loads(Path(f).read_text())
            rows.update(d["rows"])
            for so in sources:                 # engines taken over by this file
                so["engines"] = [e for e in so["engines"] if e not in d["rows"]]
            sources.append({"file": f, "argv": d["meta"].get("argv"),
                            "engines": list(d["rows"]),
                            "wall_s": d["meta"].get("wall_s"), "jobs": d["meta"].get("jobs")})
        engines = list(rows)
        names = [r["file"] for r in rows[engines[0]]]
        for e in engines:
            if sorted(r["file"] for r in rows[e]) != sorted(names):
                ap.error(f"--from-rows: engine {e} covers other files than {engines[0]}")
        t0 = time.time()
    else:
        src = Source(Path(args.data))
        exclude = excluded_names(args.exclude_rows)
        names = args.files or select(src, args.splits, None if args.full else args.n, args.seed,
                                     exclude)
        print(f"{len(names)} files from {args.data} ({args.splits} splits, seed {args.seed})",
              file=sys.stderr)
        if ROWS_LOG:                # this run's rows only: a reused path does not mix runs
            Path(ROWS_LOG).write_text("")
        setup = Setup(engines)
        t0 = time.time()
        rows = run_all(setup, src, names, engines, args.timeout, max(1, args.jobs), t0)
    overall = {e: summarize(rows[e]) for e in engines}
    splits = sorted({split_of(n) for n in names})
    per_split = {s: {e: summarize([r for r in rows[e] if r["split"] == s]) for e in engines}
                 for s in splits}
    import platform
    meta = {"data": str(args.data), "files": len(names), "seed": args.seed,
            "unreadable": sorted(UNREADABLE),
            "excluded": len(exclude) if not args.from_rows else None,
            "full": args.full, "splits": args.splits, "engines": engines,
            "time_limit_s": args.timeout, "jobs": args.jobs, "mem_limit_bytes_above_parent": MEM_LIMIT,
            "wall_s": time.time() - t0, "machine": platform.platform(),
            "cpus": os.cpu_count(), "argv": sys.argv[1:]}
    if sources:
        meta["merged_from"] = sources
        meta["wall_s"] = None
    try:
        import llguidance
        meta["llguidance"] = getattr(llguidance, "__version__", "?")
    except Exception:
        pass
    try:
        import xgrammar
        meta["xgrammar"] = getattr(xgrammar, "__version__", "?")
    except Exception:
        pass
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "overall": overall, "per_split": per_split, "rows": rows}, indent=1))
    md = ["# MaskBench acceptance (experiments/bench_maskbench.py)", ""]
    if sources:
        md.append(f"{len(names)} files; tables from the rows of earlier runs "
                  f"(`--from-rows`), each on {meta['cpus']} CPUs with limits per compile of "
                  "60 s and 4 GiB above the parent:")
        for so in sources:
            wall = "" if so["wall_s"] is None else f", wall {so['wall_s']:.0f} s"
            md.append(f"- {', '.join(so['engines'])}: "
                      f"`python -m experiments.bench_maskbench {' '.join(so['argv'] or [])}`"
                      f"{wall}")
        md.append("")
    else:
        md += [f"`python -m experiments.bench_maskbench {' '.join(sys.argv[1:])}`: "
               f"{len(names)} files, {args.splits} splits, seed {args.seed}; wall "
               f"{meta['wall_s']:.0f} s on {meta['cpus']} CPUs. Limits per compile: 60 s, "
               "4 GiB above the parent.", ""]
    md.append(table(overall, "Overall"))
    for s in splits:
        md.append(table(per_split[s], s))
    md.extend(stage_table(rows))
    # why jaxcd fails
    for e in engines:
        errs: dict[str, int] = {}
        for r in rows[e]:
            if r["status"] != "ok":
                k = r.get("error", r["status"])[:110]
                errs[k] = errs.get(k, 0) + 1
        if errs:
            md.append(f"### {e}: compile errors and failures\n")
            md.extend(f"- {v} × `{k}`" for k, v in sorted(errs.items(), key=lambda x: -x[1])[:25])
            md.append("")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(table(overall, "Overall"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
