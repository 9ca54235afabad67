"""Memory traffic of a compiled decode step, from XLA's own accounting.

A batch-``B`` decode step of a ``P``-parameter model does ``O(B P)`` flops and must read
every weight once, so at small ``B`` its time is bounded below by (weight bytes + the KV
cache it reads) / bandwidth: the *floor*. This module compiles :meth:`JaxLM.step
<jaxcd.lm.llama.JaxLM.step>` with its state donated and reports

* ``bytes_accessed``: XLA's cost analysis of the compiled program
  (``compiled.cost_analysis()["bytes accessed"]``: per top-level instruction, the bytes
  of its operands and results);
* ``floor``: the bytes of the parameters plus the K and V caches;
* counts of the optimised HLO's instructions that move data without computing
  (``while``, ``dynamic-slice``, ``slice``, ``copy``, ``transpose``, ``convert``) and
  those among them whose result is as large as a weight matrix.

Limits of the cost analysis (checked on the CPU backend, jaxlib 0.10): a ``while``
loop's body is counted ONCE, whatever its trip count, so the stacked-layer ``scan``'s
figure is an undercount (about one layer's traffic instead of ``L``); :func:`hlo_traffic`
walks the HLO instead, multiplying loop bodies by their trip counts, counting every
operand whole (an overcount for slices and gathers). A ``gather`` (the embedding
lookup) is charged its whole operand table although it reads ``B`` rows. On the CPU,
bfloat16 dots are computed in float32 (XLA:CPU converts the weights first), so bfloat16
programs compiled here move more than the same program on a GPU; float32 figures are
the reliable ones on the CPU.
"""

from __future__ import annotations

import collections
import re
from typing import Any

import jax
import numpy as np

_DT = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1,
       "s64": 8, "u64": 8, "f64": 8, "s16": 2, "u16": 2}
_SHAPE = re.compile(r"\b(" + "|".join(_DT) + r")\[([0-9,]*)\]")
_INSTR = re.compile(r"\s*(?:ROOT )?%(\S+) = (.*?) ([\w\-]+)\((.*)$")
MOVES = ("while", "dynamic-slice", "slice", "copy", "transpose", "convert")


def shape_bytes(text: str) -> int:
    """Bytes of the HLO shape(s) in ``text`` (a tuple's elements summed)."""
    tot = 0
    for dt, dims in _SHAPE.findall(text):
        tot += int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64)) * _DT[dt]
    return tot


def _computations(hlo: str) -> dict[str, list[str]]:
    comps, name, body = {}, None, []
    for line in hlo.split("\n"):
        m = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
        if m:
            name, body = m.group(1), []
            if line.startswith("ENTRY"):
                comps["__entry__"] = body
            comps[name] = body
        elif line.startswith("}"):
            name = None
        elif name is not None:
            body.append(line)
    return comps


def hlo_traffic(hlo: str) -> int:
    """Bytes moved by the top-level instructions of an optimised HLO module (fusions as
    units; each instruction's operands whole plus its result; parameters, constants,
    tuples and bitcasts free), ``while`` bodies counted ``known_trip_count`` times."""
    comps = _computations(hlo)

    def walk(lines, seen=()):
        sizes, tot = {}, 0
        for line in lines:
            m = _INSTR.match(line)
            if not m:
                continue
            name, typ, op, rest = m.groups()
            sizes[name] = shape_bytes(typ)
            if op in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                      "opt-barrier"):
                continue
            if op == "while":
                body = re.search(r"body=%([\w.\-]+)", rest)
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
                if body and body.group(1) in comps and body.group(1) not in seen:
                    tot += int(trips.group(1) if trips else 1) * walk(
                        comps[body.group(1)], seen + (body.group(1),))
                continue
            operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
            tot += sizes[name] + sum(sizes.get(o, 0) for o in operands)
        return tot

    return walk(comps["__entry__"])


def hlo_moves(hlo: str, min_bytes: int = 0) -> dict[str, int]:
    """Counts of the data-moving instructions (:data:`MOVES`) of an optimised HLO module
    over all its computations (fusion bodies included), keeping those whose result has
    at least ``min_bytes`` bytes."""
    out = collections.Counter()
    for line in hlo.split("\n"):
        m = _INSTR.match(line)
        if m and m.group(3) in MOVES and shape_bytes(m.group(2)) >= min_bytes:
            out[m.group(3)] += 1
    return {k: out.get(k, 0) for k in MOVES}


def tree_bytes(tree: Any) -> int:
    """Bytes of the arrays (or ``jax.ShapeDtypeStruct`` s) of a pytree."""
    return int(sum(int(np.prod(x.shape, dtype=np.int64)) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree)))


def step_traffic(lm, params, state, tokens) -> dict:
    """Compile ``lm``'s decode step with ``state`` donated (as :func:`step_donated
    <jaxcd.lm.llama.step_donated>` runs it) for these arguments (arrays, or
    ``jax.ShapeDtypeStruct`` s: nothing is allocated) and report its traffic:
    ``bytes_accessed`` (XLA's cost analysis), ``hlo_traffic`` (:func:`hlo_traffic`),
    ``weights`` / ``kv_cache`` / ``floor`` bytes, ``ratio`` = bytes accessed / floor,
    ``moves`` (:func:`hlo_moves`) and ``weight_sized_moves`` (those whose result is at
    least the smallest projection matrix's size); ``hlo`` (the optimised HLO text) and
    ``compiled`` (the executable: ``compiled(params, state, tokens)`` runs the step,
    consuming ``state``)."""
    from .llama import _step_jit_donate

    compiled = _step_jit_donate.lower(lm, params, state, tokens).compile()
    ca = compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    hlo = compiled.as_text()
    weights = tree_bytes(params)
    kv = tree_bytes((state["k"], state["v"]))
    tokens = jax.ShapeDtypeStruct(tokens.shape, tokens.dtype)
    c = lm.config
    smallest = min(c.hidden_size * c.num_kv_heads * c.head_dim,
                   c.hidden_size * c.intermediate_size) * lm.dtype.itemsize
    ba = float(ca["bytes accessed"])
    return {"bytes_accessed": ba, "hlo_traffic": hlo_traffic(hlo), "weights": weights,
            "kv_cache": kv, "floor": weights + kv, "ratio": ba / (weights + kv),
            "moves": hlo_moves(hlo), "weight_sized_moves": hlo_moves(hlo, smallest),
            "hlo": hlo, "compiled": compiled}


__all__ = ["step_traffic", "hlo_traffic", "hlo_moves", "shape_bytes", "tree_bytes", "MOVES"]
