"""The error every request check raises: a 4xx (or 5xx) with OpenAI's {"error": {...}} body,
never an exception that reaches the client as a 500. protocol.py re-exports it."""

from __future__ import annotations

from typing import Any

from ..errors import HybridrtError


class ApiError(HybridrtError):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers: dict[str, str] = headers or {}

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(self.status)
        if kind is None:
            kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
