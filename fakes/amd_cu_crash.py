"""`python -m fakes.amd_cu_crash run ...`: the real `dra-plugin` entry point, killed with
SIGKILL (no clean-up of any kind) at the step named by AMD_CU_KILL_AT:

- `cu-booked`: an AMD share's compute units were written to the book, its spec not yet;
- `spec-written`: a claim's CDI spec (and the record beside it) is on disk, the journal's
  `completed` entry not yet;
- `cu-freed`: an unprepare freed the claim's units in the book, its record not yet dropped.

Cluster.start_daemon(module="fakes.amd_cu_crash", env={"AMD_CU_KILL_AT": step}).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

STEPS = ("cu-booked", "spec-written", "cu-freed")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    from dra_plugin.__main__ import main as plugin_main
    from dra_plugin.cdi import claims as cdi
    from dra_plugin.vendors.amd import cubook

    kill_at = os.environ.get("AMD_CU_KILL_AT", "")
    if kill_at not in STEPS:
        raise SystemExit(f"AMD_CU_KILL_AT must be one of {STEPS}, not {kill_at!r}")

    def after_step(step: str) -> None:
        if step == kill_at:
            _die()

    cubook.after_step = after_step
    if kill_at == "spec-written":
        write = cdi.write_rendered

        def write_then_die(cdi_dir: Path, rendered: Any, **kw: Any) -> Path:
            path = write(cdi_dir, rendered, **kw)
            _die()
            return path

        cdi.write_rendered = write_then_die  # type: ignore[assignment]
    return plugin_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
