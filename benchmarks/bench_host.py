"""Benchmark: the host (Python) cost of one decode step's indexer, plugin vs vLLM, CPU-measured.

In vLLM's breakable-graph mode (its default for DeepSeek-V4.1 on ROCm) the indexer is an eager
break, so its Python runs at every decode step for each of the 8 index layers. This times that
Python alone, for the 8 layers of one step of ``tests/indexer_step.py`` (plain 2/8/14, writer
20, readers 24-36), two ways in one run on the same metadata:

- plugin: ``indexer.indexer_step``, the plugin's entry, its hooks taking every call but the
  candidate logits' (the harness's q, fp32 with one head of 8, is not one it takes);
- vLLM: vLLM 0.33.0's ``rocm_aiter_sparse_attn_indexer`` (its decode branch).

Every device op is a no-op on both sides, so only host work is left (choices, gating, argument
packing, views): the plugin's HIP launches and vLLM's Triton candidate kernels are no-op
callables, AITER's paged logits return a precomputed tensor, and vLLM's C++
``top_k_per_row_decode`` is a no-op registered under its own name, so its dispatcher cost stays.
The rounds alternate between the sides and the median round counts. Run where vLLM imports (the
CPU is enough)::

    CUDA_VISIBLE_DEVICES= python benchmarks/bench_host.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import types
from pathlib import Path

import torch

from _timing import summary, use_checkout

use_checkout()

import indexer_step as harness  # noqa: E402


def _noop_top_k():
    """vLLM's C++ top-k as a registered no-op (vllm._C is not built for the CPU)."""
    if not hasattr(torch.ops._C, "top_k_per_row_decode"):
        lib = torch.library.Library("_C", "FRAGMENT")
        lib.define(
            "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor(a!) out, "
            "int rows, int s0, int s1, int k) -> ()"
        )
        lib.impl("top_k_per_row_decode", lambda *a: None, "CPU")
        _noop_top_k.lib = lib  # the registration lives as long as the library object
    return torch.ops._C.top_k_per_row_decode


def _setup(requests: int, next_n: int, width: int):
    """The two sides' step functions over one step's layers and metadata, device ops no-ops."""
    from vllm.model_executor.layers import sparse_attn_indexer as sai
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    from dsv41_gfx942_plugin import indexer
    from dsv41_gfx942_plugin.ops import _launcher, topk

    kernels = {name: (lambda *args: None) for name in topk.KERNELS}
    topk._GPU_TYPE = "cpu"
    topk._kernels = lambda t: kernels
    # Persistent, as _launcher.Scratch is: allocated once, then handed out (not a tensor a call).
    scratch = [torch.empty(0, dtype=torch.int32)]

    def get(device, numel):
        if scratch[0].numel() < numel:
            scratch[0] = torch.empty(numel, dtype=torch.int32)
        return scratch[0]

    topk._scratch = types.SimpleNamespace(get=get)
    topk.build = lambda: True
    _launcher.stream_handle = lambda device: 0
    indexer._aiter_enabled = lambda: True
    rocm._apply_candidate_mask_strided = lambda *a, **k: None
    sai._select_candidate_blocks = lambda *a, **k: None
    top_k = _noop_top_k()
    step = harness.Step(requests, next_n, width, device="cpu")
    current = harness.install_stand_ins(harness.Patch(), step, full_graph=False)
    torch.ops._C.top_k_per_row_decode = top_k  # the no-op op, not the harness's torch version
    ours, vllms = step.layers(), step.layers()

    def plugin():
        for (lid, _), layer in zip(harness.LAYERS, ours, strict=True):
            current["logits"], current["prefix"] = step.logits[lid], layer.k_cache.prefix
            indexer.indexer_step(layer, step.q, step.q, None, step.weights)

    def vllm():
        harness.run_step(step, vllms, current, plugin=False)

    return {"plugin": plugin, "vllm": vllm}


def main() -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--iters", type=int, default=200, help="steps a round")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sides = _setup(requests=1, next_n=6, width=131072)
    rounds: dict[str, list[float]] = {name: [] for name in sides}
    for step in sides.values():
        for _ in range(50):
            step()
    for _ in range(args.rounds):
        for name, step in sides.items():
            start = time.perf_counter()
            for _ in range(args.iters):
                step()
            rounds[name].append((time.perf_counter() - start) / args.iters * 1e6)
    us = {name: statistics.median(r) for name, r in rounds.items()}
    cpu = platform.processor() or platform.machine()
    layers = len(harness.LAYERS)
    print(f"host cost of one decode step, 8 index layers, 6 rows x 128k ({cpu}, median of "
          f"{args.rounds} rounds of {args.iters} steps):")  # fmt: skip
    for name, t in us.items():
        print(f"  {name:6s} {t:7.1f} us a step, {t / layers:5.1f} us a layer")
    print(f"  plugin / vLLM: {us['plugin'] / us['vllm']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "us_per_step": us, "layers": layers}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
