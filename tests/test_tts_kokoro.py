"""tts=kokoro on tiny random-weight Kokoro models: the kokoro package (torch) and mlx-audio (mlx[cpu] on Linux)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from s2s.audio import sound_bounds
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import ReplyAudio, ReplyText
from s2s.tts.kokoro import KokoroTTS
from spies import spy
from tests.conftest import compose_config
from tests.fixtures import kokoro as tiny

TESTS = Path(__file__).parent  # a folder, but no Kokoro model
ENGLISH_PHONEMES = "həlˈO wˈɜɹld."  # misaki (spaCy + lexicon) for "Hello world."
BRITISH_PHONEMES = "həlˈQ wˈɜːld."
SPANISH_PHONEMES = "ˈola, ¿kˈomo estˈas?"  # espeak-ng (espeakng-loader, offline) for "Hola, ¿cómo estás?"


@pytest.fixture(scope="session")
def kokoro():
    from s2s import torch_support

    torch_support.repair_torchaudio()
    import kokoro

    return kokoro


@pytest.fixture(scope="session")
def torch_model(tmp_path_factory, kokoro):
    return tiny.build_torch(tmp_path_factory.mktemp("kokoro") / "Kokoro-82M")


def voice_pack(folder, name):
    import torch

    return torch.load(folder / "voices" / f"{name}.pt", weights_only=True)


def sounding(chunks) -> int:
    """How many blocks hold sound. Kokoro adds noise when it synthesizes (its source module's randn), so a random
    model's segment may end on a quiet sample: the chunk's trimmed silent tail then comes as a block of its own."""
    return sum(sound_bounds(chunk.samples) is not None for chunk in chunks)


def synthesize(stage, text, language, turn=0):
    chunks = list(stage.process(ReplyText(text, turn=turn, language=language)))
    assert chunks and all(isinstance(c, ReplyAudio) and c.sample_rate == 24000 and c.turn == turn for c in chunks)
    samples = np.concatenate([c.samples for c in chunks])
    assert samples.dtype == np.float32 and np.isfinite(samples).all()
    return chunks


@pytest.fixture(scope="module")
def torch_stage(torch_model, kokoro):
    stage = KokoroTTS(voice="af_heart", lang_code="a", speed=1.25, model=str(torch_model), backend="torch",
                      device="cpu")
    stage.setup()
    yield stage
    stage.close()


def test_torch_streams_and_follows_the_turn_language(torch_stage, torch_model, kokoro, monkeypatch):
    infer = spy(monkeypatch, kokoro.KPipeline, "infer")  # (model, phonemes, voice pack, speed) per segment
    chunks = synthesize(torch_stage, "Hello world.\nHello world.", "en")
    assert sounding(chunks) == 2 and len(infer) == 2  # one streamed block per segment
    model, phonemes, pack, speed = infer[0].args
    assert phonemes == ENGLISH_PHONEMES and speed == 1.25
    assert pack.equal(voice_pack(torch_model, "af_heart"))  # the name resolved to the model folder's voices/

    synthesize(torch_stage, "Hola, ¿cómo estás?", "es", turn=1)
    _, phonemes, pack, _ = infer[2].args
    assert phonemes == SPANISH_PHONEMES and pack.equal(voice_pack(torch_model, "ef_dora"))

    synthesize(torch_stage, "Hello world.", "de", turn=2)  # no German voices: the configured pair speaks it
    synthesize(torch_stage, "Hello world.", None, turn=3)
    for call in infer[3:]:
        _, phonemes, pack, _ = call.args
        assert phonemes == ENGLISH_PHONEMES and pack.equal(voice_pack(torch_model, "af_heart"))


def test_language_without_its_g2p_falls_back_to_the_configured_one(torch_stage, kokoro, monkeypatch, caplog):
    if importlib.util.find_spec("pyopenjtalk"):
        pytest.skip("misaki[ja] is installed here")
    infer = spy(monkeypatch, kokoro.KPipeline, "infer")
    synthesize(torch_stage, "Hello world.", "ja")
    assert "pip install 'misaki[ja]'" in caplog.text
    _, phonemes, _, _ = infer[0].args
    assert phonemes == ENGLISH_PHONEMES


def test_torch_explicit_voice_file_stays_for_its_language(torch_model, kokoro, monkeypatch):
    infer = spy(monkeypatch, kokoro.KPipeline, "infer")
    voice = torch_model / "voices" / "bf_custom.pt"
    stage = KokoroTTS(voice=str(voice), lang_code="b", model=str(torch_model))
    stage.setup()
    synthesize(stage, "Hello world.", "en")  # British is English too: the configured voice stays
    _, phonemes, pack, speed = infer[0].args
    assert phonemes == BRITISH_PHONEMES and speed == 1.0
    assert pack.equal(voice_pack(torch_model, "bf_custom"))


def test_torch_closing_stops_generation(torch_stage, kokoro, monkeypatch):
    infer = spy(monkeypatch, kokoro.KPipeline, "infer")
    reply = torch_stage.process(ReplyText("Hello world.\nHello world.\nHello world.", turn=0, language="en"))
    next(reply)
    reply.close()
    assert len(infer) == 1  # the two remaining segments were never synthesized


@pytest.fixture(scope="session")
def mlx_model(tmp_path_factory, kokoro):
    pytest.importorskip("mlx.core", reason="mlx-audio needs mlx (mlx[cpu] on Linux)")
    return tiny.build_mlx(tmp_path_factory.mktemp("kokoro_mlx") / "Kokoro-82M-mlx")


def test_mlx_backend_streams_through_mlx_audio(mlx_model, monkeypatch):
    import mlx.core as mx
    from mlx_audio.tts.models.kokoro import KokoroPipeline

    infer = spy(monkeypatch, KokoroPipeline, "infer")
    stage = KokoroTTS(voice="af_heart", lang_code="a", speed=0.8, model=str(mlx_model), backend="mlx",
                      device="cpu")
    stage.setup()
    assert stage.describe()["model"] == str(mlx_model)
    chunks = synthesize(stage, "Hi.\nHi.", "en")
    assert sounding(chunks) == 2 and len(infer) == 2
    _, phonemes, pack, speed = infer[0].args
    assert phonemes == "hˈI." and speed == 0.8
    assert mx.array_equal(pack, mx.load(str(mlx_model / "voices" / "af_heart.safetensors"))["voice"])
    synthesize(stage, "Hola.", "es", turn=1)
    _, phonemes, pack, _ = infer[2].args
    assert phonemes == "ˈola." and mx.array_equal(
        pack, mx.load(str(mlx_model / "voices" / "ef_dora.safetensors"))["voice"])
    stage.close()


def tts_spec(*overrides):
    specs = validate(compose_config(["tts=kokoro", *overrides]))
    return next(spec for spec in specs if spec.group == "tts")


def test_platform_defaults_and_describe():
    mac = tts_spec("platform=macos")
    assert mac.kwargs["backend"] == "mlx"
    assert mac.build().describe()["model"] == "mlx-community/Kokoro-82M-bf16"
    linux = tts_spec("platform=linux").build().describe()
    assert (linux["backend"], linux["model"], linux["device"]) == ("torch", "hexgrad/Kokoro-82M", "cpu")
    assert tts_spec("platform=macos", "tts.backend=torch").kwargs["device"] == "mps"  # the command line wins
    on_linux = tts_spec("platform=linux", "tts.backend=mlx").build().describe()
    assert (on_linux["backend"], on_linux["device"]) == ("mlx", "cpu (mlx)")


@pytest.mark.parametrize("overrides, fragment", [
    (["platform=macos_intel", "tts.backend=mlx"], "tts.backend=mlx: invalid; expected torch on platform macos_intel"),
    ([f"tts.model={TESTS}"], "expected a model folder with config.json and *.pth (it has no config.json or *.pth)"),
    (["tts.lang_code=x"], "tts.lang_code=x: invalid; expected one of a, b, e, f, h, i, j, p, z"),
    (["tts.voice=/nonexistent/v.pt"], "tts.voice=/nonexistent/v.pt: invalid; expected an existing voice file"),
    (["platform=macos", "tts.voice=/tmp/v.pt"], "expected a voice name or a .safetensors voice file"),
    (["tts.model=/nonexistent/kokoro"], "tts.model=/nonexistent/kokoro: invalid; expected an existing local model folder"),
    (["tts.model=someone/Kokoro-82M-mlx"], "expected a local folder or one of hexgrad/Kokoro-82M"),
    (["tts.speed=0"], "tts.speed=0: invalid; expected a number from 0.25 to 4"),
])
def test_validation_errors(overrides, fragment):
    with pytest.raises(ConfigErrors) as info:
        tts_spec(*overrides)
    assert fragment in str(info.value)
