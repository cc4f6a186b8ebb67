"""The only importer of `kubernetes`: claims, slices, nodes, API discovery.

Callers see our own exceptions, with the client's exception chained as the cause.
"""

from __future__ import annotations


class ApiError(Exception):
    """Base class for API failures."""


class NotFoundError(ApiError):
    """The object does not exist (HTTP 404)."""


class ConflictError(ApiError):
    """Stale resourceVersion or name collision (HTTP 409)."""


class InvalidError(ApiError):
    """The server rejected the object (HTTP 422); the message carries the server's reason."""


class UnavailableError(ApiError):
    """The API server could not be reached or answered 5xx/429 after retries."""
