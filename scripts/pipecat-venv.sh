#!/usr/bin/env bash
# The pipecat venv for `python -m s2s.bench pipecat` (ours against pipecat on the same models): .cache/pipecat-venv.
#   scripts/pipecat-venv.sh            # then: python -m s2s.bench pipecat --python .cache/pipecat-venv/bin/python
# pipecat-ai 1.14.0 with its local Whisper (faster-whisper, pinned to the version s2s's venv has, and its
# CTranslate2), onnxruntime at ours (pipecat's Silero VAD and Smart Turn v3, and our Piper voice) and omegaconf,
# which `import s2s` needs: the pipecat side says its replies with s2s's PiperTTS (s2s/tts/piper.py) from this
# checkout, on the PYTHONPATH, not installed. No model is downloaded: the benchmark hands it the model files s2s
# resolves. Neither scripts/setup.sh nor CI runs this; s2s's own venv is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.cache/pipecat-venv
ours="${S2S_PYTHON:-.venv/bin/python}"

# the versions s2s's venv runs, so both sides decode with the same libraries (fallbacks: this release's pins)
version() {
  [ -x "$ours" ] && "$ours" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo "$2"
}
faster_whisper=$(version faster-whisper 1.2.1)
ctranslate2=$(version ctranslate2 4.8.5)
onnxruntime=$(version onnxruntime 1.32.0)
omegaconf=$(version omegaconf 2.3.1)

python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "pipecat-ai[whisper]==1.14.0" "faster-whisper==$faster_whisper" \
  "ctranslate2==$ctranslate2" "onnxruntime==$onnxruntime" "omegaconf==$omegaconf"
"$venv/bin/python" -c "import pipecat, faster_whisper, onnxruntime, omegaconf; print('pipecat venv ready:', '$venv')"
