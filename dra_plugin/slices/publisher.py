"""The reconciling publisher: keeps this node's ResourceSlices equal to its devices.

It reconciles on every device change and whenever our slices are changed or deleted by
someone else (the kubelet deletes all of a node's slices when it starts). It writes
nothing when the API already holds what we would write, also after a restart. What to
write is decided by the pure functions in `build.py` and `sync.py`.

With `hold_new_pools`, a driver's pool is not created from nothing (the API holds no
slice of the driver on this node) until `allow_new_pools(driver)`: the daemon allows it
once the kubelet has registered the driver (running/registration.py). A pool that exists
is kept true at once, allowed or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dra_plugin.devices import Device, InvalidDeviceError
from dra_plugin.kubeapi import ApiError, Backoff, ConflictError, KubeAPI, NotFoundError
from dra_plugin.sharing import Sharing
from dra_plugin.slices.build import Obj, desired_slices, plan_sync, strip_taints
from dra_plugin.slices.gates import Gates
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)


@dataclass
class PublisherStats:
    """Counters for metrics and benchmarks."""

    reconciles: int = 0
    writes: int = 0
    creates: int = 0
    updates: int = 0
    deletes: int = 0
    conflicts: int = 0
    errors: int = 0
    last_error: str = ""
    last_success: float = 0.0  # time.time() of the last successful reconcile
    generations: dict[str, int] = field(default_factory=dict)


class SlicePublisher:
    """Keeps each driver's pool on this node equal to the devices it was last given."""

    def __init__(
        self,
        api: KubeAPI,
        node_name: str,
        drivers: Sequence[str],
        *,
        taint_effect: str = "NoSchedule",
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        resync_seconds: float = 600.0,
        sharing: Mapping[str, Sharing] | None = None,
        hold_new_pools: bool = False,
    ) -> None:
        self._api = api
        self.node_name = node_name
        self.drivers = tuple(drivers)
        self.taint_effect = taint_effect
        self._backoff = (backoff_initial, backoff_max)
        self._resync_seconds = resync_seconds
        # None: not told yet (nothing is published for a driver before its first set_devices).
        self._devices: dict[str, tuple[Device, ...] | None] = dict.fromkeys(self.drivers)
        self._dirty = {d: asyncio.Event() for d in self.drivers}
        self._idle = {d: asyncio.Event() for d in self.drivers}
        self._last_generation: dict[str, int] = {}
        self._sharing = dict(sharing or {})
        self._gates = Gates(api)  # what the server drops, learned from its answers
        self._own_rvs: deque[str] = deque(maxlen=4096)  # echoes of our own writes
        self._own_deletes: deque[str] = deque(maxlen=1024)
        # Watch events that arrive while we write may be our own echoes whose
        # resourceVersion we do not know yet: judge them once the reconcile is done.
        self._inflight: set[str] = set()
        self._deferred: dict[str, list[tuple[str, str, str]]] = {d: [] for d in self.drivers}
        self._node_uid = ""
        self._start_rv = ""  # the first list's version: the watch starts there, no re-list
        self._version = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._failure: dict[str, str] = {}  # the retry reason of a driver's last failure
        self._new_pool_allowed = dict.fromkeys(self.drivers, not hold_new_pools)
        self._held: set[str] = set()  # drivers whose pool creation waits to be allowed
        self.stats = PublisherStats()

    # --- public API ----------------------------------------------------------------------
    def set_devices(self, driver: str, devices: Iterable[Device]) -> None:
        """New desired device set for `driver` (event loop only); reconciles right away."""
        if driver not in self._dirty:
            raise ValueError(f"driver {driver!r} is not one of {self.drivers}")
        self._devices[driver] = tuple(devices)
        self._mark(driver)

    def allow_new_pools(self, driver: str) -> None:
        """From now on `driver`'s pool may be created; what was held is published."""
        self._new_pool_allowed[driver] = True
        if driver in self._held:
            self._mark(driver)

    async def start(self) -> None:
        """Resolve the Node and API version, reconcile once, then keep reconciling.

        Never raises for an unreachable API: the background loop retries with backoff.
        One list of the node's slices serves every driver's first reconcile (and the watch
        starts at its resourceVersion): a restart with nothing changed makes 3 requests.
        """
        existing = await self._list_all()
        for driver in self.drivers:
            if self._devices[driver] is not None:
                self._dirty[driver].clear()
                if await self._reconcile_guarded(driver, existing) in ("conflict", "error"):
                    self._dirty[driver].set()  # the worker retries with backoff
        for driver in self.drivers:
            self._tasks.append(asyncio.create_task(self._worker(driver), name=f"slices-{driver}"))
        self._tasks.append(asyncio.create_task(self._watch(), name="slices-watch"))
        if self._resync_seconds > 0:
            self._tasks.append(asyncio.create_task(self._resync(), name="slices-resync"))

    async def stop(self) -> None:
        """Stop reconciling. Slices stay: deleting them would break rolling updates."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def wait_synced(self, timeout: float = 10.0) -> bool:
        """True once every driver with devices has been reconciled with nothing pending
        (a held pool is pending)."""
        wanted = [d for d in self.drivers if self._devices[d] is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*(self._idle[d].wait() for d in wanted)), timeout)
        except TimeoutError:
            return False
        return all(self._idle[d].is_set() for d in wanted)

    # --- internals -------------------------------------------------------------------------
    def _mark(self, driver: str) -> None:
        self._idle[driver].clear()
        self._dirty[driver].set()

    async def _list_all(self) -> dict[str, list[Obj]] | None:
        """The node's slices by driver (one request), or None when the API failed."""
        if not any(self._devices[d] is not None for d in self.drivers):
            return None
        try:
            items, self._start_rv = await self._api.list_slices(self.node_name)
        except ApiError as exc:
            log.warning("slices list failed node=%s error=%s", self.node_name, exc)
            return None
        by_driver: dict[str, list[Obj]] = {d: [] for d in self.drivers}
        for item in items:
            by_driver.setdefault(str(item.get("spec", {}).get("driver", "")), []).append(item)
        return by_driver

    async def _ensure_ready(self) -> None:
        if not self._node_uid:
            node = await self._api.get_node(self.node_name)
            self._node_uid = str(node.get("metadata", {}).get("uid", ""))

    async def _reconcile_guarded(
        self, driver: str, listed: Mapping[str, list[Obj]] | None = None
    ) -> str:
        """One reconcile: "ok", "held", "conflict", "error" or "invalid"; never raises."""
        self._inflight.add(driver)
        try:
            await self._ensure_ready()
            await self._reconcile(driver, None if listed is None else listed.get(driver, []))
        except ConflictError as exc:
            self._failure[driver] = exc.reason
            self.stats.conflicts += 1
            log.info("slices conflict driver=%s, re-reading: %s", driver, exc)
            return "conflict"
        except (ApiError, InvalidDeviceError) as exc:
            self._failure[driver] = exc.reason if isinstance(exc, ApiError) else "invalid"
            self.stats.errors += 1
            self.stats.last_error = f"{driver}: {exc}"
            log.warning("slices reconcile failed driver=%s error=%s", driver, exc)
            return "invalid" if isinstance(exc, InvalidDeviceError) else "error"
        finally:
            self._inflight.discard(driver)
            deferred, self._deferred[driver] = self._deferred[driver], []
            for etype, name, rv in deferred:
                self._on_change(driver, etype, name, rv)
        self.stats.last_success = time.time()
        if driver in self._held:
            return "held"
        if not self._dirty[driver].is_set():
            self._idle[driver].set()
        return "ok"

    async def _worker(self, driver: str) -> None:
        backoff = Backoff(*self._backoff)
        reread = True  # the first conflict since a success is re-read at once
        while True:
            await self._dirty[driver].wait()
            self._dirty[driver].clear()
            if self._devices[driver] is None:
                continue
            outcome = await self._reconcile_guarded(driver)
            if outcome in ("ok", "held"):  # held: allow_new_pools marks it again
                backoff.reset()
                reread = True
                continue
            if outcome == "invalid":
                continue  # our own data is bad: retrying cannot help until devices change
            metrics.api_retry(self._failure.get(driver, "error"))
            self._dirty[driver].set()
            if outcome == "conflict" and reread:
                reread = False  # someone else wrote in between: re-read at once, once;
                continue  # conflicts that go on (a name taken for good) back off
            await asyncio.sleep(backoff.next())

    async def _reconcile(self, driver: str, existing: list[Obj] | None = None) -> None:
        self.stats.reconciles += 1
        devices = self._devices[driver] or ()
        if existing is None:
            existing, list_rv = await self._api.list_slices(self.node_name, driver)
            self._start_rv = self._start_rv or list_rv
        # Learned from the list (v1 first, older versions on 404): no discovery request.
        self._version = self._api.known_resource_version() or self._version
        if not self._version:
            self._version = await self._api.resource_api_version()
        if self._version != "v1" and any(d.consumes for d in devices):
            self._gates.counters_unsupported(driver, self._version)
        desired = desired_slices(
            self.node_name,
            self._node_uid,
            driver,
            devices,
            api_version=self._version,
            generation=1,
            taint_effect=self.taint_effect,
            sharing=self.sharing(driver),
            counters=self.partitions(driver),
            groups=driver not in self._gates.drops_groups,
        )
        if driver in self._gates.drops_taints:
            strip_taints(desired)
        plan = plan_sync(existing, desired, min_generation=self._last_generation.get(driver, 0))
        if not existing and plan.creates and not self._new_pool_allowed[driver]:
            if driver not in self._held:
                log.info("slices held driver=%s: the kubelet has not registered it yet", driver)
            self._held.add(driver)
            return
        self._held.discard(driver)
        if plan.writes and await self._gates.probe(driver, desired, self.sharing(driver)):
            return await self._reconcile(driver)  # without what it drops, before any write
        if not plan.writes:
            self._last_generation[driver] = plan.generation
            self.stats.generations[driver] = plan.generation
            return
        log.info(
            "slices sync driver=%s generation=%d create=%d update=%d delete=%d",
            driver,
            plan.generation,
            len(plan.creates),
            len(plan.updates),
            len(plan.deletes),
        )
        # Updates and creates first, deletes last: the pool is never emptier than needed.
        dropped = self._gates.dropped(driver)
        for obj in plan.updates:
            self._note_write(driver, obj, await self._api.update_slice(obj))
            self.stats.updates += 1
            metrics.slice_write(driver, "update")
            if self._gates.dropped(driver) != dropped:
                return await self._reconcile(driver)  # at once, without what was dropped
        for obj in plan.creates:
            self._note_write(driver, obj, await self._api.create_slice(obj))
            self.stats.creates += 1
            metrics.slice_write(driver, "create")
            if self._gates.dropped(driver) != dropped:
                return await self._reconcile(driver)
        for name, rv in plan.deletes:
            self._own_deletes.append(name)
            with contextlib.suppress(NotFoundError):  # already gone: what we wanted
                await self._api.delete_slice(name, resource_version=rv)
            self.stats.deletes += 1
            self.stats.writes += 1
            metrics.slice_write(driver, "delete")
        # Only now: a failed attempt must not make the retry bump the generation again.
        self._last_generation[driver] = plan.generation
        self.stats.generations[driver] = plan.generation

    def sharing(self, driver: str) -> Sharing | None:
        """How `driver` publishes its devices now (None: exclusive, also after fallback)."""
        return self._gates.sharing(driver, self._sharing.get(driver))

    def partitions(self, driver: str) -> bool:
        """Whether `driver`'s devices that consume counters are published (False after
        the server was seen to drop the fields)."""
        return driver not in self._gates.drops_counters

    def _note_write(self, driver: str, sent: Obj, got: Obj) -> None:
        self.stats.writes += 1
        rv = str(got.get("metadata", {}).get("resourceVersion", ""))
        if rv:
            self._own_rvs.append(rv)
        self._gates.note_write(driver, sent, got)

    async def _watch(self) -> None:
        async for event in self._api.watch_slices(self.node_name, resource_version=self._start_rv):
            if event.type == "RESYNC":
                for driver in self.drivers:
                    if self._devices[driver] is not None:
                        self._mark(driver)
                continue
            obj = event.object
            driver = str(obj.get("spec", {}).get("driver", ""))
            if driver not in self._dirty or self._devices[driver] is None:
                continue
            meta = obj.get("metadata", {})
            name, rv = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
            if driver in self._inflight:
                self._deferred[driver].append((event.type, name, rv))
            else:
                self._on_change(driver, event.type, name, rv)

    def _on_change(self, driver: str, etype: str, name: str, rv: str) -> None:
        if (etype == "DELETED" and name in self._own_deletes) or (
            etype != "DELETED" and rv in self._own_rvs
        ):
            # Tests wait for this line before asserting that an echo set nothing off.
            log.debug("own slice change event=%s name=%s driver=%s", etype, name, driver)
            return
        log.info("slice changed by someone else event=%s name=%s driver=%s", etype, name, driver)
        self._mark(driver)

    async def _resync(self) -> None:
        # Safety net in case a watch event was lost: an extra list, no writes if all is well.
        while True:
            await asyncio.sleep(self._resync_seconds)
            for driver in self.drivers:
                if self._devices[driver] is not None:
                    self._mark(driver)
