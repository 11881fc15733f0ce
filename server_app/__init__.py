"""FedForest Secure server: FastAPI over HTTPS, state in SQLAlchemy, round deadlines, audit."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
