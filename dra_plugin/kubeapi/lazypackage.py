"""Packages of the kubernetes client registered without running their `__init__`.

`import kubernetes.client` runs the `kubernetes` package's `__init__` first, which
imports every subpackage: `dynamic` (kubernetes_validate, jsonschema, referencing),
`stream` (websocket-client), `watch`, `utils`, `leaderelection`, `informer`; and the
`kubernetes.config` package's `__init__` imports the kubeconfig loader (oauthlib,
requests-oauthlib, requests, pydantic) even in a pod, which loads only the in-cluster
credentials. This package uses none of that on the way to the first ResourceSlice.

`lazy_packages(...)` puts each named package in `sys.modules` as a module made from its
spec, not executed, so its submodules import on their own. The first attribute asked of
it that is not a submodule already imported runs the real `__init__` then, into the same
module: code that reads, say, `kubernetes.watch` or `kubernetes.config.load_config`
gets what it always did, later.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType


def lazy_packages(*names: str) -> None:
    """Register each package lazily (parents first); one already imported is left alone."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            continue  # not installed, or not a package: the real import says so
        module = importlib.util.module_from_spec(spec)
        setattr(module, "__getattr__", _run_init_on_miss(module))  # noqa: B010 - PEP 562
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


def _run_init_on_miss(module: ModuleType) -> Callable[[str], object]:
    lock = threading.RLock()  # the __init__ it runs may ask for attributes of it
    ran = False

    def __getattr__(attr: str) -> object:
        nonlocal ran
        with lock:
            if not ran:
                ran = True
                spec = module.__spec__
                assert spec is not None and spec.loader is not None
                spec.loader.exec_module(module)
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}") from None

    return __getattr__
