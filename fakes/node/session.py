"""The node with the plugin on it, as the tests and `python -m fakes.node` use it.

`start(root)` brings the node up (node.py), applies the chart's DeviceClasses, creates the
NVIDIA control nodes the host lacks, starts `dra-plugin run` on the simulated GPUs and
returns once every driver's devices are published and the kubelet has registered every
driver. `run_pod(session, example, pod)` is the README's smoke test: apply the example,
wait for the pod to finish, read its log and its claims and the CDI specs written for
them; `delete(...)` then removes it all, and says whether the specs went with it.
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakes.node import plugin as hostplugin
from fakes.node.node import DEFAULT_ROOT, Node
from fakes.node.plugin import AMD, INTEL, NVIDIA, HostPlugin
from fakes.node.workloads import (
    Cluster,
    Obj,
    WorkloadError,
    chart_device_classes,
    claim_names,
    example,
)

DRIVERS = (INTEL, NVIDIA, AMD)


@dataclass
class Session:
    node: Node
    plugin: HostPlugin
    kube: Cluster
    seconds: dict[str, float] = field(default_factory=dict)
    device_nodes: list[str] = field(default_factory=list)  # made on the host for the node

    @property
    def cdi(self) -> Path:
        return self.node.layout.cdi

    def published(self, driver: str) -> list[str]:
        return sorted(
            d["name"]
            for s in self.kube.slices(self.node.name)
            if s["spec"]["driver"] == driver
            for d in s["spec"].get("devices", [])
        )

    def registered(self, driver: str, since: int = 0) -> bool:
        """Whether the plugin's log (from byte `since`) says the kubelet confirmed the
        registration of `driver` (its NotifyRegistrationStatus call)."""
        with self.plugin.log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return f"kubelet registered plugin driver={driver}" in text

    def plugin_log_size(self) -> int:
        return self.plugin.log.stat().st_size if self.plugin.log.exists() else 0

    def start_plugin(self, timeout: float = 90.0, env: dict[str, str] | None = None) -> None:
        """(Re)start the plugin (`env`: settings beyond the defaults); returns once it
        serves, publishes and is registered."""
        mark = self.plugin_log_size()
        t0 = time.monotonic()
        self.plugin.start(env)
        self.plugin.wait_serving(DRIVERS, timeout)
        for driver in DRIVERS:
            self.kube.wait_for(
                lambda d=driver: self.published(d), timeout, f"{driver} devices published"
            )
            self.kube.wait_for(
                lambda d=driver: self.registered(d, mark), timeout, f"kubelet registered {driver}"
            )
        self.seconds["plugin"] = time.monotonic() - t0

    def reboot(self) -> None:
        """Node.reboot() with the plugin killed first and started again after."""
        self.plugin.kill(signal.SIGKILL)
        self.node.reboot()
        self.start_plugin()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.plugin.close()
        self.node.down()


def start(root: Path = DEFAULT_ROOT, **plugin_options: Any) -> Session:
    node = Node.up(root)
    try:
        kube = Cluster(node.api)
        kube.apply(chart_device_classes())
        made = hostplugin.make_nvidia_nodes(node.layout)
        plugin = HostPlugin(node.layout, node.kubeconfig, node.name, **plugin_options)
        session = Session(node, plugin, kube, device_nodes=made)
        session.start_plugin()
        return session
    except BaseException:
        node.down()
        raise


@dataclass
class PodRun:
    objects: list[Obj]
    pod: Obj
    log: str
    claims: list[Obj]
    specs: list[Path]
    seconds: float


def claim_pod(name: str, device_class: str, command: list[str]) -> list[Obj]:
    """A claim template and a pod using it, in the examples' shape (for the tests' own
    pods: long-running ones, pods created at a chosen moment)."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                }
            }
        },
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "test",
                    "image": "busybox:1.37",
                    "command": command,
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        },
    }
    return [template, pod]


def run_pod(
    session: Session,
    example_name: str | list[Obj],
    pod_name: str,
    *,
    phases: tuple[str, ...] = ("Succeeded",),
    timeout: float = 120.0,
    applied: bool = False,
) -> PodRun:
    """Apply examples/<example_name> (or these objects) and wait for pod `pod_name` to
    reach `phases` (`applied`: the objects exist already, only wait)."""
    objects = example(example_name) if isinstance(example_name, str) else example_name
    t0 = time.monotonic()
    if not applied:
        session.kube.apply(objects)
    pod_obj = next(o for o in objects if o["kind"] == "Pod" and o["metadata"]["name"] == pod_name)
    namespace = pod_obj["metadata"].get("namespace", "default")
    # A finished pod's claims are unprepared (their specs removed) and then deleted by the
    # resourceclaim controller: what they held is read while the pod runs.
    seen = Seen(session)
    pod = session.kube.wait_phase(namespace, pod_name, phases, timeout, each=seen.look)
    seconds = time.monotonic() - t0
    seen.look(pod)
    log = session.kube.logs(namespace, pod_name)
    return PodRun(objects, pod, log, list(seen.claims.values()), sorted(seen.specs), seconds)


class Seen:
    """A pod's claims and their CDI spec files, as last seen (polled while it runs)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.claims: dict[str, Obj] = {}
        self.specs: set[Path] = set()

    def look(self, pod: Obj) -> None:
        namespace = pod["metadata"]["namespace"]
        for name in claim_names(pod):
            path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
            resp = self.session.node.api.request("GET", path)
            if resp.status != 200:
                continue
            claim: Obj = resp.body
            old = self.claims.get(name)
            # Keep the fullest view: a claim being torn down loses its status entries.
            if (
                old is None
                or claim.get("status", {}).get("devices")
                or not old.get("status", {}).get("devices")
            ):
                self.claims[name] = claim
            self.specs |= set(spec_files(self.session.cdi, claim))


def spec_files(cdi_root: Path, claim: Obj) -> list[Path]:
    """The CDI spec files the plugin wrote for this claim (its uid in name or content)."""
    uid = claim["metadata"]["uid"]
    return sorted(p for p in cdi_root.glob("*") if uid in p.name or uid in p.read_text())


def delete(session: Session, run: PodRun, timeout: float = 120.0) -> None:
    """Delete what the example created; the pod's claims go with it (the resourceclaim
    controller), and so must their CDI specs (the kubelet's unprepare)."""
    session.kube.delete(reversed(run.objects), wait=timeout)
    for claim in run.claims:
        meta = claim["metadata"]
        path = f"/apis/resource.k8s.io/v1/namespaces/{meta['namespace']}/resourceclaims"
        session.kube.wait_for(
            lambda p=f"{path}/{meta['name']}": session.node.api.request("GET", p).status == 404,
            timeout,
            f"claim {meta['name']} removed",
        )
    session.kube.wait_for(
        lambda: not any(p.exists() for p in run.specs), timeout, "the claims' CDI specs removed"
    )


__all__ = ["DRIVERS", "PodRun", "Session", "WorkloadError", "delete", "run_pod", "start"]
