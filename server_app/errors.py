"""Rejections the API returns: always a 4xx with a JSON body ``{"error": code, "detail": ...}``."""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError"]


class ApiError(Exception):
    """A request the server refuses; nothing was changed."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        if not 400 <= status < 500:
            raise ValueError("ApiError is for 4xx rejections only")
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self.extra}
