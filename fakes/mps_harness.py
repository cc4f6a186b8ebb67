"""A claim preparer with NVIDIA's MPS step, talking to a fake API server over HTTP through
the plugin's own API client, for the MPS tests (tests/integration/test_mps.py).

`python -m fakes.mps_harness ROOT URL ACTION UID [STEP]` is one plugin "process" of the
kill -9 test: it starts up (recovery and reconcile), then prepares (`prepare`) or
unprepares (`unprepare`) claim UID, or does nothing more (`startup`), and SIGKILLs itself
when the step named STEP is reached. It prints one JSON line: the answer, or nothing when killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_plugin import crashpoints
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.claims.claims import ClaimPreparer, ClaimRef
from dra_plugin.config import Config
from dra_plugin.devices import Device, make_device
from dra_plugin.kubeapi import KubeAPI
from dra_plugin.running.workloads import LoopWorkloads
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.base import as_driver
from dra_plugin.vendors.claimsteps import ClaimSteps
from dra_plugin.vendors.nvidia.model import NVIDIA
from dra_plugin.vendors.nvidia.mps import MpsStep
from dra_plugin.vendors.nvidia.mpslimits import MpsOptions
from dra_plugin.vendors.nvidia.vendor import NvidiaDriver

NODE = "mini-1"
NAMESPACE = "dra-system"
DRIVER = "gpu.nvidia.com"
IMAGE = "dra-plugin:test"
GIB = 2**30
GPUS = {
    "GPU-00000000-aaaa-4bbb-8ccc-000000000000": 40 * GIB,
    "GPU-00000001-aaaa-4bbb-8ccc-000000000001": 40 * GIB,
}


def gpu(minor: int, name: str = "") -> Device:
    """GPU `minor` (its UUID the minor's in GPUS), named gpu-<minor> or `name`."""
    uuid = list(GPUS)[minor]
    return make_device(
        name=name or f"gpu-{minor}",
        vendor=NVIDIA,
        driver=DRIVER,
        attributes={"type": "gpu", "uuid": uuid},
        capacity={"memory": GPUS[uuid]},
        uuid=uuid,
        extra={"minor": str(minor)},
    )


MIG_UUID = "MIG-00000000-bbbb-4ccc-8ddd-000000000000"


def mig() -> Device:
    """An administrator's MIG device on GPU 0 (as discovery publishes one it did not make)."""
    parent = next(iter(GPUS))
    return make_device(
        name="gpu-0-mig-1g10gb-9-0",
        vendor=NVIDIA,
        driver=DRIVER,
        attributes={"type": "mig", "uuid": MIG_UUID, "parentUUID": parent, "profile": "1g.10gb"},
        capacity={"memory": 10 * GIB},
        uuid=MIG_UUID,
        extra={"minor": "0", "uuid": MIG_UUID, "parentUUID": parent, "gi": "9", "ci": "0"},
    )


def mps_config(
    threads: int | None = None, pinned: int | str | None = None, kind: str = "GpuConfig"
) -> dict[str, Any]:
    """NVIDIA's GpuConfig (or MigDeviceConfig) asking for MPS, as a claim carries it
    (decoded by the NVIDIA driver's own configs decoder)."""
    mps: dict[str, Any] = {}
    if threads is not None:
        mps["defaultActiveThreadPercentage"] = threads
    if pinned is not None:
        mps["defaultPinnedDeviceMemoryLimit"] = str(pinned)
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": kind,
        "sharing": {"strategy": "MPS", "mpsConfig": mps},
    }


def claim_obj(
    uid: str,
    devices: list[str],
    *,
    name: str = "",
    config: dict[str, Any] | None = None,
    share_ids: Mapping[str, str] | None = None,
    consumed: Mapping[str, dict[str, str]] | None = None,
    requests: Mapping[str, str] | None = None,
    configs: list[tuple[list[str], dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """An allocated claim: each device for request `gpu` (or its own name in `requests`),
    `config` for every request or `configs` ((requests, parameters), in order)."""
    results = []
    for d in devices:
        req = (requests or {}).get(d, "gpu")
        r: dict[str, Any] = {"request": req, "driver": DRIVER, "pool": NODE, "device": d}
        if share_ids and d in share_ids:
            r["shareID"] = share_ids[d]
        if consumed and d in consumed:
            r["consumedCapacity"] = consumed[d]
        results.append(r)
    alloc: dict[str, Any] = {"devices": {"results": results}}
    written = [([], config)] if config is not None else []
    written += configs or []
    if written:
        alloc["devices"]["config"] = [
            {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": p}}
            | ({"requests": reqs} if reqs else {})
            for reqs, p in written
        ]
    names = sorted({r["request"] for r in results})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "default", "name": name or f"claim-{uid[:8]}", "uid": uid},
        "spec": {"devices": {"requests": [{"name": n} for n in names]}},
        "status": {"allocation": alloc},
    }


def two_group_claim(uid: str) -> dict[str, Any]:
    """A claim with two MPS configs, one per request: 30 % on gpu-1 (request `small`),
    70 % on gpu-0 (request `large`): two daemons, each with its own limit."""
    return claim_obj(
        uid,
        ["gpu-1", "gpu-0"],
        requests={"gpu-1": "small", "gpu-0": "large"},
        configs=[(["small"], mps_config(threads=30)), (["large"], mps_config(threads=70))],
    )


def ref(obj: Mapping[str, Any]) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(meta["namespace"], meta["uid"], meta["name"])


def nvidia_driver(driver_root: Path) -> NvidiaDriver:
    d = as_driver(Config().driver(NVIDIA), NvidiaDriver)
    d = d.rebound(replace(d.settings, driver_root=driver_root, cdi_strategy="device-nodes"))
    d.serves_mps = True  # the MPS step is built by hand below, not by on_demand()
    return d


def preparer(
    root: Path,
    api: KubeAPI,
    driver_root: Path,
    *,
    shares: Sharing | None = None,
    ready_timeout: float = 20.0,
    devices: Mapping[str, Device] | None = None,
) -> tuple[ClaimPreparer, MpsStep]:
    """A preparer for the two GPUs above and the MIG device (or `devices`), its MPS step
    on `api` (call inside a loop)."""
    (root / "state").mkdir(parents=True, exist_ok=True)
    (root / "cdi").mkdir(parents=True, exist_ok=True)
    workloads = LoopWorkloads(api, asyncio.get_running_loop(), NAMESPACE, NODE)
    options = MpsOptions(DRIVER, IMAGE, ready_timeout, shares)
    driver = nvidia_driver(driver_root)
    step = MpsStep(options, root / "state", driver_root, workloads, driver.mps_for, shm_size="64m")
    if devices is None:
        devices = {d.name: d for d in (gpu(0), gpu(1), mig())}
    prep = ClaimPreparer(
        driver=DRIVER,
        node_name=NODE,
        state_dir=root / "state",
        cdi_root=root / "cdi",
        claim_edits=lambda devs, claim: driver.claim_edits(devs, Path("/"), claim),
        fetch_claim=api.get_claim,
        devices=lambda: devices,
        boot_id=lambda: "boot-1",
        sharing=shares,
        on_demand=ClaimSteps([step]),
        opaque_configs=frozenset(
            ("resource.nvidia.com/v1beta1", kind) for kind in ("GpuConfig", "MigDeviceConfig")
        ),
    )
    return prep, step


def recorded(root: Path, uid: str) -> dict[str, Any]:
    """Claim `uid`'s MPS entries in the record under `root`, by device (the one store of
    its daemons)."""
    state = Checkpoint(root / "state", DRIVER, boot_id=lambda: "boot-1").read()
    assert state is not None
    rec = state.claims[uid]
    return {d.device: d.vendor["mps"] for d in rec.devices if d.vendor and "mps" in d.vendor}


async def _process(root: Path, url: str, action: str, uid: str, kill_at: str) -> dict[str, Any]:
    def on_step(name: str) -> None:
        if name == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    api = KubeAPI.from_url(url)
    driver_root = Path(os.environ["MPS_TEST_DRIVER_ROOT"])
    crashpoints.install(on_step)
    prep, _ = preparer(root, api, driver_root)
    await prep.startup()
    claim = ClaimRef("default", uid, f"claim-{uid[:8]}")
    if action == "startup":
        out = {"error": ""}
    elif action == "prepare":
        got = await prep.prepare([claim])
        out = {"error": got[uid].error}
    else:
        out = {"error": (await prep.unprepare([claim]))[uid].error}
    await api.close()
    return out


def main(argv: list[str]) -> int:
    root, url, action, uid = argv[:4]
    kill_at = argv[4] if len(argv) > 4 else ""
    print(json.dumps(asyncio.run(_process(Path(root), url, action, uid, kill_at))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
