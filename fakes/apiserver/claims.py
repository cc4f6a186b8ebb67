"""ResourceClaims in the fake API server: seeded claims, the claim's own writes (metadata
only) and its status subresource (update, and server-side apply merged by claim_status.py).
What a status may hold is the real server's to judge (test_kubeapi.py's
test_the_status_subresource_rules_of_the_real_server): the fake stores what it is sent."""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from typing import Any

from fakes.apiserver import claim_status
from fakes.apiserver.errors import GROUP, HTTPError, check_name, not_found

Obj = dict[str, Any]


class ClaimStore:
    """FakeAPIServer's claims (a mixin: the server's __init__ sets these attributes)."""

    lock: threading.Condition
    claims: dict[tuple[str, str], Obj]
    raw_claims: dict[tuple[str, str], bytes]
    claim_owners: dict[tuple[str, str], dict[claim_status.Key, set[str]]]
    _next_rv: Callable[[], str]

    def set_claim_body(self, namespace: str, name: str, data: bytes) -> None:
        """Answer every GET of this claim with `data` (status 200), whatever it is."""
        with self.lock:
            self.raw_claims[(namespace, name)] = data

    def add_claim(self, claim: Obj) -> Obj:
        """Seed a ResourceClaim, stored as given, in the shape of the version tests read it
        in (uid/resourceVersion filled in; apiVersion v1 unless it says)."""
        claim = copy.deepcopy(claim)
        meta = claim.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        claim.setdefault("apiVersion", f"{GROUP}/v1")
        claim.setdefault("kind", "ResourceClaim")
        with self.lock:
            meta["resourceVersion"] = self._next_rv()
            self.claims[(meta["namespace"], meta["name"])] = claim
        return copy.deepcopy(claim)

    def get_stored_claim(self, namespace: str, name: str) -> Obj:
        """A stored claim (as written), for assertions."""
        with self.lock:
            return copy.deepcopy(self.claims[(namespace, name)])

    def _current_claim(self, ns: str, name: str, meta: Obj) -> Obj:
        """The stored claim after the write preconditions (uid, resourceVersion) pass."""
        cur = self.claims.get((ns, name))
        if cur is None:
            raise not_found(name, f"resourceclaims.{GROUP}")
        old = cur["metadata"]
        if meta.get("uid") and meta["uid"] != old["uid"]:
            raise HTTPError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on resourceclaims.{GROUP} "{name}": '
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object "
                f"meta: {old['uid']}",
            )
        if meta.get("resourceVersion") and meta["resourceVersion"] != old["resourceVersion"]:
            raise HTTPError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on resourceclaims.{GROUP} "{name}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
            )
        return cur

    def _store_claim(self, ns: str, name: str, cur: Obj, new: Obj) -> Obj:
        if new != cur:
            new["metadata"]["resourceVersion"] = self._next_rv()
            self.claims[(ns, name)] = new
        return copy.deepcopy(self.claims[(ns, name)])

    def update_claim(self, ns: str, name: str, body: Obj, query: dict[str, str]) -> Obj:
        """PUT on the claim: labels, annotations and finalizers are taken; the spec and
        status are kept as stored."""
        meta = body.get("metadata") or {}
        check_name(meta, name)
        with self.lock:
            cur = self._current_claim(ns, name, meta)
            new = copy.deepcopy(cur)
            for field in ("labels", "annotations", "finalizers"):
                if field in meta:
                    new["metadata"][field] = copy.deepcopy(meta[field])
                else:
                    new["metadata"].pop(field, None)
            return self._store_claim(ns, name, cur, new)

    def update_claim_status(self, ns: str, name: str, body: Obj, query: dict[str, str]) -> Obj:
        """PUT on /status: spec and metadata are kept, the status is stored as sent."""
        meta = body.get("metadata") or {}
        check_name(meta, name)
        status = copy.deepcopy(body.get("status") or {})
        with self.lock:
            cur = self._current_claim(ns, name, meta)
            new = copy.deepcopy(cur)
            new["status"] = status
            owners = copy.deepcopy(self.claim_owners.get((ns, name), {}))
            claim_status.update_owners(
                owners, new["status"].get("devices") or [], query.get("fieldManager") or "unknown"
            )
            stored = self._store_claim(ns, name, cur, new)
            self.claim_owners[(ns, name)] = owners
            return stored

    def apply_claim_status(
        self, ns: str, name: str, version: str, body: Obj, query: dict[str, str]
    ) -> Obj:
        """Server-side apply on /status (only `status.devices` is modelled)."""
        manager = query.get("fieldManager") or ""
        if not manager:
            raise HTTPError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                "required for apply patch",
            )
        if body.get("apiVersion") != f"{GROUP}/{version}" or body.get("kind") != "ResourceClaim":
            raise HTTPError(
                400,
                "BadRequest",
                f"apply: apiVersion/kind must be {GROUP}/{version} ResourceClaim, got "
                f"{body.get('apiVersion')!r}/{body.get('kind')!r}",
            )
        meta = body.get("metadata") or {}
        check_name(meta, name)
        if meta.get("namespace", ns) != ns:
            raise HTTPError(400, "BadRequest", "the namespace of the object does not match")
        status = body.get("status") or {}
        if set(status) - {"devices"}:
            raise HTTPError(
                400, "BadRequest", "the fake API server models apply of status.devices only"
            )
        applied = copy.deepcopy(status.get("devices") or [])
        keys = [claim_status.key_of(e) for e in applied]
        force = query.get("force") in ("true", "True", "1")
        with self.lock:
            cur = self._current_claim(ns, name, meta)
            old_status = cur.get("status") or {}
            owners = copy.deepcopy(self.claim_owners.get((ns, name), {}))
            current = {claim_status.key_of(e): e for e in old_status.get("devices") or []}
            if not force:
                taken = [
                    k
                    for k, e in zip(keys, applied, strict=True)
                    if k in current and current[k] != e and owners.get(k, set()) - {manager}
                ]
                if taken:
                    raise HTTPError(
                        409,
                        "Conflict",
                        f"Apply failed with {len(taken)} conflict(s): .status.devices {taken}",
                    )
            devices = claim_status.apply_devices(
                list(old_status.get("devices") or []), owners, manager, applied
            )
            status_after = copy.deepcopy(old_status)
            if devices:
                status_after["devices"] = devices
            else:
                status_after.pop("devices", None)
            new = copy.deepcopy(cur)
            new["status"] = status_after
            stored = self._store_claim(ns, name, cur, new)
            self.claim_owners[(ns, name)] = owners
            return stored
