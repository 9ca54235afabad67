"""Runs that outgrow one machine (issue 23, item 4): ``--shard I/N`` slices, ``python -m
experiments.merge`` and ``--resume``, on study 1 with the smoke settings (two BFCL
examples, the smoke model: a random 2-layer Llama with SmolLM2's tokenizer, a random
H=4 HMM, k = 2, JSON).

- Two shards merged give the unsharded run's rows (outputs, validity, correctness,
  log Z, budgets), in its order, and its table.
- The merge refuses shards of other settings, the same shard twice and a missing shard
  (unless ``--partial``, which records what is missing).
- A run interrupted after its first example and resumed does not run that example
  again (the runner's calls are counted), survives a torn last record, and ends with
  the uninterrupted run's rows; ``--resume`` with other settings is refused.
"""

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import merge, studies  # noqa: E402
from experiments.runner import Runner, read_records  # noqa: E402

#: what a rerun may change: timings and compile records
TIMING = {"seconds", "cpu_s", "compiled", "compile_s", "tables_s"}
SMOKE = ["satisfaction", "--smoke", "--limit", "2", "--budget", "auto-max", "--shared-shapes"]


def rows_of(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "run" / "predictions.jsonl").open()]


def strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def study(argv, out: Path) -> dict:
    studies._RUNS.clear()                 # no reuse of an earlier call's rows in-process
    assert studies.main(argv + ["--out", str(out)]) == 0
    return json.loads((out / "satisfaction.json").read_text())


@pytest.fixture(scope="module", autouse=True)
def one_model_record():
    """``studies.model_record`` parses the whole GGUF (its 49k-token vocabulary: ~4-10 s on
    this CPU) for every study run; the runs of this file all use the smoke model, so its
    record is read once and each run gets a copy of it."""
    import copy
    import functools
    memo = functools.lru_cache(maxsize=None)(studies.model_record)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(studies, "model_record",
                   lambda model, mode="default": copy.deepcopy(memo(model, mode)))
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    t = tmp_path_factory.mktemp("shards")
    full = study(SMOKE, t / "full")
    s1 = study(SMOKE + ["--shard", "1/2"], t / "s1")
    s2 = study(SMOKE + ["--shard", "2/2"], t / "s2")
    assert merge.main([str(t / "s1"), str(t / "s2"), "--out", str(t / "merged")]) == 0
    merged = json.loads((t / "merged" / "satisfaction.json").read_text())
    return {"dir": t, "full": full, "s1": s1, "s2": s2, "merged": merged}


def test_shards_partition_and_merge_equals_unsharded(runs):
    t = runs["dir"]
    full = rows_of(t / "full")
    ids = list(dict.fromkeys(r["id"] for r in full))
    assert len(ids) == 2 and len(full) == 2 * 3         # 2 examples x 3 methods x k=2
    # interleaved slices of the seeded order: shard 1 the first example, shard 2 the second
    assert {r["id"] for r in rows_of(t / "s1")} == {ids[0]}
    assert {r["id"] for r in rows_of(t / "s2")} == {ids[1]}
    merged = rows_of(t / "merged")
    assert strip(merged) == strip(full)
    # the study's table from the merged rows is the unsharded table
    keep = ("format", "method", "particles", "n", "valid_pct", "valid_ci", "accuracy_pct",
            "accuracy_ci")
    tab = lambda res: [{k: e[k] for k in keep} for e in res["table"]]      # noqa: E731
    assert tab(runs["merged"]) == tab(runs["full"])
    assert runs["merged"]["subset"]["examples"] == 2
    assert runs["merged"]["provenance"]["command"].startswith("python -m experiments.merge")
    assert [m["shard"] for m in runs["merged"]["merged_from"]] == ["1/2", "2/2"]
    assert runs["merged"]["calls"][0]["entry"] == "reused"          # tabulated, not rerun
    summ = json.loads((t / "merged" / "run" / "summary.json").read_text())
    assert summ["meta"]["n_examples"] == 2 and summ["meta"]["missing_ids"] == []
    assert summ["meta"]["example_ids"] == ids


def test_merge_refuses_mismatches(runs, tmp_path):
    t = runs["dir"]
    # a shard whose recorded settings differ (here: the seed)
    bad = tmp_path / "s2_seed1"
    shutil.copytree(t / "s2", bad)
    info = json.loads((bad / "run" / "run.json").read_text())
    info["settings"]["seed"] = 1
    (bad / "run" / "run.json").write_text(json.dumps(info))
    with pytest.raises(SystemExit, match="other settings.*seed"):
        merge.main([str(t / "s1" / "run"), str(bad / "run"), "--out", str(tmp_path / "m1")])
    with pytest.raises(SystemExit, match="given twice"):
        merge.main([str(t / "s1" / "run"), str(t / "s1" / "run"), "--out", str(tmp_path / "m2")])
    with pytest.raises(SystemExit, match="unsharded run cannot be merged"):
        merge.main([str(t / "full" / "run"), str(t / "s2" / "run"), "--out", str(tmp_path / "m3")])
    with pytest.raises(SystemExit, match=r"shards \[2\] of 2 not given"):
        merge.main([str(t / "s1" / "run"), "--out", str(tmp_path / "m4")])
    # --partial: one shard's rows, and the record of what is missing
    assert merge.main([str(t / "s1" / "run"), "--partial", "--out", str(tmp_path / "m5")]) == 0
    s = json.loads((tmp_path / "m5" / "summary.json").read_text())["meta"]
    assert s["missing_shards"] == [2] and s["n_examples"] == 1 and s["n_planned"] == 1
    m5 = [json.loads(x) for x in (tmp_path / "m5" / "predictions.jsonl").open()]
    assert m5 == rows_of(t / "s1")


def test_resume_after_interruption(runs, tmp_path, monkeypatch):
    t = runs["dir"]
    ids = list(dict.fromkeys(r["id"] for r in rows_of(t / "full")))
    calls = []
    real = Runner.run_ks

    def counting(self, method, c, prompt_ids, budget, ks, seed, tag="", share=True):
        ex = tag.split("|", 1)[1]
        if stop["at"] == ex:
            raise KeyboardInterrupt                     # the run is stopped here
        calls.append(ex)
        return real(self, method, c, prompt_ids, budget, ks, seed, tag, share)

    monkeypatch.setattr(Runner, "run_ks", counting)
    stop = {"at": ids[1]}
    with pytest.raises(KeyboardInterrupt):
        study(SMOKE, tmp_path / "r")
    assert calls == [ids[0]] * 3
    recs = read_records(tmp_path / "r" / "run" / "records.jsonl")
    assert [r["id"] for r in recs] == [ids[0]]
    # a kill while the next record was being written leaves a torn line
    with open(tmp_path / "r" / "run" / "records.jsonl", "a") as f:
        f.write('{"index": 1, "id": "' + ids[1][:5])
    calls.clear()
    stop["at"] = None
    res = study(SMOKE + ["--resume"], tmp_path / "r")
    assert calls == [ids[1]] * 3                         # the finished example is not rerun
    rows = rows_of(tmp_path / "r")
    assert strip(rows) == strip(rows_of(t / "full"))
    assert [r for r in rows if r["id"] == ids[0]] == recs[0]["rows"]     # kept as recorded
    summ = json.loads((tmp_path / "r" / "run" / "summary.json").read_text())["meta"]
    assert summ["resumed_ids"] == [ids[0]] and summ["n_examples"] == 2
    assert res["subset"]["examples"] == 2
    # resuming with other settings is refused, and the records are left alone
    with pytest.raises(SystemExit, match="other settings"):
        study(SMOKE + ["--resume", "--seed", "1"], tmp_path / "r")
    assert len(read_records(tmp_path / "r" / "run" / "records.jsonl")) == 2


def test_make_results_from_merged_study(runs, tmp_path):
    """RESULTS.md from a merged study: the paired comparisons and the cost come from the
    merged rows, the model and machine from the records, and no absolute path leaks."""
    import re
    from experiments import make_results
    from experiments.studies import paired_tests
    res_dir = tmp_path / "results"
    shutil.copytree(runs["dir"] / "merged", res_dir / "satisfaction")
    out = tmp_path / "RESULTS.md"
    assert make_results.main(["--results", str(res_dir), "--out", str(out)]) == 0
    text = out.read_text()
    rows = rows_of(res_dir / "satisfaction")
    paired = paired_tests(rows, "valid", 0)
    assert runs["merged"]["paired"] == paired and len(paired) == 3     # 3 method pairs, k=2
    for e in paired:
        assert f"{e['diff_pct']:+.1f} [{e['diff_ci'][0]:+.1f}, {e['diff_ci'][1]:+.1f}]" in text
    mi = runs["merged"]["model_info"]
    assert mi["file"].startswith("smoke-") and f"`{mi['file']}`" in text
    assert "merged from 2 shards" in text
    assert not re.findall(r"(?<![\w.:/~<>])/(?:[\w.+@-]+/)+[\w.+@-]*", text)


def test_mcnemar_and_paired_bootstrap():
    """The exact McNemar p-value against scipy's binomial test; the paired bootstrap is
    seeded (same call, same interval) and brackets the observed difference."""
    from experiments.studies import mcnemar_p, paired_tests
    scipy_stats = pytest.importorskip("scipy.stats")
    for b, c in [(0, 0), (3, 0), (10, 2), (5, 5), (1, 9), (40, 21)]:
        ref = scipy_stats.binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
        assert mcnemar_p(b, c) == pytest.approx(ref, rel=1e-12)
    rows = [{"id": i, "format": "json", "particles": 4, "method": m,
             "valid": (i % 3 != 0) if m == "smc-lcd" else True}
            for i in range(30) for m in ("smc-lcd", "smc-gcd")]
    a, b = paired_tests(rows, "valid", 0), paired_tests(rows, "valid", 0)
    assert a == b and len(a) == 1
    e = a[0]
    assert (e["a"], e["b"], e["a_only"], e["b_only"]) == ("smc-gcd", "smc-lcd", 10, 0)
    assert e["diff_pct"] == pytest.approx(100 / 3)
    assert e["diff_ci"][0] <= e["diff_pct"] <= e["diff_ci"][1] and e["diff_ci"][0] > 0
    assert e["significant"] and e["p_mcnemar"] == pytest.approx(2 / 2 ** 10)
