#!/usr/bin/env bash
# GPU benchmark for a machine with a CUDA GPU: a CIFAR-10 pre-training epoch (data from an
# imagefolder copy of CIFAR-10), the selection and the k-NN evaluation, the step ratio and
# the selection benchmark. Writes markdown tables to $RESULTS (default bench/results/).
#   bench/gpu.sh path/to/cifar10-jpeg.tar.gz [epochs]
set -euo pipefail
cd "$(dirname "$0")/.."
data="${1:?usage: bench/gpu.sh path/to/cifar10-jpeg.tar.gz [epochs]}"
epochs="${2:-3}"
results="${RESULTS:-bench/results}"
mkdir -p "$results"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$py bench/gpu_epoch.py --data "$data" --epochs "$epochs" --out "$results/gpu_epoch.md" \
    --json "$results/gpu_epoch.json" || echo "gpu_epoch failed"
$py bench/step.py --iters 20 --out "$results/gpu_step.md" || echo "step failed"
{
  echo "# GPU benchmark ($(date -u +%Y-%m-%d))"
  echo
  cat "$results/gpu_epoch.md" 2>/dev/null
  echo
  cat "$results/gpu_step.md" 2>/dev/null
} > "$results/gpu.md"
echo "wrote $results/gpu.md"
