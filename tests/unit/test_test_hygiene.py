"""Integration tests wait on events and conditions, not on time (issue #27, item 9).

A fixed sleep used to synchronize passes too early on a slow machine, and a "nothing
happened" assertion after one proves nothing. A sleep that is itself under test (a slow
fake, a rate measured over a window) stays, marked `# sleep-ok: <reason>` on its line;
waiting goes through fakes/waits.py."""

from __future__ import annotations

import re
from pathlib import Path

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
SLEEP = re.compile(r"\b(?:time|asyncio)\.sleep\(|\bfrom\s+(?:time|asyncio)\s+import\b.*\bsleep\b")
MARKER = re.compile(r"#\s*sleep-ok:\s*\S")


def bare_sleeps(root: Path) -> list[str]:
    """`file:line: text` for every sleep under root without a `# sleep-ok: <reason>`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if SLEEP.search(line) and not MARKER.search(line):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_no_bare_sleep_in_integration_tests() -> None:
    found = bare_sleeps(INTEGRATION)
    assert not found, (
        "wait on a condition (fakes/waits.py) instead of sleeping, or mark a sleep "
        "that is part of what is tested with '# sleep-ok: <reason>':\n" + "\n".join(found)
    )


def test_the_check_catches_a_bare_sleep(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import time\n"
        "time.sleep(0.5)\n"
        "await asyncio.sleep(0.3)  # let it settle\n"
        "from time import sleep\n"
        "time.sleep(1)  # sleep-ok: a slow fake is the subject\n"
        "time.sleep(1)  # sleep-ok:\n"
    )
    assert [f.split(":")[1] for f in bare_sleeps(tmp_path)] == ["2", "3", "4", "6"]
