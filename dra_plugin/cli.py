"""Subcommands: `run` (the daemon), `discover` (what this node has), `doctor` (what is wrong)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from dra_plugin.config import Config, kubeconfig_problem
from dra_plugin.devices import PCI_BUS_ID, Device
from dra_plugin.vendors import registry

if TYPE_CHECKING:
    from dra_plugin.running.inventory import Inventory

# Subcommands import their modules when they run: `doctor` must work on a node where
# the daemon's dependencies (NVML, udev, the API) are exactly what is broken.


def run(cfg: Config) -> int:
    from dra_plugin import daemon

    return asyncio.run(daemon.run(cfg))


def _memory(device: Device) -> str:
    mem = device.caps.get("memory")
    return f"{mem / 2**30:.1f}Gi" if mem else "-"


def _link(device: Device) -> str:
    a = device.attrs
    gen, width = a.get("pcieLinkGen"), a.get("pcieLinkWidth")
    if gen is None or width is None:
        return "-"

    text = f"Gen{gen} x{width}"
    max_gen, max_width = a.get("pcieLinkMaxGen"), a.get("pcieLinkMaxWidth")
    if (max_gen, max_width) != (gen, width) and max_gen is not None:
        text += f" (max Gen{max_gen} x{max_width})"
    return text


def _table(inv: Inventory, out: TextIO) -> None:
    rows = [("VENDOR", "DRIVER", "NAME", "MODEL", "KERNEL", "PCI", "MEMORY", "LINK", "HEALTH")]
    for driver, devs in inv.devices.items():
        for d in devs:
            a = d.attrs
            model = a.get("model", a.get("productName", "-"))
            kernel = a.get("driver", d.vendor)
            rows.append(
                (
                    d.vendor,
                    driver,
                    d.name,
                    str(model),
                    str(kernel),
                    str(a.get(PCI_BUS_ID, d.pci_address or "-")),
                    _memory(d),
                    _link(d),
                    d.health.value + (f" ({d.health_reason})" if d.health_reason else ""),
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
    for card in inv.skipped:
        out.write(f"not published: {card.pci_address}: {card.reason}\n")


def discover(cfg: Config, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    from dra_plugin.running import inventory
    from dra_plugin.slices import build as slices

    inv = inventory.discover(cfg)
    for note in inv.notes:
        err.write(f"note: {note}\n")
    # One exit status for every format (see config.EPILOGS): 1 when nothing was found.
    status = 0 if inv.count else 1
    if status:
        err.write(_nothing_found())
    if cfg.output == "table":
        if inv.count:
            _table(inv, out)
        return status
    objects: list[dict[str, Any]] = []
    vendor_of = {d: v for v, d in cfg.drivers.items()}
    for driver, devs in inv.devices.items():
        # Offline there is no Node UID: the owner reference is added by `run`.
        share = cfg.sharing(vendor_of.get(driver, ""))
        objects.extend(
            slices.desired_slices(
                cfg.node_name, "", driver, devs, taint_effect=cfg.taint_effect, sharing=share
            )
        )
    doc = {"apiVersion": "v1", "kind": "List", "items": objects}
    if cfg.output == "json":
        json.dump(doc, out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        yaml.safe_dump(doc, out, sort_keys=False)
    return status


def run_doctor(cfg: Config, out: TextIO = sys.stdout) -> int:
    from dra_plugin.doctor import report as doctor
    from dra_plugin.kubeapi import ApiError, ClientSettings, KubeAPI, NoCredentials

    # Without a usable client doctor says the API was not checked, and why.
    api: KubeAPI | None = None
    unusable = None
    given = f"{cfg.setting('kubeconfig')}='{cfg.kubeconfig}'"
    if cfg.kubeconfig and (problem := kubeconfig_problem(cfg.kubeconfig)):
        unusable = f"{given} {problem}"
    else:
        try:
            api = KubeAPI.from_settings(ClientSettings(kubeconfig=cfg.kubeconfig))
        except NoCredentials as exc:  # where it looked; the finding says what to do, once
            unusable = exc.looked
        except ApiError as exc:
            unusable = f"{given}: {exc}" if cfg.kubeconfig else str(exc)
    try:
        report = doctor.run_doctor(cfg, api=api, api_unusable=unusable)
    finally:
        if api is not None:
            asyncio.run(api.close())
    out.write(doctor.render_json(report) if cfg.output == "json" else doctor.render_table(report))
    return doctor.exit_code(report)


def _nothing_found() -> str:
    """The likely causes of an empty discovery; the vendors name their drivers and hints."""
    drivers = ", ".join("/".join(v.kernel_drivers) for v in registry.VENDORS if v.kernel_drivers)
    causes = [
        f"the GPU kernel driver ({drivers}) is not loaded",
        "/sys and /run/udev are not visible in this container",
        *(v.no_gpu_hint for v in registry.VENDORS if v.no_gpu_hint),
    ]
    return (
        f"no GPUs found. Likely causes: {', '.join(causes[:-1])}, or {causes[-1]}. "
        "Run `dra-plugin doctor` (from a checkout: `sudo .venv/bin/dra-plugin doctor`).\n"
    )


COMMANDS = {"run": run, "discover": discover, "doctor": run_doctor}
