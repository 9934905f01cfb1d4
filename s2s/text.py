"""Text helpers shared by LLM and TTS stages."""
from __future__ import annotations

import re
from collections.abc import Iterator

# A sentence ends at . ! ? (or CJK 。！？) followed by whitespace; "Dr. Smith" style splits are tolerated.
_BOUNDARY = re.compile(r"(?<=[.!?。！？])[\"')\]]*\s+|(?<=[。！？])")


class SentenceSplitter:
    """Accumulates streamed text and releases whole sentences as soon as they end.

    Args:
        min_chars: a sentence shorter than this is held back and joined to the next one, so TTS is not
            asked for single words ("Yes.") that sound clipped.
    """

    def __init__(self, min_chars: int = 12) -> None:
        self.min_chars = min_chars
        self._buffer = ""

    def feed(self, piece: str) -> Iterator[str]:
        self._buffer += piece
        start = 0
        for match in _BOUNDARY.finditer(self._buffer):
            candidate = self._buffer[start:match.end()].strip()
            if len(candidate) >= self.min_chars:
                yield candidate
                start = match.end()
        self._buffer = self._buffer[start:]

    def finish(self) -> Iterator[str]:
        rest, self._buffer = self._buffer.strip(), ""
        if rest:
            yield rest


def clean_for_speech(text: str) -> str:
    """Drop markdown and emoji that TTS would read out or choke on."""
    text = re.sub(r"[*_`#>|~]+", " ", text)
    text = re.sub(r"[\U0001F000-\U0001FAFF\u2600-\u27BF]", "", text)
    return re.sub(r"\s+", " ", text).strip()
