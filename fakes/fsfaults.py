"""Real file-system faults for the claim path, in a private mount namespace.

`unshare -rm` (user + mount namespace, no privileges needed) lets a child process see a
read-only bind mount of the CDI dir (EROFS) or a tiny tmpfs as the state dir (ENOSPC),
exactly as the kernel reports them; the parent's view of the files is unchanged. The
child runs `python -m fakes.fsfaults SCENARIO ROOT` and prints a JSON report.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import State
from fakes.claim_harness import (
    DRIVER,
    FakeApi,
    check_consistent,
    claim,
    intel_device,
    preparer,
    ref,
    result,
)

REPO = Path(__file__).resolve().parents[1]
DEVICES = [intel_device(i) for i in range(20)]
API = FakeApi([claim(i, [result(DEVICES[i].name)]) for i in range(20)])


def namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def run_child(setup: str, scenario: str, root: Path) -> dict[str, Any]:
    """`setup` (shell, inside the namespace: mounts) then the scenario; its report."""
    cmd = f"{setup} && exec {shlex.quote(sys.executable)} -m fakes.fsfaults {scenario} {root}"
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def claims_state(root: Path) -> dict[str, str]:
    state = Checkpoint(root / "state", DRIVER, boot_id=str).read() or State("")
    return {u: r.state for u, r in state.claims.items()}


def spec_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "cdi").iterdir())


def refs(indexes: range) -> list[Any]:
    return [ref(API.claims[("default", f"claim-{i}")]) for i in indexes]


async def prepare(root: Path, indexes: range) -> dict[str, str]:
    p = preparer(root, API, DEVICES)
    await p.startup()
    return {u: r.error for u, r in (await p.prepare(refs(indexes))).items()}


async def unprepare(root: Path, indexes: range) -> dict[str, str]:
    p = preparer(root, API, DEVICES)
    await p.startup()
    return {u: r.error for u, r in (await p.unprepare(refs(indexes))).items()}


def _consistent(root: Path) -> str:
    try:
        check_consistent(root)
        return ""
    except AssertionError as exc:
        return str(exc)


async def readonly_cdi(root: Path) -> dict[str, Any]:
    """The CDI dir is a read-only mount; claim 0 was prepared before."""
    out: dict[str, Any] = {"prepare": await prepare(root, range(1, 3))}
    out["after_prepare"] = claims_state(root)
    out["unprepare"] = await unprepare(root, range(1))
    out["after_unprepare"] = claims_state(root)
    out["files"] = spec_files(root)
    return out


async def full_state(root: Path) -> dict[str, Any]:
    """The state dir is a tiny tmpfs: claims 0-9 prepared, then the disk is filled."""
    out: dict[str, Any] = {"before": await prepare(root, range(10))}
    filler = root / "state" / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)
    out["prepare"] = await prepare(root, range(10, 20))
    out["after_prepare"] = claims_state(root)
    out["files_after_prepare"] = spec_files(root)
    out["unprepare"] = await unprepare(root, range(10))
    out["after_unprepare"] = claims_state(root)
    out["consistent_when_full"] = _consistent(root)
    p = preparer(root, API, DEVICES)  # a restart while the disk is still full
    await p.startup()
    out["after_restart"] = claims_state(root)
    filler.unlink()
    out["prepare_freed"] = await prepare(root, range(10, 20))
    out["unprepare_freed"] = await unprepare(root, range(10))
    out["final"] = claims_state(root)
    out["consistent"] = _consistent(root)
    return out


def main(argv: list[str]) -> None:
    scenario, root = argv[0], Path(argv[1])
    fn = {"readonly-cdi": readonly_cdi, "full-state": full_state}[scenario]
    report = asyncio.run(fn(root))
    print(json.dumps(report))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main(sys.argv[1:])
