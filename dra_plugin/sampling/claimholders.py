"""Which prepared claim holds which device, and the pods the claim is reserved for.

Read in the telemetry sampler's background pass, never on the scrape path:
- the claims come from each driver's checkpoint (read-only, cached by the file's
  identity, so an unchanged checkpoint costs one stat);
- the pods come from the claim's `status.reservedFor`, fetched through the API once per
  claim UID and refreshed rarely. An API failure leaves the pod empty (and is retried
  later); it never fails a sample.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import COMPLETED, CheckpointError
from dra_plugin.telemetry.catalogue import ClaimHolder

log = logging.getLogger(__name__)

FetchClaim = Callable[[str, str], Awaitable[Mapping[str, Any]]]

REFRESH_SECONDS = 300.0  # reservedFor rarely changes after preparation
RETRY_SECONDS = 60.0  # after an API failure


@dataclass(frozen=True)
class _Prepared:
    driver: str
    device: str
    namespace: str
    name: str
    uid: str


@dataclass
class _Pods:
    names: tuple[str, ...]
    fetched_at: float
    ok: bool


def reserved_pods(claim: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the pods in `status.reservedFor` (the consumers a claim serves)."""
    status = claim.get("status") or {}
    pods = []
    for ref in status.get("reservedFor") or ():
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and ref.get("name"):
            pods.append(str(ref["name"]))
    return tuple(sorted(pods))


class ClaimHolders:
    def __init__(
        self,
        state_dirs: Mapping[str, Path],
        fetch_claim: FetchClaim,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._checkpoints = {d: Checkpoint(path, d) for d, path in state_dirs.items()}
        self._fetch = fetch_claim
        self._clock = clock
        self._pods: dict[str, _Pods] = {}

    def _prepared(self) -> list[_Prepared]:
        out = []
        for driver, checkpoint in self._checkpoints.items():
            try:
                state = checkpoint.read()
            except (CheckpointError, OSError) as exc:  # the preparer deals with it; skip
                log.debug("telemetry: checkpoint unreadable driver=%s error=%s", driver, exc)
                continue
            if state is None:
                continue
            for rec in state.claims.values():
                if rec.state != COMPLETED:
                    continue
                for dev in rec.devices:
                    out.append(_Prepared(driver, dev.device, rec.namespace, rec.name, rec.uid))
        # A claim holding several shares (or requests) of one device is one row.
        return list(dict.fromkeys(out))

    async def holders(self) -> tuple[ClaimHolder, ...]:
        prepared = await asyncio.to_thread(self._prepared)
        live = {p.uid for p in prepared}
        for uid in [u for u in self._pods if u not in live]:
            del self._pods[uid]  # unprepared: forget its pods
        out: list[ClaimHolder] = []
        for p in prepared:
            pods = await self._pods_of(p)
            for pod in pods or ("",):
                out.append(ClaimHolder(p.driver, p.device, p.namespace, p.name, p.uid, pod))
        return tuple(out)

    async def _pods_of(self, p: _Prepared) -> tuple[str, ...]:
        now = self._clock()
        cached = self._pods.get(p.uid)
        if cached is not None:
            age = now - cached.fetched_at
            if age < (REFRESH_SECONDS if cached.ok else RETRY_SECONDS):
                return cached.names
        try:
            claim = await self._fetch(p.namespace, p.name)
        except Exception as exc:  # noqa: BLE001 - any API failure only costs the pod label
            log.debug(
                "telemetry: claim %s/%s (uid %s): cannot read reservedFor: %s",
                p.namespace,
                p.name,
                p.uid,
                exc,
            )
            names = cached.names if cached is not None else ()
            self._pods[p.uid] = _Pods(names, now, ok=False)
            return names
        meta = claim.get("metadata") or {}
        names = reserved_pods(claim) if meta.get("uid") == p.uid else ()  # replaced claim
        self._pods[p.uid] = _Pods(names, now, ok=True)
        return names
