"""What the API server drops: fields behind feature gates that are off.

The server drops a gated field silently; the client learns of it only from the object it
gets back. Sharing (DRAConsumableCapacity), partitions (DRAPartitionableDevices) and
compatibility groups (DRADeviceCompatibilityGroups) are probed once per driver with a
dry-run create before their first write, so a cluster with the gate off never stores a
half-published pool; taints (DRADeviceTaints) are noticed on the first write. Each loss
is said once, and the publisher then publishes without it.
"""

from __future__ import annotations

import logging
from typing import Any

from dra_plugin.kubeapi import KubeAPI
from dra_plugin.sharing import Sharing
from dra_plugin.slices.build import Obj, content_key, flat_device
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)


class Gates:
    """Per driver: which gated fields the server was seen to drop."""

    def __init__(self, api: KubeAPI) -> None:
        self._api = api
        self.drops_taints: set[str] = set()
        self.drops_sharing: set[str] = set()  # the server does not keep consumable capacity
        self.drops_counters: set[str] = set()  # nor KEP-4815 counters
        self.drops_groups: set[str] = set()  # nor KEP-5963 compatibility groups
        self._probed: set[tuple[str, str]] = set()  # (driver, feature) a dry run answered

    def sharing(self, driver: str, configured: Sharing | None) -> Sharing | None:
        return None if driver in self.drops_sharing else configured

    def dropped(self, driver: str) -> tuple[bool, bool, bool]:
        return (
            driver in self.drops_sharing,
            driver in self.drops_counters,
            driver in self.drops_groups,
        )

    async def probe(self, driver: str, desired: list[Obj], sharing: Sharing | None) -> bool:
        """Before the first write of shared devices or counters: whether a dry-run create
        loses them (then the driver falls back, and True says to plan again)."""
        if sharing is not None and await self._loses(driver, "sharing", desired, _multi):
            self._fall_back_to_exclusive(driver)
            return True
        if driver not in self.drops_counters and await self._loses(
            driver, "counters", desired, _counted
        ):
            self._fall_back_to_static(driver)
            return True
        if (
            driver not in self.drops_counters
            and driver not in self.drops_groups
            and await self._loses(driver, "groups", desired, _grouped)
        ):
            self._fall_back_to_ungrouped(driver)
            return True
        return False

    async def _loses(self, driver: str, feature: str, desired: list[Obj], has: Any) -> bool:
        if (driver, feature) in self._probed:
            return False
        sample = next((obj for obj in desired if has(obj)), None)
        if sample is None:
            return False
        got = await self._api.create_slice(sample, dry_run=True)
        self._probed.add((driver, feature))
        return not has(got)

    def note_write(self, driver: str, sent: Obj, got: Obj) -> None:
        """A written slice as the server kept it: a dropped field found here means the
        dry run said otherwise (a server upgraded or downgraded meanwhile)."""
        if _multi(sent) and not _multi(got):
            self._fall_back_to_exclusive(driver)
            return
        if _counted(sent) and not _counted(got):
            self._fall_back_to_static(driver)
            return
        if _grouped(sent) and not _grouped(got):
            self._fall_back_to_ungrouped(driver)
            return
        if content_key(sent) != content_key(got) and driver not in self.drops_taints:
            sent_taints = any(
                flat_device(d).get("taints") for d in sent["spec"].get("devices") or []
            )
            got_taints = any(
                flat_device(d).get("taints") for d in got.get("spec", {}).get("devices") or []
            )
            if sent_taints and not got_taints:
                # Like the upstream controller's DroppedFieldsError: without this we would
                # rewrite forever. Health stays visible through the `health` attribute.
                self.drops_taints.add(driver)
                log.warning(
                    "the API server dropped device taints (feature gate "
                    "DRADeviceTaints disabled?); publishing without taints driver=%s",
                    driver,
                )
            else:
                log.warning(
                    "the API server changed the slice we wrote driver=%s name=%s",
                    driver,
                    got.get("metadata", {}).get("name"),
                )

    def counters_unsupported(self, driver: str, version: str) -> None:
        """The server serves resource.k8s.io only in an older version than v1, whose
        counter shape this plugin does not write (Kubernetes before 1.34)."""
        if driver not in self.drops_counters:
            self._fall_back_to_static(
                driver, f"the API server has no resource.k8s.io/v1 ({version})"
            )

    def _fall_back_to_static(self, driver: str, why: str = "") -> None:
        self.drops_counters.add(driver)
        metrics.fields_dropped(driver, "DRAPartitionableDevices")
        log.warning(
            "%s: partitions made on demand need the DRAPartitionableDevices feature gate "
            "(beta and on by default from Kubernetes 1.36) on the API server and scheduler; "
            "publishing driver=%s without them (partitions that exist already, made by an "
            "administrator, stay published). Enable the gate and restart the plugin, or "
            "turn partitions off to silence this",
            why or "the API server dropped sharedCounters/consumesCounters",
            driver,
        )

    def _fall_back_to_ungrouped(self, driver: str) -> None:
        self.drops_groups.add(driver)
        metrics.fields_dropped(driver, "DRADeviceCompatibilityGroups")
        log.warning(
            "the API server dropped compatibilityGroups: devices of several partition "
            "modes of one GPU need the DRADeviceCompatibilityGroups feature gate (alpha in "
            "Kubernetes 1.37) on the API server and scheduler; publishing driver=%s with "
            "each GPU in its current mode only. Enable the gate and restart the plugin, or "
            "turn the partition modes off to silence this",
            driver,
        )

    def _fall_back_to_exclusive(self, driver: str) -> None:
        # Like the taint case below: the server drops fields behind a feature gate.
        # A half-shared pool (capacity without allowMultipleAllocations) must not stay.
        self.drops_sharing.add(driver)
        log.error(
            "the API server dropped allowMultipleAllocations and the capacity request "
            "policies: GPU sharing needs the DRAConsumableCapacity feature gate (beta "
            "and on by default from Kubernetes 1.36, alpha in 1.34-1.35) on the API "
            "server, scheduler and kubelet; publishing driver=%s devices for exclusive "
            "use (one claim per device). Enable the gate and restart the plugin, or set "
            "the sharing mode to exclusive to silence this",
            driver,
        )


def _multi(obj: Obj) -> bool:
    return any(
        flat_device(d).get("allowMultipleAllocations") is True
        for d in obj.get("spec", {}).get("devices") or []
    )


def _counted(obj: Obj) -> bool:
    """Whether a slice carries KEP-4815 counters (its sets, or devices consuming them)."""
    spec = obj.get("spec") or {}
    return bool(spec.get("sharedCounters")) or any(
        flat_device(d).get("consumesCounters") for d in spec.get("devices") or []
    )


def _grouped(obj: Obj) -> bool:
    """Whether a slice has a device whose counters carry KEP-5963 compatibility groups."""
    return any(
        use.get("compatibilityGroups")
        for d in (obj.get("spec") or {}).get("devices") or []
        for use in flat_device(d).get("consumesCounters") or []
    )
