"""The kubelet's ResourceSlice wiping, as its DRA plugin manager does it (kubernetes
v1.37.2 pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go):

- at the kubelet's start, every ResourceSlice of the node is deleted (NewDRAPluginManager:
  "startup" wipe, all drivers), before any plugin has registered;
- each registered plugin's gRPC connection is watched (monitoredPlugin.HandleConn): a
  driver is usable while at least one of its plugins is connected; when none is, the
  driver's slices on this node are deleted after the wiping delay (30 s in the kubelet,
  manager.go defaultWipingDelay; a parameter here), unless a plugin of it connects again
  first (sync: CancelWork). A wipe already pending keeps its original time.
- after a disconnect the kubelet asks gRPC to connect again (conn.Connect() on ConnEnd),
  so a plugin that comes back at the same endpoint counts as connected again.

The deletion is what the kubelet's DeleteCollection with the field selector
spec.nodeName=<node>[,spec.driver=<driver>] does on the server: every matching slice goes.
It is made here as a list and one delete per slice, which the fake API server serves.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import grpc

log = logging.getLogger(__name__)

WIPING_DELAY = 30.0  # seconds: the kubelet's defaultWipingDelay
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# The kubelet retries a failed wipe with backoff (1 s doubling, 100 steps); tests need less.
WIPE_ATTEMPTS = 50
WIPE_RETRY = 0.1


@dataclass(frozen=True)
class KubeApi:
    """Where the emulated kubelet reaches the API server (plain HTTP on 127.0.0.1)."""

    url: str
    node: str

    def request(self, method: str, path: str) -> Any:
        req = urllib.request.Request(self.url + path, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"{}")

    def wipe(self, driver: str | None) -> int:
        """Delete the node's slices (of one driver, or all): the number deleted."""
        selector = f"spec.nodeName={self.node}" + (f",spec.driver={driver}" if driver else "")
        query = urllib.parse.urlencode({"fieldSelector": selector})
        listed = self.request("GET", f"{SLICES}?{query}")
        deleted = 0
        for item in listed.get("items") or []:
            name = urllib.parse.quote(item["metadata"]["name"])
            try:
                self.request("DELETE", f"{SLICES}/{name}")
                deleted += 1
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # gone already is what we wanted
                    raise
        return deleted


# The kubelet reconnects with grpc-go's backoff (1 s doubling to 120 s); the emulator
# retries sooner, so that a plugin coming back is seen within a test's patience.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
_READY = grpc.ChannelConnectivity.READY.value[0]
POLL = 0.05  # seconds between looks at the connections


@dataclass
class Link:
    """One registered plugin's connection as the kubelet watches it (monitoredPlugin)."""

    driver: str
    endpoint: str
    channel: grpc.Channel = field(repr=False)  # the emulator's own, to the same endpoint
    connected: bool = False


class SliceWiper:
    """Startup wipe, connection tracking and the delayed per-driver wipe of one kubelet."""

    def __init__(self, api: KubeApi, delay: float = WIPING_DELAY) -> None:
        self.api = api
        self.delay = delay
        self._lock = threading.Lock()
        self._links: dict[str, list[Link]] = {}
        self._pending: dict[str, threading.Timer] = {}
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.wiped: list[str | None] = []  # drivers wiped so far (None: all, at start)

    def start(self) -> None:
        """The kubelet's startup wipe (the node's slices of every driver), then the
        connection watcher."""
        self._wipe(None)
        self._watcher = threading.Thread(target=self._watch, name="kubelet-wiper", daemon=True)
        self._watcher.start()

    def add(self, driver: str, endpoint: str) -> None:
        """A plugin registered (DRAPluginManager.add): one that took over the endpoint of an
        earlier registration replaces it (the plugin watcher saw the socket go first)."""
        link = Link(driver, endpoint, grpc.insecure_channel(f"unix://{endpoint}", _CHANNEL_OPTIONS))
        old: list[Link] = []
        with self._lock:
            links = self._links.setdefault(driver, [])
            old = [x for x in links if x.endpoint == endpoint]
            for x in old:
                links.remove(x)
            links.append(link)
            self._sync(driver)  # not connected yet: a wipe is due unless it connects
        for x in old:
            x.channel.close()

    def connected(self, driver: str, endpoint: str | None = None) -> bool:
        """Whether a plugin of the driver (at that endpoint, if given) is connected."""
        with self._lock:
            return any(
                x.connected and endpoint in (None, x.endpoint) for x in self._links.get(driver, ())
            )

    def pending(self, driver: str) -> bool:
        with self._lock:
            return driver in self._pending

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(5)
        with self._lock:
            for timer in self._pending.values():
                timer.cancel()
            self._pending.clear()
            links = [x for group in self._links.values() for x in group]
            self._links.clear()
        for link in links:
            link.channel.close()

    # --- internals ----------------------------------------------------------------------
    def _watch(self) -> None:
        """HandleConn: a plugin is connected while its channel is READY; otherwise gRPC is
        asked to connect again (the kubelet's conn.Connect() after ConnEnd)."""
        while not self._stop.wait(POLL):
            with self._lock:
                links = [x for group in self._links.values() for x in group]
            for link in links:
                # grpc offers connectivity only through subscriptions, whose polling thread
                # can outlive a closed channel; this thread owns these channels instead.
                code = link.channel._channel.check_connectivity_state(not link.connected)
                connected = code == _READY
                with self._lock:
                    if self._stop.is_set() or link not in self._links.get(link.driver, ()):
                        continue  # closing, or replaced meanwhile
                    if link.connected != connected:
                        link.connected = connected
                        self._sync(link.driver)

    def _sync(self, driver: str) -> None:
        """DRAPluginManager.sync, with the lock held."""
        if self._stop.is_set():
            return
        if any(x.connected for x in self._links.get(driver, ())):
            timer = self._pending.pop(driver, None)
            if timer is not None:
                timer.cancel()
            return
        if driver in self._pending:
            return  # queued earlier: its time stands
        timer = threading.Timer(self.delay, self._fire, args=(driver,))
        timer.daemon = True
        self._pending[driver] = timer
        timer.start()

    def _fire(self, driver: str) -> None:
        with self._lock:
            if self._pending.get(driver) is None:
                return  # cancelled after it fired
        self._wipe(driver)
        with self._lock:
            self._pending.pop(driver, None)

    def _wipe(self, driver: str | None) -> None:
        for _ in range(WIPE_ATTEMPTS):
            if self._stop.is_set():
                return
            try:
                self.api.wipe(driver)
                with self._lock:
                    self.wiped.append(driver)
                return
            except (OSError, ValueError) as exc:  # the kubelet logs and retries
                log.info("wiping ResourceSlices driver=%s failed, retrying: %s", driver, exc)
                time.sleep(WIPE_RETRY)
