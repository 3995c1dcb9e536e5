"""Device time of GPU work, shared by the benchmarks: CUDA events around back-to-back calls,
eager or replayed from a CUDA graph."""

from __future__ import annotations

import torch


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
