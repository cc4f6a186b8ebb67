"""A stand-in for `nvidia-smi`, installed as an executable in a fake NVIDIA driver root
(`install()`), for the commands the plugin runs:

    nvidia-smi compute-policy -i <uuid> --set-timeslice <0|1|2|3>
    nvidia-smi -i <uuid> -c <DEFAULT|0|PROHIBITED|2|EXCLUSIVE_PROCESS|3>
    nvidia-smi [-i <uuid>] --query-gpu=<uuid,compute_mode,timeslice> --format=csv,noheader

The GPUs live in a JSON state file, `{"gpus": {uuid: {"compute_mode": "Default",
"timeslice": 0, "timeslice_supported": true}}, "mig_devices": [uuid, ...]}`, which the
test writes and reads back (the settings outlive a plugin process, as on a GPU). It refuses
what the real one refuses: a GPU it does not know (status 6, "No devices were found"), a
time-slice or compute mode on a MIG device, an interval or mode out of range (status 2),
a time-slice on a GPU without compute policies (status 3, "Not Supported"). Every call is
one JSON line in the call log: {"argv": [...], "ld_preload": "..."}.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODES = {"0": "Default", "DEFAULT": "Default", "2": "Prohibited", "PROHIBITED": "Prohibited"}
MODES |= {"3": "Exclusive_Process", "EXCLUSIVE_PROCESS": "Exclusive_Process"}
NO_DEVICE, BAD_ARGUMENT, NOT_SUPPORTED = 6, 2, 3


def _fail(code: int, message: str) -> int:
    print(message, file=sys.stderr)
    return code


def main(argv: list[str], state_path: Path, log_path: Path) -> int:
    with open(log_path, "a") as f:
        f.write(json.dumps({"argv": argv, "ld_preload": os.environ.get("LD_PRELOAD", "")}) + "\n")
    state: dict[str, Any] = json.loads(state_path.read_text())
    gpus: dict[str, dict[str, Any]] = state["gpus"]
    mig: list[str] = state.get("mig_devices", [])
    args = list(argv)
    policy = args[:1] == ["compute-policy"]
    if policy:
        args = args[1:]
    opts: dict[str, str] = {}
    while args:
        key = args.pop(0)
        if key.startswith("--query-gpu=") or key.startswith("--format="):
            name, _, value = key.partition("=")
            opts[name] = value
        elif key in ("-i", "--id", "-c", "--compute-mode", "--set-timeslice") and args:
            opts[key.lstrip("-")[:1] if key in ("-i", "--id") else key] = args.pop(0)
        else:
            return _fail(BAD_ARGUMENT, f"Invalid combination of input arguments: {key}")
    uuid = opts.get("i")
    if uuid is not None and uuid in mig:
        what = "compute policies" if policy else "this operation"
        return _fail(BAD_ARGUMENT, f"{uuid} is a MIG device: {what} apply to whole GPUs only")
    if uuid is not None and uuid not in gpus:
        return _fail(NO_DEVICE, f"No devices were found matching {uuid!r}")
    if policy and "--set-timeslice" in opts and uuid is not None:
        value = opts["--set-timeslice"]
        if value not in ("0", "1", "2", "3"):
            return _fail(BAD_ARGUMENT, f"Invalid timeslice value {value!r}: expected 0..3")
        if not gpus[uuid].get("timeslice_supported", True):
            print(f"Setting the timeslice for GPU {uuid} is Not Supported")
            return NOT_SUPPORTED
        gpus[uuid]["timeslice"] = int(value)
        save(state_path, state)
        print(f"Set timeslice to {value} for GPU {uuid}")
        return 0
    if "-c" in opts and uuid is not None and not policy:
        mode = MODES.get(opts["-c"].upper())
        if mode is None:
            return _fail(BAD_ARGUMENT, f"Invalid compute mode {opts['-c']!r}")
        gpus[uuid]["compute_mode"] = mode
        save(state_path, state)
        print(f"Set compute mode to {mode.upper()} for GPU {uuid}.")
        return 0
    if "--query-gpu" in opts and not policy:
        fields = opts["--query-gpu"].split(",")
        for u in [uuid] if uuid is not None else sorted(gpus):
            gpu = {"uuid": u, **gpus[u]}
            try:
                print(", ".join(str(gpu[f] if f != "timeslice" else gpu.get(f, 0)) for f in fields))
            except KeyError as exc:
                return _fail(BAD_ARGUMENT, f"Field {exc} is not a valid field to query.")
        return 0
    return _fail(BAD_ARGUMENT, f"stand-in nvidia-smi: unsupported arguments {argv}")


def save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(path)


@dataclass(frozen=True)
class SmiStandIn:
    """An installed stand-in: where its state and call log are."""

    binary: Path
    state_path: Path
    log_path: Path

    def calls(self) -> list[list[str]]:
        if not self.log_path.exists():
            return []
        return [json.loads(line)["argv"] for line in self.log_path.read_text().splitlines()]

    def preloads(self) -> list[str]:
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line)["ld_preload"] for line in lines]

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.state_path.read_text())
        return result

    def gpu(self, uuid: str) -> dict[str, Any]:
        result: dict[str, Any] = self.state()["gpus"][uuid]
        return result

    def set_gpu(self, uuid: str, **fields: Any) -> None:
        """What something else on the node set on a GPU (the state, not through the tool)."""
        state = self.state()
        state["gpus"][uuid].update(fields)
        save(self.state_path, state)

    def timeslice_calls(self) -> list[tuple[str, int]]:
        """(uuid, interval) of each compute-policy --set-timeslice, in order."""
        return [(c[2], int(c[4])) for c in self.calls() if c[:1] == ["compute-policy"]]


def install(
    driver_root: Path,
    gpus: list[str],
    *,
    mig_devices: tuple[str, ...] = (),
    unsupported: tuple[str, ...] = (),
    bin_dir: str = "usr/bin",
) -> SmiStandIn:
    """Put the stand-in at `<driver_root>/<bin_dir>/nvidia-smi` with `gpus` (UUIDs) at
    compute mode Default and time-slice Default; state and log beside the driver root."""
    driver_root.mkdir(parents=True, exist_ok=True)
    state = driver_root.parent / f"{driver_root.name}-smi-state.json"
    log = driver_root.parent / f"{driver_root.name}-smi-calls.jsonl"
    body = {
        "gpus": {
            u: {
                "compute_mode": "Default",
                "timeslice": 0,
                "timeslice_supported": u not in unsupported,
            }
            for u in gpus
        },
        "mig_devices": list(mig_devices),
    }
    save(state, body)
    binary = driver_root / bin_dir / "nvidia-smi"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from pathlib import Path\n"
        "from fakes.nvidia_smi import main\n"
        f"sys.exit(main(sys.argv[1:], Path({str(state)!r}), Path({str(log)!r})))\n"
    )
    binary.chmod(0o755)
    return SmiStandIn(binary, state, log)
