"""Streaming the training data from shards (hmm_distill.stream) and token dropout.

References: the in-memory job (full-batch EM sums the same expected counts, only in
another order), the multiset of training rows (every epoch visits each exactly once),
and the binomial law of the dropout draws."""

from __future__ import annotations

import numpy as np
import pytest

from hmm_distill.data import write_samples
from hmm_distill.errors import ConfigError
from hmm_distill.stream import TrainData
from hmm_distill.train import TrainConfig, train

V, EOS, T = 30, 29, 12


def _data(tmp_path, n=300, shard=64):
    rng = np.random.default_rng(0)
    X = rng.integers(0, V - 1, size=(n, T))
    ends = rng.integers(2, T + 3, size=n)  # some rows never end (cut off)
    for i, e in enumerate(ends):
        X[i, e:] = EOS
    d = tmp_path / "s"
    write_samples(d, X, vocab_size=V, eos_token_id=EOS, fingerprint="toy", shard_size=shard)
    return d, X


@pytest.mark.parametrize("full", [True, False])
def test_streamed_epochs_visit_every_training_row_once(tmp_path, full):
    d, X = _data(tmp_path)
    mem = TrainData(d, heldout_frac=0.1, seed=3, stream=False)
    st = TrainData(d, heldout_frac=0.1, seed=3, stream=True)
    assert st._all is None
    np.testing.assert_array_equal(st.held_tok, mem.held_tok)
    np.testing.assert_array_equal(st.token_counts, mem.token_counts)
    assert (st.num_train_tokens, st.num_train_seqs, st.num_train_transitions) == \
        (mem.num_train_tokens, mem.num_train_seqs, mem.num_train_transitions)
    want = sorted(map(tuple, X[mem.train_rows]))
    for epoch in range(2):
        rows = []
        for tok, msk in st.epoch_batches(epoch, 32, full=full, bucket=4, seed=3):
            assert tok.shape[0] == 32 and tok.shape[1] % 4 == 0
            for t, m in zip(tok, msk):
                if m.any():
                    r = np.full(T, EOS)
                    r[:m.sum()] = t[m]
                    rows.append(tuple(r))
        assert sorted(rows) == want
    assert st.num_batches(32, full) >= mem.num_batches(32, full)


def test_streamed_full_batch_em_equals_the_in_memory_job(tmp_path):
    d, _ = _data(tmp_path)
    kw = dict(data=str(d), hidden_size=5, epochs=3, mode="full", batch_size=32, plot=False, progress=False)
    a = train(TrainConfig(out=str(tmp_path / "a"), **kw), log=lambda *x: None)
    b = train(TrainConfig(out=str(tmp_path / "b"), stream=True, **kw), log=lambda *x: None)
    for x, y in zip(a.params, b.params):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-5)
    for ma, mb in zip(a.metrics, b.metrics):
        assert ma["heldout_ll"] == pytest.approx(mb["heldout_ll"], abs=1e-4)
    # streamed mini-batch EM runs and improves on its start
    c = train(TrainConfig(out=str(tmp_path / "c"), stream=True, step_schedule="cosine",
                          **{**kw, "mode": "minibatch"}),
              log=lambda *x: None)
    assert c.metrics[-1]["heldout_ll"] > c.metrics[0]["heldout_ll"]


def test_token_dropout_draws(tmp_path):
    d, _ = _data(tmp_path, n=2000, shard=500)
    st = TrainData(d, heldout_frac=0.1, seed=0, stream=True)
    p = 0.2
    dropped = eligible = 0
    plain = st.epoch_batches(0, 128, full=False, bucket=1, seed=0)
    for (tok, msk), (ref, rmsk) in zip(st.epoch_batches(0, 128, full=False, bucket=1, seed=0, dropout=p), plain):
        np.testing.assert_array_equal(msk, rmsk)
        hit = tok < 0
        np.testing.assert_array_equal(tok[~hit], ref[~hit])  # only the dropped positions change
        assert not (hit & ~msk).any()                         # padding and masked positions untouched
        assert not (ref[hit] == EOS).any()                    # EOS is never dropped
        dropped += int(hit.sum())
        eligible += int((msk & (ref != EOS)).sum())
    # binomial: 5 standard deviations
    assert abs(dropped / eligible - p) < 5 * np.sqrt(p * (1 - p) / eligible)
    with pytest.raises(ConfigError, match="token_dropout"):
        TrainConfig(data=str(d), token_dropout=1.0).validate()
    res = train(TrainConfig(data=str(d), out=str(tmp_path / "r"), hidden_size=4, epochs=2, token_dropout=0.05,
                            plot=False, progress=False), log=lambda *x: None)
    assert np.isfinite(res.metrics[-1]["heldout_ll"])


def test_step_schedules():
    from hmm_distill.em import step_schedule, step_size

    p = step_schedule("power", 100, k0=2.0, kappa=0.7)
    assert [p(k) for k in range(5)] == [step_size(k, 2.0, 0.7) for k in range(5)]
    c = step_schedule("cosine", 100, final=0.05)
    assert c(0) == pytest.approx(1.0) and c(100) == pytest.approx(0.05)
    assert c(50) == pytest.approx(0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * 0.5)))
    lin = step_schedule("linear", 10, final=0.1)
    assert lin(5) == pytest.approx(0.55) and lin(20) == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="schedule"):
        step_schedule("exp", 10)
