"""constraints.txt pins exactly the versions the tests run with, for every dependency."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"not an exact pin: {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"{name} pinned twice"
        pins[name] = m.group(2)
    return pins


def _roots() -> list[Requirement]:
    project = PYPROJECT["project"]
    return [
        Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]
    ]


def _closure() -> dict[str, str]:
    """Installed name -> version for the runtime and test requirements, transitively."""
    found: dict[str, str] = {}
    todo = _roots()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found:
            continue
        dist = md.distribution(req.name)
        found[name] = dist.version
        for sub in map(Requirement, dist.requires or []):
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    return found


def test_every_dependency_is_pinned_at_the_version_tested() -> None:
    pins = _pins()
    installed = _closure()
    unpinned = sorted(set(installed) - set(pins))
    assert not unpinned, f"not in constraints.txt (run .ci/freeze-constraints): {unpinned}"
    drift = {n: (pins[n], v) for n, v in installed.items() if pins[n] != v}
    assert not drift, f"constraints.txt pins differ from what runs here (pin, installed): {drift}"
    # pip and the build backend the image builds the wheel with are pinned too.
    assert {"pip", "setuptools"} <= set(pins)


def test_pins_satisfy_the_pyproject_ranges() -> None:
    pins = _pins()
    for req in _roots():
        assert req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True), req
    (backend,) = (Requirement(r) for r in PYPROJECT["build-system"]["requires"])
    assert backend.specifier.contains(pins[canonicalize_name(backend.name)]), backend


def test_setup_installs_with_the_constraints() -> None:
    setup = (REPO / ".ci" / "setup").read_text()
    installs = [line for line in setup.splitlines() if "pip install" in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
