"""AMD_PARTITION_MODES through the real discovery and libudev (umockdev), on the MI300X
CPX capture (fakes/amdcaptures.py): every mode of every GPU published with counters and
compatibility groups, the live CPX partitions carrying their DRM nodes; off, the node
publishes exactly what it did before."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fakes.amdswitch import PartitionKernel
from fakes.simnode import CARDS, REPO_ROOT, SimNode, unavailable_reason
from fakes.waits import wait_for

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)


def slices(node: SimNode, modes: str) -> list[dict[str, Any]]:
    """What `dra-plugin discover` says `run` would publish on the node."""
    r = subprocess.run(
        [sys.executable, "-m", "dra_plugin", "discover", "--node-name", "node-a",
         "--vendors", "amd", "--amd-partition-modes", modes, "-o", "json"],
        env=node.env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    items: list[dict[str, Any]] = json.loads(r.stdout)["items"]
    return items


def devices(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in items for d in s["spec"].get("devices") or []}


def test_every_mode_of_the_8_gpu_mi300x_node_in_three_slices() -> None:
    with SimNode("mi300x-cpx") as node:
        on, off = slices(node, "true"), slices(node, "false")
    # 8 counter sets in one slice, 8 x 15 devices in slices of at most 64
    assert [
        (len(s["spec"].get("sharedCounters") or []), len(s["spec"].get("devices") or []))
        for s in on
    ] == [(8, 0), (0, 64), (0, 56)]
    got = devices(on)
    base = "0000-05-00-0-0x74a1"
    mine = sorted(n.removeprefix(base + "-") for n in got if n.startswith(base))
    assert mine == sorted(
        ["spx", "dpx-p0", "dpx-p1", *(f"qpx-p{i}" for i in range(4)),
         *(f"cpx-p{i}" for i in range(8))]
    )  # fmt: skip
    for d in got.values():
        mode = d["attributes"]["partitionMode"]["string"]
        (use,) = d["consumesCounters"]
        assert use["compatibilityGroups"] == [mode]
        assert use["counterSet"] == d["name"].split(f"-{mode}")[0] + "-counters"
    # the CPX partitions that exist carry what discovery found for them
    cpx3 = got[f"{base}-cpx-p3"]["attributes"]
    assert (cpx3["renderIndex"]["int"], cpx3["partition"]["int"]) == (131, 3)
    assert "renderIndex" not in got[f"{base}-qpx-p1"]["attributes"]
    assert got[f"{base}-spx"]["capacity"]["memory"]["value"] == str(192 << 30)
    assert got[f"{base}-spx"]["capacity"]["computeUnits"]["value"] == "304"
    # off: today's names and shape, 63 partitions (the capture lacks one), no counters
    plain = devices(off)
    assert len(plain) == 63
    assert all(n.rsplit("-", 1)[1].startswith("p") for n in plain)
    assert not any(d.get("consumesCounters") for d in plain.values())


def _gpu(items: list[dict[str, Any]], pci: str) -> list[dict[str, Any]]:
    return [
        d
        for s in items
        for d in s["spec"].get("devices") or []
        if d["attributes"].get("parentPciAddr", d["attributes"].get("pciAddr", {}))
        == {"string": pci}
    ]


@pytest.mark.parametrize("fixed_xcp", [True, False], ids=["captured-xcp", "mode-xcp"])
def test_a_mode_written_to_sysfs_switches_the_simulated_gpu_as_amdgpu_does(
    fixed_xcp: bool,
) -> None:
    """The simulated amdgpu (fakes/amdswitch.py) answers a write of the mode: the old
    mode's partitions go, the new one's come (KFD nodes, and partition devices where the
    board makes only the mode's), with uevents."""
    card = CARDS["mi300x-cpx-0"]
    assert card.amd is not None
    if not fixed_xcp:
        card = replace(card, amd=replace(card.amd, xcp_devices=None))
    pci = card.pci_address
    with SimNode([]) as node:
        node.add_card(card, emit=False)
        assert len(_gpu(slices(node, "false"), pci)) == 8
        with PartitionKernel(node, latency=0.0) as kernel:
            path = Path(node.root + card.syspath, "current_compute_partition")
            path.write_text("QPX\n")  # what the plugin's write is under umockdev
            wait_for(lambda: kernel.switched == [(pci, "QPX")], 10, what="the switch")
        qpx = _gpu(slices(node, "false"), pci)
        assert sorted(d["attributes"]["partition"]["int"] for d in qpx) == [0, 1, 2, 3]
        assert {d["capacity"]["computeUnits"]["value"] for d in qpx} == {"76"}
        assert {d["attributes"]["computePartition"]["string"] for d in qpx} == {"qpx"}
        node.switch_compute_partition(pci, "SPX")
        (spx,) = _gpu(slices(node, "false"), pci)
        assert spx["attributes"]["type"] == {"string": "amdgpu"}
        assert spx["capacity"]["computeUnits"]["value"] == "304"
        # with the modes on, SPX's one device now carries the live nodes
        on = devices(slices(node, "true"))
        assert on["0000-05-00-0-0x74a1-spx"]["attributes"]["renderIndex"] == {"int": 128}
        assert "renderIndex" not in on["0000-05-00-0-0x74a1-cpx-p0"]["attributes"]
