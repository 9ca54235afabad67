"""The on-disk automaton cache (``cache=`` of the compile functions): a second compile
loads what the first saved (same tables), and concurrent saves of one key (parallel
processes on a fresh cache) leave one complete file and no temporaries."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from jaxcd import compile_regex
from jaxcd.automata.tensorized import TensorizedAutomaton, _DATA_FIELDS


def _same(a, b):
    for f in _DATA_FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)))


def test_cache_round_trip_and_concurrent_saves(tmp_path, smol_vocab):
    fa = compile_regex(r"[0-9a-f]{4}-[0-9]{2}", smol_vocab, cache=tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz"
    again = compile_regex(r"[0-9a-f]{4}-[0-9]{2}", smol_vocab, cache=tmp_path)
    _same(fa, again)
    target = tmp_path / "concurrent.npz"
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda _: fa.save(target), range(8)))
    _same(fa, TensorizedAutomaton.load(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([files[0].name, "concurrent.npz"])
