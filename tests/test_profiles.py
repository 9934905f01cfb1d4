"""Deployment profiles: each composes and validates on every platform or fails clearly; precedence rules."""
from __future__ import annotations

import re

import pytest
from hydra.errors import MissingConfigException

from conftest import CONF_DIR, compose_config, run_cli
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.platform import PLATFORMS

PROFILES = sorted(p.stem for p in (CONF_DIR / "profile").glob("*.yaml"))

# (profile, platform) -> the key the ConfigError names: combinations that cannot work must say so before loading
EXPECTED_FAILURES = {
    ("cuda_server", "linux"): "tts.device",        # qwen3_torch needs CUDA; auto resolves to cpu here
    ("cuda_server", "windows"): "tts.device",
    ("cuda_server", "macos"): "tts.backend",       # no CUDA graphs on a Mac
    ("cuda_server", "macos_intel"): "tts.backend",
    ("mac_local", "macos_intel"): "tts.backend",   # no Qwen3-TTS backend for Intel Macs
    ("mac_local", "windows"): "tts.backend",       # CPU Windows: no ggml wheel, torch needs CUDA
    **{("quality", platform): "llm.model" for platform in PLATFORMS},  # the user names the model
}


def compose_profile(overrides: list[str], tmp_path):
    try:
        return compose_config(overrides, tmp_path)
    except MissingConfigException as error:  # a profile naming an option that does not exist is broken
        pytest.fail(f"{overrides}: {str(error).splitlines()[0]}")


def test_the_checked_in_profiles():
    assert PROFILES == ["benchmark", "cpu_edge", "cuda_server", "mac_local", "offline", "quality"]
    for name in PROFILES:
        head = (CONF_DIR / "profile" / f"{name}.yaml").read_text().splitlines()
        assert head[0] == "# @package _global_"
        assert re.match(rf"# .*python run\.py .*profile={name}\b", head[1]), head[1]  # says how to use it


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_validates_on_every_platform_or_says_why_not(profile, platform, tmp_path):
    cfg = compose_profile([f"profile={profile}", f"platform={platform}"], tmp_path)
    key = EXPECTED_FAILURES.get((profile, platform))
    if key is None:
        specs = validate(cfg)
        assert [spec.group for spec in specs] == list(cfg.pipeline)
    else:
        with pytest.raises(ConfigErrors) as caught:
            validate(cfg)
        assert any(error.key == key for error in caught.value.errors), str(caught.value)
        if key != "llm.model":  # a platform's want, not the user's missing model: it says what is missing
            assert f"{platform}" in str(caught.value) or "cuda" in str(caught.value)


def test_profiles_select_what_they_promise(tmp_path):
    edge = compose_profile(["profile=cpu_edge", "platform=linux_cuda"], tmp_path)
    assert edge.tts._target_.endswith("PiperTTS") and edge.source._target_.endswith("MicSource")
    assert {spec.kwargs["device"] for spec in validate(edge) if "device" in spec.kwargs} == {"cpu"}
    server = compose_profile(["profile=cuda_server", "platform=linux_cuda"], tmp_path)
    devices = {spec.group: spec.kwargs.get("device") for spec in validate(server)}
    assert devices["tts"] == devices["llm"] == devices["stt"] == "cuda" and server.tts.backend == "torch"
    assert server.stt.language is None
    bench = compose_profile(["profile=benchmark"], tmp_path)
    assert bench.sink._target_.endswith("NullSink") and bench.llm.temperature == 0.0
    assert compose_profile(["profile=offline"], tmp_path) == compose_config([], tmp_path)  # the default itself
    default = compose_config([], tmp_path)  # SmolLM2 and Whisper's greedy decodes on onnxruntime
    assert default.llm._target_.endswith("OnnxLM") and default.stt.cpu_decoder == "onnxruntime"


def test_platform_rules_apply_under_a_profile_and_the_command_line_wins(tmp_path):
    assert compose_profile(["profile=mac_local", "platform=macos"], tmp_path).tts.backend == "mlx"
    assert compose_profile(["profile=mac_local", "platform=linux"], tmp_path).tts.backend == "ggml"
    assert compose_profile(["profile=mac_local", "platform=macos", "tts.backend=ggml"], tmp_path).tts.backend == "ggml"
    cfg = compose_profile(["profile=cpu_edge", "tts=mms", "source=file", "llm.max_new_tokens=99", "device=auto"],
                          tmp_path)
    assert cfg.tts._target_.endswith("MmsTTS") and cfg.source._target_.endswith("FileSource")
    assert cfg.llm.max_new_tokens == 99 and cfg.device == "auto"
    both = compose_profile(["profile=benchmark", "experiment=tts_benchmark"], tmp_path)  # TTS only, same profile
    assert list(both.pipeline) == ["source", "tts", "sink"] and both.sink._target_.endswith("RoundTripSink")


def test_dry_run_shows_what_a_profile_runs_on_another_platform(tmp_path):
    result = run_cli("profile=mac_local", "platform=linux", "dry_run=true", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "graph for platform=linux" in result.stdout
    assert re.search(r"tts\s+s2s\.tts\.qwen3\.Qwen3TTS .*backend=ggml", result.stdout), result.stdout
    on_mac = run_cli("profile=mac_local", "platform=macos", "dry_run=true", cwd=tmp_path, timeout=120)
    assert re.search(r"tts\s+s2s\.tts\.qwen3\.Qwen3TTS .*backend=mlx", on_mac.stdout), on_mac.stdout
    refused = run_cli("profile=cuda_server", "platform=macos", "dry_run=true", cwd=tmp_path, timeout=120)
    assert refused.returncode == 2 and "config error: tts.backend=torch" in refused.stderr


def test_the_quality_tier_runs_a_local_transformers_folder_with_history_and_tools(tmp_path):
    """profile=quality on a tiny random model of a chat architecture (Qwen2), converted once: the same stage as
    the default, so history and tools work the same."""
    from tests.fixtures import llm_models
    from s2s.messages import ReplyText, Transcript

    models = tmp_path / "models"
    folder = llm_models.tool_lm("native", models)
    cfg = compose_profile(["profile=quality", f"llm.model={folder}", f"cache_dir={models}",
                           "llm.tools=tests.fixtures.weather_tools", "llm.compute_type=float32"], tmp_path)
    [spec] = [spec for spec in validate(cfg) if spec.group == "llm"]
    assert spec.target.endswith("CTranslate2LM") and spec.kwargs["max_new_tokens"] == 96
    assert spec.kwargs["unsure_below"] is None  # SmolLM2's threshold is not carried over to another model
    stage = spec.build()
    stage.threads = 1
    stage.setup()
    try:
        first = [m for m in stage.process(Transcript("What is the weather in Paris?", 0, "en"))]
        second = [m for m in stage.process(Transcript("And in Rome?", 1, "en"))]
    finally:
        stage.close()
    assert any(isinstance(m, ReplyText) for m in first) and any(isinstance(m, ReplyText) for m in second)
