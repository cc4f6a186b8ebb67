"""`.ci/setup` run with stand-in commands first on PATH (apt-get, dpkg-query, go, the
venv's python): every command of a step counts, the FAILED line names the command that
failed, the cause is shown before pip's generic error, a rerun keeps the previous log, and
the Go step (.ci/ensure-go) gets a Go that builds the judges and says how in one line."""

from __future__ import annotations

import os
import re
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
  "-m fakes.judges.build") echo "judges: building one (1 of 2), 0 s so far"
    echo "go: downloading k8s.io/api v0.37.2" >&2
    echo "judges: building two (2 of 2), 1 s so far"
    echo "judges built in 1 s: /judges/.bin/0123" ;;
  *"-e .[test]") cat <<'OUT' >&2
{PIP_OUTPUT if install_rc else "Successfully installed dra-plugin"}
OUT
    exit {install_rc} ;;
esac
"""


# Stand-ins for Go: `go version` outside a module is the Go's own version; inside judges/ a
# go1.21+ runs (after fetching it) the toolchain go.mod asks for, unless GOTOOLCHAIN=local.
GO_MOD_GO = "1.26.0"
GO = """#!/bin/sh
case "$1" in
  version)
    if [ -f go.mod ] && [ "{switches}" = yes ] && [ "${{GOTOOLCHAIN:-auto}}" != local ]; then
      echo "go: downloading go{mod} (linux/amd64)" >&2
      echo "go version go{mod} linux/amd64"
    else
      echo "go version go{version} linux/amd64"
    fi ;;
  env) [ "$2" = GOTOOLCHAIN ] && echo "${{GOTOOLCHAIN:-auto}}" ;;
esac
"""


def _go(version: str) -> str:
    minor = int(version.split(".")[1])
    return GO.format(version=version, mod=GO_MOD_GO, switches="yes" if minor >= 21 else "no")


# apt: installing golang-go puts Debian's go1.23.5 (from backports) into the stand-ins' bin;
# apt-cache offers backports' go1.23 only once its source was added (or was there).
APT_GET = """#!/bin/sh
echo "$*" >>{record}
case "$*" in
  install*golang-go*) echo "Setting up golang-1.23-go (1.23.5-1~bpo12+1) ..."
    cat >{bin}/go <<'GO'
{go}GO
    chmod +x {bin}/go ;;
esac
"""
APT_CACHE = """#!/bin/sh
if [ "$1 $2" = "-t bookworm-backports" ] && grep -rqs bookworm-backports {apt}; then
  echo "  Candidate: 2:1.23~2~bpo12+1"
else
  echo "  Candidate: 2:1.19~1"
fi
"""
DEBIAN_SOURCES = """Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates{more}
Components: main
"""


def _system_bin(tmp: Path) -> Path:
    """/usr/bin and /bin less go and the commands the tests stand in for: this machine's own
    Go (or apt) must not answer in place of a stand-in."""
    sysbin = tmp / "sysbin"
    if not sysbin.is_dir():
        sysbin.mkdir()
        skip = {"go", "gofmt", "apt-get", "apt-cache", "sudo", "dpkg-query"}
        for d in (Path("/usr/bin"), Path("/bin")):
            for exe in d.iterdir():
                if exe.name not in skip and not (sysbin / exe.name).exists():
                    (sysbin / exe.name).symlink_to(exe)
    return sysbin


def _setup(
    tmp: Path,
    *,
    installed: bool,
    python: str,
    apt: str = "#!/bin/sh\nexit 0\n",
    go: str | None = _go("1.26.8"),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`.ci/setup --tests` in a stand-in clone; `go` is the stand-in on PATH (None: none)."""
    repo = tmp / "repo"
    (repo / ".ci").mkdir(parents=True, exist_ok=True)
    (repo / "judges").mkdir(exist_ok=True)
    for script in ("setup", "ensure-go"):
        shutil.copy(ROOT / ".ci" / script, repo / ".ci" / script)
    (repo / ".ci" / "install-helm").write_text("echo 'install-helm: stand-in'\n")
    (repo / "judges" / "go.mod").write_text(f"module stand.in/judges\n\ngo {GO_MOD_GO}\n")
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
    if go is not None and not (tmp / "bin" / "go").exists():
        stubs[tmp / "bin" / "go"] = go
    for path, text in stubs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    (tmp / "gohome").mkdir(exist_ok=True)  # /usr/local/go/bin: empty
    path = f"{tmp / 'bin'}:{_system_bin(tmp)}"
    run_env = {"PATH": path, "HOME": str(tmp), "LC_ALL": "C.UTF-8"}
    run_env |= {"ENSURE_GO_HOME_BIN": str(tmp / "gohome")}
    run_env |= env or {}
    return subprocess.run(
        ["bash", str(repo / ".ci" / "setup"), "--tests"],
        env=run_env, capture_output=True, text=True, timeout=120, cwd=tmp,
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


def test_the_judge_build_shows_its_progress_lines_and_logs_the_rest(tmp_path: Path) -> None:
    r = _setup(tmp_path, installed=True, python=_python(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    shown = r.stdout.split("setup: judges (go build in judges/) ... \n", 1)[1].splitlines()
    assert shown[:3] == [
        "    building one (1 of 2), 0 s so far",
        "    building two (2 of 2), 1 s so far",
        shown[2],
    ]
    assert re.fullmatch(r"  done \(\d+ s\)", shown[2]), shown
    log = (tmp_path / "repo" / ".setup.log").read_text()
    assert "judges: building one (1 of 2)" in log and "go: downloading k8s.io/api" in log
    assert "go: downloading" not in r.stdout and "judges built in" not in r.stdout


def test_a_good_run_says_done_and_puts_the_clone_on_the_venv_path(tmp_path: Path) -> None:
    r = _setup(tmp_path, installed=True, python=_python(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAILED" not in r.stdout and r.stderr == "", r.stdout + r.stderr
    assert " ... done (" in _step_line(r.stdout, "Python packages")
    pth = tmp_path / "site-packages" / "dra_plugin_clone.pth"
    assert pth.read_text().strip() == os.fspath(tmp_path / "repo")


# --- the Go step (.ci/ensure-go) ------------------------------------------------------


def _debian(tmp: Path, *, backports_listed: bool = False) -> dict[str, str]:
    """A Debian 12 for ensure-go: /etc/apt, /etc/os-release, and apt stand-ins that record
    what they are asked to do (in tmp/apt.calls)."""
    apt = tmp / "etc-apt"
    (apt / "sources.list.d").mkdir(parents=True, exist_ok=True)
    more = " bookworm-backports" if backports_listed else ""
    (apt / "sources.list.d" / "debian.sources").write_text(DEBIAN_SOURCES.format(more=more))
    (tmp / "os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n'
                                    "VERSION_CODENAME=bookworm\n")  # fmt: skip
    (tmp / "apt").mkdir(exist_ok=True)
    scripts = {
        "apt-get": APT_GET.format(record=tmp / "apt.calls", bin=tmp / "bin", go=_go("1.23.5")),
        "apt-cache": APT_CACHE.format(apt=apt),
    }
    for name, text in scripts.items():
        (tmp / "apt" / name).write_text(text)
        (tmp / "apt" / name).chmod(0o755)
    return {
        "ENSURE_GO_APT_GET": str(tmp / "apt" / "apt-get"),
        "ENSURE_GO_APT_CACHE": str(tmp / "apt" / "apt-cache"),
        "ENSURE_GO_APT_DIR": str(apt),
        "ENSURE_GO_OS_RELEASE": str(tmp / "os-release"),
    }


def _go_lines(out: str) -> list[str]:
    """What the Go step showed: its lines between `setup: Go ... ` and its result."""
    block = out.split("setup: Go for the judges ... \n", 1)[1]
    lines = block.splitlines()
    end = next(i for i, ln in enumerate(lines) if not ln.startswith("    "))
    assert lines[end].startswith(("  done (", "  FAILED (")), lines
    return [ln.strip() for ln in lines[: end + 1]]


def _apt_calls(tmp: Path) -> list[str]:
    calls = tmp / "apt.calls"
    return calls.read_text().splitlines() if calls.exists() else []


def test_a_good_go_is_named_and_nothing_is_installed(tmp_path: Path) -> None:
    r = _setup(tmp_path, installed=True, python=_python(tmp_path), env=_debian(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    said, result = _go_lines(r.stdout)
    assert said == f"go1.26.8 at {tmp_path / 'bin' / 'go'} (judges/go.mod: go 1.26.0)"
    assert result.startswith("done (")
    assert _apt_calls(tmp_path) == []
    assert [p.name for p in (tmp_path / "etc-apt" / "sources.list.d").iterdir()] == [
        "debian.sources"
    ]


def test_a_missing_go_is_installed_from_backports_in_one_line(tmp_path: Path) -> None:
    env = _debian(tmp_path)
    r = _setup(tmp_path, installed=True, python=_python(tmp_path), go=None, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    said, result = _go_lines(r.stdout)
    assert said == (
        f"no Go on PATH or in {tmp_path / 'gohome'} (the judges need go1.26.0): installing "
        "golang-go from bookworm-backports (go1.23, which fetches go1.26.0 for the judges by "
        "itself)"
    )
    assert result.startswith("done (")
    # Backports is added (from the mirror the system already uses) only because bookworm's
    # own golang-go (go1.19) cannot fetch a toolchain; then Debian's go1.23 fetches go1.26.
    added = tmp_path / "etc-apt" / "sources.list.d" / "bookworm-backports.sources"
    assert "URIs: http://mirror.example/debian\nSuites: bookworm-backports\n" in added.read_text()
    assert _apt_calls(tmp_path) == [
        "update -q",
        "update -q",
        "install -y -q --no-install-recommends -t bookworm-backports golang-go",
    ]
    log = (tmp_path / "repo" / ".setup.log").read_text()
    assert "Setting up golang-1.23-go" in log and "go: downloading go1.26.0" in log
    assert "Setting up" not in r.stdout  # apt's output stays in the log

    # A rerun finds Debian's go1.23, which runs go1.26 for judges/: nothing is installed or
    # added again.
    (tmp_path / "apt.calls").unlink()
    again = _setup(tmp_path, installed=True, python=_python(tmp_path), go=None, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    said, _ = _go_lines(again.stdout)
    assert said.startswith(f"go1.23.5 at {tmp_path / 'bin' / 'go'} runs go1.26.0 for the judges")
    assert _apt_calls(tmp_path) == []
    assert len(list(added.parent.iterdir())) == 2


def test_an_old_go_is_named_first_and_replaced(tmp_path: Path) -> None:
    """Debian 12's own golang-go (go1.19.8) can neither build the judges nor fetch Go: it is
    named, with what is done about it, before anything long runs."""
    env = _debian(tmp_path, backports_listed=True)
    r = _setup(tmp_path, installed=True, python=_python(tmp_path), go=_go("1.19.8"), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    said, _ = _go_lines(r.stdout)
    assert said == (
        f"go1.19.8 at {tmp_path / 'bin' / 'go'} is too old for the judges (they need go1.26.0, "
        "or go1.21+ to fetch it): installing golang-go from bookworm-backports (go1.23, which "
        "fetches go1.26.0 for the judges by itself)"
    )
    assert r.stdout.index(said) < r.stdout.index("setup: Python packages")
    # Backports was listed already: no source is added, one `apt-get update`.
    assert [p.name for p in (tmp_path / "etc-apt" / "sources.list.d").iterdir()] == [
        "debian.sources"
    ]
    assert _apt_calls(tmp_path)[-1].endswith("-t bookworm-backports golang-go")
    assert _apt_calls(tmp_path).count("update -q") == 1


def test_an_old_go_first_on_path_fails_the_step_with_the_fix(tmp_path: Path) -> None:
    """An old Go that apt does not replace (here first on PATH) is named with its version and
    the fix, and setup stops there."""
    first = tmp_path / "first"
    first.mkdir()
    (first / "go").write_text(_go("1.19.8"))
    (first / "go").chmod(0o755)
    env = _debian(tmp_path) | {"PATH": f"{first}:{tmp_path / 'bin'}:{_system_bin(tmp_path)}"}
    r = _setup(tmp_path, installed=True, python=_python(tmp_path), go=None, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    *said, result = _go_lines(r.stdout)
    assert said[-1] == (
        f"go1.19.8 at {first / 'go'} comes first on PATH and is too old for the judges (they "
        "need go1.26.0, or go1.21+ to fetch it): remove it or put a newer Go first on PATH "
        "(Debian's golang-go is /usr/bin/go)"
    )
    assert result.startswith("FAILED (") and result.endswith("bash .ci/ensure-go (exit status 1)")
    assert "Python packages" not in r.stdout


def test_a_go_that_may_not_fetch_the_toolchain_says_how_to_let_it(tmp_path: Path) -> None:
    env = _debian(tmp_path) | {"GOTOOLCHAIN": "local"}
    r = _setup(tmp_path, installed=True, python=_python(tmp_path), go=_go("1.23.5"), env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    *said, result = _go_lines(r.stdout)
    assert said[-1] == (
        f"go1.23.5 at {tmp_path / 'bin' / 'go'} runs go1.23.5 in judges/, not go1.26.0 or newer "
        "(GOTOOLCHAIN=local): set GOTOOLCHAIN=auto (go env -w GOTOOLCHAIN=auto), or install "
        "Go 1.26+ from https://go.dev/dl/ into /usr/local/go"
    )
    assert result.startswith("FAILED (")
    assert _apt_calls(tmp_path) == []


def test_a_go_that_does_not_run_is_named_with_what_it_says(tmp_path: Path) -> None:
    broken = '#!/bin/sh\necho "go: cannot find GOROOT directory: /usr/lib/go-1.23" >&2\nexit 2\n'
    r = _setup(tmp_path, installed=True, python=_python(tmp_path), go=broken, env=_debian(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    *said, result = _go_lines(r.stdout)
    assert said[-1] == (
        f"the go at {tmp_path / 'bin' / 'go'} does not run (`go version` says: go: cannot find "
        "GOROOT directory: /usr/lib/go-1.23): remove it or take it off PATH"
    )
    assert result.startswith("FAILED (") and _apt_calls(tmp_path) == []
