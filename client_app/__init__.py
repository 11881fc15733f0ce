"""FedForest Secure client: the ``fedforest`` CLI, the HTTPS client loop and the simulation."""

from __future__ import annotations
