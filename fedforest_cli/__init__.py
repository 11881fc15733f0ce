"""The ``fedforest`` command: server, client, simulate, compare, pki and audit.

The only package that imports both :mod:`server_app` and :mod:`client_app`.
"""

from __future__ import annotations
