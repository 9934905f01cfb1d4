"""Fixed sentences as reply text: they feed a TTS directly (``experiment=tts_benchmark``), no microphone or LLM."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from s2s.config_errors import ValidationContext
from s2s.messages import Message, ReplyText, TurnEnd
from s2s.stage import Source


class SentenceSource(Source):
    """Emits each sentence as the whole reply of one turn: ``ReplyText(text, turn=i)`` then ``TurnEnd(i)``.

    Args:
        sentences: the texts to speak, one turn each.
        language: language code passed to the TTS with each sentence (null: the TTS's own default).
    """

    emits = (ReplyText,)

    def __init__(self, sentences: list[str], language: str | None = "en") -> None:
        self.sentences = [str(sentence) for sentence in sentences]
        self.language = language

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        sentences = kwargs["sentences"]
        if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
            raise context.error("sentences", sentences, "a non-empty list of non-empty strings")

    def stream(self) -> Iterator[Message]:
        for turn, text in enumerate(self.sentences):
            yield ReplyText(text, turn, self.language)
            yield TurnEnd(turn)

    def describe(self) -> dict[str, Any]:
        return {"sentences": len(self.sentences), "language": self.language}
