"""Waiting on a condition instead of a fixed time: poll `predicate` with a short interval
until it is truthy or `timeout` passes, then fail naming what was awaited.

A fixed sleep either wastes time on a fast machine or passes too early on a slow one;
a deadline on a condition does neither. Tests that assert "nothing happened" first wait
here for a positive signal that the work in question ran."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_SECONDS = 0.02


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, *, what: str) -> T:
    """Block until predicate() is truthy and return its value; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_SECONDS)


async def async_wait_for(predicate: Callable[[], T], timeout: float = 10.0, *, what: str) -> T:
    """wait_for for code on an event loop: polls without blocking the loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(POLL_SECONDS)
