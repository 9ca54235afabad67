"""Sampling LM continuations for distillation (``python -m hmm_distill sample``).

:func:`sample_continuations` is one jitted program: ``lm.prefill`` then a
``lax.scan`` of ``T - 1`` ``lm.step`` calls. At step ``t`` each sequence draws
``x_t ~ softmax(log p(· | prompt, x_{<t}) / τ)`` (``τ = 0``: argmax); once a
sequence has produced EOS it emits EOS forever (EOS padding), so every row has
exactly ``T`` tokens. Randomness is per *sequence*: sequence ``i`` uses
``fold_in(key(seed), i)``, so the output does not depend on the batch size or on
which shards were generated in which run, and a resumed job is bit-identical.

:func:`run_sampling` batches the rows of a shard by prompt length and prompt
(:func:`sample_rows_shared_prefill`): each distinct prompt of a batch is prefilled once,
padded only to the longest prompt of its batch, and its prefilled LM state is copied to
the rows that continue it. With 512 continuations of 154 chat prompts (37–163 tokens)
this computes 20k prompt tokens instead of 83k; the draws are unchanged.

:func:`run_sampling` writes a sample directory (:mod:`hmm_distill.data`) shard by
shard; shards that already exist complete are skipped (resume), and a directory made
with different settings is refused.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from functools import partial
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcd.decoding.decode import draw as jaxcd_draw
from jaxcd.lm.interface import pad_prompts

from .data import (SAMPLES_FORMAT, features_name, load_shard, logprobs_name, read_metadata,
                   shard_name, write_json_atomic)
from .errors import ConfigError, SampleDataError, SampleDirMismatchError
from .priors import first_eos_mask

#: dtype of the recorded token features on disk and in the pools
FEATURE_DTYPE = jnp.float16


def feature_projection(vocab_size: int, dim: int, seed: int = 0) -> jax.Array:
    """The fixed random matrix ``R [V, D]`` (entries ``N(0, 1/D)``) of the recorded
    token features (:func:`token_features`)."""
    if dim < 1:
        raise ConfigError(f"feature dimension must be >= 1, got {dim}")
    key = jax.random.fold_in(jax.random.key(int(seed)), 0x4C5644)  # "LVD"
    return jax.random.normal(key, (int(vocab_size), int(dim)), jnp.float32) / np.sqrt(dim)


def token_features(logp: jax.Array, proj: jax.Array) -> jax.Array:
    """The feature of the LM state a token is drawn from, for latent-variable
    initialisation (:mod:`hmm_distill.lvd`): ``(log p − mean_v log p) R``.

    For a model whose next-token logits are ``W n`` (``n``: the final-normed last-layer
    hidden state, ``W [V, d]``), centring removes the log-normaliser, so the centred
    log-probabilities are ``(W − 1 w̄ᵀ) n``: a linear image of the hidden state that keeps
    all of it when ``W − 1w̄ᵀ`` has full column rank (``V ≫ d``). ``R`` (Johnson–Lindenstrauss)
    maps it to ``D`` dimensions. This works for any :class:`LanguageModel` (only its
    log-probabilities are read). ``logp [B, V]`` -> float32 ``[B, D]``."""
    logp = logp.astype(jnp.float32)
    logp = jnp.where(jnp.isfinite(logp), logp, jnp.nan)
    centred = logp - jnp.nanmean(logp, axis=-1, keepdims=True)
    centred = jnp.where(jnp.isnan(centred), 0.0, centred)
    return centred @ proj


def _decode(lm, params, state, logp, keys, length: int, temperature: float, proj=None):
    """The decoding loop after the prefill (traced; see :func:`sample_continuations_with_logprobs`)."""
    eos = jnp.int32(lm.eos_token_id)
    B = keys.shape[0]
    step_keys = jax.vmap(lambda k: jax.random.split(k, length))(keys)  # [B, T]
    step_keys = jnp.swapaxes(step_keys, 0, 1)  # [T, B]

    def draw(logp, k, done):
        # the decoding step every jaxcd loop shares (EOS logic in one place), one key per row
        logp = logp.astype(jnp.float32)
        tok, _, new_done, _ = jaxcd_draw(k, logp / max(temperature, 1e-6), done, eos,
                                         greedy=temperature == 0)
        lp = jnp.take_along_axis(logp, tok[:, None], axis=1)[:, 0]
        return tok, jnp.where(done, 0.0, lp), new_done

    def cond(carry):
        t, _, _, done, _, _, _ = carry
        return (t < length) & ~jnp.all(done)

    def body(carry):
        t, state, logp, done, toks, lps, feats = carry
        was_done = done
        tok, lp, done = draw(logp, step_keys[t], done)
        toks = jax.lax.dynamic_update_slice(toks, tok[:, None], (0, t))
        lps = jax.lax.dynamic_update_slice(lps, lp[:, None], (0, t))
        if proj is not None:
            f = jnp.where(was_done[:, None], 0.0, token_features(logp, proj)).astype(feats.dtype)
            feats = jax.lax.dynamic_update_slice(feats, f[:, None], (0, t, 0))
        # (at t = T-1 this step is wasted, but still inside the cache: max_len = P + T)
        state, logp = lm.step(params, state, tok)
        return t + 1, state, logp, done, toks, lps, feats

    toks0 = jnp.full((B, length), eos, jnp.int32)
    lps0 = jnp.zeros((B, length), jnp.float32)
    D = 0 if proj is None else proj.shape[1]
    feats0 = jnp.zeros((B, length if D else 0, D), FEATURE_DTYPE)
    carry = (jnp.int32(0), state, logp, jnp.zeros((B,), bool), toks0, lps0, feats0)
    _, _, _, _, toks, lps, feats = jax.lax.while_loop(cond, body, carry)
    return (toks, lps) if proj is None else (toks, lps, feats)


@partial(jax.jit, static_argnames=("lm", "length", "temperature"))
def sample_continuations_with_logprobs(lm, params, prompt_ids: jax.Array, prompt_lengths: jax.Array,
                                       keys: jax.Array, *, length: int,
                                       temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Draw one continuation of up to ``length`` tokens per row.

    Args:
      lm: a :class:`jaxcd.lm.interface.LanguageModel` (static, hashable).
      params: its parameter pytree.
      prompt_ids: int32 ``[B, P]`` left-padded; prompt_lengths: int32 ``[B]``.
      keys: typed PRNG keys ``[B]``, one per sequence.
      length: ``T`` (static), the hard cap; temperature: ``τ ≥ 0`` (static).
    Returns:
      ``tokens`` int32 ``[B, T]`` (tokens up to the first EOS, then EOS) and
      ``logprobs`` float32 ``[B, T]``: the LM's (untempered) ``log p(x_t | prompt, x_{<t})``
      of each drawn token up to and including the first EOS, 0 after it. The loop
      stops as soon as every row has produced EOS (a ``lax.while_loop``), so short
      continuations cost only their own length; the result equals running all ``T``
      steps (step ``t`` always uses key ``t`` of the row's split).
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    state, logp = lm.prefill(params, prompt_ids, prompt_lengths, prompt_ids.shape[1] + length)
    return _decode(lm, params, state, logp, keys, length, temperature)


@partial(jax.jit, static_argnames=("lm", "max_len"))
def _prefill(lm, params, prompt_ids, prompt_lengths, *, max_len: int):
    return lm.prefill(params, prompt_ids, prompt_lengths, max_len)


@jax.jit
def _take_rows(tree, rows):
    # every LM state leaf has the batch axis first (the LanguageModel contract)
    return jax.tree.map(lambda x: x[rows], tree)


@partial(jax.jit, static_argnames=("lm", "length", "temperature"))
def _decode_jit(lm, params, state, logp, keys, proj=None, *, length: int, temperature: float):
    return _decode(lm, params, state, logp, keys, length, temperature, proj)


def sample_rows_shared_prefill(lm, params, prompts: Sequence[Sequence[int]], which: np.ndarray,
                               keys: jax.Array, *, length: int, temperature: float = 1.0,
                               prompt_bucket: int = 32, unique_bucket: int = 8,
                               max_prompt_len: int | None = None, proj: jax.Array | None = None):
    """:func:`sample_continuations_with_logprobs` for rows ``b`` continuing
    ``prompts[which[b]]``, prefilling each *distinct* prompt once.

    The distinct prompts of the batch are left-padded only to their own longest length
    (rounded up to a multiple of ``prompt_bucket``, at most ``max_prompt_len``, so few
    shapes are compiled; their count is padded to a multiple of ``unique_bucket``), run
    through ``lm.prefill`` once, and the prefilled state rows are copied to the rows that
    continue them (``state[rows]``: every LM state leaf has the batch axis first). The
    draws are those of :func:`sample_continuations_with_logprobs` on the fully padded
    batch (same keys; the extra left padding is masked out). Returns ``(tokens,
    logprobs, prefill_tokens)`` (``prefill_tokens``: padded prompt tokens computed), and
    with ``proj`` (:func:`feature_projection`) ``(tokens, logprobs, features [B, T, D],
    prefill_tokens)``: the :func:`token_features` of each drawn token (0 after EOS)."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    which = np.asarray(which)
    uniq, inv = np.unique(which, return_inverse=True)
    U = max(len(uniq), min(-(-len(uniq) // unique_bucket) * unique_bucket, len(which)))
    uniq = np.concatenate([uniq, np.repeat(uniq[-1:], U - len(uniq))])
    width = max(len(prompts[j]) for j in uniq)
    width = -(-width // prompt_bucket) * prompt_bucket
    if max_prompt_len is not None:
        width = max(min(width, int(max_prompt_len)), max(len(prompts[j]) for j in uniq))
    mat, lens = pad_prompts([prompts[j] for j in uniq], pad_id=0, length=width)
    state, logp = _prefill(lm, params, jnp.asarray(mat), jnp.asarray(lens), max_len=width + int(length))
    state, logp = _take_rows((state, logp), jnp.asarray(inv.astype(np.int32)))
    out = _decode_jit(lm, params, state, logp, keys, proj, length=int(length),
                      temperature=float(temperature))
    return (*out, int(mat.size))


# ------------------------------------------------------------------------------------------
# Continuous batching for the JAX Llama LM (jaxcd.lm.JaxLM): a pool of rows, each row
# refilled with the next sequence as soon as its continuation ends.

def _is_jaxlm(lm) -> bool:
    try:
        from jaxcd.lm.llama import JaxLM
    except Exception:  # noqa: BLE001
        return False
    return isinstance(lm, JaxLM)


@partial(jax.jit, static_argnames=("lm", "chunk", "length", "temperature"), donate_argnums=(2,))
def _pool_chunk(lm, params, pool, proj=None, *, chunk: int, length: int, temperature: float):
    """``chunk`` decoding steps of every row of the pool. A row draws while it is active
    (step ``t < length``, no EOS yet) with key ``t`` of its own split; finished rows keep
    stepping (their results are not used) until the host refills them."""
    eos = jnp.int32(lm.eos_token_id)
    rows = jnp.arange(pool["t"].shape[0])

    def body(_, pool):
        t, done = pool["t"], pool["done"]
        k = pool["keys"][rows, jnp.minimum(t, length - 1)]
        logp = pool["logp"].astype(jnp.float32)
        tok, _, new_done, _ = jaxcd_draw(k, logp / max(temperature, 1e-6), done, eos,
                                         greedy=temperature == 0)
        lp = jnp.take_along_axis(logp, tok[:, None], axis=1)[:, 0]
        tw = jnp.minimum(t, length - 1)
        toks = pool["toks"].at[rows, tw].set(jnp.where(done, pool["toks"][rows, tw], tok))
        lps = pool["lps"].at[rows, tw].set(jnp.where(done, pool["lps"][rows, tw], lp))
        extra = {}
        if "feats" in pool:
            f = token_features(logp, proj).astype(pool["feats"].dtype)
            extra["feats"] = pool["feats"].at[rows, tw].set(
                jnp.where(done[:, None], pool["feats"][rows, tw], f))
        t = jnp.where(done, t, t + 1)
        state, logp = lm.step(params, pool["state"], tok)
        return {**pool, "state": state, "logp": logp, "t": t, "done": new_done | (t >= length),
                "toks": toks, "lps": lps, **extra}

    return jax.lax.fori_loop(0, chunk, body, pool)


@partial(jax.jit, static_argnames=("shift",), donate_argnums=(0,))
def _pool_insert_copy(pool, pre_state, pre_logp, src, replace, keys, lens, d, new_slot, *, shift: bool):
    """The whole-cache refill (``sample_pool(..., refill="copy")``, kept to measure
    :func:`_pool_refill` against): move the cache of every row ``d`` slots left (when
    ``shift``), then give the rows with ``replace`` the prefilled prompt ``src[b]`` (its
    ``lens[b]`` prompt slots moved to end at ``new_slot``), fresh keys and an empty
    output. Every leaf of the cache is rebuilt (``where`` over all ``B`` rows). JaxLM
    cache layouts (all layers stacked, batch axis first): ``k [B, L, n_kv, D, S]``,
    ``v [B, L, n_kv, S, D]``, ``slot [B]``, ``offset [B]``."""
    st = pool["state"]
    pre_end = pre_state["slot"][0]  # the prefilled prompts end at this slot

    def put(old, pre, axis):
        new = pre[src]
        pad = [(0, 0)] * new.ndim
        pad[axis] = (0, old.shape[axis] - new.shape[axis])  # the prefilled cache is shorter
        new = jnp.roll(jnp.pad(new, pad), new_slot - pre_end, axis=axis)
        old = jnp.roll(old, -d, axis=axis) if shift else old
        return jnp.where(replace.reshape((-1,) + (1,) * (old.ndim - 1)), new.astype(old.dtype), old)

    k = put(st["k"], pre_state["k"], 4)
    v = put(st["v"], pre_state["v"], 3)
    off_old = st["offset"] - d if shift else st["offset"]
    offset = jnp.where(replace, new_slot - lens, jnp.clip(off_old, 0, new_slot))
    state = {"k": k, "v": v, "slot": jnp.full_like(st["slot"], new_slot), "offset": offset}
    return _refill_small(pool, state, jnp.where(replace[:, None], pre_logp[src], pool["logp"]),
                         replace, keys)


def _refill_small(pool, state, logp, replace, keys):
    # the per-row bookkeeping of a refill (small arrays: [B] and [B, T])
    r = replace[:, None]
    extra = {}
    if "feats" in pool:
        extra = {"feats": jnp.where(r[..., None], jnp.zeros((), pool["feats"].dtype), pool["feats"])}
    return {"state": state, "logp": logp,
            "t": jnp.where(replace, 0, pool["t"]),
            "done": jnp.where(replace, False, pool["done"]),
            "keys": _where_keys(replace, keys, pool["keys"]),
            "toks": jnp.where(r, pool["eos_row"], pool["toks"]),
            "lps": jnp.where(r, 0.0, pool["lps"]),
            "eos_row": pool["eos_row"], **extra}


@partial(jax.jit, donate_argnums=(0,))
def _pool_shift(pool, d, new_slot):
    """Move the cache of every row ``d`` slots left and set the pool's slot to
    ``new_slot`` (when the cache would overflow; a whole-cache move, done rarely).
    Offsets are clipped at 0 (only free rows' offsets can fall below it)."""
    st = pool["state"]
    state = {"k": jnp.roll(st["k"], -d, axis=4),      # [B, L, n_kv, D, S]
             "v": jnp.roll(st["v"], -d, axis=3),      # [B, L, n_kv, S, D]
             "slot": jnp.full_like(st["slot"], new_slot),
             "offset": jnp.clip(st["offset"] - d, 0, new_slot)}
    return {**pool, "state": state}


@partial(jax.jit, donate_argnums=(0,))
def _pool_refill(pool, pre_state, pre_logp, rows, n, src, replace, keys, lens, new_slot):
    """Give the pool rows ``rows[:n]`` the prefilled prompts ``src[row]`` (their ``lens[row]``
    prompt slots placed to end at ``new_slot``), fresh keys and an empty output, in
    place: a ``fori_loop`` over the ``n`` refilled rows writes each row's keys/values
    with ``dynamic_update_slice`` into the donated cache, so a refill costs
    O(refilled rows), not a copy of the whole cache. Each written row equals the row
    :func:`_pool_insert_copy` builds (prompt keys/values rolled to end at ``new_slot``;
    the other slots are masked: ``offset <= j <= slot``). ``rows`` ``[B]`` (entries
    past ``n`` unused); ``src``, ``replace``, ``keys``, ``lens`` are indexed by pool
    row."""
    st = pool["state"]
    pre_end = pre_state["slot"][0]  # the prefilled prompts end at this slot
    shift = new_slot - pre_end

    def new_row(pre, s, axis, size):
        x = jax.lax.dynamic_index_in_dim(pre, s, 0, keepdims=True)  # [1, ...] one prompt
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, size - x.shape[axis])  # the prefilled cache is shorter
        return jnp.roll(jnp.pad(x, pad), shift, axis=axis)

    def body(i, carry):
        ks, vs, logp = carry
        r = rows[i]
        s = src[r]
        ks = jax.lax.dynamic_update_index_in_dim(
            ks, new_row(pre_state["k"], s, 4, ks.shape[4]).astype(ks.dtype), r, 0)
        vs = jax.lax.dynamic_update_index_in_dim(
            vs, new_row(pre_state["v"], s, 3, vs.shape[3]).astype(vs.dtype), r, 0)
        logp = jax.lax.dynamic_update_index_in_dim(
            logp, jax.lax.dynamic_index_in_dim(pre_logp, s, 0, keepdims=True).astype(logp.dtype), r, 0)
        return ks, vs, logp

    ks, vs, logp = jax.lax.fori_loop(0, n, body, (st["k"], st["v"], pool["logp"]))
    offset = jnp.where(replace, new_slot - lens, st["offset"])
    state = {"k": ks, "v": vs, "slot": jnp.full_like(st["slot"], new_slot), "offset": offset}
    return _refill_small(pool, state, logp, replace, keys)


def _where_keys(replace, new, old):
    return jax.random.wrap_key_data(jnp.where(replace[:, None, None], jax.random.key_data(new),
                                              jax.random.key_data(old)))


def sample_pool(lm, params, prompts: Sequence[Sequence[int]], seq_ids: np.ndarray, which: np.ndarray,
                seed: int, *, length: int, temperature: float = 1.0, batch_size: int = 64,
                chunk: int = 16, group: int = 16, prompt_bucket: int = 32, on_done=None,
                refill: str = "rows", on_chunk=None, proj: jax.Array | None = None) -> dict:
    """Continuations of sequences ``seq_ids[j]`` (prompt ``prompts[which[j]]``, key
    ``fold_in(key(seed), seq_ids[j])``) by continuous batching with a :class:`JaxLM`.

    ``batch_size`` rows decode ``chunk`` steps at a time; after each chunk every row whose
    continuation has ended (EOS or ``length`` tokens) is handed to ``on_done(j, tokens,
    logprobs)`` and refilled with the next waiting sequence. Prompts are prefilled
    ``group`` distinct ones at a time, in the order the sequences need them, padded to
    the group's longest prompt (rounded up to ``prompt_bucket``), each once while its
    sequences are inserted (give the sequences sorted by prompt). A refilled row gets its
    prompt's keys/values placed so that the prompt ends at the pool's current cache slot
    (a left-padded row: positions are slot − offset); when the cache would overflow,
    every row's cache is first moved left by the slots no live row needs. The draws are
    those of :func:`sample_continuations_with_logprobs` for each sequence (same keys,
    same contexts). A refill writes only the refilled rows of the cache, in place
    (:func:`_pool_refill`: O(one row) each); ``refill="copy"`` rebuilds the whole cache
    at every refill instead (:func:`_pool_insert_copy`, the earlier method, kept for the
    benchmark; same draws). ``on_chunk()`` (optional) is called after each chunk. With
    ``proj`` (:func:`feature_projection`, ``[V, D]``) each row also records the
    :func:`token_features` of every drawn token, and ``on_done`` gets them as a fourth
    argument (float16 ``[T, D]``, 0 after the end). Returns
    counters (``prefill_tokens``, ``decode_row_steps``, ``chunks``, ``shifts``,
    ``refills``: rows refilled, ``refill_calls``)."""
    if refill not in ("rows", "copy"):
        raise ConfigError(f"refill must be 'rows' or 'copy', got {refill!r}")
    n = len(seq_ids)
    B, C, T = int(batch_size), int(chunk), int(length)
    seq_ids, which = np.asarray(seq_ids), np.asarray(which)
    max_plen = max(len(prompts[w]) for w in which) if n else 1
    S = lm.cache_slots(max_plen + T + C)
    eos = int(lm.eos_token_id)
    st_shape = jax.eval_shape(lambda: lm.prefill(params, jnp.zeros((B, max_plen), jnp.int32),
                                                 jnp.full((B,), max_plen, jnp.int32), S))
    state, logp = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), st_shape)
    base = jax.random.key(seed)

    def row_keys(ids):
        return jax.vmap(lambda i: jax.random.split(jax.random.fold_in(base, i), T))(
            jnp.asarray(ids, jnp.uint32))

    pool = {"state": state, "logp": logp, "t": jnp.zeros((B,), jnp.int32), "done": jnp.ones((B,), bool),
            "keys": row_keys(np.zeros(B, np.int64)), "toks": jnp.full((B, T), eos, jnp.int32),
            "lps": jnp.zeros((B, T), jnp.float32), "eos_row": jnp.full((1, T), eos, jnp.int32)}
    if proj is not None:
        proj = jnp.asarray(proj, jnp.float32)
        pool["feats"] = jnp.zeros((B, T, proj.shape[1]), FEATURE_DTYPE)
    order_prompts = list(dict.fromkeys(which.tolist()))  # prompts in the order they are needed
    pos_of = {u: i for i, u in enumerate(order_prompts)}
    groups: list[tuple[dict, object, object]] = []       # (prompt -> row, state, logp), newest last
    row_job = np.full(B, -1)  # index j of the sequence a row decodes (-1: free)
    slot, nxt = 0, 0
    stats = {"prefill_tokens": 0, "decode_row_steps": 0, "chunks": 0, "shifts": 0, "refills": 0,
             "refill_calls": 0, "tail_shifts": 0}

    def prefill_group(u):
        gp = order_prompts[pos_of[u]: pos_of[u] + group]
        gp_pad = gp + [gp[-1]] * (group - len(gp))
        width = max(len(prompts[v]) for v in gp)
        width = max(width, min(-(-width // prompt_bucket) * prompt_bucket, max_plen))
        mat, lens = pad_prompts([prompts[v] for v in gp_pad], pad_id=0, length=width)
        st, lg = _prefill(lm, params, jnp.asarray(mat), jnp.asarray(lens), max_len=width)
        stats["prefill_tokens"] += int(mat.size)
        groups.append(({v: i for i, v in enumerate(gp)}, st, lg))
        del groups[:-2]

    while True:
        free = np.flatnonzero(row_job < 0)
        if nxt < n and len(free):
            take = np.arange(nxt, min(n, nxt + len(free)))
            nxt = int(take[-1]) + 1
            rows = free[: len(take)]
            lens_new = np.array([len(prompts[w]) for w in which[take]])
            live = row_job >= 0
            live_len = int((slot - np.asarray(pool["state"]["offset"])[live]).max()) if live.any() else 0
            shift = not (slot >= lens_new.max() and slot + C <= S)
            new_slot = max(int(lens_new.max()), live_len) if shift else slot
            stats["shifts"] += int(shift)
            d = slot - new_slot
            pending = np.ones(len(take), bool)
            while pending.any():
                u = int(which[take[np.flatnonzero(pending)[0]]])
                if not any(u in g[0] for g in groups):
                    prefill_group(u)
                gmap, gst, glg = next(g for g in groups if u in g[0])
                sel = pending & np.array([w in gmap for w in which[take]])
                src, rep = np.zeros(B, np.int32), np.zeros(B, bool)
                ids, lens_b = np.zeros(B, np.int64), np.zeros(B, np.int32)
                src[rows[sel]] = [gmap[w] for w in which[take[sel]]]
                rep[rows[sel]] = True
                ids[rows[sel]] = seq_ids[take[sel]]
                lens_b[rows[sel]] = lens_new[sel]
                if refill == "copy":
                    pool = _pool_insert_copy(pool, gst, glg, jnp.asarray(src), jnp.asarray(rep), row_keys(ids),
                                             jnp.asarray(lens_b), jnp.int32(d), jnp.int32(new_slot), shift=shift)
                else:
                    if shift:
                        pool = _pool_shift(pool, jnp.int32(d), jnp.int32(new_slot))
                    rr = np.zeros(B, np.int32)
                    rr[: int(sel.sum())] = rows[sel]
                    pool = _pool_refill(pool, gst, glg, jnp.asarray(rr), jnp.int32(sel.sum()), jnp.asarray(src),
                                        jnp.asarray(rep), row_keys(ids), jnp.asarray(lens_b), jnp.int32(new_slot))
                shift, d = False, 0
                stats["refills"] += int(sel.sum())
                stats["refill_calls"] += 1
                pending &= ~sel
            row_job[rows] = take
            slot = new_slot
        if not (row_job >= 0).any():
            break
        if slot + C > S:
            # no refill moved the cache (the tail, or no row finished): move it left by
            # the slots no live row needs, so that the chunk's writes stay inside it
            live = row_job >= 0
            live_len = int((slot - np.asarray(pool["state"]["offset"])[live]).max())
            pool = _pool_shift(pool, jnp.int32(slot - live_len), jnp.int32(live_len))
            slot = live_len
            stats["shifts"] += 1
            stats["tail_shifts"] += 1
        assert slot + C <= S, (slot, C, S)
        pool = _pool_chunk(lm, params, pool, proj, chunk=C, length=T, temperature=float(temperature))
        slot += C
        stats["chunks"] += 1
        stats["decode_row_steps"] += B * C
        fin = np.flatnonzero(np.asarray(pool["done"]) & (row_job >= 0))
        if len(fin):
            toks, lps = np.asarray(pool["toks"])[fin], np.asarray(pool["lps"])[fin]
            fts = np.asarray(pool["feats"])[fin] if proj is not None else [None] * len(fin)
            for r, tk, lq, ft in zip(fin, toks, lps, fts):
                if on_done is not None:
                    if proj is None:
                        on_done(int(row_job[r]), tk, lq)
                    else:
                        on_done(int(row_job[r]), tk, lq, ft)
            row_job[fin] = -1
        if on_chunk is not None:
            on_chunk()
    return stats


def pool_memory_bytes(lm, params, *, batch_size: int, max_prompt_len: int, length: int,
                      chunk: int = 16, group: int = 16) -> int:
    """Estimated peak bytes of one :func:`sample_pool` (shapes from ``jax.eval_shape``, no
    allocation): the pool's LM state (KV cache of ``batch_size`` rows for prompt +
    ``length`` + ``chunk`` slots) twice (a refill or a shift writes a new copy before the
    old one is freed), the two prefill groups kept (``group`` prompts each), and the float32
    attention scores of a group's prefill (``[group, n_heads, P, P]``)."""
    B, P = int(batch_size), int(max_prompt_len)
    S = lm.cache_slots(P + int(length) + int(chunk))

    def nbytes(tree):
        return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))

    def state(rows, slots):
        return nbytes(jax.eval_shape(lambda: lm.prefill(params, jnp.zeros((rows, P), jnp.int32),
                                                         jnp.full((rows,), P, jnp.int32), slots)))

    heads = int(getattr(getattr(lm, "config", None), "num_heads", 0) or 0)
    return 2 * state(B, S) + 2 * state(group, P) + 4 * group * heads * P * P


class _PoolStopped(Exception):
    """Raised inside a sampling pool when another pool failed or the run was interrupted."""


def split_by_prompt(which: np.ndarray, parts: int) -> list[np.ndarray]:
    """Split sequences (``which[j]``: the prompt of sequence ``j``) into at most ``parts``
    index arrays by prompt: the ``r``-th distinct prompt in order of first appearance goes
    to part ``r mod parts`` (so each prompt is prefilled in one part only, and parts of
    sequences sorted by prompt length get similar mixes). Empty parts are dropped; each
    array keeps the original order."""
    which = np.asarray(which)
    rank = {u: r for r, u in enumerate(dict.fromkeys(which.tolist()))}
    part = np.array([rank[u] % max(1, int(parts)) for u in which.tolist()], dtype=np.int64)
    return [np.flatnonzero(part == p) for p in range(max(1, int(parts))) if (part == p).any()]


def sample_continuations(lm, params, prompt_ids, prompt_lengths, keys, *, length: int,
                         temperature: float = 1.0) -> jax.Array:
    """The tokens of :func:`sample_continuations_with_logprobs` (int32 ``[B, T]``)."""
    return sample_continuations_with_logprobs(lm, params, prompt_ids, prompt_lengths, keys,
                                              length=length, temperature=temperature)[0]


def sequence_keys(seed: int, indices: np.ndarray) -> jax.Array:
    """Per-sequence keys ``fold_in(key(seed), i)``."""
    base = jax.random.key(seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(indices, jnp.uint32))


def _encode(tokenizer, text: str) -> list[int]:
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        ids = tokenizer.encode(text)
    ids = getattr(ids, "ids", ids)
    return [int(i) for i in ids]


def _read_text(path: Path) -> str:
    """A UTF-8 text file's contents; ``*.gz`` files are decompressed."""
    if path.name.endswith(".gz"):
        import gzip

        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        except (OSError, EOFError) as e:
            raise SampleDataError(f"{path}: not a readable gzip file ({e})") from e
    return path.read_text(encoding="utf-8")


def read_chat_prompts(path) -> list[dict]:
    """Read a JSON-lines file of chat prompts (gzip-compressed if the name ends in
    ``.gz``): one object per line with ``"user"`` (str) and optionally ``"system"``
    (str), ``"tools"`` (a list of tool JSON schemas, or one schema), ``"id"`` and
    ``"kind"``."""
    path = Path(path)
    if not path.is_file():
        raise SampleDataError(f"prompts file not found: {path}")
    out = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise SampleDataError(f"{path}:{n}: not a JSON object ({e})") from e
        if not isinstance(obj, dict) or not isinstance(obj.get("user"), str):
            raise SampleDataError(f"{path}:{n}: each line must be an object with a \"user\" string")
        unknown = sorted(set(obj) - {"user", "system", "tools", "id", "kind"})
        if unknown:
            raise SampleDataError(f"{path}:{n}: unknown keys {unknown} (allowed: user, system, tools, id, kind)")
        if obj.get("system") is not None and not isinstance(obj["system"], str):
            raise SampleDataError(f"{path}:{n}: \"system\" must be a string")
        tools = obj.get("tools")
        if isinstance(tools, dict):
            obj["tools"] = [tools]
        elif tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise SampleDataError(f"{path}:{n}: \"tools\" must be a tool schema object or a list of them")
        out.append(obj)
    if not out:
        raise SampleDataError(f"prompts file {path} has no prompts")
    return out


def encode_chat_prompts(prompts: Sequence[dict], tokenizer) -> list[list[int]]:
    """Token ids of chat prompts, rendered exactly as ``jaxcd generate`` renders its
    prompt (:func:`jaxcd.generation.format_prompt`)."""
    from jaxcd.generation import format_prompt

    return [format_prompt(tokenizer, p["user"], system=p.get("system"), tools=p.get("tools"))
            for p in prompts]


def prompt_set_id(prompt_ids: Sequence[Sequence[int]]) -> str:
    """Identity of a prompt set: SHA-256 (first 16 hex digits) of its rendered token ids
    (so it changes with the prompts, the chat template and the tokenizer)."""
    return hashlib.sha256(json.dumps([list(map(int, p)) for p in prompt_ids]).encode()).hexdigest()[:16]


def filter_prompts_by_length(prompts: Sequence, ids: Sequence[Sequence[int]], max_tokens: int | None):
    """Keep the prompts whose rendered length is at most ``max_tokens`` (``None``: all).
    Returns ``(prompts, ids)``; raises :class:`SampleDataError` when none is left."""
    if max_tokens is None:
        return list(prompts), list(ids)
    if max_tokens < 1:
        raise ConfigError(f"max_prompt_tokens must be >= 1, got {max_tokens}")
    keep = [i for i, p in enumerate(ids) if len(p) <= max_tokens]
    if not keep:
        raise SampleDataError(f"no prompt has at most {max_tokens} tokens (shortest: "
                              f"{min(len(p) for p in ids)})")
    return [prompts[i] for i in keep], [ids[i] for i in keep]


def read_prompts(path, *, fmt: str = "text", tokenizer_loader=None, bos: int | None = None,
                 max_prompt_tokens: int | None = None):
    """Read a prompts file.

    ``fmt="chat"`` (the default for ``*.jsonl``): chat prompts
    (:func:`read_chat_prompts`) rendered with the tokenizer's chat template
    (:func:`encode_chat_prompts`; ``bos`` is ignored, the template decides).
    ``fmt="text"``: one prompt per line (blank lines skipped), encoded with the LM's
    tokenizer (``tokenizer_loader()``, lazily); ``fmt="ids"``: whitespace-separated
    token ids. For these two, ``bos`` (if not None) is prepended. ``max_prompt_tokens``:
    keep only the prompts of at most that many tokens (:func:`filter_prompts_by_length`).
    Returns ``(prompts, ids)`` (``prompts``: the lines, or the chat objects).
    """
    path = Path(path)
    if fmt == "chat":
        if tokenizer_loader is None:
            raise ConfigError("chat prompts need a tokenizer; this LM has none (use --prompt-format ids)")
        prompts = read_chat_prompts(path)
        return filter_prompts_by_length(prompts, encode_chat_prompts(prompts, tokenizer_loader()),
                                        max_prompt_tokens)
    if not path.is_file():
        raise SampleDataError(f"prompts file not found: {path}")
    lines = [ln.rstrip("\n") for ln in path.read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        raise SampleDataError(f"prompts file {path} has no prompts")
    if fmt == "ids":
        try:
            ids = [[int(t) for t in ln.split()] for ln in lines]
        except ValueError as e:
            raise SampleDataError(f"prompts file {path}: not whitespace-separated token ids ({e})") from e
    elif fmt == "text":
        if tokenizer_loader is None:
            raise ConfigError("text prompts need a tokenizer; this LM has none (use --prompt-format ids)")
        tok = tokenizer_loader()
        ids = [_encode(tok, ln) for ln in lines]
    else:
        raise ConfigError(f"unknown prompt format {fmt!r} (expected 'chat', 'text' or 'ids')")
    if bos is not None:
        ids = [[int(bos)] + p if not p or p[0] != bos else p for p in ids]
    return filter_prompts_by_length(lines, ids, max_prompt_tokens)


_COMPAT_KEYS = ("vocab_size", "eos_token_id", "length", "vocab_fingerprint", "model", "prompt_ids",
                "seed", "temperature", "shard_size")


def _check_pool_memory(lm, params, prompt_lens: Sequence[int], rows: Sequence[int], length: int,
                       device=None) -> None:
    """Raise :class:`MemoryEstimateError` when the pools (``rows[i]`` rows, prompts of up to
    ``prompt_lens[i]`` tokens; :func:`pool_memory_bytes`, summed) need more than the
    available memory (:func:`hmm_distill.em.available_memory_bytes`)."""
    from .em import available_memory_bytes
    from .errors import MemoryEstimateError

    need = sum(pool_memory_bytes(lm, params, batch_size=b, max_prompt_len=p, length=length)
               for p, b in zip(prompt_lens, rows))
    avail = available_memory_bytes(device)
    if avail is not None and need > avail:
        gib = 1 << 30
        raise MemoryEstimateError(
            f"sampling in {len(rows)} pool(s) of up to {max(rows)} rows, prompts of up to "
            f"{max(prompt_lens)} tokens + {length} new, needs about {need / gib:.2f} GiB (KV caches, "
            f"prefill groups and their attention scores) but {avail / gib:.2f} GiB are "
            "available: lower --batch-size or --pools, or use shorter prompts")


def run_sampling(lm, params, out_dir, *, num_seqs: int, length: int, shard_size: int = 1024,
                 batch_size: int = 64, seed: int = 0, temperature: float = 1.0,
                 prompt_ids: Sequence[Sequence[int]] | None = None,
                 prompt_texts: Sequence | None = None, model_name: str = "lm",
                 fingerprint: str = "", progress: bool = True, prompt_set: str | None = None,
                 until_eos: bool = False, chat_template: bool = False,
                 continuous: bool | None = None, pools: int = 1, check_memory: bool = True,
                 features: int = 0, continuations_per_prompt: int = 1, devices=None) -> dict:
    """Sample ``num_seqs`` continuations of at most ``length`` tokens into ``out_dir``.

    Sequence ``i`` continues prompt ``prompt_ids[(i // c) % len(prompt_ids)]``, ``c =
    continuations_per_prompt`` (so ``c`` consecutive sequences share a prompt, which is
    prefilled once for them; default ``c = 1``: ``i mod #prompts``) (default: one
    prompt ``[BOS]``, or ``[EOS]`` if the LM has no BOS). Shards that already exist with
    the expected shape are kept (resume). ``until_eos`` records that ``length`` is a hard
    cap on continuations meant to run until EOS (the metadata counts the rows cut off
    there); either way a batch stops as soon as all its rows have ended.

    ``continuous`` (default: for a :class:`jaxcd.lm.JaxLM`) samples each shard by
    continuous batching (:func:`sample_pool`): a row whose continuation has ended is
    refilled with the next sequence, so no decoding step is spent on finished rows while
    sequences wait. Otherwise rows are batched by prompt (:func:`sample_rows_shared_prefill`).
    Either way the samples are the same.

    ``pools`` (continuous sampling only): the shard's sequences are split by prompt into
    ``pools`` parts (prompt ``r`` in order of need goes to part ``r mod pools``), each
    sampled by its own :func:`sample_pool` of ``batch_size`` rows in its own thread (the
    other pools start after the first pool's first chunk, so its programs are compiled
    once). XLA:CPU runs the attention loops and small fusions of a decode step one at a
    time (one pool kept about 1.2 of two idle cores busy), so concurrent pools can keep
    more cores busy. Each sequence is still drawn with its own key and context, so the
    samples are those of one pool up to float rounding (other cache placements and batch
    shapes; the tokens can differ where rounding flips a draw).

    ``devices`` (continuous sampling): a list of JAX devices; each runs one pool (so
    ``pools = len(devices)``), with its own copy of the parameters — a data-parallel
    sampler over the local accelerators. Several hosts: see below.

    ``check_memory`` (continuous sampling): before sampling a shard, the pools' peak memory
    is estimated (:func:`pool_memory_bytes`) and :class:`MemoryEstimateError` is raised when
    it exceeds the available memory, instead of the process being killed.

    ``features`` (``D > 0``): also record, for every sampled token, the ``D``-dimensional
    :func:`token_features` of the LM state it was drawn from (``shard_NNNNN.features.npy``,
    float16 ``[n, T, D]``, 0 after the first EOS), for latent-variable initialisation
    (:mod:`hmm_distill.lvd`). The projection is fixed by ``seed``.

    With several JAX processes (:mod:`hmm_distill.distributed`) process ``I`` of ``N``
    samples the shards ``k ≡ I (mod N)`` and process 0 writes the metadata after all
    have finished. Returns the final metadata dict.
    """
    from .distributed import barrier, is_main, process_count, process_index

    if num_seqs < 1 or length < 1 or shard_size < 1 or batch_size < 1:
        raise ConfigError("num_seqs, length, shard_size and batch_size must all be >= 1")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if int(pools) < 1:
        raise ConfigError(f"pools must be >= 1, got {pools}")
    out = Path(out_dir)
    main = is_main()
    out.mkdir(parents=True, exist_ok=True)
    V, eos = int(lm.vocab_size), int(lm.eos_token_id)
    if not prompt_ids:
        bos = getattr(lm, "bos_token_id", None)
        bos = eos if bos is None or bos < 0 else int(bos)
        prompt_ids = [[bos]]
    prompt_ids = [[int(t) for t in p] for p in prompt_ids]
    for j, p in enumerate(prompt_ids):
        if not p:
            raise SampleDataError(f"prompt {j} is empty")
        if min(p) < 0 or max(p) >= V:
            raise SampleDataError(f"prompt {j} has token ids outside the vocabulary [0, {V})")
    continuous = _is_jaxlm(lm) if continuous is None else bool(continuous)
    if devices is not None:
        devices = list(devices)
        if not devices:
            raise ConfigError("devices: give at least one device")
        if not continuous:
            raise ConfigError("sampling on several devices needs continuous batching (a JaxLM)")
        pools = len(devices)
        dev_params = [jax.device_put(params, d) for d in devices]
    meta = {
        "format": SAMPLES_FORMAT, "vocab_size": V, "eos_token_id": eos, "length": int(length),
        "vocab_fingerprint": fingerprint, "model": model_name,
        "prompts": list(prompt_texts) if prompt_texts is not None else None,
        "prompt_ids": prompt_ids, "prompt_set": prompt_set, "prompt_set_id": prompt_set_id(prompt_ids),
        "chat_template": bool(chat_template), "until_eos": bool(until_eos), "max_length": int(length),
        "seed": int(seed), "temperature": float(temperature),
        "shard_size": int(shard_size), "num_seqs": int(num_seqs), "shards": [],
        # pools only apply to continuous sampling; a resume may use another count (the
        # shards are draws of the same distribution, only float rounding differs)
        "pools": int(pools) if continuous else 1,
        "features": int(features),
    }
    if int(features) < 0:
        raise ConfigError(f"features must be >= 0, got {features}")
    cpp = int(continuations_per_prompt)
    if cpp < 1:
        raise ConfigError(f"continuations_per_prompt must be >= 1, got {continuations_per_prompt}")
    meta["continuations_per_prompt"] = cpp
    proj = feature_projection(V, int(features), seed) if features else None
    if (out / "metadata.json").exists():
        old = read_metadata(out)
        diff = [k for k in _COMPAT_KEYS if old.get(k) != meta[k]]
        if int(old.get("features", 0)) != meta["features"]:
            diff.append("features")
        if int(old.get("continuations_per_prompt", 1)) != meta["continuations_per_prompt"]:
            diff.append("continuations_per_prompt")
        if diff:
            raise SampleDirMismatchError(
                f"{out} holds samples made with different settings ("
                + "; ".join(f"{k}: existing {old.get(k)!r} vs requested {meta[k]!r}" for k in diff[:4])
                + "); use another --out directory")
        for k in ("tokens_per_s", "prefill_tokens", "decode_row_steps"):  # of the run that made the shards
            if k in old:
                meta[k] = old[k]
    barrier("hmm_distill_sample_start")

    plen = np.array([len(p) for p in prompt_ids])
    max_plen = int(plen.max())
    num_shards = -(-num_seqs // shard_size)
    sizes = [min(shard_size, num_seqs - k * shard_size) for k in range(num_shards)]

    def scan_done() -> dict[int, tuple[np.ndarray, bool]]:
        done = {}
        for k, n in enumerate(sizes):
            p = out / shard_name(k)
            if p.exists():
                try:
                    arr = load_shard(p, length=length, vocab_size=V, num_seqs=n)
                except SampleDataError:
                    continue  # incomplete / stale: regenerate
                if features and not (out / features_name(k)).exists():
                    continue
                done[k] = (arr, (out / logprobs_name(k)).exists())
        return done

    done = scan_done()
    P_, I_ = process_count(), process_index()
    todo = [k for k in range(num_shards) if k not in done and k % P_ == I_]

    def shard_entry(k, arr, has_lp):
        e = {"file": shard_name(k), "num_seqs": int(arr.shape[0]),
             "num_unfinished": int(np.sum(arr[:, -1] != eos))}
        if has_lp:
            e["logprobs"] = logprobs_name(k)
        if features:
            e["features"] = features_name(k)
        return e

    def write_meta(extra=None):
        meta["shards"] = [shard_entry(k, *done[k]) for k in sorted(done)]
        meta["complete"] = len(done) == num_shards
        n = sum(e["num_seqs"] for e in meta["shards"])
        cut = sum(e["num_unfinished"] for e in meta["shards"])
        meta["num_cut_off"] = cut
        meta["eos_fraction"] = (n - cut) / n if n else None
        if extra:
            meta.update(extra)
        if main:
            write_json_atomic(out / "metadata.json", meta)

    write_meta()
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(sizes[k] for k in todo), unit="seq",
                   desc=f"sampling {len(todo)} shard(s)" + (f" [process {I_}/{P_}]" if P_ > 1 else ""))
    t0, n_tok, n_prefill, n_rowsteps = time.perf_counter(), 0, 0, 0
    lock = threading.Lock()
    bsz = int(min(batch_size, shard_size))
    for k in todo:
        n = sizes[k]
        idx = k * shard_size + np.arange(n)
        # rows of a shard are batched by prompt length, then prompt: a batch's distinct
        # prompts are prefilled once each, padded only to their own length
        w_all = (idx // cpp) % len(prompt_ids)
        order = np.lexsort((idx, w_all, plen[w_all]))
        arr = np.empty((n, length), np.int32)
        lp = np.empty((n, length), np.float32)
        ft = np.zeros((n, length, int(features)), np.float16) if features else None
        if continuous:
            warm = threading.Event()  # the other pools start once the first has compiled
            stop = threading.Event()  # an error or Ctrl-C: every pool stops after its chunk

            def check_stop():
                if stop.is_set():
                    raise _PoolStopped()

            def run_part(k_sel):
                k_part, sel = k_sel
                if k_part > 0:
                    warm.wait()
                    check_stop()

                def on_chunk():
                    if k_part == 0:
                        warm.set()
                    check_stop()

                def on_done(j, tk, lq, fq=None):
                    nonlocal n_tok
                    i = order[sel[j]]
                    arr[i], lp[i] = tk, lq
                    if fq is not None:
                        ft[i] = fq
                    with lock:
                        n_tok += int(first_eos_mask(tk[None], eos).sum())
                        if bar is not None:
                            bar.update(1)
                            bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t0):.0f}")

                try:
                    if devices is None:
                        return sample_pool(lm, params, prompt_ids, idx[order[sel]], w_all[order[sel]], seed,
                                           length=int(length), temperature=float(temperature),
                                           batch_size=rows[k_part],
                                           on_done=on_done, on_chunk=on_chunk, proj=proj)
                    dev = devices[k_part]
                    with jax.default_device(dev):
                        return sample_pool(lm, dev_params[k_part], prompt_ids, idx[order[sel]],
                                           w_all[order[sel]], seed, length=int(length),
                                           temperature=float(temperature), batch_size=rows[k_part],
                                           on_done=on_done, on_chunk=on_chunk,
                                           proj=None if proj is None else jax.device_put(proj, dev))
                except BaseException:
                    stop.set()
                    raise
                finally:
                    warm.set()

            parts = split_by_prompt(w_all[order], pools)
            # a pool of a split shard has no more rows than sequences (one pool: as before)
            rows = [bsz if len(parts) == 1 else min(bsz, len(sel)) for sel in parts]
            if check_memory and hasattr(lm, "cache_slots"):
                lens_ = [int(plen[w_all[order[sel]]].max()) for sel in parts]
                if devices is None:
                    _check_pool_memory(lm, params, lens_, rows, int(length))
                else:  # one pool per device
                    for i in range(len(parts)):
                        _check_pool_memory(lm, params, lens_[i:i + 1], rows[i:i + 1], int(length),
                                           device=devices[i])
            if len(parts) == 1:
                stats = [run_part((0, parts[0]))]
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(len(parts), thread_name_prefix="hmm_distill_pool") as ex:
                    futs = [ex.submit(run_part, kp) for kp in enumerate(parts)]
                    try:
                        stats = [f.result() for f in futs]
                    except BaseException as e:   # a pool failed, or Ctrl-C in this thread
                        stop.set()
                        errs = [f.exception() for f in futs]   # the others stop at a chunk end
                        raise next((x for x in errs if x is not None
                                    and not isinstance(x, _PoolStopped)), e) from None
            n_prefill += sum(st["prefill_tokens"] for st in stats)
            n_rowsteps += sum(st["decode_row_steps"] for st in stats)
        for s in range(0, n if not continuous else 0, bsz):
            sel = order[s:s + bsz]
            bi = idx[sel]
            pad = bsz - len(bi)
            bi_full = np.concatenate([bi, np.repeat(bi[-1:], pad)]) if pad else bi
            *res, npre = sample_rows_shared_prefill(
                lm, params, prompt_ids, (bi_full // cpp) % len(prompt_ids), sequence_keys(seed, bi_full),
                length=int(length), temperature=float(temperature), max_prompt_len=max_plen,
                proj=proj)
            toks, lps = res[0], res[1]
            if features:
                ft[sel] = np.asarray(res[2])[: len(bi)]
            toks = np.asarray(toks)[: len(bi)]
            arr[sel] = toks
            lp[sel] = np.asarray(lps)[: len(bi)]
            n_prefill += npre
            n_rowsteps += bsz * int(first_eos_mask(toks, eos).sum(1).max())
            n_tok += int(first_eos_mask(toks, eos).sum())  # generated tokens (EOS included)
            if bar is not None:
                bar.update(len(bi))
                bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t0):.0f}")
        files = [(logprobs_name(k), lp)] + ([(features_name(k), ft)] if features else [])
        for name, a in files + [(shard_name(k), arr)]:  # shard last: it marks completion
            tmp = out / (name + ".tmp")
            with open(tmp, "wb") as f:
                np.save(f, a)
            tmp.replace(out / name)
        done[k] = (arr, True)
        write_meta({"tokens_per_s": n_tok / max(time.perf_counter() - t0, 1e-9),
                    "prefill_tokens": n_prefill, "decode_row_steps": n_rowsteps})
    if bar is not None:
        bar.close()
    if P_ > 1:
        barrier("hmm_distill_sample_done")
        done = scan_done()
        write_meta()
        barrier("hmm_distill_sample_meta")
    return meta
