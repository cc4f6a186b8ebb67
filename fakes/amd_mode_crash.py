"""`python -m fakes.amd_mode_crash run ...`: the real `dra-plugin` entry point, killed with
SIGKILL (no clean-up of any kind) at the step of an AMD mode switch named by
AMD_MODE_KILL_AT (vendors/amd/modeswitch.py):

- `mode-intent`: the switch is in the claim's record, the mode not yet written;
- `mode-written`: the mode is written (the kernel finishes the switch), its partitions
  not yet waited for;
- `mode-ready`: the new partitions are there, the claim's spec not yet written;
- `spec-written`: the claim's CDI spec is on disk, its `completed` entry not yet.

Cluster.start_daemon(module="fakes.amd_mode_crash", env={"AMD_MODE_KILL_AT": step}).
"""

from __future__ import annotations

import os
import signal
import sys

STEPS = ("mode-intent", "mode-written", "mode-ready", "spec-written")


def main() -> int:
    from dra_plugin import crashpoints
    from dra_plugin.__main__ import main as plugin_main

    kill_at = os.environ.get("AMD_MODE_KILL_AT", "")
    if kill_at not in STEPS:
        raise SystemExit(f"AMD_MODE_KILL_AT must be one of {STEPS}, not {kill_at!r}")

    def at(step: str) -> None:
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    crashpoints.install(at)
    return plugin_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
