"""stt=openai against transformers serve's /v1/audio/transcriptions (a real server on 127.0.0.1, offline)
serving a tiny Whisper overfitted on two tones; key and reachability failures against a small FastAPI app."""
from __future__ import annotations

import pytest

from conftest import CACHE, compose_config
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import SpeechSegment, Transcript, TurnEnd
from s2s.stt.openai_stt import OpenAISTT, language_code
from tests.fixtures import openai_servers, tiny_whisper

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("multipart")  # python-multipart: transformers serve reads uploads with it


@pytest.fixture(scope="module")
def whisper_dir():
    return tiny_whisper.cached(CACHE / "models")


@pytest.fixture(scope="module")
def served(whisper_dir, tmp_path_factory):
    with openai_servers.transformers_serve(tmp_path_factory.mktemp("serve")) as base_url:
        yield base_url


def segment(frequency: float, rate: int = 16000, turn: int = 0) -> SpeechSegment:
    samples = tiny_whisper.tone(frequency, 1.5, rate)
    return SpeechSegment(samples, rate, turn, 0.0, 1.5)


@pytest.mark.parametrize("language", ["en", None])
def test_speech_becomes_the_servers_transcript(served, whisper_dir, language):
    stage = OpenAISTT(model=str(whisper_dir), base_url=served, language=language, timeout_s=60)
    stage.setup()
    try:
        [out] = list(stage.process(segment(220.0, rate=48000, turn=3)))  # resampled to 16 kHz before sending
        # transformers serve answers plain json (no language): the configured one, or none, reaches the transcript
        assert out == Transcript("hello world", 3, language)
        [out] = list(stage.process(segment(880.0)))
        assert out.text == "guten tag"
    finally:
        stage.close()


def test_an_unknown_model_fails_in_setup_naming_the_server(served):
    stage = OpenAISTT(model="no-such/whisper", base_url=served, timeout_s=60)
    with pytest.raises(RuntimeError) as caught:
        stage.setup()
    message = str(caught.value)
    assert "\n" not in message and served in message and "'no-such/whisper' is not served: HTTP" in message


def test_a_wrong_key_and_an_unreachable_server_fail_in_setup():
    with openai_servers.faulty_server() as root:
        with pytest.raises(RuntimeError, match=r"stt=openai at .*/keyed/v1: the server refused the API key "
                                               r"\(HTTP 401: Incorrect API key provided.\); set OPENAI_API_KEY"):
            OpenAISTT(base_url=f"{root}/keyed/v1", api_key="sk-wrong").setup()
    url = f"http://127.0.0.1:{openai_servers.free_port()}/v1"
    with pytest.raises(RuntimeError, match="no server answered .*ConnectError.*check stt.base_url"):
        OpenAISTT(base_url=url, timeout_s=2).setup()


def test_a_failing_request_drops_the_turn_not_the_session(served, whisper_dir, caplog):
    stage = OpenAISTT(model=str(whisper_dir), base_url=served, timeout_s=60)
    stage.setup()
    stage.model = "no-such/whisper"  # the server now answers 500 for every utterance
    try:
        *error, end = stage.process(segment(220.0, turn=9))
        assert end == TurnEnd(9) and [m.name for m in error] == ["stt_error"]
    finally:
        stage.close()
    assert any("turn 9: stt=openai" in record.message for record in caplog.records)


def test_verbose_json_language_names_become_codes():
    assert [language_code(x) for x in ("english", "German", "fr", None, "klingon")] == ["en", "de", "fr", None, None]


@pytest.mark.parametrize("override,fragment", [
    ("stt.language=xx", "stt.language=xx: invalid; expected one of"),
    ("stt.base_url=127.0.0.1:8000", "expected an http:// or https:// URL"),
])
def test_validation_names_key_value_and_what_is_valid(override, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config(["stt=openai", override], tmp_path))
