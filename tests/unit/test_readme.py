"""The README stays true: its commands are the ones CI runs, its table covers every flag."""

from __future__ import annotations

import re
from pathlib import Path

from dra_plugin.config import all_options

ROOT = Path(__file__).resolve().parents[2]


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^bash \.ci/setup && (\.venv/bin/python -m pytest[^\n]*)$", readme, re.M)
    assert m, "README must show the test command"
    assert "bash .ci/setup\n" in ci and m.group(1) in ci.splitlines()


def test_readme_documents_every_flag_and_env() -> None:
    readme = (ROOT / "README.md").read_text()
    for flag, env in all_options().items():
        assert f"`{flag}`" in readme and f"`{env}`" in readme, flag
