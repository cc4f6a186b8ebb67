"""containerd's CDI settings as the host's config files say, read through the host root.

Pure reading and text: which files containerd (or Talos) merges, the `enable_cdi` and
`cdi_spec_dirs` they end up with, and the exact snippet that adds a directory. Used by
`dra-plugin doctor` (doctor/containerd.py) and at daemon start (doctor/cdiroot.py).

Merge order, last wins per key:
1. Talos's CRI parts, `/etc/cri/conf.d/*.part` in name order (00-base.part is Talos's own:
   since Talos 1.13 it sets `enable_cdi = true` and `cdi_spec_dirs = ["/run/cdi"]`;
   20-customization.part is the machine-config drop-in).
2. `/etc/containerd/config.toml`, then Talos's `/etc/cri/containerd.toml`, each followed by
   its `imports` in order. On Talos the latter imports `/etc/cri/conf.d/cri.toml`, the
   merge Talos rendered from the parts plus in-memory CRICustomizationConfig documents
   (1.14+), so when it is there it has the final word.
"""

from __future__ import annotations

import glob
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from dra_plugin.host.hostview import Host

DEFAULT_CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # containerd's when none is set
CRI_V1 = "io.containerd.grpc.v1.cri"  # containerd 1.x
CRI_V2 = "io.containerd.cri.v1.runtime"  # containerd 2.x
TALOS_CRI_PART = "/etc/cri/conf.d/20-customization.part"
TALOS_PARTS_DIR = "/etc/cri/conf.d"
MAIN_CONFIGS = ("/etc/containerd/config.toml", "/etc/cri/containerd.toml")
# Signs of containerd on a host that has no config file (it then runs on its defaults).
STATE_PATHS = ("/run/containerd", "/var/lib/containerd", "/etc/containerd")


@dataclass
class ContainerdCdi:
    dirs: list[str] | None = None  # None: containerd's default
    enable_cdi: bool | None = None
    version: int | None = None
    v2_section: bool = False
    files: tuple[str, ...] = ()  # host paths read, in merge order
    errors: list[tuple[str, str]] = field(default_factory=list)  # (host path, parse error)

    @property
    def effective_dirs(self) -> list[str]:
        return self.dirs if self.dirs is not None else list(DEFAULT_CDI_SPEC_DIRS)

    def containerd2(self, talos: bool) -> bool:
        return talos or self.v2_section or (self.version or 3) >= 3

    def enabled(self, talos: bool) -> bool:
        # containerd 2.x enables CDI by default; 1.7 does not.
        return self.enable_cdi if self.enable_cdi is not None else self.containerd2(talos)

    def lists(self, directory: str | Path) -> bool:
        return any(same_dir(d, str(directory)) for d in self.effective_dirs)

    def section(self, talos: bool) -> str:
        return CRI_V2 if self.containerd2(talos) else CRI_V1

    @property
    def source(self) -> str:
        return ", ".join(self.files) if self.files else "no containerd config found"


def visible(host: Host, state: ContainerdCdi) -> bool:
    """Whether containerd can be seen under the host root at all: without the host's /
    mounted (or on a node with another runtime) its defaults prove nothing."""
    return bool(state.files) or any(host.path(p).exists() for p in STATE_PATHS)


def same_dir(a: str, b: str) -> bool:
    """/var/run is /run on every distribution containerd runs on (Talos included)."""

    def norm(p: str) -> str:
        p = os.path.normpath(p)
        return "/run" + p[len("/var/run") :] if p == "/var/run" or p.startswith("/var/run/") else p

    return norm(a) == norm(b)


def config_files(host: Host) -> list[Path]:
    """Every file containerd's CDI settings come from, in merge order (see module doc)."""
    ordered: list[Path] = []

    def add(path: Path) -> None:
        if not path.is_file() or path in ordered:
            return
        ordered.append(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return
        imports = data.get("imports", [])
        for imp in imports if isinstance(imports, list) else []:
            if not isinstance(imp, str):
                continue
            # Absolute imports are host paths; relative ones are relative to the file.
            pattern = host.path(imp) if imp.startswith("/") else path.parent / imp
            for match in sorted(glob.glob(str(pattern))):
                add(Path(match))

    parts = host.path(TALOS_PARTS_DIR)
    for part in sorted(parts.glob("*.part")) if parts.is_dir() else []:
        add(part)
    for main in MAIN_CONFIGS:
        add(host.path(main))
    return ordered


def _host_path(host: Host, path: Path) -> str:
    return "/" + str(path.relative_to(host.root)).lstrip("/")


def read(host: Host) -> ContainerdCdi:
    """The merged CDI settings; unparsable files are listed in `errors`, not raised."""
    state = ContainerdCdi()
    files = config_files(host)
    state.files = tuple(_host_path(host, f) for f in files)
    for path in files:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            state.errors.append((_host_path(host, path), str(e)))
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
    return state


@dataclass(frozen=True)
class Fix:
    action: str  # one line: what to do
    detail: str  # the snippet to paste


def add_dir_fix(state: ContainerdCdi, directory: str | Path, talos: bool) -> Fix:
    """The exact change that makes containerd read `directory` too.

    The directories already listed are kept (TOML merging replaces a list, it does not
    extend it): on Talos 1.13+ that keeps /run/cdi, where system extensions (a GPU
    vendor's container toolkit) write their own specs.
    """
    section = state.section(talos)
    wanted = [*state.effective_dirs, str(directory)]
    lines = [f'[plugins."{section}"]']
    if not state.enabled(talos):
        lines.append("  enable_cdi = true")
    lines.append("  cdi_spec_dirs = [" + ", ".join(json.dumps(d) for d in wanted) + "]")
    toml = "\n".join(lines) + "\n"
    if not talos:
        return Fix(
            "add this to /etc/containerd/config.toml (or a file it imports) and restart containerd",
            toml,
        )
    content = "".join(f"          {line}\n" for line in toml.splitlines())
    # Talos 1.13+ lists /run/cdi itself: pointing the plugin there needs no patch at all.
    other = (
        "; or set the chart value cdi.root=/var/run/cdi, which this node already reads"
        if state.lists("/run/cdi") and not same_dir(str(directory), "/run/cdi")
        else ""
    )
    return Fix(
        f"add the containerd drop-in {TALOS_CRI_PART} with this machine-config patch "
        "(talosctl patch machineconfig --patch @file.yaml; containerd restarts by itself, "
        f"no reboot){other}",
        f"machine:\n  files:\n    - path: {TALOS_CRI_PART}\n      op: create\n"
        f"      content: |\n{content}",
    )
