"""Speaks the user's words back: checks an audio setup without any language model."""
from __future__ import annotations

from collections.abc import Iterator

from s2s.llm.base import LLMStage
from s2s.stage import Stage


class EchoLM(LLMStage, Stage):
    """Replies with the transcript itself, optionally prefixed.

    Args:
        prefix: text spoken before the echoed words.
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._init_chat(None, 0)

    def stream(self, messages: list[dict[str, str]]) -> Iterator[str]:
        yield f"{self.prefix} {messages[-1]['content']}".strip()
