"""The fakes are a package of their own (fakes/), beside the plugin: held to the house's
400-line rule, and, with demo/ and bench/, importing only supported modules, never the
test suite (tests.*), which is not installed and may change under them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORTED = ("fakes", "demo", "bench")


def long_modules(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): n
        for p in sorted(root.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 400
    }


def test_no_fakes_module_over_400_lines() -> None:
    too_long = long_modules(ROOT / "fakes")
    assert not too_long, f"split these by job: {too_long}"


def test_the_line_rule_catches_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "short.py").write_text("x = 1\n" * 400)
    (tmp_path / "long.py").write_text("x = 1\n" * 401)
    assert long_modules(tmp_path) == {"long.py": 401}


def imports_of_tests(root: Path) -> list[str]:
    """`file:line: module` for every import of `tests` or `tests.*` under root."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name == "tests" or name.startswith("tests."):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found


def test_demo_bench_and_fakes_never_import_the_tests() -> None:
    found = [f"{d}/{hit}" for d in SUPPORTED for hit in imports_of_tests(ROOT / d)]
    assert not found, "move what these need into fakes/:\n" + "\n".join(found)


def test_the_import_scan_catches_every_form(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "import tests\n"
        "import tests.judges.build as b\n"
        "from tests.integration.test_telemetry import _free_port\n"
        "from tests import judges\n"
        "def f() -> None:\n"
        "    from tests.judges import apiserver  # inside a function too\n"
        "import testsuite\n"
        "from fakes import tests_like\n"
        "from . import tests\n"
    )
    assert [hit.split(":")[1] for hit in imports_of_tests(tmp_path)] == ["1", "2", "3", "4", "6"]


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` (under root) it imports: at the top, inside
    functions and under TYPE_CHECKING alike (a circle drawn only for the type checker is
    still a circle to a reader). `from a import b` counts as importing a.b when that is a
    module, else a."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")[
                        : len(name.split(".")) - node.level + (1 if is_pkg else 0)
                    ]
                    mod = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    mod = node.module or ""
                targets = [
                    f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names
                ]
            else:
                continue
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected groups of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_in_fakes() -> None:
    found = circles(import_graph(ROOT, "fakes"))
    assert not found, f"import circles in fakes/: {found}"


def test_the_circle_check_catches_one(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n"
    )
    (pkg / "c.py").write_text("def f() -> None:\n    from . import a\n")
    (pkg / "d.py").write_text("import pkg.a\n")  # into the circle, not part of it
    assert circles(import_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
