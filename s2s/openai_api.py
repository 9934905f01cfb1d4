"""What the OpenAI-API backends (llm=openai, stt=openai, tts=openai) share: the URL rule, the client, errors.

Imported by ``s2s.llm.openai_lm``, ``s2s.stt.openai_stt`` and ``s2s.tts.openai_tts``; it imports no stage, so no
backend reaches into another's module. The ``openai`` package itself is passed in by the caller (imported in its
``setup``).
"""
from __future__ import annotations

import logging
from typing import Any

from s2s.config_errors import ValidationContext

log = logging.getLogger(__name__)
NO_KEY = "no-key"  # local servers ignore the key, but the SDK refuses to start without one


def check_base_url(base_url: Any, context: ValidationContext) -> None:
    """An OpenAI-compatible server's API root must be an http(s) URL."""
    if isinstance(base_url, str) and not base_url.startswith(("http://", "https://")):
        raise context.error("base_url", base_url, "an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1")


def connect(openai: Any, base_url: str, api_key: str | None, timeout_s: float, group: str) -> tuple[Any, list[str]]:
    """An ``openai.OpenAI`` client and the models the server lists.

    Args:
        openai: the imported ``openai`` package.
        base_url: the server's API root.
        api_key: the bearer token; None sends a placeholder (local servers need none).
        timeout_s: connect and read timeout of every request; the client never retries.
        group: the config group (``llm``, ``stt``, ``tts``) the errors name.

    Returns:
        The client, and the model ids ``GET /models`` lists (empty when the server has no model list: the
        caller then probes its model).

    Raises:
        RuntimeError: one line when no server answers or it refuses the key.
    """
    where = f"{group}=openai at {base_url}"
    client = openai.OpenAI(base_url=base_url, api_key=api_key or NO_KEY, timeout=timeout_s, max_retries=0)
    try:
        return client, [model.id for model in client.models.list()]
    except openai.APIConnectionError as error:
        client.close()
        raise RuntimeError(f"{where}: no server answered ({cause(error)}); check {group}.base_url") from None
    except (openai.AuthenticationError, openai.PermissionDeniedError) as error:
        client.close()
        raise RuntimeError(f"{where}: the server refused the API key (HTTP {error.status_code}: "
                           f"{detail(error)}); set OPENAI_API_KEY or {group}.api_key") from None
    except openai.APIStatusError as error:  # some servers have no model list: the caller probes the model
        log.debug("%s: GET /models answered HTTP %s", where, error.status_code)
        return client, []


def detail(error: Any) -> str:
    """The server's own message from an error body, else the SDK's, on one line."""
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        text = str(message or body)
    else:
        text = str(getattr(error, "message", error))
    return " ".join(text.split())[:300]


def cause(error: BaseException) -> str:
    """The low-level reason under an SDK error (ConnectError, ReadTimeout, RemoteProtocolError...), on one line."""
    inner = error.__cause__ or error.__context__
    text = f"{type(inner).__name__}: {inner}" if inner else f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:300]
