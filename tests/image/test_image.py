"""The image builds from the Dockerfile on a plain Debian base and runs on a read-only root.

The base is made here: `debootstrap --variant=minbase bookworm` (from the machine's
Debian mirror), its apt caches dropped, imported into podman as localhost/debian-base.
The Dockerfile is built on it with `--build-arg BASE_IMAGE=...` (fakes/imagebuild.py, which
the real node's chart test builds the same image with) and the container then
runs `dra-plugin --help`, `discover`, and `run` against the fake API server (in this
process, on 127.0.0.1) until SIGTERM, with `--read-only` and the kubelet and CDI
directories mounted as the chart mounts them.

The debootstrap tarball and podman's storage (so the build's layer cache) live in
/var/tmp/dra-plugin-image-test (DRA_PLUGIN_IMAGE_CACHE overrides), so a rerun takes
seconds where the first run takes a few minutes. That cache is state a fresh machine lacks,
so nothing here may pass because of it: the build gets the hash of this checkout's build
context (`SOURCE_TREE`), the image must carry it as a label, and the package installed in
the image must hash to the checkout's own files. A layer reused from an older checkout
fails here instead of testing old code: podman caches a `RUN --mount=from=build` layer on
its command text alone, not on the wheels it mounts, which is how an image of older code
once passed here (the Dockerfile now copies the wheels' checksums in before that step).

podman runs as in fakes/podman.py: in a private mount namespace without the cgroup
v2 mount crun refuses on hybrid hosts, cgroups disabled, and ulimits a sandbox allows.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes import imagebuild
from fakes.apiserver import FakeAPIServer
from fakes.cluster import write_kubeconfig
from fakes.imagebuild import BASE, SOURCE_LABEL, Podman, source_tree_hash
from fakes.podman import Podman as RuntimePodman
from fakes.podman import missing_tools as missing_runtime_tools

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
NODE = "image-node"
INTEL = "gpu.intel.com"
# Paths the chart mounts from the host (values.yaml defaults).
REGISTRAR = "/var/lib/kubelet/plugins_registry"
PLUGINS = "/var/lib/kubelet/plugins"
CDI = "/var/cdi/dynamic"


def _unusable(reason: str) -> None:
    """CI must run this test (.ci/setup installs what it needs): fail there, skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " (CI must build and run the image)")
    pytest.skip(reason)


# Run inside the image: the installed package's .py files, hashed as package_hash() does.
PACKAGE_HASH = """
import hashlib, pathlib, dra_plugin
root = pathlib.Path(dra_plugin.__file__).parent
h = hashlib.sha256()
for p in sorted(root.rglob("*.py")):
    h.update(p.relative_to(root).as_posix().encode() + b"\\0" + p.read_bytes() + b"\\0")
print(h.hexdigest())
"""


def package_hash() -> str:
    root = REPO / "dra_plugin"
    h = hashlib.sha256()
    for p in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    missing = imagebuild.missing_tools()
    if missing:
        _unusable(f"missing {', '.join(missing)} (bash .ci/setup --tests installs them)")
    if os.geteuid() != 0:
        _unusable("not root: debootstrap and podman's private mount namespace need root")
    # Before minutes of debootstrap: can a container start here at all? In a chroot or
    # without user namespaces podman fails ("cannot change root filesystem propagation").
    if missing_runtime_tools():
        _unusable(f"missing {', '.join(missing_runtime_tools())} (bash .ci/setup --tests)")
    why = RuntimePodman(tmp_path_factory.mktemp("probe")).cannot_run_reason(
        tmp_path_factory.mktemp("probe-cdi")
    )
    if why:
        _unusable(
            f"containers cannot run on this machine ({why}); run the image tests where podman "
            "can start a container: as root on a machine or VM with user and mount "
            "namespaces, not inside a chroot"
        )
    with imagebuild.podman_with_base() as p:
        yield p


@pytest.fixture(scope="module")
def image(podman: Podman) -> str:
    started = time.monotonic()
    built = imagebuild.build(podman)
    print(f"image built in {time.monotonic() - started:.0f}s")
    return built


def test_the_image_holds_this_checkout(podman: Podman, image: str) -> None:
    """Built from this source tree, not from a layer cache of an older one."""
    info = json.loads(podman.check("image", "inspect", image).stdout)[0]
    labels = info["Config"]["Labels"] or info.get("Labels") or {}
    assert labels.get(SOURCE_LABEL) == source_tree_hash(), "image built from another tree"
    r = podman.check(
        *podman.run_args("--network=none", "--entrypoint", "python3"), image, "-c", PACKAGE_HASH
    )
    assert r.stdout.strip() == package_hash(), "the installed package is not this checkout's"


def test_the_image_is_built_on_the_debian_base(podman: Podman, image: str) -> None:
    info = json.loads(podman.check("image", "inspect", image).stdout)[0]
    labels = info["Config"]["Labels"] or info.get("Labels") or {}
    assert labels["org.opencontainers.image.base.name"] == BASE
    r = podman.check(
        *podman.run_args("--network=none", "--entrypoint", "sh"),
        image,
        "-c",
        "cat /etc/debian_version; command -v python3; command -v pip pip3 || echo no-pip",
    )
    version, python, pip = r.stdout.split()
    assert version.startswith("12.")
    assert python == "/opt/dra-plugin/bin/python3"  # the venv comes first on PATH
    assert pip == "no-pip"  # pip ran from its wheel in the build and stayed out


def test_no_layer_keeps_apt_lists_or_caches(podman: Podman, image: str, tmp_path: Path) -> None:
    out = tmp_path / "oci"
    podman.check("image", "save", "--format", "oci-dir", "--uncompressed", "-o", str(out), image)
    index = json.loads((out / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((out / "blobs/sha256" / manifest_digest).read_text())
    leftovers = []
    for layer in manifest["layers"]:
        with tarfile.open(out / "blobs/sha256" / layer["digest"].split(":")[1]) as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                # Whiteouts (.wh.*) record deletions: what is deleted is not kept.
                if not member.isfile() or Path(name).name.startswith(".wh."):
                    continue
                if (
                    (name.startswith("var/lib/apt/lists/") and not name.endswith("/lock"))
                    or re.fullmatch(r"var/cache/apt/.*\.(bin|deb)", name)
                    or name.startswith(("root/.cache/pip/", "wheels/"))
                ):
                    leftovers.append(name)
    assert len(manifest["layers"]) >= 3  # the base and the Dockerfile's own layers
    assert not leftovers, leftovers[:20]


def test_help(podman: Podman, image: str) -> None:
    r = podman(*podman.run_args("--network=none"), image, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: dra-plugin")
    for command in ("run", "discover", "doctor"):
        assert command in r.stdout


def test_discover_without_gpus(podman: Podman, image: str) -> None:
    r = podman(*podman.run_args("--network=none"), image, "discover")
    # No GPU here: the table form says so and exits 1 (cli.discover).
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "no GPUs found" in r.stderr
    r = podman(
        *podman.run_args("--network=none", "-e", f"NODE_NAME={NODE}"),
        image,
        "discover",
        "-o",
        "json",
    )
    # One exit status for every format (cli.discover, --help, docs/configuration.md): 1
    # when no GPU is found; json still prints what `run` would publish.
    assert r.returncode == 1, r.stderr
    assert "no GPUs found" in r.stderr
    doc = json.loads(r.stdout)
    # The slices `run` would publish: one empty slice per enabled driver.
    assert doc["kind"] == "List"
    assert {s["spec"]["driver"] for s in doc["items"]} == {INTEL, "gpu.nvidia.com"}
    assert all(s["spec"]["nodeName"] == NODE and not s["spec"].get("devices") for s in doc["items"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return None


def test_run_serves_until_sigterm(podman: Podman, image: str, tmp_path: Path) -> None:
    """The daemon starts on the read-only image, registers with the kubelet, publishes its
    node's slice, answers /healthz, and exits 0 on SIGTERM after removing its socket."""
    dirs = {
        path: tmp_path / path.strip("/").replace("/", "_") for path in (REGISTRAR, PLUGINS, CDI)
    }
    for d in dirs.values():
        d.mkdir()
    port = _free_port()
    with FakeAPIServer(versions=("v1",)) as srv:
        srv.add_node(NODE)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", srv.url)
        args = podman.run_args(
            "--network=host",
            *(a for path, d in dirs.items() for a in ("-v", f"{d}:{path}")),
            "-v", f"{kubeconfig}:/etc/dra-plugin/kubeconfig:ro",
            "-e", f"NODE_NAME={NODE}",
            "-e", "VENDORS=intel",
            "-e", "KUBECONFIG=/etc/dra-plugin/kubeconfig",
            "-e", "METRICS_ADDRESS=127.0.0.1",
            "-e", f"METRICS_PORT={port}",
        )  # fmt: skip
        (podman.cache / "tmp").mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            podman.argv([*args, image, "run"]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=podman.env(),
        )
        try:
            deadline = time.monotonic() + 60
            sockets: list[Path] = []
            slices: list[dict[str, object]] = []
            while time.monotonic() < deadline and proc.poll() is None:
                sockets = list(dirs[REGISTRAR].glob("*.sock"))
                slices = [s for s in srv.list_stored_slices() if s["spec"]["nodeName"] == NODE]
                if sockets and slices and _healthz(port) == 200:
                    break
                time.sleep(0.5)
            assert proc.poll() is None, (
                "the daemon exited early:\n" + proc.communicate()[1].decode()
            )
            assert [s.name for s in sockets] == [f"{INTEL}-reg.sock"]
            assert (dirs[PLUGINS] / INTEL / "dra.sock").is_socket()
            assert [s["spec"]["driver"] for s in slices] == [INTEL]
            assert _healthz(port) == 200
        finally:
            # podman run passes SIGTERM on to the container, as the kubelet's stop does.
            proc.send_signal(signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
    log = err.decode(errors="replace")
    assert proc.returncode == 0, log[-4000:]
    # Shut down the way the kubelet needs: registration gone, slices kept.
    assert not list(dirs[REGISTRAR].glob("*.sock")), log[-2000:]
    assert [s["spec"]["driver"] for s in srv.list_stored_slices()] == [INTEL]
