"""The claim context the vendor hooks receive (vendors/claimcontext.py), built here from the
claim the prepare read from the API, or from the record where the API is not asked.

Opaque configs: `status.allocation.devices.config` holds the class's and the claim's
configs, copied by the scheduler, each naming the driver it is for and the requests it
applies to. Only those addressed to this driver are kept, class configs first, then
claim configs, each in the order written: the order of precedence of the DRA example
driver and of the vendors' own DRA drivers (the last that applies wins). Configs for
other drivers are skipped (a request may be satisfiable by several drivers). A config
addressed to this driver that it does not understand is the claim's error (the stricter
of the vendors' own drivers does the same; docs/architecture.md, "Opaque configs").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.snapshot import ClaimRecord
from dra_plugin.claims.allocation import Chosen, ClaimError, malformed
from dra_plugin.devices import Device
from dra_plugin.vendors.claimcontext import (
    AllocatedDevice,
    ClaimContext,
    ConfigSource,
    OpaqueConfig,
)

_SOURCES = {s.value: s for s in ConfigSource}


def _requests(who: str, claim: Mapping[str, Any]) -> tuple[str, ...]:
    """spec.devices.requests[].name; the API validated them, so odd entries are skipped."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    reqs = devices.get("requests") if isinstance(devices, Mapping) else None
    if not isinstance(reqs, list):
        return ()
    return tuple(
        r["name"] for r in reqs if isinstance(r, Mapping) and isinstance(r.get("name"), str)
    )


def _configs(who: str, claim: Mapping[str, Any], driver: str) -> tuple[OpaqueConfig, ...]:
    alloc = claim["status"]["allocation"]  # allocation_results checked these are objects
    raw = (alloc.get("devices") or {}).get("config")
    if raw is None:
        return ()
    base = "status.allocation.devices.config"
    if not isinstance(raw, list):
        raise malformed(who, base, raw, "a list")
    by_source: dict[ConfigSource, list[OpaqueConfig]] = {s: [] for s in ConfigSource}
    for i, c in enumerate(raw):
        path = f"{base}[{i}]"
        if not isinstance(c, Mapping):
            raise malformed(who, path, c, "an object")
        source = _SOURCES.get(c.get("source"))  # type: ignore[arg-type]
        if source is None:
            raise malformed(who, f"{path}.source", c.get("source"), "FromClass or FromClaim")
        requests = c.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise malformed(who, f"{path}.requests", requests, "a list of strings")
        opaque = c.get("opaque")
        if not isinstance(opaque, Mapping):  # the only kind of config the API has today
            raise malformed(who, f"{path}.opaque", opaque, "an object")
        if not isinstance(opaque.get("driver"), str):
            raise malformed(who, f"{path}.opaque.driver", opaque.get("driver"), "a string")
        if opaque["driver"] != driver:
            continue
        params = opaque.get("parameters")
        if not isinstance(params, Mapping):
            raise malformed(who, f"{path}.opaque.parameters", params, "an object")
        api_version, kind = params.get("apiVersion", ""), params.get("kind", "")
        if not isinstance(api_version, str):
            raise malformed(who, f"{path}.opaque.parameters.apiVersion", api_version, "a string")
        if not isinstance(kind, str):
            raise malformed(who, f"{path}.opaque.parameters.kind", kind, "a string")
        by_source[source].append(
            OpaqueConfig(i, source, tuple(requests), api_version, kind, params)
        )
    return (*by_source[ConfigSource.FROM_CLASS], *by_source[ConfigSource.FROM_CLAIM])


def from_api(
    who: str, claim: Mapping[str, Any], driver: str, chosen: Sequence[Chosen]
) -> ClaimContext:
    """The context of a claim read from the API (`claim` already checked by
    allocation.select, `chosen` its results of this driver); ClaimError names a bad field."""
    meta = claim["metadata"]
    devices = []
    for c in chosen:
        consumed = c.result.get("consumedCapacity") or {}
        devices.append(
            AllocatedDevice(
                device=c.device.name,
                request=str(c.result.get("request", "")),
                share_id=c.share_id,
                consumed={str(k): str(v) for k, v in consumed.items()},
                admin_access=c.admin,
            )
        )
    return ClaimContext(
        uid=str(meta["uid"]),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        requests=_requests(who, claim),
        devices=tuple(devices),
        configs=_configs(who, claim, driver),
    )


def refuse_unknown(
    who: str, ctx: ClaimContext, driver: str, understood: Collection[tuple[str, str]]
) -> None:
    """ClaimError for the first opaque config addressed to `driver` that it does not
    understand: ignoring it would prepare the claim without what its author asked for."""
    for c in ctx.configs:
        if (c.api_version, c.kind) not in understood:
            known = ", ".join(f"{a} {k}" for a, k in sorted(understood)) or "none"
            raise ClaimError(
                f"{who}: {c} addressed to driver {driver} is not understood by this driver "
                f"(it understands: {known}); the claim was not prepared"
            )


def from_record(rec: ClaimRecord) -> ClaimContext:
    """The context of a claim as the record keeps it (no API read: no configs)."""
    return ClaimContext(
        uid=rec.uid,
        namespace=rec.namespace,
        name=rec.name,
        devices=tuple(
            AllocatedDevice(
                device=d.device,
                request=d.request_names[0] if d.request_names else "",
                share_id=d.share_id,
                admin_access=d.admin_access,
                vendor=d.vendor,
            )
            for d in rec.devices
        ),
        from_record=True,
    )


def with_record(ctx: ClaimContext, rec: ClaimRecord) -> ClaimContext:
    """The API's context with the vendor entries the record keeps for its devices."""
    return ctx.with_vendor({d.device: d.vendor for d in rec.devices if d.vendor is not None})


class PassContexts:
    """The claims of one prepare pass as read from the API (their hooks see the configs);
    any other claim as the record keeps it. Called with a record: its context, carrying
    the record's vendor entries."""

    def __init__(self) -> None:
        self._api: dict[str, ClaimContext] = {}

    def add(self, ctx: ClaimContext) -> None:
        self._api[ctx.uid] = ctx

    def clear(self) -> None:
        self._api.clear()

    def __call__(self, rec: ClaimRecord) -> ClaimContext:
        api = self._api.get(rec.uid)
        return from_record(rec) if api is None else with_record(api, rec)


def node_edits(devices: Sequence[Device], claim: ClaimContext) -> cdi.ClaimEdits:
    """The default spec edits: the devices' nodes (vendors.base.Driver.claim_edits)."""
    return cdi.device_node_edits(devices)
