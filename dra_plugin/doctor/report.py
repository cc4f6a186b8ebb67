"""`dra-plugin doctor`: explain, on one node, why GPUs do not reach pods.

The checks read the host through `cfg.host_root` (host/hostview.py): the node's GPUs and
links (nodecheck.py), each vendor's modules, device nodes and libraries (vendors/*/doctor.py),
the CDI dir and containerd's CDI config (containerd.py); here the kubelet dirs, the API and
RBAC, and the report.

Every finding is one line, `STATUS check: what was found — what to do`, optionally followed
by an indented snippet to paste (a Talos machine-config patch, a containerd drop-in).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Coroutine
from dataclasses import asdict
from typing import Any, Protocol, TypeVar

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import CheckpointError, State
from dra_plugin.config import Config
from dra_plugin.doctor.containerd import check_cdi_dir, check_containerd
from dra_plugin.doctor.nodecheck import check_links, check_modules, check_pci
from dra_plugin.findings.findings import Finding, Report, Status
from dra_plugin.host.hostview import GpuVendor, Host
from dra_plugin.vendors import registry
from dra_plugin.vendors.base import DoctorContext
from dra_plugin.vendors.claimcontext import VendorEntry

_T = TypeVar("_T")


class DoctorAPI(Protocol):
    """What doctor needs from the API client (dra_plugin.kubeapi.KubeAPI fits)."""

    async def served_resource_versions(self) -> list[str]: ...

    async def can_i(self, verb: str, resource: str, group: str) -> bool: ...


def _check_kubelet_dirs(cfg: Config, host: Host) -> list[Finding]:
    out = []
    for label, d, attr in (
        ("registrar", cfg.registrar_dir, "kubelet_registrar_directory_path"),
        ("plugins", cfg.plugins_dir, "kubelet_plugins_directory_path"),
    ):
        if host.path(d).is_dir():
            out.append(Finding(Status.PASS, "kubelet-dirs", f"{label} dir {d} present"))
        elif host.path(d).exists():
            out.append(
                Finding(
                    Status.FAIL,
                    "kubelet-dirs",
                    f"{label} dir {d} is a file, not a directory",
                    f"remove the file, or set {cfg.setting(attr)} to the kubelet's directory",
                )
            )
        else:
            out.append(
                Finding(
                    Status.FAIL,
                    "kubelet-dirs",
                    f"{label} dir {d} is missing",
                    f"mount it from the host; if the kubelet uses another --root-dir, "
                    f"set {cfg.setting(attr)} to match",
                )
            )
    return out


# Everything the running plugin does with the API (the chart's ClusterRole grants these).
RBAC_NEEDS = (
    ("get", "nodes", ""),
    *(
        (v, "resourceslices", "resource.k8s.io")
        for v in ("list", "watch", "create", "update", "delete")
    ),
    ("get", "resourceclaims", "resource.k8s.io"),
    ("patch", "resourceclaims/status", "resource.k8s.io"),  # device status after prepare
)


async def _check_api(api: DoctorAPI) -> list[Finding]:
    from dra_plugin.kubeapi import ForbiddenError, NotFoundError  # lazy: imports kubernetes

    try:
        versions = await api.served_resource_versions()
    except NotFoundError:
        versions = []  # the group itself is not served: answered below
    except ForbiddenError as e:
        return [
            Finding(
                Status.FAIL,
                "api",
                f"API server refused our credentials: {e}",
                "check the kubeconfig user / the pod's service account token",
            )
        ]
    except Exception as e:  # noqa: BLE001 - any other failure means "unreachable", reported
        return [
            Finding(
                Status.FAIL,
                "api",
                f"API server not reachable: {e}",
                "check the kubeconfig / service account and network path to the API server",
            )
        ]
    if "v1" in versions:
        out = [Finding(Status.PASS, "api", "resource.k8s.io/v1 served")]
    elif versions:
        out = [
            Finding(
                Status.WARN,
                "api",
                f"resource.k8s.io served only as {', '.join(versions)}, not v1",
                "the plugin falls back to the older version; upgrade to Kubernetes 1.34+ for v1",
            )
        ]
    else:
        return [
            Finding(
                Status.FAIL,
                "api",
                "resource.k8s.io is not served",
                "DRA needs Kubernetes 1.32+ (v1 from 1.34) with the resource.k8s.io API enabled",
            )
        ]
    denied = []
    for verb, resource, group in RBAC_NEEDS:
        try:
            allowed = await api.can_i(verb, resource, group)
        except Exception as e:  # noqa: BLE001 - reported as a finding
            out.append(
                Finding(
                    Status.FAIL,
                    "rbac",
                    f"access review failed: {e}",
                    "the identity needs create on selfsubjectaccessreviews",
                )
            )
            return out
        if not allowed:
            denied.append(f"{verb} {resource}")
    if denied:
        out.append(
            Finding(
                Status.FAIL,
                "rbac",
                f"not allowed: {', '.join(denied)}",
                "bind the chart's ClusterRole to the plugin's ServiceAccount (ClusterRoleBinding)",
            )
        )
    else:
        out.append(
            Finding(
                Status.PASS,
                "rbac",
                "nodes get; resourceslices list/watch/create/update/delete; resourceclaims get",
            )
        )
    return out


def _run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """asyncio.run, also when the caller already runs an event loop (then in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


# --- entry points -----------------------------------------------------------------------


def _api_not_checked(cfg: Config, why: str | None) -> Finding:
    if cfg.kubeconfig:  # given, so it must work
        return Finding(
            Status.FAIL,
            "api",
            f"API not checked: {why or 'the kubeconfig cannot be used'}",
            f"fix the file or point {cfg.setting('kubeconfig')} at a working kubeconfig",
        )
    return Finding(
        Status.WARN,
        "api",
        f"API not checked: {why or 'no kubeconfig and no in-cluster credentials'}",
        "run doctor in the plugin's pod (its service account), or point --kubeconfig or "
        "KUBECONFIG at a kubeconfig",
    )


def run_doctor(
    cfg: Config, *, api: DoctorAPI | None = None, api_unusable: str | None = None
) -> Report:
    """Run every check against the host under cfg.host_root (and the API, when given;
    `api_unusable` says why there is none)."""
    host = Host(cfg.host_root)
    talos = host.is_talos()
    loaded = host.modules()
    gpus = host.gpus(
        {
            v.pci_vendor_id.removeprefix("0x"): GpuVendor(v.title, v.pci_classes)
            for v in registry.VENDORS
        }
    )
    bus = gpus or []
    vendor_findings: list[Finding] = []
    for vendor in registry.VENDORS:
        name = cfg.driver(vendor.name).driver_name
        state = _record(cfg, name)
        ctx = DoctorContext(
            host, bus, loaded, talos, enabled=vendor.name in cfg.vendors,
            plugin_dir=cfg.plugin_dir(name), held=_held(state), entries=_entries(state),
        )  # fmt: skip
        vendor_findings += cfg.driver(vendor.name).doctor(ctx)
    pci = check_pci(cfg, host, gpus, loaded)
    if any(f.check == "pci" and f.status is Status.FAIL for f in vendor_findings):
        # A vendor explained the empty bus (a card its module cannot see): no generic WARN.
        pci = [
            f for f in pci if f.status is not Status.WARN or "nothing for the plugin" not in f.found
        ]
    seen = {f.check for f in vendor_findings}
    fallbacks = []
    if loaded is not None and "kernel-modules" not in seen:
        fallbacks.append(Finding(Status.PASS, "kernel-modules", "no GPU on the bus needs a module"))
    if "device-nodes" not in seen:
        fallbacks.append(
            Finding(Status.PASS, "device-nodes", "no GPU bound to a driver; nothing to check")
        )
    findings = [
        *pci,
        *(f for f in vendor_findings if f.check == "pci"),
        *check_links(bus),
        # One kernel-modules line per fact: the vendors' own, the node-wide note folded in.
        *check_modules(
            host, loaded, [*(f for f in vendor_findings if f.check != "pci"), *fallbacks]
        ),
        check_cdi_dir(cfg, host),
        *check_containerd(cfg, host, talos),
        *_check_kubelet_dirs(cfg, host),
    ]
    if api is None:
        findings.append(_api_not_checked(cfg, api_unusable))
    else:
        findings += _run_sync(_check_api(api))
    return Report(node=cfg.node_name, findings=tuple(findings))


def render_table(report: Report) -> str:
    lines = []
    for f in report.findings:
        line = f"{f.status.name} {f.check}: {f.found}"
        lines.append(f"{line} — {f.action}" if f.action else line)
        lines += [f"    {d}" for d in f.detail.rstrip("\n").splitlines()]
    counts = {s: sum(f.status is s for f in report.findings) for s in Status}
    lines.append(
        f"node {report.node or '?'}: {counts[Status.PASS]} pass, "
        f"{counts[Status.WARN]} warn, {counts[Status.FAIL]} fail"
    )
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    checks = [{**asdict(f), "status": f.status.name} for f in report.findings]
    return (
        json.dumps({"node": report.node, "status": report.worst.name, "checks": checks}, indent=2)
        + "\n"
    )


def exit_code(report: Report) -> int:
    """0: all PASS; 1: some WARN; 2: some FAIL."""
    return int(report.worst)


def _record(cfg: Config, driver: str) -> State | Exception | None:
    """A driver's checkpoint, read only (None: none yet; an exception: cannot tell)."""
    try:
        return Checkpoint(cfg.plugin_dir(driver), driver).read()
    except (OSError, CheckpointError) as exc:
        return exc


def _held(state: State | Exception | None) -> frozenset[str] | None:
    """The claims a driver's checkpoint holds (None: cannot tell)."""
    if isinstance(state, Exception):
        return None
    return frozenset(state.claims) if state is not None else frozenset()


def _entries(state: State | Exception | None) -> dict[str, list[VendorEntry | None]] | None:
    """The vendor entries of each claim a driver's checkpoint holds (None: cannot tell)."""
    if isinstance(state, Exception):
        return None
    if state is None:
        return {}
    return {uid: [d.vendor for d in rec.devices] for uid, rec in state.claims.items()}
