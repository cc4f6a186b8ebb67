"""A stand-in for `nvidia-smi`'s compute-mode commands (what MPS needs; the time-slicing
stand-in covers `compute-policy`):

    nvidia-smi -i <uuid> -c <DEFAULT|EXCLUSIVE_PROCESS|PROHIBITED|0|2|3>
    nvidia-smi --query-gpu=uuid,compute_mode --format=csv,noheader

The GPUs and their modes live in FAKE_SMI_STATE (JSON {uuid: mode}, written by the test);
an unknown GPU or mode is refused as the real one refuses it (exit 6 / 2). Every call is
one JSON line in FAKE_SMI_LOG.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MODES = {"0": "DEFAULT", "2": "PROHIBITED", "3": "EXCLUSIVE_PROCESS"}
QUERY = {"DEFAULT": "Default", "PROHIBITED": "Prohibited", "EXCLUSIVE_PROCESS": "Exclusive_Process"}


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_SMI_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"argv": argv}) + "\n")
    state_path = Path(os.environ["FAKE_SMI_STATE"])
    state: dict[str, str] = json.loads(state_path.read_text())
    if argv[:1] == ["--query-gpu=uuid,compute_mode"]:
        for uuid, mode in state.items():
            print(f"{uuid}, {QUERY.get(mode, mode)}")
        return 0
    if len(argv) == 4 and argv[0] == "-i" and argv[2] == "-c":
        uuid, mode = argv[1], MODES.get(argv[3], argv[3])
        if uuid not in state:
            print(f"No devices were found matching {uuid}", file=sys.stderr)
            return 6
        if mode not in QUERY:
            print(f'Invalid compute mode "{argv[3]}"', file=sys.stderr)
            return 2
        state[uuid] = mode
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(state_path)
        print(f"Set compute mode to {mode} for GPU {uuid}.")
        return 0
    print(f"stand-in nvidia-smi: unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
