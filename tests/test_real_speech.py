"""Real people's speech from pinned sdists (s2s/bench/real_speech.py): splicing a pause between two words, and
how the turn detectors fare on the spliced recordings (an aggregate over the set, with a margin)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from s2s.bench import real_speech
from s2s.bench.real_speech import Word, pause_points, spliced

RATE = 16000
WORDS = [Word("Go", 0.10, 0.30), Word("forward", 0.35, 0.80), Word("ten,", 0.90, 1.20), Word("meters.", 1.40, 1.90),
         Word("Then", 2.00, 2.20), Word("stop", 2.30, 2.60), Word("there.", 2.70, 3.00)]


def speech(floor: float = 0.002) -> np.ndarray:
    """3.2 s: a loud tone where each word of WORDS is, noise at ``floor`` between them."""
    samples = np.random.default_rng(0).standard_normal(round(3.2 * RATE)) * floor
    for word in WORDS:
        span = slice(round(word.start * RATE), round(word.end * RATE))
        samples[span] = 0.3 * np.sin(2 * np.pi * 220 * np.arange(span.stop - span.start) / RATE)
    return samples.astype(np.float32)


@pytest.mark.parametrize("pause_s", [0.7, 0.85, 1.2])
def test_the_pause_lands_in_the_middle_of_the_gap_between_the_two_words_and_lasts_as_asked(pause_s):
    samples = speech()
    out, (start, end) = spliced(samples, WORDS, 2, pause_s, seed=3)
    assert start == pytest.approx((1.20 + 1.40) / 2, abs=1 / RATE)
    assert end - start == pytest.approx(pause_s, abs=1 / RATE) and len(out) == len(samples) + round(pause_s * RATE)
    first, last = round(start * RATE), round(end * RATE)
    assert np.array_equal(out[:first - 160], samples[:first - 160])  # before the fade: untouched
    assert np.array_equal(out[last + 160:], samples[first + 160:])  # after it: the rest, shifted by the pause
    assert np.abs(out[first:last]).max() < 0.02  # the floor noise, well under the speech


@pytest.mark.parametrize("floor", [0.0005, 0.004])
def test_the_pause_is_filled_at_the_recording_s_own_noise_floor(floor):
    out, (start, end) = spliced(speech(floor), WORDS, 2, 1.0)
    pause = out[round(start * RATE):round(end * RATE)]
    assert np.sqrt(np.mean(pause ** 2)) == pytest.approx(floor, rel=0.15)


def test_pauses_fall_inside_sentences_only_never_after_the_last_word_or_the_first():
    points = pause_points(WORDS, count=4)
    assert points and all(1 <= index < len(WORDS) - 1 for index in points)
    assert 3 not in points  # "meters." ends a sentence
    assert pause_points(WORDS[:2]) == []
    assert pause_points([Word("Yes.", 0, 1), Word("No.", 1, 2), Word("Ok.", 2, 3)]) == []


@pytest.mark.parametrize("floor", [0.0, 0.002, 0.0025])
def test_the_end_of_speech_is_the_last_word_s_end_not_the_hiss_that_runs_on_after_it(floor):
    # 0.0025 RMS is about 3% of the tones' peak in noise peaks: over the old 2%-of-the-peak mark to the last sample
    from s2s.bench.server import speech_end_s

    samples = np.concatenate([speech(floor), np.random.default_rng(1).standard_normal(RATE).astype(np.float32) * floor])
    assert speech_end_s(samples, RATE) == pytest.approx(WORDS[-1].end, abs=0.01)


# ---------------------------------------------------------------- the real recordings
def _real_set(sources=None):
    """The turn bench's real set (complete and paused clips) from the fetched archives; missing: a skip that CI
    (S2S_CI=1) counts as a failure, as for every missing real dependency."""
    from s2s.bench.turns import build_real_set

    if real_speech.missing(real_speech.FOLDER):
        pytest.skip(real_speech.missing_message(real_speech.FOLDER))
    return build_real_set(real_speech.FOLDER, sources)


@pytest.fixture(scope="session")
def real_turns():
    """The real set of the recordings of SOURCES, whose transcripts are checked: the figures below were measured on
    them."""
    return _real_set(real_speech.SOURCES)


def test_the_real_set_has_many_speakers_each_complete_and_paused_inside_a_sentence():
    everyone = real_speech.SOURCES + real_speech.TURN_SOURCES
    clips = _real_set()  # the bench's: TURN_SOURCES too
    assert len({speaker for _, _, speaker, _ in real_speech.SOURCES}) >= 10 and len(everyone) >= 20
    complete = [clip for clip in clips if clip.pause is None]
    paused = [clip for clip in clips if clip.pause is not None]
    assert [clip.name for clip in complete] == [f"complete {Path(path).name} ({package})"
                                                for package, path, _, _ in everyone]
    # the bench counts the held-out recordings' cut-offs apart: exactly those of TURN_SOURCES, paused ones too
    assert [clip.held_out for clip in complete] == [source in real_speech.TURN_SOURCES for source in everyone]
    assert {clip.name.split(":")[0].split(" s ", 1)[1] for clip in paused if clip.held_out} == \
        {f"{Path(path).name} ({package})" for package, path, _, _ in real_speech.TURN_SOURCES}
    assert len(paused) >= 1.5 * len(complete)
    assert all(0.69 <= clip.pause[1] - clip.pause[0] <= 1.21 for clip in paused)
    assert all(2.0 <= len(clip.samples) / RATE - 4.5 <= 11.0 for clip in complete)  # 0.5 s lead, 4 s tail


def _judged(real_turns, overrides):
    """The bench's verdict on each clip; the words' verdict comes back at once (a fast machine's worst case)."""
    from s2s.bench.turns import Hearing, build_vad, judge
    from s2s.messages import TurnVerdict

    vad = build_vad(overrides)
    hearing = Hearing(overrides, delay_s=0.0) if TurnVerdict in vad.takes else None
    try:
        return [judge(vad, clip, hearing) for clip in real_turns]
    finally:
        vad.close()
        if hearing is not None:
            hearing.close()


def test_turn_silence_cuts_most_spliced_real_pauses_so_the_set_is_hard(real_turns):
    found = _judged(real_turns, ["turn=silence"])
    paused = [r for r, clip in zip(found, real_turns) if clip.pause]
    complete = [r for r, clip in zip(found, real_turns) if clip.pause is None]
    # measured 15 of 23 (the shortest pauses, 0.7 s, sometimes outlast Silero's hangover); the margin is wide
    assert sum(r["cut"] for r in paused) >= 0.4 * len(paused)
    assert all(r["turns"] == 1 and not r["cut"] for r in complete)  # a complete recording is one turn
    # ... but the speaker goes on within vad.resume_ms, so the turn that stands holds the whole sentence (measured:
    # all 23); without it, only the pauses that were not cut
    assert sum(r["whole"] for r in paused) >= 0.9 * len(paused)
    alone = [r for r, clip in zip(_judged(real_turns, ["turn=silence", "vad.resume_ms=null"]), real_turns)
             if clip.pause]
    assert [r["whole"] for r in alone] == [not r["cut"] for r in alone]


@pytest.mark.slow
def test_the_default_detector_keeps_real_pauses_whole_and_ends_complete_turns_within_the_target(real_turns):
    from s2s.bench.turns import PATIENCE_S

    # half the set, to be quick: the verdict at an instant does not depend on the pause's length, so 0.85 and 1.0 s
    # pauses stand for all; every other complete recording
    complete = [clip for clip in real_turns if clip.pause is None][::2]
    middle = ("paused 0.85", "paused 1.00")
    clips = complete + [clip for clip in real_turns if clip.pause and clip.name.startswith(middle)]
    found = _judged(clips, [])
    paused = [r for r, clip in zip(found, clips) if clip.pause]
    ends = [r["endpoint_s"] for r, clip in zip(found, clips) if clip.pause is None]
    # the target: at most 10% cut off (measured on the whole set: 2 of 23 with instant verdicts), no complete
    # turn over 1.5 s (measured: 1.41 s at most); the margins allow a clip or two more on another CPU
    assert sum(r["cut"] for r in paused) <= 0.1 * len(paused) + 2, [c.name for r, c in zip(found, clips) if r["cut"]]
    assert max(ends) <= PATIENCE_S + 0.1, ends  # real statements often wait it out: both must say done
    # ... but not where Smart Turn is sure (turn.sure_threshold): "... behind the curtain on the left." (words 0.09)
    # and "... than he was." (0.20) waited 1.4 s before it; measured (AVX2 EPYC): all six ended by 0.51 s under its
    # AVX2, AVX, GENERIC and two threads; float32 (STT and LLM) one waited 1.5 s, the margin's clip
    assert sum(end > 1.0 for end in ends) <= 1, ends


def test_without_the_archives_the_bench_says_what_to_run(tmp_path, capsys):
    from s2s.bench.turns import bench_turns

    assert bench_turns([], [["turn=silence"]], "real", tmp_path) == 1
    out = capsys.readouterr().out
    assert "scripts/setup.sh test" in out and str(tmp_path) in out and "pocketsphinx-5.1.1.tar.gz" in out
    with pytest.raises(FileNotFoundError, match="setup.sh test"):
        real_speech.recordings(tmp_path)


def _work_and_end(clip, **settings):
    """When the VAD let the last speculative segment of ``clip`` go, that segment, and when the turn ended."""
    from s2s import audio
    from s2s.messages import AudioChunk, SpeechSegment, TurnConfirmed
    from s2s.vad.silero import SileroVAD

    vad = SileroVAD(**settings)
    vad.setup()
    out = [message for block in audio.chunks(clip.samples, 512) for message in vad.process(AudioChunk(block, RATE))]
    out += list(vad.flush())
    speculative = [m for m in out if isinstance(m, SpeechSegment) and m.speculative]
    return speculative[-1], [m.at_s for m in out if isinstance(m, TurnConfirmed)]


def test_a_quiet_pause_starts_the_work_sooner_the_silence_rule_ends_the_turn_as_before_no_word_is_lost(real_turns):
    from s2s.bench.roundtrip import whisper_normalised_errors
    from s2s.stt.faster_whisper import FasterWhisperSTT

    said = {f"complete {recording.name}": recording.text for recording in real_speech.recordings()}
    stt = FasterWhisperSTT(window_s=10)
    stt.setup()
    sooner, errors, words = [], {"quiet": 0, "silero": 0}, 0
    for clip in [clip for clip in real_turns if clip.pause is None]:
        quiet, quiet_ends = _work_and_end(clip)  # vad.quiet_below's default (0.02)
        silero, silero_ends = _work_and_end(clip, quiet_below=None)
        # one turn, ended by turn=silence's rule (vad.min_silence_ms of Silero's silence) where it was
        assert len(quiet_ends) == 1 and quiet_ends == silero_ends, clip.name
        sooner.append(silero.closed_s - quiet.closed_s)
        for name, segment in (("quiet", quiet), ("silero", silero)):
            wrong, count = whisper_normalised_errors(said[clip.name], stt.transcribe(segment.samples)[0])
            errors[name] += wrong
        words += count
    # measured on the 12: never later, 0.03-0.13 s sooner on 7 (Silero heard speech that long past the last word)
    assert min(sooner) >= 0 and sum(s >= 0.05 for s in sooner) >= len(sooner) / 3, sooner
    # measured: 6 errors in 163 words against 5-6 (int8 and float32, one and two threads, AVX and GENERIC too)
    assert errors["quiet"] <= errors["silero"] + max(2, 0.02 * words), errors


def test_the_stt_hears_a_pause_a_frame_before_its_segment_goes_and_the_segment_takes_those_words(real_turns):
    """stt.at_pause: when a pause begins the VAD hands the STT the speech so far, zero-padded to the length the
    speculative segment will have; the segment, a frame later, then costs no decode of its own."""
    from s2s import audio
    from s2s.bench.roundtrip import whisper_normalised_errors
    from s2s.messages import AudioChunk, SpeechSegment, SpeechSoFar, Transcript
    from s2s.stt.faster_whisper import FasterWhisperSTT
    from s2s.vad.silero import FRAME, SileroVAD

    class Counting(FasterWhisperSTT):
        decodes = 0

        def transcribe(self, samples):
            self.decodes += 1
            return super().transcribe(samples)

    said = {f"complete {recording.name}": recording.text for recording in real_speech.recordings()}
    stt = Counting(window_s=10, at_pause=True)
    stt.setup()
    vad = SileroVAD()
    vad.wanted = frozenset({SpeechSoFar})  # as the graph tells it when the STT asks
    vad.setup()
    errors, words, free, total = {"taken": 0, "own": 0}, 0, 0, 0
    for clip in [clip for clip in real_turns if clip.pause is None]:
        vad.reset()
        stt.reset()
        last_pass, segments = None, []
        for index, block in enumerate(audio.chunks(clip.samples, FRAME)):
            for message in vad.process(AudioChunk(block, RATE)):
                if isinstance(message, SpeechSoFar) and message.paused:
                    last_pass = (index, message.samples)
                    list(stt.process(message))
                elif isinstance(message, SpeechSegment) and message.speculative:
                    at, heard = last_pass or (None, None)
                    before, total = stt.decodes, total + 1
                    segments.append((message, [m.text for m in stt.process(message) if isinstance(m, Transcript)]))
                    if at == index - 1:  # the pause began a frame ago: the same audio but for that frame, silence
                        assert len(heard) == len(message.samples) and not heard[-FRAME:].any(), clip.name
                        assert np.array_equal(heard[:-FRAME], message.samples[:-FRAME])
                        free += stt.decodes == before  # the segment took the pass's words (unless it was unsure)
        segment, texts = segments[-1]  # the turn's: it lasted
        for name, text in (("taken", " ".join(texts)), ("own", stt.recognise(segment.samples)[0])):
            wrong, count = whisper_normalised_errors(said[clip.name], text)
            errors[name] += wrong
        words += count
    # measured: 34 of 37 (36 in float32; the rest were passes Whisper was unsure of, or came at once after an
    # attempt dropped in a long quiet: decoded whole, as before); the words: 7 errors in 163 against 6 (AVX the
    # same, GENERIC 9 against 8, float32 6 and 6, two threads 7 and 6): the pass and the segment differ in casing,
    # punctuation and now and then a word either way
    assert free >= 0.8 * total and total >= 12, (free, total)
    assert errors["taken"] <= errors["own"] + max(2, 0.02 * words), errors


def test_whisper_hears_real_peoples_finished_sentences_end_and_their_halves_go_on(real_turns):
    """stt=faster_whisper's sentence_end (which weighs the words' verdict, turn.sentence_end): over the real set,
    the complete recordings score high and the first halves of the paused ones (up to the pause, 64 ms into it) low."""
    from s2s.stt.faster_whisper import FasterWhisperSTT

    stt = FasterWhisperSTT(window_s=10)
    stt.setup()
    scores: dict[bool, list[float]] = {True: [], False: []}
    for clip in real_turns:
        loud = np.flatnonzero(np.abs(clip.samples) > 0.02 * np.abs(clip.samples).max())
        end = int(clip.pause[0] * RATE) if clip.pause else loud[-1] + 1
        samples = clip.samples[int(0.4 * RATE):end + 1024]
        scores[clip.pause is None].append(stt.sentence_end(samples, stt.transcribe(samples)[0]))
    complete, halves = np.array(scores[True]), np.array(scores[False])
    # measured: complete 0.66-0.96 (median 0.84), halves median 0.29 with 5 of 23 over 0.7 ("Go forward", a sentence);
    # AVX, GENERIC, float32, two threads: complete median 0.84-0.87, all over 0.5; halves median 0.29-0.35, 4-5 over 0.7
    assert np.median(complete) >= 0.7 and np.mean(complete >= 0.5) >= 0.8, complete
    assert np.median(halves) <= 0.4 and np.mean(halves >= 0.7) <= 0.35, halves
