"""The README's Python examples run as written (the front door must be true)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_api_and_generate_examples_run():
    blocks = python_blocks()
    assert len(blocks) >= 2
    ns: dict = {}
    exec(compile(blocks[0], "README block 1", "exec"), ns)     # compile + allowed_tokens
    assert ns["mask"].shape == (49152,) and ns["mask"].any()
    exec(compile(blocks[1], "README block 2", "exec"), ns)     # jaxcd.generate with GCD
    out = ns["out"]
    assert len(out.texts) == 4 and all(out.valid)
