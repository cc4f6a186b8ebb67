"""The README and docs/ stay true: the commands are the ones CI runs, the configuration
table covers every flag, the Kubernetes version is the chart's, and the containerd snippet
is the one doctor prints and the Talos example applies."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from dra_plugin import config
from dra_plugin.config import all_options
from dra_plugin.doctor import cdiroot
from dra_plugin.findings.findings import Status
from dra_plugin.kubeapi.discovery import RESOURCE_VERSIONS
from dra_plugin.vendors import registry
from fakes.hostroot import host_root

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CRI = "io.containerd.cri.v1.runtime"


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^bash \.ci/setup --tests && (\.venv/bin/python -m pytest[^\n]*)$", README, re.M)
    assert m, "README must show the test command"
    assert "bash .ci/setup --tests\n" in ci and m.group(1) in ci.splitlines()


def test_readme_demo_command_sets_up_only_what_the_demo_needs() -> None:
    """The demo's setup is the light one: no test tools (podman, helm, linters)."""
    assert re.search(r"^bash \.ci/setup && \.venv/bin/python -m demo$", README, re.M)


def test_readme_names_the_dockerfiles_default_base() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    m = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M)
    assert m, "the Dockerfile has a default BASE_IMAGE"
    base = m.group(1)
    for text in (README, dockerfile, (ROOT / "docs" / "configuration.md").read_text()):
        named = set(re.findall(r"\bpython:[0-9][\w.-]*", text))
        assert named == {base}, named


def test_configuration_documents_every_flag_and_env() -> None:
    """One row per option, the flag beside its own environment twin."""
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for flag, env in all_options().items():
        assert f"| `{flag}` | `{env}` |" in doc, flag


def test_configuration_chart_values_exist() -> None:
    """Every chart value the table names is a key of values.yaml."""
    values = yaml.safe_load((ROOT / "charts" / "dra-plugin" / "values.yaml").read_text())
    doc = (ROOT / "docs" / "configuration.md").read_text()
    rows = [line.split(" | ") for line in doc.splitlines() if line.startswith("| `--")]
    assert len(rows) == len(all_options())
    named = [v for row in rows for v in re.findall(r"`([a-z][A-Za-z]*(?:\.[A-Za-z]+)*)`", row[3])]
    assert "cdi.root" in named and "extraEnv" in named
    for dotted in named:
        node = values
        for key in dotted.split("."):
            assert isinstance(node, dict) and key in node, f"{dotted} is not a chart value"
            node = node[key]


def test_kubernetes_version_is_the_charts() -> None:
    """One minimum version in the README, the chart's kubeVersion; the fallback versions it
    names are the ones the client tries."""
    chart = yaml.safe_load((ROOT / "charts" / "dra-plugin" / "Chart.yaml").read_text())
    m = re.fullmatch(r">=(\d+)\.(\d+)\.0-0", chart["kubeVersion"])
    assert m, chart["kubeVersion"]
    stated = set(re.findall(r"Kubernetes (\d+\.\d+)\+", README))
    assert stated == {f"{m[1]}.{m[2]}"}, stated
    assert f"**Kubernetes {m[1]}.{m[2]}+** (`resource.k8s.io/{RESOURCE_VERSIONS[0]}`)" in README
    statement = README.split(f"**Kubernetes {m[1]}.{m[2]}+**", 1)[1].split("\n\n", 1)[0]
    assert " and ".join(RESOURCE_VERSIONS[1:]) in statement


def _cdi_dirs_of(toml_text: str) -> list[str]:
    dirs = tomllib.loads(toml_text)["plugins"][CRI]["cdi_spec_dirs"]
    assert isinstance(dirs, list)
    return dirs


def test_one_containerd_snippet_the_example_and_doctor_agree(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", README, re.S)
    assert len(blocks) == 1, "the README has one containerd snippet"
    snippet = "\n".join(line.strip() for line in blocks[0].splitlines()) + "\n"
    readme_dirs = _cdi_dirs_of(snippet)

    example = yaml.safe_load((ROOT / "examples" / "talos-cdi-containerd-patch.yaml").read_text())
    (drop_in,) = example["machine"]["files"]
    assert _cdi_dirs_of(drop_in["content"]) == readme_dirs

    # What the plugin and doctor print on a Talos 1.13+ node with the default CDI root.
    with host_root(tmp_path / "host") as host:
        host.talos_113()
        cfg = config.parse(["doctor"], {"HOST_ROOT": str(host.root)})
        finding = cdiroot.check_cdi_root_listed(cfg)
    assert finding is not None and finding.status is Status.FAIL
    (fix,) = yaml.safe_load(finding.detail)["machine"]["files"]
    assert fix == drop_in
    assert str(cfg.cdi_root) in readme_dirs


def test_readme_links_every_doc() -> None:
    linked = set(re.findall(r"\]\((docs/[a-z-]+\.md)(?:#[a-z-]+)?\)", README))
    on_disk = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert linked == on_disk


def test_every_helm_install_goes_to_a_privileged_namespace() -> None:
    """The plugin uses hostPath volumes: each documented install names a namespace that the
    same text labels for the privileged Pod Security level (or lets the chart make it)."""
    docs = {"README.md": README}
    docs |= {f"docs/{p.name}": p.read_text() for p in (ROOT / "docs").glob("*.md")}
    checked = 0
    for name, text in docs.items():
        for m in re.finditer(r"helm install \S+ charts/dra-plugin([^`]*?)(?:```|`)", text, re.S):
            ns = re.search(r"-n (\S+)", m.group(1))
            assert ns, f"{name}: `helm install{m.group(1)[:60]}` names no namespace"
            before = text[: m.start()]
            label = f"kubectl label namespace {ns[1]} pod-security.kubernetes.io/enforce=privileged"
            assert label in before or "namespace.create=true" in m.group(1), (name, ns[1])
            checked += 1
    assert checked >= 4  # README and the three migrations


def test_descriptions_name_every_vendor() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "dra-plugin" / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for description in (chart["description"], project["description"]):
        for vendor in registry.VENDORS:
            assert vendor.title in description, (vendor.title, description)
