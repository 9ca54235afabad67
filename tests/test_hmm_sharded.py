"""Data-parallel EM: 4 forced host devices give the same parameters as one device.

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
    p0 = F.random_params(jax.random.key(0), H, V)
    batches = [pad_batch(X[:16], None, 16), pad_batch(X[16:], None, 16)]  # 2nd has 2 masked rows
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
    # the training job on 4 devices vs 1 device
    d = sys.argv[1]
    write_samples(d + "/data", X, vocab_size=V, eos_token_id=V - 1, fingerprint="toy")
    runs = []
    for D in (1, 4):
        cfg = TrainConfig(data=d + "/data", out=d + f"/run{D}", hidden_size=H, epochs=2,
                          batch_size=8, devices=D, plot=False, progress=False, init="random")
        runs.append([np.asarray(x) for x in train(cfg, log=lambda *a: None).params])
    out["train_max_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(*runs))
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
    assert out["train_max_diff"] < 1e-5, out
    h1, h4 = out["hist"]
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(h1, h4)), out
