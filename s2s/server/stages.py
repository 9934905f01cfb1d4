"""The stages a session adds around the configured ones: the socket as source and sink, and its own VAD.

Stages still see no JSON and no socket: the session feeds decoded audio into :class:`SocketSource` and
receives :class:`~s2s.messages.ReplyAudio` from :class:`SocketSink` through a plain callback.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from s2s.io.push import CallbackSink, PushSource
from s2s.messages import (Control, Data, Message, SpeechSegment, SpeechSoFar, SpeechStarted, TurnConfirmed,
                          TurnDiscarded)
from s2s.server.partials import PartialTranscriber
from s2s.stage import Stage

PIPELINE_RATE = 16000  # the rate a session feeds its graph: the unit of the session's input clock
RESUMABLE_TURNS = 16  # the VAD's turns kept numbered behind the newest: a resumed utterance names one of them


class SocketSource(PushSource):
    """Audio a client appends, already decoded and resampled by the session, as pipeline chunks."""

    def __init__(self, sample_rate: int = PIPELINE_RATE) -> None:
        super().__init__(sample_rate)

    def describe(self) -> dict[str, Any]:
        return {"input": "the client's input_audio_buffer.append (PCM16)"}


class SocketSink(CallbackSink):
    """Hands each block of reply audio to the session, which sends it as ``response.output_audio.delta``."""

    def describe(self) -> dict[str, Any]:
        return {"output": "response.output_audio.delta (PCM16 at the client's rate)"}


class TurnCounter:
    """One sequence of turn numbers per session, shared by spoken turns (from the VAD) and typed ones.

    A turn number names one attempt at the user's turn: when the user goes on after a speculative attempt, the
    attempt is void and the rest of the utterance takes a new number (so the void attempt's late work is told
    apart). The client still sees one utterance, one item: :meth:`utterance` maps each number to the first.
    """

    def __init__(self) -> None:
        self._count = itertools.count()
        self._lock = threading.Lock()
        self._first: dict[int, int] = {}  # a turn that goes on with an earlier, void attempt -> its first turn

    def next(self) -> int:
        with self._lock:
            return next(self._count)

    def go_on(self, turn: int, earlier: int) -> None:
        """Turn ``turn`` is the rest of the utterance whose attempt ``earlier`` was void (the user went on)."""
        with self._lock:
            self._first[turn] = self._first.get(earlier, earlier)

    def utterance(self, turn: int) -> int:
        """The first turn number of the utterance ``turn`` belongs to (``turn`` itself for most turns)."""
        with self._lock:
            return self._first.get(turn, turn)


class SessionVAD(Stage):
    """The session's own VAD (stateful, so never shared), numbering its turns in the session's sequence.

    Typed turns (``response.create`` after a text item) take numbers from the same :class:`TurnCounter`, so
    "a later turn cancels an earlier reply" holds across both kinds. ``replace`` swaps in a VAD with new
    settings (``session.update`` of turn detection) between two input chunks. A client's
    ``input_audio_buffer.commit`` ends the utterance in progress (the VAD's ``flush``) and ``.clear`` drops it;
    both act before the next input chunk.

    Its speech (segments, and the speech so far) carries the session's transcription language, so the pooled
    STT transcribes it in that one.

    Args:
        vad: the configured VAD stage, built for this session.
        turns: the session's turn sequence.
        language: the session's transcription language now (None: the STT's own).
    """

    def __init__(self, vad: Stage, turns: TurnCounter,
                 language: Callable[[], str | None] = lambda: None) -> None:
        self.vad = vad
        self.language = language
        self.accepts, self.emits = vad.accepts, vad.emits
        self.takes = vad.takes  # turn=words: the LLM's verdicts come back to the VAD through here
        self._turns = turns
        self._numbers: dict[int, int] = {}  # the VAD's own turn -> the session's
        self._replacement: Stage | None = None
        self._retired: list[Stage] = []
        self._lock = threading.Lock()
        self._speaking = False  # an utterance is in progress (from its SpeechStarted to its end)
        self._speculated: int | None = None  # the VAD's number of its speculative segment, when one is out
        self._dropping = False  # the client cleared the utterance in progress: nothing more of it passes
        self._requests: list[str] = []  # commit | clear, acted on before the next chunk
        self._open: int | None = None  # the session's turn of the utterance partial transcripts are for
        self._went_on: int | None = None  # the session's turn of an attempt the user went on from (its VAD voided it)
        self._partials: PartialTranscriber | None = None
        self._put_partial: Callable[[int, str], None] = lambda turn, text: None
        self._wanted: Callable[[], bool] = lambda: False

    @property
    def wanted(self) -> frozenset[type[Message]]:  # type: ignore[override]
        return self.vad.wanted

    @wanted.setter
    def wanted(self, kinds: frozenset[type[Message]]) -> None:
        """What the graph wants of the VAD (the speech so far, for an incremental STT) goes to the VAD itself."""
        self.vad.wanted = kinds

    @property
    def barge_in(self) -> bool:  # type: ignore[override]
        return self.vad.barge_in

    @barge_in.setter
    def barge_in(self, value: bool) -> None:
        """Whether the session's speech cancels a reply (interrupt_response) goes to the VAD itself."""
        self.vad.barge_in = value

    def enable_partials(self, stt: Any, every_s: float, put: Callable[[int, str], None],
                        wanted: Callable[[], bool]) -> None:
        """Transcribe the open utterance after each ``every_s`` s of new speech; ``put(turn, text)`` sends it.

        A pass runs only while the user is voicing and before the turn's (speculative) segment is out, so the
        turn's own STT never waits behind one; its text is dropped if the turn moved on meanwhile (a segment
        went out, the client cleared it). ``wanted()`` is asked before each pass (transcription null: no).

        An STT that decodes while the user speaks (``decodes_while_speaking``) makes these passes itself, at its
        own ``incremental_s``: its words so far come back through :meth:`heard`, and no pass runs here. One that
        decodes only at a pause (``at_pause``) leaves them to this.
        """
        if not getattr(stt, "decodes_while_speaking", False):
            self._partials = PartialTranscriber(stt, every_s, self.heard)
        self._put_partial, self._wanted = put, wanted

    def heard(self, turn: int, text: str) -> None:
        """The words so far of session turn ``turn`` (from a pass here or the STT's own): sent if still open."""
        with self._lock:
            if self._open == turn and self._speculated is None and not self._dropping and self._wanted():
                self._put_partial(turn, text)

    def _offer_partial(self, vad: Stage) -> None:
        with self._lock:
            turn = self._open
        if self._partials is None or turn is None or not getattr(vad, "voicing", False) or not self._wanted():
            return
        speech = vad.open_speech()  # type: ignore[attr-defined]  # a VAD with ``voicing`` has it
        if speech is not None and self._partials.due(turn, len(speech)):
            self._partials.start(turn, speech, self.language())

    def request(self, kind: str) -> bool:
        """Commit or clear the utterance in progress before the next chunk; False when none is in progress."""
        with self._lock:
            if not self._speaking:
                return False
            self._requests.append(kind)
            return True

    def replace(self, vad: Stage) -> None:
        """Use ``vad`` (already set up) from the next input chunk on; an utterance in progress is dropped."""
        with self._lock:
            self._replacement = vad

    def _current(self) -> Stage:
        with self._lock:
            if self._replacement is not None:
                self._retired.append(self.vad)
                self._replacement.wanted, self._replacement.barge_in = self.vad.wanted, self.vad.barge_in
                self.vad, self._replacement = self._replacement, None
                self._numbers.clear()
                self._open = self._went_on = None
            return self.vad

    def _renumber(self, message: Message) -> Message:
        turn = getattr(message, "turn", None)
        if turn is None:
            return message
        if turn not in self._numbers:
            # keep it small, and the turns a resumed utterance may name (one per attempt the speaker went on from)
            self._numbers = {k: v for k, v in self._numbers.items() if k >= turn - RESUMABLE_TURNS}
            self._numbers[turn] = self._turns.next()
            if self._went_on is not None:  # the rest of the utterance: the same item, and its partials go on
                self._turns.go_on(self._numbers[turn], self._went_on)
                self._open = self._numbers[turn] if self._speaking and not self._dropping else None
                self._went_on = None
        changes: dict[str, Any] = {"turn": self._numbers[turn]}
        if isinstance(message, (SpeechSegment, SpeechSoFar)) and (language := self.language()) is not None:
            changes["language"] = language
        if isinstance(message, SpeechSegment) and message.resumes is not None:
            changes["resumes"] = self._numbers.get(message.resumes)
        return dataclasses.replace(message, **changes)

    def setup(self) -> None:
        self.vad.setup()

    def warm_up(self) -> None:
        self.vad.warm_up()

    def _track(self, outputs: Iterator[Message]) -> Iterator[Message]:
        """Renumber the VAD's outputs, follow the utterance in progress, and drop what the client cleared."""
        for output in outputs:
            ends = isinstance(output, TurnConfirmed) or (isinstance(output, SpeechSegment) and not output.speculative)
            with self._lock:
                dropped = self._dropping and not isinstance(output, SpeechStarted)
                shown = None if dropped else self._renumber(output)
                if isinstance(output, SpeechStarted):
                    self._speaking, self._dropping = True, False
                    self._open = getattr(shown, "turn", None)
                elif isinstance(output, SpeechSegment) and output.speculative and not self._dropping:
                    self._speculated = output.turn
                elif isinstance(output, TurnDiscarded):  # the VAD's own: the user went on after its attempt
                    self._speculated = None
                    self._went_on = getattr(shown, "turn", None)
                elif ends:
                    self._speaking, self._speculated, self._dropping = False, None, False
                if not isinstance(output, (SpeechStarted, SpeechSoFar)) and getattr(output, "turn", None) is not None:
                    self._open = None  # its segment is out, or its attempt void: no more partials for it
            if shown is not None:
                yield shown

    def _act(self, vad: Stage) -> Iterator[Message]:
        """The client's commit (the utterance ends now) or clear (it is dropped), in the order they came."""
        with self._lock:
            requests, self._requests = self._requests, []
        for kind in requests:
            if kind == "commit":
                yield from self._track(vad.flush())
                continue
            with self._lock:
                speculated, self._speculated = self._speculated, None
                self._dropping = self._speaking
                self._open = None
            if speculated is not None:  # its work already started: it is void now
                yield self._renumber(TurnDiscarded(speculated))

    def process(self, message: Data) -> Iterator[Message]:
        vad = self._current()
        yield from self._act(vad)
        yield from self._track(vad.process(message))
        self._offer_partial(vad)

    def steer(self, message: Control) -> Iterator[Message]:
        """A verdict on a session turn goes to the VAD under the VAD's own number (none: no longer open)."""
        with self._lock:
            own = next((own for own, session in self._numbers.items() if session == getattr(message, "turn", None)),
                       None)
        if own is not None:
            yield from self._track(self._current().steer(dataclasses.replace(message, turn=own)))

    def end_turn(self, turn: int) -> Iterator[Message]:
        return iter(())  # the VAD starts turns; nothing upstream of it can end one

    def flush(self) -> Iterator[Message]:
        yield from self._track(self._current().flush())

    def reset(self) -> None:
        self.vad.reset()

    def close(self) -> None:
        if self._partials is not None:
            self._partials.close()
        for vad in [self.vad, *self._retired, *([self._replacement] if self._replacement else [])]:
            vad.close()

    def describe(self) -> dict[str, Any]:
        return self.vad.describe()
