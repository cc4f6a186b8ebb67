"""The vendor seam: no vendor knowledge outside dra_plugin/vendors/<vendor>/ and the
registry, and the core takes what the vendors declare (issue #27, item 5)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from dra_plugin.doctor import nodecheck
from dra_plugin.vendors import registry

PACKAGE = Path(__file__).resolve().parents[2] / "dra_plugin"

# Vendor, driver, library and product words, matched case-insensitively as words (an
# underscore, dash or dot ends a word: `nvml_reader` and `xe-vfio-pci` are hits).
VENDOR_WORDS = (
    "intel", "nvidia", "amd", "amdgpu", "i915", "xe", "nouveau", "nvgrace", "radeon",
    "rocm", "kfd", "cuda", "nvml", "mig", "xcp", "instinct", "geforce", "quadro", "habana",
    "gaudi", "0x8086", "0x10de", "0x1002",
)  # fmt: skip
_WORD = re.compile(
    r"(?<![a-z0-9])(" + "|".join(map(re.escape, VENDOR_WORDS)) + r")(?![a-z0-9])", re.I
)

# Where a vendor name is a wire fact or a measured unit, not knowledge: (path under
# dra_plugin/, word). Keep each entry explained.
ALLOWED = {
    # The CPU's IOMMU kernel parameter in a VFIO error's hint, not a GPU vendor.
    ("host/vfio.py", "intel"),
    # A metric's HELP text, published as is: it says what the series means on AMD GPUs.
    ("telemetry/catalogue.py", "amd"),
}


def _core_files() -> list[Path]:
    vendor_dirs = {PACKAGE / "vendors" / v.name for v in registry.VENDORS}
    skip = {PACKAGE / "vendors" / "registry.py"}
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(d in p.parents for d in vendor_dirs)
        and p not in skip
        and (PACKAGE / "_proto") not in p.parents
    ]


def _hits(path: Path) -> list[str]:
    """`line: word` for every vendor word in the file's names and strings (comments are
    prose for maintainers and may give examples)."""
    out = []
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for tok in tokens:
        if tok.type not in (tokenize.NAME, tokenize.STRING):
            continue
        rel = str(path.relative_to(PACKAGE))
        for m in _WORD.finditer(tok.string):
            if (rel, m.group(1).lower()) not in ALLOWED:
                out.append(f"{rel}:{tok.start[0]}: {m.group(1)}")
    return out


def test_the_core_names_no_vendor() -> None:
    files = _core_files()
    assert PACKAGE / "doctor" / "nodecheck.py" in files  # the scan covers the core
    hits = [h for p in files for h in _hits(p)]
    assert hits == [], "vendor knowledge outside dra_plugin/vendors/<vendor>/:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    ("source", "hit"),
    [
        ('X = ("vfio-pci", "xe-vfio-pci")\n', True),
        ("def nvml_reader() -> None: ...\n", True),
        ('"""Reads AMD GPUs."""\n', True),
        ("# a comment about NVIDIA\n", False),
        ('MIGRATE = "mixed"\n', False),
    ],
)
def test_the_scan_finds_words_in_names_and_strings(
    tmp_path: Path, source: str, hit: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path)
    f = tmp_path / "core.py"
    f.write_text(source)
    assert bool(_hits(f)) is hit


def test_the_core_takes_the_vendors_vfio_drivers() -> None:
    declared = {d for v in registry.VENDORS for d in v.vfio_drivers}
    assert nodecheck.vfio_drivers() == declared
    assert "nvgrace-gpu-vfio-pci" in declared  # Grace Hopper/Blackwell passthrough
