"""One exception tree for the whole service; front ends map it with `to_http`/`as_text`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class DsqaError(Exception):
    """Base of every error dsqa raises on purpose."""

    status_code = 500
    code = "internal"

    def __init__(self, message: str, *, field_name: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field_name
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.field:
            body["field"] = self.field
        if self.details:
            body["details"] = self.details
        return body


class InvalidInput(DsqaError):
    status_code = 422
    code = "invalid_input"


class NotFound(DsqaError):
    status_code = 404
    code = "not_found"


class IndexNotReady(DsqaError):
    status_code = 503
    code = "index_not_ready"


class IndexUnusable(DsqaError):
    status_code = 503
    code = "index_unusable"


class NotConfigured(DsqaError):
    """A front end that needs a secret or token that this deployment was not given."""

    status_code = 503
    code = "not_configured"


class SourceUnavailable(DsqaError):
    status_code = 502
    code = "source_unavailable"


class UpstreamFailed(DsqaError):
    status_code = 502
    code = "upstream_failed"


@dataclass
class ErrorReply:
    status_code: int
    body: dict[str, Any] = field(default_factory=dict)


def to_reply(exc: DsqaError) -> ErrorReply:
    return ErrorReply(status_code=exc.status_code, body=exc.to_dict())


def as_text(exc: DsqaError) -> str:
    """The same error for text front ends (CLI, MCP, Slack)."""
    where = f" (field: {exc.field})" if exc.field else ""
    return f"Error: {exc.message}{where}"
