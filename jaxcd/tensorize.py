"""Token lifting and tensorization (host side, NumPy) — DESIGN.md §2.

A byte-level DFA ``D`` is lifted over the vocabulary into the token-level automaton
``M``: its states are the states of ``D`` reachable from the start by whole
tokens, plus the terminal state ``⊥`` (``final_state``) and an explicit ``dead``
state (no edges; makes state updates total so particles keep fixed shapes).
Edges are grouped by ``(source, destination)``; edge ``e`` carries the label set
``L_e``. EOS edges go from every accepting state to ``⊥``; ``⊥`` has an EOS
self-loop (padding). States that cannot reach ``⊥`` are removed (trimmed), so
``β_∞ = 1`` on every live state.

Storage (the maths of DESIGN.md with a layout chosen for fast masks):

- ``edge_src``, ``edge_dst`` (int32 ``[E]``) are ``T_out`` and ``T_in`` in index form;
  edges are sorted by source, then by ``dist[dst]`` (shortest number of tokens from
  ``dst`` to ``⊥``).
- ``cum_masks`` (uint32 ``[E + S, W]``, ``W = ceil(V / 32)``, bit ``v % 32`` of word
  ``v // 32``): for state ``s`` with out-edges ``e_1..e_d`` (in that order), row
  ``base[s] + k`` is the bit-packed union ``L_{e_1} ∪ … ∪ L_{e_k}`` (row ``base[s]``
  is empty), with ``base[s] = out_start[s] + s``. ``B_f`` is recovered exactly as
  ``row_k XOR row_{k-1}`` because a DFA's out-labels are disjoint.
- Because ``β_{t+1}(s') = 1{dist[s'] ≤ n - t - 1}`` is monotone in ``dist``, the live
  out-edges of a state always form a prefix of its sorted edge list, so the GCD
  mask ``1{w_{t+1}ᵀ B_f}`` is the single row ``base[s] + Σ_e β_{t+1}(dst e)`` — one
  gather, whatever the budget. Tests check this against the dense formula.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import jax
import numpy as np

from .automata.fsa import DFA
from .errors import EmptyLanguageError, PrefixRejectedError
from .vocab import Vocabulary

INF_DIST = 1 << 30
FORMAT_VERSION = 1

_DATA_FIELDS = ("edge_src", "edge_dst", "out_start", "out_dst", "cum_masks", "dist")
_META_FIELDS = ("num_states", "vocab_size", "initial_state", "final_state", "dead_state",
                "eos_id", "key")


@dataclass(frozen=True)
class TensorizedAutomaton:
    """A token-level DFA over a real vocabulary, stored as (sparse) ``T_out``, ``T_in``,
    ``B_f`` plus per-state tables (see the module docstring). A JAX pytree: the
    arrays are leaves, the sizes and ids are static.

    Arrays are NumPy when built; ``fa.to_device()`` gives a copy with ``jax.Array``
    leaves for the jitted functions in :mod:`jaxcd.gcd` (do it once, not per step).
    """

    edge_src: np.ndarray    # int32 [E]
    edge_dst: np.ndarray    # int32 [E]
    out_start: np.ndarray   # int32 [S + 1]   CSR offsets of out-edges
    out_dst: np.ndarray     # int32 [S, D]    out-edge destinations, padded with dead_state
    cum_masks: np.ndarray   # uint32 [E + S, W]
    dist: np.ndarray        # int32 [S]       tokens to ⊥ (INF_DIST if none)
    num_states: int
    vocab_size: int
    initial_state: int
    final_state: int
    dead_state: int
    eos_id: int
    key: str = ""

    # -- sizes -------------------------------------------------------------------------
    @property
    def num_edges(self) -> int:
        return int(self.edge_src.shape[0])

    @property
    def num_words(self) -> int:
        return int(self.cum_masks.shape[1])

    @property
    def nbytes(self) -> int:
        return int(sum(np.asarray(getattr(self, f)).nbytes for f in _DATA_FIELDS))

    @property
    def min_budget(self) -> int:
        """Smallest budget (tokens, EOS included) for which the constraint can be met."""
        return int(self.dist[self.initial_state])

    def stats(self) -> dict:
        return {"num_states": self.num_states, "num_edges": self.num_edges,
                "vocab_size": self.vocab_size, "max_out_degree": int(self.out_dst.shape[1]),
                "min_budget": self.min_budget, "nbytes": self.nbytes}

    def to_device(self) -> "TensorizedAutomaton":
        return jax.device_put(self)

    # -- dense views (DESIGN.md §2), for tests and the HMM product ---------------------
    @property
    def T_out(self) -> np.ndarray:
        m = np.zeros((self.num_states, self.num_edges), np.uint8)
        m[np.asarray(self.edge_src), np.arange(self.num_edges)] = 1
        return m

    @property
    def T_in(self) -> np.ndarray:
        m = np.zeros((self.num_edges, self.num_states), np.uint8)
        m[np.arange(self.num_edges), np.asarray(self.edge_dst)] = 1
        return m

    def label_words(self) -> np.ndarray:
        """Bit-packed ``B_f``: uint32 ``[E, W]``."""
        src = np.asarray(self.edge_src)
        out_start = np.asarray(self.out_start)
        rows = out_start[src] + src + (np.arange(self.num_edges) - out_start[src]) + 1
        cum = np.asarray(self.cum_masks)
        return cum[rows] ^ cum[rows - 1]

    @property
    def B_f(self) -> np.ndarray:
        """Dense ``B_f``: bool ``[E, V]``."""
        return unpack_bits(self.label_words(), self.vocab_size)

    @property
    def initial(self) -> np.ndarray:
        return np.eye(self.num_states, dtype=np.uint8)[self.initial_state]

    @property
    def final(self) -> np.ndarray:
        return np.eye(self.num_states, dtype=np.uint8)[self.final_state]

    # -- host-side stepping (NumPy) ------------------------------------------------------
    def next_state(self, state: int, token: int) -> int:
        """``δ(state, token)``; ``dead_state`` if the token is not allowed."""
        out_start = self.out_start
        a, b = int(out_start[state]), int(out_start[state + 1])
        if a == b or not 0 <= token < self.vocab_size:
            return self.dead_state
        base = a + state
        col = self.cum_masks[base + 1: base + 1 + (b - a), token >> 5]
        hit = np.nonzero((col >> np.uint32(token & 31)) & np.uint32(1))[0]
        if len(hit) == 0:
            return self.dead_state
        return int(self.edge_dst[a + hit[0]])

    def mask_words(self, state: int, steps_left: int | None) -> np.ndarray:
        """Packed mask of tokens allowed from ``state`` when ``steps_left`` tokens remain
        (EOS included); ``None`` = LCD (no budget)."""
        a, b = int(self.out_start[state]), int(self.out_start[state + 1])
        if steps_left is None:
            k = b - a
        else:
            k = int(np.count_nonzero(self.dist[self.edge_dst[a:b]] <= steps_left - 1))
        return self.cum_masks[a + state + k]

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        path = Path(path)
        tmp = path.with_suffix(".tmp.npz")
        meta = {f: getattr(self, f) for f in _META_FIELDS}
        meta["format_version"] = FORMAT_VERSION
        np.savez(tmp, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                 **{f: np.asarray(getattr(self, f)) for f in _DATA_FIELDS})
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> "TensorizedAutomaton":
        with np.load(path) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.pop("format_version", None) != FORMAT_VERSION:
                raise ValueError(f"{path}: cached automaton has an old format")
            return cls(**{f: z[f] for f in _DATA_FIELDS}, **meta)


jax.tree_util.register_dataclass(TensorizedAutomaton, data_fields=list(_DATA_FIELDS),
                                 meta_fields=list(_META_FIELDS))


def unpack_bits(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """uint32 ``[..., W]`` -> bool ``[..., vocab_size]`` (little-endian bit order)."""
    words = np.ascontiguousarray(words, dtype="<u4")
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


def pack_bits(mask: np.ndarray) -> np.ndarray:
    """bool ``[..., V]`` -> uint32 ``[..., ceil(V/32)]``."""
    mask = np.asarray(mask, bool)
    V = mask.shape[-1]
    W = (V + 31) // 32
    pad = np.zeros(mask.shape[:-1] + (W * 32 - V,), bool)
    packed = np.packbits(np.concatenate([mask, pad], -1), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4").astype(np.uint32)


# ---------------------------------------------------------------------------------------
# lifting
# ---------------------------------------------------------------------------------------
def lift_transitions(dfa: DFA, vocab: Vocabulary, max_pairs: int = 1 << 22):
    """All token transitions from DFA states reachable by whole tokens.

    Returns ``(states, src, tok, dst)``: ``states`` are the reachable DFA states in BFS
    order (start first); ``src``/``dst`` index into ``states``; ``tok`` are token ids.

    Vectorised over (state, trie node) pairs: the vocabulary's byte trie is walked
    level by level for all frontier states at once, a pair is dropped as soon as the
    DFA dies, and shared token prefixes are read once — the cost follows the number
    of live (state, prefix) pairs, never ``S × V × max_len``.
    """
    trie = vocab.trie
    Q = dfa.num_states
    table = np.full((Q + 1, 256), Q, np.int32)
    bt = dfa.byte_table()
    table[:Q] = np.where(bt >= 0, bt, Q)
    has_first = trie.first_node >= 0
    first_bytes = np.nonzero(has_first)[0]
    first_nodes = trie.first_node[first_bytes]

    # Lift every DFA state at once (chunked to bound memory): one pass over the trie
    # levels instead of one pass per BFS round. Reachability by whole tokens is
    # computed afterwards on the (small) state graph.
    out_src, out_tok, out_dst = [], [], []
    live_first = table[:Q][:, first_bytes] != Q                       # [Q, nb]
    est = live_first.sum(1) * max(1, len(trie.node_byte) // max(len(first_bytes), 1))
    chunks, cur_chunk, acc = [], [], 0
    for q in range(Q):
        if cur_chunk and acc + est[q] > max_pairs:
            chunks.append(cur_chunk)
            cur_chunk, acc = [], 0
        cur_chunk.append(q)
        acc += est[q]
    if cur_chunk:
        chunks.append(cur_chunk)
    for ch in chunks:
        states_c = np.asarray(ch, np.int64)
        cur = table[states_c[:, None], first_bytes[None, :]]
        fi, bi = np.nonzero(cur != Q)
        src_state = states_c[fi]
        node = first_nodes[bi]
        cur = cur[fi, bi]
        while len(node):
            ecount = trie.end_start[node + 1] - trie.end_start[node]
            has = ecount > 0
            if has.any():
                n_h, c_h = node[has], ecount[has]
                reps = np.repeat(np.arange(len(n_h)), c_h)
                offs = np.repeat(trie.end_start[n_h] - (np.cumsum(c_h) - c_h), c_h)
                out_tok.append(trie.end_tokens[offs + np.arange(len(reps))])
                out_src.append(src_state[has][reps])
                out_dst.append(cur[has][reps])
            ccount = trie.child_start[node + 1] - trie.child_start[node]
            keep = ccount > 0
            node, cur, src_state, ccount = node[keep], cur[keep], src_state[keep], ccount[keep]
            total = int(ccount.sum())
            if total == 0:
                break
            reps = np.repeat(np.arange(len(node)), ccount)
            child = np.repeat(trie.child_start[node] - (np.cumsum(ccount) - ccount),
                              ccount) + np.arange(total)
            nxt = table[cur[reps], trie.node_byte[child]]
            alive = nxt != Q
            node, cur, src_state = child[alive], nxt[alive], src_state[reps[alive]]
    if out_src:
        src = np.concatenate(out_src)
        tok = np.concatenate(out_tok)
        dst = np.concatenate(out_dst)
    else:
        src = tok = dst = np.zeros(0, np.int64)
    # states reachable from the start by whole tokens, BFS order
    pairs = np.unique(src * Q + dst)
    es, ed = pairs // Q, pairs % Q
    starts = np.searchsorted(es, np.arange(Q + 1))
    index = {0: 0}
    order = [0]
    i = 0
    while i < len(order):
        q = order[i]
        i += 1
        for d in ed[starts[q]:starts[q + 1]].tolist():
            if d not in index:
                index[d] = len(order)
                order.append(d)
    remap = np.full(Q, -1, np.int64)
    remap[np.array(order)] = np.arange(len(order))
    keep = remap[src] >= 0
    return (np.array(order), remap[src[keep]], tok[keep].astype(np.int64),
            remap[dst[keep]])


def _bfs_dist(num_states: int, src: np.ndarray, dst: np.ndarray, target: int) -> np.ndarray:
    """Shortest number of edges from each state to ``target`` (INF_DIST if unreachable)."""
    dist = np.full(num_states, INF_DIST, np.int64)
    dist[target] = 0
    order = np.argsort(dst, kind="stable")
    dsorted = dst[order]
    starts = np.searchsorted(dsorted, np.arange(num_states + 1))
    q = deque([target])
    while q:
        x = q.popleft()
        for e in order[starts[x]:starts[x + 1]]:
            s = int(src[e])
            if dist[s] == INF_DIST:
                dist[s] = dist[x] + 1
                q.append(s)
    return dist


def tensorize(dfa: DFA, vocab: Vocabulary, key: str = "") -> TensorizedAutomaton:
    """Lift a (minimised) byte DFA over ``vocab`` and build the tensorized automaton."""
    if dfa.num_states == 0:
        raise EmptyLanguageError(f"the constraint {key or ''} accepts no string at all".replace("  ", " "))
    states, src, tok, dst = lift_transitions(dfa, vocab)
    n_live = len(states)
    final, dead = n_live, n_live + 1
    S = n_live + 2
    acc = np.nonzero(dfa.accepting[states])[0]
    eos = vocab.eos_id
    src = np.concatenate([src, acc, [final]])
    dst = np.concatenate([dst, np.full(len(acc), final), [final]])
    tok = np.concatenate([tok, np.full(len(acc) + 1, eos)])

    # group into edges (unique (src, dst) pairs)
    pair = src * S + dst
    if S * S <= (1 << 25):
        present = np.bincount(pair, minlength=S * S) > 0
        uniq = np.nonzero(present)[0]
        lookup = np.zeros(S * S, np.int64)
        lookup[uniq] = np.arange(len(uniq))
        edge_of_pair = lookup[pair]
    else:
        uniq, edge_of_pair = np.unique(pair, return_inverse=True)
    e_src, e_dst = uniq // S, uniq % S
    dist = _bfs_dist(S, e_src, e_dst, final)
    dist[dead] = INF_DIST
    if dist[0] >= INF_DIST:
        raise EmptyLanguageError(
            f"the constraint {key!r} has no output that the vocabulary can spell with whole "
            "tokens followed by EOS" if key else
            "the constraint has no output that the vocabulary can spell with whole tokens")
    # trim: drop edges into (or out of) states that cannot reach ⊥
    live_edge = (dist[e_dst] < INF_DIST) & (dist[e_src] < INF_DIST)
    # renumber surviving states: keep ids (no gaps needed for correctness), but
    # dead-end states get no edges; compact them away for memory
    keep_state = dist < INF_DIST
    keep_state[dead] = True
    new_id = np.cumsum(keep_state) - 1
    S2 = int(keep_state.sum())
    # order edges: by src, then dist[dst], then dst
    E_ids = np.nonzero(live_edge)[0]
    e_src2, e_dst2 = new_id[e_src[E_ids]], new_id[e_dst[E_ids]]
    dist2 = dist[keep_state]
    order = np.lexsort((e_dst2, dist2[e_dst2], e_src2))
    E_ids, e_src2, e_dst2 = E_ids[order], e_src2[order], e_dst2[order]
    E = len(E_ids)
    edge_rank = np.full(len(uniq), -1, np.int64)
    edge_rank[E_ids] = np.arange(E)
    pe = edge_rank[edge_of_pair]
    ok = pe >= 0
    pe, ptok = pe[ok], tok[ok]

    V = vocab.vocab_size
    W = (V + 31) // 32
    out_start = np.searchsorted(e_src2, np.arange(S2 + 1)).astype(np.int32)
    deg = np.diff(out_start)
    D = max(int(deg.max()) if S2 else 1, 1)
    dead2 = int(new_id[dead])
    out_dst = np.full((S2, D), dead2, np.int32)
    col = np.arange(E) - out_start[e_src2]
    out_dst[e_src2, col] = e_dst2

    # labels -> packed words (distinct bits of one word: OR == sum, exact in float64)
    word = pe * W + (ptok >> 5)
    bit = np.left_shift(1, ptok & 31).astype(np.float64)
    label = np.bincount(word, weights=bit, minlength=E * W).astype(np.uint32).reshape(E, W)
    cum = np.zeros((E + S2, W), np.uint32)
    for s in np.nonzero(deg)[0]:
        a, b = out_start[s], out_start[s + 1]
        cum[a + s + 1: b + s + 1] = np.bitwise_or.accumulate(label[a:b], axis=0)
    return TensorizedAutomaton(
        edge_src=e_src2.astype(np.int32), edge_dst=e_dst2.astype(np.int32),
        out_start=out_start, out_dst=out_dst, cum_masks=cum,
        dist=np.minimum(dist2, INF_DIST).astype(np.int32),
        num_states=S2, vocab_size=V, initial_state=int(new_id[0]),
        final_state=int(new_id[final]), dead_state=dead2, eos_id=int(eos), key=key)


def cache_key(kind: str, source: str, options: dict, vocab: Vocabulary) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([kind, source, options, vocab.fingerprint, FORMAT_VERSION],
                        sort_keys=True, default=str).encode())
    return h.hexdigest()[:40]
