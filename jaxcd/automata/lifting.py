"""Token lifting and tensorization (host side, NumPy) — docs/design.md §2.

A byte-level DFA ``D`` is lifted over the vocabulary into the token-level automaton
``M``: its states are the states of ``D`` reachable from the start by whole
tokens, plus the terminal state ``⊥`` (``final_state``) and an explicit ``dead``
state (no edges; makes state updates total so particles keep fixed shapes).
Edges are grouped by ``(source, destination)``; edge ``e`` carries the label set
``L_e``. EOS edges go from every accepting state to ``⊥``; ``⊥`` has an EOS
self-loop (padding). States that cannot reach ``⊥`` are removed (trimmed), so
``β_∞ = 1`` on every live state.

:func:`lift_transitions` lifts the byte DFA over the vocabulary (:class:`Lifted`:
individual ``(state, token)`` transitions, and bulk ones for runs of states whose tokens
share a label set); :func:`tensorize` groups them into edges, trims, orders the edges,
finds the distinct cumulative mask rows (:func:`_dedupe_rows`, :func:`_materialize_rows`)
and returns a :class:`~jaxcd.automata.tensorized.TensorizedAutomaton` (its storage
layout is described in :mod:`jaxcd.automata.tensorized`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ..errors import EmptyLanguageError
from ..limits import current_limits, too_large
from .bits import unpack_bits
from .fsa import (DFA, _argsort_ints, _group_rows, _ranges_of, _unique_first_inverse,
                  _unique_ints)
from .tensorized import INF_DIST, TensorizedAutomaton

if TYPE_CHECKING:
    from ..vocab import Vocabulary


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


class _ByteTable:
    """The DFA's next state by byte, ``table[q, b]`` (``q`` up to ``Q``; dead -> ``Q``,
    row ``Q`` all dead), indexed like an int32 ``[Q + 1, 256]`` array (``table[q, b]``,
    ``table[q]``: whole rows, ``table[:, bytes]``) but stored by byte class
    (``[Q + 1, C]``, each lookup maps the bytes through ``byte_class``): the byte table
    of a 30,000-state DFA is 30 MB of freshly touched memory, several times the class
    table's cost to fill."""

    def __init__(self, dfa: DFA):
        Q, C = dfa.trans.shape
        ctab = np.empty((Q + 1, C), np.int32)
        np.copyto(ctab[:Q], dfa.trans)
        ctab[Q] = Q
        np.putmask(ctab[:Q], ctab[:Q] < 0, Q)
        self.ctab, self.bc = ctab, dfa.byte_class

    def __len__(self) -> int:
        return len(self.ctab)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            rows, byts = key
            if isinstance(byts, slice):
                return self.ctab[rows][..., self.bc[byts]]
            cls = self.bc[byts]
            if isinstance(rows, slice) and rows == slice(None) and \
                    np.array_equal(cls, np.arange(self.ctab.shape[1])):
                return self.ctab                 # table[:, a byte of each class]: no copy
            return self.ctab[rows, cls]
        return self.ctab[key][..., self.bc]


def _emit_ends(trie, src, node, cur, out) -> None:
    """Emit ``(src, token, cur)`` for every token ending at trie node ``node``."""
    et = trie.end_token[node]
    ends = et >= 0
    if ends.any():
        _count(out, int(np.count_nonzero(ends)))
        out[0].append(src[ends])
        out[1].append(et[ends])
        out[2].append(cur[ends])
    multi = et == -2                                   # duplicate byte strings (rare)
    if multi.any():
        n_m = node[multi]
        c_m = trie.end_start[n_m + 1] - trie.end_start[n_m]
        reps = np.repeat(np.arange(len(n_m)), c_m)
        offs = np.repeat(trie.end_start[n_m] - (np.cumsum(c_m) - c_m), c_m)
        _count(out, len(reps))
        out[0].append(src[multi][reps])
        out[1].append(trie.end_tokens[offs + np.arange(len(reps))])
        out[2].append(cur[multi][reps])


def _walk(trie, table: np.ndarray, dead: int, src, node, cur, max_pairs: int, out) -> None:
    """Continue the trie walk from ``(src, node, cur)`` pairs (``node``'s byte already
    read, DFA now in ``cur``): emit ``(src, token, state)`` for every token ending at or
    below ``node`` whose bytes keep the DFA alive. Frontiers larger than ``max_pairs``
    are split (depth first), which bounds memory."""
    ccount, cstart, nbyte = trie.child_count, trie.child_start, trie.node_byte
    stack = [(src, node, cur)]
    while stack:
        src, node, cur = stack.pop()
        _emit_ends(trie, src, node, cur, out)
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
    trans = dfa.trans
    Q, C = trans.shape
    # bytes per class, as prefix sums: a run of classes a..b has S[b + 1] - S[a] bytes
    S = np.concatenate([[0], np.cumsum(np.bincount(dfa.byte_class, minlength=C))])
    # per row, runs of adjacent classes with the same successor (few per row), then
    # the bytes per (row, successor) summed over its runs
    first = np.ones((Q, C), bool)
    np.not_equal(trans[:, 1:], trans[:, :-1], out=first[:, 1:])
    starts = np.flatnonzero(first)                      # every row starts a run
    ends = np.append(starts[1:], Q * C)                 # one past each run's last class
    nbytes = S[(ends - 1) % C + 1] - S[starts % C]
    row = starts // C
    key = row * (Q + 1) + (trans.reshape(-1)[starts] + 1)   # by row, then successor
    o = _argsort_ints(key)
    key, nbytes = key[o], nbytes[o]
    new = np.ones(len(key), bool)
    new[1:] = key[1:] != key[:-1]
    seg = np.flatnonzero(new)
    cnt = np.add.reduceat(nbytes, seg).astype(np.float64)
    key = key[seg]
    tt = key % (Q + 1) - 1                              # successor (-1: dead)
    rows = key // (Q + 1)
    cnt[tt < 0] = -1
    tt[tt < 0] = Q
    # most bytes, then smallest target (a row's successors are in ascending order)
    nseg = np.bincount(rows, minlength=Q)
    rowmax = np.maximum.reduceat(cnt, np.cumsum(nseg) - nseg)
    idx = np.flatnonzero(cnt == np.repeat(rowmax, nseg))
    firsts = idx[np.searchsorted(rows[idx], np.arange(Q))]
    dom, dom_bytes = tt[firsts], cnt[firsts]
    cand = np.nonzero((dom != Q) & (dom_bytes >= min_bytes))[0]
    if len(cand) == 0:
        return
    sig = dfa.trans[cand] == dom[cand, None]                          # [n, C]
    # group equal rows (in the lexicographic order of their packed bytes, as
    # np.unique(axis=0) would, without its slow sort of void records)
    packed = np.packbits(sig, axis=1)
    nb = -(-packed.shape[1] // 8) * 8
    packed = np.concatenate([packed, np.zeros((len(cand), nb - packed.shape[1]), np.uint8)], 1)
    cols = np.ascontiguousarray(packed).view(">u8")                    # [n, nb / 8]
    order = np.lexsort(cols.T[::-1])
    sc = cols[order]
    new = np.ones(len(cand), bool)
    new[1:] = (sc[1:] != sc[:-1]).any(1)
    ginv = np.empty(len(cand), np.int64)
    ginv[order] = np.cumsum(new) - 1
    by_group = _argsort_ints(ginv)
    bounds = np.searchsorted(ginv[by_group], np.arange(int(ginv.max()) + 2))
    for g in range(int(ginv.max()) + 1):
        idx = by_group[bounds[g]:bounds[g + 1]]
        yield sig[idx[0]][dfa.byte_class], cand[idx]


def _pure_nodes(trie, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Trie nodes whose whole byte path is in ``sigma`` ("pure", sorted) and the nodes
    whose byte is the first one outside ``sigma`` on their path ("exits", sorted).
    Work: the pure nodes and their children, not the whole trie."""
    nb, cstart, ccount = trie.node_byte, trie.child_start, trie.child_count
    roots = trie.first_node[trie.first_node >= 0]
    in_s = sigma[nb[roots]]
    frontier = roots[in_s]
    pure, exits = [frontier], [roots[~in_s]]
    while len(frontier):
        cc = ccount[frontier]
        keep = cc > 0
        frontier, cc = frontier[keep], cc[keep]
        if len(frontier) == 0:
            break
        csum = np.cumsum(cc)
        child = np.repeat(cstart[frontier] - (csum - cc), cc) + np.arange(int(csum[-1]))
        in_s = sigma[nb[child]]
        frontier = child[in_s]
        pure.append(frontier)
        exits.append(child[~in_s])
    return np.sort(np.concatenate(pure)), np.sort(np.concatenate(exits))


def _sigma_chain(table: np.ndarray, dead: int, sigma: np.ndarray, members: np.ndarray,
                 length: int) -> tuple[np.ndarray, np.ndarray]:
    """``chain[j + 1] = D(chain[j])`` from ``chain[0] = members`` (int64 ``[length + 1,
    G]``), where ``D(x)`` is the state every byte of ``sigma`` leads ``x`` to (``dead``
    absorbs); ``ok[g]``: ``D`` was defined all along ``g``'s chain. Only the states on
    the chains are looked at."""
    sb = np.nonzero(sigma)[0]
    chain = np.empty((length + 1, len(members)), np.int64)
    chain[0] = members
    ok = np.ones(len(members), bool)
    D = np.full(len(table), -2, np.int64)               # -2: not computed yet
    for j in range(length):
        x = chain[j]
        need = np.unique(x[D[x] == -2])                 # chains overlap: each state once
        if len(need):
            sub = table[need[:, None], sb[None, :]]
            D[need] = np.where((sub == sub[:, :1]).all(1), sub[:, 0], -1)
        d = D[x]
        ok &= d >= 0
        chain[j + 1] = np.where(d >= 0, d, dead)
    return chain, ok


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
    pure, exits = _pure_nodes(trie, sigma)
    ends = pure[trie.end_token[pure] != -1]
    if len(ends) == 0 or np.count_nonzero(trie.end_token[ends] >= 0) < min_tokens:
        return None
    depth = trie.depth
    pure_depth = int(depth[pure].max()) + 1                # longest all-sigma prefix (bytes)
    chain, ok = _sigma_chain(table, dead, sigma, members, pure_depth)
    if not ok.any():
        return None
    # pure tokens (with duplicates of a byte string expanded) and their lengths
    c_e = trie.end_start[ends + 1] - trie.end_start[ends]
    reps = np.repeat(np.arange(len(ends)), c_e)
    offs = np.repeat(trie.end_start[ends] - (np.cumsum(c_e) - c_e), c_e)
    toks = trie.end_tokens[offs + np.arange(len(reps))]
    lens = depth[ends][reps] + 1
    return ok, chain[:, ok], exits, toks, lens


def _into_run(trie, table: np.ndarray, dead: int, sigma: np.ndarray, members: np.ndarray,
              psrc: np.ndarray, px: np.ndarray, min_tokens: int, W: int, cache: dict):
    """Bulk transitions for tokens ``b + (bytes of sigma)*`` whose first byte ``b`` (the
    depth-0 trie node ``px[i]``) leads state ``psrc[i]`` into a member ``h`` of a run
    over ``sigma``: the rest of the token, if all in ``sigma``, follows ``h``'s chain, so
    every such token of ``m + 1`` bytes goes to ``chain_h[m]`` at once (one packed row
    per first byte and length, shared by all the sources; per first byte only where
    every chain used stays put, as in a string body). Tokens below ``b`` that leave
    ``sigma`` again are walked from that second exit only. ``cache``: per ``sigma``, the
    trie's all-in-sigma suffixes (reused across calls). Returns ``None`` or ``(index
    of the handled pairs, packed rows [R, W], bulk src, bulk dst, bulk row, walk starts
    (src, node, cur))``; the pairs not handled are left to the caller.
    """
    ls = trie.level_start
    if len(ls) < 3 or len(members) == 0 or len(psrc) == 0:
        return None
    node_byte = trie.node_byte
    G = len(members)
    pos = np.full(dead + 1, -1, np.int64)
    pos[members] = np.arange(G)
    tgt = pos[table[psrc, node_byte[px]]]
    if not (tgt >= 0).any():
        return None
    parent, depth = trie.parent, trie.depth
    ck = sigma.tobytes()
    if ck not in cache:
        N = trie.num_nodes
        in_sigma = sigma[node_byte]
        pa = np.zeros(N, bool)                  # all bytes after the first are in sigma
        anc = np.arange(N)                      # depth-0 ancestor
        for j in range(1, len(ls) - 1):
            a, b = ls[j], ls[j + 1]
            anc[a:b] = anc[parent[a:b]]
            pa[a:b] = in_sigma[a:b] & (pa[parent[a:b]] if j >= 2 else True)
        pa[:int(ls[1])] = True
        # second exits: first byte outside sigma after an all-sigma start, by first node
        sec = np.nonzero((depth >= 1) & ~in_sigma)[0]
        sec = sec[(depth[sec] == 1) | pa[parent[sec]]]
        sec = sec[_argsort_ints(anc[sec])]
        cache[ck] = (pa, anc, sec)
    pa, anc, sec = cache[ck]
    ex_mask = np.zeros(trie.num_nodes, bool)
    ex_mask[px[tgt >= 0]] = True
    pure = pa & ex_mask[anc]
    ends = np.nonzero(pure & (trie.end_token != -1))[0]
    if len(ends) < min_tokens:
        return None
    # chains from every member, long enough for the deepest all-sigma suffix; a target
    # member qualifies only if its chain is uniform all the way
    M = int(depth[pure].max())
    chain, ok = _sigma_chain(table, dead, sigma, members, M)
    tgt = np.where(tgt >= 0, np.where(ok[np.maximum(tgt, 0)], tgt, -1), -1)
    hi = np.nonzero(tgt >= 0)[0]
    if len(hi) == 0:
        return None
    px_, ps, ph = px[hi], psrc[hi], tgt[hi]
    # every chain used stays put (a string body's loop): one row per first byte
    used = np.unique(ph)
    flat = bool((chain[:, used] == chain[:1, used]).all())
    # rows: tokens by (first node, suffix length), or by first node
    c_e = trie.end_start[ends + 1] - trie.end_start[ends]
    reps = np.repeat(np.arange(len(ends)), c_e)
    offs = np.repeat(trie.end_start[ends] - (np.cumsum(c_e) - c_e), c_e)
    toks = trie.end_tokens[offs + np.arange(len(reps))]
    key = anc[ends][reps] * (M + 1) + (0 if flat else depth[ends][reps])
    ukey, rows = _pack_rows(key, toks, W)
    row_x, row_m = ukey // (M + 1), ukey % (M + 1)             # sorted by first node
    # bulk edges: each handled pair (first node x, source s -> member h) x rows of x
    r_lo = np.searchsorted(row_x, px_)
    r_cnt = np.searchsorted(row_x, px_, side="right") - r_lo
    pr = np.repeat(np.arange(len(px_)), r_cnt)
    ridx = _ranges_of(r_lo, r_cnt)
    bdst = chain[row_m[ridx], ph[pr]]
    live = bdst != dead
    bsrc, bdst, brow = ps[pr][live], bdst[live], ridx[live]
    # second exits below each handled first node
    sec_x = anc[sec]
    s_lo = np.searchsorted(sec_x, px_)
    s_cnt = np.searchsorted(sec_x, px_, side="right") - s_lo
    pw = np.repeat(np.arange(len(px_)), s_cnt)
    sidx = _ranges_of(s_lo, s_cnt)
    y = sec[sidx]
    cur = table[chain[depth[y] - 1, ph[pw]], node_byte[y]]
    go = cur != dead
    starts = (ps[pw][go], y[go], cur[go])
    return hi, rows, bsrc, bdst, brow, starts


_DEAD_F, _EXIT_F = -1, -2


@dataclass(frozen=True)
class _Fragment:
    """The one-character fragment of a run (see :func:`_fragment_of`): local ids ``0``
    (the run state, at a character boundary), ``1 .. m`` (inside a character) and
    ``m + 1`` (``END``: one character read). ``tf[f, b]``: local id after byte ``b``,
    ``_DEAD_F`` or (only for ``f = 0``) ``_EXIT_F`` (a byte that leaves the run)."""

    tf: np.ndarray          # int64 [m + 1, 256]
    tree_f: list            # per BFS level: local ids, their tree parents, their bytes
    tree_p: list
    tree_b: list
    sigma0: int             # a one-byte character (a byte of sigma)

    @property
    def m(self) -> int:
        return self.tf.shape[0] - 1


def _fragment_of(dfa: DFA, table: np.ndarray, dead: int, sigma: np.ndarray, r: int,
                 byte_rep: np.ndarray, max_depth: int = 3) -> "_Fragment | None":
    """Multi-byte characters of a run, read off its member ``r``.

    ``D(r)`` is the state every byte of ``sigma`` leads ``r`` to. The *inside* states are
    the states ``y ∉ {r, D(r)}`` reached from ``r`` by at most ``max_depth`` bytes (the
    rest of a UTF-8 character) whose every live transition goes inside or to ``D(r)``:
    from ``r``, a byte into an inside state starts a character that can only end in
    ``D(r)``. Returns ``None`` when there are none (the run has one-byte characters
    only)."""
    sb = np.nonzero(sigma)[0]
    T = int(table[r, sb[0]])
    trans = dfa.trans
    Q = dfa.num_states
    # candidates: within max_depth bytes of r, outside {r, T}
    skip = np.zeros(Q + 2, bool)                  # index Q: dead, Q + 1 (= -1): dead
    skip[[r, T, dead, -1]] = True
    is_cand = np.zeros(Q + 2, bool)
    frontier = _unique_ints(table[r][~sigma])
    frontier = frontier[~skip[frontier]]
    for _ in range(max_depth):
        new = frontier[~is_cand[frontier]]
        if len(new) == 0:
            break
        is_cand[new] = True
        frontier = _unique_ints(trans[new].ravel())
        frontier = frontier[~skip[frontier]]
    if not is_cand.any():
        return None
    # prune: inside states go inside, to D(r), or die (the largest such set)
    ok_target = is_cand.copy()
    ok_target[[T, -1]] = True
    cand = np.nonzero(is_cand)[0]
    while True:
        bad = ~ok_target[trans[cand]].all(1)
        if not bad.any():
            break
        ok_target[cand[bad]] = False
        cand = cand[~bad]
    if len(cand) == 0:
        return None
    is_cand = np.zeros(Q + 2, bool)
    is_cand[cand] = True
    # BFS from r inside the fragment: local ids, tree parents and bytes (a state's
    # successors in class order, first visits in BFS order)
    local_id = np.full(Q + 2, -1, np.int64)
    local_id[r] = 0
    order = [np.array([r], np.int64)]
    tree_f, tree_p, tree_b = [], [], []
    level = order[0]
    n_local = 1
    first_cls = np.nonzero(~sigma[byte_rep])[0]          # from r: bytes outside sigma
    while len(level):
        cs = first_cls if n_local == 1 else np.arange(len(byte_rep))
        z = trans[level[:, None], cs[None, :]].ravel()    # [level, classes], row-major
        par = np.repeat(level, len(cs))
        byt = np.tile(byte_rep[cs], len(level))
        keep = is_cand[z] & (local_id[z] < 0)
        z, par, byt = z[keep], par[keep], byt[keep]
        _, firsts = np.unique(z, return_index=True)
        firsts.sort()
        z, par, byt = z[firsts], par[firsts], byt[firsts]
        if len(z) == 0:
            break
        local_id[z] = n_local + np.arange(len(z))
        n_local += len(z)
        tree_f.append(local_id[z])
        tree_p.append(local_id[par])
        tree_b.append(byt.astype(np.int64))
        order.append(z)
        level = z
    local = {int(y): i for i, y in enumerate(np.concatenate(order).tolist())}
    m = len(local) - 1
    if m == 0:
        return None
    END = m + 1
    ids = np.full(Q + 1, _DEAD_F, np.int64)      # state -> local id (dead -> _DEAD_F)
    for y, f in local.items():
        ids[y] = f
    ids[T] = END
    states = np.array(sorted(local, key=local.get), np.int64)
    tf = ids[table[states]]                       # [m + 1, 256]
    row0 = tf[0]
    row0[~sigma & ~((row0 >= 1) & (row0 <= m))] = _EXIT_F
    row0[sigma] = END
    return _Fragment(tf, tree_f, tree_p, tree_b, int(sb[0]))


def _fragment_psi(frag: _Fragment, table: np.ndarray, dead: int, byte_rep: np.ndarray,
                  X: np.ndarray, ctab: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """For states ``X``: ``psi [m + 2, |X|]`` (``psi[f, i]``: the state of ``X[i]``'s
    fragment at local id ``f``; ``psi[m + 1]`` is ``D(X[i])``) and ``ok [|X|]``: ``X[i]``'s
    fragment has exactly the shape of ``frag`` — for every local id and byte class that
    the fragment defines, the transition lands where the shape says (or dies where it
    dies). A state whose every character byte dies matches with ``psi`` all dead."""
    m = frag.m
    psi = np.empty((m + 2, len(X)), np.int64)
    psi[0] = X
    psi[m + 1] = table[X, frag.sigma0]
    for f, p, b in zip(frag.tree_f, frag.tree_p, frag.tree_b):
        psi[f] = table[psi[p], b[:, None]]
    tf = frag.tf[:, byte_rep]                                   # [m + 1, C]
    defined = tf != _EXIT_F
    want = np.where(defined, tf, m + 2)                          # m + 2: dead
    ok = np.ones(len(X), bool)
    ctab = table[:, byte_rep] if ctab is None else ctab          # [Q + 1, C]
    step = max(1, (1 << 21) // tf.size)
    for i0 in range(0, len(X), step):
        p = np.concatenate([psi[:, i0:i0 + step], np.full((1, min(step, len(X) - i0)), dead)])
        got = ctab[p[:m + 1]]                                    # [m + 1, g, C] rows
        exp = p[want].transpose(0, 2, 1)                         # [m + 1, g, C]
        ok[i0:i0 + step] = ((got == exp) | ~defined[:, None, :]).all((0, 2))
    return psi, ok


def _pure_walk(trie, tf: np.ndarray, sid, node, n, f):
    """Walk the trie through a fragment's shape: pairs ``(sid, node)`` whose ``node`` is
    still to be read, at ``n`` characters read and local id ``f``. A byte that dies
    drops the pair; a byte that leaves the run (``_EXIT_F``) records an exit. Returns
    ``(tokens (sid, token, n, f) ending inside the run, exits (sid, node, n))``."""
    END = tf.shape[0]
    nb, cstart, ccount, et = trie.node_byte, trie.child_start, trie.child_count, \
        trie.end_token
    toks = ([], [], [], [])
    exits = ([], [], [])
    while len(node):
        g = tf[f, nb[node]]
        ex = g == _EXIT_F
        if ex.any():
            exits[0].append(sid[ex])
            exits[1].append(node[ex])
            exits[2].append(n[ex])
        live = g >= 0
        sid, node, n, g = sid[live], node[live], n[live], g[live]
        done = g == END
        n = n + done
        f = np.where(done, 0, g)
        e = et[node]
        one = e >= 0
        if one.any():
            for lst, a in zip(toks, (sid[one], e[one], n[one], f[one])):
                lst.append(a)
        multi = e == -2
        if multi.any():
            n_m = node[multi]
            c_m = trie.end_start[n_m + 1] - trie.end_start[n_m]
            reps = np.repeat(np.arange(len(n_m)), c_m)
            offs = np.repeat(trie.end_start[n_m] - (np.cumsum(c_m) - c_m), c_m)
            for lst, a in zip(toks, (sid[multi][reps], trie.end_tokens[offs + np.arange(len(reps))],
                                     n[multi][reps], f[multi][reps])):
                lst.append(a)
        cc = ccount[node]
        keep = cc > 0
        sid, node, n, f, cc = sid[keep], node[keep], n[keep], f[keep], cc[keep]
        if len(node) == 0:
            break
        csum = np.cumsum(cc)
        reps = np.repeat(np.arange(len(node)), cc)
        node = np.repeat(cstart[node] - (csum - cc), cc) + np.arange(int(csum[-1]))
        sid, n, f = sid[reps], n[reps], f[reps]

    def cat(parts):
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    return tuple(cat(t) for t in toks), tuple(cat(x) for x in exits)


def _first_byte_pairs(trie, ctab: np.ndarray, byte_class: np.ndarray, hit: np.ndarray):
    """``(source index, depth-0 trie node)`` pairs whose byte class ``hit`` (bool
    ``[n, C]``) marks: the class-level test expanded to the first bytes of the
    vocabulary in that class (few pairs hit, so the byte-level arrays stay small)."""
    n0 = int(trie.level_start[1]) if len(trie.level_start) > 1 else 0
    cls = byte_class[trie.node_byte[:n0]]
    order = _argsort_ints(cls)
    start = np.searchsorted(cls[order], np.arange(ctab.shape[1] + 1))
    si, ci = np.nonzero(hit)
    cnt = start[ci + 1] - start[ci]
    reps = np.repeat(np.arange(len(si)), cnt)
    idx = _ranges_of(start[ci], cnt)
    return si[reps], order[idx]


def _pack_rows(key: np.ndarray, toks: np.ndarray, W: int):
    """Tokens grouped by ``key``: ``(sorted distinct keys, packed rows uint32 [K, W])``."""
    ukey, inv = np.unique(key, return_inverse=True)
    rows = np.zeros(len(ukey) * W, np.uint32)
    np.bitwise_or.at(rows, inv.ravel() * W + (toks >> 5),
                     np.left_shift(np.uint32(1), (toks & 31).astype(np.uint32)))
    return ukey, rows.reshape(len(ukey), W)


def _fragment_run(trie, table: np.ndarray, dead: int, frag: _Fragment, byte_rep: np.ndarray,
                  members: np.ndarray, taken: np.ndarray, W: int, max_pairs: int, out):
    """Lift a run with multi-byte characters (:func:`_fragment_of`) in bulk.

    The run's states ``members`` (each with the fragment's exact shape) and the states
    inside their characters ("starts" ``(x, f)``: the state of ``x``'s fragment at local
    id ``f``) are lifted together. A token read from start ``(x, f)`` that stays in the
    run ends after ``n`` whole characters at local id ``f'`` — in state ``psi_{c_n}[f']``
    with ``c_0 = x``, ``c_{j+1} = D(c_j)`` (every state on the chain has the same
    shape) — so the tokens of each ``(f, n, f')`` form one packed row, shared by all
    members. Tokens leaving the run (a byte outside the characters at a character
    boundary) are walked from there; tokens ``b + (characters)`` whose first byte leads
    into a member ``h`` are bulk too, along ``h``'s chain (like :func:`_into_run`).
    States in ``taken`` are skipped.

    Returns ``None`` or ``(states lifted, rows, bulk src, bulk dst, bulk row, second)``;
    ``second(sources)`` lifts, for other states, the tokens ``b + (characters)`` whose
    first byte leads into a member (e.g. the space after a full word of
    ``(\\w{1,12} ) {3,8}``): it returns ``(handled (state, byte) pairs, bulk src, bulk
    dst, bulk row)`` (row numbers continue after this run's rows) and walks the rest of
    those tokens; the caller walks every other token of those states."""
    m = frag.m
    END = m + 1
    tf = frag.tf
    K = m + 1
    ctab = table[:, byte_rep]                                       # [Q + 1, C]
    # pure walks from every local id, from the vocabulary's root
    roots = trie.first_node[trie.first_node >= 0]
    sid0 = np.repeat(np.arange(K), len(roots))
    node0 = np.tile(roots, K)
    (t_sid, t_tok, t_n, t_f), (x_sid, x_node, x_n) = _pure_walk(
        trie, tf, sid0, node0, np.zeros(len(sid0), np.int64), sid0.copy())
    # second level: a first byte b (any: a member takes only the depth-0 exits of local
    # id 0, another state any byte into a member), then characters
    n0 = int(trie.level_start[1])
    is_exit = np.zeros(n0, bool)
    is_exit[x_node[(x_sid == 0) & (x_node < n0)]] = True
    x0 = np.arange(n0)
    if len(x0):
        cc = trie.child_count[x0]
        csum = np.cumsum(cc)
        s_sid = np.repeat(np.arange(len(x0)), cc)
        s_node = np.repeat(trie.child_start[x0] - (csum - cc), cc) + np.arange(int(csum[-1]))
        z = np.zeros(len(s_sid), np.int64)
        (u_sid, u_tok, u_n, u_f), (y_sid, y_node, y_n) = _pure_walk(trie, tf, s_sid, s_node, z, z)
        # the token of x0 itself (one byte, no character read)
        e = trie.end_start
        c0 = e[x0 + 1] - e[x0]
        r0 = np.repeat(np.arange(len(x0)), c0)
        off0 = _ranges_of(e[x0], c0)
        u_sid = np.concatenate([u_sid, r0])
        u_tok = np.concatenate([u_tok, trie.end_tokens[off0]])
        u_n = np.concatenate([u_n, np.zeros(len(r0), np.int64)])
        u_f = np.concatenate([u_f, np.zeros(len(r0), np.int64)])
        o = _argsort_ints(y_sid)
        y_sid, y_node, y_n = y_sid[o], y_node[o], y_n[o]
    else:
        u_sid = u_tok = u_n = u_f = y_sid = y_node = y_n = np.zeros(0, np.int64)
    length = int(max(t_n.max(initial=0), x_n.max(initial=0), u_n.max(initial=0),
                     y_n.max(initial=0)))
    # chains c_0 .. c_length of every member, with each chain state's fragment states
    G = len(members)
    col_of = np.full(dead + 1, -1, np.int64)
    col_of[dead] = 0
    cols = [np.full((m + 2, 1), dead, np.int64)]
    ncol = 1
    Dn = np.full(dead + 1, -2, np.int64)
    Dn[dead] = dead
    chain = np.empty((length + 1, G), np.int64)
    chain[0] = members
    ok = np.ones(G, bool)
    for j in range(length + 1):
        x = chain[j]
        need = np.unique(x[Dn[x] == -2])
        if len(need):
            psi, okn = _fragment_psi(frag, table, dead, byte_rep, need, ctab)
            col_of[need] = ncol + np.arange(len(need))
            ncol += len(need)
            cols.append(psi)
            Dn[need] = np.where(okn, psi[END], -1)
        d = Dn[x]
        ok &= d >= 0
        if j < length:
            chain[j + 1] = np.where(d >= 0, d, dead)
    if not ok.any():
        return None
    P = np.concatenate(cols, axis=1)                                # [m + 2, ncol]
    # starts (x, f): members with ok chains, each state once (skip taken ones)
    okg = np.nonzero(ok)[0]
    st_g = np.tile(okg, K)
    st_f = np.repeat(np.arange(K), len(okg))
    st_y = P[st_f, col_of[members[st_g]]]
    o = np.lexsort((st_f,))                                         # f = 0 first
    st_g, st_f, st_y = st_g[o], st_f[o], st_y[o]
    live = st_y != dead
    st_g, st_f, st_y = st_g[live], st_f[live], st_y[live]
    live = ~taken[st_y]
    st_g, st_f, st_y = st_g[live], st_f[live], st_y[live]
    _, first = np.unique(st_y, return_index=True)
    first = np.sort(first)
    st_g, st_f, st_y = st_g[first], st_f[first], st_y[first]
    if len(st_y) == 0:
        return None
    # first-level rows (f, n, f') and their bulk edges from every start
    NN = length + 1
    key = (t_sid * NN + t_n) * (m + 2) + t_f
    ukey, rows = _pack_rows(key, t_tok, W)
    r_sid = ukey // (NN * (m + 2))
    r_n = (ukey // (m + 2)) % NN
    r_f = ukey % (m + 2)
    lo = np.searchsorted(r_sid, st_f)
    cnt = np.searchsorted(r_sid, st_f, side="right") - lo
    ps = np.repeat(np.arange(len(st_y)), cnt)
    ridx = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
    bdst = P[r_f[ridx], col_of[chain[r_n[ridx], st_g[ps]]]]
    keep = bdst != dead
    bulk_src, bulk_dst, bulk_row = [st_y[ps][keep]], [bdst[keep]], [ridx[keep]]
    n_rows = len(rows)
    # second-level rows (x0, n, f')
    pos = np.full(dead + 1, -1, np.int64)
    pos[members[ok]] = np.nonzero(ok)[0]                          # members with ok chains
    if len(x0):
        ukey2, rows2 = _pack_rows((u_sid * NN + u_n) * (m + 2) + u_f, u_tok, W)
        q_sid = ukey2 // (NN * (m + 2))
        q_n = (ukey2 // (m + 2)) % NN
        q_f = ukey2 % (m + 2)
        all_rows = [rows, rows2]
        base2 = n_rows
        n_rows += len(rows2)
    else:
        all_rows = [rows]

    def second(src: np.ndarray, xi: np.ndarray, hi: np.ndarray):
        """Bulk edges and walks for pairs (source state, x0 index, member index h)."""
        lo = np.searchsorted(q_sid, xi)
        cnt = np.searchsorted(q_sid, xi, side="right") - lo
        pp = np.repeat(np.arange(len(xi)), cnt)
        ridx = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
        bdst = P[q_f[ridx], col_of[chain[q_n[ridx], hi[pp]]]]
        keep = bdst != dead
        # second exits: walk from h's chain state
        lo = np.searchsorted(y_sid, xi)
        cnt = np.searchsorted(y_sid, xi, side="right") - lo
        pw = np.repeat(np.arange(len(xi)), cnt)
        idx = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
        cur = table[chain[y_n[idx], hi[pw]], trie.node_byte[y_node[idx]]]
        go = cur != dead
        ws, wn, wc = src[pw][go], y_node[idx][go], cur[go]
        for i in range(0, len(ws), max_pairs):
            _walk(trie, table, dead, ws[i:i + max_pairs], wn[i:i + max_pairs],
                  wc[i:i + max_pairs], max_pairs, out)
        return src[pp][keep], bdst[keep], base2 + ridx[keep]

    # second level from the members themselves (starts at local id 0)
    handled = np.zeros(0, np.int64)
    s0 = st_f == 0
    g0 = st_g[s0]
    if len(x0) and len(g0):
        tgt = pos[table[members[g0][None, :], trie.node_byte[x0][:, None]]]   # [X0, g]
        tgt[~is_exit] = -1
        xi, gj = np.nonzero(tgt >= 0)
        if len(xi):
            bs, bd, br = second(members[g0[gj]], xi, tgt[xi, gj])
            bulk_src.append(bs)
            bulk_dst.append(bd)
            bulk_row.append(br)
            handled = np.sort(x0[xi] * G + g0[gj])
    # first-level exits: walk from the chain state at the exit's character boundary
    o = _argsort_ints(x_sid)
    x_sid, x_node, x_n = x_sid[o], x_node[o], x_n[o]
    step = max(1, max_pairs // max(1, len(x_node) // max(1, K)))
    for s0_ in range(0, len(st_y), step):
        sf, sg, sy = st_f[s0_:s0_ + step], st_g[s0_:s0_ + step], st_y[s0_:s0_ + step]
        lo = np.searchsorted(x_sid, sf)
        cnt = np.searchsorted(x_sid, sf, side="right") - lo
        pp = np.repeat(np.arange(len(sf)), cnt)
        idx = np.repeat(lo - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
        en = x_node[idx]
        cur = table[chain[x_n[idx], sg[pp]], trie.node_byte[en]]
        go = cur != dead
        if len(handled):
            d0 = np.flatnonzero(sf[pp] == 0)
            code = en[d0] * G + sg[pp[d0]]
            at = np.minimum(np.searchsorted(handled, code), len(handled) - 1)
            go[d0] &= handled[at] != code                   # (handled is sorted)
        if go.any():
            _walk(trie, table, dead, sy[pp][go], en[go], cur[go], max_pairs, out)

    def second_for(sources: np.ndarray, own_run: np.ndarray | None = None,
                   own_sig: np.ndarray | None = None):
        """The tokens ``b + (characters)`` of other states (see above), but for the
        first bytes ``b`` in ``own_sig[own_run[i]]`` (bool ``[., 256]``) for source
        ``i``."""
        if len(x0) == 0 or len(sources) == 0:
            return None
        si, xi = _first_byte_pairs(trie, ctab, table.bc, pos[ctab[sources]] >= 0)
        if own_run is not None:
            keep = ~own_sig[own_run[si], trie.node_byte[xi]]
            si, xi = si[keep], xi[keep]
        if len(si) == 0:
            return None
        bs, bd, br = second(sources[si], xi, pos[table[sources[si], trie.node_byte[xi]]])
        return sources[si] * 256 + trie.node_byte[xi], bs, bd, br

    return (st_y, np.concatenate(all_rows), np.concatenate(bulk_src),
            np.concatenate(bulk_dst), np.concatenate(bulk_row), second_for)


def _dominant_successor(trans: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per state ``q``, the successor ``r != q`` (not dead) that the most ``weight`` of
    byte classes leads to (ties: the smallest ``r``), or -1 if none has positive weight.
    Each row is sorted on its own (``C`` classes) and its runs of equal successors summed:
    no sort of all ``Q * C`` entries."""
    Q, C = trans.shape
    o = np.argsort(trans, axis=1, kind="stable")
    ss = np.take_along_axis(trans, o, 1).ravel()
    cw = np.cumsum(weight[o], axis=1).ravel()
    end = np.ones(Q * C, bool)                       # last entry of each run in its row
    end[:-1] = ss[1:] != ss[:-1]
    end[C - 1::C] = True
    ends = np.flatnonzero(end)
    rows = ends // C
    prev = np.concatenate([[-1], ends[:-1]])
    start_row = np.concatenate([[True], rows[1:] != rows[:-1]])
    tot = cw[ends] - np.where(start_row, 0.0, cw[np.maximum(prev, 0)])
    succ = ss[ends]
    tot[(succ < 0) | (succ == rows)] = -1            # dead is no reference, nor q itself
    # per row, the first run (smallest successor) with the row's largest total
    seg = np.flatnonzero(start_row)
    rowmax = np.maximum.reduceat(tot, seg)
    best = tot == np.repeat(rowmax, np.diff(np.append(seg, len(tot))))
    first = np.flatnonzero(best)
    first = first[np.concatenate([[True], rows[first][1:] != rows[first][:-1]])]
    ref = np.full(Q, -1, np.int64)
    ok = tot[first] > 0
    ref[rows[first][ok]] = succ[first][ok]
    return ref


def _delta_states(dfa: DFA, trie, max_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """States ``q`` to lift from a reference state ``r`` (``q``'s most common successor):
    where ``q`` and ``r`` go to the same state on byte ``b``, every token starting with
    ``b`` goes from ``q`` where it goes from ``r``. Kept when the tokens starting with a
    byte on which they differ (and ``q`` lives) are at most ``max_fraction`` of the
    tokens ``q`` can start; references are never lifted this way themselves.
    (An open object's "any key but the declared ones": after ``"na`` of a declared
    ``"name"``, every byte but ``m``, ``"`` and ``\\`` acts as in the plain key body.)
    Returns ``(q, r)`` arrays."""
    trans = dfa.trans
    Q, C = trans.shape
    if Q < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # tokens per byte class (first byte), then per state: the most tokens to one successor
    cls_tok = np.bincount(dfa.byte_class, weights=trie.tokens_by_first_byte, minlength=C)
    ref = _dominant_successor(trans, cls_tok)
    q = np.nonzero(ref >= 0)[0]
    r = ref[q]
    alive_tok = ((trans[q] >= 0) * cls_tok).sum(1)
    differ = (trans[q] != trans[r]) & (trans[q] >= 0)
    walk_tok = (differ * cls_tok).sum(1)
    ok = (walk_tok <= max_fraction * alive_tok) & (alive_tok > 0)
    q, r = q[ok], r[ok]
    keep = ~np.isin(q, r)                                         # references stay plain
    return q[keep].astype(np.int64), r[keep].astype(np.int64)


def _lift_deltas(trie, table, dead: int, vocab, delta_q, delta_r, out, bulk_src, bulk_dst,
                 bulk_row, rows, n_rows: int, W: int, max_pairs: int, max_rows: int,
                 pack_tokens: int = 256) -> int:
    """Transitions of the states of :func:`_delta_states`: their reference's, for the
    tokens whose first byte acts alike (bulk rows masked to those tokens; past
    ``max_rows`` new rows, expanded to individual transitions; the reference's
    individual transitions to a state that at least ``pack_tokens`` of them reach, as
    a new packed row within the same budget), and a walk for the others. A differing
    first byte ``b`` that starts at least ``pack_tokens`` tokens and leads ``q`` to a
    state acting as the reference's successor on all but a few second bytes (the
    declared key ``"user"`` after ``"use``, against the plain key body) is copied too,
    for the tokens whose second byte acts alike: only ``b`` itself and the others are
    walked. Appends to the lists; returns the new row count."""
    V = vocab.vocab_size
    mat, lens = vocab.byte_matrix
    ids = vocab.ordinary_ids
    fb = np.full(V, 256, np.int64)
    fb[ids[lens > 0]] = mat[lens > 0, 0]
    # the reference states' transitions so far (individual, then bulk), by source
    isrc = np.concatenate(out[0]) if out[0] else np.zeros(0, np.int64)
    itok = np.concatenate(out[1]) if out[1] else np.zeros(0, np.int64)
    idst = np.concatenate(out[2]) if out[2] else np.zeros(0, np.int64)
    refs = np.unique(delta_r)
    is_ref = np.zeros(dead + 1, bool)                       # by state (a lookup, no sort)
    is_ref[refs] = True
    sel = np.flatnonzero(is_ref[isrc])
    sel = sel[_argsort_ints(isrc[sel])]
    isrc, itok, idst = isrc[sel], itok[sel], idst[sel]
    i_lo = np.searchsorted(isrc, refs)
    i_hi = np.searchsorted(isrc, refs, side="right")
    bs = np.concatenate(bulk_src) if bulk_src else np.zeros(0, np.int64)
    bd = np.concatenate(bulk_dst) if bulk_dst else np.zeros(0, np.int64)
    br = np.concatenate(bulk_row) if bulk_row else np.zeros(0, np.int64)
    allrows = np.concatenate(rows) if rows else np.zeros((0, W), np.uint32)
    bsel = np.flatnonzero(is_ref[bs])
    bsel = bsel[_argsort_ints(bs[bsel])]
    bs, bd, br = bs[bsel], bd[bsel], br[bsel]
    b_lo = np.searchsorted(bs, refs)
    b_hi = np.searchsorted(bs, refs, side="right")
    sb = np.full(V, 256, np.int64)                           # second byte (256: none)
    if mat.shape[1] > 1:
        sb[ids[lens > 1]] = mat[lens > 1, 1]
    tab_q = table[delta_q]                                   # [n, 256]
    tab_r = table[delta_r]
    same = tab_q == tab_r
    n = len(delta_q)
    # a differing first byte b whose successor p acts as the reference's successor
    # R' = D(r, b) on every second byte c but a few (X): a token b + c + ... with c
    # outside X goes from q where it goes from r (D(p, c) = D(R', c)), so it is copied
    # too; only the token b itself and those with a second byte in X are walked. One
    # such byte per state (the one starting the most tokens), where that copies at
    # least half of its tokens.
    diff = ~same & (tab_q != dead) & (trie.first_node >= 0)[None, :]
    score = np.where(diff & (tab_r != dead), trie.tokens_by_first_byte[None, :], -1)
    ext_b = np.argmax(score, axis=1)
    has = score[np.arange(n), ext_b] >= pack_tokens
    ext_X = np.ones((n, 257), bool)                          # second bytes walked
    if has.any():
        tok2 = np.bincount(fb * 257 + sb, minlength=257 * 257)[:256 * 257].reshape(256, 257)
        hi = np.nonzero(has)[0]
        p_, r_ = tab_q[hi, ext_b[hi]], tab_r[hi, ext_b[hi]]
        X = table[p_] != table[r_]
        copied = (tok2[ext_b[hi], :256] * ~X).sum(1)
        good = copied * 2 >= trie.tokens_by_first_byte[ext_b[hi]]
        hi, X = hi[good], X[good]
        has[:] = False
        has[hi] = True
        ext_X[hi, :256] = X
    ext_b = np.where(has, ext_b, -1)
    # walk the tokens whose first byte differs (and keeps q alive), but for the extended
    # bytes: there, the token of that byte alone and the children in X
    diff[has, ext_b[has]] = False
    wi, wb = np.nonzero(diff)
    ws, wn, wc = delta_q[wi], trie.first_node[wb], tab_q[wi, wb].astype(np.int64)
    hi = np.nonzero(has)[0]
    if len(hi):
        eb = ext_b[hi]
        node = trie.first_node[eb]
        p_ = tab_q[hi, eb].astype(np.int64)
        # the token b alone (ends at its first node), then walks from the children in X
        _emit_ends(trie, delta_q[hi], node, p_, out)
        cc = trie.child_count[node]
        csum = np.cumsum(cc)
        reps = np.repeat(np.arange(len(hi)), cc)
        child = np.repeat(trie.child_start[node] - (csum - cc), cc) + np.arange(int(csum[-1]))
        cb = trie.node_byte[child]
        walk = ext_X[hi[reps], cb]
        reps, child, cb = reps[walk], child[walk], cb[walk]
        cur = table[p_[reps], cb]
        go = cur != dead
        ws = np.concatenate([ws, delta_q[hi[reps[go]]]])
        wn = np.concatenate([wn, child[go]])
        wc = np.concatenate([wc, cur[go].astype(np.int64)])
    # states with the same reference, the same differing bytes and the same extension
    # share their copies
    gkey = np.concatenate([delta_r[:, None].astype(np.int64),
                           np.packbits(same, axis=1).astype(np.int64), ext_b[:, None],
                           np.packbits(ext_X, axis=1).astype(np.int64)], axis=1)
    ginv = _row_ids(gkey)[1]
    order = _argsort_ints(ginv)
    bounds = np.searchsorted(ginv[order], np.arange(int(ginv.max()) + 2))
    new_rows, nq, nd, nr = [], [], [], []
    n_new = 0
    # rows by content: a packed copy here or a masked row in _delta_bulk that equals a
    # row already there (the references' own or a new one) takes its id
    by_content: dict = {}
    content = np.empty(len(allrows), np.int64)          # equal rows, one key
    for i, x in enumerate(allrows):
        xb = x.tobytes()
        first = by_content.setdefault(xb, i)
        content[i] = first
    # the references' individual transitions for the bytes that act alike, copied to
    # the group's states: groups where that leaves fewer than pack_tokens tokens at once
    # (chunks of at most max_pairs (group, transition) pairs), the others one by one
    same_pad = np.concatenate([same, np.zeros((n, 1), bool)], axis=1)
    G = len(bounds) - 1
    g_i0 = order[bounds[:-1]]                                # a member of each group
    g_k = np.searchsorted(refs, delta_r[g_i0])
    g_a, g_cnt = i_lo[g_k], (i_hi[g_k] - i_lo[g_k]).astype(np.int64)
    g_m = np.diff(bounds)                                    # members per group
    n_alike = np.zeros(G, np.int64)
    ends = np.cumsum(g_cnt)
    g0 = 0
    while g0 < G:
        g1 = max(g0 + 1, int(np.searchsorted(ends, ends[g0] - g_cnt[g0] + max_pairs,
                                             side="right")))
        c = g_cnt[g0:g1]
        pg = np.repeat(np.arange(g0, g1), c)
        pidx = _ranges_of(g_a[g0:g1], c)
        t = itok[pidx]
        i0 = g_i0[pg]
        ft = fb[t]
        ok = same_pad[i0, ft] | ((ft == ext_b[i0]) & ~ext_X[i0, sb[t]])
        n_alike[g0:g1] = np.bincount(pg[ok] - g0, minlength=g1 - g0)
        ok &= n_alike[pg] < pack_tokens
        pg, t, dd = pg[ok], t[ok], idst[pidx[ok]]
        if len(pg):
            mc = g_m[pg]
            rep = np.repeat(np.arange(len(pg)), mc)
            midx = _ranges_of(bounds[pg], mc)
            _count(out, len(rep))
            out[0].append(delta_q[order[midx]])
            out[1].append(t[rep])
            out[2].append(dd[rep])
        g0 = g1
    for g in np.flatnonzero(n_alike >= pack_tokens).tolist():
        members = order[bounds[g]:bounds[g + 1]]
        qs = delta_q[members]
        i0 = int(members[0])
        k = int(g_k[g])
        ok_b = same_pad[i0]
        e_b, e_X = int(ext_b[i0]), ext_X[i0]
        a, b = i_lo[k], i_hi[k]
        t = itok[a:b]
        ft = fb[t]
        ok = ok_b[ft] | ((ft == e_b) & ~e_X[sb[t]])
        t, dd = t[ok], idst[a:b][ok]
        if n_new < max_rows:
            # a destination reached by many tokens: one packed row shared by the
            # group's states, instead of a copy of each token per state (an open
            # object's key states copy ~35,000 tokens from their reference)
            ud, dinv, dcnt = np.unique(dd, return_inverse=True, return_counts=True)
            big = dcnt >= pack_tokens
            n_big = int(big.sum())
            if n_big and n_new + n_big <= max_rows:
                dinv = dinv.ravel()
                sel = big[dinv]
                slot = np.cumsum(big) - 1
                packed = np.zeros((n_big, W), np.uint32)
                tb = t[sel]
                np.bitwise_or.at(packed.reshape(-1), slot[dinv[sel]] * W + (tb >> 5),
                                 np.left_shift(np.uint32(1), (tb & 31).astype(np.uint32)))
                rid = np.empty(n_big, np.int64)
                for j, x in enumerate(packed):
                    xb = x.tobytes()
                    r_ = by_content.get(xb)
                    if r_ is None:
                        r_ = by_content[xb] = n_rows + n_new
                        new_rows.append(x[None, :])
                        n_new += 1
                    rid[j] = r_
                nq.append(np.repeat(qs, n_big))
                nd.append(np.tile(ud[big], len(qs)))
                nr.append(np.tile(rid, len(qs)))
                t, dd = t[~sel], dd[~sel]
        if len(t):
            _count(out, len(t) * len(qs))
            out[0].append(np.repeat(qs, len(t)))
            out[1].append(np.tile(t, len(qs)))
            out[2].append(np.tile(dd, len(qs)))
    # bulk transitions of the references, rows masked to the tokens that act alike:
    # one masked row per (row content, pattern of alike tokens) (groups of other
    # references with the same pattern share it; -1: empty), equal masked rows once
    n_new = _delta_bulk(order, bounds, gkey, refs, delta_q, delta_r, same, ext_b, ext_X, fb,
                        sb, b_lo, b_hi, br, bd, allrows, content, out, by_content, new_rows,
                        n_new, max_rows, (nq, nd, nr))
    if n_new:
        rows.append(np.concatenate(new_rows))
        n_rows += n_new
    if nq:                              # (rows of the references' own are reused too)
        bulk_src.append(np.concatenate(nq))
        bulk_dst.append(np.concatenate(nd))
        bulk_row.append(np.concatenate(nr))
    for i in range(0, len(ws), max_pairs):
        _walk(trie, table, dead, ws[i:i + max_pairs], wn[i:i + max_pairs],
              wc[i:i + max_pairs], max_pairs, out)
    return n_rows


def _delta_bulk(order, bounds, gkey, refs, delta_q, delta_r, same, ext_b, ext_X, fb, sb,
                b_lo, b_hi, br, bd, allrows, content, out, by_content: dict, new_rows: list,
                n_new: int, max_rows: int, acc, chunk_bytes: int = 4 << 20) -> int:
    """The bulk transitions of :func:`_lift_deltas`' groups (``order``/``bounds``): the
    reference's rows masked to the tokens that act alike, appended to ``acc`` (lists of
    sources, destinations and row ids). A masked row depends only on the row's content
    and the group's pattern of alike tokens (its key without the reference): it is
    computed once per such pair for all groups, stored once per content (new rows get
    ids ``len(allrows) + n_new`` in ``by_content``), and dropped where empty; past
    ``max_rows`` new rows, its tokens are individual transitions. Scratch is at most
    ``chunk_bytes`` at a time. Returns the new row count."""
    nq, nd, nr = acc
    n_rows, W = allrows.shape
    V = len(fb)
    gm = order[bounds[:-1]]                                  # a member of each group
    gk = np.searchsorted(refs, delta_r[gm])
    cnt = (b_hi[gk] - b_lo[gk]).astype(np.int64)
    gi = np.flatnonzero(cnt > 0)
    if len(gi) == 0:
        return n_new
    pfirst, pinv = _row_ids(gkey[gm[gi], 1:])
    prep = gm[gi[pfirst]]                                    # a member per pattern
    n_pat = len(prep)
    same_pad = np.concatenate([same[prep], np.zeros((n_pat, 1), bool)], axis=1)
    # (group, bulk transition of its reference) pairs, and their distinct
    # (row content, pattern) keys
    c = cnt[gi]
    pos = np.repeat(b_lo[gk[gi]] - (np.cumsum(c) - c), c) + np.arange(int(c.sum()))
    pg = np.repeat(np.arange(len(gi)), c)
    ufirst, uinv = _unique_first_inverse(content[br[pos]] * n_pat + pinv[pg])
    urow, upat = br[pos[ufirst]], pinv[pg[ufirst]]
    ids = np.full(len(ufirst), -1, np.int64)                 # -1: empty, -2: expanded
    # a row whose tokens' first bytes all act alike is kept whole (its own id), one
    # whose first bytes all differ (none the extended byte) is dropped: only the others
    # are masked (a run's entry rows have one first byte each)
    fset = _first_byte_sets(allrows, urow, fb)
    part = same_pad.copy()                                  # bytes with a token alike
    eb = ext_b[prep]
    part[eb >= 0, eb[eb >= 0]] = True
    whole = ~(fset & ~same_pad[upat]).any(axis=1)
    ids[whole] = urow[whole]
    todo = np.flatnonzero(~whole & (fset & part[upat]).any(axis=1))
    # the tokens that act alike, packed, for the patterns masked here
    need, kidx = np.unique(upat[todo], return_inverse=True)
    kidx = kidx.ravel()
    keep = np.empty((len(need), W), np.uint32)
    per = max(1, chunk_bytes // (3 * 32 * W))
    for p0 in range(0, len(need), per):
        pp = prep[need[p0:p0 + per]]
        a = same_pad[need[p0:p0 + per]][:, fb] | ((fb[None, :] == ext_b[pp, None])
                                                  & ~ext_X[pp][:, sb])
        pad = np.zeros((a.shape[0], W * 32), bool)
        pad[:, :V] = a
        keep[p0:p0 + per] = np.packbits(pad, axis=1, bitorder="little").view(np.uint32)
    per = max(1, min(len(todo), chunk_bytes // (8 * W)))
    buf = np.empty((2, per, W), np.uint32)                    # reused: no fresh pages
    for u0 in range(0, len(todo), per):
        tu = todo[u0:u0 + per]
        m = np.take(allrows, urow[tu], axis=0, out=buf[0, :len(tu)])
        m &= np.take(keep, kidx[u0:u0 + per], axis=0, out=buf[1, :len(tu)])
        for j in np.flatnonzero(m.any(axis=1)).tolist():
            xb = m[j].tobytes()
            r_ = by_content.get(xb)
            if r_ is None:
                if n_new >= max_rows:
                    ids[tu[j]] = -2
                    continue
                r_ = by_content[xb] = n_rows + n_new
                new_rows.append(m[j][None, :].copy())
                n_new += 1
            ids[tu[j]] = r_
    e = ids[uinv]
    live = np.flatnonzero(e >= 0)
    g_of = gi[pg[live]]
    mc = bounds[g_of + 1] - bounds[g_of]                     # members of each pair's group
    rep = np.repeat(live, mc)
    midx = np.repeat(bounds[g_of] - (np.cumsum(mc) - mc), mc) + np.arange(int(mc.sum()))
    nq.append(delta_q[order[midx]])
    nd.append(bd[pos[rep]])
    nr.append(e[rep])
    kpos = np.full(len(ufirst), -1, np.int64)
    kpos[todo] = kidx
    for p_ in np.flatnonzero(e == -2).tolist():              # past the row budget
        g = gi[pg[p_]]
        qs = delta_q[order[bounds[g]:bounds[g + 1]]]
        t = np.nonzero(unpack_bits(allrows[br[pos[p_]]] & keep[kpos[uinv[p_]]], V))[0]
        _count(out, len(t) * len(qs))
        out[0].append(np.repeat(qs, len(t)))
        out[1].append(np.tile(t, len(qs)))
        out[2].append(np.full(len(t) * len(qs), int(bd[pos[p_]]), np.int64))
    return n_new


def _first_byte_sets(rows: np.ndarray, idx: np.ndarray, fb: np.ndarray) -> np.ndarray:
    """bool ``[len(idx), 257]``: the first bytes of the tokens of row ``rows[idx[i]]``
    (``fb``: each token's first byte, 256 for none), from the row's nonzero bytes."""
    u, inv = np.unique(idx, return_inverse=True)
    out = np.zeros((len(u), 257), bool)
    if len(u):
        nb, flat, at = _nonzero_bytes(rows[u])
        bits = np.unpackbits(flat[at][:, None], axis=1, bitorder="little")   # [n, 8]
        i, j = np.nonzero(bits)
        tok = (at[i] % nb) * 8 + j
        out[at[i] // nb, fb[np.minimum(tok, len(fb) - 1)]] = True
    return out[inv.ravel()]


def _nonzero_bytes(rows: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Packed rows (uint32 ``[n, W]``, little-endian: byte ``k`` of a row holds tokens
    ``8k .. 8k + 7``) as ``(bytes per row, their flat bytes, the flat indices of the
    nonzero ones)``."""
    flat = np.ascontiguousarray(rows, dtype="<u4").view(np.uint8).reshape(-1)
    return 4 * rows.shape[1], flat, np.flatnonzero(flat)


def _row_ids(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Equal rows of an integer matrix ``[n, k]``: the first row of each group and each
    row's group id (``np.unique(axis=0)`` without sorting the rows)."""
    mult = np.random.default_rng(0x6A78).integers(1, 1 << 62, size=(2, x.shape[1]),
                                                  dtype=np.int64) | 1
    inv = _group_rows(x, mult)
    first = np.empty(int(inv.max()) + 1, np.int64)
    first[inv[::-1]] = np.arange(len(inv))[::-1]
    return first, inv


def _alive_tokens(table, members: np.ndarray, tok_by_byte: np.ndarray) -> float:
    """The mean number of tokens per member whose first byte keeps it alive."""
    per_class = np.bincount(table.bc, weights=tok_by_byte, minlength=table.ctab.shape[1])
    alive = (table.ctab[members] != len(table) - 1).sum(0)
    return float(alive @ per_class) / max(len(members), 1)


def lift_transitions(dfa: DFA, vocab: Vocabulary, max_pairs: int = 1 << 18,
                     min_run_bytes: int = 8, min_run_tokens: int = 64,
                     min_fragment_members: int = 64, delta: bool = True,
                     max_delta_fraction: float = 0.25, max_delta_rows: int = 4096,
                     delta_pack_tokens: int = 256) -> Lifted:
    """All token transitions from DFA states reachable by whole tokens.

    Vectorised over (state, trie node) pairs: the vocabulary's byte trie is walked
    level by level for many states at once, a pair is dropped as soon as the DFA dies,
    and shared token prefixes are read once. States inside long runs of "any of these
    bytes" (string bodies, counted repetitions like ``{0,80}``, ``[a-z]+``) get the
    tokens spelled only with those bytes in bulk, as packed bit rows, and are walked
    only below the first byte outside the run (see :func:`_run_shortcut`): the cost
    follows the number of (state, prefix) pairs that are not in such a run. Runs of at
    least ``min_fragment_members`` states whose characters are multi-byte UTF-8 (Unicode
    ``\\w``, JSON string bodies) are lifted together with the states inside their
    characters (see :func:`_fragment_run`); smaller ones take the byte path (cheaper
    there: a fragment run walks the whole trie once per position in a character).
    A delta state's copies of its reference's individual transitions to one state are
    a packed row where at least ``delta_pack_tokens`` tokens go there (see
    :func:`_lift_deltas`). ``min_run_bytes`` above 256 makes no bulk row at all (the
    plain walk the tests compare with).
    """
    trie = vocab.trie
    Q = dfa.num_states
    V = vocab.vocab_size
    W = (V + 31) // 32
    table = _ByteTable(dfa)

    out = _Out()
    bulk_src, bulk_dst, bulk_row, rows = [], [], [], []
    n_rows = 0
    shortcut = np.zeros(Q, bool)
    # states lifted as a few bytes' difference from another state (see _delta_states);
    # they take no part in the runs and walks below
    delta_q, delta_r = _delta_states(dfa, trie, max_delta_fraction) if delta else \
        (np.zeros(0, np.int64), np.zeros(0, np.int64))
    shortcut[delta_q] = True
    groups = list(_run_groups(dfa, min_run_bytes))
    # runs with multi-byte characters first: their members and the states inside their
    # characters in bulk (see _fragment_run)
    byte_rep = np.unique(dfa.byte_class, return_index=True)[1]     # a byte of each class
    tok_by_byte = trie.tokens_by_first_byte
    seconds = []
    pending = []                        # (sigma, members, chain, exits) of the byte runs
    for sigma, members in groups:
        members = members[~shortcut[members]]
        if len(members) < min_fragment_members:      # few states: the byte path is cheaper
            continue
        # most of the members' tokens start outside sigma (the start of the next item of
        # a sorted unique array: every first byte but one leads into its own copy of a
        # string body): not a run; as other states, those first bytes are lifted in bulk
        # into the runs they lead to
        if tok_by_byte[sigma].sum() * 4 < _alive_tokens(table, members, tok_by_byte):
            continue
        frag = _fragment_of(dfa, table, Q, sigma, int(members[0]), byte_rep)
        if frag is None:
            continue
        res = _fragment_run(trie, table, Q, frag, byte_rep, members, shortcut, W,
                            max_pairs, out)
        if res is None:
            continue
        lifted, frows, fsrc, fdst, frow, second_for = res
        shortcut[lifted] = True
        rows.append(frows)
        bulk_src.append(fsrc)
        bulk_dst.append(fdst)
        bulk_row.append(n_rows + frow)
        seconds.append((second_for, n_rows))
        n_rows += len(frows)
    for sigma, members in groups:
        members = members[~shortcut[members]]
        if len(members) == 0:
            continue
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
        pending.append((sigma, members, chain, exits))

    normal = np.nonzero(~shortcut)[0]
    # tokens "b + characters" whose first byte b leads a state into a run, in bulk (a
    # (state, b) pair leads into one state, a member of one run at most): from the
    # states in no run (any first byte), and from the byte runs' members (a first byte
    # outside their own sigma, a depth-0 exit); the handled pairs as q * 256 + b
    # (a member's own sigma is no first byte here: its run lifts those tokens)
    run_of = np.full(Q + 1, -1, np.int64)
    own_sig = np.zeros((len(pending) + 1, 256), bool)         # row -1: no own run
    for i, (sg, m, _, _) in enumerate(pending):
        run_of[m] = i
        own_sig[i] = sg
    all_src = np.concatenate([normal] + [m for _, m, _, _ in pending])
    handled = np.zeros(0, np.int64)
    for second_for, base in seconds:
        for g0 in range(0, len(all_src), 1 << 14):
            qs = all_src[g0:g0 + (1 << 14)]
            res = second_for(qs, run_of[qs], own_sig)
            if res is None:
                continue
            codes, bs, bd, br = res
            handled = np.union1d(handled, codes)
            bulk_src.append(bs)
            bulk_dst.append(bd)
            bulk_row.append(base + br)
    n0 = int(trie.level_start[1]) if len(trie.level_start) > 1 else 0
    if pending and n0:
        # (source, first node) pairs into each byte run, found in chunks
        nb0 = trie.node_byte[:n0]
        ps_, px_, pr_ = [], [], []
        for g0 in range(0, len(all_src), 1 << 14):
            qs = all_src[g0:g0 + (1 << 14)]
            si, xi = _first_byte_pairs(trie, table.ctab, table.bc, run_of[table.ctab[qs]] >= 0)
            own = run_of[qs[si]]
            keep = ~own_sig[own, nb0[xi]]
            si, xi = si[keep], xi[keep]
            ps_.append(qs[si])
            px_.append(xi)
            pr_.append(run_of[table[qs[si], nb0[xi]]])
        ps_, px_, pr_ = np.concatenate(ps_), np.concatenate(px_), np.concatenate(pr_)
        o = _argsort_ints(pr_)
        ps_, px_, pr_ = ps_[o], px_[o], pr_[o]
        bounds = np.searchsorted(pr_, np.arange(len(pending) + 1))
        cache: dict = {}
        for i, (sigma, members, _, _) in enumerate(pending):
            a_, b_ = bounds[i], bounds[i + 1]
            if a_ == b_:
                continue
            res = _into_run(trie, table, Q, sigma, members, ps_[a_:b_], px_[a_:b_],
                            min_run_tokens, W, cache)
            if res is None:
                continue
            hi, rows2, bs2, bd2, br2, (ws, wn, wc) = res
            handled = np.union1d(handled, ps_[a_:b_][hi] * 256 + nb0[px_[a_:b_][hi]])
            _count(out, len(bs2))
            rows.append(rows2)
            bulk_src.append(bs2)
            bulk_dst.append(bd2)
            bulk_row.append(n_rows + br2)
            n_rows += len(rows2)
            for j in range(0, len(ws), max_pairs):
                _walk(trie, table, Q, ws[j:j + max_pairs], wn[j:j + max_pairs],
                      wc[j:j + max_pairs], max_pairs, out)
    # the (state, first byte) pairs handled above, a bit per q * 256 + b: one lookup per
    # pair below (np.isin would sort each chunk's pairs with them)
    handled_bits = _code_bits(handled, Q)
    # the byte runs' members: walk below their exit nodes (chunked over members), but
    # for the depth-0 exits handled above
    for sigma, members, chain, exits in pending:
        xb = trie.node_byte[exits]
        xd = trie.depth[exits]
        step = max(1, max_pairs // max(len(exits), 1))
        for g0 in range(0, len(members), step):
            before = chain[:, g0:g0 + step][xd]                      # [X, g]
            nxt = table[before, xb[:, None]]
            xi, gi = np.nonzero(nxt != Q)
            if len(handled) and len(xi):
                d0 = np.flatnonzero(xd[xi] == 0)
                keep = np.ones(len(xi), bool)
                keep[d0] = ~_has_code(handled_bits, members[g0 + gi[d0]] * 256 + xb[xi[d0]])
                xi, gi = xi[keep], gi[keep]
            if len(xi):
                _walk(trie, table, Q, members[g0 + gi], exits[xi], nxt[xi, gi], max_pairs, out)
    if len(normal):
        first_bytes = np.nonzero(trie.first_node >= 0)[0]
        first_nodes = trie.first_node[first_bytes]
        step = max(1, max_pairs // max(len(first_bytes), 1))
        for g0 in range(0, len(normal), step):
            qs = normal[g0:g0 + step]
            cur = table[qs[:, None], first_bytes[None, :]]
            fi, bi = np.nonzero(cur != Q)
            if len(fi) and len(handled):
                keep = ~_has_code(handled_bits, qs[fi] * 256 + first_bytes[bi])
                fi, bi = fi[keep], bi[keep]
            if len(fi):
                _walk(trie, table, Q, qs[fi], first_nodes[bi], cur[fi, bi], max_pairs, out)

    if len(delta_q):
        n_rows = _lift_deltas(trie, table, Q, vocab, delta_q, delta_r, out, bulk_src, bulk_dst,
                              bulk_row, rows, n_rows, W, max_pairs, max_delta_rows,
                              delta_pack_tokens if min_run_bytes <= 256 else V + 1)

    def cat(parts, dtype=np.int32):
        """Concatenate (int32: states and tokens fit) and free the parts."""
        x = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
        parts.clear()
        return x

    src, tok, dst = cat(out[0]), cat(out[1]), cat(out[2])
    bsrc, bdst, brow = cat(bulk_src), cat(bulk_dst), cat(bulk_row)
    rows = np.concatenate(rows) if rows else np.zeros((0, W), np.uint32)

    # states reachable from the start by whole tokens, BFS order
    pairs = _unique_ints(np.concatenate([src.astype(np.int64) * Q + dst,
                                      bsrc.astype(np.int64) * Q + bdst]))
    es, ed = pairs // Q, pairs % Q
    starts = np.searchsorted(es, np.arange(Q + 1))
    # breadth-first, one level at a time; the order of a sequential BFS (successors
    # in ascending order): each level lists first occurrences in frontier order
    seen = np.zeros(Q, bool)
    seen[0] = True
    levels = [np.zeros(1, np.int64)]
    frontier = levels[0]
    pos = np.zeros(Q, np.int64)
    while len(frontier):
        a = starts[frontier]
        cnt = starts[frontier + 1] - a
        cand = ed[np.repeat(a - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))]
        cand = cand[~seen[cand]]
        if len(cand) == 0:
            break
        idx = np.arange(len(cand))
        pos[cand[::-1]] = idx[::-1]                      # first occurrence of each state
        frontier = cand[pos[cand] == idx]
        seen[frontier] = True
        levels.append(frontier)
    order = np.concatenate(levels)
    del pairs, es, ed
    remap = np.full(Q, -1, np.int32)
    remap[order] = np.arange(len(order), dtype=np.int32)
    keep = remap[src] >= 0
    bkeep = remap[bsrc] >= 0
    if keep.all():                                      # (usual) no copies
        src, tok, dst = remap[src], tok, remap[dst]
    else:
        src, tok, dst = remap[src[keep]], tok[keep], remap[dst[keep]]
    return Lifted(order, src, tok, dst,
                  remap[bsrc[bkeep]], remap[bdst[bkeep]], brow[bkeep], rows)


def _code_bits(codes: np.ndarray, num_states: int) -> np.ndarray:
    """A set of ``q * 256 + b`` codes (``q < num_states``) as a bitmap, uint8
    ``[num_states * 32]`` (see :func:`_has_code`)."""
    bits = np.zeros(num_states * 32, np.uint8)
    codes = np.asarray(codes, np.int64)
    np.bitwise_or.at(bits, codes >> 3, np.left_shift(np.uint8(1), (codes & 7).astype(np.uint8)))
    return bits


def _has_code(bits: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Membership of each code in the set of :func:`_code_bits`, bool."""
    return (bits[codes >> 3] >> (codes & 7).astype(np.uint8)) & 1 > 0


def _bfs_dist(num_states: int, src: np.ndarray, dst: np.ndarray, target: int) -> np.ndarray:
    """Shortest number of edges from each state to ``target`` (INF_DIST if unreachable);
    a backward BFS one level at a time."""
    dist = np.full(num_states, INF_DIST, np.int64)
    dist[target] = 0
    order = _argsort_ints(dst)
    src_by_dst = src[order]
    starts = np.searchsorted(dst[order], np.arange(num_states + 1))
    frontier = np.array([target])
    level = 0
    while len(frontier):
        level += 1
        a, b = starts[frontier], starts[frontier + 1]
        cnt = b - a
        idx = np.repeat(a - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
        p = src_by_dst[idx]
        p = _unique_ints(p[dist[p] == INF_DIST])
        dist[p] = level
        frontier = p
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
    tok = np.concatenate([lifted.tok, np.full(len(acc) + 1, eos, np.int32)])
    n_ind = len(tok)
    # group into edges (unique (src, dst) pairs); intermediates are dropped as soon as
    # they are used (the transition lists are the largest arrays here)
    pair = np.concatenate([lifted.src, acc, [final], lifted.bulk_src]).astype(np.int64) * S
    pair += np.concatenate([lifted.dst, np.full(len(acc), final), [final], lifted.bulk_dst])
    bulk_rows, bulk_row = lifted.rows, lifted.bulk_row
    del lifted
    # ``by_pair``: the transitions in the order of their pair (stable: a pair's
    # individual transitions before its bulk ones, each in their own order); the
    # pair's transitions are positions gs[u] .. gs[u + 1] - 1 there
    if S * S <= (1 << 22):                                 # dense lookup: <= 32 MB
        count = np.bincount(pair, minlength=S * S)
        uniq = np.nonzero(count)[0]
        lookup = np.zeros(S * S, np.int64)
        lookup[uniq] = np.arange(len(uniq))
        by_pair = _argsort_ints(lookup[pair])
        gs = np.concatenate([[0], np.cumsum(count[uniq])])
        del count, lookup
    else:
        by_pair = _argsort_ints(pair)
        ps = pair[by_pair]
        head = np.empty(len(ps), bool)
        head[:1] = True
        np.not_equal(ps[1:], ps[:-1], out=head[1:])
        gs = np.append(np.flatnonzero(head), len(ps))
        uniq = ps[head]
        del ps, head
    del pair
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

    V = vocab.vocab_size
    W = (V + 31) // 32
    out_start = np.searchsorted(e_src2, np.arange(S2 + 1)).astype(np.int32)
    deg = np.diff(out_start)
    D = max(int(deg.max()) if S2 else 1, 1)
    dead2 = int(new_id[dead])
    out_dst = np.full((S2, D), dead2, np.int32)
    col = np.arange(E) - out_start[e_src2]
    out_dst[e_src2, col] = e_dst2

    # labels of the live edges, in edge order, with CSR offsets (each edge's label a
    # contiguous range): individual tokens (ptok, pstart) and bulk rows (brow, bstart,
    # and the edge of each: be); a pair's individual transitions come first in by_pair
    n_ind_of = np.add.reduceat((by_pair < n_ind).astype(np.int64), gs[:-1]) if len(uniq) \
        else np.zeros(0, np.int64)
    a, n_all = gs[E_ids], gs[E_ids + 1] - gs[E_ids]
    ni = n_ind_of[E_ids]
    pstart = np.concatenate([[0], np.cumsum(ni)])
    ptok = tok[by_pair[_ranges_of(a, ni)]]
    nb = n_all - ni
    bstart = np.concatenate([[0], np.cumsum(nb)])
    brow = bulk_row[by_pair[_ranges_of(a + ni, nb)] - n_ind]
    be = np.repeat(np.arange(E), nb)
    del by_pair, tok, gs
    row_index, reps = _dedupe_rows(ptok, pstart, be, brow, bulk_rows, out_start, V)
    R = len(reps)
    table_bytes = 4 * (R * W + S2 * D + 3 * E + 3 * S2 + 1)
    if table_bytes > current_limits().max_table_bytes:
        raise too_large("max_table_bytes", table_bytes,
                        f"bytes of tables ({S2:,} states, {E:,} edges, {R:,} distinct mask rows, "
                        f"{V:,} tokens)", "tensorize")
    cum = _materialize_rows(reps, ptok, pstart, brow, bstart, bulk_rows, out_start, W)
    return TensorizedAutomaton(
        edge_src=e_src2.astype(np.int32), edge_dst=e_dst2.astype(np.int32),
        out_start=out_start, out_dst=out_dst, cum_masks=cum, row_index=row_index,
        dist=np.minimum(dist2, INF_DIST).astype(np.int32),
        vocab_size=V, initial_state=int(new_id[0]),
        final_state=int(new_id[final]), dead_state=dead2, eos_id=int(eos), key=key)


_HASH_SEED = 0x6A78_C0DE


def _token_hashes(vocab_size: int) -> np.ndarray:
    """Two independent uniform 64-bit values per token, uint64 ``[2, V]`` (fixed seed)."""
    rng = np.random.default_rng(_HASH_SEED)
    return rng.integers(0, 1 << 64, size=(2, vocab_size), dtype=np.uint64, endpoint=False)


@lru_cache(maxsize=2)
def _byte_hash_table(vocab_size: int) -> np.ndarray:
    """uint64 ``[2, 4W, 256]``: for byte ``k`` of a packed row (tokens ``8k .. 8k + 7``,
    little-endian) and its value ``x``, the sum (mod 2^64) of :func:`_token_hashes` over
    the tokens whose bit is set in ``x`` (25 MB for a 49,152-token vocabulary)."""
    hv = _token_hashes(vocab_size)
    nb = ((vocab_size + 31) // 32) * 4
    pad = np.zeros((2, nb * 8), np.uint64)
    pad[:, :vocab_size] = hv
    per = pad.reshape(2, nb, 8)
    out = np.zeros((2, nb, 256), np.uint64)
    for x in range(1, 256):
        low = (x & -x).bit_length() - 1
        out[:, :, x] = out[:, :, x & (x - 1)] + per[:, :, low]
    return out


def _dedupe_rows(ptok, pstart, be, brow, bulk_rows, out_start, V: int):
    """Which logical rows of the cumulative masks are equal, without building them.

    Logical row ``base[s] + k`` (``base[s] = out_start[s] + s``) is the union of the
    labels of the first ``k`` out-edges of ``s``. Each token gets two independent
    uniform 64-bit values; a set's hash is the sum of its tokens' values mod 2^64, so
    (labels of one state being disjoint) the hash of row ``k`` is the running sum of
    its edges' hashes. Two different sets get the same pair of hashes with probability
    2^-128 (the difference of two sums of independent uniform values is uniform).
    Tokens of edge ``e``: ``ptok[pstart[e]:pstart[e + 1]]``; bulk rows: ``brow`` where
    ``be == e``. Returns ``row_index`` (int32 ``[E + S]``, logical row -> distinct row,
    the empty row is 0) and, per distinct row, a representative ``(state, k)`` as
    int64 ``[R, 2]``.
    """
    S = len(out_start) - 1
    E = len(pstart) - 1
    hv = _token_hashes(V)
    h = np.empty((2, E), np.uint64)
    row_h = np.zeros((2, len(bulk_rows)), np.uint64)
    if len(bulk_rows):
        # a packed row's hash from its bytes: table[i, k, x] is the sum of the values
        # of the tokens 8k .. 8k + 7 whose bits are set in byte value x
        used = _unique_ints(brow)
        table = _byte_hash_table(V)                         # [2, 4W, 256]
        per = max(1, (16 << 20) // (4 * table.shape[1]))    # rows at a time
        for c0 in range(0, len(used), per):
            u = used[c0:c0 + per]
            # only the nonzero bytes (bulk rows are often sparse: 2% nonzero words in
            # Unicode (\w{1,12} ){3,8}); a row's sum over them, mod 2^64
            nb, flat, idx = _nonzero_bytes(bulk_rows[u])
            if len(idx) == 0:
                continue
            lin = (idx % nb) * 256 + flat[idx]              # (byte k, value x) -> k * 256 + x
            start = np.searchsorted(idx, np.arange(len(u) + 1) * nb)
            live = np.flatnonzero(start[1:] > start[:-1])   # rows with a nonzero byte
            for i in range(2):
                row_h[i, u[live]] = np.add.reduceat(table[i].reshape(-1)[lin],
                                                    start[live])              # wraps
    run = np.zeros(len(ptok) + 1, np.uint64)
    for i in range(2):
        np.cumsum(hv[i][ptok], out=run[1:])                # wraps mod 2^64
        h[i] = run[pstart[1:]] - run[pstart[:-1]]
        if len(be):
            np.add.at(h[i], be, row_h[i][brow])
    # cumulative hashes per state: C[e] - C[out_start[s]] over the sorted edges
    C = np.zeros((2, E + 1), np.uint64)
    np.cumsum(h, axis=1, out=C[:, 1:])
    deg = np.diff(out_start).astype(np.int64)
    srow = np.repeat(np.arange(S), deg + 1)                 # state of each logical row
    lrow = np.arange(E + S) - srow                          # = out_start[s] + k
    k = lrow - out_start[srow]
    rh = C[:, lrow] - C[:, out_start[srow]]
    # group equal hash pairs, numbered in the order of their first logical row: the
    # representatives are then in (state, k) order, the empty row (state 0, k = 0, the
    # first logical row) is 0, and _materialize_rows writes the rows in order
    key0 = rh[0]
    first, inv = _unique_first_inverse(key0)
    if not (rh[1] == rh[1][first[inv]]).all():             # equal first hash only
        pairs = np.stack([rh[0], rh[1]], 1)
        _, first, inv = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
    by_first = _argsort_ints(first)
    rank = np.empty(len(first), np.int64)
    rank[by_first] = np.arange(len(first))
    inv = rank[inv]
    first = first[by_first]
    reps = np.stack([srow[first], k[first]], 1)
    return inv.astype(np.int32), reps


_MANY_BULK = 8     # _materialize_rows: segments with more bulk rows are reduced one by one


def _by_rank(new: np.ndarray) -> list[np.ndarray]:
    """Items in runs (``new[i]``: item ``i`` starts one; ``new[0]`` is True), grouped by
    their rank in their run: the first items of all runs, then the second ones, ...
    (the items of one rank are in distinct runs)."""
    start = np.flatnonzero(new)
    rank = np.arange(len(new)) - np.repeat(start, np.diff(np.append(start, len(new))))
    by_rank = _argsort_ints(rank)
    bounds = np.searchsorted(rank[by_rank], np.arange(int(rank.max()) + 2))
    return [by_rank[bounds[j]:bounds[j + 1]] for j in range(len(bounds) - 1)]


def _materialize_rows(reps, ptok, pstart, brow, bstart, bulk_rows, out_start, W: int,
                      chunk_bytes: int = 8 << 20) -> np.ndarray:
    """The distinct rows, uint32 ``[R, W]``: row ``u`` is the union of the labels of the
    first ``reps[u, 1]`` out-edges of state ``reps[u, 0]``.

    The representatives of one state, sorted by ``k``, cut its first edges into
    segments; each segment's tokens (a contiguous range of ``ptok``: pairs are sorted by
    edge and a state's edges are contiguous) are packed once, and a row is the previous
    row of its state plus its segment (labels of one state are disjoint, so ``+`` is
    ``|``). Work: the tokens of the needed edges once, plus ``R · W`` words; scratch is
    at most ``chunk_bytes``. Row 0 is the empty row and rows ``1 .. R - 1`` come in
    ``(state, k)`` order (as :func:`_dedupe_rows` numbers them): each chunk of rows is
    built in place."""
    R = len(reps)
    out = np.zeros((R, W), np.uint32)
    if R <= 1:
        return out
    s, k = reps[1:, 0], reps[1:, 1]
    first = np.ones(R - 1, bool)
    first[1:] = s[1:] != s[:-1]
    e_hi = out_start[s].astype(np.int64) + k                 # segment: edges [e_lo, e_hi)
    e_lo = np.empty_like(e_hi)
    e_lo[0] = out_start[s[0]]
    e_lo[1:] = np.where(first[1:], out_start[s[1:]], e_hi[:-1])
    per_chunk = max(1, chunk_bytes // (12 * W))
    unions: dict[bytes, np.ndarray] = {}
    max_unions = max(1, chunk_bytes // (4 * W))
    for c0 in range(0, R - 1, per_chunk):
        c1 = min(R - 1, c0 + per_chunk)
        n = c1 - c0
        a, b = pstart[e_lo[c0:c1]], pstart[e_hi[c0:c1]]
        cnt = b - a
        t = ptok[_ranges_of(a, cnt)]
        seg = out[1 + c0:1 + c1]                               # (a view: in place)
        if len(t):                  # (a segment's tokens are distinct: one state's labels)
            np.bitwise_or.at(seg.reshape(-1), np.repeat(np.arange(n), cnt) * W + (t >> 5),
                             np.left_shift(np.uint32(1), (t & 31).astype(np.uint32)))
        ba, bb = bstart[e_lo[c0:c1]], bstart[e_hi[c0:c1]]
        nb = bb - ba
        if nb.any():
            pi = np.repeat(np.arange(n), nb)                   # segment of each bulk row
            pr = brow[_ranges_of(ba, nb)]
            # a segment with many bulk rows (one per first byte of the tokens into a
            # run) ORs them in one reduction, and equal sets of them (they repeat
            # across states) once, within chunk_bytes; the others one rank (j-th row of
            # a segment) at a time
            many = np.flatnonzero(nb > _MANY_BULK)
            if len(many):
                starts = np.cumsum(nb) - nb
                for i in many.tolist():
                    rows_i = pr[starts[i]:starts[i] + nb[i]]
                    key = rows_i.tobytes()
                    u = unions.get(key)
                    if u is None:
                        u = np.bitwise_or.reduce(bulk_rows[rows_i], axis=0)
                        if len(unions) < max_unions:
                            unions[key] = u
                    seg[i] |= u
                few = nb[pi] <= _MANY_BULK
                pi, pr = pi[few], pr[few]
            per = max(1, chunk_bytes // (4 * W))
            for p0 in range(0, len(pi), per):
                ii, rr = pi[p0:p0 + per], pr[p0:p0 + per]
                for at in _by_rank(np.concatenate([[True], ii[1:] != ii[:-1]])):
                    seg[ii[at]] |= bulk_rows[rr[at]]
        # running union within each state: the j-th row of every state's run at once
        # (a state's rows are consecutive; the chunk's first row may continue the last
        # chunk's state)
        fc = first[c0:c1].copy()
        if not fc[0]:
            seg[0] += out[c0]                                  # the row before the chunk
            fc[0] = True
        for at in _by_rank(fc)[1:]:
            seg[at] += seg[at - 1]
    return out
