"""tests/run.sh with ``DSV41_TEST_VENV`` (README: an MI300X's one command), run on a copy of the
script against a stand-in environment whose ``python`` records each call and answers as a ROCm
or CUDA torch would: the steps it runs, and the environment the wheel is built in."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The stand-in environment's python: every call logged with the build's requirement switch; the
# vLLM check (a script on stdin) passes; "-c" scripts asking for torch.version.hip answer
# FAKE_HIP, others (torch.cuda.is_available) say yes; "pip wheel" leaves a wheel in dist/.
FAKE_PYTHON = """#!/bin/bash
echo "$* | REQUIRE=${DSV41_GFX942_REQUIRE_HIP-unset}" >> "$FAKE_LOG"
case "$1" in
  -) cat > /dev/null ;;
  -c) case "$2" in *version.hip*) [ "$FAKE_HIP" = 1 ]; exit ;; esac ;;
  -m) if [ "$2 $3" = "pip wheel" ]; then
        mkdir -p dist && touch dist/dsv41_gfx942_plugin-0.1.0-py3-none-any.whl
      fi ;;
esac
exit 0
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.mark.skipif(shutil.which("python3") is None, reason="run.sh asks python3 for hip/build.py")
@pytest.mark.parametrize(
    ("hip", "require", "built_with", "exe"),
    [(True, None, "1", "python"), (False, None, "unset", "python"), (True, " ", "1", "python"),
     (True, "", "1", "python"), (True, "0", "0", "python"), (False, "1", "1", "python"),
     (True, None, "1", "python3")],
    ids=["rocm-torch", "cuda-torch", "rocm-blank-switch", "rocm-empty-switch", "rocm-switch-off",
         "cuda-switch-on", "python3-only"],
)  # fmt: skip
def test_user_environment(tmp_path, hip, require, built_with, exe):
    """A ROCm torch builds the wheel with a HIP compiler required (a wheel without the gfx942
    code object would let the GPU top-k and indexer tests skip on an MI300X), also where
    ``DSV41_GFX942_REQUIRE_HIP`` is blank (a blank switch is unset: the build would read it as
    off); a value set is the user's and kept. A CUDA or CPU torch as before. The environment is
    used as it is (its python still the stand-in after the run: never rebuilt), and the wheel
    it builds is what it installs and tests. ruff runs
    through the environment's python (a system environment's scripts are not in its ``bin``),
    pinned; the extra arguments reach pytest. An environment whose ``bin`` has only
    ``python3`` (a system prefix) is used through it."""
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "hip").mkdir()
    shutil.copy(ROOT / "tests/run.sh", tree / "tests/run.sh")
    shutil.copy(ROOT / "hip/build.py", tree / "hip/build.py")
    env_dir, tools = tmp_path / "env", tmp_path / "tools"
    (env_dir / "bin").mkdir(parents=True)
    tools.mkdir()
    _executable(env_dir / f"bin/{exe}", FAKE_PYTHON)
    _executable(tools / "hipcc", "#!/bin/sh\nexit 0\n")  # ROCm's compiler is found: no apt-get
    log = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV41_")}
    if require is not None:
        env["DSV41_GFX942_REQUIRE_HIP"] = require
    env.update(
        DSV41_TEST_VENV=str(env_dir), FAKE_LOG=str(log), FAKE_HIP=str(int(hip)),
        PATH=f"{tools}{os.pathsep}{env['PATH']}",
    )  # fmt: skip
    done = subprocess.run(
        ["bash", str(tree / "tests/run.sh"), "-m", "gpu or gfx942"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    [wheel] = [c for c in calls if c.startswith("-m pip wheel")]
    assert wheel.endswith(f"REQUIRE={built_with}")
    # The tests then import the wheel just built (README), not the source tree.
    [install] = [c for c in calls[calls.index(wheel) :] if "dist/dsv41_gfx942_plugin-" in c]
    assert install.startswith("-m pip install") and "--force-reinstall" in install
    assert not any(c.startswith("-m pip install") and " -e " in c for c in calls)
    assert (env_dir / f"bin/{exe}").read_text() == FAKE_PYTHON
    [tools_install] = [c for c in calls if c.startswith("-m pip install") and "ruff" in c]
    assert "ruff==" in tools_install
    assert any(c.startswith("-m ruff check .") for c in calls)
    assert any(c.startswith("-m ruff format --check .") for c in calls)
    assert calls[-1].startswith("-m pytest") and "-m gpu or gfx942 |" in calls[-1]


def _version_check() -> str:
    """run.sh's check of the user's vLLM: the Python it feeds ``"$PY" -`` (its first heredoc)."""
    text = (ROOT / "tests/run.sh").read_text()
    return text.split("\"$PY\" - <<'PY'\n", 1)[1].split("\nPY\n", 1)[0]


@pytest.mark.parametrize(
    ("dist_info", "dunder", "passes", "said"),
    [(None, "0.33.0+rocm700", True, ""), ("", "0.33.1", True, ""),
     ("Version: 0.33.0rc1\n", None, True, ""), (None, "0.34.0", False, "vLLM 0.34.0, not"),
     (None, None, False, "vLLM none, not")],
    ids=["no-metadata", "dist-info-without-metadata", "metadata", "other-version", "no-version"],
)  # fmt: skip
def test_user_environment_vllm_check(tmp_path, dist_info, dunder, passes, said):
    """The check asks the plugin's own lookup (``vllm_version``): a build installed without
    metadata, or whose dist-info lacks its METADATA file (``metadata.version`` then gives None,
    which the check once handed on and failed with a traceback), is judged by its
    ``vllm.__version__``; another version or none stops the script with one line naming it.
    Run with ``-S`` and only the stand-in vLLM on the path, so this machine's vLLM is unseen."""
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("" if dunder is None else f"__version__ = {dunder!r}\n")
    if dist_info is not None:
        info = tmp_path / "vllm-0.33.0.dist-info"
        info.mkdir()
        if dist_info:
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\n{dist_info}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-S", "-"], input=_version_check(), cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode == 0) is passes, done.stderr
    assert "Traceback" not in done.stderr
    assert said in done.stderr


def test_ci_runs_the_readme_command_with_the_build_required(tmp_path):
    """.ci/run (what CI runs on a clean clone) runs tests/run.sh, the README's test command,
    with no arguments and a missing HIP compiler made a build error, from the tree's root."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / ".ci/run", tmp_path / ".ci/run")
    seen = tmp_path / "seen"
    (tmp_path / "tests/run.sh").write_text(
        f'echo "$PWD|${{DSV41_GFX942_REQUIRE_HIP-unset}}|$#" > "{seen}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV41_")}
    done = subprocess.run(["bash", str(tmp_path / ".ci/run")], cwd="/", env=env, timeout=60)
    assert done.returncode == 0
    assert seen.read_text().strip() == f"{tmp_path}|1|0"
