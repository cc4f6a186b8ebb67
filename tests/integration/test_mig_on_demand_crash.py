"""kill -9 at every step of making and destroying a MIG instance on demand: after the
restart the instance is either in use by its claim (its spec is there) or destroyed, the
kubelet's repeated call succeeds, and at the end no instance is left.

Each plugin "process" is a forked child (real SIGKILL); the NVML stand-in keeps the
instances in its state file, so they outlive the process as on a real GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_plugin.vendors.nvidia.nvml.library import session
from dra_plugin.vendors.nvidia.nvml.miginstances import gpu_instances
from tests.fakes.claim_harness import FakeApi, ref
from tests.fakes.migworld import MigNode, placement_claim, set_env
from tests.fakes.nvml_lib import FakeNvml, build_fake_nvml

PREPARE_STEPS = [
    "claim-started", "mig-intent", "gi-created", "ci-created", "mig-recorded",
    "spec-written", "claim-completed",
]  # fmt: skip
UNPREPARE_STEPS = ["claim-unpreparing", "spec-removed", "ci-destroyed", "gi-destroyed",
                   "claim-dropped"]  # fmt: skip
KILLED = -signal.SIGKILL


@pytest.fixture(scope="module")
def fake() -> FakeNvml:
    return build_fake_nvml()


def forked(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run `fn` in a forked child: (its exit status or -signal, what it returned)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a plugin process
        os.close(r)
        code = 0
        try:
            out = json.dumps(fn()).encode()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out, code = json.dumps({"error": repr(exc)}).encode(), 3
        os.write(w, out)
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return code, json.loads(data) if data else None


def live(fake: FakeNvml) -> list[list[int]]:
    with session(fake.driver_root):
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return sorted([g.profile_id, g.start] for g in gpu_instances(h, range(40)))


@pytest.mark.parametrize("step", PREPARE_STEPS + UNPREPARE_STEPS)
def test_kill_at_every_step_ends_with_the_instance_in_use_or_destroyed(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    set_env(monkeypatch, tmp_path, "a100-40gb-mig-empty")
    target = "gpu-0-mig-3g20gb-9-4"
    obj = placement_claim(1, target)
    api = FakeApi([obj])
    claim = ref(obj)

    def process(call: str, kill_at: str | None) -> Any:
        node = MigNode(fake, tmp_path, api, on_step=lambda name: die(name, kill_at))
        node.maker.step = lambda name: die(name, kill_at)
        asyncio.run(node.preparer.startup())
        after_start = {
            "live": live(fake),
            "spec": bool(list((tmp_path / "cdi").glob("*.json"))),
            "book": sorted(node.maker.book.entries),
        }
        if call == "prepare":
            got = asyncio.run(node.preparer.prepare([claim]))[claim.uid].error
        else:
            got = asyncio.run(node.preparer.unprepare([claim]))[claim.uid]
        return {"start": after_start, "error": got, "live": live(fake)}

    def check_start(report: dict[str, Any]) -> None:
        start = report["start"]
        # Either in use by its claim (prepared: spec there) or destroyed.
        assert start["live"] in ([], [[9, 4]]), start
        assert (start["live"] == [[9, 4]]) == start["spec"], (step, start)
        assert start["book"] == ([target] if start["live"] else []), (step, start)

    # The first process prepares, killed at `step` when it is a prepare step.
    code, report = forked(lambda: process("prepare", step))
    assert code == (KILLED if step in PREPARE_STEPS else 0), report
    # A restart, then the kubelet's repeated prepare (and an unprepare killed at `step`).
    code, report = forked(lambda: process("prepare", None))
    assert code == 0, report
    check_start(report)
    assert report["error"] == "" and report["live"] == [[9, 4]], (step, report)
    code, report = forked(lambda: process("unprepare", step))
    assert code == (KILLED if step in UNPREPARE_STEPS else 0), report
    # A restart, then the kubelet's repeated unprepare: nothing is left.
    code, report = forked(lambda: process("unprepare", None))
    assert code == 0, report
    check_start(report)
    assert report["error"] == "" and report["live"] == [], (step, report)
    assert not list((tmp_path / "cdi").glob("*.json"))


def die(name: str, kill_at: str | None) -> None:
    if name == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
