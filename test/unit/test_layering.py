"""The package's layering, read from the source with ``ast`` (imports inside function
bodies included): which top-level rooms of ``opfuse`` import which, and which compiler
modules the runtime still reaches.

Today the rooms still form a cycle (docs/architecture.md, "Known tangles"); the target
is one direction and a runtime that imports no compiler module. Until then this test is a
ratchet: the room-to-room edges and the runtime's compiler imports are pinned below, a new
one fails the test, and one that goes away must be struck from the list, so the list only
shrinks and always says where the code stands.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where each installed package's source lives (pyproject.toml's package-dir).
SOURCES = {"opfuse": ROOT / "python/opfuse", "opfuse.passes": ROOT / "passes",
           "opfuse.tools": ROOT / "tools"}
# Rooms that compile: what runtime/ should never import.
COMPILER_ROOMS = {"analysis", "codegen", "contract", "cost", "frontends", "passes",
                  "pipeline", "report", "tools", "builder", "torch_backend", "api"}

# room -> rooms it imports, on main as of this file's last change. Strike an edge when
# the code stops needing it; never add one to make the test pass.
KNOWN_ROOM_EDGES = {
    'analysis': {'codegen', 'config', 'cost', 'errors', 'ir', 'report'},
    'api': {'contract', 'errors', 'ir', 'pipeline', 'report', 'runtime'},
    'builder': {'frontends'},
    'codegen': {'analysis', 'config', 'cost', 'errors', 'ir', 'pipeline', 'runtime', 'tempdirs'},
    'contract': {'analysis', 'config', 'errors', 'ir'},
    'cost': {'analysis', 'errors'},
    'frontends': {'errors', 'ir'},
    'ir': {'errors'},
    'passes': {'analysis', 'contract', 'cost', 'ir', 'report'},
    'pipeline': {'analysis', 'config', 'errors', 'ir', 'passes', 'report', 'tempdirs'},
    'report': {'analysis', 'cost'},
    'runtime': {'codegen', 'config', 'errors', 'ir', 'report', 'tempdirs'},
    'tempdirs': {'config'},
    'tools': {'api', 'builder', 'codegen', 'config', 'contract', 'errors', 'frontends', 'ir', 'pipeline', 'report', 'runtime'},
    'torch': {'torch_backend'},
    'torch_backend': {'errors', 'frontends', 'torch_partitions'},
    'torch_partitions': {'api', 'errors', 'frontends', 'runtime'},
}

# (runtime module, compiler module it imports): the edges issue 24 removes.
KNOWN_RUNTIME_TO_COMPILER = {
    ('runtime.cpu', 'codegen.cpu'),
    ('runtime.executable', 'codegen'),
    ('runtime.executable', 'codegen.bundle'),
    ('runtime.executable', 'codegen.cpu'),
    ('runtime.executable', 'codegen.cpu_threads'),
    ('runtime.executable', 'codegen.gpu'),
    ('runtime.executable', 'report'),
    ('runtime.executable', 'report.summary'),
}


def _modules():
    """(dotted name, path, is package) of every module in the installed packages."""
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            yield ".".join([package, *parts]), path, is_package


def _imported(name: str, path: Path, is_package: bool) -> set[str]:
    """Dotted names of the opfuse modules (or packages) a module imports anywhere."""
    here = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # ``from opfuse import pipeline``: the names may be modules themselves.
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m == "opfuse" or m.startswith("opfuse.")}


def _room(module: str) -> str | None:
    """The top-level room of an opfuse module; None for the package facade itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _module_imports() -> list[tuple[str, set[str]]]:
    """(module, the opfuse modules it imports) for every module, each import resolved to
    a module: ``from opfuse.x import y`` where y is a function counts as importing x."""
    modules = list(_modules())
    known = {name for name, _, _ in modules}

    def resolve(target: str) -> str:
        while target not in known and "." in target:
            target = target.rpartition(".")[0]
        return target

    return [(name, {resolve(t) for t in _imported(name, path, is_package)})
            for name, path, is_package in modules]


def _room_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, targets in _module_imports():
        src = _room(name)
        for dst in map(_room, targets):
            if None not in (src, dst) and dst != src:
                edges.setdefault(src, set()).add(dst)
    return edges


def _runtime_to_compiler() -> set[tuple[str, str]]:
    return {(name.removeprefix("opfuse."), target.removeprefix("opfuse."))
            for name, targets in _module_imports() if _room(name) == "runtime"
            for target in targets if _room(target) in COMPILER_ROOMS}


def test_the_reader_sees_function_level_imports():
    # runtime/executable.py compiles on first use through imports inside its methods.
    assert any(src == "runtime.executable" for src, _ in _runtime_to_compiler())


def test_no_new_edge_between_rooms():
    now = {(s, d) for s, ds in _room_edges().items() for d in ds}
    pinned = {(s, d) for s, ds in KNOWN_ROOM_EDGES.items() for d in ds}
    assert sorted(now - pinned) == [], "new imports between top-level rooms"
    assert sorted(pinned - now) == [], "edges gone from the code: strike them from the list"


def test_no_new_runtime_import_of_the_compiler():
    now = _runtime_to_compiler()
    assert sorted(now - KNOWN_RUNTIME_TO_COMPILER) == [], "runtime/ imports more of the compiler"
    assert sorted(KNOWN_RUNTIME_TO_COMPILER - now) == [], "gone from the code: strike them"


def _rooms_on_a_cycle(edges: dict[str, set[str]]) -> set[str]:
    """Rooms that reach themselves through the room graph."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), list(edges.get(start, ()))
        while todo:
            room = todo.pop()
            if room not in seen:
                seen.add(room)
                todo.extend(edges.get(room, ()))
        return seen

    return {room for room in edges if room in reach(room)}


def test_the_cycle_finder_on_a_hand_made_graph():
    assert _rooms_on_a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == {"a", "b", "c"}
    assert _rooms_on_a_cycle({"a": {"b"}, "b": set()}) == set()


def test_the_cycle_does_not_grow():
    # The rooms issue 24 untangles; the list shrinks to nothing as the layers separate.
    assert _rooms_on_a_cycle(_room_edges()) == {
        "analysis", "codegen", "contract", "cost", "passes", "pipeline", "report", "runtime"}
