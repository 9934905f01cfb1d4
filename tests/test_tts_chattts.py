"""tts=chattts on a tiny random-weight ChatTTS loaded through ChatTTS's own Chat.load(source="custom")."""
from __future__ import annotations

import re

import numpy as np
import pytest

from s2s.config import validate
from s2s.config_errors import ConfigError, ConfigErrors
from s2s.messages import ReplyAudio, ReplyText
from s2s.tts.chattts import ChatTTSTTS
from spies import spy
from tests.conftest import compose_config
from tests.fixtures import chattts as tiny


@pytest.fixture(scope="session")
def chattts_dir(tmp_path_factory):
    return tiny.build(tmp_path_factory.mktemp("chattts"))


@pytest.fixture(scope="session")
def chattts():
    from s2s import torch_support

    torch_support.repair_torchaudio()
    import ChatTTS

    return ChatTTS


def make_stage(model_dir, **options) -> ChatTTSTTS:
    settings = {"model": str(model_dir), "device": "cpu", "config_overrides": tiny.tiny_overrides(),
                "verify_hashes": False, "max_new_tokens": 60, "stream_batch": 4, **options}
    return ChatTTSTTS(**settings)


def test_streams_several_finite_blocks_at_24khz_with_the_configured_sampling(chattts_dir, chattts, monkeypatch):
    infer_calls = spy(monkeypatch, chattts.Chat, "infer")
    stage = make_stage(chattts_dir, temperature=0.5, top_p=0.8, top_k=10)
    stage.setup()
    import torch

    torch.manual_seed(0)  # code sampling uses torch's RNG; seeded so the tiny model's length is stable
    out = list(stage.process(ReplyText("hello world, this is a test.", turn=3, language="en")))

    assert len(out) >= 2 and all(isinstance(message, ReplyAudio) for message in out)
    assert {message.sample_rate for message in out} == {24000} and {message.turn for message in out} == {3}
    samples = np.concatenate([message.samples for message in out])
    assert samples.dtype == np.float32 and np.isfinite(samples).all() and np.abs(samples).max() > 0
    _, text, *_ = infer_calls[0].args
    kwargs = infer_calls[0].kwargs
    params = kwargs["params_infer_code"]
    assert text == "hello world, this is a test."
    assert kwargs["stream"] is True and kwargs["split_text"] is False and kwargs["skip_refine_text"] is True
    assert kwargs["lang"] == "en"
    assert (params.temperature, params.top_P, params.top_K) == (0.5, 0.8, 10)
    assert (params.max_new_token, params.stream_batch) == (60, 4)
    assert params.spk_emb == stage.speaker


def test_speaker_seed_gives_the_same_voice_across_instances(chattts_dir, chattts):
    import torch

    voices = []
    for seed in (7, 7, 8):
        stage = make_stage(chattts_dir, speaker_seed=seed)
        stage.setup()
        voices.append(stage.speaker)
    assert voices[0] == voices[1] != voices[2]
    torch.manual_seed(7)  # the voice is ChatTTS's own random speaker drawn under that seed
    assert stage._chat.sample_random_speaker() == voices[0]
    decoded = chattts.model.Speaker._decode(voices[0])
    assert decoded.shape == (tiny.HIDDEN,) and np.isfinite(decoded).all()

    random_voices = set()
    for _ in range(2):
        stage = make_stage(chattts_dir, speaker_seed=None)
        stage.setup()
        random_voices.add(stage.speaker)
    assert len(random_voices) == 2


def test_device_and_model_folder_reach_chattts(chattts_dir, chattts, monkeypatch):
    import torch

    load_calls = spy(monkeypatch, chattts.Chat, "load")
    stage = make_stage(chattts_dir)
    stage.setup()
    kwargs = load_calls[0].kwargs
    assert kwargs["device"] == torch.device("cpu") and kwargs["source"] == "custom"
    assert kwargs["custom_path"] == str(chattts_dir) and kwargs["compile"] is False
    chat = stage._chat
    assert chat.device == torch.device("cpu")
    for module in (chat.gpt, chat.vocos, chat.decoder, chat.dvae, chat.embed):
        assert {parameter.device for parameter in module.parameters()} == {torch.device("cpu")}
    assert chat.config.gpt.hidden_size == tiny.HIDDEN and chat.config.dvae.vq.levels == (5, 5, 5, 5)


def test_closing_after_the_first_block_stops_the_gpt_loop(chattts_dir, chattts):
    import torch

    stage = make_stage(chattts_dir, max_new_tokens=400, stream_batch=2)
    stage.setup()
    real_generate = stage._chat.gpt.generate
    events = []

    def generate(*args, **kwargs):  # calls through; records whether the loop ran out or was closed
        try:
            for result in real_generate(*args, **kwargs):
                events.append("batch")
                yield result
            events.append("exhausted")
        except GeneratorExit:
            events.append("closed")
            raise

    stage._chat.gpt.generate = generate
    torch.manual_seed(0)
    replies = stage.process(ReplyText("hello world, this is a longer test sentence.", turn=0, language="en"))
    first = next(replies)
    assert isinstance(first, ReplyAudio) and len(first.samples)
    replies.close()
    assert events[-1] == "closed"
    assert events.count("batch") <= 4  # ChatTTS skips two stream batches, yields on the third


def test_shipped_hashes_reject_other_files_with_a_hint(chattts_dir, chattts):
    stage = make_stage(chattts_dir, verify_hashes=True)
    with pytest.raises(RuntimeError, match="verify_hashes=false"):
        stage.setup()


def test_unknown_config_override_names_the_key(chattts_dir, chattts):
    stage = make_stage(chattts_dir, config_overrides={"gpt": {"hiden_size": 32}})
    with pytest.raises(ConfigError, match=r"tts\.config_overrides\.gpt\.hiden_size=32.*hidden_size"):
        stage.setup()


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["tts.verify_hashes=false"], "tts.verify_hashes=False: invalid; expected true unless model is a local folder"),
    (["tts.compile=true"], "tts.compile=True: invalid; expected false with device=cpu"),
    (["tts.model=/no/such/chattts"], "tts.model=/no/such/chattts: invalid; expected an existing path"),
    (["tts.stream_batch=0"], "tts.stream_batch=0: invalid; expected a number from 1 to 1000"),
])
def test_validation_names_key_value_and_what_is_valid(overrides, fragment):
    with pytest.raises(ConfigErrors, match=re.escape(fragment)):
        validate(compose_config(["tts=chattts", *overrides]))


def test_compile_validates_on_cuda_platforms():
    specs = validate(compose_config(["tts=chattts", "tts.compile=true", "platform=linux_cuda"]))
    assert specs[-2].kwargs["device"] == "cuda" and specs[-2].kwargs["compile"] is True
