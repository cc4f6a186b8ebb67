"""When a lone prepare's locked pass runs on the event loop instead of the pass thread.

A lone prepare of one claim waits on nothing but this node's disk: a few small files and
one fdatasync, about 0.5 ms. Handing that to the pass thread and back cost it two thread
wake-ups (0.12-0.17 ms measured, a third of what it adds above the floor; the thread's
queue, then `call_soon_threadsafe` and the loop's wake-up). So such a pass runs on the
loop, in the group commit's task, while the loop has nothing else of ours to do. Every
other pass (several claims, a burst, unprepare, start-up) stays in the thread.

A pass runs on the loop only when it cannot wait on anything slower than the disk:

1. one call of one claim not prepared already (`ClaimPreparer._run_batch`);
2. the checkpoint's file lock free now (never waited for on the loop: another
   instance's pass may hold it);
3. the record as cached: nothing to rebuild after damage, no boot to mark, nothing
   half done to settle (settling may release what a vendor made);
4. the vendor's hook says making the claim's devices waits on nothing slower than the
   disk (`OnDemand.work` is not WAITS: no partition of a GPU made, no tool run, no
   daemon started);
5. the disk answered lately: a pass on the loop that took longer than `budget` sends
   the next ones to the thread for `backoff` seconds, so a stalling disk holds the loop
   once per `backoff` at most.

Conditions 2-4 are known only once the pass has looked (under the lock, before its
`started` line or anything else is written): the pass then stops with `NotOnLoop`,
leaving no trace, and runs again from the start in the thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BUDGET = 0.05  # s: what a pass may hold the loop before the next ones go to the thread
BACKOFF = 60.0  # s


class NotOnLoop(Exception):
    """A pass that must wait on more than the disk stops here, before any side effect."""


class OnLoop:
    """Condition 5: whether the disk has been quick enough to run a pass on the loop."""

    def __init__(
        self,
        enabled: bool = True,
        *,
        budget: float = BUDGET,
        backoff: float = BACKOFF,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.budget = budget
        self.backoff = backoff
        self._clock = clock
        self._until = 0.0  # passes go to the thread until then
        self.tries = 0  # passes begun on the loop, for tests and benchmarks
        self.passes = 0  # ... and done there

    def allowed(self) -> bool:
        return self.enabled and self._clock() >= self._until

    def started(self) -> float:
        return self._clock()

    def ran(self, since: float, *, done: bool) -> None:
        """A pass ran on the loop from `since` (`done`: to its end, else it stopped with
        NotOnLoop); a slow one sends the next ones to the thread."""
        self.tries += 1
        self.passes += done
        if self._clock() - since > self.budget:
            self._until = self._clock() + self.backoff
