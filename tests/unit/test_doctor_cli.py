"""`dra-plugin doctor` on a bad day: a broken kubeconfig, files where directories belong,
a pod without the host mounted. One finding line each, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.hostroot import HostRoot, host_root

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostRoot]:
    with host_root(tmp_path / "node") as h:
        yield h


def doctor(host: HostRoot, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    r = subprocess.run(
        [sys.executable, "-m", "dra_plugin", "doctor", "--host-root", str(host.root), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # An empty driver root: NVML answers "library not found" at once.
        env={
            "PATH": "/usr/bin:/bin",
            "NVIDIA_DRIVER_ROOT": str(host.root / "no-driver"),
            **(env or {}),
        },
        timeout=60,
    )
    return r.returncode, r.stdout, r.stderr


def lines(out: str, check: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.split(" ", 2)[1:2] == [f"{check}:"]]


@pytest.mark.parametrize(
    "content,why",
    [
        ('apiVersion: v1\nclusters:\n- cluster:\n    server: "http', "is not valid YAML"),
        ("x\n", "is not a kubeconfig"),
        ("clusters: 5\n", "is not a kubeconfig: clusters is not a list"),
    ],
)
def test_malformed_kubeconfig_is_one_finding(
    host: HostRoot, tmp_path: Path, content: str, why: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(content)
    code, out, err = doctor(host, "--kubeconfig", str(kubeconfig))
    assert "Traceback" not in out + err and err == ""
    [api] = lines(out, "api")
    assert api.startswith("FAIL api: API not checked: ")
    assert f"--kubeconfig='{kubeconfig}' {why}" in api
    assert code == 2


def test_no_credentials_says_where_it_looked_and_the_remedy_once(
    host: HostRoot, tmp_path: Path
) -> None:
    _, out, _ = doctor(host, env={"HOME": str(tmp_path)})
    [api] = lines(out, "api")
    found, action = api.split(" — ")
    assert found.startswith("WARN api: API not checked: no Kubernetes API credentials; ")
    assert f"{tmp_path}/.kube/config (no such file)" in found
    assert found.endswith("(no such file)"), found  # where it looked; what to do follows
    assert action.count("--kubeconfig") == 1 and "pod" in action, action
    assert api.count(" pod") == 1, api


def test_kubeconfig_from_env_is_named_as_env(host: HostRoot, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    _, out, _ = doctor(host, env={"KUBECONFIG": str(missing)})
    [api] = lines(out, "api")
    assert f"KUBECONFIG='{missing}' cannot be read: No such file or directory" in api
    assert "pass --kubeconfig" not in api  # it was given: say what is wrong with it


def test_kubeconfig_without_a_context_says_why(host: HostRoot, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n")
    _, out, _ = doctor(host, "--kubeconfig", str(kubeconfig))
    [api] = lines(out, "api")
    assert api.startswith(f"FAIL api: API not checked: --kubeconfig='{kubeconfig}': ")
    assert "no kubeconfig" not in api


def test_files_where_directories_belong_are_named_as_such(host: HostRoot) -> None:
    host.write("/var/cdi/dynamic", "")
    host.write("/var/lib/kubelet/plugins", "")
    _, out, _ = doctor(host, "--cdi-root", "/var/cdi/dynamic")
    [cdi] = lines(out, "cdi-dir")
    assert cdi.startswith("FAIL cdi-dir: CDI dir /var/cdi/dynamic is a file, not a directory")
    assert "--cdi-root" in cdi
    plugins = [ln for ln in lines(out, "kubelet-dirs") if "plugins dir" in ln]
    assert plugins == [
        "FAIL kubelet-dirs: plugins dir /var/lib/kubelet/plugins is a file, not a directory — "
        "remove the file, or set KUBELET_PLUGINS_DIRECTORY_PATH to the kubelet's directory"
    ]


def test_containerd_not_checked_without_the_host_mounted(host: HostRoot) -> None:
    # An Intel-only pod without the host's / mounted: nothing of containerd is visible.
    _, out, _ = doctor(host, "--vendors", "intel")
    [ctr] = lines(out, "containerd-cdi")
    assert ctr.startswith("WARN containerd-cdi: NOT CHECKED: no containerd config or state")
    assert "--host-root" in ctr


def test_containerd_on_its_defaults_is_still_checked(host: HostRoot) -> None:
    # containerd runs (its state dir is there) with no config file: its defaults apply.
    host.dirs("/var/lib/containerd")
    _, out, _ = doctor(host, "--vendors", "intel")
    [ctr] = lines(out, "containerd-cdi")
    assert ctr.startswith("FAIL containerd-cdi: containerd reads CDI specs from /etc/cdi")


def test_vendor_names_are_spelled_as_their_makers_do(host: HostRoot) -> None:
    host.pci_gpu("0000:00:02.0", "8086", "7d55")
    host.pci_gpu("0000:01:00.0", "10de", "2c05")
    host.pci_gpu("0000:03:00.0", "1002", "744c")
    _, out, _ = doctor(host, "--vendors", "intel,nvidia,amd")
    pci = "\n".join(lines(out, "pci"))
    for title, vid in (("Intel", "8086"), ("NVIDIA", "10de"), ("AMD", "1002")):
        assert f"{title} [{vid}:" in pci
