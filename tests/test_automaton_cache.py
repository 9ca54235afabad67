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


def test_cache_key_covers_the_compiler_and_the_cache_is_bounded(tmp_path, smol_vocab,
                                                                 monkeypatch):
    """A change to the compiler's source gives new keys (no stale automaton is served),
    and the directory is kept under its byte bound, least recently used first."""
    import time

    from jaxcd import api
    from jaxcd.automata import tensorized
    compile_regex(r"[0-9]{3}", smol_vocab, cache=tmp_path)
    first = {p.name for p in tmp_path.glob("*.npz")}
    monkeypatch.setattr(tensorized, "_COMPILER_HASH", ["another compiler"])
    compile_regex(r"[0-9]{3}", smol_vocab, cache=tmp_path)
    assert len({p.name for p in tmp_path.glob("*.npz")} - first) == 1
    for f in tmp_path.glob("*.npz"):
        f.unlink()

    def compile_new(pattern):
        """Compile ``pattern`` into the cache; return the file it added."""
        before = set(tmp_path.glob("*.npz"))
        compile_regex(pattern, smol_vocab, cache=tmp_path)
        new = set(tmp_path.glob("*.npz")) - before
        assert len(new) == 1
        return new.pop()

    a = compile_new(r"[0-9]{3}a")
    time.sleep(0.02)
    b = compile_new(r"[0-9]{3}b")
    time.sleep(0.02)
    compile_regex(r"[0-9]{3}a", smol_vocab, cache=tmp_path)    # a hit: a is now the newer
    sa, sb = a.stat().st_size, b.stat().st_size
    limit = sa + sb + max(sa, sb) // 2
    monkeypatch.setattr(api, "AUTOMATON_CACHE_MAX_BYTES", limit)
    time.sleep(0.02)
    compile_regex(r"[0-9]{3}c", smol_vocab, cache=tmp_path)
    files = set(tmp_path.glob("*.npz"))
    assert a in files and b not in files and len(files) == 2
    assert sum(f.stat().st_size for f in files) <= limit
