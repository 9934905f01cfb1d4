"""python -m s2s.bench turns [key=value ...] [--variant "key=value ..."]...: how each way of ending a turn cuts
the user off in a pause and how long it waits after a complete turn.

The set is spoken by espeak-ng in four voices: complete questions, and the same questions with a pause of
0.7-1.0 s inside ("What is the capital of ... France?"), the two pieces joined with silence. espeak says each
piece as a sentence of its own, with a falling end; a second form ends the first piece with a comma, so it is
said with a continuing rise, as a person pausing mid-sentence would. The VAD stage runs (from the composed
config, on the input clock, as fast as it can): a turn that is let go inside the pause is a cut-off; the
endpoint is the silence from the last voiced frame to the turn's end (``TurnConfirmed``, or the segment). With
a turn that reads the words (``turn=words``, ``turn=fused``: the VAD takes verdicts) the STT and LLM stages run
too: each speculative segment is transcribed and its words scored, and the verdict reaches the VAD as much
input later as that took in wall time (as a realtime stream would see it), or ``--verdict-delay-s`` later (0: a
machine fast enough to judge at once, the most cut-offs).
The end-to-end voice-to-voice of a variant is ``python -m s2s.bench latency --versus "turn=words"``.

A third espeak set asks questions of several sentences ("Fidel lies. Jerry says Fidel tells the truth. Does
Jerry tell the truth?"), each said whole, with espeak's own pauses between the sentences: both the audio and the
words find each sentence finished, so only the silence keeps the question whole. A turn let go before the last
sentence starts is a split.

``--set real`` (or ``all``, the default) adds recordings of real people (:mod:`s2s.bench.real_speech`): each
complete, and with a pause of 0.7-1.2 s spliced between two words inside a sentence, with the recording's own noise
floor around it. Per variant it prints the cut-off rate on real pauses (and on those of the recordings held out,
that no threshold was chosen on) and on espeak pauses, the endpoint on complete turns (p50 / p90 / max) and how
many waited more than 1.5 s; then, as eot-bench reports it, the lowest cut-off rate at each latency budget (a
variant is within a budget when its complete turns' median endpoint is), over the variants run (sweep a threshold
with several ``--variant "turn=words turn.threshold=0.05"``).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from s2s import audio
from s2s.bench.speech import espeak, espeak_available

if TYPE_CHECKING:
    from s2s.bench.real_speech import Source

RATE = 16000
VOICES = [("en-us", 150), ("en-gb", 165), ("en-us+f3", 140), ("en-gb+m3", 155)]
# (first piece, second piece): the pause goes between them
SPLITS = [("What is the capital of", "France?"), ("How many days are there in", "a leap year?"),
          ("Can you tell me", "a fun fact about the ocean?"), ("What should I cook", "for dinner tonight?")]
PAUSES_S = (0.7, 0.85, 1.0)
# questions of several sentences, in Big Bench Audio's categories (its own are longer): split if a turn ends early
SENTENCES = ["All cats are mammals. Tom is a cat. So Tom is a mammal. Is the argument valid or invalid?",
             "Take two steps forward, then two steps back. Do you return to the start?",
             "I have a piano, two flutes and a violin. How many instruments do I have?",
             "Fidel lies. Jerry says Fidel tells the truth. Does Jerry tell the truth?",
             "My flight leaves at six. The airport is an hour away. When should I leave home?",
             "I need a gift for my sister. She likes books and tea. What should I get her?"]
SENTENCE_GAP_S = 0.2  # espeak's pauses between sentences are 0.3-0.45 s, between words under 0.15 s
DEFAULT_VARIANTS = [["turn=fused"], ["turn=silence"], ["turn=smart_turn"], ["turn=words"]]  # the default first
SETS = ("all", "real", "espeak")
BUDGETS_S = (0.5, 0.75, 1.0, 1.5)  # latency budgets of the eot-bench style table
PATIENCE_S = 1.5  # the target: no complete turn waits longer


@dataclass
class TurnClip:
    """A clip with where its pause lies (None: a complete turn with no pause) on the stream's clock."""

    name: str
    samples: np.ndarray
    pause: tuple[float, float] | None
    real: bool = False
    sentences: bool = False  # the "pause" runs from the first sentence's end to the last one's start
    held_out: bool = False  # a real recording no threshold was chosen on (real_speech.TURN_SOURCES)

    @property
    def mid_sentence(self) -> bool:
        """A pause inside a sentence (the cut-off columns), not between a question's sentences."""
        return self.pause is not None and not self.sentences


def _trimmed(samples: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(samples) > 0.02)
    return samples[loud[0]:loud[-1] + 1]


def build_set(folder: Path) -> list[TurnClip]:
    """Complete questions and paused ones (both intonations), with 0.5 s of silence before, 4 s after."""
    lead, tail = audio.silence(0.5, RATE), audio.silence(4.0, RATE)  # the tail outlasts turn.max_silence_ms
    clips = []
    for index, (voice, rate) in enumerate(VOICES):
        for first, second in SPLITS:
            whole = _trimmed(espeak(f"{first} {second}", voice, rate, folder / "w.wav").samples)
            clips.append(TurnClip(f"complete {voice}: {first} {second}", np.concatenate([lead, whole, tail]), None))
            for ending, form in (("", "falling"), (",", "continuing")):
                one = _trimmed(espeak(first + ending, voice, rate, folder / "a.wav").samples)
                two = _trimmed(espeak(second, voice, rate, folder / "b.wav").samples)
                pause = PAUSES_S[(index + len(clips)) % len(PAUSES_S)]
                start = (len(lead) + len(one)) / RATE
                clips.append(TurnClip(f"paused {pause:.2f} s {form} {voice}: {first} ... {second}",
                                      np.concatenate([lead, one, audio.silence(pause, RATE), two, tail]),
                                      (start, start + pause)))
    return clips


def build_sentence_set(folder: Path) -> list[TurnClip]:
    """:data:`SENTENCES`, each said whole in every voice, with 0.5 s of silence before and 4 s after."""
    lead, tail = audio.silence(0.5, RATE), audio.silence(4.0, RATE)
    clips = []
    for voice, rate in VOICES:
        for text in SENTENCES:
            whole = _trimmed(espeak(text, voice, rate, folder / "s.wav").samples)
            loud = np.flatnonzero(np.abs(whole) > 0.02)
            gaps = np.flatnonzero(np.diff(loud) > SENTENCE_GAP_S * RATE)
            if not len(gaps):  # this voice ran the sentences together: nothing to measure on it
                continue
            span = ((len(lead) + loud[gaps[0]]) / RATE, (len(lead) + loud[gaps[-1] + 1]) / RATE)
            clips.append(TurnClip(f"sentences {voice}: {text}", np.concatenate([lead, whole, tail]), span,
                                  sentences=True))
    return clips


def build_real_set(folder: Path, sources: list[Source] | None = None) -> list[TurnClip]:
    """The real recordings (``sources``: see :func:`s2s.bench.real_speech.turn_set`), complete and paused, with 0.5 s
    of their noise floor before and 4 s after."""
    from s2s.bench.real_speech import floor_noise, noise_floor, turn_set

    clips = []
    for index, (name, samples, pause, held) in enumerate(turn_set(folder, sources)):
        floor = noise_floor(samples)
        lead, tail = floor_noise(floor, 0.5, 2 * index + 1), floor_noise(floor, 4.0, 2 * index + 2)
        span = None if pause is None else (pause[0] + len(lead) / RATE, pause[1] + len(lead) / RATE)
        clips.append(TurnClip(name, np.concatenate([lead, samples, tail]), span, real=True, held_out=held))
    return clips


def build_vad(overrides: list[str]) -> Any:
    """The composed config's VAD stage (validated first, as a run would), set up, with barge-in as a realtime
    session has it (interrupt_response): a turn the speaker goes on from is resumed (``vad.resume_ms``)."""
    from s2s.bench.compose import set_up

    vad = set_up(overrides, "vad", "/tmp/s2s-bench-turns")
    vad.barge_in = True
    return vad


class Hearing:
    """The STT and LLM stages a VAD that reads the words needs: a speculative segment in, the verdicts out (the
    LLM's on the words, and the STT's on their sentence end where it makes one)."""

    def __init__(self, overrides: list[str], delay_s: float | None = None, takes: tuple[type, ...] = ()) -> None:
        from s2s.bench.compose import set_up
        from s2s.messages import SentenceEnd, TurnVerdict

        self.delay_s = delay_s  # None: the verdicts come back after the wall time they took; else after this

        self.stt, self.llm = (set_up(overrides, group, "/tmp/s2s-bench-turns") for group in ("stt", "llm"))
        # as the runner tells them: the STT makes its verdict only for a VAD that takes it (turn.sentence_end)
        self.stt.wanted = frozenset({SentenceEnd}) & frozenset(takes)
        self.llm.wanted = frozenset({TurnVerdict})
        self.texts: dict[str, float] = {}  # each speculative transcript and its weighed score, for the report
        self.delays: list[float] = []  # wall seconds from each speculative segment to its verdict

    def verdict(self, segment: Any) -> tuple[list[Any], float]:
        """The verdicts on ``segment`` (none: no words or no score) and the wall seconds STT and LLM took."""
        from s2s.messages import SentenceEnd, Transcript, TurnVerdict
        from s2s.vad.turn_detection import words_probability

        started = time.perf_counter()
        out = list(self.stt.process(segment))
        texts = [m.text for m in out if isinstance(m, Transcript)]
        verdicts = [m for m in out if isinstance(m, SentenceEnd)]
        probability = self.llm.end_of_turn_probability(self.llm.chat_messages(texts[0])) if texts else None
        if probability is not None:
            verdicts.append(TurnVerdict(segment.turn, probability))
            heard = verdicts[0].probability if isinstance(verdicts[0], SentenceEnd) else None
            self.texts[texts[0]] = words_probability(probability, heard)
        self.delays.append(time.perf_counter() - started)
        return verdicts, self.delays[-1] if self.delay_s is None else self.delay_s

    def close(self) -> None:
        self.stt.close()
        self.llm.close()


def judge(vad: Any, clip: TurnClip, hearing: Hearing | None = None) -> dict[str, Any]:
    """The turns the VAD let go on ``clip``: cut off in the pause or not, whether the last one holds the whole
    sentence (a turn cut off and resumed when the speaker went on: ``vad.resume_ms``), and the endpoint of the last.
    """
    from s2s.messages import AudioChunk, SpeechSegment, SpeechStarted, TurnConfirmed

    vad.reset()
    segments: dict[int, SpeechSegment] = {}
    ended: list[tuple[float, float, float]] = []  # (speech end, when the turn ended, its start) of each turn let go
    due: list[tuple[float, Any]] = []  # (input position at which it comes back, verdict)
    starts: list[float] = []  # where each SpeechStarted came (a barge-in, with runner.barge_in)
    started = time.perf_counter()
    for index, block in enumerate([*audio.chunks(clip.samples, 512), None]):
        out = list(vad.process(AudioChunk(block, RATE)) if block is not None else vad.flush())
        position = (index + 1) * 512 / RATE
        while due and due[0][0] <= position and block is not None:
            out += vad.steer(due.pop(0)[1])
        for message in out:
            if isinstance(message, SpeechSegment):
                segments[message.turn] = message
                if not message.speculative:
                    ended.append((message.speech_end_s, message.closed_s, message.start_s))
                elif hearing is not None:
                    verdicts, seconds = hearing.verdict(message)
                    due += [(message.closed_s + seconds, verdict) for verdict in verdicts]
            elif isinstance(message, SpeechStarted):
                starts.append(position)
            elif isinstance(message, TurnConfirmed):
                segment = segments[message.turn]
                ended.append((segment.speech_end_s, message.at_s, segment.start_s))
    seconds = time.perf_counter() - started
    cut = bool(clip.pause and ended and ended[0][0] < clip.pause[1])
    # the turn that stands holds the words before the pause and after it: it was not cut, or it was resumed
    whole = bool(clip.pause and ended and ended[-1][2] == ended[0][2] and ended[-1][0] > clip.pause[1])
    endpoint = ended[-1][1] - ended[-1][0] if ended else None
    # a cut turn's reply may play from its end until the speaker's going on barges in: the longest false start
    over = next((start - ended[0][1] for start in starts if start > ended[0][1]), None) if cut and whole else None
    return {"turns": len(ended), "cut": cut, "whole": whole, "endpoint_s": endpoint, "vad_s": seconds,
            "talked_over_s": over}


def _share(rows: list[dict[str, Any]], key: str = "cut") -> str:
    return f"{sum(r[key] for r in rows)}/{len(rows)} ({sum(r[key] for r in rows) / len(rows):.0%})" if rows else "-"


def _summary(found: list[dict[str, Any]], clips: list[TurnClip]) -> dict[str, str]:
    complete = [r for r, c in zip(found, clips) if c.pause is None]
    ends = [r["endpoint_s"] for r in complete if r["endpoint_s"] is not None]
    spread = (f"{statistics.median(ends):.2f} / {float(np.percentile(ends, 90)):.2f} / {max(ends):.2f}"
              if ends else "-")
    paused = [(r, c) for r, c in zip(found, clips) if c.mid_sentence]
    return {"cut off, real": _share([r for r, c in paused if c.real]),
            "answered whole, real": _share([r for r, c in paused if c.real], "whole"),
            "of them, held out": _share([r for r, c in paused if c.held_out]),
            "cut off, espeak": _share([r for r, c in paused if not c.real]),
            "split, espeak sentences": _share([r for r, c in zip(found, clips) if c.sentences]),
            "complete split": f"{sum(r['turns'] != 1 for r in complete)}/{len(complete)}",
            "endpoint complete p50 / p90 / max s": spread,
            f"complete > {PATIENCE_S} s": f"{sum(e > PATIENCE_S for e in ends)}/{len(ends)}"}


def budget_table(results: dict[str, tuple[float, float]]) -> list[str]:
    """eot-bench's view: per latency budget, the variant with the fewest cut-offs whose complete turns' median
    endpoint fits the budget. ``results``: variant -> (median endpoint s, cut-off share over every pause)."""
    lines = ["| budget (median endpoint, complete turns) | lowest cut-off rate | variant |", "|---|---|---|"]
    for budget in BUDGETS_S:
        fits = [(cut, name) for name, (median, cut) in results.items() if median <= budget]
        cut, name = min(fits) if fits else (None, "none fits")
        lines.append(f"| {budget:.2f} s | {'-' if cut is None else f'{cut:.0%}'} | {name} |")
    return lines


def build_sets(which: str, speech_dir: Path) -> list[TurnClip]:
    """The clips of ``which`` (one of :data:`SETS`); FileNotFoundError saying what to run when one is missing."""
    from s2s.bench.real_speech import missing_message

    if which != "real" and not espeak_available():
        raise FileNotFoundError("espeak-ng is not installed (apt-get install espeak-ng): the espeak set is "
                                "spoken by it (--set real runs without it)")
    clips = []
    if which != "espeak":
        try:
            clips += build_real_set(speech_dir)
        except FileNotFoundError:
            raise FileNotFoundError(missing_message(speech_dir)) from None
    if which != "real":
        with tempfile.TemporaryDirectory() as folder:
            clips += build_set(Path(folder)) + build_sentence_set(Path(folder))
    return clips


def bench_turns(overrides: list[str], variants: list[list[str]], which: str = "all",
                speech_dir: Path | None = None, verdict_delay_s: float | None = None) -> int:
    """Each variant (overrides added to ``overrides``) over the same set; prints one table row per variant."""
    from s2s.bench.real_speech import FOLDER

    try:
        clips = build_sets(which, speech_dir or FOLDER)
    except FileNotFoundError as error:
        print(error)
        return 1
    rows, budgets = {}, {}
    for variant in variants or DEFAULT_VARIANTS:
        from s2s.messages import TurnVerdict

        vad = build_vad([*overrides, *variant])
        hearing = Hearing([*overrides, *variant], verdict_delay_s, vad.takes) if TurnVerdict in vad.takes else None
        found = [judge(vad, clip, hearing) for clip in clips]
        vad.close()
        name = " ".join(variant)
        if hearing is not None:
            for text, probability in sorted(hearing.texts.items(), key=lambda item: item[1]):
                print(f"  {name}: {probability:.3f} {text}")
            print(f"  {name}: the verdict came {statistics.median(hearing.delays):.2f} s (median), "
                  f"{max(hearing.delays):.2f} s (max) after the speculative segment (STT + scoring)")
            hearing.close()
        rows[name] = _summary(found, clips)
        for result, clip in zip(found, clips):
            if result["cut"] or result["turns"] != 1:
                print(f"  {name}: {clip.name}: {result['turns']} turns"
                      + (", cut off in the pause" if result["cut"] else "")
                      + (", resumed whole" if result["cut"] and result["whole"] else ""))
            elif clip.pause is None and (result["endpoint_s"] or 0) > PATIENCE_S:
                print(f"  {name}: {clip.name}: waited {result['endpoint_s']:.2f} s")
        ends = [r["endpoint_s"] for r, c in zip(found, clips) if c.pause is None and r["endpoint_s"] is not None]
        early = {kind: [(r["endpoint_s"] or 9.0) < 1.0 for r, c in zip(found, clips)
                        if c.pause is None and c.real == real] for kind, real in (("real", True), ("espeak", False))}
        print(f"  {name}: complete turns ended within 1 s: "
              + ", ".join(f"{kind} {sum(flags)}/{len(flags)}" for kind, flags in early.items() if flags))
        paused = [r for r, c in zip(found, clips) if c.mid_sentence]
        if over := [r["talked_over_s"] for r in paused if r["talked_over_s"] is not None]:
            print(f"  {name}: {len(over)} cut turns resumed; from a cut turn's end to the barge-in of the speaker "
                  f"going on (its reply's longest false start) p50 {statistics.median(over):.2f} s, max "
                  f"{max(over):.2f} s")
        if ends and paused:
            budgets[name] = (statistics.median(ends), sum(r["cut"] for r in paused) / len(paused))
    head = ["variant", *next(iter(rows.values()))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join([name, *cells.values()]) + " |" for name, cells in rows.items()]
    count = lambda real, paused: sum(c.real == real and c.mid_sentence == paused and not c.sentences
                                     for c in clips)  # noqa: E731
    print(f"\n{len(clips)} clips: {count(True, False)} real complete and {count(True, True)} real paused 0.7-1.2 s; "
          f"{count(False, False)} espeak complete, {count(False, True)} espeak paused 0.7-1.0 s and "
          f"{sum(c.sentences for c in clips)} espeak questions of several sentences"
          + (f"; overrides: {' '.join(overrides)}" if overrides else "")
          + (f"; verdicts after {verdict_delay_s} s" if verdict_delay_s is not None else ""))
    print("\n".join(lines))
    if budgets:
        print("\nCut-off rate (real and espeak pauses together) at a latency budget, over the variants above:")
        print("\n".join(budget_table(budgets)))
    return 0
