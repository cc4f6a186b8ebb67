"""NVIDIA's own flags and their parsed, frozen value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dra_plugin.options import (
    EVERY,
    RUN_DISCOVER,
    RUN_ONLY,
    ConfigError,
    Option,
    Raw,
    absolute_path,
    label,
    number,
    shown,
    split,
)
from dra_plugin.sharing import DEFAULT_SHARES, EXCLUSIVE, SHARED, Sharing
from dra_plugin.vendors.basicsettings import (
    driver_name_option,
    parse_driver_name,
    parse_shares,
    parse_vfio,
    sharing_options,
    vfio_option,
)
from dra_plugin.vendors.nvidia.model import NVIDIA

CDI_STRATEGIES = ("auto", "toolkit", "host-libs", "device-nodes")
# XIDs caused by applications (not the hardware): the vendor drivers ignore them too.
DEFAULT_XID_IGNORE = (13, 31, 43, 45, 68, 109)
DEFAULT_TOOLKIT_CDI_DIRS = (Path("/var/cdi/static"), Path("/var/run/cdi"), Path("/etc/cdi"))

OPTIONS = (
    driver_name_option(NVIDIA, "NVIDIA", "gpu.nvidia.com"),
    Option(
        "--nvidia-driver-root",
        "NVIDIA_DRIVER_ROOT",
        "root of the NVIDIA driver install (where libnvidia-ml.so.1 lives)",
        "/",
        commands=EVERY,
    ),
    Option(
        "--nvidia-cdi-strategy",
        "NVIDIA_CDI_STRATEGY",
        "how NVIDIA userspace reaches containers",
        "auto",
        CDI_STRATEGIES,
    ),
    Option(
        "--nvidia-toolkit-cdi-dirs",
        "NVIDIA_TOOLKIT_CDI_DIRS",
        "comma-separated dirs searched for the NVIDIA toolkit's CDI spec",
        ",".join(str(d) for d in DEFAULT_TOOLKIT_CDI_DIRS),
    ),
    *sharing_options(
        NVIDIA,
        "NVIDIA GPU",
        "one claim per NVIDIA GPU",
        "several claims share one",
    ),
    Option(
        "--nvidia-shared-memory",
        "NVIDIA_SHARED_MEMORY",
        "shared NVIDIA GPUs also publish memory as consumable capacity (booked by the "
        "scheduler, not enforced on the GPU)",
        "false",
        ("true", "false"),
        commands=RUN_DISCOVER,
    ),
    vfio_option(NVIDIA, "NVIDIA", "vfio-pci", "type vfio, "),
    Option(
        "--nvidia-mig-partitions",
        "NVIDIA_MIG_PARTITIONS",
        "GPUs in MIG mode publish every MIG placement as a partitionable device (KEP-4815, "
        "needs the DRAPartitionableDevices gate); the MIG instance is made when a claim is "
        "prepared and destroyed when it is unprepared",
        "false",
        ("true", "false"),
        commands=RUN_DISCOVER,
    ),
    Option(
        "--nvidia-mps-image",
        "NVIDIA_MPS_IMAGE",
        "image of the MPS control daemon pods (the chart sets the plugin's own image; the "
        "daemon runs from the driver root)",
        "",
        commands=RUN_ONLY,
    ),
    Option(
        "--nvidia-mps-image-pull-secrets",
        "NVIDIA_MPS_IMAGE_PULL_SECRETS",
        "comma-separated names of Secrets in the plugin's namespace the MPS control daemon "
        "pods pull their image with (imagePullSecrets; the chart passes the release's own)",
        "",
        commands=RUN_ONLY,
    ),
    Option(
        "--nvidia-mps-ready-timeout",
        "NVIDIA_MPS_READY_TIMEOUT",
        "how long a prepare waits for a claim's MPS control daemon to be ready (seconds)",
        "30",
        commands=RUN_ONLY,
        old_envs=("NVIDIA_MPS_READY_TIMEOUT_SECONDS",),
    ),
    Option(
        "--nvidia-shares-mps",
        "NVIDIA_SHARES_MPS",
        "shared NVIDIA GPUs are served by one MPS control daemon each, and each claim's "
        "consumed shares (and memory) become its MPS limits",
        "false",
        ("true", "false"),
        commands=RUN_ONLY,
    ),
    Option(
        "--xid-ignore",
        "XID_IGNORE",
        "comma-separated XIDs that do not mark a GPU unhealthy",
        ",".join(str(x) for x in DEFAULT_XID_IGNORE),
        old_envs=("NVIDIA_XID_IGNORE",),
    ),
)


@dataclass(frozen=True)
class NvidiaSettings:
    driver_name: str = "gpu.nvidia.com"
    driver_root: Path = Path("/")
    cdi_strategy: str = "auto"
    toolkit_cdi_dirs: tuple[Path, ...] = DEFAULT_TOOLKIT_CDI_DIRS
    sharing_mode: str = EXCLUSIVE
    shares: int = DEFAULT_SHARES
    shared_memory: bool = False
    xid_ignore: tuple[int, ...] = DEFAULT_XID_IGNORE
    vfio: bool = False  # publish VFIO-bound GPUs (found through udev, not NVML)
    mig_partitions: bool = False  # MIG placements published, instances made on demand
    mps_image: str = ""
    mps_pull_secrets: tuple[str, ...] = ()  # imagePullSecrets of the daemons' pods
    mps_ready_timeout: float = 30.0
    shares_mps: bool = False  # shared GPUs get one MPS daemon each, shares become limits

    @property
    def sharing(self) -> Sharing | None:
        if self.sharing_mode != SHARED:
            return None
        return Sharing(self.shares, memory=self.shared_memory)

    @classmethod
    def parse(cls, raw: Raw) -> NvidiaSettings:
        try:
            xids = tuple(int(x) for x in split(raw["xid_ignore"]))
        except ValueError:
            raise ConfigError(
                f"{shown(raw, 'xid_ignore')} is not a comma list of integers"
            ) from None
        mode, shares = parse_shares(NVIDIA, raw)
        partitions = raw["nvidia_mig_partitions"] == "true"
        shares_mps = raw["nvidia_shares_mps"] == "true"
        if shares_mps and mode != SHARED:
            raise ConfigError(
                f"{shown(raw, 'nvidia_shares_mps')} needs {shown(raw, 'nvidia_sharing')} "
                "to be shared: only shares are enforced with MPS"
            )
        if partitions and mode == SHARED:
            # A MIG instance made for a claim is that claim's; NVIDIA's DynamicMIG
            # excludes MPS sharing the same way.
            raise ConfigError(
                f"{shown(raw, 'nvidia_mig_partitions')} cannot be combined with "
                f"{shown(raw, 'nvidia_sharing')}: partitions made on demand are never shared"
            )
        # Relative paths would be read relative to wherever the process was started.
        dirs = split(raw["nvidia_toolkit_cdi_dirs"])
        if any(not d.startswith("/") for d in dirs):
            raise ConfigError(
                f"{shown(raw, 'nvidia_toolkit_cdi_dirs')} must list absolute paths only"
            )
        return cls(
            driver_name=parse_driver_name(NVIDIA, raw),
            driver_root=Path(absolute_path(raw, "nvidia_driver_root")),
            cdi_strategy=raw["nvidia_cdi_strategy"],
            toolkit_cdi_dirs=tuple(Path(p) for p in dirs),
            sharing_mode=mode,
            shares=shares,
            shared_memory=raw["nvidia_shared_memory"] == "true",
            xid_ignore=xids,
            vfio=parse_vfio(NVIDIA, raw),
            mig_partitions=partitions,
            mps_image=raw["nvidia_mps_image"].strip(),
            mps_pull_secrets=split(raw["nvidia_mps_image_pull_secrets"]),
            mps_ready_timeout=float(
                number(
                    label(raw, "nvidia_mps_ready_timeout"),
                    raw["nvidia_mps_ready_timeout"],
                    float,
                    1,
                )
            ),
            shares_mps=shares_mps,
        )
