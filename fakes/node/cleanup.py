"""Taking a node down completely, also after a run that died half way.

`teardown(layout)` undoes, in order: every process the node started (by the PIDs it wrote,
checked against their start times, then any process still inside the node's cgroups or
naming its directory: containerd's shims, the containers), every mount under the node's
directory (network namespaces, rootfs, volumes), the cgroups under the node's cgroup root,
the CNI bridge and the iptables chains that appeared while it ran, device nodes it made,
the kubelet's links in /var/log/containers into the node's pod logs, and the kernel
settings the kubelet changed. What lies outside the node's directory is recorded in
`undo.json` before it is changed, so a later run can undo what a killed one left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from fakes.node.config import BRIDGE, CGROUP_ROOT, Layout

CGROUP_FS = Path("/sys/fs/cgroup")
# The kernel settings the kubelet sets when protectKernelDefaults is off.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
CONTAINER_LOG_LINKS = Path("/var/log/containers")
# containerd 2.x puts its shims' sockets here whatever its state dir (each shim removes its
# own on exit); the directory goes again if the node made it and left it empty.
SHIM_SOCKETS = Path("/run/containerd/s")


def read_undo(layout: Layout) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        data: dict[str, Any] = json.loads(layout.state.read_text())
        return data
    return {}


def write_undo(layout: Layout, **update: Any) -> None:
    data = read_undo(layout) | update
    layout.state.write_text(json.dumps(data, indent=1))


def record_host_state(layout: Layout) -> None:
    """What teardown restores: sysctls and the iptables chains that exist now."""
    sysctls = {}
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            sysctls[name] = (Path("/proc/sys") / name).read_text().strip()
    write_undo(
        layout,
        sysctls=sysctls,
        chains=sorted(iptables_chains()),
        device_nodes=[],
        shim_dir_existed=SHIM_SOCKETS.parent.exists(),
        log_links_dir_existed=CONTAINER_LOG_LINKS.exists(),
    )


def iptables_chains() -> set[str]:
    """ "table/chain" for every chain iptables-save shows (empty without iptables)."""
    chains: set[str] = set()
    for tool in ("iptables-save", "ip6tables-save"):
        if shutil.which(tool) is None:
            continue
        out = subprocess.run([tool], capture_output=True, text=True).stdout
        table = ""
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":"):
                chains.add(f"{tool[:-5]}/{table}/{line[1:].split()[0]}")
    return chains


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def record_pid(layout: Layout, name: str, pid: int) -> None:
    pids = layout.root / "pids"
    pids.mkdir(exist_ok=True)
    (pids / f"{name}.pid").write_text(f"{pid} {_start_time(pid)}\n")


def _recorded_pids(layout: Layout) -> list[int]:
    found = []
    for f in sorted((layout.root / "pids").glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pid_s, start = f.read_text().split()
            if _start_time(int(pid_s)) == start:
                found.append(int(pid_s))
    return found


def cgroup_dirs() -> list[Path]:
    """The node's cgroup directory in every mounted hierarchy that has one."""
    if not CGROUP_FS.is_dir():
        return []
    dirs = [CGROUP_FS / CGROUP_ROOT.strip("/")]
    dirs += [c / CGROUP_ROOT.strip("/") for c in CGROUP_FS.iterdir() if c.is_dir()]
    return [d for d in dirs if d.is_dir()]


def make_cgroup_root() -> None:
    """The kubelet's cgroupRoot in every v1 hierarchy (the kubelet wants it to exist);
    cpuset's with its parent's CPUs and memory nodes, or no task could join it."""
    for hierarchy in CGROUP_FS.iterdir():
        if not hierarchy.is_dir() or hierarchy.name == "unified":
            continue
        d = hierarchy / CGROUP_ROOT.strip("/")
        d.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / name).exists() and not (d / name).read_text().strip():
                (d / name).write_text((hierarchy / name).read_text())


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for top in cgroup_dirs():
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    text = (Path(dirpath) / "cgroup.procs").read_text()
                    pids |= {int(p) for p in text.split()}
    return pids


def _naming_root(layout: Layout) -> set[int]:
    """Processes with an argument inside the node's directory (shims, the containers' init),
    never this process or its ancestors."""
    root = str(layout.root).rstrip("/")
    pattern = re.compile(rb"(?:^|[=:])" + re.escape(root.encode()) + rb"(?:/|$)")
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                args = (entry / "cmdline").read_bytes().split(b"\0")
                if any(pattern.search(a) for a in args):
                    found.add(int(entry.name))
    return found - _ancestors()


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def _kill(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_processes(layout: Layout, grace: float = 5.0) -> None:
    first = set(_recorded_pids(layout))
    _kill(first, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_start_time(p) for p in first):
        time.sleep(0.1)
    for _ in range(20):
        left = set(_recorded_pids(layout)) | _cgroup_pids() | _naming_root(layout)
        left -= _ancestors()
        if not left:
            break
        _kill(left, signal.SIGKILL)
        time.sleep(0.2)
    shutil.rmtree(layout.root / "pids", ignore_errors=True)


def kill_all_but(layout: Layout, keep: set[int]) -> None:
    """SIGKILL every process of the node (recorded, in its cgroups, naming its directory)
    except `keep` (a reboot keeps the control plane, which is another machine)."""
    for _ in range(20):
        left = set(_recorded_pids(layout)) | _cgroup_pids() | _naming_root(layout)
        left -= _ancestors() | keep
        if not left:
            return
        _kill(left, signal.SIGKILL)
        time.sleep(0.2)


def mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix) or point == str(root):
                found.append(point)
    return found


def unmount_all(root: Path) -> None:
    for _ in range(5):
        points = mounts_under(root)
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)


def remove_cgroups() -> None:
    for top in cgroup_dirs():
        for dirpath, _dirs, _files in os.walk(top, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def remove_network(layout: Layout) -> None:
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
    before = set(read_undo(layout).get("chains", []))
    if not before:
        return  # nothing recorded: no way to tell the node's chains from the host's
    for entry in sorted(iptables_chains() - before):
        family, table, chain = entry.split("/")
        if chain.startswith(("KUBE-", "CNI-")):
            tool = f"{family}"
            subprocess.run([tool, "-t", table, "-F", chain], capture_output=True)
            subprocess.run([tool, "-t", table, "-X", chain], capture_output=True)


def restore_host(layout: Layout) -> None:
    undo = read_undo(layout)
    for path in undo.get("device_nodes", []):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    # Host directories a pod's hostPath (DirectoryOrCreate) made for the node: empty ones go.
    for path in undo.get("host_dirs", []):
        with contextlib.suppress(OSError):
            os.rmdir(path)
    for name, value in undo.get("sysctls", {}).items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(value + "\n")
    if undo.get("shim_dir_existed") is False:
        # No containerd had it before the node: every socket in it was a shim of the node's.
        for sock in SHIM_SOCKETS.glob("*"):
            with contextlib.suppress(OSError):
                sock.unlink()
        for d in (SHIM_SOCKETS, SHIM_SOCKETS.parent / "fifo", SHIM_SOCKETS.parent):
            with contextlib.suppress(OSError):
                d.rmdir()
    if CONTAINER_LOG_LINKS.is_dir():
        for link in CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(layout.pod_logs)):
                    link.unlink()
        if undo.get("log_links_dir_existed") is False:
            with contextlib.suppress(OSError):
                CONTAINER_LOG_LINKS.rmdir()


def leftovers(layout: Layout) -> list[str]:
    """What of the node is still there after teardown (empty: nothing; logs excepted)."""
    found = [f"process {pid}" for pid in sorted(set(_recorded_pids(layout)) | _cgroup_pids())]
    found += [f"process {pid} naming {layout.root}" for pid in sorted(_naming_root(layout))]
    found += [f"mount {m}" for m in mounts_under(layout.root)]
    found += [f"cgroup {d}" for d in cgroup_dirs()]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"network interface {BRIDGE}")
    if layout.root.exists():
        found += [f"file {p}" for p in layout.root.iterdir() if p != layout.logs]
    return found


def teardown(layout: Layout, *, keep_logs: bool = True) -> None:
    """Everything the node made goes; its logs stay (for a failed test's report)."""
    if not layout.root.exists():
        return
    stop_processes(layout)
    unmount_all(layout.root)
    remove_cgroups()
    remove_network(layout)
    restore_host(layout)
    for child in layout.root.iterdir():
        if keep_logs and child == layout.logs:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
