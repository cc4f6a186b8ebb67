"""NVIDIA's configs and time-slicing through the real prepare path: the real NVIDIA driver
(NVML stand-in GPUs, its configs, its per-claim steps), the real ClaimPreparer, and the
nvidia-smi stand-in in the driver root recording every call. NVIDIA's own example
manifests (tests/fixtures/nvidia_configs/) are prepared without edits."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_plugin import crashpoints
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.devices import DeviceNode, make_device
from dra_plugin.vendors.nvidia.model import NVIDIA
from fakes.claim_harness import FakeApi, ref, share_id
from fakes.nvidia_claims import allocated, manifest_spec
from fakes.nvidia_smi import SmiStandIn
from fakes.nvml_lib import build_fake_nvml
from fakes.timeslice_node import SliceNode, driver_root, stand_in_env

GPU0 = "GPU-5e1a6f3c-0b1d-4c2e-9f3a-7d8e9f0a1b2c"  # datacenter profile, gpu-0
GPU1 = "GPU-0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d"


def node_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str = "datacenter", **kw: Any
) -> tuple[Path, SmiStandIn, FakeApi, Callable[..., SliceNode]]:
    for k, v in stand_in_env(profile).items():
        monkeypatch.setenv(k, v)
    droot, smi = driver_root(build_fake_nvml(), tmp_path, profile, **kw)
    api = FakeApi()

    def make(**node_kw: Any) -> SliceNode:
        return SliceNode(droot, tmp_path, api, **node_kw)

    return droot, smi, api, make


def prepare(node: SliceNode, obj: dict[str, Any]) -> str:
    return asyncio.run(node.preparer.prepare([ref(obj)]))[ref(obj).uid].error


def unprepare(node: SliceNode, obj: dict[str, Any]) -> str:
    return asyncio.run(node.preparer.unprepare([ref(obj)]))[ref(obj).uid].error


def record(tmp_path: Path) -> Checkpoint:
    return Checkpoint(tmp_path / "state", "gpu.nvidia.com", boot_id=lambda: "boot-1")


def held(tmp_path: Path) -> set[str]:
    state = record(tmp_path).read()
    return set(state.claims) if state is not None else set()


def vendor_entries(tmp_path: Path, uid: str) -> dict[str, Any]:
    state = record(tmp_path).read()
    assert state is not None
    return {d.device: d.vendor for d in state.claims[uid].devices}


def start(node: SliceNode) -> None:
    asyncio.run(node.preparer.startup())


@pytest.mark.parametrize(
    ("fixture", "interval"), [("gpu-test6.yaml", 3), ("gpu-timeslicing.yaml", 1)]
)
def test_nvidias_time_slicing_manifests_set_the_gpu_and_reset_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture: str, interval: int
) -> None:
    droot, smi, api, make = node_for(tmp_path, monkeypatch)
    node = make()
    start(node)
    obj = allocated(1, manifest_spec(fixture), {"gpu": "gpu-3"})
    api.add(obj)
    assert prepare(node, obj) == ""
    assert smi.gpu(GPU1)["timeslice"] == interval
    assert smi.gpu(GPU0)["timeslice"] == 0
    # The claim holds the GPU whole: compute mode Default first, as NVIDIA's driver does.
    assert smi.calls() == [
        ["-i", GPU1, "-c", "DEFAULT"],
        ["compute-policy", "-i", GPU1, "--set-timeslice", str(interval)],
    ]
    # nvidia-smi from the driver root, with its NVML library preloaded.
    lib = droot / "usr/lib64/libnvidia-ml.so.1"  # the root's own path, as NVML finds it
    assert smi.preloads()[0].split(":")[0] == str(lib)
    entry = vendor_entries(tmp_path, ref(obj).uid)["gpu-3"]
    assert entry["timeslice"] == {"gpu": GPU1, "interval": interval, "at": 1, "boot": "boot-1"}
    # The kubelet's repeated prepare changes nothing on the GPU.
    assert prepare(node, obj) == ""
    assert len(smi.calls()) == 2
    assert unprepare(node, obj) == ""
    assert smi.gpu(GPU1)["timeslice"] == 0
    # NVIDIA's reset at unprepare: compute mode Default, then the Default time-slice.
    assert smi.calls()[2:] == [
        ["-i", GPU1, "-c", "DEFAULT"],
        ["compute-policy", "-i", GPU1, "--set-timeslice", "0"],
    ]
    assert held(tmp_path) == set() and not (tmp_path / "state/timeslice.json").exists()


def test_a_gpu_left_exclusive_is_set_back_to_default_for_a_whole_gpu_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    smi.set_gpu(GPU0, compute_mode="Exclusive_Process")
    node = make()
    start(node)
    obj = allocated(1, manifest_spec("gpu-test6.yaml"), {"gpu": "gpu-0"})
    api.add(obj)
    assert prepare(node, obj) == ""
    assert smi.gpu(GPU0)["compute_mode"] == "Default"


def test_an_admin_access_claim_sets_its_interval_and_never_the_compute_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admin access watches a GPU others may hold (here one left in EXCLUSIVE_PROCESS, as
    an MPS daemon keeps it): its time-slice is set, its mode is not reset under them."""
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    smi.set_gpu(GPU0, compute_mode="Exclusive_Process")
    node = make()
    start(node)
    obj = allocated(1, manifest_spec("gpu-test6.yaml"), {"gpu": "gpu-0"})
    for r in obj["status"]["allocation"]["devices"]["results"]:
        r["adminAccess"] = True
    api.add(obj)
    assert prepare(node, obj) == ""
    assert smi.calls() == [["compute-policy", "-i", GPU0, "--set-timeslice", "3"]]
    assert smi.gpu(GPU0)["compute_mode"] == "Exclusive_Process"
    assert unprepare(node, obj) == ""
    assert smi.gpu(GPU0)["timeslice"] == 0 and smi.gpu(GPU0)["compute_mode"] == "Exclusive_Process"


def test_a_claim_without_configs_runs_nothing_and_renders_its_spec_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """...and, as every pass, both lone prepares run in the pass thread, never on the
    event loop (claims/claims.py)."""
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    loop_thread = threading.get_ident()  # asyncio.run's loop runs in this thread
    where: list[str] = []

    def step(name: str) -> None:
        if name == "claim-started":
            where.append("loop" if threading.get_ident() == loop_thread else "thread")

    crashpoints.install(step)
    node = make()
    rendered: list[str] = []
    edits = node.preparer._parts.claim_edits

    def counting(devs: Any, claim: Any) -> Any:
        rendered.append(claim.uid)
        return edits(devs, claim)

    node.preparer._parts.claim_edits = counting
    start(node)
    plain = allocated(1, {"devices": {"requests": [{"name": "gpu"}]}}, {"gpu": "gpu-0"})
    sliced = allocated(2, manifest_spec("gpu-test6.yaml"), {"gpu": "gpu-3"})
    api.add(plain)
    api.add(sliced)
    assert prepare(node, plain) == ""
    assert rendered == [ref(plain).uid]  # once: the step made nothing for it
    assert prepare(node, sliced) == ""
    assert rendered.count(ref(sliced).uid) == 1  # once, after the step recorded its entry
    assert where == ["thread", "thread"]
    assert unprepare(node, plain) == ""
    assert smi.calls() == [
        ["-i", GPU1, "-c", "DEFAULT"],
        ["compute-policy", "-i", GPU1, "--set-timeslice", "3"],
    ]
    assert vendor_entries(tmp_path, ref(sliced).uid)["gpu-3"] is not None


def two_shares_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[SmiStandIn, SliceNode, dict[str, Any], dict[str, Any]]:
    """Two shares of gpu-0 prepared: interval 3 (gpu-test6), then 1 (gpu-timeslicing)."""
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    node = make(shared=True)
    start(node)
    long = allocated(
        1, manifest_spec("gpu-test6.yaml"), {"gpu": "gpu-0"}, share_ids={"gpu": share_id(1)}
    )
    short = allocated(
        2, manifest_spec("gpu-timeslicing.yaml"), {"gpu": "gpu-0"}, share_ids={"gpu": share_id(2)}
    )
    for obj in (long, short):
        api.add(obj)
        assert prepare(node, obj) == ""
    return smi, node, long, short


def test_shares_of_one_gpu_keep_the_held_claims_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi, node, long, short = two_shares_prepared(tmp_path, monkeypatch)
    assert smi.gpu(GPU0)["timeslice"] == 1  # the last asked
    assert not any("-c" in c for c in smi.calls())  # a share never changes the compute mode
    assert unprepare(node, short) == ""
    assert smi.gpu(GPU0)["timeslice"] == 3  # the held claim's setting is kept
    assert unprepare(node, long) == ""
    assert smi.gpu(GPU0)["timeslice"] == 0
    assert smi.timeslice_calls() == [(GPU0, 3), (GPU0, 1), (GPU0, 3), (GPU0, 0)]


def test_every_share_of_a_gpu_unprepared_in_one_call_sets_it_back_to_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One kubelet call unpreparing both shares: each release sees the other claim as
    going too (it is `unpreparing` in the record), so the GPU is reset, not left at the
    interval of the claim released first."""
    smi, node, long, short = two_shares_prepared(tmp_path, monkeypatch)
    answers = asyncio.run(node.preparer.unprepare([ref(short), ref(long)]))
    assert {uid: a.error for uid, a in answers.items()} == {ref(short).uid: "", ref(long).uid: ""}
    assert smi.gpu(GPU0)["timeslice"] == 0
    assert held(tmp_path) == set()


def test_nvidias_mig_manifest_prepares_and_touches_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, smi, api, make = node_for(tmp_path, monkeypatch, profile="a100-mig")
    node = make()
    start(node)
    mig, other = [d.name for d in node.devices.values() if d.attrs.get("type") == "mig"][:2]
    obj = allocated(1, manifest_spec("gpu-simple-mig-ts.yaml"), {"mig1gts": mig})
    api.add(obj)
    assert prepare(node, obj) == ""
    assert smi.calls() == []
    # A GpuConfig asking for time-slicing on that MIG device is the claim's error.
    spec = manifest_spec("gpu-test6.yaml")
    bad = allocated(2, spec, {"gpu": other})
    api.add(bad)
    err = prepare(node, bad)
    assert "opaque config #0 (FromClaim)" in err and "cannot apply GpuConfig" in err, err
    assert smi.calls() == []


def test_nvidias_vfio_manifest_prepares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    node = make()
    node.devices["gpu-vfio-0"] = make_device(
        name="gpu-vfio-0", vendor=NVIDIA, driver="gpu.nvidia.com",
        attributes={"type": "vfio"}, extra={"type": "vfio"},
        nodes=(DeviceNode("/dev/vfio/12", 511, 1),),
        shared_nodes=(DeviceNode("/dev/vfio/vfio", 10, 196),),
    )  # fmt: skip
    start(node)
    obj = allocated(1, manifest_spec("gpu-test-vfio-config.yaml"), {"gpu": "gpu-vfio-0"})
    api.add(obj)
    assert prepare(node, obj) == ""
    spec = json.loads(next((tmp_path / "cdi").glob("*.json")).read_text())
    assert "/dev/vfio/vfio" in json.dumps(spec)  # the API device NVIDIA's config enables
    assert smi.calls() == []


@pytest.mark.parametrize("fixture", ["gpu-test-mps.yaml", "gpu-test5.yaml"])
def test_mps_manifests_are_refused_where_no_mps_daemon_can_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture: str
) -> None:
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    node = make()
    start(node)
    spec = manifest_spec(fixture)
    names = [r["name"] for r in spec["devices"]["requests"]]
    obj = allocated(1, spec, dict(zip(names, ["gpu-0", "gpu-3"], strict=False)))
    api.add(obj)
    err = prepare(node, obj)
    # This node has no namespace or image for MPS daemons (test_mps.py runs them).
    assert "MPS needs the plugin's namespace and an image" in err, err
    # gpu-test5's time-sliced GPU was set before MPS failed, and is back at Default.
    assert [i for _, i in smi.timeslice_calls()][-1:] in ([], [0])
    assert not list((tmp_path / "cdi").glob("*.json"))


def test_an_invalid_config_is_the_claims_error_and_nothing_is_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    node = make()
    start(node)
    spec = manifest_spec("gpu-test6.yaml")
    spec["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["timeSlicingConfig"] = {
        "interval": "VeryLong"
    }
    obj = allocated(1, spec, {"gpu": "gpu-0"})
    api.add(obj)
    err = prepare(node, obj)
    assert err.startswith(
        f"claim default/claim-1 (uid {ref(obj).uid}): opaque config #0 (FromClaim)"
    )
    assert "sharing.timeSlicingConfig.interval: unknown time-slice interval 'VeryLong'" in err
    assert smi.calls() == []
    assert ref(obj).uid not in held(tmp_path)


def test_not_supported_is_the_claims_error_unless_default_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, smi, api, make = node_for(tmp_path, monkeypatch, unsupported=(GPU0,))
    node = make()
    start(node)
    obj = allocated(1, manifest_spec("gpu-test6.yaml"), {"gpu": "gpu-0"})
    api.add(obj)
    err = prepare(node, obj)
    assert f"device gpu-0: set the time-slice of GPU {GPU0} to 3" in err and "Not Supported" in err
    assert held(tmp_path) == set() and not (tmp_path / "state/timeslice.json").exists()
    spec = manifest_spec("gpu-test6.yaml")
    spec["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["timeSlicingConfig"] = {}
    default = allocated(2, spec, {"gpu": "gpu-0"})
    api.add(default)
    assert prepare(node, default) == ""
    assert unprepare(node, default) == ""
    # Long refused, the undo's Default, the Default claim's; its unprepare has nothing to set.
    assert smi.timeslice_calls() == [(GPU0, 3), (GPU0, 0), (GPU0, 0)]
    assert smi.gpu(GPU0)["timeslice"] == 0


def test_a_restart_sets_nothing_in_the_same_boot_and_a_reboot_sets_held_ones_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    node = make()
    start(node)
    held = allocated(1, manifest_spec("gpu-test6.yaml"), {"gpu": "gpu-0"})
    gone = allocated(2, manifest_spec("gpu-timeslicing.yaml"), {"gpu": "gpu-3"})
    for obj in (held, gone):
        api.add(obj)
        assert prepare(node, obj) == ""
    assert unprepare(node, gone) == ""
    calls = len(smi.calls())
    start(make())  # the same boot: the record says the held claim's GPU is set
    assert smi.calls()[calls:] == []
    assert (smi.gpu(GPU0)["timeslice"], smi.gpu(GPU1)["timeslice"]) == (3, 0)
    # A reboot: every interval was reset; the held claim's is set again, once.
    state = smi.state()
    state["gpus"][GPU0]["timeslice"] = 0
    smi.state_path.write_text(json.dumps(state))
    start(make(boot="boot-2"))
    assert smi.gpu(GPU0)["timeslice"] == 3
    assert vendor_entries(tmp_path, ref(held).uid)["gpu-0"]["timeslice"]["boot"] == "boot-2"
    calls = len(smi.calls())
    start(make(boot="boot-2"))
    assert smi.calls()[calls:] == []


FIXTURE = Path(__file__).parent.parent / "fixtures" / "pretimeslice" / "timeslice.json"


def test_the_old_book_is_read_once_its_gpus_of_claims_gone_reset_and_it_is_retired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/fixtures/pretimeslice/: `timeslice.json` as earlier versions wrote it. Its
    claims on GPU0 are held (long, asked first; short, asked last: the record of either
    has no order), GPU1's claim is gone (an unprepare whose reset never ran)."""
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    node = make(shared=True)
    start(node)
    long = allocated(
        1, manifest_spec("gpu-test6.yaml"), {"gpu": "gpu-0"}, share_ids={"gpu": share_id(1)}
    )
    short = allocated(
        2, manifest_spec("gpu-timeslicing.yaml"), {"gpu": "gpu-0"}, share_ids={"gpu": share_id(2)}
    )
    for obj in (short, long):  # recorded in the other order than the book says
        api.add(obj)
        assert prepare(node, obj) == ""
    # As the earlier version recorded them: no order, no boot.
    cp = record(tmp_path)
    state = cp.read()
    assert state is not None
    cp.put(
        replace(r, devices=tuple(replace(d, vendor={"v": 1, "timeslice": {
            "gpu": GPU0, "interval": d.vendor["timeslice"]["interval"]}})  # type: ignore[index]
            for d in r.devices))
        for r in state.claims.values()
    )  # fmt: skip
    book = json.loads(FIXTURE.read_text())
    assert set(book["gpus"]) == {GPU0, GPU1}
    long_uid, short_uid = ref(long).uid, ref(short).uid
    book["gpus"][GPU0]["claims"] = [[long_uid, 3], [short_uid, 1]]
    (tmp_path / "state/timeslice.json").write_text(json.dumps(book))
    smi.set_gpu(GPU1, timeslice=2)  # set for the claim gone
    start(make(shared=True))
    assert (smi.gpu(GPU0)["timeslice"], smi.gpu(GPU1)["timeslice"]) == (1, 0)
    assert not (tmp_path / "state/timeslice.json").exists()
    assert (tmp_path / "state/timeslice.json.migrated").exists()
    # The book's order is the record's now: short asked last; its unprepare sets long's.
    node = make(shared=True)
    assert unprepare(node, short) == ""
    assert smi.gpu(GPU0)["timeslice"] == 3
    assert unprepare(node, long) == ""
    assert smi.gpu(GPU0)["timeslice"] == 0


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_record_keeps_what_each_claim_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """The record is the one store of the time-slice: damaged, it is rebuilt from the
    records beside the specs, which carry each claim's entry, so the GPU is still set back
    when its claim goes."""
    _, smi, api, make = node_for(tmp_path, monkeypatch)
    node = make()
    start(node)
    obj = allocated(1, manifest_spec("gpu-test6.yaml"), {"gpu": "gpu-3"})
    api.add(obj)
    assert prepare(node, obj) == ""
    assert smi.gpu(GPU1)["timeslice"] == 3
    for name in ("checkpoint.json", "checkpoint.journal"):
        path = tmp_path / "state" / name
        if damage == "missing":
            path.unlink(missing_ok=True)
        elif path.exists():
            path.write_text("damaged")
    node = make()
    start(node)
    assert vendor_entries(tmp_path, ref(obj).uid)["gpu-3"]["timeslice"]["gpu"] == GPU1
    assert smi.gpu(GPU1)["timeslice"] == 3
    assert unprepare(node, obj) == ""
    assert smi.gpu(GPU1)["timeslice"] == 0
