"""The plugin's image, built from the Dockerfile with podman on a plain Debian base, no
registry: what the image test checks and what the real node's DaemonSet runs.

The base is made here: `debootstrap --variant=minbase bookworm` (from the machine's
Debian mirror), its apt caches dropped, imported into podman as localhost/debian-base.
The Dockerfile is built on it with `--build-arg BASE_IMAGE=...`.

The debootstrap tarball and podman's storage (so the build's layer cache) live in
/var/tmp/dra-plugin-image-test (DRA_PLUGIN_IMAGE_CACHE overrides), so a rebuild takes
seconds where the first takes a few minutes. That cache is state a fresh machine lacks,
so the build gets the hash of this checkout's build context (`SOURCE_TREE`) and the image
carries it as a label: whoever uses the image checks it (tests/image/test_image.py).

podman runs in a private mount namespace without the cgroup v2 mount crun refuses on
hybrid hosts, with cgroups disabled (fakes/podman.py does the same for its runs).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import resource
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DRA_PLUGIN_IMAGE_CACHE", "/var/tmp/dra-plugin-image-test"))
SUITE = "bookworm"
BASE = f"localhost/debian-base:{SUITE}"
IMAGE = "localhost/dra-plugin:test-debian"
TOOLS = ("debootstrap", "podman", "crun", "unshare", "mountpoint", "tar")
CONTEXT = ("constraints.txt", "pyproject.toml", "README.md", "protos", "dra_plugin")
SOURCE_LABEL = "io.github.dra-plugin.source-tree"


class ImageBuildError(RuntimeError):
    """The image did not build."""


def _context_files() -> list[Path]:
    """The files of the build context (.dockerignore lets only CONTEXT in), sorted."""
    out: list[Path] = []
    for name in CONTEXT:
        top = REPO / name
        found = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        out += [
            p
            for p in found
            if "__pycache__" not in p.parts
            and not p.name.endswith(".pyc")
            and not any(part.endswith(".egg-info") for part in p.parts)
        ]
    return sorted(out)


def source_tree_hash() -> str:
    """sha256 over the build context's paths and contents: what the image is built from."""
    h = hashlib.sha256()
    for p in _context_files():
        h.update(p.relative_to(REPO).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _debian_mirror() -> str | None:
    """The machine's own Debian mirror (apt's sources), else debootstrap's default."""
    texts = [p.read_text() for p in Path("/etc/apt/sources.list.d").glob("*.sources")]
    for text in texts:  # deb822: "URIs: <url>" in a stanza whose suites are plain bookworm
        for stanza in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split():
                return uris.group(1)
    sources = Path("/etc/apt/sources.list")
    if sources.exists():
        m = re.search(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", sources.read_text(), re.M)
        if m:
            return m.group(1)
    return None


def _ca_bundle() -> str | None:
    """The CA bundle this machine's pip trusts, for a TLS-intercepting proxy in the build."""
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


class Podman:
    """podman with its own storage under `cache`, in a private mount namespace."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.conf = cache / "containers.conf"
        self.conf.write_text(
            "[containers]\n"
            'cgroups = "disabled"\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            'runtime = "crun"\n'
        )

    def argv(self, args: Sequence[str]) -> list[str]:
        podman = [
            "podman",
            "--root", str(self.cache / "storage"),
            "--runroot", str(self.cache / "run"),
            "--tmpdir", str(self.cache / "tmp"),
            *args,
        ]  # fmt: skip
        script = (
            # crun: "cgroups in hybrid mode not supported": drop the v2 mount here only.
            "if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi\n"
            "exec " + " ".join(shlex.quote(a) for a in podman)
        )
        return ["unshare", "--mount", "--propagation", "private", "bash", "-c", script]

    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def __call__(self, *args: str, timeout: float = 120, stdin: bytes | None = None) -> Done:
        (self.cache / "tmp").mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            self.argv(args), capture_output=True, input=stdin, timeout=timeout, env=self.env()
        )
        return Done(
            r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        )

    def check(self, *args: str, timeout: float = 120) -> Done:
        r = self(*args, timeout=timeout)
        if r.returncode != 0:
            raise ImageBuildError(f"podman {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
        return r

    @staticmethod
    def ulimits() -> list[str]:
        # podman asks for nofile=1048576 by default; without CAP_SYS_RESOURCE (sandboxes,
        # CI containers) raising past the hard limit fails.
        out = []
        for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
            hard = resource.getrlimit(which)[1]
            value = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
            out += ["--ulimit", f"{name}={value}:{value}"]
        return out

    def run_args(self, *extra: str) -> list[str]:
        """`podman run` for the plugin image the way the chart runs it: read-only root,
        writable /tmp, as root."""
        return [
            "run", "--rm", "--read-only", "--tmpfs", "/tmp", *self.ulimits(), *extra,
        ]  # fmt: skip


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _debootstrap_base(tarball: Path) -> None:
    """A minbase Debian root, without apt's package cache and lists, as a tarball."""
    work = tarball.parent / "rootfs.tmp"
    shutil.rmtree(work, ignore_errors=True)
    cmd = ["debootstrap", "--variant=minbase", SUITE, str(work)]
    mirror = _debian_mirror()
    if mirror:
        cmd.append(mirror)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise ImageBuildError(f"debootstrap failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    for deb in (work / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    for path in [*(work / "var/cache/apt").glob("*.bin"), *(work / "var/lib/apt/lists").iterdir()]:
        if path.is_file():
            path.unlink()
    partial = tarball.with_suffix(".tmp")
    subprocess.run(["tar", "-C", str(work), "-cf", str(partial), "."], check=True, timeout=300)
    partial.rename(tarball)
    shutil.rmtree(work)


@contextmanager
def podman_with_base(cache: Path = CACHE) -> Iterator[Podman]:
    """podman on the shared cache, with the Debian base imported; several checkouts on
    one machine share the cache, so one holds it at a time."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        p = Podman(cache)
        tarball = cache / f"debian-{SUITE}-minbase-{platform.machine()}.tar"
        if not tarball.exists():
            _debootstrap_base(tarball)
        if p("image", "exists", BASE).returncode != 0:
            p.check("import", str(tarball), BASE, timeout=300)
        yield p


def build(podman: Podman, image: str = IMAGE) -> str:
    """The Dockerfile built on the Debian base, labelled with this checkout's hash."""
    args = ["build", "--network=host", "--build-arg", f"BASE_IMAGE={BASE}", "-t", image]
    args += ["--build-arg", f"SOURCE_TREE={source_tree_hash()}"]
    ca = _ca_bundle()
    if ca:
        args += ["--secret", f"id=pip-ca,src={ca}"]
    r = podman(*args, str(REPO), timeout=900)
    if r.returncode != 0:
        raise ImageBuildError(f"the image did not build:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    # Keep the layer cache for reruns, not every build ever made.
    podman("image", "prune", "-f", "--filter", "until=72h")
    return image


def save_oci_archive(podman: Podman, image: str, out: Path) -> Path:
    """`image` as an OCI archive (what `ctr images import` reads), named as built."""
    out.unlink(missing_ok=True)
    podman.check("save", "--format", "oci-archive", "-o", str(out), image, timeout=300)
    return out
