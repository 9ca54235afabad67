"""``pgcd.edge_masses`` from the deduplicated mask rows equals the dense ``B · B_fᵀ``.

Reference: the dense label matrix ``fa.B_f`` (bool ``[E, V]``) times the emission
matrix in float64 NumPy, with the ``⊥`` self-loop set to 1. The implementation must
not build the dense ``[E, W]`` label words (``fa.label_words`` is made to fail).
"""

import numpy as np
import pytest

from jaxcd import Vocabulary, compile_regex

from jaxcd.decoding import pgcd
from jaxcd.automata.tensorized import TensorizedAutomaton


def _vocab(seed=0, n=700):
    """A synthetic vocabulary: single bytes of an alphabet with multi-byte UTF-8
    characters (and their lone bytes), plus random strings over it."""
    rng = np.random.default_rng(seed)
    alphabet = ["a", "b", "c", "x", "y", "z", "0", "1", " ", "é", "ß", "中", "-"]
    toks = {b"<eos>"} | {ch.encode() for ch in alphabet} | {bytes([b]) for b in
                                                           "é中".encode()}
    while len(toks) < n:
        k = int(rng.integers(2, 7))
        toks.add("".join(rng.choice(alphabet, size=k)).encode())
    toks = [b"<eos>"] + sorted(toks - {b"<eos>"})
    return Vocabulary.from_token_bytes(toks, eos_id=0)


VOCAB = _vocab()


def _dense_reference(fa, B):
    C = np.asarray(B, np.float64) @ fa.B_f.T.astype(np.float64)        # [H, E]
    src, dst = np.asarray(fa.edge_src), np.asarray(fa.edge_dst)
    C[:, (src == fa.final_state) & (dst == fa.final_state)] = 1.0
    return C


@pytest.mark.parametrize("pattern", [
    r"(\w{1,4} ){2,4}",        # counters: many edges share (hi, lo) mask-row pairs
    r"[a-z0-9 ]{0,6}-?",       # large label sets (dense matmuls and complements)
    r"(é|ß|中)+x?",             # multi-byte characters, small label sets
    r"[^-]*",                  # labels over half the vocabulary (complement path)
])
def test_edge_masses_equal_dense(pattern, monkeypatch):
    fa = compile_regex(pattern, VOCAB)
    rng = np.random.default_rng(1)
    H = 5
    B = rng.dirichlet(np.ones(VOCAB.vocab_size) * 0.5, size=H).astype(np.float32)
    ref = _dense_reference(fa, B)

    def refuse(self):
        raise AssertionError("edge_masses built the dense [E, W] label words")

    monkeypatch.setattr(TensorizedAutomaton, "label_words", refuse)
    got = np.asarray(pgcd.edge_masses(fa, B), np.float64)
    assert got.shape == ref.shape == (H, fa.num_edges)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-9)
    # counters repeat labels: the check covers edges that share a (hi, lo) pair
    hi, lo = pgcd._edge_label_rows(fa)
    if pattern.startswith(r"(\w"):
        assert len(np.unique(hi * fa.cum_masks.shape[0] + lo)) < fa.num_edges


def test_small_label_pieces_give_the_same_masses(monkeypatch):
    """The small labels' gather-sums run in pieces of ``_small_piece(E)`` (label, token)
    pairs, a label never split: many pieces give bitwise the masses of one piece."""
    fa = compile_regex(r"(é|ß|中)+x?|(\w{1,4} ){2,4}", VOCAB)
    rng = np.random.default_rng(2)
    B = rng.dirichlet(np.ones(VOCAB.vocab_size) * 0.5, size=5).astype(np.float32)
    one = np.asarray(pgcd.edge_masses(fa, B))
    from jaxcd.decoding import pgcd as impl
    calls = []
    orig = impl._small_sums
    monkeypatch.setattr(impl, "_small_piece", lambda E: impl._SPARSE_MAX)
    monkeypatch.setattr(impl, "_small_sums", lambda *a: calls.append(1) or orig(*a))
    many = np.asarray(pgcd.edge_masses(fa, B))
    assert len(calls) > 2
    np.testing.assert_array_equal(many, one)
    np.testing.assert_allclose(one, _dense_reference(fa, B), rtol=2e-5, atol=1e-9)
