"""The settings every vendor has: its driver name, sharing, and the VFIO switch (their
options and parsers), and the settings of a vendor with no options beyond them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dra_plugin.devices import valid_driver_name
from dra_plugin.options import (
    EVERY,
    RUN_DISCOVER,
    ConfigError,
    Option,
    Raw,
    RawValues,
    attr_name,
    label,
    number,
    shown,
)
from dra_plugin.sharing import DEFAULT_SHARES, EXCLUSIVE, MAX_SHARES, MODES, SHARED, Sharing


def driver_name_option(vendor: str, title: str, default: str) -> Option:
    return Option(
        f"--{vendor}-driver-name",
        f"{vendor.upper()}_DRIVER_NAME",
        f"DRA driver name for {title} GPUs",
        default,
        commands=EVERY,
    )


def sharing_options(
    vendor: str, what: str, exclusive_help: str, shared_help: str
) -> tuple[Option, ...]:
    return (
        Option(
            f"--{vendor}-sharing",
            f"{vendor.upper()}_SHARING",
            f"exclusive: {exclusive_help}; shared: {shared_help}",
            EXCLUSIVE,
            MODES,
            commands=RUN_DISCOVER,  # discover renders the slices run would publish
        ),
        Option(
            f"--{vendor}-shares",
            f"{vendor.upper()}_SHARES",
            f"shares per {what} when shared",
            str(DEFAULT_SHARES),
            commands=RUN_DISCOVER,
        ),
    )


def vfio_option(vendor: str, title: str, drivers: str, kind: str = "") -> Option:
    """The switch that also publishes a vendor's VFIO-bound GPUs (`Driver.vfio`)."""
    return Option(
        f"--{vendor}-vfio",
        f"{vendor.upper()}_VFIO",
        f"also publish {title} GPUs bound to {drivers} (VM passthrough; {kind}claims get "
        "/dev/vfio nodes); drivers are never rebound",
        "false",
        ("true", "false"),
        commands=RUN_DISCOVER,  # it changes what is published
    )


def parse_vfio(vendor: str, raw: Raw) -> bool:
    return raw[f"{vendor}_vfio"] == "true"


def parse_driver_name(vendor: str, raw: Raw) -> str:
    attr = f"{vendor}_driver_name"
    name = raw[attr]
    if not valid_driver_name(name):
        raise ConfigError(
            f"{shown(raw, attr)} is not a lowercase DNS subdomain of at most 63 characters"
        )
    return name


def parse_shares(vendor: str, raw: Raw) -> tuple[str, int]:
    """(mode, shares) of a vendor's sharing flags."""
    key = f"{vendor}_shares"
    shares = int(number(label(raw, key), raw[key], int, 1))
    if shares > MAX_SHARES:
        raise ConfigError(f"{shown(raw, key)} must be <= {MAX_SHARES}")
    return raw[f"{vendor}_sharing"], shares


@dataclass(frozen=True)
class BasicSettings:
    """Settings of a vendor with no options beyond its driver name and sharing."""

    driver_name: str
    sharing_mode: str = EXCLUSIVE
    shares: int = DEFAULT_SHARES

    @property
    def sharing(self) -> Sharing | None:
        return Sharing(self.shares) if self.sharing_mode == SHARED else None

    @classmethod
    def parse(cls, vendor: str, raw: Raw) -> BasicSettings:
        mode, shares = parse_shares(vendor, raw)
        return cls(parse_driver_name(vendor, raw), mode, shares)


def defaults(options: Sequence[Option]) -> RawValues:
    """Raw values of `options` at their defaults (named by their env twins)."""
    return RawValues(
        {attr_name(o): o.default for o in options}, {attr_name(o): o.env for o in options}
    )
