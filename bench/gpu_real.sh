#!/usr/bin/env bash
# One GPU session's checks, as one script (the lent GPU's time is short):
#   1. bench/step.py: the Sel-CL pre-training step against a plain CE step (also a quick
#      check that the compiled CUDA path runs; if it fails, the rest runs eager);
#   2. bench/gpu_real.py: Sel-CL+ and CE on the full CIFAR-10 training set with 40 %
#      asymmetric noise, shortened schedules, the two parts in parallel on the one GPU
#      (CE twice: as many epochs as Sel-CL + Sel-CL+, and twice as many).
#   bench/gpu_real.sh path/to/cifar10-jpeg.tar.gz [sel-cl epochs] [fine-tuning epochs] [out dir]
# (GPU_REAL_ARGS="--subset 500 --arch small" for a quick smoke run on the CPU; SKIP_STEP=1 skips step 1;
#  TIME_LIMIT=seconds stops every part by then, keeping the per-epoch CSVs written so far,
#  and the script still ends normally: use it instead of killing the script from outside.)
set -uo pipefail
cd "$(dirname "$0")/.."
data="${1:?usage: bench/gpu_real.sh path/to/cifar10-jpeg.tar.gz [epochs] [finetune epochs] [out]}"
P="${2:-20}"; F="${3:-8}"; out="${4:-bench/results/gpu_real}"
mkdir -p "$out"
py="${PYTHON:-python3}"
deadline=$(( $(date +%s) + ${TIME_LIMIT:-86400} ))
left() { local s=$(( deadline - $(date +%s) )); echo $(( s > 1 ? s : 1 )); }
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if [ -n "${SKIP_STEP:-}" ]; then :
elif ! timeout 240 $py bench/step.py --iters 20 --out "$out/step.md" > "$out/step.log" 2>&1; then
  tail -30 "$out/step.log"; echo "compiled step failed: SELCL_COMPILE=0 from here"; export SELCL_COMPILE=0
fi
cat "$out/step.md" 2>/dev/null
# The same with L_SIM recomputed (SELCL_SIM_RECOMPUTE=1: every online graph back-propagated
# once, so CUDA graphs for the online network too): the lever of bench/results/gpu_notes.md.
if [ -z "${SKIP_STEP:-}" ]; then
  timeout 240 $py bench/step.py --iters 20 --sim-recompute --out "$out/step_recompute.md" > "$out/step_recompute.log" 2>&1 \
    || tail -30 "$out/step_recompute.log"
  cat "$out/step_recompute.md" 2>/dev/null
fi
# CE for the same number of epochs as Sel-CL + Sel-CL+, then for twice as many (has it
# converged, or begun to memorise?), one after the other beside the Sel-CL part.
( timeout "$(left)" $py bench/gpu_real.py ${GPU_REAL_ARGS:-} --data "$data" --part ce --epochs "$P" --finetune-epochs "$F" --out "$out/ce.md" \
    > "$out/ce.log" 2>&1
  timeout "$(left)" $py bench/gpu_real.py ${GPU_REAL_ARGS:-} --data "$data" --part ce --epochs "$P" --finetune-epochs "$F" --ce-epochs $((2 * (P + F))) \
    --out "$out/ce_long.md" --workdir /tmp/selcl_gpu_real_long > "$out/ce_long.log" 2>&1 ) &
ce=$!
timeout "$(left)" $py bench/gpu_real.py ${GPU_REAL_ARGS:-} --data "$data" --part selcl --epochs "$P" --finetune-epochs "$F" --out "$out/selcl.md" \
  > "$out/selcl.log" 2>&1 || { echo "selcl part failed:"; tail -40 "$out/selcl.log"; }
wait $ce || { echo "ce part failed:"; tail -40 "$out/ce.log"; }
tail -c 1500 "$out/selcl.log"
cat "$out/selcl.md" "$out/ce.md" "$out/ce_long.md" 2>/dev/null
[ -f "$out/selcl.md" ] || { echo "no selcl.md (stopped early?): the last pre-training rows"; tail -3 "$out/selcl_pretrain.csv" 2>/dev/null; }
