"""The exception tree of FedForest Secure.

Every error the library raises on purpose derives from :class:`FedForestError`::

    FedForestError
    ├── SchemaError (ValueError)          a table or schema file that does not fit
    ├── ProfileError (ValueError)         a privacy profile that does not validate
    ├── ProtocolError                     a message out of order, for the wrong round or job
    │   ├── InvalidMessage (ValueError)   any message that fails to parse or authenticate
    │   ├── RefusedRequest                a request a client will not answer (privacy rule)
    │   ├── UploadRejected (ValueError)   an upload that is malformed or does not answer its task
    │   └── AbortedRound                  too few survivors: no partial sum is released
    ├── OverflowRisk (ValueError)         a value outside the fixed-point range (never a wrong sum)
    ├── BudgetError (ValueError)          a differential-privacy budget missing or exhausted
    ├── AuditError                        a log whose chain or receipts do not verify
    └── NotFittedError (sklearn's NotFittedError)

Subclasses also inherit the matching builtin where one fits, so callers can catch either.
"""

from __future__ import annotations

from sklearn.exceptions import NotFittedError as _SklearnNotFittedError

__all__ = [
    "AbortedRound",
    "AuditError",
    "BudgetError",
    "FedForestError",
    "InvalidMessage",
    "NotFittedError",
    "OverflowRisk",
    "ProfileError",
    "ProtocolError",
    "RefusedRequest",
    "SchemaError",
    "UploadRejected",
]


class FedForestError(Exception):
    """Root of every error FedForest Secure raises on purpose."""


class SchemaError(FedForestError, ValueError):
    """A schema file or a data table that does not match its schema."""


class ProfileError(FedForestError, ValueError):
    """A privacy profile that does not validate."""


class ProtocolError(FedForestError):
    """A protocol message that arrives out of order, for another round or another job."""


class InvalidMessage(ProtocolError, ValueError):
    """A message that fails to parse or authenticate. Deliberately says no more than that."""


class RefusedRequest(ProtocolError):
    """A request that a client refuses to answer because answering would break a privacy rule."""


class UploadRejected(ProtocolError, ValueError):
    """A client's upload that is malformed or does not answer its round's task; nothing is
    stored. ``code`` names the defect (``"malformed_upload"``, ``"wrong_task"``,
    ``"out_of_range"``, ...), ``detail`` says what a sender needs to fix it."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class AbortedRound(ProtocolError):
    """An aggregation round that cannot complete (e.g. fewer survivors than the threshold)."""


class OverflowRisk(FedForestError, ValueError):
    """A value outside the range the fixed-point ring can sum without wrapping."""


class BudgetError(FedForestError, ValueError):
    """A differential-privacy budget that is missing, infinite, or exhausted."""


class AuditError(FedForestError):
    """An audit log whose hash chain or client receipts do not verify."""


class NotFittedError(FedForestError, _SklearnNotFittedError):
    """An estimator used before ``fit``."""
