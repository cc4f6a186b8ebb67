"""MPS for NVIDIA claims, a per-claim step (claimsteps.py): the GPU in EXCLUSIVE_PROCESS,
an MPS control daemon in a Deployment of its own (mpsdaemon.py), a tmpfs for its
`/dev/shm` and a pipe dir under the plugin's dir, ready before the prepare returns, all of
it gone after the unprepare.

Two kinds of daemon:
- one per MPS config group of a claim: the devices one of its NVIDIA configs asking for
  MPS won for (`mps_for`; claimconfigs.py groups them as NVIDIA's driver does), with that
  config's limits as the daemon's defaults, so a claim with two MPS configs (30 % for one
  request, 70 % for another) gets two daemons, each with its own limits, as NVIDIA's
  driver starts them; only the group's devices get its pipe and shm (mpslimits.client_edits);
- one per shared GPU (NVIDIA_SHARES_MPS), serving every claim holding a share of it,
  made by the first and removed after the last; each claim's consumed capacity becomes
  its own limits, handed to its processes through their environment (mpsdaemon.ClientLimits).

Crash safety. The claims' record is the one store of a daemon: each device it serves
keeps the whole daemon in its vendor entry (`mps`, mpsrecord.py), written into the
`started` claim (ClaimContext.record) before anything of the daemon is made, and leaving
the record with the claim, after the daemon is gone. Who holds a shared GPU's daemon is
read from the other claims' entries (ClaimContext.peers, under the claim lock). The dir
`<plugin dir>/mps/<claim-UID-GROUP | device-NAME>` holds the daemon's runtime state only
(its pipe and log dirs, the tmpfs for its shm). Every step is idempotent, so a kill -9
anywhere is settled by the same code again: the next prepare, the unprepare, or start-up
(`reconcile`: a dir no held claim names is torn down; `daemon.json`, the record of earlier
versions, is read once, mpsmigrate.py). A dir whose claim's record is lost (damage with
no spec record to rebuild it from) is torn down at the next start without knowing its
GPUs: they stay in EXCLUSIVE_PROCESS, which doctor reports with the command to reset them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.devices import Device
from dra_plugin.host import files
from dra_plugin.host.tmpfs import Mounter, default_size
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import (
    AllocatedDevice,
    ClaimContext,
    NotRecordable,
    VendorEntry,
)
from dra_plugin.vendors.nvidia import mpsdaemon, mpslimits, mpsmigrate, mpsrecord
from dra_plugin.vendors.nvidia.mpsdaemon import ClientLimits, DaemonLimits
from dra_plugin.vendors.nvidia.mpslimits import (
    ENTRY_KEY,
    MpsFor,
    MpsOptions,
    no_mps,
    share_limits,
)
from dra_plugin.vendors.nvidia.mpsmake import DaemonHost
from dra_plugin.vendors.nvidia.mpsrecord import DaemonRecord, Plan, claim_dir, daemon_of, our_dir
from dra_plugin.vendors.nvidia.nvidiasmi import NvidiaSmi
from dra_plugin.vendors.workloads import Workloads

log = logging.getLogger(__name__)

DIR_NAME = "mps"

Own = dict[str, tuple[DaemonRecord, ClientLimits, list[str]]]  # dir -> daemon, limits, devices
Named = dict[str, tuple[DaemonRecord, dict[str, ClientLimits]]]  # dir -> daemon, uid -> limits


def own_daemons(claim: ClaimContext) -> Own:
    """The daemons the claim's own entries name, by dir: each with the claim's own limits
    and the claim's devices it serves."""
    out: Own = {}
    for d in claim.devices:
        got = daemon_of(d.vendor)
        if got is not None:
            rec, client = got
            out.setdefault(rec.dir, (rec, client, []))[2].append(d.device)
    return out


class MpsStep:
    """The MPS step of ClaimSteps (vendors.base.OnDemand)."""

    def __init__(
        self,
        options: MpsOptions,
        state_dir: Path,
        driver_root: Path,
        workloads: Workloads | None,
        mps_for: MpsFor = no_mps,
        *,
        smi: NvidiaSmi | None = None,
        mounter: Mounter | None = None,
        shm_size: str | None = None,
        host_root: Path = Path("/"),
    ) -> None:
        self.options = options
        self.root = state_dir / DIR_NAME
        self.mps_for = mps_for
        self.host = DaemonHost(
            options, self.root, driver_root, workloads,
            smi or NvidiaSmi(driver_root), mounter or Mounter(),
            shm_size or default_size(host_root / "proc" / "meminfo"),
        )  # fmt: skip
        # The daemons the held claims' entries name, for telemetry only (read on its
        # thread: replaced whole, never changed in place): rebuilt from the record at
        # start-up, kept by make and release.
        self._index: dict[str, DaemonRecord] = {}
        # A shared GPU's daemon dir -> the claims whose release this process finished
        # (they leave the record at the end of their pass, after the others' releases).
        self._leaving: dict[str, set[str]] = {}

    def daemons(self) -> list[DaemonRecord]:
        """The daemons of the held claims (telemetry's thread)."""
        return list(self._index.values())

    def _others(self, claim: ClaimContext, rec: DaemonRecord) -> set[str]:
        """The other held claims whose entries name shared daemon `rec`, but those whose
        release this process finished (still in the record until their pass ends)."""
        named = set()
        for uid, entry in claim.peers(rec.key).items():
            got = daemon_of(entry)
            if got is not None and got[0].dir == rec.dir:
                named.add(uid)
        return named - self._leaving.get(rec.dir, set())

    def _indexed(self, rec: DaemonRecord, uid: str, client: ClientLimits | None) -> None:
        index = dict(self._index)
        have = index.get(rec.dir)
        if client is None:  # the claim let it go
            if have is not None and uid in have.holders:
                holders = [h for h in have.holders if h != uid]
                clients = {u: c for u, c in have.clients.items() if u != uid}
                index[rec.dir] = DaemonRecord(
                    have.dir, have.key, have.name, have.gpus, have.limits,
                    holders, clients, have.devices,
                )  # fmt: skip
                if not holders:
                    del index[rec.dir]
        else:
            base = have or rec
            holders = sorted({*base.holders, uid})
            clients = dict(base.clients)
            if rec.shared:
                clients[uid] = mpsrecord.own_limits(client)
            index[rec.dir] = DaemonRecord(
                rec.dir, rec.key, rec.name, rec.gpus, rec.limits, holders, clients, rec.devices
            )
        self._index = index

    # --- OnDemand ----------------------------------------------------------------------
    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        by_name = {d.name: d for d in devices}
        plans = self._plan(claim, by_name)
        if not plans:
            return Made(list(devices))
        entries: dict[str, VendorEntry] = {}
        for p in plans:
            pipe, _, shm = self.host.paths(p.rec)
            entry = mpsrecord.entry(p.rec, pipe, shm, p.client)
            entries.update({name: {ENTRY_KEY: entry} for name in p.served})
            self._leaving.get(p.rec.dir, set()).discard(claim.uid)
        try:
            # The claim's own record says which daemons it needs, whole, before anything
            # is made: what release and reconcile read.
            with contextlib.suppress(NotRecordable):  # none (tests): with `completed`
                claim.record(entries)
            crashpoints.reached("mps-recorded")
        except OSError as exc:  # nothing made yet
            raise MakeError(
                f"MPS control daemon {plans[0].rec.name}: cannot record it: {exc}"
            ) from exc
        try:
            for p in plans:
                self.host.ensure(p.rec, claim)
        except MakeError:
            for p in plans:
                self._undo(p, claim)
            raise
        for p in plans:
            self._indexed(p.rec, claim.uid, p.client)
        return Made(list(devices), entries)

    def _plan(self, claim: ClaimContext, devices: Mapping[str, Device]) -> list[Plan]:
        """The daemons the claim needs, with its own limits and the devices each serves;
        empty: no MPS for this claim."""
        own = {k: v for k, v in own_daemons(claim).items() if v[0].complete}
        legacy = f"claim-{claim.uid}"  # one daemon per claim, made by an earlier version
        if own and (claim.from_record or legacy in own):  # the record is what it needs
            return [Plan(rec, client, served, False) for rec, client, served in own.values()]
        asked, shared = mpslimits.wanted(claim, devices, self.mps_for, self.options.shares)
        if not asked and not shared:
            return []
        self.host.can_run()
        if shared:
            return [self._plan_shared(claim, shared, devices, own)]
        plans: list[Plan] = []
        for g in mpslimits.groups(asked, devices):
            dirname = claim_dir(claim.uid, g.key)
            if dirname in own:  # made before: as recorded
                plans.append(Plan(own[dirname][0], ClientLimits(), list(g.devices), False))
                continue
            key = f"{claim.uid}-{g.key}"
            name = mpsdaemon.deployment_name(self.host.node(), self.options.driver, key)
            rec = DaemonRecord(dirname, key, name, g.gpus, g.limits, [claim.uid], devices=g.devices)
            plans.append(Plan(rec, ClientLimits(), list(g.devices), True))
        return plans

    def _plan_shared(
        self,
        claim: ClaimContext,
        shared: list[AllocatedDevice],
        devices: Mapping[str, Device],
        own: Own,
    ) -> Plan:
        if len(shared) != 1:
            raise MakeError(
                "a claim may hold a share of one GPU only while shares are enforced with MPS "
                f"(it holds {', '.join(d.device for d in shared)}): its processes talk to "
                "one daemon"
            )
        d = shared[0]
        dev = devices[d.device]
        client = share_limits(d, dev, self.options.shares or Sharing())
        dirname = f"device-{d.device}"
        if dirname in own:
            rec, recorded, _ = own[dirname]
            if claim.from_record:  # the record keeps no consumed capacity: as recorded
                client = recorded
            return Plan(rec, client, [d.device], False)
        for entry in claim.peers(d.device).values():
            got = daemon_of(entry)
            if got is not None and got[0].dir == dirname and got[0].complete:
                return Plan(got[0], client, [d.device], False)  # another claim's daemon
        name = mpsdaemon.deployment_name(self.host.node(), self.options.driver, d.device)
        rec = DaemonRecord(dirname, d.device, name, (dev.uuid or d.device,), DaemonLimits())
        return Plan(rec, client, [d.device], True)

    def _undo(self, plan: Plan, claim: ClaimContext) -> None:
        """A make that failed: a daemon it made for the claim alone, or a shared one no
        other claim holds, goes (the claim's entries leave the record with it)."""
        rec = plan.rec
        if (rec.shared and self._others(claim, rec)) or (not rec.shared and not plan.created):
            return
        try:
            self.host.teardown(rec)
        except MakeError as exc:
            log.error("%s; start-up or the next unprepare removes it", exc)

    def release(self, claim: ClaimContext) -> None:
        errors: list[str] = []
        for rec, _, _ in own_daemons(claim).values():
            try:
                if rec.shared and (others := self._others(claim, rec)):
                    # Others still hold it: this claim just lets go (its entry leaves the
                    # record at the end of the pass, after the releases of the others in it).
                    leaving = self._leaving.get(rec.dir, set()) & others
                    self._leaving[rec.dir] = {*leaving, claim.uid}
                else:
                    self.host.teardown(rec)
                    self._leaving.pop(rec.dir, None)
            except (OSError, MakeError) as exc:
                errors.append(str(exc))
                continue
            self._indexed(rec, claim.uid, None)
        if errors:
            raise MakeError("; ".join(errors))

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        """Start-up: the daemons the held claims' entries name are kept (and indexed);
        every other daemon dir is torn down; earlier versions' daemon.json read once."""
        named: Named = {}
        for uid, claim in held.items():
            for rec, client, _ in own_daemons(claim).values():
                named.setdefault(rec.dir, (rec, {}))[1][uid] = client
        for dirname, old in mpsmigrate.read_old(self.root).items():
            holders = [h for h in old.holders if h in held]
            try:
                if holders:
                    self._migrate(old, holders, held)
                    named[dirname] = (old, {h: self._client(old, h, named) for h in holders})
                elif dirname not in named:
                    log.info("MPS control daemon %s serves no held claim; removing it", old.name)
                    self.host.teardown(old)
                    continue
            except (OSError, MakeError) as exc:  # the next start reads it again
                log.error("cannot settle MPS control daemon %s: %s", old.name, exc)
                named.setdefault(dirname, (old, {}))
                continue
            mpsmigrate.retire(self.root, dirname)
        self._collect_dirs(set(named))
        index: dict[str, DaemonRecord] = {}
        for dirname, (rec, clients) in named.items():
            index[dirname] = DaemonRecord(
                rec.dir, rec.key, rec.name, rec.gpus, rec.limits, sorted(clients),
                {u: mpsrecord.own_limits(c) for u, c in clients.items()} if rec.shared else {},
                rec.devices,
            )  # fmt: skip
        self._index = index
        self._leaving.clear()
        self.host.collect_deployments({rec.name for rec, _ in named.values()})

    @staticmethod
    def _client(
        old: DaemonRecord,
        uid: str,
        named: Mapping[str, tuple[DaemonRecord, dict[str, ClientLimits]]],
    ) -> ClientLimits:
        """A claim's own limits with an earlier version's daemon: its record's, else what
        the daemon's record kept for it."""
        if (got := named.get(old.dir)) is not None and uid in got[1]:
            return got[1][uid]
        own = old.clients.get(uid, {})
        return ClientLimits(own.get("threads"), (own["pinned"],) if "pinned" in own else ())

    def _migrate(
        self, old: DaemonRecord, holders: list[str], held: Mapping[str, ClaimContext]
    ) -> None:
        """An earlier version's daemon record written whole into its held claims' entries."""
        pipe, _, shm = self.host.paths(old)
        for uid in holders:
            claim = held[uid]
            recorded = own_daemons(claim).get(old.dir)
            served = recorded[2] if recorded else old.served([d.device for d in claim.devices])
            client = recorded[1] if recorded else self._client(old, uid, {})
            entry = mpsrecord.entry(old, pipe, shm, client)
            with contextlib.suppress(NotRecordable):
                claim.record({name: {ENTRY_KEY: entry} for name in served})

    def _collect_dirs(self, named: set[str]) -> None:
        """Daemon dirs no held claim's entry names (their claim gone, its record lost):
        torn down. Their GPUs are not known here (see the module docstring)."""
        if files.kind(self.root) != "dir":
            return
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if not our_dir(name):
                files.remove_unexpected(entry, files.kind(entry) or "entry", "MPS daemon dir")
            elif name not in named:
                log.warning("MPS daemon dir %s is named by no held claim; removing it", entry)
                try:
                    self.host.remove_dirs(name)
                except MakeError as exc:
                    log.error("%s", exc)
