"""ClaimStatusReporter around the real ClaimPreparer, with the real client against the
fake API server: what is written, when it is not written again, and failure counting."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dra_plugin.claims.claimstatus import ClaimStatusReporter, PrepareActivity
from dra_plugin.kubeapi import KubeAPI, Timeouts
from dra_plugin.telemetry import metrics
from fakes.apiserver import FakeAPIServer
from fakes.claim_harness import DRIVER, NODE, claim, intel_device, preparer, ref, result
from fakes.waits import async_wait_for

FAST = Timeouts(connect=1, read=5, read_attempts=2, backoff_initial=0.01)
DEV = intel_device(0)


def _failures() -> float:
    for line in metrics.render().decode().splitlines():
        labels = ('operation="status"', f'driver="{DRIVER}"')
        if line.startswith("dra_plugin_claim_errors_total{") and all(x in line for x in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _reporter(
    tmp_path: Path, srv: FakeAPIServer
) -> tuple[KubeAPI, ClaimStatusReporter, PrepareActivity]:
    """The real preparer wrapped by the reporter, the real client against `srv`."""
    api = KubeAPI.from_url(srv.url, timeouts=FAST)
    inner = preparer(tmp_path, api, [DEV], driver=DRIVER, node_name=NODE, claim_edits=None)
    await inner.startup()
    activity = PrepareActivity()
    reporter = ClaimStatusReporter(
        inner,
        driver=DRIVER,
        api=api,
        devices=lambda: {DEV.name: DEV},
        activity=activity,
        max_defer=60,
    )
    return api, reporter, activity


def test_status_is_written_once_per_prepared_claim(tmp_path: Path) -> None:
    with FakeAPIServer(versions=("v1",)) as srv:
        first = srv.add_claim(claim(1, [result(DEV.name)]))
        second = srv.add_claim(claim(2, [result(DEV.name, adminAccess=True)]))

        async def go() -> ClaimStatusReporter:
            api, reporter, activity = await _reporter(tmp_path, srv)
            # While another prepare runs (any driver), writes wait; an unprepare in the
            # meantime drops the claim's queued write.
            with activity.busy():
                assert not (await reporter.prepare([ref(first)]))[ref(first).uid].error
                # The positive signal: the writer has woken for the queued write (it
                # clears its wake-up first) and so stands at the quiet-moment gate; a
                # write that ignored the gate would now be on its way, and is counted
                # after the flush below even though the unprepare drops the queue.
                await async_wait_for(
                    lambda: not reporter._wake.is_set(), what="the writer to wake up"
                )
                assert srv.count("patch", "resourceclaims/status") == 0
                assert (await reporter.unprepare([ref(first)]))[ref(first).uid].error == ""
            assert await reporter.flush(10)
            assert srv.count("patch", "resourceclaims/status") == 0
            assert not (await reporter.prepare([ref(first)]))[ref(first).uid].error
            assert await reporter.flush(10)
            assert srv.count("patch", "resourceclaims/status") == 1
            # The kubelet repeats the call (idempotent): nothing new to say, nothing sent.
            await reporter.prepare([ref(first)])
            assert await reporter.flush(10)
            assert srv.count("patch", "resourceclaims/status") == 1
            # After an unprepare the claim is new again.
            assert (await reporter.unprepare([ref(first)]))[ref(first).uid].error == ""
            await reporter.prepare([ref(first)])
            assert await reporter.flush(10)
            assert srv.count("patch", "resourceclaims/status") == 2
            # A refused write is counted, and the next prepare of it tries again.
            srv.forbidden = {("patch", "resourceclaims/status")}
            before = _failures()
            assert not (await reporter.prepare([ref(second)]))[ref(second).uid].error
            assert await reporter.flush(10)
            assert (reporter.failures, _failures()) == (1, before + 1)
            srv.forbidden = set()
            await reporter.prepare([ref(second)])
            assert await reporter.flush(10)
            await reporter.close()
            await api.close()
            return reporter

        reporter = asyncio.run(go())
        assert (reporter.writes, reporter.failures) == (3, 1)
        for obj in (first, second):
            (entry,) = srv.get_stored_claim("default", obj["metadata"]["name"])["status"]["devices"]
            assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, DEV.name)
            assert entry["data"] == {"pciBusID": "0000:00:00.0", "model": "Arc A770"}


def test_writes_wait_for_a_quiet_moment_not_a_gap_in_a_burst(tmp_path: Path) -> None:
    """Kubelet calls of a burst arrive with short gaps between them: a write must not start
    in such a gap (QUIET_SECONDS), only once the calls have stopped."""
    from dra_plugin.claims.claimstatus import QUIET_SECONDS

    with FakeAPIServer(versions=("v1",)) as srv:
        first = srv.add_claim(claim(1, [result(DEV.name, adminAccess=True)]))

        async def go() -> None:
            api, reporter, activity = await _reporter(tmp_path, srv)
            assert not (await reporter.prepare([ref(first)]))[ref(first).uid].error
            # A train of other calls, each separated by a gap shorter than the quiet time.
            for _ in range(10):
                await asyncio.sleep(QUIET_SECONDS / 4)  # sleep-ok: the gap is the subject
                with activity.busy():
                    await asyncio.sleep(0.005)  # sleep-ok: a call that takes a while
                assert srv.count("patch", "resourceclaims/status") == 0
            assert await reporter.flush(10)  # the train is over: the write goes out
            assert srv.count("patch", "resourceclaims/status") == 1
            await reporter.close()
            await api.close()

        asyncio.run(go())
