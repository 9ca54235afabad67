"""The task HMM recipe end to end, on the smoke model (a random 2-layer Llama with the
default model's tokenizer and vocabulary): sampling with LM features, LVD, streaming EM;
the result is cached, identified by its checksum and found by jaxcd's ``task`` builder;
an interrupted build resumes from its sample shards."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest


def test_task_hmm_recipe_builds_caches_and_resumes(tmp_path, monkeypatch):
    from experiments.studies import smoke_model

    model = smoke_model()  # in the shared cache (built once from the default model's GGUF)
    monkeypatch.setenv("JAXCD_CACHE", str(tmp_path / "cache"))
    from hmm_distill import default as D
    from hmm_distill.errors import ConfigError

    st = dataclasses.replace(D.TASK_PROFILES["smoke"], prompt_set="builtin", num_seqs=48, shard_size=16)
    params, info = D.task_hmm(model, settings=st, progress=False, log=lambda *a: None)
    assert not info["cached"] and info["kind"] == "task"
    H, V = st.hidden_size, info["vocab_size"]
    assert np.asarray(params.B).shape == (H, V) and V == 49152
    np.testing.assert_allclose(np.asarray(params.B).sum(1), 1, rtol=1e-4)
    with open(info["path"], "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == info["checkpoint_sha256"]
    held = info["heldout"]
    assert held["gap_share"] == pytest.approx((held["heldout_ll"] - held["unigram_heldout_ll"])
                                              / (held["lm_heldout_ll"] - held["unigram_heldout_ll"]))
    root = D.task_hmm_dir(model, st)
    meta = json.loads((root / "samples" / "metadata.json").read_text())
    assert meta["features"] == st.features and len(meta["shards"]) == 3
    run_cfg = json.loads((root / "run" / "config.json").read_text())
    assert run_cfg["init"] == "lvd" and run_cfg["stream"] and run_cfg["token_dropout"] == st.token_dropout
    # cached: the same checkpoint, nothing rebuilt
    _, again = D.task_hmm(model, settings=st, progress=False, log=lambda *a: None)
    assert again["cached"] and again["checkpoint_sha256"] == info["checkpoint_sha256"]
    # an interrupted build (no final checkpoint) resumes: the sample shards are kept
    stamps = {p.name: p.stat().st_mtime_ns for p in (root / "samples").glob("shard_*.npy")}
    os.remove(root / "hmm.safetensors")
    _, resumed = D.task_hmm(model, settings=st, progress=False, log=lambda *a: None)
    assert not resumed["cached"]
    assert {p.name: p.stat().st_mtime_ns for p in (root / "samples").glob("shard_*.npy")} == stamps
    # another H is another HMM (another cache entry)
    assert D.task_hmm_dir(model, dataclasses.replace(st, hidden_size=8)) != root
    with pytest.raises(ConfigError, match="profile"):
        D.task_hmm(model, profile="huge")
    # jaxcd finds it through the "task" builder entry point
    from jaxcd.hmm import build_hmm

    p2, i2 = build_hmm("task", model, settings=st, progress=False, log=lambda *a: None)
    assert i2["cached"] and i2["checkpoint_sha256"] == resumed["checkpoint_sha256"]
