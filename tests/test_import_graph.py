"""jaxcd's modules import each other without a cycle.

The graph is read from the source (``ast``), not from ``sys.modules``: every ``import``
and ``from … import`` in a module counts, including those inside functions and under
``TYPE_CHECKING`` (a cycle through a lazy import is still a circle in the design; it
only fails later, at call time). An edge goes to the module named, or to the module a
``from pkg import name`` takes ``name`` from when ``name`` is not a submodule.
Cycles are found as the strongly connected components of that graph (Tarjan)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "jaxcd"

#: The one circle this test was written against: jaxcd.checkpoints loads models through
#: jaxcd.lm.llama, which calls back into checkpoints for its memory check. Remove it from
#: here (and the expected failure below) once the circle is gone.
KNOWN_CYCLES = [{"jaxcd.checkpoints", "jaxcd.lm.llama"}]


def _modules() -> dict[str, Path]:
    mods = {}
    for p in (ROOT / PACKAGE).rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _targets(mods, module: str, is_package: bool, node) -> set[str]:
    out = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
        return out
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        frm = ".".join(base + ([node.module] if node.module else []))
    else:
        frm = node.module or ""
    for alias in node.names:
        sub = f"{frm}.{alias.name}"
        if sub in mods:
            out.add(sub)
        elif frm in mods:
            out.add(frm)
    return out


def _edges(mods, name: str, is_package: bool, source: str) -> set[str]:
    edges = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            edges |= _targets(mods, name, is_package, node)
    return edges - {name}


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _edges(mods, name, path.name == "__init__.py", path.read_text())
            for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (iterative Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(comp)
    return found


def test_cycle_finder_on_known_graphs():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    two = cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}})
    assert sorted(map(sorted, two)) == [["a", "b"], ["c", "d"]]


def test_edges_of_every_import_form():
    mods = dict.fromkeys(["p", "p.a", "p.b", "p.sub", "p.sub.c", "p.sub.d", "p.e"])
    src = """
import p.a
from . import d
from .. import b
from ..e import name_in_e
from p.sub import c, not_a_module

def f():
    import p.sub.c as cc          # lazy
if False:
    from numpy import x           # outside the package
"""
    assert _edges(mods, "p.sub.d", False, src) == {"p.a", "p.b", "p.e", "p.sub.c", "p.sub"}
    assert _edges(mods, "p.sub", True, "from . import c\nfrom .d import y") == {"p.sub.c",
                                                                               "p.sub.d"}
    g = import_graph()
    assert "jaxcd.decoding.gcd" in g["jaxcd.decoding.smc"]          # the real package read


def test_no_new_import_cycle():
    """No cycle beyond the known one(s) listed in KNOWN_CYCLES."""
    new = [c for c in cycles(import_graph()) if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {[sorted(c) for c in new]}"


@pytest.mark.xfail(strict=True, reason="known circle jaxcd.checkpoints <-> jaxcd.lm.llama; "
                   "once it is removed this test passes, and strict xfail turns that into a "
                   "failure: drop this mark and KNOWN_CYCLES")
def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, f"import cycles: {[sorted(c) for c in found]}"
