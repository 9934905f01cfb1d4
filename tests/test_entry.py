"""The entry (the ``s2s`` command, ``python -m s2s``): run.py's behaviour under one name, plus its shortcuts.

The venv's ``s2s`` script may belong to another checkout (an editable install), so these run ``python -m s2s``
from this checkout; ``[project.scripts]`` is checked to name the same function. Nothing here loads a model.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT
from s2s.entry import with_shortcut


def s2s(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "s2s", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_script_entry_is_the_entrys_main():
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["s2s"]
    module, _, name = entry.partition(":")
    assert getattr(importlib.import_module(module), name) is importlib.import_module("s2s.entry").main


@pytest.mark.parametrize(("args", "source", "sink"), [
    ([], "s2s.io.file.FileSource", "s2s.io.file.FileSink"),
    (["local"], "s2s.io.sound.MicSource", "s2s.io.sound.SpeakerSink"),
    (["local", "sink=file"], "s2s.io.sound.MicSource", "s2s.io.file.FileSink"),  # the user's override wins
    (["serve"], "s2s.server.stages.SocketSource", "s2s.server.stages.SocketSink"),
])
def test_each_command_builds_its_graph(args, source, sink, tmp_path):
    result = s2s(*args, "dry_run=true", "platform=macos", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("graph for platform=macos") for line in lines), result.stdout
    assert any(line.split()[:2] == ["source", source] for line in lines), result.stdout
    assert any(line.split()[:2] == ["sink", sink] for line in lines), result.stdout


def test_the_platform_is_detected_as_run_py_does(tmp_path):
    from s2s.platform import detect

    result = s2s("--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"name: {detect().platform}\n" in result.stdout  # cfg.platform.name, appended as run.py appends it


def test_a_config_error_is_one_line_and_exit_2(tmp_path):
    result = s2s("serve", "tts=nope", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("config error: tts=nope: unknown option for config group 'tts'")


def test_help_names_the_commands_then_the_config_groups(tmp_path):
    result = s2s("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:") and "s2s talk [--url ...]" in result.stdout
    assert "== Config groups (group=option) ==" in result.stdout  # Hydra's help of conf/hydra/help/s2s.yaml


def test_talk_is_the_client(tmp_path):
    result = s2s("talk", "--help", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("usage: s2s talk")
    assert "--url" in result.stdout and "--input-device" in result.stdout


def test_shortcut_overrides_give_way_to_the_users():
    assert with_shortcut("local", ["tts=kokoro"]) == ["tts=kokoro", "source=mic", "sink=speaker"]
    assert with_shortcut("local", ["source=file", "-m"]) == ["source=file", "-m", "sink=speaker"]
    assert with_shortcut("serve", ["server=null"]) == ["server=null"]
    assert with_shortcut(None, ["a.b=1"]) == ["a.b=1"]
