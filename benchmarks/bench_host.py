"""Benchmark: the host (Python) cost of the plugin's indexer decode path, CPU-measured.

In vLLM's breakable-graph mode (its default for DeepSeek-V4.1 on ROCm) the indexer is an eager
break, so its Python runs at every decode step for each of the 8 index layers. This times that
Python alone: ``indexer.indexer_step`` for the 8 layers of one step (plain 2/8/14, writer 20,
readers 24-36), with every kernel launch replaced by a no-op recorder and AITER's logits by a
precomputed tensor, so only host work is left (choices, hook gating, argument packing).
vLLM's own decode branch has Python of the same kind around its launches; this figure is the
plugin's share, not a comparison. Run where vLLM imports (the CPU is enough)::

    CUDA_VISIBLE_DEVICES= python benchmarks/bench_host.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import types
from pathlib import Path

import torch

LAYERS = ((2, "plain"), (8, "plain"), (14, "plain"), (20, "writer"), (24, "reader"),
          (28, "reader"), (32, "reader"), (36, "reader"))  # fmt: skip


def _setup(rows: int, width: int):
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
    rocm.rocm_fp8_paged_mqa_logits = lambda *a, **k: logits
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
        max_model_len=width, compress_ratio=1, skip_k_cache_insert=True,
        candidate_blocks=None if kind == "plain" else cands, candidate_block_size=8,
        candidate_write=kind == "writer", dsv41_topk=True, dsv41_cand_logits=True)
        for lid, kind in LAYERS]  # fmt: skip
    context = types.SimpleNamespace(attn_metadata={x.k_cache.prefix: meta for x in layers},
                                    cudagraph_runtime_mode=CUDAGraphMode.NONE)  # fmt: skip
    indexer.get_forward_context = lambda: context
    q = torch.zeros(rows, 32, 128)
    weights = torch.ones(rows, 32)
    return indexer, layers, q, weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    indexer, layers, q, weights = _setup(rows=6, width=131072)

    def step():
        for layer in layers:
            indexer.indexer_step(layer, q, q, None, weights)

    for _ in range(50):
        step()
    start = time.perf_counter()
    for _ in range(args.iters):
        step()
    us = (time.perf_counter() - start) / args.iters * 1e6
    cpu = platform.processor() or platform.machine()
    print(f"host cost of one decode step, 8 index layers, 6 rows x 128k ({cpu}): "
          f"{us:.1f} us a step, {us / len(layers):.1f} us a layer")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "us_per_step": us, "layers": len(layers)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
