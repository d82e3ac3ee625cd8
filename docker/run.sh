#!/usr/bin/env bash
# Run any command inside the Sel-CL container with the repo mounted, all GPUs, as you.
#   docker/run.sh dvc repro
#   docker/run.sh make test
#   CUDA_VISIBLE_DEVICES=1 docker/run.sh dvc exp run ...
#   SELCL_NPROC=4 docker/run.sh dvc repro      # every SELCL_* switch set here reaches the container
# Build first: docker build -f docker/Dockerfile --build-arg UID=$(id -u) --build-arg GID=$(id -g) -t selcl .
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
image="${SELCL_IMAGE:-selcl}"
gpus="${SELCL_GPUS:-all}"
tty=()
[ -t 0 ] && [ -t 1 ] && tty=(-it)
# The host's CUDA_VISIBLE_DEVICES and SELCL_* switches (SELCL_NPROC, SELCL_COMPILE, ...), by
# name: docker copies each value. Not this script's own SELCL_IMAGE / SELCL_GPUS, nor
# SELCL_CONTAINER, which the image sets.
envs=(-e CUDA_VISIBLE_DEVICES)
for v in $(compgen -e); do
  case "$v" in
    SELCL_IMAGE|SELCL_GPUS|SELCL_CONTAINER) ;;
    SELCL_*) envs+=(-e "$v") ;;
  esac
done
exec docker run --rm "${tty[@]}" --gpus "$gpus" --ipc=host \
  --user "$(id -u):$(id -g)" \
  "${envs[@]}" \
  -v "$repo":/workspace -w /workspace \
  "$image" "$@"
