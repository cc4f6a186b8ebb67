"""A small fake Kubernetes API server for resource.k8s.io (stdlib only).

Serves discovery, ResourceSlices (create with generateName, get, list/watch with label
and field selectors, update with resourceVersion conflicts, delete), ResourceClaims
(namespaced get/create/update, and the status subresource: update and server-side
apply, the drivers' entries merged as claim_status.py says), Nodes (get/create),
SelfSubjectAccessReviews, and the Pods and DeviceClasses the judges need (objects.py).
It does not validate: the real kube-apiserver judges what the plugin writes
(tests/realapi.py, shared across the test run); this server is for the faults and
counts a real one cannot be made to show.
ResourceSlice writes are stored as sent: unknown fields, fields behind feature gates and
canonical quantities are the real server's (tests/judges/slice_cases.py); a test that
needs a server that drops fields and the fake's counts sets `rewrite_slice`. Objects are
read back in the shape they were written in: converting between versions is the real
server's too (tests/realapi.py serves the beta versions with runtime_config).

The rooms: server.py (state, lifecycle, test controls), slices.py and claims.py (the
writes), handler.py (HTTP and routes), discovery.py, watch.py, selectors.py (what a read
answers; label and field selectors), errors.py (Status answers).

In-process:
    with FakeAPIServer(versions=("v1",)) as srv:
        srv.add_node("node-1")
        api = KubeAPI.from_url(srv.url)
As a subprocess:
    python -m fakes.apiserver --port 8081 --versions v1,v1beta1 --node node-1
(prints "listening on http://127.0.0.1:8081" once ready; stops on SIGTERM/SIGINT).
"""

from __future__ import annotations

from fakes.apiserver.server import ALL_VERSIONS, FakeAPIServer

__all__ = ["ALL_VERSIONS", "FakeAPIServer"]
