"""Doctor's CDI checks: the plugin's CDI dir, and whether containerd (or Talos) reads it.

How containerd's config files are found and merged is host/containerd.py's (the daemon
checks the same at start); here they become findings. Nothing talks to containerd itself.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from dra_plugin.config import Config
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.host import containerd
from dra_plugin.host.containerd import TALOS_CRI_PART
from dra_plugin.host.hostview import Host

__all__ = ["TALOS_CRI_PART", "check_cdi_dir", "check_containerd"]


def _probe_write(directory: Path) -> str | None:
    """None if a file can be created in `directory`, else why not (EROFS is Talos's /etc)."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".doctor-")
    except OSError as e:
        return os.strerror(e.errno) if e.errno else str(e)
    os.close(fd)
    os.unlink(name)
    return None


def check_cdi_dir(cfg: Config, host: Host) -> Finding:
    where = host.path(cfg.cdi_root)
    if where.exists() and not where.is_dir():
        return Finding(
            Status.FAIL,
            "cdi-dir",
            f"CDI dir {cfg.cdi_root} is a file, not a directory",
            f"remove the file, or set {cfg.setting('cdi_root')} to a directory containerd reads",
        )
    if not where.is_dir():
        return _missing_cdi_dir(cfg, host)
    why = _probe_write(where)
    if why is None:
        return Finding(Status.PASS, "cdi-dir", f"{cfg.cdi_root} exists and is writable")
    hint = (
        " (on Talos /etc is read-only: use /var/cdi/dynamic)"
        if why == os.strerror(errno.EROFS)
        else ""
    )
    return Finding(
        Status.FAIL,
        "cdi-dir",
        f"cannot write to {cfg.cdi_root}: {why}{hint}",
        "set CDI_ROOT to a writable directory that containerd reads (see containerd-cdi)",
    )


def _missing_cdi_dir(cfg: Config, host: Host) -> Finding:
    """Not a failure while the plugin can create it at start (as `run` does): only when
    the nearest existing parent is a file or not writable."""
    parents = Path(cfg.cdi_root).parents
    parent = next((p for p in parents if host.path(p).exists()), Path("/"))
    if not host.path(parent).exists():
        why = f"{host.path(parent)} is missing"
    elif not host.path(parent).is_dir():
        why = f"{parent} is a file, not a directory"
    elif not os.access(host.path(parent), os.W_OK | os.X_OK):
        ro = _read_only_fs(host.path(parent))
        why = f"{parent} is not writable" + (
            " (a read-only file system; on Talos /etc is: use /var/cdi/dynamic)" if ro else ""
        )
    else:
        return Finding(
            Status.WARN,
            "cdi-dir",
            f"CDI dir {cfg.cdi_root} does not exist yet; the plugin creates it at start "
            f"({parent} is writable)",
            f"nothing to do when the plugin runs on this node itself; in a pod it must be "
            f"the host's: hostPath {cfg.cdi_root}, type DirectoryOrCreate (the chart's)",
        )
    return Finding(
        Status.FAIL,
        "cdi-dir",
        f"CDI dir {cfg.cdi_root} does not exist and cannot be created: {why}",
        f"set {cfg.setting('cdi_root')} to a writable directory that containerd reads "
        "(see containerd-cdi)",
    )


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_containerd(cfg: Config, host: Host, talos: bool) -> list[Finding]:
    state = containerd.read(host)
    if not containerd.visible(host, state):
        return [
            Finding(
                Status.WARN,
                "containerd-cdi",
                f"NOT CHECKED: no containerd config or state under {host.root} (the host's / "
                "is not mounted here, or the node runs another runtime)",
                f"mount the host's / and set {cfg.setting('host_root')} to it, or run doctor "
                "on the node",
            )
        ]
    out = [
        Finding(
            Status.FAIL,
            "containerd-cdi",
            f"cannot parse {path}: {err}",
            "fix the TOML: containerd does not start with a broken config",
        )
        for path, err in state.errors
    ]
    source = state.source
    if not state.enabled(talos):
        out.append(
            Finding(
                Status.FAIL,
                "containerd-cdi",
                f"CDI is disabled in containerd ({source})",
                f'set enable_cdi = true in [plugins."{state.section(talos)}"]',
            )
        )
    dirs = state.effective_dirs
    if state.lists(cfg.cdi_root):
        out.append(
            Finding(
                Status.PASS,
                "containerd-cdi",
                f"containerd reads CDI specs from "
                f"{', '.join(dirs)} ({source}), including {cfg.cdi_root}",
            )
        )
        return out
    readonly = [d for d in dirs if host.path(d).is_dir() and _probe_write(host.path(d))]
    ro_note = f"; read-only: {', '.join(readonly)}" if readonly else ""
    fix = containerd.add_dir_fix(state, cfg.cdi_root, talos)
    default = " (default)" if state.dirs is None else ""
    out.append(
        Finding(
            Status.FAIL,
            "containerd-cdi",
            f"containerd reads CDI specs from {', '.join(dirs)}{default}, not from "
            f"{cfg.cdi_root} where this plugin writes them ({source}{ro_note})",
            fix.action,
            fix.detail,
        )
    )
    return out
