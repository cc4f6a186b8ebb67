"""How a simulated node (simnode.py) writes a card into its umockdev testbed: the PCI
record and its bridges, the bound driver (or vfio-pci), the DRM minors and by-path links,
AMD partitions and the KFD topology. A mixin of SimNode, which holds the testbed."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fakes import amdsim
from fakes.simcards import SimCard


@dataclass
class _Present:
    card: SimCard
    drm: list[str] = field(default_factory=list)  # syspaths of the DRM minors
    platform: list[str] = field(default_factory=list)  # amdgpu_xcp devices (AMD partitions)


class SysfsWriter:
    """SimNode's sysfs building (a mixin: SimNode's __init__ sets these attributes)."""

    root: str
    _testbed: Any
    _present: dict[str, _Present]
    _bridges: set[str]

    def _path(self, syspath: str) -> str:
        return self.root + syspath

    def _add_bridges(self, card: SimCard) -> None:
        parent = f"/devices/{card.root}"
        for bridge in card.bridges:
            parent = f"{parent}/{bridge}"
            if parent in self._bridges:
                continue
            self._bridges.add(parent)
            self._testbed.add_from_string(
                f"P: {parent}\nE: SUBSYSTEM=pci\nE: PCI_CLASS=60400\n"
                f"E: PCI_SLOT_NAME={bridge}\nA: class=0x060400\nA: vendor=0x8086\n"
                "A: device=0x7d01\n\n"
            )

    def _pci_record(self, card: SimCard) -> str:
        lines = [
            f"P: {card.devpath}",
            "E: SUBSYSTEM=pci",
            f"E: PCI_CLASS={int(card.class_id, 16):X}",
            f"E: PCI_ID={card.pci_id}",
            f"E: PCI_SLOT_NAME={card.pci_address}",
            f"A: vendor={card.vendor_id}",
            f"A: device={card.device_id}",
            f"A: class={card.class_id}",
            f"A: numa_node={card.numa_node}",
        ]
        if card.link:
            speed, width, max_speed, max_width = card.link
            lines += [
                f"A: current_link_speed={speed}",
                f"A: current_link_width={width}",
                f"A: max_link_speed={max_speed}",
                f"A: max_link_width={max_width}",
            ]
        if card.sriov_totalvfs is not None:
            lines += [
                f"A: sriov_totalvfs={card.sriov_totalvfs}",
                f"A: sriov_numvfs={len(card.vfs)}",
                "A: sriov_drivers_autoprobe=1",
            ]
        if card.driver:
            lines.append(f"E: DRIVER={card.driver}")
        if card.amd:
            lines += amdsim.pci_lines(card.amd)
        return "\n".join(lines) + "\n\n"

    def _set_driver(self, card: SimCard) -> None:
        link = self._path(card.syspath) + "/driver"
        if os.path.islink(link):
            os.unlink(link)
        uevent = self._path(card.syspath) + "/uevent"
        props = [
            line for line in Path(uevent).read_text().splitlines() if not line.startswith("DRIVER=")
        ]
        if card.driver:
            drivers = f"/sys/bus/pci/drivers/{card.driver}"
            os.makedirs(self._path(drivers), exist_ok=True)
            os.symlink(os.path.relpath(drivers, card.syspath), link)  # as the kernel: relative
            props.append(f"DRIVER={card.driver}")
        Path(uevent).write_text("\n".join(props) + "\n")
        self._set_vfio(card)

    def _set_vfio(self, card: SimCard) -> None:
        """What vfio-pci shows of a bound function: its group's node (and the iommufd cdev
        under vfio-dev/, with /dev/iommu); the iommu_group link exists whatever the driver."""
        base = self._path(card.syspath)
        if card.iommu_group is not None and not os.path.islink(f"{base}/iommu_group"):
            groups = self._path("/sys/kernel/iommu_groups")
            os.makedirs(f"{groups}/{card.iommu_group}", exist_ok=True)
            os.symlink(os.path.relpath(f"{groups}/{card.iommu_group}", base), f"{base}/iommu_group")
        shutil.rmtree(f"{base}/vfio-dev", ignore_errors=True)
        if card.driver is None or "vfio" not in card.driver or card.iommu_group is None:
            return
        os.makedirs(self._path("/dev/vfio/devices"), exist_ok=True)
        for node in ("/dev/vfio/vfio", f"/dev/vfio/{card.iommu_group}"):
            Path(self._path(node)).touch()
        if card.vfio_cdev is not None:
            os.makedirs(f"{base}/vfio-dev/{card.vfio_cdev}")
            Path(self._path(f"/dev/vfio/devices/{card.vfio_cdev}")).touch()
            Path(self._path("/dev/iommu")).touch()

    def _add_drm(self, card: SimCard, parent: str | None = None) -> list[str]:
        """The DRM minors a bound GPU driver creates (none without a driver or index)."""
        if card.card is None or card.driver is None or card.driver.startswith("vfio"):
            return []
        added = []
        for name, minor in (
            (f"card{card.card}", card.card),
            (f"renderD{128 + card.card}", 128 + card.card),
        ):
            devpath = f"{parent or card.devpath}/drm/{name}"
            record = [
                f"P: {devpath}",
                "E: SUBSYSTEM=drm",
                f"E: DEVNAME=/dev/dri/{name}",
                "E: DEVTYPE=drm_minor",
                "E: MAJOR=226",
                f"E: MINOR={minor}",
                f"A: dev=226:{minor}",
            ]
            if card.i915_lmem is not None and name.startswith("card"):
                record.append(f"A: lmem_total_bytes={card.i915_lmem}")
            self._testbed.add_from_string("\n".join(record) + "\n\n")
            # The node itself: a plain file; the preload reports it as char 226:minor
            # (from the dev attribute). A "N:" record line would back it with a pty that
            # umockdev never forgets, so a re-bind after unbind would abort.
            os.makedirs(self._path("/dev/dri"), exist_ok=True)
            Path(self._path(f"/dev/dri/{name}")).touch()
            added.append("/sys" + devpath)
            if card.by_path:
                kind = "card" if name.startswith("card") else "render"
                link_dir = self._path("/dev/dri/by-path")
                os.makedirs(link_dir, exist_ok=True)
                os.symlink(f"../{name}", f"{link_dir}/pci-{card.pci_address}-{kind}")
        return added

    def _add_amd_partitions(self, present: _Present) -> None:
        """amdgpu's partition devices and the KFD topology (a bound AMD card only)."""
        card, board = present.card, present.card.amd
        if board is not None and card.driver == "amdgpu" and card.card is not None:
            for i, devpath in enumerate(amdsim.xcp_devpaths(board), start=1):
                self._testbed.add_from_string(f"P: {devpath}\nE: SUBSYSTEM=platform\n\n")
                present.platform.append("/sys" + devpath)
                present.drm += self._add_drm(
                    replace(card, card=card.card + i, by_path=False), parent=devpath
                )
        self._sync_kfd()

    def _switch_partition(self, pci_address: str, mode: str) -> tuple[list[str], list[str]]:
        """What amdgpu does when `mode` is written to current_compute_partition: the
        partitions of the old mode go (their KFD nodes, and their amdgpu_xcp devices where
        the board makes only the mode's), those of the new one come, each with its share
        of the GPU's SIMDs. Returns the DRM minors removed and added (for uevents)."""
        present = self._present[pci_address]
        card, board = present.card, present.card.amd
        assert board is not None and board.partitions is not None, f"{pci_address}: no modes"
        n = amdsim.mode_partitions(card.device_id, mode)
        total = board.simd_count * amdsim.partition_count(board)
        _, avail, mem, mem_avail, _ = board.partitions
        props = dict(board.kfd_props)
        if "simd_count" in props:
            props["simd_count"] = total // n
        new = replace(
            board, partitions=(mode.upper(), avail, mem, mem_avail, n), simd_count=total // n,
            kfd_parts=None, banks=None if board.banks is None else (),
            kfd_props=tuple(props.items()),
        )  # fmt: skip
        removed: list[str] = []
        if board.xcp_devices is None:  # only the mode's amdgpu_xcp devices: they change
            removed = [p for p in present.drm if p.startswith("/sys/devices/platform/")]
            for syspath in [*removed, *present.platform]:
                self._testbed.remove_device(syspath)
            present.drm = [p for p in present.drm if p not in removed]
            present.platform = []
        present.card = replace(card, amd=new)
        Path(self._path(card.syspath), "current_compute_partition").write_text(f"{mode.upper()}\n")
        before = set(present.drm)
        if board.xcp_devices is None:
            self._add_amd_partitions(present)
        else:
            self._sync_kfd()
        return removed, [p for p in present.drm if p not in before]

    def _sync_kfd(self) -> None:
        bound = [
            p.card
            for p in self._present.values()
            if p.card.amd and p.card.driver == "amdgpu" and p.card.card is not None
        ]
        gpus = [
            amdsim.KfdGpu(c.pci_address, c.device_id, 128 + (c.card or 0), c.amd)
            for c in bound
            if c.amd
        ]
        kfd = self._path("/sys" + amdsim.KFD_DEVPATH)
        if not gpus:
            return
        if not os.path.isdir(kfd):
            self._testbed.add_from_string(amdsim.kfd_record())
            os.makedirs(self._path("/dev"), exist_ok=True)
            Path(self._path("/dev/kfd")).touch()
        shutil.rmtree(f"{kfd}/topology", ignore_errors=True)
        cpus = next((c.cpu_nodes for c in bound if c.cpu_nodes), None)
        for rel, text in amdsim.topology_files(gpus, *([cpus] if cpus else [])).items():
            os.makedirs(os.path.dirname(f"{kfd}/{rel}"), exist_ok=True)
            Path(f"{kfd}/{rel}").write_text(text)
        module = next((c.amd.module for c in bound if c.amd and c.amd.module), None)
        if module is not None:  # the ROCm amdgpu module's version files
            base = self._path("/sys/module/amdgpu")
            os.makedirs(base, exist_ok=True)
            Path(base, "version").write_text(f"{module[0]}\n")
            Path(base, "srcversion").write_text(f"{module[1]}\n")
            link = self._path("/sys/bus/pci/drivers/amdgpu/module")
            if not os.path.islink(link):
                os.symlink("../../../../module/amdgpu", link)

    def _remove_drm(self, present: _Present) -> None:
        for syspath in present.drm:
            self._testbed.remove_device(syspath)  # also drops /dev/dri/<name>
        present.drm = []
        for syspath in present.platform:
            self._testbed.remove_device(syspath)
        present.platform = []
        for kind in ("card", "render"):
            link = self._path(f"/dev/dri/by-path/pci-{present.card.pci_address}-{kind}")
            if os.path.islink(link):
                os.unlink(link)
