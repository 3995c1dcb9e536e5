"""``python -m dsv41_gfx942_plugin`` on this machine: every section, exit code 0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dsv41_gfx942_plugin import envs, patches


def _status_command(stdout=subprocess.PIPE, **env) -> subprocess.CompletedProcess:
    """``python -m dsv41_gfx942_plugin`` in a child process with ``env`` added."""
    return subprocess.run([sys.executable, "-m", "dsv41_gfx942_plugin"], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, env=dict(os.environ, **env),
                          timeout=300)  # fmt: skip


def test_status_command_reports_everything():
    proc = _status_command(DSV41_GFX942_CAND_LOGITS="0")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for section in ("Versions", "Platform", "Patches", "Code objects", "Settings", "Hook counters"):
        assert f"\n{section}" in out
    assert "vllm    0.33.0: supported" in out
    assert "plugin in a vLLM process here: inactive: platform is" in out
    for patch, _ in patches.PATCHES:
        assert f"{patch.target}: fits this vLLM; not applied here (plugin inactive)" in out
    assert "DSV41_GFX942_CAND_LOGITS=0" in out
    assert "error:" not in out


def test_status_command_honours_vllms_plugin_allowlist():
    """VLLM_PLUGINS without the plugin's name: vLLM never calls register(), and the status
    command says so rather than judging the platform."""
    proc = _status_command(VLLM_PLUGINS="some_other_plugin")
    assert proc.returncode == 0, proc.stderr
    assert ("plugin in a vLLM process here: inactive: VLLM_PLUGINS='some_other_plugin' does not "
            "list dsv41_gfx942") in proc.stdout  # fmt: skip


def test_status_without_the_entry_point(monkeypatch):
    """The package importable but not installed (a source tree on PYTHONPATH): vLLM's loader
    finds no entry point, so the command says inactive, not ACTIVE (whatever the platform)."""
    from dsv41_gfx942_plugin import __main__ as status

    assert status._not_loaded_by_vllm() is None  # installed here (tests/run.sh)
    monkeypatch.setattr(status.metadata, "entry_points", lambda **kw: [])
    assert status._not_loaded_by_vllm().startswith("no dsv41_gfx942 entry point")


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["unbuffered", "buffered"])
def test_status_command_survives_a_closed_stdout(unbuffered):
    """``python -m dsv41_gfx942_plugin | head -1``: the reader leaving early (here before the
    first write, so every write fails) is not an error of the command, whether its first print
    fails (unbuffered) or only the final flush (a pipe's default buffering; empty is unset)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = _status_command(stdout=write, PYTHONUNBUFFERED=unbuffered)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr


#: Switch settings on a (stand-in) gfx942 ROCm platform, with what register() decides there.
_VERDICTS = [
    ({}, "active"),
    ({"DSV41_GFX942_TOPK": "0"}, "active"),
    ({"DSV41_GFX942_CAND_LOGITS": "0", "DSV41_GFX942_FUSED_MARKOV": " Off "}, "active"),
    ({"DSV41_GFX942_TOPK": "0", "DSV41_GFX942_FUSED_MARKOV": "OFF"}, "inactive: no patch applied"),
    ({"DSV41_GFX942_TOPK": "nope", "DSV41_GFX942_FUSED_MARKOV": "maybe"},
     "inactive: no patch applied"),
    ({"DSV41_GFX942_DISABLE": " Y ", "DSV41_GFX942_TOPK": "1"},
     "inactive: turned off by DSV41_GFX942_DISABLE"),
    ({"DSV41_GFX942_DISABLE": "", "DSV41_GFX942_FUSED_MARKOV": ""}, "active"),
]  # fmt: skip


@pytest.mark.parametrize(("env", "decided"), _VERDICTS)
def test_status_command_says_what_register_decides(clean_plugin, fake_platform, targets,
                                                   monkeypatch, capsys, env, decided):  # fmt: skip
    """The command's verdict is register()'s in the same environment (README: it "says what the
    plugin decides on that machine"), the case where every patch is switched off included,
    where register() says "inactive: no patch applied"; it prints each value set and what it
    reads as; and it patches nothing (vLLM's originals stay, register() has not run), however
    much would apply."""
    from dsv41_gfx942_plugin import __main__ as command
    from dsv41_gfx942_plugin import patching

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert command.main() == 0
    out = capsys.readouterr().out
    assert "error:" not in out
    assert clean_plugin.status() is None and patching.applied() == {}
    for patch, _ in patches.PATCHES:
        owner = patching.resolve(f"{patch.module}:{patch.owner}")
        assert vars(owner)[patch.attr] is targets[patch.target]
    for name, value in env.items():  # each value set, stripped, what it reads as (blank: unset)
        read = f"{value.strip()} (read as {envs.get_bool(name)})" if value.strip() else "<unset: "
        assert f"\n  {name}={read}" in out
    [verdict] = [ln for ln in out.splitlines() if "plugin in a vLLM process here:" in ln]
    clean_plugin.register()
    assert clean_plugin.status() == decided
    if decided == "active":
        assert verdict.endswith(": ACTIVE")
    else:
        assert verdict.endswith(": " + decided.replace("no patch applied", "no patch would apply"))


def test_status_lists_code_objects_of_a_source_tree(tmp_path, monkeypatch, capsys):
    """A source tree (no build info) where ``python hip/build.py`` put a code object: the
    loader takes it, so the status command lists it (it said only "no build info")."""
    from dsv41_gfx942_plugin import __main__ as status

    monkeypatch.setitem(sys.modules, "dsv41_gfx942_plugin._build_info", None)  # import fails
    monkeypatch.setattr(status, "PACKAGE_DIR", tmp_path)
    (tmp_path / "_kernels").mkdir()
    status._code_objects()
    assert "no code object here (`python hip/build.py` builds one" in capsys.readouterr().out
    (tmp_path / "_kernels" / "topk512.gfx942.co").write_bytes(b"x" * 7)
    status._code_objects()
    out = capsys.readouterr().out
    assert "topk512.gfx942.co (7 bytes), from hip/build.py" in out
    assert "no code object here" not in out


def test_status_lists_code_objects_of_a_wheel(tmp_path, monkeypatch, capsys):
    """An installed wheel: the build info's commit, archs and compilers, each recorded object
    with its size and kernels, and an object recorded but not shipped as MISSING; a build
    without objects says the HIP hooks stay off."""
    import types

    from dsv41_gfx942_plugin import __main__ as status

    info = {"archs": ["gfx942"], "compilers": {"gfx942": "clang++-19: Debian clang 19.1.7"},
            "commit": "0123456789ab", "code_objects": {
                "topk512.gfx942.co": {"arch": "gfx942", "kernels": ["k_one", "k_two"]},
                "gone.gfx942.co": {"arch": "gfx942", "kernels": ["k_three"]}}}  # fmt: skip
    built = types.SimpleNamespace(BUILD_INFO=info)
    monkeypatch.setitem(sys.modules, "dsv41_gfx942_plugin._build_info", built)
    monkeypatch.setattr(status, "PACKAGE_DIR", tmp_path)
    (tmp_path / "_kernels").mkdir()
    (tmp_path / "_kernels" / "topk512.gfx942.co").write_bytes(b"x" * 9)
    status._code_objects()
    out = capsys.readouterr().out.splitlines()
    assert out[-4:] == [
        "  built from commit 0123456789ab, archs ['gfx942']",
        "  gfx942 compiler: clang++-19: Debian clang 19.1.7",
        "  topk512.gfx942.co (gfx942, 9 bytes): k_one, k_two",
        "  gone.gfx942.co (gfx942, MISSING): k_three",
    ]
    built.BUILD_INFO = dict(info, archs=[], compilers={"gfx942": None}, code_objects={})
    status._code_objects()
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "  built from commit 0123456789ab, archs none",
        "  gfx942 compiler: none found at build time",
        "  no code object in this build: the HIP hooks stay off, vLLM's ops run",
    ]
