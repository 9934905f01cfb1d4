"""A session's settings: an update is checked whole and applies all or nothing; the view shows what is in effect."""
from __future__ import annotations

from typing import Literal

import pytest

from conftest import compose_config
from s2s.config import StageSpec, validate
from s2s.config_errors import ConfigErrors
from s2s.server.pipelines import Pool
from s2s.server.protocol import ProtocolError, SessionUpdate, TurnDetection
from s2s.server.session_settings import SessionSettings, StageRules
from s2s.platform import machine_context
from s2s.tts.base import TTSStage

VAD = {"threshold": 0.5, "min_silence_ms": 700, "speech_pad_ms": 100, "onnx": True}


class Rules:
    """Stand-in for what the stages accept: every value is fine unless named here."""

    def __init__(self, locked=False, voices=("jf_alpha", "jm_kumo"), takes_instructions=True, tools=True,
                 max_threshold=0.9):
        self.locked, self.voices, self.takes_instructions, self.tools = locked, voices, takes_instructions, tools
        self.max_threshold = max_threshold

    def voice_locked(self):
        return self.locked

    def voice_problem(self, voice):
        return None if voice in self.voices else f"voice={voice} is not accepted"

    def instructions_problem(self):
        return None if self.takes_instructions else "llm EchoStub takes no instructions"

    def vad_problem(self, overrides):
        return "threshold too high" if overrides.get("threshold", 0) > self.max_threshold else None

    def tools_problem(self, tools):
        return None if self.tools or not tools else "this LLM has no tool calling"


def initial() -> SessionSettings:
    return SessionSettings(instructions="Be kind.", voice="jf_alpha", vad_defaults=VAD)


TOOL = {"type": "function", "name": "get_weather", "description": "", "parameters": {"type": "object"}}


def test_an_update_changes_only_what_it_names_and_returns_new_settings():
    settings = initial()
    new = settings.apply(SessionUpdate(instructions="Be brief.", output_rate=16000), Rules())
    assert (new.instructions, new.output_rate, new.voice, new.input_rate) == ("Be brief.", 16000, "jf_alpha", 24000)
    assert settings.instructions == "Be kind." and settings.output_rate == 24000  # a value: the old one stays
    detection = TurnDetection(threshold=0.6, silence_duration_ms=400)
    new = new.apply(SessionUpdate(turn_detection=detection, tools=[TOOL], tool_choice="none"), Rules())
    assert new.vad_overrides == {"threshold": 0.6, "min_silence_ms": 400} and new.instructions == "Be brief."
    assert new.tools == [TOOL] and new.tool_choice == "none"


@pytest.mark.parametrize("update,rules,code,param", [
    (SessionUpdate(instructions="Hi.", voice="alloy"), Rules(), "invalid_value", "session.audio.output.voice"),
    (SessionUpdate(instructions="Hi.", voice="jm_kumo"), Rules(locked=True), "cannot_update_voice",
     "session.audio.output.voice"),
    (SessionUpdate(voice="jm_kumo", instructions="Hi."), Rules(takes_instructions=False), "invalid_value",
     "session.instructions"),
    (SessionUpdate(instructions="Hi.", turn_detection=TurnDetection(threshold=0.95)), Rules(), "invalid_value",
     "session.audio.input.turn_detection"),
    (SessionUpdate(instructions="Hi.", output_rate=16000, tools=[TOOL]), Rules(tools=False),
     "tools_not_supported", "session.tools"),
])
def test_one_bad_part_refuses_the_whole_update(update, rules, code, param):
    settings = initial()
    with pytest.raises(ProtocolError) as refused:
        settings.apply(update, rules, "evt_1")
    assert (refused.value.code, refused.value.param, refused.value.event_id) == (code, param, "evt_1")
    assert settings == initial()  # nothing of the good parts was applied


def test_the_voice_may_be_named_again_once_locked_and_tools_may_always_be_taken_away():
    settings = initial()
    assert settings.apply(SessionUpdate(voice="jf_alpha"), Rules(locked=True)).voice == "jf_alpha"
    assert settings.apply(SessionUpdate(tools=[]), Rules(tools=False)).tools == []


def test_the_view_shows_the_effective_settings():
    settings = initial().apply(SessionUpdate(input_rate=16000, voice="jm_kumo", tools=[TOOL],
                                             turn_detection=TurnDetection(silence_duration_ms=300,
                                                                          interrupt_response=False)), Rules())
    view = settings.view("sess_1", "s2s-test", "tiny.en")
    assert (view["id"], view["model"], view["instructions"], view["tools"]) == ("sess_1", "s2s-test", "Be kind.",
                                                                                 [TOOL])
    audio_in, audio_out = view["audio"]["input"], view["audio"]["output"]
    assert audio_in["format"]["rate"] == 16000 and audio_out == {"format": {"type": "audio/pcm", "rate": 24000},
                                                                 "voice": "jm_kumo", "speed": 1.0}
    assert audio_in["transcription"] == {"model": "tiny.en"}
    detection = audio_in["turn_detection"]  # the client's value where it gave one, the configured VAD's elsewhere
    assert (detection["threshold"], detection["silence_duration_ms"], detection["prefix_padding_ms"]) == (0.5, 300,
                                                                                                         100)
    assert detection["interrupt_response"] is False and detection["create_response"] is True


def test_stage_rules_ask_the_configured_stages(tmp_path):
    cfg = compose_config(["llm=echo", "tts=kokoro_onnx", "server=realtime"], tmp_path)
    specs = {spec.group: spec for spec in validate(cfg)}
    rules = StageRules(cfg, specs["vad"], specs["tts"], specs["llm"].build(), lambda: False)
    assert rules.voice_problem("jm_kumo") is None
    problem = rules.voice_problem("alloy")
    assert problem.startswith("voice=alloy is not accepted by tts=KokoroOnnxTTS; expected one of") and \
        "jf_alpha" in problem
    assert rules.vad_problem({"threshold": 3}).startswith("threshold=3 is not accepted by vad=SileroVAD")
    assert rules.vad_problem({"threshold": 0.4, "min_silence_ms": 400}) is None
    assert rules.instructions_problem() is None and rules.tools_problem([]) is None
    assert not rules.voice_locked()


def test_each_tts_declares_voice_and_speed_keys_of_its_own_constructor():
    import importlib
    import inspect

    from omegaconf import OmegaConf

    from conftest import CONF_DIR
    from s2s.tts import base

    targets = {OmegaConf.load(path).get("_target_") for path in (CONF_DIR / "tts").glob("*.yaml")} - {None}
    classes = [getattr(importlib.import_module(target.rpartition(".")[0]), target.rpartition(".")[2])
               for target in sorted(targets)]  # every backend a config names, a new one included
    keys = {cls.__name__: (cls.voice_key, cls.speed_key) for cls in classes}
    assert {"PiperTTS", "SupertonicTTS", "Qwen3TTS", "ChatTTSTTS"} <= set(keys)
    assert keys["PiperTTS"] == ("speaker", "speed") and keys["KokoroOnnxTTS"] == ("voice", "speed")
    assert keys["ChatTTSTTS"] == (None, None) and keys["MmsTTS"] == (None, "speaking_rate")
    for cls in classes:
        assert issubclass(cls, base.TTSStage)
        parameters = inspect.signature(cls.__init__).parameters
        assert all(key is None or key in parameters for key in (cls.voice_key, cls.speed_key)), cls
        assert cls.runtime_keys <= set(parameters), cls  # what changes in place is a constructor keyword
    runtime = {cls.__name__: cls.runtime_keys for cls in classes}
    assert {"speaker", "speed"} <= runtime["PiperTTS"] and runtime["KokoroOnnxTTS"] == {"voice", "speed"}
    assert runtime["KokoroTTS"] == {"voice", "speed"} and runtime["MmsTTS"] == {"speaking_rate"}
    assert not runtime["PocketTTS"] and not runtime["Qwen3TTS"] and not runtime["ChatTTSTTS"]  # rebuilt


class Voices(TTSStage):
    """A TTS whose voice changes in place: counts its setups (a reload) and what it was set to."""

    runtime_keys = frozenset({"voice"})
    voice_key = "voice"

    def __init__(self, voice: Literal["a", "b"] = "a", model: str = "m") -> None:
        self.voice, self.model, self.setups, self.changed = voice, model, 0, []

    def setup(self) -> None:
        self.setups += 1

    def settings_changed(self, keys):
        self.changed.append(self.voice)


def test_a_voice_changed_in_place_is_judged_by_the_config_rules_and_set_back_on_release():
    from s2s.llm.echo import EchoLM
    from s2s.vad.silero import SileroVAD

    spec = lambda group, cls: StageSpec(group, f"tests.{cls.__name__}", cls, {})  # noqa: E731
    # the VAD is the session's (never built by the pool): a real one, so the pool finds it by what it takes
    from graph_stages import Recognizer

    pool = Pool([spec("source", Voices), spec("vad", SileroVAD), spec("stt", Recognizer), spec("llm", EchoLM),
                 spec("tts", Voices), spec("sink", Voices)], size=1)
    pool.setup(warm_up=False)
    pipeline = pool.acquire()
    tts = dict(pipeline.stages)["tts"]
    assert pipeline.change_in_place("tts", {"voice": "b"}, machine_context("tts"))
    assert (tts.voice, tts.setups, tts.changed) == ("b", 1, ["b"])
    with pytest.raises(ConfigErrors, match="tts.voice=c: invalid"):
        tts.apply_settings({"voice": "c"}, machine_context("tts"))
    assert not pipeline.change_in_place("tts", {"model": "n"}, machine_context("tts")) and tts.model == "m"
    pool.give_back(pipeline)
    assert (tts.voice, tts.setups, tts.changed) == ("a", 1, ["b", "a"])  # the next session hears the config's
    pool.give_back(pool.acquire())
    assert tts.changed == ["b", "a"]  # nothing to set back


def test_piper_maps_the_voice_onto_its_speaker_and_keeps_it_for_openai_voice_names(tmp_path):
    cfg = compose_config(["llm=echo", "tts=piper", "server=realtime"], tmp_path)
    specs = {spec.group: spec for spec in validate(cfg)}
    rules = StageRules(cfg, specs["vad"], specs["tts"], specs["llm"].build(), lambda: False)
    assert rules.configured("voice") is None and rules.configured("speed") == 1.0
    assert rules.builtin_voice("ash", None) and not rules.builtin_voice("joe", None)
    assert rules.voice_problem("joe").startswith("speaker=joe is not accepted by tts=PiperTTS")
    assert rules.speed_problem(1.2) is None and "speed=9" in rules.speed_problem(9)
    assert rules.tts_overrides(None, 1.2) == {"speed": 1.2} and rules.tts_overrides(None, 1.0) == {}
    settings = SessionSettings(instructions=None, voice=None)
    with pytest.raises(ProtocolError) as refused:
        settings.apply(SessionUpdate(speed=1.2), Rules(locked=True))
    assert (refused.value.code, refused.value.param) == ("cannot_update_speed", "session.audio.output.speed")


def test_a_clients_silence_is_the_longest_wait_of_a_detector_that_judges_the_pause(tmp_path):
    """Under the default turn=fused, min_silence_ms ends no turn: silence_duration_ms (and eagerness) set the wait
    for a pause judged unfinished, turn.max_silence_ms, and session.updated shows it."""
    cfg = compose_config(["llm=echo", "server=realtime"], tmp_path)
    specs = {spec.group: spec for spec in validate(cfg)}
    rules = StageRules(cfg, specs["vad"], specs["tts"], specs["llm"].build(), lambda: False)
    settings = SessionSettings(instructions=None, voice=None, vad_defaults=specs["vad"].kwargs)
    assert settings.view("sess_1", "s2s-test", "tiny.en")["audio"]["input"]["turn_detection"][
        "silence_duration_ms"] == cfg.turn.max_silence_ms  # 1400: what is in effect, not min_silence_ms
    new = settings.apply(SessionUpdate(turn_detection=TurnDetection(silence_duration_ms=900)), rules)
    assert new.vad_overrides["turn"] == {**specs["vad"].kwargs["turn"], "max_silence_ms": 900}
    assert "min_silence_ms" not in new.vad_overrides
    assert new.view("sess_1", "s2s-test", "tiny.en")["audio"]["input"]["turn_detection"][
        "silence_duration_ms"] == 900
    vad = specs["vad"].cls(**{**specs["vad"].kwargs, **new.vad_overrides})  # the session's VAD waits 900 ms
    assert vad._end_silence == 900 * 16
    with pytest.raises(ProtocolError, match="max_silence_ms") as refused:  # not above the speculative silence
        settings.apply(SessionUpdate(turn_detection=TurnDetection(silence_duration_ms=150)), rules)
    assert refused.value.param == "session.audio.input.turn_detection"
    eager = settings.apply(SessionUpdate(turn_detection=TurnDetection(kind="semantic_vad", eagerness="low")), rules)
    assert eager.vad_overrides["turn"]["max_silence_ms"] == 2000
