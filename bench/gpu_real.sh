#!/usr/bin/env bash
# One GPU session's checks, as one script (the lent GPU's time is short):
#   1. bench/step.py: the Sel-CL pre-training step against a plain CE step (also a quick
#      check that the compiled CUDA path runs; if it fails, the rest runs eager);
#   2. bench/gpu_real.py: Sel-CL+ and CE on the full CIFAR-10 training set with 40 %
#      asymmetric noise, shortened schedules, the two parts in parallel on the one GPU.
#   bench/gpu_real.sh path/to/cifar10-jpeg.tar.gz [sel-cl epochs] [fine-tuning epochs] [out dir]
set -uo pipefail
cd "$(dirname "$0")/.."
data="${1:?usage: bench/gpu_real.sh path/to/cifar10-jpeg.tar.gz [epochs] [finetune epochs] [out]}"
P="${2:-20}"; F="${3:-8}"; out="${4:-bench/results/gpu_real}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ -n "${SKIP_STEP:-}" ]; then :
elif ! timeout 240 $py bench/step.py --iters 20 --out "$out/step.md" > "$out/step.log" 2>&1; then
  tail -30 "$out/step.log"; echo "compiled step failed: SELCL_COMPILE=0 from here"; export SELCL_COMPILE=0
fi
cat "$out/step.md" 2>/dev/null
$py bench/gpu_real.py --data "$data" --part ce --epochs "$P" --finetune-epochs "$F" --out "$out/ce.md" \
  > "$out/ce.log" 2>&1 &
ce=$!
$py bench/gpu_real.py --data "$data" --part selcl --epochs "$P" --finetune-epochs "$F" --out "$out/selcl.md" \
  > "$out/selcl.log" 2>&1 || { echo "selcl part failed:"; tail -40 "$out/selcl.log"; }
wait $ce || { echo "ce part failed:"; tail -40 "$out/ce.log"; }
tail -c 1500 "$out/selcl.log"
cat "$out/selcl.md" "$out/ce.md" 2>/dev/null
