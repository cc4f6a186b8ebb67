"""Device metadata (KEP-5304) through ClaimPreparer: the kubelet plugin library's files,
paths and answers, byte for byte; crash safety, unprepare and start-up GC; off changes
nothing."""

from __future__ import annotations

import asyncio
import json
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_plugin import crashpoints
from dra_plugin.cdi import claims as cdi
from dra_plugin.cdi import rules as cdispec
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import (
    COMPLETED,
    STARTED,
    ClaimRecord,
    DeviceRecord,
    State,
)
from dra_plugin.claims import devicemetadata as dm
from dra_plugin.claims import metadatastream
from dra_plugin.claims.claims import ClaimRef, PreparedDevice
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.devices import PCI_BUS_ID, make_device
from fakes.claim_harness import (
    DRIVER,
    NODE,
    FakeApi,
    Harness,
    check_consistent,
    claim,
    intel_device,
    ref,
    result,
    uid,
)

DEVICES = [intel_device(i) for i in range(3)]
D0, D1, D2 = (d.name for d in DEVICES)
U = uid(1)


def recorded(root: Path) -> State:
    """The checkpoint as the daemon reads it (snapshot and journal)."""
    state = Checkpoint(root / "state", DRIVER, boot_id=lambda: "boot-1").read()
    assert state is not None
    return state


def stored_bytes(root: Path) -> bytes:
    """Everything the checkpoint keeps on disk (snapshot and journal)."""
    return b"".join(p.read_bytes() for p in sorted((root / "state").glob("checkpoint.*")))


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def stream(path: Path) -> list[dict[str, Any]]:
    """A metadata file's objects: v1beta1, then the same in v1alpha1."""
    docs = metadatastream.read_stream(path)
    assert docs is not None
    assert [d["apiVersion"] for d in docs] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    assert {json.dumps(dict(d, apiVersion="")) for d in docs} == {
        json.dumps(dict(docs[0], apiVersion=""))
    }
    return docs


def claim_id(dev: str, u: str = U) -> str:
    return f"k8s.{DRIVER}/claim={u}-{dev}"


def meta_dir(root: Path) -> Path:
    return root / "state" / "dra-device-metadata"


def host_file(root: Path, ns: str, name: str, request: str) -> Path:
    return meta_dir(root) / f"{ns}_{name}" / request / "metadata.json"


def spec_file(root: Path, request: str, u: str = U) -> Path:
    return root / "cdi" / f"{DRIVER}_metadata_{u}_{request}.json"


def test_files_and_answer_are_the_librarys(tmp_path: Path, harness: Harness) -> None:
    c = claim(1, [result(D0), result(D1), result(D2, request="second")], name="gpu-claim")
    p = harness.preparer([c], device_metadata=True)
    got = run(p.prepare([ref(c)]))[U]
    assert got.error == ""
    # The metadata ID goes with the first device of each request, after its own IDs.
    assert got.devices == (
        PreparedDevice(("gpu",), NODE, D0, (claim_id(D0), f"{DRIVER}/metadata={U}_gpu")),
        PreparedDevice(("gpu",), NODE, D1, (claim_id(D1),)),
        PreparedDevice(("second",), NODE, D2, (claim_id(D2), f"{DRIVER}/metadata={U}_second")),
    )
    host = host_file(tmp_path, "default", "gpu-claim", "gpu")
    # The same object once per version, newest first, each followed by a newline: what the
    # library's metadataWriter.encodeMetadataStream writes with both versions enabled.
    expected_doc = "".join(
        "{\n"
        '  "kind": "DeviceMetadata",\n'
        f'  "apiVersion": "metadata.resource.k8s.io/{version}",\n'
        '  "metadata": {\n'
        '    "name": "gpu-claim",\n'
        '    "namespace": "default",\n'
        f'    "uid": "{U}",\n'
        '    "generation": 1\n'
        "  },\n"
        '  "requests": [\n'
        "    {\n"
        '      "name": "gpu",\n'
        '      "devices": [\n'
        + ",\n".join(
            "        {\n"
            f'          "driver": "{DRIVER}",\n'
            f'          "pool": "{NODE}",\n'
            f'          "name": "{d}",\n'
            '          "attributes": {\n'
            '            "health": {\n'
            '              "string": "Healthy"\n'
            "            },\n"
            '            "model": {\n'
            '              "string": "Arc A770"\n'
            "            }\n"
            "          }\n"
            "        }"
            for d in (D0, D1)
        )
        + "\n      ]\n    }\n  ]\n}\n"
        for version in ("v1beta1", "v1alpha1")
    )
    assert host.read_text() == expected_doc
    assert stat.S_IMODE(host.stat().st_mode) == 0o644
    spec = spec_file(tmp_path, "gpu")
    expected_spec = {
        "cdiVersion": "0.5.0",
        "kind": f"{DRIVER}/metadata",
        "devices": [
            {
                "name": f"{U}_gpu",
                "containerEdits": {
                    "mounts": [
                        {
                            "hostPath": str(host),
                            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/"
                            f"resourceclaims/gpu-claim/gpu/{DRIVER}-metadata.json",
                            "options": ["ro", "bind"],
                        }
                    ]
                },
            }
        ],
    }
    # json.MarshalIndent(spec, "", "  "): this key order, no trailing newline.
    assert spec.read_text() == json.dumps(expected_spec, indent=2)
    assert stat.S_IMODE(spec.stat().st_mode) == 0o644
    assert cdispec.validate_spec(json.loads(spec.read_text())) == []
    second = stream(host_file(tmp_path, "default", "gpu-claim", "second"))
    assert [[d["name"] for d in doc["requests"][0]["devices"]] for doc in second] == [[D2]] * 2
    # Recorded, so a known claim answers the same without the API.
    meta = recorded(tmp_path).claims[U].device_metadata
    assert meta is not None and meta["requests"][0]["cdiId"] == f"{DRIVER}/metadata={U}_gpu"
    assert run(harness.preparer().prepare([ref(c)]))[U] == got
    check_consistent(tmp_path)


def test_template_claim_and_subrequest(tmp_path: Path, harness: Harness) -> None:
    c = claim(1, [result(D0, request="gpu/large")], name="pod-gpu-x7k2p")
    c["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "accel"}
    got = run(harness.preparer([c], device_metadata=True).prepare([ref(c)]))
    assert got[U].devices[0].request_names == ("gpu",)
    assert got[U].devices[0].cdi_device_ids[-1] == f"{DRIVER}/metadata={U}_gpu"
    host = host_file(tmp_path, "default", "pod-gpu-x7k2p", "gpu")  # the real claim name
    for doc in stream(host):
        assert list(doc) == ["kind", "apiVersion", "metadata", "podClaimName", "requests"]
        assert doc["podClaimName"] == "accel" and doc["requests"][0]["name"] == "gpu/large"
    (mount,) = json.loads(spec_file(tmp_path, "gpu").read_text())["devices"][0]["containerEdits"][
        "mounts"
    ]
    assert mount["hostPath"] == str(host)
    assert mount["containerPath"] == (
        f"/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/accel/gpu/"
        f"{DRIVER}-metadata.json"
    )


def test_off_changes_nothing(tmp_path: Path, harness: Harness) -> None:
    c = claim(1, [result(D0), result(D1), result(D2, request="second")])
    off = run(harness.preparer([c], root=tmp_path / "off").prepare([ref(c)]))[U]
    on = run(harness.preparer([c], root=tmp_path / "on", device_metadata=True).prepare([ref(c)]))[U]
    # Today's answer: our claim spec's IDs only.
    assert off.devices == tuple(
        PreparedDevice((r,), NODE, d, (claim_id(d),))
        for r, d in (("gpu", D0), ("gpu", D1), ("second", D2))
    )
    stripped = tuple(
        PreparedDevice(
            d.request_names,
            d.pool_name,
            d.device_name,
            tuple(i for i in d.cdi_device_ids if "/metadata=" not in i),
        )
        for d in on.devices
    )
    assert stripped == off.devices
    assert not meta_dir(tmp_path / "off").exists()
    spec = cdi.spec_file_name(DRIVER, U)
    assert sorted(p.name for p in (tmp_path / "off" / "cdi").iterdir()) == [
        spec,
        specrecord.file_name(spec),
    ]
    assert b"deviceMetadata" not in stored_bytes(tmp_path / "off")


def test_unprepare_removes_everything(tmp_path: Path, harness: Harness) -> None:
    c = claim(1, [result(D0), result(D1, request="second")])
    api = FakeApi([c])
    p = harness.preparer(api, device_metadata=True)
    run(p.prepare([ref(c)]))
    assert run(p.unprepare([ref(c)])) == {U: UNPREPARED}
    assert list((tmp_path / "cdi").iterdir()) == []
    assert list(meta_dir(tmp_path).iterdir()) == []
    # A UID we do not know: its stray metadata specs go (as the library's glob).
    stray = spec_file(tmp_path, "gpu", uid(9))
    stray.write_text("{}")
    assert run(p.unprepare([ClaimRef("default", uid(9), "gone")])) == {uid(9): UNPREPARED}
    assert not stray.exists()


def test_a_file_where_the_metadata_dir_belongs_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, harness: Harness
) -> None:
    c = claim(1, [result(D0)])
    p = harness.preparer([c], device_metadata=True)
    meta_dir(tmp_path).parent.mkdir(parents=True, exist_ok=True)
    meta_dir(tmp_path).write_text("not a directory")
    got = run(p.prepare([ref(c)]))[U]
    assert got.error == "" and len(got.devices[0].cdi_device_ids) == 2
    assert host_file(tmp_path, "default", "claim-1", "gpu").is_file()
    assert "unexpected file at " in caplog.text and "removed without following it" in caplog.text


def test_write_failure_prepares_without_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, harness: Harness
) -> None:
    """As the library: metadata that cannot be written is logged, the claim still works."""
    c = claim(1, [result(D0)])
    p = harness.preparer([c], device_metadata=True)

    def disk_full(path: Path, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dm, "atomic_write", disk_full)
    got = run(p.prepare([ref(c)]))[U]
    assert got.error == "" and got.devices[0].cdi_device_ids == (claim_id(D0),)
    assert not spec_file(tmp_path, "gpu").exists()
    # The journal keeps the intent line; the claim as recorded has no metadata.
    assert recorded(tmp_path).claims[U].device_metadata is None


def test_vanished_metadata_is_rewritten_on_reprepare(tmp_path: Path, harness: Harness) -> None:
    c = claim(1, [result(D0)])
    first = run(harness.preparer([c], device_metadata=True).prepare([ref(c)]))
    content = spec_file(tmp_path, "gpu").read_bytes()
    spec_file(tmp_path, "gpu").unlink()  # e.g. a CDI root on tmpfs after a reboot
    host_file(tmp_path, "default", "claim-1", "gpu").unlink()
    steps: list[str] = []
    crashpoints.install(steps.append)
    p = harness.preparer(device_metadata=True)
    assert run(p.prepare([ref(c)])) == first and steps == ["spec-rerendered"]
    assert spec_file(tmp_path, "gpu").read_bytes() == content
    assert host_file(tmp_path, "default", "claim-1", "gpu").is_file()


def test_a_v1alpha1_only_file_is_rewritten_with_both_versions(
    tmp_path: Path, harness: Harness
) -> None:
    """A file an older plugin wrote (v1alpha1 alone) is brought to today's stream when the
    kubelet prepares the claim again, as are torn or foreign streams."""
    c = claim(1, [result(D0)])
    first = run(harness.preparer([c], device_metadata=True).prepare([ref(c)]))
    host = host_file(tmp_path, "default", "claim-1", "gpu")
    content = host.read_bytes()
    beta, alpha = stream(host)

    def one(doc: dict[str, Any]) -> bytes:
        return metadatastream.go_json(doc) + b"\n"

    for old in (
        one(alpha),  # before v1beta1
        one(beta),  # one version missing
        one(alpha) + one(beta),  # oldest first
        content[: len(content) // 2],  # torn
        content + b"[]\n",  # not an object
    ):
        host.write_bytes(old)
        steps: list[str] = []
        crashpoints.install(steps.append)
        p = harness.preparer(device_metadata=True)
        assert run(p.prepare([ref(c)])) == first and steps == ["spec-rerendered"]
        assert host.read_bytes() == content


def test_crash_and_startup_gc(tmp_path: Path, harness: Harness) -> None:
    keep = claim(1, [result(D0)])
    half = claim(2, [result(D1)])
    api = FakeApi([keep, half])
    run(harness.preparer(api, device_metadata=True).prepare([ref(keep), ref(half)]))
    # Claim 2 as a process killed mid-prepare leaves it: recorded `started`, files written.
    ckpt = Checkpoint(tmp_path / "state", DRIVER, boot_id=lambda: "boot-1")
    state = ckpt.load(dict).state
    state.claims[uid(2)] = replace(state.claims[uid(2)], state=STARTED)
    ckpt.save(state)
    # Orphans: a spec and a claim dir no record owns, and an interrupted write's temp file.
    orphan_spec = spec_file(tmp_path, "gpu", uid(7))
    orphan_spec.write_text("{}")
    orphan_dir = meta_dir(tmp_path) / "default_claim-7" / "gpu"
    orphan_dir.mkdir(parents=True)
    (orphan_dir / "metadata.json").write_text("{}")
    temp = tmp_path / "cdi" / f".{DRIVER}_metadata_{uid(1)}_gpu.json.tmp-dead"
    temp.write_text("{")
    other = tmp_path / "cdi" / "gpu.nvidia.com_metadata_x_gpu.json"  # not ours
    other.write_text("{}")
    run(harness.preparer(api, device_metadata=True).startup())
    # Its CDI spec and the record beside it were written whole: kept as prepared (a journal
    # cut short looks the same; the kubelet prepares it again or unprepares it).
    assert spec_file(tmp_path, "gpu", uid(2)).exists()
    assert (meta_dir(tmp_path) / "default_claim-2").exists()
    assert not orphan_spec.exists() and not temp.exists()
    assert not (meta_dir(tmp_path) / "default_claim-7").exists()
    assert other.exists()
    other.unlink()
    assert spec_file(tmp_path, "gpu").exists()
    assert host_file(tmp_path, "default", "claim-1", "gpu").exists()
    assert set(check_consistent(tmp_path)) == {uid(1), uid(2)}
    # Switched off later: recorded files stay until their claim is unprepared.
    p = harness.preparer(api, started=True)
    assert spec_file(tmp_path, "gpu").exists()
    assert run(p.unprepare([ref(keep)])) == {uid(1): UNPREPARED}
    assert not spec_file(tmp_path, "gpu").exists()


def test_pci_bus_id_attribute_reaches_the_file(tmp_path: Path) -> None:
    dev = make_device(
        name="gpu-0",
        vendor="nvidia",
        driver=DRIVER,
        attributes={PCI_BUS_ID: "0000:01:00.0", "index": 0, "mig": False},
    )
    files = dm.MetadataFiles(DRIVER, tmp_path / "plugin", tmp_path / "cdi")
    meta = dm.plan(DRIVER, U, {"metadata": {}}, [("gpu", "gpu")])
    assert meta is not None
    rec = ClaimRecord(
        U,
        "default",
        "c",
        COMPLETED,
        "",
        (DeviceRecord(("gpu",), NODE, "gpu-0", ()),),
        device_metadata=meta.to_json(),
    )
    path = tmp_path / "metadata.json"
    path.write_bytes(files.document(rec, meta, meta.requests[0], {"gpu-0": dev}))
    for doc in stream(path):
        attrs = doc["requests"][0]["devices"][0]["attributes"]
        assert attrs[PCI_BUS_ID] == {"string": "0000:01:00.0"}
        assert attrs["index"] == {"int": 0} and attrs["mig"] == {"bool": False}


@pytest.mark.parametrize("text", ["a<b>&c", "ünï\u2028"])
def test_go_json_escapes_like_encoding_json(text: str) -> None:
    out = metadatastream.go_json({"k": text}).decode()
    assert "<" not in out and ">" not in out and "&" not in out and "\u2028" not in out
    assert json.loads(out) == {"k": text}


def test_old_checkpoint_entries_load_without_metadata(tmp_path: Path, harness: Harness) -> None:
    c = claim(1, [result(D0)])
    run(harness.preparer([c]).prepare([ref(c)]))
    assert recorded(tmp_path).claims[U].device_metadata is None
