"""Which GPU runtime library ops/_launcher.py loads its code objects through: the one torch's
own calls bind to, also where the process has mapped a second copy."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import threading
import time
import types
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


# A stand-in libamdhip64 with ROCm >= 7's rule for the last error: a failed call sets it, and
# only hipGetLastError reads and resets it (torch calls that after each of its own launches).
# Its launch takes its arguments as HIP does from ``extra`` (HIP_LAUNCH_PARAM_BUFFER_POINTER 1,
# the buffer, HIP_LAUNCH_PARAM_BUFFER_SIZE 2, a pointer to the size, HIP_LAUNCH_PARAM_END 3; else
# error 1) and records them with the launch's configuration.
FAKE_HIP = """
#include <string.h>
#include <unistd.h>
static int last, fail, delay_us;
void set_fail(int which) { fail = which; }
void set_delay(int us) { delay_us = us; }
volatile int in_launch;
unsigned long long first_args[16];
int logged;
int pending(void) { return last; }
static int result(int which) { if (fail != which) return 0; last = 200; return 200; }
static void *loaded_module = (void *)0xBEEF, *kernel_fn = (void *)0xF00D, *asked_module;
unsigned long long launched[10];
unsigned char arg_bytes[256];
int hipModuleLoadData(void **module, const void *image) {
  if (module) *module = loaded_module;
  return result(1); }
int hipModuleGetFunction(void **fn, void *module, const char *name) {
  asked_module = module;
  if (fn) *fn = kernel_fn;
  return result(2); }
int hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared, void *stream,
                          void **params, void **extra) {
  if (result(3)) return 200;
  if (params || !extra || (size_t)extra[0] != 1 || (size_t)extra[2] != 2
      || (size_t)extra[4] != 3 || *(size_t *)extra[3] > sizeof arg_bytes) return 1;
  unsigned long long got[10] = {(size_t)f, gx, gy, gz, bx, by, bz, shared, (size_t)stream,
                                *(size_t *)extra[3]};
  memcpy(launched, got, sizeof got);
  in_launch = 1;
  int wait = delay_us;  /* the first launch after set_delay reads its buffer late */
  delay_us = 0;
  if (wait) usleep(wait);
  memcpy(arg_bytes, extra[1], *(size_t *)extra[3]);
  first_args[__sync_fetch_and_add(&logged, 1) % 16] = *(unsigned long long *)extra[1];
  return asked_module == loaded_module && f == kernel_fn ? 0 : 2;
}
int hipGetLastError(void) { int e = last; last = 0; return e; }
"""


@pytest.fixture
def fake_hip(tmp_path, monkeypatch):
    """The launcher's runtime on the stand-in library, as on ROCm; the library's handle."""
    if CC is None:
        pytest.skip("needs a C compiler for the stand-in HIP library")
    src, lib = tmp_path / "hip.c", tmp_path / "libamdhip64.so.7"
    src.write_text(FAKE_HIP)
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    monkeypatch.setattr(_launcher._Runtime, "_mapped_hip", staticmethod(lambda: str(lib)))
    monkeypatch.setattr(_launcher, "_runtime", None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    handle = ctypes.CDLL(str(lib))
    handle.set_fail(0)
    return handle


FAILS = ["hipModuleLoadData", "hipModuleGetFunction", "hipModuleLaunchKernel"]


@pytest.mark.parametrize("fail", FAILS)
def test_a_failed_hip_call_leaves_no_last_error(fake_hip, tmp_path, fail):
    """A failed load, lookup or launch raises (the hooks then decline and vLLM's op runs) and
    leaves the thread's HIP last error reset: left set, torch's check after vLLM's next kernel
    would raise it and take the server down."""
    image = tmp_path / "topk512.gfx942.co"
    image.write_bytes(b"\x7fELF")
    fake_hip.set_fail(FAILS.index(fail) + 1)
    with pytest.raises(RuntimeError, match=f"{fail}.* failed with error 200"):
        module = _launcher.Module(image, {"k": "Pi"}, 0)
        module.kernels["k"]((1, 1, 1), 64, 0, 0, 7)
    assert fake_hip.pending() == 0


def test_clear_last_error_resets_hips_and_never_raises(fake_hip, monkeypatch):
    """What the hooks' handlers call after any failure (a Triton or Gluon launch's too)."""
    fake_hip.set_fail(1)
    fake_hip.hipModuleLoadData(None, None)  # a failure the launcher did not see
    monkeypatch.setattr(torch.version, "hip", None)  # not ROCm: nothing asked
    assert _launcher.clear_last_error() == 0 and fake_hip.pending() == 200
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    assert _launcher.clear_last_error() == 200 and fake_hip.pending() == 0
    assert _launcher.clear_last_error() == 0

    def no_library():
        raise OSError("libamdhip64 is not loaded in this process")

    monkeypatch.setattr(_launcher, "_runtime", None)
    monkeypatch.setattr(_launcher._Runtime, "_mapped_hip", staticmethod(no_library))
    assert _launcher.clear_last_error() == 0


def test_a_launch_hands_hip_its_arguments_as_the_kernel_lays_them_out(
    fake_hip, tmp_path, monkeypatch
):
    """A kernel of the module loaded on its device (device 3 current while it loads), launched
    on the given stream with the given grid and block, its arguments packed at the offsets of
    their C layout (pointer, int32, then int64 and pointer, each aligned to its size) and passed
    in HIP's ``extra`` buffer, whose size ends at the last argument (12 bytes for a pointer and
    an int32, not 16: the runtime copies that many)."""
    image = tmp_path / "topk512.gfx942.co"
    image.write_bytes(b"\x7fELF")
    current = []
    monkeypatch.setattr(
        torch.cuda, "device", lambda d: current.append(d) or contextlib.nullcontext()
    )
    module = _launcher.Module(image, {"k": "PiqP", "short": "Pi"}, 3)
    assert current == [3]
    module.kernels["k"]((3, 5, 7), 256, 0xABC, 0x1122334455667788, -2, -3, 0x99)
    launched = list((ctypes.c_ulonglong * 10).in_dll(fake_hip, "launched"))
    assert launched == [0xF00D, 3, 5, 7, 256, 1, 1, 0, 0xABC, 32]
    packed = bytes((ctypes.c_ubyte * 32).in_dll(fake_hip, "arg_bytes"))
    assert packed == (
        (0x1122334455667788).to_bytes(8, "little") + (-2).to_bytes(4, "little", signed=True)
        + bytes(4) + (-3).to_bytes(8, "little", signed=True) + (0x99).to_bytes(8, "little")
    )  # fmt: skip
    module.kernels["short"]((1, 1, 1), 64, 0, 0x55, 7)
    assert list((ctypes.c_ulonglong * 10).in_dll(fake_hip, "launched"))[9] == 12


def test_launches_from_two_threads_each_hand_hip_their_own_arguments(fake_hip, tmp_path):
    """One thread's launch is inside the runtime, its argument buffer not yet read (ctypes lets
    other threads run then), when another thread launches the same kernel: each launch must
    still pass its own arguments, not the other's, so the second waits for the first."""
    image = tmp_path / "topk512.gfx942.co"
    image.write_bytes(b"\x7fELF")
    kernel = _launcher.Module(image, {"k": "P"}, 0).kernels["k"]
    fake_hip.set_delay(200_000)
    first = threading.Thread(target=kernel, args=((1, 1, 1), 64, 0, 0x1111))
    first.start()
    in_launch = ctypes.c_int.in_dll(fake_hip, "in_launch")
    while not in_launch.value:
        time.sleep(0.001)
    kernel((1, 1, 1), 64, 0, 0x2222)
    first.join()
    assert ctypes.c_int.in_dll(fake_hip, "logged").value == 2
    assert list((ctypes.c_ulonglong * 2).in_dll(fake_hip, "first_args")) == [0x1111, 0x2222]


def test_stream_handle_is_the_devices_current_stream(monkeypatch):
    """torch's current raw stream of the device asked for (torch's accessor, else its Stream
    object's handle)."""
    asked = []
    monkeypatch.setattr(_launcher, "_raw_stream", lambda device: asked.append(device) or 0x51)
    assert _launcher.stream_handle(3) == 0x51 and asked == [3]
    monkeypatch.setattr(_launcher, "_raw_stream", None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: asked.append(device) or
                        types.SimpleNamespace(cuda_stream=0x52))  # fmt: skip
    assert _launcher.stream_handle(2) == 0x52 and asked == [3, 2]


def test_a_missing_code_object_is_named(monkeypatch, tmp_path):
    """No code object for this GPU's arch (a build without the HIP compiler): an OSError that
    names the arch and the file (the hooks' one warning says it), before any runtime call."""
    monkeypatch.setattr(_launcher, "code_object_arch", lambda device=None: "gfx942")
    monkeypatch.setattr(_launcher, "KERNEL_DIR", tmp_path)
    monkeypatch.setattr(_launcher, "_get_runtime", lambda: pytest.fail("runtime asked"))
    with pytest.raises(OSError, match=f"no code object for gfx942: {tmp_path}/topk512.gfx942.co"):
        _launcher.load("topk512", {}, 0)


@pytest.mark.parametrize(("hip", "props", "arch"), [
    ("6.4.1", dict(gcnArchName="gfx942:sramecc+:xnack-"), "gfx942"),  # MI300X's full name
    (None, dict(major=9, minor=0), "sm_90"),
])  # fmt: skip
def test_code_object_arch_names_the_file(monkeypatch, hip, props, arch):
    """The arch as the code objects are named: ROCm's target without its feature flags, CUDA's
    compute capability."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(**props))  # fmt: skip
    monkeypatch.setattr(torch.version, "hip", hip)
    assert _launcher.code_object_arch(0) == arch
