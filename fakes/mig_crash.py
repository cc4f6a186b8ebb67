"""kill -9 while a MIG instance is made or destroyed on demand: the plugin processes of
tests/integration/test_mig_on_demand_crash.py.

`python -m fakes.mig_crash STEP WORKDIR` runs, in one fresh interpreter (no threads
in the parent, so forking is safe), four plugin "processes", each a forked child: prepare
killed at STEP (when it is a prepare step), a restart and the kubelet's repeated prepare,
unprepare killed at STEP (when it is an unprepare step), a restart and the repeated
unprepare. It prints one JSON list: per process, its exit status (-9: killed) and its
report (what it found after start-up and after its call). The NVML stand-in keeps the
instances in its state file, so they outlive each process as on a real GPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PREPARE_STEPS = (
    "claim-started", "mig-intent", "gi-created", "ci-created", "spec-written",
    "claim-completed",
)  # fmt: skip
UNPREPARE_STEPS = (
    "claim-unpreparing", "spec-removed", "ci-destroyed", "gi-destroyed", "claim-dropped",
)  # fmt: skip
PROFILE = "a100-40gb-mig-empty"
TARGET = "gpu-0-mig-3g20gb-9-4"  # profile 9 at memory slice 4


def forked(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Run `fn` in a forked child: (its exit status or -signal, what it returned)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one plugin process
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


def main(argv: list[str]) -> int:
    step, root = argv[0], Path(argv[1])
    # The stand-in reads its environment at the first nvmlInit: set before anything loads.
    from fakes.migworld import stand_in_env

    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/devices").write_text("Character devices:\n195 nvidia\n508 nvidia-caps\n")
    os.environ.update(stand_in_env(root, PROFILE))

    import pynvml

    from dra_plugin import crashpoints
    from dra_plugin.vendors.nvidia.nvml.library import session
    from dra_plugin.vendors.nvidia.nvml.miginstances import gpu_instances
    from fakes.claim_harness import FakeApi, ref
    from fakes.migworld import MigNode, placement_claim
    from fakes.nvml_lib import build_fake_nvml

    fake = build_fake_nvml()
    obj = placement_claim(1, TARGET)
    api = FakeApi([obj])
    claim = ref(obj)

    def live() -> list[list[int]]:
        with session(fake.driver_root):
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            return sorted([g.profile_id, g.start] for g in gpu_instances(h, range(40)))

    def die(name: str, kill_at: str | None) -> None:
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def process(call: str, kill_at: str | None) -> Any:
        crashpoints.install(lambda name: die(name, kill_at))
        node = MigNode(fake, root, api)
        asyncio.run(node.preparer.startup())
        after_start = {
            "live": live(),
            "spec": bool(list((root / "cdi").glob("*.json"))),
            "ours": sorted(node.maker.owned),  # what the record says was made
        }
        if call == "prepare":
            got = asyncio.run(node.preparer.prepare([claim]))[claim.uid].error
        else:
            got = asyncio.run(node.preparer.unprepare([claim]))[claim.uid].error
        return {"start": after_start, "error": got, "live": live()}

    runs = [
        forked(lambda: process("prepare", step)),
        forked(lambda: process("prepare", None)),
        forked(lambda: process("unprepare", step)),
        forked(lambda: process("unprepare", None)),
    ]
    runs.append((0, {"specs_left": sorted(p.name for p in (root / "cdi").glob("*.json"))}))
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
