#!/usr/bin/env bash
# A bench/gpu_real.sh run longer than one device call (at most 10 minutes a call), over
# two calls on the same warm machine, without a restart or a second compilation:
#   call 1:  bench/gpu_lease.sh start SECONDS data.tar.gz SEL_CL_EPOCHS FINETUNE_EPOCHS
#            launches gpu_real.sh in a process session of its own (setsid: it outlives the
#            call), then waits SECONDS and returns, the run still going;
#   call 2:  bench/gpu_lease.sh wait
#            (issued at once: the machine goes back after its idle time) waits for the run
#            to end.
# Both copy everything the run has written into $OUT/r.tgz every 20 s, so a call killed
# at its limit (or at the end of the lease's device time) still brings back the per-epoch
# CSVs and the markdown written so far. The environment (SKIP_STEP, TIME_LIMIT, SUBSET,
# GPU_REAL_ARGS, SELCL_DEVICE, ...) passes through to gpu_real.sh; give TIME_LIMIT so the
# run ends by itself inside the lease.
#
# The compilation cache travels between leases: compilation took 272 s of a 900 s lease on
# a fresh H200 (2026-12-04), against ≈ 60 s on an H100 whose Inductor cache was warm. The
# run compiles into $run/inductor (TORCHINDUCTOR_CACHE_DIR; Triton's kernels go under it),
# the call that sees the run end returns that folder as $OUT/inductor.tgz.aa, .ab, ... (at
# most 3 parts of 15 MiB: $OUT's file limits), and a later lease that carries those parts
# in compile_cache/ (GPU_LEASE_CACHE; git-ignored) starts from them, at the same absolute
# path. Inductor keys its entries on the torch and Triton versions and the GPU, so a cache
# from another image or card is a miss, never a wrong kernel; a hit compiles nothing new
# and changes no number (the same kernels).
set -uo pipefail
cd "$(dirname "$0")/.."
run=${GPU_LEASE_DIR:-/tmp/gpu_lease}
out=${OUT:?bench/gpu_lease.sh writes its snapshots to \$OUT}
every=${GPU_LEASE_EVERY:-20}   # seconds between snapshots
cache_in=${GPU_LEASE_CACHE:-compile_cache}
export TORCHINDUCTOR_CACHE_DIR="$run/inductor"; unset TRITON_CACHE_DIR   # Triton then caches under it
snap() { tar czf "$out/r.part" --exclude="$(basename "$run")/inductor" -C "$(dirname "$run")" "$(basename "$run")" 2>/dev/null \
           && mv "$out/r.part" "$out/r.tgz"; }
cache_out() {   # the run's compilation cache into $OUT, in parts that fit its limits
  [ -d "$run/inductor" ] || return 0
  tar czf "$run/inductor.tgz" -C "$run" inductor
  local mb=$(( $(stat -c %s "$run/inductor.tgz") / 1048576 ))
  if [ "$mb" -ge 45 ]; then echo "gpu_lease: the compilation cache is $mb MiB, over the 45 MiB \$OUT takes: not returned"
  else split -b 15M "$run/inductor.tgz" "$out/inductor.tgz." && echo "gpu_lease: compilation cache returned ($mb MiB)"; fi
  rm -f "$run/inductor.tgz"
}
finished() { [ -f "$run/rc" ]; }
follow() {   # until the run ends or $1 s have passed, a snapshot every $every s
  local end=$(( $(date +%s) + $1 ))
  while ! finished && [ "$(date +%s)" -lt "$end" ]; do sleep "$every"; snap; done
  snap
  tail -5 "$run/driver.log" 2>/dev/null
  if finished; then echo "gpu_lease: the run ended (exit $(cat "$run/rc"))"; cache_out; else echo "gpu_lease: the run goes on"; fi
}
case "${1:-}" in
  start)
    [ $# -eq 5 ] || { echo "usage: bench/gpu_lease.sh start SECONDS data.tar.gz EPOCHS FINETUNE_EPOCHS" >&2; exit 2; }
    [ -e "$run" ] && { echo "gpu_lease: $run exists (a run already started on this machine)" >&2; exit 2; }
    mkdir -p "$run"
    if compgen -G "$cache_in/inductor.tgz.*" > /dev/null; then
      cat "$cache_in"/inductor.tgz.* | tar xzf - -C "$run" && echo "gpu_lease: compilation cache from $cache_in"
    fi
    setsid nohup bash -c 'bash bench/gpu_real.sh "$1" "$2" "$3" "$4"; echo $? > "$4/rc"' _ "$3" "$4" "$5" "$run" \
      > "$run/driver.log" 2>&1 < /dev/null &
    follow "$2" ;;
  wait)
    [ -d "$run" ] || { echo "gpu_lease: no run in $run (a fresh machine? the first call's run is gone)" >&2; exit 2; }
    follow 100000 ;;
  *) echo "usage: bench/gpu_lease.sh start SECONDS data.tar.gz EPOCHS FINETUNE_EPOCHS | wait" >&2; exit 2 ;;
esac
