"""The bytes of a KEP-5304 metadata file, as k8s.io/dynamic-resource-allocation v0.37.2
writes and reads them (kubeletplugin/metadata.go encodeMetadataStream; api/metadata/doc.go
"File format"; devicemetadata.DecodeMetadataFromStream):

- one DeviceMetadata object encoded once per API version, newest first:
  `metadata.resource.k8s.io/v1beta1` (beta in 1.37; the library refuses to start without
  it), then `v1alpha1` (same schema) for readers built against 1.36;
- each object as Go's json.MarshalIndent(obj, "", "  ") prints it, followed by a newline;
- a reader takes the first object whose version it knows and skips the others.
Pure: no files here (devicemetadata.py writes them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_plugin.host.files import read_regular

API_GROUP = "metadata.resource.k8s.io"
API_VERSIONS = (f"{API_GROUP}/v1beta1", f"{API_GROUP}/v1alpha1")  # newest first
KIND = "DeviceMetadata"


def go_json(obj: Any) -> bytes:
    """json.MarshalIndent(obj, "", "  ") as Go writes it (dicts keep the order given)."""
    text = json.dumps(obj, indent=2, ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(ch, esc)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()


def encode(
    claim: Mapping[str, str],
    pod_claim_name: str | None,
    request: str,
    devices: Sequence[Mapping[str, Any]],
) -> bytes:
    """The stream for one request: `claim` has name, namespace and uid; `request` is the
    request as allocated ("gpu/large" for a subrequest); `devices` in the library's field
    order (driver, pool, name, attributes)."""
    entry: dict[str, Any] = {"name": request}
    if devices:
        entry["devices"] = [dict(d) for d in devices]
    stream = b""
    for version in API_VERSIONS:
        obj: dict[str, Any] = {
            "kind": KIND,
            "apiVersion": version,
            "metadata": {
                "name": claim["name"],
                "namespace": claim["namespace"],
                "uid": claim["uid"],
                "generation": 1,
            },
        }
        if pod_claim_name:
            obj["podClaimName"] = pod_claim_name
        obj["requests"] = [entry]
        stream += go_json(obj) + b"\n"
    return stream


def read_stream(path: Path) -> list[dict[str, Any]] | None:
    """The objects of a metadata file, never read through a link; None when it is missing,
    not a regular file, or not a stream of objects."""
    try:
        return parse_stream(read_regular(path).decode())
    except (OSError, ValueError):
        return None


def parse_stream(text: str) -> list[dict[str, Any]] | None:
    """The JSON objects of a metadata stream in order; None when it is empty or anything in
    it is not a whole JSON object."""
    decoder = json.JSONDecoder()
    docs: list[dict[str, Any]] = []
    at = 0
    try:
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at == len(text):
                return docs or None
            doc, at = decoder.raw_decode(text, at)
            if not isinstance(doc, dict):
                return None
            docs.append(doc)
    except (ValueError, RecursionError):
        return None
