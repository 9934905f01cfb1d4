"""A local OpenAI-compatible chat-completions endpoint over one of our LLM stages, for the pipecat comparison.

``python -m s2s.bench pipecat`` points pipecat's ``OpenAILLMService`` at it, so both pipelines run the same model
with the same settings (the composed ``llm`` group: SmolLM2 on CTranslate2 int8 by default, its system prompt,
``max_new_tokens``, greedy decoding, repetition penalty and confidence hedge). It serves ``POST
/v1/chat/completions`` (streamed as server-sent events, or whole) and ``GET /v1/models`` on 127.0.0.1 only, one
generation at a time, with the standard library's ``http.server``. The messages are rendered as sent; the
request's sampling keys (temperature, max tokens) are ignored: the stage's own apply, as in our pipeline.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 1 << 20  # a chat request of a voice turn is a few kilobytes
MODEL_ID = "s2s-local"


def text_of(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def completion_chunks(pieces: Iterator[Any], request_id: str, model: str,
                      usage: bool) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply: a role chunk, one per piece of text, the
    finish reason (``length`` when the stage says the cap cut the reply), then the usage (when asked)."""
    from s2s.llm.calibration import Capped
    from s2s.usage import Usage

    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    finish, counted = "stop", None
    for piece in pieces:
        if isinstance(piece, str):
            if piece:
                yield chunk({"content": piece})
        elif isinstance(piece, Capped):
            finish = "length"
        elif isinstance(piece, Usage):
            counted = piece
    yield chunk({}, finish)
    if usage:
        prompt, completion = (counted.input_tokens, counted.output_tokens) if counted else (0, 0)
        yield {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                        "total_tokens": prompt + completion}}


class ChatServer:
    """``stage`` (a set-up LLM stage with ``stream(messages)``) behind a chat-completions endpoint.

    Use as a context manager: the server listens on 127.0.0.1 (port 0: a free one) from ``__enter__`` and is shut
    down, its thread joined, on ``__exit__``.
    """

    def __init__(self, stage: Any, port: int = 0) -> None:
        self.stage = stage
        self.requests = 0
        self.last_messages: list[dict[str, str]] = []  # what the last request asked: the benchmark keeps it
        self._lock = threading.Lock()  # one generation at a time, as our pipeline's LLM stage runs
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="chat-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether no generation is running, waiting up to ``timeout_s`` for one to end (a client that went away
        stops its generation at the next piece it is sent)."""
        if self._lock.acquire(timeout=timeout_s):
            self._lock.release()
            return True
        return False

    def reply(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The chunks answering one request body (the caller holds no lock: this one does)."""
        messages = [{"role": str(message.get("role", "user")), "content": text_of(message.get("content"))}
                    for message in body.get("messages") or [] if isinstance(message, dict)]
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        request_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        with self._lock:
            self.requests += 1
            self.last_messages = messages
            pieces = self.stage.stream(messages)
            try:
                yield from completion_chunks(pieces, request_id, str(body.get("model") or MODEL_ID), usage)
            finally:
                pieces.close()  # a client that went away stops the generation

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet: the benchmark prints its own
                pass

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path.rstrip("/") == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model",
                                                                 "owned_by": "s2s"}]})
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= MAX_BODY:
                    self._json(413 if length else 411, {"error": {"message": "a JSON body up to 1 MiB"}})
                    return
                try:
                    body = json.loads(self.rfile.read(length))
                    assert isinstance(body, dict)
                except (ValueError, AssertionError):
                    self._json(400, {"error": {"message": "the body is not a JSON object"}})
                    return
                if not body.get("stream"):
                    self._whole(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunks = server.reply(body)
                try:
                    for chunk in chunks:
                        self._send(f"data: {json.dumps(chunk)}\n\n")
                    self._send("data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    chunks.close()

            def _send(self, text: str) -> None:
                data = text.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _whole(self, body: dict[str, Any]) -> None:
                text, finish, usage, request_id, model = [], "stop", None, "", MODEL_ID
                for chunk in server.reply({**body, "stream_options": {"include_usage": True}}):
                    request_id, model = chunk["id"], chunk["model"]
                    for choice in chunk["choices"]:
                        text.append(choice["delta"].get("content") or "")
                        finish = choice["finish_reason"] or finish
                    usage = chunk.get("usage") or usage
                self._json(200, {"id": request_id, "object": "chat.completion", "created": int(time.time()),
                                 "model": model, "usage": usage,
                                 "choices": [{"index": 0, "finish_reason": finish,
                                              "message": {"role": "assistant", "content": "".join(text)}}]})

        return Handler
