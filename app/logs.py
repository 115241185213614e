"""Structured logs: one JSON object per line, set up once at the entry point (`dsqa serve`)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", ...fields}`; a record's `fields` dict is merged in."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


def configure_logging(*, json_lines: bool = True, level: int = logging.INFO) -> None:
    """dsqa's loggers (the access log included) to stderr, as JSON lines or plain text."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for name in ("dsqa", "app", "indexer"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level)
        logger.propagate = False
    # plain mode leaves the per-request lines to uvicorn's own access log
    logging.getLogger("dsqa.access").setLevel(logging.INFO if json_lines else logging.WARNING)
