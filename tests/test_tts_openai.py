"""tts=openai against a real server on 127.0.0.1: a small FastAPI app whose /v1/audio/speech speaks with the
packaged Piper voice (the default TTS's model) and streams 24 kHz PCM16 in pieces, plus its faulty modes."""
from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import compose_config, run_cli
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import Metric, ReplyAudio, ReplyText
from s2s.platform import machine_context
from s2s.tts.openai_tts import OpenAITTS
from tests.fixtures import openai_servers

pytest.importorskip("openai")
pytest.importorskip("fastapi")

HERE = machine_context("tts")
TEXT = "The quick brown fox jumps over the lazy dog. Then it runs far away."


@pytest.fixture(scope="module")
def root():
    with openai_servers.faulty_server() as url:
        yield url


def make(url: str, **options) -> OpenAITTS:
    stage = OpenAITTS(**{"model": openai_servers.SPEECH_MODEL, "voice": "alloy", "base_url": url, "timeout_s": 30,
                         **options})
    stage.setup()
    return stage


def test_speech_streams_in_pieces_as_the_server_sends_them(root):
    from s2s.tts.piper import PiperTTS

    stage = make(f"{root}/record/v1")
    openai_servers.SPOKEN.clear()
    try:
        blocks = list(stage.process(ReplyText(TEXT, 4)))
    finally:
        stage.close()
    assert all(isinstance(block, ReplyAudio) and block.sample_rate == 24000 and block.turn == 4 for block in blocks)
    assert len(blocks) > 10  # the server's 0.1 s pieces, not one block at the end
    samples = np.concatenate([block.samples for block in blocks])
    piper = PiperTTS()
    piper.setup()
    direct = sum(len(block) for block in piper.synthesize(TEXT, None)) / piper.sample_rate
    assert abs(len(samples) / 24000 - direct) < 0.25 * direct  # the voice's own length (pauses shortened)
    assert np.abs(samples).max() > 0.1, "speech, not silence"
    [body] = openai_servers.SPOKEN
    assert body == {"model": "m", "voice": "alloy", "input": TEXT, "response_format": "pcm"}


def test_speed_and_instructions_reach_the_server_and_change_in_place(root):
    stage = make(f"{root}/record/v1", speed=1.5, instructions="Speak softly.")
    openai_servers.SPOKEN.clear()
    try:
        fast = sum(len(b.samples) for b in stage.process(ReplyText(TEXT, 0)))
        assert stage.apply_settings({"voice": "verse", "speed": 1.0, "instructions": None}, HERE)  # model kept
        normal = sum(len(b.samples) for b in stage.process(ReplyText(TEXT, 1)))
    finally:
        stage.close()
    first, second = openai_servers.SPOKEN
    assert (first["speed"], first["instructions"], first["voice"]) == (1.5, "Speak softly.", "alloy")
    assert second["voice"] == "verse" and "speed" not in second and "instructions" not in second
    assert fast < 0.8 * normal  # Piper behind the server spoke faster


def test_closing_the_reply_closes_the_servers_stream(root):
    stage = make(f"{root}/slow/v1")
    openai_servers.STREAMS_ENDED.clear()
    try:
        replies = stage.process(ReplyText(TEXT, 0))
        next(replies)  # the first piece is out; the server would go on for a minute
        replies.close()  # barge-in: the runner closes the stage's generator
        closed = time.monotonic()
        deadline = closed + 10
        while not openai_servers.STREAMS_ENDED and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stage.close()
    assert openai_servers.STREAMS_ENDED and openai_servers.STREAMS_ENDED[0] - closed < 1.0


def test_a_server_dropping_mid_chunk_costs_that_chunk_not_the_run(root, caplog):
    stage = make(f"{root}/record/v1")
    openai_servers.DROP_SPEECH[0] = 1
    try:
        dropped = list(stage.process(ReplyText(TEXT, 7)))
        after = list(stage.process(ReplyText(TEXT, 8)))
    finally:
        stage.close()
        openai_servers.DROP_SPEECH[0] = 0
    # what came before the drop was said: the audio before the error, and the pause the shaper still held after it
    # (whether it held any depends on where the stream was cut)
    [error] = [m for m in dropped if not isinstance(m, ReplyAudio)]
    assert dropped.index(error) > 0 and dropped.index(error) >= len(dropped) - 2
    assert isinstance(error, Metric) and error.name == "tts_error" and "failed mid-chunk" in error.extra["error"]
    assert any("turn 7: a reply chunk was not said" in record.message for record in caplog.records)
    assert len(after) > 10 and all(isinstance(m, ReplyAudio) for m in after)  # the next chunk is whole


@pytest.mark.parametrize("options,fragment", [
    ({"model": "nope"}, r"model 'nope' with voice 'alloy' is not served: HTTP 404: The model 'nope' does not exist "
                        r"\(it lists: m\); check tts.model and tts.voice"),
    ({"voice": "nobody"}, r"voice 'nobody' is not served: HTTP 400: Voice 'nobody' not found; available: alloy"),
])
def test_an_unknown_model_or_voice_fails_in_setup_naming_the_server(root, options, fragment):
    with pytest.raises(RuntimeError, match=fragment) as caught:
        make(f"{root}/record/v1", **options)
    assert "\n" not in str(caught.value) and f"{root}/record/v1" in str(caught.value)


def test_a_wrong_key_and_an_unreachable_server_fail_in_setup(root):
    with pytest.raises(RuntimeError, match=r"tts=openai at .*/keyed/v1: the server refused the API key "
                                           r"\(HTTP 401: Incorrect API key provided.\); set OPENAI_API_KEY"):
        make(f"{root}/keyed/v1", api_key="sk-wrong")
    make(f"{root}/keyed/v1", api_key=openai_servers.API_KEY).close()  # the right one speaks
    url = f"http://127.0.0.1:{openai_servers.free_port()}/v1"
    with pytest.raises(RuntimeError, match="no server answered .*ConnectError.*check tts.base_url"):
        make(url, timeout_s=2)


@pytest.mark.parametrize("override,fragment", [
    ("tts.base_url=127.0.0.1:8880", "expected an http:// or https:// URL"),
    ("tts.speed=5", "tts.speed=5: invalid"),
    ("tts.sample_rate=1000", "tts.sample_rate=1000: invalid"),
    ("tts.voice=' '", "a voice name the server knows"),
])
def test_validation_names_key_value_and_what_is_valid(override, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config(["tts=openai", override], tmp_path))


def test_the_pipeline_speaks_through_the_server_end_to_end(root, tmp_path):
    """python run.py tts=openai on the bundled question: the reply.wav is what the server said."""
    import soundfile

    openai_servers.SPOKEN.clear()
    result = run_cli("llm=echo", "tts=openai", f"tts.base_url={root}/record/v1", "tts.model=m", "tts.voice=ash",
                     "runner.warm_up=false", f"hydra.run.dir={tmp_path}", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    reply, rate = soundfile.read(tmp_path / "reply.wav")
    assert len(reply) / rate > 1.0 and np.abs(reply).max() > 0.1
    spoken = [body for body in openai_servers.SPOKEN if body["input"] != "Hi."]  # setup's probe aside
    assert spoken and all(body["voice"] == "ash" for body in spoken)
    assert "OpenAITTS" in result.stdout + result.stderr
