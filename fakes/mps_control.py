"""A stand-in for `nvidia-cuda-mps-control`, run by the tests' node where the real daemon
would run (fakes/mps_node.py), through the same script the daemon's Deployment runs.

    nvidia-cuda-mps-control -d [-M]     start the control daemon in the background
    echo <command> | nvidia-cuda-mps-control    send commands to the running daemon

Like the real one it keeps its pid file (`nvidia-cuda-mps-control.pid`) and its control
endpoint in CUDA_MPS_PIPE_DIRECTORY and logs to CUDA_MPS_LOG_DIRECTORY/control.log; it
serves the GPUs in CUDA_VISIBLE_DEVICES. It refuses an active thread percentage outside
0..100 (NVIDIA's config validation's range, which the plugin's decoder takes too; what the
real daemon does with 0 is not verified here: no GPU to ask), a pinned memory limit that
is not `<n>M`/`<n>G`, names a GPU it does not serve, or exceeds that GPU's memory
(FAKE_MPS_GPUS: JSON {uuid: bytes}), and any command it does not know. Every command it
receives is appended as one JSON line to FAKE_MPS_RECORD (with the pipe dir, so tests
tell daemons apart). A refused command answers `error: ...` and the client exits 1.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
ENDPOINT = "control"
_LIMIT = re.compile(r"(\d+)([MG])")


class Daemon:
    def __init__(self, pipe: Path, log: Path, multi_user: bool) -> None:
        self.pipe = pipe
        self.log = log
        self.multi_user = multi_user
        self.visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        self.memory: dict[str, int] = json.loads(os.environ.get("FAKE_MPS_GPUS") or "{}")
        self.threads = 100
        self.pinned: dict[str, int] = {}

    def record(self, command: str, answer: str) -> None:
        path = os.environ.get("FAKE_MPS_RECORD")
        line = {"pipe": str(self.pipe), "command": command, "answer": answer}
        line["root"] = os.environ.get("FAKE_CHROOT", "")  # the root it runs in (chroot)
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
        with open(self.log / "control.log", "a") as f:
            f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {command} -> {answer}\n")

    def gpu(self, ident: str) -> str | None:
        if ident.isdigit():
            i = int(ident)
            return self.visible[i] if i < len(self.visible) else None
        return ident if ident in self.visible else None

    def handle(self, command: str) -> tuple[str, bool]:
        """(answer, quit)."""
        words = command.split()
        if not words:
            return "", False
        op, args = words[0], words[1:]
        if op == "quit" and not args:
            return "", True
        if op == "set_default_active_thread_percentage" and len(args) == 1:
            if not args[0].isdigit() or not 0 <= int(args[0]) <= 100:
                return f"error: active thread percentage {args[0]} is not in 0..100", False
            self.threads = int(args[0])
            return str(self.threads), False
        if op == "get_default_active_thread_percentage" and not args:
            return str(self.threads), False
        if op == "set_default_device_pinned_mem_limit" and len(args) == 2:
            uuid = self.gpu(args[0])
            if uuid is None:
                return f"error: device {args[0]} is not visible to this daemon", False
            m = _LIMIT.fullmatch(args[1])
            if m is None:
                return f"error: limit {args[1]} is not <n>M or <n>G", False
            limit = int(m.group(1)) * (2**20 if m.group(2) == "M" else 2**30)
            total = self.memory.get(uuid)
            if total is None or limit > total:
                return f"error: limit {args[1]} is above the memory of {uuid}", False
            self.pinned[uuid] = limit
            return "", False
        if op == "get_default_device_pinned_mem_limit" and len(args) == 1:
            uuid = self.gpu(args[0])
            if uuid is None:
                return f"error: device {args[0]} is not visible to this daemon", False
            return f"{self.pinned.get(uuid, 0) // 2**20}M", False
        if op == "get_server_list" and not args:
            return "", False
        return f"error: unknown command {command!r}", False

    def serve(self) -> None:
        endpoint = self.pipe / ENDPOINT
        endpoint.unlink(missing_ok=True)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        os.chdir(self.pipe)  # bound by a relative name: test paths outgrow sun_path
        srv.bind(ENDPOINT)
        srv.listen(8)
        (self.pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        self.record("<start>" + (" -M" if self.multi_user else ""), "")
        try:
            while True:
                conn, _ = srv.accept()
                with conn:
                    data = b""
                    while not data.endswith(b"\n"):
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    command = data.decode().strip()
                    answer, done = self.handle(command)
                    self.record(command, answer)
                    conn.sendall((answer + "\n").encode())
                if done:
                    return
        finally:
            srv.close()
            endpoint.unlink(missing_ok=True)
            (self.pipe / PID_FILE).unlink(missing_ok=True)


def _dirs() -> tuple[Path, Path]:
    # The defaults are under the root it runs in (FAKE_CHROOT: fakes/chroot.py's root).
    root = os.environ.get("FAKE_CHROOT", "")
    return (
        Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or root + "/tmp/nvidia-mps"),
        Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or root + "/var/log/nvidia-mps"),
    )


def client() -> int:
    pipe, _ = _dirs()
    status = 0
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                os.chdir(pipe)  # the daemon's endpoint by a relative name, as it binds it
                s.connect(ENDPOINT)
                s.sendall((line.strip() + "\n").encode())
                answer = s.makefile().readline().rstrip("\n")
        except OSError as exc:
            print(f"Cannot find MPS control daemon process ({exc})", file=sys.stderr)
            return 1
        if answer:
            print(answer)
        if answer.startswith("error:"):
            status = 1
    return status


def main(argv: list[str]) -> int:
    pipe, log = _dirs()
    if argv and argv[0] == "--serve":  # the daemon itself, started by -d
        Daemon(pipe, log, "-M" in argv).serve()
        return 0
    if argv and argv[0] == "-d":
        if not pipe.is_dir() or not log.is_dir():
            print(f"pipe dir {pipe} or log dir {log} missing", file=sys.stderr)
            return 1
        if (pipe / PID_FILE).exists():
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        args = [sys.executable, "-m", "fakes.mps_control", "--serve", *argv[1:]]
        subprocess.Popen(
            args,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):  # as the real -d, return once the daemon answers
            if (pipe / ENDPOINT).exists():
                return 0
            time.sleep(0.025)  # sleep-ok: a stand-in waiting for its own child
        print("daemon did not start", file=sys.stderr)
        return 1
    if argv:
        print(f"unknown option {argv[0]}", file=sys.stderr)
        return 1
    return client()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
