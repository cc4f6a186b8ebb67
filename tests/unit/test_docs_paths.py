"""Docs stay true: every `.py` file a docstring or comment in dra_plugin/ names, and every
one docs/architecture.md names, exists. A bare name (`claims.py`) is looked up anywhere in
the package; a path (`nvml/events.py`, `fakes/acme_vendor.py`) relative to dra_plugin/,
to the repository, or as the tail of a package path."""

from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dra_plugin"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# A file name or slash path ending in .py, not the tail of a longer word or dotted name.
NAMED = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b")


def _package_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "_proto" not in p.parts]


def exists(ref: str, files: list[Path]) -> bool:
    if "/" not in ref:
        return any(p.name == ref for p in files)
    if (ROOT / ref).is_file() or (PACKAGE / ref).is_file():
        return True
    return any(p.as_posix().endswith("/" + ref) for p in files)


def prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring in one module."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                yield node.body[0].lineno, doc


def missing_in(name: str, lines: Iterator[tuple[int, str]], files: list[Path]) -> list[str]:
    return [
        f"{name}:{line + text.count(chr(10), 0, m.start())}: {m[1]}"  # the line within a docstring
        for line, text in lines
        for m in NAMED.finditer(text)
        if not exists(m[1], files)
    ]


def test_docstrings_and_comments_name_only_files_that_exist() -> None:
    files = _package_files()
    stale = [
        m
        for p in sorted(files)
        for m in missing_in(str(p.relative_to(ROOT)), prose(p.read_text()), files)
    ]
    assert not stale, "docstrings or comments name files that do not exist:\n" + "\n".join(stale)


def test_architecture_names_only_files_that_exist() -> None:
    lines = enumerate(ARCHITECTURE.read_text().splitlines(), 1)
    stale = missing_in("docs/architecture.md", lines, _package_files())
    assert not stale, "docs/architecture.md names files that do not exist:\n" + "\n".join(stale)


def test_the_check_catches_a_stale_name() -> None:
    """The names this issue found stale, in a docstring and a comment: both are reported,
    while real names (bare, package-relative, repository-relative) pass."""
    source = (
        '"""See `claimcontract.py`, claims/claims.py and fakes/acme_vendor.py."""\n'
        "# rules live in slicerules.py and kubelet/store.py; nvml/events.py is real\n"
        "x = 'gpuhealth.py'  # a string, not prose: not checked\n"
    )
    got = missing_in("m.py", prose(source), _package_files())
    assert got == ["m.py:2: slicerules.py", "m.py:2: kubelet/store.py", "m.py:1: claimcontract.py"]


# --- "Adding a vendor" (docs/architecture.md): every step, for every vendor folder -----
PYPROJECT = ROOT / "pyproject.toml"
VALUES = ROOT / "charts" / "dra-plugin" / "values.yaml"
DEVICECLASS = ROOT / "charts" / "dra-plugin" / "templates" / "deviceclass.yaml"
REGISTRY = PACKAGE / "vendors" / "registry.py"
CONTRACTS = {  # the import-linter contracts step 3 names, by name: the list that holds a vendor
    "Vendor folders are independent": "modules",
    "Vendors never import the registry": "source_modules",
    "Only the vendor registry names the vendors": "forbidden_modules",
}


def adding_a_vendor() -> str:
    text = ARCHITECTURE.read_text()
    start = text.index("**Adding a vendor**")
    return text[start : text.index("\n\n", start)]


def _named(module: str, names: list[str]) -> bool:
    """Whether a contract's module list covers `module`, by name or by a wildcard over the
    vendors."""
    return module in names or bool(set(names) & {"dra_plugin.vendors.*", "dra_plugin.vendors.**"})


def contracts_missing(module: str, contracts: list[dict[str, Any]]) -> list[str]:
    """The contracts of step 3 that do not hold vendor `module`: each vendor contract, and
    the floors (the first layers contract), which must place `vendors/` as a whole or the
    vendor by name."""
    by_name = {c["name"]: c for c in contracts}
    missing = [
        title
        for title, key in CONTRACTS.items()
        if not _named(module, by_name.get(title, {}).get(key, []))
    ]
    layers = next((c for c in contracts if c["type"] == "layers"), {})
    names = {p.strip() for layer in layers.get("layers", []) for p in layer.split("|")}
    whole = layers.get("containers") == ["dra_plugin"] and "vendors" in names
    if not whole and module not in names:
        missing.append(str(layers.get("name", "the layers")))
    return missing


def vendor_steps_missing(name: str) -> list[str]:
    """What vendor `name` lacks of the steps "Adding a vendor" lists."""
    missing = []
    module = f"dra_plugin.vendors.{name}"
    if not (PACKAGE / "vendors" / name / "vendor.py").is_file():
        missing.append(f"step 1: dra_plugin/vendors/{name}/vendor.py")
    if module not in REGISTRY.read_text():
        missing.append(f"step 2: {name} in vendors/registry.py")
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    for title in contracts_missing(module, contracts):
        missing.append(f"step 3: {module} in the import-linter contract {title!r}")
    section = yaml.safe_load(VALUES.read_text()).get(name)
    if not isinstance(section, dict) or not {"enabled", "driverName", "deviceClass"} <= set(
        section
    ):
        missing.append(
            f"step 4: a {name}: section (enabled, driverName, deviceClass) in values.yaml"
        )
    if f".Values.{name}." not in DEVICECLASS.read_text():
        missing.append(f"step 4: {name}'s DeviceClass in deviceclass.yaml")
    return missing


def test_adding_a_vendor_names_its_steps_and_their_files() -> None:
    """The steps name the files they change, and those files exist."""
    steps = adding_a_vendor()
    for path in (REGISTRY, PYPROJECT, VALUES, DEVICECLASS, PACKAGE / "vendors" / "base.py"):
        rel = path.relative_to(ROOT).as_posix()
        assert path.is_file() and path.name in steps, f"'Adding a vendor' does not name {rel}"
    for title in CONTRACTS:
        assert title in steps.replace("\n   ", " "), f"'Adding a vendor' omits {title!r}"


def test_every_vendor_folder_takes_the_adding_a_vendor_steps() -> None:
    folders = sorted(p.parent.name for p in (PACKAGE / "vendors").glob("*/vendor.py"))
    assert folders, "no vendor folders found"
    missing = [m for name in folders for m in vendor_steps_missing(name)]
    assert not missing, "a vendor skipped steps of 'Adding a vendor':\n" + "\n".join(missing)


def test_the_vendor_check_catches_a_vendor_that_skipped_every_step() -> None:
    """A vendor with no folder, registry line or chart entry; the contracts hold it by
    wildcard, so it cannot miss step 3."""
    got = vendor_steps_missing("acme")
    assert [m.split(":")[0] for m in got] == ["step 1", "step 2", "step 4", "step 4"]


def test_the_contract_check_catches_contracts_that_name_each_vendor() -> None:
    """Contracts written the old way, listing the vendors by name, do not hold a new one."""
    named = ["dra_plugin.vendors.intel", "dra_plugin.vendors.nvidia"]
    old = [
        {"name": "Layers", "type": "layers", "layers": ["dra_plugin.vendors.intel"]},
        *({"name": t, "type": "forbidden", key: named} for t, key in CONTRACTS.items()),
    ]
    assert contracts_missing("dra_plugin.vendors.acme", old) == [*CONTRACTS, "Layers"]
    assert contracts_missing("dra_plugin.vendors.intel", old) == []
