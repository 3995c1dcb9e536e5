"""A search for inputs on which the fused Markov path's fast noise is wrong (tests only).

Imported by the tests that use it, when they run (not at collection), so that its kernel is
decorated under the Triton interpreter when the CPU tests turned it on.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from vllm.v1.worker.gpu.sample.gumbel import (
    _DRAFT_NOISE_SALT,
    murmur3_uniform32,
    murmur3_uniform64,
    spec_step_seed,
)

from dsv41_gfx942_plugin.ops import _markov_math as M


@triton.jit
def _noises(exact_ptr, fast_ptr, seeds_ptr, req, pos, vocab, FAST_LOG: tl.constexpr):
    v = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    u = murmur3_uniform32(spec_step_seed(tl.load(seeds_ptr + req), 0), pos, v)
    tl.store(exact_ptr + v, M._noise32(u, ""), mask=v < vocab)
    tl.store(fast_ptr + v, M._noise32(u, FAST_LOG), mask=v < vocab)


@triton.jit
def _noises64(out_ptr, seeds_ptr, req, pos, vocab):
    v = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    u = murmur3_uniform64(spec_step_seed(tl.load(seeds_ptr + req), 0), pos, v)
    tl.store(out_ptr + v, -tl.log(-tl.log(u)), mask=v < vocab)


def _row_key(spec, row: int) -> tuple[int, int]:
    """Row ``row``'s request and salted position at its first draft step, as the step kernel
    keys the noise."""
    at = row * spec.num_speculative_steps
    return int(spec.sample_idx_mapping[at]), int(spec.sample_pos[at]) - 1 + _DRAFT_NOISE_SALT.value


def row_noises(spec, row: int, vocab: int, fast_log: str = ""):
    """vLLM's noise and the fast noise (``fast_log``; vLLM's again for "") of every token at row
    ``row``'s first draft step: two fp32 tensors on the CPU."""
    exact = torch.empty(vocab, device=spec.seeds.device)
    fast = torch.empty_like(exact)
    grid = (triton.cdiv(vocab, 1024),)
    _noises[grid](exact, fast, spec.seeds, *_row_key(spec, row), vocab, fast_log)
    return exact.cpu(), fast.cpu()


def row_noises64(spec, row: int, vocab: int):
    """vLLM's fp64 noise (``use_fp64_gumbel``) of every token at row ``row``'s first draft step,
    on the CPU."""
    out = torch.empty(vocab, dtype=torch.float64, device=spec.seeds.device)
    _noises64[(triton.cdiv(vocab, 1024),)](out, spec.seeds, *_row_key(spec, row), vocab)
    return out.cpu()


def swapped_pair(spec, vocab: int, bv: int, fast_log: str):
    """Two tokens ``a < b`` in different vocabulary blocks of ``bv`` tokens whose fast noises
    (``fast_log``) order them the other way round than vLLM's noise does, at the first row's
    first draft step, and vLLM's winner between them when their logits are equal; None when that
    row has no such pair."""
    exact, fast = row_noises(spec, 0, vocab, fast_log)
    order = torch.argsort(exact, descending=True, stable=True)  # neighbours in vLLM's order
    a, b = torch.minimum(order[:-1], order[1:]), torch.maximum(order[:-1], order[1:])
    swapped = (a // bv != b // bv) & ((exact[a] >= exact[b]) != (fast[a] >= fast[b]))
    if not swapped.any():
        return None
    i = int(swapped.nonzero()[0])
    a, b = int(a[i]), int(b[i])
    return a, b, a if exact[a] >= exact[b] else b
