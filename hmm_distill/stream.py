"""The training job's data: the training and held-out sequences of a sample directory,
held in memory or streamed from its shards.

:class:`TrainData` splits the sequences of a sample directory into training and
held-out sets (:func:`heldout_split`: a seeded split of the global sequence indices, the
same in both modes), and serves what EM needs:

* the held-out sequences (in memory: they are a small share) and the LM's
  log-probabilities of them, when the samples carry them;
* the training tokens' statistics (token counts, sequences, transitions) for the prior
  and the unigram baseline, gathered in one pass;
* each epoch's batches (:meth:`TrainData.epoch_batches`).

``stream=False`` loads every shard at once (the order of batches is the historical one:
mini-batch EM permutes all training rows, full-batch EM sorts them by length).
``stream=True`` holds one shard at a time: mini-batch EM visits the shards in a seeded
order per epoch and permutes the rows inside each shard (a batch may span two shards);
full-batch EM reads the shards in order and sorts each by length. Shards are
memory-mapped, so a sample directory larger than the machine's memory trains with the
memory of one shard, the held-out set and the model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .data import load_features, load_logprobs, load_shard, read_metadata
from .em import pad_batch
from .errors import SampleDataError
from .priors import first_eos_mask


def heldout_split(n: int, frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices ``(train, heldout)`` of a seeded split of ``n`` sequences."""
    n_held = int(round(frac * n)) if frac > 0 else 0
    if frac > 0 and n >= 2:
        n_held = min(max(n_held, 1), n - 1)
    perm = np.random.default_rng([seed, 12345]).permutation(n)
    return perm[n_held:], perm[:n_held]


def trim_batch(tok: np.ndarray, msk: np.ndarray, bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop trailing all-masked columns, keeping a multiple of ``bucket`` (few shapes to
    compile). Exact: masked positions contribute nothing."""
    T = tok.shape[1]
    L = int(msk.sum(1).max()) if msk.size else 1
    L = min(T, max(bucket, -(-max(L, 1) // bucket) * bucket))
    return tok[:, :L], msk[:, :L]


class TrainData:
    """See the module docstring. ``mask_eos``: model each row up to its first EOS (the
    EOS padding after it is masked); ``max_seqs``: use only the first sequences."""

    def __init__(self, directory, *, heldout_frac: float, seed: int, max_seqs: int | None = None,
                 mask_eos: bool = True, stream: bool = False):
        self.path = Path(directory)
        self.meta = read_metadata(self.path)
        self.vocab_size = int(self.meta["vocab_size"])
        self.eos_token_id = int(self.meta["eos_token_id"])
        self.fingerprint = str(self.meta["vocab_fingerprint"])
        self.length = int(self.meta["length"])
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise SampleDataError(f"{self.path}/metadata.json: eos_token_id {self.eos_token_id} "
                                  f"outside the vocabulary (size {self.vocab_size})")
        self.stream = bool(stream)
        self._mask_eos = self.eos_token_id if mask_eos else None
        shards = self.meta["shards"]
        if not shards:
            raise SampleDataError(f"{self.path} has no complete shards (empty sample set)")
        # shard k holds global rows [start_k, start_k + n_k), truncated at max_seqs
        self.shards, start = [], 0
        for s in shards:
            n = int(s["num_seqs"])
            if max_seqs is not None:
                n = min(n, int(max_seqs) - start)
            if n <= 0:
                break
            self.shards.append((s, start, n))
            start += n
        self.num_seqs = start
        tr, ho = heldout_split(self.num_seqs, heldout_frac, seed)
        self.train_rows, self.heldout_rows = tr, ho
        if len(tr) == 0:
            raise SampleDataError(f"{self.path}: no training sequences left after the held-out split")
        self._is_train = np.zeros(self.num_seqs, bool)
        self._is_train[tr] = True
        self.has_logprobs = all(s.get("logprobs") for s, _, _ in self.shards)
        self._all = None
        if not self.stream:
            self._all = np.concatenate([self._shard_tokens(i) for i in range(len(self.shards))], 0)
        # held-out rows in their split order (as the in-memory job always had them)
        pos = np.full(self.num_seqs, -1, np.int64)
        pos[ho] = np.arange(len(ho))
        self.held_tok = np.zeros((len(ho), self.length), np.int32)
        self.held_lp = np.zeros((len(ho), self.length), np.float32) if self.has_logprobs else None
        for i, (s, lo, n) in enumerate(self.shards):
            rows = lo + np.flatnonzero(pos[lo:lo + n] >= 0)
            if len(rows) == 0:
                continue
            dst = pos[rows]
            self.held_tok[dst] = self._all[rows] if self._all is not None else self._shard_tokens(i)[rows - lo]
            if self.has_logprobs:
                self.held_lp[dst] = load_logprobs(self.path / s["logprobs"], (int(s["num_seqs"]), self.length))[rows - lo]
        self.held_msk = first_eos_mask(self.held_tok, self._mask_eos)
        # statistics of the training tokens (one pass)
        V = self.vocab_size
        self.token_counts = np.zeros(V, np.int64)
        self.num_train_tokens = self.num_train_seqs = self.num_train_transitions = 0
        for tok, msk in self._train_shards():
            lens = msk.sum(1)
            self.token_counts += np.bincount(tok[msk], minlength=V)
            self.num_train_tokens += int(lens.sum())
            self.num_train_seqs += int((lens > 0).sum())
            self.num_train_transitions += int(np.maximum(lens - 1, 0).sum())
        self.num_train = len(tr)

    # -- reading -----------------------------------------------------------------------------
    def _shard_tokens(self, i: int) -> np.ndarray:
        s, _, n = self.shards[i]
        arr = load_shard(self.path / s["file"], length=self.length, vocab_size=self.vocab_size,
                         num_seqs=s.get("num_seqs"))
        return arr[:n]

    def _train_part(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Global row indices and tokens of the training rows of shard ``i``."""
        _, lo, n = self.shards[i]
        rows = lo + np.flatnonzero(self._is_train[lo:lo + n])
        tok = self._all[rows] if self._all is not None else self._shard_tokens(i)[rows - lo]
        return rows, tok

    def _train_shards(self):
        for i in range(len(self.shards)):
            _, tok = self._train_part(i)
            yield tok, first_eos_mask(tok, self._mask_eos)

    def train_tokens(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The training rows (at most ``limit``, the first ones in split order when held in
        memory, the first shards' when streamed) and their masks."""
        if self._all is not None:
            rows = self.train_rows if limit is None else self.train_rows[:limit]
            tok = self._all[rows]
            return tok, first_eos_mask(tok, self._mask_eos)
        out, n = [], 0
        for tok, _ in self._train_shards():
            out.append(tok)
            n += len(tok)
            if limit is not None and n >= limit:
                break
        tok = np.concatenate(out)[:limit]
        return tok, first_eos_mask(tok, self._mask_eos)

    def feature_chunks(self):
        """For :func:`hmm_distill.lvd.lvd_init`: a callable giving ``(tokens, mask,
        features)`` of the training rows, shard by shard (features memory-mapped)."""
        missing = [s["file"] for s, _, _ in self.shards if not s.get("features")]
        if missing:
            raise SampleDataError(
                f"init 'lvd' needs token features, but {self.path} has shards without them "
                f"({missing[:3]}...): sample with `hmm-distill sample --features D`")

        def chunks():
            for i, (s, lo, n) in enumerate(self.shards):
                rows, tok = self._train_part(i)
                if len(rows) == 0:
                    continue
                feats = load_features(self.path / s["features"], (int(s["num_seqs"]), self.length))
                yield tok, first_eos_mask(tok, self._mask_eos), np.asarray(feats[rows - lo])
        return chunks

    # -- batches -----------------------------------------------------------------------------
    def num_batches(self, bs: int, full: bool) -> int:
        if not self.stream or not full:
            return -(-self.num_train // bs)
        return sum(-(-int(self._is_train[lo:lo + n].sum()) // bs) for _, lo, n in self.shards)

    def epoch_batches(self, epoch: int, bs: int, *, full: bool, bucket: int, seed: int,
                      dropout: float = 0.0):
        """The batches ``(tokens, mask)`` of one epoch, padded to ``bs`` rows and trimmed
        to a multiple of ``bucket`` columns. ``dropout``: each valid non-EOS token is
        replaced by ``-1`` (marginalised by the E-step) with this probability (seeded per
        epoch)."""
        drop_rng = np.random.default_rng([seed, epoch, 0xD0])

        def out(tok, msk):
            if dropout > 0:
                hit = msk & (tok != self.eos_token_id) & (drop_rng.random(tok.shape) < dropout)
                tok = np.where(hit, -1, tok)
            return trim_batch(*pad_batch(tok, msk, bs), bucket)

        if self._all is not None:
            tok_all, _ = self.train_tokens()
            msk_all = first_eos_mask(tok_all, self._mask_eos)
            if full:  # batches of similar lengths: trimming then saves the most
                order = np.argsort(msk_all.sum(1), kind="stable")
            else:
                order = np.random.default_rng([seed, epoch]).permutation(len(tok_all))
            for s in range(0, len(order), bs):
                rows = order[s:s + bs]
                yield out(tok_all[rows], msk_all[rows])
            return
        rng = np.random.default_rng([seed, epoch])
        shard_order = range(len(self.shards)) if full else rng.permutation(len(self.shards))
        buf_t, buf_m = [], []
        for i in shard_order:
            _, tok = self._train_part(int(i))
            if len(tok) == 0:
                continue
            msk = first_eos_mask(tok, self._mask_eos)
            if full:
                order = np.argsort(msk.sum(1), kind="stable")
                for s in range(0, len(order), bs):
                    rows = order[s:s + bs]
                    yield out(tok[rows], msk[rows])
                continue
            perm = rng.permutation(len(tok))
            buf_t.append(tok[perm])
            buf_m.append(msk[perm])
            t, m = np.concatenate(buf_t), np.concatenate(buf_m)
            k = (len(t) // bs) * bs
            for s in range(0, k, bs):
                yield out(t[s:s + bs], m[s:s + bs])
            buf_t, buf_m = [t[k:]], [m[k:]]
        if not full and buf_t and len(buf_t[0]):
            yield out(buf_t[0], buf_m[0])
