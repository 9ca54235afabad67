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
from .limits import current_limits, too_large
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
@dataclass(frozen=True)
class Lifted:
    """Token transitions of a byte DFA over a vocabulary (see :func:`lift_transitions`).

    ``states``: the DFA states reachable from the start by whole tokens, BFS order
    (start first); every other array indexes into it. Transitions come in two forms,
    disjoint: individual ones ``src[i] --tok[i]--> dst[i]``, and bulk ones — every token
    of the packed set ``rows[bulk_row[j]]`` (uint32 ``[R, W]``) goes
    ``bulk_src[j] --> bulk_dst[j]``.
    """

    states: np.ndarray
    src: np.ndarray
    tok: np.ndarray
    dst: np.ndarray
    bulk_src: np.ndarray
    bulk_dst: np.ndarray
    bulk_row: np.ndarray
    rows: np.ndarray

    def triples(self, vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All transitions as ``(src, tok, dst)`` (bulk ones expanded; for tests)."""
        src, tok, dst = [self.src], [self.tok], [self.dst]
        for s, d, r in zip(self.bulk_src, self.bulk_dst, self.bulk_row):
            t = np.nonzero(unpack_bits(self.rows[r], vocab_size))[0]
            src.append(np.full(len(t), s))
            tok.append(t)
            dst.append(np.full(len(t), d))
        return (np.concatenate(src).astype(np.int64), np.concatenate(tok).astype(np.int64),
                np.concatenate(dst).astype(np.int64))


class _Out(tuple):
    """``(src list, token list, dst list)`` of individual transitions, with a running
    count checked against ``CompileLimits.max_token_transitions`` before each append."""

    def __new__(cls):
        self = super().__new__(cls, ([], [], []))
        self.n = 0
        self.max = current_limits().max_token_transitions
        return self


def _count(out, k: int) -> None:
    if isinstance(out, _Out):
        out.n += k
        if out.n > out.max:
            raise too_large("max_token_transitions", out.n, "(state, token) transitions",
                            "lift over the vocabulary", at_least=True)


def _walk(trie, table: np.ndarray, dead: int, src, node, cur, max_pairs: int, out) -> None:
    """Continue the trie walk from ``(src, node, cur)`` pairs (``node``'s byte already
    read, DFA now in ``cur``): emit ``(src, token, state)`` for every token ending at or
    below ``node`` whose bytes keep the DFA alive. Frontiers larger than ``max_pairs``
    are split (depth first), which bounds memory."""
    end_token, ccount, cstart, nbyte = trie.end_token, trie.child_count, trie.child_start, \
        trie.node_byte
    stack = [(src, node, cur)]
    while stack:
        src, node, cur = stack.pop()
        et = end_token[node]
        ends = et >= 0
        if ends.any():
            _count(out, int(np.count_nonzero(ends)))
            out[0].append(src[ends])
            out[1].append(et[ends])
            out[2].append(cur[ends])
        multi = et == -2                               # duplicate byte strings (rare)
        if multi.any():
            n_m = node[multi]
            c_m = trie.end_start[n_m + 1] - trie.end_start[n_m]
            reps = np.repeat(np.arange(len(n_m)), c_m)
            offs = np.repeat(trie.end_start[n_m] - (np.cumsum(c_m) - c_m), c_m)
            _count(out, len(reps))
            out[0].append(src[multi][reps])
            out[1].append(trie.end_tokens[offs + np.arange(len(reps))])
            out[2].append(cur[multi][reps])
        cc = ccount[node]
        keep = cc > 0
        if not keep.all():
            node, cur, src, cc = node[keep], cur[keep], src[keep], cc[keep]
        if len(node) == 0:
            continue
        csum = np.cumsum(cc)
        total = int(csum[-1])
        reps = np.repeat(np.arange(len(node)), cc)
        child = np.repeat(cstart[node] - (csum - cc), cc) + np.arange(total)
        nxt = table[cur[reps], nbyte[child]]
        alive = np.nonzero(nxt != dead)[0]
        if len(alive) == 0:
            continue
        src, node, cur = src[reps[alive]], child[alive], nxt[alive]
        for i in range(0, len(src), max_pairs):
            stack.append((src[i:i + max_pairs], node[i:i + max_pairs], cur[i:i + max_pairs]))


def _run_groups(dfa: DFA, min_bytes: int):
    """Candidate byte sets for run shortcuts: for each state, the bytes leading to its
    most common successor (its "dominant" target); states grouped by that byte set.
    Yields ``(sigma bool[256], member states)`` for sets of at least ``min_bytes``."""
    Q, C = dfa.trans.shape
    trans = np.where(dfa.trans >= 0, dfa.trans, Q).astype(np.int64)
    size = np.bincount(dfa.byte_class, minlength=C)
    key = (np.arange(Q)[:, None] * (Q + 1) + trans).ravel()
    uk, inv = np.unique(key, return_inverse=True)
    cnt = np.bincount(inv.ravel(), weights=np.tile(size, Q))
    tq, tt = uk // (Q + 1), uk % (Q + 1)
    cnt[tt == Q] = -1
    order = np.lexsort((-cnt, tq))
    first = order[np.searchsorted(tq[order], np.arange(Q))]
    dom, dom_bytes = tt[first], cnt[first]
    cand = np.nonzero((dom != Q) & (dom_bytes >= min_bytes))[0]
    if len(cand) == 0:
        return
    sig = trans[cand] == dom[cand, None]                              # [n, C]
    _, ginv = np.unique(np.packbits(sig, axis=1), axis=0, return_inverse=True)
    ginv = ginv.ravel()
    for g in range(int(ginv.max()) + 1):
        members = cand[ginv == g]
        yield sig[np.argmax(ginv == g)][dfa.byte_class], members


def _run_shortcut(trie, table: np.ndarray, dead: int, sigma: np.ndarray, members: np.ndarray,
                  vocab_size: int, min_tokens: int):
    """Lift the tokens spelled only with bytes of ``sigma`` in bulk.

    For a state ``q`` whose run ``c_0 = q, c_{j+1} = D(c_j)`` only visits states where
    every byte of ``sigma`` leads to one and the same state ``D(c_j)`` (or none), a
    token of ``L`` bytes all in ``sigma`` goes to ``c_L`` — for all such tokens at once.
    (Inside a JSON string with ``maxLength: 80`` the run is the 80-state counter; in an
    unbounded string body it is a self-loop.) Every other token has a first byte outside
    ``sigma``, at a trie node of depth ``k`` (an "exit" node) reached in state ``c_k``:
    the walk starts there, so only those subtrees are walked.

    Returns ``None`` (not worth it / no member qualifies) or
    ``(ok_members, chain [Lp+1, G], exit nodes, pure tokens, their lengths)``.
    """
    if int(trie.tokens_by_first_byte[sigma].sum()) < min_tokens:
        return None
    N = trie.num_nodes
    ls = trie.level_start
    parent = trie.parent
    in_sigma = sigma[trie.node_byte]
    pure = in_sigma.copy()
    for j in range(1, len(ls) - 1):
        a, b = ls[j], ls[j + 1]
        lvl = pure[a:b]
        lvl &= pure[parent[a:b]]
        if not lvl.any():
            pure[b:] = False
            break
    ends = np.nonzero(pure & (trie.end_token != -1))[0]
    if len(ends) == 0 or np.count_nonzero(trie.end_token[ends] >= 0) < min_tokens:
        return None
    depth = trie.depth
    pure_depth = int(depth[pure].max()) + 1                # longest all-sigma prefix (bytes)
    # D: the common sigma-successor of each state (dead absorbs; -1: not uniform)
    sub = table[:, sigma]
    D = np.where((sub == sub[:, :1]).all(1), sub[:, 0], -1)
    chain = np.empty((pure_depth + 1, len(members)), np.int64)
    chain[0] = members
    ok = np.ones(len(members), bool)
    for j in range(pure_depth):
        d = D[chain[j]]
        ok &= d >= 0
        chain[j + 1] = np.where(d >= 0, d, dead)
    if not ok.any():
        return None
    parent_pure = np.ones(N, bool)
    parent_pure[ls[1]:] = pure[parent[ls[1]:]]
    exits = np.nonzero(~in_sigma & parent_pure)[0]
    # pure tokens (with duplicates of a byte string expanded) and their lengths
    c_e = trie.end_start[ends + 1] - trie.end_start[ends]
    reps = np.repeat(np.arange(len(ends)), c_e)
    offs = np.repeat(trie.end_start[ends] - (np.cumsum(c_e) - c_e), c_e)
    toks = trie.end_tokens[offs + np.arange(len(reps))]
    lens = depth[ends][reps] + 1
    return ok, chain[:, ok], exits, toks, lens


def _second_level(trie, table: np.ndarray, dead: int, sigma: np.ndarray, members: np.ndarray,
                  min_tokens: int, W: int):
    """Bulk transitions for tokens ``b + (bytes of sigma)*`` from run members.

    A token's first byte ``b`` outside ``sigma`` (an exit at depth 0, e.g. the space of
    ``" hello"``) may lead from member ``g`` straight into another member ``h`` of the
    same run (the next word of ``(\\w{1,12} ){3,8}``): then the rest of the token, if
    all in ``sigma``, follows ``h``'s chain, and every such token of ``m + 1`` bytes goes
    ``g -> chain_h[m]`` at once. Tokens below ``b`` that leave ``sigma`` again are
    walked from that second exit only. Returns ``None`` or ``(handled (exit node,
    member index) codes, packed rows [R, W], bulk src, bulk dst, bulk row, walk starts
    (src, node, cur))``.
    """
    ls = trie.level_start
    if len(ls) < 3 or len(members) == 0:
        return None
    n0 = int(ls[1])
    node_byte = trie.node_byte
    x0 = np.nonzero(~sigma[node_byte[:n0]])[0]               # depth-0 exits (node ids)
    if len(x0) == 0:
        return None
    G = len(members)
    pos = np.full(dead + 1, -1, np.int64)
    pos[members] = np.arange(G)
    tgt = pos[table[members[None, :], node_byte[x0][:, None]]]          # [X0, G]
    if not (tgt >= 0).any():
        return None
    N = trie.num_nodes
    parent, depth = trie.parent, trie.depth
    in_sigma = sigma[node_byte]
    pa = np.zeros(N, bool)                      # all bytes after the first are in sigma
    anc = np.arange(N)                          # depth-0 ancestor
    for j in range(1, len(ls) - 1):
        a, b = ls[j], ls[j + 1]
        anc[a:b] = anc[parent[a:b]]
        pa[a:b] = in_sigma[a:b] & (pa[parent[a:b]] if j >= 2 else True)
    ex_mask = np.zeros(N, bool)
    ex_mask[x0[(tgt >= 0).any(1)]] = True
    pure = (pa | (np.arange(N) < n0)) & ex_mask[anc]
    ends = np.nonzero(pure & (trie.end_token != -1))[0]
    if len(ends) < min_tokens:
        return None
    # chains from every member, long enough for the deepest all-sigma suffix; a target
    # member qualifies only if its chain is uniform all the way
    M = int(depth[pure].max())
    sub = table[:, sigma]
    D = np.where((sub == sub[:, :1]).all(1), sub[:, 0], -1)
    chain = np.empty((M + 1, G), np.int64)
    chain[0] = members
    ok = np.ones(G, bool)
    for k in range(M):
        d = D[chain[k]]
        ok &= d >= 0
        chain[k + 1] = np.where(d >= 0, d, dead)
    tgt = np.where(tgt >= 0, np.where(ok[np.maximum(tgt, 0)], tgt, -1), -1)
    xi, gi = np.nonzero(tgt >= 0)
    if len(xi) == 0:
        return None
    # rows: tokens by (first node, suffix length)
    c_e = trie.end_start[ends + 1] - trie.end_start[ends]
    reps = np.repeat(np.arange(len(ends)), c_e)
    offs = np.repeat(trie.end_start[ends] - (np.cumsum(c_e) - c_e), c_e)
    toks = trie.end_tokens[offs + np.arange(len(reps))]
    key = anc[ends][reps] * (M + 1) + depth[ends][reps]
    ukey, rinv = np.unique(key, return_inverse=True)
    rows = np.zeros(len(ukey) * W, np.uint32)
    np.bitwise_or.at(rows, rinv.ravel() * W + (toks >> 5),
                     np.left_shift(np.uint32(1), (toks & 31).astype(np.uint32)))
    rows = rows.reshape(len(ukey), W)
    row_x, row_m = ukey // (M + 1), ukey % (M + 1)             # sorted by first node
    # bulk edges: each handled pair (first node x, member g -> member h) x rows of x
    px, pg, ph = x0[xi], gi, tgt[xi, gi]
    r_lo = np.searchsorted(row_x, px)
    r_cnt = np.searchsorted(row_x, px, side="right") - r_lo
    pr = np.repeat(np.arange(len(px)), r_cnt)
    ridx = np.repeat(r_lo - (np.cumsum(r_cnt) - r_cnt), r_cnt) + np.arange(int(r_cnt.sum()))
    bdst = chain[row_m[ridx], ph[pr]]
    live = bdst != dead
    bsrc, bdst, brow = members[pg[pr]][live], bdst[live], ridx[live]
    # second exits below each handled first node: first byte outside sigma again
    sec = np.nonzero((depth >= 1) & ~in_sigma & ex_mask[anc])[0]
    sec = sec[(depth[sec] == 1) | pa[parent[sec]]]
    order = np.argsort(anc[sec], kind="stable")
    sec = sec[order]
    sec_x = anc[sec]
    s_lo = np.searchsorted(sec_x, px)
    s_cnt = np.searchsorted(sec_x, px, side="right") - s_lo
    ps = np.repeat(np.arange(len(px)), s_cnt)
    sidx = np.repeat(s_lo - (np.cumsum(s_cnt) - s_cnt), s_cnt) + np.arange(int(s_cnt.sum()))
    y = sec[sidx]
    cur = table[chain[depth[y] - 1, ph[ps]], node_byte[y]]
    go = cur != dead
    starts = (members[pg[ps]][go], y[go], cur[go])
    handled = px * G + pg
    return handled, rows, bsrc, bdst, brow, starts


def lift_transitions(dfa: DFA, vocab: Vocabulary, max_pairs: int = 1 << 20,
                     min_run_bytes: int = 8, min_run_tokens: int = 64) -> Lifted:
    """All token transitions from DFA states reachable by whole tokens.

    Vectorised over (state, trie node) pairs: the vocabulary's byte trie is walked
    level by level for many states at once, a pair is dropped as soon as the DFA dies,
    and shared token prefixes are read once. States inside long runs of "any of these
    bytes" (string bodies, counted repetitions like ``{0,80}``, ``[a-z]+``) get the
    tokens spelled only with those bytes in bulk, as packed bit rows, and are walked
    only below the first byte outside the run (see :func:`_run_shortcut`): the cost
    follows the number of (state, prefix) pairs that are not in such a run.
    """
    trie = vocab.trie
    Q = dfa.num_states
    V = vocab.vocab_size
    W = (V + 31) // 32
    table = np.full((Q + 1, 256), Q, np.int32)
    bt = dfa.byte_table()
    table[:Q] = np.where(bt >= 0, bt, Q)

    out = _Out()
    bulk_src, bulk_dst, bulk_row, rows = [], [], [], []
    n_rows = 0
    shortcut = np.zeros(Q, bool)
    for sigma, members in _run_groups(dfa, min_run_bytes):
        res = _run_shortcut(trie, table, Q, sigma, members, V, min_run_tokens)
        if res is None:
            continue
        ok, chain, exits, toks, lens = res
        members = members[ok]
        shortcut[members] = True
        # bulk rows: the pure tokens of each length
        uL, li = np.unique(lens, return_inverse=True)
        packed = np.zeros(len(uL) * W, np.uint32)
        np.bitwise_or.at(packed, li.ravel() * W + (toks >> 5),
                         np.left_shift(np.uint32(1), (toks & 31).astype(np.uint32)))
        rows.append(packed.reshape(len(uL), W))
        dst = chain[uL]                                             # [nL, G]
        li2, gi = np.nonzero(dst != Q)
        bulk_src.append(members[gi])
        bulk_dst.append(dst[li2, gi])
        bulk_row.append(n_rows + li2)
        n_rows += len(uL)
        # tokens "b + sigma*" whose first byte b leads into another member: in bulk
        second = _second_level(trie, table, Q, sigma, members, min_run_tokens, W)
        handled = None
        if second is not None:
            handled, rows2, bs2, bd2, br2, (ws, wn, wc) = second
            _count(out, len(bs2))
            rows.append(rows2)
            bulk_src.append(bs2)
            bulk_dst.append(bd2)
            bulk_row.append(n_rows + br2)
            n_rows += len(rows2)
            for i in range(0, len(ws), max_pairs):
                _walk(trie, table, Q, ws[i:i + max_pairs], wn[i:i + max_pairs],
                      wc[i:i + max_pairs], max_pairs, out)
        # walk below the exit nodes, chunked over members
        xb = trie.node_byte[exits]
        xd = trie.depth[exits]
        G = len(members)
        step = max(1, max_pairs // max(len(exits), 1))
        for g0 in range(0, len(members), step):
            before = chain[:, g0:g0 + step][xd]                      # [X, g]
            nxt = table[before, xb[:, None]]
            xi, gi = np.nonzero(nxt != Q)
            if handled is not None and len(xi):
                keep = ~np.isin(exits[xi] * G + g0 + gi, handled)
                xi, gi = xi[keep], gi[keep]
            if len(xi):
                _walk(trie, table, Q, members[g0 + gi], exits[xi], nxt[xi, gi], max_pairs, out)

    normal = np.nonzero(~shortcut)[0]
    if len(normal):
        first_bytes = np.nonzero(trie.first_node >= 0)[0]
        first_nodes = trie.first_node[first_bytes]
        step = max(1, max_pairs // max(len(first_bytes), 1))
        for g0 in range(0, len(normal), step):
            qs = normal[g0:g0 + step]
            cur = table[qs[:, None], first_bytes[None, :]]
            fi, bi = np.nonzero(cur != Q)
            if len(fi):
                _walk(trie, table, Q, qs[fi], first_nodes[bi], cur[fi, bi], max_pairs, out)

    def cat(parts, dtype=np.int64):
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    src, tok, dst = cat(out[0]), cat(out[1]), cat(out[2])
    bsrc, bdst, brow = cat(bulk_src), cat(bulk_dst), cat(bulk_row)
    rows = np.concatenate(rows) if rows else np.zeros((0, W), np.uint32)

    # states reachable from the start by whole tokens, BFS order
    pairs = np.unique(np.concatenate([src * Q + dst, bsrc * Q + bdst]))
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
    bkeep = remap[bsrc] >= 0
    return Lifted(np.array(order), remap[src[keep]], tok[keep], remap[dst[keep]],
                  remap[bsrc[bkeep]], remap[bdst[bkeep]], brow[bkeep], rows)


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
    lifted = lift_transitions(dfa, vocab)
    states = lifted.states
    n_live = len(states)
    final, dead = n_live, n_live + 1
    S = n_live + 2
    acc = np.nonzero(dfa.accepting[states])[0]
    eos = vocab.eos_id
    src = np.concatenate([lifted.src, acc, [final]])
    dst = np.concatenate([lifted.dst, np.full(len(acc), final), [final]])
    tok = np.concatenate([lifted.tok, np.full(len(acc) + 1, eos)])
    n_ind = len(src)
    src = np.concatenate([src, lifted.bulk_src])
    dst = np.concatenate([dst, lifted.bulk_dst])

    # group into edges (unique (src, dst) pairs)
    pair = src * S + dst
    if S * S <= (1 << 22):                                 # dense lookup: <= 32 MB
        present = np.bincount(pair, minlength=S * S) > 0
        uniq = np.nonzero(present)[0]
        lookup = np.zeros(S * S, np.int64)
        lookup[uniq] = np.arange(len(uniq))
        edge_of_pair = lookup[pair]
    else:
        uniq, edge_of_pair = np.unique(pair, return_inverse=True)
        edge_of_pair = edge_of_pair.ravel()
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
    pe_all = edge_rank[edge_of_pair]

    V = vocab.vocab_size
    W = (V + 31) // 32
    out_start = np.searchsorted(e_src2, np.arange(S2 + 1)).astype(np.int32)
    deg = np.diff(out_start)
    D = max(int(deg.max()) if S2 else 1, 1)
    table_bytes = 4 * ((E + S2) * W + S2 * D + 2 * E + 2 * S2 + 1)
    if table_bytes > current_limits().max_table_bytes:
        raise too_large("max_table_bytes", table_bytes,
                        f"bytes of tables ({S2:,} states, {E:,} edges, {V:,} tokens)", "tensorize")
    dead2 = int(new_id[dead])
    out_dst = np.full((S2, D), dead2, np.int32)
    col = np.arange(E) - out_start[e_src2]
    out_dst[e_src2, col] = e_dst2

    # labels -> packed words. Out-labels of a state are disjoint (DFA), and so are
    # the bulk rows and individual tokens of one edge: OR == sum everywhere below.
    # cum_masks row base[s] + k = L_{e_1} | ... | L_{e_k}: rows of a state's block are
    # filled by a running sum (no carries: disjoint bits).
    cum = np.zeros((E + S2, W), np.uint32)
    row_of_edge = np.arange(E) + e_src2 + 1                      # base[src] + rank + 1
    pe = pe_all[:n_ind]
    ok = pe >= 0
    pe, ptok = pe[ok], tok[ok]
    flat = cum.reshape(-1)
    np.bitwise_or.at(flat, row_of_edge[pe] * W + (ptok >> 5),
                     np.left_shift(np.uint32(1), (ptok & 31).astype(np.uint32)))
    be = pe_all[n_ind:]
    bok = be >= 0
    for e, r in zip(row_of_edge[be[bok]].tolist(), lifted.bulk_row[bok].tolist()):
        cum[e] |= lifted.rows[r]
    for s in np.nonzero(deg > 1)[0].tolist():
        # row by row: NumPy's cumsum along axis 0 is strided and ~4x slower
        a = int(out_start[s]) + s + 1
        for r in range(a + 1, int(out_start[s + 1]) + s + 1):
            np.add(cum[r], cum[r - 1], out=cum[r])
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
