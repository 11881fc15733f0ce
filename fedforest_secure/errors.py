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
    │   └── SumOutOfRange                 a ring sum no honest sites' encodings can add up to
    ├── BudgetError (ValueError)          a differential-privacy budget missing or exhausted
    ├── AuditError                        a log whose chain or receipts do not verify
    └── NotFittedError (sklearn's NotFittedError)

Subclasses also inherit the matching builtin where one fits, so callers can catch either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "REFUSAL_CODES",
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
    "SumOutOfRange",
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
    """A message that fails to parse or authenticate. Deliberately says no more than that,
    except whose it was: ``peer`` is the index of the client whose message (relayed by the
    server) failed, None for the server's own messages. A client refusing a round on it
    accuses that peer (threat_model.md §2.4): the peer, or the server that relayed it."""

    def __init__(self, *args: object, peer: int | None = None) -> None:
        super().__init__(*args)
        self.peer = peer


class RefusedRequest(ProtocolError):
    """A request that a client refuses to answer because answering would break a privacy rule.

    ``code`` names the rule from a fixed list (:data:`REFUSAL_CODES`): it is all a client tells
    the server about a refusal; the message stays in the client's own log.
    """

    def __init__(self, *args: object, code: str = "other") -> None:
        super().__init__(*args)
        self.code = code if code in REFUSAL_CODES else "other"


#: Why a client refuses a secure-aggregation request (the only words of a refusal that reach the
#: server and the audit log).
REFUSAL_CODES = (
    "roster",            # a roster, threshold or graph that is not the client's own view of the job
    "too_few_survivors",  # fewer survivors than t, 3, or the K_min of the client's DP noise
    "survivor_set",      # a survivor set other than the one signed, or naming unmasked peers
    "too_few_peers",     # shares of fewer than t - 1 peers delivered: too few masks to mask with
    "signatures",        # fewer than t valid signatures on the survivor set
    "both_shares",       # both the self-mask and the key share of one peer
    "question_reused",   # the same question over a different set of clients
    "job_config",        # a job configuration that disagrees with the client's own
    "disclosure",        # a disclosure the client's profile does not name
    "restarted",         # the site's client restarted: its keys for the open round are lost
    "stopped",           # the site's client was stopped (Ctrl-C, SIGTERM): its round keys die
    "failed",            # the site's client stopped on an error (its own log says which)
    "invalid_message",   # a peer's message, relayed by the server, that does not authenticate
                         # (the refusal may name the peer it accuses, by its client index)
    "evaluated_before",  # an evaluation job on held-out rows this site answered another on
    "other",
)


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


class SumOutOfRange(OverflowRisk):
    """A decoded ring sum with an entry outside what its contributors' encodings can add up
    to: every honest encoding is range-checked before it is encoded, so a site sent a value
    outside the codec's range (a malicious site can add anything to its masked words). The
    sum is not to be used. ``entry`` is the first such entry of the round's layout, ``value``
    its decoded value and ``bound`` the largest |value| the contributors can make, both in
    the statistic's units."""

    def __init__(self, message: str, *, entry: int, value: float, bound: float) -> None:
        super().__init__(message)
        self.entry = entry
        self.value = value
        self.bound = bound


class BudgetError(FedForestError, ValueError):
    """A differential-privacy budget that is missing, infinite, or exhausted."""


class AuditError(FedForestError):
    """An audit log whose hash chain or client receipts do not verify."""


if TYPE_CHECKING:
    from sklearn.exceptions import NotFittedError as _SklearnNotFittedError

    # scikit-learn ships no type information: its NotFittedError is Any to mypy
    class NotFittedError(FedForestError, _SklearnNotFittedError):  # type: ignore[misc]
        """An estimator used before ``fit``."""


def __getattr__(name: str) -> Any:
    # NotFittedError subclasses scikit-learn's, whose import costs a site's client process
    # most of its start-up: the class is made on first use (the estimators' import)
    if name != "NotFittedError":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from sklearn.exceptions import NotFittedError as _Sklearn

    cls = type("NotFittedError", (FedForestError, _Sklearn),
               {"__doc__": "An estimator used before ``fit``.", "__module__": __name__})
    globals()["NotFittedError"] = cls
    return cls
