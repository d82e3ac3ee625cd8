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
