"""Sampling LM continuations for distillation (``python -m hmm_distill sample``).

:func:`sample_continuations` is one jitted program: ``lm.prefill`` then a
``lax.scan`` of ``T - 1`` ``lm.step`` calls. At step ``t`` each sequence draws
``x_t ~ softmax(log p(· | prompt, x_{<t}) / τ)`` (``τ = 0``: argmax); once a
sequence has produced EOS it emits EOS forever (EOS padding), so every row has
exactly ``T`` tokens. Randomness is per *sequence*: sequence ``i`` uses
``fold_in(key(seed), i)``, so the output does not depend on the batch size or on
which shards were generated in which run, and a resumed job is bit-identical.

:func:`run_sampling` writes a sample directory (:mod:`hmm_distill.data`) shard by
shard; shards that already exist complete are skipped (resume), and a directory made
with different settings is refused.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxcd.sampling import categorical

from .data import (SAMPLES_FORMAT, load_shard, read_metadata, shard_name, write_json_atomic)
from .errors import ConfigError, SampleDataError, SampleDirMismatchError


@partial(jax.jit, static_argnames=("lm", "length", "temperature"))
def sample_continuations(lm, params, prompt_ids: jax.Array, prompt_lengths: jax.Array,
                         keys: jax.Array, *, length: int, temperature: float = 1.0) -> jax.Array:
    """Draw one continuation of ``length`` tokens per row.

    Args:
      lm: a :class:`jaxcd.lm.interface.LanguageModel` (static, hashable).
      params: its parameter pytree.
      prompt_ids: int32 ``[B, P]`` left-padded; prompt_lengths: int32 ``[B]``.
      keys: typed PRNG keys ``[B]``, one per sequence.
      length: ``T`` (static); temperature: ``τ ≥ 0`` (static).
    Returns:
      int32 ``[B, T]``: tokens up to the first EOS, then EOS.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    eos = jnp.int32(lm.eos_token_id)
    B = prompt_ids.shape[0]
    state, logp = lm.prefill(params, prompt_ids, prompt_lengths, prompt_ids.shape[1] + length)
    step_keys = jax.vmap(lambda k: jax.random.split(k, length))(keys)  # [B, T]
    step_keys = jnp.swapaxes(step_keys, 0, 1)  # [T, B]

    def draw(logp, k, done):
        if temperature == 0:
            tok = jnp.argmax(logp, axis=-1)
        else:
            tok = jax.vmap(lambda k_, l_: categorical(k_, l_[None])[0])(
                k, logp.astype(jnp.float32) / temperature)
        tok = jnp.where(done, eos, tok.astype(jnp.int32))
        return tok, done | (tok == eos)

    def body(carry, k):
        state, logp, done = carry
        tok, done = draw(logp, k, done)
        state, logp = lm.step(params, state, tok)
        return (state, logp, done), tok

    done0 = jnp.zeros((B,), bool)
    (state, logp, done), toks = jax.lax.scan(body, (state, logp, done0), step_keys[:-1])
    last, _ = draw(logp, step_keys[-1], done)
    return jnp.concatenate([toks, last[None]], 0).T


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


def read_prompts(path, *, fmt: str = "text", tokenizer_loader=None, bos: int | None = None):
    """Read a prompts file, one prompt per line (blank lines skipped).

    ``fmt="text"``: encoded with the LM's tokenizer (``tokenizer_loader()``, lazily);
    ``fmt="ids"``: whitespace-separated token ids. ``bos`` (if not None) is prepended.
    Returns ``(texts, ids)``.
    """
    path = Path(path)
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
        raise ConfigError(f"unknown prompt format {fmt!r} (expected 'text' or 'ids')")
    if bos is not None:
        ids = [[int(bos)] + p if not p or p[0] != bos else p for p in ids]
    return lines, ids


_COMPAT_KEYS = ("vocab_size", "eos_token_id", "length", "vocab_fingerprint", "model", "prompt_ids",
                "seed", "temperature", "shard_size")


def run_sampling(lm, params, out_dir, *, num_seqs: int, length: int, shard_size: int = 1024,
                 batch_size: int = 64, seed: int = 0, temperature: float = 1.0,
                 prompt_ids: Sequence[Sequence[int]] | None = None,
                 prompt_texts: Sequence[str] | None = None, model_name: str = "lm",
                 fingerprint: str = "", progress: bool = True) -> dict:
    """Sample ``num_seqs`` continuations of ``length`` tokens into ``out_dir``.

    Sequence ``i`` continues prompt ``prompt_ids[i % len(prompt_ids)]`` (default: one
    prompt ``[BOS]``, or ``[EOS]`` if the LM has no BOS). Shards that already exist with
    the expected shape are kept (resume). Returns the final metadata dict.
    """
    from jaxcd.lm.interface import pad_prompts

    if num_seqs < 1 or length < 1 or shard_size < 1 or batch_size < 1:
        raise ConfigError("num_seqs, length, shard_size and batch_size must all be >= 1")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    out = Path(out_dir)
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
    meta = {
        "format": SAMPLES_FORMAT, "vocab_size": V, "eos_token_id": eos, "length": int(length),
        "vocab_fingerprint": fingerprint, "model": model_name,
        "prompts": list(prompt_texts) if prompt_texts is not None else None,
        "prompt_ids": prompt_ids, "seed": int(seed), "temperature": float(temperature),
        "shard_size": int(shard_size), "num_seqs": int(num_seqs), "shards": [],
    }
    if (out / "metadata.json").exists():
        old = read_metadata(out)
        diff = [k for k in _COMPAT_KEYS if old.get(k) != meta[k]]
        if diff:
            raise SampleDirMismatchError(
                f"{out} holds samples made with different settings ("
                + "; ".join(f"{k}: existing {old.get(k)!r} vs requested {meta[k]!r}" for k in diff[:4])
                + "); use another --out directory")
        if "tokens_per_s" in old:  # keep the throughput of the run that made the shards
            meta["tokens_per_s"] = old["tokens_per_s"]

    prompt_mat, prompt_len = pad_prompts(prompt_ids, pad_id=0)
    num_shards = -(-num_seqs // shard_size)
    sizes = [min(shard_size, num_seqs - k * shard_size) for k in range(num_shards)]
    done: dict[int, np.ndarray] = {}
    for k, n in enumerate(sizes):
        p = out / shard_name(k)
        if p.exists():
            try:
                done[k] = load_shard(p, length=length, vocab_size=V, num_seqs=n)
            except SampleDataError:
                pass  # incomplete / stale: regenerate
    todo = [k for k in range(num_shards) if k not in done]

    def shard_entry(k, arr):
        return {"file": shard_name(k), "num_seqs": int(arr.shape[0]),
                "num_unfinished": int(np.sum(arr[:, -1] != eos))}

    def write_meta(extra=None):
        meta["shards"] = [shard_entry(k, done[k]) for k in sorted(done)]
        meta["complete"] = len(done) == num_shards
        if extra:
            meta.update(extra)
        write_json_atomic(out / "metadata.json", meta)

    write_meta()
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(sizes[k] for k in todo) * length, unit="tok", unit_scale=True,
                   desc=f"sampling {len(todo)} shard(s)")
    t0, n_tok = time.perf_counter(), 0
    bsz = int(min(batch_size, shard_size))
    for k in todo:
        n = sizes[k]
        idx = k * shard_size + np.arange(n)
        rows = []
        for s in range(0, n, bsz):
            bi = idx[s:s + bsz]
            pad = bsz - len(bi)
            bi_full = np.concatenate([bi, np.repeat(bi[-1:], pad)]) if pad else bi
            which = bi_full % len(prompt_ids)
            toks = sample_continuations(
                lm, params, jnp.asarray(prompt_mat[which]), jnp.asarray(prompt_len[which]),
                sequence_keys(seed, bi_full), length=int(length), temperature=float(temperature))
            rows.append(np.asarray(toks)[: len(bi)])
            n_tok += len(bi) * length
            if bar is not None:
                bar.update(len(bi) * length)
                bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t0):.0f}")
        arr = np.concatenate(rows, 0).astype(np.int32)
        tmp = out / (shard_name(k) + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, arr)
        tmp.replace(out / shard_name(k))
        done[k] = arr
        write_meta({"tokens_per_s": n_tok / max(time.perf_counter() - t0, 1e-9)})
    if bar is not None:
        bar.close()
    return meta
