"""Our directories hold only what we put there: a symlink, a file where a directory of
ours belongs or the reverse is removed without being followed, and start-up never fails
on one. A victim directory outside our dirs must come through every case unchanged."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.snapshot import FILE_NAME, JOURNAL_NAME, LOCK_NAME
from dra_plugin.claims import devicemetadata as dm
from fakes.claim_harness import (
    DRIVER,
    Harness,
    check_consistent,
    claim,
    intel_device,
    ref,
    result,
    uid,
)
from fakes.damage import fingerprint

DEVICES = [intel_device(i) for i in range(2)]
D0, D1 = DEVICES[0].name, DEVICES[1].name


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    (v / "sub").mkdir(parents=True)
    (v / "precious").write_text("do not touch\n")
    (v / "sub" / "metadata.json").write_text("{}\n")
    return v


@pytest.fixture
def untouched(victim: Path):  # type: ignore[no-untyped-def]
    before = fingerprint(victim)
    yield victim
    assert fingerprint(victim) == before, "something outside our directories was changed"


def _meta_dir(root: Path) -> Path:
    return root / "state" / dm.SUBDIR


@pytest.mark.parametrize("metadata", [False, True], ids=["metadata-off", "metadata-on"])
def test_a_link_as_the_metadata_dir_is_removed_not_followed(
    tmp_path: Path,
    untouched: Path,
    metadata: bool,
    caplog: pytest.LogCaptureFixture,
    harness: Harness,
) -> None:
    c = claim(1, [result(D0)])
    p = harness.preparer([c], device_metadata=metadata)
    _meta_dir(tmp_path).symlink_to(untouched, target_is_directory=True)
    run(p.startup())  # must neither delete the target's contents nor fail
    assert not _meta_dir(tmp_path).is_symlink()
    assert "unexpected link at " in caplog.text
    got = run(p.prepare([ref(c)]))[uid(1)]  # type: ignore[index]
    assert got.error == ""
    if metadata:
        assert (_meta_dir(tmp_path) / "default_claim-1" / "gpu" / dm.FILE_NAME).is_file()


def test_links_inside_the_metadata_dir_are_removed_and_repaired(
    tmp_path: Path, untouched: Path, harness: Harness
) -> None:
    c = claim(1, [result(D0)])
    p = harness.preparer([c], device_metadata=True)
    assert run(p.prepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    claim_dir = _meta_dir(tmp_path) / "default_claim-1"
    # The request's file becomes a link to a victim file, and a second claim dir a link.
    (claim_dir / "gpu" / dm.FILE_NAME).unlink()
    (claim_dir / "gpu" / dm.FILE_NAME).symlink_to(untouched / "sub" / "metadata.json")
    (_meta_dir(tmp_path) / "default_other").symlink_to(untouched, target_is_directory=True)
    (_meta_dir(tmp_path) / "stray-file").write_text("x")
    q = harness.preparer([c], device_metadata=True, started=True)
    assert not (_meta_dir(tmp_path) / "default_other").exists()
    assert not (_meta_dir(tmp_path) / "stray-file").exists()
    # The kubelet's re-prepare writes the file again, as a file.
    assert run(q.prepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    assert (claim_dir / "gpu" / dm.FILE_NAME).is_file()
    assert not (claim_dir / "gpu" / dm.FILE_NAME).is_symlink()
    assert run(q.unprepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    assert not claim_dir.exists()


def test_a_link_named_like_our_spec_file_is_never_followed(
    tmp_path: Path, untouched: Path, harness: Harness
) -> None:
    c, orphan = claim(1, [result(D0)]), claim(2, [result(D1)])
    p = harness.preparer([c, orphan])
    assert run(p.prepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    spec = tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(1))
    spec.unlink()
    spec.symlink_to(untouched / "precious")
    stray = tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(2))
    stray.symlink_to(untouched / "precious")
    q = harness.preparer([c, orphan], started=True)
    assert not stray.is_symlink() and not stray.exists()  # no record: the link goes
    # The kubelet's re-prepare writes a real spec in the link's place.
    assert run(q.prepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    assert spec.is_file() and not spec.is_symlink()
    assert run(q.unprepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    assert not spec.exists()


def test_a_directory_where_our_spec_file_belongs(tmp_path: Path, harness: Harness) -> None:
    c, orphan = claim(1, [result(D0)]), claim(2, [result(D1)])
    p = harness.preparer([c, orphan])
    (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(1)) / "x").mkdir(parents=True)
    (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(2)) / "y").mkdir(parents=True)
    run(p.startup())  # the one without a record goes
    assert not (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(2))).exists()
    assert run(p.prepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    assert (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(1))).is_file()
    check_consistent(tmp_path)


@pytest.mark.parametrize("name", [FILE_NAME, JOURNAL_NAME, LOCK_NAME])
def test_a_link_in_place_of_a_checkpoint_file_is_not_followed(
    tmp_path: Path, untouched: Path, name: str, harness: Harness
) -> None:
    c, other = claim(1, [result(D0)]), claim(2, [result(D0)])
    p = harness.preparer([c, other])
    assert run(p.prepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    path = tmp_path / "state" / name
    path.unlink()
    path.symlink_to(untouched / "precious")
    q = harness.preparer([c, other], started=True)
    # The claim is still held: its re-prepare answers, a second claim of D0 is refused.
    assert run(q.prepare([ref(c)]))[uid(1)].error == ""  # type: ignore[index]
    assert "already prepared" in run(q.prepare([ref(other)]))[uid(2)].error  # type: ignore[index]
    assert not path.is_symlink()
