"""tts=pocket on a tiny random-weight pocket-tts model loaded from a local YAML config, cloning a reference clip."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import ReplyAudio, ReplyText
from s2s.tts.pocket import PRESET_VOICES, PocketTTS
from spies import spy
from tests.conftest import compose_config
from tests.fixtures import pocket as tiny


@pytest.fixture(scope="session")
def pocket_tts():
    import torch

    threads = torch.get_num_threads()
    import pocket_tts

    torch.set_num_threads(threads)
    return pocket_tts


@pytest.fixture(scope="session")
def model_files(tmp_path_factory, pocket_tts):
    root = tmp_path_factory.mktemp("pocket")
    return {"config": tiny.build(root / "model"), "voice": tiny.reference_audio(root / "me.wav")}


@pytest.fixture
def stage(model_files, pocket_tts, monkeypatch):
    prompts = spy(monkeypatch, pocket_tts.TTSModel, "get_state_for_audio_prompt")
    stage = PocketTTS(voice=str(model_files["voice"]), language="english", max_tokens=12,
                      model=str(model_files["config"]), device="cpu")
    stage.setup()
    stage.prompts = prompts
    yield stage
    stage.close()


def count_steps(stage, delay_s: float = 0.0) -> list[int]:
    """Count the model's generation steps (each runs the text conditioner once), observed by a forward hook.

    ``delay_s`` slows every step a little so that "the first chunk arrives before the last step" does not
    depend on how the OS schedules the library's threads.
    """
    steps = [0]

    def hook(*_):
        steps[0] += 1
        time.sleep(delay_s)

    stage._model.flow_lm.conditioner.register_forward_hook(hook)
    return steps


def test_streams_incrementally_from_the_cloned_voice(stage, model_files, pocket_tts, monkeypatch):
    prompt, = stage.prompts
    prompt_args = prompt.args
    assert prompt_args[1] == Path(model_files["voice"])  # cloning path: the reference file reaches pocket-tts
    streams = spy(monkeypatch, pocket_tts.TTSModel, "generate_audio_stream")
    steps = count_steps(stage, delay_s=0.005)
    chunks, steps_at_chunk = [], []
    for message in stage.process(ReplyText("Hello world.", turn=3)):
        chunks.append(message)
        steps_at_chunk.append(steps[0])
    stream, = streams
    args, kwargs = stream.args, stream.kwargs
    assert args[2] == "Hello world." and kwargs["max_tokens"] == 12
    assert len(chunks) >= 3
    assert steps_at_chunk[0] < steps[0]  # the first block came out before generation finished
    assert all(isinstance(c, ReplyAudio) and c.sample_rate == 24000 and c.turn == 3 for c in chunks)
    samples = np.concatenate([c.samples for c in chunks])
    assert samples.dtype == np.float32 and np.isfinite(samples).all()
    assert len(samples) % 1920 == 0  # whole Mimi frames (24 kHz / 12.5 Hz), none lost between blocks


def test_closing_the_stream_stops_generation(stage, pocket_tts, monkeypatch):
    streams = spy(monkeypatch, pocket_tts.TTSModel, "generate_audio_stream")
    steps = count_steps(stage)
    reply = stage.process(ReplyText("Hello world. How are you today?", turn=1))
    next(reply)
    reply.close()
    stream, = streams
    kwargs = stream.kwargs
    assert kwargs["stop"].is_set()
    time.sleep(0.3)
    stopped_at = steps[0]
    time.sleep(0.3)
    assert steps[0] == stopped_at  # the generation thread has ended
    full = [0]
    stage._model.flow_lm.conditioner.register_forward_hook(lambda *_: full.__setitem__(0, full[0] + 1))
    list(stage.process(ReplyText("Hello world. How are you today?", turn=2)))
    assert stopped_at < full[0] / 2


def test_validation_rules(model_files):
    def errors(*overrides):
        with pytest.raises(ConfigErrors) as info:
            validate(compose_config(["tts=pocket", *overrides]))
        return str(info.value)

    message = errors("tts.voice=/nonexistent/me.wav")
    assert "tts.voice=/nonexistent/me.wav" in message and ", ".join(PRESET_VOICES[:8]) in message
    assert "need model: null" in errors(f"tts.model={model_files['config']}")  # preset voices need packaged weights
    assert "tts.language=klingon" in errors("tts.language=klingon")
    assert "tts.model=/nonexistent/tiny.yaml" in errors("tts.model=/nonexistent/tiny.yaml", "tts.voice=alba")
    specs = validate(compose_config(["tts=pocket", f"tts.model={model_files['config']}",
                                     f"tts.voice={model_files['voice']}", "tts.max_tokens=20"]))
    tts = next(spec for spec in specs if spec.group == "tts")
    assert tts.build().describe() == {"model": str(model_files["config"]), "voice": str(model_files["voice"]),
                                      "max_tokens": 20, "device": "cpu"}
