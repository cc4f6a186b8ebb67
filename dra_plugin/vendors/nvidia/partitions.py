"""MIG placements as partitionable devices (KEP-4815), pure: no NVML, no API here.

For a GPU in MIG mode, every placement of every GPU instance profile is one device, named
as NVIDIA's DynamicMIG names it (`gpu-<minor>-mig-<profile>-<profile id>-<start>`, the
name a static MIG device of that placement has too), with today's MIG capacities. The
GPU's counter set (`gpu-<minor>-counter-set`) encodes exactly the rules NVML applies when
it creates GPU instances:

- `memory-slice-<i>` = 1 for each memory slice: a placement consumes the slices it covers,
  so two placements fit together if and only if they do not overlap;
- `profile-<id>-instances` = the profile's instance count, for the profiles that have
  fewer instances than placements that could coexist (the `+me` profiles: one per GPU),
  consumed 1 by each placement of that profile.

NVIDIA's DynamicMIG also publishes the largest profile's engine and memory totals as
counters; those add nothing the slices do not already say on the GPUs whose tables add
up, and refuse layouts NVML accepts where they do not, so they are left out
(docs/migrating.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace

from dra_plugin.devices import CounterSet, Device, DeviceNode, make_device
from dra_plugin.vendors.nvidia.mig import GiProfile, capacities, profile_name
from dra_plugin.vendors.nvidia.model import CONTROL_NODES, NVIDIA, GpuFacts, fit, mig_name

Range = tuple[int, int]  # a placement: (start, size) over the memory slices


@dataclass(frozen=True)
class Target:
    """Where a placement device's instance goes: what make needs to make it."""

    gpu: str  # the parent GPU's UUID
    minor: int
    profile: int  # GPU instance profile id
    start: int
    size: int
    slices: int  # GPU slices of the profile (which compute instance spans it)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.gpu, self.profile, self.start)

    def __str__(self) -> str:
        return f"profile {self.profile} at memory slices {self.start}-{self.start + self.size - 1}"


@dataclass(frozen=True, kw_only=True)
class PlacementDevice(Device):
    """A placement as published (a Device), with where its instance goes, typed: never
    published, read by the MIG maker (ondemand.py) and whoever must tell a placement apart."""

    target: Target


@dataclass(frozen=True)
class Placement:
    """One place a GPU instance of one profile can be made on one GPU."""

    gpu_minor: int
    profile: GiProfile
    profile_name: str
    start: int
    size: int

    @property
    def name(self) -> str:
        return mig_name(self.gpu_minor, self.profile_name, 0, 0, (self.profile.id, self.start))

    @property
    def range(self) -> Range:
        return (self.start, self.size)

    def capacities(self) -> dict[str, int]:
        return capacities(self.profile, self.range)


@dataclass(frozen=True)
class GpuPartitions:
    """A GPU's placement devices and the counter set they consume from."""

    gpu_minor: int
    counter_set: str
    counters: Mapping[str, int]
    placements: tuple[Placement, ...]

    def consumes(self, p: Placement) -> dict[str, int]:
        """The counters placement `p` consumes from `counter_set`."""
        out = {slice_counter(i): 1 for i in range(p.start, p.start + p.size)}
        limit = instance_counter(p.profile.id)
        if limit in self.counters:
            out[limit] = 1
        return out


def counter_set_name(gpu_minor: int) -> str:
    return f"gpu-{gpu_minor}-counter-set"


def slice_counter(i: int) -> str:
    return f"memory-slice-{i}"


def instance_counter(profile_id: int) -> str:
    return f"profile-{profile_id}-instances"


def overlap(a: Range, b: Range) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _most_apart(places: Sequence[Range]) -> int:
    """How many of `places` can coexist (placements of one profile are aligned runs, so
    taking them in order of their end never does worse)."""
    count, end = 0, -1
    for start, size in sorted(places, key=lambda r: r[0] + r[1]):
        if start > end:
            count, end = count + 1, start + size - 1
    return count


def partitions(
    gpu_minor: int,
    total_bytes: int,
    profiles: Iterable[tuple[GiProfile, int, Sequence[Range]]],
    taken: Iterable[Range] = (),
) -> GpuPartitions:
    """The placement devices of one GPU: `profiles` is (profile, instance count, possible
    placements) as NVML lists them; `taken`: the ranges of GPU instances that exist and
    are not ours to make (an administrator's), whose slices no placement may cover."""
    held = list(taken)
    counters: dict[str, int] = {}
    out: list[Placement] = []
    slices = 0
    for gi, instances, places in profiles:
        name = profile_name(gi, total_bytes)
        if name is None or not places:
            continue
        slices = max([slices, *(s + n for s, n in places)])
        if instances < _most_apart(places):
            counters[instance_counter(gi.id)] = instances
        for start, size in places:
            if not any(overlap((start, size), t) for t in held):
                out.append(Placement(gpu_minor, gi, name, start, size))
    counters.update({slice_counter(i): 1 for i in range(slices)})
    out.sort(key=lambda p: p.name)
    return GpuPartitions(gpu_minor, counter_set_name(gpu_minor), counters, tuple(out))


def fits(gpu: GpuPartitions, chosen: Iterable[Placement]) -> bool:
    """Whether the scheduler may allocate all of `chosen` together: their consumption
    stays within the counter set (what KEP-4815's allocator checks)."""
    used: dict[str, int] = {}
    for p in chosen:
        for counter, n in gpu.consumes(p).items():
            used[counter] = used.get(counter, 0) + n
    return all(n <= gpu.counters.get(c, 0) for c, n in used.items())


def counter_set(gpu: GpuPartitions) -> CounterSet:
    return CounterSet(gpu.counter_set, tuple(sorted(gpu.counters.items())))


def placement_device(driver: str, facts: GpuFacts, gpu: GpuPartitions, p: Placement) -> Device:
    """A placement as a device, with NVIDIA DynamicMIG's attributes (a MIG device's, less
    the UUID the instance does not have yet) and today's MIG capacities, with where its
    instance goes (`target`)."""
    attributes, caps = fit(
        {"type": "mig", "parentUUID": facts.uuid, "profile": p.profile_name,
         **facts.attributes()},
        facts.link, p.capacities(),
    )  # fmt: skip
    device = make_device(
        name=p.name, vendor=NVIDIA, driver=driver,
        attributes=attributes, capacity=caps,
        nodes=[facts.node(), *CONTROL_NODES],
        pci_address=facts.bus_id,
        extra={"minor": str(facts.minor), "parentUUID": facts.uuid, "index": str(facts.index)},
        consumes=[(counter_set(gpu), gpu.consumes(p))],
    )  # fmt: skip
    target = Target(facts.uuid, facts.minor, p.profile.id, p.start, p.size, p.profile.slices)
    return PlacementDevice(
        **{f.name: getattr(device, f.name) for f in fields(Device)}, target=target
    )


def with_instance(d: Device, uuid: str, gi: int, ci: int, caps: Sequence[DeviceNode]) -> Device:
    """A placement device whose MIG instance exists: its UUID, ids and /dev/nvidia-caps
    nodes, as a static MIG device carries them (so CDI, health and telemetry treat both
    alike)."""
    extra = {**dict(d.extra), "uuid": uuid, "gi": str(gi), "ci": str(ci)}
    return replace(d, uuid=uuid, nodes=(*d.nodes, *caps), extra=tuple(sorted(extra.items())))
