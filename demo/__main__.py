"""Sandbox demo: the real daemon on a simulated GPU node, no cluster and no GPU needed.

Run from the repository root after `bash .ci/setup`:  .venv/bin/python -m demo

What is real: the `dra-plugin run` process, libudev (reading a umockdev-simulated node
with a Core Ultra iGPU on i915 and an NVIDIA card), pynvml (loading a stand-in
libnvidia-ml.so.1 that describes two H200-class GPUs), the kubernetes client (talking
HTTP to a local fake API server), and gRPC over unix sockets (driven by a kubelet
emulator). Nothing here touches the host's /dev, /sys or a real cluster.
"""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from tests.fakes.cluster import INTEL, NVIDIA, Cluster, allocated_claim
from tests.fakes.kubelet import Claim
from tests.fakes.simnode import CARDS, unavailable_reason


def say(step: str, text: str = "") -> None:
    print(f"\n== {step}")
    if text:
        print(textwrap.indent(text.rstrip(), "   "))


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

            mem = d.get("capacity", {}).get("memory", {}).get("value", "-")
            model = val("model") if val("model") != "-" else val("productName")
            lines.append(
                f"  - {d['name']}: {model}, memory={mem}, "
                f"pciBusID={val('resource.kubernetes.io/pciBusID')}, "
                f"health={val('health')}"
            )
    return "\n".join(lines)


def main() -> int:
    reason = unavailable_reason()
    if reason:
        print(f"demo needs umockdev: {reason}. Run `bash .ci/setup` first.", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dra-demo-") as tmp:
        cluster = Cluster(
            Path(tmp), profile="igpu+nvidia", nvml_profile="datacenter", node="mini-1"
        )
        try:
            return run(cluster)
        finally:
            cluster.close()


def run(cluster: Cluster) -> int:
    say(
        "simulated node mini-1",
        "udev (umockdev): Intel Core Ultra iGPU 0000:00:02.0 on i915 + an NVIDIA card\n"
        "NVML (stand-in libnvidia-ml.so.1): 2 x NVIDIA H200\n"
        f"API server: {cluster.api.url} (fake, serving resource.k8s.io/v1)",
    )

    daemon = cluster.start_daemon()
    daemon.wait_ready()
    say("dra-plugin run started", f"pid {daemon.proc.pid}; sockets under {cluster.sockets}")

    kubelet = cluster.kubelet((1, 35))
    plugins = {driver: kubelet.wait_for(driver) for driver in (INTEL, NVIDIA)}
    lines = []
    for driver, p in plugins.items():
        lines.append(
            f"{driver}: type={p.info.type} endpoint={p.info.endpoint}\n"
            f"  supported_versions={list(p.info.supported_versions)} "
            f"-> kubelet 1.35 uses {p.version}"
        )
    say("kubelet registration (GetInfo + NotifyRegistrationStatus)", "\n".join(lines))

    igpu = CARDS["igpu"].name
    cluster.wait_for(
        "slices", lambda: igpu in cluster.published(INTEL) and "gpu-0" in cluster.published(NVIDIA)
    )
    say("ResourceSlices published (resource.k8s.io/v1)", slice_summary(cluster.slices()))

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

    resp = plugins[INTEL].prepare([Claim("default", uid, "gpu-smoke-test")])
    result = resp.claims[uid]
    if result.error:
        say("NodePrepareResources FAILED", result.error)
        return 1
    say(
        "NodePrepareResources",
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
    say(f"CDI spec written: {spec_path.name}", json.dumps(spec, indent=2))

    nv = cluster.api.add_claim(
        allocated_claim(
            "cuda-job",
            [{"request": "gpu", "driver": NVIDIA, "pool": cluster.node, "device": "gpu-0"}],
        )
    )
    nv_uid = nv["metadata"]["uid"]
    nv_result = plugins[NVIDIA].prepare([Claim("default", nv_uid, "cuda-job")]).claims[nv_uid]
    if nv_result.error:
        say("NodePrepareResources (NVIDIA) FAILED", nv_result.error)
        return 1
    nv_spec = json.loads((cluster.cdi / f"k8s.{NVIDIA}-claim_{nv_uid}.json").read_text())
    nodes = [n["path"] for d in nv_spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    nodes += [n["path"] for n in nv_spec.get("containerEdits", {}).get("deviceNodes", [])]
    mounts = [m["containerPath"] for m in nv_spec.get("containerEdits", {}).get("mounts", [])]
    strategy = next(
        (ln.split("NVIDIA userspace ", 1)[1] for ln in daemon.logs().splitlines()
         if "NVIDIA userspace strategy=" in ln),
        "not logged",
    )  # fmt: skip
    say(
        "NodePrepareResources (NVIDIA claim default/cuda-job -> gpu-0)",
        f"CDI {' '.join(i for d in nv_result.devices for i in d.cdi_device_ids)}\n"
        f"device nodes {' '.join(nodes)}\n"
        f"driver files mounted read-only: {len(mounts)}\n"
        f"userspace (why, as logged): {strategy}",
    )
    nv_spec_path = cluster.cdi / f"k8s.{NVIDIA}-claim_{nv_uid}.json"
    nv_un = plugins[NVIDIA].unprepare([Claim("default", nv_uid, "cuda-job")])
    if nv_un.claims[nv_uid].error or nv_spec_path.exists():
        say("NodeUnprepareResources (NVIDIA) FAILED", nv_un.claims[nv_uid].error or "spec left")
        return 1
    say("NodeUnprepareResources (NVIDIA)", f"ok; {nv_spec_path.name} removed")

    un = plugins[INTEL].unprepare([Claim("default", uid, "gpu-smoke-test")])
    if un.claims[uid].error:
        say("NodeUnprepareResources FAILED", un.claims[uid].error)
        return 1
    say("NodeUnprepareResources", f"ok; spec file present afterwards: {spec_path.exists()}")

    kubelet.close()
    code = daemon.terminate()
    say(
        "SIGTERM",
        f"daemon exited {code}; registration socket left behind: "
        f"{daemon.registration_socket(INTEL).exists()}; ResourceSlices kept for the next "
        f"instance: {len(cluster.slices())}",
    )
    if spec_path.exists() or code != 0:
        return 1
    # What an operator reads in `kubectl logs`: discovery, registration, prepares, the
    # NVIDIA userspace choice and the shutdown, one line each.
    wanted = ("discovered", "running node=", "NVIDIA userspace", "prepared claim",
              "unprepared", "shutting down", "stopped")  # fmt: skip
    lines = [ln for ln in daemon.logs().splitlines() if any(w in ln for w in wanted)]
    say("daemon log lines that matter", "\n".join(lines))
    print("\ndemo finished: all steps succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
