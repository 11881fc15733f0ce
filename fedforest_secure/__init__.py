"""FedForest Secure: federated random forests with secure aggregation, DP and an audit log.

The public API is what ``__all__`` lists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names
from .errors import FedForestError

if TYPE_CHECKING:
    from .estimators import FedForestClassifier, FedForestRegressor
    from .model import ForestModel
    from .privacy import load_profile

#: the names imported on first use: the estimators import scikit-learn, the model NumPy and
#: the profiles pydantic, none of which a command that imports only a submodule (``from
#: fedforest_secure.errors import ...``, ``fedforest --help``) needs
_LAZY = {"FedForestClassifier": "estimators", "FedForestRegressor": "estimators",
         "ForestModel": "model", "load_profile": "privacy"}


if not TYPE_CHECKING:  # to mypy, the names are the imports above: a misspelt one is an error
    __getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "FedForestClassifier",
    "FedForestError",
    "FedForestRegressor",
    "ForestModel",
    "load_profile",
]

__version__ = "0.1.0"
