#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one run on a machine with no registry (the device tool's):
#   bash scripts/gpu-check.sh WHEELS_DIR OUT_DIR
# WHEELS_DIR holds what the machine's own python3 (torch, CUDA) lacks, fetched beforehand with
#   pip download --no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 \
#     faster-qwen3-tts==0.5.4 qwen-tts-hf==0.1.1.post1 transformers==5.16.1 hydra-core omegaconf soxr soundfile \
#     pysbd librosa audioread pooch platformdirs decorator sox standard-aifc
#   pip download --no-deps --no-binary :all: antlr4-python3-runtime==4.9.3
# Runs tests/test_tts_qwen3.py's torch tests (real CUDA graphs with -m gpu) and scripts/qwen3_ttfa.py.
set -uo pipefail
wheels=${1:?wheels folder}; out=${2:?output folder}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -m pip install -q --no-index --no-deps --no-build-isolation "$wheels"/* 2>&1 | tail -3
python3 -c "import torch, transformers, faster_qwen3_tts; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
python3 -c "from s2s.platform import detect; print('platform detected:', detect().platform)" 2>&1 | tail -1
timeout 300 python3 -m pytest -p no:cacheprovider -q -x tests/test_tts_qwen3.py -k "torch" --durations=3 \
  2>&1 | tee "$out/pytest.log" | tail -15
timeout 400 python3 scripts/qwen3_ttfa.py --rounds 10 --out /tmp/qwen3_ttfa 2>&1 | tee "$out/ttfa.log" \
  | grep -v Warning | tail -30
