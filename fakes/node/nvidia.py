"""The simulated NVIDIA driver root of the node: the stand-in NVML library (fakes/nvml) and
a static `nvidia-smi` stand-in in `usr/bin`, which the plugin's CDI spec bind-mounts into
the container at /usr/bin/nvidia-smi, as it mounts a real driver's.

The README's NVIDIA smoke test runs `nvidia-smi -L` in NVIDIA's CUDA base image, which has
no nvidia-smi of its own: the node's copy is the image's busybox, so the stand-in must run
without a libc in the container (static) and without NVML (which needs one). It knows the
profile's GPUs (minor, name, UUID), compiled in, and lists those whose /dev/nvidia<minor>
the container holds: so its output shows exactly the GPUs the claim injected, in the real
tool's `-L` format ("GPU 0: NVIDIA H200 (UUID: GPU-...)").
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from fakes.nvml_lib import FakeNvml, profile_path

_SMI_C = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
struct gpu { int minor; const char *name; const char *uuid; };
static const struct gpu GPUS[] = { %(table)s {-1, 0, 0} };
int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "-L") != 0) {
        fprintf(stderr, "nvidia-smi stand-in: only -L\n");
        return 0;
    }
    int index = 0;
    for (const struct gpu *g = GPUS; g->minor >= 0; g++) {
        char path[64];
        snprintf(path, sizeof path, "/dev/nvidia%%d", g->minor);
        if (access(path, F_OK) == 0)
            printf("GPU %%d: %%s (UUID: %%s)\n", index++, g->name, g->uuid);
    }
    if (index == 0) {
        printf("No devices were found\n");
        return 6;
    }
    return 0;
}
"""


def profile_gpus(profile: str) -> list[tuple[int, str, str]]:
    """(minor, name, uuid) of every [gpu] section of a stand-in NVML profile."""
    gpus = []
    for section in re.split(r"^\[gpu\]\s*$", profile_path(profile).read_text(), flags=re.M)[1:]:
        fields = dict(
            (k.strip(), v.strip())
            for k, v in (line.split("=", 1) for line in section.splitlines() if "=" in line)
            if not k.strip().startswith("#")
        )
        if {"minor", "name", "uuid"} <= fields.keys():
            gpus.append((int(fields["minor"]), fields["name"], fields["uuid"]))
    return gpus


def driver_root(work: Path, fake: FakeNvml, profile: str) -> Path:
    """A copy of the stand-in's driver root with the static nvidia-smi in usr/bin."""
    root = work / "nvidia-driver-root"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(fake.driver_root, root, symlinks=True)
    table = " ".join(
        f"{{{minor}, {json.dumps(name)}, {json.dumps(uuid)}}},"
        for minor, name, uuid in profile_gpus(profile)
    )
    source = work / "nvidia-smi.c"
    source.write_text(_SMI_C % {"table": table})
    binary = root / "usr" / "bin" / "nvidia-smi"
    binary.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["gcc", "-static", "-O2", "-o", str(binary), str(source)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"gcc -static nvidia-smi.c failed:\n{proc.stderr}")
    return root
