#!/usr/bin/env bash
# Issue 15's target table on one CUDA GPU in under 4 minutes (prepared for an H200): one Python process
# (benchmarks/gpu.py), CUDA-event medians after a warm-up, bf16 autocast; every linvit row with the default backend
# (Triton kernels) and under the eager torch backend. Prints the table and writes targets-<date>.md and .json to
# benchmarks/results/cuda/. Needs torch, timm (and Triton for the fused rows); not Hydra or Lightning.
# Extra arguments pass through, e.g. --only operators,core, --budget 220 (seconds), --out DIR.
# The multi-process suite of every operator and backbone is `python -m benchmarks.run --device cuda`.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
# python3: the GPU machines may have no `python` on the PATH
exec python3 -m benchmarks.gpu --device cuda "$@"
