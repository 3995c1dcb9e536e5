"""GPU tests under NVIDIA's compute-sanitizer: a Python snippet run in a child process under one
tool (the test directory and the plugin's package on its path, torch's caching allocator off so
that a tensor's end is an allocation's), passing when the tool reports nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dsv41_gfx942_plugin

SANITIZER = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
needs_sanitizer = pytest.mark.skipif(
    torch.version.hip is not None or not os.access(SANITIZER, os.X_OK),
    reason="needs NVIDIA's compute-sanitizer",
)
# What a clean run prints, by tool (racecheck has its own summary line).
_CLEAN = {"racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"}


def assert_clean(tool: str, script: str, timeout: int) -> None:
    """Run ``script`` under ``tool``; fail with the tool's report unless it found nothing."""
    paths = [os.path.dirname(__file__), str(Path(dsv41_gfx942_plugin.__file__).parents[1])]
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    cmd = [SANITIZER, "--tool", tool, "--error-exitcode", "3", sys.executable, "-c", script]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and _CLEAN.get(tool, "ERROR SUMMARY: 0 errors") in done.stdout, (
        done.stdout[-3000:] + done.stderr[-3000:]
    )
