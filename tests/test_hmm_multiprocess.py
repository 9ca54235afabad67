"""Several processes (jax.distributed, gloo collectives on CPU): two local processes
give the same checkpoint as one process (full-batch and mini-batch EM), sample the
same shards, and a run whose process was killed resumes to the uninterrupted result.

Each process is a ``python -m hmm_distill ... --coordinator 127.0.0.1:PORT`` subprocess
on a free port; the single-process references run in this process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hmm_distill.checkpoint import load_checkpoint
from hmm_distill.data import load_samples, write_samples
from hmm_distill.lms import load_lm
from hmm_distill.sampler import run_sampling
from hmm_distill.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
V, T, H = 24, 12, 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None):
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # one CPU device per process (the suite's other XLA flags kept)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "force_host_platform_device_count" not in f)
    env.update(extra or {})
    return env


def _launch(args, n=2, env_for=None):
    port = _free_port()
    procs = []
    for i in range(n):
        cmd = [sys.executable, "-m", "hmm_distill", *args, "--coordinator", f"127.0.0.1:{port}",
               "--num-processes", str(n), "--process-id", str(i)]
        procs.append(subprocess.Popen(cmd, env=_env(env_for(i) if env_for else None), cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _wait(procs, timeout=240):
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out)
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    return outs


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mp") / "data"
    from test_hmm_priors import _np_random_params, np_hmm_sample  # numpy: no JAX compilation

    true = _np_random_params(np.random.default_rng(7), 3, V, 2.0)
    X = np_hmm_sample(*true, 122, T, 8)
    write_samples(d, X, vocab_size=V, eos_token_id=V - 1, fingerprint="toy-A", shard_size=50)
    return d


def _train_args(data, out, mode, epochs):
    return ["train", "--data", str(data), "--out", str(out), "--hidden-size", str(H), "--epochs",
            str(epochs), "--batch-size", "16", "--mode", mode, "--no-progress", "--no-plot"]


def _reference(data, out, mode, epochs):
    cfg = TrainConfig(data=str(data), out=str(out), hidden_size=H, epochs=epochs, batch_size=16, mode=mode,
                      plot=False, progress=False)
    return [np.asarray(x) for x in train(cfg, log=lambda *a: None).params]


def _maxdiff(a, b):
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b))


@pytest.mark.slow
def test_two_processes_equal_one(data_dir, tmp_path):
    """Full-batch and mini-batch EM (batch 16 = 8 rows per process; the last batch is
    padded) run as two processes at once; each checkpoint equals the single-process one."""
    runs = {m: _launch(_train_args(data_dir, tmp_path / f"mp_{m}", m, 3)) for m in ("full", "minibatch")}
    outs = {m: _wait(p) for m, p in runs.items()}
    for mode in ("full", "minibatch"):
        ref = _reference(data_dir, tmp_path / f"sp_{mode}", mode, 3)
        ck = load_checkpoint(tmp_path / f"mp_{mode}" / "hmm.safetensors")
        assert ck.extra["processes"] == 2
        assert _maxdiff(ck.params, ref) <= 1e-5, mode
        # process 0 alone writes (and reports)
        assert "done:" in outs[mode][0] and "done:" not in outs[mode][1]
        lines = (tmp_path / f"mp_{mode}" / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 4  # epochs 0..3, written once


@pytest.mark.slow
def test_resume_after_a_killed_process(data_dir, tmp_path):
    """Process 1 is SIGKILLed right after epoch 2 (process 0 then blocks in the next
    collective and is killed too). Relaunching the same command resumes from epoch 2 and
    ends at the parameters of an uninterrupted single-process run."""
    out = tmp_path / "run"
    args = _train_args(data_dir, out, "full", 4)
    procs = _launch(args, env_for=lambda i: {"HMM_DISTILL_TEST_KILL_AFTER_EPOCH": "2"} if i == 1 else {})
    procs[1].wait(timeout=240)
    assert procs[1].returncode == -9
    t0 = time.time()
    while not (out / "ckpt_epoch0002.safetensors").exists() and time.time() - t0 < 30:
        time.sleep(0.2)
    procs[0].kill()
    procs[0].communicate()
    assert not (out / "hmm.safetensors").exists()
    assert (out / "ckpt_epoch0002.safetensors").exists()
    outs = _wait(_launch(args))
    assert "resuming from" in outs[0] and "epoch 2" in outs[0]
    ref = _reference(data_dir, tmp_path / "ref", "full", 4)
    assert _maxdiff(load_checkpoint(out / "hmm.safetensors").params, ref) <= 1e-5


def test_two_processes_sample_the_same_shards(tmp_path):
    args = ["sample", "--lm", "toy:32:3", "--out", str(tmp_path / "mp"), "--num-seqs", "50", "--length", "9",
            "--shard-size", "12", "--batch-size", "8", "--no-progress"]
    _wait(_launch(args))
    loaded = load_lm("toy:32:3")
    run_sampling(loaded.lm, loaded.params, tmp_path / "sp", num_seqs=50, length=9, shard_size=12,
                 batch_size=8, model_name=loaded.name, fingerprint=loaded.fingerprint, progress=False)
    a, b = load_samples(tmp_path / "mp"), load_samples(tmp_path / "sp")
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert len(a.meta["shards"]) == 5 and a.meta["complete"]
    assert a.meta["eos_fraction"] == b.meta["eos_fraction"]
