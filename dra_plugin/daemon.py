"""The main flow of `dra-plugin run`, top to bottom. Read this file first.

1. Bind what can fail on bad settings before the kubelet can see us: the API client (its
credentials), directories, the metrics listener (on failure: one line naming the setting,
exit 2, whatever we created removed); 2. discover devices; 3. checkpoint recovery and CDI
garbage collection; 4. per driver: DRA socket, then registration socket; 5. ResourceSlice
publisher, fed by hotplug and health monitors; 6. metrics and /healthz; 7. on SIGTERM:
registration sockets first, let in-flight calls finish, remove our sockets. ResourceSlices
are left in place: the next instance (rolling update) or the Node's garbage collection owns them.

Every step enters what it starts into one exit stack, so one path undoes it all, in reverse
order, after a signal, a start-up error or a bug. A vendor's unexpected exception stays in
its driver (logged with its name, counted in dra_plugin_vendor_faults_total).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.cdi.claims import CdiOptions, ClaimEdits
from dra_plugin.checkpoint.snapshot import read_boot_id
from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.claims.claimstatus import ClaimStatusReporter, PrepareActivity
from dra_plugin.config import Config
from dra_plugin.devices import Device, Health
from dra_plugin.doctor import cdiroot
from dra_plugin.host import files, hotplug
from dra_plugin.kubeapi import KubeAPI
from dra_plugin.kubelet import server
from dra_plugin.kubelet.health import HealthTracker
from dra_plugin.running import inventory, monitors
from dra_plugin.running.node import Node
from dra_plugin.running.startup import (
    StartupError,
    api_client,
    listen_metrics,
    make_dir,
    undo_dirs_on_failure,
)
from dra_plugin.running.workloads import LoopWorkloads
from dra_plugin.sampling.claimholders import ClaimHolders
from dra_plugin.sampling.sampler import Sampler
from dra_plugin.slices.publisher import SlicePublisher
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.base import Driver as VendorDriver
from dra_plugin.vendors.base import Monitor, MonitorHooks, OnDemand, TelemetryReader, Vendor
from dra_plugin.vendors.claimcontext import ClaimContext

log = logging.getLogger(__name__)
STEPS = ("bind", "discover", "claims", "sockets", "publisher", "monitors", "telemetry")


@dataclass
class Driver:
    """One DRA driver while the daemon runs: its vendor's bound driver, and what serves it."""

    bound: VendorDriver  # the vendor's hooks, bound to its settings (vendors/base.py)
    preparer: ClaimPreparer | None = None
    reporter: ClaimStatusReporter | None = None
    server: server.DriverServer | None = None
    monitors: list[Monitor] = field(default_factory=list)
    on_demand: OnDemand | None = None  # what makes its devices on demand (MIG instances)

    @property
    def vendor(self) -> Vendor:
        return self.bound.vendor

    @property
    def name(self) -> str:
        return self.bound.driver_name


async def run(cfg: Config) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(setattr, threading, "excepthook", threading.excepthook)
            threading.excepthook = monitors.log_thread_exceptions
            await _start(cfg, stack)
            # What start-up made (the imported libraries above all) lives as long as the
            # process: out of the collector's sight, a full collection no longer walks it
            # (tens of ms, landing on a random prepare).
            gc.freeze()
            await stop.wait()
            log.info("shutting down grace_seconds=%s", cfg.shutdown_grace_seconds)
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        return 2
    log.info("stopped")
    return 0


async def _start(cfg: Config, stack: contextlib.AsyncExitStack) -> None:
    drivers = [Driver(cfg.driver(v)) for v in cfg.vendors]
    serving: list[server.DriverServer] = []

    async def healthz() -> str | None:
        return await sockets_healthy(serving) if serving else "starting: sockets not served yet"

    # 1. What bad settings break, bound before any socket: the kubelet must never see a
    #    plugin that is about to exit.
    api = await _bind(cfg, stack, healthz)
    cdiroot.announce_cdi_root(cfg)  # one error (with the fix) when containerd won't look
    crashpoints.reached("bind")

    # 2. Discovery, logged once per vendor; what a driver makes on demand is bound first
    #    (discovery asks it which devices it made).
    boot_id = read_boot_id()
    workloads = None
    if cfg.pod_namespace:  # workloads of our own (MPS daemons) run beside us there
        workloads = LoopWorkloads(api, asyncio.get_running_loop(), cfg.pod_namespace, cfg.node_name)
    for d in drivers:
        d.on_demand = d.bound.on_demand(cfg.plugin_dir(d.name), boot_id, cfg.host_root, workloads)
    inv = await asyncio.to_thread(inventory.discover, cfg)
    for note in inv.notes:
        log.warning("%s", note)
    for card in inv.skipped:
        log.info("not published pci=%s reason=%s", card.pci_address, card.reason)
    log.info("discovered %s", " ".join(f"{d}={len(v)}" for d, v in inv.devices.items()))
    crashpoints.reached("discover")

    # 3. Claims: checkpoint recovery and CDI garbage collection before serving.
    health = HealthTracker(pool=cfg.node_name)
    sharing = {d.name: sh for d in drivers if (sh := d.bound.sharing) is not None}
    publisher = SlicePublisher(
        api, cfg.node_name, [d.name for d in drivers], taint_effect=cfg.taint_effect,
        sharing=sharing,
    )  # fmt: skip
    node = Node(cfg, health, publisher)
    # Prepared devices are reported in ResourceClaim.status.devices, after the answer and
    # once no driver is preparing.
    activity = PrepareActivity()
    for d in drivers:
        await _claims(cfg, d, node, api, activity, stack)
    if any(d.on_demand is not None for d in drivers):
        # The record told the drivers what they made (OnDemand.reconcile): discovery
        # again, so nothing made for a held claim is first published as someone else's.
        inv = await asyncio.to_thread(inventory.discover, cfg)
    node.set_discovered(inv)
    crashpoints.reached("claims")

    # 4. Sockets: DRA service first, then registration.
    for d in drivers:
        d.server = server.DriverServer(
            driver=d.name,
            dra_socket=cfg.dra_socket(d.name),
            registration_socket=cfg.registration_socket(d.name),
            handler=_handler(d),
            health=health,
            health_timeout_seconds=cfg.health_check_timeout_seconds,
        )
        stack.push_async_callback(d.server.stop, 0)  # what start() opened, if it fails
        try:
            await d.server.start()
        except (server.ServerError, OSError) as exc:  # e.g. a non-socket where a socket goes
            raise StartupError(str(exc)) from exc
        serving.append(d.server)
    crashpoints.reached("sockets")

    # 5. Publisher and the monitors that feed it.
    await publisher.start()
    stack.push_async_callback(publisher.stop)
    rescans = asyncio.create_task(node.rescan_loop(failing=bool(inv.failed)), name="rescan")
    stack.push_async_callback(_cancel, rescans)
    crashpoints.reached("publisher")
    started: list[monitors.Owned] = []
    join_seconds = max(1.0, min(monitors.JOIN_SECONDS, cfg.shutdown_grace_seconds))
    stack.push_async_callback(monitors.stop_all, started, join_seconds)
    for owner, m in _monitors(cfg, drivers, node, loop=asyncio.get_running_loop()):
        await monitors.start(owner, m, started)
    # Cancelled before the monitors are told to stop (the stack unwinds in reverse), so a
    # stop is never taken for a death.
    alive = monitors.running(started)
    watch = asyncio.create_task(monitors.watch(alive, node), name="monitor-watch")
    stack.push_async_callback(_cancel, watch)
    crashpoints.reached("monitors")

    # 6. GPU telemetry sampled in the background for /metrics (listening since step 1),
    #    served from cache.
    if cfg.metrics_port and cfg.telemetry_interval_seconds > 0:
        sampler = Sampler(
            node=cfg.node_name,
            interval=cfg.telemetry_interval_seconds,
            devices=lambda: [d for devs in node.published.values() for d in devs],
            readers=_readers(drivers),
            kernel_labels={d.vendor.name: d.vendor.kernel_label for d in drivers},
            holders=ClaimHolders({d.name: cfg.plugin_dir(d.name) for d in drivers}, api.get_claim),
        )
        metrics.serve_telemetry(sampler.rendered)
        task = asyncio.create_task(sampler.run(), name="telemetry")
        stack.push_async_callback(_stop_sampler, sampler, task)
    crashpoints.reached("telemetry")

    # 7. Shutdown, entered last so it runs first: the kubelet must stop seeing us before
    #    the service goes away.
    stack.push_async_callback(_leave_kubelet, drivers, cfg.shutdown_grace_seconds)
    log.info("running node=%s drivers=%s", cfg.node_name, ",".join(d.name for d in drivers))


async def _bind(
    cfg: Config, stack: contextlib.AsyncExitStack, healthz: metrics.HealthCheck
) -> KubeAPI:
    # Credentials first: without them the plugin cannot work, so a failed start neither
    # creates a directory nor binds the metrics port.
    api = api_client(cfg)
    stack.push_async_callback(api.close)
    # Explicit modes, whatever the umask: the runtime reads the CDI root; the plugin dirs
    # hold sockets and the checkpoint.
    created = stack.enter_context(undo_dirs_on_failure())
    make_dir(cfg.cdi_root, cfg.setting("cdi_root"), created, files.SHARED_DIR_MODE)
    registrar = cfg.setting("kubelet_registrar_directory_path")
    make_dir(cfg.registrar_dir, registrar, created, files.PRIVATE_DIR_MODE)
    plugins = cfg.setting("kubelet_plugins_directory_path")
    for driver in cfg.drivers.values():
        make_dir(cfg.plugin_dir(driver), plugins, created, files.PRIVATE_DIR_MODE)
    if cfg.metrics_port:
        metrics_server = metrics.MetricsServer(cfg.metrics_address, cfg.metrics_port, healthz)
        stack.push_async_callback(metrics_server.stop)
        await listen_metrics(cfg, metrics_server)
    return api


async def _claims(
    cfg: Config,
    d: Driver,
    node: Node,
    api: KubeAPI,
    activity: PrepareActivity,
    stack: contextlib.AsyncExitStack,
) -> None:
    def edits(devices: Sequence[Device], claim: ClaimContext) -> ClaimEdits:
        return d.bound.claim_edits(devices, cfg.host_root, claim)

    def devices() -> dict[str, Device]:
        return node.devices(d.name)

    def on_held(held: set[str]) -> None:
        node.set_held(d.name, held)

    d.preparer = ClaimPreparer(
        driver=d.name,
        node_name=cfg.node_name,
        state_dir=cfg.plugin_dir(d.name),
        cdi_root=cfg.cdi_root,
        cdi_options=CdiOptions(max_version=cfg.cdi_max_version),
        claim_edits=edits,
        fetch_claim=api.get_claim,
        devices=devices,
        on_held=on_held,
        sharing=d.bound.sharing,
        device_metadata=cfg.device_metadata,
        on_demand=d.on_demand,
        opaque_configs=d.bound.opaque_configs,
    )
    stack.callback(d.preparer.close)  # after the servers' stop: no call is left
    await d.preparer.startup()
    d.reporter = ClaimStatusReporter(
        d.preparer,
        driver=d.name,
        api=api,
        devices=devices,
        activity=activity,
        share_condition=d.bound.share_condition,
    )
    stack.push_async_callback(d.reporter.close)


def _handler(d: Driver) -> ClaimStatusReporter:
    if d.reporter is None:  # step 3 sets it for every driver
        raise AssertionError(f"driver {d.name} has no claim handler")
    return d.reporter


def _monitors(
    cfg: Config, drivers: list[Driver], node: Node, loop: asyncio.AbstractEventLoop
) -> list[monitors.Owned]:
    """(driver, monitor) for every monitor to start: the core's one DRM uevent listener
    (no driver) when a vendor wants hotplug, then each vendor's own."""

    def rescan() -> None:
        loop.call_soon_threadsafe(node.request_rescan)

    out: list[monitors.Owned] = []
    drm_monitor = None
    if any(d.vendor.drm_hotplug for d in drivers):  # one uevent listener for every DRM vendor
        drm_monitor = hotplug.DrmMonitor(rescan)
        out.append((None, drm_monitor))
    for d in drivers:
        hooks = _hooks(d.name, node, loop, rescan)
        if drm_monitor is not None:
            hooks = replace(hooks, drm_events=drm_monitor.subscribe)
        try:
            d.monitors = d.bound.monitors(hooks)
        except Exception:  # noqa: BLE001 - a vendor bug: its driver is served without monitors
            _fault(d, "monitor", "creating its monitors failed")
        out += [(d.bound, m) for m in d.monitors]
    return out


def _hooks(
    driver: str, node: Node, loop: asyncio.AbstractEventLoop, rescan: Callable[[], None]
) -> MonitorHooks:
    def report(device: str, h: Health, reason: str) -> None:
        loop.call_soon_threadsafe(node.report_health, driver, device, h, reason)

    def published() -> tuple[Device, ...]:
        return node.published.get(driver, ())

    return MonitorHooks(rescan=rescan, report_health=report, published=published)


def _readers(drivers: list[Driver]) -> dict[str, TelemetryReader]:
    readers: dict[str, TelemetryReader] = {}
    for d in drivers:
        try:
            reader = d.bound.telemetry()
        except Exception:  # noqa: BLE001 - a vendor bug: its devices are sampled as down
            _fault(d, "telemetry", "creating its telemetry reader failed")
            continue
        if reader is not None:
            readers[d.vendor.name] = reader
    return readers


def _fault(d: Driver, stage: str, what: str) -> None:
    monitors.fault(d.bound, stage, what)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _stop_sampler(sampler: Sampler, task: asyncio.Task[None]) -> None:
    sampler.stop()  # its task ends after the pass in progress and closes NVML
    done, _ = await asyncio.wait([task], timeout=5)
    if not done:  # a GPU hanging in an NVML call must not hang the shutdown
        log.warning("telemetry sampler did not stop within 5 s; exiting without it")


async def _leave_kubelet(drivers: list[Driver], grace_seconds: float) -> None:
    """Registration sockets first, then in-flight calls finish and the DRA sockets go; the
    claim statuses they produced are reported before the API client closes."""
    for d in drivers:
        if d.server is not None:
            await d.server.stop_registration()
    await asyncio.gather(*(d.server.stop(grace_seconds) for d in drivers if d.server))
    await asyncio.gather(*(d.reporter.flush(2.0) for d in drivers if d.reporter))


async def sockets_healthy(servers: list[server.DriverServer]) -> str | None:
    """None when every driver's two sockets answer, else what is wrong."""
    for s in servers:
        for path in (s.registration_socket, s.dra_socket):
            if not Path(path).exists():
                return f"{path} is missing"
            try:
                await server.socket_answers(path, 1.0)
            except Exception as exc:  # noqa: BLE001 - any failure means unhealthy, and says why
                return f"{path} does not answer: {exc}"
    return None
