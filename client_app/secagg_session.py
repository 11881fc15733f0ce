"""The client side of secure aggregation over HTTPS: one :class:`SecAggSession` per job.

The session owns the site's long-term Ed25519 identity (kept in the state directory, mode 0600,
registered with the server at join and audited there) and a
:class:`~fedforest_secure.secagg.SecAggClient`. It follows ``GET /v1/jobs/{job}/secagg``, which
says what the server needs from this client now:

``advert``  the signed round keys (only for the first round, or after a round without us:
            afterwards the next round's advert rides on every unmask response)
``share``   the RoundSetup; we check it is for the task we were given (digest, question and
            vector length), then post our encrypted Shamir shares. The question is
            :func:`question_key` (the task's content without its round id), so the same statistic
            re-asked in a later round over a different set of clients is refused at unmask
``upload``  the ShareDelivery; we mask ``encode_contribution(config, task, reply)`` and post it
            as a binary body
``unmask``  the UnmaskRequest; we reveal shares, or refuse (:class:`RefusedRequest`), in which
            case we tell the server why and stop
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from nacl.signing import SigningKey
from pydantic import ValidationError

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, InvalidMessage, ProtocolError, RefusedRequest
from fedforest_secure.protocol import Task, layout_size, question_key
from fedforest_secure.protocol.api import Directory, RefuseBody
from fedforest_secure.secagg import (
    RoundSetup,
    SecAggClient,
    ShareDelivery,
    UnmaskRequest,
    parse,
)

from .state import ClientState
from .transport import Transport

__all__ = ["SecAggSession", "identity_key"]


def identity_key(state: ClientState, job: str) -> SigningKey:
    """This site's Ed25519 identity for ``job``: loaded from the state dir, or made once."""
    name = f"identity-{job}.ed25519"
    seed = state.read_secret(name)
    if seed is None or len(seed) != 32:
        key = SigningKey.generate()
        state.write_secret(name, bytes(key))
        return key
    return SigningKey(seed)


@dataclass
class SecAggSession:
    """One client's secure-aggregation state for one job."""

    config: JobConfig
    tr: Transport
    job: str
    index: int
    identity: SigningKey
    client: SecAggClient | None = None
    messages_sent: int = 0
    log: list[str] = field(default_factory=list)
    _advertised: set[int] = field(default_factory=set)

    def connect(self, timeout_s: float = 600.0,
                on_wait: Callable[[], None] | None = None) -> None:
        """Fetch the identity directory once every client has joined; check our own entry.
        ``on_wait`` is called while the directory is incomplete."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                d = Directory.model_validate(self.tr.get_json(f"/v1/jobs/{self.job}/directory"))
            except ValidationError:
                raise InvalidMessage("malformed identity directory") from None
            if d.complete:
                break
            if time.monotonic() > deadline:
                raise FedForestError("not every client registered an identity key in time")
            if on_wait is not None:
                on_wait()
            time.sleep(0.2)
        try:
            directory = {int(k): bytes.fromhex(v) for k, v in d.keys.items()}
        except (KeyError, ValueError, TypeError) as exc:
            raise InvalidMessage("malformed identity directory") from exc
        if any(len(v) != 32 for v in directory.values()):
            raise InvalidMessage("malformed identity directory")
        if directory.get(self.index) != bytes(self.identity.verify_key):
            raise ProtocolError("the server's directory does not hold this client's identity "
                                "key (a server substituting keys?)")
        self.client = SecAggClient(self.index, self.job, self.identity, directory)

    def _post(self, round_id: int, kind: str, body: str) -> None:
        self.tr.request("POST", f"/v1/jobs/{self.job}/rounds/{round_id}/secagg/{kind}",
                        content=body.encode(), content_type="application/json")
        self.messages_sent += 1

    def advertised(self, round_id: int) -> bool:
        """Whether this session made round keys for ``round_id`` (a fresh process after a
        restart has none for the round that was open)."""
        return round_id in self._advertised

    def advert(self, round_id: int) -> None:
        sa = self._sa()
        adv = sa.pending_advert(round_id) or sa.advertise(round_id)
        self._advertised.add(round_id)
        self._post(round_id, "advert", adv.model_dump_json())

    def share(self, task: Task, message: str) -> None:
        setup = parse(RoundSetup, message)
        if (setup.round_id != task.round_id or setup.task_digest != task.digest()
                or setup.question != question_key(task)
                or setup.vector_length != layout_size(task.layout)):
            raise ProtocolError("the round setup does not describe the task this client was "
                                "given (digest, question or vector length differ)")
        # SecAggClient checks the signatures and its own rules (>= 3 clients, t a strict majority)
        bundle = self._sa().share_keys(setup)
        self._post(task.round_id, "shares", bundle.model_dump_json())

    def mask(self, task: Task, message: str, vector: np.ndarray) -> tuple[str, np.ndarray]:
        """``(MaskedUpload header JSON, masked uint64 vector)``."""
        delivery = parse(ShareDelivery, message)
        if delivery.round_id != task.round_id:
            raise ProtocolError("share delivery for another round")
        # the plain encoding is not needed after masking: mask it in place (no second buffer)
        header, masked = self._sa().mask(delivery, vector, inplace=True)
        return header.model_dump_json(), masked

    def unmask(self, task: Task, message: str) -> None:
        """Answer the unmask request (with the next round's advert riding along), or refuse."""
        request = parse(UnmaskRequest, message)
        sa = self._sa()
        nxt = sa.pending_advert(task.round_id + 1) or sa.advertise(task.round_id + 1)
        self._advertised.add(task.round_id + 1)
        try:
            response = sa.unmask(request, next_advert=nxt)
        except RefusedRequest as exc:
            self.tr.request("POST", f"/v1/jobs/{self.job}/rounds/{task.round_id}/secagg/refuse",
                            content=json.dumps(RefuseBody(reason=str(exc)).model_dump()).encode(),
                            content_type="application/json")
            raise
        self._post(task.round_id, "unmask", response.model_dump_json())

    def _sa(self) -> SecAggClient:
        if self.client is None:
            raise ProtocolError("secure aggregation session not connected")
        return self.client
