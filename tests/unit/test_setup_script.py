"""`.ci/setup` run with stand-in commands first on PATH (apt-get, dpkg-query, the venv's
python): every command of a step counts, the FAILED line names the command that failed,
the cause is shown before pip's generic error, and a rerun keeps the previous log."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

APT_OFFLINE = """#!/bin/sh
case "$1" in
  update) echo "Err:1 http://deb.debian.org/debian bookworm InRelease"
          echo "  Temporary failure resolving 'deb.debian.org'"
          echo "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease"
          exit 100 ;;
  install) echo "nothing to do"; exit 0 ;;
esac
exit 0
"""

RETRY = (
    "WARNING: Retrying (Retry(total={n}, connect=None, read=None, redirect=None, "
    "status=None)) after connection broken by 'SSLError(SSLCertVerificationError(1, "
    "'[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate "
    "in certificate chain (_ssl.c:1006)'))': /simple/grpcio/"
)
PIP_OUTPUT = "\n".join(
    [
        "ERROR: Cannot install dra-plugin because these package versions have conflicting "
        "dependencies.",
        "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topic/"
        "dependency-resolution/#dealing-with-dependency-conflicts",
        *(RETRY.format(n=n) for n in (4, 3, 2)),
        "ERROR: Could not find a version that satisfies the requirement grpcio==1.85.1 "
        "(from versions: none)",
        "ERROR: No matching distribution found for grpcio==1.85.1",
    ]
)


def _python(tmp: Path, *, upgrade_rc: int = 0, install_rc: int = 0) -> str:
    """The venv's python: `-VV`, `-c` (the site-packages dir) and the two pip runs."""
    site = tmp / "site-packages"
    site.mkdir(exist_ok=True)
    return f"""#!/bin/sh
case "$*" in
  -VV) echo "Python 3.11.2 (stand-in)" ;;
  -c*) echo "{site}" ;;
  *"-c constraints.txt pip") echo "pip upgrade refused: disk quota exceeded"; exit {upgrade_rc} ;;
  *"-e .[test]") cat <<'OUT' >&2
{PIP_OUTPUT if install_rc else "Successfully installed dra-plugin"}
OUT
    exit {install_rc} ;;
esac
"""


def _setup(
    tmp: Path, *, installed: bool, python: str, apt: str = "#!/bin/sh\nexit 0\n"
) -> subprocess.CompletedProcess[str]:
    repo = tmp / "repo"
    (repo / ".ci").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / ".ci" / "setup", repo / ".ci" / "setup")
    (repo / ".ci" / "install-helm").write_text("echo 'install-helm: stand-in'\n")
    for f in ("constraints.txt", "pyproject.toml"):
        (repo / f).write_text("# stand-in\n")
    (repo / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    stubs = {
        repo / ".venv" / "bin" / "python": python,
        tmp / "bin" / "apt-get": apt,
        tmp / "bin" / "sudo": '#!/bin/sh\nexec "$@"\n',
        tmp / "bin" / "dpkg-query": (
            "#!/bin/sh\necho 'install ok installed'\n" if installed else "#!/bin/sh\nexit 1\n"
        ),
    }
    for path, text in stubs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    env = {"PATH": f"{tmp / 'bin'}:/usr/bin:/bin", "HOME": str(tmp), "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        ["bash", str(repo / ".ci" / "setup"), "--tests"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp,
    )  # fmt: skip


def _step_line(out: str, what: str) -> str:
    [line] = [ln for ln in out.splitlines() if ln.startswith(f"setup: {what}")]
    return line


def test_a_failing_first_command_fails_the_step_and_is_named(tmp_path: Path) -> None:
    # apt_install runs `apt-get update`, then `apt-get install`, which succeeds.
    r = _setup(tmp_path, installed=False, python=_python(tmp_path), apt=APT_OFFLINE)
    assert r.returncode == 1, r.stdout + r.stderr
    line = _step_line(r.stdout, "Debian packages")
    assert " ... FAILED (" in line, line
    assert line.endswith("s): apt-get update -q (exit status 100)"), line
    assert "Python packages" not in r.stdout  # nothing after a failed step
    # The cause comes before the log's tail.
    why = r.stderr.split("---- the last lines of", 1)[0]
    assert "---- why, as far as the log says:" in why
    assert "Temporary failure resolving 'deb.debian.org'" in why


def test_a_failing_pip_upgrade_fails_the_python_step(tmp_path: Path) -> None:
    r = _setup(tmp_path, installed=True, python=_python(tmp_path, upgrade_rc=1))
    assert r.returncode == 1, r.stdout + r.stderr
    line = _step_line(r.stdout, "Python packages")
    assert " ... FAILED (" in line and "-c constraints.txt pip (exit status 1)" in line, line
    assert "helm" not in r.stdout


def test_pip_failure_shows_the_cause_before_resolution_impossible(tmp_path: Path) -> None:
    r = _setup(tmp_path, installed=True, python=_python(tmp_path, install_rc=1))
    assert r.returncode == 1, r.stdout + r.stderr
    line = _step_line(r.stdout, "Python packages")
    assert line.endswith("-e .[test] (exit status 1)"), line
    err = r.stderr
    assert err.index("CERTIFICATE_VERIFY_FAILED") < err.index("ResolutionImpossible"), err
    assert err.index("No matching distribution found") < err.index("ResolutionImpossible")
    why = err.split("---- the last lines of", 1)[0]
    assert why.count("CERTIFICATE_VERIFY_FAILED") == 1, why  # pip's retries, said once


def test_a_rerun_keeps_the_previous_log(tmp_path: Path) -> None:
    first = _setup(tmp_path, installed=False, python=_python(tmp_path), apt=APT_OFFLINE)
    assert first.returncode == 1
    second = _setup(tmp_path, installed=True, python=_python(tmp_path))
    assert second.returncode == 0, second.stdout + second.stderr
    repo = tmp_path / "repo"
    previous = (repo / ".setup.log.1").read_text()
    assert previous.startswith("==== bash .ci/setup --tests (")
    assert "Temporary failure resolving" in previous
    current = (repo / ".setup.log").read_text()
    assert current.startswith("==== bash .ci/setup --tests (")
    assert "Temporary failure resolving" not in current


def test_a_good_run_says_done_and_puts_the_clone_on_the_venv_path(tmp_path: Path) -> None:
    r = _setup(tmp_path, installed=True, python=_python(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAILED" not in r.stdout and r.stderr == "", r.stdout + r.stderr
    assert " ... done (" in _step_line(r.stdout, "Python packages")
    pth = tmp_path / "site-packages" / "dra_plugin_clone.pth"
    assert pth.read_text().strip() == os.fspath(tmp_path / "repo")
