"""Every option of every group composes on every platform and binds to its target; bad configs fail clearly."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

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
    # the mlx extra installs MLX on Linux and macOS only (pyproject's markers): no Windows config may choose it
    **{(group, option, windows): "MLX has no Windows wheels" for group, option in
       (("tts", "qwen3_mlx"), ("llm", "mlx_lm"), ("stt", "mlx_whisper")) for windows in ("windows", "windows_cuda")},
    ("tts", "qwen3_torch", "linux"): "tts.device=cpu: invalid; expected cuda",
    ("tts", "qwen3_torch", "windows"): "tts.device=cpu: invalid; expected cuda",
    ("tts", "qwen3_torch", "macos"): "runs on CUDA graphs",
    ("tts", "qwen3_torch", "macos_intel"): "runs on CUDA graphs",
}


# Options that only fit another pipeline compose with what selects it.
CONTEXT: dict[tuple[str, str], list[str]] = {
    ("source", "sentences"): ["experiment=tts_benchmark"],
    # no STT: the utterance goes to an LLM that hears audio (tests/test_llm_audio.py has the refusals)
    ("stt", "none"): ["llm=openai", "llm.base_url=http://127.0.0.1:8000/v1", "llm.model=m"],
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.name.startswith("_"))


def test_platform_configs_match_detection():
    assert sorted(p.stem for p in (CONF_DIR / "platform").glob("*.yaml")) == sorted(PLATFORMS)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_platform_is_one_name_from_the_command_line_to_the_config(platform, tmp_path):
    """platform=<name> picks conf/platform/<name>.yaml, whose facts are cfg.platform (no second name for it)."""
    from s2s.platform import detect

    cfg = compose_config([f"platform={platform}"], tmp_path)
    assert cfg.platform.name == platform and "host" not in cfg
    assert cfg.platform.accelerator in ("cpu", "cuda", "mps") and cfg.platform.os in platform
    assert detect().platform in PLATFORMS  # the machine's facts name the platform config that fits it


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


def test_validate_config_sees_every_argument_even_when_the_config_omits_one(tmp_path):
    """Backends read bound arguments directly (no kwargs.get(key, default)): the validator applies defaults,
    on the command line as in a server session.update."""
    from s2s.server.pipelines import override_errors

    cfg = compose_config(["stt=parakeet", "~stt.backend", "~stt.model"], tmp_path)
    spec = next(spec for spec in validate(cfg) if spec.group == "stt")
    assert "backend" not in spec.kwargs and "model" not in spec.kwargs
    [error] = override_errors(cfg, spec, {"quantization": "int8", "model": "/nonexistent/parakeet"})
    assert error.key == "stt.model" and "no such folder" in error.expected
    assert override_errors(cfg, spec, {"language": "de"}) == []


def test_device_auto_follows_the_platform(tmp_path):
    for platform, device in [("linux", "cpu"), ("linux_cuda", "cuda"), ("macos", "mps")]:
        specs = validate(compose_config([f"platform={platform}", "llm=ctranslate2"], tmp_path))  # (onnx: the CPU)
        assert next(s for s in specs if s.group == "llm").kwargs["device"] == device
    specs = validate(compose_config(["platform=linux_cuda"], tmp_path))  # the default LLM: onnxruntime on the CPU
    devices = {spec.group: spec.kwargs.get("device") for spec in specs}
    assert (devices["stt"], devices["llm"]) == ("cuda", "cpu")
    specs = validate(compose_config(["platform=linux_cuda", "llm=ctranslate2", "llm.device=cpu"], tmp_path))
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
    [message] = errors_of(["tts=kokoro_onnx", "tts.voice=nobody"], tmp_path)
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
    assert message.startswith("tts.pitch=3") and "speaker" in message and "speed" in message


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
    assert any("tts.pitch=3: unknown key 'pitch'" in line and "speaker" in line for line in lines)
    assert any("vad=nope: unknown option" in line and "silero" in line for line in lines)


def test_cli_validation_errors_exit_2_before_loading(tmp_path):
    result = run_cli("tts=kokoro_onnx", "tts.voice=nobody", f"source.path={tmp_path / 'nothing.wav'}", f"hydra.run.dir={tmp_path}",
                     cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("config error:")]
    assert len(lines) == 2
    assert "set up" not in result.stderr + result.stdout  # no stage was set up


def test_the_command_line_is_checked_ahead_of_hydra_through_its_public_api():
    """preflight.check composes what Hydra will compose; Hydra's internals are never patched."""
    from s2s.preflight import check

    [line] = check(["tts=nope", "platform=linux"])
    assert line.startswith("tts=nope: unknown option for config group 'tts'; valid: ") and "kokoro_onnx" in line
    assert check(["--cfg", "job", "llm=echo", "platform=linux"]) == []
    # a sweep: every option a group sweep names exists, and the first job composes, before any job runs
    [line] = check(["-m", "tts=kokoro_onnx,nope", "llm=echo", "platform=linux"])
    assert line.startswith("tts=nope: unknown option")
    [line] = check(["-m", "tts=kokoro_onnx", "tts.voice=jf_alpha,jm_kumo", "tts.pitch=1,2", "platform=linux"])
    assert line.startswith("tts.pitch=1: unknown key 'pitch' in 'tts'")
    assert check(["-m", "tts=glob(*,exclude=_*)", "tts.speed=1.0,1.2", "platform=linux"]) == []
    assert check(["-cn", "another", "tts=nope"]) == []  # another config: Hydra's to compose and report (guarded)
    assert check(["tts.voice=[broken", "platform=linux"]) == []  # a grammar error: Hydra's message says it
    # only the guard touches Hydra's internals, at the one method every composition goes through
    users = [path for path in [ROOT / "run.py", *(ROOT / "s2s").rglob("*.py")] if "ConfigLoaderImpl" in path.read_text()]
    assert [path.name for path in users] == ["hydra_guard.py"]


CALLBACK = """
dry_run: true
hydra:
  callbacks:
    evil:
      _target_: pathlib.Path.touch
      self: {touched}
"""


def _foreign_configs(folder: Path, touched: Path) -> None:
    """A primary config of its own (for -cp/-cn) and a group option for ours (for -cd), each with a callback
    that would create ``touched`` if Hydra instantiated it."""
    (folder / "experiment").mkdir(parents=True)
    (folder / "standalone.yaml").write_text("platform: null\n" + CALLBACK.format(touched=touched))
    (folder / "with_ours.yaml").write_text("defaults:\n  - config\n  - _self_\n" + CALLBACK.format(touched=touched))
    (folder / "experiment" / "evil.yaml").write_text("# @package _global_\n" + CALLBACK.format(touched=touched))


@pytest.mark.parametrize("flags", [
    ["-cd", "{dir}", "experiment=evil"],
    ["--config-dir={dir}", "experiment=evil"],
    ["-cd", "{dir}", "-cn", "with_ours"],
    ["-cp", "{dir}", "-cn", "standalone"],
    ["--config-path", "{dir}", "--config-name", "standalone"],
    ["-cd", "{dir}", "-m", "experiment=evil"],
    ["-cd", "{dir}", "experiment=evil", "--cfg", "job"],
])
def test_a_config_from_another_folder_is_checked_before_hydra_instantiates_it(flags, tmp_path):
    touched = tmp_path / "touched.txt"
    _foreign_configs(tmp_path / "theirs", touched)
    args = [flag.format(dir=tmp_path / "theirs") for flag in flags]
    result = run_cli(*args, f"hydra.run.dir={tmp_path / 'run'}",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("config error: hydra.callbacks.evil._target_=pathlib.Path.touch") and "refused" in line
    assert not touched.exists()


def test_a_config_dir_of_the_users_own_still_works(tmp_path):
    (tmp_path / "theirs" / "tts").mkdir(parents=True)
    (tmp_path / "theirs" / "tts" / "mine.yaml").write_text("defaults:\n  - piper\n  - _self_\nspeed: 1.2\n")
    result = run_cli("-cd", str(tmp_path / "theirs"), "tts=mine", "--cfg", "job", cwd=tmp_path, check=True)
    assert "s2s.tts.piper.PiperTTS" in result.stdout and "speed: 1.2" in result.stdout


def test_experimental_rerun_is_refused_before_the_pickle_is_opened(tmp_path):
    import pickle

    touched = tmp_path / "touched.txt"

    class Touch:
        def __reduce__(self):
            return (Path.touch, (touched,))

    (tmp_path / "config.pickle").write_bytes(pickle.dumps(Touch()))
    result = run_cli("--experimental-rerun", str(tmp_path / "config.pickle"), cwd=tmp_path)
    assert result.returncode == 2 and "--experimental-rerun: refused for safety" in result.stderr
    assert not touched.exists()


def test_cli_cfg_job_and_dry_run_for_another_platform_load_nothing(tmp_path):
    result = run_cli("platform=macos", "--cfg", "job", "llm=echo", cwd=tmp_path, check=True)
    assert "name: macos" in result.stdout and "s2s.llm.echo.EchoLM" in result.stdout
    assert "_target_: s2s.tts.piper.PiperTTS" in result.stdout
    probe = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "run.py"), "platform=macos",
                            "llm=transformers", "dry_run=true", f"hydra.run.dir={tmp_path}"], cwd=tmp_path, capture_output=True,
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


# ---------------------------------------------------------------- issue 10: holes and one-pass reports
def _numeric_keys(cls):
    """(key, annotation) of each int/float constructor argument, Optional[...] included."""
    import inspect
    import typing

    hints = typing.get_type_hints(cls.__init__, include_extras=True)
    for name in inspect.signature(cls).parameters:
        annotation = hints.get(name)
        arms = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, __import__(
            "types").UnionType) else (annotation,)
        bases = {typing.get_args(arm)[0] if typing.get_origin(arm) is typing.Annotated else arm for arm in arms}
        if bases & {int, float} and name != "audio_device":  # a device index or name: checked by PortAudio
            yield name, annotation


def _out_of_range(annotation):
    from s2s.schema import constraints

    [bound] = [c for c in constraints(annotation) if hasattr(c, "low")] or [None]
    assert bound is not None, f"no Range declared on {annotation}"
    return bound.low - 1 if bound.low is not None else bound.high + 1


def _every_stage_option():
    """Each option that selects a stage (stt=none selects none: it leaves the STT out of the pipeline)."""
    for group in STAGE_GROUPS:
        for option in options(group):
            if "_target_" in OmegaConf.load(CONF_DIR / group / f"{option}.yaml"):
                yield group, option


@pytest.mark.parametrize("group,option", list(_every_stage_option()))
def test_every_numeric_key_has_a_range_and_an_out_of_range_value_fails_before_loading(group, option, tmp_path):
    overrides = [f"{group}={option}", *CONTEXT.get((group, option), [])]
    if (group, option, "linux") in EXPECTED_FAILURES:
        overrides.append("platform=linux_cuda")  # e.g. qwen3_torch needs CUDA
    spec = next(s for s in validate(compose_config(overrides, tmp_path)) if s.group == group)
    for key, annotation in _numeric_keys(spec.cls):
        bad = _out_of_range(annotation)
        messages = errors_of([*overrides, f"{group}.{key}={bad}"], tmp_path)
        assert any(m.startswith(f"{group}.{key}={bad}: invalid; expected a number") for m in messages), messages


@pytest.mark.parametrize("override", ["stt.beam_size=0", "llm.max_new_tokens=-5", "llm.history_turns=-1",
                                      "audio.sample_rate=7", "vad.threshold=1.0", "stt.language=klingon"])
def test_the_reported_out_of_range_values_exit_2_on_a_dry_run(override, tmp_path):
    result = run_cli(override, "dry_run=true", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"config error: {override}: invalid; expected" in result.stderr
    assert "graph for platform" not in result.stdout


def test_an_unknown_key_and_a_bad_value_are_reported_together(tmp_path):
    result = run_cli("tts=kokoro_onnx", "tts.pitch=3", "tts.voice=nobody", "stt.beam_size=0", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert any("tts.pitch=3: unknown key 'pitch'" in line for line in lines)
    assert any(line.startswith("config error: tts.voice=nobody: invalid") for line in lines)
    assert any(line.startswith("config error: stt.beam_size=0: invalid") for line in lines)
    assert len(lines) == 3, lines


@pytest.mark.parametrize("override", [
    "+hydra.callbacks.x._target_=pathlib.Path.touch",
    "hydra.callbacks.sweep._target_=pathlib.Path.touch",
    "+hydra.job_logging.handlers.evil.class=pathlib.Path.touch",
])
def test_no_target_outside_s2s_is_instantiated_anywhere(override, tmp_path):
    touched = tmp_path / "touched.txt"
    for mode in ([], ["-m"]):
        result = run_cli(*mode, override, f"+{override.split('=')[0].lstrip('+').rsplit('.', 1)[0]}.self={touched}",
                         "dry_run=true", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("config error: hydra.") and "refused for safety" in line
        assert not touched.exists()


def test_a_stage_target_outside_s2s_is_refused_in_one_line(tmp_path):
    result = run_cli("+llm.extra._target_=os.system", "dry_run=true", cwd=tmp_path)
    assert result.returncode == 2
    assert "config error: llm.extra._target_=os.system: invalid" in result.stderr


def test_hydra_launchers_selected_through_their_group_still_work(tmp_path):
    result = run_cli("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=1", "dry_run=true",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_two_runs_started_together_never_share_a_folder(tmp_path):
    runs = [subprocess.Popen([sys.executable, str(ROOT / "run.py"), "dry_run=true"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    folders = set()
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        [sink] = [line for line in out.splitlines() if line.strip().startswith("sink")]
        folders.add(sink.split("path=")[1].rsplit("/", 1)[0])
    assert len(folders) == 3, folders
    assert all((tmp_path / "outputs").glob("*/*"))


def test_a_folder_holding_another_runs_results_is_refused(tmp_path):
    (tmp_path / "metrics.json").write_text('{"status": "completed"}')
    result = run_cli("llm=echo", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 2 and "earlier run's metrics.json" in result.stderr
    assert (tmp_path / "metrics.json").read_text() == '{"status": "completed"}'


def test_help_says_what_s2s_is_and_lists_only_user_choices(tmp_path):
    result = run_cli("--help", cwd=tmp_path, check=True)
    assert "powered by Hydra" not in result.stdout and "voice agent" in result.stdout
    assert "_qwen3_base" not in result.stdout and "tts_platform" not in result.stdout
    for group in STAGE_GROUPS + ("profile",):
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith(f"{group}:"))
        assert set(line.split(":", 1)[1].replace(",", " ").split()) == set(options(group))


def test_thread_budgets_are_checked_and_reach_the_stages(tmp_path):
    messages = errors_of(["runner.threads.stt=0", "runner.threads.tts=many"], tmp_path)
    assert sorted(m.split(":")[0] for m in messages) == ["runner.threads.stt=0", "runner.threads.tts=many"]
    [message] = errors_of(["+runner.threads.mixer=2"], tmp_path)
    assert message.startswith("runner.threads.mixer=2: invalid; expected a key naming a stage")
    specs = {spec.group: spec for spec in validate(compose_config(["runner.threads.llm=1", "runner.threads.tts=2"],
                                                                  tmp_path))}
    assert specs["llm"].build().threads == 1 and specs["tts"].build().threads == 2
    assert specs["stt"].build().threads is None  # unset: the library's own default


def test_every_optional_defaults_entry_points_at_a_folder_with_files():
    """``optional <group>: ...`` entries name folders that exist (a missing one silently matches nothing)."""
    from omegaconf import OmegaConf

    entries = [next(iter(entry)) for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults
               if isinstance(entry, dict) or OmegaConf.is_dict(entry)]
    optional = [key.split()[1] for key in entries if key.startswith("optional ")]
    assert optional, entries
    for group in optional:
        assert sorted((CONF_DIR / group).glob("*.yaml")), f"conf/{group}/ is empty or missing"


def test_the_shared_llm_defaults_are_stated_once_and_match_the_code():
    import inspect

    from omegaconf import OmegaConf

    from s2s.llm.base import FIRST_CHUNK_MIN_WORDS, FIRST_CHUNK_WORDS

    shared = {"first_chunk_words": FIRST_CHUNK_WORDS, "first_chunk_min_words": FIRST_CHUNK_MIN_WORDS,
              "language": "en", "follow_user_language": True}
    assert OmegaConf.to_container(OmegaConf.load(CONF_DIR / "llm" / "_chat_base.yaml")) == shared
    for option in options("llm"):
        assert not set(shared) & set(OmegaConf.load(CONF_DIR / "llm" / f"{option}.yaml")), f"{option} restates them"
        [spec] = [spec for spec in validate(compose_config([f"llm={option}", "platform=macos"]))
                  if spec.group == "llm"]
        parameters = inspect.signature(spec.cls).parameters
        assert {key: spec.kwargs[key] for key in shared} == shared == {
            key: parameters[key].default for key in shared}, option
