"""Speaks the user's words back: checks an audio setup without any language model."""
from __future__ import annotations

from collections.abc import Iterator

from s2s.llm.base import FIRST_CHUNK_MIN_WORDS, FIRST_CHUNK_WORDS, LLMStage
from s2s.llm.keywords import FirstChunkMinWords, FirstChunkWords, ReplyLanguage


class EchoLM(LLMStage):
    """Replies with the transcript itself, optionally prefixed.

    Args:
        prefix: text spoken before the echoed words.
        first_chunk_words: the first TTS chunk ends at a clause or after this many words (0: a whole sentence).
        first_chunk_min_words: a clause shorter than this does not end the first chunk.
        language, follow_user_language: what every LLM takes (conf/llm/_chat_base.yaml); an echo is in the
            user's own language already.
    """

    def __init__(self, prefix: str = "", first_chunk_words: FirstChunkWords = FIRST_CHUNK_WORDS,
                 first_chunk_min_words: FirstChunkMinWords = FIRST_CHUNK_MIN_WORDS,
                 language: ReplyLanguage = "en",
                 follow_user_language: bool = True) -> None:
        self.prefix = prefix
        self._init_chat(None, 0, first_chunk_words=first_chunk_words, first_chunk_min_words=first_chunk_min_words,
                        language=language, follow_user_language=follow_user_language)

    def stream(self, messages: list[dict[str, str]]) -> Iterator[str]:
        """The words back, as many as a turn's own token cap lets through (``count_tokens`` measures)."""
        text = f"{self.prefix} {messages[-1]['content']}".strip()
        cap, kept = self.reply_tokens(self.count_tokens(text)), []
        for word in text.split():
            if kept and self.count_tokens(" ".join([*kept, word])) > cap:
                break
            kept.append(word)
        yield text if len(kept) == len(text.split()) else " ".join(kept)
