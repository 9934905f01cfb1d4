"""tts=qwen3 and its pinned variants: validation per platform, then each backend's real library on tiny models.

ggml runs faster-qwen3-tts's real GGML adapter over a stand-in for the native ``qwentts_cpp`` module; torch runs
faster-qwen3-tts's real generation code on the CPU with eager stand-ins for its two CUDA-graph wrappers; mlx runs
mlx-audio itself (``mlx[cpu]``), including locally converted bf16/4/6/8-bit checkpoints.
"""
from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from s2s.config import validate
from s2s.config_errors import ConfigError, ConfigErrors
from s2s.messages import ReplyText
from s2s.stage import MissingExtraError
from s2s.tts import qwen3
from s2s.tts.qwen3 import Qwen3TTS, Settings, language_name
from s2s.tts.qwen3.settings import MIN_REPLY_STEPS, reply_steps
from spies import spy
from tests.conftest import compose_config, run_cli
from tests.fixtures import qwen3 as fixtures

CV_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"


# ---------------------------------------------------------------- helpers
def tts_spec(tmp_path, *overrides, platform="linux"):
    cfg = compose_config([*overrides, f"platform={platform}"], tmp_path)
    return next(spec for spec in validate(cfg) if spec.group == "tts")


def config_errors(tmp_path, *overrides, platform="linux") -> dict[str, str]:
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config([*overrides, f"platform={platform}"], tmp_path))
    return {error.key: str(error) for error in caught.value.errors}


def speak(stage, text="Hello world.", language=None, keep=None):
    """Blocks of one reply; with ``keep``, close the stream after that many (as the runner does on barge-in)."""
    messages = stage.process(ReplyText(text, 0, language))
    blocks = []
    for message in messages:
        blocks.append(message)
        if keep and len(blocks) >= keep:
            messages.close()
            break
    for block in blocks:
        assert block.sample_rate == 24000 and block.samples.dtype == np.float32 and block.samples.ndim == 1
        assert len(block.samples) and np.all(np.isfinite(block.samples))
    return blocks


def assert_closed_mid_stream(stage, calls):
    """Closing our stream after its first block must close the library's generator while it still had work."""
    blocks = stage.process(ReplyText("Hello world. The quick brown fox jumps over the lazy dog.", 0, None))
    next(blocks)
    library_stream = calls[-1].result
    assert inspect.getgeneratorstate(library_stream) == inspect.GEN_SUSPENDED
    blocks.close()
    assert inspect.getgeneratorstate(library_stream) == inspect.GEN_CLOSED


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3")
    return {variant: fixtures.build_tiny_qwen3_tts(root / variant, variant)
            for variant in ("custom_voice", "voice_design", "base")}


@pytest.fixture(scope="session")
def reference_wav(tmp_path_factory) -> Path:
    import soundfile

    path = tmp_path_factory.mktemp("qwen3_ref") / "ref.wav"
    tone = 0.3 * np.sin(2 * np.pi * 180 * np.arange(9600) / 16000)  # 0.6 s at 16 kHz: the libraries resample
    soundfile.write(path, tone.astype(np.float32), 16000)
    return path


@pytest.fixture
def native_ggml(monkeypatch):
    module = fixtures.fake_qwentts_cpp()
    fixtures.install(monkeypatch, module)
    return module.QwenTTS


@pytest.fixture
def eager_torch(monkeypatch):
    """The torch backend on this CPU: from_pretrained builds eager graphs; torch.cuda's two calls become no-ops."""
    import torch
    from faster_qwen3_tts import FasterQwen3TTS

    calls: list[dict] = []
    monkeypatch.setattr(FasterQwen3TTS, "from_pretrained", fixtures.eager_from_pretrained(calls))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    torch.manual_seed(0)
    return calls


# ---------------------------------------------------------------- validation (nothing loads)
@pytest.mark.parametrize("platform, backend", [("linux", "ggml"), ("linux_cuda", "ggml"), ("macos", "mlx"),
                                               ("windows_cuda", "torch")])
def test_backend_follows_the_platform(tmp_path, platform, backend):
    spec = tts_spec(tmp_path, "tts=qwen3", platform=platform)
    assert spec.kwargs["backend"] == backend
    if platform == "macos":
        assert spec.build().describe()["model"] == "mlx-community/Qwen3-TTS-12Hz-1.7B-CustomVoice-6bit"


@pytest.mark.parametrize("overrides, platform, backend", [
    (["tts=qwen3_ggml"], "macos", "ggml"), (["tts=qwen3_mlx"], "linux", "mlx"), (["tts=qwen3_mlx"], "macos", "mlx"),
    (["tts=qwen3_torch"], "linux_cuda", "torch"), (["tts=qwen3", "tts.backend=torch"], "linux_cuda", "torch"),
    (["tts=qwen3", "tts.backend=ggml"], "macos", "ggml")])  # what the user types wins over conf/tts_platform
def test_variants_and_the_command_line_pin_the_backend(tmp_path, overrides, platform, backend):
    assert tts_spec(tmp_path, *overrides, platform=platform).kwargs["backend"] == backend


@pytest.mark.parametrize("option, platform, key, fragment", [
    ("qwen3", "macos_intel", "tts.backend", "no Qwen3-TTS backend runs on platform macos_intel"),
    ("qwen3", "windows", "tts.backend", "no Windows wheels"),
    ("qwen3_ggml", "windows_cuda", "tts.backend", "no Windows wheels"),
    ("qwen3_mlx", "macos_intel", "tts.backend", "Intel Macs"),
    ("qwen3_torch", "macos", "tts.backend", "CUDA graphs"),
    ("qwen3_torch", "linux", "tts.device", "cuda"),
    ("qwen3_torch", "windows", "tts.device", "cuda"),
])
def test_platforms_that_cannot_run_a_backend(tmp_path, option, platform, key, fragment):
    errors = config_errors(tmp_path, f"tts={option}", platform=platform)
    assert fragment in errors[key]


@pytest.mark.parametrize("overrides, key, fragment", [
    (["tts.quantization=6bit"], "tts.quantization", "BF16, Q8_0, Q4_K_M, F32 with backend=ggml"),
    (["tts=qwen3_mlx", "tts.quantization=Q8_0"], "tts.quantization", "bf16, 4bit, 6bit, 8bit with backend=mlx"),
    (["tts=qwen3_torch", "tts.quantization=Q8_0"], "tts.quantization", "null with backend=torch"),
    (["tts=qwen3_torch", "tts.ref_cache_dir=/tmp"], "tts.ref_cache_dir", "for backend ggml"),
    (["tts=qwen3_mlx", "tts.dtype=float16"], "tts.dtype", "for backend torch"),
    (["tts.attn_implementation=eager"], "tts.attn_implementation", "for backend torch"),
    (["tts=qwen3_torch", "tts.dtype=int8"], "tts.dtype", "auto, bfloat16, float16, float32"),
    (["tts=qwen3_torch", "tts.attn_implementation=flash"], "tts.attn_implementation", "flash_attention_2"),
    (["tts.backend=onnx"], "tts.backend", "ggml, torch, mlx"),
    (["tts=qwen3_mlx", "tts.model=/tmp", "tts.quantization=4bit"], "tts.quantization", "a local path"),
    (["tts.model=/tmp"], "tts.model", "gguf_talker_path"),
    (["tts=qwen3_mlx", "tts.model=/nonexistent/qwen3"], "tts.model", "no such folder"),
    (["tts.gguf_talker_path=/tmp"], "tts.gguf_codec_path", "go together"),
    (["tts.gguf_talker_path=/nonexistent.gguf", "tts.gguf_codec_path=/tmp"], "tts.gguf_talker_path", "existing"),
    (["tts.language=xx"], "tts.language", "en (English)"),
    (["tts.max_new_tokens=0"], "tts.max_new_tokens", "from 1 to"),
    (["tts.model=Qwen/Qwen3-TTS-12Hz-1.7B-Base"], "tts.ref_audio", "Base model"),
    (["tts.ref_text=hello"], "tts.ref_text", "without ref_audio"),
    (["tts.xvec_only=true"], "tts.xvec_only", "without ref_audio"),
    (["tts.model=Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign"], "tts.instruct", "voice description"),
    (["tts.model=Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign", "tts.speaker=Ryan", "tts.instruct=calm"],
     "tts.speaker", "VoiceDesign"),
    (["tts.ref_audio=/nonexistent.wav"], "tts.ref_audio", "existing path"),
    (["tts.non_streaming_mode=false"], "tts.non_streaming_mode", "null or true with backend=ggml"),
    (["tts=qwen3_mlx", "tts.non_streaming_mode=true"], "tts.non_streaming_mode", "null with backend=mlx"),
    (["tts.parity_mode=true"], "tts.parity_mode", "false with backend=ggml"),
    (["tts=qwen3_torch", "tts.parity_mode=true"], "tts.parity_mode", "unless cloning a voice"),
    (["tts.blocksize=8"], "tts.blocksize", "from 64 to"),
    (["tts.streaming_chunk_size=0"], "tts.streaming_chunk_size", "from 1 to"),
])
def test_invalid_settings_fail_before_loading(tmp_path, overrides, key, fragment):
    errors = config_errors(tmp_path, *(overrides if overrides[0].startswith("tts=") else ["tts=qwen3", *overrides]))
    assert fragment in errors[key], errors


def test_cloning_rules(tmp_path, reference_wav):
    base, ref = "tts.model=Qwen/Qwen3-TTS-12Hz-1.7B-Base", f"tts.ref_audio={reference_wav}"
    cases = [
        ([ref], "tts.ref_text", "transcript of ref_audio"),
        ([ref, "tts.ref_text=hi", f"tts.ref_spk={reference_wav}"], "tts.ref_spk", "either audio or cached"),
        ([f"tts.ref_spk={reference_wav}", f"tts.ref_rvq={reference_wav}"], "tts.ref_rvq", "with ref_spk and ref_text"),
        ([f"tts.ref_rvq={reference_wav}", "tts.ref_text=hi"], "tts.ref_rvq", "with ref_spk and ref_text"),
        ([f"tts.ref_spk={reference_wav}", "tts.ref_text=hi"], "tts.ref_text", "ref_spk alone"),
        ([f"tts.ref_spk={reference_wav}", f"tts.ref_rvq={reference_wav}", "tts.ref_text=hi", "tts.xvec_only=true"],
         "tts.xvec_only", "ICL"),
        ([ref, "tts.ref_text=hi", "tts.instruct=calm"], "tts.instruct", "only backend torch"),
        ([ref, "tts.ref_text=hi", "tts.speaker=Ryan"], "tts.speaker", "null when cloning"),
    ]
    for overrides, key, fragment in cases:
        assert fragment in config_errors(tmp_path, "tts=qwen3", base, *overrides)[key]
    errors = config_errors(tmp_path, "tts=qwen3", ref, "tts.ref_text=hi")  # a CustomVoice model cannot clone
    assert "-Base model" in errors["tts.model"]
    errors = config_errors(tmp_path, "tts=qwen3_mlx", base, f"tts.ref_spk={reference_wav}")
    assert "for backend ggml" in errors["tts.ref_spk"]
    voice = tts_spec(tmp_path, "tts=qwen3_torch", base, ref, "tts.xvec_only=true", "tts.instruct=calm",
                     platform="linux_cuda").build().settings.voice
    assert (voice.mode, voice.xvec_only, voice.instruct) == ("clone", True, "calm")


def test_construction_resolves_settings_without_validating_again(monkeypatch):
    """validate_config runs once, before loading; the constructor only resolves (it checks nothing)."""
    def refuse(*args, **kwargs):
        raise AssertionError("validation ran again at construction")

    monkeypatch.setattr(Qwen3TTS, "validate_config", classmethod(refuse))
    monkeypatch.setattr(qwen3, "check_backend", refuse)
    monkeypatch.setattr(qwen3, "voice_errors", refuse)
    stage = Qwen3TTS(backend="mlx", language="de", instruct="calm", ref_text="not checked here")
    settings = stage.settings
    assert isinstance(settings, Settings) and (settings.language, settings.quantization) == ("German", "6bit")
    assert (settings.voice.mode, settings.voice.speaker, settings.voice.instruct) == ("custom_voice", "Aiden", "calm")
    assert settings.mlx_repo == "mlx-community/Qwen3-TTS-12Hz-1.7B-CustomVoice-6bit"
    with pytest.raises(AttributeError):
        settings.model = "other"  # frozen: a runtime cannot change what the stage resolved


def test_runtimes_depend_on_the_settings_only():
    """No import loop: the runtimes import only qwen3.settings of the package, and load first without trouble."""
    package = Path(qwen3.__file__).parent
    for runtime in ("faster", "mlx"):
        tree = ast.parse((package / f"{runtime}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert {name for name in imported if name.startswith("s2s.tts")} == {"s2s.tts.qwen3.settings"}, runtime
        code = (f"import s2s.tts.qwen3.{runtime} as runtime, s2s.tts.qwen3 as stage; "
                "assert stage.Qwen3TTS and runtime.__name__")
        subprocess.run([sys.executable, "-c", code], check=True)


def test_language_aliases():
    assert [language_name(code) for code in ("en", "zh", "ja", "de", "fr", "es", "it", "pt", "ru", "ko")] == [
        "English", "Chinese", "Japanese", "German", "French", "Spanish", "Italian", "Portuguese", "Russian", "Korean"]
    assert (language_name("EN-us"), language_name("german"), language_name("auto"), language_name("xx")) == (
        "English", "German", "Auto", None)


def test_cli_dry_runs(tmp_path):
    result = run_cli("tts=qwen3", "platform=macos", "dry_run=true", f"hydra.run.dir={tmp_path}", cwd=tmp_path,
                     check=True)
    assert "backend=mlx" in result.stdout
    assert "model=mlx-community/Qwen3-TTS-12Hz-1.7B-CustomVoice-6bit" in result.stdout
    result = run_cli("tts=qwen3", "tts.backend=torch", "platform=macos", "dry_run=true", f"hydra.run.dir={tmp_path}",
                     cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "config error: tts.backend=torch: invalid; expected one of ggml, mlx on platform macos (faster-qwen3-tts's "
        "torch backend runs on CUDA graphs: Linux or Windows with an NVIDIA GPU)"]


def test_each_utterance_gets_a_budget_sized_to_its_text():
    short = reply_steps("Hello.", 2048, 8)
    long_text = " ".join(["Here is a long reply, with a comma."] * 20)
    long = reply_steps(long_text, 2048, 8)
    assert short == MIN_REPLY_STEPS  # a short text keeps 28.8 s: the estimate never cuts it
    assert long > MIN_REPLY_STEPS and long % 8 == 0  # whole streamed blocks
    assert reply_steps(long_text + long_text, 2048, 8) > long  # twice the text, a larger budget
    assert reply_steps(long_text, 400, 8) == 400 and reply_steps("Hello.", 6, 8) == 6  # the cap holds


@pytest.mark.parametrize("option, platform, chunk, attention", [
    ("qwen3_mlx", "linux", 4, None), ("qwen3_ggml", "linux", 8, None), ("qwen3_torch", "linux_cuda", 8, "sdpa")])
def test_the_defaults_per_backend(tmp_path, option, platform, chunk, attention):
    settings = tts_spec(tmp_path, f"tts={option}", platform=platform).build().settings
    assert (settings.streaming_chunk_size, settings.attn_implementation) == (chunk, attention)
    assert settings.non_streaming_mode is None and settings.parity_mode is False and settings.blocksize is None


# ---------------------------------------------------------------- ggml: real adapter, stand-in native module
def test_ggml_custom_voice_streams_with_quantization_and_turn_language(tmp_path, monkeypatch, native_ggml):
    from faster_qwen3_tts import FasterQwen3TTS, GGMLQwen3TTS

    loads = spy(monkeypatch, FasterQwen3TTS, "from_pretrained")
    streams = spy(monkeypatch, GGMLQwen3TTS, "generate_custom_voice_streaming")
    stage = tts_spec(tmp_path, "tts=qwen3", "tts.quantization=Q8_0", "tts.speaker=Ryan", "tts.instruct=calm",
                     "tts.streaming_chunk_size=2", "tts.max_new_tokens=8", f"tts.ref_cache_dir={tmp_path}").build()
    stage.setup()
    assert loads[0].args == (CV_MODEL,) and loads[0].kwargs == {
        "backend": "ggml", "quant": "Q8_0", "qwentts_ref_cache_dir": str(tmp_path)}
    assert native_ggml.calls[0] == ("from_pretrained", {"model_id": CV_MODEL, "quant": "Q8_0"})
    blocks = speak(stage, language="de")  # auto: the STT's language of the turn
    assert [len(block.samples) for block in blocks] == [4 * 1920, 2 * 1920, 2 * 1920]  # 4 first, then 2 per block
    assert streams[0].kwargs == {"text": "Hello world.", "language": "German", "max_new_tokens": 8,
                                 "chunk_size": 2, "speaker": "Ryan", "instruct": "calm", "non_streaming_mode": None}
    name, request = native_ggml.calls[-1]
    assert (name, request["lang"], request["speaker"], request["codec_chunk_sec"]) == ("stream", "German", "Ryan", 0.16)
    assert_closed_mid_stream(stage, streams)
    assert native_ggml.streams[-1] == {"packets": 1, "cancelled": True}


def test_ggml_blocksize_and_non_streaming_mode_reach_the_reply(tmp_path, monkeypatch, native_ggml):
    from faster_qwen3_tts import GGMLQwen3TTS

    streams = spy(monkeypatch, GGMLQwen3TTS, "generate_custom_voice_streaming")
    stage = tts_spec(tmp_path, "tts=qwen3", "tts.speaker=Ryan", "tts.streaming_chunk_size=2", "tts.blocksize=1000",
                     "tts.non_streaming_mode=true", f"tts.ref_cache_dir={tmp_path}").build()
    stage.setup()
    text = "Hello world. " * 3
    blocks = speak(stage, text=text)
    sizes = [len(block.samples) for block in blocks]
    assert set(sizes[:-1]) == {1000} and 0 < sizes[-1] <= 1000 and len(sizes) > 2  # re-blocked, nothing padded
    assert streams[0].kwargs["non_streaming_mode"] is True
    assert streams[0].kwargs["max_new_tokens"] == reply_steps(text, 2048, 2)  # sized to the text, not the cap
    assert_closed_mid_stream(stage, streams)  # closing the re-blocked stream still stops the library's


def test_ggml_local_gguf_voice_design_and_bad_speaker(tmp_path, native_ggml):
    talker, codec = tmp_path / "qwen-talker-1.7b-voicedesign-Q4_K_M.gguf", tmp_path / "qwen-tokenizer-12hz-Q4_K_M.gguf"
    talker.write_bytes(b"GGUF"), codec.write_bytes(b"GGUF")
    stage = tts_spec(tmp_path, "tts=qwen3_ggml", f"tts.gguf_talker_path={talker}", f"tts.gguf_codec_path={codec}",
                     "tts.instruct=A calm voice.", "tts.language=ja", "tts.max_new_tokens=4").build()
    assert stage.settings.voice.mode == "voice_design" and stage.describe()["quantization"] == "from the GGUF files"
    stage.setup()
    assert native_ggml.calls[0] == ("__init__", {"talker_path": str(talker), "codec_path": str(codec)})
    speak(stage, language="en")  # a fixed language wins over the turn's
    request = native_ggml.calls[-1][1]
    assert (request["instruct"], request["lang"], request["speaker"]) == ("A calm voice.", "Japanese", None)

    stage = tts_spec(tmp_path, "tts=qwen3_ggml", "tts.speaker=Nobody").build()
    with pytest.raises(ConfigError, match="tts.speaker=Nobody.*ryan, vivian"):
        stage.setup()


def test_ggml_clone_from_audio_then_from_the_cached_reference(tmp_path, reference_wav, native_ggml):
    cache = tmp_path / "refs"
    base = ["tts=qwen3", "tts.model=Qwen/Qwen3-TTS-12Hz-0.6B-Base", f"tts.ref_cache_dir={cache}",
            "tts.max_new_tokens=4", "tts.ref_text=This is a test."]
    stage = tts_spec(tmp_path, *base, f"tts.ref_audio={reference_wav}").build()
    stage.setup()
    assert native_ggml.calls[0][1]["quant"] == "BF16"  # the ggml default
    speak(stage)
    request = native_ggml.calls[-1][1]
    assert request["ref_text"] == "This is a test." and request["ref_codes"][0] == 16 and request["ref_spk_emb"]
    spk, = cache.glob("*.spk")
    stage = tts_spec(tmp_path, *base, f"tts.ref_spk={spk}", f"tts.ref_rvq={spk.with_suffix('.rvq')}").build()
    stage.setup()
    speak(stage)
    assert native_ggml.calls[-1][1]["ref_codes"] == request["ref_codes"]
    stage = tts_spec(tmp_path, *base[:-1], f"tts.ref_spk={spk}").build()  # x-vector from the cached embedding
    stage.setup()
    speak(stage)
    assert native_ggml.calls[-1][1]["ref_codes"] is None and native_ggml.calls[-1][1]["ref_spk_emb"] == (64,)


def test_ggml_install_problems_are_explained(tmp_path, monkeypatch, native_ggml):
    stage = tts_spec(tmp_path, "tts=qwen3", "tts.speaker=ryan").build()

    def no_driver(*args, **kwargs):  # what ctypes raises for PyPI's CUDA wheel on a machine without a driver
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(native_ggml, "from_pretrained", no_driver)
    with pytest.raises(RuntimeError, match="CUDA 12.8 build.*tts.backend=mlx"):
        stage.setup()
    monkeypatch.setitem(sys.modules, "qwentts_cpp", None)
    with pytest.raises(MissingExtraError, match=re.escape("pip install -e '.[qwen3-ggml]'")):
        stage.setup()


# ---------------------------------------------------------------- torch: real generation code, eager graphs
def test_torch_refusal_of_a_cpu_device_is_a_config_error(tiny):
    stage = Qwen3TTS(model=str(tiny["custom_voice"]), backend="torch", device="cpu", speaker="ryan")
    with pytest.raises(ConfigError, match="tts.device=cpu.*a CUDA device for backend torch"):
        stage.setup()  # faster-qwen3-tts's own from_pretrained refuses before loading anything


def test_torch_custom_voice_streams(tmp_path, monkeypatch, tiny, eager_torch):
    import torch
    from faster_qwen3_tts import FasterQwen3TTS

    streams = spy(monkeypatch, FasterQwen3TTS, "generate_custom_voice_streaming")
    stage = tts_spec(tmp_path, "tts=qwen3_torch", f"tts.model={tiny['custom_voice']}", "tts.speaker=ryan",
                     "tts.instruct=Speak slowly.", "tts.dtype=bfloat16", "tts.attn_implementation=eager",
                     "tts.streaming_chunk_size=2", "tts.max_new_tokens=6", "tts.language=en",
                     platform="linux_cuda").build()
    stage.setup()
    assert eager_torch[0] == {"model_name": str(tiny["custom_voice"]), "device": "cuda", "dtype": torch.bfloat16,
                              "backend": "torch", "attn_implementation": "eager", "max_seq_len": 2048}
    blocks = speak(stage)
    assert len(blocks) >= 2
    assert streams[0].kwargs == {"text": "Hello world.", "language": "English", "max_new_tokens": 6,
                                 "chunk_size": 2, "speaker": "ryan", "instruct": "Speak slowly.",
                                 "non_streaming_mode": None}
    assert_closed_mid_stream(stage, streams)


def test_torch_voice_design_and_clone(tmp_path, monkeypatch, tiny, reference_wav, eager_torch):
    import torch
    from faster_qwen3_tts import FasterQwen3TTS

    common = ["tts=qwen3_torch", "tts.streaming_chunk_size=2", "tts.max_new_tokens=4"]
    design = spy(monkeypatch, FasterQwen3TTS, "generate_voice_design_streaming")
    stage = tts_spec(tmp_path, *common, f"tts.model={tiny['voice_design']}", "tts.instruct=A cheerful voice.",
                     platform="linux_cuda").build()
    stage.setup()
    assert eager_torch[-1]["dtype"] == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    speak(stage)
    assert design[0].kwargs["instruct"] == "A cheerful voice." and design[0].kwargs["language"] == "Auto"

    clone = spy(monkeypatch, FasterQwen3TTS, "generate_voice_clone_streaming")
    for extra in (["tts.ref_text=This is a test."], ["tts.xvec_only=true"]):
        stage = tts_spec(tmp_path, *common, f"tts.model={tiny['base']}", f"tts.ref_audio={reference_wav}", *extra,
                         platform="linux_cuda").build()
        stage.setup()
        speak(stage)
    assert [(c.kwargs["ref_audio"], c.kwargs["ref_text"], c.kwargs["xvec_only"]) for c in clone] == [
        (str(reference_wav), "This is a test.", False), (str(reference_wav), "", True)]
    assert eager_torch[-1]["attn_implementation"] == "sdpa"  # not configured: the library's default

    warmups = spy(monkeypatch, FasterQwen3TTS, "warmup")
    stage = tts_spec(tmp_path, *common, f"tts.model={tiny['base']}", f"tts.ref_audio={reference_wav}",
                     "tts.ref_text=This is a test.", "tts.parity_mode=true", platform="linux_cuda").build()
    stage.setup()
    assert warmups == []  # parity mode runs no CUDA graphs: none are captured
    speak(stage)
    assert clone[-1].kwargs["parity_mode"] is True and [c.kwargs["parity_mode"] for c in clone[:-1]] == [False] * 2


@pytest.mark.gpu
def test_torch_on_cuda_with_real_graphs(tmp_path, tiny):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    stage = tts_spec(tmp_path, "tts=qwen3_torch", f"tts.model={tiny['custom_voice']}", "tts.speaker=ryan",
                     "tts.streaming_chunk_size=2", "tts.max_new_tokens=8", platform="linux_cuda").build()
    stage.setup()
    assert len(speak(stage)) >= 2
    assert len(speak(stage, keep=1)) == 1


# ---------------------------------------------------------------- mlx: mlx-audio itself (mlx[cpu])
@pytest.fixture(scope="session")
def mlx_model_class(tiny):
    pytest.importorskip("mlx.core")
    from mlx_audio.tts.models.qwen3_tts import Model

    return Model


def test_mlx_custom_voice_streams(tmp_path, monkeypatch, tiny, mlx_model_class):
    import mlx.core as mx
    import mlx_audio.tts.utils

    loads = spy(monkeypatch, mlx_audio.tts.utils, "load_model")
    streams = spy(monkeypatch, mlx_model_class, "generate_custom_voice")
    stage = tts_spec(tmp_path, "tts=qwen3_mlx", f"tts.model={tiny['custom_voice']}", "tts.speaker=Vivian",
                     "tts.instruct=Very happy.", "tts.streaming_chunk_size=2", "tts.max_new_tokens=6").build()
    stage.setup()
    assert loads[0].args == (str(tiny["custom_voice"]),)  # a local folder passes through unmapped
    mx.random.seed(0)
    blocks = speak(stage, language="zh")
    assert len(blocks) >= 2 and len(blocks[0].samples) == 2 * 480  # 2 codec steps of the tiny 480-sample vocoder
    assert streams[0].args[1:] == ("Hello world.", "Vivian") and streams[0].kwargs == {
        "language": "Chinese", "instruct": "Very happy.", "max_tokens": 6, "stream": True,
        "streaming_interval": 0.2}
    assert_closed_mid_stream(stage, streams)


def test_mlx_voice_design_and_clone(tmp_path, monkeypatch, tiny, reference_wav, mlx_model_class):
    common = ["tts=qwen3_mlx", "tts.streaming_chunk_size=2", "tts.max_new_tokens=4", "tts.device=cpu"]
    design = spy(monkeypatch, mlx_model_class, "generate_voice_design")
    stage = tts_spec(tmp_path, *common, f"tts.model={tiny['voice_design']}", "tts.instruct=A calm voice.").build()
    stage.setup()
    speak(stage)
    assert design[0].args[1:] == ("Hello world.", "A calm voice.") and design[0].kwargs["language"] == "Auto"

    clone = spy(monkeypatch, mlx_model_class, "generate")
    for extra in (["tts.ref_text=This is a test."], ["tts.xvec_only=true"]):
        stage = tts_spec(tmp_path, *common, f"tts.model={tiny['base']}", f"tts.ref_audio={reference_wav}",
                         *extra).build()
        stage.setup()
        speak(stage)
    assert [(c.kwargs["ref_audio"], c.kwargs["ref_text"]) for c in clone] == [
        (str(reference_wav), "This is a test."), (str(reference_wav), None)]


@pytest.fixture(scope="session")
def mlx_hub_cache(tmp_path_factory, tiny, mlx_model_class):
    """mlx-community/Qwen3-TTS-12Hz-1.7B-CustomVoice-<q> look-alikes, converted locally, in an offline hub cache."""
    root, cache = tmp_path_factory.mktemp("qwen3_mlx"), tmp_path_factory.mktemp("hub")
    for quantization in ("bf16", "4bit", "6bit", "8bit"):
        folder = fixtures.mlx_variant(tiny["custom_voice"], root / quantization, quantization)
        fixtures.hub_snapshot(cache, f"mlx-community/Qwen3-TTS-12Hz-1.7B-CustomVoice-{quantization}", folder)
    return cache


@pytest.mark.parametrize("quantization", ["bf16", "4bit", "8bit", None])  # None: the mlx default, 6bit
def test_mlx_quantizations_reach_mlx_community_ids(tmp_path, monkeypatch, mlx_hub_cache, quantization):
    import huggingface_hub.constants
    import mlx.core as mx
    import mlx.nn as nn
    import mlx_audio.tts.utils
    from mlx.utils import tree_flatten

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(mlx_hub_cache))
    loads = spy(monkeypatch, mlx_audio.tts.utils, "load_model")
    stage = tts_spec(tmp_path, "tts=qwen3_mlx", f"tts.quantization={quantization or 'null'}", "tts.speaker=ryan",
                     "tts.streaming_chunk_size=2", "tts.max_new_tokens=2").build()
    stage.setup()
    expected = f"mlx-community/Qwen3-TTS-12Hz-1.7B-CustomVoice-{quantization or '6bit'}"
    assert loads[0].args == (expected,) and stage.describe()["model"] == expected
    model = loads[0].result
    quantized = [m for _, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    if quantization == "bf16":
        assert not quantized
        assert {v.dtype for _, v in tree_flatten(model.talker.parameters())} == {mx.bfloat16}
    else:
        assert quantized and {m.bits for m in quantized} == {int((quantization or "6bit")[0])}
    speak(stage)

