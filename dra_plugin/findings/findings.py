"""What `dra-plugin doctor` reports: one finding per check result, and the whole report."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(enum.IntEnum):
    # Ordered by severity: the report's worst status decides the exit code.
    PASS = 0
    WARN = 1
    FAIL = 2


@dataclass(frozen=True)
class Finding:
    status: Status
    check: str
    found: str
    action: str = ""  # empty: nothing to do
    detail: str = ""  # optional multi-line snippet to paste (TOML, YAML)


@dataclass(frozen=True)
class Report:
    node: str
    findings: tuple[Finding, ...]

    @property
    def worst(self) -> Status:
        return max((f.status for f in self.findings), default=Status.PASS)
