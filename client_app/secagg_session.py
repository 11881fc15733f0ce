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
``sign``    the SurvivorSet; we sign job, round, task digest and the survivors (once per round)
``unmask``  the UnmaskRequest; we reveal shares only for the set we signed, carried by ``t``
            valid signatures, or refuse (:class:`RefusedRequest`), in which case we tell the
            server why and stop

What the session takes as the job's membership is the identity directory it fetched once every
client joined: exactly ``n_clients`` identities (the job configuration the site checked at join)
and its own key among them; a session given the federation CA (a site with a TLS client
certificate) also requires every identity to be certified by a certificate that CA issued
(:mod:`fedforest_secure.secagg.directory`), so the server cannot add identities of its own.
The threshold and the graph (``neighbours``: None for the complete graph, ``k`` for the
SecAgg+ sparse graph) come from the job's privacy profile (the site's pinned profile when it
pinned one; a setting the profile leaves out is
:class:`~fedforest_secure.privacy.PrivacyProfile`'s default, as in the pin check: threshold 1.0,
t = n), the fewest survivors from the profile's ``min_clients`` and the ``K_min`` of its
DP noise; a round that announces another threshold or graph is refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from nacl.signing import SigningKey
from pydantic import ValidationError

from fedforest_secure import __version__
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, InvalidMessage, ProtocolError, RefusedRequest
from fedforest_secure.pki import load_certificate
from fedforest_secure.privacy.profile import with_profile_defaults
from fedforest_secure.protocol import Task, question_key
from fedforest_secure.protocol.api import Directory, JoinBody, RefuseBody
from fedforest_secure.secagg import (
    RoundSetup,
    SecAggClient,
    ShareDelivery,
    SurvivorSet,
    UnmaskRequest,
    parse,
)
from fedforest_secure.secagg.directory import (
    SITE_CERTIFICATE,
    Certification,
    certify_identity,
    federation_ca,
    site_certificate_problem,
    verify_directory,
)
from fedforest_secure.secure_sum import make_codec, unmask_floor

from .state import ClientState
from .transport import Transport

__all__ = ["SecAggSession", "check_federation_ca", "check_own_certificate", "identity_key",
           "join_body", "post_refusal", "stored_identity"]


def identity_key(state: ClientState, job: str) -> SigningKey:
    """This site's Ed25519 identity for ``job``: loaded from the state dir, or made once. A
    key file that someone else may have written or can read is refused
    (:func:`stored_identity`), never used; so is a new key its file system does not keep
    this user's only (:meth:`ClientState.write_secret`), before the join sends it."""
    seed = stored_identity(state, job)
    if seed is None:
        key = SigningKey.generate()
        try:
            state.write_secret(f"identity-{job}.ed25519", bytes(key))
        except FedForestError as exc:
            raise FedForestError(f"{exc}. This site has not joined job {job}") from None
        return key
    return SigningKey(seed)


def stored_identity(state: ClientState, job: str) -> bytes | None:
    """The seed of this site's identity key for ``job`` in the state dir, None if it has
    none yet: checked before anything is sent, and again when the key is used.

    Raises :class:`FedForestError` for a key file that someone else may have written or can
    read (:meth:`ClientState.read_secret`), or that holds no key."""
    name = f"identity-{job}.ed25519"
    try:
        seed = state.read_secret(name)
    except FedForestError as exc:
        raise FedForestError(f"{exc}. This client did not use the key (this site's identity "
                             f"in job {job})") from None
    if seed is not None and len(seed) != 32:  # a new key would not be the one the server knows
        raise FedForestError(
            f"{state.root / name} holds {len(seed)} bytes, not an Ed25519 key of 32: the "
            f"state directory is damaged. This site's identity in job {job} is the key it "
            "first joined with: restore the file from a backup; without it the site cannot "
            "take part in the job again")
    return seed


def check_own_certificate(cert: Path, job: str) -> None:
    """Refuse (:class:`FedForestError`) to join the secure job ``job`` with a TLS certificate
    (``--cert``) that is not a site's: every other site would refuse the identity it
    certifies at the job's first round (:func:`~fedforest_secure.secagg.directory.
    site_certificate_problem`, the rule they apply), and the job would fail for all of them."""
    unfit = site_certificate_problem(load_certificate(cert))
    if unfit is not None:
        raise FedForestError(
            f"--cert {cert} is not a site's certificate ({unfit}): every other site of secure "
            f"job {job} would refuse this site's identity at the job's first round, and the "
            f"job would fail. {SITE_CERTIFICATE[0].upper()}{SITE_CERTIFICATE[1:]}: start the "
            "client with this site's own certificate and key (the key this site made with "
            "`fedforest pki request`, the certificate `fedforest pki sign` gave for it where the "
            "federation's CA is kept). This site has not joined the job")


def check_federation_ca(ca: Path, job: str) -> None:
    """Refuse (:class:`FedForestError`) to join the secure job ``job`` with a ``--ca`` file
    that holds more than the federation CA's certificate and the CAs above it (:func:`~
    fedforest_secure.secagg.directory.federation_ca`): every identity of the job is checked
    against exactly one CA, the file's first."""
    try:
        federation_ca(ca.read_bytes())
    except ValueError as exc:
        raise FedForestError(
            f"--ca {ca}: {exc}. Give the federation CA's certificate (the ca.pem the "
            "coordinator sent, whose fingerprint the sites compared; on an institution's PKI, "
            "the CA that issues the sites' certificates, then the CAs above it): in a CA "
            "changeover the site moves to the new CA's ca.pem with its certificate from that "
            "CA. This site has not joined the job") from None


def join_body(state: ClientState, job: str, cert: Path | None, key: Path | None, *,
              secure: bool) -> dict[str, Any]:
    """The join's body: this site's Ed25519 identity key for ``job`` (used only by secure
    jobs) and, for a ``secure`` job with a TLS client certificate (``cert``; its key in
    ``key``, else in the same file, as TLS reads them), the key certified with it (see
    :mod:`fedforest_secure.secagg.directory`). An open job stores no certification, so none
    is made: any certificate TLS accepts joins it. A certificate and key that cannot certify
    (not an EC key, no key, not exactly one common name) stop a secure join with
    :class:`FedForestError` naming ``--cert``."""
    identity = bytes(identity_key(state, job).verify_key)
    certification = None
    if secure and cert is not None:
        key_file = key or cert
        key_pem = key_file.read_bytes()
        try:
            if b"PRIVATE KEY-----" not in key_pem:
                raise ValueError(f"{key_file} holds no private key")
            certification = certify_identity(job, identity, cert.read_bytes(),
                                             key_pem).to_json()
        except (ValueError, TypeError) as exc:  # InvalidMessage is a ValueError
            given = f"--cert {cert}" + (f" with --key {key}" if key is not None else "")
            raise FedForestError(
                f"{given} cannot certify this site's identity key for secure job {job} "
                f"({exc}): a site of a secure job signs its identity with its certificate's EC "
                "private key (in --key, or in the --cert file), and the certificate names the "
                "site in exactly one common name, as those `fedforest pki sign` writes: start "
                "the client with this site's own certificate and key (the key this site made "
                "with `fedforest pki request`, the certificate signed for it). This site has "
                "not joined the job") from None
    return JoinBody(identity_key=identity.hex(),
                    identity_cert=certification).model_dump(exclude_none=True)


@dataclass
class SecAggSession:
    """One client's secure-aggregation state for one job."""

    config: JobConfig
    tr: Transport
    job: str
    index: int
    identity: SigningKey
    #: the federation CA (PEM): when set, every directory entry must be a certified identity
    ca_pem: bytes | None = None
    client: SecAggClient | None = None
    names: dict[int, str] = field(default_factory=dict)
    messages_sent: int = 0
    log: list[str] = field(default_factory=list)
    _advertised: set[int] = field(default_factory=set)
    #: the round the client is answering (None before the first)
    open_round: int | None = None
    _refused: set[int] = field(default_factory=set)
    #: called with ``(round_id, the server's answer)`` once a refusal of this client is
    #: recorded (the site keeps a receipt of it)
    on_refused: Callable[[int, dict[str, Any]], None] | None = None

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
        n = self.config.n_clients
        if len(set(directory.values())) != len(directory):
            same = sorted(i for i, k in directory.items()
                          if list(directory.values()).count(k) > 1)
            raise ProtocolError(f"the server's directory gives clients {same} the same identity "
                                "key (a server counting one site's signature several times?)")
        if sorted(directory) != list(range(n)):
            raise ProtocolError(f"the server's directory lists clients {sorted(directory)[:8]}"
                                f"{'...' if len(directory) > 8 else ''}; this job has {n} "
                                f"clients (0..{n - 1})")
        if self.ca_pem is not None:  # every identity must be certified by the federation CA
            if not d.certs:
                raise ProtocolError("the server's directory carries no certifications; this "
                                    "client checks every identity against the federation CA")
            try:
                certs = {int(k): Certification.from_json(v) for k, v in d.certs.items()}
            except (ValueError, TypeError) as exc:
                raise InvalidMessage("malformed identity certifications") from exc
            try:
                self.names = verify_directory(self.job, directory, certs, self.ca_pem)
            except InvalidMessage as exc:
                if exc.peer != self.index:
                    raise
                # this site's own entry: its own certificate, not a peer's to accuse
                raise FedForestError(f"this site's own identity in job {self.job} does not "
                                     f"check: {exc} (--cert)") from None
        # read as the site's pin check reads them: a left-out threshold is the profile's
        # default 1.0 (t = n), never a lower one
        prof = with_profile_defaults(self.config.profile)
        threshold = prof["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ProtocolError(f"the job's profile has no valid threshold ({threshold!r})")
        neighbours = prof["neighbours"]
        if neighbours is not None and (isinstance(neighbours, bool)
                                       or not isinstance(neighbours, int)):
            raise ProtocolError(f"the job's profile has no valid graph ({neighbours!r})")
        try:
            self.client = SecAggClient(self.index, self.job, self.identity, directory,
                                       n_clients=n, threshold=threshold, neighbours=neighbours,
                                       min_survivors=unmask_floor(self.config))
        except ValueError as exc:
            raise RefusedRequest(f"refusing secure aggregation in job {self.job}: {exc}") from exc

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
        """Check the round setup, make and post our encrypted Shamir shares."""
        self.post_shares(task.round_id, self.share_bundle(task, message))

    def share_bundle(self, task: Task, message: str) -> str:
        """The ShareBundle JSON for the round setup ``message``, after checking that the setup
        describes ``task`` (digest, question and vector length); nothing is sent."""
        setup = parse(RoundSetup, message)
        if (setup.round_id == task.round_id and setup.task_digest == task.digest()
                and setup.vector_length == make_codec(self.config, task).words
                and setup.question != question_key(task)):
            # the same task, read as another question: the server computes question keys as
            # another version of the code does (or relabels the question)
            raise ProtocolError(
                "the round setup names this round's task but another question key for it: "
                "the server may run another version of fedforest-secure than this site "
                f"(this site: {__version__}); run the same version on the server and every "
                "site. A server of this version that does this relabels the question")
        if (setup.round_id != task.round_id or setup.task_digest != task.digest()
                or setup.question != question_key(task)
                or setup.vector_length != make_codec(self.config, task).words):
            raise ProtocolError("the round setup does not describe the task this client was "
                                "given (digest, question or vector length differ)")
        # SecAggClient checks the signatures and its own rules (>= 3 clients, t a strict majority)
        try:
            return self._sa().share_keys(setup).model_dump_json()
        except InvalidMessage as exc:
            raise self._named(exc) from exc

    def post_shares(self, round_id: int, bundle: str) -> None:
        self._post(round_id, "shares", bundle)

    def mask(self, task: Task, message: str, vector: np.ndarray) -> tuple[str, np.ndarray]:
        """``(MaskedUpload header JSON, masked uint64 vector)``."""
        delivery = parse(ShareDelivery, message)
        if delivery.round_id != task.round_id:
            raise ProtocolError("share delivery for another round")
        # the plain encoding is not needed after masking: mask it in place (no second buffer)
        try:
            header, masked = self._sa().mask(delivery, vector, inplace=True)
        except InvalidMessage as exc:
            raise self._named(exc) from exc
        return header.model_dump_json(), masked

    def _named(self, exc: InvalidMessage) -> InvalidMessage:
        """``exc``, saying also the site name of the peer it accuses where this session knows
        it (a certified directory): what the site's log line and its operator read."""
        name = self.names.get(exc.peer) if exc.peer is not None else None
        if name is None or name == f"client-{exc.peer}":
            return exc
        return InvalidMessage(f"{exc}; client {exc.peer} is {name}", peer=exc.peer)

    def sign(self, task: Task, message: str) -> None:
        """Sign the round's survivor set (once per round), or refuse."""
        survivor_set = parse(SurvivorSet, message)
        if survivor_set.round_id != task.round_id:
            raise ProtocolError("survivor set for another round")
        try:
            signature = self._sa().sign_survivors(survivor_set)
        except RefusedRequest as exc:
            self._refuse(task, exc)
            raise
        self._post(task.round_id, "signature", signature.model_dump_json())

    def _refuse(self, task: Task, exc: RefusedRequest) -> None:
        self.log.append(f"round {task.round_id}: refused: {exc}")
        self.refuse_round(task.round_id, exc.code)

    def refused(self, round_id: int) -> bool:
        """Whether this client told the server it refuses round ``round_id``."""
        return round_id in self._refused

    def last_refused(self) -> int | None:
        """The last round this client refused (or tried to), or None."""
        return max(self._refused, default=None)

    def refuse_round(self, round_id: int, code: str, accused: int | None = None) -> None:
        """Tell the server this client leaves the job at round ``round_id``, and why (a code
        of :data:`~fedforest_secure.errors.REFUSAL_CODES`, and for ``invalid_message`` the
        client index of the peer whose message did not authenticate): the server drops it at
        once."""
        self._refused.add(round_id)
        answer = post_refusal(self.tr, self.job, round_id, code, accused)
        if self.on_refused is not None:
            self.on_refused(round_id, answer)

    def unmask(self, task: Task, message: str) -> None:
        """Answer the unmask request (with the next round's advert riding along), or refuse."""
        request = parse(UnmaskRequest, message)
        sa = self._sa()
        nxt = sa.pending_advert(task.round_id + 1) or sa.advertise(task.round_id + 1)
        self._advertised.add(task.round_id + 1)
        try:
            response = sa.unmask(request, next_advert=nxt)
        except RefusedRequest as exc:
            self._refuse(task, exc)
            raise
        self._post(task.round_id, "unmask", response.model_dump_json())

    def _sa(self) -> SecAggClient:
        if self.client is None:
            raise ProtocolError("secure aggregation session not connected")
        return self.client


def post_refusal(tr: Transport, job: str, round_id: int, code: str,
                 accused: int | None = None) -> dict[str, Any]:
    """``POST .../rounds/{round_id}/secagg/refuse`` with ``code`` (one of
    :data:`~fedforest_secure.errors.REFUSAL_CODES`) and the peer it ``accused``, if any: the
    server drops this site at once. A refusal accusing nobody is the body it always was. The
    server's answer (with the audit chain's tip after the site's drop), or ``{}``."""
    body = RefuseBody(reason=code, accused=accused)
    resp = tr.request("POST", f"/v1/jobs/{job}/rounds/{round_id}/secagg/refuse",
                      content=body.model_dump_json(exclude_none=True).encode(),
                      content_type="application/json")
    try:
        answer = json.loads(resp.content)
    except (ValueError, RecursionError):
        return {}
    return answer if isinstance(answer, dict) else {}
