"""Device time of GPU work, shared by the benchmarks: CUDA events around back-to-back calls,
eager or replayed from a CUDA graph; and what every benchmark does first: run this checkout's
code (``use_checkout``), and stop with one line where it cannot time anything (no GPU, no top-k
code object) rather than with a traceback from deep inside torch."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def use_checkout() -> None:
    """This checkout's ``src/`` and ``tests/`` first on ``sys.path``: a benchmark times the
    checkout's plugin (code objects included: ``python hip/build.py`` puts them in ``src/``),
    never a wheel installed in the environment, which an edit would not reach."""
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


def summary(doc: str) -> str:
    """A benchmark's docstring's first paragraph on one line: its ``--help`` description."""
    return " ".join(doc.split("\n\n")[0].split())


def require_gpu(script: str) -> None:
    """Exit with one line where torch sees no GPU."""
    if not torch.cuda.is_available():
        sys.exit(f"{script}: needs a CUDA or ROCm GPU; torch {torch.__version__} sees none")


def require_topk_kernels(script: str) -> None:
    """Exit with one line where the plugin's top-k kernels do not load on this GPU: where its
    code object is missing, the command that builds it."""
    from dsv41_gfx942_plugin.ops import _launcher, topk

    if topk.build():
        return
    arch = _launcher.code_object_arch()
    path = topk.code_object_path()
    if not path.is_file():
        sys.exit(
            f"{script}: no top-k code object for {arch} ({path} is missing); build this "
            f"checkout's: python hip/build.py --arch {arch}"
        )
    sys.exit(f"{script}: the top-k kernels do not load on this GPU (the warning above says why)")


def mean_us(fn, iters: int, warmup: int = 3) -> float:
    """Mean device time of ``fn()`` in microseconds over ``iters`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1000 / iters


def graphed(fn, calls: int = 1):
    """The replay of a CUDA graph holding ``calls`` calls of ``fn`` (captured after one eager
    call, which compiles kernels and allocates persistent scratch)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay
