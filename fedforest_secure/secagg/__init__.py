"""Secure aggregation by pairwise masking with Shamir-shared keys (Bonawitz et al. 2017).

This is the recipe layer: "mask this vector for round r" and "unmask this sum", with the privacy
rules enforced. The primitives (X25519 + HKDF, AES-CTR PRG, Shamir, ring encoding) live in the
private :mod:`fedforest_secure.secagg._primitives` and are imported only from here.

* :class:`InProcessSecureSum` runs whole rounds in one process (the engine's entry point).
* :class:`SecAggClient` / :class:`SecAggServer` are the transport-agnostic state machines;
  :mod:`.messages` holds the wire messages (pydantic; vectors travel beside them as uint64).
* :func:`encode`, :func:`decode`, :class:`RingCodec`: range-checked fixed-point ring encoding.

Against an actively malicious server each client pins what it knows of the job (the identity
directory, the job's size, the threshold and graph of its own profile) and reveals unmask shares
only for a survivor set that ``t`` members signed (the consistency step); on the SecAgg+ sparse
graph, a share of a neighbour only for a set that ``t_local`` members of that neighbour's group
signed (the checks local to the neighbourhood: O(log K) per client).

Masks are fresh every round: every round draws a new masking key pair and self-mask seed, and the
pairwise seeds are bound to ``job|round|i|j|task_digest``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ._rounds import job_threshold
from .encoding import RingCodec, decode, encode
from .messages import (
    KeyAdvert,
    MaskedUpload,
    RoundSetup,
    ShareBundle,
    ShareDelivery,
    SurvivorSet,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
    parse,
)

if TYPE_CHECKING:
    from .client import ClientStage, SecAggClient
    from .driver import InProcessSecureSum, Upload
    from .server import KeyMismatch, SecAggServer, ServerStage

#: the two sides (and the in-process driver, which runs both), imported on first use: a site's
#: client process runs the client's side only, the server the server's side only
_LAZY = {"ClientStage": "client", "SecAggClient": "client", "InProcessSecureSum": "driver",
         "Upload": "driver", "KeyMismatch": "server", "SecAggServer": "server",
         "ServerStage": "server"}


if not TYPE_CHECKING:  # to mypy, the names are the imports above: a misspelt one is an error
    __getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "ClientStage",
    "InProcessSecureSum",
    "KeyAdvert",
    "KeyMismatch",
    "MaskedUpload",
    "RingCodec",
    "RoundSetup",
    "SecAggClient",
    "SecAggServer",
    "ServerStage",
    "ShareBundle",
    "ShareDelivery",
    "SurvivorSet",
    "SurvivorSignature",
    "UnmaskRequest",
    "UnmaskResponse",
    "Upload",
    "decode",
    "encode",
    "job_threshold",
    "parse",
]
