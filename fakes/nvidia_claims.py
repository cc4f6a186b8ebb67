"""Claims written for NVIDIA's DRA driver, as the API returns them once allocated: the
ResourceClaim(Template) of a manifest (tests/fixtures/nvidia_configs/) with each request
given a device, and its configs copied into the allocation as the scheduler copies them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fakes.claim_harness import NODE, claim

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nvidia_configs"
DRIVER = "gpu.nvidia.com"


def manifest_spec(name: str) -> dict[str, Any]:
    """The `spec` of the claim (or the claim spec of the template) in a fixture."""
    for doc in yaml.safe_load_all((FIXTURES / name).read_text()):
        if doc and doc.get("kind") == "ResourceClaimTemplate":
            spec: dict[str, Any] = doc["spec"]["spec"]
            return spec
        if doc and doc.get("kind") == "ResourceClaim":
            spec = doc["spec"]
            return spec
    raise AssertionError(f"no claim in {name}")


def container_requests(name: str) -> dict[str, list[str]]:
    """Container name -> the claim requests it is given, from the fixture's Pod (a claim
    entry naming no request gives it every request of the claim)."""
    docs = [d for d in yaml.safe_load_all((FIXTURES / name).read_text()) if d]
    (pod,) = [d for d in docs if d.get("kind") == "Pod"]
    every = [r["name"] for r in manifest_spec(name)["devices"]["requests"]]
    out: dict[str, list[str]] = {}
    for c in pod["spec"]["containers"]:
        claims = (c.get("resources") or {}).get("claims") or []
        out[c["name"]] = [r for e in claims for r in ([e["request"]] if "request" in e else every)]
    return out


def allocated(
    i: int,
    spec: dict[str, Any],
    devices: dict[str, str],
    *,
    class_configs: list[dict[str, Any]] | None = None,
    share_ids: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Claim number `i` with `spec`, each request given the device `devices` names."""
    results = []
    for req in spec["devices"]["requests"]:
        r = {"request": req["name"], "driver": DRIVER, "pool": NODE}
        r["device"] = devices[req["name"]]
        if share_ids and req["name"] in share_ids:
            r["shareID"] = share_ids[req["name"]]
        results.append(r)
    obj = claim(i, results)
    obj["spec"] = spec
    config = [{"source": "FromClass", **c} for c in class_configs or []]
    config += [{"source": "FromClaim", **c} for c in spec["devices"].get("config") or []]
    if config:
        obj["status"]["allocation"]["devices"]["config"] = config
    return obj
