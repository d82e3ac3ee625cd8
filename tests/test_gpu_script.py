"""bench/gpu_real.sh, the one command a GPU lease runs, has control flow of its own: epochs
sized to the time left, and a fallback from the L_SIM recompute path to the default one.
A broken script costs a whole lease, so its flow is checked here with a stand-in Python
that records how it was called (the training itself is tested elsewhere)."""
from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = """#!/usr/bin/env bash
# stand-in for python: fails the Sel-CL part when told to, writes the --out file otherwise
echo "$* DEVICE=${SELCL_DEVICE:-} RECOMPUTE=${SELCL_SIM_RECOMPUTE:-0}" >> "$CALLS"
if [[ "$*" == *"--part selcl"* && "${SELCL_SIM_RECOMPUTE:-0}" == 1 && -n "$FAIL_RECOMPUTE" ]]; then exit 1; fi
if [[ "$*" == *"--part selcl"* && -n "$FAIL_SELCL" ]]; then exit 1; fi
if [[ "$*" == *"--sim-recompute"* && -n "$FAIL_RECOMPUTE_STEP" ]]; then exit "$FAIL_RECOMPUTE_STEP"; fi
out=$(echo "$*" | sed -n 's/.*--out \\([^ ]*\\).*/\\1/p')
echo "done" > "$out"
"""


def run_script(tmp_path: Path, epochs=("auto", "auto"), **env) -> tuple[str, list[str]]:
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SELCL_")}   # the caller's switches
    e = {**base, "PYTHON": str(fake), "CALLS": str(calls), "SKIP_STEP": "1", "TIME_LIMIT": "520", **env}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_real.sh"), "data.tar.gz", *epochs, str(tmp_path / "out")],
                          env=e, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, calls.read_text().splitlines()


def _epochs(call: str) -> tuple[int, int]:
    return int(re.search(r"--epochs (\d+)", call)[1]), int(re.search(r"--finetune-epochs (\d+)", call)[1])


def test_auto_epochs_fit_the_time_left(tmp_path):
    out, calls = run_script(tmp_path)
    selcl = [c for c in calls if "--part selcl" in c]
    ce = [c for c in calls if "--part ce" in c]
    assert len(selcl) == 1 and len(ce) == 1
    P, F = _epochs(selcl[0])
    assert _epochs(ce[0]) == (P, F)                  # CE gets the same plan
    # 38 ms steps (no measurement): ≈ 25 s per epoch with its share of fine-tuning, after
    # ≈ 200 s of fixed costs, in 520 s
    assert 10 <= P <= 16 and F == (P * 15 + 20) // 40
    assert "auto epochs" in out


def test_a_subset_reaches_both_parts_and_sizes_its_shorter_epochs(tmp_path):
    _, calls = run_script(tmp_path, SUBSET="500")
    parts = [c for c in calls if "--part" in c]
    assert len(parts) == 2 and all("--subset 500" in c for c in parts)
    P, F = _epochs(parts[0])
    # 5,000 images: 39 steps of 38 ms per epoch, ≈ 2.7 s with selection and fine-tuning's
    # share, after ≈ 170 s of fixed costs, in 520 s
    assert 110 <= P <= 140 and F == (P * 15 + 20) // 40
    _, calls = run_script(tmp_path)
    assert not any("--subset" in c for c in calls)


def test_explicit_epochs_are_kept(tmp_path):
    _, calls = run_script(tmp_path, epochs=("24", "9"))
    assert all(_epochs(c) == (24, 9) for c in calls)


def test_a_failing_recompute_path_falls_back_to_the_default(tmp_path):
    out, calls = run_script(tmp_path, SELCL_SIM_RECOMPUTE="1", FAIL_RECOMPUTE="1")
    selcl = [c for c in calls if "--part selcl" in c]
    assert [c.endswith("RECOMPUTE=1") for c in selcl] == [True, False]
    assert "/tmp/selcl_gpu_real_retained" in selcl[1]     # a fresh work folder
    assert (tmp_path / "out" / "selcl_recompute_failed.log").exists()
    assert (tmp_path / "out" / "selcl.md").exists()


@pytest.mark.parametrize("recompute", ["0", "1"])
def test_no_retry_without_a_recompute_failure(tmp_path, recompute):
    """The default path failing is not retried, and a working recompute run is the only one."""
    env = {"SELCL_SIM_RECOMPUTE": recompute}
    if recompute == "0":
        env["FAIL_SELCL"] = "1"
    out, calls = run_script(tmp_path, **env)
    assert len([c for c in calls if "--part selcl" in c]) == 1
    assert ("selcl part failed" in out) == (recompute == "0")


@pytest.mark.parametrize("want, steps", [("", ["", "--sim-recompute"]), ("0", [""]), ("1", ["--sim-recompute"])])
def test_step_benchmarks_measure_the_path_asked_for(tmp_path, want, steps):
    """Each step benchmark costs ~100 s of compilation on a fresh machine: with
    SELCL_SIM_RECOMPUTE given only that path's step runs, without it both (the faster wins)."""
    env = {"SKIP_STEP": ""} | ({"SELCL_SIM_RECOMPUTE": want} if want else {})
    _, calls = run_script(tmp_path, **env)
    step = [c for c in calls if "bench/step.py" in c]
    assert [("--sim-recompute" if "--sim-recompute" in c else "") for c in step] == steps


@pytest.mark.parametrize("asked", ["1", "yes"])
def test_a_crashed_recompute_step_switches_the_real_run_to_the_default(tmp_path, asked):
    """...after the default path's step, which is also the check that compilation works."""
    out, calls = run_script(tmp_path, SKIP_STEP="", SELCL_SIM_RECOMPUTE=asked, FAIL_RECOMPUTE_STEP="1")
    step = [c for c in calls if "bench/step.py" in c]
    assert ["--sim-recompute" in c for c in step] == [True, False] and step[1].endswith("RECOMPUTE=0")
    selcl = [c for c in calls if "--part selcl" in c]
    assert len(selcl) == 1 and selcl[0].endswith("RECOMPUTE=0")
    assert "recompute step failed" in out


def test_a_recompute_step_out_of_time_is_no_crash(tmp_path):
    """timeout's 124 (a slow cold compilation) does not switch the path."""
    out, calls = run_script(tmp_path, SKIP_STEP="", SELCL_SIM_RECOMPUTE="1", FAIL_RECOMPUTE_STEP="124")
    assert len([c for c in calls if "bench/step.py" in c]) == 1
    assert [c for c in calls if "--part selcl" in c][0].endswith("RECOMPUTE=1")
    assert "recompute step failed" not in out


def test_no_stale_step_result_sizes_the_epochs(tmp_path):
    """A step.md left in the output folder by an earlier run is not read when step 1 is skipped."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "step.md").write_text("| Sel-CL pre-training step | 5.0 | ms |\n")
    out, _ = run_script(tmp_path)
    assert "auto epochs (step 38 ms" in out


def test_profile_steps_reach_the_sel_cl_part_only(tmp_path):
    _, calls = run_script(tmp_path, PROFILE_STEPS="10")
    assert all(("--profile-steps 10" in c) == ("--part selcl" in c) for c in calls)


def test_the_retry_after_a_recompute_failure_runs_without_the_profiler(tmp_path):
    """If the profiler is what failed, a retry with it would fail the same way."""
    _, calls = run_script(tmp_path, SELCL_SIM_RECOMPUTE="1", FAIL_RECOMPUTE="1", PROFILE_STEPS="10")
    selcl = [c for c in calls if "--part selcl" in c]
    assert len(selcl) == 2 and "--profile-steps 10" in selcl[0] and "--profile-steps 0" in selcl[1]


@pytest.mark.parametrize("word, runs", [("on", "RECOMPUTE=1"), ("OFF", "RECOMPUTE=0"), ("of", None)])
def test_the_recompute_switch_is_read_as_selcl_reads_it(tmp_path, word, runs):
    """on/off in any case, and a typo is an error before anything runs (not silently "off")."""
    if runs is None:
        fake = tmp_path / "python"
        fake.write_text(FAKE)
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        e = {**{k: v for k, v in os.environ.items() if not k.startswith("SELCL_")}, "PYTHON": str(fake),
             "CALLS": str(tmp_path / "calls.txt"), "SKIP_STEP": "1", "TIME_LIMIT": "520", "SELCL_SIM_RECOMPUTE": word}
        proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_real.sh"), "data.tar.gz", "auto", "auto",
                               str(tmp_path / "out")], env=e, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "SELCL_SIM_RECOMPUTE=of" in proc.stderr
        assert not (tmp_path / "calls.txt").exists()
        return
    _, calls = run_script(tmp_path, SELCL_SIM_RECOMPUTE=word)
    assert all(c.endswith(runs) for c in calls if "--part selcl" in c)


def test_the_parts_run_on_cuda_unless_told(tmp_path):
    """SELCL_DEVICE=cuda by default, so a machine without a GPU fails at once instead of
    spending the lease on the CPU; SELCL_DEVICE=cpu (the smoke run) is kept."""
    _, calls = run_script(tmp_path)
    assert calls and all(" DEVICE=cuda " in c for c in calls)
    (tmp_path / "out" / "selcl.md").unlink()
    _, calls = run_script(tmp_path, SELCL_DEVICE="cpu")
    assert calls and all(" DEVICE=cpu " in c for c in calls)


# bench/gpu_lease.sh: one gpu_real.sh run over two device calls. The run must outlive the
# first call, and each call must leave the run's files in its own (emptied) $OUT.
# The stand-in looks for a cached kernel when it starts and caches one when it ends (after
# SLEEP seconds, so that two parts started together see only what was there before them).
SLOW = FAKE.replace("#!/usr/bin/env bash\n", """#!/usr/bin/env bash
[ -f "$TORCHINDUCTOR_CACHE_DIR/kernel" ] && echo "CACHE HIT" >> "$CALLS"
""").replace('echo "done" > "$out"', "\n".join([
    'sleep "${SLEEP:-0}"; echo "done" > "$out"',
    'mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && echo compiled > "$TORCHINDUCTOR_CACHE_DIR/kernel"']))


def lease(tmp_path: Path, *args: str, out: str, **env) -> subprocess.CompletedProcess:
    fake = tmp_path / "python"
    if not fake.exists():
        fake.write_text(SLOW)
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (tmp_path / out).mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith("SELCL_")}
    e = {**base, "PYTHON": str(fake), "CALLS": str(tmp_path / "calls.txt"), "SKIP_STEP": "1",
         "TIME_LIMIT": "60", "GPU_LEASE_DIR": str(tmp_path / "run"), "GPU_LEASE_EVERY": "1",
         "OUT": str(tmp_path / out), **env}
    # the device tool ends a call's process group when the call returns: so does this
    proc = subprocess.Popen(["bash", str(ROOT / "bench" / "gpu_lease.sh"), *args], env=e, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    stdout, stderr = proc.communicate(timeout=90)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def snapshot(tmp_path: Path, out: str) -> list[str]:
    tar = subprocess.run(["tar", "tzf", str(tmp_path / out / "r.tgz")], capture_output=True, text=True, check=True)
    return [Path(n).name for n in tar.stdout.split()]


def test_a_lease_run_outlives_its_first_call_and_the_second_call_waits_for_it(tmp_path):
    first = lease(tmp_path, "start", "1", "data.tar.gz", "24", "12", out="out1", SLEEP="4")
    assert first.returncode == 0, first.stderr
    assert "the run goes on" in first.stdout
    assert "rc" not in snapshot(tmp_path, "out1")           # a snapshot of a run still going
    second = lease(tmp_path, "wait", out="out2")
    assert second.returncode == 0, second.stderr
    assert "the run ended (exit 0)" in second.stdout
    files = snapshot(tmp_path, "out2")
    assert {"rc", "selcl.md", "ce.md", "driver.log"} <= set(files)
    calls = (tmp_path / "calls.txt").read_text()
    assert "--part selcl" in calls and "--epochs 24 --finetune-epochs 12" in calls


def test_a_lease_wait_on_a_fresh_machine_says_so(tmp_path):
    r = lease(tmp_path, "wait", out="out")
    assert r.returncode == 2 and "no run in" in r.stderr


def test_a_lease_never_starts_a_second_run_over_the_first(tmp_path):
    assert lease(tmp_path, "start", "30", "data.tar.gz", "4", "2", out="out1").returncode == 0
    again = lease(tmp_path, "start", "30", "data.tar.gz", "4", "2", out="out2")
    assert again.returncode == 2 and "already started" in again.stderr


def test_a_lease_start_names_its_arguments(tmp_path):
    r = lease(tmp_path, "start", "30", "data.tar.gz", out="out")
    assert r.returncode == 2 and "usage" in r.stderr


def test_a_lease_returns_its_compilation_cache_and_the_next_lease_starts_from_it(tmp_path):
    assert lease(tmp_path, "start", "30", "data.tar.gz", "4", "2", out="out1").returncode == 0
    parts = sorted((tmp_path / "out1").glob("inductor.tgz.*"))
    assert parts and all(p.stat().st_size <= 15 * 2**20 for p in parts)
    assert not any(n == "kernel" for n in snapshot(tmp_path, "out1"))   # the snapshot leaves it out
    # the next lease: a fresh machine, the parts carried in a folder of the tree
    carried = tmp_path / "compile_cache"
    carried.mkdir()
    for p in parts:
        (carried / p.name).write_bytes(p.read_bytes())
    (tmp_path / "calls.txt").write_text("")
    subprocess.run(["rm", "-rf", str(tmp_path / "run")], check=True)      # a fresh machine
    # under a loaded CI host this once came back with no call recorded: most likely the lease
    # read the run's pid file empty (between its creation and its write) or not yet there after
    # its 10 s wait, and returned before the run began (both closed; the pid test below)
    again = lease(tmp_path, "start", "50", "data.tar.gz", "4", "2", out="out2", GPU_LEASE_CACHE=str(carried), SLEEP="2")
    calls = (tmp_path / "calls.txt").read_text()
    seen = f"stdout:\n{again.stdout}\nstderr:\n{again.stderr}\ncalls:\n{calls}"
    assert again.returncode == 0 and "compilation cache from" in again.stdout, seen
    assert "the run ended (exit 0)" in again.stdout, seen
    assert calls.count("CACHE HIT") == 2, seen   # both parts, CE and Sel-CL


def test_a_lease_over_a_killed_run_says_so_instead_of_waiting_forever(tmp_path):
    assert lease(tmp_path, "start", "1", "data.tar.gz", "4", "2", out="out1", SLEEP="30").returncode == 0
    os.killpg(int((tmp_path / "run" / "pid").read_text()), signal.SIGKILL)   # the run's own session
    r = lease(tmp_path, "wait", out="out2")
    assert r.returncode == 1 and "gone without an exit status" in r.stdout


def test_a_carried_cache_of_two_leases_mixed_is_left_out(tmp_path):
    assert lease(tmp_path, "start", "30", "data.tar.gz", "4", "2", out="out1").returncode == 0
    carried = tmp_path / "compile_cache"
    carried.mkdir()
    for p in (tmp_path / "out1").glob("inductor.tgz.*"):
        (carried / p.name).write_bytes(p.read_bytes())
    (carried / "inductor.tgz.zz").write_bytes(b"a part of an older lease")
    (tmp_path / "calls.txt").write_text("")
    subprocess.run(["rm", "-rf", str(tmp_path / "run")], check=True)
    again = lease(tmp_path, "start", "30", "data.tar.gz", "4", "2", out="out2", GPU_LEASE_CACHE=str(carried), SLEEP="2")
    assert again.returncode == 0 and "not one whole archive" in again.stdout
    assert "CACHE HIT" not in (tmp_path / "calls.txt").read_text()


def _member(tmp_path: Path, out: str, name: str) -> str:
    import tarfile
    with tarfile.open(tmp_path / out / "r.tgz") as tar:
        return next(tar.extractfile(m).read().decode() for m in tar.getmembers() if Path(m.name).name == name)


SMI = """#!/usr/bin/env bash
# stand-in for nvidia-smi: one row of the fields asked for
echo "$*" >> "$SMI_CALLS"
echo "2026/12/04 10:00:00.000, 1980 MHz, 3201 MHz, 512.30 W, 51, 97 %, 1234 MiB, 0x0000000000000000"
"""


@pytest.mark.parametrize("gpu", [True, False])
def test_a_lease_run_logs_the_pace_of_the_card_and_the_host_beside_it(tmp_path, gpu):
    """Every GPU_LEASE_SAMPLE s a line of the time, the host's load and (where nvidia-smi
    runs) the GPU's clocks, power and clock-event reasons, in the run's snapshot."""
    path = os.environ["PATH"]
    if gpu:
        smi = tmp_path / "bin" / "nvidia-smi"
        smi.parent.mkdir()
        smi.write_text(SMI)
        smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
        path = f"{smi.parent}:{path}"
    else:   # this machine's PATH, less any real nvidia-smi
        path = ":".join(d for d in path.split(":") if not (Path(d) / "nvidia-smi").exists())
    r = lease(tmp_path, "start", "30", "data.tar.gz", "4", "2", out="out", SLEEP="3", GPU_LEASE_SAMPLE="1",
              PATH=path, SMI_CALLS=str(tmp_path / "smi.txt"))
    assert r.returncode == 0 and "the run ended (exit 0)" in r.stdout, r.stdout
    samples = [ln for ln in _member(tmp_path, "out", "telemetry.txt").splitlines() if not ln.startswith("#")]
    assert len(samples) >= 2, samples
    assert all(re.fullmatch(r"\d+ load [\d.]+ [\d.]+ [\d.]+" + (" gpu 2026/12/04 .*, 1980 MHz, .*" if gpu else ""), ln)
               for ln in samples), samples
    if gpu:
        assert "clocks_event_reasons.active" in (tmp_path / "smi.txt").read_text()


def test_a_lease_waits_for_the_run_to_write_its_pid_instead_of_calling_it_gone(tmp_path):
    """The run writes its pid first thing; a lease that looks in between the file's creation
    and its content (a loaded host) must wait, not report the run gone or return before it
    has started (the once-in-four CI failure of the cache test, whose second lease came back
    with no call recorded)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "pid").write_text("")        # created, not yet written: the window
    late = subprocess.Popen(["bash", "-c", f"sleep 3; exec bash -c 'echo $$ > {run}/pid; sleep 2; echo 0 > {run}/rc'"],
                            start_new_session=True)
    try:
        r = lease(tmp_path, "wait", out="out")
    finally:
        late.wait(timeout=30)
    assert r.returncode == 0 and "the run ended (exit 0)" in r.stdout, r.stdout + r.stderr
