"""The node's container images, made here: no registry is reachable, and a node test must
not depend on one.

Two images, each written as an OCI image-layout archive (one uncompressed layer) that
`ctr -n k8s.io images import` loads into the node's containerd:

- the sandbox ("pause") image: a static C program that sleeps until SIGTERM/SIGINT,
  compiled with the host's gcc (`-static`);
- a busybox image: Debian's busybox-static with a link per applet in /bin.

The busybox image is imported under every name the README's examples use (ubuntu:24.04,
busybox:1.37, NVIDIA's CUDA base image), so the examples run unchanged: their commands are
`ls`, `sh -c ...` and `sleep`, which busybox provides. The archives are rebuilt per node
(a few hundred milliseconds), so nothing depends on a cache a fresh machine lacks.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
# What the examples name (examples/*.yaml), as containerd spells them (fully qualified).
EXAMPLE_IMAGES = (
    "docker.io/library/ubuntu:24.04",
    "docker.io/library/busybox:1.37",
    "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04",
)
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
"""


class ImageError(RuntimeError):
    """An image could not be made (no gcc, no static busybox)."""


def static_busybox() -> Path | None:
    for path in BUSYBOX_PATHS:
        if os.path.exists(path):
            r = subprocess.run(["ldd", path], capture_output=True, text=True)
            if "not a dynamic executable" in r.stdout + r.stderr:
                return Path(path)
    return None


def missing_tools() -> list[str]:
    missing = [] if shutil.which("gcc") else ["gcc"]
    if static_busybox() is None:
        missing.append("busybox-static")
    return missing


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _layer(files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(n).parent) for n in [*files, *links]} - {"."})
        for d in [*dirs, "tmp", "dev", "proc", "sys", "etc"]:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755, 0
            tar.addfile(info)
        for name, (data, mode) in sorted(files.items()):
            _add_file(tar, name, data, mode)
        for name, target in sorted(links.items()):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
            tar.addfile(info)
    return buf.getvalue()


def write_archive(
    out: Path, names: Sequence[str], layer: bytes, cmd: Sequence[str], entrypoint: Sequence[str]
) -> Path:
    """An OCI image-layout tar holding one image under every name in `names`."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [PATH_ENV], "Cmd": list(cmd), "Entrypoint": list(entrypoint) or None},
        "rootfs": {"type": "layers", "diff_ids": [_sha(layer)]},
    }
    config_raw = json.dumps(config, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": _sha(config_raw),
            "size": len(config_raw),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": _sha(layer),
                "size": len(layer),
            }
        ],
    }
    manifest_raw = json.dumps(manifest, sort_keys=True).encode()
    descriptor = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": _sha(manifest_raw),
        "size": len(manifest_raw),
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        # containerd's importer names each image by this annotation (a full reference).
        "manifests": [
            {**descriptor, "annotations": {"io.containerd.image.name": n}} for n in names
        ],
    }
    with tarfile.open(out, "w") as tar:
        _add_file(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}', 0o644)
        _add_file(tar, "index.json", json.dumps(index).encode(), 0o644)
        for blob in (config_raw, manifest_raw, layer):
            _add_file(tar, "blobs/sha256/" + _sha(blob).split(":", 1)[1], blob, 0o644)
    return out


def pause_archive(workdir: Path) -> Path:
    source = workdir / "pause.c"
    source.write_text(_PAUSE_C)
    binary = workdir / "pause"
    proc = subprocess.run(
        ["gcc", "-static", "-O2", "-o", str(binary), str(source)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise ImageError(f"gcc -static pause.c failed (libc6-dev installed?):\n{proc.stderr}")
    layer = _layer({"pause": (binary.read_bytes(), 0o755)}, {})
    return write_archive(workdir / "pause.tar", [PAUSE_IMAGE], layer, [], ["/pause"])


def busybox_archive(workdir: Path, names: Sequence[str] = EXAMPLE_IMAGES) -> Path:
    busybox = static_busybox()
    if busybox is None:
        raise ImageError("no static busybox (Debian: busybox-static)")
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    links = {f"bin/{a}": "busybox" for a in applets if a != "busybox"}
    layer = _layer({"bin/busybox": (busybox.read_bytes(), 0o755)}, links)
    return write_archive(workdir / "busybox.tar", names, layer, ["sh"], [])
