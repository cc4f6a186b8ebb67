"""The claim path on a bad day: read-only or full disks, malformed claims, a lost
checkpoint. Every claim gets its own answer; the record on disk stays consistent."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_plugin.checkpoint.snapshot import FILE_NAME, JOURNAL_NAME
from dra_plugin.claims.claims import ClaimRef
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.host.files import PRIVATE_DIR_MODE, SHARED_DIR_MODE, make_dir
from dra_plugin.kubelet import server
from fakes import fsfaults
from fakes.claim_harness import (
    DRIVER,
    FakeApi,
    Harness,
    check_consistent,
    claim,
    intel_device,
    preparer,
    ref,
    result,
    uid,
)

DEVICES = [intel_device(i) for i in range(2)]
D0, D1 = DEVICES[0].name, DEVICES[1].name

needs_namespaces = pytest.mark.skipif(
    not fsfaults.namespaces_work(), reason="needs `unshare -rm` (user + mount namespaces)"
)


@needs_namespaces
def test_read_only_cdi_dir_fails_each_claim_and_leaves_no_started_entry(tmp_path: Path) -> None:
    assert asyncio.run(fsfaults.prepare(tmp_path, range(1)))[uid(0)] == ""
    cdi = tmp_path / "cdi"
    spec0, orphan = (cdi / f"k8s.{DRIVER}-claim_{uid(i)}.json" for i in (0, 9))
    orphan.write_bytes(spec0.read_bytes())  # start-up cannot remove it: must not stop us
    got = fsfaults.run_child(f"mount --bind -o ro {cdi} {cdi}", "readonly-cdi", tmp_path)
    assert set(got["prepare"]) == {uid(1), uid(2)}
    for i in (1, 2):
        err = got["prepare"][uid(i)]
        assert f"claim default/claim-{i} (uid {uid(i)})" in err
        assert f"CDI dir {cdi} is read-only" in err and "EROFS" in err
        assert "CDI_ROOT" in err and f"k8s.{DRIVER}-claim_{uid(i)}.json" in err
    # No `started` entry is left for the claims whose spec could not be written.
    assert got["after_prepare"] == {uid(0): "completed"}
    # Unprepare answers too; the claim's spec is still there, so is its entry.
    assert "read-only" in got["unprepare"][uid(0)]
    assert got["files"] == sorted([spec0.name, spec0.name.replace(".json", ".record"), orphan.name])
    assert got["after_unprepare"] == {uid(0): "unpreparing"}
    # Writable again: the next pass finishes the unprepare; the claims prepare.
    assert asyncio.run(fsfaults.prepare(tmp_path, range(1, 3))) == {uid(1): "", uid(2): ""}
    assert set(check_consistent(tmp_path)) == {uid(1), uid(2)}


@needs_namespaces
def test_full_state_dir_fails_each_claim_and_records_nothing_half(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    got = fsfaults.run_child(f"mount -t tmpfs -o size=256k tmpfs {state}", "full-state", tmp_path)
    assert set(got["before"].values()) == {""}
    ten = {uid(i) for i in range(10)}
    for i in range(10, 20):
        err = got["prepare"][uid(i)]
        assert f"claim default/claim-{i} (uid {uid(i)})" in err
        assert f"the file system holding {state} is full" in err and "ENOSPC" in err
    assert got["after_prepare"] == dict.fromkeys(ten, "completed")
    assert got["files_after_prepare"] == sorted(
        f"k8s.{DRIVER}-claim_{u}.{ext}" for u in ten for ext in ("json", "record")
    )
    assert set(got["unprepare"]) == ten
    assert all("ENOSPC" in e for e in got["unprepare"].values()), got["unprepare"]
    assert got["after_unprepare"] == dict.fromkeys(ten, "completed")
    assert got["consistent_when_full"] == ""
    assert got["after_restart"] == dict.fromkeys(ten, "completed")
    # Space freed: everything works again.
    assert set(got["prepare_freed"].values()) == {""}
    assert set(got["unprepare_freed"].values()) == {""}
    assert set(got["final"]) == {uid(i) for i in range(10, 20)}
    assert got["consistent"] == ""


# --- malformed claims from the API ----------------------------------------------------
def _good_and(bad: Any) -> tuple[FakeApi, list[ClaimRef]]:
    good = claim(2, [result(D1)])
    api = FakeApi([good])
    api.claims[("default", "claim-1")] = bad
    return api, [ClaimRef("default", uid(1), "claim-1"), ref(good)]


def _claim1(**parts: Any) -> dict[str, Any]:
    obj = claim(1, [result(D0)])
    for path, value in parts.items():
        *head, last = path.split("__")
        node = obj
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return obj


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (_claim1(status=5), "status is int 5"),
        (_claim1(status__allocation="x"), "status.allocation is str 'x'"),
        (_claim1(status__allocation__devices=[1]), "status.allocation.devices is list"),
        (
            _claim1(status__allocation__devices__results={"a": 1}),
            "status.allocation.devices.results is dict",
        ),
        (
            _claim1(status__allocation__devices__results__0=3),
            "status.allocation.devices.results[0] is int 3",
        ),
        (
            _claim1(status__allocation__devices__results__0__device=7),
            "status.allocation.devices.results[0].device is int 7",
        ),
        (
            _claim1(status__allocation__devices__results__0__adminAccess="yes"),
            "results[0].adminAccess is str 'yes'",
        ),
        (
            _claim1(status__allocation__devices__results__0__consumedCapacity=5),
            "results[0].consumedCapacity is int 5",
        ),
        (_claim1(metadata="x"), "metadata is str 'x'"),
        (_claim1(metadata__uid=5), "metadata.uid is int 5"),
        (_claim1(metadata__annotations=["a"]), "metadata.annotations is list"),
        ([1, 2], "the claim is list"),
        ("0", "the claim is str '0'"),  # not to be taken for a fetch error message
    ],
)
def test_a_malformed_claim_fails_alone_naming_the_field(
    tmp_path: Path, bad: Any, field: str, harness: Harness
) -> None:
    api, refs = _good_and(bad)
    p = harness.preparer(api, device_metadata=True, started=True)
    got = asyncio.run(p.prepare(refs))
    assert got[uid(2)].error == "" and got[uid(2)].devices
    err = got[uid(1)].error
    assert err.startswith(f"claim default/claim-1 (uid {uid(1)}): malformed claim"), err
    assert field in err, err
    assert set(check_consistent(tmp_path)) == {uid(2)}


json_ish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
PARTS = (
    "",
    "metadata",
    "status",
    "status.allocation",
    "status.allocation.devices",
    "status.allocation.devices.results",
    "status.allocation.devices.results.0",
    "status.allocation.devices.results.0.consumedCapacity",
)


@given(part=st.sampled_from(PARTS), value=json_ish)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_json_in_any_part_we_read_answers_every_claim(part: str, value: Any) -> None:
    bad: Any = claim(1, [result(D0, consumedCapacity={})])
    if part:
        *head, last = part.split(".")
        node = bad
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    else:
        bad = value
    api, refs = _good_and(bad)
    with tempfile.TemporaryDirectory() as tmp:
        p = preparer(Path(tmp), api, DEVICES, device_metadata=True)
        asyncio.run(p.startup())
        got = asyncio.run(p.prepare(refs))  # never raises
        assert set(got) == {uid(1), uid(2)}
        assert got[uid(2)].error == ""
        assert got[uid(1)].error.startswith(f"claim default/claim-1 (uid {uid(1)})") or (
            got[uid(1)].error == ""
        )
        check_consistent(Path(tmp))


# --- a lost checkpoint ----------------------------------------------------------------
@pytest.mark.parametrize("lost", ["snapshot", "snapshot and journal"])
def test_a_deleted_checkpoint_is_rebuilt_from_the_spec_files(
    tmp_path: Path, lost: str, harness: Harness
) -> None:
    first, second = claim(1, [result(D0)]), claim(2, [result(D0)], name="second")
    api = FakeApi([first, second])
    p = harness.preparer(api, started=True)
    assert asyncio.run(p.prepare([ref(first)]))[uid(1)].error == ""
    # kill -9, then the record is lost.
    (tmp_path / "state" / FILE_NAME).unlink()
    if lost != "snapshot":
        (tmp_path / "state" / JOURNAL_NAME).unlink()
    p = harness.preparer(api)
    asyncio.run(p.startup())  # must not collect the claim's spec as an orphan
    assert set(check_consistent(tmp_path)) == {uid(1)}
    assert (tmp_path / "state" / FILE_NAME).exists()
    err = asyncio.run(p.prepare([ref(second)]))[uid(2)].error
    # Exact either way: the journal still knew it, or its spec file carries its record.
    holder = f"claim default/claim-1 (uid {uid(1)})"
    assert (
        err == f"claim default/second (uid {uid(2)}): device {D0} is already prepared for {holder}"
    )
    # The kubelet still knows the first claim: it unprepares it, then the device is free.
    assert asyncio.run(p.unprepare([ref(first)])) == {uid(1): UNPREPARED}
    assert asyncio.run(p.prepare([ref(second)]))[uid(2)].error == ""


# --- directory modes ------------------------------------------------------------------
def test_directories_get_their_modes_whatever_the_umask(tmp_path: Path, harness: Harness) -> None:
    old = os.umask(0)
    try:
        make_dir(tmp_path / "plugins" / DRIVER, PRIVATE_DIR_MODE)
        make_dir(tmp_path / "cdi" / "dynamic", SHARED_DIR_MODE)
        server.prepare_socket_path(tmp_path / "registry" / "x.sock")
        c = claim(1, [result(D0)])
        p = harness.preparer([c], root=tmp_path / "p", device_metadata=True, started=True)
        assert asyncio.run(p.prepare([ref(c)]))[uid(1)].error == ""
    finally:
        os.umask(old)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(tmp_path / "plugins") == mode(tmp_path / "plugins" / DRIVER) == 0o750
    assert mode(tmp_path / "cdi") == mode(tmp_path / "cdi" / "dynamic") == 0o755
    assert mode(tmp_path / "registry") == 0o750
    meta = tmp_path / "p" / "state" / "dra-device-metadata"
    dirs = [meta, *(d for d in meta.rglob("*") if d.is_dir())]
    assert len(dirs) == 3 and {mode(d) for d in dirs} == {0o755}
    # An existing directory is the operator's: left as it is.
    (tmp_path / "mine").mkdir(mode=0o700)
    make_dir(tmp_path / "mine", SHARED_DIR_MODE)
    assert mode(tmp_path / "mine") == 0o700
