"""The API server's Warning headers: a field it dropped (unknown to its version:
fieldValidation defaults to Warn, and the write still succeeds), a deprecated API. Each
distinct warning is logged once per client, so a slice that lost a field is said, not
lost silently, and a repeated write does not repeat the line."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

MAX_REMEMBERED = 256  # distinct warnings remembered; past that, no more are logged


def server_warning_text(header: str) -> str:
    """The text of a Warning header as the API server writes it (RFC 7234:
    `299 - "text"`, the text a quoted string)."""
    code, _, rest = header.partition(" ")
    text = rest.partition(" ")[2].strip() if code.isdigit() else header.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return text


class ServerWarnings:
    """The warnings one client has logged."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def note(self, what: str, headers: Any) -> None:
        """Log the Warning headers of the answer to `what` not logged before."""
        getlist = getattr(headers, "getlist", None)
        if getlist is None:
            return
        for raw in getlist("Warning"):
            text = server_warning_text(str(raw))
            if text in self._said or len(self._said) >= MAX_REMEMBERED:
                continue
            self._said.add(text)
            log.warning("the API server warns what=%r warning=%r", what, text)
