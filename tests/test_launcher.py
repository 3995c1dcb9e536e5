"""Which GPU runtime library ops/_launcher.py loads its code objects through: the one torch's
own calls bind to, also where the process has mapped a second copy."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv41_gfx942_plugin.ops import _launcher

TORCH_LIB = Path(torch.__file__).parent / "lib"
SYSTEM_GOMP = Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1")
CC = next(filter(None, map(shutil.which, ("cc", "gcc", "clang", "clang-19"))), None)
# Run with a preloaded library that defines omp_get_max_threads: where torch's own call goes
# (what torch.get_num_threads() returns) and what the lookup names must agree.
PRELOADED = """
import os, torch
from dsv41_gfx942_plugin.ops import _launcher
user = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
print(torch.get_num_threads(), _launcher._providing(user, "omp_get_max_threads",
      _launcher._file_maps()))
"""


@pytest.mark.skipif(
    not (TORCH_LIB / "libgomp.so.1").exists() or not SYSTEM_GOMP.exists(),
    reason="needs torch's bundled libgomp and a system one",
)
def test_providing_follows_the_users_binding_not_the_first_copy():
    """The same lookup as for libamdhip64, on the CPU: with the system's libgomp loaded as
    well, a symbol resolved from torch's libtorch_cpu is torch's bundled copy's."""
    ctypes.CDLL(str(SYSTEM_GOMP))  # a second copy, mapped
    maps = _launcher._file_maps()
    gomps = {os.path.realpath(p) for _, _, p in maps if "libgomp" in os.path.basename(p)}
    assert len(gomps) >= 2, gomps
    user = str(TORCH_LIB / "libtorch_cpu.so")
    found = _launcher._providing(user, "omp_get_max_threads", maps)
    assert os.path.realpath(found) == os.path.realpath(TORCH_LIB / "libgomp.so.1")
    assert _launcher._providing(user, "no_such_symbol_anywhere", maps) is None


@pytest.mark.skipif(CC is None, reason="needs a C compiler for the preloaded library")
def test_providing_looks_in_the_global_scope_first(tmp_path):
    """A library in the global scope (here preloaded) takes torch's calls before torch's own
    dependency does; the lookup then names it, as the dynamic linker binds."""
    src, shim = tmp_path / "shim.c", tmp_path / "libshim.so"  # (LD_PRELOAD splits at spaces)
    src.write_text("int omp_get_max_threads(void) { return 42; }\n")
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(shim)], check=True)
    env = dict(os.environ, LD_PRELOAD=str(shim), OMP_NUM_THREADS="")
    src_dir = str(Path(_launcher.__file__).parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src_dir, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", PRELOADED], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split(maxsplit=1) == ["42", f"{shim}\n"]


def test_mapped_hip_takes_torchs_copy(monkeypatch, tmp_path):
    other, torchs = "/opt/rocm/lib/libamdhip64.so.6", "/t/lib/libamdhip64.so.6"
    maps = [(0, 10, other), (10, 20, torchs), (20, 30, "/t/lib/libc10_hip.so")]
    monkeypatch.setattr(_launcher, "_file_maps", lambda: maps)
    asked = []

    def providing(user, symbol, maps_):
        asked.append((user, symbol))
        return torchs

    monkeypatch.setattr(_launcher, "_providing", providing)
    assert _launcher._Runtime._mapped_hip() == torchs
    assert asked == [("/t/lib/libc10_hip.so", "hipModuleLaunchKernel")]
    # torch's binding unknown (no libc10_hip mapped, or the lookup failed): the first copy
    monkeypatch.setattr(_launcher, "_providing", lambda *a: None)
    assert _launcher._Runtime._mapped_hip() == other
    monkeypatch.setattr(_launcher, "_file_maps", lambda: maps[1:2])
    assert _launcher._Runtime._mapped_hip() == torchs
    # a bound library that is not a libamdhip64 (a shim): the first copy named so
    monkeypatch.setattr(_launcher, "_file_maps", lambda: maps)
    monkeypatch.setattr(_launcher, "_providing", lambda *a: "/t/lib/libc10_hip.so")
    assert _launcher._Runtime._mapped_hip() == other
    # none mapped: the one in torch's lib folder, else an error naming the library
    monkeypatch.setattr(_launcher, "_file_maps", lambda: [])
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.setattr(_launcher.torch, "__file__", str(tmp_path / "__init__.py"))
    with pytest.raises(OSError, match="libamdhip64 is not loaded"):
        _launcher._Runtime._mapped_hip()
    (lib / "libamdhip64.so.6").touch()
    assert _launcher._Runtime._mapped_hip() == str(lib / "libamdhip64.so.6")


def test_file_maps_lists_this_process_libraries(tmp_path):
    """Each mapped file's range and whole path (spaces too); a deleted file's is left out."""
    lib = tmp_path / "a b" / "libgomp copy.so.1"
    lib.parent.mkdir()
    shutil.copy(SYSTEM_GOMP if SYSTEM_GOMP.exists() else TORCH_LIB / "libgomp.so.1", lib)
    ctypes.CDLL(str(lib))
    maps = _launcher._file_maps()
    assert any(os.path.basename(p).startswith("libtorch_cpu") for _, _, p in maps)
    assert all(lo < hi and p.startswith("/") for lo, hi, p in maps)
    assert str(lib) in {p for _, _, p in maps}
    lib.unlink()
    assert str(lib) not in {p for _, _, p in _launcher._file_maps()}
    assert not any(p.endswith("(deleted)") for _, _, p in _launcher._file_maps())
