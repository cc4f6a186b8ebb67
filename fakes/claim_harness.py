"""Claims under test: fake devices and claims, an in-memory API, and a crash harness.

`python -m fakes.claim_harness ROUNDS SEED WORKDIR` runs crash rounds in ONE fresh
interpreter (no threads in the parent), forking one child per plugin "process": it starts
up (recovery), repeats the kubelet call its killed predecessor was making and reports the
result and the on-disk state, then makes the next call with a step hook that SIGKILLs it
at a randomly chosen step. The parent checks every report and prints a JSON summary.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dra_plugin import crashpoints
from dra_plugin.cdi import claims as cdi
from dra_plugin.cdi import rules as cdispec
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import COMPLETED, State
from dra_plugin.claims.claims import ClaimPreparer, ClaimRef
from dra_plugin.config import Config
from dra_plugin.devices import Device, DeviceNode, make_device
from dra_plugin.kubeapi import NotFoundError
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.base import OnDemand
from dra_plugin.vendors.claimcontext import ClaimContext
from dra_plugin.vendors.intel.ids import INTEL
from dra_plugin.vendors.nvidia.model import NVIDIA

DRIVER = "gpu.intel.com"
NODE = "mini-1"


def uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def intel_device(index: int, driver: str = DRIVER) -> Device:
    bdf = f"0000:{index:02x}:00.0"
    card, render = f"/dev/dri/card{index}", f"/dev/dri/renderD{128 + index}"
    return make_device(
        name=f"0000-{index:02x}-00-0-0x56a0",
        vendor=INTEL,
        driver=driver,
        attributes={"model": "Arc A770"},
        pci_address=bdf,
        nodes=(
            DeviceNode(card, 226, index),
            DeviceNode(render, 226, 128 + index),
            DeviceNode(f"/dev/dri/by-path/pci-{bdf}-card", host_path=card),
            DeviceNode(f"/dev/dri/by-path/pci-{bdf}-render", host_path=render),
        ),
    )


def nvidia_device(minor: int, driver: str = "gpu.nvidia.com") -> Device:
    return make_device(
        name=f"gpu-{minor}",
        vendor=NVIDIA,
        driver=driver,
        attributes={"productName": "NVIDIA H200"},
        uuid=f"GPU-{minor:08d}-aaaa-bbbb-cccc-dddddddddddd",
        extra={"minor": str(minor)},
    )


def claim(
    i: int,
    results: list[dict[str, Any]],
    *,
    namespace: str = "default",
    name: str | None = None,
    claim_uid: str | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim as the API returns it."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name or f"claim-{i}",
            "namespace": namespace,
            "uid": claim_uid or uid(i),
        },
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {"devices": {"results": results}}
    return obj


def result(
    device: str, *, request: str = "gpu", driver: str = DRIVER, pool: str = NODE, **extra: Any
) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def ref(obj: Mapping[str, Any], claim_uid: str | None = None) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(meta["namespace"], claim_uid or meta["uid"], meta["name"])


class FakeApi:
    """In-memory claims by namespace/name; counts GETs."""

    def __init__(self, claims: list[dict[str, Any]] | None = None) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0
        for c in claims or []:
            self.add(c)

    def add(self, obj: dict[str, Any]) -> None:
        self.claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.gets += 1
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise NotFoundError(f"resourceclaims {namespace}/{name} not found") from None


_VENDOR_EDITS: Any = object()  # preparer(): claim edits as the daemon makes them


def preparer(
    root: Path,
    api: Any,  # FakeApi, or a real client (KubeAPI): what has get_claim
    devices: Sequence[Device],
    *,
    driver: str = DRIVER,
    node_name: str = NODE,
    boot: str = "boot-1",
    options: cdi.CdiOptions | None = None,
    sharing: Sharing | None = None,
    nvidia_strategy: str = "auto",
    device_metadata: bool = False,
    claim_edits: Any = _VENDOR_EDITS,
    on_demand: OnDemand | None = None,
    opaque_configs: Collection[tuple[str, str]] = frozenset(),
) -> ClaimPreparer:
    """A ClaimPreparer over root/state and root/cdi (made here), reading claims from `api`
    and holding `devices`; `claim_edits` None is the core's node edits only."""
    (root / "state").mkdir(parents=True, exist_ok=True)
    (root / "cdi").mkdir(parents=True, exist_ok=True)
    return ClaimPreparer(
        driver=driver,
        node_name=node_name,
        state_dir=root / "state",
        cdi_root=root / "cdi",
        cdi_options=options,
        claim_edits=vendor_edits(nvidia_strategy) if claim_edits is _VENDOR_EDITS else claim_edits,
        fetch_claim=api.get_claim,
        devices=lambda: {d.name: d for d in devices},
        boot_id=lambda: boot,
        sharing=sharing,
        device_metadata=device_metadata,
        on_demand=on_demand,
        opaque_configs=opaque_configs,
    )


class Harness:
    """One node's claim world in a folder, for tests (the `harness` fixture): preparers
    over `root` holding `devices` (the test module's DEVICES), each reading a FakeApi."""

    def __init__(self, root: Path, devices: Sequence[Device]) -> None:
        self.root = root
        self.devices = list(devices)

    def preparer(
        self,
        claims: FakeApi | Iterable[dict[str, Any]] = (),
        *,
        root: Path | None = None,
        devices: Sequence[Device] | None = None,
        started: bool = False,
        **options: Any,
    ) -> ClaimPreparer:
        """A preparer reading `claims` (a fresh FakeApi holding them, or the FakeApi given),
        over `root` (default: the harness's) with `devices` (default: the harness's);
        `started`: its startup() has run. `options` are preparer()'s."""
        api = claims if isinstance(claims, FakeApi) else FakeApi(list(claims))
        p = preparer(
            self.root if root is None else root,
            api,
            self.devices if devices is None else devices,
            **options,
        )
        if started:
            asyncio.run(p.startup())
        return p


def vendor_edits(
    nvidia_strategy: str = "auto",
) -> Callable[[Sequence[Device], ClaimContext], cdi.ClaimEdits]:
    """Claim edits as the daemon makes them: from the devices' vendor, default settings."""

    def edits(devices: Sequence[Device], claim: ClaimContext) -> cdi.ClaimEdits:
        driver = Config().driver(devices[0].vendor)
        if driver.vendor.name == NVIDIA:
            driver = driver.rebound(replace(driver.settings, cdi_strategy=nvidia_strategy))
        return driver.claim_edits(devices, Path("/"), claim)

    return edits


def check_consistent(
    root: Path, driver: str = DRIVER, max_shares: int | None = None
) -> dict[str, Any]:
    """Assert the on-disk invariants; return the checkpoint's claims (uid -> raw record)."""
    cdi_dir = root / "cdi"
    state = Checkpoint(root / "state", driver, boot_id=str).read() or State("")
    files = cdi.list_spec_files(cdi_dir, [driver])[driver]
    for u, rec in state.claims.items():
        assert rec.state == COMPLETED, f"{u} left {rec.state}"
        assert u in files, f"completed claim {u} has no spec file"
        spec = json.loads(files[u].read_text())
        errors = cdispec.validate_spec(spec)
        assert not errors, errors
    shares: dict[str, int] = {}
    for rec in state.claims.values():
        for d in rec.devices:
            if d.share_id is not None:
                shares[d.device] = shares.get(d.device, 0) + d.shares
    limit = N_SHARED if max_shares is None else max_shares
    assert all(n <= limit for n in shares.values()), f"over-subscribed: {shares}"
    orphans = set(files) - set(state.claims)
    assert not orphans, f"orphan spec files {orphans}"
    leftovers = [n for n in os.listdir(cdi_dir) if ".tmp" in n]
    assert not leftovers, leftovers
    return {u: r.devices for u, r in state.claims.items()}


# --- crash rounds --------------------------------------------------------------------
N_EXCLUSIVE = 8
N_SHARED = 4  # claims 8..11 share one more device, which has exactly that many shares
N_CLAIMS = N_EXCLUSIVE + N_SHARED
SHARING = Sharing(N_SHARED)
REPORT = "report.json"
KILLED_AT = "killed_at"


def share_id(i: int) -> str:
    return f"5ea1{i:04x}-0000-4000-8000-{i:012x}"


def _world() -> tuple[FakeApi, list[Device]]:
    devices = [intel_device(i) for i in range(N_EXCLUSIVE + 1)]
    claims = [claim(i, [result(devices[i].name)]) for i in range(N_EXCLUSIVE)]
    claims += [
        claim(i, [result(devices[N_EXCLUSIVE].name, shareID=share_id(i))])
        for i in range(N_EXCLUSIVE, N_CLAIMS)
    ]
    # One claim also looks at device 0 with adminAccess: allowed next to its owner.
    claims[1]["status"]["allocation"]["devices"]["results"].append(
        result(devices[0].name, request="monitor", adminAccess=True)
    )
    return FakeApi(claims), devices


@dataclass(frozen=True)
class Call:
    boot: str
    op: str  # prepare | unprepare
    indexes: tuple[int, ...]
    kill_at: int = 0  # the n-th step of the call, whichever step it is (0: never)

    def refs(self, api: FakeApi) -> list[ClaimRef]:
        return [ref(api.claims[("default", f"claim-{i}")]) for i in self.indexes]


async def _do(
    root: Path, call: Call, on_step: crashpoints.Hook | None, report: dict[str, Any]
) -> dict[str, str]:
    api, devices = _world()
    crashpoints.install(on_step)  # this process's crash points (it is forked for the call)
    p = preparer(root, api, devices, boot=call.boot, sharing=SHARING)
    await p.startup()
    try:  # startup recovery alone must leave a consistent state
        check_consistent(root)
    except AssertionError as exc:
        report["inconsistent"] = f"after startup: {exc}"
    if call.op == "prepare":
        return {u: r.error for u, r in (await p.prepare(call.refs(api))).items()}
    return {u: r.error for u, r in (await p.unprepare(call.refs(api))).items()}


def _process(root: Path, repeat: Call | None, nxt: Call | None) -> None:
    """The body of one plugin process: repeat the interrupted call, report, make the next."""
    seen: list[str] = []

    def on_step(name: str) -> None:
        seen.append(name)
        if nxt is not None and len(seen) == nxt.kill_at:
            (root / KILLED_AT).write_text(name)  # where we die, for the summary
            os.kill(os.getpid(), signal.SIGKILL)

    async def go() -> None:
        report: dict[str, Any] = {}
        if repeat is not None:
            got = await _do(root, repeat, None, report)
            report["errors"] = {u: e for u, e in got.items() if e}
            try:
                report["claims"] = sorted(check_consistent(root))
            except AssertionError as exc:
                report.setdefault("inconsistent", str(exc))
        (root / REPORT).write_text(json.dumps(report))
        if nxt is not None:
            await _do(root, nxt, on_step, {})

    asyncio.run(go())


def _child(fn: Callable[[], None]) -> int:
    """Run fn in a forked child; return its wait status."""
    pid = os.fork()
    if pid == 0:  # child: never returns into the parent's code
        code = 0
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent by exit code
            print(f"child failed: {exc!r}", file=sys.stderr)
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def _check(report: dict[str, Any], call: Call, before: set[str]) -> set[str]:
    """The repeated call succeeded and the state is what that call promises."""
    assert "inconsistent" not in report, report["inconsistent"]
    assert not report["errors"], f"repeated {call.op} failed: {report['errors']}"
    after = set(report["claims"])
    uids = {uid(i) for i in call.indexes}
    if call.op == "prepare":
        assert uids <= after, f"prepared claims missing: {uids - after}"
    else:
        assert not uids & after, f"unprepared claims still recorded: {uids & after}"
    lost = before - uids - after
    assert not lost, f"claims lost: {lost}"
    return after


def main(argv: list[str]) -> int:
    rounds, seed, work = int(argv[0]), int(argv[1]), Path(argv[2])
    logging.disable(logging.CRITICAL)  # recovery warnings are expected here
    rng = random.Random(seed)
    boot, killed, steps = 0, 0, dict[str, int]()
    root, prev, before = work, None, set[str]()
    for n in range(rounds + 1):
        if n % 25 == 0 and prev is None:  # now and then a fresh node: empty and full states
            root = work / f"node-{n}"
            (root / "cdi").mkdir(parents=True)
            before = set()
        if rng.random() < 0.15:
            boot += 1  # a reboot between the previous call and this one
        nxt = None
        if n < rounds:
            op = rng.choice(("prepare", "prepare", "unprepare"))
            idx = tuple(rng.sample(range(N_CLAIMS), rng.randint(1, 4)))
            nxt = Call(f"boot-{boot}", op, idx, kill_at=rng.randint(1, 4))
        (root / KILLED_AT).unlink(missing_ok=True)
        status = _child(lambda r=root, p=prev, x=nxt: _process(r, p, x))  # type: ignore[misc]
        report = json.loads((root / REPORT).read_text())
        try:
            if prev is not None:
                before = _check(report, prev, before)
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                killed += 1
                step = (root / KILLED_AT).read_text()
                steps[step] = steps.get(step, 0) + 1
            else:
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"status {status}"
        except AssertionError as exc:
            print(json.dumps({"failed_round": n, "seed": seed, "error": str(exc)}))
            return 1
        prev = nxt
    print(json.dumps({"rounds": rounds, "killed": killed, "killed_at": steps}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
