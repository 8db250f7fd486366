"""The package's layering, read from the source with ``ast`` (imports inside function
bodies included): the top-level rooms of ``opfuse`` import one way only, down the layers of
docs/architecture.md, and the runtime imports no compiler room.

A new room must be placed in ``LAYERS``; an import that goes up a layer fails the test, and
the fix is to move the code (or inject the dependency), not to move the room.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where each installed package's source lives (pyproject.toml's package-dir).
SOURCES = {"opfuse": ROOT / "python/opfuse", "opfuse.passes": ROOT / "passes",
           "opfuse.tools": ROOT / "tools"}
# Rooms that compile: what runtime/ must never import.
COMPILER_ROOMS = {"analysis", "backends", "cost", "driver", "frontends", "passes", "pipeline",
                  "report", "testing", "tools", "builder", "torch_backend", "torch_partitions",
                  "torch_shapes", "torch_training", "torch_inputs", "api", "opfuse", "harness"}

# The layers, bottom first: a room imports only rooms of lower layers (or its own room).
LAYERS = [
    {"errors", "config", "kinds", "version"},  # kinds: the group-kind registry, data only
    {"tempdirs", "ir"},
    {"cost"},                       # targets and the guard: numbers, no IR
    {"analysis"},                   # graph, op info, groups (the planner), ledger
    {"frontends"},                  # mlir (the input contract), builder, torch importer
    {"passes"},
    {"pipeline"},
    {"report"},
    {"runtime"},                    # loads and runs; imports no compiler room
    {"backends"},                   # gpu and cpu code generation (may import the runtime's
                                    # formats: schedule, bundle, cache, the CPU ABI)
    {"testing"},                    # the PTX emulator
    {"driver"},                     # stages, the Executable, the program cache, progress
    {"api"},
    {"opfuse"},                     # the facade: import opfuse; opfuse.compile
    {"harness"},                    # fuse-run's library: compare, bisect, timing
    {"builder", "torch_partitions", "torch_inputs"},
    {"torch_shapes", "torch_training"},  # symbolic graphs: a specialization per shape;
                                         # training: forward and backward through AOTAutograd
    {"torch_backend"},
    {"torch"},
    {"tools"},
]


def _modules():
    """(dotted name, path, is package) of every module in the installed packages."""
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            if any(not (d / "__init__.py").exists() for d in path.parents
                   if d == folder or folder in d.parents):
                continue  # a folder of scripts (tools/gpu/), not a package
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            yield ".".join([package, *parts]), path, is_package


def _imported(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """Dotted names of the opfuse modules (or packages) a module imports anywhere:
    ``from opfuse.x import y`` counts as importing ``opfuse.x.y`` when y is a module, else
    ``opfuse.x``; so ``from opfuse import config`` imports config, not the facade."""
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
            for a in node.names:
                found.add(f"{target}.{a.name}" if f"{target}.{a.name}" in known else target)
    return {m for m in found if m == "opfuse" or m.startswith("opfuse.")}


def _room(module: str) -> str:
    """The top-level room of an opfuse module; ``opfuse`` for the package facade itself
    (``opfuse.compile``, ``opfuse.Pipeline``: it imports the API)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "opfuse"


def _module_imports() -> list[tuple[str, set[str]]]:
    """(module, the opfuse modules it imports) for every module, each import resolved to
    a module: ``from opfuse.x import y`` where y is a function counts as importing x."""
    modules = list(_modules())
    known = {name for name, _, _ in modules}

    def resolve(target: str) -> str:
        while target not in known and "." in target:
            target = target.rpartition(".")[0]
        return target

    return [(name, {resolve(t) for t in _imported(name, path, is_package, known)})
            for name, path, is_package in modules]


def _room_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, targets in _module_imports():
        src = _room(name)
        for dst in map(_room, targets):
            if dst != src:
                edges.setdefault(src, set()).add(dst)
    return edges


def _runtime_to_compiler() -> set[tuple[str, str]]:
    return {(name.removeprefix("opfuse."), target.removeprefix("opfuse."))
            for name, targets in _module_imports() if _room(name) == "runtime"
            for target in targets if _room(target) in COMPILER_ROOMS}


def _layer(room: str) -> int:
    return next(i for i, rooms in enumerate(LAYERS) if room in rooms)


def test_the_reader_sees_function_level_imports():
    # api.py imports the GPU backend's register measurement inside _compile only.
    found = dict(_module_imports())
    assert "opfuse.backends.gpu.measure" in found["opfuse.api"]


def test_every_room_has_a_layer():
    rooms = {_room(name) for name, _, _ in _modules()}
    placed = set().union(*LAYERS)
    assert sorted(rooms - placed) == [], "new top-level rooms: place them in LAYERS"
    assert sorted(placed - rooms) == [], "rooms gone from the code: strike them from LAYERS"


def test_imports_go_down_the_layers():
    up = sorted((src, dst) for src, dsts in _room_edges().items() for dst in dsts
                if _layer(dst) >= _layer(src))
    assert up == [], "imports up (or across) the layers"


def test_the_runtime_imports_no_compiler_module():
    assert sorted(_runtime_to_compiler()) == []


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


def test_no_cycle_between_rooms():
    assert _rooms_on_a_cycle(_room_edges()) == set()

