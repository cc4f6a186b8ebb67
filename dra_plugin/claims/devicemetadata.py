"""Device metadata files (KEP-5304), as the kubelet plugin library writes them for Go drivers.

Per prepared claim and (base) request:
- the file `<plugin dir>/dra-device-metadata/<ns>_<claim>/<request>/metadata.json`: a JSON
  stream of the same DeviceMetadata object once per API version, newest first
  (`metadata.resource.k8s.io/v1beta1`, then `v1alpha1`; metadatastream.py);
- its CDI spec `<cdi root>/<driver>_metadata_<claimUID>_<request>.json` (kind
  `<driver>/metadata`, device `<claimUID>_<request>`, cdiVersion 0.5.0) bind-mounting it
  read-only at `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/
  <request>/<driver>-metadata.json` (`resourceclaimtemplates/<pod claim name>/...` for
  claims made from a template);
- its CDI ID, answered with the first device of that request, after the device's own IDs.
Byte layout follows Go's encoding/json (MarshalIndent, struct field order, HTML escaping).

What was written is recorded in the claim's checkpoint entry (`ClaimRecord.device_metadata`,
see `record`), so unprepare, crash recovery and start-up GC need no claim object.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dra_plugin.cdi.rules import validate_spec
from dra_plugin.checkpoint.recovery import who
from dra_plugin.checkpoint.snapshot import ClaimRecord
from dra_plugin.claims.allocation import Chosen
from dra_plugin.claims.metadatastream import API_VERSIONS, encode, go_json, read_stream
from dra_plugin.devices import Device, is_dns_label, is_dns_subdomain
from dra_plugin.host.files import (
    SHARED_DIR_MODE,
    atomic_write,
    kind,
    make_dir,
    own_dir,
    read_json,
    remove_any,
    remove_unexpected,
)
from dra_plugin.slices.build import published_attributes

log = logging.getLogger(__name__)

SUBDIR = "dra-device-metadata"
FILE_NAME = "metadata.json"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CDI_VERSION = "0.5.0"
FILE_MODE = 0o644
DIR_MODE = SHARED_DIR_MODE  # as the library's


class MetadataError(OSError):
    """A metadata file or spec could not be written or removed, or a request name cannot
    become a path; the message says which."""


@dataclass(frozen=True)
class Request:
    name: str  # base request: file paths and CDI names
    ref: str  # as allocated ("gpu/large" for a subrequest): recorded in the file
    cdi_id: str


@dataclass(frozen=True)
class Recorded:
    """The checkpoint's `deviceMetadata` entry of one claim."""

    pod_claim_name: str | None
    requests: tuple[Request, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "podClaimName": self.pod_claim_name,
            "requests": [
                {"name": r.name, "request": r.ref, "cdiId": r.cdi_id} for r in self.requests
            ],
        }

    @staticmethod
    def from_json(raw: Mapping[str, Any] | None) -> Recorded | None:
        if not isinstance(raw, Mapping):
            return None
        pod = raw.get("podClaimName")
        reqs = []
        for r in raw.get("requests") or []:
            ok = isinstance(r, Mapping) and all(isinstance(r.get(k), str) for k in _REQ_KEYS)
            if ok and is_dns_label(r["name"]):  # the name becomes a path segment
                reqs.append(Request(r["name"], r["request"], r["cdiId"]))
        return Recorded(pod if isinstance(pod, str) and pod else None, tuple(reqs))


_REQ_KEYS = ("name", "request", "cdiId")


def recorded(rec: ClaimRecord) -> Recorded | None:
    return Recorded.from_json(rec.device_metadata)


def cdi_id(driver: str, claim_uid: str, request: str) -> str:
    return f"{driver}/metadata={claim_uid}_{request}"


def inject(
    ids_by_device: Sequence[tuple[tuple[str, ...], tuple[str, ...]]], rec: Recorded | None
) -> list[tuple[str, ...]]:
    """Each device's CDI IDs, given (request names, ids) per device in answer order: the
    metadata ID of a request goes with the first device of that request only."""
    by_request = {r.name: r.cdi_id for r in rec.requests} if rec else {}
    done: set[str] = set()
    out = []
    for requests, ids in ids_by_device:
        extra = []
        for name in requests:
            if name in by_request and name not in done:
                extra.append(by_request[name])
                done.add(name)
        out.append((*ids, *extra))
    return out


def plan(
    driver: str, claim_uid: str, claim: Mapping[str, Any], results: Iterable[tuple[str, str]]
) -> Recorded | None:
    """What to write for a claim, from (base request, request as allocated) per result;
    None when no result is ours."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    pod = annotations.get(POD_CLAIM_ANNOTATION)
    if isinstance(pod, str) and pod and not is_dns_subdomain(pod):  # it becomes a path
        raise MetadataError(f"annotation {POD_CLAIM_ANNOTATION}={pod[:80]!r} is not a name")
    seen: dict[str, str] = {}
    for base, ref in results:
        if not is_dns_label(base):
            raise MetadataError(f"request name {base!r} is not a DNS label")
        seen.setdefault(base, ref)
    if not seen:
        return None
    reqs = tuple(Request(b, r, cdi_id(driver, claim_uid, b)) for b, r in sorted(seen.items()))
    return Recorded(pod if isinstance(pod, str) and pod else None, reqs)


class MetadataFiles:
    """The files of one driver: host metadata under its plugin dir, CDI specs in cdi_root."""

    def __init__(self, driver: str, plugin_dir: Path, cdi_root: Path) -> None:
        self.driver = driver
        self.base = plugin_dir / SUBDIR
        self.cdi_root = cdi_root
        self._spec = re.compile(
            rf"^{re.escape(driver)}_metadata_(?P<uid>[a-z0-9-]+)_(?P<req>[a-z0-9-]+)\.json\Z"
        )

    def plan(
        self, claim_uid: str, claim: Mapping[str, Any], chosen: Sequence[Chosen]
    ) -> dict[str, Any] | None:
        """The checkpoint entry for a claim about to be prepared (None: nothing to write)."""
        results = [(c.request, str(c.result.get("request") or c.request)) for c in chosen]
        got = plan(self.driver, claim_uid, claim, results)
        return got.to_json() if got is not None else None

    # --- paths -------------------------------------------------------------------------
    def claim_dir(self, namespace: str, name: str) -> Path:
        return self.base / f"{namespace}_{name}"

    def host_file(self, namespace: str, name: str, request: str) -> Path:
        return self.claim_dir(namespace, name) / request / FILE_NAME

    def spec_file(self, claim_uid: str, request: str) -> Path:
        return self.cdi_root / f"{self.driver}_metadata_{claim_uid}_{request}.json"

    def container_path(self, claim_name: str, pod_claim_name: str | None, request: str) -> str:
        where = (
            f"resourceclaimtemplates/{pod_claim_name}"
            if pod_claim_name
            else (f"resourceclaims/{claim_name}")
        )
        return f"{CONTAINER_DIR}/{where}/{request}/{self.driver}-metadata.json"

    # --- rendering (pure) ----------------------------------------------------------------
    def document(
        self, rec: ClaimRecord, meta: Recorded, req: Request, devices: Mapping[str, Device]
    ) -> bytes:
        listed = []
        for d in rec.devices:
            if req.name not in d.request_names:
                continue
            entry: dict[str, Any] = {"driver": self.driver, "pool": d.pool, "name": d.device}
            dev = devices.get(d.device)
            attrs = published_attributes(dev) if dev is not None else {}
            if attrs:
                entry["attributes"] = dict(sorted(attrs.items()))
            listed.append(entry)
        claim = {"name": rec.name, "namespace": rec.namespace, "uid": rec.uid}
        return encode(claim, meta.pod_claim_name, req.ref, listed)

    def spec(self, rec: ClaimRecord, meta: Recorded, req: Request) -> dict[str, Any]:
        mount = {
            "hostPath": str(self.host_file(rec.namespace, rec.name, req.name)),
            "containerPath": self.container_path(rec.name, meta.pod_claim_name, req.name),
            "options": ["ro", "bind"],
        }
        return {
            "cdiVersion": CDI_VERSION,
            "kind": f"{self.driver}/metadata",
            "devices": [{"name": f"{rec.uid}_{req.name}", "containerEdits": {"mounts": [mount]}}],
        }

    # --- side effects --------------------------------------------------------------------
    def write(self, rec: ClaimRecord, devices: Mapping[str, Device]) -> None:
        """Write every file the record lists (atomically); MetadataError says what failed."""
        meta = recorded(rec)
        for req in meta.requests if meta else ():
            assert meta is not None
            spec = self.spec(rec, meta, req)
            errors = validate_spec(spec)
            if errors:
                raise MetadataError(
                    f"metadata CDI spec for request {req.name}: {'; '.join(errors)}"
                )
            host = self.host_file(rec.namespace, rec.name, req.name)
            try:
                # Each level made or checked without following a link left in its place.
                for d in (self.base, host.parent.parent, host.parent):
                    own_dir(d, DIR_MODE)
                atomic_write(host, self.document(rec, meta, req, devices), FILE_MODE)
                make_dir(self.cdi_root, SHARED_DIR_MODE)
                atomic_write(self.spec_file(rec.uid, req.name), go_json(spec), FILE_MODE)
            except OSError as exc:
                raise MetadataError(f"request {req.name}: {exc}") from exc

    def write_or_drop(self, rec: ClaimRecord, devices: Mapping[str, Device]) -> ClaimRecord:
        """As the library does: a claim whose metadata cannot be written is still prepared,
        without its metadata (logged); what was written of it is removed."""
        try:
            self.write(rec, devices)
            return rec
        except OSError as exc:
            log.error("%s: device metadata not written: %s", who(rec), exc)
            with contextlib.suppress(OSError):
                self.remove_record(rec)
            return replace(rec, device_metadata=None)

    def remove_record(self, rec: ClaimRecord) -> bool:
        return self.remove(rec.namespace, rec.name, rec.uid, rec)

    def present(self, rec: ClaimRecord) -> bool:
        """Whether every file the record lists is there as we wrote it (each spec exactly:
        it is rendered from the record alone; each metadata file this claim's and
        request's; each directory level a directory), else a re-prepare writes them."""
        meta = recorded(rec)
        for req in meta.requests if meta else ():
            assert meta is not None
            host = self.host_file(rec.namespace, rec.name, req.name)
            if any(kind(d) != "dir" for d in (self.base, host.parent.parent, host.parent)):
                return False
            if read_json(self.spec_file(rec.uid, req.name)) != self.spec(rec, meta, req):
                return False
            docs = read_stream(host)
            # Every version we write, in our order: a file from before v1beta1 is rewritten.
            if docs is None or [d.get("apiVersion") for d in docs] != list(API_VERSIONS):
                return False
            for doc in docs:
                asked = [r.get("name") for r in doc.get("requests") or [] if isinstance(r, dict)]
                if (doc.get("metadata") or {}).get("uid") != rec.uid or asked != [req.ref]:
                    return False
        return True

    def _real_dirs(self, namespace: str, name: str) -> bool:
        """Whether the metadata dir and the claim's dir are directories, not links: only
        then is a path below them ours."""
        return kind(self.base) == "dir" and kind(self.claim_dir(namespace, name)) == "dir"

    def remove(self, namespace: str, name: str, claim_uid: str, rec: ClaimRecord | None) -> bool:
        """Remove a claim's files; True if any was there. Raises MetadataError.

        With a record: the files it lists, and the claim dir once empty. Without one (a UID
        we do not know): every spec file of the UID, as the library's glob does, but not
        the claim dir, which is named by namespace/name that a newer claim may reuse. A
        record without metadata costs nothing here.
        """
        meta = recorded(rec) if rec is not None else None
        if rec is not None and meta is None:
            return False
        removed = False
        try:
            if meta is None:
                specs = list(self.cdi_root.glob(f"{self.driver}_metadata_{claim_uid}_*.json"))
            else:
                specs = [self.spec_file(claim_uid, r.name) for r in meta.requests]
            for path in specs:
                if self._spec.match(path.name) and remove_any(path):
                    removed = True
            claim_dir = self.claim_dir(namespace, name)
            if meta is not None and not self._real_dirs(namespace, name):
                # A link (or file) where our directory belongs: it goes, its target stays.
                for path, expected in ((self.base, "directory"), (claim_dir, "directory")):
                    what = kind(path)
                    if what not in (None, "dir"):
                        remove_unexpected(path, what, expected)
                        return True
                return removed
            for req in meta.requests if meta else ():
                if remove_any(claim_dir / req.name):
                    removed = True
            if meta is not None and not any(os.scandir(claim_dir)):
                claim_dir.rmdir()
        except OSError as exc:
            raise MetadataError(f"cannot remove device metadata: {exc}") from exc
        return removed

    def collect_orphans(self, records: Iterable[ClaimRecord]) -> list[Path]:
        """Start-up GC: files and dirs no record lists (and leftovers of interrupted writes)."""
        keep_specs: set[tuple[str, str]] = set()
        keep_dirs: dict[str, set[str]] = {}
        for rec in records:
            meta = recorded(rec)
            for req in meta.requests if meta else ():
                keep_specs.add((rec.uid, req.name))
                keep_dirs.setdefault(f"{rec.namespace}_{rec.name}", set()).add(req.name)
        removed: list[Path] = []
        try:
            names = sorted(os.listdir(self.cdi_root))
        except FileNotFoundError:
            names = []
        for n in names:
            m = self._spec.match(n)
            stray_tmp = n.startswith(f".{self.driver}_metadata_") and ".tmp" in n
            if (m and (m["uid"], m["req"]) not in keep_specs) or stray_tmp:
                remove_any(self.cdi_root / n)  # whatever it is, never followed
                removed.append(self.cdi_root / n)
        for claim_dir in self._own_dirs(self.base):
            keep = keep_dirs.get(claim_dir.name, set())
            for sub in self._own_dirs(claim_dir):
                if sub.name not in keep:
                    remove_any(sub)
                    removed.append(sub)
                    continue
                for entry in os.scandir(sub):
                    if entry.name.startswith(f".{FILE_NAME}.tmp-"):
                        os.unlink(entry.path)  # an interrupted write's
                    elif entry.name != FILE_NAME or entry.is_symlink() or not entry.is_file():
                        remove_unexpected(Path(entry.path), _kind(entry), "metadata file")
            if not any(os.scandir(claim_dir)):
                claim_dir.rmdir()
        for path in removed:
            log.warning("removed orphan device metadata path=%s", path)
        return removed

    @staticmethod
    def _own_dirs(parent: Path) -> list[Path]:
        """The directories in one of ours (sorted); anything else there is removed without
        being followed, and a link or file in the place of `parent` itself goes too."""
        what = kind(parent)
        if what != "dir":
            if what is not None:
                remove_unexpected(parent, what, "directory")
            return []
        out = []
        for entry in sorted(os.scandir(parent), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                out.append(Path(entry.path))
            else:
                remove_unexpected(Path(entry.path), _kind(entry), "directory")
        return out


def _kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return "link"
    return "dir" if entry.is_dir(follow_symlinks=False) else "file"
