"""The server's HTTP endpoints with a body, as OpenAI defines them: WebRTC calls and client secrets.

* ``POST /v1/realtime/calls`` (``Content-Type: application/sdp``, the offer as the body, as browsers and
  @openai/agents-realtime send it; or the ``openai`` SDK's ``multipart/form-data`` with an ``sdp`` and a
  ``session`` part; ``?model=`` is echoed): ``201 Created``, the SDP answer, and
  ``Location: /v1/realtime/calls/<call_id>``; ``DELETE`` on that location (or ``POST .../hangup``, OpenAI's
  name) hangs up.
* ``POST /v1/realtime/client_secrets`` (JSON ``{"expires_after": {"anchor": "created_at", "seconds": N},
  "session": {...}}``, both optional): ``{"value": "ek_...", "expires_at": ..., "session": {...}}``, a key for
  one session (:mod:`s2s.server.client_secrets`).

Each refusal has its own status: 401 a wrong key, 403 a page of another site (as for the WebSocket), 415 not
SDP, 400 an SDP that cannot make a call, 503 a full server, 501 no aiortc, 404 no such call.
"""
from __future__ import annotations

import asyncio
import http
import json
import logging
from typing import Any, Protocol
from urllib.parse import parse_qs

from s2s.server import protocol
from s2s.server.client_log import quote
from s2s.server.client_secrets import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S, ClientSecrets
from s2s.server.front import HttpAnswer, HttpRequest, error_answer, json_answer
from s2s.server.handshake import PATH, presented_keys, refusal
from s2s.server.protocol import ClientEvent, ProtocolError
from s2s.server.session_update import parse_session_update
from s2s.server.settings import ServerSettings

log = logging.getLogger("s2s.server")
CALLS = PATH + "/calls"
SECRETS = PATH + "/client_secrets"
Status = http.HTTPStatus


class Host(Protocol):
    """What the endpoints need of the server (:class:`s2s.server.server.SessionServer`)."""

    settings: ServerSettings
    secrets: ClientSecrets
    pool: Any
    refused: int

    async def hold(self, link: Any, pipeline: Any, model: str, configs: list[dict[str, Any]]) -> None: ...


class HttpEndpoints:
    """Answers the requests the front (:mod:`s2s.server.front`) does not give to ``websockets``.

    Args:
        host: the server whose sessions the calls are.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.calls: dict[str, Any] = {}  # call id -> Call, until it is hung up or its session ends
        self._holding: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        """The server stops: every call ends as a WebSocket session does then (its session closes, bounded)."""
        for call in list(self.calls.values()):
            call.hang_up("server_stopping")
        if self._holding:
            await asyncio.wait(self._holding, timeout=30)

    async def __call__(self, request: HttpRequest) -> HttpAnswer:
        path = request.path.rstrip("/")
        call_id = path.removeprefix(CALLS + "/").removesuffix("/hangup") if path.startswith(CALLS + "/") else None
        if path not in (CALLS, SECRETS) and call_id is None:
            return error_answer(Status.NOT_FOUND, "not_found", f"no such endpoint {request.method} {path[:200]}; "
                                f"POST {CALLS} (WebRTC) and POST {SECRETS} take a body here")
        secrets = self.host.secrets if path == CALLS else None  # a secret opens a call; it mints no other
        if (refused := refusal(path, request.headers, self.host.settings, secrets)) is not None:
            return json_answer(*refused)
        allowed = "DELETE, POST" if call_id is not None else "POST"
        if request.method not in allowed.split(", ") or (request.method == "POST" and call_id is not None
                                                         and not path.endswith("/hangup")):
            return error_answer(Status.METHOD_NOT_ALLOWED, "method_not_allowed", f"{path[:200]} takes {allowed}",
                                (("Allow", allowed),))
        if call_id is not None:
            return self._hang_up(call_id)
        return await (self._call(request) if path == CALLS else self._secret(request))

    def _hang_up(self, call_id: str) -> HttpAnswer:
        call = self.calls.pop(call_id, None)  # gone at once: a second hang-up is a 404 while the session winds down
        if call is None:
            return error_answer(Status.NOT_FOUND, "call_not_found", f"no call {call_id[:80]!r} on this server (it "
                                                                    "has ended, or never was)")
        log.info("call %s: hung up by the client", call_id)
        call.hang_up()
        return HttpAnswer(Status.NO_CONTENT)

    async def _secret(self, request: HttpRequest) -> HttpAnswer:
        try:
            body = json.loads(request.body or b"{}")
            if not isinstance(body, dict):
                raise ProtocolError("invalid_request", "the body must be a JSON object")
            protocol.check_keys(body, {"expires_after", "session"}, "", None)
            ttl = _ttl(body.get("expires_after"))
            session = body.get("session")
            if session is not None:
                _check_session(session, self.host.settings)
        except ValueError as error:  # a ProtocolError or bad JSON
            message = error.message if isinstance(error, ProtocolError) else f"the body is not JSON: {error}"
            return error_answer(Status.BAD_REQUEST, getattr(error, "code", "invalid_json"), message)
        secret = self.host.secrets.mint(ttl, session)
        if secret is None:
            return error_answer(Status.TOO_MANY_REQUESTS, "too_many_client_secrets", f"{self.host.secrets.max_live} "
                                "client secrets are unused and unexpired; use some first")
        return json_answer(Status.OK, {"value": secret.value, "expires_at": secret.expires_at,
                                       "session": {"type": "realtime", "object": "realtime.session",
                                                   **(session or {})}})

    def _offer(self, request: HttpRequest) -> tuple[str, dict[str, Any] | None]:
        """The SDP offer, and the ``session`` config a multipart request (the ``openai`` SDK's) brings."""
        kind = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if kind == "application/sdp":
            parts = {"sdp": request.body}
        elif kind == "multipart/form-data":
            parts = _form(request.headers["Content-Type"], request.body)
            if "sdp" not in parts:
                raise ProtocolError("invalid_offer", "the form has no 'sdp' part (the offer)", "sdp")
        else:
            raise _Refused(Status.UNSUPPORTED_MEDIA_TYPE, "unsupported_content_type", f"a call's offer is "
                           f"'Content-Type: application/sdp' (or a multipart form with 'sdp' and 'session'), not "
                           f"{kind[:80]!r}")
        try:
            offer = parts["sdp"].decode("utf-8")
            session = json.loads(parts["session"]) if "session" in parts else None
        except ValueError as error:
            raise ProtocolError("invalid_offer", f"the offer or session is not UTF-8 text or JSON: {error}")
        if session is not None:
            _check_session(session, self.host.settings)
        return offer, session

    async def _call(self, request: HttpRequest) -> HttpAnswer:
        try:
            offer, session = self._offer(request)
        except _Refused as refused:
            return error_answer(refused.status, refused.code, refused.message)
        except ProtocolError as error:
            return error_answer(Status.BAD_REQUEST, error.code, error.message)
        try:
            from s2s.server.webrtc import BadOffer, Call
        except ImportError as error:
            return error_answer(Status.NOT_IMPLEMENTED, "webrtc_not_installed", f"WebRTC calls need aiortc "
                                f"({error}): pip install 's2s[webrtc]'")
        host = self.host
        pipeline = host.pool.acquire()
        if pipeline is None:
            host.refused += 1
            log.info("refused a call: all %d sessions are in use", host.settings.max_sessions)
            return error_answer(Status.SERVICE_UNAVAILABLE, "session_limit_reached", f"all "
                                f"{host.settings.max_sessions} sessions of this server are in use "
                                f"(server.max_sessions); try again later", (("Retry-After", "5"),))
        call = Call(protocol.new_id("rtc"), host.settings)
        try:
            answer = await call.answer(offer)
        except (BadOffer, TimeoutError) as error:
            host.pool.give_back(pipeline)
            await call.end("refused")
            if isinstance(error, TimeoutError):
                log.warning("call %s: no ICE candidates gathered in time (server.ice_servers)", call.id)
                return error_answer(Status.SERVICE_UNAVAILABLE, "ice_gathering_timeout", "the server could not "
                                    "gather its ICE candidates in time (server.ice_servers); try again later")
            log.info("refused a call: %s", quote(str(error)))
            return error_answer(Status.BAD_REQUEST, "invalid_offer", str(error))
        secret = host.secrets.take(presented_keys(request.headers))
        configs = [config for config in (secret.session if secret else None, session) if config]
        self.calls[call.id] = call
        task = asyncio.get_running_loop().create_task(
            self._hold(call, pipeline, parse_qs(request.query).get("model", ["s2s"])[0], configs))
        self._holding.add(task)
        task.add_done_callback(self._holding.discard)
        return HttpAnswer(Status.CREATED, answer.encode(), "application/sdp",
                          (("Location", f"{CALLS}/{call.id}"),))

    async def _hold(self, call: Any, pipeline: Any, model: str, configs: list[dict[str, Any]]) -> None:
        try:
            await self.host.hold(call, pipeline, model, configs)
        finally:
            self.calls.pop(call.id, None)


class _Refused(Exception):
    def __init__(self, status: Status, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _check_session(session: Any, settings: ServerSettings) -> None:
    """A session config that will be a session's first update, checked now: a bad one fails here, not later."""
    parse_session_update(ClientEvent("session.update", None, {"type": "session.update", "session": session}),
                         settings)


def _form(content_type: str, body: bytes) -> dict[str, bytes]:
    """The parts of a ``multipart/form-data`` body by name (the stdlib's MIME parser reads it)."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
                                                  + body)
    if not message.is_multipart():
        raise ProtocolError("invalid_offer", "the multipart form cannot be read (no boundary?)")
    return {part.get_param("name", header="content-disposition"): part.get_payload(decode=True) or b""
            for part in message.iter_parts() if part.get_param("name", header="content-disposition")}


def _ttl(expires_after: Any) -> int:
    if expires_after is None:
        return DEFAULT_TTL_S
    if not isinstance(expires_after, dict):
        raise ProtocolError("invalid_type", "'expires_after' must be an object", "expires_after")
    protocol.check_keys(expires_after, {"anchor", "seconds"}, "expires_after.", None)
    if expires_after.get("anchor", "created_at") != "created_at":
        raise ProtocolError("invalid_value", "'expires_after.anchor' must be 'created_at'", "expires_after.anchor")
    seconds = expires_after.get("seconds", DEFAULT_TTL_S)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise ProtocolError("invalid_value", f"'expires_after.seconds' must be an integer from {MIN_TTL_S} to "
                            f"{MAX_TTL_S}", "expires_after.seconds")
    return seconds
