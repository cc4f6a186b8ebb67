"""Prometheus metrics and the /healthz endpoint (the only importer of prometheus_client).

The HTTP side is a few lines of asyncio rather than prometheus_client's threaded server:
it runs on the daemon's loop, so /healthz can call the plugin's own sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from dra_plugin.telemetry import catalogue as t

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()

_RPCS = Counter("dra_plugin_rpc_total", "gRPC calls served", ["method", "code"], registry=REGISTRY)
_RPC_SECONDS = Histogram(
    "dra_plugin_rpc_duration_seconds",
    "gRPC call latency",
    ["method"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 45),
    registry=REGISTRY,
)
_CLAIM_ERRORS = Counter(
    "dra_plugin_claim_errors_total",
    "claims that got a per-claim error",
    ["driver", "operation"],
    registry=REGISTRY,
)
_DEVICES = Gauge("dra_plugin_devices", "devices published", ["driver"], registry=REGISTRY)
_HEALTH = Gauge(
    "dra_plugin_device_healthy",
    "1 healthy, 0 unhealthy, -1 unknown",
    ["driver", "device"],
    registry=REGISTRY,
)
_SLICE_WRITES = Counter(
    "dra_plugin_resourceslice_writes_total",
    "ResourceSlice create/update/delete calls",
    ["driver", "verb"],
    registry=REGISTRY,
)
_API_RETRIES = Counter(
    "dra_plugin_api_retries_total",
    "API requests that failed and are tried again after a backoff, by reason: unavailable "
    "(no connection, timeout), server_error (5xx), throttled (429), conflict (409), "
    "invalid (422)",
    ["reason"],
    registry=REGISTRY,
)
_CDI_ROOT_LISTED = Gauge(
    "dra_plugin_cdi_root_listed",
    "1 when containerd's config lists the CDI root (and CDI is on), 0 when not; absent "
    "when the host's containerd config cannot be read",
    ["cdi_root"],
    registry=REGISTRY,
)
_CHECKPOINT_DAMAGE = Counter(
    "dra_plugin_checkpoint_damage_total",
    "damage found in the prepared-claims record (a file missing, shorter, replaced, "
    "corrupt or foreign, or claims it lacks): each time, the record was rebuilt from what "
    "was intact and the CDI spec files",
    ["driver", "file", "reason"],
    registry=REGISTRY,
)
_FIELDS_DROPPED = Gauge(
    "dra_plugin_api_fields_dropped",
    "1 while the API server drops a ResourceSlice feature's fields and this driver "
    "publishes without them (feature: the gate's name)",
    ["driver", "feature"],
    registry=REGISTRY,
)
_VENDOR_FAULTS = Counter(
    "dra_plugin_vendor_faults_total",
    "unexpected exceptions in a vendor's code, contained to its driver, by stage: "
    "discover, monitor, telemetry",
    ["driver", "stage"],
    registry=REGISTRY,
)

_HEALTH_VALUE = {"Healthy": 1.0, "Unhealthy": 0.0, "Unknown": -1.0}


def observe_rpc(method: str, code: str, seconds: float) -> None:
    _RPCS.labels(method, code).inc()
    _RPC_SECONDS.labels(method).observe(seconds)


def claim_error(driver: str, operation: str) -> None:
    _CLAIM_ERRORS.labels(driver, operation).inc()


def set_devices(driver: str, count: int) -> None:
    _DEVICES.labels(driver).set(count)


def set_device_health(driver: str, device: str, health: str) -> None:
    _HEALTH.labels(driver, device).set(_HEALTH_VALUE.get(health, -1.0))


def forget_device_health(driver: str, device: str) -> None:
    with contextlib.suppress(KeyError):  # never set: nothing to remove
        _HEALTH.remove(driver, device)


def set_cdi_root_listed(cdi_root: str, listed: bool) -> None:
    _CDI_ROOT_LISTED.labels(cdi_root).set(1.0 if listed else 0.0)


def slice_write(driver: str, verb: str) -> None:
    _SLICE_WRITES.labels(driver, verb).inc()


def api_retry(reason: str) -> None:
    _API_RETRIES.labels(reason).inc()


def checkpoint_damage(driver: str, file: str, reason: str) -> None:
    _CHECKPOINT_DAMAGE.labels(driver, file, reason).inc()


def fields_dropped(driver: str, feature: str) -> None:
    _FIELDS_DROPPED.labels(driver=driver, feature=feature).set(1)


def vendor_fault(
    vendor: str, driver: str, stage: str, what: str, *, traceback: bool = True
) -> None:
    """One unexpected exception of a vendor's code, contained to its driver: logged once
    with the vendor's and driver's names (and the exception being handled), and counted."""
    log.error("%s vendor=%s driver=%s", what, vendor, driver, exc_info=traceback)
    _VENDOR_FAULTS.labels(driver, stage).inc()


def render() -> bytes:
    """The scrape body: the daemon's own metrics, then the pre-rendered GPU telemetry."""
    body = generate_latest(REGISTRY)
    return body + _telemetry() if _telemetry is not None else body


# --- GPU telemetry: families built from the sampler's latest snapshot on each scrape ------


def _numeric(series: t.Series) -> GaugeMetricFamily | CounterMetricFamily:
    name, labels = t.PREFIX + series.name, [*t.DEVICE_LABELS, *series.labels]
    if series.kind == "counter":
        return CounterMetricFamily(name, series.help, labels=labels)
    return GaugeMetricFamily(name, series.help, labels=labels)


def _info(series: t.Series) -> InfoMetricFamily:
    name = (t.PREFIX + series.name).removesuffix("_info")  # the family adds _info back
    return InfoMetricFamily(name, series.help, labels=t.DEVICE_LABELS)


def telemetry_families(snap: t.Snapshot) -> Iterator[Metric]:
    """The device series of `snap`, in catalogue order; a series without values is left
    out entirely (absent, not 0)."""
    numeric: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    info = _info(t.INFO)
    claims = _info(t.CLAIM_INFO)

    def add(series: t.Series, labels: list[str], value: float) -> None:
        if series.name not in numeric:
            numeric[series.name] = _numeric(series)
        numeric[series.name].add_metric(labels, value)

    for d in snap.devices:
        ident = d.identity
        base = list(ident.label_values)
        add(t.UP, base, 1.0 if d.up else 0.0)
        extra = {"vendor": ident.vendor, "uuid": ident.uuid, "kernel_driver": ident.kernel_driver}
        info.add_metric(base, {**extra, "node": snap.node})
        for r in d.readings:
            add(r.series, [*base, *r.labels], r.value)
    by_device = {(d.identity.driver, d.identity.device): d.identity for d in snap.devices}
    for h in dict.fromkeys(snap.holders):  # one sample per label set, whatever the source
        held = by_device.get((h.driver, h.device))
        if held is None:
            continue  # a claim on a device no longer published
        claims.add_metric(
            list(held.label_values),
            {"namespace": h.namespace, "claim": h.claim, "claim_uid": h.claim_uid, "pod": h.pod},
        )
    for series in t.CATALOGUE:
        if series is t.INFO and info.samples:
            yield info
        elif series is t.CLAIM_INFO and claims.samples:
            yield claims
        elif series.name in numeric:
            yield numeric[series.name]
    if snap.taken_at:
        yield GaugeMetricFamily(
            "dra_plugin_telemetry_last_sample_timestamp_seconds",
            "Unix time of the last telemetry sample",
            value=snap.taken_at,
        )
        yield GaugeMetricFamily(
            "dra_plugin_telemetry_sample_duration_seconds",
            "Wall time the last telemetry sample took to read every device",
            value=snap.duration_seconds,
        )


class TelemetryCollector(Collector):
    """Yields the families of one snapshot (it never reads hardware)."""

    def __init__(self, snapshot: Callable[[], t.Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return telemetry_families(self._snapshot())


def exposition(snap: t.Snapshot) -> bytes:
    """`snap` in the text exposition format. The sampler renders each snapshot once, off
    the event loop, so a scrape costs a copy however many devices there are."""
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(lambda: snap))
    return generate_latest(registry)


_telemetry: Callable[[], bytes] | None = None


def serve_telemetry(rendered: Callable[[], bytes] | None) -> None:
    """Append `rendered()` (see exposition()) to every scrape; None stops it."""
    global _telemetry
    _telemetry = rendered


HealthCheck = Callable[[], Awaitable[str | None]]
"""Returns None when healthy, else the reason."""


class MetricsServer:
    """Serves /metrics, /healthz and /readyz over plain HTTP/1.1."""

    def __init__(self, address: str, port: int, check: HealthCheck) -> None:
        self._address = address
        self._port = port
        self._check = check
        self._server: asyncio.base_events.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._address, self._port)
        log.info("metrics listening address=%s port=%d", self._address, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                pass  # headers are not needed
            parts = line.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            status, ctype, body = await self._route(parts[0] if parts else "", path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError) as exc:
            log.debug("metrics request dropped error=%s", exc)
        finally:
            writer.close()

    async def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, render()
        if path in ("/healthz", "/readyz"):
            reason = await self._check()
            if reason is None:
                return "200 OK", "text/plain", b"ok\n"
            return "503 Service Unavailable", "text/plain", f"{reason}\n".encode()
        return "404 Not Found", "text/plain", b"not found\n"
