"""Runtime requirements: each backend declares the runtime it needs, the validator alone checks the platform."""
from __future__ import annotations

import ast
import functools
import importlib
import re

import pytest
from omegaconf import OmegaConf

from conftest import CONF_DIR, ROOT, compose_config
from s2s.config import validate
from s2s.config_errors import ConfigErrors, ValidationContext
from s2s.platform import PLATFORMS
from s2s.runtimes import ByBackend, Runtime, device_error, unavailable_error
from s2s.stage import Stage

BACKEND_DIRS = ("vad", "stt", "llm", "tts", "io")
BACKEND_MODULES = sorted(path for folder in BACKEND_DIRS for path in (ROOT / "s2s" / folder).rglob("*.py"))
# Looking at the machine or the platform from a backend, instead of declaring ``requires``; s2s.platform included:
# platform knowledge reaches a backend only as config (its keys, ``requires`` checked by the validator).
PLATFORM_LOOKS = re.compile(r"\bsys\.platform\b|\bplatform\.(system|machine|mac_ver|win32_ver)\(|^\s*import platform\b"
                            r"|^\s*from platform import|context\.(unavailable|platform|accelerator)\b"
                            r"|\bs2s\.platform\b|^\s*from s2s import [^\n]*\bplatform\b", re.M)
PLATFORM_NAMES = {*PLATFORMS, "darwin", "win32"}


@functools.cache
def option_classes() -> dict[str, type[Stage]]:
    """Every option of every stage group by ``group=option``, as its class (composed: variants inherit it)."""
    classes = {}
    for group in ("source", "vad", "stt", "llm", "tts", "sink"):
        for path in sorted((CONF_DIR / group).glob("[!_]*.yaml")):
            option = compose_config([f"{group}={path.stem}"]).get(group)
            if option is None or "_target_" not in option:  # stt=none: no stage at all
                continue
            module, _, name = option._target_.rpartition(".")
            classes[f"{group}={path.stem}"] = getattr(importlib.import_module(module), name)
    return classes


def context(platform: str = "macos_intel", accelerator: str = "cpu", **unavailable: str) -> ValidationContext:
    return ValidationContext(group="tts", platform=platform, os="macos", accelerator=accelerator,
                             unavailable=unavailable)


@pytest.mark.parametrize("path", BACKEND_MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_backend_looks_at_the_platform_itself(path):
    source = path.read_text()
    assert not PLATFORM_LOOKS.search(source), "declare Stage.requires; s2s.config checks the platform"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            constants = [c.value for side in sides
                         for c in ([side] if isinstance(side, ast.Constant) else getattr(side, "elts", []))
                         if isinstance(c, ast.Constant)]
            assert not PLATFORM_NAMES & set(constants), f"line {node.lineno} compares with a platform name"


def test_the_backends_with_platform_rules_declare_them():
    classes = option_classes()
    declared = {option for option, cls in classes.items() if cls.requires is not None}
    assert {"llm=mlx_lm", "stt=mlx_whisper", "stt=parakeet", "tts=kokoro", "tts=qwen3"} <= declared
    for option, cls in classes.items():
        if isinstance(cls.requires, ByBackend):  # every value of its backend key has an entry
            import typing

            backends = typing.get_args(typing.get_type_hints(cls.__init__)["backend"])
            assert sorted(cls.requires.runtimes) == sorted(backends), option


def test_every_unavailable_runtime_in_the_platform_configs_is_one_a_backend_needs():
    named = set()
    for cls in option_classes().values():
        requires = cls.requires
        runtimes = requires.runtimes.values() if isinstance(requires, ByBackend) else [requires]
        named |= {runtime.name for runtime in runtimes if runtime is not None}
    for platform in PLATFORMS:
        listed = set(OmegaConf.load(CONF_DIR / "platform" / f"{platform}.yaml").platform.unavailable or {})
        assert listed <= named, f"{platform}: {listed - named} is unavailable but no backend needs it"


def test_the_messages_name_the_key_the_value_and_what_runs_here():
    whole = Runtime("mlx", option="mlx_lm", instead="llm=transformers")
    assert unavailable_error(whole, {}, context()) is None
    assert str(unavailable_error(whole, {}, context(mlx="no wheels"))) == (
        "tts=mlx_lm: invalid; expected another option on platform macos_intel (no wheels), e.g. llm=transformers")
    cuda = Runtime("graphs", device="cuda", device_reason="it runs on CUDA graphs")
    three = ByBackend({"a": Runtime("ra"), "b": cuda, "c": None}, none_left="another TTS: none runs")
    assert str(unavailable_error(three, {"backend": "a"}, context(ra="why"))) == (
        "tts.backend=a: invalid; expected one of b (with a CUDA device), c on platform macos_intel (why)")
    assert str(unavailable_error(three, {"backend": "a"}, context(accelerator="cuda", ra="why", graphs="-"))) == (
        "tts.backend=a: invalid; expected c on platform macos_intel (why)")
    two = ByBackend({"a": Runtime("ra"), "b": Runtime("rb")}, none_left="another TTS: none runs")
    assert str(unavailable_error(two, {"backend": "b"}, context(ra="x", rb="why"))) == (
        "tts.backend=b: invalid; expected another TTS: none runs on platform macos_intel (why)")
    assert unavailable_error(three, {"backend": "c"}, context(ra="x", graphs="y")) is None
    assert str(device_error(three, {"backend": "b", "device": "cpu"}, context())) == (
        "tts.device=cpu: invalid; expected cuda: it runs on CUDA graphs")
    assert device_error(three, {"backend": "b", "device": "cuda:1"}, context()) is None


def test_a_backend_that_cannot_run_here_is_not_checked_further(tmp_path):
    """Its own rules assume it runs: a bad voice file on a platform without MLX is not worth a second line."""
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config(["tts=kokoro", "tts.backend=mlx", "tts.voice=/no/such/voice.pt",
                                 "platform=macos_intel"], tmp_path))
    assert [error.key for error in caught.value.errors] == ["tts.backend"]
    with pytest.raises(ConfigErrors) as caught:  # where it runs, the same voice is refused by the stage's rules
        validate(compose_config(["tts=kokoro", "tts.backend=mlx", "tts.voice=/no/such/voice.pt",
                                 "platform=macos"], tmp_path))
    assert [error.key for error in caught.value.errors] == ["tts.voice"]
