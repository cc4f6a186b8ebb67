"""The chart's DaemonSet on the real node: the image built from the Dockerfile, imported
into the node's containerd, and `helm install` as the README's install section says.

What is the node's own (a chart user on another node would set the same values):
- its kubelet's root is not /var/lib/kubelet and its containerd reads the CDI root under
  the node's directory: `kubelet.registrarDir`, `kubelet.pluginsDir`, `cdi.root`;
- the NVIDIA driver root is the simulated one (`nvidia.driverRoot`), and the toolkit's
  CDI dirs are a directory of the node's (`nvidia.toolkitCdiDirs`), so nothing is made
  outside it.

What is simulated, through `extraEnv` and directories the chart mounts anyway:
- Intel and AMD GPUs: the node's umockdev testbed (fakes/simnode.py, the host plugin's) is
  bind-mounted under the kubelet's plugins dir, which the chart mounts at its host path,
  with umockdev's preload library beside it; `LD_PRELOAD` and `UMOCKDEV_DIR` make the real
  libudev in the image read the testbed's sysfs, udev database and /dev instead of the
  host's /sys, /run/udev and /dev, which the chart mounts as well (uevents reach the
  container through the testbed, so hotplug works as for the host plugin);
- NVIDIA: the stand-in NVML library is in the driver root the chart mounts, found there
  by the plugin as a real driver's is; its GPU profile is copied into that root.

The image name is the chart's default tag (the appVersion) under `localhost/dra-plugin`
(`--set image.repository=localhost/dra-plugin`, the README's one required value): the
node has no registry, the image is present, `IfNotPresent` never pulls.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fakes import imagebuild
from fakes.judges import helmenv
from fakes.node import cleanup
from fakes.node.session import DRIVERS, Session
from fakes.node.workloads import CHART, HELM, Obj, WorkloadError, chart_device_classes
from fakes.nvml_lib import EVENTS_ENV, PROFILE_ENV
from fakes.simnode import preload_library

NAMESPACE = "dra-plugin"
RELEASE = "dra-plugin"
REPOSITORY = "localhost/dra-plugin"
SELECTOR = "app.kubernetes.io/name=dra-plugin,app.kubernetes.io/instance=dra-plugin"
SIM_DIR = "dra-plugin-simnode"  # under the kubelet's plugins dir
UDEV = Path("/run/udev")  # the chart's udev hostPath (DirectoryOrCreate)


class ChartError(RuntimeError):
    """The chart could not be installed or its pod did not serve."""


def app_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def import_image(session: Session) -> str:
    """Build the image (fakes/imagebuild.py, as the image test does), tag it as the chart
    names it and import it into the node's containerd as an OCI archive."""
    ref = f"{REPOSITORY}:{app_version()}"
    archive = session.node.layout.work / "dra-plugin-image.tar"
    with imagebuild.podman_with_base() as podman:
        built = imagebuild.build(podman)
        podman.check("tag", built, ref)
        imagebuild.save_oci_archive(podman, ref, archive)
    try:
        session.node.ctr("images", "import", str(archive))
    finally:
        archive.unlink(missing_ok=True)
    return ref


@dataclass
class Simulation:
    """The simulated GPUs, reachable inside the plugin's container."""

    dir: Path
    env: dict[str, str] = field(default_factory=dict)
    driver_root: Path = Path()

    def close(self) -> None:
        """Unmount the testbed, then remove the directory. Never remove it while anything
        is mounted under it: that would delete the testbed itself (the host plugin's GPUs)
        through the bind mount. (os.path.ismount cannot tell a bind mount from the same
        filesystem: /proc's mount table decides.)"""
        for point in sorted(cleanup.mounts_under(self.dir), key=len, reverse=True):
            subprocess.run(["umount", point], capture_output=True)
        if cleanup.mounts_under(self.dir):
            raise ChartError(f"{self.dir} still has mounts: {cleanup.mounts_under(self.dir)}")
        shutil.rmtree(self.dir, ignore_errors=True)


def simulate(session: Session) -> Simulation:
    layout = session.node.layout
    sim = Simulation(layout.plugins / SIM_DIR)
    sim.close()
    testbed, lib = sim.dir / "testbed", sim.dir / "lib"
    testbed.mkdir(parents=True)
    lib.mkdir()
    subprocess.run(["mount", "--bind", session.plugin.sim.root, str(testbed)], check=True)
    preload = preload_library()
    assert preload is not None  # the node's session needs umockdev already
    shutil.copy2(preload, lib / Path(preload).name)
    host_env = session.plugin.env()
    sim.driver_root = Path(host_env["NVIDIA_DRIVER_ROOT"])
    nvml = sim.driver_root / "etc" / "fake-nvml"
    nvml.mkdir(parents=True, exist_ok=True)
    shutil.copy2(host_env[PROFILE_ENV], nvml / "profile.conf")
    (nvml / "events").write_text("")
    sim.env = {
        "LD_PRELOAD": str(lib / Path(preload).name),
        "UMOCKDEV_DIR": str(testbed),
        PROFILE_ENV: str(nvml / "profile.conf"),
        EVENTS_ENV: str(nvml / "events"),
    }
    return sim


def node_values(session: Session, sim: Simulation) -> Obj:
    """The values this node needs beyond the README's (module docstring)."""
    layout = session.node.layout
    return {
        "kubelet": {"registrarDir": str(layout.registry), "pluginsDir": str(layout.plugins)},
        "cdi": {"root": str(layout.cdi)},
        "nvidia": {
            "driverRoot": str(sim.driver_root),
            "toolkitCdiDirs": [str(layout.work / "toolkit-cdi")],
        },
        "extraEnv": [{"name": k, "value": v} for k, v in sorted(sim.env.items())],
    }


def helm(session: Session, *args: str, timeout: float = 180) -> str:
    helm_bin = str(HELM) if os.access(HELM, os.X_OK) else "helm"
    with tempfile.TemporaryDirectory(prefix="node-helm-") as tmp:
        # HOME too: helm keeps the cluster's discovery cache under $HOME/.kube (relative to
        # the working directory when HOME is unset).
        env = {**helmenv.isolated(tmp), "KUBECONFIG": str(session.node.kubeconfig), "HOME": tmp}
        proc = subprocess.run(
            [helm_bin, *args], capture_output=True, text=True, env=env, timeout=timeout
        )
    if proc.returncode != 0:
        raise ChartError(f"helm {' '.join(args)}: {proc.stderr}")
    return proc.stdout


@dataclass
class Release:
    session: Session
    sim: Simulation
    values_file: Path

    def pods(self) -> list[Obj]:
        return [
            p
            for p in self.session.kube.pods(NAMESPACE, SELECTOR)
            if not p["metadata"].get("deletionTimestamp")
        ]

    def registered(self, pod: Obj) -> bool:
        """The kubelet confirmed every driver of this plugin pod (its log says so) and its
        per-pod registration sockets are there (the chart's rolling-update names)."""
        uid = pod["metadata"]["uid"]
        registry = self.session.node.layout.registry
        if not all((registry / f"{d}-{uid}-reg.sock").exists() for d in DRIVERS):
            return False
        try:
            log = self.session.kube.logs(NAMESPACE, pod["metadata"]["name"])
        except Exception:  # noqa: BLE001 - not started yet
            return False
        return all(f"kubelet registered plugin driver={d}" in log for d in DRIVERS)

    def wait_serving(self, timeout: float = 180, exclude: frozenset[str] = frozenset()) -> Obj:
        """The plugin pod (one not in `exclude`, by uid) once it is Ready, registered and
        its node's devices are published."""
        kube = self.session.kube

        def serving() -> Obj | None:
            for pod in self.pods():
                if pod["metadata"]["uid"] in exclude:
                    continue
                conditions = pod.get("status", {}).get("conditions", [])
                ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                if ready and self.registered(pod):
                    return pod
            return None

        try:
            pod: Obj = kube.wait_for(serving, timeout, "the chart's plugin pod serving")
        except WorkloadError as exc:
            raise ChartError(f"{exc}\n{self.describe()}") from None
        kube.wait_for(
            lambda: all(self.session.published(d) for d in DRIVERS), 60, "devices published"
        )
        return pod

    def describe(self) -> str:
        out = []
        for pod in self.session.kube.pods(NAMESPACE, SELECTOR):
            out.append(self.session.kube.describe(pod))
            try:
                out.append(self.session.kube.logs(NAMESPACE, pod["metadata"]["name"])[-4000:])
            except Exception as exc:  # noqa: BLE001 - for the report only
                out.append(f"(no log: {exc})")
        return "\n".join(out)

    def upgrade(self, *sets: str) -> None:
        helm(self.session, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
             *(a for s in sets for a in ("--set", s)))  # fmt: skip

    def uninstall(self, timeout: float = 120) -> None:
        """helm uninstall; the pods gone, the namespace deleted, the simulation taken down
        and the DeviceClasses the node's other tests use applied again."""
        kube = self.session.kube
        try:
            helm(self.session, "uninstall", RELEASE, "-n", NAMESPACE, "--wait")
            kube.wait_for(lambda: not kube.pods(NAMESPACE, SELECTOR), timeout, "plugin pods gone")
            kube.delete(
                [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
            )
        finally:
            self.sim.close()
            existing = {
                d["metadata"]["name"]
                for d in self.session.node.api.ok("GET", "/apis/resource.k8s.io/v1/deviceclasses")[
                    "items"
                ]
            }
            kube.apply(c for c in chart_device_classes() if c["metadata"]["name"] not in existing)


def install(session: Session, *, timeout: float = 240) -> Release:
    """The host plugin stopped; the image imported; the README's install: the namespace
    with the privileged Pod Security level, then `helm install ... --set
    image.repository=... --set amd.enabled=true` with the node's values; returns once the
    DaemonSet's pod serves."""
    session.plugin.kill(signal.SIGTERM)
    import_image(session)
    if not UDEV.exists():  # the chart's hostPath makes it; teardown removes it again
        undo = cleanup.read_undo(session.node.layout)
        cleanup.write_undo(session.node.layout, host_dirs=[*undo.get("host_dirs", []), str(UDEV)])
    # The session applied the chart's DeviceClasses for the host plugin: the release owns
    # them now (helm refuses objects it did not make).
    for dc in chart_device_classes():
        session.kube.delete([dc])
    sim = simulate(session)
    values_file = session.node.layout.work / "chart-node-values.yaml"
    values_file.write_text(yaml.safe_dump(node_values(session, sim)))
    release = Release(session, sim, values_file)
    try:
        session.kube.apply(
            [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
        )
        session.node.api.ok(
            "PATCH",
            f"/api/v1/namespaces/{NAMESPACE}",
            {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}},
            content_type="application/merge-patch+json",
        )
        helm(session, "install", RELEASE, str(CHART), "-n", NAMESPACE,
             "--set", f"image.repository={REPOSITORY}", "--set", "amd.enabled=true",
             "-f", str(values_file))  # fmt: skip
        release.wait_serving(timeout)
    except BaseException:
        release.uninstall()
        raise
    return release
