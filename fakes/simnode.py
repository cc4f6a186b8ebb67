"""A simulated GPU node for udev tests: the real libudev, fed by a umockdev testbed.

`SimNode(profile)` builds a umockdev testbed (sysfs tree + /dev/dri nodes) holding the
cards of the named profiles. Programs see it only when started with `SimNode.env()`:
UMOCKDEV_DIR points the preload library at the testbed and LD_PRELOAD loads
libumockdev-preload, which redirects /sys and /dev accesses and turns the netlink
uevent socket into a unix socket in the testbed. The test process itself is NOT
preloaded (pytest runs plainly), so discovery runs in a child:
`python -m fakes.simnode discover|list-pci|monitor` (see `main`).

uevents are sent from the test process by `send_uevent`, which writes the libudev
wire format to every listener socket the preload created. umockdev's own
`Testbed.uevent()` cannot be used here: it looks the device up with libudev in the
calling process, which would read the host's real /sys.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fakes import amdsim
from fakes.gpusysfs import telemetry_path, write_telemetry
from fakes.simcards import CARDS, PROFILES, GiB, SimCard, expand_profile
from fakes.simnode_child import main
from fakes.simnode_monitor import MonitorChild
from fakes.simsysfs import SysfsWriter, _Present
from fakes.uevents import send_uevent

__all__ = [
    "CARDS",
    "PROFILES",
    "GiB",
    "MonitorChild",
    "SimCard",
    "SimNode",
    "expand_profile",
    "main",
    "send_uevent",
    "unavailable_reason",
]
REPO_ROOT = Path(__file__).resolve().parents[1]


def preload_library() -> str | None:
    """Path of libumockdev-preload.so.0 (UMOCKDEV_PRELOAD overrides), None if absent."""
    override = os.environ.get("UMOCKDEV_PRELOAD")
    if override:
        return override if os.path.exists(override) else None
    patterns = (
        "/usr/lib/*/libumockdev-preload.so.0",
        "/usr/lib64/libumockdev-preload.so.0",
        "/usr/lib/libumockdev-preload.so.0",
        "/usr/local/lib*/libumockdev-preload.so.0",
        "/usr/local/lib/*/libumockdev-preload.so.0",
    )
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def unavailable_reason() -> str | None:
    """Why umockdev tests cannot run here (None when they can)."""
    if preload_library() is None:
        return "libumockdev-preload.so.0 not found (Debian package: umockdev)"
    try:
        _testbed_class()
    except (ImportError, ValueError) as exc:
        return f"UMockdev GI bindings unavailable ({exc}); install gir1.2-umockdev-1.0"
    return None


def _testbed_class() -> Any:
    import gi  # imported lazily: children running `main` never need it

    gi.require_version("UMockdev", "1.0")
    from gi.repository import UMockdev

    return UMockdev.Testbed


class SimNode(SysfsWriter):
    """A umockdev testbed describing one node's GPUs; use as a context manager."""

    def __init__(self, profile: str | Sequence[str] = "mixed") -> None:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self._testbed = _testbed_class().new()
        # The Testbed constructor exports UMOCKDEV_DIR into this process's C environment;
        # children get it only through env(), so undo the leak.
        from gi.repository import GLib

        GLib.unsetenv("UMOCKDEV_DIR")
        self.root: str = self._testbed.get_root_dir()
        self._present: dict[str, _Present] = {}
        self._bridges: set[str] = set()
        for card in expand_profile(profile):
            self.add_card(card, emit=False)

    # --- lifecycle ---
    def close(self) -> None:
        if getattr(self, "_testbed", None) is not None:
            self._testbed = None  # the Testbed finalizer deletes its directory
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SimNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess that must see this node instead of the host."""
        env = dict(os.environ if base is None else base)
        preload = preload_library()
        assert preload is not None
        env["UMOCKDEV_DIR"] = self.root
        env["LD_PRELOAD"] = ":".join(p for p in (preload, env.get("LD_PRELOAD")) if p)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        return env

    # --- what is there ---
    @property
    def cards(self) -> tuple[SimCard, ...]:
        return tuple(p.card for p in self._present.values())

    def card(self, pci_address: str) -> SimCard:
        return self._present[pci_address].card

    # --- runtime changes (what a test does to the node) ---
    def add_card(self, card: SimCard | str, *, emit: bool = True) -> SimCard:
        """Plug a card in (as hotplug or SR-IOV enablement would), sending uevents."""
        card = CARDS[card] if isinstance(card, str) else card
        if card.pci_address in self._present:
            raise ValueError(f"{card.pci_address} is already present")
        self._add_bridges(card)
        self._testbed.add_from_string(self._pci_record(card))
        self._set_driver(card)
        base = self._path(card.syspath)
        for i, tile_bytes in enumerate(card.xe_vram_tiles):
            os.makedirs(f"{base}/tile{i}", exist_ok=True)
            Path(f"{base}/tile{i}/physical_vram_size_bytes").write_text(f"{tile_bytes}\n")
        for i, vf in enumerate(card.vfs):
            os.symlink(f"../{vf}", f"{base}/virtfn{i}")
        if card.physfn:
            os.symlink(f"../{card.physfn}", f"{base}/physfn")
        if card.bars:
            Path(f"{base}/resource").write_text(
                "".join(f"0x{a:016x} 0x{b:016x} 0x{f:016x}\n" for a, b, f in card.bars)
            )
        present = _Present(card, self._add_drm(card))
        self._present[card.pci_address] = present
        if card.amd:
            for rel, text in amdsim.ras_files(card.amd).items():
                os.makedirs(os.path.dirname(f"{base}/{rel}"), exist_ok=True)
                Path(f"{base}/{rel}").write_text(text)
            self._add_amd_partitions(present)
        write_telemetry(card.key, Path(base), self._drm_card_dir(present))
        if emit:
            self._pci_event(card, "add")
            for syspath in present.drm:
                self._drm_event(syspath, "add")
            if card.driver:
                self._pci_event(card, "bind")
        return card

    def remove_card(self, pci_address: str, *, emit: bool = True) -> None:
        """Unplug a card: its DRM minors go first, then the PCI function."""
        present = self._present.pop(pci_address)
        drm = list(present.drm)
        self._remove_drm(present)
        self._testbed.remove_device(present.card.syspath)
        self._sync_kfd()
        if emit:
            for syspath in reversed(drm):
                self._drm_event(syspath, "remove")
            if present.card.driver:
                self._pci_event(present.card, "unbind")
            self._pci_event(present.card, "remove")

    def unbind(self, pci_address: str, *, emit: bool = True) -> None:
        """Detach the kernel driver (echo > unbind): DRM minors vanish, the PCI device stays."""
        present = self._present[pci_address]
        drm = list(present.drm)
        self._remove_drm(present)
        present.card = replace(present.card, driver=None)
        self._set_driver(present.card)
        self._sync_kfd()
        if emit:
            for syspath in reversed(drm):
                self._drm_event(syspath, "remove")
            self._pci_event(present.card, "unbind")

    def bind(self, pci_address: str, driver: str, *, emit: bool = True) -> None:
        """Attach `driver` (i915, xe, vfio-pci, ...); GPU drivers create DRM minors."""
        present = self._present[pci_address]
        if present.card.driver is not None:
            self.unbind(pci_address, emit=emit)
        present.card = replace(present.card, driver=driver)
        self._set_driver(present.card)
        present.drm = self._add_drm(present.card)
        self._add_amd_partitions(present)
        if emit:
            for syspath in present.drm:
                self._drm_event(syspath, "add")
            self._pci_event(present.card, "bind")

    def set_pci_attribute(
        self, pci_address: str, name: str, value: str, *, emit: bool = True
    ) -> None:
        """Change a sysfs attribute (e.g. current_link_speed) and send a 'change' uevent."""
        card = self._present[pci_address].card
        Path(self._path(card.syspath), name).write_text(f"{value}\n")
        if emit:
            self._pci_event(card, "change")

    def switch_compute_partition(self, pci_address: str, mode: str, *, emit: bool = True) -> None:
        """Switch an AMD card's compute partition mode as amdgpu does (simsysfs.py), with
        the uevents: removed DRM minors, added ones, and a change of the PCI function."""
        removed, added = self._switch_partition(pci_address, mode)
        if emit:
            for syspath in reversed(removed):
                self._drm_event(syspath, "remove")
            for syspath in added:
                self._drm_event(syspath, "add")
            self._pci_event(self._present[pci_address].card, "change")

    def _drm_card_dir(self, present: _Present) -> Path | None:
        cards = [p for p in present.drm if p.rsplit("/", 1)[1].startswith("card")]
        return Path(self._path(cards[0])) if cards else None

    def set_telemetry(self, pci_address: str, key: str, value: str) -> None:
        """Rewrite a telemetry file (gpusysfs.TELEMETRY key), e.g. advance an energy counter."""
        present = self._present[pci_address]
        path = telemetry_path(
            Path(self._path(present.card.syspath)), self._drm_card_dir(present), key
        )
        assert path is not None, f"{pci_address} has no DRM card for {key}"
        path.write_text(f"{value}\n")

    def uevent(self, syspath: str, action: str, props: Mapping[str, str] | None = None) -> int:
        """Send a raw uevent; SUBSYSTEM is taken from `props` or guessed from the path."""
        fields = dict(props or {})
        fields.setdefault("SUBSYSTEM", "drm" if "/drm/" in syspath else "pci")
        return send_uevent(self.root, syspath.removeprefix("/sys"), action, fields)

    def listeners(self) -> int:
        """How many processes' uevent sockets are bound in this testbed."""
        return len(glob.glob(os.path.join(self.root, "event[0-9]*")))

    def _pci_event(self, card: SimCard, action: str) -> None:
        props = {
            "SUBSYSTEM": "pci",
            "PCI_CLASS": f"{int(card.class_id, 16):X}",
            "PCI_ID": card.pci_id,
            "PCI_SLOT_NAME": card.pci_address,
        }
        if card.driver and action != "unbind":
            props["DRIVER"] = card.driver
        send_uevent(self.root, card.devpath, action, props)

    def _drm_event(self, syspath: str, action: str) -> None:
        name = syspath.rsplit("/", 1)[1]
        minor = int(name.removeprefix("card").removeprefix("renderD"))
        send_uevent(self.root, syspath.removeprefix("/sys"), action, {
            "SUBSYSTEM": "drm", "DEVNAME": f"dri/{name}", "DEVTYPE": "drm_minor",
            "MAJOR": "226", "MINOR": str(minor),
        })  # fmt: skip

    # --- running code against the node ---
    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """`python -m fakes.simnode ARGS` under the preload, seeing this node."""
        return subprocess.run(
            [sys.executable, "-m", "fakes.simnode", *args],
            env=self.env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def discover(
        self,
        driver_name: str = "gpu.intel.com",
        amd_driver_name: str | None = None,
        host_root: str | None = None,
    ) -> dict[str, Any]:
        """discover_drm() as the child saw it, as JSON (see `discovery_json`)."""
        extra = [amd_driver_name or ""] + ([host_root] if host_root else [])
        r = self.run("discover", driver_name, *(extra if amd_driver_name or host_root else []))
        if r.returncode != 0:
            raise RuntimeError(f"discover child failed ({r.returncode}): {r.stderr}")
        result: dict[str, Any] = json.loads(r.stdout)
        return result

    def start_monitor(
        self,
        debounce_seconds: float = 0.2,
        udev_control: str | None = None,
        *,
        events: bool = False,
    ) -> MonitorChild:
        """A child running DrmMonitor; it prints one JSON line per on_change call, or with
        `events` one per DRM card event its subscribers get (and nothing on_change).

        `udev_control`: the file whose presence says udevd runs (default: the real one).
        """
        return MonitorChild(
            self.env(), self.listeners, debounce_seconds, udev_control, events=events
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
