"""The chart lints, renders for every value set, and every object is valid Kubernetes."""

from __future__ import annotations

import json

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from .rendering import (
    CHART,
    NAMESPACE,
    VALUE_SETS,
    Manifest,
    all_of,
    chart_values,
    only,
    render,
    run_helm,
    template_args,
    values_args,
)

# The oldest version the chart supports (kubeVersion >=1.34), the one in the field (1.35)
# and the newest kubernetes-validate knows.
SCHEMA_VERSIONS = ("1.34.0", "1.35.0", "1.37.0")


def test_kubernetes_validate_knows_the_versions() -> None:
    known = kubernetes_validate.utils.all_versions()
    for version in SCHEMA_VERSIONS:
        assert version in known
    # resource.k8s.io/v1 and admissionregistration.k8s.io/v1 policies have schemas there.
    for api, kind in (
        ("resource.k8s.io/v1", "DeviceClass"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
    ):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(
                {"apiVersion": api, "kind": kind, "bogus": 1}, "1.35.0", strict=True
            )


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda v: v or "defaults")
def test_helm_lint_strict(values: str | None) -> None:
    proc = run_helm(
        "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *values_args(values), check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_object_validates_strictly(rendered: list[Manifest]) -> None:
    assert rendered
    for manifest in rendered:
        for version in SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(manifest, version, strict=True)
            except (
                kubernetes_validate.ValidationError,
                kubernetes_validate.SchemaNotFoundError,
            ) as err:
                name = f"{manifest['kind']}/{manifest['metadata']['name']}"
                pytest.fail(f"{name} is invalid at {version}: {err.message}")


def test_chart_objects(value_set: str | None, rendered: list[Manifest]) -> None:
    values = chart_values(value_set)
    kinds = sorted(m["kind"] for m in rendered)
    expected = ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"]
    if values["namespace"]["create"]:
        expected.append("Namespace")
    if values["nvidia"]["enabled"] and values["nvidia"].get("mps", {}).get("enabled"):
        expected += ["Role", "RoleBinding"]  # MPS control daemons in our namespace
    if values["admissionPolicy"]["enabled"]:
        # One for ResourceSlice writes, one for ResourceClaim status writes.
        expected += ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2
    if values["metrics"]["service"]["enabled"]:
        expected.append("Service")
    if values["metrics"]["networkPolicy"]["enabled"]:
        expected.append("NetworkPolicy")
    for vendor in ("intel", "nvidia", "amd"):
        if values[vendor]["enabled"] and values[vendor]["deviceClass"]["create"]:
            expected.append("DeviceClass")
    intel = values["intel"]
    if intel["enabled"] and intel["vfio"]["enabled"] and intel["vfio"]["deviceClass"]["create"]:
        expected.append("DeviceClass")  # gpu-vfio.intel.com
    if values["nvidia"]["enabled"]:  # NVIDIA's MIG and VFIO classes
        for key in ("migDeviceClass", "vfioDeviceClass"):
            expected += ["DeviceClass"] if values["nvidia"][key]["create"] else []
    assert kinds == sorted(expected)
    for manifest in rendered:
        if manifest["kind"] in ("DaemonSet", "ServiceAccount"):
            assert manifest["metadata"]["namespace"] == NAMESPACE


def test_device_classes_select_their_driver(
    value_set: str | None, rendered: list[Manifest]
) -> None:
    values = chart_values(value_set)
    classes = {m["metadata"]["name"]: m for m in all_of(rendered, "DeviceClass")}
    nv = values["nvidia"]
    for key, device_type in (("migDeviceClass", "mig"), ("vfioDeviceClass", "vfio")):
        if nv["enabled"] and nv[key]["create"]:
            d = nv["driverName"]
            assert classes.pop(nv[key]["name"])["spec"]["selectors"] == [
                {"cel": {"expression": f"device.driver == '{d}' && "
                         f"device.attributes['{d}'].type == '{device_type}'"}}
            ]  # fmt: skip
    for vendor in ("intel", "nvidia", "amd"):
        v = values[vendor]
        if not (v["enabled"] and v["deviceClass"]["create"]):
            continue
        dc = classes.pop(v["deviceClass"]["name"] or v["driverName"])
        assert dc["apiVersion"] == "resource.k8s.io/v1"
        selectors = [s["cel"]["expression"] for s in dc["spec"]["selectors"]]
        expression = f'device.driver == "{v["driverName"]}"'
        if vendor == "nvidia":  # NVIDIA's chart: whole GPUs only; MIG and VFIO have their own
            d = v["driverName"]
            expression = f"device.driver == '{d}' && device.attributes['{d}'].type == 'gpu'"
        assert selectors[0] == expression
        vfio = v.get("vfio", {}).get("enabled", False)
        if vfio:  # VFIO-bound GPUs only through the passthrough class (test_intel_classes)
            assert selectors[1:] == [
                f'!(device.attributes["{v["driverName"]}"].driver in ["vfio-pci", "xe-vfio-pci"])'
            ]
            if v["vfio"]["deviceClass"]["create"]:
                classes.pop(v["vfio"]["deviceClass"]["name"] or "gpu-vfio.intel.com")
        else:
            assert selectors[1:] == []
        # Off unless asked for: the API server would map pods' extended resources to it.
        extended = v["deviceClass"].get("extendedResourceName")
        assert dc["spec"].get("extendedResourceName") == (extended or None)
    assert not classes


def test_extended_resource_names() -> None:
    """KEP-5004: pods written for the device plugins get these classes' devices."""
    classes = {
        m["metadata"]["name"]: m for m in all_of(render("extended-resources.yaml"), "DeviceClass")
    }
    assert classes["gpu.intel.com"]["spec"]["extendedResourceName"] == "gpu.intel.com/i915"
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert all("extendedResourceName" not in m["spec"] for m in all_of(render(None), "DeviceClass"))
    # The field is in every schema the chart is validated against.
    for version in SCHEMA_VERSIONS:
        dc = dict(classes["gpu.intel.com"])
        kubernetes_validate.validate(dc, version, strict=True)
        dc["spec"] = {**dc["spec"], "extendedResourceNames": "x/y"}
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(dc, version, strict=True)
    # The API server's format rules, enforced before anything reaches it.
    for bad in ("i915", "gpu.intel.com/", "Gpu.Intel.com/i915", "gpu.intel.com/-i915"):
        proc = run_helm(
            *template_args(None, "--set", f"intel.deviceClass.extendedResourceName={bad}"),
            check=False,
        )
        assert proc.returncode != 0, f"{bad!r} was accepted"
    for sets, message in {
        "intel.deviceClass.extendedResourceName=requests.example.com/gpu": "requests.",
        "intel.deviceClass.extendedResourceName=kubernetes.io/gpu": "kubernetes.io domain",
        "intel.deviceClass.extendedResourceName=example.com/gpu,"
        "nvidia.deviceClass.extendedResourceName=example.com/gpu": "must be unique",
    }.items():
        proc = run_helm(*template_args(None, "--set", sets), check=False)
        assert proc.returncode != 0 and message in proc.stderr, (sets, proc.stderr)


def test_namespace_is_privileged_when_created() -> None:
    ns = only(render("namespace-create.yaml"), "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    labels = ns["metadata"]["labels"]
    # The user's labels are kept, but cannot lower the Pod Security level.
    assert labels["team"] == "gpu"
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_daemonset_basics(value_set: str | None, rendered: list[Manifest]) -> None:
    values = chart_values(value_set)
    ds = only(rendered, "DaemonSet")
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["terminationGracePeriodSeconds"] == values["terminationGracePeriodSeconds"]
    assert pod["serviceAccountName"] == only(rendered, "ServiceAccount")["metadata"]["name"]
    # No Node Feature Discovery needed by default.
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    keys = {t["key"] for t in pod["tolerations"]}
    assert {"nvidia.com/gpu", "gpu.intel.com", "node-role.kubernetes.io/control-plane"} <= keys
    (container,) = pod["containers"]
    assert container["args"] == ["run"]
    port = values["metrics"]["port"]
    assert container["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["METRICS_PORT"]["value"] == str(port)
    assert container["resources"]["requests"] and container["resources"]["limits"]
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()


def test_security_context(value_set: str | None, rendered: list[Manifest]) -> None:
    values = chart_values(value_set)
    want = values["securityContext"]["privileged"]
    privileged = values["nvidia"]["enabled"] if want == "auto" else want
    (container,) = only(rendered, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    sc = container["securityContext"]
    assert sc["runAsUser"] == 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["privileged"] is privileged
    if not privileged:
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_intel_only_is_unprivileged() -> None:
    (container,) = only(render("intel-only.yaml"), "DaemonSet")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["securityContext"]["privileged"] is False


def test_schema_rejects_unknown_and_bad_values() -> None:
    for bad in (
        "bogus=1",
        "nvidia.bogus=1",
        "cdi.root=relative/dir",
        "nvidia.cdiStrategy=magic",
        "intel.driverName=Not_A_DNS_Name",
        "health.taintEffect=Sometimes",
        "metrics.port=0",
        "hostRoot.mount=sometimes",
    ):
        proc = run_helm(*template_args(None, "--set", bad), check=False)
        assert proc.returncode != 0, f"--set {bad} was accepted"


def test_template_refuses_impossible_combinations() -> None:
    cases = {
        "intel.enabled=false,nvidia.enabled=false": "enable at least one vendor",
        "nvidia.driverName=gpu.intel.com": "must differ",
        "amd.enabled=true,amd.driverName=gpu.nvidia.com": (
            'nvidia.driverName and amd.driverName must differ (both "gpu.nvidia.com")'
        ),
        "shutdownGraceSeconds=30": "below terminationGracePeriodSeconds",
        "hostRoot.mount=false": "hostRoot.mount must not be false",
    }
    for sets, message in cases.items():
        proc = run_helm(*template_args(None, "--set", sets), check=False)
        assert proc.returncode != 0 and message in proc.stderr, (sets, proc.stderr)


def test_amd_alone_is_a_valid_install() -> None:
    sets = "intel.enabled=false,nvidia.enabled=false,amd.enabled=true"
    proc = run_helm(*template_args(None, "--set", sets), check=False)
    assert proc.returncode == 0, proc.stderr
    ds = next(d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert {"name": "VENDORS", "value": "amd"} in container["env"]


def test_kube_version_constraint() -> None:
    args = [a for a in template_args(None) if a != "1.35.0"]
    args[args.index("--kube-version") + 1 : args.index("--kube-version") + 1] = ["1.33.5"]
    proc = run_helm(*args, check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr


def test_every_value_is_commented() -> None:
    """Each key in values.yaml has a comment right above it, or sits in a data block (a
    commented key whose value is a list or map without comments, e.g. tolerations), or is
    a section whose keys are commented one by one."""
    lines = (CHART / "values.yaml").read_text().splitlines()

    def indent(i: int) -> int:
        return len(lines[i]) - len(lines[i].lstrip(" -"))

    def block(i: int) -> list[int]:
        out = []
        for j in range(i + 1, len(lines)):
            if lines[j].strip() and indent(j) <= indent(i):
                break
            out.append(j)
        return out

    def is_key(i: int) -> bool:
        text = lines[i].strip()
        return bool(text) and not text.startswith("#") and ":" in text.split(" #")[0]

    def commented(i: int) -> bool:
        return i > 0 and lines[i - 1].strip().startswith("#")

    def has_comments(i: int) -> bool:
        return any(lines[j].strip().startswith("#") for j in block(i))

    def ancestors(i: int) -> list[int]:
        out, level = [], indent(i)
        for j in range(i - 1, -1, -1):
            if is_key(j) and indent(j) < level:
                out.append(j)
                level = indent(j)
        return out

    missing = [
        f"line {i + 1}: {lines[i].strip()}"
        for i in range(len(lines))
        if is_key(i)
        and not has_comments(i)
        and not commented(i)
        and not any(commented(a) and not has_comments(a) for a in ancestors(i))
    ]
    assert not missing, "uncommented values: " + "; ".join(missing)


def test_schema_is_strict() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(schema["properties"])
