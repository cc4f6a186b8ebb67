"""kubeapi/lazypackage.py: a package registered lazily imports its submodules without its
`__init__`, and runs that `__init__` the first time something else is asked of it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, code: str) -> str:
    pkg = tmp_path / "lazydemo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import sys\nsys.stdout.write('init ran\\n')\nfrom lazydemo import heavy\nVALUE = 42\n"
    )
    (pkg / "heavy.py").write_text("import sys\nsys.stdout.write('heavy ran\\n')\n")
    (pkg / "light.py").write_text("LIGHT = 1\n")
    (pkg / "sub" / "__init__.py").write_text("import sys\nsys.stdout.write('sub init ran\\n')\n")
    (pkg / "sub" / "leaf.py").write_text("LEAF = 2\n")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}"},
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def test_submodules_import_without_the_package_init(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        """
        from dra_plugin.kubeapi.lazypackage import lazy_packages
        lazy_packages("lazydemo", "lazydemo.sub")
        import lazydemo.light
        from lazydemo.sub.leaf import LEAF
        print(lazydemo.light.LIGHT, LEAF)
        """,
    )
    assert out.splitlines() == ["1 2"]


def test_the_first_other_attribute_runs_the_init_once(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        """
        from dra_plugin.kubeapi.lazypackage import lazy_packages
        lazy_packages("lazydemo")
        import lazydemo
        import lazydemo.light
        print("before")
        print(lazydemo.VALUE)
        print(lazydemo.VALUE, lazydemo.heavy.__name__)
        try:
            lazydemo.missing
        except AttributeError as exc:
            print("AttributeError", exc)
        """,
    )
    assert out.splitlines() == [
        "before",
        "init ran",
        "heavy ran",
        "42",
        "42 lazydemo.heavy",
        "AttributeError module 'lazydemo' has no attribute 'missing'",
    ]


def test_a_package_already_imported_is_left_alone(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        """
        import lazydemo
        from dra_plugin.kubeapi.lazypackage import lazy_packages
        lazy_packages("lazydemo", "not_installed_anywhere")
        print(lazydemo.VALUE)
        """,
    )
    assert out.splitlines() == ["init ran", "heavy ran", "42"]


def test_the_daemon_imports_no_client_subpackage_it_does_not_use() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, dra_plugin.daemon; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('websocket', 'jsonschema', 'kubernetes_validate', 'oauthlib', 'pydantic') "
            "or m in ('kubernetes.dynamic', 'kubernetes.stream', 'kubernetes.watch')))",
        ],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == "[]"
