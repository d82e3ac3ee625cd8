"""The container's pins mirror pyproject.toml (faiss-gpu for faiss-cpu), and run.sh
mounts the repo with all GPUs as the calling user."""
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_container_pins_mirror_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = set(project["dependencies"]) | {d for d in project["optional-dependencies"]["dev"]
                                           if d.startswith("pytest")}
    expected = {p.replace("faiss-cpu", "faiss-gpu") for p in pins}
    lines = [ln.strip() for ln in (ROOT / "docker" / "requirements-gpu.txt").read_text().splitlines()]
    assert {ln for ln in lines if ln and not ln.startswith("#")} == expected


def test_dockerfile_and_run_script():
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    assert docker.startswith("#") and "FROM nvidia/cuda:12" in docker
    for needle in ("ARG UID", "ARG GID", "safe.directory", "DVC_SITE_CACHE_DIR=/workspace",
                   "requirements-gpu.txt", "git"):
        assert needle in docker, needle
    run = (ROOT / "docker" / "run.sh").read_text()
    for needle in ("--gpus", "--ipc=host", "id -u", "/workspace"):
        assert needle in run, needle


def test_make_in_the_container_uses_the_image_environment():
    """docker/run.sh make paper: /opt/venv's dvc and python, never the host's .venv
    (mounted with the repo, its interpreter does not exist in the image)."""
    import os
    import subprocess
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    assert "SELCL_CONTAINER=1" in docker and "VIRTUAL_ENV=/opt/venv" in docker
    env = dict(os.environ, SELCL_CONTAINER="1", VIRTUAL_ENV="/opt/venv")
    for target in ("paper", "demo", "test"):
        out = subprocess.run(["make", "-n", target], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=True).stdout
        assert "/opt/venv/bin/" in out and ".venv" not in out.replace("/opt/venv", ""), out
        assert "pip install" not in out, out


def test_run_sh_passes_the_hosts_selcl_switches_into_the_container(tmp_path):
    """SELCL_NPROC=4 docker/run.sh dvc repro must reach torchrun inside: run.sh forwards
    every SELCL_* switch set on the host (by name, `-e VAR`), but not its own SELCL_IMAGE /
    SELCL_GPUS, nor SELCL_CONTAINER, which the image sets."""
    import os
    import subprocess
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELCL_")}
    env.update(PATH=f"{tmp_path}:{env['PATH']}", SELCL_NPROC="4", SELCL_COMPILE="0",
               SELCL_IMAGE="myimage", SELCL_GPUS="device=1", SELCL_CONTAINER="1")
    args = subprocess.run(["bash", str(ROOT / "docker" / "run.sh"), "dvc", "repro"], env=env,
                          capture_output=True, text=True, check=True).stdout.split("\n")
    passed = {args[i + 1] for i, a in enumerate(args) if a == "-e"}
    assert passed == {"CUDA_VISIBLE_DEVICES", "SELCL_NPROC", "SELCL_COMPILE"}, args
    assert "myimage" in args and "device=1" in args and args[-3:-1] == ["dvc", "repro"]
