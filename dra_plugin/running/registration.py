"""A driver's first ResourceSlices wait for the kubelet to register the driver.

A slice tells the scheduler it may send pods with this driver's devices to this node. A
pod that arrives before the kubelet's plugin watcher has registered the driver fails its
prepare with "DRA driver ... is not registered" and waits for the kubelet's retry (about
12 s). So the publisher creates a driver's pool only once the kubelet has called
NotifyRegistrationStatus with plugin_registered=true on the driver's registration socket,
or once `wait_seconds` have passed without that: then a WARNING names the socket and
the devices are published anyway, so a node whose kubelet watches another directory
still shows them.

What already exists is never held: a restart or a rolling update finds the pool the
previous instance left (slices are not deleted at shutdown) and keeps it true at once;
the new instance registers on its own socket beside the old one. Later registrations
(a restarted kubelet registering the socket again) change nothing: the gate is open for
the life of the process. A rejection (plugin_registered=false) is logged by the
registration servicer and opens nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from dra_plugin.config import Config
from dra_plugin.slices.publisher import SlicePublisher

log = logging.getLogger(__name__)


class RegistrationGate:
    """Opens each driver's pool creation on the kubelet's word, or after the wait."""

    def __init__(self, publisher: SlicePublisher, cfg: Config, drivers: Sequence[str]) -> None:
        self._publisher = publisher  # made with hold_new_pools when the wait is not 0
        self._wait = cfg.registration_wait_seconds
        self._sockets = {d: cfg.registration_socket(d) for d in drivers}
        self._setting = cfg.setting("kubelet_registrar_directory_path")
        self._open: set[str] = set()
        self._expiry: asyncio.Task[None] | None = None

    def notified(self, driver: str, registered: bool) -> None:
        """The kubelet's registration status for `driver` (event loop)."""
        if registered:
            self._let_through(driver)

    def start(self) -> None:
        """The wait counts from now: the registration sockets are served."""
        if self._wait > 0:
            self._expiry = asyncio.create_task(self._expire(), name="registration-wait")

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry

    async def _expire(self) -> None:
        """After the wait, open every driver the kubelet has not registered, each with a
        WARNING naming its socket and the setting of the directory it is in."""
        await asyncio.sleep(self._wait)
        for driver, socket in self._sockets.items():
            if driver in self._open:
                continue
            log.warning(
                "the kubelet has not registered driver=%s within %gs; publishing its devices "
                "anyway, but pods cannot use them until it does: is registration_socket=%s "
                "in the directory the kubelet's plugin watcher reads (%s)?",
                driver,
                self._wait,
                socket,
                self._setting,
            )
            self._let_through(driver)

    def _let_through(self, driver: str) -> None:
        if driver not in self._open:
            self._open.add(driver)
            self._publisher.allow_new_pools(driver)
