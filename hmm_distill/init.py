r"""Initialisations for EM.

* ``random``: no data. ``π, A_h, B_h ∝ exp(σ·N(0,1))`` (:func:`hmm_distill.hmm.random_params`).
* ``cluster`` (data-driven, "bigram clustering"): a class-bigram model used as an
  HMM whose states are token clusters (Brown-clustering style):

  1. token counts ``c_v`` and bigram counts over the training data (EOS padding
     included, so EOS and the "end" context are clustered too);
  2. each seen token ``v`` gets a context feature: its right-context distribution
     ``p(x_{t+1} | x_t = v)`` and left-context distribution ``p(x_{t-1} | x_t = v)``
     restricted to the ``K`` most frequent tokens plus one "other" bucket and one
     "boundary" bucket; square-rooted (Hellinger geometry);
  3. frequency-weighted k-means (k-means++ seeding, Lloyd iterations) into
     ``k = min(H, #seen tokens)`` clusters ``z(v)``; if ``k < H`` the remaining
     states are copies of the largest clusters (the noise below separates them);
  4. ``B_h ∝ (1 - ε) c_v [z(v) = h] / Σ_{z(v')=h} c_{v'} + ε p_unigram(v)`` with the
     add-one unigram ``p_unigram(v) = (c_v + 1) / (Σ c + V)``, so tokens never seen in
     the training data keep a small positive probability (a held-out sequence is never
     impossible under the initial model),
     ``A_{h,h'} ∝ #(z(x_t)=h, z(x_{t+1})=h') + 1``, ``π_h ∝ #(z(x_1) = h) + 1``,
     each multiplied by ``exp(σ·N(0,1))`` noise and renormalised.

  The initial log-likelihood is (close to) that of the class-bigram model, far
  above a random HMM's, and EM then refines the soft assignment.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import hmm as F
from .errors import ConfigError, SampleDataError
from .hmm import HMMParams


def random_init(key, hidden_size: int, vocab_size: int, *, noise: float = 1.0,
                dtype=jnp.float32) -> HMMParams:
    """Data-free random initialisation."""
    return F.random_params(key, hidden_size, vocab_size, noise=noise, dtype=dtype)


def _kmeans(X: np.ndarray, w: np.ndarray, k: int, rng: np.random.Generator,
            iters: int = 25, chunk: int = 8192) -> np.ndarray:
    """Weighted k-means (k-means++ seeding). ``X [n, d]``, weights ``w [n]``. Returns labels."""
    n = X.shape[0]
    x2 = np.einsum("nd,nd->n", X, X)

    def assign(C):
        c2 = np.einsum("kd,kd->k", C, C)
        lab = np.empty(n, np.int64)
        dist = np.empty(n, X.dtype)
        for s in range(0, n, chunk):
            d = x2[s:s + chunk, None] - 2 * X[s:s + chunk] @ C.T + c2[None]
            lab[s:s + chunk] = d.argmin(1)
            dist[s:s + chunk] = np.maximum(d[np.arange(d.shape[0]), lab[s:s + chunk]], 0)
        return lab, dist

    # k-means++ seeding, weighted (batched: draw centres one by one, O(n k d))
    centres = [X[rng.choice(n, p=w / w.sum())]]
    d_min = np.maximum(x2 - 2 * X @ centres[0] + centres[0] @ centres[0], 0)
    for _ in range(1, k):
        p = w * d_min
        s = p.sum()
        i = rng.choice(n, p=p / s) if s > 0 else rng.choice(n)
        centres.append(X[i])
        d_min = np.minimum(d_min, np.maximum(x2 - 2 * X @ X[i] + X[i] @ X[i], 0))
    C = np.stack(centres)
    lab = None
    for _ in range(iters):
        new_lab, dist = assign(C)
        if lab is not None and np.array_equal(new_lab, lab):
            break
        lab = new_lab
        sums = np.zeros_like(C)
        np.add.at(sums, lab, X * w[:, None])
        wt = np.bincount(lab, weights=w, minlength=k)
        empty = wt <= 0
        C = np.where(empty[:, None], C, sums / np.where(empty, 1, wt)[:, None])
        if empty.any():  # re-seed empty clusters at the worst-fit points
            far = np.argsort(-dist * w)[: int(empty.sum())]
            C[empty] = X[far]
    return lab


def cluster_init(tokens: np.ndarray, hidden_size: int, vocab_size: int, *, seed: int = 0,
                 noise: float = 0.1, num_context: int = 256, smoothing: float = 0.05,
                 dtype=jnp.float32) -> HMMParams:
    """Data-driven initialisation by bigram-context clustering (see module docstring).

    Args:
      tokens: int ``[N, T]`` training sequences.
      num_context: ``K``, the number of most frequent tokens used as context features.
      smoothing: ``ε``, the unigram mass mixed into every emission row.
      noise: log-scale noise ``σ`` (breaks ties between duplicated states).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.size == 0:
        raise SampleDataError(f"cluster_init needs non-empty [N, T] tokens, got shape {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise SampleDataError(f"cluster_init: token ids outside [0, {vocab_size})")
    if not 0 <= smoothing < 1:
        raise ConfigError(f"smoothing must be in [0, 1), got {smoothing}")
    H, V = hidden_size, vocab_size
    rng = np.random.default_rng(seed)
    counts = np.bincount(tokens.ravel(), minlength=V).astype(np.float64)
    seen = np.nonzero(counts)[0]
    K = min(num_context, len(seen))
    top = seen[np.argsort(-counts[seen], kind="stable")[:K]]
    col = np.full(V, K, np.int64)  # "other" bucket = K
    col[top] = np.arange(K)
    ctx = K + 2  # + other + boundary
    idx = np.full(V, -1, np.int64)
    idx[seen] = np.arange(len(seen))
    n = len(seen)
    right = np.zeros((n, ctx))
    left = np.zeros((n, ctx))
    cur, nxt = tokens[:, :-1].ravel(), tokens[:, 1:].ravel()
    np.add.at(right, (idx[cur], col[nxt]), 1.0)
    np.add.at(left, (idx[nxt], col[cur]), 1.0)
    np.add.at(right, (idx[tokens[:, -1]], K + 1), 1.0)  # sequence boundary
    np.add.at(left, (idx[tokens[:, 0]], K + 1), 1.0)
    feats = np.concatenate([
        np.sqrt(right / np.maximum(right.sum(1, keepdims=True), 1)),
        np.sqrt(left / np.maximum(left.sum(1, keepdims=True), 1)),
    ], 1).astype(np.float32)
    k = min(H, n)
    lab = _kmeans(feats, counts[seen], k, rng) if k > 1 else np.zeros(n, np.int64)
    # states beyond k copy the heaviest clusters
    weight = np.bincount(lab, weights=counts[seen], minlength=k)
    extra = [int(c) for c in np.argsort(-weight, kind="stable")]
    state_of_cluster = [[c] for c in range(k)]
    copies = np.arange(k).tolist()
    for j in range(H - k):
        c = extra[j % k]
        state_of_cluster[c].append(k + j)
        copies.append(c)
    copies = np.asarray(copies)  # state -> cluster
    z = np.full(V, -1, np.int64)
    z[seen] = lab
    # emissions
    unigram = (counts + 1.0) / (counts.sum() + V)  # add-one: unseen tokens stay possible
    Bc = np.zeros((k, V))
    Bc[lab, seen] = counts[seen]
    Bc /= np.maximum(Bc.sum(1, keepdims=True), 1e-300)
    B = (1 - smoothing) * Bc[copies] + smoothing * unigram[None]
    # transitions between clusters, expanded to states (split evenly among copies)
    Ac = np.zeros((k, k))
    np.add.at(Ac, (z[cur], z[nxt]), 1.0)
    pic = np.bincount(z[tokens[:, 0]], minlength=k).astype(np.float64)
    ncopy = np.bincount(copies, minlength=k).astype(np.float64)
    A = (Ac[copies][:, copies] / ncopy[copies][None]) + 1.0
    pi = pic[copies] / ncopy[copies] + 1.0
    jitter = lambda x: x * np.exp(noise * rng.standard_normal(x.shape))
    pi, A, B = jitter(pi), jitter(A), jitter(B)
    pi /= pi.sum()
    A /= A.sum(1, keepdims=True)
    B /= B.sum(1, keepdims=True)
    return F.as_params(pi, A, B, dtype=dtype)


def initialise(method: str, tokens: np.ndarray | None, hidden_size: int, vocab_size: int, *,
               seed: int = 0, noise: float | None = None, dtype=jnp.float32) -> HMMParams:
    """``method`` in ``{"random", "cluster"}``."""
    if method == "random":
        return random_init(jax.random.key(seed), hidden_size, vocab_size,
                           noise=1.0 if noise is None else noise, dtype=dtype)
    if method == "cluster":
        if tokens is None:
            raise ConfigError("init 'cluster' needs training tokens")
        return cluster_init(tokens, hidden_size, vocab_size, seed=seed,
                            noise=0.1 if noise is None else noise, dtype=dtype)
    raise ConfigError(f"unknown init method {method!r} (expected 'random' or 'cluster')")
