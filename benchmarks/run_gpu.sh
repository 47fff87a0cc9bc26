#!/usr/bin/env bash
# The suite on a CUDA GPU (prepared for an H200): bf16 autocast, backbones at batch 64 (224) and 8 (1024), training
# at batch 64, memory from the CUDA allocator. Results go to benchmarks/results/cuda/ (RESULTS.md records the date,
# command, GPU and versions). Extra arguments pass through, e.g. --only operators or --quick.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python -m benchmarks.run --device cuda --dtype bf16 --only operators,backbones,training \
    --sizes 224,1024 --out benchmarks/results/cuda --case-timeout 300 "$@"
