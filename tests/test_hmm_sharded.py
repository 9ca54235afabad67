"""Data-parallel EM: 4 forced host devices give the same parameters as one device, with
the data split 4 ways (mesh (4, 1)) and split 2 ways with B split over the vocabulary
2 ways (mesh (2, 2); also the training job). (Each mesh costs its own compilations:
the pure 4-way vocabulary split (1, 4) and a data-parallel-only training job were
dropped to keep the test cheap; (2, 2) runs both code paths.)

The device count must be fixed before JAX initialises, so the comparison runs in a
subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

SCRIPT = textwrap.dedent(r"""
    import json, sys
    import numpy as np, jax
    from hmm_distill import hmm as F
    from hmm_distill.em import EM, full_batch_em, make_mesh, pad_batch, step_size
    from hmm_distill.data import write_samples
    from hmm_distill.train import TrainConfig, train

    assert len(jax.devices()) == 4, jax.devices()
    rng = np.random.default_rng(0)
    H, V, T = 6, 40, 16
    X = rng.integers(0, V, (30, T))
    z = [rng.normal(size=sh) for sh in ((H,), (H, H), (H, V))]  # random parameters (numpy: no compile)
    p0 = F.as_params(*(np.exp(x) / np.exp(x).sum(-1, keepdims=True) for x in z))
    Xd = np.where(rng.random(X.shape) < 0.1, -1, X)  # dropped (marginalised) tokens too
    batches = [pad_batch(Xd[:16], None, 16), pad_batch(Xd[16:], None, 16)]  # 2nd has 2 masked rows
    out = {}
    res = {}
    for D in (1, 4):
        eng = EM(make_mesh(D))
        p, hist = full_batch_em(p0, batches, iterations=3, pseudocount=1e-2, engine=eng)
        q = eng.replicate(F.to_token_major(p0))
        for k, (t, m) in enumerate(batches):
            q, _, ok = eng.minibatch_step(q, t, m, step_size(k), 1e-2)
            assert bool(ok)
        res[D] = ([np.asarray(x) for x in p], hist, [np.asarray(x) for x in F.from_token_major(q)],
                  np.asarray(eng.log_likelihood(p, *batches[0])))
    out["full_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(res[1][0], res[4][0]))
    out["hist"] = [res[1][1], res[4][1]]
    out["mb_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(res[1][2], res[4][2]))
    out["ll_max_diff"] = float(np.abs(res[1][3] - res[4][3]).max())
    # the training job on one device (the reference of the sharded job below)
    d = sys.argv[1]
    write_samples(d + "/data", X, vocab_size=V, eos_token_id=V - 1, fingerprint="toy")
    cfg = TrainConfig(data=d + "/data", out=d + "/run1", hidden_size=H, epochs=2,
                      batch_size=8, devices=1, plot=False, progress=False, init="random")
    runs = [[np.asarray(x) for x in train(cfg, log=lambda *a: None).params]]
    # B split over the vocabulary: mesh (data, model) = (2, 2) vs one device
    mres = {}
    for shape in ((2, 2),):
        eng = EM(make_mesh(4, model_shards=shape[1]))
        assert eng.num_devices == shape[0] and eng.model_shards == shape[1]
        p, hist = full_batch_em(p0, batches, iterations=3, pseudocount=1e-2, engine=eng)
        q = eng.replicate(F.to_token_major(p0))
        assert q.BT.sharding.spec[0] == "model"
        for k, (t, m) in enumerate(batches):
            q, _, ok = eng.minibatch_step(q, t, m, step_size(k), 1e-2)
            assert bool(ok)
        mres[shape] = (max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(p, res[1][0])),
                       max(abs(a - b) / abs(b) for a, b in zip(hist, res[1][1])),
                       max(float(np.abs(np.asarray(a) - b).max())
                           for a, b in zip(F.from_token_major(q), res[1][2])),
                       abs(eng.log_likelihood_sum(p, *batches[0]) - float(res[1][3].sum())))
    out["model_sharded"] = [list(v) for v in mres.values()]
    cfg = TrainConfig(data=d + "/data", out=d + "/run_ms", hidden_size=H, epochs=2, batch_size=8,
                      devices=4, model_shards=2, plot=False, progress=False, init="random")
    ms = [np.asarray(x) for x in train(cfg, log=lambda *a: None).params]
    out["train_model_sharded_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(ms, runs[0]))
    print("RESULT " + json.dumps(out))
""")


def test_sharded_equals_single_device(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
    env["JAX_PLATFORMS"] = "cpu"
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    # float32; only the summation order of the expected counts differs
    assert out["full_max_diff"] < 1e-5, out
    assert out["mb_max_diff"] < 1e-5, out
    assert out["ll_max_diff"] < 1e-4, out
    h1, h4 = out["hist"]
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(h1, h4)), out
    for full, hist_rel, mb, ll in out["model_sharded"]:  # vocabulary-sharded B == one device
        assert full < 1e-5 and hist_rel < 1e-5 and mb < 1e-5 and ll < 1e-3, out
    assert out["train_model_sharded_max_diff"] < 1e-5, out


def test_memory_estimate_and_refusal(tmp_path):
    from hmm_distill.em import check_memory, memory_estimate
    from hmm_distill.errors import MemoryEstimateError

    # H = 16384, V = 49152: B alone is 16384 * 49152 * 4 bytes = 3.0 GiB; 5 such tables
    est = memory_estimate(16384, 49152, 64, 128)
    assert est["tables"] == 5 * 16384 * 49152 * 4
    assert est["activations"] == 8 * 128 * 64 * 16384 * 4
    assert memory_estimate(16384, 49152, 64, 128, model_shards=8)["tables"] == est["tables"] // 8
    lines = []
    with pytest.raises(MemoryEstimateError, match=r"H=16384, V=49152.*needs about 23\.\d\d GiB.*over >= 8 devices"):
        check_memory(16384, 49152, 64, 128, limit_bytes=10 << 30, log=lines.append)
    assert "memory estimate per device" in lines[0]
    check_memory(16384, 49152, 64, 128, model_shards=8, limit_bytes=10 << 30, log=lines.append)
    # the training job refuses before allocating anything
    from hmm_distill.data import write_samples
    from hmm_distill.train import TrainConfig, train

    write_samples(tmp_path / "d", np.zeros((4, 8), np.int32), vocab_size=49152, eos_token_id=2,
                  fingerprint="fp")
    cfg = TrainConfig(data=str(tmp_path / "d"), out=str(tmp_path / "r"), hidden_size=4096, epochs=1,
                      memory_limit_gb=0.5, plot=False, progress=False, init="random")
    with pytest.raises(MemoryEstimateError, match="H=4096, V=49152"):
        train(cfg, log=lambda *a: None)
