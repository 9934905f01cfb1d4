"""s2s.models: one rule for where a model comes from (local path, packaged name, hub id), and its folder check."""
from __future__ import annotations

from pathlib import Path

import pytest

from s2s import models
from s2s.config_errors import ValidationContext
from s2s.models import (
    build_once,
    model_threads,
    loadable,
    local_path,
    model_folder_error,
    model_source,
)

CONTEXT = ValidationContext("stt", "linux", "linux", "cpu")


@pytest.mark.parametrize("model, path", [
    ("/models/whisper", True), ("./whisper", True), ("../whisper", True), ("~/whisper", True),
    ("C:\\models\\whisper", True), ("models\\whisper", True), ("models/whisper/small", True),
    ("openai/whisper-small", False), ("gpt2", False), ("tiny.en", False), ("SmolLM2-135M-Instruct", False)])
def test_a_path_is_told_from_an_id_by_how_it_is_written(model, path):
    assert models.looks_like_path(model) is path


def test_local_packaged_or_hub(tmp_path, monkeypatch):
    packaged = ("tiny.en",)
    assert model_source(str(tmp_path / "missing"), packaged) == "local"  # a path, even before it exists
    assert model_source("tiny.en", packaged) == "packaged"
    assert model_source("tiny.en") == "hub"  # a name only counts as packaged for the backend that ships it
    assert model_source("openai/whisper-small", packaged) == "hub"
    (tmp_path / "owner" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert model_source("owner/name") == "local"  # an existing relative folder wins over the owner/name reading
    assert local_path("owner/name") == Path("owner/name") and local_path("other/name") is None
    assert loadable("~/m") == str(Path.home() / "m") and loadable("openai/whisper-small") == "openai/whisper-small"


def test_a_missing_or_incomplete_folder_is_a_config_error_naming_the_key(tmp_path):
    assert model_folder_error("openai/whisper-small", CONTEXT, "openai/whisper-tiny") is None  # the hub's business
    assert model_folder_error(None, CONTEXT, "openai/whisper-tiny") is None
    assert model_folder_error(str(tmp_path), CONTEXT, "openai/whisper-tiny") is None
    error = model_folder_error(f"{tmp_path}/nope", CONTEXT, "openai/whisper-tiny")
    assert str(error) == (f"stt.model={tmp_path}/nope: invalid; expected an existing local model folder or a hub id "
                          "such as openai/whisper-tiny (no such folder)")
    (tmp_path / "config.json").write_text("{}")
    error = model_folder_error(str(tmp_path), CONTEXT, "x/y", key="models.fr", needs=("config.json", "*.pth"))
    assert error.key == "stt.models.fr" and "with config.json and *.pth (it has no *.pth)" in error.expected
    (tmp_path / "file.bin").write_bytes(b"")
    assert "no such folder" in model_folder_error(str(tmp_path / "file.bin"), CONTEXT, "x/y").expected


def test_build_once_builds_a_missing_target_once(tmp_path):
    built = []

    def build(out: Path) -> None:
        built.append(out.name)
        out.write_text("done")

    target = tmp_path / "cache" / "model.onnx"
    assert build_once(target, build, "test") == target and build_once(target, build, "test") == target
    assert built == ["model.onnx.partial"] and target.read_text() == "done"


def test_small_ctranslate2_weights_get_one_cpu_thread_unless_the_runner_says(tmp_path):
    """The packaged tiny.en (78 MB) gets one thread on the CPU; runner.threads wins; large weights, a folder
    without model.bin (a hub id) and a GPU keep CTranslate2's default (0)."""
    from s2s.stt.faster_whisper import resolve_model

    tiny = resolve_model("tiny.en")
    assert model_threads(None, "cpu", tiny) == 1
    assert model_threads(3, "cpu", tiny) == 3
    assert model_threads(None, "cuda", tiny) == 0
    large = tmp_path / "large"
    large.mkdir()
    with open(large / "model.bin", "wb") as weights:  # sparse: its size is what counts
        weights.truncate((models.SMALL_WEIGHTS_MB + 1) * 1_000_000)
    assert model_threads(None, "cpu", large) == 0
    assert model_threads(None, "cpu", "Systran/faster-whisper-small") == 0


def test_the_whisper_and_llm_stages_load_the_packaged_models_on_one_thread():
    """Both CTranslate2 stages ask the rule (the shared-weights key records what the library was given)."""
    from s2s import sharing
    from s2s.llm.ctranslate2_lm import CTranslate2LM
    from s2s.stt.faster_whisper import FasterWhisperSTT

    sharing.enable(users=1)
    try:
        for stage in (FasterWhisperSTT(device="cpu"), CTranslate2LM(device="cpu")):
            stage.setup()
            stage.close()
        keys = [key for key in sharing._models if key[0] in ("faster_whisper", "ctranslate2")]
        assert len(keys) == 2 and all(key[5] == 1 for key in keys), keys
    finally:
        sharing.enable(False)
