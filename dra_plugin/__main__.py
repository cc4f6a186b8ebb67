"""Entry point: parse the configuration, set up logging, run the chosen command."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence

from dra_plugin import cli
from dra_plugin.config import ConfigError, UsageError, parse

_STD_ATTRS = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


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
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
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
    return cli.COMMANDS[cfg.command](cfg)


if __name__ == "__main__":
    sys.exit(main())
