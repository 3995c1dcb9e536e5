"""``python -m dsv41_gfx942_plugin`` on this machine: every section, exit code 0."""

from __future__ import annotations

import os
import subprocess
import sys

from dsv41_gfx942_plugin import patches


def test_status_command_reports_everything():
    env = dict(os.environ, DSV41_GFX942_TOPK="0")
    proc = subprocess.run([sys.executable, "-m", "dsv41_gfx942_plugin"], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for section in ("Versions", "Platform", "Patches", "Code objects", "Settings", "Hook counters"):
        assert f"\n{section}" in out
    assert "vllm    0.33.0: supported" in out
    assert "plugin in a vLLM process here: inactive: platform is" in out
    for patch, _ in patches.PATCHES:
        assert f"{patch.target}: fits this vLLM; not applied here (plugin inactive)" in out
    assert "DSV41_GFX942_TOPK=0" in out
    assert "error:" not in out


def test_status_command_honours_vllms_plugin_allowlist():
    """VLLM_PLUGINS without the plugin's name: vLLM never calls register(), and the status
    command says so rather than judging the platform."""
    env = dict(os.environ, VLLM_PLUGINS="some_other_plugin")
    proc = subprocess.run([sys.executable, "-m", "dsv41_gfx942_plugin"], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ("plugin in a vLLM process here: inactive: VLLM_PLUGINS='some_other_plugin' does not "
            "list dsv41_gfx942") in proc.stdout  # fmt: skip
