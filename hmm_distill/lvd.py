r"""Latent-variable initialisation ("latent-variable distillation", LVD).

The HMM's hidden state at step ``t`` should summarise what the LM "knows" when it
draws ``x_t``. LVD makes that literal before EM starts:

1. while sampling (``hmm-distill sample --features D``), record for every sampled
   token ``x_t`` the feature ``f_t`` of the LM state it was drawn from
   (:func:`hmm_distill.sampler.token_features`: a fixed random projection of the
   centred next-token log-probabilities, a linear image of the last-layer hidden state);
2. cluster the features of the training tokens into ``H`` clusters by k-means in JAX
   (:func:`kmeans`: k-means++ seeding on a subsample, then Lloyd iterations);
3. read the HMM off the hard assignment ``z_t = cluster(f_t)`` by counting:

   * ``π_h ∝ #(z_1 = h) + λ``,
   * ``A_{h,h'} ∝ #(z_t = h, z_{t+1} = h') + λ``,
   * ``B_h = (1 − ε) · #(z_t = h, x_t = ·) / #(z_t = h) + ε · u``, with ``u`` the add-one
     unigram of the training tokens, so no token is impossible (a cluster that received
     no token emits ``u``).

Counts run over the valid positions of each row (up to and including its first EOS).
EM then refines the soft assignment (:mod:`hmm_distill.train`, ``init="lvd"``). The
counting streams: :func:`lvd_init` takes an iterable of ``(tokens, mask, features)``
chunks, so the features never have to fit in memory at once (only the k-means
subsample does).
"""

from __future__ import annotations

from functools import partial
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from . import hmm as F
from .errors import ConfigError, SampleDataError
from .hmm import HMMParams

_CHUNK = 8192  # rows per assignment block (bounds the [chunk, k] distance matrix)


def _sq_dists(X: jax.Array, C: jax.Array) -> jax.Array:
    """``‖x − c‖²`` for every row of ``X [n, D]`` and ``C [k, D]`` (``[n, k]``, ≥ 0)."""
    d = (jnp.sum(X * X, 1)[:, None] - 2.0 * X @ C.T + jnp.sum(C * C, 1)[None, :])
    return jnp.maximum(d, 0.0)


@jax.jit
def _assign_block(X: jax.Array, C: jax.Array) -> tuple[jax.Array, jax.Array]:
    d = _sq_dists(X, C)
    lab = jnp.argmin(d, axis=1).astype(jnp.int32)
    return lab, jnp.take_along_axis(d, lab[:, None], axis=1)[:, 0]


def assign(X, C) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centre (``labels int32 [n]``) and squared distance (``[n]``) of each row of
    ``X [n, D]`` to the centres ``C [k, D]``, in blocks of rows (one compiled shape)."""
    X = np.asarray(X, np.float32)
    C = jnp.asarray(C, jnp.float32)
    n = X.shape[0]
    labs, dists = np.empty(n, np.int32), np.empty(n, np.float32)
    for s in range(0, n, _CHUNK):
        blk = X[s:s + _CHUNK]
        m = blk.shape[0]
        if m < _CHUNK and n > _CHUNK:  # pad the last block to the compiled shape
            blk = np.concatenate([blk, np.zeros((_CHUNK - m, X.shape[1]), np.float32)])
        lab, dist = _assign_block(jnp.asarray(blk), C)
        labs[s:s + m], dists[s:s + m] = np.asarray(lab)[:m], np.asarray(dist)[:m]
    return labs, dists


@partial(jax.jit, static_argnames=("k",))
def kmeans_pp_seed(key: jax.Array, X: jax.Array, k: int) -> jax.Array:
    """k-means++ seeding: the first centre uniformly, each next one with probability
    proportional to the squared distance to the nearest centre chosen so far.
    ``X [n, D]`` -> ``C [k, D]``."""
    n = X.shape[0]
    keys = jax.random.split(key, k)
    first = jax.random.randint(keys[0], (), 0, n)
    C = jnp.zeros((k, X.shape[1]), X.dtype).at[0].set(X[first])
    d_min = _sq_dists(X, X[first][None])[:, 0]

    def body(i, carry):
        C, d_min = carry
        total = jnp.sum(d_min)
        logits = jnp.where(total > 0, jnp.log(jnp.maximum(d_min, 0.0)), 0.0)
        j = jax.random.categorical(keys[i], logits)
        C = C.at[i].set(X[j])
        d_min = jnp.minimum(d_min, _sq_dists(X, X[j][None])[:, 0])
        return C, d_min

    C, _ = jax.lax.fori_loop(1, k, body, (C, d_min))
    return C


@partial(jax.jit, static_argnames=("k",))
def _lloyd_update(X: jax.Array, lab: jax.Array, dist: jax.Array, C: jax.Array, k: int):
    """New centres = means of their points; an empty cluster is moved to the points
    farthest from their centres (largest ``dist`` first)."""
    sums = jax.ops.segment_sum(X, lab, num_segments=k)
    cnt = jax.ops.segment_sum(jnp.ones_like(dist), lab, num_segments=k)
    empty = cnt == 0
    means = sums / jnp.maximum(cnt, 1.0)[:, None]
    # the r-th empty cluster takes the r-th farthest point
    far = jnp.argsort(-dist)[:k]
    rank = jnp.cumsum(empty) - 1
    C_new = jnp.where(empty[:, None], X[far[jnp.clip(rank, 0, k - 1)]], means)
    return C_new, jnp.sum(empty)


def kmeans(X, k: int, *, key: jax.Array, iters: int = 30, max_points: int = 200_000,
           seed_points: int = 50_000, init=None) -> tuple[np.ndarray, dict]:
    """k-means of the rows of ``X [n, D]`` into ``k`` clusters.

    Seeding is k-means++ (:func:`kmeans_pp_seed`) on at most ``seed_points`` rows; the
    Lloyd iterations (assign every row to its nearest centre, move each centre to the
    mean of its rows) run on at most ``max_points`` rows (a seeded subsample, the same
    for every iteration) until no assignment changes or ``iters`` iterations (``init``:
    given starting centres ``[k, D]`` instead of the seeding). Returns the
    centres ``[k, D]`` (float32) and ``{"iterations", "inertia", "points", "empty"}``
    (inertia: mean squared distance of the fitted rows to their centres)."""
    X = np.asarray(X, np.float32)
    if X.ndim != 2 or X.shape[0] == 0:
        raise SampleDataError(f"kmeans needs a non-empty [n, D] array, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise SampleDataError("kmeans: the features contain NaN or infinite values")
    if k < 1:
        raise ConfigError(f"kmeans: k must be >= 1, got {k}")
    n = X.shape[0]
    k_seed, k_fit, k_pp = jax.random.split(key, 3)
    if n > max_points:
        X = X[np.sort(np.asarray(jax.random.choice(k_fit, n, (max_points,), replace=False)))]
        n = max_points
    S = X if n <= seed_points else X[np.sort(np.asarray(
        jax.random.choice(k_seed, n, (seed_points,), replace=False)))]
    if k > S.shape[0]:  # fewer points than clusters: repeat points (the copies stay identical)
        S = np.concatenate([S] * (-(-k // S.shape[0])))
    C = kmeans_pp_seed(k_pp, jnp.asarray(S), k) if init is None else jnp.asarray(init, jnp.float32)
    lab, empty, it = None, 0, 0
    for it in range(1, iters + 1):
        new_lab, dist = assign(X, C)
        if lab is not None and np.array_equal(new_lab, lab):
            break
        lab = new_lab
        C, empty = _lloyd_update(jnp.asarray(X), jnp.asarray(lab), jnp.asarray(dist), C, k)
    lab, dist = assign(X, C)
    return np.asarray(C), {"iterations": it, "inertia": float(dist.mean()), "points": int(n),
                           "empty": int(empty)}


def _valid_features(features: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.asarray(features[mask], np.float32)


def lvd_counts(chunks: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], centres, hidden_size: int,
               vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Hard-assignment counts over ``(tokens [n, T], mask [n, T], features [n, T, D])``
    chunks: ``start [H]``, ``trans [H, H]``, ``emit [H, V]`` and the token counts ``[V]``
    (float64, over the valid positions; a transition needs both of its positions valid)."""
    H, V = int(hidden_size), int(vocab_size)
    start = np.zeros(H)
    trans = np.zeros(H * H)
    emit = jnp.zeros((H, V), jnp.float32)
    tok_counts = np.zeros(V)
    for tokens, mask, feats in chunks:
        tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
        if not mask.any():
            continue
        z = np.full(tokens.shape, -1, np.int64)
        z[mask], _ = assign(_valid_features(feats, mask), centres)
        first = mask[:, 0]
        start += np.bincount(z[first, 0], minlength=H)
        pair = mask[:, :-1] & mask[:, 1:]
        trans += np.bincount((z[:, :-1][pair] * H + z[:, 1:][pair]), minlength=H * H)
        x = tokens[mask]
        emit = emit.at[jnp.asarray(z[mask]), jnp.asarray(x)].add(1.0)
        tok_counts += np.bincount(x, minlength=V)
    return start, trans.reshape(H, H), np.asarray(emit, np.float64), tok_counts


def params_from_counts(start, trans, emit, tok_counts, *, pseudocount: float = 1.0,
                       smoothing: float = 0.05, dtype=jnp.float32) -> HMMParams:
    """The HMM of the module docstring's step 3 from hard-assignment counts."""
    if not 0 <= smoothing < 1:
        raise ConfigError(f"smoothing must be in [0, 1), got {smoothing}")
    if pseudocount < 0:
        raise ConfigError(f"pseudocount must be >= 0, got {pseudocount}")
    V = emit.shape[1]
    u = (tok_counts + 1.0) / (tok_counts.sum() + V)
    rows = emit.sum(1, keepdims=True)
    Bc = np.where(rows > 0, emit / np.maximum(rows, 1e-300), u[None])
    B = (1.0 - smoothing) * Bc + smoothing * u[None]
    A = trans + pseudocount
    pi = start + pseudocount
    if pi.sum() <= 0:
        pi = np.ones_like(pi)
    A = np.where(A.sum(1, keepdims=True) > 0, A, 1.0)
    return F.as_params(pi / pi.sum(), A / A.sum(1, keepdims=True), B / B.sum(1, keepdims=True),
                       dtype=dtype)


def lvd_init(chunks, hidden_size: int, vocab_size: int, *, seed: int = 0, iters: int = 30,
             max_points: int = 200_000, pseudocount: float = 1.0, smoothing: float = 0.05,
             dtype=jnp.float32, log=None) -> tuple[HMMParams, dict]:
    """Latent-variable initialisation (module docstring).

    ``chunks``: a callable returning a fresh iterable of ``(tokens [n, T], mask [n, T],
    features [n, T, D])`` (it is read twice: once for the k-means subsample, once for the
    counts). Returns ``(params, info)``."""
    H = int(hidden_size)
    if H < 1:
        raise ConfigError(f"hidden_size must be >= 1, got {H}")
    rng = np.random.default_rng([seed, 0x4C56])
    # the k-means sample: a uniform share of the valid positions of every chunk, about
    # max_points in all (a first pass counts them)
    total = sum(int(np.asarray(m, bool).sum()) for _, m, _ in chunks())
    if total == 0:
        raise SampleDataError("latent-variable initialisation: no valid token positions in the data")
    keep = min(1.0, max_points / total)
    sample = []
    for _, m, f in chunks():
        X = _valid_features(f, np.asarray(m, bool))
        if keep < 1.0:
            X = X[rng.random(X.shape[0]) < keep]
        sample.append(X)
    X = np.concatenate(sample)
    C, km = kmeans(X, H, key=jax.random.key(seed), iters=iters, max_points=max_points)
    if log is not None:
        log(f"LVD: k-means of {km['points']} of {total} token features into {H} clusters, "
            f"{km['iterations']} Lloyd iterations, inertia {km['inertia']:.4g}")
    start, trans, emit, tok = lvd_counts(chunks(), C, H, vocab_size)
    used = int((emit.sum(1) > 0).sum())
    params = params_from_counts(start, trans, emit, tok, pseudocount=pseudocount, smoothing=smoothing,
                                dtype=dtype)
    return params, {**km, "tokens": total, "states_used": used, "feature_dim": int(X.shape[1])}
