"""`dra-plugin run` as a host process on the node, on a simulated GPU node: what the
chart's DaemonSet runs, without the container around it.

The GPUs are simulated: Intel and AMD cards through umockdev (the real libudev reads a
testbed's sysfs and /dev), NVIDIA through the stand-in NVML library under a fake driver
root (fakes/node/nvidia.py). The plugin talks to the node's real kubelet through the
kubelet's own plugin directories and writes its CDI specs into the directory the node's
containerd reads.

NVIDIA's CDI spec names the control nodes (/dev/nvidiactl, /dev/nvidia-uvm,
/dev/nvidia-uvm-tools) without major/minor, as their majors are dynamic: containerd stats
them on the host. Where the host has none, `make_nvidia_nodes` creates stand-ins with
mknod and records them, so teardown removes them again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from fakes.kubelet import get_info
from fakes.node import cleanup, nvidia
from fakes.node.config import Layout
from fakes.nvml_lib import build_fake_nvml
from fakes.simnode import SimNode

REPO = Path(__file__).resolve().parents[2]
INTEL, NVIDIA, AMD = "gpu.intel.com", "gpu.nvidia.com", "gpu.amd.com"
# Stand-ins for the NVIDIA control nodes where the host has no driver (majors as a real
# node commonly has them; nvidia-uvm's is dynamic, hence the runtime's stat).
NVIDIA_CONTROL_NODES = {
    "/dev/nvidiactl": (195, 255),
    "/dev/nvidia-uvm": (236, 0),
    "/dev/nvidia-uvm-tools": (236, 1),
}


def make_nvidia_nodes(layout: Layout) -> list[str]:
    """mknod the control nodes the host lacks; each one made is recorded for teardown."""
    made = []
    for path, (major, minor) in NVIDIA_CONTROL_NODES.items():
        if not os.path.exists(path):
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
            made.append(path)
            undo = cleanup.read_undo(layout)
            cleanup.write_undo(layout, device_nodes=[*undo.get("device_nodes", []), path])
    return made


class HostPlugin:
    """The plugin process and the simulated node it runs on."""

    def __init__(
        self,
        layout: Layout,
        kubeconfig: Path,
        node_name: str,
        *,
        profile: str = "igpu+amd",
        nvml_profile: str = "datacenter",
    ) -> None:
        self.layout = layout
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.sim = SimNode(profile)
        self.nvml_events = layout.work / "nvml-events"
        self.nvml_events.touch()
        fake = build_fake_nvml()
        self._nvml_env = fake.env(nvml_profile, events=self.nvml_events)
        # The driver root with a static nvidia-smi stand-in for the NVIDIA smoke test.
        root = nvidia.driver_root(layout.work, fake, nvml_profile)
        self._nvml_env["NVIDIA_DRIVER_ROOT"] = str(root)
        library = root / fake.library.relative_to(fake.driver_root)
        self._nvml_env["LD_LIBRARY_PATH"] = str(library.parent)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = layout.logs / "plugin.log"
        self.starts = 0

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("DRA_")}
        env = self.sim.env(base)
        env.update(self._nvml_env)
        env.update(
            {
                "NODE_NAME": self.node_name,
                "KUBECONFIG": str(self.kubeconfig),
                "KUBELET_REGISTRAR_DIRECTORY_PATH": str(self.layout.registry),
                "KUBELET_PLUGINS_DIRECTORY_PATH": str(self.layout.plugins),
                "CDI_ROOT": str(self.layout.cdi),
                "NVIDIA_TOOLKIT_CDI_DIRS": str(self.layout.work / "toolkit-cdi"),
                "METRICS_PORT": "0",
                "SHUTDOWN_GRACE_SECONDS": "5",
                "PYTHONUNBUFFERED": "1",
                "VENDORS": "intel,nvidia,amd",
            }
        )
        env.update(extra or {})
        return env

    def start(self, extra: Mapping[str, str] | None = None) -> None:
        self.starts += 1
        # The stand-in NVML replays its events file from the start: a new process must not
        # relive an earlier one's lost and recovered GPUs (a GPU's health is its present).
        self.nvml_events.write_text("")
        with self.log.open("ab") as out:
            out.write(f"==== start {self.starts}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dra_plugin", "run"],
                cwd=REPO,
                env=self.env(extra),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        cleanup.record_pid(self.layout, "plugin", self.proc.pid)

    def registration_socket(self, driver: str) -> Path:
        return self.layout.registry / f"{driver}-reg.sock"

    def wait_serving(self, drivers: tuple[str, ...], timeout: float = 60) -> None:
        """Until every driver's registration socket answers GetInfo."""
        deadline = time.monotonic() + timeout
        pending = list(drivers)
        while pending:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the plugin exited:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the plugin does not serve {pending}:\n{self.log_tail()}")
            try:
                get_info(self.registration_socket(pending[0]), timeout=0.5)
                pending.pop(0)
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.1)

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        self.kill(signal.SIGTERM)
        self.sim.close()
