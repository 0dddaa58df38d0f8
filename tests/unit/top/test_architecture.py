"""The house's rules, computed from the code (docs/architecture.md draws them): edged/'s top
level holds only the entry points, and each room imports only the rooms below it, so a frame
(sources → streams → processing → inference → backends → processing → events → mqtt) and a
socket request (api → inference → backends) cross folders in one direction only."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "edged"

# Lowest first: a room may import only rooms before it in this list (and itself).
ROOMS = ["core", "mqtt", "galleries", "tasks", "model", "hardware", "backends", "inference",
         "processing", "events", "describer", "sources", "recording", "streams", "service", "web",
         "api", "ota", "ops"]
# The entry points, the composition root, the daemon's config (composed of each room's own
# section) and how a running daemon takes a new one.
ENTRY_POINTS = {"__init__", "__main__", "cli", "daemon", "config", "configcheck", "reload"}
TOP = "top"  # the entry points: may import every room
# What any room may import from the top: the package's version, and for the operator's side
# (which runs beside the daemon, never in it) the daemon's config file and its defaults.
LEAVES = ("edged.__version__",)
OPS_READS = ("edged.config.",)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else TOP


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every edged module a file imports, wherever the import statement stands (function
    bodies and TYPE_CHECKING blocks count: a lazy import is still a dependency)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "edged")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            if base.split(".")[0] == "edged":
                found.update(f"{base}.{a.name}" for a in node.names)
    return found


def room_edges() -> dict[tuple[str, str], list[str]]:
    """(importing room, imported room) → the module pairs behind it."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_of(path)
        for target in _imports(path):
            pair = (_room(module), _room(target))
            if pair[0] != pair[1] and not target.startswith(LEAVES):
                edges[pair].append(f"{module} → {target}")
    return edges


def test_top_level_when_listed_holds_only_the_entry_points() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules <= ENTRY_POINTS, sorted(modules - ENTRY_POINTS)
    assert len(modules - {"__init__", "__main__"}) <= 6
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(ROOMS), "a new room must take its place in ROOMS (and the docs)"


def test_rooms_when_imports_are_computed_point_only_downwards() -> None:
    rank = {room: i for i, room in enumerate(ROOMS)}
    upward = {f"{a} → {b}": modules for (a, b), modules in room_edges().items()
              if a != TOP and (b == TOP or rank[b] > rank[a])
              and not (a == "ops" and all(m.split(" → ")[1].startswith(OPS_READS)
                                          for m in modules))}
    assert not upward, upward


def test_rooms_when_imports_are_computed_never_import_the_operators_side() -> None:
    users = {a for (a, b) in room_edges() if b == "ops"}
    assert users <= {TOP}, users
