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
import logging
from collections.abc import Mapping
from pathlib import Path

from dra_plugin.slices.publisher import SlicePublisher

log = logging.getLogger(__name__)


class RegistrationGate:
    """Opens each driver's pool creation on the kubelet's word, or after a timeout."""

    def __init__(self, publisher: SlicePublisher, wait_seconds: float) -> None:
        self._publisher = publisher
        self._wait = wait_seconds
        self._open: set[str] = set()

    def notified(self, driver: str, registered: bool) -> None:
        """The kubelet's registration status for `driver` (event loop)."""
        if registered:
            self._let_through(driver)

    async def expire(self, sockets: Mapping[str, Path], setting: str) -> None:
        """After the wait, open every driver the kubelet has not registered, each with a
        WARNING naming its socket and the setting of the directory it is in."""
        await asyncio.sleep(self._wait)
        for driver, socket in sockets.items():
            if driver in self._open:
                continue
            log.warning(
                "the kubelet has not registered driver=%s within %gs; publishing its devices "
                "anyway, but pods cannot use them until it does: is registration_socket=%s "
                "in the directory the kubelet's plugin watcher reads (%s)?",
                driver,
                self._wait,
                socket,
                setting,
            )
            self._let_through(driver)

    def _let_through(self, driver: str) -> None:
        if driver not in self._open:
            self._open.add(driver)
            self._publisher.allow_new_pools(driver)
