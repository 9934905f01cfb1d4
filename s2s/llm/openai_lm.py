"""Any OpenAI-compatible server (vLLM, llama.cpp, Ollama, transformers serve, a hosted API) through ``openai``."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from s2s.config_errors import Range, ValidationContext
from s2s.llm.base import FIRST_CHUNK_MIN_WORDS, FIRST_CHUNK_WORDS, LLMStage, ReplyFailed
from s2s.llm.keywords import FirstChunkMinWords, FirstChunkWords, HistoryTokens, HistoryTurns, ReplyLanguage
from s2s.llm.tools import ToolCall, ToolResult, check_module, parse_arguments
from s2s.openai_api import cause, check_base_url, connect, detail
from s2s.stage import require


class OpenAILM(LLMStage):
    """Streams chat replies from an OpenAI-compatible server.

    Args:
        model: the model name the server knows.
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1`` for a local vLLM.
        api_key: sent as a bearer token; null sends a placeholder (local servers need none).
        api: ``chat_completions`` (``/chat/completions``, every server) or ``responses`` (``/responses``).
        temperature: sampling temperature; null leaves the server's default.
        max_tokens: reply length cap.
        reasoning_effort: how hard a reasoning model thinks before it answers (``reasoning_effort`` for chat
            completions, ``reasoning.effort`` for responses); null sends nothing (the server's default), which
            is also what a model without reasoning needs.
        timeout_s: how long to wait for the server to connect or send the next piece before the turn fails.
        system_prompt: the assistant's instructions.
        history_turns: how many previous exchanges the model sees.
        history_tokens: the previous exchanges the model sees stop at this many tokens (oldest dropped
            first, the system prompt never); null: only ``history_turns`` limits them.
        tools: an importable module with ``TOOLS`` and ``call_tool`` (trusted code), or null.
        first_chunk_words: the first TTS chunk ends at a clause or after this many words (0: a whole sentence).
        first_chunk_min_words: a clause shorter than this does not end the first chunk.
        language: the language replies are in (the system prompt's), as a Whisper code; null: unknown.
        follow_user_language: when a turn's transcript is in another language (the STT detected it), the
            system prompt asks for the reply in that language.
    """

    def __init__(self, model: str, base_url: str = "https://api.openai.com/v1", api_key: str | None = None,
                 api: Literal["chat_completions", "responses"] = "chat_completions",
                 temperature: Annotated[float, Range(0, 2)] | None = None,
                 max_tokens: Annotated[int, Range(1)] = 64,
                 reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None,
                 timeout_s: Annotated[float, Range(0, exclusive=True)] = 30.0, system_prompt: str | None = None,
                 history_turns: HistoryTurns = 4,
                 history_tokens: HistoryTokens = None, tools: str | None = None,
                 first_chunk_words: FirstChunkWords = FIRST_CHUNK_WORDS,
                 first_chunk_min_words: FirstChunkMinWords = FIRST_CHUNK_MIN_WORDS,
                 language: ReplyLanguage = "en",
                 follow_user_language: bool = True,
                 ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.api = api
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.reasoning_effort = reasoning_effort
        self.timeout_s = timeout_s
        self._init_chat(system_prompt, history_turns, tools, first_chunk_words, first_chunk_min_words,
                        history_tokens, language, follow_user_language)
        self._client: Any = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        check_base_url(kwargs["base_url"], context)
        check_module(kwargs["tools"], f"{context.group}.tools")

    def setup(self) -> None:
        openai = require("openai", backend="llm=openai", extra="openai")
        self._load_tools()
        self._client, served = connect(openai, self.base_url, self.api_key, self.timeout_s, "llm")
        self._check_model(openai, served)

    def _check_model(self, openai: Any, served: list[str]) -> None:
        """Fail now, in one line, if the server does not serve the model."""
        where = f"llm=openai at {self.base_url}"
        if self.model in served:
            return
        try:  # not listed (many servers list only some models): one token says whether it is served
            if self.api == "responses":
                self._client.responses.create(model=self.model, input="Hi", max_output_tokens=16)
            else:
                self._client.chat.completions.create(model=self.model, max_tokens=1,
                                                     messages=[{"role": "user", "content": "Hi"}])
        except openai.APIConnectionError as error:
            raise RuntimeError(f"{where}: the server stopped answering ({cause(error)})") from None
        except openai.APIStatusError as error:
            listed = f" (it lists: {', '.join(served[:10])})" if served else ""
            raise RuntimeError(f"{where}: model {self.model!r} is not served: HTTP {error.status_code}: "
                               f"{detail(error)}{listed}; check llm.model") from None

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str | ToolCall]:
        openai = require("openai", backend="llm=openai", extra="openai")
        try:
            if self.api == "responses":
                yield from self._stream_responses(messages)
            else:
                yield from self._stream_chat(messages)
        except openai.APIStatusError as error:
            raise ReplyFailed(f"llm=openai at {self.base_url} answered HTTP {error.status_code}: "
                              f"{detail(error)}") from error
        except openai.APIError as error:  # dropped connection, read timeout, an error event in the stream
            raise ReplyFailed(f"llm=openai at {self.base_url} failed mid-reply: {cause(error)}") from error

    def _stream_chat(self, messages: list[dict[str, Any]]) -> Iterator[str | ToolCall]:
        options: dict[str, Any] = {"max_tokens": self.max_tokens}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.reasoning_effort is not None:
            options["reasoning_effort"] = self.reasoning_effort
        if self._toolbox:
            options["tools"] = self._toolbox.definitions
        stream = self._client.chat.completions.create(model=self.model, messages=messages, stream=True, **options)
        calls: dict[int, dict[str, str]] = {}
        try:  # closing the response when the runner closes this generator cancels the request
            for chunk in stream:
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                if delta.content:
                    yield delta.content
                for call in delta.tool_calls or ():  # arrives in pieces, keyed by index
                    entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] = call.id or entry["id"]
                    if call.function:
                        entry["name"] += call.function.name or ""
                        entry["arguments"] += call.function.arguments or ""
        finally:
            stream.close()
        for index, entry in sorted(calls.items()):
            yield parse_arguments(entry["name"], entry["arguments"], entry["id"] or f"call_{index}")

    def _stream_responses(self, messages: list[dict[str, Any]]) -> Iterator[str | ToolCall]:
        options: dict[str, Any] = {"max_output_tokens": self.max_tokens}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.reasoning_effort is not None:
            options["reasoning"] = {"effort": self.reasoning_effort}
        if self._toolbox:
            options["tools"] = self._toolbox.responses_definitions()
        stream = self._client.responses.create(model=self.model, input=messages, stream=True, **options)
        try:
            for event in stream:
                if event.type == "response.output_text.delta":
                    yield event.delta
                elif event.type == "response.output_item.done" and event.item.type == "function_call":
                    yield parse_arguments(event.item.name, event.item.arguments, event.item.call_id)
                elif event.type in ("error", "response.failed"):
                    raise ReplyFailed(f"llm=openai at {self.base_url} reported {event.type}: "
                                      f"{getattr(event, 'message', None) or event.response.error}")
        finally:
            stream.close()

    def tool_messages(self, calls: list[ToolCall], results: list[ToolResult]) -> list[dict[str, Any]]:
        if self.api != "responses":
            return super().tool_messages(calls, results)
        return [*({"type": "function_call", "call_id": call.id, "name": call.name,
                   "arguments": json.dumps(call.arguments)} for call in calls),
                *({"type": "function_call_output", "call_id": result.call.id, "output": result.output}
                  for result in results)]

    def warm_up(self) -> None:
        """Nothing: the setup check already made the server load the model."""

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "base_url": self.base_url, "api": self.api,
                **({"reasoning_effort": self.reasoning_effort} if self.reasoning_effort else {}),
                **({"tools": self.tools} if self.tools else {})}
