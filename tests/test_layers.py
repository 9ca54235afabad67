"""The package's import structure, read from the source (AST), not by importing it.

- No import cycle among jaxcd's modules (imports inside functions count; imports under
  ``if TYPE_CHECKING:`` do not, they never run).
- No module that only re-exports another's names, and nothing rewrites ``sys.modules``.
- ``jaxcd/`` is layered: base -> automata -> decoding -> lm -> user API; a module
  imports only from its own layer or lower ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "jaxcd"

#: (layer, module prefixes), lowest first. A module belongs to the layer of its longest
#: matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("jaxcd.errors", "jaxcd.limits", "jaxcd.vocab", "jaxcd.native_build",
              "jaxcd.model_files")),
    ("automata", ("jaxcd.automata",)),
    ("decoding", ("jaxcd.decoding", "jaxcd.host")),
    ("lm", ("jaxcd.lm", "jaxcd.tokenizer", "jaxcd.hmm")),
    ("api", ("jaxcd", "jaxcd.api", "jaxcd.generation", "jaxcd.cli", "jaxcd.hf",
             "jaxcd.__main__")),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def imports_of(name: str) -> set[str]:
    """The jaxcd modules that module ``name`` imports (at module level or in a
    function), resolved to module names (``from .x import y`` counts ``x.y`` when that is
    a module, else ``x``)."""
    tree = ast.parse(MODULES[name].read_text())
    skip = _type_checking_nodes(tree)
    package = name if _is_package(name) else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "jaxcd")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "jaxcd":
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in MODULES else mod)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {m: imports_of(m) for m in MODULES}


def layer_of(name: str) -> int:
    best, layer = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, layer = len(p), i
    assert layer is not None, f"{name} is in no layer of {LAYERS}"
    return layer


def test_the_graph_sees_known_imports():
    """The walker resolves relative, absolute and function-level imports."""
    assert "jaxcd.decoding.gcd" in GRAPH["jaxcd.decoding.decode"]           # from . import gcd
    assert "jaxcd.automata.tensorized" in GRAPH["jaxcd.decoding.gcd"]       # from ..automata
    assert "jaxcd.lm.loading" in GRAPH["jaxcd.generation"]                  # inside a function
    assert "jaxcd.vocab" not in GRAPH["jaxcd.automata.tensorized"]          # TYPE_CHECKING only


def test_no_import_cycle():
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):                                   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_cycle_detection_works_on_a_planted_cycle():
    saved = set(GRAPH["jaxcd.errors"])
    GRAPH["jaxcd.errors"].add("jaxcd.limits")       # limits imports errors: now a circle
    try:
        with pytest.raises(AssertionError, match="jaxcd.errors"):
            test_no_import_cycle()
    finally:
        GRAPH["jaxcd.errors"] = saved


@pytest.mark.parametrize("name", sorted(m for m in MODULES if not _is_package(m)))
def test_module_defines_something(name):
    """A module (not a package ``__init__``) defines a function, class or value of its
    own: a module of imports and ``__all__`` alone is a second name for another one."""
    tree = ast.parse(MODULES[name].read_text())
    own = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue                                 # the docstring
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            continue
        own.append(node)
    assert own, f"{name} only re-exports"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_nothing_rewrites_sys_modules(name):
    src = MODULES[name].read_text()
    assert "sys.modules[" not in src, f"{name} rewrites sys.modules"


def test_layers():
    bad = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
           for m in sorted(GRAPH) for d in sorted(GRAPH[m]) if layer_of(d) > layer_of(m)]
    assert not bad, "a lower layer imports a higher one:\n" + "\n".join(bad)
