"""Text helpers shared by the STT, LLM and TTS stages."""
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


_CLOSING = re.compile(r"[\s.?!,;:\-\u2026\u2013\u2014]+$")


def bare_words(text: str) -> str:
    """``text`` without the marks that close it ("capital of France?" -> "capital of France")."""
    return _CLOSING.sub("", text.strip())


def has_words(text: str) -> bool:
    """Whether ``text`` holds a word: marks alone ("." or "...") do not; a number or any script's letters do. A
    transcript without one gets no reply (Whisper writes "." for a breath or a click), a clause without one no
    speech."""
    return any(character.isalnum() for character in text)


def closes_sentence(piece: str) -> bool:
    """A token's text (spacing stripped) that ends a sentence after a word: it starts with "." "?" or "!", and is
    not an ellipsis. The LLM's words score and the STT's sentence end sum the probabilities of these tokens."""
    return piece[:1] in (".", "?", "!") and not piece.startswith("..")


def normalise(sentence: str) -> str:
    """Lower case, punctuation and spacing dropped: how two sentences are compared for repetition."""
    return re.sub(r"[\W_]+", " ", sentence.lower()).strip()


_TRIM_SENTENCE = re.compile(r"[.!?][\"')\]]*(?=\s|$)")
_TRIM_CLAUSE = re.compile(r"[\s,;:\u2014-]+$")


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

    def trim(self) -> None:
        """Drop the unreleased text's unfinished end (the reply hit its token cap): back to the reply's last
        sentence end, else to its last whole word (without a trailing comma); a single cut word goes altogether."""
        tail = self._buffer[self._spoken:]
        if ends := list(_TRIM_SENTENCE.finditer(tail)):
            tail = tail[:ends[-1].end()]
        elif self._kept or _TRIM_SENTENCE.search(self._buffer[:self._spoken].rstrip()):  # a sentence ended
            tail = ""
        else:
            tail = _TRIM_CLAUSE.sub("", tail.rstrip().rpartition(" ")[0] if " " in tail.strip() else "")
        self._buffer = self._buffer[:self._spoken] + tail

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


class TagFilter:
    """Takes ``<tag>...</tag>`` blocks out of streamed text: the text around them streams on, the blocks are kept.

    A tail that could be the start of the opening tag is held back until the next piece decides it. An unclosed
    block at the end is a block too (models often stop at the end-of-turn token).
    """

    def __init__(self, open_tag: str, close_tag: str) -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        self.blocks: list[str] = []
        self._buffer = ""
        self._inside = False

    def feed(self, piece: str) -> Iterator[str]:
        self._buffer += piece
        while True:
            if self._inside:
                end = self._buffer.find(self.close_tag)
                if end < 0:
                    return
                self.blocks.append(self._buffer[:end])
                self._buffer, self._inside = self._buffer[end + len(self.close_tag):], False
                continue
            start = self._buffer.find(self.open_tag)
            if start >= 0:
                if start:
                    yield self._buffer[:start]
                self._buffer, self._inside = self._buffer[start + len(self.open_tag):], True
                continue
            keep = next((n for n in range(min(len(self.open_tag) - 1, len(self._buffer)), 0, -1)
                         if self.open_tag.startswith(self._buffer[-n:])), 0)
            if len(self._buffer) > keep:
                yield self._buffer[:len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep:]
            return

    def finish(self) -> Iterator[str]:
        """The end of the text: what was held back, or the unclosed block."""
        rest, self._buffer = self._buffer, ""
        if self._inside:
            self.blocks.append(rest)
            self._inside = False
        elif rest:
            yield rest


# Markdown a reply may carry, matched so that what it means is spoken and arithmetic and identifiers stay:
# "2 * 3", "a_b", "snake_case_name", "x^2" and "#1" are no markup (emphasis hugs its words, a heading's # a space).
_FENCE = re.compile(r"^\s*(```|~~~)")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$")
_ITEM = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+(.*)$")
_QUOTE = re.compile(r"^\s*(>\s?)+")
_CODE = re.compile(r"`+([^`]*)`+")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)\s]*\)")
_STARS = re.compile(r"(?<![\w*\\])(\*{1,3})(?=[^\s*])(.+?)(?<=[^\s*\\])\1(?![\w*])")
_UNDERSCORES = re.compile(r"(?<![\w\\])(_{1,2})(?=[^\s_])(.+?)(?<=[^\s_])\1(?!\w)")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
# a chunk boundary may fall inside bold or italics: an unpaired run of stars that hugs a word is markup too
_LONE_STARS = re.compile(r"(?<![\w*\\])\*{1,3}(?=\w)|(?<=[\w.!?,;:)])\*{1,3}(?![\w*])")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~])")
_EMOJI = re.compile(r"[\U0001F000-\U0001FAFF\u2600-\u27BF\uFE0F]")
_ENDS_CLAUSE = re.compile(r"[.!?;:,。！？]$")
_TABLE_RULE = re.compile(r"^[\s|:-]+$")


def _emphasis(match: re.Match[str]) -> str:
    marker, words = match.group(1), match.group(2)
    return match.group(0) if marker == "__" and words.isidentifier() else words  # __init__ is a name


def _inline(text: str) -> str:
    """Links, emphasis and strike-through dropped to their words; inline code keeps its text verbatim."""
    parts = _CODE.split(text)  # odd parts are code
    for index in range(0, len(parts), 2):
        part = _LINK.sub(r"\1", parts[index])
        for _ in range(2):  # ***both*** and **bold with *italic* inside**
            part = _UNDERSCORES.sub(_emphasis, _STARS.sub(r"\2", part))
        part = _LONE_STARS.sub("", _STRIKE.sub(r"\1", part)).replace("`", "")
        parts[index] = _ESCAPE.sub(r"\1", part)
    return "".join(parts)


def clean_for_speech(text: str) -> str:
    """Markdown as plain speech, emoji dropped: what TTS should say for one streamed chunk of a reply.

    Headings become sentences ("# Steps" -> "Steps."), list items become clauses joined by commas, the last
    one ending the run, and emphasis, links and code fences drop their markers; inline code keeps its text
    (``foo_bar()``) and arithmetic and identifiers ("2 * 3 = 6", "snake_case", "#1") are kept as written.

    Args:
        text: a chunk as ``SentenceSplitter`` releases it: a sentence or a few lines, possibly cut mid-span.
    """
    lines: list[tuple[str, bool]] = []  # (spoken text, is a list item)
    for line in text.splitlines():
        if _FENCE.match(line) or _RULE.match(line):
            continue
        line = _QUOTE.sub("", line)
        if line.lstrip().startswith("|"):  # a table row: a sentence of its cells; the |---| rule under the head goes
            if not _TABLE_RULE.match(line):
                cells = _inline(", ".join(c.strip() for c in line.strip().strip("|").split("|"))).strip()
                lines.append((cells + ("" if _ENDS_CLAUSE.search(cells) else "."), False))
            continue
        if heading := _HEADING.match(line):
            spoken = _inline(heading.group(1)).strip()
            lines.append((spoken + ("" if not spoken or _ENDS_CLAUSE.search(spoken) else "."), False))
        elif item := _ITEM.match(line):
            lines.append((_inline(item.group(1)).strip(), True))
        else:
            lines.append((_inline(line).strip(), False))
    lines = [(spoken, is_item) for spoken, is_item in lines if spoken]
    out = []
    for index, (spoken, is_item) in enumerate(lines):
        if is_item and not _ENDS_CLAUSE.search(spoken):
            follows = index + 1 < len(lines) and lines[index + 1][1]
            spoken += "," if follows else "."
        out.append(spoken)
    return re.sub(r"\s+", " ", _EMOJI.sub("", " ".join(out))).strip()
