"""Which GPU runtime library ops/_launcher.py loads its code objects through: the one torch's
own calls bind to, also where the process has mapped a second copy."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest
import torch

from dsv41_gfx942_plugin.ops import _launcher

TORCH_LIB = Path(torch.__file__).parent / "lib"
SYSTEM_GOMP = Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1")


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


def test_mapped_hip_takes_torchs_copy(monkeypatch):
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
    monkeypatch.setattr(_launcher, "_file_maps", lambda: [])
    if not list(TORCH_LIB.glob("libamdhip64.so*")):
        with pytest.raises(OSError, match="libamdhip64 is not loaded"):
            _launcher._Runtime._mapped_hip()


def test_file_maps_lists_this_process_libraries():
    maps = _launcher._file_maps()
    assert any(os.path.basename(p).startswith("libtorch_cpu") for _, _, p in maps)
    assert all(lo < hi and p.startswith("/") for lo, hi, p in maps)
