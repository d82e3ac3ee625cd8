"""A host with an NVIDIA driver that torch cannot use (a driver older than the wheel's CUDA
needs, a CPU-only wheel, no GPU passed into the container): the stages say which, with the
driver's version and the minimum the wheel needs, instead of sending the user to the CPU
demo. Simulated: a stand-in /proc/driver/nvidia/version or nvidia-smi."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from selcl import device
from selcl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from stages import common  # noqa: E402

PROC = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Thu Feb 22 01:44:30 UTC 2024\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
PAPER = {"name": "cifar10_sym20", "model": {"arch": "preact_resnet18"}}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """No CUDA in torch, a CUDA 13.0 wheel, no nvidia-smi on PATH, no driver file, and
    `driver(version, via)` installs one (via "proc": the kernel module's file; "smi")."""
    monkeypatch.setattr(common, "cuda_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(device, "NVIDIA_PROC", tmp_path / "no-driver")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("SELCL_ALLOW_CPU", raising=False)
    (tmp_path / "bin").mkdir()

    def driver(version: str, via: str = "proc") -> None:
        if via == "proc":
            monkeypatch.setattr(device, "NVIDIA_PROC", tmp_path / "version")
            (tmp_path / "version").write_text(PROC.format(v=version))
        else:
            smi = tmp_path / "bin" / "nvidia-smi"
            smi.write_text(f"#!/bin/sh\n[ \"$1\" = --query-gpu=driver_version ] && echo {version}\n")
            smi.chmod(0o755)
    return driver


def _stage_line(cfg=PAPER) -> str:
    with pytest.raises(common.StageError) as err:
        common.require_device(cfg)
    line = str(err.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("via", ["proc", "smi"])
def test_an_old_driver_gets_its_version_and_the_minimum(host, via):
    host("550.54.14", via)
    assert device.nvidia_driver() == "550.54.14"
    line = _stage_line()
    assert "driver 550.54.14" in line and ">= 580" in line and "CUDA 13.0" in line, line
    assert "make demo" not in line and "settings.cifar10_sym20.model.arch" in line, line


def test_a_new_enough_driver_without_a_visible_gpu(host):
    host("580.159.04")
    line = _stage_line()
    assert "580.159.04" in line and "--gpus" in line and "CUDA_VISIBLE_DEVICES" in line, line


def test_a_cpu_only_wheel(host, monkeypatch):
    host("580.159.04")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU-only build" in _stage_line()


def test_no_driver_still_points_to_the_demo(host):
    assert device.nvidia_driver() is None and device.no_cuda_reason() is None
    line = _stage_line()
    assert "make demo" in line and "SELCL_ALLOW_CPU" in line, line


def test_selcl_device_cuda_names_the_driver_too(host, monkeypatch):
    host("535.104.05")
    monkeypatch.setenv("SELCL_DEVICE", "cuda")
    with pytest.raises(ConfigError, match=r"SELCL_DEVICE=cuda: .*driver 535\.104\.05 .*>= 580"):
        device.get_device()


def test_the_minimum_matches_the_pinned_wheel():
    """The table's entry for the pinned wheel is the one the README states (driver >= 580
    for torch 2.14.1+cu130)."""
    pin = next(d for d in __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]
               ["dependencies"] if d.startswith("torch=="))
    assert pin == "torch==2.14.1" and device.MIN_DRIVER[13] == 580
    if torch.version.cuda:          # the installed wheel is the pinned CUDA 13 build
        assert int(torch.version.cuda.split(".")[0]) in device.MIN_DRIVER
