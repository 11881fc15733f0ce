"""Rejections the API returns: always a 4xx with a JSON body ``{"error": code, "detail": ...}``."""

from __future__ import annotations

from typing import Any

from fedforest_secure.errors import UploadRejected

__all__ = ["ApiError", "upload_error"]


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


#: The status of an upload rejection by its code (:mod:`fedforest_secure.protocol.uploads`):
#: an upload for another task conflicts with the round; every other defect is a bad request.
_UPLOAD_STATUS = {"wrong_task": 409}


def upload_error(exc: UploadRejected) -> ApiError:
    """The API's answer to an upload the protocol rejects."""
    return ApiError(_UPLOAD_STATUS.get(exc.code, 400), exc.code, exc.detail)
