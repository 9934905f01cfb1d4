"""s2s in a program (s2s.api): an Agent fed audio as it comes, and the realtime server started and stopped."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from s2s import audio
from s2s.api import Agent, ConfigProblems, Server

KEY = "test-key-0123456789abcdef"


def test_an_agent_hears_what_a_program_feeds_at_any_rate_and_hands_back_the_reply(espeak, tmp_path):
    question = audio.read_audio(espeak("What is the capital of France?", tmp_path / "q.wav"), 44100)
    stereo = (np.stack([question, question], axis=1) * 32767).astype(np.int16)  # what a sound card gives
    pause = np.zeros((44100, 2), np.int16)
    replies, turns = [], []
    with Agent("llm=echo", on_audio=replies.append, on_turn=turns.append, output_dir=tmp_path / "run") as agent:
        for block in np.array_split(np.concatenate([pause, stereo, pause, pause]), 40):  # about 0.1 s each
            agent.feed(block, 44100)
    assert len(turns) == 1 and "capital" in turns[0]["user"].lower()
    assert turns[0]["assistant"] == turns[0]["user"]  # llm=echo says it back
    # one turn's audio (its number counts the VAD's attempts: a gap between espeak's words may start one and drop it)
    assert replies and len({reply.turn for reply in replies}) == 1
    spoken = sum(len(reply.samples) / reply.sample_rate for reply in replies)
    assert spoken > 1.0  # the whole echoed sentence, not a click
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["status"] == "completed" and len(metrics["turns"]) == 1
    assert (tmp_path / "run" / "transcript.jsonl").read_text().count("\n") == 1


def test_bad_overrides_raise_the_command_lines_lines_before_anything_loads(tmp_path):
    with pytest.raises(ConfigProblems) as raised:
        Agent("tts.pitch=3", "stt.beam_size=0", output_dir=tmp_path)
    problems = raised.value.problems
    assert any(line.startswith("tts.pitch=3: unknown key 'pitch'") for line in problems)
    assert any(line.startswith("stt.beam_size=0: invalid") for line in problems)
    with pytest.raises(ConfigProblems, match="_target_"):  # the allowlist holds here too
        Agent("+hydra.callbacks.evil._target_=os.system", output_dir=tmp_path)
    with pytest.raises(RuntimeError, match="start"):
        Agent("llm=echo", output_dir=tmp_path).feed(np.zeros(160, np.float32), 16000)


def test_a_program_starts_the_realtime_server_on_a_free_port_and_stops_it(tmp_path):
    with Server("llm=echo", "server.port=0", f"server.api_key={KEY}", output_dir=tmp_path) as server:
        assert server.url.startswith("ws://127.0.0.1:") and server.url.endswith("/v1/realtime")
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/sessions",
                                         headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200 and json.loads(response.read())["active"] == 0
    assert server.exit_code == 0
    with pytest.raises(OSError):  # the port is closed again
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=2)
