"""ResourceSlices in the fake API server: the stored slices, their writes (stored as
sent, or as a test's `rewrite_slice` fault changes them) and the event history watches
read. What a real server keeps, drops or refuses is the real server's to say
(tests/realapi.py, tests/judges/slice_cases.py): the fake stores what it is sent."""

from __future__ import annotations

import copy
import random
import threading
import uuid
from collections.abc import Callable
from typing import Any

from fakes.apiserver.errors import GROUP, HTTPError, not_found, slice_details
from fakes.apiserver.selectors import now, served

Obj = dict[str, Any]


class SliceStore:
    """FakeAPIServer's slices (a mixin: the server's __init__ sets these attributes)."""

    lock: threading.Condition
    rv: int
    slices: dict[str, Obj]
    events: list[tuple[int, str, Obj]]  # (rv, type, object as stored)
    history: int
    oldest_rv: int
    _next_rv: Callable[[], str]
    # A test's fault: called with the slice being written (as sent) and the stored one (None on
    # create), it edits the first in place before it is stored (a server that drops
    # fields, as one with a feature gate off does); dry runs too.
    rewrite_slice: Callable[[Obj, Obj | None], None] | None

    def list_stored_slices(self) -> list[Obj]:
        """Stored slices (as written, in the version they were written in), for assertions."""
        with self.lock:
            return [copy.deepcopy(s) for s in self.slices.values()]

    def delete_all_slices(self, node: str | None = None) -> int:
        """What the kubelet does at its start: delete every slice of the node."""
        with self.lock:
            names = [
                n
                for n, s in self.slices.items()
                if node is None or s["spec"].get("nodeName") == node
            ]
            for name in names:
                self._delete(name)
        return len(names)

    def edit_slice(self, name: str, mutate: Any) -> Obj:
        """Someone else changes a stored slice: `mutate(obj)` edits it in place."""
        with self.lock:
            obj = copy.deepcopy(self.slices[name])
            mutate(obj)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self.slices[name] = obj
            self._event("MODIFIED", obj)
            return copy.deepcopy(obj)

    def compact(self) -> None:
        """Forget the event history: watches resuming from older versions get 410."""
        with self.lock:
            self.events.clear()
            self.oldest_rv = self.rv

    def _event(self, etype: str, obj: Obj) -> None:
        self.events.append((int(obj["metadata"]["resourceVersion"]), etype, copy.deepcopy(obj)))
        if len(self.events) > self.history:
            drop = len(self.events) - self.history
            self.oldest_rv = self.events[drop - 1][0] + 1
            del self.events[:drop]
        self.lock.notify_all()

    def _delete(self, name: str) -> Obj:
        obj = self.slices.pop(name)
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._event("DELETED", obj)
        return obj

    def create_slice(
        self,
        version: str,
        body: Obj,
        *,
        dry_run: bool = False,
    ) -> Obj:
        if body.get("kind", "ResourceSlice") != "ResourceSlice":
            raise HTTPError(400, "BadRequest", f"kind {body.get('kind')!r} is not ResourceSlice")
        meta = body.setdefault("metadata", {})
        name = meta.get("name") or ""
        if not name:
            prefix = meta.get("generateName") or ""
            if not prefix:
                raise HTTPError(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                    slice_details("", [("metadata.name", "Required value")]),
                )
            # Like the real server: generateName is cut to 58 chars, 5 random chars follow.
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            name = prefix[:58] + "".join(random.choices(alphabet, k=5))
            meta["name"] = name
        obj = copy.deepcopy(body)
        obj["apiVersion"] = f"{GROUP}/{version}"
        obj["kind"] = "ResourceSlice"
        if self.rewrite_slice is not None:
            self.rewrite_slice(obj, None)
        stamp = now()
        _stamp_taints(obj, stamp)
        with self.lock:
            if name in self.slices:
                raise HTTPError(
                    409,
                    "AlreadyExists",
                    f'resourceslices.{GROUP} "{name}" already exists',
                    {"name": name, "group": GROUP, "kind": "resourceslices"},
                )
            m = obj["metadata"]
            if dry_run:
                # dryRun=All: admitted, defaulted and stripped like a create, never stored.
                m.update(uid=str(uuid.uuid4()), creationTimestamp=stamp, generation=1)
                return served(obj, version)
            m.update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next_rv(),
                creationTimestamp=stamp,
                generation=1,
            )
            self.slices[name] = obj
            self._event("ADDED", obj)
            return served(obj, version)

    def update_slice(
        self,
        version: str,
        name: str,
        body: Obj,
    ) -> Obj:
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            raise HTTPError(
                400,
                "BadRequest",
                "the name of the object "
                f"({meta.get('name')}) does not match the name on the URL ({name})",
            )
        obj = copy.deepcopy(body)
        obj["apiVersion"] = f"{GROUP}/{version}"
        obj["kind"] = "ResourceSlice"
        if self.rewrite_slice is not None:
            with self.lock:
                stored = copy.deepcopy(self.slices.get(name))
            self.rewrite_slice(obj, stored)
        with self.lock:
            cur = self.slices.get(name)
            if cur is None:
                raise not_found(name)
            want = meta.get("resourceVersion")
            if want and want != cur["metadata"]["resourceVersion"]:
                raise HTTPError(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on "
                    f'resourceslices.{GROUP} "{name}": the object has been '
                    "modified; please apply your changes to the latest version "
                    "and try again",
                    {"name": name, "group": GROUP, "kind": "resourceslices"},
                )
            for field in ("driver", "nodeName"):
                if obj["spec"].get(field) != cur["spec"].get(field):
                    raise HTTPError(
                        422,
                        "Invalid",
                        f"spec.{field}: Invalid value: field is immutable",
                        slice_details(name, [(f"spec.{field}", "field is immutable")]),
                    )
            if obj["spec"]["pool"].get("name") != cur["spec"]["pool"].get("name"):
                raise HTTPError(
                    422,
                    "Invalid",
                    "spec.pool.name: Invalid value: field is immutable",
                    slice_details(name, [("spec.pool.name", "field is immutable")]),
                )
            _stamp_taints(obj, now())
            m = obj["metadata"]
            old = cur["metadata"]
            for keep in ("uid", "creationTimestamp", "generation"):
                m[keep] = old.get(keep)
            if obj["spec"] != cur["spec"]:
                m["generation"] = int(old.get("generation", 1)) + 1
            m["resourceVersion"] = self._next_rv()
            self.slices[name] = obj
            self._event("MODIFIED", obj)
            return served(obj, version)


def _stamp_taints(obj: Obj, now: str) -> None:
    # The server fills in taint.timeAdded when a client leaves it out.
    for dev in obj.get("spec", {}).get("devices") or []:
        for taint in dev.get("basic", dev).get("taints") or []:  # v1beta1: under basic
            taint.setdefault("timeAdded", now)
