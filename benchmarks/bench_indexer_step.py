"""Benchmark: one DSv4.1 indexer decode step (the 8 index layers) on a GPU, the plugin's decode
path against vLLM's decode branch, both under CUDA graphs, in one run.

AITER's paged logits do not run off gfx942: both sides take the same precomputed random logits
(``tests/indexer_step.py``), so their cost is in neither figure. vLLM's C++
``top_k_per_row_decode`` runs for real where vLLM's compiled library loads (``vllm_top_k_loaded``:
its CUDA build on an NVIDIA GPU, the same source as its gfx942 kernel); elsewhere a torch
transcription of its contract stands in, and the output and the JSON say which. Figures are
for the machine it runs on: an H200 run is H200-measured, never a gfx942 figure.

    python benchmarks/bench_indexer_step.py --json out.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

from _timing import graphed, mean_us, require_gpu, require_topk_kernels, summary, use_checkout

use_checkout()

import indexer_step as harness  # noqa: E402


def graphed_us(fn) -> float:
    return mean_us(graphed(fn), 200, warmup=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    require_gpu("bench_indexer_step.py")
    require_topk_kernels("bench_indexer_step.py")
    top_k = (
        "vLLM's top_k_per_row_decode"
        if harness.vllm_top_k_loaded()
        else "torch stand-in (torch.topk)"
    )
    results = []
    print(f"GPU: {torch.cuda.get_device_name()}; vLLM's branch's top-k: {top_k}")
    print(f"{'rows x context':>16} {'plugin us':>10} {'vLLM branch us':>15} {'speed-up':>9}")
    for requests, next_n, width in ((1, 6, 32768), (1, 6, 131072), (8, 6, 131072)):
        step = harness.Step(requests, next_n, width)
        current = harness.install_stand_ins(harness.Patch(), step)
        ours, vllms = step.layers(), step.layers()
        t_plugin = graphed_us(functools.partial(harness.run_step, step, ours, current, True))
        t_vllm = graphed_us(functools.partial(harness.run_step, step, vllms, current, False))
        row = {"rows": step.rows, "context": width, "plugin_us": t_plugin, "vllm_us": t_vllm,
               "speedup": t_vllm / t_plugin}  # fmt: skip
        results.append(row)
        print(f"{step.rows:>6} x {width:>7} {t_plugin:>10.1f} {t_vllm:>15.1f} "
              f"{t_vllm / t_plugin:>8.2f}x")  # fmt: skip
    if args.json:
        report = {"gpu": torch.cuda.get_device_name(), "vllm_top_k": top_k, "results": results}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
