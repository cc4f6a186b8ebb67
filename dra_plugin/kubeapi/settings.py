"""What the caller tells the API client, as plain values: the caller builds them from its
own configuration (config.py reads --kubeconfig and KUBECONFIG), so this package reads no
settings of its own and imports nothing above it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClientSettings:
    """Where the client finds its credentials."""

    kubeconfig: str = ""  # empty: the in-cluster service account, else ~/.kube/config
