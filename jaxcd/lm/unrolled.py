"""Per-layer ("unrolled") parameters for :class:`jaxcd.lm.llama.JaxLM`: a decode step
that reads each weight once.

:class:`~jaxcd.lm.llama.JaxLM` keeps the ``L`` blocks' weights stacked (``[L, ...]``)
and runs them as one ``lax.scan``. Compiled by XLA's generic path (GPU, TPU, and the CPU
without the native kernels, ``matmul="xla"``), every scan iteration first copies its
layer's slice out of the stacked arrays (a ``dynamic-slice`` per weight: the slice is
read, written, then read again by the dot), so a decode step moves each weight about
three times instead of once.

:func:`unroll_params` turns the stacked parameters into :class:`UnrolledParams`: one
parameter set per layer, each its own array (built once, outside ``jit``). Passed as
``params`` to any of the LM's entry points (``prefill``, ``step``, :func:`step_donated
<jaxcd.lm.llama.step_donated>`, ``prefill_after``, ``logprobs_all``, and so inside the
decoders), the layers run as an unrolled Python loop over those sets: each dot reads
its weight where it lies, there is no slice copy and no loop. The program computes the
same function (same blocks, same order); the trade is compile time, which now grows
with ``L`` (one block per layer instead of one for all).

With the state donated (:func:`~jaxcd.lm.llama.step_donated`, or a loop carry inside a
decoder's ``jit``) the KV cache is updated in place (one ``dynamic-update-slice`` of
this step's slot); the layers only read it. The compiled step then accesses about
(weights + the KV cache it reads) bytes: ``experiments/bench_decode_traffic.py``
prints the figures and ``tests/test_decode_traffic.py`` asserts them.

Example::

    from jaxcd.lm.unrolled import unroll_params
    up = unroll_params(params)            # once; the stacked params may then be dropped
    state, lp = lm.prefill(up, ids, lens, max_len)
    state, lp = step_donated(lm, up, state, tok)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

PyTree = Any


@jax.tree_util.register_pytree_node_class
class UnrolledParams:
    """A :class:`~jaxcd.lm.llama.LlamaModel`'s parameters with one set per layer.

    Attributes:
      base: ``nnx.State`` of everything but the blocks (embedding, final norm, head).
      layers: tuple of ``L`` ``nnx.State``, layer ``l``'s block parameters (the stacked
        layout's ``params["layers"]`` at index ``l``).

    A pytree (it travels through ``jit`` as an argument, every weight a leaf of its own).
    """

    is_unrolled_params = True

    def __init__(self, base: nnx.State, layers: tuple):
        self.base = base
        self.layers = tuple(layers)

    def tree_flatten(self):
        return (self.base, self.layers), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], children[1])

    def __len__(self) -> int:
        return len(self.layers)

    def model(self, graphdef) -> "_UnrolledModel":
        """The LM's module (``graphdef`` = ``JaxLM.graphdef``) with these weights merged in:
        a :class:`~jaxcd.lm.llama.LlamaModel` whose :meth:`run_layers` loops over the
        per-layer blocks (unrolled)."""
        state = nnx.State({k: v for k, v in self.base.items()})
        state["layers"] = self.layers[0]          # the template: any one layer's shapes
        model = nnx.merge(graphdef, state)
        block_def, _ = nnx.split(model.layers)
        blocks = [nnx.merge(block_def, s) for s in self.layers]
        return _UnrolledModel(model, blocks)


class _UnrolledModel:
    """A :class:`~jaxcd.lm.llama.LlamaModel` view whose :meth:`run_layers` runs the layers
    as a Python loop over separate per-layer blocks; every other attribute is the
    model's."""

    def __init__(self, model, blocks):
        self._model = model
        self._blocks = blocks
        self.num_layers = len(blocks)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def run_layers(self, fn, carry, in_place: bool = False):
        """``carry, y_l = fn(block_l, l, carry)`` for ``l = 0 .. L-1`` (``l`` a Python
        int), unrolled; returns ``(carry, ys)`` with the ``y_l`` stacked (``[L, ...]``),
        as :meth:`jaxcd.lm.llama.LlamaModel.run_layers`. ``in_place`` is ignored: each
        block's weights are whole arrays already, read in place by XLA's dots."""
        ys = []
        for l, block in enumerate(self._blocks):
            carry, y = fn(block, l, carry)
            ys.append(y)
        if all(y is None for y in ys):
            return carry, None
        ys = jax.tree.map(lambda *a: jnp.stack(a), *ys)
        # As with the scan, the ys must exist only once every layer has run: the decode
        # step writes them into the KV cache that the layers read, and XLA updates a
        # donated buffer in place only when every read of it comes before the write in
        # the dataflow (else it copies the whole cache, twice). The last layer's
        # attention reads the cache after its own key/value exist, so the ys are made to
        # depend on the final carry through an exact zero, 0 * (one element of it),
        # which XLA does not fold for floats (0 * inf is nan; a non-finite carry makes
        # the step's log-probabilities non-finite anyway). optimization_barrier does not
        # survive XLA:CPU's pipeline up to copy insertion.
        zero = 0 * jax.tree.leaves(carry)[0].reshape(-1)[0].astype(jnp.float32)
        return carry, jax.tree.map(lambda y: y + zero.astype(y.dtype), ys)


def unroll_params(params: nnx.State) -> UnrolledParams:
    """Split stacked LM parameters (``JaxLM`` layout: ``params["layers"]`` leaves
    ``[L, ...]``) into :class:`UnrolledParams` (one array per layer and weight; a copy,
    made eagerly, so the stacked arrays may be deleted afterwards)."""
    if isinstance(params, UnrolledParams):
        return params
    layers = params["layers"]
    L = jax.tree.leaves(layers)[0].shape[0]
    base = nnx.State({k: v for k, v in params.items() if k != "layers"})
    per = tuple(jax.tree.map(lambda x, l=l: x[l], layers) for l in range(L))
    return UnrolledParams(base, per)


def stack_params(up: UnrolledParams) -> nnx.State:
    """The inverse of :func:`unroll_params`: the stacked ``JaxLM`` layout."""
    state = nnx.State({k: v for k, v in up.base.items()})
    state["layers"] = jax.tree.map(lambda *a: jnp.stack(a), *up.layers)
    return state


def random_unrolled_params(lm, seed: int = 0) -> UnrolledParams:
    """Random weights (flax's initialisers, ``lm.dtype``) built directly in the per-layer
    layout on the default device, one jitted call per layer, so that a large model never
    holds a stacked copy next to the per-layer one (for benchmarks on random models)."""
    from .llama import Block, LlamaModel

    cfg = lm.config
    one = dataclasses.replace(cfg, num_layers=1)

    @jax.jit
    def make_base():
        m = LlamaModel(one, dtype=lm.dtype, precision=lm._jax_precision(),
                       rngs=nnx.Rngs(seed))
        st = nnx.split(m)[1]
        return nnx.State({k: v for k, v in st.items() if k != "layers"})

    @jax.jit
    def make_layer(key):
        b = Block(cfg, dtype=lm.dtype, precision=lm._jax_precision(), rngs=nnx.Rngs(key))
        return nnx.split(b)[1]

    root = jax.random.key(seed)
    return UnrolledParams(make_base(), tuple(make_layer(jax.random.fold_in(root, 1 + i))
                                             for i in range(cfg.num_layers)))


__all__ = ["UnrolledParams", "unroll_params", "stack_params", "random_unrolled_params"]
