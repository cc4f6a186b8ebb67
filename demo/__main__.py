"""Sandbox demo: the real daemon on a simulated GPU node, no cluster and no GPU needed.

After `bash .ci/setup`:  .venv/bin/python -m demo  (from the clone's root, or from any
directory with that venv's python: setup puts the clone on the venv's import path).

What is real: the `dra-plugin run` process, libudev (reading a umockdev-simulated node
with a Core Ultra iGPU on i915 and an NVIDIA card), pynvml (loading a stand-in
libnvidia-ml.so.1 that describes two H200-class GPUs), the kubernetes client (talking
HTTP to a local fake API server), and gRPC over unix sockets (driven by a kubelet
emulator). Nothing here touches the host's /dev, /sys or a real cluster.
"""

from __future__ import annotations

import io
import json
import re
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from dra_plugin.apivalues.quantity import parse_quantity
from dra_plugin.vendors.intel import ids as intel_ids
from fakes.cluster import INTEL, NVIDIA, Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.nvml_lib import profile_path
from fakes.simnode import CARDS, unavailable_reason

NVML_PROFILE = "datacenter"

# What each NVIDIA userspace strategy puts into the container (vendors/nvidia/cdi.py).
USERSPACE = {
    "toolkit": "the NVIDIA container toolkit's own CDI device, which brings the driver's libraries",
    "host-libs": "the host's NVIDIA driver files, mounted read-only",
    "device-nodes": "device nodes only, no CUDA userspace",
}


def nvml_gpus(profile: str) -> list[dict[str, str]]:
    """The GPUs the stand-in NVML library reports: one dict per [gpu] section."""
    gpus: list[dict[str, str]] = []
    for line in profile_path(profile).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line == "[gpu]":
            gpus.append({})
        elif "=" in line and gpus:
            key, value = (part.strip() for part in line.split("=", 1))
            gpus[-1][key] = value
    return gpus


def say(step: str, text: str = "") -> None:
    print(f"\n== {step}")
    if text:
        print(textwrap.indent(text.rstrip(), "   "))


def size(amount: int) -> str:
    """A byte count in binary units: 150754820096 -> 140.4 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if amount >= scale:
            return f"{amount / scale:.1f} {unit}"
    return f"{amount} B"


def memory(driver: str, capacity: str | None, pci_id: str) -> str:
    """A device's `memory` capacity in words. Intel publishes 0 where a GPU has no memory
    of its own: an integrated GPU, which shares the system's RAM."""
    if capacity is None:
        return "-"
    amount = int(parse_quantity(capacity))
    if amount:
        return size(amount)
    if driver == INTEL and pci_id != "-" and not intel_ids.lookup(pci_id).discrete:
        return "the system's RAM, shared (an integrated GPU: capacity 0)"
    return "unknown (capacity 0: the kernel driver does not say)"


def slice_summary(slices: list[dict[str, Any]]) -> str:
    lines = []
    for s in sorted(slices, key=lambda s: s["spec"]["driver"]):
        spec = s["spec"]
        pool = spec["pool"]
        lines.append(
            f"{s['metadata']['name']}: driver={spec['driver']} node={spec['nodeName']} "
            f"pool={pool['name']} generation={pool['generation']} "
            f"slices-in-pool={pool['resourceSliceCount']}"
        )
        for d in spec.get("devices", []):
            attrs = d.get("attributes", {})

            def val(key: str, attrs: dict[str, Any] = attrs) -> str:
                v = attrs.get(key, {})
                return str(next(iter(v.values()), "-")) if v else "-"

            mem = memory(spec["driver"], d.get("capacity", {}).get("memory", {}).get("value"),
                         val("pciId"))  # fmt: skip
            model = val("model") if val("model") != "-" else val("productName")
            lines.append(
                f"  - {d['name']}: {model}, memory={mem}, "
                f"pciBusID={val('resource.kubernetes.io/pciBusID')}, "
                f"health={val('health')}"
            )
    return "\n".join(lines)


def main() -> int:
    # One line at a time also into a pipe (`| tee`): each step shows when it happens.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    reason = unavailable_reason()
    if reason:
        print(f"demo needs umockdev: {reason}. Run `bash .ci/setup` first.", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dra-demo-") as tmp:
        cluster = Cluster(
            Path(tmp), profile="igpu+nvidia", nvml_profile=NVML_PROFILE, node="mini-1"
        )
        try:
            return run(cluster)
        finally:
            cluster.close()


def run(cluster: Cluster) -> int:
    h200s = nvml_gpus(NVML_PROFILE)
    minors = [g["minor"] for g in h200s]
    udev_nvidia = CARDS["nvidia"].pci_address
    say(
        "simulated node mini-1",
        "udev (umockdev): Intel Core Ultra iGPU 0000:00:02.0 on i915, and an NVIDIA card\n"
        f"  at {udev_nvidia} on the nvidia driver, which the plugin passes over: NVIDIA GPUs\n"
        "  are served through NVML, so what it publishes for NVIDIA is what NVML reports\n"
        "  (here a stand-in describing other cards; on a real node both see the same GPUs)\n"
        f"NVML (stand-in libnvidia-ml.so.1): {len(h200s)} x NVIDIA H200, minors "
        f"{' and '.join(minors)} (/dev/nvidia{', /dev/nvidia'.join(minors)})\n"
        f"API server: {cluster.api.url} (fake, serving resource.k8s.io/v1)",
    )

    # The kubelet first, as on a node (the plugin is a pod the kubelet runs). A real one
    # deletes every ResourceSlice of the node at its start (the kubelet judge shows it);
    # the demo's kubelet is only its plugin side, so the first publication is generation 1.
    kubelet = cluster.kubelet((1, 35))
    daemon = cluster.start_daemon()
    daemon.wait_ready()
    say(
        "dra-plugin run started",
        f"pid {daemon.proc.pid}; sockets under {cluster.sockets}\n"
        f"CDI specs go to {cluster.cdi} (--cdi-root; on a node /var/cdi/dynamic)",
    )

    plugins = {driver: kubelet.wait_for(driver) for driver in (INTEL, NVIDIA)}
    lines = []
    for driver, p in plugins.items():
        lines.append(
            f"{driver}: type={p.info.type} endpoint={p.info.endpoint}\n"
            f"  supported_versions {', '.join(p.info.supported_versions)} "
            f"-> kubelet 1.35 uses {p.version}"
        )
    say("kubelet registration (GetInfo + NotifyRegistrationStatus)", "\n".join(lines))

    igpu = CARDS["igpu"].name
    cluster.wait_for(
        "slices", lambda: igpu in cluster.published(INTEL) and "gpu-0" in cluster.published(NVIDIA)
    )
    names = " and ".join(f"gpu-{m}" for m in minors)
    say(
        "ResourceSlices published (resource.k8s.io/v1)",
        slice_summary(cluster.slices())
        + "\n\nDevice names: an Intel GPU is named by its PCI address and device id; an NVIDIA"
        "\nGPU by its minor number, the N of /dev/nvidiaN. The two H200s have minors "
        f"{' and '.join(minors)}\n(the second sits in PCI domain 2, "
        f"{h200s[-1]['pci_bus_id'].lower().removeprefix('0000')}), so they are {names}.",
    )

    claim = cluster.api.add_claim(
        allocated_claim(
            "gpu-smoke-test",
            [{"request": "gpu", "driver": INTEL, "pool": cluster.node, "device": igpu}],
        )
    )
    uid = claim["metadata"]["uid"]
    say(
        "scheduler allocated ResourceClaim default/gpu-smoke-test",
        f"uid {uid}: request 'gpu' -> {INTEL} / {cluster.node} / {igpu}",
    )

    intel_step = "NodePrepareResources (Intel claim default/gpu-smoke-test)"
    resp = plugins[INTEL].prepare([Claim("default", uid, "gpu-smoke-test")])
    result = resp.claims[uid]
    if result.error:
        say(f"{intel_step} FAILED", result.error)
        return 1
    say(
        intel_step,
        "\n".join(
            f"device {d.device_name} (pool {d.pool_name}, request "
            f"{', '.join(d.request_names)}): CDI {' '.join(d.cdi_device_ids)}"
            for d in result.devices
        ),
    )
    # KEP-4817: the plugin writes the prepared device into the claim's status, after
    # answering the kubelet (server-side apply, field manager = the driver name).
    status = cluster.wait_for(
        "status.devices",
        lambda: (cluster.api.get_stored_claim("default", "gpu-smoke-test").get("status") or {}).get(
            "devices"
        ),
    )
    say(
        "ResourceClaim status.devices written by the plugin",
        "\n".join(
            f"{s['driver']} / {s['pool']} / {s['device']}: "
            + ", ".join(f"{c['type']}={c['status']}" for c in s.get("conditions", []))
            for s in status
        ),
    )

    spec_path = cluster.cdi / f"k8s.{INTEL}-claim_{uid}.json"
    spec = json.loads(spec_path.read_text())
    say(f"CDI spec written: {spec_path}", json.dumps(spec, indent=2))

    nv = cluster.api.add_claim(
        allocated_claim(
            "cuda-job",
            [{"request": "gpu", "driver": NVIDIA, "pool": cluster.node, "device": "gpu-0"}],
        )
    )
    nv_uid = nv["metadata"]["uid"]
    nv_step = "NodePrepareResources (NVIDIA claim default/cuda-job)"
    nv_result = plugins[NVIDIA].prepare([Claim("default", nv_uid, "cuda-job")]).claims[nv_uid]
    if nv_result.error:
        say(f"{nv_step} FAILED", nv_result.error)
        return 1
    nv_spec_path = cluster.cdi / f"k8s.{NVIDIA}-claim_{nv_uid}.json"
    nv_spec = json.loads(nv_spec_path.read_text())
    mounts = [m["containerPath"] for m in nv_spec.get("containerEdits", {}).get("mounts", [])]
    say(
        nv_step,
        "\n".join(
            f"device {d.device_name} (pool {d.pool_name}, request "
            f"{', '.join(d.request_names)}): CDI {' '.join(d.cdi_device_ids)}"
            for d in nv_result.devices
        )
        + "\n"
        + userspace(daemon.logs(), len(mounts)),
    )
    say(f"CDI spec written: {nv_spec_path}", json.dumps(nv_spec, indent=2))

    for vendor, driver, (claim_uid, name), path in (
        ("NVIDIA", NVIDIA, (nv_uid, "cuda-job"), nv_spec_path),
        ("Intel", INTEL, (uid, "gpu-smoke-test"), spec_path),
    ):
        step = f"NodeUnprepareResources ({vendor} claim default/{name})"
        un = plugins[driver].unprepare([Claim("default", claim_uid, name)]).claims[claim_uid]
        if un.error or path.exists():
            say(f"{step} FAILED", un.error or f"{path.name} is still there")
            return 1
        say(step, f"ok; CDI spec {path.name} removed")

    kubelet.close()
    code = daemon.terminate()
    left = [str(p) for d in (INTEL, NVIDIA) for p in (daemon.registration_socket(d),) if p.exists()]
    say(
        "SIGTERM",
        f"daemon exited {code}; "
        + (f"left behind: {', '.join(left)}" if left else "its registration sockets are gone")
        + f"; ResourceSlices kept for the next instance: {len(cluster.slices())}",
    )
    if code != 0 or left:
        return 1
    # What an operator reads in `kubectl logs`: discovery, registration, prepares, the
    # NVIDIA userspace choice and the shutdown, one line each.
    wanted = ("discovered", "running node=", "NVIDIA userspace", "prepared claim",
              "unprepared", "shutting down", "stopped")  # fmt: skip
    lines = [ln for ln in daemon.logs().splitlines() if any(w in ln for w in wanted)]
    say("daemon log lines that matter", "\n".join(lines))
    print("\ndemo finished: all steps succeeded")
    return 0


def userspace(logs: str, mounted: int) -> str:
    """The NVIDIA userspace strategy the daemon chose (its log line), told as a choice."""
    found = re.search(r"NVIDIA userspace strategy=(\S+) reason=(.*)", logs)
    if found is None:
        return "userspace: the daemon logged no strategy"
    strategy, reason = found.groups()
    why, *notes = reason.split("; ")
    lines = [f"userspace: strategy {strategy}, {USERSPACE.get(strategy, strategy)}"]
    if strategy == "host-libs":
        lines[0] += f" ({mounted} mount{'s' if mounted != 1 else ''})"
    lines.append(f"  chosen because {why}")
    if strategy == "host-libs":
        lines.append(
            "  (the simulated node has no NVIDIA container toolkit; where the toolkit's CDI"
            " spec lists the GPU, the default strategy auto picks toolkit)"
        )
    lines += [f"  note: {n}" for n in notes]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
