"""Names that become paths or CDI names are checked whole: no trailing newline (Python's `$`
matches before one), no `/`, no NUL, no look-alike of an ASCII character."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import dra_plugin
from dra_plugin.cdi import claims as cdi
from dra_plugin.cdi.rules import valid_device_name
from dra_plugin.claims.contract import ClaimRef, check_ref
from dra_plugin.devices import is_dns_label, is_dns_subdomain
from dra_plugin.sharing import is_share_id
from fakes.claim_harness import Harness, claim, intel_device, ref, result, uid

BAD = {
    "trailing newline": "gpu\n",
    "parent": "../x",
    "slash": "a/b",
    "nul": "gpu\0",
    "empty": "",
    "cyrillic a": "gpu-\u0430",
    "fullwidth digit": "gpu\uff11",
    "kelvin sign": "\u212a8s",
}
SHARE = "5ea10000-0000-4000-8000-000000000001"


def _modules() -> list[str]:
    return [
        m.name
        for m in pkgutil.walk_packages(dra_plugin.__path__, "dra_plugin.")
        if "._proto" not in m.name
    ]


@pytest.mark.parametrize("module", _modules())
def test_module_patterns_are_anchored_at_the_very_end_and_ascii(module: str) -> None:
    mod = importlib.import_module(module)
    for name, value in vars(mod).items():
        if not isinstance(value, re.Pattern) or not isinstance(value.pattern, str):
            continue
        where = f"{module}.{name} = {value.pattern!r}"
        if not value.flags & re.MULTILINE:
            assert not value.pattern.endswith("$"), f"{where}: `$` also matches before a \\n"
        if re.search(r"\\[dwsb]", value.pattern):
            assert value.flags & re.ASCII, f"{where}: \\d, \\w, \\s take non-ASCII look-alikes"


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_every_name_check_refuses(bad: str) -> None:
    assert not is_dns_label(bad)
    assert not is_dns_subdomain(bad)
    assert not is_dns_subdomain(f"{bad}.example.com")
    assert not cdi.valid_claim_uid(bad)
    assert not is_share_id(SHARE[:-1] + bad) and not is_share_id(bad)
    assert not valid_device_name(bad) or bad == ""  # "" fails elsewhere: required
    with pytest.raises(cdi.CdiError):
        cdi.spec_file_name("gpu.intel.com", bad)
    good = "00000001-0000-4000-8000-000000000001"
    assert check_ref(ClaimRef("default", bad, "c")) is not None  # uid
    assert check_ref(ClaimRef(bad, good, "c")) is not None  # namespace
    assert check_ref(ClaimRef("default", good, bad)) is not None  # name


@pytest.mark.parametrize("bad", ["gpu\n", "GPU", "g.pu", "gpu\u0430"])
def test_a_request_name_that_is_not_a_label_fails_its_claim_with_metadata_on(
    tmp_path: Path, bad: str, harness: Harness
) -> None:
    dev = intel_device(0)
    odd, fine = claim(1, [result(dev.name, request=bad)]), claim(2, [result(intel_device(1).name)])
    p = harness.preparer([odd, fine], devices=[dev, intel_device(1)], device_metadata=True)
    got = asyncio.run(p.prepare([ref(odd), ref(fine)]))
    assert got[uid(1)].error.startswith(f"claim default/claim-1 (uid {uid(1)}): ")
    assert repr(bad.split("/")[0]) in got[uid(1)].error
    assert not got[uid(2)].error
    # Nothing with an odd name was left in our directories.
    for path in (tmp_path / "cdi").rglob("*"):
        assert path.name.isascii() and "\n" not in path.name
    for path in (tmp_path / "state").rglob("*"):
        assert path.name.isascii() and "\n" not in path.name


@pytest.mark.parametrize("bad", ["gpu\n", "a/b/c", "../x", "gpu\u0430", ""])
def test_a_request_name_that_is_not_a_request_fails_its_claim_with_metadata_off(
    tmp_path: Path, bad: str, harness: Harness
) -> None:
    """The request name is echoed to the kubelet, which matches containers by it."""
    dev = intel_device(0)
    odd = claim(1, [result(dev.name, request=bad)])
    got = asyncio.run(harness.preparer([odd], devices=[dev]).prepare([ref(odd)]))[uid(1)]
    assert got.error.startswith(f"claim default/claim-1 (uid {uid(1)}): device {dev.name}: ")
    assert "is not a DNS label (or label/label)" in got.error


def test_a_pod_claim_annotation_that_is_not_a_name_fails_its_claim(
    tmp_path: Path, harness: Harness
) -> None:
    dev = intel_device(0)
    odd = claim(1, [result(dev.name)])
    odd["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "../../etc"}
    p = harness.preparer([odd], devices=[dev], device_metadata=True)
    got = asyncio.run(p.prepare([ref(odd)]))[uid(1)]
    assert "pod-claim-name='../../etc' is not a name" in got.error, got.error
