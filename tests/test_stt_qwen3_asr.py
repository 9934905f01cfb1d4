"""stt=qwen3_asr on a tiny Qwen3-ASR built from transformers' own classes and overfitted on two tones: the
language the model names labels each transcript, a configured one is forced, hotwords reach the model's prompt,
bad config fails before loading, and the stage runs in a composed pipeline whose replies carry the language."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from conftest import CACHE, compose_config
from s2s import audio
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.graph import Graph
from s2s.messages import Message, ReplyText, SpeechSegment, Transcript, TurnEnd
from s2s.stage import Source
from s2s.stt.qwen3_asr import LANGUAGES, Qwen3ASRSTT
from tests.fixtures import tiny_qwen3_asr
from tests.graph_stages import Collector


@pytest.fixture(scope="module")
def asr_dir():
    return tiny_qwen3_asr.cached(CACHE / "models")


def make(model, **options) -> Qwen3ASRSTT:
    stage = Qwen3ASRSTT(model=str(model), device="cpu", max_new_tokens=16, **options)
    stage.setup()
    stage.warm_up()
    return stage


@pytest.fixture(scope="module")
def stage(asr_dir):
    return make(asr_dir)


def segment(frequency: float, rate: int = 16000, turn: int = 0, language: str | None = None) -> SpeechSegment:
    return SpeechSegment(tiny_qwen3_asr.tone(frequency, 1.5, rate), rate, turn, 0.0, 1.5, language=language)


def prompt_text(stage: Qwen3ASRSTT, frequency: float = 220.0) -> str:
    """The prompt the stage builds for one utterance, as the real tokenizer reads its ids back."""
    ids = stage.inputs(tiny_qwen3_asr.tone(frequency, 1.5))["input_ids"][0]
    return stage._processor.tokenizer.decode(ids).replace("<|audio_pad|>", "")


def test_each_transcript_carries_the_language_the_model_named(stage):
    assert list(stage.process(segment(220.0, turn=1))) == [Transcript("hello world", 1, "en")]
    assert list(stage.process(segment(880.0, rate=44100, turn=2))) == [Transcript("guten tag", 2, "de")]
    assert "<|im_start|>assistant\n" == prompt_text(stage)[-len("<|im_start|>assistant\n"):]  # nothing prefilled


def test_the_language_is_read_from_what_the_model_writes(stage):
    """The real processor's decode of the model's own format; a name outside its table is an unknown language."""
    tokenizer = stage._processor.tokenizer
    for written, code in [("language French<asr_text>bonjour", "fr"), ("language Cantonese<asr_text>x", "yue"),
                          ("language None<asr_text>", None), ("language Klingon<asr_text>qapla", None)]:
        said = stage._processor.decode(tokenizer(written)["input_ids"], return_format="parsed")
        assert stage.language_code(said["language"]) == code, written


def test_the_languages_are_the_processors_own():
    from transformers.models.qwen3_asr.processing_qwen3_asr import LANGUAGE_CODE_TO_NAME

    assert LANGUAGES == tuple(LANGUAGE_CODE_TO_NAME)


def test_a_configured_or_session_language_is_forced(stage, asr_dir):
    # a realtime session's language on the segment: the processor prefills it, the model writes only the text
    assert list(stage.process(segment(880.0, turn=3, language="de"))) == [Transcript("guten tag", 3, "de")]
    assert stage.language is None  # the configured one is back for the next turn
    forced = make(asr_dir, language="de")
    assert prompt_text(forced).endswith("<|im_start|>assistant\nlanguage German<asr_text>")
    [out] = list(forced.process(segment(880.0, turn=4)))
    assert out == Transcript("guten tag", 4, "de")


def test_audio_without_words_ends_the_turn(stage):
    assert list(stage.process(SpeechSegment(audio.silence(1.5, 16000), 16000, 7, 0.0, 1.5))) == [TurnEnd(7)]


def test_hotwords_reach_the_models_system_turn(stage, asr_dir):
    assert "<|im_start|>system\n<|im_end|>" in prompt_text(stage)  # none configured: an empty system turn
    listed = Qwen3ASRSTT(model=str(asr_dir), device="cpu", context=tiny_qwen3_asr.HOTWORDS)
    listed._processor, listed._model = stage._processor, stage._model  # the same loaded pair, another context
    assert "<|im_start|>system\nQuilter, apostle<|im_end|>" in prompt_text(listed)
    tokenizer = stage._processor.tokenizer
    ids = listed.inputs(tiny_qwen3_asr.tone(220.0, 1.5))["input_ids"][0].tolist()
    words = tokenizer("Quilter, apostle", add_special_tokens=False)["input_ids"]
    assert any(ids[i:i + len(words)] == words for i in range(len(ids)))  # the words' own tokens, in order
    [out] = list(listed.process(segment(220.0, turn=5)))
    assert isinstance(out, (Transcript, TurnEnd)) and out.turn == 5


@pytest.mark.parametrize("override,fragment", [
    ("stt.language=english", "stt.language=english: invalid; expected one of ar, yue, zh"),
    ("stt.language=sw", "stt.language=sw: invalid; expected one of"),  # Whisper knows Swahili, Qwen3-ASR does not
    ("stt.model=/no/such/qwen3", "stt.model=/no/such/qwen3: invalid; expected an existing local model folder"),
    ("stt.context=[Quilter,'']", "stt.context=.*: invalid; expected a list of non-empty words"),
    ("stt.max_new_tokens=0", "stt.max_new_tokens=0: invalid; expected a number from 1 to 4096"),
])
def test_validation_names_key_value_and_what_is_valid(override, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config(["stt=qwen3_asr", override], tmp_path))


def test_a_folder_that_holds_no_model_fails_before_loading(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigErrors, match=r"stt.model=.*empty: invalid; expected a model folder with config.json"):
        validate(compose_config(["stt=qwen3_asr", f"stt.model={tmp_path / 'empty'}"], tmp_path))


def test_hotwords_from_the_command_line_are_a_list_or_a_string(tmp_path):
    def stt(override: str) -> Qwen3ASRSTT:
        spec = next(s for s in validate(compose_config(["stt=qwen3_asr", override], tmp_path)) if s.group == "stt")
        return spec.build()  # loads nothing

    assert stt("stt.context=[Quilter,apostle]").describe()["context"] == "Quilter, apostle"
    assert stt("stt.context='Mr. Quilter, the apostle'").describe()["context"] == "Mr. Quilter, the apostle"


class Tones(Source):
    """Two utterances as a VAD would hand them over: English, then German."""

    def stream(self) -> Iterator[Message]:
        yield segment(220.0, turn=0)
        yield segment(880.0, turn=1)


def test_a_composed_pipeline_carries_each_turns_language_to_the_reply(asr_dir, tmp_path):
    specs = {spec.group: spec for spec in validate(compose_config(
        ["stt=qwen3_asr", f"stt.model={asr_dir}", "stt.max_new_tokens=16", "llm=echo"], tmp_path))}
    assert specs["stt"].kwargs["device"] == "cpu"  # device auto, resolved for the platform
    sink = Collector()
    graph = Graph([("source", Tones()), ("stt", specs["stt"].build()), ("llm", specs["llm"].build()),
                   ("sink", sink)])
    graph.setup()
    try:
        assert graph.run().status == "completed"
    finally:
        graph.close()
    replies = [(m.turn, m.language) for _, m in sink.received if isinstance(m, ReplyText)]
    assert sorted(set(replies)) == [(0, "en"), (1, "de")]  # what a language-switching TTS is handed
