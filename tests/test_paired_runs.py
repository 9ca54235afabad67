"""experiments.paired_runs: rows of two runs on the same examples, paired."""

import json

from experiments import paired_runs as P


def _rows(method, correct):
    return [{"id": f"e{i}", "method": method, "particles": 4, "format": "json", "correct": c,
             "valid": True, "output": "[]", "tokens": 3, "log_Z": 0.0}
            for i, c in enumerate(correct)]


def test_combine_keeps_the_shared_examples_and_renames():
    base = _rows("smc-gcd", [1, 1, 0, 1]) + _rows("smc-lookahead", [0, 1, 0, 0])
    new = [r for r in _rows("smc-lookahead", [1, 1, 0, 1]) if r["id"] != "e3"]
    rows = P.combine(base, new, " (new)")
    assert {r["id"] for r in rows} == {"e0", "e1", "e2"}
    assert sorted({r["method"] for r in rows}) == ["smc-gcd", "smc-lookahead",
                                                   "smc-lookahead (new)"]


def test_main_counts_discordant_pairs(tmp_path):
    """Against hand counts: the new lookahead gets right 3 examples the old one missed
    and misses none it got (McNemar exact p = 2 · 0.5³ = 0.25)."""
    base, new = tmp_path / "base", tmp_path / "new"
    base.mkdir(), new.mkdir()
    b = _rows("smc-gcd", [1, 1, 0, 1, 0]) + _rows("smc-lookahead", [0, 0, 0, 1, 0])
    n = _rows("smc-lookahead", [1, 1, 0, 1, 1])
    (base / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in b))
    (new / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in n))
    res = P.main(["--base", str(base), "--new", str(new), "--suffix", " (new)",
                  "--out", str(tmp_path / "out")])
    (pair,) = [e for e in res["paired_accuracy"]
               if {e["a"], e["b"]} == {"smc-lookahead", "smc-lookahead (new)"}]
    new_first = pair["a"] == "smc-lookahead (new)"
    assert (pair["a_only"], pair["b_only"]) == ((3, 0) if new_first else (0, 3))
    assert abs(pair["p_mcnemar"] - 0.25) < 1e-12 and pair["n"] == 5
    assert (tmp_path / "out" / "paired_runs.md").exists()
