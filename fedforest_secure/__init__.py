"""FedForest Secure: federated random forests with secure aggregation, DP and an audit log.

The public API is what ``__all__`` lists.
"""

from __future__ import annotations

from .errors import FedForestError
from .estimators import FedForestClassifier, FedForestRegressor
from .model import ForestModel
from .privacy import load_profile

__all__ = [
    "FedForestClassifier",
    "FedForestError",
    "FedForestRegressor",
    "ForestModel",
    "load_profile",
]

__version__ = "0.1.0"
