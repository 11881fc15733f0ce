"""In-process driver: the real client and server state machines of one job, without a network.

The engine and the tests use :class:`InProcessSecureSum`; over HTTPS the same
:class:`~fedforest_secure.secagg.SecAggClient` / :class:`~fedforest_secure.secagg.SecAggServer`
objects exchange the same messages, serialised. Every message the server receives is appended
to :attr:`InProcessSecureSum.transcript` (what a curious server sees).

A round runs the consistency step of the actively secure protocol (every survivor signs the
survivor set; the unmask request carries the signatures). Clients announce the next round's keys
on their unmask response (``next_advert``), so from the second round on a client that took part
in the previous round skips the advertisement step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from nacl.signing import SigningKey

from ..errors import RefusedRequest
from .client import SecAggClient
from .messages import KeyAdvert, MaskedUpload
from .server import SecAggServer

__all__ = ["InProcessSecureSum", "Upload"]


@dataclass(frozen=True)
class Upload:
    """A masked upload as the server received it: the header and the uint64 vector beside it."""

    header: MaskedUpload
    vector: np.ndarray


class InProcessSecureSum:
    """Secure sums over in-process clients, one aggregation round per :meth:`sum` call.

    Parameters
    ----------
    client_ids : iterable of int
        Every client of the job (a round may use a subset of at least ``t``).
    threshold : float or int
        Fraction of the job's clients needed to unmask (rounded up), or an absolute count: a
        strict majority of the job.
    job_id : str
        Job identifier bound into every key derivation.
    neighbours : int or None
        ``None`` for the complete graph, ``k`` for the SecAgg+ sparse graph of degree ~k.
    streaming : bool
        Run the server in accumulate mode: masked vectors are added into one running sum as
        they arrive instead of being kept (memory O(vector); same result).
    record : bool
        Keep every message of every round in :attr:`transcript` (masked uploads included: for
        tests and audits of what a server saw; memory grows with the job). Off, the transcript
        stays empty.
    min_survivors : int
        Fewest survivors a client helps unmask (at least 3; the ``K_min`` of DP noise).
    """

    def __init__(self, client_ids: Iterable[int], threshold: float | int = 0.67,
                 job_id: str = "job", neighbours: int | None = None, *,
                 streaming: bool = False, record: bool = True, min_survivors: int = 3) -> None:
        ids = sorted(set(int(i) for i in client_ids))
        if len(ids) < 3:
            raise ValueError("secure aggregation needs at least 3 clients")
        identities = {u: SigningKey.generate() for u in ids}
        self.directory: dict[int, bytes] = {u: bytes(k.verify_key) for u, k in identities.items()}
        self.clients = {u: SecAggClient(u, job_id, identities[u], self.directory,
                                        n_clients=len(ids), threshold=threshold,
                                        neighbours=neighbours, min_survivors=min_survivors)
                        for u in ids}
        self.threshold = threshold
        self.job_id = job_id
        self.neighbours = neighbours
        self.streaming = streaming
        self.record = record
        self.round_id = 0
        self.transcript: list[Any] = []
        self._next_adverts: dict[int, KeyAdvert] = {}
        self.last_server: SecAggServer | None = None

    def sum(self, question: str, task_digest: bytes, vectors: Mapping[int, np.ndarray], *,
            drop_after_sharing: Iterable[int] = (), drop_after_upload: Iterable[int] = ()
            ) -> np.ndarray:
        """Run one round; return the uint64 sum over clients whose masked upload was received.

        Clients in ``drop_after_sharing`` vanish after sending their shares (never upload);
        clients in ``drop_after_upload`` vanish after uploading (never help to unmask).
        Raises :class:`~fedforest_secure.errors.AbortedRound` when fewer than ``t`` remain and
        :class:`~fedforest_secure.errors.RefusedRequest` when the clients refuse to answer.
        """
        parts = sorted(vectors)
        lengths = {np.asarray(vectors[u]).shape for u in parts}
        if len(lengths) != 1 or any(np.asarray(vectors[u]).dtype != np.uint64 for u in parts):
            raise ValueError("vectors must be uint64 arrays of one common length")
        (shape,) = lengths
        if len(shape) != 1:
            raise ValueError("vectors must be 1-d")
        return self._round(question, task_digest, parts, shape[0],
                           lambda u: np.asarray(vectors[u]), False, drop_after_sharing,
                           drop_after_upload)

    def sum_produced(self, question: str, task_digest: bytes, clients: Iterable[int],
                     length: int, produce: Callable[[int], np.ndarray]) -> np.ndarray:
        """:meth:`sum` of vectors made one at a time: ``produce(u)`` is called once the
        round's shares are delivered, returns client ``u``'s uint64 vector of ``length``
        (a fresh array: it is masked in place), and the vector is uploaded and dropped before
        the next client's is made (memory O(vector), not O(K x vector))."""
        return self._round(question, task_digest, sorted(set(clients)), int(length), produce,
                           True, (), ())

    def _round(self, question: str, task_digest: bytes, parts: list[int], length: int,
               vector: Callable[[int], np.ndarray], fresh: bool,
               drop_after_sharing: Iterable[int], drop_after_upload: Iterable[int]
               ) -> np.ndarray:
        unknown = set(parts) - set(self.clients)
        if unknown:
            raise ValueError(f"unknown clients {sorted(unknown)}")
        drop1, drop2 = set(drop_after_sharing), set(drop_after_upload)
        if not (drop1 | drop2) <= set(parts) or drop1 & drop2:
            raise ValueError("dropouts must be disjoint subsets of the round's clients")
        shape = (length,)
        r = self.round_id
        self.round_id += 1
        server = SecAggServer(self.job_id, r, question, task_digest, shape[0], self.threshold,
                              self.directory, self.neighbours, streaming=self.streaming)
        self.last_server = server
        for u in parts:
            advert = self.clients[u].pending_advert(r) or self.clients[u].advertise(r)
            if self._next_adverts.get(u) == advert:
                server.receive_advert(advert)  # already seen, riding on the last round
            else:
                self._receive(server.receive_advert, advert)
        self._next_adverts = {}
        server.setup()
        for u in parts:  # each client's setup: on the sparse graph, its group's adverts only
            self._receive(server.receive_shares, self.clients[u].share_keys(server.setup_for(u)))
        deliveries = server.deliver_shares()
        for u in sorted(deliveries):
            if u in drop1:
                continue
            vec = vector(u)
            header, masked = self.clients[u].mask(deliveries[u], vec, inplace=fresh)
            del vec
            if self.record:
                self.transcript.append(Upload(header, masked.copy()))
            server.receive_upload(header, masked)
            del header, masked
        refused: list[RefusedRequest] = []
        survivor_set = server.request_signatures()
        for u in survivor_set.survivors:
            if u in drop2:
                continue
            try:
                signature = self.clients[u].sign_survivors(survivor_set)
            except RefusedRequest as exc:
                refused.append(exc)
                continue
            self._receive(server.receive_signature, signature)
        if refused:
            raise refused[0]
        request = server.request_unmask()
        for u in request.survivors:
            if u in drop2 or u not in server.signed:
                continue
            try:
                client = self.clients[u]
                nxt = client.pending_advert(r + 1) or client.advertise(r + 1)
                response = client.unmask(server.unmask_request_for(u), next_advert=nxt)
            except RefusedRequest as exc:
                refused.append(exc)
                continue
            self._receive(server.receive_unmask, response)
        if refused:
            raise refused[0]
        total = server.finish()
        self._next_adverts = dict(server.next_adverts)
        return total

    def _receive(self, handler: Any, msg: Any) -> None:
        if self.record:
            self.transcript.append(msg)
        handler(msg)
