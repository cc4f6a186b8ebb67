"""Claim GETs for a prepare, before the lock: bounded concurrency, failures as data."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import COMPLETED, CheckpointError
from dra_plugin.claims.allocation import malformed
from dra_plugin.claims.contract import ClaimRef
from dra_plugin.kubeapi import ApiError, NotFoundError

log = logging.getLogger(__name__)
FETCH_CONCURRENCY = 8
FetchClaim = Callable[[str, str], Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True)
class FetchFailed:
    """A claim that could not be read: the message its prepare answers with."""

    message: str


Fetched = Mapping[str, Any] | FetchFailed


async def _one(fetch: FetchClaim, ref: ClaimRef) -> Fetched:
    try:
        got = await fetch(ref.namespace, ref.name)
        if not isinstance(got, Mapping):  # the API answered something that is not a claim
            return FetchFailed(str(malformed(str(ref), "the claim", got, "an object")))
        return got
    except NotFoundError:
        return FetchFailed(f"{ref}: not found in the API")
    except ApiError as exc:
        return FetchFailed(f"{ref}: cannot read it from the API: {exc}")
    except Exception as exc:  # a bug reading one claim fails that claim, not the call
        log.exception("%s: unexpected error reading the claim", ref)
        return FetchFailed(f"{ref}: cannot read it from the API: {type(exc).__name__}: {exc}")


async def fetch_all(fetch: FetchClaim, refs: Sequence[ClaimRef]) -> dict[str, Fetched]:
    """uid -> the claim, or why it could not be read."""
    if len(refs) == 1:  # the common call: no tasks, no semaphore
        return {refs[0].uid: await _one(fetch, refs[0])}
    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def gated(ref: ClaimRef) -> Fetched:
        async with gate:
            return await _one(fetch, ref)

    got = await asyncio.gather(*(gated(r) for r in refs))
    return {r.uid: g for r, g in zip(refs, got, strict=True)}


async def known_completed(checkpoint: Checkpoint, uids: Iterable[str]) -> set[str]:
    """Claims prepared as of the last locked pass: their GET is skipped. No I/O once a
    pass has run (before it, a separate reader reads the files). Rechecked under the lock:
    one unprepared meanwhile answers "changed while waiting; retry"."""
    state = checkpoint.cached()
    if state is None:
        reader = Checkpoint(checkpoint.path.parent, checkpoint.driver, boot_id=str)
        try:
            state = await asyncio.to_thread(reader.read)
        except (CheckpointError, OSError):  # an unusable file is handled under the lock
            return set()
        if state is None:
            return set()
    recs = [c for u in uids if (c := state.claims.get(u)) is not None]
    return {c.uid for c in recs if c.state == COMPLETED and not c.recovered}
