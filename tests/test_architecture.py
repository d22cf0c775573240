"""The house's layering, read from the source: no import cycle anywhere (function-level and type-only
imports count), ``sakura`` imports nothing from ``app`` or ``device_bridge``, and no code outside the
systems registry compares against a system's name."""

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sakura", "app", "device_bridge")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _project_module(name: str, modules: dict) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> nx.DiGraph:
    """Module → project modules it imports, wherever the import statement is (top, function, TYPE_CHECKING).
    ``from pkg import sub`` is an import of the submodule, not of the package's ``__init__``."""
    modules = _modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                dep = _project_module(target, modules)
                if dep is not None and dep != name:
                    graph.add_edge(name, dep, line=node.lineno)
    return graph


def test_no_import_cycles():
    graph = import_graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    detail = [[f"{a} -> {b} (line {graph.edges[a, b]['line']})" for a in c for b in c if graph.has_edge(a, b)]
              for c in cycles]
    assert not cycles, detail


def test_the_library_imports_neither_the_app_nor_the_bridge():
    graph = import_graph()
    wrong = [(a, b) for a, b in graph.edges if a.startswith("sakura") and b.split(".")[0] in ("app", "device_bridge")]
    assert not wrong


def test_each_package_imports_what_its_docstring_allows():
    """runtime: the library below it only; eval (the benchmarks): imported by nothing in ``sakura`` but the CLI."""
    edges = list(import_graph().edges)
    below = ("sakura.eval", "sakura.cli", "sakura.server", "sakura.offline")
    assert not [(a, b) for a, b in edges if a.startswith("sakura.runtime") and b.startswith(below)]
    assert not [(a, b) for a, b in edges if b.startswith("sakura.eval") and a.startswith("sakura")
                and not a.startswith(("sakura.eval", "sakura.cli"))]


def silent_function_level_imports() -> list[str]:
    """Imports of a project module written inside a function with no ``#`` comment on their first or last line."""
    modules = _modules()
    silent = []
    for path in modules.values():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        inside = {node for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
        for node in sorted(inside, key=lambda n: n.lineno):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            project = isinstance(node, ast.ImportFrom) and node.level or any(_project_module(n, modules) for n in names)
            if project and "#" not in lines[node.lineno - 1] and "#" not in lines[node.end_lineno - 1]:
                silent.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return silent


def test_function_level_imports_say_why():
    """An import of a project module inside a function is there for start-up time (torch, gradio, …), an
    optional dependency or a cycle, and its line says which in a ``#`` comment (on its first or last line);
    every other import of the project is at the top of the module."""
    silent = silent_function_level_imports()
    assert not silent, silent


def test_the_checker_sees_a_silent_function_level_import(tmp_path, monkeypatch):
    pkg = tmp_path / "sakura"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from sakura.b import g\n    from . import b  # cycle\n"
                              "    import json\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "PACKAGES", ("sakura",))
    assert silent_function_level_imports() == ["sakura/a.py:2: from sakura.b import g"]


def test_the_checker_sees_a_function_level_cycle(tmp_path, monkeypatch):
    """(The test above can fail: a cycle made only of imports inside functions is found.)"""
    pkg = tmp_path / "sakura"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from sakura.b import g\n")
    (pkg / "b.py").write_text("from sakura import a\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "PACKAGES", ("sakura",))
    assert {"sakura.a", "sakura.b"} in [set(c) for c in nx.strongly_connected_components(import_graph())]


# a comparison of something holding a system's name (``system``, ``r["system"]``, ``name``) with a literal name
SYSTEM_NAME = re.compile(r"""(system|name)\b[\w"'\]\[]*\s*(==|!=)\s*["'](sakura|oracle|fp16|intq|cachegen|local)["']""")


def test_no_string_comparison_against_a_system_name_outside_the_registry():
    """A system's behaviour is read from its ``System`` record (``sakura.systems``), never from its name."""
    hits = []
    for name, path in _modules().items():
        if name == "sakura.systems":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if SYSTEM_NAME.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, hits
