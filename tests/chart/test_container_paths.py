"""What the container runtime must create in the plugin's containers, and the host's /dev
the plugin reads.

The kubelet bind-mounts each container's termination message file (its
`terminationMessagePath`, `/dev/termination-log` unless set) from its own directory, so
the runtime (runc under containerd or CRI-O) first creates an empty file at that path in
the container. Under a read-only volume it cannot: the container fails to start
("error mounting ... to rootfs at \"/dev/termination-log\": ... read-only file system").
Podman, which the image test runs, adds no such file, so only this rule sees it. The
rootfs itself is no obstacle (`readOnlyRootFilesystem` is applied after the mounts).
"""

from __future__ import annotations

import copy
from pathlib import PurePosixPath
from typing import Any

import pytest

from dra_plugin.host import udev, vfio
from dra_plugin.options import SOCKET_PATH_MAX
from dra_plugin.vendors.amd import devices as amd_devices
from dra_plugin.vendors.nvidia import model as nvidia_model

from .rendering import Manifest, only, run_helm, template_args

DEFAULT_TERMINATION_PATH = "/dev/termination-log"  # the API server's default

# Every place under /dev the plugin reads or names in CDI specs (as the host's path).
PLUGIN_DEV_PATHS = (
    udev.DEV_DRI,  # cardN / renderDN (stat for major/minor where udev has none)
    f"{udev.DEV_DRI}/by-path",  # links resolved to their target for CDI specs
    *(n.path for n in nvidia_model.CONTROL_NODES),  # NVML opens these
    "/dev/nvidia0",  # NVML opens each GPU's node
    "/dev/nvidia-caps",  # MIG access nodes
    vfio.VFIO_CONTAINER,
    "/dev/vfio",  # /dev/vfio/<group>, stat'ed for major/minor
    "/dev/vfio/devices",  # iommufd cdevs
    vfio.IOMMUFD,
    f"/dev/{amd_devices.KFD_SUBSYSTEM}",
)


def _pod_templates(rendered: list[Manifest]) -> list[tuple[str, dict[str, Any]]]:
    """(object name, pod spec) of every object that runs containers."""
    out = []
    for m in rendered:
        name = f"{m['kind']}/{m['metadata']['name']}"
        if m["kind"] == "Pod":
            out.append((name, m["spec"]))
        elif m["kind"] == "CronJob":
            out.append((name, m["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
        elif "template" in m.get("spec", {}):
            out.append((name, m["spec"]["template"]["spec"]))
    return out


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def _covering(path: str, container: dict[str, Any]) -> dict[str, Any] | None:
    """The deepest volume mount at or above `path`, or None (the container's rootfs)."""
    p = PurePosixPath(path)
    mounts = [m for m in container.get("volumeMounts", []) if p.is_relative_to(m["mountPath"])]
    return max(mounts, key=lambda m: len(PurePosixPath(m["mountPath"]).parts), default=None)


def termination_file_problems(pod: dict[str, Any]) -> list[str]:
    """Why the runtime could not create a container's termination message file."""
    problems = []
    for c in _containers(pod):
        path = c.get("terminationMessagePath", DEFAULT_TERMINATION_PATH)
        mount = _covering(path, c)
        if mount is None:
            continue
        if PurePosixPath(mount["mountPath"]) == PurePosixPath(path):
            problems.append(f"{c['name']}: volume {mount['name']} is mounted at {path} itself")
        elif mount.get("readOnly", False):
            problems.append(
                f"{c['name']}: {path} is on the read-only volume {mount['name']} "
                f"(at {mount['mountPath']}); the runtime cannot create it"
            )
    return problems


def test_the_runtime_can_create_every_termination_message_file(
    rendered: list[Manifest],
) -> None:
    templates = _pod_templates(rendered)
    assert templates, "the chart runs no containers?"
    for name, pod in templates:
        assert termination_file_problems(pod) == [], name


def test_the_rule_sees_the_read_only_dev_of_the_chart_before_the_fix(
    rendered: list[Manifest],
) -> None:
    """The DaemonSet as it was (host /dev read-only at /dev, the default path) fails the
    rule, so the test above would have caught it."""
    pod = copy.deepcopy(only(rendered, "DaemonSet")["spec"]["template"]["spec"])
    (container,) = pod["containers"]
    container.pop("terminationMessagePath")
    (problem,) = termination_file_problems(pod)
    assert "/dev/termination-log is on the read-only volume dev (at /dev)" in problem
    # On a failed exit that wrote no message, the kubelet shows the log's tail instead.
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_plugin_sees_the_hosts_dev_live_at_its_host_paths(rendered: list[Manifest]) -> None:
    """Each /dev path the plugin reads is the host's own, through a hostPath directory
    mount that keeps the path (CDI specs name host paths; a by-path link resolves to a
    host path), and a directory, not single nodes, so nodes made after the start (a GPU
    bound to vfio-pci, a driver loaded later) appear in it."""
    pod = only(rendered, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in PLUGIN_DEV_PATHS:
        mount = _covering(path, container)
        assert mount is not None, (
            f"{path} is not mounted: the container's own /dev is not the host's"
        )
        assert "subPath" not in mount and "subPathExpr" not in mount, path
        host = volumes[mount["name"]].get("hostPath")
        assert host is not None, f"{path} is on volume {mount['name']}, not the host's"
        assert host.get("type", "") in ("", "Directory"), f"{path}: {host}"
        inside = PurePosixPath(path).relative_to(mount["mountPath"])
        assert PurePosixPath(host["path"]) / inside == PurePosixPath(path), (
            f"{path} in the container is {PurePosixPath(host['path']) / inside} on the host"
        )


@pytest.mark.parametrize("read_only", [True, False])
def test_the_rule_on_made_up_pods(read_only: bool) -> None:
    """A read-only volume above the path is refused, a writable one deeper is fine, and
    a volume at the path itself clashes with the kubelet's own mount."""
    container: dict[str, Any] = {
        "name": "c",
        "terminationMessagePath": "/var/log/app/termination",
        "volumeMounts": [{"name": "logs", "mountPath": "/var/log", "readOnly": read_only}],
    }
    pod = {"containers": [container]}
    assert bool(termination_file_problems(pod)) is read_only
    container["volumeMounts"].append({"name": "app", "mountPath": "/var/log/app"})
    assert termination_file_problems(pod) == []
    container["volumeMounts"].append({"name": "f", "mountPath": "/var/log/app/termination"})
    assert termination_file_problems(pod) == [
        "c: volume f is mounted at /var/log/app/termination itself"
    ]


# The kubelet root of the real node's first try (fakes/node/config.py shortened it): with a
# pod UID in the socket names, gpu.intel.com's registration socket was 109 bytes and the
# plugin exited at start ("unix sockets allow at most 107") in a crash loop.
LONG_KUBELET = "/var/lib/dra-plugin-node/kubelet"


@pytest.mark.parametrize(
    ("setting", "vendor"),
    [
        (f"kubelet.registrarDir={LONG_KUBELET}/plugins_registry", "intel"),
        (f"kubelet.pluginsDir={LONG_KUBELET}/plugins/and/a/few/more/levels", "intel"),
    ],
)
def test_kubelet_paths_too_long_for_the_sockets_are_refused(setting: str, vendor: str) -> None:
    proc = run_helm(*template_args(None, "--set", setting), check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    assert f"at most {SOCKET_PATH_MAX}" in proc.stderr and f"{vendor}.driverName" in proc.stderr


def test_the_sockets_fit_under_the_default_and_the_nodes_kubelet_dirs() -> None:
    for kubelet in ("/var/lib/kubelet", "/var/lib/dra-plugin-node/k"):
        sets = [f"kubelet.registrarDir={kubelet}/plugins_registry"]
        sets += [f"kubelet.pluginsDir={kubelet}/plugins", "amd.enabled=true"]
        args = [a for s in sets for a in ("--set", s)]
        assert run_helm(*template_args(None, *args), check=False).returncode == 0, kubelet
