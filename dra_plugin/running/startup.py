"""What `run` binds before the kubelet can see it, in this order: the API client (its
credentials), directories and the metrics listener. A setting that cannot work fails here,
as one line naming the setting the way the user set it (`--cdi-root` or `CDI_ROOT`), and
what was created is removed."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from dra_plugin.config import Config, kubeconfig_problem
from dra_plugin.host import files
from dra_plugin.kubeapi import ApiError, ClientSettings, KubeAPI, NoCredentials
from dra_plugin.telemetry import metrics


class StartupError(Exception):
    """A setting that cannot work on this node; the message names it as the user set it."""


def make_dir(path: Path, setting: str, created: list[Path], mode: int) -> None:
    """mkdir -p `path` (new directories get `mode`), recording what it created (deepest
    first) for the undo."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    where = f"{setting}='{path}'"
    try:
        files.make_dir(path, mode)
    except (FileExistsError, NotADirectoryError):
        if path.exists() and not path.is_dir():
            raise StartupError(f"{where} is a file, not a directory") from None
        raise StartupError(f"{where}: a parent of it is a file, not a directory") from None
    except OSError as exc:
        raise StartupError(f"{where}: cannot create it: {exc.strerror or exc}") from None
    created.extend(p for p in missing if p.is_dir())
    if not os.access(path, os.W_OK | os.X_OK):
        raise StartupError(f"{where} is not writable by this process")


def remove_created(created: list[Path]) -> None:
    """Remove the directories a failed start created, children before parents: several
    make_dir calls share parents (every driver's dir sits in the plugins dir), so the order
    they were recorded in is not an order they can be removed in."""
    for d in sorted(set(created), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty or already gone: not ours to remove
            d.rmdir()


@contextlib.contextmanager
def undo_dirs_on_failure() -> Iterator[list[Path]]:
    """A list for make_dir to record into; what it recorded is removed if start-up fails.
    A clean exit keeps them: a rolling update's next instance may be using them already."""
    created: list[Path] = []
    try:
        yield created
    except BaseException:
        remove_created(created)
        raise


def api_client(cfg: Config) -> KubeAPI:
    setting = cfg.setting("kubeconfig")
    if cfg.kubeconfig and (problem := kubeconfig_problem(cfg.kubeconfig)):
        raise StartupError(f"{setting}='{cfg.kubeconfig}' {problem}")
    try:
        return KubeAPI.from_settings(ClientSettings(kubeconfig=cfg.kubeconfig))
    except NoCredentials as exc:  # no setting to blame: it says where it looked
        raise StartupError(str(exc)) from None
    except ApiError as exc:
        raise StartupError(f"{setting}: cannot configure the API client: {exc}") from None


async def listen_metrics(cfg: Config, server_: metrics.MetricsServer) -> None:
    try:
        await server_.start()
    except OSError as exc:
        # The port when it is taken or privileged, else the address.
        by_port = exc.errno in (errno.EADDRINUSE, errno.EACCES)
        if isinstance(exc, socket.gaierror) or not by_port:
            setting = f"{cfg.setting('metrics_address')}='{cfg.metrics_address}'"
        else:
            setting = f"{cfg.setting('metrics_port')}='{cfg.metrics_port}'"
        raise StartupError(
            f"{setting}: cannot listen on {cfg.metrics_address}:{cfg.metrics_port}: "
            f"{exc.strerror or exc}"
        ) from None
