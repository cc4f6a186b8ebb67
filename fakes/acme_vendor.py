"""A fourth GPU vendor that exists only in the tests: "Acme", a DRM-style GPU read from a
directory of its own (one subdirectory per card: `model`, `minor`, `busy`).

It implements the vendor interface (dra_plugin.vendors.base) and nothing under
dra_plugin/ knows it. `python -m fakes.acme_vendor ARGS` registers it and runs the
real `dra-plugin` entry point, as a downstream build would.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.devices import Device, DeviceNode, make_device
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.options import Option, Raw
from dra_plugin.telemetry import catalogue as t
from dra_plugin.vendors.base import (
    Discovered,
    DoctorContext,
    Driver,
    DrmScan,
    Monitor,
    MonitorHooks,
    ReadError,
    TelemetryReader,
    Vendor,
)
from dra_plugin.vendors.basicsettings import (
    BasicSettings,
    driver_name_option,
    sharing_options,
)

ACME = "acme"
DRIVER = "gpu.acme.example"
ROOT_ENV = "ACME_ROOT"
MAJOR = 511  # an unassigned character major: the runtime test never opens it


FAULT_FILE = "fault"  # words naming where the vendor raises now: discover, monitor, telemetry
RESCAN_FIFO = "rescan.fifo"  # each line written to it asks the daemon for a rescan
# ("crash" instead makes the monitor's thread raise)


class AcmeBug(Exception):
    """An unexpected exception of the vendor's own code (not one the interface names)."""


def _faults(root: Path) -> set[str]:
    try:
        return set((root / FAULT_FILE).read_text().split())
    except FileNotFoundError:
        return set()


def _raise_if(root: Path, stage: str) -> None:
    if stage in _faults(root):
        raise AcmeBug(f"acme {stage} bug")


@dataclass(frozen=True)
class AcmeSettings(BasicSettings):
    root: Path = Path("/acme")


class AcmeMonitor:
    """Asks for a rescan per line written to the root's FIFO (created by the tests)."""

    def __init__(self, root: Path, hooks: MonitorHooks) -> None:
        self._root, self._hooks = root, hooks
        self._thread: threading.Thread | None = None
        self._fifo = -1

    def start(self) -> None:
        _raise_if(self._root, "monitor")
        path = self._root / RESCAN_FIFO
        if not path.exists():
            return
        self._fifo = os.open(path, os.O_RDWR)  # RDWR: open without waiting for a writer
        self._thread = threading.Thread(target=self._run, name="acme-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with os.fdopen(self._fifo, "rb", buffering=0) as f:
            for line in iter(f.readline, b""):
                if line.strip() == b"stop":
                    return
                if line.strip() == b"crash":  # a bug in the vendor's own thread
                    raise AcmeBug("acme monitor thread bug")
                self._hooks.rescan()

    def stop(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            return  # nobody reads the FIFO: opening it to write would block
        try:
            fd = os.open(self._root / RESCAN_FIFO, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: the reader is gone after all
            return
        try:
            os.write(fd, b"stop\n")
        finally:
            os.close(fd)

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True


class AcmeReader:
    def __init__(self, root: Path) -> None:
        self._root = root

    def read(self, device: Device, now: float) -> list[t.Reading]:
        _raise_if(self._root, "telemetry")
        try:
            busy = float((self._root / device.name / "busy").read_text())
        except (OSError, ValueError) as exc:
            raise ReadError(f"{device.name}: {exc}") from exc
        return [t.Reading(t.UTILIZATION, busy)]

    def forget(self, name: str) -> None:
        pass  # nothing kept per device

    def close(self) -> None:
        pass  # plain file reads


class AcmeVendor(Vendor):
    name = ACME
    title = "Acme"
    pci_vendor_id = "0x1234"
    kernel_drivers = ("acmegpu",)

    def options(self) -> tuple[Option, ...]:
        return (
            driver_name_option(ACME, "Acme", DRIVER),
            Option("--acme-root", ROOT_ENV, "directory describing the Acme cards", "/acme"),
            *sharing_options(ACME, "Acme GPU", "one claim per GPU", "several claims share one"),
        )

    def configure(self, raw: Raw) -> AcmeDriver:
        basic = BasicSettings.parse(ACME, raw)
        settings = AcmeSettings(
            basic.driver_name, basic.sharing_mode, basic.shares, Path(raw["acme_root"])
        )
        return AcmeDriver(self, settings)


class AcmeDriver(Driver):
    def __init__(self, vendor: Vendor, settings: AcmeSettings) -> None:
        self.vendor = vendor
        self.settings: AcmeSettings = settings

    def discover(self, scan: DrmScan, host_root: Path) -> Discovered:
        root = self.settings.root
        _raise_if(root, "discover")
        cards = sorted(p for p in root.glob("acme-*") if p.is_dir())
        devices = tuple(
            make_device(
                name=card.name,
                vendor=ACME,
                driver=self.settings.driver_name,
                attributes={"model": (card / "model").read_text().strip(), "type": "gpu"},
                nodes=[DeviceNode(f"/dev/acme{minor}", MAJOR, minor)],
            )
            for card in cards
            if (minor := int((card / "minor").read_text())) >= 0
        )
        notes = () if devices else (f"acme: no card under {root}",)
        return Discovered(devices, notes)

    def monitors(self, hooks: MonitorHooks) -> list[Monitor]:
        return [AcmeMonitor(self.settings.root, hooks)]

    def telemetry(self) -> TelemetryReader | None:
        return AcmeReader(self.settings.root)

    def doctor(self, ctx: DoctorContext) -> list[Finding]:
        if not ctx.enabled:
            return []
        cards = sorted(p.name for p in self.settings.root.glob("acme-*"))
        return [Finding(Status.PASS, "acme", f"{len(cards)} Acme GPU(s): {', '.join(cards)}")]


def write_cards(root: Path, count: int) -> None:
    for i in range(count):
        card = root / f"acme-{i}"
        card.mkdir(parents=True, exist_ok=True)
        (card / "model").write_text("Acme X1\n")
        (card / "minor").write_text(f"{i}\n")
        (card / "busy").write_text("0.42\n")


def main() -> int:
    from dra_plugin.__main__ import main as plugin_main
    from dra_plugin.vendors import registry

    registry.register(AcmeVendor())
    return plugin_main()


if __name__ == "__main__":
    sys.exit(main())
