"""FedForest Secure client: one institution's site runtime over HTTPS.

It loads and validates the site's table, joins a job, answers each round's task (masked under
secure aggregation), keeps receipts and saves the model. It speaks
:mod:`fedforest_secure.protocol` and never imports the server.
"""

from __future__ import annotations
