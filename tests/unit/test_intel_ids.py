"""The Intel PCI id table: coverage of the platforms users run, and its lookup rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_plugin.devices import MAX_STRING_ATTRIBUTE
from dra_plugin.vendors.intel import ids as intel_ids


@pytest.mark.parametrize(
    ("pci_id", "model", "family"),
    [
        # Core Ultra iGPUs
        ("0x7d55", "Meteor Lake", "Arc Graphics"),
        ("0x7d45", "Meteor Lake", "Intel Graphics"),
        ("0x7d51", "Arrow Lake", "Arc Graphics"),
        ("0x7d67", "Arrow Lake-S", "Intel Graphics"),
        ("0x64a0", "Lunar Lake", "Arc Graphics"),
        # Alder/Raptor Lake Xe iGPUs (0xa7a0 as the Intel driver names it)
        ("0x46a6", "Alder Lake-P", "Iris Xe"),
        ("0x4680", "Alder Lake-S", "UHD Graphics"),
        ("0x46d1", "Alder Lake-N", "UHD Graphics"),
        ("0xa7a0", "Raptor Lake-P", "Iris Xe"),
        ("0xa780", "Raptor Lake-S", "UHD Graphics"),
        # Arc discrete, A- and B-series (names as the Intel driver publishes them)
        ("0x5690", "A770M", "Arc"),  # not in Intel's table: ours
        ("0x56a0", "A770", "Arc A-Series"),
        ("0x56a1", "A750", "Arc A-Series"),
        ("0x56a5", "A380", "Arc A-Series"),
        ("0x56b1", "A40/A50", "Arc Pro A-Series"),
        ("0xe20b", "B580", "Arc B-Series"),
        ("0xe20c", "B570", "Arc B-Series"),
        ("0xe211", "B60", "Arc Pro B-Series"),
        # Data Center GPU Flex and Max
        ("0x56c0", "Flex 170", "Data Center Flex"),
        ("0x56c1", "Flex 140", "Data Center Flex"),
        ("0x0bd5", "Max 1550", "Data Center Max"),
        ("0x0bd6", "Max 1450", "Data Center Max"),
        ("0x0bda", "Max 1100", "Data Center Max"),
    ],
)
def test_known_ids(pci_id: str, model: str, family: str) -> None:
    found = intel_ids.lookup(pci_id)
    assert (found.model, found.family) == (model, family)


def test_discrete_flag() -> None:
    assert intel_ids.lookup("0xe20b").discrete
    assert intel_ids.lookup("0x0bd5").discrete
    assert not intel_ids.lookup("0x7d55").discrete


@pytest.mark.parametrize("spelling", ["0x7d55", "0x7D55", "7d55", " 0x7d55\n", 0x7D55])
def test_lookup_accepts_sysfs_and_udev_spellings(spelling: str | int) -> None:
    assert intel_ids.lookup(spelling).platform == "Meteor Lake"


@pytest.mark.parametrize("pci_id", ["0xabcd", "0x0000", "", "0x", "zzzz", "0x12345", -1, 70000])
def test_unknown_ids_are_unknown_not_errors(pci_id: str | int) -> None:
    assert intel_ids.lookup(pci_id) == intel_ids.UNKNOWN
    assert (intel_ids.UNKNOWN.model, intel_ids.UNKNOWN.family) == ("Unknown", "Unknown")


def test_table_values_fit_attributes() -> None:
    assert len(intel_ids.TABLE) > 100
    for pci_id, entry in intel_ids.TABLE.items():
        assert 0 < pci_id <= 0xFFFF
        for text in (entry.model, entry.family):
            assert text and len(text) <= MAX_STRING_ATTRIBUTE, (hex(pci_id), text)


def test_every_required_platform_is_covered() -> None:
    platforms = {e.platform for e in intel_ids.TABLE.values()}
    for required in (
        "Meteor Lake", "Arrow Lake", "Lunar Lake", "Alder Lake-P", "Alder Lake-S",
        "Raptor Lake-P", "Raptor Lake-S", "Alchemist", "Battlemage", "Arctic Sound-M",
        "Ponte Vecchio",
    ):  # fmt: skip
        assert required in platforms


def test_every_id_in_intels_table_gets_intels_model_and_family() -> None:
    """tests/fixtures/intel/expected.json holds Intel's driver's table (models.go)."""
    fixture = Path(__file__).parents[1] / "fixtures" / "intel" / "expected.json"
    theirs: dict[str, list[str]] = json.loads(fixture.read_text())["models"]
    assert len(theirs) == 35
    ours = {k: [intel_ids.lookup(k).model, intel_ids.lookup(k).family] for k in theirs}
    assert ours == theirs
