"""amdgpu's side of a compute partition mode write on the simulated node (simnode.py).

On a real node a program writes "CPX" to the GPU's `current_compute_partition` and amdgpu
re-creates the partitions before the write returns. Under umockdev the write lands in a
plain file of the testbed; `PartitionKernel` is the kernel here: a thread that sees a
mode written there that the card is not in, and switches the card (its KFD nodes and
partition devices gone and made again, uevents sent) after `latency` seconds, so a
plugin that does not wait for the new partitions sees the old ones. It keeps going when
the writer is killed, as the kernel finishes a switch whatever happens to the writer.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

from fakes.simnode import SimNode

MODES = ("SPX", "DPX", "QPX", "CPX")


class PartitionKernel:
    def __init__(self, node: SimNode, latency: float = 0.3, poll: float = 0.05) -> None:
        self.node = node
        self.latency = latency
        self.poll = poll
        self._switched: list[tuple[str, str]] = []
        # A switch and its entry in `switched` are one step to a reader of either.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="amdgpu-partition", daemon=True)

    def __enter__(self) -> PartitionKernel:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def switched(self) -> list[tuple[str, str]]:
        """(PCI address, mode) of every switch so far, in order; one being made (its
        partitions already there for the plugin to see) is waited for."""
        with self._lock:
            return list(self._switched)

    def mode(self, pci_address: str) -> str:
        with self._lock:
            return self._mode(pci_address)

    def _mode(self, pci_address: str) -> str:
        board = self.node.card(pci_address).amd
        assert board is not None and board.partitions is not None
        return board.partitions[0]

    def _written(self, pci_address: str) -> str | None:
        card = self.node.card(pci_address)
        path = Path(self.node.root + card.syspath, "current_compute_partition")
        try:
            text = path.read_text().strip().upper()
        except OSError:
            return None
        return text if text in MODES and text != self._mode(pci_address) else None

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            for card in self.node.cards:
                if card.amd is None or card.amd.partitions is None:
                    continue
                mode = self._written(card.pci_address)
                if mode is None:
                    continue
                if self._stop.wait(self.latency):
                    return
                with self._lock:
                    self.node.switch_compute_partition(card.pci_address, mode)
                    self._switched.append((card.pci_address, mode))
