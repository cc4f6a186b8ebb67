"""uevents in the libudev wire format, sent from the test process to every monitor
socket umockdev's preload created in a testbed (umockdev's own Testbed.uevent() looks the
device up with libudev in the calling process, which would read the host's /sys)."""

from __future__ import annotations

import glob
import itertools
import os
import socket
import struct
from collections.abc import Mapping

_UDEV_MONITOR_MAGIC = 0xFEEDCAFE
_seqnum = itertools.count(1000)


def _murmur2(data: bytes) -> int:
    """MurmurHash2 (seed = length) as libudev hashes subsystem names for its BPF filter."""
    m, length = 0x5BD1E995, len(data)
    h = length
    i = 0
    while length - i >= 4:
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
        i += 4
    rest = data[i:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if len(rest) >= 1:
        h ^= rest[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def send_uevent(root: str, devpath: str, action: str, props: Mapping[str, str]) -> int:
    """Deliver one uevent to every monitor socket in testbed `root`; returns how many.

    `props` must hold SUBSYSTEM; ACTION, DEVPATH and SEQNUM are added. Monitors whose
    process has exited are unlinked (as umockdev does).
    """
    body = {"ACTION": action, "DEVPATH": devpath, **props, "SEQNUM": str(next(_seqnum))}
    payload = b"".join(f"{k}={v}".encode() + b"\0" for k, v in body.items())
    devtype = props.get("DEVTYPE")
    header = (
        b"libudev\0"
        + struct.pack(">I", _UDEV_MONITOR_MAGIC)
        + struct.pack("=III", 40, 40, len(payload))  # header_size, properties_off, _len
        + struct.pack(">II", _murmur2(props["SUBSYSTEM"].encode()),
                      _murmur2(devtype.encode()) if devtype else 0)
        + struct.pack("=II", 0, 0)  # tag bloom filter: unused
    )  # fmt: skip
    sent = 0
    for path in sorted(glob.glob(os.path.join(root, "event[0-9]*"))):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto(header + payload, path)
                sent += 1
            except ConnectionRefusedError:
                os.unlink(path)  # its monitor is gone
    return sent
