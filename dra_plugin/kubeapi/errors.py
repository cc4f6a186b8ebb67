"""Our API exceptions, and the translation of the kubernetes client's failures into them.

Callers never see the client's exceptions: each is mapped here, by HTTP status or
transport failure, and chained as the cause of ours.
"""

from __future__ import annotations

import json

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException


class ApiError(Exception):
    """Base class for API failures."""

    reason = "error"  # the label of dra_plugin_api_retries_total when it is retried


class NoCredentials(ApiError):
    """Neither a kubeconfig nor the in-cluster service account: the message says where it
    looked (`looked`), then what to do (`remedy`); doctor words its own remedy."""

    def __init__(self, looked: str, remedy: str) -> None:
        super().__init__(f"{looked}: {remedy}")
        self.looked = looked
        self.remedy = remedy


class NotFoundError(ApiError):
    """The object does not exist (HTTP 404)."""


class ConflictError(ApiError):
    """Stale resourceVersion, changed UID or name collision (HTTP 409)."""

    reason = "conflict"


class InvalidError(ApiError):
    """The server rejected the object (HTTP 422); the message carries the server's reason."""

    reason = "invalid"


class UnavailableError(ApiError):
    """The API server could not be reached or answered 5xx/429 after retries."""

    def __init__(self, msg: str, *, reason: str = "unavailable", retry_after: float = 0.0):
        super().__init__(msg)
        self.reason = reason  # unavailable (no answer), server_error (5xx), throttled (429)
        self.retry_after = retry_after  # seconds the server asked us to wait (Retry-After)


class MalformedError(ApiError):
    """The server answered 2xx with a body that cannot be used (not JSON, nested past what
    the decoder takes, or larger than any object the API server stores): asking again
    would give the same answer, so it is not retried."""

    reason = "malformed"


class ForbiddenError(ApiError):
    """Authentication or authorization failed (HTTP 401/403): RBAC, not a transient fault."""


class ExpiredError(ApiError):
    """A watch's resourceVersion is too old (HTTP 410 Gone): list again, then watch."""


class DiscoveryError(ApiError):
    """resource.k8s.io API discovery failed: the group or none of our versions is served,
    or the discovery request itself failed. Not a NotFoundError on purpose: the object a
    caller asked for was never looked up, and its error must say so."""


# Transport failures: connection refused/reset, timeouts, broken chunked streams.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, OSError)
STREAM_ERRORS: tuple[type[BaseException], ...] = (*TRANSPORT_ERRORS, ValueError)


def status_message(exc: ApiException) -> str:
    """The server's `Status.message`, else the body, else the HTTP status line."""
    body = getattr(exc, "body", None)
    if body:
        try:
            status = json.loads(body)
        except (TypeError, ValueError):
            return str(body)[:500]
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
    return f"{exc.status} {exc.reason}"


def translate(exc: BaseException, what: str) -> ApiError:
    """Map a client/transport exception to ours; the caller chains the cause."""
    if isinstance(exc, ApiException):
        msg = f"{what}: {status_message(exc)}"
        status = exc.status or 0
        if status == 404:
            return NotFoundError(msg)
        if status == 409:
            return ConflictError(msg)
        if status == 410:
            return ExpiredError(msg)
        if status == 422:
            return InvalidError(msg)
        if status in (401, 403):
            return ForbiddenError(msg)
        if status == 429 or status >= 500:
            reason = "throttled" if status == 429 else "server_error"
            return UnavailableError(msg, reason=reason, retry_after=retry_after(exc))
        if status == 0:
            return UnavailableError(msg)
        return ApiError(msg)
    return UnavailableError(f"{what}: {type(exc).__name__}: {exc}")


def retry_after(exc: ApiException) -> float:
    """The Retry-After header in seconds (0: none, or an HTTP date, which servers of the
    API do not send)."""
    headers = getattr(exc, "headers", None) or {}
    try:
        return max(0.0, float(headers.get("Retry-After", 0) or 0))
    except (TypeError, ValueError):
        return 0.0
