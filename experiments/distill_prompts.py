"""Tool-calling prompts for HMM distillation, disjoint from every evaluation.

Three sets of BFCL example ids, each a committed file with the rule that made it:

* **evaluated** (``experiments/data/bfcl_evaluated_ids.json``): every BFCL example id
  named in a file under ``experiments/results/`` (the studies' ``data.jsonl``,
  predictions, records, tables) or ``tests/data/bfcl/``, plus the subsets a study run
  at n = 200 with the default seed draws (:func:`experiments.studies.bfcl_subset`,
  seed 0, limit 200, over the main categories and over simple_python / multiple /
  live_simple). ``--rescan`` adds what new results name; the set never shrinks. The scan
  reads whole ids: MaskBench's ``BFCL_multiple_116``-style schema names (mask benchmarks
  of a function's schema: no prompt, no model output) are not BFCL example ids and do not
  count.
* **development** (``experiments/data/bfcl_dev_ids.json``): for tuning. 50 examples each
  of simple_python, multiple and live_simple, none of them evaluated: per category, the
  non-evaluated examples in file order, permuted by
  ``numpy.random.default_rng([DEV_SEED, category index])``, the first 50; listed
  round-robin over the categories (so every prefix is balanced). Drawn once; the file
  keeps the evaluated ids it excluded, so the rule reproduces it after the evaluated
  set grows.
* **distillation prompts** (``hmm_distill/data/tool_prompts.jsonl.gz``): every other
  single-turn BFCL example, in both output formats (``json`` and ``python``), plus
  prompts built from the built-in tool schemas of :mod:`hmm_distill.prompts` (kind
  ``synthetic``), shuffled with a fixed seed (every prefix is a mix).

Each prompt is a chat prompt record ``{"id", "kind", "user", "system", "tools"}`` as
``hmm-distill sample --prompts FILE`` reads it (:func:`hmm_distill.sampler.read_chat_prompts`);
rendered with the chat template it gives the token ids a study feeds the model for that
example (:func:`experiments.bfcl.prompt_ids`): the system turn is the format instruction
(:data:`experiments.bfcl.SYSTEM`) plus the example's own system turns, the user turn its
other turns, the tools the example's functions as JSON Schema. Ids are
``FORMAT:EXAMPLE_ID`` (``json:live_multiple_12-4-0``) and ``FORMAT:synthetic-NNN``; the
kind is ``bfcl/CATEGORY`` or ``synthetic``.

The generator is deterministic: given the two id files it writes the same bytes (gzip
with a zero timestamp and no file name). ``--lengths`` renders every prompt with the
SmolLM2 tokenizer and writes the token-length distribution, per format and kind, the
number of prompts each ``max_prompt_tokens`` threshold keeps, and every prompt's length
(``experiments/results/distill_prompts.json``): prefill of long prompts is what
sampling them costs on a CPU (``hmm-distill sample --max-prompt-tokens N`` drops the
longer ones).

Usage::

    python -m experiments.distill_prompts                  # ids (if missing) + prompts
    python -m experiments.distill_prompts --rescan         # add newly evaluated ids first
    python -m experiments.distill_prompts --lengths        # also the length statistics
    python -m experiments.distill_prompts --dev-data DIR   # the dev set as data.jsonl/answers.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments import bfcl  # noqa: E402

DATA_DIR = ROOT / "experiments" / "data"
EVALUATED_FILE = DATA_DIR / "bfcl_evaluated_ids.json"
DEV_FILE = DATA_DIR / "bfcl_dev_ids.json"
PROMPTS_FILE = ROOT / "hmm_distill" / "data" / "tool_prompts.jsonl.gz"
LENGTHS_FILE = ROOT / "experiments" / "results" / "distill_prompts.json"
#: where evaluated ids are looked for (relative to the repository root)
SCAN_DIRS = ("experiments/results", "tests/data/bfcl")
SCAN_SUFFIXES = (".jsonl", ".json", ".md", ".csv", ".txt")

DEV_SEED = 43
DEV_CATEGORIES = ("simple_python", "multiple", "live_simple")
DEV_PER_CATEGORY = 50
#: the subsets a study at n = 200 with the default seed draws (reserved for evaluation)
RESERVED_SUBSETS = ({"limit": 200, "seed": 0, "categories": list(bfcl.MAIN_CATEGORIES)},
                    {"limit": 200, "seed": 0, "categories": list(DEV_CATEGORIES)})
SHUFFLE_SEED = 39
FORMATS = ("json", "python")
SYNTHETIC_FILLS = 8
THRESHOLDS = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

_ID_TOKEN = re.compile(r"[A-Za-z_]+_\d+(?:-\d+)*")


# ---------------------------------------------------------------------------------------
# ids
# ---------------------------------------------------------------------------------------
def all_example_ids() -> dict[str, list[str]]:
    """Every single-turn BFCL example id, per category, in file order."""
    return {c: [r["id"] for r in bfcl.load_jsonl(bfcl.category_file(c))] for c in bfcl.SINGLE_TURN}


def scan_ids(known: set[str], dirs=SCAN_DIRS, root: Path = ROOT) -> dict[str, list[str]]:
    """The ids in ``known`` named in the text files under ``dirs``: ``{id: [files]}``."""
    found: dict[str, list[str]] = {}
    for d in dirs:
        base = root / d
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if not p.is_file() or not p.name.endswith(SCAN_SUFFIXES):
                continue
            text = p.read_text(encoding="utf-8", errors="replace")
            rel = str(p.relative_to(root))
            for tok in set(_ID_TOKEN.findall(text)):
                if tok in known:
                    found.setdefault(tok, []).append(rel)
    return found


def reserved_ids() -> list[str]:
    """The ids of :data:`RESERVED_SUBSETS`, drawn by the studies' own subset rule."""
    from experiments.studies import bfcl_subset

    out: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(RESERVED_SUBSETS):
            _, _, info = bfcl_subset(Path(tmp) / str(i), s["limit"], s["seed"], tuple(s["categories"]))
            out += [x for x in info["ids"] if x not in out]
    return out


def build_evaluated(previous: dict | None = None, dev: set[str] = frozenset()) -> dict:
    """The evaluated-id record: scanned ids (with the files that name them) ∪ the
    reserved subsets ∪ ``previous["ids"]`` (the set never shrinks). Ids of the
    development set ``dev`` named by results are runs on the development set, not
    evaluations: they are not added."""
    known = {x for ids in all_example_ids().values() for x in ids}
    found = {k: v for k, v in scan_ids(known).items() if k not in dev}
    reserved = reserved_ids()
    ids = set(found) | set(reserved) | set((previous or {}).get("ids", []))
    sources: dict[str, int] = {}
    for files in found.values():
        for f in files:
            sources[f] = sources.get(f, 0) + 1
    return {"rule": ("every single-turn BFCL example id named in a text file under "
                     f"{', '.join(SCAN_DIRS)}, plus the subsets experiments.studies.bfcl_subset "
                     "draws for the reserved settings, plus the ids of the previous version of "
                     "this file (never shrinks); development-set ids are not added"),
            "scanned": list(SCAN_DIRS), "reserved_subsets": list(RESERVED_SUBSETS),
            "num_ids": len(ids), "num_scanned": len(found), "num_reserved": len(reserved),
            "files": dict(sorted(sources.items())),
            "ids": sorted(ids, key=_id_key)}


def _id_key(x: str):
    cat = bfcl.category_of(x)
    nums = [int(n) for n in re.findall(r"\d+", x[len(cat):])]
    return (cat, nums)


def build_dev(evaluated: set[str], seed: int = DEV_SEED, categories=DEV_CATEGORIES,
              per_category: int = DEV_PER_CATEGORY) -> dict:
    """The development set: per category the non-evaluated examples in file order,
    permuted by ``default_rng([seed, category index])``, the first ``per_category``;
    listed round-robin over the categories."""
    ids = all_example_ids()
    picks = []
    for ci, cat in enumerate(categories):
        pool = [x for x in ids[cat] if x not in evaluated]
        if len(pool) < per_category:
            raise ValueError(f"{cat}: only {len(pool)} non-evaluated examples, need {per_category}")
        order = np.random.default_rng([seed, ci]).permutation(len(pool))
        picks.append([pool[i] for i in order[:per_category]])
    chosen = [p[i] for i in range(per_category) for p in picks]
    return {"rule": (f"per category (index i in {list(categories)}): the examples not in "
                     "'excluded' (the evaluated ids when this set was drawn), in file order, "
                     f"permuted by numpy.random.default_rng([{seed}, i]); the first "
                     f"{per_category}; listed round-robin over the categories"),
            "seed": seed, "categories": list(categories), "per_category": per_category,
            "wheel": f"{bfcl.WHEEL}=={bfcl.WHEEL_VERSION}", "ids": chosen,
            "excluded": sorted(evaluated, key=_id_key)}


def load_ids(path: Path) -> dict:
    """A committed id record (:data:`EVALUATED_FILE` or :data:`DEV_FILE`)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def write_dev_data(out_dir: Path, dev: dict | None = None) -> tuple[Path, Path]:
    """The development set as a study's ``data.jsonl`` / ``answers.jsonl`` (the ids'
    order), for ``experiments.tool_calls --data``."""
    dev = dev or load_ids(DEV_FILE)
    rows, answers = {}, {}
    for cat in dev["categories"]:
        rows.update({r["id"]: r for r in bfcl.load_jsonl(bfcl.category_file(cat))})
        answers.update({r["id"]: r for r in bfcl.load_jsonl(bfcl.category_file(cat, answers=True))})
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data, ans = out_dir / "data.jsonl", out_dir / "answers.jsonl"
    data.write_text("".join(json.dumps(rows[x]) + "\n" for x in dev["ids"]))
    ans.write_text("".join(json.dumps(answers[x]) + "\n" for x in dev["ids"] if x in answers))
    return data, ans


# ---------------------------------------------------------------------------------------
# prompt records
# ---------------------------------------------------------------------------------------
def example_record(ex: bfcl.Example, fmt: str) -> dict:
    """The chat prompt record of a BFCL example in format ``fmt`` (what
    :func:`experiments.bfcl.prompt_ids` renders)."""
    system = [bfcl.SYSTEM[fmt]] + [m["content"] for m in ex.question if m["role"] == "system"]
    user = "\n".join(m["content"] for m in ex.question if m["role"] != "system")
    return {"id": f"{fmt}:{ex.id}", "kind": f"bfcl/{ex.category}", "system": "\n\n".join(system),
            "user": user, "tools": bfcl.tool_docs(ex)}


def example_id_of(record_id: str) -> str:
    """``json:simple_python_3`` -> ``simple_python_3``."""
    return record_id.split(":", 1)[1]


def synthetic_records(fills: int = SYNTHETIC_FILLS) -> list[dict]:
    """Prompts from the built-in tool schemas (:data:`hmm_distill.prompts.TOOLS`): each
    template filled ``fills`` ways; the odd fills offer two other tools beside the right
    one (at a position that varies), as BFCL's ``multiple`` does."""
    from hmm_distill.prompts import TOOLS, _fill

    docs = [{"name": t["name"], "description": t["description"], "parameters": t["parameters"]}
            for t, _ in TOOLS]
    base, seen = [], set()
    for ti, (_, templates) in enumerate(TOOLS):
        for template in templates:
            for k in range(fills):
                user = _fill(template, k)
                tools = [docs[ti]]
                if k % 2:
                    others = [docs[(ti + 1 + k) % len(docs)], docs[(ti + 4 + k) % len(docs)]]
                    tools = others[:k % 3] + tools + others[k % 3:]
                key = json.dumps([user, [t["name"] for t in tools]])
                if key not in seen:
                    seen.add(key)
                    base.append((user, tools))
    out = []
    for fmt in FORMATS:
        for i, (user, tools) in enumerate(base):
            out.append({"id": f"{fmt}:synthetic-{i:03d}", "kind": "synthetic",
                        "system": bfcl.SYSTEM[fmt], "user": user, "tools": tools})
    return out


def generate(evaluated: set[str], dev: set[str]) -> tuple[list[dict], dict]:
    """The distillation prompt records (shuffled with :data:`SHUFFLE_SEED`) and a
    summary of what was left out."""
    records, skipped = [], {}
    counts = {"examples": 0, "excluded_evaluated": 0, "excluded_dev": 0}
    for cat in bfcl.SINGLE_TURN:
        for ex in bfcl.load_examples(bfcl.category_file(cat)):
            counts["examples"] += 1
            if ex.id in evaluated:
                counts["excluded_evaluated"] += 1
                continue
            if ex.id in dev:
                counts["excluded_dev"] += 1
                continue
            try:
                recs = [example_record(ex, fmt) for fmt in FORMATS]
            except (ValueError, TypeError, KeyError) as e:   # a function the converter rejects
                skipped[ex.id] = f"{type(e).__name__}: {e}"[:200]
                continue
            records += recs
    synth = synthetic_records()
    records += synth
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(records))
    records = [records[i] for i in order]
    counts.update(skipped=len(skipped), skipped_ids=skipped, synthetic=len(synth),
                  prompts=len(records))
    return records, counts


def encode_records(records: list[dict]) -> bytes:
    """JSON lines (keys in record order, tool schemas as BFCL orders them)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def gzip_bytes(raw: bytes) -> bytes:
    """gzip with a zero timestamp and no file name (the same bytes every time)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(raw)
    return buf.getvalue()


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def write_prompts(path: Path = PROMPTS_FILE) -> dict:
    """Generate the prompt set from the committed id files and write it to ``path``."""
    evaluated = set(load_ids(EVALUATED_FILE)["ids"])
    dev = set(load_ids(DEV_FILE)["ids"])
    records, info = generate(evaluated, dev)
    raw = encode_records(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip_bytes(raw) if path.name.endswith(".gz") else raw)
    info.update(file=str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
                sha256_uncompressed=sha256(raw), bytes_uncompressed=len(raw),
                bytes=path.stat().st_size)
    return info


# ---------------------------------------------------------------------------------------
# token lengths
# ---------------------------------------------------------------------------------------
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


def _quantiles(x) -> dict:
    x = np.asarray(x)
    return {f"q{int(q * 100):02d}" if q < 1 else "max": int(np.quantile(x, q, method="nearest"))
            for q in QUANTILES} | {"mean": round(float(x.mean()), 1), "n": int(x.size)}


def length_stats(records: list[dict], lengths: list[int], thresholds=THRESHOLDS) -> dict:
    """Token-length quantiles (all, per format, per kind) and, per threshold, how many
    prompts (and distinct examples, and prompt tokens) ``max_prompt_tokens`` keeps."""
    L = np.asarray(lengths)
    fmt = np.array([r["id"].split(":", 1)[0] for r in records])
    kind = np.array([r["kind"] for r in records])
    ex = np.array([example_id_of(r["id"]) for r in records])
    keep = {}
    for t in thresholds:
        m = L <= t
        keep[str(t)] = {"prompts": int(m.sum()), "share": round(float(m.mean()), 4),
                        "examples": int(len(set(ex[m]))), "prompt_tokens": int(L[m].sum())}
    return {"all": _quantiles(L),
            "per_format": {f: _quantiles(L[fmt == f]) for f in FORMATS},
            "per_kind": {k: _quantiles(L[kind == k]) for k in sorted(set(kind))},
            "max_prompt_tokens": keep, "total_prompt_tokens": int(L.sum())}


def lengths_file(model: str | None = None) -> Path:
    """Where the length statistics for ``model``'s tokenizer go (``None``: SmolLM2,
    :data:`LENGTHS_FILE`; a name or GGUF path: ``distill_prompts_<name>.json``)."""
    if model is None:
        return LENGTHS_FILE
    name = Path(model).stem if model.endswith(".gguf") else Path(model).name
    return LENGTHS_FILE.with_name(f"distill_prompts_{name}.json")


def write_lengths(path: Path = PROMPTS_FILE, out: Path | None = None, model: str | None = None,
                  argv=()) -> dict:
    """Render every prompt of ``path`` with the model's tokenizer (default SmolLM2) and
    write :func:`length_stats` plus every prompt's length to ``out``."""
    from hmm_distill.sampler import encode_chat_prompts, read_chat_prompts
    from jaxcd.tokenizer import load_tokenizer
    from experiments.provenance import provenance

    out = lengths_file(model) if out is None else Path(out)
    records = read_chat_prompts(path)
    tok = load_tokenizer(model)
    lengths = [len(p) for p in encode_chat_prompts(records, tok)]
    res = {"prompt_set": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
           "prompt_set_sha256": sha256(path.read_bytes()),
           "tokenizer": model or "SmolLM2-135M-Instruct (default GGUF)",
           "wheel": f"{bfcl.WHEEL}=={bfcl.WHEEL_VERSION}",
           "stats": length_stats(records, lengths),
           "provenance": provenance("experiments.distill_prompts", list(argv),
                                   [SHUFFLE_SEED, DEV_SEED]),
           "lengths_order": "the prompt file's order", "lengths": "LENGTHS"}
    text = json.dumps(res, indent=1, ensure_ascii=False).replace('"LENGTHS"', json.dumps(lengths))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")
    res["lengths"] = lengths
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.distill_prompts",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rescan", action="store_true",
                    help="add the ids named by new results to the evaluated set (and check the dev set)")
    ap.add_argument("--lengths", action="store_true", help="also write the token-length statistics")
    ap.add_argument("--model", default=None,
                    help="tokenizer for --lengths: a model name or GGUF (default SmolLM2)")
    ap.add_argument("--out", type=Path, default=PROMPTS_FILE)
    ap.add_argument("--dev-data", type=Path, default=None,
                    help="write the dev set as DIR/data.jsonl + DIR/answers.jsonl and stop")
    a = ap.parse_args(argv)
    if a.dev_data:
        d, _ = write_dev_data(a.dev_data)
        print(f"wrote {sum(1 for _ in d.open())} dev examples to {d}")
        return 0
    if a.rescan or not EVALUATED_FILE.exists():
        prev = load_ids(EVALUATED_FILE) if EVALUATED_FILE.exists() else None
        dev_ids = set(load_ids(DEV_FILE)["ids"]) if DEV_FILE.exists() else set()
        ev = build_evaluated(prev, dev_ids)
        write_json(EVALUATED_FILE, ev)
        print(f"{EVALUATED_FILE.relative_to(ROOT)}: {ev['num_ids']} evaluated ids")
    evaluated = set(load_ids(EVALUATED_FILE)["ids"])
    if not DEV_FILE.exists():
        write_json(DEV_FILE, build_dev(evaluated))
    dev = load_ids(DEV_FILE)
    clash = sorted(set(dev["ids"]) & evaluated)
    if clash:
        raise SystemExit(f"dev ids now evaluated elsewhere (not a dev set any more): {clash[:5]} ...")
    info = write_prompts(a.out)
    print(f"{info['file']}: {info['prompts']} prompts ({info['bytes']} bytes; "
          f"{info['excluded_evaluated']} evaluated and {info['excluded_dev']} dev examples left out, "
          f"{info['skipped']} skipped, {info['synthetic']} synthetic)")
    if a.lengths:
        res = write_lengths(a.out, model=a.model, argv=sys.argv[1:] if argv is None else argv)
        s = res["stats"]["all"]
        print(f"{lengths_file(a.model).relative_to(ROOT)}: tokens median {s['q50']}, "
              f"p90 {s['q90']}, max {s['max']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
