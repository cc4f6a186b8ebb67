"""The only importer of `kubernetes`: claims, slices, nodes, API discovery.

This package is the one place that imports the kubernetes client library; the rest of
the plugin imports from here and sees our own exceptions (errors.py), with the client's
exception chained as the cause. Its modules, by job:
  errors.py     our exceptions; client/transport failures translated into them
  settings.py   what the caller tells the client (`ClientSettings`: its credentials)
  transport.py  client construction, timeouts, read retries with backoff, JSON in/out
  serverwarnings.py  the server's Warning headers, each logged once
  httpget.py    plain GETs (claims, nodes) from the event loop, set up from the client's
                configuration
  discovery.py  the served resource.k8s.io version (cached) and v1beta1 -> v1 conversion
  objects.py    claims (and their status), nodes, slices, access reviews
  watch.py      the resilient ResourceSlice watch
  workloads.py  Deployments and Pods the plugin runs in its own namespace (MPS daemons)
`KubeAPI` stacks them: Transport -> ResourceDiscovery -> ResourceObjects -> SliceWatch, with
WorkloadObjects beside.

Objects are plain dicts in the API's JSON shape. The kubernetes client's generated models
are bypassed on purpose: `CustomObjectsApi` speaks dicts for every resource.k8s.io
version, including versions newer or older than the client's models.
"""

from __future__ import annotations

from dra_plugin.kubeapi.lazypackage import lazy_packages

# Before any module below imports the client: start-up imports only what it uses.
lazy_packages("kubernetes", "kubernetes.config")

from dra_plugin.kubeapi.discovery import (  # noqa: E402
    CLAIMS,
    RESOURCE_GROUP,
    RESOURCE_VERSIONS,
    SLICES,
    claim_to_v1,
)
from dra_plugin.kubeapi.errors import (  # noqa: E402
    ApiError,
    ConflictError,
    DiscoveryError,
    ExpiredError,
    ForbiddenError,
    InvalidError,
    MalformedError,
    NoCredentials,
    NotFoundError,
    UnavailableError,
)
from dra_plugin.kubeapi.settings import ClientSettings  # noqa: E402
from dra_plugin.kubeapi.transport import Backoff, Obj, Timeouts  # noqa: E402
from dra_plugin.kubeapi.watch import SliceWatch, WatchEvent  # noqa: E402
from dra_plugin.kubeapi.workloads import WorkloadObjects  # noqa: E402


class KubeAPI(SliceWatch, WorkloadObjects):
    """Async facade over the kubernetes client for the objects this plugin touches."""


__all__ = [
    "CLAIMS",
    "RESOURCE_GROUP",
    "RESOURCE_VERSIONS",
    "SLICES",
    "ApiError",
    "Backoff",
    "ClientSettings",
    "ConflictError",
    "DiscoveryError",
    "ExpiredError",
    "ForbiddenError",
    "InvalidError",
    "KubeAPI",
    "MalformedError",
    "NoCredentials",
    "NotFoundError",
    "Obj",
    "Timeouts",
    "UnavailableError",
    "WatchEvent",
    "claim_to_v1",
]
