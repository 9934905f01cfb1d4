"""Visemes (``speech_to_speech.output_audio.visemes``) through a real server session: opt-in, timed on the audio.

The shared ``llm=echo`` server (conftest's ``echo_server``, the embedded Piper voice) speaks typed turns back; the
shapes are checked against the audio the client received: they tile it, ahead of it, and silence in it is the
silent shape while voiced sound is not. A few synthetic sounds check the shapes themselves.
"""
from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest

from realtime_server import Events, openai_client, reply_audio
from s2s.server.visemes import EVENT, VisemeTrack

pytest.importorskip("websockets")
pytest.importorskip("openai")

RATE = 24000
SENTENCES = "Hello there. How are you today? I am fine, thank you. See you soon."
LONG = " ".join(["The quick brown fox jumps over the lazy dog, and the dog sleeps on."] * 10)


def ask(connection, events: Events, text: str) -> Any:
    """A typed turn and ``response.create``; returns ``response.created``."""
    connection.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})
    connection.response.create()
    return events.until("response.created", 60)


def visemes_on(connection, events: Events, on: bool = True) -> Any:
    connection.send_raw(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "audio": {"output": {"visemes": on}}}}))
    return events.until("session.updated", 30)


def of_response(events: Events, response_id: str) -> list[Any]:
    return [e for e in events.all if getattr(e, "response_id", None) == response_id]


def cues_of(events: list[Any]) -> list[dict]:
    return [cue for e in events if e.type == EVENT for cue in e.visemes]


def frame_levels(samples: np.ndarray, frame_s: float = 0.02) -> np.ndarray:
    """dBFS of each ``frame_s`` of int16 samples."""
    size = int(frame_s * RATE)
    frames = samples[:len(samples) // size * size].astype(np.float64).reshape(-1, size) / 32768.0
    return 10 * np.log10(np.maximum((frames ** 2).mean(axis=1), 1e-12))


def shape_at(cues: list[dict], seconds: float) -> int:
    return next(cue["viseme"] for cue in cues if cue["start_s"] <= seconds < cue["end_s"])


def test_visemes_come_only_when_asked_and_tile_the_audio_ahead_of_it(echo_server):
    echo_server.wait_idle()  # one session at a time: the previous test's may still be closing
    with openai_client(echo_server).realtime.connect(model="s2s") as connection:
        events = Events(connection)
        assert not hasattr(events.until("session.created", 30).session.audio.output, "visemes")
        plain = ask(connection, events, SENTENCES).response.id
        events.until("response.done", 120)
        assert not events.of(EVENT), "no visemes for a session that did not ask"

        connection.send_raw(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"visemes": "yes"}}}}))
        error = events.until("error", 30).error
        assert error.code == "invalid_type" and error.param == "session.audio.output.visemes"
        assert visemes_on(connection, events).session.audio.output.visemes is True
        asked = ask(connection, events, SENTENCES).response.id
        done = events.until("response.done", 120)
        assert done.response.status == "completed"

    mine = of_response(events, asked)
    assert not cues_of(of_response(events, plain))
    shaped = [e for e in mine if e.type == EVENT]
    item_id = next(e.item_id for e in mine if e.type == "response.output_audio.delta")
    assert len(shaped) >= 2 and all(e.item_id == item_id and e.output_index == 0 and e.content_index == 0
                                    for e in shaped)
    # each event comes just before the audio it describes: its first shape starts where the audio sent ends
    sent_s = 0.0
    for e in mine:
        if e.type == "response.output_audio.delta":
            sent_s += len(reply_audio([e])) / RATE
        elif e.type == EVENT:
            assert abs(e.visemes[0]["start_s"] - sent_s) < 0.002, (e.visemes[0], sent_s)
        elif e.type == "response.output_audio.done":
            assert not [later for later in mine[mine.index(e):] if later.type == EVENT]
    samples = reply_audio(mine)
    duration = len(samples) / RATE
    cues = cues_of(mine)
    assert cues[0]["start_s"] == 0.0 and abs(cues[-1]["end_s"] - duration) < 0.1, (cues[-1], duration)
    assert all(0 <= cue["viseme"] <= 21 and cue["start_s"] < cue["end_s"] for cue in cues)
    assert all(abs(b["start_s"] - a["end_s"]) < 0.002 for a, b in zip(cues, cues[1:])), "monotonic, no gap"

    levels = frame_levels(samples)
    middles = (np.arange(len(levels)) + 0.5) * 0.02
    shapes = np.array([shape_at(cues, t) for t in middles])
    silent, voiced = levels < -60, levels > -35
    assert silent.sum() >= 5 and voiced.sum() >= 20, (silent.sum(), voiced.sum())
    assert (shapes[silent] == 0).mean() >= 0.9, "silence is the silent shape"
    assert (shapes[voiced] != 0).mean() >= 0.95, "voiced sound opens the mouth"
    assert len(set(shapes[voiced].tolist())) >= 4, "the mouth changes shape with the sound, not only opens"


def test_a_cancelled_response_stops_its_visemes(echo_server):
    echo_server.wait_idle()  # one session at a time: the previous test's may still be closing
    with openai_client(echo_server).realtime.connect(model="s2s") as connection:
        events = Events(connection)
        events.until("session.created", 30)
        visemes_on(connection, events)
        response_id = ask(connection, events, LONG).response.id
        events.until(EVENT, 120, lambda e: e.response_id == response_id)
        connection.response.cancel()
        done = events.until("response.done", 60, lambda e: e.response.id == response_id)
        assert done.response.status == "cancelled"
        time.sleep(2.0)  # whatever was still on its way for it
        visemes_on(connection, events)  # a round trip: everything the server sent before is in
        after = events.all[events.all.index(done) + 1:]
    assert not [e for e in after if e.type == EVENT and e.response_id == response_id]
    mine = of_response(events, response_id)
    cues, heard_s = cues_of(mine), len(reply_audio(mine)) / RATE
    assert cues and abs(cues[-1]["end_s"] - heard_s) < 0.01, "the shapes stop where the audio stopped"
    assert heard_s < 20, "cancelled long before the end of its ~40 s of audio"


def vowel(f1: float, f2: float, seconds: float = 0.4, f0: float = 120) -> np.ndarray:
    """A sustained vowel: a pulse train through resonators at its formants (and two higher ones)."""
    from scipy.signal import lfilter

    signal = np.zeros(int(RATE * seconds))
    signal[::int(RATE / f0)] = 1.0
    for frequency, bandwidth in ((f1, 80), (f2, 100), (2600, 150), (3400, 200)):
        radius, angle = np.exp(-np.pi * bandwidth / RATE), 2 * np.pi * frequency / RATE
        signal = lfilter([1 - radius], [1, -2 * radius * np.cos(angle), radius ** 2], signal)
    return 0.3 * signal / np.abs(signal).max()


def noise(low: float, high: float, seconds: float = 0.4) -> np.ndarray:
    from scipy.signal import butter, sosfilt

    band = butter(4, [low, high], "bandpass", fs=RATE, output="sos")
    return 0.1 * sosfilt(band, np.random.default_rng(0).standard_normal(int(RATE * seconds)))


@pytest.mark.parametrize("sound,shape", [
    (lambda: vowel(280, 2250), 6), (lambda: vowel(750, 1100), 2), (lambda: vowel(320, 880), 7),
    (lambda: vowel(660, 1720), 1), (lambda: vowel(480, 900), 8), (lambda: noise(5000, 10000), 15),
    (lambda: noise(2500, 4500), 16), (lambda: np.zeros(RATE // 2), 0),
], ids=["i", "ah", "u", "ae", "o", "s", "sh", "silence"])
def test_a_sustained_sound_is_mostly_its_shape(sound, shape):
    cues = VisemeTrack().feed(sound(), RATE)
    held = sum(cue["end_s"] - cue["start_s"] for cue in cues if cue["viseme"] == shape)
    assert held >= 0.8 * cues[-1]["end_s"], cues


def test_a_track_keeps_the_response_clock_across_blocks_and_rates():
    track = VisemeTrack()
    first = track.feed(vowel(750, 1100, seconds=0.25), RATE)
    second = track.feed(np.zeros(800), 16000)  # a block at another rate: its seconds, not its samples
    assert first[0]["start_s"] == 0.0 and second[0]["start_s"] == first[-1]["end_s"] == 0.25
    assert second == [{"viseme": 0, "start_s": 0.25, "end_s": 0.3}]
    assert track.feed(np.zeros(0), RATE) == []
    tail = track.feed(vowel(750, 1100)[:3], RATE)  # a resampler's last samples: too short to read, still timed
    assert len(tail) == 1 and tail[0]["start_s"] == 0.3 and tail[0]["end_s"] == round(0.3 + 3 / RATE, 3)
