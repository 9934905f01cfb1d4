"""Ephemeral client keys, as OpenAI's ``POST /v1/realtime/client_secrets`` mints them: pages never hold the key.

A program of the user's (their backend, holding ``server.api_key``) asks for a secret and hands its ``value``
(``ek_...``) to a browser or a phone, which connects with it as its Bearer key, over WebRTC or WebSocket. A
secret opens one session, before it expires, and reads or mints nothing; the session configuration it was minted
with (instructions, voice, turn detection, ...) is that session's first ``session.update``, so the backend sets
the start (the client's own ``session.update`` may still change what the allowlist lets it, as with OpenAI).
"""
from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

PREFIX = "ek_"  # @openai/agents-realtime's WebRTC transport refuses, in a browser, a key without it
DEFAULT_TTL_S = 600  # OpenAI's default; it allows 10 s to 2 hours
MIN_TTL_S, MAX_TTL_S = 10, 7200
MAX_LIVE = 10000  # unused secrets held at once; minting more is refused until some are used or expire


@dataclass(frozen=True)
class ClientSecret:
    """A minted key: its ``value``, when it stops opening sessions, and the session config it carries."""

    value: str
    expires_at: int
    session: dict[str, Any] | None


class ClientSecrets:
    """The secrets minted and not yet used or expired (this process's: a restart forgets them)."""

    def __init__(self, max_live: int = MAX_LIVE) -> None:
        self._live: dict[bytes, ClientSecret] = {}  # by the value's digest: a lookup takes the same time for any key
        self.max_live = max_live

    @staticmethod
    def _digest(value: str) -> bytes:
        return hashlib.sha256(value.encode()).digest()

    def _prune(self) -> None:
        now = time.time()
        self._live = {digest: secret for digest, secret in self._live.items() if secret.expires_at > now}

    def mint(self, ttl_s: int, session: dict[str, Any] | None) -> ClientSecret | None:
        """A new secret valid for ``ttl_s`` seconds; None when :attr:`max_live` unused ones are out already."""
        if len(self._live) >= self.max_live:
            self._prune()
            if len(self._live) >= self.max_live:
                return None
        secret = ClientSecret(PREFIX + secrets.token_urlsafe(32), int(time.time() + ttl_s), session)
        self._live[self._digest(secret.value)] = secret
        return secret

    def valid(self, value: str) -> bool:
        """``value`` is a secret that has neither expired nor opened a session yet."""
        secret = self._live.get(self._digest(value)) if value.startswith(PREFIX) else None
        return secret is not None and secret.expires_at > time.time()

    def take(self, values: list[str]) -> ClientSecret | None:
        """The first of ``values`` that is a valid secret, used up now (it opens this session and no other)."""
        for value in values:
            if self.valid(value):
                return self._live.pop(self._digest(value))
        return None
