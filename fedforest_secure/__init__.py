"""FedForest Secure: federated random forests with secure aggregation, DP and an audit log.

The public API is what ``__all__`` lists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import FedForestError
from .model import ForestModel
from .privacy import load_profile

if TYPE_CHECKING:
    from .estimators import FedForestClassifier, FedForestRegressor


def __getattr__(name: str) -> Any:
    # the estimators import scikit-learn: loaded on first use, so a site's client process
    # (which never needs them) starts without it
    if name in ("FedForestClassifier", "FedForestRegressor"):
        from . import estimators

        value = getattr(estimators, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FedForestClassifier",
    "FedForestError",
    "FedForestRegressor",
    "ForestModel",
    "load_profile",
]

__version__ = "0.1.0"
