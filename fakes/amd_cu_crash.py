"""`python -m fakes.amd_cu_crash run ...`: the real `dra-plugin` entry point, killed with
SIGKILL (no clean-up of any kind) at the step named by AMD_CU_KILL_AT:

- `cu-booked`: an AMD share's compute units were written into its `started` record, its
  spec not yet;
- `spec-written`: a claim's CDI spec (and the record beside it) is on disk, the journal's
  `completed` entry not yet;
- `cu-freed`: an unprepare's release of the claim's units, its `unpreparing` record not
  yet dropped.

Cluster.start_daemon(module="fakes.amd_cu_crash", env={"AMD_CU_KILL_AT": step}).
"""

from __future__ import annotations

import os
import signal
import sys

STEPS = ("cu-booked", "spec-written", "cu-freed")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    from dra_plugin import crashpoints
    from dra_plugin.__main__ import main as plugin_main

    kill_at = os.environ.get("AMD_CU_KILL_AT", "")
    if kill_at not in STEPS:
        raise SystemExit(f"AMD_CU_KILL_AT must be one of {STEPS}, not {kill_at!r}")

    def at(step: str) -> None:
        if step == kill_at:
            _die()

    crashpoints.install(at)  # the vendor's points and the claim pass's `spec-written`
    return plugin_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
