"""No import circle inside the package (each room imports only downwards), and no module over 400 lines.

The imports are read statically (``ast``), so nothing is imported and no optional library is needed.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "s2s"


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name, for its ``__init__``)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: the body, and the blocks of its ``if``/``try``, not the
    bodies of functions or classes' methods (deferred on purpose), nor ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            pending += node.orelse if _is_type_checking(node) else [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            pending += [*node.body, *(s for h in node.handlers for s in h.body), *node.orelse, *node.finalbody]
        elif isinstance(node, (ast.With, ast.ClassDef)):  # a class body runs at import time
            pending += [s for s in node.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return found


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def imports_of(name: str, path: Path, modules: dict[str, Path], deferred: bool) -> set[str]:
    """The package's modules that ``name`` imports (``from s2s import audio`` names the module s2s.audio)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in (_all_imports if deferred else _top_level_imports)(tree):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                          for alias in node.names]
        for candidate in candidates:
            while candidate and candidate not in modules:  # ``import s2s.x.y`` where y is a function's module
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                targets.add(candidate)
    return targets


def import_graph(deferred: bool) -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, modules, deferred) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_walker_sees_relative_and_package_imports(tmp_path):
    modules = {"s2s": PACKAGE / "__init__.py", "s2s.audio": Path(), "s2s.server": Path(),
               "s2s.server.protocol": Path(), "s2s.server.session": Path()}
    source = tmp_path / "session.py"
    source.write_text("from __future__ import annotations\nimport numpy\nfrom s2s import audio\n"
                      "from . import protocol\nfrom .. import server\nfrom typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from s2s.app import main\n"
                      "def later():\n    import s2s.server.protocol\n")
    assert imports_of("s2s.server.session", source, modules, deferred=False) == {
        "s2s.audio", "s2s.server.protocol", "s2s.server"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_level_import_circle():
    assert find_cycle(import_graph(deferred=False)) is None


def test_no_circle_even_through_deferred_imports():
    """A function-level import only hides a circle (app -> server -> server.server -> app was one): the rooms
    import downwards, whether at the top of a module or inside a function."""
    graph = import_graph(deferred=True)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def _room(module: str) -> str:
    """A module's room: its subpackage (s2s.server.session -> s2s.server), or itself at the top (s2s.app)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def test_no_circle_between_packages():
    """Rooms import downwards as wholes too: app -> server -> bench -> app was one, through three files that
    each imported downwards on their own."""
    rooms: dict[str, set[str]] = {}
    for module, targets in import_graph(deferred=True).items():
        rooms.setdefault(_room(module), set()).update(_room(t) for t in targets if _room(t) != _room(module))
    assert find_cycle(rooms) is None, " -> ".join(find_cycle(rooms) or [])



@pytest.mark.parametrize("name", sorted(module_names()))
def test_every_module_stays_small(name):
    lines = module_names()[name].read_text().count("\n")
    assert lines <= 400, f"{name} has {lines} lines; split it (one job per module)"


def test_the_config_check_stays_well_under_the_limit_without_the_annotation_machinery():
    """config.py once sat at exactly 400 lines with the schema inside it. The annotations are read in
    s2s/schema.py and spoken in s2s/config_errors.py, so config.py keeps the composed config's checks alone."""
    source = (PACKAGE / "config.py").read_text()
    assert source.count("\n") <= 300
    defined = {node.name for node in ast.parse(source).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert not defined & {"matches", "describe", "constraints", "must_exist", "check_kwargs", "Range", "OneOf"}


def test_design_names_every_room():
    """DESIGN.md describes the rooms as they are: every module at the top of the package and of the server, and
    every subpackage, is named there (a new room is described, a removed one leaves the page)."""
    design = (ROOT / "DESIGN.md").read_text()
    modules = [path.name for folder in (PACKAGE, PACKAGE / "server") for path in sorted(folder.glob("*.py"))
               if not path.name.startswith("__")]
    packages = [f"{path.name}/" for path in sorted(PACKAGE.iterdir()) if (path / "__init__.py").is_file()]
    assert [name for name in modules + packages if not re.search(rf"(?<![\w.]){re.escape(name)}", design)] == []


def test_stage_groups_do_not_import_each_other():
    """A backend imports shared rooms (audio, openai_api, ...), never another stage group's modules: stt=openai
    and llm=openai share their client helpers through s2s.openai_api, not through each other."""
    groups = ("s2s.vad", "s2s.stt", "s2s.llm", "s2s.tts")
    graph = import_graph(deferred=True)
    crossing = sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                      for group in groups if name.startswith(group + ".") or name == group
                      if target.startswith(groups) and not (target == group or target.startswith(group + ".")))
    assert crossing == []
