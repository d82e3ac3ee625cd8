#!/usr/bin/env bash
# Run any command inside the Sel-CL container with the repo mounted, all GPUs, as you.
#   docker/run.sh dvc repro
#   docker/run.sh make test
#   CUDA_VISIBLE_DEVICES=1 docker/run.sh dvc exp run ...
# Build first: docker build -f docker/Dockerfile --build-arg UID=$(id -u) --build-arg GID=$(id -g) -t selcl .
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
image="${SELCL_IMAGE:-selcl}"
gpus="${SELCL_GPUS:-all}"
tty=()
[ -t 0 ] && [ -t 1 ] && tty=(-it)
exec docker run --rm "${tty[@]}" --gpus "$gpus" --ipc=host \
  --user "$(id -u):$(id -g)" \
  -e CUDA_VISIBLE_DEVICES -e SELCL_ALLOW_CPU \
  -v "$repo":/workspace -w /workspace \
  "$image" "$@"
