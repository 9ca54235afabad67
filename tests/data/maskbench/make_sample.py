"""Copy a seeded sample of MaskBench files into this folder (issue 22).

    python tests/data/maskbench/make_sample.py /path/to/jsonschemabench.git

Source: the public repository ``guidance-ai/jsonschemabench``, ``maskbench/data/*.json``
(each file: a JSON Schema with valid and invalid instances). Only the development splits
(Github_*, Glaiveai2K, Synthesized, BFCL_*, JME) are sampled; the held-out splits
(Kubernetes, Snowplow, JsonSchemaStore, WashingtonPost, MCPspec, Handwritten) are never
copied. Seed 20261126, 300 files with tests, each at most 20 kB.
"""

import json
import random
import subprocess
import sys
from pathlib import Path

SEED = 20261126
N = 300
MAX_BYTES = 20_000
DEV = ("Github_", "Glaiveai2K", "Synthesized", "BFCL_", "JME")


def main(git_dir: str) -> None:
    here = Path(__file__).resolve().parent
    names = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "--name-only", "HEAD",
                            "maskbench/data/"], check=True, capture_output=True,
                           text=True).stdout.split()
    names = sorted(n for n in names if n.rsplit("/", 1)[-1].startswith(DEV))
    random.Random(SEED).shuffle(names)
    kept = 0
    for n in names:
        raw = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:{n}"],
                             check=True, capture_output=True).stdout
        if len(raw) > MAX_BYTES or not json.loads(raw).get("tests"):
            continue
        (here / n.rsplit("/", 1)[-1]).write_bytes(raw)
        kept += 1
        if kept == N:
            break
    print(f"copied {kept} files")


if __name__ == "__main__":
    main(sys.argv[1])
