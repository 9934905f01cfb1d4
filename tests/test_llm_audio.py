"""stt=none: the VAD's utterances go straight to llm=openai as ``input_audio`` parts.

Against transformers serve on 127.0.0.1 (offline) serving a tiny Qwen2-Audio model overfitted on what it hears
(tests/fixtures/tiny_audio_lm.py): the server decodes the audio and the model's answer depends on it, turn after
turn, and a whole run on the bundled question answers it. The request's exact shape is read at the small FastAPI
app's ``/record/v1`` and checked against the ``openai`` SDK's own types. The config refuses the combinations that
cannot work before anything loads.
"""
from __future__ import annotations

import base64
import io
import json
from typing import Optional

import numpy as np
import pytest

from conftest import CACHE, compose_config
from s2s import job
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.llm.base import SPOKEN_TURN
from s2s.llm.openai_lm import OpenAILM
from s2s.messages import Metric, ReplyText, SpeechSegment, Transcript, TurnEnd
from tests.fixtures import openai_servers, tiny_audio_lm, tiny_whisper

RECORDED = "It is noted."  # what /record/v1 answers every chat request

pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("librosa")  # transformers serve decodes input_audio with it (or torchcodec)


@pytest.fixture(scope="module")
def audio_lm():
    return tiny_audio_lm.cached(CACHE / "models", SPOKEN_TURN)


@pytest.fixture(scope="module")
def served(audio_lm, tmp_path_factory):
    with openai_servers.transformers_serve(tmp_path_factory.mktemp("serve")) as base_url:
        yield base_url


def make(base_url: str, model: str, **options) -> OpenAILM:
    stage = OpenAILM(model=model, base_url=base_url, **{"system_prompt": None, "temperature": 0.0,
                                                        "max_tokens": 40, "timeout_s": 60, **options})
    stage.setup()
    return stage


def replies(out: list) -> list[str]:
    return [message.text for message in out if isinstance(message, ReplyText)]


def test_the_server_hears_each_utterance_and_the_history_keeps_a_note(served, audio_lm):
    stage = make(served, str(audio_lm))
    low = tiny_audio_lm.sound("low")
    high = tiny_whisper.tone(880.0, 1.0, 48000)  # a 48 kHz segment is sent at 16 kHz
    try:
        first = list(stage.process(SpeechSegment(low, 16000, 0, 0.0, 1.0)))
        second = list(stage.process(SpeechSegment(high, 48000, 1, 2.0, 3.0)))
    finally:
        stage.close()
    assert isinstance(first[0], Metric) and first[0].name == "llm_first_token_s"
    # released as they end, before the reply does
    assert len(replies(first)) >= 2 and " ".join(replies(first)) == tiny_audio_lm.LOW_REPLY
    assert " ".join(replies(second)) == tiny_audio_lm.HIGH_REPLY
    assert first[-1] == TurnEnd(0) and second[-1] == TurnEnd(1)
    # the model answered the second tone after the first turn's note: only the current turn carries audio
    assert stage.context.history() == [
        {"role": "user", "content": SPOKEN_TURN}, {"role": "assistant", "content": tiny_audio_lm.LOW_REPLY},
        {"role": "user", "content": SPOKEN_TURN}, {"role": "assistant", "content": tiny_audio_lm.HIGH_REPLY}]


def test_the_request_is_chat_completions_input_audio_as_the_sdk_types_it():
    import soundfile
    from openai.types.chat import ChatCompletionContentPartParam, ChatCompletionMessageParam
    from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
    from pydantic import ConfigDict, TypeAdapter

    strict = ConfigDict(extra="forbid")  # a key the SDK does not declare is a mistake, not an extension
    # (pydantic takes a config for unions only: the request's TypedDict goes in as Optional)
    request, message, part_of = (TypeAdapter(kind, config=strict) for kind in (
        Optional[CompletionCreateParamsStreaming], ChatCompletionMessageParam, ChatCompletionContentPartParam))

    low = tiny_audio_lm.sound("low")
    with openai_servers.faulty_server() as root:
        stage = make(f"{root}/record/v1", "m", system_prompt="Be brief.")
        openai_servers.RECEIVED.clear()
        try:
            list(stage.process(SpeechSegment(low, 16000, 0, 0.0, 1.0)))
            list(stage.process(Transcript("And now in words?", 1)))  # a typed turn still goes as text
            list(stage.process(SpeechSegment(low, 16000, 2, 4.0, 5.0)))
        finally:
            stage.close()
    bodies = list(openai_servers.RECEIVED)  # the server lists model "m": setup sent no probe
    assert len(bodies) == 3
    for body in bodies:  # what the openai SDK itself declares a streamed chat request to be
        request.validate_python(body)
        for each in body["messages"]:  # (pydantic checks an Iterable's items lazily: each one here)
            message.validate_python(each)
            for part in each["content"] if isinstance(each["content"], list) else ():
                part_of.validate_python(part)
    first, _, third = (body["messages"] for body in bodies)
    assert first[0] == {"role": "system", "content": "Be brief."}
    [part] = first[-1]["content"]
    assert first[-1]["role"] == "user" and part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(part["input_audio"]["data"])), dtype="float32")
    assert rate == 16000 and np.abs(samples - low).max() < 1e-3  # the utterance itself, 16-bit
    # the third request: earlier turns as text (the audio turn as a note), the current one as audio
    assert [m["content"] for m in third[1:-1]] == [SPOKEN_TURN, RECORDED, "And now in words?", RECORDED]
    assert third[-1]["content"][0]["type"] == "input_audio"
    assert sum("input_audio" in json.dumps(m) for m in third) == 1


def test_a_whole_run_answers_the_spoken_question(served, audio_lm, tmp_path):
    """python run.py stt=none llm=openai ... on the bundled question: VAD -> LLM (audio) -> TTS -> reply.wav."""
    import soundfile

    cfg = compose_config(["stt=none", "llm=openai", f"llm.base_url={served}", f"llm.model={audio_lm}",
                          "llm.system_prompt=null", "llm.temperature=0", "llm.timeout_s=60", "turn=silence",
                          "runner.warm_up=false"], tmp_path)
    assert cfg.pipeline == ["source", "vad", "llm", "tts", "sink"]
    assert job.run(cfg) == 0
    [record] = [json.loads(line) for line in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    assert record["assistant"] == tiny_audio_lm.QUESTION_REPLY and record["user"] == ""
    assert record["timings"]["llm_total_s"] > 0 and record["timings"]["stt_s"] is None  # no STT ran
    reply, rate = soundfile.read(tmp_path / "reply.wav")
    assert len(reply) / rate > 1.0 and np.abs(reply).max() > 0.1


@pytest.mark.parametrize("overrides,key,fragments", [
    (["stt=none"], "stt", ["before llm (s2s.llm.onnx_lm.OnnxLM), which reads text only",
                           "stt=faster_whisper", "works only with llm=openai"]),
    (["stt=none", "llm=transformers"], "stt", ["llm (s2s.llm.transformers_lm.TransformersLM)", "llm=openai"]),
    (["stt=none", "llm=openai", "llm.base_url=http://127.0.0.1:8000/v1", "llm.model=m", "llm.api=responses"],
     "llm.api", ["chat_completions with stt=none"]),
    (["stt=none", "llm=openai", "llm.base_url=https://api.openai.com/v1", "llm.model=gpt-4.1-mini"],
     "llm.model", ["a model that takes audio", "gpt-audio"]),
])
def test_combinations_that_cannot_hear_fail_before_anything_loads(overrides, key, fragments, tmp_path):
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config(overrides, tmp_path))
    [error] = caught.value.errors
    assert error.key == key and all(fragment in str(error) for fragment in fragments), str(error)


def test_the_realtime_server_refuses_stt_none_at_config_time(tmp_path):
    cfg = compose_config(["stt=none", "llm=openai", "llm.base_url=http://127.0.0.1:8000/v1", "llm.model=m",
                          "server=realtime"], tmp_path)
    specs, errors = job.problems(cfg)
    assert specs == [] and [(e.key, e.value) for e in errors] == [("stt", "none")]
    assert "an STT with server=realtime" in str(errors[0])


def test_audio_models_validate_with_stt_none(tmp_path):
    for model in ("gpt-audio-mini", "gpt-4o-mini-audio-preview"):
        specs = validate(compose_config(["stt=none", "llm=openai", "llm.base_url=https://api.openai.com/v1",
                                         f"llm.model={model}"], tmp_path))
        assert [spec.group for spec in specs] == ["source", "vad", "llm", "tts", "sink"]
