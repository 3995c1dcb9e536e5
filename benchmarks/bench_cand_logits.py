"""Candidate-only indexer logits against scoring every position of the row.

On gfx942 (MI300X/MI325X, AITER + vLLM installed) it times the plugin's hook
(`candidate_logits_top_k`: candidate logits + compact top-512) against vLLM's dense decode path
(AITER's dense logits + `_apply_candidate_mask_strided` + `top_k_per_row_decode`). Not run yet:
nobody on the project has the hardware.

Elsewhere (an NVIDIA H200 or H100) it times the portable twin on the 2048 x 8 candidate columns
against the same twin scoring every column of the row (candidates = all blocks), i.e. what
computing only the candidates saves with one kernel held fixed. These are that GPU's figures of
a test twin, never a gfx942 speed.

Each figure is the mean device time of one call, replaying a CUDA graph of it ``--iters`` times,
as vLLM replays its decode steps (host launch costs are in neither figure).

    python benchmarks/bench_cand_logits.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from _timing import graphed, mean_us, require_gpu, require_topk_kernels, summary, use_checkout

use_checkout()
from dsv41_gfx942_plugin.ops import cand_logits  # noqa: E402


def make_step(rows: int, context: int, heads: int, page_size: int, fp8: torch.dtype):
    """Random bytes in a strided cache (timing only), a shuffled block table, 2048 distinct
    candidate blocks of 8 per row."""
    dev = "cuda"
    pages = math.ceil(context / page_size)
    page_bytes = page_size * 132
    stride = page_bytes + 4096
    base = torch.randint(0, 120, (rows * pages * stride,), dtype=torch.uint8, device=dev)
    cache = base.as_strided((rows * pages, page_size, 1, 132), (stride, 132, 132, 1))
    table = torch.randperm(rows * pages, device=dev, dtype=torch.int32).view(rows, pages)
    q = torch.randn(rows, 1, heads, 128, device=dev).to(fp8)
    weights = torch.randn(rows, heads, device=dev)
    seq_lens = torch.full((rows, 1), context, dtype=torch.int32, device=dev)
    nblocks = context // 8
    cand = torch.stack([torch.randperm(nblocks, device=dev)[:2048] for _ in range(rows)])
    return q, cache, weights, seq_lens, table, cand.to(torch.int32)


def twin_ratio(rows, context, heads, page_size, iters):
    q, cache, weights, seq_lens, table, cand = make_step(
        rows, context, heads, page_size, torch.float8_e4m3fn
    )
    every = torch.arange(context // 8, device="cuda", dtype=torch.int32).repeat(rows, 1)

    def run(blocks):
        out = torch.empty(rows, blocks.shape[1] * 8, device="cuda")
        ids = torch.empty_like(out, dtype=torch.int32)
        args = (q.view(rows, heads, 128), cache, weights, seq_lens, 1, table, blocks, 8, out, ids)
        return lambda: cand_logits.candidate_logits(*args, portable=True)

    cand_us = mean_us(graphed(run(cand)), iters, warmup=10)
    dense_us = mean_us(graphed(run(every)), iters, warmup=10)
    return {"candidates_us": cand_us, "all_columns_us": dense_us, "ratio": dense_us / cand_us}


def gfx942_ratio(rows, context, heads, page_size, iters):
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import (
        _apply_candidate_mask_strided,
        paged_mqa_logits_module,
    )

    aiter = paged_mqa_logits_module()  # AITER's module where vLLM 0.33 finds it (either path)
    if aiter is None:
        raise SystemExit("bench_cand_logits.py: vLLM finds no AITER paged-MQA logits module")
    deepgemm_fp8_paged_mqa_logits = aiter.deepgemm_fp8_paged_mqa_logits
    q, cache, weights, seq_lens, table, cand = make_step(
        rows, context, heads, page_size, torch.float8_e4m3fnuz
    )
    width = context + 256
    logits = torch.empty(rows, width, device="cuda")
    indices = torch.empty(rows, 512, dtype=torch.int32, device="cuda")
    ends = seq_lens.view(-1).to(torch.int64)

    def dense():
        deepgemm_fp8_paged_mqa_logits(
            q, cache, weights, logits, seq_lens.view(-1), table, width,
            ChunkK=256, Preshuffle=True, KVBlockSize=page_size, WavePerEU=2,
        )  # fmt: skip
        _apply_candidate_mask_strided(logits, torch.zeros_like(ends), ends, cand, 8)
        torch.ops._C.top_k_per_row_decode(
            logits, 1, seq_lens, indices, rows, logits.stride(0), logits.stride(1), 512
        )

    def plugin():
        assert cand_logits.candidate_logits_top_k(
            q, cache, weights, seq_lens, table, cand, 8, indices, 512, True, False
        )

    plugin_us = mean_us(graphed(plugin), iters, warmup=10)
    dense_us = mean_us(graphed(dense), iters, warmup=10)
    return {"plugin_us": plugin_us, "vllm_dense_us": dense_us, "ratio": dense_us / plugin_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--rows", type=int, default=6)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--contexts", default="16384,32768,65536,131072")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    require_gpu("bench_cand_logits.py")
    arch = torch.cuda.get_device_properties(0)
    name = getattr(arch, "gcnArchName", "") or torch.cuda.get_device_name(0)
    on_gfx942 = torch.version.hip is not None and name.startswith("gfx942")
    if on_gfx942:  # the hook ends with the compact top-512: its code object must load
        require_topk_kernels("bench_cand_logits.py")
    measure = gfx942_ratio if on_gfx942 else twin_ratio
    results = []
    for context in (int(c) for c in args.contexts.split(",")):
        r = measure(args.rows, context, args.heads, args.page_size, args.iters)
        r.update(rows=args.rows, context=context, heads=args.heads, page_size=args.page_size)
        results.append(r)
        print(
            " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items())
        )
    what = "gfx942: hook vs vLLM dense path" if on_gfx942 else "portable twin: candidates vs all"
    report = {"device": name, "torch": torch.__version__, "measured": what, "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
