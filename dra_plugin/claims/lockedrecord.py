"""The record as every locked pass sees it: taken under the checkpoint's file lock, loaded
(rebuilt after damage), its boot marked, what a crash left half done settled; and what
start-up does to it once (temp files, orphans, what vendors made, claims to re-read)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import State
from dra_plugin.claims import rebuild
from dra_plugin.claims.devicemetadata import MetadataFiles
from dra_plugin.claims.made import MadeDevices
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class LockedRecord:
    def __init__(
        self,
        checkpoint: Checkpoint,
        cdi_root: Path,
        driver: str,
        node_name: str,
        metadata: MetadataFiles,
        made: MadeDevices,
    ) -> None:
        self.checkpoint = checkpoint
        self.cdi_root = cdi_root
        self.driver = driver
        self.node_name = node_name
        self._metadata = metadata
        self._made = made

    def locked(self, fn: Callable[[State], _T]) -> tuple[_T, set[str]]:
        """`fn(state)` under the lock, the record loaded and settled, and the devices held
        after it. Blocks (the lock, the disk): called in the pass thread only."""
        ck = self.checkpoint
        ck.lock.acquire()
        try:
            loaded = ck.load(partial(rebuild.rebuild, self.cdi_root, self.driver, self.node_name))
            state = loaded.state
            self.settle(state)
            if loaded.rebooted:
                log.warning(
                    "checkpoint is from an earlier boot driver=%s claims=%d: keeping them; "
                    "their CDI specs are re-rendered when the kubelet prepares them again",
                    self.driver,
                    len(state.claims),
                )
                try:
                    ck.mark_boot()
                except OSError as exc:  # tried again by the next pass
                    log.error("cannot record the boot in the checkpoint: %s", exc)
            result = fn(state)
            return result, set(state.claims.by_device)  # O(devices), not claims
        finally:
            ck.lock.release()

    def settle(self, state: State, *, after_crash: bool = True) -> list[str]:
        """Undo/finish half-done entries. When even recording that fails (disk full) they
        stay as they are, consistent, and the next pass tries again.

        After a crash, a `started` prepare whose spec and record file were both written
        whole is kept as prepared: a journal cut short looks the same, and undoing an
        acknowledged prepare would hand its device to another claim. The kubelet prepares
        it again (answered from the record) or unprepares it."""
        written = rebuild.written(state, self.cdi_root, self.driver) if after_crash else []
        if written:
            try:
                self.checkpoint.put(written)
            except OSError as exc:  # the next pass tries again; until then they stay held
                log.error("cannot record kept claims in the checkpoint: %s", exc)
        dropped = rebuild.settle(state, self.cdi_root, self._made.remove_owned)
        try:
            self.checkpoint.drop(dropped)
        except OSError as exc:
            log.error("cannot record settled claims %s in the checkpoint: %s", dropped, exc)
        return dropped

    def startup(self, state: State) -> set[str]:
        """Start-up's clean-up, under the lock; the claims to read from the API before
        they are answered (rebuild.unproven)."""
        ck = self.checkpoint
        ck.remove_temp_files()
        adopted = rebuild.adopt_orphans(state, self.cdi_root, self.driver, self.node_name)
        if adopted:
            ck.put(adopted)
            metrics.checkpoint_damage(self.driver, "cdi", "claims missing")
        intact = ck.damage is None and not adopted
        rebuild.collect_orphans(state, self.cdi_root, self.driver, intact=intact)
        self._metadata.collect_orphans(state.claims.values())
        self._made.reconcile(state)
        return rebuild.unproven(state, self.cdi_root, self.driver)
