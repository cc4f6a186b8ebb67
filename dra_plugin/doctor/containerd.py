"""Doctor's CDI checks: the plugin's CDI dir, and whether containerd (or Talos) reads it.

Reads containerd's config the way containerd merges it: the main config, its imports in
order, then Talos's CRI drop-ins. Nothing here talks to containerd itself.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.config import Config
from dra_plugin.doctor.findings import Finding, Status
from dra_plugin.host.hostview import Host

DEFAULT_CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CRI_V1 = "io.containerd.grpc.v1.cri"  # containerd 1.x
CRI_V2 = "io.containerd.cri.v1.runtime"  # containerd 2.x
TALOS_CRI_PART = "/etc/cri/conf.d/20-customization.part"


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
    if not where.is_dir():
        return Finding(
            Status.FAIL,
            "cdi-dir",
            f"CDI dir {cfg.cdi_root} does not exist",
            f"create it (the plugin does at start) or mount it: hostPath "
            f"{cfg.cdi_root}, type DirectoryOrCreate",
        )
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


@dataclass
class _ContainerdCdi:
    dirs: list[str] | None = None  # None: containerd's default
    enable_cdi: bool | None = None
    version: int | None = None
    v2_section: bool = False
    files: tuple[str, ...] = ()


def _containerd_files(host: Host) -> list[Path]:
    """Main configs, their imports (in order), then Talos drop-ins — containerd's merge order."""
    ordered: list[Path] = []

    def add(path: Path) -> None:
        if path.is_file() and path not in ordered:
            ordered.append(path)
            try:
                data = tomllib.loads(path.read_text())
            except (OSError, tomllib.TOMLDecodeError):
                return
            for imp in data.get("imports", []):
                if not isinstance(imp, str):
                    continue
                # Absolute imports are host paths; relative ones are relative to the file.
                pattern = host.path(imp) if imp.startswith("/") else path.parent / imp
                for match in sorted(glob.glob(str(pattern))):
                    add(Path(match))

    add(host.path("/etc/containerd/config.toml"))
    add(host.path("/etc/cri/containerd.toml"))
    for part in sorted(host.path("/etc/cri/conf.d").glob("*.part")):
        add(part)
    return ordered


def _read_containerd(host: Host) -> tuple[_ContainerdCdi, list[Finding]]:
    state, errors = _ContainerdCdi(), []
    files = _containerd_files(host)
    state.files = tuple("/" + str(f.relative_to(host.root)) for f in files)
    for path in files:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            rel = "/" + str(path.relative_to(host.root))
            errors.append(
                Finding(
                    Status.FAIL,
                    "containerd-cdi",
                    f"cannot parse {rel}: {e}",
                    "fix the TOML: containerd does not start with a broken config",
                )
            )
            continue
        if isinstance(data.get("version"), int):
            state.version = data["version"]
        plugins = data.get("plugins", {})
        for section in (CRI_V1, CRI_V2):
            cri = plugins.get(section, {}) if isinstance(plugins, dict) else {}
            if not isinstance(cri, dict):
                continue
            state.v2_section |= section == CRI_V2 and bool(cri)
            if isinstance(cri.get("cdi_spec_dirs"), list):
                state.dirs = [str(d) for d in cri["cdi_spec_dirs"]]
            if isinstance(cri.get("enable_cdi"), bool):
                state.enable_cdi = cri["enable_cdi"]
    return state, errors


def _same_dir(a: str, b: str) -> bool:
    def norm(p: str) -> str:
        p = os.path.normpath(p)
        return "/run" + p[len("/var/run") :] if p.startswith("/var/run/") else p

    return norm(a) == norm(b)


def check_containerd(cfg: Config, host: Host, talos: bool) -> list[Finding]:
    state, out = _read_containerd(host)
    containerd2 = talos or state.v2_section or (state.version or 3) >= 3
    dirs = state.dirs if state.dirs is not None else list(DEFAULT_CDI_SPEC_DIRS)
    source = ", ".join(state.files) if state.files else "no containerd config found"
    enabled = state.enable_cdi if state.enable_cdi is not None else containerd2
    if not enabled:
        section = CRI_V2 if containerd2 else CRI_V1
        out.append(
            Finding(
                Status.FAIL,
                "containerd-cdi",
                f"CDI is disabled in containerd ({source})",
                f'set enable_cdi = true in [plugins."{section}"]',
            )
        )
    if any(_same_dir(d, str(cfg.cdi_root)) for d in dirs):
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
    wanted = [*dirs, str(cfg.cdi_root)]
    section = CRI_V2 if containerd2 else CRI_V1
    toml = (
        f'[plugins."{section}"]\n  cdi_spec_dirs = ['
        + ", ".join(json.dumps(d) for d in wanted)
        + "]\n"
    )
    if talos:
        action = (
            f"add the containerd drop-in {TALOS_CRI_PART} with this machine-config patch "
            "(containerd restarts by itself, no reboot)"
        )
        content = "".join(f"          {line}\n" for line in toml.splitlines())
        detail = (
            f"machine:\n  files:\n    - path: {TALOS_CRI_PART}\n      op: create\n"
            f"      content: |\n{content}"
        )
    else:
        action = (
            "add this to /etc/containerd/config.toml (or a file it imports) and restart containerd"
        )
        detail = toml
    default = " (default)" if state.dirs is None else ""
    out.append(
        Finding(
            Status.FAIL,
            "containerd-cdi",
            f"containerd reads CDI specs from {', '.join(dirs)}{default}, not from "
            f"{cfg.cdi_root} where this plugin writes them ({source}{ro_note})",
            action,
            detail,
        )
    )
    return out
