"""A server keeps its users' words out of its log and files unless ``server.log_transcripts=true``.

Real servers (``llm=echo``: the reply repeats what was heard) in subprocesses; everything they print and every
file under their run folder is searched for the words of a spoken turn.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from realtime_server import API_KEY, Events, RunningServer, openai_client, pcm16, send_speech

pytest.importorskip("websockets")
pytest.importorskip("openai")


def spoken_turn(server: RunningServer, question: Path) -> set[str]:
    """One spoken turn; the distinctive words (5+ letters) of what the server heard and said back."""
    with openai_client(server).realtime.connect(model="s2s") as connection:
        events = Events(connection)
        events.until("session.created", 60)
        send_speech(connection, pcm16(question))
        heard = events.until("conversation.item.input_audio_transcription.completed", 300).transcript
        said = events.until("response.done", 300).response.output[0].content[0].transcript
    server.wait_idle()
    found = set(re.findall(r"[a-z]{5,}", f"{heard} {said}".lower()))
    assert len(found) >= 2, (heard, said)
    return found


def left_behind(server: RunningServer, name: str = "*") -> str:
    """What the stopped server printed (its log) and wrote into files called ``name``, lower-cased."""
    assert server.stop() == 0, server.output[-3000:]
    files = [path for path in server.run_dir.rglob(name) if path.is_file()]
    return "\n".join([server.output, *(path.read_text(errors="replace") for path in files)]).lower()


@pytest.mark.parametrize("opted_in", [False, True], ids=["default", "log_transcripts"])
def test_a_server_logs_and_writes_the_words_of_a_turn_only_when_the_operator_opts_in(tmp_path, espeak, opted_in):
    question = espeak("The quick brown fox jumps over the lazy dog.", tmp_path / "question.wav")
    server = RunningServer(tmp_path / "run", "llm=echo", "server.max_sessions=1",
                           f"server.log_transcripts={str(opted_in).lower()}", env={"S2S_API_KEY": API_KEY})
    try:
        words = spoken_turn(server, question)
        status, document = server.get("/v1/sessions")
        assert status == 200 and document["sessions"][0]["summary"]["turns"] == 1
        shown = str(document).lower()
    finally:
        server.stop()
    everything = left_behind(server)
    transcripts = list(server.run_dir.rglob("transcript.jsonl"))
    if opted_in:
        assert words <= set(re.findall(r"[a-z]+", left_behind(server, "transcript.jsonl")))
        assert words <= set(re.findall(r"[a-z]+", server.output.lower()))  # the turn's log line
        assert words <= set(re.findall(r"[a-z]+", shown))
    else:
        assert not transcripts
        assert not words & set(re.findall(r"[a-z]+", everything)), sorted(words)
        assert not words & set(re.findall(r"[a-z]+", shown))
        assert re.search(r"turn \d+: voice-to-voice \d", server.output)  # the figures are still logged
