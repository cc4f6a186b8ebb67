"""Fake node filesystems (sysfs, /proc, /dev, /etc, kubelet dirs) under a directory.

Doctor reads everything through `Config.host_root`, so a test builds the node it wants here
and points host_root at it. The sysfs layout mirrors the kernel's: real device directories
under sys/devices/pci0000:00/<bridge>/<device> and relative symlinks from sys/bus/pci/devices,
so resolving a device lands on its upstream bridge (the slot) as on a real host.

Device nodes are real character devices made with os.mknod (tests run as root); a read-only
directory is a real read-only bind mount, the way /etc is read-only on Talos.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

from dra_plugin.config import Config

GEN_SPEED = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
}
NVIDIA_UVM_MAJOR = 508


def can_mknod() -> bool:
    return os.geteuid() == 0


class HostRoot:
    """Builder for one fake node rooted at `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []
        self.char_devices: dict[str, int] = {"drm": 226}
        self._mounts: list[Path] = []
        for d in ("sys/bus/pci/devices", "sys/module", "proc", "dev", "etc"):
            (root / d).mkdir(parents=True, exist_ok=True)
        self._write_proc()

    def path(self, p: str | Path) -> Path:
        return self.root / str(p).lstrip("/")

    def write(self, p: str | Path, text: str) -> Path:
        target = self.path(p)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target

    def config(self, **overrides: object) -> Config:
        driver_root = overrides.pop("nvidia_driver_root", None)
        base = Config(command="doctor", node_name="node-1", host_root=self.root)
        cfg = replace(base, **overrides)  # type: ignore[arg-type]
        if driver_root is not None:  # NVIDIA's own setting lives in its settings value
            nvidia = cfg.driver("nvidia")
            nvidia = nvidia.rebound(replace(nvidia.settings, driver_root=Path(str(driver_root))))
            cfg = replace(cfg, vendor_drivers={**cfg.vendor_drivers, "nvidia": nvidia})
        return cfg

    # --- sysfs ------------------------------------------------------------------------
    def pci_gpu(
        self,
        address: str,
        vendor: str,
        device: str,
        *,
        cls: str = "0x030000",
        driver: str | None = None,
        link: tuple[int, int] | None = None,
        max_link: tuple[int, int] | None = None,
        port_max: tuple[int, int] | None = None,
    ) -> Path:
        """Add a PCI function. Links are (generation, width); None: no link attributes."""
        bridge = "0000:00:01.0" if link else None
        parent = self.path("sys/devices/pci0000:00") / (bridge or "")
        dev = parent / address
        dev.mkdir(parents=True)
        for name, value in (("class", cls), ("vendor", f"0x{vendor}"), ("device", f"0x{device}")):
            (dev / name).write_text(value + "\n")
        if link:
            top = max_link or link
            for which, (gen, width) in (("current", link), ("max", top)):
                (dev / f"{which}_link_speed").write_text(GEN_SPEED[gen] + "\n")
                (dev / f"{which}_link_width").write_text(f"{width}\n")
            if port_max:
                (parent / "max_link_speed").write_text(GEN_SPEED[port_max[0]] + "\n")
                (parent / "max_link_width").write_text(f"{port_max[1]}\n")
        if driver:
            drv = self.path(f"sys/bus/pci/drivers/{driver}")
            drv.mkdir(parents=True, exist_ok=True)
            (dev / "driver").symlink_to(os.path.relpath(drv, dev))
        link_path = self.path(f"sys/bus/pci/devices/{address}")
        link_path.symlink_to(os.path.relpath(dev, link_path.parent))
        return dev

    def amd_card_with_switch(
        self,
        address: str,
        device: str,
        *,
        driver: str | None = "amdgpu",
        slot_link: tuple[int, int] = (4, 16),
        slot_max: tuple[int, int] = (4, 16),
    ) -> Path:
        """A Radeon board as sysfs shows it: root port -> the board's switch (upstream
        port, downstream port, both vendor 1002) -> the GPU, whose own link reaches only
        the switch. `slot_link`/`slot_max`: the upstream port's link to the host."""
        up = self.path("sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0")
        down = up / "0000:02:00.0"
        for port, dev_id in ((up, "0x1478"), (down, "0x1479")):
            port.mkdir(parents=True, exist_ok=True)
            for name, value in (("class", "0x060400"), ("vendor", "0x1002"), ("device", dev_id)):
                (port / name).write_text(value + "\n")
        for which, (gen, width) in (("current", slot_link), ("max", slot_max)):
            (up / f"{which}_link_speed").write_text(GEN_SPEED[gen] + "\n")
            (up / f"{which}_link_width").write_text(f"{width}\n")
        gpu = down / address
        gpu.mkdir()
        for name, value in (("class", "0x030000"), ("vendor", "0x1002"), ("device", device)):
            (gpu / name).write_text(value + "\n")
        for which in ("current", "max"):  # the on-board hop always trains at full speed
            (gpu / f"{which}_link_speed").write_text(GEN_SPEED[4] + "\n")
            (gpu / f"{which}_link_width").write_text("16\n")
        if driver:
            drv = self.path(f"sys/bus/pci/drivers/{driver}")
            drv.mkdir(parents=True, exist_ok=True)
            (gpu / "driver").symlink_to(os.path.relpath(drv, gpu))
        link_path = self.path(f"sys/bus/pci/devices/{address}")
        link_path.symlink_to(os.path.relpath(gpu, link_path.parent))
        return gpu

    # --- /proc ------------------------------------------------------------------------
    def load_modules(self, *names: str) -> None:
        self.modules += names
        if "nvidia" in names:
            self.char_devices["nvidia-frontend"] = 195
        if "nvidia_uvm" in names:
            self.char_devices["nvidia-uvm"] = NVIDIA_UVM_MAJOR
        self._write_proc()

    def _write_proc(self) -> None:
        self.write(
            "proc/modules",
            "".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in self.modules),
        )
        chars = "".join(
            f"{major:3d} {name}\n"
            for name, major in sorted(self.char_devices.items(), key=lambda kv: kv[1])
        )
        self.write(
            "proc/devices", f"Character devices:\n  1 mem\n{chars}\nBlock devices:\n  8 sd\n"
        )

    # --- /dev -------------------------------------------------------------------------
    def char_node(self, p: str, major: int, minor: int) -> None:
        target = self.path(p)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(target, stat.S_IFCHR | 0o660, os.makedev(major, minor))

    def dri_nodes(self, index: int = 0, *, major: int = 226) -> None:
        self.char_node(f"dev/dri/card{index}", major, index)
        self.char_node(f"dev/dri/renderD{128 + index}", major, 128 + index)

    def kfd_node(self, major: int = 235) -> None:
        self.char_devices["kfd"] = major
        self._write_proc()
        self.char_node("dev/kfd", major, 0)

    def nvidia_nodes(self, count: int = 1, *, uvm: bool = True) -> None:
        self.char_node("dev/nvidiactl", 195, 255)
        for i in range(count):
            self.char_node(f"dev/nvidia{i}", 195, i)
        if uvm:
            self.char_node("dev/nvidia-uvm", NVIDIA_UVM_MAJOR, 0)
            self.char_node("dev/nvidia-uvm-tools", NVIDIA_UVM_MAJOR, 1)

    # --- /etc and /var ----------------------------------------------------------------
    def talos(self) -> None:
        self.write("etc/os-release", 'NAME="Talos"\nID=talos\nVERSION_ID=v1.12.0\n')

    def containerd(self, text: str, path: str = "etc/containerd/config.toml") -> Path:
        return self.write(path, text)

    def talos_part(self, name: str, text: str) -> Path:
        return self.write(f"etc/cri/conf.d/{name}", text)

    def talos_113(self, merged_dirs: Iterable[str] | None = ("/run/cdi",)) -> None:
        """Talos 1.13+'s CRI layout (siderolabs/talos hack/cri-plugin.part, shipped as
        00-base.part; hack/cri-containerd.toml, /etc/cri/containerd.toml). `merged_dirs`:
        cdi_spec_dirs in the cri.toml Talos renders from every part and in-memory
        CRICustomizationConfig document; None: not rendered (a bare fixture)."""
        self.write("etc/os-release", 'NAME="Talos"\nID=talos\nVERSION_ID=v1.13.0\n')
        self.containerd(
            'version = 3\nimports = ["/etc/cri/conf.d/cri.toml"]\n', path="etc/cri/containerd.toml"
        )
        self.talos_part(
            "00-base.part",
            'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
            '  enable_cdi = true\n  cdi_spec_dirs = ["/run/cdi"]\n',
        )
        if merged_dirs is not None:
            dirs = ", ".join(f'"{d}"' for d in merged_dirs)
            self.write(
                "etc/cri/conf.d/cri.toml",
                'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
                f"  enable_cdi = true\n  cdi_spec_dirs = [{dirs}]\n",
            )

    def dirs(self, *paths: str | Path) -> None:
        for p in paths:
            self.path(p).mkdir(parents=True, exist_ok=True)

    def kubelet_dirs(self, cfg: Config) -> None:
        self.dirs(cfg.registrar_dir, cfg.plugins_dir)

    def read_only(self, p: str) -> None:
        """Make a directory read-only for root too: a read-only bind mount onto itself."""
        target = self.path(p)
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(target), str(target)], check=True)
        self._mounts.append(target)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], check=True)

    def cleanup(self) -> None:
        for target in reversed(self._mounts):
            subprocess.run(["umount", str(target)], check=False)
        self._mounts.clear()

    # --- whole nodes ------------------------------------------------------------------
    def healthy_intel_node(self) -> None:
        """An Intel iGPU on i915 with its DRI nodes, CDI wired up, kubelet dirs present."""
        self.pci_gpu("0000:00:02.0", "8086", "7d55", driver="i915")
        self.load_modules("i915", "video")
        self.dri_nodes(0)
        self.cdi_ready()

    def healthy_nvidia_node(self, count: int = 1) -> None:
        for i in range(count):
            self.pci_gpu(f"0000:0{i + 1}:00.0", "10de", "2c05", driver="nvidia", link=(5, 16))
        self.load_modules("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
        self.nvidia_nodes(count)
        self.cdi_ready()

    def cdi_ready(self, cdi_dirs: Iterable[str] = ("/var/cdi/static", "/var/cdi/dynamic")) -> None:
        dirs = ", ".join(f'"{d}"' for d in cdi_dirs)
        self.containerd(
            f'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  cdi_spec_dirs = [{dirs}]\n'
        )
        self.dirs("/var/cdi/dynamic", "/var/cdi/static")
        self.kubelet_dirs(self.config())


@contextlib.contextmanager
def host_root(root: Path) -> Iterator[HostRoot]:
    host = HostRoot(root)
    try:
        yield host
    finally:
        host.cleanup()
