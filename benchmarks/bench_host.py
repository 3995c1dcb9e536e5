"""Benchmark: the host (Python) cost of one decode step's indexer, plugin vs vLLM, CPU-measured.

In vLLM's breakable-graph mode (its default for DeepSeek-V4.1 on ROCm) the indexer is an eager
break, so its Python runs at every decode step for each of the 8 index layers. This times that
Python alone, for the 8 layers of one step (plain 2/8/14, writer 20, readers 24-36), two ways in
one run on the same metadata:

- plugin: ``indexer.indexer_step``, the plugin's decode path, its hooks taking every call;
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

LAYERS = ((2, "plain"), (8, "plain"), (14, "plain"), (20, "writer"), (24, "reader"),
          (28, "reader"), (32, "reader"), (36, "reader"))  # fmt: skip


def _noop_vllm_ops(rocm, logits) -> None:
    """vLLM's device ops as no-ops: AITER's logits, the Triton candidate kernels, the C++ top-k."""
    from vllm.model_executor.layers import sparse_attn_indexer as sai

    rocm.rocm_fp8_paged_mqa_logits = lambda *a, **k: logits
    rocm._apply_candidate_mask_strided = lambda *a, **k: None
    sai._select_candidate_blocks = lambda *a, **k: None
    if not hasattr(torch.ops._C, "top_k_per_row_decode"):  # vllm._C is not built for the CPU
        lib = torch.library.Library("_C", "FRAGMENT")
        lib.define(
            "top_k_per_row_decode(Tensor logits, int next_n, Tensor seq_lens, Tensor(a!) out, "
            "int rows, int s0, int s1, int k) -> ()"
        )
        lib.impl("top_k_per_row_decode", lambda *a: None, "CPU")
        _noop_vllm_ops.lib = lib  # the registration lives as long as the library object


def _setup(rows: int, width: int):
    """The two sides' step functions over the same layers and metadata."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backends.mla.indexer import (
        DeepSeekV32IndexerDecodeMetadata,
        DeepseekV32IndexerMetadata,
    )
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    from dsv41_gfx942_plugin import indexer
    from dsv41_gfx942_plugin.ops import _launcher, topk

    kernels = {name: (lambda *args: None) for name in topk.KERNELS}
    topk._GPU_TYPE = "cpu"
    topk._kernels = lambda t: kernels
    topk._scratch = types.SimpleNamespace(get=lambda device, n: torch.empty(n, dtype=torch.int32))
    topk.build = lambda: True
    _launcher.stream_handle = lambda device: 0
    indexer._aiter_enabled = lambda: True
    logits = torch.zeros(rows, width)
    _noop_vllm_ops(rocm, logits)
    seq = torch.full((rows, 1), width, dtype=torch.int32)
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=torch.zeros(rows, 1, dtype=torch.int32), seq_lens=seq,
        decode_lens=torch.ones(rows, dtype=torch.int32), requires_padding=False,
        schedule_metadata=torch.zeros(1, dtype=torch.int32))  # fmt: skip
    meta = DeepseekV32IndexerMetadata(
        seq_lens=seq.view(-1), max_seq_len=width, slot_mapping=torch.zeros(rows, dtype=torch.long),
        num_decodes=rows, num_decode_tokens=rows, num_prefills=0, num_prefill_tokens=0,
        decode=decode)  # fmt: skip
    cands = torch.zeros(rows, 2048, dtype=torch.int32)
    layers = [types.SimpleNamespace(
        k_cache=types.SimpleNamespace(prefix=f"layers.{lid}",
                                      kv_cache=torch.zeros(1, 64, 132, dtype=torch.uint8)),
        topk_indices_buffer=torch.zeros(rows, 512, dtype=torch.int32), topk_tokens=512,
        max_model_len=width, max_total_seq_len=width, quant_block_size=128, scale_fmt="ue8m0",
        head_dim=128, compress_ratio=1, skip_k_cache_insert=True,
        candidate_blocks=None if kind == "plain" else cands, candidate_block_size=8,
        candidate_write=kind == "writer", dsv41_topk=True, dsv41_cand_logits=True)
        for lid, kind in LAYERS]  # fmt: skip
    context = types.SimpleNamespace(attn_metadata={x.k_cache.prefix: meta for x in layers},
                                    cudagraph_runtime_mode=CUDAGraphMode.NONE)  # fmt: skip
    indexer.get_forward_context = rocm.get_forward_context = lambda: context
    q = torch.zeros(rows, 32, 128)
    weights = torch.ones(rows, 32)

    def plugin():
        for x in layers:
            indexer.indexer_step(x, q, q, None, weights)

    def vllm():
        for x in layers:
            rocm.rocm_aiter_sparse_attn_indexer(
                q, x.k_cache.prefix, x.k_cache.kv_cache, q, None, weights, x.quant_block_size,
                x.scale_fmt, x.topk_tokens, x.head_dim, x.max_model_len, x.max_total_seq_len,
                x.topk_indices_buffer, skip_k_cache_insert=True, compress_ratio=1,
                candidate_blocks=x.candidate_blocks, candidate_block_size=8,
                candidate_write=x.candidate_write)  # fmt: skip

    return {"plugin": plugin, "vllm": vllm}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200, help="steps a round")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sides = _setup(rows=6, width=131072)
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
    print(f"host cost of one decode step, 8 index layers, 6 rows x 128k ({cpu}, median of "
          f"{args.rounds} rounds of {args.iters} steps):")  # fmt: skip
    for name, t in us.items():
        print(f"  {name:6s} {t:7.1f} us a step, {t / len(LAYERS):5.1f} us a layer")
    print(f"  plugin / vLLM: {us['plugin'] / us['vllm']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "us_per_step": us, "layers": len(LAYERS)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
