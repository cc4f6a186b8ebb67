"""Entry point: parse the configuration, set up logging, run the chosen command."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from dra_plugin import cli
from dra_plugin.config import ConfigError, UsageError, parse

_STD_ATTRS = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}

# Claim names, UIDs and namespaces come from the kubelet as they are: a newline or NUL in
# one must not start a forged log line. C0/C1 controls, DEL and the Unicode line breaks.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(text: str) -> str:
    """`text` with every control character written as an escape: one line, printable."""
    return _CONTROL.sub(
        lambda m: _NAMED.get(
            c := m.group(), f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
        ),
        text,
    )


class TextFormatter(logging.Formatter):
    """`ts LEVEL logger: message`, one line per record; a traceback follows indented, so
    every line that starts at column 0 is a record of ours."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("  " + escape(line) for line in text.splitlines())


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update({k: v for k, v in vars(record).items() if k not in _STD_ATTRS})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    except ConfigError as exc:
        sys.stderr.write(f"dra-plugin: invalid configuration: {exc}\n")
        return 2
    setup_logging(cfg.log_level, cfg.log_format)
    for note in cfg.deprecated:  # old environment names (docs/configuration.md)
        logging.getLogger("dra_plugin.config").warning("deprecated: %s", note)
    return cli.COMMANDS[cfg.command](cfg)


if __name__ == "__main__":
    sys.exit(main())
