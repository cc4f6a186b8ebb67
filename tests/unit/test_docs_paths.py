"""Docs stay true: every `.py` file a docstring or comment in dra_plugin/ names, and every
one docs/architecture.md names, exists. A bare name (`claims.py`) is looked up anywhere in
the package; a path (`nvml/events.py`, `tests/fakes/acme_vendor.py`) relative to dra_plugin/,
to the repository, or as the tail of a package path."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

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
        '"""See `claimcontract.py`, claims/claims.py and tests/fakes/acme_vendor.py."""\n'
        "# rules live in slicerules.py and kubelet/store.py; nvml/events.py is real\n"
        "x = 'gpuhealth.py'  # a string, not prose: not checked\n"
    )
    got = missing_in("m.py", prose(source), _package_files())
    assert got == ["m.py:2: slicerules.py", "m.py:2: kubelet/store.py", "m.py:1: claimcontract.py"]
