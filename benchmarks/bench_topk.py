"""Plugin top-512 kernels against vLLM's ops and torch.topk, per shape, in one run; prints
ratios, writes JSON.

    python benchmarks/bench_topk.py [--json PATH] [--iters N] [--structures]

Each figure is the mean device time of one call, measured by replaying a CUDA graph that holds
``--iters`` calls (the baselines' graphs ``max(iters // 5, 4)``; so launch overhead on the host
is excluded for both sides), after warm-up.
"eager" is the mean of back-to-back eager calls (host cost included). "floor": the same
launches over the same bytes with no selection (``_topk_floors.py``), timed the same way; the
plugin's time above it is its selecting. Two baselines, "vLLM" (vLLM 0.33.0's own ops: its
C++ ``top_k_per_row_decode`` where its compiled library loads,
``indexer_step.vllm_top_k_loaded``, else a dash) and "torch":
- decode: vLLM's top-k over the row up to its end; ``torch.topk(..., 512, sorted=False)`` over
  the row (set to -inf past its end beforehand). "ragged" rows end at seeded random lengths
  from half the width to all of it, as decode rows do; "recency" rows have their newest 4096
  logits raised by 3 (attention to recent tokens);
- candidate top-k: vLLM's decode mask (``_apply_candidate_mask_strided``, Triton, in place on
  its own copy of the logits, as on its logits buffer) plus its top-k; torch's mask of the
  non-candidate columns to -inf (a fill, a gather and a scatter) plus topk;
- compact: vLLM's top-k and torch.topk over the compact row (vLLM has no compact path: its
  readers mask the whole row, the candidate top-k above);
- candidate selection: vLLM's ``select_candidate_blocks`` (Triton block scores, torch.topk,
  Triton store; its DeepSelect path is SM100-only); torch's block max (amax), the newest-block
  pin, topk(2048).
``--structures`` times the decode top-512 on rows with structure instead (``STRUCTURES``: ties
at the cut, -inf or one value everywhere, monotone rows, clusters; ``benchmarks/topk_sweeps.md``).
On an NVIDIA H200 these are H200-measured figures, never gfx942 ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from _timing import graphed, mean_us, require_gpu, require_topk_kernels, summary, use_checkout

use_checkout()
import _topk_floors as floors  # noqa: E402
from dsv41_gfx942_plugin.ops import topk  # noqa: E402
from indexer_step import vllm_top_k_loaded  # noqa: E402

DEV = "cuda"


def taken(hook, name):
    """``hook`` as a callable that fails loudly when the plugin declines: a declined call writes
    nothing, so a graph of it would time an empty replay."""

    def run():
        if not hook():
            raise SystemExit(f"bench_topk.py: the plugin declined {name}: nothing to time")

    return run


def graph_time_us(fn, iters: int) -> float:
    """Mean device time of fn() over a CUDA graph of ``iters`` calls, replayed 5 times."""
    return mean_us(graphed(fn, iters), 5, warmup=1) / iters


def masked(x: torch.Tensor) -> torch.Tensor:
    """7 of every 8 blocks of 8 columns at -inf (a candidate-masked row)."""
    keep = torch.rand(x.shape[0], -(-x.shape[1] // 8), device=DEV) < 0.125
    return x.masked_fill(~keep.repeat_interleave(8, 1)[:, : x.shape[1]], float("-inf"))


def vllm_decode(x, seq, idx):
    """vLLM's top-512 of ``x`` up to the ends ``seq`` as a callable, or None where it is absent."""
    if not vllm_top_k_loaded():
        return None
    op = torch.ops._C.top_k_per_row_decode
    return lambda: op(x, 1, seq, idx, x.shape[0], x.stride(0), x.stride(1), 512)


def decode_case(name, x, seq, seen=None):
    """(name, plugin, vLLM baseline or None, torch baseline, floor) for the decode top-512 of
    ``x`` with row ends ``seq``; torch takes the top 512 of ``seen`` (the rows as vLLM's op sees
    them), else ``x``."""
    seen = x if seen is None else seen
    idx = torch.empty(x.shape[0], 512, dtype=torch.int32, device=DEV)

    def plugin():
        return topk.decode_top_k(x, 1, seq, idx, 512)

    def base():
        torch.topk(seen, 512, dim=-1, sorted=False)

    return name, plugin, vllm_decode(x, seq, idx.clone()), base, floors.decode(x, seq)


def full(rows: int, width: int) -> torch.Tensor:
    return torch.full((rows, 1), width, dtype=torch.int32, device=DEV)


def decode_cases():
    for rows, width in [(6, 16384), (6, 131072), (6, 1 << 20), (32, 131072), (32, 1 << 20)]:
        for kind in ("dense", "masked"):
            x = torch.randn(rows, width, device=DEV)
            if kind == "masked":
                x = masked(x)
            yield decode_case(f"decode {kind} {rows}x{width}", x, full(rows, width))
    yield from ragged_cases()
    yield from recency_cases()


def ragged_cases():
    gen = torch.Generator(device=DEV).manual_seed(5)
    for rows, width in [(6, 131072), (32, 131072), (32, 1 << 20)]:
        x = torch.randn(rows, width, device=DEV)
        seq = torch.randint(width // 2, width + 1, (rows, 1), device=DEV, generator=gen)
        seq = seq.to(torch.int32)
        cut = x.masked_fill(torch.arange(width, device=DEV) >= seq, float("-inf"))
        yield decode_case(f"decode ragged {rows}x{width}", x, seq, cut)


def recent(x: torch.Tensor) -> torch.Tensor:
    """The newest 4096 logits of each row raised by 3, as attention to recent tokens raises them:
    the last chunk holds most of the top 512 (with the interleaved groups about 650 of its keys
    pass its floor, within its superset's 1,024 slots; with consecutive groups about 1,750 did,
    and it cut its superset with a radix pass)."""
    return torch.cat([x[:, :-4096], x[:, -4096:] + 3.0], 1)


def recency_cases():
    for rows, width in [(6, 131072), (32, 1 << 20)]:
        x = recent(torch.randn(rows, width, device=DEV))
        yield decode_case(f"decode recency {rows}x{width}", x, full(rows, width))


# Decode rows with structure, from N(0, 1) rows x (seeded generator g).
STRUCTURES = {
    "random": lambda x, g: x,
    "ReLU of random": lambda x, g: x.relu(),
    "rounded to bf16": lambda x, g: x.bfloat16().float(),
    "masked": lambda x, g: masked(x),
    "newest 4096 +3": lambda x, g: recent(x),
    "600 at a third +6": lambda x, g: x.index_add(
        1, torch.arange(600, device=DEV) + x.shape[1] // 3, torch.full_like(x[:, :600], 6.0)
    ),
    "grid of 0.25": lambda x, g: (x * 4).round() / 4,
    "95% zeros": lambda x, g: x.masked_fill(
        torch.rand(x.shape, device=DEV, generator=g) < 0.95, 0.0
    ),
    "all -inf": lambda x, g: torch.full_like(x, float("-inf")),
    "one value": lambda x, g: torch.full_like(x, 1.5),
    "ascending": lambda x, g: torch.arange(x.shape[1], device=DEV) + x / 10,
    "descending": lambda x, g: (torch.arange(x.shape[1], device=DEV) + x / 10).flip(-1),
}


def structure_cases():
    gen = torch.Generator(device=DEV).manual_seed(3)
    for rows, width in [(6, 131072), (32, 1 << 20)]:
        for name, make in STRUCTURES.items():
            x = make(torch.randn(rows, width, device=DEV, generator=gen), gen).contiguous()
            yield decode_case(f"decode {name} {rows}x{width}", x, full(rows, width))


def candidate_cases():
    try:  # vLLM's Python ops; without vLLM the vLLM column shows a dash
        from vllm.model_executor.kernels.attention.dsa.candidate_blocks import (
            select_candidate_blocks,
        )
        from vllm.v1.attention.ops.rocm_aiter_mla_sparse import _apply_candidate_mask_strided
    except ImportError:
        select_candidate_blocks = _apply_candidate_mask_strided = None

    rows, width, bs, k = 6, 131072, 8, 2048
    x = torch.randn(rows, width, device=DEV)
    seq = full(rows, width)
    cands = torch.stack([torch.randperm(width // bs, device=DEV)[:k] for _ in range(rows)]).int()
    idx = torch.empty(rows, 512, dtype=torch.int32, device=DEV)
    cols = (cands.long()[:, :, None] * bs + torch.arange(bs, device=DEV)).view(rows, -1)
    work = torch.empty_like(x)

    def plugin():
        return topk.candidate_top_k(x, 1, seq, cands, bs, idx, 512)

    def base():
        work.fill_(float("-inf"))
        work.scatter_(1, cols, x.gather(1, cols))
        torch.topk(work, 512, dim=-1, sorted=False)

    ends = seq.view(-1).long()
    masked_copy = x.clone()
    top = vllm_decode(masked_copy, seq, idx.clone())

    def vllm_base():
        _apply_candidate_mask_strided(masked_copy, torch.zeros_like(ends), ends, cands, bs)
        top()

    name = f"candidate top-k {rows}x{k}x{bs} of {width}"
    vllm_base = vllm_base if top and _apply_candidate_mask_strided else None
    yield name, plugin, vllm_base, base, floors.candidate(x, cands, bs)

    ids = torch.arange(rows * k * bs, device=DEV, dtype=torch.int32).view(rows, -1)
    compact = torch.randn(rows, k * bs, device=DEV)

    def plugin_c():
        return topk.compact_top_k_512(compact, ids, seq, 1, idx)

    def base_c():
        torch.topk(compact, 512, dim=-1, sorted=False)

    vllm_c = vllm_decode(compact, full(rows, k * bs), idx.clone())
    yield f"compact top-k {rows}x{k * bs}", plugin_c, vllm_c, base_c, floors.compact(compact, ids)

    out, vllm_out = (torch.empty(rows, k, dtype=torch.int32, device=DEV) for _ in range(2))
    ends32 = ends.int()

    def plugin_s():
        return topk.select_candidates(x, 1, ends32, bs, out)

    def vllm_s():
        select_candidate_blocks(x, torch.zeros_like(ends), ends, k, bs, vllm_out)

    def base_s():
        scores = x.view(rows, -1, bs).amax(-1)
        scores[:, -1] = float("inf")
        top = torch.topk(scores, k, dim=-1)
        torch.where(top.values != float("-inf"), top.indices, -1)

    name = f"candidate selection {rows}x{width}"
    vllm_s = vllm_s if select_candidate_blocks else None
    yield name, plugin_s, vllm_s, base_s, floors.selection(x, ends32, bs, k)


def main() -> int:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--structures", action="store_true", help="rows with structure instead")
    args = parser.parse_args()
    require_gpu("bench_topk.py")
    require_topk_kernels("bench_topk.py")
    torch.manual_seed(0)
    results = []
    top_k = "vLLM's top_k_per_row_decode" if vllm_top_k_loaded() else "absent (vLLM us: -)"
    print(f"{torch.cuda.get_device_name()} (torch {torch.__version__}); vLLM's top-k: {top_k}")
    print(
        f"{'shape':44s} {'plugin us':>10s} {'floor us':>9s} {'/floor':>7s} {'vLLM us':>9s}"
        f" {'ratio':>7s} {'torch us':>9s} {'ratio':>7s} {'eager us':>9s}"
    )
    cases = structure_cases() if args.structures else [*decode_cases(), *candidate_cases()]
    for name, plugin, vllm, base, floor in cases:
        plugin = taken(plugin, name)
        p = graph_time_us(plugin, args.iters)
        f = graph_time_us(floor, args.iters)
        v = graph_time_us(vllm, max(args.iters // 5, 4)) if vllm else None
        b = graph_time_us(base, max(args.iters // 5, 4))
        e = mean_us(plugin, args.iters)
        results.append({"shape": name, "plugin_us": p, "floor_us": f, "vllm_us": v,
                        "vllm_speedup": v and v / p, "torch_us": b, "speedup": b / p,
                        "plugin_eager_us": e})  # fmt: skip
        vs = f"{v:9.2f} {v / p:6.1f}x" if v else f"{'-':>9s} {'-':>7s}"
        print(f"{name:44s} {p:10.2f} {f:9.2f} {p / f:6.2f}x {vs} {b:9.2f} {b / p:6.1f}x {e:9.2f}")
    if args.json:
        report = {"device": torch.cuda.get_device_name(), "vllm_top_k": top_k, "results": results}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
