"""Chat models through mlx-lm (Metal on Apple silicon; ``mlx[cpu]`` elsewhere), streamed token by token."""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Annotated, Any

from s2s.config_errors import Range, ValidationContext
from s2s.llm.base import FIRST_CHUNK_MIN_WORDS, FIRST_CHUNK_WORDS, LLMStage
from s2s.llm.chat_template import check_thinking, thinking_error
from s2s.llm.keywords import (CompactHistory, FirstChunkMinWords, FirstChunkWords, HistoryTokens, HistoryTurns,
                              MaxNewTokens, ReplyLanguage, Temperature, Thinking)
from s2s.llm.tools import TemplateTools, ToolCall, ToolCallFilter, check_module
from s2s.models import loadable, model_folder_error
from s2s.runtimes import Runtime
from s2s.stage import require
from s2s.usage import Usage

log = logging.getLogger(__name__)


class MLXLM(TemplateTools, LLMStage):
    """A chat model run by ``mlx_lm.stream_generate``; closing the reply stops generation at the next token.

    Args:
        model: an mlx-community hub id (``mlx-community/Qwen2.5-0.5B-Instruct-4bit``) or a local folder
            (MLX or plain transformers safetensors of a supported architecture).
        system_prompt: the assistant's instructions.
        max_new_tokens: reply length cap.
        history_turns: how many previous exchanges the model sees.
        history_tokens: the previous exchanges the model sees stop at this many tokens (oldest dropped
            first, the system prompt never); null: only ``history_turns`` limits them.
        compact_history: exchanges past that budget are summarised by the model, after a reply, into a note
            at the end of the system prompt, instead of being dropped (:mod:`s2s.compaction`).
        thinking: ``enable_thinking`` for the chat template of a thinking model (Qwen3); null: the model's own
            default. Reasoning is never spoken.
        temperature: 0 decodes greedily (reproducible); above 0 samples.
        top_p: nucleus sampling when temperature > 0 (0 turns it off).
        tools: an importable module with ``TOOLS`` and ``call_tool`` (trusted code), or null.
        first_chunk_words: the first TTS chunk ends at a clause or after this many words (0: a whole sentence).
        first_chunk_min_words: a clause shorter than this does not end the first chunk.
        language: the language replies are in (the system prompt's), as a Whisper code; null: unknown.
        follow_user_language: when a turn's transcript is in another language (the STT detected it), the
            system prompt asks for the reply in that language.
    """

    requires = Runtime("mlx", option="mlx_lm", instead="llm=transformers")

    def __init__(self, model: str = "mlx-community/Qwen2.5-0.5B-Instruct-4bit", system_prompt: str | None = None,
                 max_new_tokens: MaxNewTokens = 64, history_turns: HistoryTurns = 4,
                 history_tokens: HistoryTokens = None,
                 temperature: Temperature = 0.0, top_p: Annotated[float, Range(0, 1)] = 0.0,
                 tools: str | None = None, first_chunk_words: FirstChunkWords = FIRST_CHUNK_WORDS,
                 first_chunk_min_words: FirstChunkMinWords = FIRST_CHUNK_MIN_WORDS,
                 language: ReplyLanguage = "en",
                 follow_user_language: bool = True, compact_history: CompactHistory = False,
                 thinking: Thinking = None) -> None:
        self.model_name = model
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self._init_chat(system_prompt, history_turns, tools, first_chunk_words, first_chunk_min_words,
                        history_tokens, language, follow_user_language, compact_history, thinking)
        self._model: Any = None
        self._tokenizer: Any = None
        self._step = threading.Lock()  # MLX is not thread-safe: a summary and a reply take turns, a token each

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if error := model_folder_error(kwargs["model"], context, "mlx-community/Qwen2.5-0.5B-Instruct-4bit") or \
                thinking_error(kwargs["thinking"], kwargs["model"], context):
            raise error
        check_module(kwargs["tools"], f"{context.group}.tools")

    def count_tokens(self, text: str) -> int:
        if self._tokenizer is None:  # before setup: the estimate
            return super().count_tokens(text)
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def setup(self) -> None:
        mlx_lm = require("mlx_lm", backend="llm=mlx_lm", extra="mlx")
        self._load_tools()
        self._model, self._tokenizer = mlx_lm.load(loadable(self.model_name))
        check_thinking(self.thinking, self._tokenizer.chat_template, "llm")

    def warm_up(self) -> None:
        for _ in zip(range(2), self.stream([{"role": "user", "content": "Hi"}])):
            pass

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str | ToolCall | Usage]:
        prompt = self._tokenizer.apply_chat_template(self._with_tools(messages), add_generation_prompt=True,
                                                     tokenize=False, **self._template_tools(),
                                                     **self.template_switches())
        calls = ToolCallFilter() if self._toolbox else None  # takes <tool_call> out of the spoken text
        for piece in self._generate(prompt, self.reply_tokens(self.max_new_tokens)):
            if calls is None or isinstance(piece, Usage):
                yield piece
            else:
                yield from calls.feed(piece)
        if calls is not None:
            yield from calls.finish()
            yield from calls.calls

    def complete(self, messages: list[dict[str, Any]], max_tokens: int) -> Iterator[str | Usage]:
        yield from self._generate(self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.template_switches()), max_tokens)

    def _generate(self, prompt: str, max_tokens: int) -> Iterator[str | Usage]:
        """The generated text as it comes, then the ``Usage`` (mlx-lm's own counts: the end token included)."""
        import mlx_lm
        from mlx_lm.sample_utils import make_sampler

        sampler = make_sampler(temp=self.temperature, top_p=self.top_p)
        generation = mlx_lm.stream_generate(self._model, self._tokenizer, prompt, max_tokens=max_tokens,
                                            sampler=sampler)
        last = None
        try:  # one thread: closing this generator closes stream_generate, which stops at the next token
            while True:
                with self._step:
                    response = next(generation, None)
                if response is None:
                    break
                last = response
                if response.text:
                    yield response.text
        finally:
            with self._step:
                generation.close()
        if last is not None:
            yield Usage(last.prompt_tokens, last.generation_tokens)

    def close(self) -> None:
        super().close()  # a summary being written stops first
        self._model = self._tokenizer = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": "mlx (Metal on Apple silicon, else CPU)",
                **({"tools": self.tools} if self.tools else {})}
