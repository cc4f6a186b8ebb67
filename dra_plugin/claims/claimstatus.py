"""ResourceClaim device status (KEP-4817): tell the cluster what each prepared device is.

`ClaimStatusReporter` wraps one driver's ClaimHandler (the same Protocol, so the gRPC
servicers cannot tell the difference). After a prepare has answered, it writes one
`status.devices` entry per prepared device of ours: driver, pool, device, shareID where
set, a `Ready` condition, and `data` with the device's identity (PCI bus ID, UUID,
model), so `kubectl get resourceclaim -o yaml` shows which GPU a pod got. A share of a
device also gets a `ShareLimits` condition where its vendor says whether anything on the
node holds it to what it consumed (vendors.base.Driver.share_condition): an accounting-only
share is said to be one, not left silent.

The write runs in the background, when no prepare is running (see PrepareActivity), and
never changes the kubelet's answer: a failure
(RBAC, an old API server, a claim gone meanwhile) is logged and counted
(`dra_plugin_claim_errors_total{operation="status"}`) and the prepare still succeeds.
It is a server-side apply with the driver name as field manager (see
`KubeAPI.apply_claim_device_status`), so other drivers' entries are kept. A claim whose
entries were already written by this process is not written again; unprepare writes
nothing (the API server drops the entries itself when the claim is deallocated, and
unprepare must work without the API).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from dra_plugin.claims.claims import (
    ClaimHandler,
    ClaimRef,
    Outcome,
    Prepared,
    PreparedDevice,
    Unprepared,
    UnprepareOutcome,
)
from dra_plugin.devices import PCI_BUS_ID, Device
from dra_plugin.kubeapi import ApiError
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.claimcontext import ShareCondition, VendorEntry

log = logging.getLogger(__name__)
QUIET_SECONDS = 0.05  # how long no prepare must run before status writes start

WRITE_CONCURRENCY = 2  # each write holds a worker thread; prepare needs them more
READY_REASON = "Prepared"
SHARE_LIMITS = "ShareLimits"  # the condition a share gets: its consumed capacity enforced?
Entry = dict[str, Any]
ShareConditions = Callable[[Device, VendorEntry | None], ShareCondition | None]


def _no_share_condition(device: Device, vendor: VendorEntry | None) -> ShareCondition | None:
    return None


class StatusAPI(Protocol):
    """What the reporter needs from KubeAPI."""

    def apply_claim_device_status(
        self, namespace: str, name: str, uid: str, devices: list[Entry], *, field_manager: str
    ) -> Awaitable[Mapping[str, Any]]: ...


def device_data(device: Device | None) -> dict[str, str]:
    """The identity of a device as `status.devices[].data`: what an operator looks for."""
    if device is None:
        return {}
    attrs = device.attrs
    out: dict[str, str] = {}
    bus_id = attrs.get(PCI_BUS_ID) or device.pci_address
    if isinstance(bus_id, str) and bus_id:
        out["pciBusID"] = bus_id
    if device.uuid:
        out["uuid"] = device.uuid
    model = attrs.get("model") or attrs.get("productName")
    if isinstance(model, str) and model:
        out["model"] = model
    return out


def status_entries(
    driver: str,
    prepared: Sequence[PreparedDevice],
    devices: Mapping[str, Device],
    now: str,
    share_condition: ShareConditions = _no_share_condition,
) -> list[Entry]:
    """One entry per prepared (pool, device, shareID), in the order prepared.

    Pure. Entries are keyed like the API's map-list (driver, pool, device, shareID); a
    device listed under several requests gets one entry.
    """
    out: dict[tuple[str, str, str | None], Entry] = {}
    for d in prepared:
        key = (d.pool_name, d.device_name, d.share_id)
        if key in out:
            continue
        entry: Entry = {"driver": driver, "pool": d.pool_name, "device": d.device_name}
        if d.share_id:
            entry["shareID"] = d.share_id
        entry["conditions"] = [
            {
                "type": "Ready",
                "status": "True",
                "reason": READY_REASON,
                "message": "CDI spec written; the device is ready for the pod's containers",
                "lastTransitionTime": now,
            }
        ]
        device = devices.get(d.device_name)
        said = share_condition(device, d.vendor) if d.share_id and device is not None else None
        if said is not None:
            entry["conditions"].append(
                {
                    "type": SHARE_LIMITS,
                    "status": "True" if said.enforced else "False",
                    "reason": said.reason,
                    "message": said.message,
                    "lastTransitionTime": now,
                }
            )
        data = device_data(device)
        if data:
            entry["data"] = data
        out[key] = entry
    return list(out.values())


def _without_times(entries: list[Entry]) -> list[Entry]:
    """Entries minus the condition timestamps, to tell a real change from a repeat."""
    return [
        {
            **e,
            "conditions": [
                {k: v for k, v in c.items() if k != "lastTransitionTime"}
                for c in e.get("conditions", [])
            ],
        }
        for e in entries
    ]


class PrepareActivity:
    """Prepare calls in flight (across drivers): status writes wait for a quiet moment, so
    a burst of kubelet calls does not share threads and the GIL with API writes."""

    def __init__(self) -> None:
        self._running = 0
        self.started = 0  # prepares begun so far: a quiet window is one where it stays put
        self.idle = asyncio.Event()
        self.idle.set()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self._running += 1
        self.started += 1
        self.idle.clear()
        try:
            yield
        finally:
            self._running -= 1
            if not self._running:
                self.idle.set()


class ClaimStatusReporter:
    """A ClaimHandler that adds status writes to another one's prepare.

    Writes are queued per claim UID and sent by one background task once no prepare is
    running (or after `max_defer` seconds, so a busy kubelet cannot starve them); an
    unprepare drops the claim's queued write, whose entries the API server would drop
    on deallocation anyway.
    """

    def __init__(
        self,
        inner: ClaimHandler,
        *,
        driver: str,
        api: StatusAPI,
        devices: Callable[[], Mapping[str, Device]],
        activity: PrepareActivity | None = None,
        max_defer: float = 2.0,
        now: Callable[[], str] | None = None,
        share_condition: ShareConditions = _no_share_condition,
    ) -> None:
        self._inner = inner
        self.driver = driver
        self._api = api
        self._devices = devices
        self._activity = activity or PrepareActivity()
        self._max_defer = max_defer
        self._share_condition = share_condition
        self._now = now or (lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self._gate = asyncio.Semaphore(WRITE_CONCURRENCY)
        self._written: dict[str, list[Entry]] = {}  # uid -> entries (no times) applied
        self._pending: dict[str, tuple[ClaimRef, list[Entry]]] = {}
        self._wake = asyncio.Event()
        self._done = asyncio.Event()
        self._done.set()
        self._worker: asyncio.Task[None] | None = None
        self._deferred = 0  # prepares whose writes are still to be queued (_queue)
        self._writing = False  # a batch of writes is under way
        self.writes = 0
        self.failures = 0

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Outcome]:
        with self._activity.busy():
            results = await self._inner.prepare(claims)
        if any(isinstance(r, Prepared) and r.devices for r in results.values()):
            # The writes are queued from a callback: the caller's task hands the answer
            # to grpc before the loop gets to it, so the kubelet waits neither for the
            # entries nor for the API. `flush` waits for the callback too (`_deferred`).
            self._done.clear()
            self._deferred += 1
            asyncio.get_running_loop().call_soon(self._queue, claims, results)
        return results

    def _queue(self, claims: Sequence[ClaimRef], results: Mapping[str, Outcome]) -> None:
        self._deferred -= 1
        devices = self._devices()
        for ref in claims:
            res = results.get(ref.uid)
            if not isinstance(res, Prepared) or not res.devices:
                continue
            entries = status_entries(
                self.driver, res.devices, devices, self._now(), self._share_condition
            )
            if self._written.get(ref.uid) == _without_times(entries):
                continue
            self._pending[ref.uid] = (ref, entries)
        if self._pending:
            self._wake.set()
            if self._worker is None or self._worker.done():
                self._worker = asyncio.create_task(self._run(), name=f"claim-status-{self.driver}")
        elif not self._deferred and not self._writing:
            self._done.set()  # nothing new to write, and no batch under way

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]:
        results = await self._inner.unprepare(claims)
        for ref in claims:
            if isinstance(results.get(ref.uid), Unprepared):
                self._written.pop(ref.uid, None)
                self._pending.pop(ref.uid, None)
        return results

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # The kubelet's calls go first; a steady stream of them delays writes only so long.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet(), self._max_defer)
            batch = list(self._pending.values())
            self._pending.clear()
            self._writing = True
            try:
                outcomes = await asyncio.gather(
                    *(self._write(ref, entries) for ref, entries in batch),
                    return_exceptions=True,
                )
            finally:
                self._writing = False
            for (ref, _), outcome in zip(batch, outcomes, strict=True):
                # API errors are handled in _write; anything else is a bug, but the
                # writer (and the daemon) keeps going.
                if isinstance(outcome, Exception):
                    self.failures += 1
                    metrics.claim_error(self.driver, "status")
                    log.error("%s: status.devices write crashed: %r", ref, outcome)
            if self._pending:
                self._wake.set()
            elif not self._deferred:
                self._done.set()

    async def _quiet(self) -> None:
        """No prepare running for QUIET_SECONDS: a burst of kubelet calls has gaps between
        calls, and writes started in one would compete with the calls after it."""
        while True:
            await self._activity.idle.wait()
            began = self._activity.started
            await asyncio.sleep(QUIET_SECONDS)
            if self._activity.idle.is_set() and self._activity.started == began:
                return

    async def _write(self, ref: ClaimRef, entries: list[Entry]) -> None:
        async with self._gate:
            try:
                await self._api.apply_claim_device_status(
                    ref.namespace, ref.name, ref.uid, entries, field_manager=self.driver
                )
            except ApiError as exc:
                self.failures += 1
                metrics.claim_error(self.driver, "status")
                log.warning(
                    "%s: cannot write status.devices (the prepare itself succeeded): %s",
                    ref,
                    exc,
                )
                return
            self.writes += 1
            self._written[ref.uid] = _without_times(entries)
            log.debug(
                "%s: status.devices written devices=%s",
                ref,
                ",".join(e["device"] for e in entries),
            )

    async def flush(self, timeout: float) -> bool:
        """Wait until every queued write is done; False if `timeout` came first."""
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Stop the background writer (shutdown; call flush first to let writes finish)."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
