"""Any OpenAI-compatible server (vLLM, llama.cpp, Ollama, transformers serve, a hosted API) through ``openai``."""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from s2s import audio
from s2s.config_errors import Range, ValidationContext
from s2s.llm.base import FIRST_CHUNK_MIN_WORDS, FIRST_CHUNK_WORDS, LLMStage, ReplyFailed
from s2s.llm.keywords import (CompactHistory, FirstChunkMinWords, FirstChunkWords, HistoryTokens, HistoryTurns,
                              ReplyLanguage, Thinking)
from s2s.llm.tools import ToolCall, ToolResult, check_module, parse_arguments
from s2s.messages import SpeechSegment, Transcript
from s2s.openai_api import cause, check_base_url, connect, detail
from s2s.stage import require
from s2s.usage import Usage

OPENAI_HOST = "api.openai.com"  # OpenAI's own API: no chat template, so no chat_template_kwargs
AUDIO_RATE = 16000  # what utterances are sent at (the pipeline's rate; audio models resample to their own)


class OpenAILM(LLMStage):
    """Streams chat replies from an OpenAI-compatible server.

    With ``stt=none`` it hears the user itself: each utterance goes as a WAV in an ``input_audio`` content part
    of the user message (Chat Completions; the model must take audio: OpenAI's ``gpt-audio`` family, or a local
    server's Qwen2-Audio, Voxtral, Qwen2.5-Omni, Phi-4-multimodal, ...). Only the current turn carries audio: the
    history keeps :data:`~s2s.llm.base.SPOKEN_TURN` and the reply for each earlier utterance.

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
        compact_history: exchanges past that budget are summarised by the model, after a reply, into a note
            at the end of the system prompt, instead of being dropped (:mod:`s2s.compaction`).
        thinking: ``enable_thinking`` for a thinking model's chat template on servers that render one (vLLM,
            SGLang, llama.cpp, transformers serve), sent as chat completions' ``chat_template_kwargs``; null sends
            nothing. OpenAI's own API and the Responses API have none (``reasoning_effort`` is their switch).
            Reasoning is never spoken.
        tools: an importable module with ``TOOLS`` and ``call_tool`` (trusted code), or null.
        first_chunk_words: the first TTS chunk ends at a clause or after this many words (0: a whole sentence).
        first_chunk_min_words: a clause shorter than this does not end the first chunk.
        language: the language replies are in (the system prompt's), as a Whisper code; null: unknown.
        follow_user_language: when a turn's transcript is in another language (the STT detected it), the
            system prompt asks for the reply in that language.
    """

    on_cores = False  # it waits on the network: never in a server's turn order

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
                 follow_user_language: bool = True, compact_history: CompactHistory = False,
                 thinking: Thinking = None,
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
                        history_tokens, language, follow_user_language, compact_history, thinking)
        self._client: Any = None

    accepts = (Transcript, SpeechSegment)

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        check_base_url(kwargs["base_url"], context)
        check_module(kwargs["tools"], f"{context.group}.tools")
        if SpeechSegment in context.fed:  # stt=none: the audio itself comes here
            if kwargs["api"] != "chat_completions":
                raise context.error("api", kwargs["api"], "chat_completions with stt=none (the audio goes as "
                                    "Chat Completions input_audio parts)")
            if urlsplit(str(kwargs["base_url"])).hostname == OPENAI_HOST and "audio" not in kwargs["model"]:
                raise context.error("model", kwargs["model"], f"a model that takes audio with stt=none on "
                                    f"{OPENAI_HOST}, e.g. gpt-audio, gpt-audio-mini or gpt-4o-mini-audio-preview")
        if kwargs["thinking"] is None:
            return
        shown = str(kwargs["thinking"]).lower()
        if kwargs["reasoning_effort"] is not None:
            raise context.error("thinking", shown, f"null while reasoning_effort is set "
                                f"({kwargs['reasoning_effort']}): one switch for a model's reasoning, not two")
        if kwargs["api"] == "responses":
            raise context.error("thinking", shown, "null with api=responses: servers take chat_template_kwargs on "
                                "chat completions only (the Responses API's switch is reasoning_effort)")
        if urlsplit(str(kwargs["base_url"])).hostname == OPENAI_HOST:
            raise context.error("thinking", shown, f"null for {OPENAI_HOST}: it renders no chat template; its "
                                "reasoning models take llm.reasoning_effort")

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

    def user_content(self, message: Transcript | SpeechSegment) -> str | list[dict[str, Any]]:
        """A transcript's words, or an utterance as one ``input_audio`` part: a base64 16-bit WAV."""
        if isinstance(message, Transcript):
            return message.text
        wav = audio.wav_bytes(audio.resample(message.samples, message.sample_rate, AUDIO_RATE), AUDIO_RATE)
        return [{"type": "input_audio",
                 "input_audio": {"data": base64.b64encode(wav).decode("ascii"), "format": "wav"}}]

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str | ToolCall | Usage]:
        yield from self._streamed(messages, self.reply_tokens(self.max_tokens), tools=True)

    def complete(self, messages: list[dict[str, Any]], max_tokens: int) -> Iterator[str | Usage]:
        for piece in self._streamed(messages, max_tokens, tools=False):
            if not isinstance(piece, ToolCall):
                yield piece

    def _streamed(self, messages: list[dict[str, Any]], max_tokens: int,
                  tools: bool) -> Iterator[str | ToolCall | Usage]:
        openai = require("openai", backend="llm=openai", extra="openai")
        try:
            if self.api == "responses":
                yield from self._stream_responses(messages, max_tokens, tools)
            else:
                yield from self._stream_chat(messages, max_tokens, tools)
        except openai.APIStatusError as error:
            raise ReplyFailed(f"llm=openai at {self.base_url} answered HTTP {error.status_code}: "
                              f"{detail(error)}") from error
        except openai.APIError as error:  # dropped connection, read timeout, an error event in the stream
            raise ReplyFailed(f"llm=openai at {self.base_url} failed mid-reply: {cause(error)}") from error

    def _stream_chat(self, messages: list[dict[str, Any]], max_tokens: int,
                     tools: bool) -> Iterator[str | ToolCall | Usage]:
        options: dict[str, Any] = {"max_tokens": max_tokens}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.thinking is not None:  # not an OpenAI parameter: the SDK sends it in the body as it is
            options["extra_body"] = {"chat_template_kwargs": {"enable_thinking": self.thinking}}
        if self.reasoning_effort is not None:
            options["reasoning_effort"] = self.reasoning_effort
        if self._toolbox and tools:
            options["tools"] = self._toolbox.definitions
        stream = self._client.chat.completions.create(model=self.model, messages=messages, stream=True,
                                                      stream_options={"include_usage": True}, **options)
        calls: dict[int, dict[str, str]] = {}
        usage = None
        try:  # closing the response when the runner closes this generator cancels the request
            for chunk in stream:
                if chunk.usage is not None:  # the last chunk (OpenAI sends it with no choices)
                    usage = chunk.usage
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
        if usage is not None:
            details = usage.prompt_tokens_details
            yield Usage(usage.prompt_tokens, usage.completion_tokens, details and details.cached_tokens)

    def _stream_responses(self, messages: list[dict[str, Any]], max_tokens: int,
                          tools: bool) -> Iterator[str | ToolCall | Usage]:
        options: dict[str, Any] = {"max_output_tokens": max_tokens}
        if self.temperature is not None:
            options["temperature"] = self.temperature
        if self.reasoning_effort is not None:
            options["reasoning"] = {"effort": self.reasoning_effort}
        if self._toolbox and tools:
            options["tools"] = self._toolbox.responses_definitions()
        stream = self._client.responses.create(model=self.model, input=messages, stream=True, **options)
        usage = None
        try:
            for event in stream:
                if event.type == "response.completed":
                    usage = event.response.usage
                elif event.type == "response.output_text.delta":
                    yield event.delta
                elif event.type == "response.output_item.done" and event.item.type == "function_call":
                    yield parse_arguments(event.item.name, event.item.arguments, event.item.call_id)
                elif event.type in ("error", "response.failed"):
                    raise ReplyFailed(f"llm=openai at {self.base_url} reported {event.type}: "
                                      f"{getattr(event, 'message', None) or event.response.error}")
        finally:
            stream.close()
        if usage is not None:
            details = usage.input_tokens_details
            yield Usage(usage.input_tokens, usage.output_tokens, details and details.cached_tokens)

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
        super().close()  # a summary being written stops first
        if self._client is not None:
            self._client.close()
        self._client = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "base_url": self.base_url, "api": self.api,
                **({"reasoning_effort": self.reasoning_effort} if self.reasoning_effort else {}),
                **({"thinking": self.thinking} if self.thinking is not None else {}),
                **({"tools": self.tools} if self.tools else {})}
