"""A floor beside each of ``bench_topk.py``'s plugin figures: the same launches, grids and
workgroup sizes over the same bytes, with no selection. Triton kernels read what the plugin's
kernels read (each row's end, the logits, a chunk's candidates, candidate block ids), reduce it
so that no load can be dropped, and write what the plugin writes (a chunk's candidate slots of
keys and ids, 512 or 2048 ids a row). A plugin figure is then this floor plus the time its
kernels spend selecting; a target below a shape's floor is out of reach of that launch
structure here.

The structures, as ``ops/topk.py`` launches them:
- decode: one program a 16384-logit chunk of a row (512 threads); rows of more than one chunk
  write each chunk's ``CHUNK_SLOTS`` candidate slots to scratch, and a merge launch, one
  program for every ``MERGE_UNITS`` chunks of a row, reads theirs and writes the row's 512 ids
  (one program a row) or its own slots for a second merge launch, one program a row;
- candidate top-k: one program a row reads its 2048 block ids and the 8 columns of each;
- compact top-k: one program a row reads 16384 logits and their ids;
- candidate selection: one launch, one program a row (1024 threads) reads the whole row and
  writes 2048 block ids (one launch and no traffic between workgroups put a row's every logit
  through one workgroup), streaming it in 1-D tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv41_gfx942_plugin.ops.topk import CHUNK, CHUNK_SLOTS, MERGE_UNITS, THREADS, TOPK

# Logits a tile of the selection floor's row stream (see selection()).
SELECT_TILE = 16384


def _warps(kernel: str, t: torch.Tensor) -> int:
    """Triton's num_warps for the workgroup size of the plugin's ``kernel`` on t's device."""
    return THREADS[kernel] // torch.cuda.get_device_properties(t.device).warp_size


@triton.jit
def _chunk_floor(x, stride, seq, keys, ids, out, width, nchunks, CHUNK: tl.constexpr,
                 K: tl.constexpr, SLOTS: tl.constexpr, DIRECT: tl.constexpr):  # fmt: skip
    c, r = tl.program_id(0), tl.program_id(1)
    end = tl.minimum(tl.load(seq + r), width)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    v = tl.load(x + r.to(tl.int64) * stride + cols, mask=cols < end, other=float("-inf"))
    top = tl.max(v, 0)
    if DIRECT:
        j = tl.arange(0, K)
        tl.store(out + r * K + j, tl.where(top > 0, j, -1))
    else:
        j = tl.arange(0, SLOTS)
        slot = (r * nchunks + c) * SLOTS + j
        tl.store(keys + slot, top + j)
        tl.store(ids + slot, c * CHUNK + j)


@triton.jit
def _merge_floor(keys, ids, keys2, ids2, out, units, groups, UNITS: tl.constexpr,
                 K: tl.constexpr, SLOTS: tl.constexpr, DIRECT: tl.constexpr):  # fmt: skip
    g, r = tl.program_id(0), tl.program_id(1)
    u = g * UNITS + tl.arange(0, UNITS)[:, None]
    slot = (r * units + u) * SLOTS + tl.arange(0, SLOTS)[None, :]
    live = u < units
    k = tl.load(keys + slot, mask=live, other=float("-inf"))
    i = tl.load(ids + slot, mask=live, other=-1)
    best = tl.max(tl.where(k > 0, i, -1), 0)
    if DIRECT:
        tl.store(out + r * K + tl.arange(0, K), tl.max(tl.reshape(best, [K, SLOTS // K]), 1))
    else:
        mine = (r * groups + g) * SLOTS + tl.arange(0, SLOTS)
        tl.store(keys2 + mine, tl.max(k, 0))
        tl.store(ids2 + mine, best)


@triton.jit
def _candidate_floor(x, stride, cand, out, NB: tl.constexpr, BS: tl.constexpr, K: tl.constexpr):
    r = tl.program_id(0)
    block = tl.load(cand + r * NB + tl.arange(0, NB))
    cols = block[:, None] * BS + tl.arange(0, BS)[None, :]
    v = tl.load(x + r.to(tl.int64) * stride + cols, mask=block[:, None] >= 0, other=float("-inf"))
    top = tl.max(tl.reshape(tl.max(v, 1), [K, NB // K]), 1)
    tl.store(out + r * K + tl.arange(0, K), tl.where(top > 0, tl.arange(0, K), -1))


@triton.jit
def _compact_floor(x, ids, out, N: tl.constexpr, K: tl.constexpr):
    r = tl.program_id(0)
    v = tl.load(x + r * N + tl.arange(0, N))
    i = tl.load(ids + r * N + tl.arange(0, N))
    best = tl.max(tl.reshape(tl.where(v > 0, i, -1), [K, N // K]), 1)
    tl.store(out + r * K + tl.arange(0, K), best)


@triton.jit
def _select_floor(x, stride, seq, out, width, TILE: tl.constexpr, K: tl.constexpr):
    r = tl.program_id(0)
    end = tl.minimum(tl.load(seq + r), width)
    top = tl.full([TILE], float("-inf"), tl.float32)
    row = x + r.to(tl.int64) * stride
    full = end // TILE * TILE
    for c in tl.range(0, full, TILE, num_stages=1):  # unmasked: 16-byte loads
        top = tl.maximum(top, tl.load(row + c + tl.arange(0, TILE)))
    cols = full + tl.arange(0, TILE)
    top = tl.maximum(top, tl.load(row + cols, mask=cols < end, other=float("-inf")))
    best = tl.max(tl.reshape(top, [K, TILE // K]), 1)
    tl.store(out + r * K + tl.arange(0, K), tl.where(best > 0, tl.arange(0, K), -1))


def decode(x: torch.Tensor, seq: torch.Tensor):
    """The decode top-512's launches over ``x`` [rows, width] with row ends ``seq`` [rows]."""
    rows, width = x.shape
    nchunks = triton.cdiv(width, CHUNK)
    groups = triton.cdiv(nchunks, MERGE_UNITS)
    keys = torch.empty(rows * (nchunks + groups) * CHUNK_SLOTS, device=x.device)
    ids = torch.empty(keys.shape, dtype=torch.int32, device=x.device)
    keys2, ids2 = keys[rows * nchunks * CHUNK_SLOTS :], ids[rows * nchunks * CHUNK_SLOTS :]
    out = torch.empty(rows, TOPK, dtype=torch.int32, device=x.device)
    seq = seq.reshape(-1)
    chunk_warps = _warps("dsv_topk512_chunks", x)
    merge = dict(UNITS=MERGE_UNITS, K=TOPK, SLOTS=CHUNK_SLOTS)
    merge["num_warps"] = _warps("dsv_topk512_merge", x)

    def run():
        _chunk_floor[(nchunks, rows)](
            x, x.stride(0), seq, keys, ids, out, width, nchunks,
            CHUNK=CHUNK, K=TOPK, SLOTS=CHUNK_SLOTS, DIRECT=nchunks == 1, num_warps=chunk_warps,
        )  # fmt: skip
        if nchunks > 1:
            _merge_floor[(groups, rows)](
                keys, ids, keys2, ids2, out, nchunks, groups, DIRECT=groups == 1, **merge
            )
        if groups > 1:
            _merge_floor[(1, rows)](keys2, ids2, keys, ids, out, groups, 1, DIRECT=True, **merge)

    return run


def candidate(x: torch.Tensor, cands: torch.Tensor, block_size: int):
    """The candidate top-k's launch: ``cands`` [rows, 2048] block ids of ``x``'s rows."""
    out = torch.empty(x.shape[0], TOPK, dtype=torch.int32, device=x.device)
    grid, nb = (x.shape[0],), cands.shape[1]
    warps = _warps("dsv_topk512_candidates", x)

    def run():
        _candidate_floor[grid](
            x, x.stride(0), cands, out, NB=nb, BS=block_size, K=TOPK, num_warps=warps
        )

    return run


def compact(x: torch.Tensor, ids: torch.Tensor):
    """The compact top-512's launch over ``x`` [rows, n] and its ids."""
    out = torch.empty(x.shape[0], TOPK, dtype=torch.int32, device=x.device)
    warps = _warps("dsv_topk512_compact", x)

    def run():
        _compact_floor[(x.shape[0],)](x, ids, out, N=x.shape[1], K=TOPK, num_warps=warps)

    return run


def selection(x: torch.Tensor, seq: torch.Tensor, block_size: int, k: int):
    """Layer 20's selection launch: each row of ``x`` read through one program, ``k`` ids
    written. The row streams through in 1-D tiles of ``SELECT_TILE`` logits, unmasked but the
    last (a mask on every tile costs the 16-byte loads): H200, 6 x 128k, 1024 threads, graph of
    50 calls, 4.53 us (rows of 128k and 100k alternating: 4.50), where 2-D tiles of 2048 blocks x
    8 (this floor until then) took 12.05-12.24 and every tile masked 9.98 (``block_size`` does
    not change the bytes)."""
    rows, width = x.shape
    out = torch.empty(rows, k, dtype=torch.int32, device=x.device)
    warps = _warps("dsv_select_blocks", x)

    def run():
        _select_floor[(rows,)](
            x, x.stride(0), seq, out, width, TILE=max(SELECT_TILE, k), K=k, num_warps=warps
        )

    return run
