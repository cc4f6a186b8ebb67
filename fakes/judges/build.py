"""Builds the judge programs of judges/ once per source state.

The binaries live in judges/.bin/<key>/, where the key hashes go.mod, go.sum, every Go
source file of the module and the Go toolchain's version: a change to any of them builds
again, so no test runs a stale binary. Go's own module and build caches only make a
rebuild faster; a fresh machine builds from the module proxy. Concurrent test processes
build once (a file lock).

judges/cmd/refdriver is built with them: not a judge but the Go reference driver (the
kubelet plugin library and the CNCF CDI library) that bench/peers.py measures against.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

JUDGES = Path(__file__).resolve().parents[2] / "judges"
BIN_ROOT = JUDGES / ".bin"
# containerd, its runc shim and ctr for the single-node tests (fakes/node): a module of its
# own (judges/containerd/go.mod, `tool` lines), as its dependencies' versions differ from
# k8s.io/kubernetes'. Built static (CGO off: no btrfs/devmapper headers needed).
CONTAINERD = JUDGES / "containerd"
CONTAINERD_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr")


class JudgeBuildError(RuntimeError):
    """The judges could not be built (no Go, a module the proxy refused, a compile error)."""


@dataclass(frozen=True)
class Built:
    dir: Path
    key: str
    seconds: float  # 0.0 when an earlier run built this key

    def binary(self, name: str) -> Path:
        path = self.dir / name
        if not path.is_file():
            raise JudgeBuildError(f"judge {name!r} was not built: no {path}")
        return path


# Where Go's own installer puts it: a non-interactive shell (CI) may not have it on PATH.
GO_HOME_BIN = "/usr/local/go/bin"


def _go() -> str:
    go = shutil.which("go") or shutil.which("go", path=GO_HOME_BIN)
    if go is None:
        raise JudgeBuildError(
            f"the judges need Go (go1.26+) on PATH or in {GO_HOME_BIN}: "
            "`bash .ci/setup --tests` installs one (.ci/ensure-go)"
        )
    return go


def kubernetes_version() -> str:
    """The k8s.io/kubernetes version go.mod pins (e.g. v1.37.2)."""
    found = re.search(
        r"^\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+)\s*$", (JUDGES / "go.mod").read_text(), re.M
    )
    if found is None:
        raise JudgeBuildError(f"{JUDGES / 'go.mod'} pins no k8s.io/kubernetes version")
    return found.group(1)


def _ldflags() -> str:
    # A module build has no git tag: without these, /version would say v0.0.0-master and the
    # binary version would fall back to a hard-coded minor. The judges claim the pinned one.
    version = kubernetes_version()
    major, minor = version[1:].split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return " ".join(
        f"-X {pkg}.{name}={value}"
        for name, value in (
            ("gitVersion", version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        )
    )


def containerd_version() -> str:
    """The containerd version judges/containerd/go.mod pins (e.g. v2.4.2)."""
    found = re.search(
        r"^\s*github\.com/containerd/containerd/v2 (v\d+\.\d+\.\d+)\b",
        (CONTAINERD / "go.mod").read_text(),
        re.M,
    )
    if found is None:
        raise JudgeBuildError(f"{CONTAINERD / 'go.mod'} pins no containerd version")
    return found.group(1)


def _containerd_ldflags() -> str:
    return f"-X github.com/containerd/containerd/v2/version.Version={containerd_version()}"


def source_key(go: str | None = None) -> str:
    """What a judge binary depends on: the module files, the sources, the toolchain, the flags."""
    go = go or _go()
    digest = hashlib.sha256()
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    digest.update(version.stdout.encode())
    digest.update(_ldflags().encode() + b"\0" + _containerd_ldflags().encode() + b"\0")
    files = [JUDGES / "go.mod", JUDGES / "go.sum", CONTAINERD / "go.mod", CONTAINERD / "go.sum"]
    files += sorted(p for p in JUDGES.rglob("*.go") if ".bin" not in p.relative_to(JUDGES).parts)
    for path in files:
        digest.update(str(path.relative_to(JUDGES)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _quiet(line: str) -> None:
    pass


def _go_run(go: str, *args: str, cwd: Path = JUDGES, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run([go, *args], cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise JudgeBuildError(f"go {' '.join(args)} in {cwd} failed:\n{proc.stderr[-4000:]}")


def build(progress: Callable[[str], None] = _quiet) -> Built:
    """Every program under judges/cmd/, built for the current sources. `progress` gets a
    line as each part starts (the module download, each binary) and one at the end, with
    the time so far: a fresh machine's build takes minutes."""
    go = _go()
    key = source_key(go)
    out = BIN_ROOT / key
    BIN_ROOT.mkdir(exist_ok=True)
    with open(BIN_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "build.json").is_file():
            return Built(out, key, 0.0)
        tmp = BIN_ROOT / f".{key}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        t0 = time.monotonic()
        names = sorted(p.name for p in (JUDGES / "cmd").iterdir() if (p / "main.go").is_file())
        # Where the time goes: the modules (downloaded once per machine, into Go's module
        # cache), then one binary after the other; the first compiles most of what the
        # others share (Go's build cache), so it takes longest.
        parts: dict[str, float] = {}
        try:
            cache = _gomodcache(go)
            progress(f"modules: go list -deps ./cmd/... (fetches those not yet in {cache})")
            _go_run(go, "list", "-deps", "./cmd/...")
            parts["modules"] = time.monotonic() - t0
            for i, name in enumerate(names, 1):
                started = time.monotonic()
                progress(f"building {name} ({i} of {len(names)}), {started - t0:.0f} s so far")
                # Plain flags (no -trimpath, the environment's CGO setting): Go's build cache
                # keys on them, so a plain `go build ./...` in judges/ warms what this reuses.
                _go_run(go, "build", "-ldflags", _ldflags(), "-o", str(tmp / name), f"./cmd/{name}")
                parts[name] = time.monotonic() - started
            started = time.monotonic()
            progress(f"building containerd, its runc shim and ctr, {started - t0:.0f} s so far")
            tools = [f"github.com/containerd/containerd/v2/cmd/{n}" for n in CONTAINERD_TOOLS]
            _go_run(
                go, "build", "-ldflags", _containerd_ldflags(), "-o", str(tmp) + "/", *tools,
                cwd=CONTAINERD, env={**os.environ, "CGO_ENABLED": "0"},  # static: any rootfs
            )  # fmt: skip
            parts["containerd"] = time.monotonic() - started
        except JudgeBuildError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        seconds = time.monotonic() - t0
        progress(
            f"built {len(names)} in {seconds:.0f} s ("
            + ", ".join(f"{part} {s:.0f} s" for part, s in parts.items())
            + ")"
        )
        record = {
            "key": key,
            "seconds": round(seconds, 1),
            "parts": {part: round(s, 1) for part, s in parts.items()},
        }
        (tmp / "build.json").write_text(json.dumps(record))
        # Older keys are stale by definition: drop them so the folder does not grow.
        for old in BIN_ROOT.iterdir():
            if old.is_dir() and old.name not in (key, tmp.name):
                shutil.rmtree(old, ignore_errors=True)
        tmp.rename(out)
        return Built(out, key, seconds)


def _gomodcache(go: str) -> str:
    proc = subprocess.run([go, "env", "GOMODCACHE"], cwd=JUDGES, capture_output=True, text=True)
    return proc.stdout.strip() or "Go's module cache"


def main() -> int:
    """`python -m fakes.judges.build`: .ci/setup builds the judges before the tests run, so
    a fresh machine's module download and build are not inside a test's time limit. Each
    progress line starts with "judges: " and is flushed at once (setup shows those lines)."""

    def say(line: str) -> None:
        print(f"judges: {line}", flush=True)

    try:
        built = build(say)
    except JudgeBuildError as exc:
        first, _, rest = str(exc).partition("\n")
        say(f"FAILED: {first}")
        if rest:
            print(rest, file=sys.stderr, flush=True)
        return 1
    # Into setup's log only (no "judges: "): a build that was done already is no news.
    done = "already, for this source state" if built.seconds == 0.0 else f"in {built.seconds:.0f} s"
    print(f"judges built {done}: {built.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
