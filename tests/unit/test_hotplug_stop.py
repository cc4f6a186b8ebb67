"""The core's DRM monitor keeps the Monitor contract: stop() only signals, join(timeout)
waits, so the daemon can tell every monitor at once and wait off the event loop."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from dra_plugin.host import hotplug, udev


class PipeMonitor:
    """A netlink socket stand-in: readable when the test writes to its pipe."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def fileno(self) -> int:
        return self.r


def test_stop_does_not_wait_for_a_busy_thread_and_join_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    source = PipeMonitor()
    monkeypatch.setattr(udev, "listen", lambda sources: ([("kernel", source)], []))
    monkeypatch.setattr(udev, "drain", lambda m, cards: bool(os.read(m.r, 64)))
    entered, release = threading.Event(), threading.Event()

    def on_change() -> None:  # stuck, as a handler blocked on a slow call would be
        entered.set()
        release.wait(30)

    mon = hotplug.DrmMonitor(on_change, debounce_seconds=0, udev_control=str(tmp_path / "none"))
    mon.start()
    os.write(source.w, b"change")
    assert entered.wait(10)
    mon.stop()  # returns at once although the thread is busy: it only signals
    assert mon.join(0.01) is False  # still in on_change
    release.set()
    assert mon.join(10) is True
    assert not any(t.name == "drm-monitor" for t in threading.enumerate())
    mon.stop()  # after join: nothing to do
    assert mon.join(1) is True
    os.close(source.r)
    os.close(source.w)
