"""Shared behaviour of LLM stages: chat history, sentence streaming, timing."""
from __future__ import annotations

import time
from collections.abc import Iterator

from s2s.messages import Data, Message, Metric, ReplyText, Transcript, TurnEnd
from s2s.text import SentenceSplitter, clean_for_speech


class LLMStage:
    """Mixin for LLM stages: subclasses implement ``stream(messages)`` yielding text pieces.

    ``process`` keeps the last ``history_turns`` exchanges, releases the reply sentence by sentence as it
    streams (so TTS starts before the LLM ends), reports the time to first token and ends the turn.
    """

    accepts = (Transcript,)
    emits = (ReplyText,)
    system_prompt: str | None
    history_turns: int

    def _init_chat(self, system_prompt: str | None, history_turns: int) -> None:
        self.system_prompt = system_prompt
        self.history_turns = history_turns
        self._history: list[dict[str, str]] = []

    def reset(self) -> None:
        self._history = []

    def stream(self, messages: list[dict[str, str]]) -> Iterator[str]:
        raise NotImplementedError

    def chat_messages(self, user_text: str) -> list[dict[str, str]]:
        window = self._history[-2 * self.history_turns:] if self.history_turns > 0 else []
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, *window, {"role": "user", "content": user_text}]

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, Transcript)
        start = time.perf_counter()
        splitter, reply, first = SentenceSplitter(), [], True
        pieces = self.stream(self.chat_messages(message.text))
        try:
            for piece in pieces:
                if first and piece.strip():
                    first = False
                    yield Metric(message.turn, "llm_first_token_s", time.perf_counter() - start)
                reply.append(piece)
                for sentence in splitter.feed(piece):
                    if spoken := clean_for_speech(sentence):
                        yield ReplyText(spoken, message.turn, message.language)
            for sentence in splitter.finish():
                if spoken := clean_for_speech(sentence):
                    yield ReplyText(spoken, message.turn, message.language)
        finally:
            pieces.close()  # type: ignore[attr-defined]  - stops generation when the runner cancels
        self._history += [{"role": "user", "content": message.text},
                          {"role": "assistant", "content": "".join(reply).strip()}]
        yield TurnEnd(message.turn)
