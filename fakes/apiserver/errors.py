"""The fake API server's failure answers: a `Status` body for every refusal, as the real
server writes it (code, reason, message, and for invalid objects the causes naming each
field), raised as HTTPError from wherever a request is refused."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
GROUP = "resource.k8s.io"


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    """A `Status` as the API server answers a failure."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class RawBody(dict[str, Any]):
    """A response body sent as these exact bytes (FakeAPIServer.set_claim_body)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data


class HTTPError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None):
        super().__init__(message)
        self.code = code
        self.body = status_body(code, reason, message, details)
        self.retry_after: float | None = None


FAIL_REASONS = {
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    503: "ServiceUnavailable",
}


def slice_details(name: str, errs: list[tuple[str, str]]) -> Obj:
    return {
        "name": name,
        "group": GROUP,
        "kind": "ResourceSlice",
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in errs],
    }


def check_name(meta: Obj, name: str) -> None:
    if meta.get("name") != name:
        raise HTTPError(
            400,
            "BadRequest",
            f"the name of the object ({meta.get('name')}) does not match the name on the "
            f"URL ({name})",
        )


def not_found(name: str, resource: str = f"resourceslices.{GROUP}") -> HTTPError:
    res, _, group = resource.partition(".")
    return HTTPError(
        404,
        "NotFound",
        f'{resource} "{name}" not found',
        {"name": name, "group": group, "kind": res},
    )
