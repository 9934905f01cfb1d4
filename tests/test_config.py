"""Every option of every group composes on every platform and binds to its target; bad configs fail clearly."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import CONF_DIR, ROOT, compose_config, run_cli
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.platform import PLATFORMS

STAGE_GROUPS = ("source", "vad", "stt", "llm", "tts", "sink")

# Combinations that cannot work and must say so (group, option, platform) -> fragment of the error.
EXPECTED_FAILURES: dict[tuple[str, str, str], str] = {
    # qwentts.cpp (ggml) publishes wheels for Linux (glibc >= 2.39) and Apple silicon only; mlx has no Intel-Mac
    # wheel; faster-qwen3-tts's torch backend runs on CUDA graphs.
    ("tts", "qwen3", "macos_intel"): "no Qwen3-TTS backend runs on platform macos_intel",
    ("tts", "qwen3", "windows"): "publishes no Windows wheels",
    ("tts", "qwen3_ggml", "macos_intel"): "no Qwen3-TTS backend runs on platform macos_intel",
    ("tts", "qwen3_ggml", "windows"): "publishes no Windows wheels",
    ("tts", "qwen3_ggml", "windows_cuda"): "publishes no Windows wheels",
    ("tts", "qwen3_mlx", "macos_intel"): "no wheels for Intel Macs",
    ("llm", "mlx_lm", "macos_intel"): "no wheels for Intel Macs",
    ("stt", "mlx_whisper", "macos_intel"): "no wheels for Intel Macs",
    ("tts", "qwen3_torch", "linux"): "tts.device=cpu: invalid; expected cuda",
    ("tts", "qwen3_torch", "windows"): "tts.device=cpu: invalid; expected cuda",
    ("tts", "qwen3_torch", "macos"): "runs on CUDA graphs",
    ("tts", "qwen3_torch", "macos_intel"): "runs on CUDA graphs",
}


# Options that only fit another pipeline compose with what selects it.
CONTEXT: dict[tuple[str, str], list[str]] = {("source", "sentences"): ["bench=tts"]}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.name.startswith("_"))


def test_platform_configs_match_detection():
    assert sorted(p.stem for p in (CONF_DIR / "platform").glob("*.yaml")) == sorted(PLATFORMS)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("group,option", [(g, o) for g in STAGE_GROUPS for o in options(g)])
def test_every_option_composes_and_binds(group, option, platform, tmp_path):
    cfg = compose_config([f"{group}={option}", f"platform={platform}", *CONTEXT.get((group, option), [])], tmp_path)
    expected = EXPECTED_FAILURES.get((group, option, platform))
    if expected is None:
        specs = validate(cfg)
        assert [spec.group for spec in specs] == list(cfg.pipeline)
        if group not in cfg.pipeline:
            return
        spec = next(spec for spec in specs if spec.group == group)
        assert spec.target == cfg[group]["_target_"]
        if "device" in spec.kwargs:
            assert spec.kwargs["device"] in ("cpu", "cuda", "mps")
    else:
        with pytest.raises(ConfigErrors, match=expected):
            validate(cfg)


def test_device_auto_follows_the_platform(tmp_path):
    for platform, device in [("linux", "cpu"), ("linux_cuda", "cuda"), ("macos", "mps")]:
        specs = validate(compose_config([f"platform={platform}"], tmp_path))
        assert next(s for s in specs if s.group == "llm").kwargs["device"] == device
    specs = validate(compose_config(["platform=linux_cuda", "llm.device=cpu"], tmp_path))
    assert next(s for s in specs if s.group == "llm").kwargs["device"] == "cpu"  # the command line wins


def errors_of(overrides, tmp_path) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config(overrides, tmp_path))
    return [str(error) for error in caught.value.errors]


def test_a_device_the_platform_lacks_is_refused_once(tmp_path):
    [message] = errors_of(["device=cuda", "platform=linux"], tmp_path)
    assert message.startswith("device=cuda") and "no CUDA" in message and "linux_cuda" in message
    [message] = errors_of(["llm.device=mps", "platform=windows"], tmp_path)
    assert message.startswith("llm.device=mps") and "Apple silicon" in message
    validate(compose_config(["device=cuda", "platform=linux_cuda"], tmp_path))


def test_bad_enum_value_names_key_value_and_choices(tmp_path):
    [message] = errors_of(["tts.voice=nobody"], tmp_path)
    assert message.startswith("tts.voice=nobody") and "jf_alpha" in message and "jm_kumo" in message


def test_speed_out_of_range(tmp_path):
    [message] = errors_of(["tts.speed=0"], tmp_path)
    assert message.startswith("tts.speed=0") and "from 0.25 to 4" in message


def test_bad_type_and_bad_device(tmp_path):
    messages = errors_of(["tts.speed=fast", "llm.device=tpu"], tmp_path)
    assert any(m.startswith("tts.speed=fast") and "number" in m for m in messages)
    assert any(m.startswith("llm.device=tpu") and "cuda" in m for m in messages)


def test_runner_settings_are_checked(tmp_path):
    messages = errors_of(["runner.half_duplex=maybe", "dry_run=often"], tmp_path)
    assert sorted(m.split(":")[0] for m in messages) == ["dry_run=often", "runner.half_duplex=maybe"]


def test_unknown_key_added_with_plus_is_refused(tmp_path):
    [message] = errors_of(["+tts.pitch=3"], tmp_path)
    assert message.startswith("tts.pitch=3") and "voice" in message and "speed" in message


def test_missing_required_value(tmp_path):
    [message] = errors_of(["source.path=???"], tmp_path)
    assert message.startswith("source.path=???") and "required" in message


def test_targets_outside_the_package_are_refused(tmp_path):
    [message] = errors_of(["tts._target_=os.system"], tmp_path)
    assert "tts._target_=os.system" in message and "s2s" in message
    [message] = errors_of(["tts._target_=s2s.audio.resample"], tmp_path)
    assert "Stage" in message


def test_source_file_problems(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    text = tmp_path / "notes.wav"
    text.write_text("hello, I am not audio\n" * 20)
    for path, fragment in [(tmp_path / "missing.wav", "no such file"), (empty, "empty"),
                           (text, "not a readable audio file")]:
        [message] = errors_of([f"source.path={path}"], tmp_path)
        assert message.startswith(f"source.path={path}") and fragment in message


def test_pipeline_neighbours_must_fit(tmp_path):
    [message] = errors_of(["source=sentences"], tmp_path)
    assert message.startswith("pipeline=[source, vad, stt, llm, tts, sink]")
    assert "source (s2s.io.sentences.SentenceSource) emits ReplyText" in message and "accepts AudioChunk" in message
    [message] = errors_of(["pipeline=[source,vad,tts,sink]"], tmp_path)
    assert "vad (s2s.vad.silero.SileroVAD) emits SpeechSegment" in message and "accepts ReplyText" in message


def test_vad_cross_field_rules(tmp_path):
    messages = errors_of(["vad.threshold=1.5", "vad.max_speech_ms=100"], tmp_path)
    assert any(m.startswith("vad.threshold=1.5") for m in messages)
    assert any(m.startswith("vad.max_speech_ms=100") for m in messages)


# ---------------------------------------------------------------- the command line (subprocesses)
def test_cli_unknown_group_option(tmp_path):
    result = run_cli("tts=nope", cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("config error: tts=nope: unknown option") and "kokoro_onnx" in line


def test_cli_unknown_key_and_bad_value_in_one_go(tmp_path):
    result = run_cli("tts.pitch=3", "vad=nope", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in result.stderr
    assert any("tts.pitch=3: unknown key 'pitch'" in line and "voice" in line for line in lines)
    assert any("vad=nope: unknown option" in line and "silero" in line for line in lines)


def test_cli_validation_errors_exit_2_before_loading(tmp_path):
    result = run_cli("tts.voice=nobody", f"source.path={tmp_path / 'nothing.wav'}", f"hydra.run.dir={tmp_path}",
                     cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("config error:")]
    assert len(lines) == 2
    assert "set up" not in result.stderr + result.stdout  # no stage was set up


def test_cli_cfg_job_and_dry_run_for_another_platform_load_nothing(tmp_path):
    result = run_cli("platform=macos", "--cfg", "job", "llm=echo", cwd=tmp_path, check=True)
    assert "name: macos" in result.stdout and "s2s.llm.echo.EchoLM" in result.stdout
    assert "_target_: s2s.tts.kokoro_onnx.KokoroOnnxTTS" in result.stdout
    probe = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "run.py"), "platform=macos",
                            "dry_run=true", f"hydra.run.dir={tmp_path}"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert "graph for platform=macos (device auto -> mps)" in probe.stdout
    assert "s2s.llm.transformers_lm.TransformersLM  device=mps" in probe.stdout
    imported = {line.split("|")[-1].strip() for line in probe.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "transformers", "onnxruntime", "faster_whisper", "silero_vad"}


def test_cli_platform_is_detected_and_can_be_forced(tmp_path):
    from s2s.platform import detect

    result = run_cli("dry_run=true", f"hydra.run.dir={tmp_path}", cwd=tmp_path, check=True)
    assert f"graph for platform={detect().platform} " in result.stdout
    result = run_cli("dry_run=true", "platform=windows", f"hydra.run.dir={tmp_path}", cwd=tmp_path, check=True)
    assert "graph for platform=windows " in result.stdout
