"""The main flow of `dra-plugin run`, top to bottom. Read this file first.

1. Bind what can fail on bad settings before the kubelet can see us: directories, the API
client, the metrics listener (on failure: one line naming the setting, exit 2, whatever
we created removed); 2. discover devices; 3. checkpoint recovery and CDI garbage collection;
4. per driver: DRA socket, then registration socket; 5. ResourceSlice publisher, fed by
hotplug and health monitors; 6. metrics and /healthz; 7. on SIGTERM: registration
sockets first, let in-flight calls finish, remove our sockets. ResourceSlices are left in
place: the next instance (rolling update) or the Node's garbage collection owns them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from dataclasses import replace
from pathlib import Path

from dra_plugin import inventory
from dra_plugin.cdi.claims import CdiOptions
from dra_plugin.config import Config
from dra_plugin.devices import Device, Health
from dra_plugin.doctor import cdiroot
from dra_plugin.host import files, hotplug, udev
from dra_plugin.kubelet import server
from dra_plugin.kubelet.claims import ClaimPreparer
from dra_plugin.kubelet.claimstatus import ClaimStatusReporter, PrepareActivity
from dra_plugin.kubelet.health import HealthTracker
from dra_plugin.slices.publisher import SlicePublisher
from dra_plugin.startup import StartupError, api_client, listen_metrics, make_dir, remove_created
from dra_plugin.telemetry import metrics
from dra_plugin.telemetry.claimholders import ClaimHolders
from dra_plugin.telemetry.sampler import Sampler
from dra_plugin.vendors import registry
from dra_plugin.vendors.base import Monitor, MonitorHooks, TelemetryReader

log = logging.getLogger(__name__)
RESCAN_RETRY_SECONDS = 5.0


class Node:
    """The daemon's view of its node: current devices per driver, with health applied.

    Hotplug triggers a fresh discovery; health monitors report per device. Every change
    goes to the publisher (ResourceSlices) and the health tracker (kubelet stream).
    """

    def __init__(self, cfg: Config, health: HealthTracker, publisher: SlicePublisher) -> None:
        self._cfg = cfg
        self._health = health
        self._publisher = publisher
        self._discovered: dict[str, tuple[Device, ...]] = {}
        self.published: dict[str, tuple[Device, ...]] = {}
        self._held: dict[str, set[str]] = {}
        self._present: dict[str, set[str]] = {}  # names the last discovery really found
        self._rescan = asyncio.Event()

    def devices(self, driver: str) -> dict[str, Device]:
        return {d.name: d for d in self.published.get(driver, ())}

    def set_discovered(self, inv: inventory.Inventory) -> None:
        why_skipped = {card.pci_address: card.reason for card in inv.skipped}
        for driver, devs in inv.devices.items():
            old = {d.name: d for d in self._discovered.get(driver, ())}
            new = {d.name for d in devs}
            gone = [d for name, d in old.items() if name not in new]
            kept = []
            for d in gone:
                reason = why_skipped.get(d.pci_address or "", "device removed from the node")
                if d.name in self._present.get(driver, set()):
                    log.warning("device gone driver=%s device=%s reason=%r", driver, d.name, reason)
                # A device that vanished while a claim still holds it stays published as
                # Unhealthy (and tainted), so the kubelet can tell the pod what happened.
                if d.name in self._held.get(driver, set()):
                    kept.append(d.with_health(Health.UNHEALTHY, reason))
            self._present[driver] = new
            self._discovered[driver] = tuple(sorted((*devs, *kept), key=lambda d: d.name))
        self._publish()

    def set_held(self, driver: str, held: set[str]) -> None:
        self._held[driver] = held
        # A vanished device kept only for its claim goes once the claim is unprepared.
        present = self._present.get(driver, set())
        devs = self._discovered.get(driver, ())
        keep = tuple(d for d in devs if d.name in present or d.name in held)
        if keep != devs:
            self._discovered[driver] = keep
            self._publish()

    def report_health(self, driver: str, device: str, health: Health, reason: str) -> None:
        if self._health.report(driver, device, health, reason):
            log.log(
                logging.WARNING if health is not Health.HEALTHY else logging.INFO,
                "device health driver=%s device=%s health=%s reason=%r",
                driver,
                device,
                health.value,
                reason,
            )
            self._publish()

    def _publish(self) -> None:
        for driver, devs in self._discovered.items():
            applied = self._health.apply(driver, devs)
            if applied != self.published.get(driver):
                self.published[driver] = applied
                metrics.set_devices(driver, len(applied))
                self._publisher.set_devices(driver, applied)

    def request_rescan(self) -> None:
        self._rescan.set()

    async def rescan_loop(self, retry_seconds: float = RESCAN_RETRY_SECONDS) -> None:
        while True:
            await self._rescan.wait()
            self._rescan.clear()
            try:
                inv = await asyncio.to_thread(inventory.discover, self._cfg)
                self.set_discovered(inv)
            except Exception:  # one bad pass must not end hotplug for good
                log.exception("rescan failed; trying again in %ss", retry_seconds)
                await asyncio.sleep(retry_seconds)
                self._rescan.set()


async def run(cfg: Config) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    drivers = list(cfg.drivers.values())
    servers: list[server.DriverServer] = []

    async def healthz() -> str | None:
        return await sockets_healthy(servers) if servers else "starting: sockets not served yet"

    # 1. What bad settings break, bound before any socket: the kubelet must never see a
    #    plugin that is about to exit.
    created: list[Path] = []
    metrics_server = (
        metrics.MetricsServer(cfg.metrics_address, cfg.metrics_port, healthz)
        if cfg.metrics_port
        else None
    )
    try:
        # Explicit modes, whatever the umask: the runtime reads the CDI root; the plugin
        # dirs hold sockets and the checkpoint.
        make_dir(cfg.cdi_root, cfg.setting("cdi_root"), created, files.SHARED_DIR_MODE)
        registrar = cfg.setting("kubelet_registrar_directory_path")
        make_dir(cfg.registrar_dir, registrar, created, files.PRIVATE_DIR_MODE)
        plugins = cfg.setting("kubelet_plugins_directory_path")
        for driver in drivers:
            make_dir(cfg.plugin_dir(driver), plugins, created, files.PRIVATE_DIR_MODE)
        if metrics_server is not None:
            await listen_metrics(cfg, metrics_server)
        api = api_client(cfg)
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        if metrics_server is not None:
            await metrics_server.stop()
        remove_created(created)
        return 2
    cdiroot.announce_cdi_root(cfg)  # one error (with the fix) when containerd won't look

    # 2. Discovery, logged once per vendor.
    inv = await asyncio.to_thread(inventory.discover, cfg)
    for note in inv.notes:
        log.warning("%s", note)
    for card in inv.skipped:
        log.info("not published pci=%s reason=%s", card.pci_address, card.reason)
    log.info("discovered %s", " ".join(f"{d}={len(v)}" for d, v in inv.devices.items()))

    health = HealthTracker(pool=cfg.node_name)
    sharing = {d: sh for v, d in cfg.drivers.items() if (sh := cfg.sharing(v)) is not None}
    publisher = SlicePublisher(
        api, cfg.node_name, drivers, taint_effect=cfg.taint_effect, sharing=sharing
    )
    node = Node(cfg, health, publisher)

    # 3. Claims: checkpoint recovery and CDI garbage collection before serving.
    preparers: dict[str, ClaimPreparer] = {}
    for name, driver in cfg.drivers.items():
        vendor, settings = registry.get(name), cfg.settings(name)
        preparer = ClaimPreparer(
            driver=driver,
            node_name=cfg.node_name,
            state_dir=cfg.plugin_dir(driver),
            cdi_root=cfg.cdi_root,
            cdi_options=CdiOptions(max_version=cfg.cdi_max_version),
            claim_edits=lambda devs, v=vendor, s=settings: v.claim_edits(s, devs, cfg.host_root),  # type: ignore[misc]
            fetch_claim=api.get_claim,
            devices=lambda d=driver: node.devices(d),  # type: ignore[misc]
            on_held=lambda held, d=driver: node.set_held(d, held),  # type: ignore[misc]
            sharing=sharing.get(driver),
            device_metadata=cfg.device_metadata,
        )
        await preparer.startup()
        preparers[driver] = preparer
    node.set_discovered(inv)
    # Prepared devices are reported in ResourceClaim.status.devices, after the answer and
    # once no driver is preparing.
    activity = PrepareActivity()
    handlers = {
        driver: ClaimStatusReporter(
            preparer,
            driver=driver,
            api=api,
            devices=lambda d=driver: node.devices(d),  # type: ignore[misc]
            activity=activity,
        )
        for driver, preparer in preparers.items()
    }

    # 4. Sockets: DRA service first, then registration.
    servers[:] = [
        server.DriverServer(
            driver=driver,
            dra_socket=cfg.dra_socket(driver),
            registration_socket=cfg.registration_socket(driver),
            handler=handlers[driver],
            health=health,
            health_timeout_seconds=cfg.health_check_timeout_seconds,
        )
        for driver in drivers
    ]
    started: list[server.DriverServer] = []
    try:
        for s in servers:
            started.append(s)
            await s.start()
    except (server.ServerError, OSError) as exc:  # e.g. a non-socket where a socket goes
        log.error("cannot start: %s", exc)
        await asyncio.gather(*(s.stop(0) for s in started))
        if metrics_server is not None:
            await metrics_server.stop()
        await api.close()
        return 2

    # 5. Publisher and the monitors that feed it.
    await publisher.start()
    tasks = [asyncio.create_task(node.rescan_loop(), name="rescan")]

    def rescan() -> None:
        loop.call_soon_threadsafe(node.request_rescan)

    enabled = [registry.get(v) for v in cfg.vendors]
    monitors: list[Monitor] = []
    drm_monitor = None
    if any(v.drm_hotplug for v in enabled):  # one uevent listener for every DRM vendor
        drm_monitor = hotplug.DrmMonitor(rescan)
        monitors.append(drm_monitor)
    by_vendor: dict[str, list[Monitor]] = {}
    for vendor in enabled:
        driver = cfg.settings(vendor.name).driver_name

        def report(device: str, h: Health, reason: str, d: str = driver) -> None:
            loop.call_soon_threadsafe(node.report_health, d, device, h, reason)

        hooks = MonitorHooks(
            rescan=rescan,
            report_health=report,
            published=lambda d=driver: node.published.get(d, ()),  # type: ignore[misc]
        )
        if drm_monitor is not None:
            hooks = replace(hooks, drm_events=drm_monitor.subscribe)
        by_vendor[vendor.name] = vendor.monitors(cfg.settings(vendor.name), hooks)
        monitors += by_vendor[vendor.name]
    for m in monitors:
        try:
            # In a thread: nvmlInit and event registration can be slow, and the kubelet
            # may already be calling GetInfo (1 s) on the sockets opened above.
            await asyncio.to_thread(m.start)
        except udev.DiscoveryError as exc:
            # Without hotplug the node is still served; changes show after a restart.
            log.error("hotplug monitor disabled error=%s", exc)

    # 6. GPU telemetry sampled in the background for /metrics (listening since step 1),
    #    served from cache.
    sampler: Sampler | None = None
    sampler_task: asyncio.Task[None] | None = None
    if cfg.metrics_port and cfg.telemetry_interval_seconds > 0:
        readers: dict[str, TelemetryReader] = {}
        for vendor in enabled:
            reader = vendor.telemetry(cfg.settings(vendor.name), by_vendor[vendor.name])
            if reader is not None:
                readers[vendor.name] = reader
        sampler = Sampler(
            node=cfg.node_name,
            interval=cfg.telemetry_interval_seconds,
            devices=lambda: [d for devs in node.published.values() for d in devs],
            readers=readers,
            kernel_labels={v.name: v.kernel_label for v in enabled},
            holders=ClaimHolders({d: cfg.plugin_dir(d) for d in drivers}, api.get_claim),
        )
        metrics.serve_telemetry(sampler.rendered)
        sampler_task = asyncio.create_task(sampler.run(), name="telemetry")

    log.info("running node=%s drivers=%s", cfg.node_name, ",".join(drivers))
    # What start-up made (the imported libraries above all) lives as long as the process:
    # out of the collector's sight, a full collection no longer walks it (tens of ms,
    # landing on a random prepare).
    gc.freeze()
    await stop.wait()

    # 7. Shutdown: the kubelet must stop seeing us before the service goes away.
    log.info("shutting down grace_seconds=%s", cfg.shutdown_grace_seconds)
    for s in servers:
        await s.stop_registration()
    await asyncio.gather(*(s.stop(cfg.shutdown_grace_seconds) for s in servers))
    await asyncio.gather(*(h.flush(2.0) for h in handlers.values()))
    await asyncio.gather(*(h.close() for h in handlers.values()))
    if sampler is not None and sampler_task is not None:
        sampler.stop()  # its task ends after the pass in progress and closes NVML
        done, _ = await asyncio.wait([sampler_task], timeout=5)
        if not done:  # a GPU hanging in an NVML call must not hang the shutdown
            log.warning("telemetry sampler did not stop within 5 s; exiting without it")
    for m in monitors:
        m.stop()
    for t in tasks:
        t.cancel()
    await publisher.stop()
    if metrics_server is not None:
        await metrics_server.stop()
    log.info("stopped")
    return 0


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
