"""Measured references beside ``bench_markov.py``'s modelled memory floor, 5 draft steps graphed:

- ``stream``: the bytes a step must move, moved by torch: a reduction over ``markov_w2`` (read
  once) and a copy of the rows' base logits into the draft logits cache (read and written once),
  two kernels a step. What torch's kernels take to move them, not a lower bound: the reduction
  falls short of the bandwidth, and the fused step (which moves the same bytes and does the
  arithmetic) beats it up to 64 rows on the H200 and the H100 (not at 128 and 256).
- ``noise``: vLLM's fp32 Gumbel noise alone (``murmur3_uniform32``, ``_log1p_neg_stable``, the
  two logs, from ``vllm/v1/worker/gpu/sample/gumbel.py``) for every (row, token) of a step, with
  the argmax of each row: one launch a step, no logits, no memory traffic but the winners (for
  timing only: nobody reads them). What the exact noise costs to issue, whatever the memory
  does. ``noise(..., fast_log=...)`` takes the fast noise of the plugin's large batches instead
  (``_markov_math._noise32``: the same hash, the hardware's log2): what that costs to issue, the
  floor of a sampled step kernel that draws every token's noise that way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from vllm.v1.worker.gpu.sample.gumbel import murmur3_uniform32, spec_step_seed

from dsv41_gfx942_plugin.ops._markov_math import _noise32

# Tokens a program: one row a program, so the noise's per-row part (seed and position hashed) is
# computed once a program and every token pays only its own part (the fairest floor).
TOKENS_A_BLOCK = 1024


@triton.jit
def _noise_kernel(seeds_ptr, win_ptr, vocab, step, BV: tl.constexpr, FAST_LOG: tl.constexpr):
    r = tl.program_id(0)
    v = tl.program_id(1) * BV + tl.arange(0, BV)
    seed = spec_step_seed(tl.load(seeds_ptr + r), step)
    u = murmur3_uniform32(seed, r + 1000, v)
    y = tl.where(v < vocab, _noise32(u, FAST_LOG), float("-inf"))
    best, at = tl.max(y, axis=0, return_indices=True, return_indices_tie_break_left=True)
    key = (best.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (tl.program_id(1) * BV + at)
    tl.atomic_max(win_ptr + r, key)


def stream(spec, rows: int, base3: torch.Tensor, w2: torch.Tensor):
    """The step's memory traffic done by torch, for each of the steps."""
    sink = torch.empty((), dtype=torch.float32, device=w2.device)
    flat = w2.view(-1)
    cache = spec.draft_logits

    def run():
        for step in range(base3.shape[1]):
            torch.sum(flat, 0, dtype=torch.float32, out=sink)
            cache[:rows, step].copy_(base3[:, step])

    return run


def noise(spec, rows: int, base3: torch.Tensor, fast_log: str = ""):
    """vLLM's Gumbel noise (or with ``fast_log`` its fast approximation) and a row argmax over
    every (row, token), for each of the steps."""
    vocab = base3.shape[2]
    win = torch.empty(rows, dtype=torch.int64, device=base3.device)
    grid = (rows, triton.cdiv(vocab, TOKENS_A_BLOCK))

    def run():
        for step in range(base3.shape[1]):
            _noise_kernel[grid](spec.seeds, win, vocab, step, BV=TOKENS_A_BLOCK, FAST_LOG=fast_log)

    return run
