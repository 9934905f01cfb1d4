"""IPA phonemes from the espeak-ng program, clause by clause, for the TTS backends whose models read IPA.

espeak-ng runs as a program of its own, so neither libespeak-ng nor a GPL Python package (``phonemizer``,
``piper-phonemize``) is loaded into the process. One espeak-ng per stage stays running and answers each reply
chunk's lines as they come (1.5 ms a chunk, where a process per chunk took 12-15 ms before the first audio). The
text is cut where espeak cuts its clauses, each clause is phonemized with its punctuation kept (as Piper and
``phonemizer`` with ``preserve_punctuation`` do), and a backend speaks a reply's first clause alone when it is long
enough (:func:`pieces`), so the first audio comes sooner, then whole sentences.
"""
from __future__ import annotations

import queue
import re
import shutil
import subprocess
import textwrap
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from s2s.config_errors import ValidationContext
from s2s.text import has_words

ESPEAK = "espeak-ng"
INSTALL = {"linux": "apt-get install espeak-ng", "macos": "brew install espeak-ng",
           "windows": "the espeak-ng installer from https://github.com/espeak-ng/espeak-ng/releases"}
MIN_CLAUSE_PHONEMES = 10  # a first clause shorter than this ("Yes, ") stays with what follows: alone it sounds clipped
LINE_CHARS = 240  # espeak-ng reads standard input in lines of at most 999 bytes (4 per character at most)
# Where espeak-ng ends a clause: . ? ! , ; : or an ellipsis (closing quotes and brackets with it) before a space
CLAUSE_END = re.compile(r"(?:\.\.\.|…|[.?!,;:])+[\"'”’»)\]]*(?=\s|$)")
CLOSERS = "\"'”’»)]"
LANGUAGE_FLAG = re.compile(r"\([^)]*\)")  # espeak's (fr)...(en) around words it reads with another language
# The running espeak-ng's answers end with its answer to this line: it marks where a chunk's answer ends (a text
# that holds it goes to a process of its own)
MARK = "zqzqz"
PARAGRAPH = b"\n\n"  # espeak-ng ends its answer to each paragraph (a line and an empty one) so
ANSWER_S = 10.0  # the running espeak-ng answers a chunk in milliseconds: past this it is stopped and started again


@dataclass(frozen=True)
class Clause:
    """One clause of a sentence: as written, and as espeak-ng's IPA with its terminator (a space after ``,;:``)."""

    text: str
    phonemes: str


def missing_espeak(os_name: str | None) -> str:
    """What to install, for ``os_name`` (None: a stage setting up knows no platform, so every OS's way)."""
    how = INSTALL[os_name] if os_name in INSTALL else "; ".join(f"{name}: {way}" for name, way in INSTALL.items())
    return f"the {ESPEAK} program, which is not on PATH; install it with: {how}"


def missing_here(context: ValidationContext) -> str | None:
    """What to install when the config is judged for this machine and espeak-ng is not on its PATH, else None
    (a preview for another platform cannot see that machine's programs)."""
    return missing_espeak(context.os) if context.here and shutil.which(ESPEAK) is None else None


def split_clauses(text: str) -> list[tuple[str, str, bool]]:
    """``(clause, terminator, ends_sentence)`` where espeak-ng ends its clauses.

    A single dot before a lowercase word ends nothing ("Mr. and", "e.g. this"), as in espeak; a blank line ends a
    sentence with no terminator, as espeak's paragraph does.
    """
    clauses: list[tuple[str, str, bool]] = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph, start = " ".join(paragraph.split()), 0
        for match in CLAUSE_END.finditer(paragraph):
            marks = match.group().rstrip(CLOSERS)
            if marks == "." and paragraph[match.end():].lstrip()[:1].islower():
                continue
            terminator = marks[-1].replace("…", ".")
            clauses.append((paragraph[start:match.end()].strip(), terminator, terminator in ".?!"))
            start = match.end()
        if rest := paragraph[start:].strip():
            clauses.append((rest, "", True))
        elif clauses:
            clauses[-1] = (*clauses[-1][:2], True)
    return clauses


def pieces(sentence: list[Clause], first: bool, minimum: int = MIN_CLAUSE_PHONEMES) -> list[list[Clause]]:
    """The sentence as one piece; for a reply's first sentence, its first clause(s) up to ``minimum`` phonemes
    alone and then the rest, so that the first audio comes out before the whole sentence is made."""
    for cut in range(1, len(sentence) if first else 1):
        if sum(len(clause.phonemes) for clause in sentence[:cut]) >= minimum:
            return [sentence[:cut], sentence[cut:]]
    return [sentence]


class Espeak:
    """espeak-ng's IPA for a voice (``en-us``, ...), the program run once per text.

    Args:
        voice: an espeak-ng voice name.
        backend: the backend's name for the error raised when the program is missing (``tts=piper``).

    Raises:
        RuntimeError: espeak-ng is not on PATH (the message says how to install it).
    """

    def __init__(self, voice: str, backend: str) -> None:
        program = shutil.which(ESPEAK)
        if program is None:
            raise RuntimeError(f"{backend} needs {missing_espeak(None)}")
        self.command = [program, "-q", "-b", "1", "--ipa", "-v", voice]
        self._lock = threading.Lock()  # one chunk at a time through the running espeak-ng
        self._running: Running | None = None

    def ipa(self, lines: list[str]) -> list[list[str]]:
        """espeak-ng's IPA lines for each line of text; an empty line after each marks its end.

        The running espeak-ng answers (started on the first call, again after it failed); a text holding
        :data:`MARK`, or one it did not answer in :data:`ANSWER_S`, gets a process of its own."""
        text = "".join(f"{line}\n\n" for line in lines)
        if MARK not in text.lower():
            with self._lock:
                try:
                    self._running = self._running or Running(self.command)
                    answer = self._running.ask(text)
                    if answer is not None:
                        return _blocks(answer)
                except OSError:  # it exited or closed its output: the next chunk starts another
                    pass
                self.close()
        result = subprocess.run(self.command, input=text, capture_output=True, encoding="utf-8", errors="replace",
                                check=False)
        if result.returncode:
            raise RuntimeError(f"{' '.join(self.command)} failed: {result.stderr.strip()}")
        return _blocks(result.stdout)

    def close(self) -> None:
        """Stop the running espeak-ng (the next text starts it again)."""
        running, self._running = self._running, None
        if running is not None:
            running.stop()

    def sentences(self, text: str) -> list[list[Clause]]:
        """The clauses of each sentence of ``text`` with their IPA, punctuation kept (as Piper's phonemize)."""
        clauses = split_clauses(text)
        lines, owners = [], []
        for index, (clause, _, _) in enumerate(clauses):
            if has_words(clause):  # the rest has no sound, only its mark
                parts = textwrap.wrap(clause, LINE_CHARS, break_on_hyphens=False)
                lines += parts
                owners += [index] * len(parts)
        groups = self.ipa(lines) if lines else []
        if len(groups) != len(lines):  # a line espeak answered in an unexpected shape: one process per line
            groups = [[ipa for group in self.ipa([line]) for ipa in group] for line in lines]
        ipa = [""] * len(clauses)
        for owner, group in zip(owners, groups):
            ipa[owner] = " ".join(filter(None, [ipa[owner], *group]))
        sentences: list[list[Clause]] = []
        sentence: list[Clause] = []
        for (clause, terminator, ends), phonemes in zip(clauses, ipa):
            space = " " if terminator in (",", ";", ":") else ""  # a clause, not a sentence, ends there
            sentence.append(Clause(clause, LANGUAGE_FLAG.sub("", phonemes) + terminator + space))
            if ends:
                sentences.append(sentence)
                sentence = []
        return sentences + [sentence] if sentence else sentences


def _blocks(answer: str) -> list[list[str]]:
    """espeak-ng's answer as each line's IPA lines: a line without sound answers an empty line (its block is "")."""
    return [[ipa.strip() for ipa in block.split("\n") if ipa.strip()] for block in answer.split("\n\n")[:-1]]


class Running:
    """An espeak-ng process that answers the text written to it, paragraph by paragraph, as it comes; a thread
    reads its output (a pipe has no timeout of its own). The process ends with :meth:`stop`, or with this object."""

    def __init__(self, command: list[str]) -> None:
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, bufsize=0)
        self._output: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, args=(self._process.stdout, self._output), daemon=True,
                         name="espeak-ng output").start()
        self._finalizer = weakref.finalize(self, _stop, self._process)
        # its answer to MARK alone (up to the first paragraph's end) ends every answer after; none: nothing would
        # tell where an answer ends
        mark = self._answer(f"{MARK}\n\n", PARAGRAPH)
        self._ending = mark if mark is not None and mark.strip() else None

    @staticmethod
    def _read(stream: Any, output: queue.Queue[bytes]) -> None:
        while chunk := stream.read(65536):  # unbuffered: what the process has written so far
            output.put(chunk)
        output.put(b"")  # the process closed its output

    def ask(self, text: str) -> str | None:
        """The answer to ``text`` (lines, each followed by an empty line); None when it does not come within
        :data:`ANSWER_S`, or when the process never answered :data:`MARK`.

        Raises:
            OSError: the process exited or closed its output.
        """
        if self._ending is None:
            return None
        answer = self._answer(f"{text}{MARK}\n\n", self._ending)
        return None if answer is None else answer[:-len(self._ending)].decode("utf-8", errors="replace")

    def _answer(self, text: str, ending: bytes) -> bytes | None:
        """What the process writes for ``text``, up to ``ending`` (after a whole paragraph, unless ``ending`` is
        the paragraph's end itself); None when it does not come within :data:`ANSWER_S`."""
        assert self._process.stdin is not None
        self._process.stdin.write(text.encode("utf-8"))
        answer, deadline = b"", time.monotonic() + ANSWER_S
        while not answer.endswith(ending) or (ending != PARAGRAPH and answer[:-len(ending)][-2:] not in
                                              (b"", PARAGRAPH)):
            try:
                chunk = self._output.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if not chunk:
                raise OSError("espeak-ng closed its output")
            answer += chunk
        return answer

    def stop(self) -> None:
        self._finalizer()


def _stop(process: subprocess.Popen) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
