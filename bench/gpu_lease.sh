#!/usr/bin/env bash
# A bench/gpu_real.sh run longer than one device call (at most 10 minutes a call), over
# two calls on the same warm machine, without a restart or a second compilation:
#   call 1:  bench/gpu_lease.sh start SECONDS data.tar.gz SEL_CL_EPOCHS FINETUNE_EPOCHS
#            launches gpu_real.sh in a process session of its own (setsid, so that it
#            outlives the call: shown by tests/test_gpu_script.py, not yet on a device),
#            then waits at most SECONDS and returns, the run still going;
#   call 2:  bench/gpu_lease.sh wait
#            (sent at once: the machine goes back after 30 s of idle time) waits for the
#            run to end.
# A run that ends within SECONDS needs no second call. Both calls copy what the run has
# written into $OUT/r.tgz every 20 s, so a call killed at its limit (or at the end of the
# lease's device time) still brings back the per-epoch CSVs and the markdown written so
# far. The environment (SKIP_STEP, TIME_LIMIT, SUBSET, GPU_REAL_ARGS, SELCL_DEVICE, ...)
# passes through to gpu_real.sh; give TIME_LIMIT so the run ends by itself in the lease.
#
# The compilation cache travels between leases. On a fresh H200 (2026-12-04) a run spent
# 272 s to the end of its first pre-training epoch, nearly all of it compiling; an H100
# whose Inductor cache the step benchmark had warmed trained the same two epochs in 61 s.
# The run compiles into $run/inductor (TORCHINDUCTOR_CACHE_DIR; Triton's kernels go under
# it); the call that sees the run end returns that folder as $OUT/inductor.tgz.aa, .ab
# (at most 30 MiB: carried back beside the 19 MiB data archive and the tree, it must fit
# a call's 64 MiB); a later lease that carries those parts, and only those, in
# compile_cache/ (GPU_LEASE_CACHE; git-ignored) starts from them, at the same absolute
# path (keep GPU_LEASE_DIR). Inductor keys its entries on the torch and Triton versions and
# the GPU, so a cache from another image or card is a miss, never a wrong kernel; a hit
# compiles nothing new and changes no number (the same kernels).
#
# Beside the run, $run/telemetry.txt gets a line every GPU_LEASE_SAMPLE (5) s: the time,
# the host's load and the GPU's clocks, power, temperature, use and clock-event reasons
# (run 5's epochs went from 22-25 s to 15-18 s mid-run, cause unknown: this says whether
# the card or the host changed pace).
set -uo pipefail
cd "$(dirname "$0")/.."
run=${GPU_LEASE_DIR:-/tmp/gpu_lease}
out=${OUT:?bench/gpu_lease.sh writes its snapshots to \$OUT}
every=${GPU_LEASE_EVERY:-20}   # seconds between snapshots
cache_in=${GPU_LEASE_CACHE:-compile_cache}
export TORCHINDUCTOR_CACHE_DIR="$run/inductor"; unset TRITON_CACHE_DIR   # Triton then caches under it
snap() {   # tar's exit 1 is "a file changed as we read it" (a CSV being appended): a good snapshot
  tar czf "$out/r.part" --exclude="$(basename "$run")/inductor" -C "$(dirname "$run")" "$(basename "$run")" 2>/dev/null
  if [ $? -le 1 ]; then mv "$out/r.part" "$out/r.tgz"; else rm -f "$out/r.part"; fi
}
cache_out() {   # the compilation cache into $OUT, whole parts only (built beside the run, then moved)
  [ -d "$run/inductor" ] || return 0
  rm -rf "$run/parts"; mkdir -p "$run/parts"
  tar czf "$run/parts/inductor.tgz" -C "$run" inductor 2>/dev/null
  local mb=$(( $(stat -c %s "$run/parts/inductor.tgz") / 1048576 ))
  if [ "$mb" -ge 30 ]; then echo "gpu_lease: the compilation cache is $mb MiB, more than a lease can carry back: not returned"
  else split -b 15M "$run/parts/inductor.tgz" "$run/parts/inductor.tgz." && rm "$run/parts/inductor.tgz" \
         && mv "$run/parts"/inductor.tgz.* "$out/" && echo "gpu_lease: compilation cache returned ($mb MiB)"; fi
  rm -rf "$run/parts"
}
telemetry() {   # until killed: one line every GPU_LEASE_SAMPLE s (nvidia-smi's fields where it runs)
  local q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used
  command -v nvidia-smi > /dev/null || q=""
  # clock-event reasons (throttling) where this driver knows the field
  [ -n "$q" ] && nvidia-smi --query-gpu="$q,clocks_event_reasons.active" --format=csv,noheader > /dev/null 2>&1 \
    && q="$q,clocks_event_reasons.active"
  [ -n "$q" ] && echo "# gpu: $q"
  while :; do
    echo "$(date +%s) load $(cut -d' ' -f1-3 /proc/loadavg)${q:+ gpu $(nvidia-smi --query-gpu="$q" --format=csv,noheader 2>&1 | head -1)}"
    sleep "${GPU_LEASE_SAMPLE:-5}"
  done
}
finished() { [ -f "$run/rc" ]; }
alive() { [ -s "$run/pid" ] && kill -0 "$(cat "$run/pid")" 2>/dev/null; }
follow() {   # until the run ends or $1 s have passed, a snapshot every $every s
  local end=$(( $(date +%s) + $1 )) left
  # the run writes its pid first thing (whole, by a rename); wait for it with content, up to
  # 30 s: a lease that read it empty, or not yet there on a loaded host, called a starting
  # run gone, or returned "the run goes on" before it began
  local i; for i in $(seq 30); do [ -s "$run/pid" ] || finished && break; sleep 1; done
  while ! finished && alive && left=$(( end - $(date +%s) )) && [ "$left" -gt 0 ]; do
    sleep $(( left < every ? left : every )); snap
  done
  snap
  tail -5 "$run/driver.log" 2>/dev/null
  if finished; then echo "gpu_lease: the run ended (exit $(cat "$run/rc"))"; cache_out
  elif ! alive; then echo "gpu_lease: the run is gone without an exit status (killed?)"; return 1
  else echo "gpu_lease: the run goes on"; fi
}
case "${1:-}" in
  start)
    [ $# -eq 5 ] || { echo "usage: bench/gpu_lease.sh start SECONDS data.tar.gz EPOCHS FINETUNE_EPOCHS" >&2; exit 2; }
    [ -e "$run" ] && { echo "gpu_lease: $run exists (a run already started on this machine)" >&2; exit 2; }
    mkdir -p "$run"
    if compgen -G "$cache_in/inductor.tgz.*" > /dev/null; then
      # parts of two leases side by side make no gzip stream: checked before unpacking
      if cat "$cache_in"/inductor.tgz.* | gzip -t 2>/dev/null && cat "$cache_in"/inductor.tgz.* | tar xzf - -C "$run"; then
        echo "gpu_lease: compilation cache from $cache_in"
      else
        rm -rf "$run/inductor"; echo "gpu_lease: $cache_in/inductor.tgz.* is not one whole archive: compiling from nothing"
      fi
    fi
    setsid nohup bash -c 'echo $$ > "$4/pid.new" && mv "$4/pid.new" "$4/pid"; bash bench/gpu_lease.sh telemetry > "$4/telemetry.txt" 2>&1 & t=$!
      bash bench/gpu_real.sh "$1" "$2" "$3" "$4"; rc=$?; kill $t; echo $rc > "$4/rc.new" && mv "$4/rc.new" "$4/rc"' \
      _ "$3" "$4" "$5" "$run" > "$run/driver.log" 2>&1 < /dev/null &
    follow "$2" ;;
  telemetry) telemetry ;;
  wait)
    [ -d "$run" ] || { echo "gpu_lease: no run in $run (a fresh machine? the first call's run is gone)" >&2; exit 2; }
    follow 100000 ;;
  *) echo "usage: bench/gpu_lease.sh start SECONDS data.tar.gz EPOCHS FINETUNE_EPOCHS | wait" >&2; exit 2 ;;
esac
