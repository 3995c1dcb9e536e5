#!/usr/bin/env bash
# The test command (README "The two commands on a fresh machine"): installs what the tests
# need, then runs them.
#  1. the gfx942 HIP toolchain, where neither a ROCm compiler nor Debian's clang-19 with the HIP
#     headers and device libraries is installed and apt-get is there (hip/build.py builds with
#     either), and python3-venv;
#  2. a virtual environment with vLLM 0.33.0 (~9 GB, ~5 min the first time), cached under
#     ~/.cache so a later run on the same machine reuses it (checked, never trusted blindly:
#     rebuilt when it does not hold vLLM 0.33.0 and pytest). DSV41_TEST_VENV names another
#     environment instead (a ROCm build of vLLM 0.33.x): it is used as it is, given the test
#     tools, and never rebuilt or deleted;
#  3. the plugin itself, built as a wheel into dist/ and installed from it (so the tests see the
#     shipped code object, and the wheel tested is the one left to publish);
#  4. ruff (lint + format check), then pytest (15 minutes a test at most). GPU-only and
#     gfx942-only tests skip on a CPU (the gfx942 build checks, also marked gfx942, run).
# DSV41_GFX942_REQUIRE_HIP=1 makes a missing HIP compiler a build error (CI sets it; so does
# this script where the environment's torch is a ROCm build).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${DSV41_TEST_VENV:-$HOME/.cache/dsv41-gfx942-plugin/venv-vllm-0.33.0}"
PY="$VENV/bin/python"
if [ -n "${DSV41_TEST_VENV:-}" ] && [ ! -x "$PY" ] && [ -x "$VENV/bin/python3" ]; then
  PY="$VENV/bin/python3"  # a system prefix (a ROCm image's /usr) may have only python3
fi

have_hip() {  # what hip/build.py builds with: a ROCm compiler (on PATH, under $ROCM_PATH or
  # /opt/rocm), or Debian's clang-19 with the HIP headers and device libraries
  python3 -c "import sys; sys.path.insert(0, 'hip'); import build
sys.exit(build.find_rocm_compiler() is None)" 2>/dev/null && return 0
  command -v clang++-19 >/dev/null && [ -f /usr/include/hip/hip_runtime.h ] &&
    { [ -f /usr/lib/x86_64-linux-gnu/amdgcn/bitcode/ockl.bc ] || [ -f /usr/lib/amdgcn/bitcode/ockl.bc ]; }
}
cached_venv_ok() {
  [ -x "$PY" ] && "$PY" -c "import importlib.metadata as m; assert m.version('vllm') == '0.33.0'; import vllm, pytest" 2>/dev/null
}
PKGS=""
have_hip || PKGS="clang-19 lld-19 llvm-19 libamdhip64-dev rocm-device-libs"
if [ -z "${DSV41_TEST_VENV:-}" ] && ! cached_venv_ok && ! python3 -c "import ensurepip" 2>/dev/null; then
  PKGS="$PKGS python3-venv"  # the venv below is made
fi
if [ -n "$PKGS" ] && command -v apt-get >/dev/null; then
  echo "== installing $PKGS"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $PKGS >/dev/null
fi

if [ -n "${DSV41_TEST_VENV:-}" ]; then
  # The user's environment: vLLM 0.33.x (any local build) must be there; never replaced.
  "$PY" - <<'PY'
import sys

sys.path.insert(0, "src")
from dsv41_gfx942_plugin import vllm_supported, vllm_version

v = vllm_version()  # the plugin's own lookup: metadata, else vllm.__version__
if v is None or not vllm_supported(v):
    sys.exit(f"DSV41_TEST_VENV={sys.prefix} holds vLLM {v or 'none'}, not 0.33.x")
PY
elif ! cached_venv_ok; then
  echo "== creating $VENV with vllm==0.33.0"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q --no-cache-dir "vllm==0.33.0"  # 9 GB: no second copy in pip's cache
fi
# ruff pinned: another release formats or lints this tree otherwise, and an environment's own
# older (or newer) ruff would stop the script here, before any test.
"$PY" -m pip install -q "pytest>=8" "pytest-timeout>=2.3" "ruff==0.17.6"

echo "== building and installing the plugin wheel (left in dist/, the wheel a CI publishes)"
require="${DSV41_GFX942_REQUIRE_HIP:-}"
if [ -z "${require//[[:space:]]/}" ] &&
  "$PY" -c "import sys, torch; sys.exit(0 if torch.version.hip else 1)" 2>/dev/null; then
  # A ROCm torch (an MI300X's environment): a wheel without the gfx942 code object would let
  # every GPU top-k and indexer test skip ("no top-k code object"); fail the build instead.
  # (Unless the switch is set: a blank one is unset, as the build reads it.)
  export DSV41_GFX942_REQUIRE_HIP=1
fi
rm -f dist/dsv41_gfx942_plugin-*.whl
"$PY" -m pip wheel -q --no-deps -w dist .
"$PY" -m pip install -q --no-deps --force-reinstall dist/dsv41_gfx942_plugin-*.whl

echo "== ruff"
"$PY" -m ruff check .  # through the environment's python: a system one's scripts are elsewhere
"$PY" -m ruff format --check .

echo "== pytest"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  # No GPU: run Triton kernels (vLLM's and ours) in the interpreter. vLLM keeps Triton on
  # without a GPU driver only when CUDA_VISIBLE_DEVICES is set and empty.
  export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
fi
# A test that hangs (a kernel looping in the CPU emulation, where Python's signals cannot reach
# it) fails after 15 minutes with every thread's stack, instead of holding CI to its limit.
exec "$PY" -m pytest -q -p no:cacheprovider --timeout 900 --timeout-method thread "$@"
