"""The shape of the imports, read from the source (ast), not from what one run happens to import.

* No cycles in reflex_core: its modules form a plain stack (DESIGN.md, "Shape"). Every import
  statement counts, wherever it sits -- module level, inside a function, under
  ``if TYPE_CHECKING`` -- because an import deferred into a function still makes a lower layer
  depend on a higher one; deferring hides a cycle from the interpreter, it does not remove it.
  ``from . import x`` is an edge to module ``x`` when ``x`` is a submodule, else to the package;
  ``from .m import name`` is an edge to ``m``.
* The GPU cold path imports no numpy, gguf (gguf-py), huggingface_hub or jinja2 at module level,
  not even through another module: each of the first three costs 230-260 ms before the first
  token (DESIGN.md, "The cold path"); jinja2 (tens of ms) is for --chat alone (reflex_core.chat).
  HEAVY_ALLOWED lists the modules that may; every other module of reflex_core and of the plugins
  in plugins/, including any module added later, is held to the rule.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "reflex_core"

# Imports that cost tens to hundreds of milliseconds and that the GPU cold path must not pay for.
HEAVY = ("numpy", "gguf", "huggingface_hub", "jinja2")
# The only modules that may import HEAVY at module level (directly or through another module):
# the NumPy reference backend and the test/benchmark helpers, which use numpy and gguf-py on
# purpose and which nothing on the GPU path imports.
HEAVY_ALLOWED = {
    "reflex_core.backends.numpy_backend",
    "reflex_core.testing.modelwriter",
    "reflex_core.testing.oracle",
    "reflex_core.testing.op_cases",
    "reflex_core.testing.op_harness",
    "reflex_core.testing.f16_pairs",
    "reflex_core.testing.x_halves",
    "reflex_core.testing.x_limbs",
}


# --- reading the graph -------------------------------------------------------------------------
def packages() -> dict[str, Path]:
    """Package name -> its directory: reflex_core and each plugin's package."""
    found = {PACKAGE: ROOT / PACKAGE}
    for init in sorted(ROOT.glob("plugins/*/*/__init__.py")):
        found[init.parent.name] = init.parent
    return found


def module_files() -> dict[str, tuple[str, Path]]:
    """Every module: dotted name -> (package, file); a package is its __init__.py."""
    out = {}
    for pkg, directory in packages().items():
        for path in sorted(directory.rglob("*.py")):
            parts = list(path.relative_to(directory.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = (pkg, path)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_at_import(tree: ast.Module) -> set[int]:
    """ids of the nodes that run when the module is imported: the top level and the bodies of
    if/try/with/for blocks and of class statements, not function bodies, not ``if
    TYPE_CHECKING:`` (which never runs)."""
    seen = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        seen.add(id(node))
        todo.extend(ast.iter_child_nodes(node))
    return seen


def _add(where: dict[str, list[int]], target: str, line: int) -> None:
    lines = where.setdefault(target, [])
    if line not in lines:  # ``from .m import a, b`` is one import of m
        lines.append(line)


class Imports:
    """One module's imports. ``internal`` {module of ours: [line, ...]} from every import
    statement; ``internal_top`` the same from the statements that run at import time;
    ``external_top`` {top-level name of another distribution: [line, ...]}, run at import time."""

    def __init__(self, name: str, package: str, path: Path, modules: set[str], ours: set[str]):
        self.name, self.package, self.path = name, package, path
        self.internal: dict[str, list[int]] = {}
        self.internal_top: dict[str, list[int]] = {}
        self.external_top: dict[str, list[int]] = {}
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        at_import = _run_at_import(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = self._from_targets(node, modules)
            else:
                continue
            top = id(node) in at_import
            for t in targets:
                if t.split(".")[0] in ours:
                    t = self._existing(t, modules)
                    _add(self.internal, t, node.lineno)
                    if top:
                        _add(self.internal_top, t, node.lineno)
                elif top:
                    _add(self.external_top, t.split(".")[0], node.lineno)

    def _from_targets(self, node: ast.ImportFrom, modules: set[str]) -> list[str]:
        if node.level:
            here = self.name.split(".")
            if self.path.name != "__init__.py":
                here.pop()  # a plain module's package is its parent
            if node.level > len(here):
                raise AssertionError(f"{self.path}:{node.lineno}: relative import beyond the "
                                     "top-level package")
            parts = here[:len(here) - node.level + 1] + ([node.module] if node.module else [])
            base = ".".join(parts)
        else:
            base = node.module
        # ``from pkg import x``: the module pkg.x when there is one, else pkg (x is a name in it)
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                for a in node.names]

    @staticmethod
    def _existing(target: str, modules: set[str]) -> str:
        """The longest prefix that is a module (``import reflex_core.nope`` would fail at run
        time; that is another test's business, the graph just stays closed)."""
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        return target


def read_graph() -> dict[str, Imports]:
    files = module_files()
    names, ours = set(files), set(packages())
    return {name: Imports(name, pkg, path, names, ours) for name, (pkg, path) in files.items()}


# --- cycles --------------------------------------------------------------------------------------
def core_edges(graph: dict[str, Imports]) -> dict[str, set[str]]:
    """reflex_core's modules -> the reflex_core modules each imports (a self-import included).
    Plugins are left out: the core never imports a plugin by name, so no cycle runs through one."""
    return {name: {t for t in imp.internal if graph[t].package == PACKAGE}
            for name, imp in graph.items() if imp.package == PACKAGE}


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm (iterative); only the components that hold a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(edges[start])))]
        while work:
            v, successors = work[-1]
            for w in successors:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in edges[v]:
                        found.append(comp)
    return found


def elementary_cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every simple cycle once, as the tuple of its modules starting from the alphabetically
    first. A depth-first walk per start module inside each strongly connected component, using
    only modules after the start (reflex_core's components are a handful of modules)."""
    cycles: set[tuple[str, ...]] = set()
    for comp in strongly_connected(edges):
        order = sorted(comp)
        for i, start in enumerate(order):
            allowed = set(order[i:])
            path = [start]

            def walk(v: str) -> None:
                for w in sorted(edges[v] & allowed):
                    if w == start:
                        cycles.add(tuple(path))
                    elif w not in path:
                        path.append(w)
                        walk(w)
                        path.pop()

            walk(start)
    return cycles


def short(module: str) -> str:
    return module[len(PACKAGE) + 1:] if module.startswith(PACKAGE + ".") else module


def cycle_text(cycle: tuple[str, ...]) -> str:
    return " -> ".join(short(m) for m in cycle + cycle[:1])


def describe(cycle: tuple[str, ...], graph: dict[str, Imports]) -> str:
    """The cycle, then the file and lines of each import that makes it."""
    steps = [cycle_text(cycle)]
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        where = graph[a].path.relative_to(ROOT)
        lines = ",".join(str(n) for n in graph[a].internal[b])
        steps.append(f"  {short(a)} imports {short(b)} ({where}:{lines})")
    return "\n".join(steps)


# --- heavy imports -------------------------------------------------------------------------------
def heavy_chains(graph: dict[str, Imports]) -> dict[str, list[str]]:
    """Each module outside HEAVY_ALLOWED whose import pulls in a HEAVY package (itself or
    through what it imports at import time) -> one shortest chain of imports that does."""
    bad: dict[str, list[str]] = {}
    for start in sorted(graph):
        if start in HEAVY_ALLOWED:
            continue
        came_from: dict[str, str | None] = {start: None}
        queue = deque([start])
        while queue:
            m = queue.popleft()
            hits = [h for h in HEAVY if h in graph[m].external_top]
            if hits:
                chain = [f"{m} imports {hits[0]} (line {graph[m].external_top[hits[0]][0]})"]
                while came_from[m] is not None:
                    prev = came_from[m]
                    chain.insert(0, f"{prev} imports {m} (line {graph[prev].internal_top[m][0]})")
                    m = prev
                bad[start] = chain
                break
            for t in sorted(graph[m].internal_top):
                if t not in came_from:
                    came_from[t] = m
                    queue.append(t)
    return bad


# --- the tests -----------------------------------------------------------------------------------
def test_the_reader_sees_every_kind_of_import(tmp_path, monkeypatch):
    """The reader on a made-up tree: absolute and relative imports at module and function level,
    ``from . import x`` as module x, TYPE_CHECKING imports; a cycle closed only by deferred
    imports is found, with the lines that make it; a heavy import is traced through a plugin."""
    files = {
        "reflex_core/__init__.py": "",
        "reflex_core/a.py": "from . import b\nimport numpy.linalg\n",
        "reflex_core/b.py": "def f():\n    from .sub.c import thing\n",
        "reflex_core/sub/__init__.py": "from .. import a\n",
        "reflex_core/sub/c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    import reflex_core.d\nthing = 1\n"),
        "reflex_core/d.py": ("import json\ndef g():\n    import gguf\n"
                             "    from reflex_core import a\n"),
        "reflex_core/e.py": "from reflex_core.sub import c as cc, name_in_sub\n",
        "plugins/p/reflex_p/__init__.py": "from reflex_core.e import x\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    g = read_graph()
    assert set(g) == {"reflex_core", "reflex_core.a", "reflex_core.b", "reflex_core.sub",
                      "reflex_core.sub.c", "reflex_core.d", "reflex_core.e", "reflex_p"}
    assert g["reflex_core.a"].internal == {"reflex_core.b": [1]}
    assert g["reflex_core.b"].internal == {"reflex_core.sub.c": [2]}
    assert g["reflex_core.b"].internal_top == {}  # function level
    assert g["reflex_core.sub"].internal == {"reflex_core.a": [1]}
    assert g["reflex_core.sub.c"].internal == {"reflex_core.d": [3]}
    assert g["reflex_core.sub.c"].internal_top == {}  # TYPE_CHECKING never runs
    assert g["reflex_core.d"].internal == {"reflex_core.a": [4]}
    assert g["reflex_core.e"].internal == {"reflex_core.sub.c": [1], "reflex_core.sub": [1]}
    assert g["reflex_core.a"].external_top == {"numpy": [2]}
    assert g["reflex_core.d"].external_top == {"json": [1]}  # gguf: inside a function
    cycles = elementary_cycles(core_edges(g))
    assert {cycle_text(c) for c in cycles} == {"a -> b -> sub.c -> d -> a"}
    assert "  b imports sub.c (reflex_core/b.py:2)" in describe(min(cycles), g).splitlines()
    chains = heavy_chains(g)
    assert set(chains) == {"reflex_core.a", "reflex_core.sub", "reflex_core.e", "reflex_p"}
    assert chains["reflex_p"] == ["reflex_p imports reflex_core.e (line 1)",
                                  "reflex_core.e imports reflex_core.sub (line 1)",
                                  "reflex_core.sub imports reflex_core.a (line 1)",
                                  "reflex_core.a imports numpy (line 2)"]


def test_cycle_finder_on_overlapping_cycles():
    edges = {"a": {"b"}, "b": {"c", "a"}, "c": {"a", "c"}, "d": {"a"}, "e": set()}
    assert elementary_cycles(edges) == {("a", "b"), ("a", "b", "c"), ("c",)}
    assert sorted(map(sorted, strongly_connected(edges))) == [["a", "b", "c"]]


def test_no_import_cycles_in_reflex_core():
    graph = read_graph()
    assert len([m for m in graph if graph[m].package == PACKAGE]) > 20  # really read the package
    found = {cycle_text(c): c for c in elementary_cycles(core_edges(graph))}
    assert not found, (f"{len(found)} import cycle(s) in {PACKAGE}:\n"
                       + "\n".join(describe(c, graph) for c in found.values()))


def test_cold_path_modules_import_no_numpy_gguf_or_hub():
    graph = read_graph()
    assert HEAVY_ALLOWED <= set(graph), f"gone, update HEAVY_ALLOWED: {HEAVY_ALLOWED - set(graph)}"
    assert any(graph[m].package != PACKAGE for m in graph), "no plugin package found"
    bad = heavy_chains(graph)
    assert not bad, (f"{'/'.join(HEAVY)} imported at module level outside HEAVY_ALLOWED:\n"
                     + "\n".join(f"{m}:\n  " + "\n  ".join(c) for m, c in bad.items()))


def test_cold_path_modules_import_with_numpy_gguf_and_hub_unimportable():
    """The same rule as a process sees it, for every module the ast test holds to it (an import
    the ast cannot see, e.g. importlib.import_module at module level, fails here)."""
    graph = read_graph()
    mods = sorted(m for m in graph if m not in HEAVY_ALLOWED and not m.endswith("__main__"))
    code = ("import importlib, sys, traceback\n"
            f"for m in {HEAVY!r}: sys.modules[m] = None\n"
            f"for m in {mods!r}:\n"
            "    try:\n"
            "        importlib.import_module(m)\n"
            "    except Exception:\n"
            "        print(m, traceback.format_exc(limit=-2).strip().splitlines()[-3:])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and not r.stdout, r.stdout + r.stderr[-2000:]
