"""Judge 3: the kubelet's own DRA code plays the node (judges/cmd/kubelet).

`KubeletJudge.start()` runs the program against any API server (a kubeconfig), a
registry directory it watches with the kubelet's plugin watcher and a state directory
for the kubelet's DRA checkpoint. Requests go over its stdin as JSON lines; answers and
events come back on stdout:

- `prepare(pod)` -> {container: [CDI device IDs]}; `unprepare(pod)`; both raise
  KubeletError with the kubelet's own message when the kubelet fails the pod;
- `health(pod)` -> {container: allocatedResourcesStatus}, what the kubelet would write
  to the pod's status now;
- `wait_registered(driver)` / `wait_event(predicate)`: registration, deregistration
  and health events ({"event": "health", "pod": ..., "containers": ...}) as they come.

On start it deletes every ResourceSlice of the node (the kubelet does, before any
driver registers), and a driver's slices once none of its plugins has been connected
for `wiping_delay` (the kubelet's 30 s; tests pass less).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

Obj = dict[str, Any]


class KubeletError(AssertionError):
    """The kubelet failed the request; the message is the kubelet's."""


class KubeletJudge:
    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        self.proc = proc
        self.log = log
        self.events: list[Obj] = []
        self._answers: dict[int, Obj] = {}
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._reader = threading.Thread(target=self._read, name="kubelet-judge", daemon=True)
        self._reader.start()

    @classmethod
    def start(
        cls,
        binary: Path,
        *,
        kubeconfig: Path,
        node: str,
        registry: Path,
        state_dir: Path,
        log: Path,
        wiping_delay: float = 30.0,
        feature_gates: str = "",
        content_type: str | None = None,
        verbosity: int = 4,
    ) -> KubeletJudge:
        """`content_type`: None for the kubelet's default (protobuf, as against a real API
        server); "application/json" for a server that speaks only JSON (the fake)."""
        registry.mkdir(parents=True, exist_ok=True)
        state_dir.mkdir(parents=True, exist_ok=True)
        args = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--node-name={node}",
            f"--registry-dir={registry}",
            f"--state-dir={state_dir}",
            f"--wiping-delay={wiping_delay}s",
            f"--v={verbosity}",
        ]
        if feature_gates:
            args.append(f"--feature-gates={feature_gates}")
        if content_type:
            args.append(f"--kube-api-content-type={content_type}")
        with log.open("a") as err:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
            )
        judge = cls(proc, log)
        judge.wait_event(lambda e: e.get("event") == "started", timeout=30, what="start")
        return judge

    # --- the wire ----------------------------------------------------------------------
    def _read(self) -> None:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        for line in out:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                msg = {"event": "garbage", "line": line}
            with self._cond:
                if "id" in msg and "event" not in msg:
                    self._answers[int(msg["id"])] = msg
                else:
                    self.events.append(msg)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def request(self, op: str, timeout: float = 120, **fields: Any) -> Obj:
        rid = next(self._ids)
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps({"op": op, "id": rid, **fields}) + "\n")
        stdin.flush()
        deadline = time.monotonic() + timeout
        with self._cond:
            while rid not in self._answers:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"kubelet judge exited {self.proc.returncode}:\n{self.logs()[-4000:]}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"kubelet judge: no answer to {op} {fields}")
                self._cond.wait(min(left, 0.5))
            return self._answers.pop(rid)

    def _ok(self, op: str, **fields: Any) -> Obj:
        answer = self.request(op, **fields)
        if not answer.get("ok"):
            raise KubeletError(f"{op} {fields}: {answer.get('error')}")
        return answer

    # --- what a test asks ----------------------------------------------------------------
    def prepare(self, pod: str) -> dict[str, list[str]]:
        """The kubelet prepares the pod's claims ("namespace/name"): CDI IDs per container."""
        cdi: dict[str, list[str]] = self._ok("prepare", pod=pod)["cdi"]
        return cdi

    def unprepare(self, pod: str) -> None:
        self._ok("unprepare", pod=pod)

    def health(self, pod: str) -> dict[str, list[Obj]]:
        containers: dict[str, list[Obj]] = self._ok("health", pod=pod)["containers"]
        return {name: statuses or [] for name, statuses in containers.items()}

    def registered(self, driver: str) -> int:
        """How many of the driver's plugins (endpoints) the kubelet has registered."""
        endpoints: int = self._ok("plugins", driver=driver)["endpoints"]
        return endpoints

    def wait_event(
        self,
        predicate: Callable[[Obj], bool],
        timeout: float = 30,
        what: str = "event",
        since: int = 0,
    ) -> Obj:
        """The first event (from index `since`) that matches."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events[since:]:
                    if predicate(event):
                        return event
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError(
                        f"kubelet judge exited while waiting for {what}:\n{self.logs()[-4000:]}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"kubelet judge: no {what} in {self.events}\n{self.logs()[-3000:]}"
                    )
                self._cond.wait(min(left, 0.5))

    def wait_registered(
        self, driver: str, timeout: float = 30, since: int = 0, endpoint: str | None = None
    ) -> Obj:
        def match(e: Obj) -> bool:
            return (
                e.get("event") == "registered"
                and e.get("driver") == driver
                and not e.get("error")
                and (endpoint is None or e.get("endpoint") == endpoint)
            )

        return self.wait_event(match, timeout, what=f"registration of {driver}", since=since)

    def mark(self) -> int:
        """An index for wait_event(since=...): only events after this point."""
        with self._cond:
            return len(self.events)

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None and self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)


def health_of(containers: dict[str, list[Obj]]) -> dict[str, str]:
    """resourceID -> health across a pod's containers, from allocatedResourcesStatus."""
    out: dict[str, str] = {}
    for statuses in containers.values():
        for status in statuses:
            for res in status.get("resources") or []:
                out[res["resourceID"]] = res.get("health", "")
    return out


def pod_claims(answer: dict[str, list[str]]) -> Sequence[str]:
    return sorted(i for ids in answer.values() for i in ids)
