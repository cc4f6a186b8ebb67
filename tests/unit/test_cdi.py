"""CDI naming, version gating, the validator, per-vendor rendering and the spec files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.cdi import rules as cdispec
from dra_plugin.config import parse
from dra_plugin.devices import DeviceNode, make_device
from dra_plugin.vendors.nvidia import cdi as nv_cdi
from fakes.claim_harness import intel_device, nvidia_device, uid

DRIVER = "gpu.intel.com"
UID_LETTER = "a1b2c3d4-0000-4000-8000-000000000001"
UID_DIGIT = "11b2c3d4-0000-4000-8000-000000000001"


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "cdiVersion": "0.3.0",
        "kind": "k8s.gpu.intel.com/claim",
        "devices": [{"name": "dev-a", "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}],
    }
    base.update(over)
    return base


def test_naming() -> None:
    assert cdi.kind(DRIVER) == "k8s.gpu.intel.com/claim"
    assert cdi.qualified_id(DRIVER, UID_LETTER, "0000-00-02-0-0x7d55") == (
        f"k8s.gpu.intel.com/claim={UID_LETTER}-0000-00-02-0-0x7d55"
    )
    assert cdi.spec_file_name(DRIVER, UID_LETTER) == f"k8s.gpu.intel.com-claim_{UID_LETTER}.json"
    for bad in ("../x", "a/b", "", "A" * 10, "x" * 64, "a\0b", "-a"):
        with pytest.raises(cdi.CdiError):
            cdi.spec_file_name(DRIVER, bad)


@pytest.mark.parametrize(
    ("change", "version"),
    [
        ({}, "0.3.0"),
        ({"devices": [{"name": "1dev", "containerEdits": {"env": ["A=1"]}}]}, "0.5.0"),
        (
            {
                "devices": [
                    {
                        "name": "dev",
                        "containerEdits": {"deviceNodes": [{"path": "/a", "hostPath": "/b"}]},
                    }
                ]
            },
            "0.5.0",
        ),
        (
            {
                "containerEdits": {
                    "mounts": [{"hostPath": "/a", "containerPath": "/a", "type": "x"}]
                }
            },
            "0.4.0",
        ),
        ({"annotations": {"a": "b"}}, "0.6.0"),
        ({"kind": "vendor.com/cla.ss"}, "0.6.0"),
        ({"containerEdits": {"additionalGids": [5]}}, "0.7.0"),
        ({"containerEdits": {"intelRdt": {"closID": "x"}}}, "0.7.0"),
        ({"containerEdits": {"netDevices": []}}, "1.1.0"),
    ],
)
def test_required_version(change: dict[str, Any], version: str) -> None:
    assert cdispec.required_version(spec(**change))[0] == version


def test_validator_accepts_a_valid_spec() -> None:
    assert cdispec.validate_spec(spec()) == []


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"kind": "foo"}, "kind"),
        ({"kind": "vendor.com/foo/"}, "kind"),
        ({"kind": "vendor.com/foo/bar"}, "kind"),
        ({"kind": "1vendor/foo"}, "kind"),
        ({"kind": "vendor.com/" + "c" * 64}, "kind"),
        ({"cdiVersion": "0.2.0"}, "cdiVersion"),
        ({"cdiVersion": "9.9.9"}, "cdiVersion"),
        ({"devices": []}, "at least one device"),
        ({"devices": [{"name": "a b", "containerEdits": {"env": ["A=1"]}}]}, "name"),
        ({"devices": [{"name": "-ab", "containerEdits": {"env": ["A=1"]}}]}, "name"),
        ({"devices": [{"name": "ab", "containerEdits": {}}]}, "at least one edit"),
        ({"devices": [{"name": "ab"}]}, "must be an object"),
        ({"extra": 1}, "unknown field"),
        (
            {"devices": [{"name": "ab", "containerEdits": {"deviceNodes": [{"path": "rel"}]}}]},
            "absolute",
        ),
        ({"devices": [{"name": "ab", "containerEdits": {"env": ["NOEQUALS"]}}]}, "NAME=VALUE"),
        (
            {
                "devices": [
                    {"name": "ab", "containerEdits": {"hooks": [{"hookName": "x", "path": "/h"}]}}
                ]
            },
            "hookName",
        ),
        # version gating: a 0.5.0 field under cdiVersion 0.4.0
        (
            {
                "cdiVersion": "0.4.0",
                "devices": [
                    {
                        "name": "ab",
                        "containerEdits": {"deviceNodes": [{"path": "/a", "hostPath": "/b"}]},
                    }
                ],
            },
            "too low",
        ),
        ({"cdiVersion": "0.5.0", "annotations": {"a": "b"}}, "too low"),
        ({"devices": [{"name": "1ab", "containerEdits": {"env": ["A=1"]}}]}, "too low"),
        (
            {
                "devices": [
                    {"name": "ab", "containerEdits": {"env": ["A=1"]}},
                    {"name": "ab", "containerEdits": {"env": ["A=1"]}},
                ]
            },
            "not unique",
        ),
    ],
)
def test_validator_rejects(change: dict[str, Any], fragment: str) -> None:
    errors = cdispec.validate_spec(spec(**change))
    assert any(fragment in e for e in errors), errors


def test_intel_render_with_by_path_links() -> None:
    dev = intel_device(2)
    r = cdi.render_claim_spec(DRIVER, UID_LETTER, [dev], max_version="0.8.0")
    assert r.file_name == f"k8s.gpu.intel.com-claim_{UID_LETTER}.json"
    assert r.spec["cdiVersion"] == "0.5.0"  # hostPath on the by-path links
    nodes = r.spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes[0] == {"path": "/dev/dri/card2", "type": "c", "major": 226, "minor": 2}
    assert nodes[1]["path"] == "/dev/dri/renderD130"
    assert nodes[2] == {
        "path": "/dev/dri/by-path/pci-0000:02:00.0-card",
        "hostPath": "/dev/dri/card2",
        "type": "c",
    }
    assert r.cdi_ids == {dev.name: (f"k8s.gpu.intel.com/claim={UID_LETTER}-{dev.name}",)}
    assert cdispec.validate_spec(r.spec) == []


def test_lowest_version_and_cap() -> None:
    plain = make_device(
        name="d0",
        vendor="intel",
        driver=DRIVER,
        attributes={},
        nodes=(DeviceNode("/dev/dri/card0", 226, 0),),
    )
    r = cdi.render_claim_spec(DRIVER, UID_LETTER, [plain], max_version="0.3.0")
    assert r.spec["cdiVersion"] == "0.3.0"
    r = cdi.render_claim_spec(DRIVER, UID_DIGIT, [plain], max_version="0.8.0")
    assert r.spec["cdiVersion"] == "0.5.0"  # device name starts with a digit
    with pytest.raises(cdi.CdiError, match=r"needs cdiVersion 0\.5\.0 .* maximum 0\.4\.0"):
        cdi.render_claim_spec(DRIVER, UID_DIGIT, [plain], max_version="0.4.0")


def test_a_spec_shape_is_checked_once_and_its_bytes_are_the_specs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The version and the validation run once per shape (the spec less its claim uid);
    what is written is byte for byte the spec's own JSON; a cap and an invalid spec are
    still refused every time."""
    monkeypatch.setattr(cdi, "_CHECKED", {})
    checks: list[int] = []
    real = cdi.validate_spec

    def counting(spec: Any, **kw: Any) -> list[str]:
        checks.append(1)
        return real(spec, **kw)

    monkeypatch.setattr(cdi, "validate_spec", counting)
    dev = intel_device(2)
    first = cdi.render_claim_spec(DRIVER, UID_LETTER, [dev], max_version="0.8.0")
    other = UID_LETTER.replace("0001", "0002")
    again = cdi.render_claim_spec(DRIVER, other, [dev], max_version="0.8.0")
    assert len(checks) == 1  # the same shape for another claim
    for r in (first, again):
        assert r.encoded == cdi._encode(r.spec) and cdispec.validate_spec(r.spec) == []
    assert again.spec["cdiVersion"] == first.spec["cdiVersion"] == "0.5.0"
    # A uid starting with a digit is another shape (it may need another version).
    cdi.render_claim_spec(DRIVER, UID_DIGIT, [dev], max_version="0.8.0")
    assert len(checks) == 2
    with pytest.raises(cdi.CdiError, match=r"needs cdiVersion 0\.5\.0 .* maximum 0\.4\.0"):
        cdi.render_claim_spec(DRIVER, other, [dev], max_version="0.4.0")  # from the cache
    # An invalid spec is never remembered: refused again, and checked each time.
    bad = make_device(
        name="d0", vendor="intel", driver=DRIVER, attributes={},
        nodes=(DeviceNode("relative/path", 226, 0),),
    )  # fmt: skip
    for _ in range(2):
        with pytest.raises(cdi.CdiError, match="rendered CDI spec is invalid"):
            cdi.render_claim_spec(DRIVER, UID_LETTER, [bad], max_version="0.8.0")
    assert len(checks) == 4


def test_options_from_config() -> None:
    cfg = parse(
        [
            "run",
            "--node-name",
            "n1",
            "--cdi-max-version",
            "0.6.0",
            "--nvidia-cdi-strategy",
            "toolkit",
        ],
        env={},
    )
    opts = nv_cdi.UserspaceOptions.of(cfg.driver("nvidia").settings, cfg.host_root)
    assert (cfg.cdi_max_version, opts.strategy) == ("0.6.0", "toolkit")


# --- NVIDIA --------------------------------------------------------------------------
def fake_driver_root(root: Path, *, hook: bool = False) -> None:
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    for name in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        (lib / f"{name}.so.570.86.15").write_bytes(b"\x7fELF")
        (lib / f"{name}.so.1").symlink_to(f"{name}.so.570.86.15")
    (lib / "libnvidia-gpucomp.so.570.86.15").write_bytes(b"\x7fELF")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_bytes(b"#!")
    if hook:
        (root / "usr/bin/nvidia-cdi-hook").write_bytes(b"#!")


def toolkit_spec(d: Path, uuids: list[str], fmt: str = "yaml") -> None:
    d.mkdir(parents=True, exist_ok=True)
    devices = "".join(
        f"- name: {u}\n  containerEdits:\n    deviceNodes:\n    - path: /dev/x\n" for u in uuids
    )
    if fmt == "yaml":
        (d / "nvidia.yaml").write_text(
            f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{devices}"
        )
    else:
        (d / "nvidia.json").write_text(
            json.dumps(
                {
                    "cdiVersion": "0.5.0",
                    "kind": "nvidia.com/gpu",
                    "devices": [{"name": u} for u in uuids],
                }
            )
        )


def render_nvidia(
    opts: nv_cdi.UserspaceOptions, devs: list[Any]
) -> tuple[nv_cdi.NvidiaPlan, cdi.RenderedSpec]:
    plan = nv_cdi.plan_nvidia(opts, [d.uuid for d in devs])
    edits = nv_cdi.claim_edits(devs, plan)
    r = cdi.render_claim_spec("gpu.nvidia.com", UID_LETTER, devs, max_version="0.8.0", edits=edits)
    assert cdispec.validate_spec(r.spec) == []
    return plan, r


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_nvidia_toolkit_strategy(tmp_path: Path, fmt: str) -> None:
    dev = nvidia_device(0)
    assert dev.uuid is not None
    toolkit_spec(tmp_path / "static", [dev.uuid, "all"], fmt)
    (tmp_path / "static" / "broken.yaml").write_text(": : :")
    opts = nv_cdi.UserspaceOptions(
        strategy="auto", toolkit_cdi_dirs=(tmp_path / "missing", tmp_path / "static")
    )
    plan, r = render_nvidia(opts, [dev])
    assert plan.strategy == "toolkit"
    assert r.cdi_ids["gpu-0"] == (
        f"k8s.gpu.nvidia.com/claim={UID_LETTER}-gpu-0",
        f"nvidia.com/gpu={dev.uuid}",
    )
    edits = r.spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert edits == [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]
    ctl = [n["path"] for n in r.spec["containerEdits"]["deviceNodes"]]
    assert ctl == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert "mounts" not in r.spec["containerEdits"]


def test_nvidia_explicit_toolkit_without_spec_is_an_error(tmp_path: Path) -> None:
    opts = nv_cdi.UserspaceOptions(strategy="toolkit", toolkit_cdi_dirs=(tmp_path,))
    with pytest.raises(
        cdi.CdiError, match=r"strategy toolkit: .* do not list nvidia\.com/gpu=GPU-1"
    ):
        nv_cdi.plan_nvidia(opts, ["GPU-1"])


@pytest.mark.parametrize("hook", [False, True])
def test_nvidia_host_libs(tmp_path: Path, hook: bool) -> None:
    root = tmp_path / "driver"
    fake_driver_root(root, hook=hook)
    opts = nv_cdi.UserspaceOptions(
        strategy="auto",
        toolkit_cdi_dirs=(tmp_path / "none",),
        driver_root=root,
        host_driver_root=Path("/run/nvidia/driver"),
        host_root=root,
    )
    plan, r = render_nvidia(opts, [nvidia_device(1)])
    assert plan.strategy == "host-libs"
    mounts = {m["containerPath"]: m for m in r.spec["containerEdits"]["mounts"]}
    libdir = "/usr/lib/x86_64-linux-gnu"
    real = "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.15"
    assert mounts[f"{libdir}/libcuda.so.1"]["hostPath"] == real
    assert mounts[f"{libdir}/libcuda.so.570.86.15"]["hostPath"] == real
    assert f"{libdir}/libnvidia-gpucomp.so.570.86.15" in mounts
    assert mounts["/usr/bin/nvidia-smi"]["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert r.cdi_ids["gpu-1"] == (f"k8s.gpu.nvidia.com/claim={UID_LETTER}-gpu-1",)
    if hook:
        assert r.spec["containerEdits"]["hooks"] == [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", libdir],
            }
        ]
    else:
        assert "hooks" not in r.spec["containerEdits"]
        assert "no nvidia-cdi-hook" in plan.reason


def test_nvidia_device_nodes_fallback(tmp_path: Path) -> None:
    opts = nv_cdi.UserspaceOptions(toolkit_cdi_dirs=(tmp_path,), driver_root=tmp_path)
    plan, r = render_nvidia(opts, [nvidia_device(3)])
    assert plan.strategy == "device-nodes"
    assert "no NVIDIA driver libraries" in plan.reason
    assert set(r.spec["containerEdits"]) == {"deviceNodes"}
    with pytest.raises(cdi.CdiError, match="strategy host-libs"):
        nv_cdi.plan_nvidia(
            nv_cdi.UserspaceOptions(strategy="host-libs", driver_root=tmp_path), ["GPU-1"]
        )
    plan = nv_cdi.plan_nvidia(nv_cdi.UserspaceOptions(strategy="device-nodes"), ["GPU-1"])
    assert plan.strategy == "device-nodes"


# --- files ---------------------------------------------------------------------------
def test_write_is_atomic_readable_and_validated(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        path = cdi.write_spec(tmp_path, "k8s.gpu.intel.com-claim_abc.json", spec())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert json.loads(path.read_text()) == spec()
    # One compact line (json's C encoder; with indent it falls back to pure Python).
    assert path.read_text().count("\n") == 1 and '", "' not in path.read_text()
    assert os.listdir(tmp_path) == [path.name]  # no temp file left
    with pytest.raises(cdi.CdiError, match="invalid CDI spec"):
        cdi.write_spec(tmp_path, "k8s.gpu.intel.com-claim_abd.json", spec(kind="bad"))
    for bad in ("../escape.json", "sub/x.json", ".."):
        with pytest.raises(cdi.CdiError, match="plain file name"):
            cdi.write_spec(tmp_path, bad, spec())
    assert cdi.remove_spec(tmp_path, path.name) is True
    assert cdi.remove_spec(tmp_path, path.name) is False  # missing is fine


def test_a_rendered_spec_is_written_as_rendered_without_validating_again_or_syncing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = cdi.render_claim_spec(DRIVER, UID_LETTER, [intel_device(0)], max_version="0.8.0")
    calls: list[str] = []
    monkeypatch.setattr(cdi, "validate_spec", lambda s: calls.append("validate") or [])
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync"))
    path = cdi.write_rendered(tmp_path, r, durable=False)
    assert json.loads(path.read_text()) == r.spec and path.name == r.file_name
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert calls == []  # render_claim_spec validated it; not durable: no fsync
    cdi.write_rendered(tmp_path, r)
    assert calls == ["fsync", "fsync"]  # durable: the file, then the directory


def test_listing_and_gc_touch_only_our_files(tmp_path: Path) -> None:
    ours = [uid(1), uid(2), uid(3)]
    for u in ours:
        (tmp_path / cdi.spec_file_name(DRIVER, u)).write_text("{}")
    (tmp_path / cdi.spec_file_name("gpu.nvidia.com", uid(4))).write_text("{}")
    foreign = [
        "nvidia.yaml",
        "k8s.gpu.intel.com-claim_UPPER.json",
        "k8s.gpu.intel.com-claim_x.yaml",
        "k8s.gpu.intel.comx-claim_abc.json",
        "k8s.other.com-claim_abc.json",
        "random.json",
    ]
    for name in foreign:
        (tmp_path / name).write_text("{}")
    (tmp_path / f".k8s.gpu.intel.com-claim_{uid(9)}.json.tmp-1234").write_text("{")
    listed = cdi.list_spec_files(tmp_path, [DRIVER, "gpu.nvidia.com"])
    assert sorted(listed[DRIVER]) == ours
    assert list(listed["gpu.nvidia.com"]) == [uid(4)]
    removed = cdi.gc_spec_files(tmp_path, DRIVER, keep={uid(2)})
    assert sorted(p.name for p in removed) == sorted(
        [
            cdi.spec_file_name(DRIVER, uid(1)),
            cdi.spec_file_name(DRIVER, uid(3)),
            f".k8s.gpu.intel.com-claim_{uid(9)}.json.tmp-1234",
        ]
    )
    left = set(os.listdir(tmp_path))
    assert set(foreign) <= left
    assert cdi.spec_file_name(DRIVER, uid(2)) in left
    assert cdi.spec_file_name("gpu.nvidia.com", uid(4)) in left
    assert cdi.list_spec_files(tmp_path / "missing", [DRIVER]) == {DRIVER: {}}


def test_driver_root_under_host_mount_maps_to_host_paths() -> None:
    cfg = parse(["run"], {"NODE_NAME": "n", "NVIDIA_DRIVER_ROOT": "/host", "HOST_ROOT": "/host"})
    opts = nv_cdi.UserspaceOptions.of(cfg.driver("nvidia").settings, cfg.host_root)
    assert opts.driver_root == Path("/host") and opts.host_driver_root == Path("/")
    cfg = parse(["run"], {"NODE_NAME": "n", "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"})
    opts = nv_cdi.UserspaceOptions.of(cfg.driver("nvidia").settings, cfg.host_root)
    assert opts.host_driver_root == Path("/run/nvidia/driver")


def test_toolkit_spec_changes_are_seen_despite_the_cache(tmp_path: Path) -> None:
    spec = tmp_path / "nvidia.yaml"

    def write(*uuids: str) -> None:
        body = {
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "devices": [{"name": u, "containerEdits": {}} for u in uuids],
        }
        spec.write_text(json.dumps(body))
        os.utime(spec, ns=(len(uuids), len(uuids)))  # a new mtime even within one tick

    write("GPU-a")
    assert nv_cdi.toolkit_devices([tmp_path]) == {"GPU-a"}
    assert nv_cdi.toolkit_devices([tmp_path]) == {"GPU-a"}  # served from the cache
    write("GPU-a", "GPU-b")
    assert nv_cdi.toolkit_devices([tmp_path]) == {"GPU-a", "GPU-b"}
    spec.unlink()
    assert nv_cdi.toolkit_devices([tmp_path]) == set()


def test_a_driver_installed_later_is_seen_despite_the_library_cache(tmp_path: Path) -> None:
    root = tmp_path / "driver"
    (root / "usr/lib").mkdir(parents=True)
    opts = nv_cdi.UserspaceOptions(toolkit_cdi_dirs=(tmp_path / "none",), driver_root=root)
    assert nv_cdi.plan_nvidia(opts, ["GPU-1"]).strategy == "device-nodes"
    assert nv_cdi.plan_nvidia(opts, ["GPU-1"]).strategy == "device-nodes"  # cached
    fake_driver_root(root)  # creates usr/lib/x86_64-linux-gnu: usr/lib's mtime changes
    assert nv_cdi.plan_nvidia(opts, ["GPU-1"]).strategy == "host-libs"


def test_the_planner_sees_an_install_once_its_facts_are_older_than_the_interval(
    tmp_path: Path,
) -> None:
    root = tmp_path / "driver"
    (root / "usr/lib").mkdir(parents=True)
    opts = nv_cdi.UserspaceOptions(toolkit_cdi_dirs=(tmp_path / "cdi",), driver_root=root)
    now = [100.0]
    planner = nv_cdi.Planner(ttl=2.0, clock=lambda: now[0])
    assert planner.plan(opts, ["GPU-1"]).strategy == "device-nodes"
    fake_driver_root(root)
    now[0] += 1.9  # within the interval: the facts gathered at 100.0 still hold
    assert planner.plan(opts, ["GPU-1"]).strategy == "device-nodes"
    now[0] += 0.1  # the interval is over: gathered again, the driver is seen
    plan = planner.plan(opts, ["GPU-1"])
    assert plan.strategy == "host-libs"
    assert plan == nv_cdi.plan_nvidia(opts, ["GPU-1"])
    toolkit_spec(tmp_path / "cdi", ["GPU-1"], "json")
    assert planner.plan(opts, ["GPU-1"]).strategy == "host-libs"
    now[0] += 2.0
    assert planner.plan(opts, ["GPU-1"]).strategy == "toolkit"
    # Other options are never answered with the facts of the last ones.
    other = nv_cdi.UserspaceOptions(strategy="device-nodes", driver_root=root)
    assert planner.plan(other, ["GPU-1"]).strategy == "device-nodes"
    assert planner.plan(opts, ["GPU-1"]).strategy == "toolkit"
