#!/usr/bin/env bash
# The checks a lent GPU is for, in one command sized for a 15-minute lease (issue 18): each kernel timed at the cost
# figure's benchmark shape (benchmarks/kernel_timing.py, under 150 s), the GPU test tier
# (`pytest -m cuda`: the kernels compiled in bf16/fp16/fp32 against the reference, whole models against the eager
# backend, autocast numerics; spread over the CPU cores with pytest-xdist where it is installed, since compiling is
# most of its time), then the target table (what `run_gpu.sh` runs). Each step has its own time limit, so the table runs
# whatever the tests do. Versions, logs and results go to OUT (default benchmarks/results/cuda):
#   bash benchmarks/gpu_check.sh [OUT]
# Needs python3 (or $PYTHON) with torch, Triton and timm (the GPU machine's image); linvit is read from this checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/cuda}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OMP_WAIT_POLICY=PASSIVE PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu-versions.txt"
"$python" - <<'PY' 2>&1 | tee -a "$OUT/gpu-versions.txt"
import torch, triton, timm
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"{gpu}: torch {torch.__version__}, Triton {triton.__version__}, timm {timm.__version__}")
PY
# Each kernel at the cost figure's benchmark shape, timed, with the first autotuning call's gradients checked; it saves
# after each step, so its limit leaves what it measured. At the limit it gets SIGABRT, on which Python's faulthandler
# writes every thread's stack to the log: a step that never ends says where it waits.
timeout -s ABRT "${GPU_TIMING_SECONDS:-150}" "$python" -X faulthandler -m benchmarks.kernel_timing --out "$OUT" \
    > "$OUT/kernel-timing.log" 2>&1
timing=$?
# pyproject's addopts ask for pytest-xdist and pytest-timeout (the dev extra), which the GPU machine's image may lack:
# this run states its own options instead (its time limit is `timeout`'s).
# -v: each test's outcome as it ends, so a run stopped at its limit still names what failed
# --durations: which tests the limit is spent on
options=(-o "addopts=-ra --import-mode=importlib" -m cuda -v -p no:cacheprovider --durations=20)
if "$python" -c "import xdist" 2>/dev/null; then options+=(-n 8); fi
timeout "${GPU_TESTS_SECONDS:-300}" "$python" -m pytest "${options[@]}" \
    tests/ops/test_linear_attention_cuda.py tests/reliability/test_numerics.py 2>&1 | tee "$OUT/gpu-tests.txt"
tests=${PIPESTATUS[0]}
# the table's own budget ends 40 s before the limit, so it skips the rows that would not fit and still writes itself
table_seconds=${GPU_TABLE_SECONDS:-280}
timeout "$table_seconds" "$python" -m benchmarks.gpu --device cuda --out "$OUT" --budget $((table_seconds > 80 ? table_seconds - 40 : 40)) \
    2>&1 | tee "$OUT/gpu-targets.txt"
table=${PIPESTATUS[0]}
echo "gpu_check: kernel timing exit $timing, tests exit $tests, target table exit $table" | tee -a "$OUT/gpu-versions.txt"
exit $(( timing || tests || table ))
