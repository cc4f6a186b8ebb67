"""kill -9 while a GPU's time-slice is set or reset: the plugin processes of
tests/integration/test_timeslice_crash.py.

`python -m fakes.timeslice_crash PHASE STEP WORKDIR` runs, in one fresh interpreter (no
threads in the parent, so forking is safe), four plugin "processes", each a forked child:
prepare (killed at STEP when PHASE is prepare), a restart and the kubelet's repeated
prepare, unprepare (killed at STEP when PHASE is unprepare), a restart and the repeated
unprepare. It prints one JSON list: per process, its exit status (-9: killed) and its
report: after start-up and after its call, the GPU's time-slice as the nvidia-smi stand-in
keeps it (it outlives each process, as a GPU's setting does), whether the claim's spec is
there, and the GPUs the claims' record asks a time-slice of (reported as "book").
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fakes.mig_crash import forked

PREPARE_STEPS = (
    "claim-started", "timeslice-intent", "timeslice-set", "spec-written", "claim-completed",
)  # fmt: skip
UNPREPARE_STEPS = (
    "claim-unpreparing", "spec-removed", "timeslice-dropped", "timeslice-set", "claim-dropped",
)  # fmt: skip
PROFILE = "datacenter"
DEVICE = "gpu-3"
GPU = "GPU-0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d"
INTERVAL = 3  # gpu-test6.yaml asks for Long


def main(argv: list[str]) -> int:
    phase, step, root = argv[0], argv[1], Path(argv[2])
    from fakes.timeslice_node import stand_in_env

    os.environ.update(stand_in_env(PROFILE))

    from dra_plugin import crashpoints
    from dra_plugin.checkpoint.checkpoint import Checkpoint
    from fakes.claim_harness import FakeApi, ref
    from fakes.nvidia_claims import allocated, manifest_spec
    from fakes.nvml_lib import build_fake_nvml
    from fakes.timeslice_node import DRIVER, SliceNode, driver_root

    droot, smi = driver_root(build_fake_nvml(), root, PROFILE)
    obj = allocated(1, manifest_spec("gpu-test6.yaml"), {"gpu": DEVICE})
    api = FakeApi([obj])
    claim = ref(obj)

    def die(name: str, kill_at: str | None) -> None:
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def seen() -> dict[str, Any]:
        state = Checkpoint(root / "state", DRIVER).read()
        asked = {
            d.vendor["timeslice"]["gpu"]
            for rec in (state.claims.values() if state is not None else ())
            for d in rec.devices
            if d.vendor is not None and d.vendor.get("timeslice")
        }
        return {
            "timeslice": smi.gpu(GPU)["timeslice"],
            "spec": bool(list((root / "cdi").glob("*.json"))),
            "book": sorted(asked),
        }

    def process(call: str, kill_at: str | None) -> Any:
        crashpoints.install(lambda name: die(name, kill_at))
        node = SliceNode(droot, root, api)
        asyncio.run(node.preparer.startup())
        after_start = seen()
        if call == "prepare":
            got = asyncio.run(node.preparer.prepare([claim]))[claim.uid].error
        else:
            got = asyncio.run(node.preparer.unprepare([claim]))[claim.uid].error
        return {"start": after_start, "error": got, **seen()}

    runs = [
        forked(lambda: process("prepare", step if phase == "prepare" else None)),
        forked(lambda: process("prepare", None)),
        forked(lambda: process("unprepare", step if phase == "unprepare" else None)),
        forked(lambda: process("unprepare", None)),
    ]
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
