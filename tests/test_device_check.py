"""The prepared device check (``experiments/device_check.py``) runs end to end at tiny
shapes on the CPU (``--smoke``): every part produces its figures, nothing errors, the
results files are written, the per-layer step matches the stacked one and the Pallas
scores have the XLA path's support."""

import json
import math

import pytest


def test_device_check_smoke(tmp_path):
    from experiments import device_check

    out = tmp_path / "dc"
    res = device_check.main(["--smoke", "--hidden", "16", "--out", str(out)])
    assert res["errors"] == {} and res["skipped"] == []
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["decode_floor"].keys() == {"tiny"} and saved["wall_s"] > 0
    md = out.with_suffix(".md").read_text()
    assert "Decode step vs the weight-read floor" in md and "lookahead H=16" in md
    f = res["decode_floor"]["tiny"]
    for k in ("floor_ms", "scan_ms", "unrolled_ms"):
        assert f[k] > 0 and math.isfinite(f[k])
    assert f["unrolled_vs_scan_max_abs_logprob"] < 0.05          # bf16, same function
    assert f["cost_analysis"]["moves"]["while"] == 0
    s = res["scoring"]["16"]
    assert "pallas_error" not in s and s["same_support"]
    assert s["max_abs_logpsi"] < 0.02        # B and β^P in bf16: 2^-8 relative roundings
    rows = res["decoding"]["tiny"]["rows"]
    assert set(rows) == {"none", "gcd", "smc-gcd", "lookahead H=16"}
    for r in rows.values():
        assert len(r["steps"]) == 2 and all(x >= 1 for x in r["steps"])
        assert r["ms_per_step"][0] > 0
    assert rows["none"]["slowdown"][0] == pytest.approx(1.0)
    em = saved["em"]["H=16 V=512"]                        # part 4: one EM iteration timed
    assert em["tokens"] == 8 * 16 and em["tokens_per_s"] > 0 and "vs_pyjuice" not in em
    assert "EM throughput" in md and "pyjuice" in md
