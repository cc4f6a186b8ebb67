"""Intel GPU PCI device ids -> marketing model and family.

Pure data plus one lookup. The `model`/`family` strings become ResourceSlice attributes.
For every id Intel's own DRA driver knows (its pkg/gpu/device/models.go, `_INTEL_DRIVER`
below) we publish exactly its strings, so its CEL selectors keep working after a switch.
Ids it does not list keep our own names: discrete cards get model "A770M", family
"Arc"; integrated GPUs get the platform as model ("Meteor Lake") and the graphics brand
as family. Platform membership of each id follows the kernel's
include/drm/intel/pciids.h; marketing names are public product facts. Where one id
covers several SKUs, the model is the platform name rather than a guess.

Unknown ids are never dropped: they are published as model/family "Unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_plugin.host.pci import parse_pci_id

INTEL = "intel"  # the VENDORS word and Device.vendor
PCI_VENDOR_ID = "0x8086"


@dataclass(frozen=True)
class IntelGpuModel:
    model: str
    family: str
    platform: str  # codename, e.g. "Meteor Lake"
    discrete: bool


UNKNOWN = IntelGpuModel(model="Unknown", family="Unknown", platform="Unknown", discrete=False)


@dataclass(frozen=True)
class _Platform:
    platform: str
    family: str
    discrete: bool
    # id -> model name; None means "use the platform name" (several SKUs share the id).
    ids: dict[int, str | None]


# fmt: off
_PLATFORMS: tuple[_Platform, ...] = (
    # --- integrated, Xe-LP (Gen12) ----------------------------------------------------
    _Platform("Tiger Lake", "UHD Graphics", False, {0x9A60: None, 0x9A68: None, 0x9A70: None}),
    _Platform("Tiger Lake", "Iris Xe", False, {
        0x9A40: None, 0x9A49: None, 0x9A59: None, 0x9A78: None,
        0x9AC0: None, 0x9AC9: None, 0x9AD9: None, 0x9AF8: None,
    }),
    _Platform("Alder Lake-S", "UHD Graphics", False, {
        0x4680: None, 0x4682: None, 0x4688: None, 0x468A: None, 0x468B: None, 0x4690: None,
        0x4692: None, 0x4693: None,
    }),
    _Platform("Alder Lake-P", "Iris Xe", False, {
        0x46A0: None, 0x46A1: None, 0x46A2: None, 0x46A3: None, 0x46A6: None, 0x46A8: None,
        0x46AA: None, 0x462A: None, 0x4626: None, 0x4628: None, 0x46B0: None, 0x46B1: None,
        0x46B2: None, 0x46B3: None, 0x46C0: None, 0x46C1: None, 0x46C2: None, 0x46C3: None,
    }),
    _Platform("Alder Lake-N", "UHD Graphics", False, {
        0x46D0: None, 0x46D1: None, 0x46D2: None, 0x46D3: None, 0x46D4: None,
    }),
    _Platform("Raptor Lake-S", "UHD Graphics", False, {
        0xA780: None, 0xA781: None, 0xA782: None, 0xA783: None,
        0xA788: None, 0xA789: None, 0xA78A: None, 0xA78B: None,
    }),
    _Platform("Raptor Lake-P", "Iris Xe", False, {
        0xA720: None, 0xA7A0: None, 0xA7A8: None, 0xA7AA: None, 0xA7AB: None,
    }),
    _Platform("Raptor Lake-U", "Iris Xe", False, {
        0xA721: None, 0xA7A1: None, 0xA7A9: None, 0xA7AC: None, 0xA7AD: None,
    }),
    # --- integrated, Core Ultra (Xe-LPG, Xe2, Xe3) -----------------------------------
    _Platform("Meteor Lake", "Arc Graphics", False, {0x7D55: None, 0x7DD5: None}),
    _Platform("Meteor Lake", "Intel Graphics", False, {0x7D40: None, 0x7D45: None, 0x7D60: None}),
    _Platform("Arrow Lake", "Arc Graphics", False, {0x7D51: None, 0x7DD1: None}),
    _Platform("Arrow Lake", "Intel Graphics", False, {0x7D41: None, 0x7D67: None, 0xB640: None}),
    _Platform("Lunar Lake", "Arc Graphics", False, {
        0x6420: None, 0x64A0: None, 0x64B0: None,
    }),
    _Platform("Panther Lake", "Arc Graphics", False, {
        0xB080: None, 0xB081: None, 0xB082: None, 0xB083: None, 0xB084: None, 0xB085: None,
        0xB086: None, 0xB087: None, 0xB08F: None, 0xB090: None, 0xB0A0: None, 0xB0B0: None,
    }),
    # --- discrete --------------------------------------------------------------------
    _Platform("DG1", "Iris Xe", True, {
        0x4905: "Iris Xe MAX", 0x4906: None, 0x4907: None, 0x4908: None,
        0x4909: None,
    }),
    _Platform("Alchemist", "Arc", True, {
        0x56A0: "A770", 0x56A1: "A750", 0x56A2: "A580", 0x56A3: None, 0x56A4: None,
        0x56A5: "A380", 0x56A6: "A310", 0x5690: "A770M", 0x5691: "A730M", 0x5692: "A550M",
        0x5693: "A370M", 0x5694: "A350M", 0x5695: None, 0x5696: "A570M", 0x5697: "A530M",
        0x56BA: "A380E", 0x56BB: "A310E", 0x56BC: "A370E", 0x56BD: "A350E", 0x56BE: "A750E",
        0x56BF: "A580E",
    }),
    _Platform("Alchemist", "Arc Pro", True, {
        0x56B0: "Pro A30M", 0x56B1: "A40/A50", 0x56B2: "Pro A60M", 0x56B3: "Pro A60",
    }),
    _Platform("Arctic Sound-M", "Data Center Flex", True, {
        0x56C0: "Flex 170", 0x56C1: "Flex 140", 0x56C2: None,
    }),
    _Platform("Ponte Vecchio", "Data Center Max", True, {
        0x0B69: "Max 1550", 0x0B6E: None, 0x0BD0: None, 0x0BD4: None, 0x0BD5: "Max 1550",
        0x0BD6: "Max 1450", 0x0BD7: None, 0x0BD8: None, 0x0BD9: "Max 1100", 0x0BDA: "Max 1100",
        0x0BDB: "Max 1100", 0x0BE0: None, 0x0BE1: None, 0x0BE5: None,
    }),
    _Platform("Battlemage", "Arc", True, {
        0xE202: None, 0xE209: None, 0xE20B: "B580", 0xE20C: "B570", 0xE20D: None,
        0xE210: None, 0xE216: None, 0xE220: None, 0xE221: None, 0xE222: None, 0xE223: None,
    }),
    _Platform("Battlemage", "Arc Pro", True, {0xE211: "Pro B60", 0xE212: "Pro B50"}),
)

# (model, family) as Intel's DRA driver publishes them (gpu-v0.11.0 models.go); these
# win over the platform table above, so a switch from that driver changes no attribute.
_INTEL_DRIVER: dict[int, tuple[str, str]] = {
    0x4626: ("Alder Lake-P", "Iris Xe"), 0xA7A0: ("Raptor Lake-P", "Iris Xe"),
    0x7D67: ("Arrow Lake-S", "Intel Graphics"),
    0x56A0: ("A770", "Arc A-Series"), 0x56A1: ("A750", "Arc A-Series"),
    0x56A2: ("A580", "Arc A-Series"), 0x56A5: ("A380", "Arc A-Series"),
    0x56A6: ("A310", "Arc A-Series"),
    0x56B0: ("A30M", "Arc Pro A-Series"), 0x56B1: ("A40/A50", "Arc Pro A-Series"),
    0x56B2: ("A60M", "Arc Pro A-Series"), 0x56B3: ("A60", "Arc Pro A-Series"),
    0x56C0: ("Flex 170", "Data Center Flex"), 0x56C1: ("Flex 140", "Data Center Flex"),
    0x0B69: ("Max 1550", "Data Center Max"), 0x0BD0: ("Max 1550", "Data Center Max"),
    0x0BD5: ("Max 1550", "Data Center Max"), 0x0BD6: ("Max 1450", "Data Center Max"),
    0x0BD9: ("Max 1100", "Data Center Max"), 0x0BDA: ("Max 1100", "Data Center Max"),
    0x0BDB: ("Max 1100", "Data Center Max"),
    # Panther Lake's integrated Arc B390/B370, as Intel names them.
    0xB080: ("B390", "Arc B-Series"), 0xB081: ("B370", "Arc B-Series"),
    0xB082: ("B390", "Arc B-Series"), 0xB083: ("B370", "Arc B-Series"),
    0xB084: ("B390", "Arc B-Series"), 0xB085: ("B370", "Arc B-Series"),
    0xB086: ("B390", "Arc B-Series"), 0xB087: ("B370", "Arc B-Series"),
    0xE20B: ("B580", "Arc B-Series"), 0xE20C: ("B570", "Arc B-Series"),
    0xE211: ("B60", "Arc Pro B-Series"), 0xE212: ("B50", "Arc Pro B-Series"),
    0xE222: ("B65", "Arc Pro B-Series"), 0xE223: ("B70", "Arc Pro B-Series"),
}
# fmt: on


def _build() -> dict[int, IntelGpuModel]:
    table: dict[int, IntelGpuModel] = {}
    for p in _PLATFORMS:
        for pci_id, model in p.ids.items():
            if pci_id in table:  # a duplicate id is a table bug, caught by the unit test
                raise ValueError(f"PCI id {pci_id:#06x} listed twice")
            model, family = _INTEL_DRIVER.get(pci_id, (model or p.platform, p.family))
            table[pci_id] = IntelGpuModel(model, family, p.platform, p.discrete)
    if missing := set(_INTEL_DRIVER) - set(table):  # each needs a platform: caught by tests
        raise ValueError(f"PCI ids {sorted(missing)} have no platform")
    return table


TABLE: dict[int, IntelGpuModel] = _build()


def lookup(pci_id: str | int) -> IntelGpuModel:
    """Model and family of an Intel device id; UNKNOWN (never an error) when not listed."""
    value = parse_pci_id(pci_id)
    return TABLE.get(value, UNKNOWN) if value is not None else UNKNOWN
