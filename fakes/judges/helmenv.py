"""The environment a `helm template` of ours runs in: the machine's PATH and nothing of
the user's helm setup (config, cache, data in a throwaway folder; no cluster), so a
render depends on the chart and its values alone."""

from __future__ import annotations

import os


def isolated(tmp: str) -> dict[str, str]:
    """Environment for helm with its homes under `tmp` (a temporary directory)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HELM_CONFIG_HOME": f"{tmp}/config",
        "HELM_CACHE_HOME": f"{tmp}/cache",
        "HELM_DATA_HOME": f"{tmp}/data",
        "KUBECONFIG": os.devnull,
    }
