"""HTTPS transport of a client: TLS verified against the federation CA, retries with backoff.

Each attempt of a request waits as long as :mod:`.waits` says (for its answer, the long poll it
asks for plus :data:`~.waits.ANSWER_MARGIN_S`; for each part of its body, as long), then sends
it again, while the retry budget lasts.

There is deliberately no way to switch certificate verification off: the only trust anchor is
the CA file given on the command line (plus an optional client certificate for mTLS). Plain
``http://`` is allowed only towards a loopback host (``localhost``, 127.0.0.0/8, ``::1``) and only
with the client's explicit ``--insecure-dev``; the URL is parsed, never prefix-matched.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fedforest_secure.errors import FedForestError
from fedforest_secure.printable import printable
from fedforest_secure.protocol.api import ErrorBody
from fedforest_secure.protocol.steps import STEP_JSON_BYTES, WITH_TASK, split_step

from . import stop
from .answers import (
    ERROR_MAX,
    JSON_MAX,
    TASK_MAX,
    WINDOW_BYTES,
    WINDOW_S,
    AnswerTooLarge,
    SlowAnswer,
    answer_json,
    json_limit,
    read_body,
)
from .server_url import check_server_url, is_loopback_host
from .tls_files import clock_hint, tls_context
from .waits import ANSWER_MARGIN_S, CONNECT_S, MIN_SEND_RATE, attempt_timeout, body_parts

__all__ = ["ANSWER_MARGIN_S", "MIN_SEND_RATE", "AnswerTooLarge", "ApiRejected",
           "ServerUnreachable", "Transport", "TransportFailed", "check_server_url",
           "is_loopback_host", "tls_context"]

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
#: Connections closed without an answer, in a row, before the client asks whether the server
#: closes every connection right after the TLS handshake: what a server that refuses the
#: client's certificate (or its lack of one) does under TLS 1.3, where the client's side of
#: the handshake is over before the server has looked at its certificate. uvicorn sends no
#: alert then; the connection just closes.
_HANGUPS = 3
#: seconds an idle connection stays in the client's pool; the server keeps one open longer
#: (:data:`server_app.serve.KEEP_ALIVE_S`), so the client never reuses a connection the server
#: is closing at that moment (a request that meets the close is a hang-up, retried)
KEEPALIVE_S = 5.0
#: How long that probe waits on a fresh connection that sends nothing: a server that accepted
#: the certificate waits for a request, one that refused it has closed the connection.
_PROBE_S = 2.0
#: TLS alerts by which a server refuses the client's certificate (OpenSSL's wording).
_REFUSAL = re.compile(r"(?:tlsv1|tlsv13|sslv3) alert (unknown ca|certificate expired|"
                      r"certificate revoked|bad certificate|certificate unknown|"
                      r"unsupported certificate|access denied|certificate required)",
                      re.IGNORECASE)
#: The alerts a certificate outside its dates may be refused with.
_DATE_ALERTS = ("bad certificate", "certificate expired", "certificate unknown")
#: The POSTs that carry the next secure-aggregation step back (``?next_wait=``). The client
#: posts its share bundle from a second thread while it computes its answer.
_STEP_PATH = re.compile(r"/rounds/\d+/(secagg/(advert|shares|signature|unmask)|upload)$")


class ApiRejected(FedForestError):
    """The server refused a request with a 4xx; ``code`` and ``detail`` come from its JSON (the
    message holds them :func:`~fedforest_secure.printable.printable`: one line of text)."""

    def __init__(self, status: int, code: str, detail: str, body: dict[str, Any]) -> None:
        super().__init__(printable(f"{status} {code}: {detail}"))
        self.status, self.code, self.detail, self.body = status, code, detail, body


class TransportFailed(FedForestError):
    """The server cannot be talked to: it stayed unreachable for longer than the retry budget
    (:class:`ServerUnreachable`), or TLS stands in the way."""


class ServerUnreachable(TransportFailed):
    """The server did not answer, or kept failing, for longer than the retry budget.
    ``failure`` is what happened, without the advice the message ends with."""

    def __init__(self, message: str, *, failure: str) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass
class Transport:
    """A small wrapper over :class:`httpx.Client` with bounded exponential backoff."""

    base_url: str
    token: str = field(repr=False)  # a logged repr never holds the site's token
    ca: Path | None
    cert: Path | None = None
    key: Path | None = None
    retry_budget_s: float = 300.0
    #: Seconds one attempt waits for the server beyond the long poll it asks for (the wait it
    #: asks plus this is the longest a connection may stay silent): :data:`ANSWER_MARGIN_S`.
    answer_margin_s: float = field(default_factory=lambda: ANSWER_MARGIN_S)
    #: Bytes a second a body is sure to get through at: :data:`MIN_SEND_RATE`.
    min_send_rate: float = MIN_SEND_RATE
    #: An answer's body must bring :attr:`window_bytes` in every :attr:`window_s` seconds
    #: (:func:`~.answers.read_body`): :data:`~.answers.WINDOW_BYTES`,
    #: :data:`~.answers.WINDOW_S`.
    window_s: float = WINDOW_S
    window_bytes: float = WINDOW_BYTES

    insecure_dev: bool = False
    #: Secure runs: the key advert, the share bundle, the masked upload, the survivor
    #: signature and the unmask response ask the server to answer with the client's next step
    #: as well (``?next_wait=``, long-polled), kept for the client loop in
    #: :meth:`take_next_step`: one request and one wake-up less per step.
    step_wait: float = 0.0
    #: Told (once per outage) when the server cannot be reached and the client keeps trying,
    #: and when it answers again.
    on_wait: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self._waiting = False
        # a token read from a file or a secret store often ends in a newline: the token is
        # what lies between; whitespace inside it is a token pasted wrong (never printed)
        self.token = self.token.strip()
        if not self.token or any(c.isspace() or not c.isprintable() for c in self.token):
            raise ValueError("the site's token (--token or FEDFOREST_TOKEN) is empty or holds "
                             "spaces or control characters: give the token the server "
                             "printed, on one line")
        scheme = check_server_url(self.base_url, insecure_dev=self.insecure_dev)
        if scheme == "https":
            if self.ca is None:
                raise ValueError("an https server needs --ca (the federation CA certificate)")
            self._tls: ssl.SSLContext | None = tls_context(self.ca, self.cert, self.key)
            verify: ssl.SSLContext | bool = self._tls
        else:
            self._tls = None
            verify = True  # plain HTTP only towards a loopback server run with --insecure-dev
        # a proxy of the environment (http_proxy, ALL_PROXY) only where TLS protects the
        # token end to end (an https proxy tunnels): plain HTTP goes to the loopback server
        # named, never through a proxy that may be on another machine
        self._http = httpx.Client(base_url=self.base_url, verify=verify,
                                  timeout=httpx.Timeout(self.answer_margin_s,
                                                        connect=CONNECT_S),
                                  limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
                                  # never compressed: answers are read as they are sent
                                  headers={"Authorization": f"Bearer {self.token}",
                                           "Accept-Encoding": "identity"},
                                  trust_env=scheme == "https")
        self.bytes_sent = 0
        self.bytes_received = 0
        #: HTTP requests sent (each one a round trip to the server), retries included
        self.requests = 0
        self._next_step: dict[str, Any] | None = None
        self._next_task: bytes | None = None  # the task after the next step's JSON
        self._step_task: bytes | None = None  # the task of the step handed over last
        #: each request's timeout while :meth:`brief` (the client's own otherwise)
        self._timeout: httpx.Timeout | None = None

    @contextlib.contextmanager
    def brief(self, seconds: float = 5.0) -> Iterator[None]:
        """Requests that give up within about ``seconds`` (each attempt waits at most that
        long, and no attempt starts after that long): what a client that is stopping, or only
        asking a courtesy question, sends."""
        saved = self.retry_budget_s, self._timeout
        self.retry_budget_s = min(self.retry_budget_s, seconds)
        self._timeout = httpx.Timeout(seconds)
        try:
            yield
        finally:
            self.retry_budget_s, self._timeout = saved

    def take_next_step(self) -> dict[str, Any] | None:
        """The next secure-aggregation step the last POST brought back (once), or None; the
        task that came with it is :meth:`take_step_task`'s until the next call."""
        out, self._next_step = self._next_step, None
        self._step_task, self._next_task = self._next_task, None
        return out

    def take_step_task(self) -> bytes | None:
        """The task bytes that came with the step :meth:`take_next_step` handed over last
        (once), or None: unchecked, the caller checks them against the step's digest."""
        out, self._step_task = self._step_task, None
        return out

    def _keep_next_step(self, resp: httpx.Response, what: str, limit: int) -> httpx.Response:
        """Keep the next step a step POST's answer brings (and the task after its JSON, if
        any: :func:`~fedforest_secure.protocol.steps.split_step`); the answer with its JSON
        alone. A body the header does not split is a :class:`ProtocolError`; a JSON longer
        than ``limit``, or a task longer than :data:`~.answers.TASK_MAX`, is
        :class:`AnswerTooLarge`."""
        text, task = split_step(resp.content, resp.headers.get(STEP_JSON_BYTES))
        for name, part, most in (("JSON", text, limit), ("task", task or b"", TASK_MAX)):
            if len(part) > most:
                raise AnswerTooLarge(f"{what}: the {name} of the server's step answer takes "
                                     f"{len(part)} bytes; this client reads at most {most}: "
                                     "refused (a server that sends more is broken or hostile)")
        self._next_step = _next_of(text)
        self._next_task = task if self._next_step is not None else None
        if task is None:
            return resp
        # the answer handed on is the JSON alone, and says so
        headers = [(k, v) for k, v in resp.headers.multi_items() if k.lower() not in (
            "content-length", "content-type", STEP_JSON_BYTES.lower())]
        headers.append(("Content-Type", "application/json"))
        return httpx.Response(resp.status_code, headers=headers, content=text,
                              request=resp.request, extensions=resp.extensions)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, content: bytes | None = None,
                ok_statuses: tuple[int, ...] = (200,),
                content_type: str = "application/octet-stream",
                params: dict[str, Any] | None = None, limit: int = JSON_MAX) -> httpx.Response:
        """Send with retries on network errors and 5xx/429; a 4xx raises :class:`ApiRejected`.

        Each attempt waits for an answer at most the long poll it asks for plus
        :attr:`answer_margin_s` (or the seconds of :meth:`brief`), plus the time the body's
        bytes still queued in the kernel take at :attr:`min_send_rate`, and for each part of
        the body to be taken as long; attempts go on, with backoff, while
        :attr:`retry_budget_s` lasts. The answer's body is read as it comes, at most
        ``limit`` bytes, and must bring :attr:`window_bytes` in every :attr:`window_s`
        seconds (the whole body within :meth:`brief`'s seconds;
        :func:`~.answers.read_body`): a compressed or longer answer is refused
        (:class:`~.answers.AnswerTooLarge`, not sent again), one that stopped moving is lost
        as a silent one is. A request made outside the main thread (the
        share bundle's POST) is not retried once this process was asked to stop: the signal
        interrupts only the main thread."""
        headers = {} if content is None else {"Content-Type": content_type,
                                               "Content-Length": str(len(content))}
        step = self.step_wait > 0 and method == "POST" and params is None and bool(
            _STEP_PATH.search(path))
        if step:
            # the next step's task may follow its JSON (a step of the next round)
            params = {"next_wait": self.step_wait, WITH_TASK: "true"}
        if self._timeout is not None:
            timeout, silent_s = self._timeout, float(self._timeout.read or 0.0)
        else:
            timeout = attempt_timeout(params, len(content or b""), self.answer_margin_s,
                                      self.min_send_rate)
            silent_s = float(timeout.write or 0.0)
        delay, start = 0.2, time.monotonic()
        hangups = tries = 0
        while True:
            self.requests += 1
            tries += 1
            try:
                resp = self._answer(method, path, content, headers, params, timeout,
                                    limit, ok_statuses, with_task=step)
            except httpx.TransportError as exc:
                if isinstance(exc, httpx.ConnectError) and "CERTIFICATE_VERIFY_FAILED" in str(
                        exc):
                    raise TransportFailed(f"TLS verification of {self.base_url} failed: the "
                                          "server's certificate is not signed by --ca, or not "
                                          f"for this host name ({exc})") from exc
                alert = _REFUSAL.search(str(exc))
                if alert is not None:
                    raise TransportFailed(self._refused(alert.group(1).lower())) from exc
                hangup = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError
                                    | httpx.WriteError)
                hangups = hangups + 1 if hangup else 0
                if hangups >= _HANGUPS:
                    hangups = 0
                    if self._closes_after_handshake():
                        raise TransportFailed(self._refused(None)) from exc
                silent = isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout | SlowAnswer)
                err: str = (f"no answer on the connection for {timeout.read or 0:.0f}s"
                            if isinstance(exc, httpx.ReadTimeout) else
                            str(exc) if isinstance(exc, SlowAnswer) else
                            f"the connection took no part of the request body for "
                            f"{silent_s:.0f}s" if isinstance(exc, httpx.WriteTimeout)
                            else _describe(exc))
            else:
                self.bytes_sent += len(content or b"") + len(path) + 200
                self.bytes_received += len(resp.content)
                if self._waiting and resp.status_code not in _RETRY_STATUS:
                    self._waiting = False
                    if self.on_wait is not None:
                        self.on_wait(f"the server at {self.base_url} answers")
                if resp.status_code in ok_statuses or resp.status_code == 204:
                    if step:
                        resp = self._keep_next_step(resp, f"{method} {path}", limit)
                    return resp
                if resp.status_code not in _RETRY_STATUS:
                    try:
                        # not JSON, or not an error object (pydantic's ValidationError is
                        # a ValueError too)
                        body = ErrorBody.model_validate(json.loads(resp.content))
                    except (ValueError, RecursionError):
                        body = ErrorBody(error="http_error", detail=resp.text[:200])
                    raise ApiRejected(resp.status_code, body.error, body.detail,
                                      body.model_dump())
                err, silent = f"HTTP {resp.status_code}{_detail_of(resp)}", False
            if _stopping():
                raise TransportFailed(f"{method} {path}: not sent again: this client is "
                                      f"stopping ({err})")
            if time.monotonic() - start > self.retry_budget_s:
                raise self._gave_up(method, path, err, silent=silent, tries=tries)
            if not self._waiting and self.on_wait is not None:
                self.on_wait(f"waiting for the server at {self.base_url} ({err}); retrying "
                             f"for up to {self.retry_budget_s:.0f}s")
            self._waiting = True
            _sleep(delay)
            delay = min(delay * 2, 5.0)

    def _answer(self, method: str, path: str, content: bytes | None, headers: dict[str, str],
                params: dict[str, Any] | None, timeout: httpx.Timeout, limit: int,
                ok_statuses: tuple[int, ...], *, with_task: bool = False) -> httpx.Response:
        """One attempt: the request sent, its answer read whole (:func:`~.answers.read_body`:
        at most ``limit`` bytes of an answer of ``ok_statuses`` or 204, the first
        :data:`~.answers.ERROR_MAX` of any other). ``with_task``: a step POST's, whose answer
        may bring a task after its JSON; then one whose head has the
        :data:`~fedforest_secure.protocol.steps.STEP_JSON_BYTES` header is read up to
        ``limit`` plus :data:`~.answers.TASK_MAX` bytes (its parts checked by
        :meth:`_keep_next_step`)."""
        with self._http.stream(method, path, content=body_parts(content), headers=headers,
                               params=params, timeout=timeout) as raw:
            ok = raw.status_code in ok_statuses or raw.status_code == 204
            if ok and with_task and STEP_JSON_BYTES in raw.headers:
                limit += TASK_MAX
            brief = self._timeout is not None  # the whole body within its seconds
            body = read_body(raw, f"{method} {path}", limit=limit if ok else ERROR_MAX,
                             window_s=float(timeout.read or 0.0) if brief else self.window_s,
                             window_bytes=math.inf if brief else self.window_bytes,
                             truncate=not ok)
            return httpx.Response(raw.status_code, headers=raw.headers, content=body,
                                  request=raw.request, extensions=raw.extensions)

    def _gave_up(self, method: str, path: str, err: str, *, silent: bool, tries: int
                 ) -> ServerUnreachable:
        """The error of a request that failed until its retry budget ran out: ``err`` what its
        last attempt met (``silent``: its connection went silent), after ``tries`` attempts."""
        budget, retried = f"{self.retry_budget_s:.0f}s", _retried(tries - 1)
        if silent:  # the server took the connection: it runs, at that address
            failure = (f"{method} {path}: no answer from the server at {self.base_url} reached "
                       f"this client within {budget} ({err}; {retried})")
            return ServerUnreachable(
                failure + "; the request or its answer was lost on the way: a firewall, proxy "
                "or NAT between this site and the server may drop connections, or the server "
                "is overloaded or hung (its log says whether the request arrived)", failure=failure)
        failing = err.startswith("HTTP")
        failure = (f"{method} {path}: the server at {self.base_url} "
                   f"{'kept failing' if failing else 'did not answer'} for {budget} ({err})")
        return ServerUnreachable(failure + ("; its log says why" if failing else
                                            "; is it running, and are the address and "
                                            "port right?"), failure=failure)

    def _closes_after_handshake(self) -> bool:
        """Whether the server closes a fresh TLS connection that has sent nothing yet, right
        after the handshake: it refuses the client's certificate (or its lack of one).

        False when the server cannot be reached, the handshake does not finish, or the
        connection stays open for :data:`_PROBE_S` seconds (the server waits for a request):
        then the hang-ups have another cause, and the client keeps trying.
        """
        if self._tls is None:
            return False
        url = httpx.URL(self.base_url)
        try:
            raw = socket.create_connection((url.host, url.port or 443), timeout=_PROBE_S)
        except OSError:
            return False
        with raw:
            try:
                tls = self._tls.wrap_socket(raw, server_hostname=url.host)
            except (TimeoutError, ssl.SSLCertVerificationError):
                return False
            except OSError:  # an alert or a reset during the handshake (TLS 1.2)
                return True
            with tls:
                try:
                    return tls.recv(1) == b""
                except TimeoutError:
                    return False
                except OSError:  # an alert, or a reset, in place of a request's answer
                    return True

    def _refused(self, alert: str | None) -> str:
        """Why the server refuses this client's connections; ``alert``: the reason of the TLS
        alert it sent (``unknown ca``), if any."""
        said = f" (TLS alert: {alert})" if alert else ""
        # a certificate not valid yet, or expired, is answered `bad certificate` or
        # `certificate expired` (by OpenSSL's version); `unknown ca`, `certificate revoked`
        # and the others name another cause, where the clocks are beside the point
        clocks = clock_hint(self.cert) if self.cert is not None and (
            alert is None or alert.lower() in _DATE_ALERTS) else ""
        if self.cert is None:
            return (f"{self.base_url} refuses the connection{said}: the server requires a "
                    "client certificate (mutual TLS). Pass --cert client.pem --key "
                    "client.key (this site's key from `fedforest pki request` and the "
                    "certificate `fedforest pki sign` gave for it)")
        check = ("Is it signed by a CA the server does not trust (its [tls] client_ca), "
                 "revoked, expired, or not valid yet on the server's clock? Check that --cert "
                 "and --key are this site's key and the certificate signed for it, "
                 "and that the CA that signed it is the server's client_ca (`openssl verify "
                 f"-CAfile <that CA> {self.cert}`); the server's operator can tell which CA it "
                 f"trusts{clocks}")
        if alert:
            return (f"{self.base_url} refuses the client certificate --cert {self.cert}{said}. "
                    f"{check}")
        return (f"{self.base_url} closes every connection right after the TLS handshake: the "
                f"server may refuse the client certificate --cert {self.cert}. {check}")

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """The JSON answer to ``GET path``; a :class:`ProtocolError` if it is none."""
        return answer_json(self.request("GET", path, params=params, limit=json_limit(path)),
                           f"GET {path}")

    def post_json(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer to ``POST path`` with the JSON ``body``; a :class:`ProtocolError`
        if it is none."""
        limit = json_limit(path)
        if body is None:
            return answer_json(self.request("POST", path, limit=limit), f"POST {path}")
        return answer_json(self.request("POST", path, content=json.dumps(body).encode(),
                                        content_type="application/json", limit=limit),
                           f"POST {path}")


def _retried(times: int) -> str:
    return {0: "not retried", 1: "retried once"}.get(times, f"retried {times} times")


def _stopping() -> bool:
    """Whether this process was asked to stop and the caller runs outside the main thread:
    a signal interrupts only the main thread, whose own requests (the refusal it sends on its
    way out) are the ones still meant to go."""
    return stop.asked() is not None and threading.current_thread() is not \
        threading.main_thread()


def _sleep(seconds: float) -> None:
    """Sleep ``seconds``, less if :func:`_stopping` becomes true meanwhile."""
    end = time.monotonic() + seconds
    while not _stopping() and (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))


def _detail_of(resp: httpx.Response) -> str:
    """``": <detail>"`` from a JSON error body, or nothing."""
    try:
        detail = ErrorBody.model_validate(json.loads(resp.content)).detail
    except (ValueError, RecursionError):
        return ""
    return f": {printable(detail[:300])}" if detail else ""


def _describe(exc: httpx.TransportError) -> str:
    """A transport failure in the words an operator looks for."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError) and "refused" in text.lower():
        return "connection refused: the server is not running yet, or the port is wrong"
    if isinstance(exc, httpx.ConnectTimeout):
        return "no answer to the connection (a firewall, or a wrong host?)"
    return f"{type(exc).__name__}: {text}"


def _next_of(content: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        return None
    nxt = body.get("next") if isinstance(body, dict) else None
    return nxt if isinstance(nxt, dict) else None
