"""One floor per folder, checked on the import graph itself (grimp) rather than taken on
lint-imports' word. The floors are the first layers contract in pyproject.toml; a "room" is
a folder or a loose module directly under a package. Each floor names whole rooms of
dra_plugin/ and each room is on one floor; no import runs from a room up to a higher
floor or across to another room of its own floor; no rooms import each other in a circle,
in dra_plugin/ or in any folder below it; dra_plugin/ keeps at most ten loose modules."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "dra_plugin"
GENERATED = f"{PACKAGE}._proto"  # generated from protos/, never edited: on no floor


def floors() -> list[set[str]]:
    """The layers contract's floors, top first, as sets of room names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    assert contract.get("containers") == [PACKAGE], "the floors are rooms of the package"
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None)


def room(module: str, package: str) -> str:
    """The room of `package` that holds `module` (its child, or one of its ancestors)."""
    depth = package.count(".") + 2
    return ".".join(module.split(".")[:depth])


def arrows(graph: grimp.ImportGraph, package: str) -> dict[tuple[str, str], list[str]]:
    """Imports between different rooms of `package`: (room, room) -> the module imports."""
    out: dict[tuple[str, str], list[str]] = {}
    inside = [m for m in graph.find_descendants(package) if not m.startswith(GENERATED)]
    for importer in inside:
        for imported in graph.find_modules_directly_imported_by(importer):
            if not imported.startswith(package + ".") or imported.startswith(GENERATED):
                continue
            a, b = room(importer, package), room(imported, package)
            if a != b:
                out.setdefault((a, b), []).append(f"{importer} -> {imported}")
    return out


def upward(graph: grimp.ImportGraph, floors: list[set[str]]) -> list[str]:
    """Every import from a room to a room on a higher floor or on its own floor."""
    floor_of = {f"{PACKAGE}.{name}": n for n, floor in enumerate(floors) for name in floor}
    return sorted(
        f"{imp} (floor {floor_of[a]} -> floor {floor_of[b]})"
        for (a, b), imports in arrows(graph, PACKAGE).items()
        if a in floor_of and b in floor_of and floor_of[a] >= floor_of[b]
        for imp in imports
    )


def circles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Groups of rooms of `package` that import each other in a circle (strongly connected
    groups of two or more)."""
    edges = arrows(graph, package)
    rooms = sorted({r for pair in edges for r in pair})
    reach = {r: {b for (a, b) in edges if a == r} for r in rooms}
    for r in rooms:  # transitive closure: tens of rooms at most
        todo = list(reach[r])
        while todo:
            nxt = todo.pop()
            for b in reach[nxt] - reach[r]:
                reach[r].add(b)
                todo.append(b)
    groups = {tuple(sorted(b for b in reach[r] if r in reach[b])) for r in rooms if r in reach[r]}
    return sorted(list(g) for g in groups)


def packages(graph: grimp.ImportGraph) -> Iterator[str]:
    yield PACKAGE
    for m in sorted(graph.find_descendants(PACKAGE)):
        if graph.find_children(m) and not m.startswith(GENERATED):
            yield m


def test_each_floor_is_whole_rooms_and_each_room_is_on_one_floor(
    graph: grimp.ImportGraph,
) -> None:
    named = [name for floor in floors() for name in floor]
    rooms = sorted(
        m.removeprefix(PACKAGE + ".") for m in graph.find_children(PACKAGE) if m != GENERATED
    )
    assert sorted(named) == rooms, "each room of dra_plugin/ on exactly one floor, by its name"


def test_no_import_runs_up_or_across_a_floor(graph: grimp.ImportGraph) -> None:
    up = upward(graph, floors())
    assert not up, f"{len(up)} imports run up or across:\n" + "\n".join(up)


def test_no_rooms_import_each_other_in_a_circle(graph: grimp.ImportGraph) -> None:
    found = {p: c for p in packages(graph) if (c := circles(graph, p))}
    assert not found, f"circles: {found}"


def test_at_most_ten_loose_modules_in_the_package() -> None:
    loose = sorted(p.name for p in (ROOT / PACKAGE).glob("*.py"))
    assert len(loose) <= 10, f"{len(loose)} loose modules, group some: {loose}"


def test_the_checks_catch_the_old_arrows(graph: grimp.ImportGraph) -> None:
    """Two imports the old layout had, put back on the real graph: the API reading the
    configuration, and the exposition reaching up to the claim -> pod map. Both run up a
    floor; the second closes a circle (the sampler imports the exposition)."""
    graph = copy.deepcopy(graph)  # the fixture's graph stays as the code is
    graph.add_import(importer=f"{PACKAGE}.kubeapi.transport", imported=f"{PACKAGE}.config")
    graph.add_import(
        importer=f"{PACKAGE}.telemetry.metrics", imported=f"{PACKAGE}.sampling.claimholders"
    )
    up = upward(graph, floors())
    assert [u.split(" (")[0] for u in up] == [
        "dra_plugin.kubeapi.transport -> dra_plugin.config",
        "dra_plugin.telemetry.metrics -> dra_plugin.sampling.claimholders",
    ]
    (circle,) = circles(graph, PACKAGE)  # through every room between the two
    assert {"dra_plugin.sampling", "dra_plugin.telemetry"} <= set(circle)
