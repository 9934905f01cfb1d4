"""A config must not validate where its pip extra cannot install the runtime it needs (MLX on Windows)."""
from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement

from conftest import ROOT, compose_config
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.platform import PLATFORMS, RUNTIME_OSES

MLX_CONFIGS = {  # every way a config can choose the MLX runtime -> the key its error names
    "tts=qwen3_mlx": ("tts.backend", ["tts=qwen3_mlx"]),
    "stt=mlx_whisper": ("stt=mlx_whisper", ["stt=mlx_whisper"]),
    "llm=mlx_lm": ("llm=mlx_lm", ["llm=mlx_lm"]),
    "kokoro on mlx": ("tts.backend", ["tts=kokoro", "tts.backend=mlx"]),
    "parakeet on mlx": ("stt.backend", ["stt=parakeet", "stt.backend=mlx"]),
}
SYS_PLATFORM = {"linux": "linux", "macos": "darwin", "windows": "win32"}


@pytest.mark.parametrize("platform", ["windows", "windows_cuda"])
@pytest.mark.parametrize("name", list(MLX_CONFIGS))
def test_mlx_is_refused_on_windows_with_one_error_naming_the_key(name, platform, tmp_path):
    key, overrides = MLX_CONFIGS[name]
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config([*overrides, f"platform={platform}"], tmp_path))
    errors = [str(error) for error in caught.value.errors]
    assert len(errors) == 1 and errors[0].startswith(f"{key}") and "no Windows wheels" in errors[0], errors


@pytest.mark.parametrize("name", list(MLX_CONFIGS))
def test_mlx_still_validates_on_linux(name, tmp_path):
    validate(compose_config([*MLX_CONFIGS[name][1], "platform=linux"], tmp_path))


def test_the_rule_matches_the_markers_of_the_mlx_extra():
    """RUNTIME_OSES says where the extra installs MLX: exactly where pyproject's markers let an mlx wheel in."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["mlx"]
    mlx = [Requirement(line) for line in extra if Requirement(line).name == "mlx"]
    installs = {os_name for os_name in {p.split("_")[0] for p in PLATFORMS}
                if any(r.marker is None or r.marker.evaluate({"sys_platform": SYS_PLATFORM[os_name]}) for r in mlx)}
    assert installs == set(RUNTIME_OSES["mlx"][0])
