"""The kubelet's DRA manager for pods (kubernetes v1.37.2 pkg/kubelet/cm/dra/manager.go):

- prepare (prepareResources): every claim of the pod is read from the API server; the
  drivers of its allocation results say which plugins must prepare it; claims already
  prepared for another pod are not prepared again; then ONE NodePrepareResources call per
  driver carries all of the pod's claims for that driver. The pod fails when a driver is
  not registered, the call fails, any claim comes back with an error, an answer names a
  claim that was not asked for, or a claim gets no answer.
- unprepare (unprepareResources): a claim still used by another pod only loses this pod's
  reference; the others go in ONE NodeUnprepareResources call per driver, from what the
  kubelet recorded at prepare time (no API read: the claim may be gone).
Left out: the pod spec itself (a pod is its UID, namespace and claim names), reservedFor
and owner checks, the checkpoint, and skipped node operations.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fakes.kubelet import Plugin
    from fakes.kubelet_slices import KubeApi

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"


@dataclass(frozen=True)
class Claim:
    """A claim as the kubelet names it to a plugin."""

    namespace: str
    uid: str
    name: str


class PodFailed(AssertionError):
    """What makes the kubelet fail a pod's prepare or unprepare; the message says why."""


@dataclass
class ClaimInfo:
    """The kubelet's claim info cache entry of one claim."""

    claim: Claim
    drivers: tuple[str, ...]  # of its allocation results, in order of first appearance
    pods: set[str] = field(default_factory=set)
    prepared: bool = False


class PodClaims:
    """Prepare and unprepare pods' claims as the kubelet's DRA manager batches them."""

    def __init__(self, api: KubeApi, plugin_for: Callable[[str], Plugin]) -> None:
        self.api = api
        self.plugin_for = plugin_for  # GetPlugin: raises PodFailed when not registered
        self.cache: dict[tuple[str, str], ClaimInfo] = {}  # (namespace, name)

    def prepare(self, pod: str, namespace: str, claim_names: Sequence[str]) -> dict[str, Any]:
        """The NodePrepareResources answer of each driver called, by driver name."""
        # Validation pass first, without touching the cache (as the kubelet does).
        infos: list[ClaimInfo] = []
        for name in claim_names:
            path = CLAIMS.format(ns=urllib.parse.quote(namespace), name=urllib.parse.quote(name))
            try:
                obj = self.api.request("GET", path)
            except OSError as exc:
                raise PodFailed(f"fetch ResourceClaim {name}: {exc}") from None
            results = ((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}
            drivers = tuple(dict.fromkeys(r["driver"] for r in results.get("results") or []))
            for driver in drivers:
                self.plugin_for(driver)
            ref = Claim(namespace, obj["metadata"]["uid"], name)
            infos.append(ClaimInfo(ref, drivers))
        batches: dict[str, list[Claim]] = {}
        for info in infos:
            key = (namespace, info.claim.name)
            cached = self.cache.setdefault(key, info)
            if cached.claim.uid != info.claim.uid:
                raise PodFailed(
                    f"old ResourceClaim with same name {info.claim.name} and different UID "
                    f"{cached.claim.uid} still exists"
                )
            cached.pods.add(pod)
            if cached.prepared:
                continue
            for driver in cached.drivers:
                batches.setdefault(driver, []).append(cached.claim)
        answers: dict[str, Any] = {}
        for driver, claims in batches.items():
            resp = self.plugin_for(driver).prepare(claims)
            _check(resp, claims, "NodePrepareResources")
            answers[driver] = resp
        for info in infos:
            self.cache[(namespace, info.claim.name)].prepared = True
        return answers

    def unprepare(self, pod: str, namespace: str, claim_names: Sequence[str]) -> dict[str, Any]:
        """The NodeUnprepareResources answer of each driver called, by driver name."""
        batches: dict[str, list[Claim]] = {}
        done: list[tuple[str, str]] = []
        for name in claim_names:
            info = self.cache.get((namespace, name))
            if info is None or pod not in info.pods:
                continue  # never prepared for this pod: nothing to undo
            if len(info.pods) > 1:
                info.pods.discard(pod)
                continue
            done.append((namespace, name))
            for driver in info.drivers:
                batches.setdefault(driver, []).append(info.claim)
        answers: dict[str, Any] = {}
        for driver, claims in batches.items():
            resp = self.plugin_for(driver).unprepare(claims)
            _check(resp, claims, "NodeUnprepareResources")
            answers[driver] = resp
        for key in done:
            del self.cache[key]
        return answers


def _check(resp: Any, claims: Sequence[Claim], call: str) -> None:
    asked = {c.uid: c for c in claims}
    for uid, result in resp.claims.items():
        if uid not in asked:
            raise PodFailed(f"{call} returned result for unknown claim UID {uid}")
        if result.error:
            raise PodFailed(f"{call} failed for ResourceClaim {asked[uid].name}: {result.error}")
    if len(resp.claims) != len(claims):
        raise PodFailed(f"{call} skipped {len(claims) - len(resp.claims)} ResourceClaims")
