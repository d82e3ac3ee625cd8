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
