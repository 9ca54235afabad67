"""hmm_distill I/O: checkpoints (round trip, refusal of another model), training resume,
bad sample files, the CLI."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from hmm_distill import hmm as F
from hmm_distill.checkpoint import load_checkpoint, save_checkpoint
from hmm_distill.cli import main
from hmm_distill.data import load_samples, write_samples
from hmm_distill.errors import (CheckpointError, CheckpointMismatchError, ConfigError, SampleDataError,
                                VocabularyMismatchError)
from hmm_distill.train import TrainConfig, train

V, T, H = 24, 12, 5
# Resumed == uninterrupted: bit-for-bit up to float32 rounding on CPU. On GPUs the
# emission scatter-add uses atomics, so float32 sums are order-dependent from run to run.
RESUME_ATOL = 1e-7 if jax.default_backend() == "cpu" else 1e-5


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("samples")
    true = F.random_params(jax.random.key(7), 3, V, noise=2.0)
    X, _ = F.sample(true, jax.random.key(8), 120, T)
    write_samples(d, np.asarray(X), vocab_size=V, eos_token_id=V - 1, fingerprint="toy-A",
                  shard_size=50)
    return d


def _cfg(data, out, **kw):
    base = dict(data=str(data), out=str(out), hidden_size=H, epochs=3, batch_size=16,
                plot=False, progress=False)
    base.update(kw)
    return TrainConfig(**base)


def test_checkpoint_roundtrip_and_refusal(tmp_path):
    p = F.random_params(jax.random.key(0), H, V)
    key = np.asarray(jax.random.key_data(jax.random.key(3)))
    path = save_checkpoint(tmp_path / "c.safetensors", p, fingerprint="fp-1", eos_token_id=V - 1,
                           epoch=4, step=17, rng_key=key, config={"hidden_size": H}, extra={"a": 1})
    ck = load_checkpoint(path, expect_vocab_size=V, expect_fingerprint="fp-1", expect_hidden_size=H)
    for a, b in zip(ck.params, p):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert (ck.epoch, ck.step, ck.eos_token_id, ck.fingerprint) == (4, 17, V - 1, "fp-1")
    np.testing.assert_array_equal(ck.rng_key, key)
    assert ck.config == {"hidden_size": H} and ck.extra == {"a": 1}
    with pytest.raises(VocabularyMismatchError, match=r"vocabulary size 24, expected 49152") as e:
        load_checkpoint(path, expect_vocab_size=49152)
    assert isinstance(e.value, ValueError) and "c.safetensors" in str(e.value)
    with pytest.raises(VocabularyMismatchError, match="fp-2"):
        load_checkpoint(path, expect_fingerprint="fp-2")
    with pytest.raises(CheckpointMismatchError, match="hidden size 5, expected 7"):
        load_checkpoint(path, expect_hidden_size=7)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="junk.safetensors"):
        load_checkpoint(junk)
    from safetensors.numpy import save_file

    other = tmp_path / "other.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, str(other))
    with pytest.raises(CheckpointError, match="not an hmm_distill checkpoint"):
        load_checkpoint(other)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("mode", ["minibatch", "full"])
def test_resume_reproduces_uninterrupted_run(data_dir, tmp_path, mode):
    full = train(_cfg(data_dir, tmp_path / "a", mode=mode), log=lambda *a: None)
    # "interrupted" after epoch 1, then resumed to 3
    train(_cfg(data_dir, tmp_path / "b", mode=mode, epochs=1), log=lambda *a: None)
    msgs = []
    resumed = train(_cfg(data_dir, tmp_path / "b", mode=mode), log=msgs.append)
    assert any("resuming" in m and "epoch 1" in m for m in msgs)
    for a, b in zip(full.params, resumed.params):
        np.testing.assert_allclose(a, b, rtol=0, atol=RESUME_ATOL)
    lines = [json.loads(s) for s in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [0, 1, 2, 3]
    assert lines[-1]["heldout_ll"] > lines[0]["heldout_ll"]  # EM improves held-out LL
    assert lines[-1]["heldout_ll"] > lines[-1]["unigram_heldout_ll"]
    ck = load_checkpoint(tmp_path / "b" / "hmm.safetensors", expect_vocab_size=V,
                         expect_fingerprint="toy-A")
    assert ck.epoch == 3 and ck.config["mode"] == mode
    F.validate_params(F.as_params(*ck.params))
    # the last epoch checkpoint holds the same parameters as the final file
    last = load_checkpoint(tmp_path / "b" / "ckpt_epoch0003.safetensors")
    for a, b in zip(last.params, ck.params):
        np.testing.assert_array_equal(a, b)


def test_training_curve_png_iff_matplotlib(data_dir, tmp_path):
    """The PNG curve is drawn when the optional matplotlib is installed, and its absence
    is not an error; the JSON metrics log is always written."""
    import importlib.util

    train(_cfg(data_dir, tmp_path / "p", epochs=2, plot=True), log=lambda *a: None)
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    png = tmp_path / "p" / "training_curve.png"
    assert png.exists() == has_mpl
    if has_mpl:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = [json.loads(s) for s in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [0, 1, 2]
    assert all(m["unigram_heldout_ll"] == lines[0]["unigram_heldout_ll"] for m in lines)


def test_crash_mid_run_loses_no_completed_epoch(data_dir, tmp_path, monkeypatch):
    """A crash while epoch 2's checkpoint is being written (its metrics line is already
    in metrics.jsonl): the resumed run restarts epoch 2 from the epoch-1 checkpoint, drops
    the stale metrics line and ends with the parameters of an uninterrupted run."""
    import hmm_distill.train as tr

    full = train(_cfg(data_dir, tmp_path / "a"), log=lambda *a: None)
    real_save = tr.save_checkpoint

    def crashing_save(path, *a, epoch, **kw):
        if epoch == 2:
            (tmp_path / "b" / "ckpt_epoch0002.safetensors.tmp").write_bytes(b"half-written")
            raise KeyboardInterrupt("simulated crash")
        return real_save(path, *a, epoch=epoch, **kw)

    monkeypatch.setattr(tr, "save_checkpoint", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(data_dir, tmp_path / "b"), log=lambda *a: None)
    monkeypatch.setattr(tr, "save_checkpoint", real_save)
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(s)["epoch"] for s in lines] == [0, 1, 2]  # stale epoch-2 line
    resumed = train(_cfg(data_dir, tmp_path / "b"), log=lambda *a: None)
    for a, b in zip(full.params, resumed.params):
        np.testing.assert_allclose(a, b, rtol=0, atol=RESUME_ATOL)
    lines = [json.loads(s) for s in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in lines] == [0, 1, 2, 3]


def test_resume_refuses_other_model(data_dir, tmp_path):
    train(_cfg(data_dir, tmp_path / "r", epochs=1), log=lambda *a: None)
    with pytest.raises(CheckpointMismatchError, match="hidden size"):
        train(_cfg(data_dir, tmp_path / "r", hidden_size=H + 1), log=lambda *a: None)
    with pytest.raises(CheckpointMismatchError, match="pseudocount|batch_size"):
        train(_cfg(data_dir, tmp_path / "r", batch_size=8), log=lambda *a: None)
    # same shapes, other vocabulary identity
    other = tmp_path / "other_vocab"
    X = load_samples(data_dir).tokens
    write_samples(other, X, vocab_size=V, eos_token_id=V - 1, fingerprint="toy-B")
    with pytest.raises(VocabularyMismatchError, match="toy-A"):
        train(_cfg(other, tmp_path / "r"), log=lambda *a: None)


def test_bad_sample_inputs(tmp_path):
    with pytest.raises(SampleDataError, match="not found"):
        load_samples(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SampleDataError, match="no metadata.json"):
        load_samples(tmp_path / "empty")
    d = write_samples(tmp_path / "ok", np.zeros((4, 6), np.int32), vocab_size=10, eos_token_id=9,
                      fingerprint="f")
    meta = json.loads((d / "metadata.json").read_text())
    with pytest.raises(VocabularyMismatchError, match="vocabulary size 10, expected 11"):
        load_samples(d, expect_vocab_size=11)
    with pytest.raises(VocabularyMismatchError, match="'f'"):
        load_samples(d, expect_fingerprint="g")
    # no complete shards
    (d / "metadata.json").write_text(json.dumps({**meta, "shards": []}))
    with pytest.raises(SampleDataError, match="no complete shards"):
        load_samples(d)
    # wrong sequence length
    np.save(d / "shard_00000.npy", np.zeros((4, 5), np.int32))
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SampleDataError, match=r"shard_00000.npy has sequences of length 5"):
        load_samples(d)
    # token ids outside the vocabulary
    np.save(d / "shard_00000.npy", np.full((4, 6), 12, np.int32))
    with pytest.raises(VocabularyMismatchError, match="outside the vocabulary"):
        load_samples(d)
    # empty / corrupt shard files
    np.save(d / "shard_00000.npy", np.zeros((0, 6), np.int32))
    with pytest.raises(SampleDataError, match="non-empty"):
        load_samples(d)
    (d / "shard_00000.npy").write_bytes(b"garbage")
    with pytest.raises(SampleDataError, match="cannot read shard"):
        load_samples(d)
    np.save(d / "shard_00000.npy", np.zeros((4, 6), np.float32))
    with pytest.raises(SampleDataError, match="dtype float32"):
        load_samples(d)
    (d / "metadata.json").write_text("{not json")
    with pytest.raises(SampleDataError, match="not valid JSON"):
        load_samples(d)


def test_cli_train_eval_and_errors(data_dir, tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"hidden_size": 4, "epochs": 1, "batch_size": 32, "init": "random"}))
    run = tmp_path / "run"
    rc = main(["train", "--config", str(cfg), "--data", str(data_dir), "--out", str(run),
               "--epochs", "2", "--no-plot", "--no-progress"])
    assert rc == 0
    ck = load_checkpoint(run / "hmm.safetensors")
    assert ck.hidden_size == 4 and ck.epoch == 2 and ck.config["init"] == "random"
    assert main(["eval", "--ckpt", str(run / "hmm.safetensors"), "--data", str(data_dir)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # eval counts each row up to and including its first EOS, as training does: numpy forward
    pi, A, B = (np.asarray(x, np.float64) for x in ck.params)
    tot, n = 0.0, 0
    for row in load_samples(data_dir).tokens:
        L = list(row).index(V - 1) + 1 if (V - 1) in row else T
        a = pi * B[:, row[0]]
        for x in row[1:L]:
            tot += np.log(a.sum())
            a = (a / a.sum()) @ A * B[:, x]
        tot += np.log(a.sum())
        n += L
    assert out["num_tokens"] == n < 120 * T and out["ll_per_token"] == pytest.approx(tot / n, rel=1e-5)
    # user errors: one line, exit status 2
    assert main(["train", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "sample directory not found" in capsys.readouterr().err
    assert main(["train", "--data", str(data_dir), "--out", str(tmp_path / "y"),
                 "--mode", "bogus"]) == 2
    assert "mode must be" in capsys.readouterr().err
    assert main(["info", "--ckpt", str(tmp_path / "cfg.json")]) == 2
    assert "cfg.json" in capsys.readouterr().err


def test_docs_quickstart_runs(tmp_path, monkeypatch, capsys):
    """The quick-start commands and the Python snippet of docs/hmm_distill.md run as written."""
    import re
    import shlex
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "hmm_distill.md").read_text()
    block = doc.split("<!-- quickstart -->")[1].split("<!-- /quickstart -->")[0]
    cmds = [ln for ln in block.splitlines() if ln.startswith("hmm-distill ")]
    assert len(cmds) == 4
    monkeypatch.chdir(tmp_path)
    for cmd in cmds:
        assert main(shlex.split(cmd)[1:]) == 0, cmd
    cfg = json.loads((tmp_path / "runs/toy/config.json").read_text())
    assert cfg["hidden_size"] == 16 and cfg["epochs"] == 3
    assert (tmp_path / "runs/toy/metrics.jsonl").read_text().count("\n") == 4  # epochs 0..3
    snippet = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    scope: dict = {}
    exec(compile(snippet, "docs/hmm_distill.md", "exec"), scope)
    assert scope["hmm"].hidden_size == 16 and scope["hmm"].vocab_size == 64


def test_early_stopping_keeps_best_heldout_epoch(tmp_path):
    """patience=p: training stops p epochs after the best held-out log-likelihood and the
    result is that epoch's parameters, i.e. the checkpoint an uninterrupted run wrote at
    that epoch; a resumed run finds the best epoch again (best.safetensors)."""
    from hmm_distill.lms import load_lm
    from hmm_distill.sampler import run_sampling

    toy = load_lm("toy:32:0")
    data = tmp_path / "s"
    run_sampling(toy.lm, toy.params, data, num_seqs=60, length=12, shard_size=60, batch_size=60, seed=0,
                 progress=False, fingerprint=toy.fingerprint)
    kw = dict(data=str(data), hidden_size=16, mode="full", prior_strength=0.01, init="random",
              heldout_frac=0.3, plot=False, progress=False)
    quiet = dict(log=lambda *a: None)
    full = train(TrainConfig(out=str(tmp_path / "full"), epochs=14, keep_checkpoints=0, **kw), **quiet)
    held = [m["heldout_ll"] for m in full.metrics]
    best = int(np.argmax(held))
    assert 0 < best < 14 - 3 and held[-1] < held[best]  # this data overfits: held-out peaks early
    es = train(TrainConfig(out=str(tmp_path / "es"), epochs=14, patience=3, **kw), **quiet)
    assert [m["epoch"] for m in es.metrics][-1] == best + 3 and es.best["epoch"] == best
    ref = load_checkpoint(tmp_path / "full" / f"ckpt_epoch{best:04d}.safetensors").params
    got = load_checkpoint(tmp_path / "es" / "hmm.safetensors")
    assert got.epoch == best and got.extra["metrics"]["heldout_ll"] == pytest.approx(held[best])
    for a, b in zip(got.params, ref):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # resume: a run without early stopping past the best epoch, then resumed with patience
    train(TrainConfig(out=str(tmp_path / "r"), epochs=best + 3, keep_checkpoints=1, patience=100, **kw), **quiet)
    res = train(TrainConfig(out=str(tmp_path / "r"), epochs=14, patience=3, **kw), **quiet)
    assert res.metrics[-1]["epoch"] == best + 3 and res.best["epoch"] == best
    for a, b in zip(load_checkpoint(tmp_path / "r" / "hmm.safetensors").params, ref):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # resumed AT the best epoch and no later epoch beats it: the result is still the
    # best epoch's parameters (not the last epoch's under the best epoch's label)
    train(TrainConfig(out=str(tmp_path / "r2"), epochs=best, keep_checkpoints=1, **kw), **quiet)
    res2 = train(TrainConfig(out=str(tmp_path / "r2"), epochs=14, patience=3, **kw), **quiet)
    assert res2.metrics[-1]["epoch"] == best + 3 and res2.best["epoch"] == best
    got2 = load_checkpoint(tmp_path / "r2" / "hmm.safetensors")
    assert got2.epoch == best
    for a, b in zip(got2.params, ref):
        np.testing.assert_allclose(a, b, atol=1e-6)
    with pytest.raises(ConfigError, match="held-out"):
        train(TrainConfig(out=str(tmp_path / "x"), epochs=2, patience=2, **{**kw, "heldout_frac": 0}), **quiet)
