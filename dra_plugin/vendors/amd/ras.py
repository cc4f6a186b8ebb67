"""AMD RAS error counters: a change asks the daemon for a rescan.

amdgpu sends no uevent when it counts a RAS error, so the counters
(`<pci>/ras/<block>_err_count`, "ue: N" / "ce: N") are read every `interval` seconds.
Discovery (devices.py) turns uncorrectable errors into an Unhealthy device with the
blocks named; this thread only notices that something changed, as the udev monitor does
for hotplug. Only GPUs with a `ras` directory are read (consumer cards have none).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

PCI_DEVICES = "/sys/bus/pci/devices"


_UE = re.compile(r"^ue:\s*\d+", re.MULTILINE | re.ASCII)


def snapshot(pci_addresses: Iterable[str], pci_root: str = PCI_DEVICES) -> dict[str, str]:
    """path -> the uncorrectable-error count line(s) of every RAS counter file of the
    given PCI functions."""
    out: dict[str, str] = {}
    for address in sorted(set(pci_addresses)):
        if "/" in address or address.startswith("."):
            continue  # an address is never a path; refuse to build one from it
        ras = os.path.join(pci_root, address, "ras")
        try:
            names = sorted(n for n in os.listdir(ras) if n.endswith("_err_count"))
        except OSError:
            continue
        for name in names:
            path = os.path.join(ras, name)
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    # Only uncorrectable counts matter to health; a correctable error
                    # ticking up must not cost a full rescan.
                    out[path] = " ".join(_UE.findall(f.read()))
            except OSError:
                out[path] = ""  # unreadable is a state too: it changes when it recovers
    return out


class RasWatcher:
    """Calls `on_change` (in its thread) when any RAS counter of `addresses()` changes."""

    def __init__(
        self,
        addresses: Callable[[], Iterable[str]],
        on_change: Callable[[], object],
        interval: float,
        pci_root: str = PCI_DEVICES,
    ) -> None:
        self._addresses = addresses
        self._on_change = on_change
        self._interval = interval
        self._pci_root = pci_root
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None or self._interval <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="amd-ras", daemon=True)
        self._thread.start()
        log.info("reading AMD RAS error counters interval_seconds=%s", self._interval)

    def stop(self) -> None:
        """Signal the thread to end; never blocks (join() waits)."""
        self._stop.set()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        last = snapshot(self._addresses(), self._pci_root)
        while not self._stop.wait(self._interval):
            try:
                now = snapshot(self._addresses(), self._pci_root)
                if now != last:
                    log.info("AMD RAS error counters changed; rescanning")
                    last = now
                    self._on_change()
            except Exception:  # the daemon's handler must not kill the watcher
                log.exception("RAS watcher failed")
