"""Loads the plugin's ahead-of-time code objects and launches their kernels on torch's stream.

The code object is ``_kernels/<stem>.<arch>.co`` in this package: ``gfx942`` on ROCm (the
product, built by ``hip/build.py`` in the wheel build) and ``sm_90`` on an NVIDIA H200 (tests
and benchmarks only). The sm_90 cubin is not shipped: the plugin patches vLLM only on ROCm
gfx942, so on NVIDIA nothing would launch it; tests build it with ``python hip/build.py --arch
sm_90`` into the same folder.

It is loaded through the GPU runtime torch already has in the process: on ROCm the
``libamdhip64`` that torch's own HIP calls bind to (the copy a symbol resolves to from
torch's ``libc10_hip``, found in ``/proc/self/maps``; else under torch's lib folder), with
``hipModuleLoadData`` / ``hipModuleGetFunction`` / ``hipModuleLaunchKernel``; on NVIDIA
libcuda's ``cuModuleLoadData`` / ``cuModuleGetFunction`` / ``cuLaunchKernel``. Nothing here
links to torch's C++ ABI or needs a compiler, so one wheel serves any torch and ROCm that vLLM
runs on.

A launch packs its arguments with one ``struct.pack_into`` into a buffer laid out as the
kernel's C parameters (the layout is checked against the code object's metadata in
tests/test_topk_build.py) and passes it as the launch's ``extra`` buffer: no per-call ctypes
objects, a few microseconds of host time. A lock a kernel keeps the buffer one launch's while
the runtime reads it, should two threads launch the same kernel. Launches go on torch's current
stream, allocate nothing, and are captured by CUDA graphs like any other kernel.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path

import torch

KERNEL_DIR = Path(__file__).resolve().parent.parent / "_kernels"

# Parameter codes: P pointer, q int64, i int32 (the natural C layout, each aligned to its size).
_SIZES = {"P": 8, "q": 8, "i": 4}


def arg_layout(signature: str) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of a kernel whose C parameters are ``signature``."""
    layout, offset = [], 0
    for code in signature:
        size = _SIZES[code]
        offset = (offset + size - 1) // size * size
        layout.append((offset, size))
        offset += size
    return layout


def _packer(signature: str) -> struct.Struct:
    fmt, offset = "<", 0
    for (start, size), code in zip(arg_layout(signature), signature, strict=True):
        fmt += "x" * (start - offset) + ("Q" if code == "P" else code)
        offset = start + size
    return struct.Struct(fmt)  # the explicit kernel arguments, as the code object lays them out


def code_object_arch(device: torch.device | int | None = None) -> str | None:
    """The architecture name of this process's GPU as the code objects are named, or None."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return props.gcnArchName.split(":")[0]
    return f"sm_{props.major}{props.minor}"


def _file_maps() -> list[tuple[int, int, str]]:
    """(start, end, path) of each file this process has mapped, from ``/proc/self/maps`` (a
    path may hold spaces; a deleted file's is left out)."""
    try:
        with open("/proc/self/maps", errors="surrogateescape") as maps:
            rows = [line.rstrip("\n").split(maxsplit=5) for line in maps]
    except OSError:
        return []
    return [
        (int(r[0].split("-")[0], 16), int(r[0].split("-")[1], 16), r[5])
        for r in rows
        if len(r) == 6 and r[5].startswith("/") and not r[5].endswith(" (deleted)")
    ]


def _providing(user: str, symbol: str, maps: list[tuple[int, int, str]]) -> str | None:
    """The mapped file whose ``symbol`` library ``user`` (already loaded) binds to, as the
    dynamic linker looks it up: the global scope first (the program, preloaded libraries,
    RTLD_GLOBAL ones), then ``user`` and its own dependencies."""
    for name in (None, user):
        try:
            fn = getattr(ctypes.CDLL(name, mode=os.RTLD_NOLOAD), symbol)
        except (OSError, AttributeError):
            continue
        address = ctypes.cast(fn, ctypes.c_void_p).value
        return next((path for lo, hi, path in maps if lo <= address < hi), None)
    return None


class _Runtime:
    """The module API of the GPU runtime torch uses (HIP or the CUDA driver)."""

    def __init__(self):
        if torch.version.hip:
            # Local: the library is torch's, already loaded; adding it to the global scope
            # could rebind torch's own lazily bound calls.
            self.lib = ctypes.CDLL(self._mapped_hip())
            prefix, self.end_marker = "hip", 3  # HIP_LAUNCH_PARAM_END
            self.load_data = self.lib.hipModuleLoadData
            self.get_function = self.lib.hipModuleGetFunction
            self.launch = self.lib.hipModuleLaunchKernel
            self.get_last_error = self.lib.hipGetLastError
            self.get_last_error.argtypes = []
            self.get_last_error.restype = ctypes.c_int
        else:
            self.lib = ctypes.CDLL("libcuda.so.1")
            prefix, self.end_marker = "cu", 0  # CU_LAUNCH_PARAM_END
            self.load_data = self.lib.cuModuleLoadData
            self.get_function = self.lib.cuModuleGetFunction
            self.launch = self.lib.cuLaunchKernel
            # The driver API's errors never reach the runtime's cudaGetLastError, which torch
            # reads: nothing to reset.
            self.get_last_error = lambda: 0
        self.name = prefix
        vp = ctypes.c_void_p
        self.load_data.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        self.get_function.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        self.launch.argtypes = [vp] + [ctypes.c_uint] * 7 + [vp, vp, vp]
        for fn in (self.load_data, self.get_function, self.launch):
            fn.restype = ctypes.c_int

    @staticmethod
    def _mapped_hip() -> str:
        """The libamdhip64 torch's HIP calls go to: the one that resolves a HIP symbol from
        torch's ``libc10_hip`` (where another copy is also mapped, say one that a ROCm
        extension linked, the first copy in the process need not be torch's). Else the first
        libamdhip64 mapped, else the one under torch's lib folder."""
        maps = _file_maps()
        named = [path for _, _, path in maps if os.path.basename(path).startswith("libamdhip64.")]
        user = next((p for _, _, p in maps if os.path.basename(p).startswith("libc10_hip.")), None)
        bound = user and _providing(user, "hipModuleLaunchKernel", maps)
        if bound in named:
            return bound
        if named:
            return named[0]
        lib_dir = Path(torch.__file__).parent / "lib"
        for path in sorted(lib_dir.glob("libamdhip64.so*")):
            return str(path)
        raise OSError("libamdhip64 is not loaded in this process")

    def check(self, err: int, what: str) -> None:
        if err != 0:
            self.get_last_error()  # reset: see clear_last_error
            raise RuntimeError(f"{self.name}{what} failed with error {err}")


_runtime: _Runtime | None = None


def _get_runtime() -> _Runtime:
    """The process's HIP (or CUDA driver) bindings, made at first use."""
    global _runtime
    if _runtime is None:
        _runtime = _Runtime()
    return _runtime


def clear_last_error() -> int:
    """Read and reset this thread's HIP last error (0: none, or not ROCm); never raises. Every
    handler that lets vLLM's op run after a plugin call raised calls it: since ROCm 7 a failed
    HIP call's error stays until ``hipGetLastError`` reads it, and torch reads it after each of
    its own launches, so a failure of the plugin's (a code object that does not load, a Triton
    or Gluon launch that HIP refused) would raise again in vLLM's next op, which then takes the
    server down."""
    if not torch.version.hip:
        return 0
    try:
        return _get_runtime().get_last_error()
    except Exception:  # noqa: BLE001 - no HIP runtime to ask: nothing to reset
        return 0


class Kernel:
    """One kernel of a loaded module, with its preallocated argument buffer."""

    def __init__(self, runtime: _Runtime, handle: int, name: str, signature: str):
        self.name = name
        self.signature = signature
        self._rt = runtime
        self._fn = handle
        self._pack = _packer(signature)
        self._buf = ctypes.create_string_buffer(self._pack.size)
        # One buffer, so one launch at a time packs and reads it. vLLM launches from one thread
        # a worker; the lock costs 0.2 us a launch (1.73 -> 1.93 us on a stand-in runtime, the
        # CPU VM of this release), about 3 us of a decode step's 16 launches.
        self._lock = threading.Lock()
        # The size ends at the last parameter, not rounded to 8 or 16: ROCm's runtime copies each
        # parameter at its metadata offset from the buffer (ROCm/clr: ihipLaunchKernelCommand,
        # KernelParameters::captureAndSet, which writes zero for one past the size) and adds
        # the hidden arguments itself. libcuda takes the same sizes (every sm_90 GPU test).
        self._size = ctypes.c_size_t(self._pack.size)
        self._extra = (ctypes.c_void_p * 5)(
            1, ctypes.addressof(self._buf), 2, ctypes.addressof(self._size), runtime.end_marker
        )

    def __call__(self, grid: tuple[int, int, int], block: int, stream: int, *args) -> None:
        """Launch on ``stream`` (a raw stream handle); ``args`` match ``signature``."""
        with self._lock:  # ctypes lets other threads run while the runtime reads the buffer
            self._pack.pack_into(self._buf, 0, *args)
            err = self._rt.launch(
                self._fn, grid[0], grid[1], grid[2], block, 1, 1, 0, stream, None, self._extra
            )
        if err != 0:
            self._rt.check(err, f"ModuleLaunchKernel({self.name})")


class Module:
    """A code object loaded on one device: its kernels by name."""

    def __init__(self, path: Path, kernels: dict[str, str], device: int):
        rt = _get_runtime()
        image = path.read_bytes()
        self._image = ctypes.create_string_buffer(image, len(image))  # kept alive with the module
        with torch.cuda.device(device):
            torch.cuda.synchronize()  # the device's context exists and is current
            module = ctypes.c_void_p()
            rt.check(rt.load_data(ctypes.byref(module), self._image), "ModuleLoadData")
            self.kernels = {}
            for name, signature in kernels.items():
                fn = ctypes.c_void_p()
                rt.check(
                    rt.get_function(ctypes.byref(fn), module, name.encode()),
                    f"ModuleGetFunction({name})",
                )
                self.kernels[name] = Kernel(rt, fn.value, name, signature)
        self.path = path


def code_object_path(stem: str, arch: str | None) -> Path:
    """Where ``stem``'s code object for ``arch`` lies: ``_kernels/<stem>.<arch>.co``."""
    return KERNEL_DIR / f"{stem}.{arch}.co"


def load(stem: str, kernels: dict[str, str], device: int) -> Module:
    """Load ``_kernels/<stem>.<arch>.co`` on ``device``; raises OSError/RuntimeError saying why
    it cannot."""
    arch = code_object_arch(device)
    if arch is None:
        raise RuntimeError("no GPU")
    path = code_object_path(stem, arch)
    if not path.is_file():
        raise OSError(f"no code object for {arch}: {path} is missing")
    return Module(path, kernels, device)


# torch's own accessor of the current raw stream (what Inductor's generated code calls): no
# Stream object a launch, a fraction of a microsecond.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: int) -> int:
    """The raw handle of torch's current stream on ``device``."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


class Scratch:
    """Persistent int32 buffers, one a device, grown outside graph capture only. A grown buffer
    keeps the old ones alive, so graphs captured with them stay valid; but one that was only
    reserved (``reserve``: vLLM's memory profile, before any launch) and never handed to a
    launch goes before its successor is made, so the profile counts only the largest (at 1M
    context the ratio-2 layers' reservation would otherwise stay beside the full width's: 54
    MiB more at 192 rows). One a device, not a stream: launches that share it must be
    stream-ordered, as vLLM 0.33 runs the indexer (one compute stream, its dual-batch
    overlap's two micro-batches included). ``device_type``: "cuda" (ROCm's too); tests use
    "cpu"."""

    def __init__(self, device_type: str = "cuda"):
        self._type = device_type
        self._bufs: dict[int, list[torch.Tensor]] = {}
        self._unlaunched: set[int] = set()  # devices whose last buffer no launch has had

    def get(self, device: int, numel: int) -> torch.Tensor | None:
        """A buffer of at least ``numel`` for a launch; None inside capture when it must grow."""
        buf, _ = self._grow(device, numel)
        self._unlaunched.discard(device)
        return buf

    def reserve(self, device: int, numel: int) -> bool:
        """Grow to at least ``numel`` now, for no launch yet; whether it holds that much."""
        buf, grew = self._grow(device, numel)
        if grew:
            self._unlaunched.add(device)
        return buf is not None

    def _grow(self, device: int, numel: int) -> tuple[torch.Tensor | None, bool]:
        bufs = self._bufs.setdefault(device, [])
        if bufs and bufs[-1].numel() >= numel:
            return bufs[-1], False
        if torch.cuda.is_current_stream_capturing():
            return None, False
        size = max(numel, 2 * bufs[-1].numel() if bufs else numel)
        if device in self._unlaunched:
            # No launch, so no graph, has it: freed before the next is made. Unmarked at once,
            # so that an allocation below that fails leaves the launched buffer before it
            # marked as launched (a later growth would free it).
            bufs.pop()
            self._unlaunched.discard(device)
        bufs.append(torch.empty(size, dtype=torch.int32, device=torch.device(self._type, device)))
        return bufs[-1], True
