"""NVML library loading, sessions and errors (pynvml lives behind this package).

The library is loaded from the configured driver root (NVIDIA_DRIVER_ROOT), never from
wherever the loader happens to look first, so a containerised driver under
/run/nvidia/driver works and a mismatched host copy is not picked up by accident.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml

from dra_plugin.vendors.nvidia.model import LIBRARY, error_line, find_library

log = logging.getLogger(__name__)

NO_ANSWER_OK = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION)
_ERROR_NAMES = {
    v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)
}

Handle = Any  # an NVML device handle


class NvmlError(RuntimeError):
    """NVML is unavailable or failed; the message is one line an operator can act on."""

    def __init__(self, message: str, *, gpu_lost: bool = False) -> None:
        super().__init__(message)
        self.gpu_lost = gpu_lost  # NVML_ERROR_GPU_IS_LOST


def describe_error(err: BaseException) -> str:
    """One line for an NVML error: 'NVML: <what> (NVML_ERROR_X): <hint>'."""
    code = getattr(err, "value", None)
    if not isinstance(code, int):
        return error_line(type(err).__name__, str(err))
    return error_line(_ERROR_NAMES.get(code, f"code {code}"), str(err))


def code_of(err: BaseException) -> int:
    code = getattr(err, "value", -1)
    return code if isinstance(code, int) else -1


@contextmanager
def as_nvml_error() -> Iterator[None]:
    try:
        yield
    except pynvml.NVMLError as e:
        lost = code_of(e) == pynvml.NVML_ERROR_GPU_IS_LOST
        raise NvmlError(describe_error(e), gpu_lost=lost) from None


# --- library loading ------------------------------------------------------------------

_load_lock = threading.Lock()
_loaded_from: str | None = None


def _not_found(driver_root: Path) -> str:
    return (
        f"{LIBRARY} not found under {driver_root} (is the NVIDIA driver installed? "
        "set NVIDIA_DRIVER_ROOT)"
    )


def _load(driver_root: Path) -> None:
    """Point pynvml at the library under `driver_root` (pynvml itself only dlopens by name).

    pynvml keeps one global library handle (`nvmlLib`) and a symbol cache; we set both
    under its own lock, which makes its lazy loader a no-op. The default loader path is
    used only for driver root '/', where it is the host's own library.
    """
    global _loaded_from
    found = find_library(driver_root)
    if found is None and driver_root != Path("/"):
        raise NvmlError(_not_found(driver_root))
    target = str(found) if found else LIBRARY
    with _load_lock, pynvml.libLoadLock:
        if pynvml.nvmlLib is not None and _loaded_from == target:
            return
        if pynvml.nvmlLib is not None and getattr(pynvml, "_nvmlLib_refcount", 0) > 0:
            raise NvmlError(
                f"NVML is in use from {_loaded_from or 'elsewhere'}; cannot switch to {target}"
            )
        try:
            library = ctypes.CDLL(target)
        except OSError as e:
            raise NvmlError(
                _not_found(driver_root) if found is None else f"cannot load {target}: {e}"
            ) from None
        pynvml.nvmlLib = library
        getattr(pynvml, "_nvmlGetFunctionPointer_cache", {}).clear()
        _loaded_from = target


def init(driver_root: Path) -> None:
    """Load the library under `driver_root` and nvmlInit; pair with shutdown()."""
    _load(driver_root)
    with as_nvml_error():
        # NO_GPUS: a driver without GPUs is "no devices", not an init failure.
        pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)


def shutdown() -> None:
    with as_nvml_error():
        pynvml.nvmlShutdown()


@contextmanager
def session(driver_root: Path) -> Iterator[None]:
    """init ... shutdown (NVML refcounts, so sessions may overlap)."""
    init(driver_root)
    try:
        yield
    finally:
        try:
            shutdown()
        except NvmlError as e:
            log.warning("NVML shutdown failed error=%r", str(e))
