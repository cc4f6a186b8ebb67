"""Build a C stand-in (a shared library of ours) once per source version.

The library lands at `<build>/<hash>/<relative path>`, where the hash covers the C source
and the compiler flags: a changed source gets a fresh directory, an unchanged one is
reused across test runs. The build is written to a temporary name and renamed, so
concurrent test processes never load a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

BUILD_ROOT = Path(__file__).resolve().parents[1] / "tests" / ".build"  # git-ignored
SHARED = ("-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-pthread")


def build_shared(
    source: Path, build_dir: Path, relative: str, cflags: Sequence[str] = SHARED
) -> tuple[Path, Path]:
    """(the build's root, the library) for `source` compiled to `<root>/<relative>`."""
    digest = hashlib.sha256(source.read_bytes() + " ".join(cflags).encode()).hexdigest()[:16]
    root = build_dir / digest / "root"
    library = root / relative
    if library.is_file():
        return root, library
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        raise RuntimeError(f"gcc is needed to build {source.name} (set CC or install gcc)")
    library.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{library.name}.", dir=library.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *cflags, "-o", tmp, str(source), "-ldl"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"building {source.name} failed:\n{result.stderr}")
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return root, library
