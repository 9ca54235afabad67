"""Shape buckets: constraints as data, one compiled program per bucket.

A jitted decoder compiles once per *shape* of its inputs. Every array of a
:class:`~jaxcd.automata.tensorized.TensorizedAutomaton` is a pytree leaf (state ids included),
so two constraints whose arrays have the same shapes share every compiled program. This
module chooses those shapes:

- **automaton buckets** (:func:`automaton_bucket`, :func:`bucket_automaton`): states,
  edges, out-degree and distinct mask rows rounded up to a few coarse levels (each ×4),
  so that the constraints of a workload fall into a handful of buckets;
- **budget buckets** (:func:`budget_bucket`): the static length of the decoding loop and
  its tables; the budget itself is traced (a loop bound and a table offset);
- **prompt buckets** (:func:`prompt_bucket`): the width of the left-padded prompt batch.

:func:`stack_automata` pads several automata to a common bucket and stacks them with a
leading batch axis (one constraint per prompt row); :func:`flatten` turns such a stack
into one automaton of ``B·S`` states (the disjoint union, one start state per row) inside
``jit``, which is what the GCD/LCD/P-GCD code runs on: a row's masks, transitions and
tables are exactly those of its own automaton.

Padding never changes a language, a mask, a budget or ``β``/``β^P`` of a real state
(see :func:`~jaxcd.automata.tensorized.pad_automaton`).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..automata.tensorized import TensorizedAutomaton, pad_automaton

__all__ = ["pad_prompts", "automaton_bucket", "bucket_automaton", "is_bucketed", "stack_automata",
           "common_bucket", "flatten",
           "budget_bucket", "prompt_bucket", "LEVELS"]

#: ``(states, edges, out-degree, mask rows)`` of the coarse automaton buckets; an
#: automaton takes the first level that holds it. Past the last level, each size is
#: rounded up to a power of two on its own (large automata are rare and the padding
#: would cost memory).
LEVELS: tuple[tuple[int, int, int, int], ...] = tuple(
    (64 * 4 ** c, 256 * 4 ** c, 16 * 4 ** c, 64 * 4 ** c) for c in range(4))

_MIN_BUDGET_BUCKET = 16
_MIN_PROMPT_BUCKET = 32


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0,
                length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists into ``(ids [B, P] int32, lengths [B] int32)``."""
    if len(prompts) == 0:
        raise ValueError("pad_prompts: need at least one prompt")
    lengths = np.array([len(p) for p in prompts], dtype=np.int32)
    width = int(lengths.max()) if length is None else int(length)
    if width < lengths.max():
        raise ValueError(f"pad_prompts: a prompt has {lengths.max()} tokens, more than length={width}")
    ids = np.full((len(prompts), max(width, 1)), pad_id, dtype=np.int32)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, ids.shape[1] - len(p):] = np.asarray(p, dtype=np.int32)
    return ids, lengths


def _pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 0).bit_length()


def _sizes(fa: TensorizedAutomaton) -> tuple[int, int, int, int]:
    # (states, edges, out-degree, distinct mask rows): the shapes a bucket must hold
    return fa.num_states, fa.num_edges, int(np.shape(fa.out_dst)[-1]), int(np.shape(fa.cum_masks)[-2])


def automaton_bucket(fa: TensorizedAutomaton) -> tuple[int, int, int, int]:
    """The bucket ``(states, edges, out-degree, mask rows)`` that ``fa`` is padded to."""
    S, E, D, R = _sizes(fa)
    for lv in LEVELS:
        if S <= lv[0] and E <= lv[1] and D <= min(lv[2], lv[0]) and R <= lv[3]:
            return (lv[0], lv[1], min(lv[2], lv[0]), lv[3])
    return (max(_pow2(S), LEVELS[-1][0]), max(_pow2(E), LEVELS[-1][1]),
            _pow2(D), max(_pow2(R), LEVELS[-1][3]))


def bucket_automaton(fa: TensorizedAutomaton, bucket: tuple[int, int, int, int] | None = None
                     ) -> TensorizedAutomaton:
    """``fa`` padded to ``bucket`` (default: :func:`automaton_bucket`), with the
    canonical ids ``initial = 0``, ``final = S - 2``, ``dead = S - 1``. Keeps ``key``.
    An automaton already of that shape and layout is returned as it is."""
    b = automaton_bucket(fa) if bucket is None else tuple(int(x) for x in bucket)
    if _sizes(fa) == b and int(fa.initial_state) == 0 and int(fa.final_state) == b[0] - 2 \
            and int(fa.dead_state) == b[0] - 1:
        return fa
    out, _ = pad_automaton(fa, num_states=b[0], num_edges=b[1], max_out_degree=b[2],
                           num_mask_rows=b[3], key=fa.key)
    return out


def is_bucketed(fa: TensorizedAutomaton) -> bool:
    """``fa`` is laid out as :func:`bucket_automaton` leaves it: power-of-two sizes and the
    canonical ids (``initial = 0``, ``final = S - 2``, ``dead = S - 1``)."""
    S, E, D, R = _sizes(fa)
    return (all(x == _pow2(x) for x in (S, E, D, R)) and int(fa.initial_state) == 0
            and int(fa.final_state) == S - 2 and int(fa.dead_state) == S - 1)


def common_bucket(fas: Sequence[TensorizedAutomaton]) -> tuple[int, int, int, int]:
    """The smallest bucket that holds every automaton of ``fas``."""
    bks = [automaton_bucket(fa) for fa in fas]
    return automaton_bucket(_Shape(*(max(x[i] for x in bks) for i in range(4))))


def stack_automata(fas: Sequence[TensorizedAutomaton],
                   bucket: tuple[int, int, int, int] | None = None) -> TensorizedAutomaton:
    """One automaton per prompt row: each padded to the smallest bucket that holds them
    all (:func:`bucket_automaton`; or to ``bucket``), stacked with a leading batch axis
    ``[B, ...]``.
    Every decoder and table builder (:func:`jaxcd.decoding.decode.sample`,
    :func:`jaxcd.decoding.smc.run`, :func:`jaxcd.decoding.gcd.backward`,
    :func:`jaxcd.decoding.pgcd.backward`) accepts the stack and gives row ``b`` the
    constraint ``fas[b]``."""
    fas = list(fas)
    if not fas:
        raise ValueError("stack_automata: no automata")
    if any(fa.batch_shape for fa in fas):
        raise ValueError("stack_automata: the automata must not be stacked already")
    V, eos = fas[0].vocab_size, fas[0].eos_id
    for i, fa in enumerate(fas):
        if (fa.vocab_size, fa.eos_id) != (V, eos):
            raise ValueError(f"stack_automata: automaton {i} is for another vocabulary "
                             f"({fa.vocab_size} tokens, EOS {fa.eos_id}; expected {V}, {eos})")
    b = common_bucket(fas) if bucket is None else tuple(int(x) for x in bucket)
    padded = [bucket_automaton(fa, b) for fa in fas]
    leaves = [jax.tree_util.tree_leaves(p) for p in padded]
    treedef = jax.tree_util.tree_structure(padded[0])
    out = jax.tree_util.tree_unflatten(treedef, [np.stack(x) for x in zip(*leaves)])
    object.__setattr__(out, "key", "stack[" + ", ".join(p.key or "?" for p in padded)[:200] + "]")
    return out


class _Shape:
    """Sizes only, for :func:`automaton_bucket` of a combined bucket."""

    def __init__(self, S, E, D, R):
        self.num_states, self.num_edges = S, E
        self.out_dst = np.empty((0, D))
        self.cum_masks = np.empty((R, 0))


def flatten(fa: TensorizedAutomaton) -> TensorizedAutomaton:
    """A stack ``[B, ...]`` as one automaton of ``B·S`` states: the disjoint union of
    the rows (state ``s`` of row ``b`` is ``b·S + s``; edges and mask rows likewise),
    with ``initial_state [B]`` (row ``b``'s start), ``final_state [B]`` and one shared
    dead state (row 0's; every dead state is absorbing). Works inside ``jit`` (reshapes
    and offsets); an unstacked automaton is returned as it is.

    Needs the stack's rows to be in the canonical padded layout of
    :func:`stack_automata` (every edge counted in ``out_start``, ``E + S`` logical rows)."""
    if fa.dist.ndim == 1:
        return fa
    xp = np if isinstance(fa.dist, np.ndarray) else jnp
    B, S = fa.dist.shape
    E = fa.edge_src.shape[1]
    R, W = fa.cum_masks.shape[1:]
    D = fa.out_dst.shape[2]
    b = xp.arange(B, dtype=np.int32)
    out_start = xp.concatenate([(fa.out_start[:, :S] + (b * E)[:, None]).reshape(-1),
                                xp.full((1,), B * E, np.int32)])
    flat = TensorizedAutomaton.__new__(TensorizedAutomaton)
    vals = dict(
        edge_src=(fa.edge_src + (b * S)[:, None]).reshape(-1),
        edge_dst=(fa.edge_dst + (b * S)[:, None]).reshape(-1),
        out_start=out_start,
        out_dst=(fa.out_dst + (b * S)[:, None, None]).reshape(B * S, D),
        cum_masks=fa.cum_masks.reshape(B * R, W),
        row_index=(fa.row_index + (b * R)[:, None]).reshape(-1),
        dist=fa.dist.reshape(-1),
        initial_state=fa.initial_state + b * S,
        final_state=fa.final_state + b * S,
        dead_state=fa.dead_state[0],
        vocab_size=fa.vocab_size, eos_id=fa.eos_id, key=fa.key)
    for k, v in vals.items():
        object.__setattr__(flat, k, v)
    return flat


def budget_bucket(budget: int) -> int:
    """Static loop length for ``budget``: the next power of two, at least 16."""
    if not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    return max(_MIN_BUDGET_BUCKET, _pow2(budget))


def prompt_bucket(width: int) -> int:
    """Static width of a left-padded prompt batch: the next power of two, at least 32."""
    return max(_MIN_PROMPT_BUCKET, _pow2(width))
