"""Text helpers shared by LLM and TTS stages."""
from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator
from typing import Any

# A character after which a sentence may end: only pieces near one are worth re-segmenting.
_CANDIDATE = re.compile(r"[.!?。！？…]")
_CJK_END = "。！？"
# The first chunk may end at a clause: a word ending in one of these (closing quotes and brackets aside).
_CLAUSE_END = re.compile(r"[,;:—–][\"')\]”’]*$")
_WORD = re.compile(r"\S+")
_LOCAL = threading.local()  # a pysbd Segmenter keeps the text being segmented on itself: one per thread


def _segmenter() -> Any:
    """pysbd's English rules (abbreviations, numbers, initials, ellipses, CJK full stops), built once per thread."""
    segmenter = getattr(_LOCAL, "segmenter", None)
    if segmenter is None:
        import pysbd

        segmenter = _LOCAL.segmenter = pysbd.Segmenter(language="en", clean=False)
    return segmenter


def sentence_ends(text: str, final: bool = False) -> list[int]:
    """Offsets in ``text`` where a sentence ends (trailing whitespace excluded), in order.

    Args:
        text: streamed text so far.
        final: the text is complete, so its last sentence ends too. Otherwise the last sentence may still
            grow, and a boundary only counts once the next sentence has begun after whitespace (or after a
            CJK full stop): "U.S." or "3." alone at the end of a stream decide nothing.
    """
    ends, position = [], 0
    for segment in _segmenter().segment(text):
        found = text.find(segment, position)
        if found < 0:  # pysbd keeps the text with clean=False; be safe if it ever does not
            break
        position = found + len(segment)
        ends.append(len(text[:position].rstrip()))
    ends = [end for end in ends if end > 0]
    if final:
        return ends
    confirmed = []
    for end in ends[:-1] if ends and ends[-1] >= len(text.rstrip()) else ends:
        rest = text[end:]
        if (rest[:1].isspace() and rest.strip()) or (text[end - 1] in _CJK_END and rest):
            confirmed.append(end)
    return confirmed


def normalise(sentence: str) -> str:
    """Lower case, punctuation and spacing dropped: how two sentences are compared for repetition."""
    return re.sub(r"[\W_]+", " ", sentence.lower()).strip()


class SentenceSplitter:
    """Accumulates streamed text and releases it in chunks for TTS: a short first chunk, then whole sentences.

    Sentence ends come from pysbd run over the unreleased buffer, so "Dr.", "U.S.", "e.g." and "$3.50" do not
    end a sentence; every segment but the last (which may still grow) is released. The buffer is only
    re-segmented when the new piece, or the few characters before it, hold a character that can end a
    sentence, so a token costs a regex search and, near a full stop, one segmentation of about a sentence.

    Args:
        min_chars: a sentence shorter than this is held back and joined to the next one, so TTS is not
            asked for single words ("Yes.") that sound clipped.
        first_chunk_words: the first chunk of a reply ends after this many words, or earlier at the first
            clause (, ; : —) or sentence end, so the first audio comes early; 0 makes it a whole sentence.
        first_chunk_min_words: a clause or sentence end before this many words does not end the first
            chunk ("Yes," alone sounds clipped).
        stop_on_repeat: a sentence identical (after ``normalise``) to an earlier one of this reply is not
            released, nor anything after it, and ``repeated`` becomes true: the reply is looping.
    """

    def __init__(self, min_chars: int = 12, first_chunk_words: int = 0, first_chunk_min_words: int = 3,
                 stop_on_repeat: bool = False) -> None:
        self.min_chars = min_chars
        self.first_chunk_words = first_chunk_words
        self.first_chunk_min_words = first_chunk_min_words
        self.stop_on_repeat = stop_on_repeat
        self.repeated = False
        self._buffer = ""  # text not yet released as whole sentences
        self._spoken = 0  # leading characters of the buffer already released as the first chunk
        self._first = first_chunk_words > 0
        self._seen: set[str] = set()
        self._kept: list[str] = []  # raw text released (or due to be) before any repeat

    @property
    def text(self) -> str:
        """The raw reply as kept: everything fed, or up to the repeated sentence once ``repeated`` is set."""
        return "".join(self._kept) + ("" if self.repeated else self._buffer)

    def feed(self, piece: str) -> Iterator[str]:
        if self.repeated or not piece:
            return
        before = len(self._buffer)
        self._buffer += piece
        near = _CANDIDATE.search(self._buffer, max(0, before - 4))
        ends = sentence_ends(self._buffer) if near else []
        if self._first:
            cut = self._first_cut(ends)
            if cut is not None:
                self._first = False
                if chunk := self._buffer[:cut].strip():
                    self._spoken = cut
                    yield chunk
        yield from self._release(ends)

    def finish(self) -> Iterator[str]:
        if self.repeated:
            return
        if self._buffer.strip():
            yield from self._release(sentence_ends(self._buffer, final=True), final=True)
        if not self.repeated and (rest := self._buffer[self._spoken:].strip()):  # text no segment covered
            self._kept.append(self._buffer)
            yield rest
        self._buffer, self._spoken = "", 0

    def _first_cut(self, ends: list[int]) -> int | None:
        """Where the first chunk ends: a clause or sentence end after enough words, else the N-th word."""
        for count, word in enumerate(_WORD.finditer(self._buffer), start=1):
            if word.end() >= len(self._buffer):
                return None  # the word may still grow
            if count >= self.first_chunk_words:
                return word.end()
            if count >= self.first_chunk_min_words and (_CLAUSE_END.search(word.group()) or word.end() in ends):
                return word.end()
        return None

    def _release(self, ends: list[int], final: bool = False) -> Iterator[str]:
        start = 0  # start of the sentences not yet released
        for index, end in enumerate(ends):
            if end <= self._spoken:  # the first chunk ended exactly here
                if self._repeats(self._buffer[start:end]):
                    return
                self._kept.append(self._buffer[start:end])
                start = end
                continue
            last = final and index == len(ends) - 1
            rest_of_first = start < self._spoken  # the sentence began in the first chunk: its end goes on its own
            if len(self._buffer[max(start, self._spoken):end].strip()) < self.min_chars and not (last or rest_of_first):
                continue  # too short alone: joined to the next sentence
            sentences = [start, *(e for e in ends[:index] if e > start), end]
            for a, b in itertools.pairwise(sentences):
                if self._repeats(self._buffer[a:b]):
                    self._kept.append(self._buffer[start:a])
                    if chunk := self._buffer[max(start, self._spoken):a].strip():
                        yield chunk
                    return
            chunk = self._buffer[max(start, self._spoken):end].strip()
            self._kept.append(self._buffer[start:end])
            start = end
            if chunk:
                self._first = False
                yield chunk
        if start:
            self._buffer = self._buffer[start:]
            self._spoken = max(0, self._spoken - start)

    def _repeats(self, sentence: str) -> bool:
        if not self.stop_on_repeat or not (key := normalise(sentence)):
            return False
        if key in self._seen:
            self.repeated = True
            return True
        self._seen.add(key)
        return False


def clean_for_speech(text: str) -> str:
    """Drop markdown and emoji that TTS would read out or choke on."""
    text = re.sub(r"[*_`#>|~]+", " ", text)
    text = re.sub(r"[\U0001F000-\U0001FAFF\u2600-\u27BF]", "", text)
    return re.sub(r"\s+", " ", text).strip()
