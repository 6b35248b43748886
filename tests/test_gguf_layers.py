"""The GGUF reader, its on-disk index and the tokenizer stay separate layers: gguf.py imports
nothing of reflex_core but errors and ggml_types, the tokenizer nothing of the reader or the
index, and no import (module level or inside a function) closes a cycle among them."""

from __future__ import annotations

import ast
from pathlib import Path

import reflex_core

PKG = Path(reflex_core.__file__).parent
LAYERS = ("ggml_types", "gguf", "gguf_index", "modelfile", "tokenizer")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The reflex_core modules ``name`` imports anywhere in its source."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and t != "reflex_core":
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {n: _imports(n, p, modules) for n, p in modules.items()}


def _in_layers(name: str) -> bool:
    return any(name == f"reflex_core.{m}" or name.startswith(f"reflex_core.{m}.") for m in LAYERS)


def test_gguf_reader_is_pure():
    g = _graph()
    assert g["reflex_core.gguf"] <= {"reflex_core.errors", "reflex_core.ggml_types"}
    assert g["reflex_core.ggml_types"] <= {"reflex_core.errors"}


def test_tokenizer_knows_nothing_of_files_or_the_index():
    g = _graph()
    tok = [n for n in g if n == "reflex_core.tokenizer" or n.startswith("reflex_core.tokenizer.")]
    assert len(tok) > 1
    for n in tok:
        outside = {d for d in g[n] if not d.startswith("reflex_core.tokenizer")}
        assert outside <= {"reflex_core.errors"}, (n, outside)


def test_no_import_cycle_among_the_layers():
    g = {n: {d for d in deps if _in_layers(d)} for n, deps in _graph().items() if _in_layers(n)}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for d in sorted(g[n]):
            assert state.get(d) != 1, " -> ".join(path + [n, d])
            if d not in state:
                visit(d, path + [n])
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n, [])
    assert "reflex_core.modelfile" in g and "reflex_core.gguf_index" in g
