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
