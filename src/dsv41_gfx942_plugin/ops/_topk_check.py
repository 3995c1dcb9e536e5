"""The top-k kernels' check at load time: each op once on a few fixed rows of the GPU at hand,
against torch, before any hook takes a call.

No gfx942 GPU has run the shipped code object yet. A kernel that loads but answers wrongly
there (a compiler's or the hardware's semantics that neither the CPU emulation nor the sm_90
build can show) would give vLLM wrong index sets without an error. ``topk.build`` runs
:func:`check` after loading and keeps every top-k hook off in the process when it fails, so
vLLM's ops run. The rows take the product's paths: register chunks with one and two merge
launches, the general path, a short row, 1-D causal lengths, candidates with -1 and repeated
ids, a compact row, layer 20's selection with a short row; their values lie on a grid of 0.25
(ties at every cut), every 7th is -inf and a few +inf. H200: 3.5 ms of GPU time, 14-15 ms a
check in all (the first, with the code object's load and torch's first launches, 0.9 s).
"""

from __future__ import annotations

import torch

from . import topk

K = 512
BLOCK = 8  # the candidate block size


def _grid_rows(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    f32 = dict(dtype=torch.float32, device=gen.device)  # vLLM builds models under a bf16 default
    x = torch.randn(rows, width, generator=gen, **f32).mul_(4).round_().div_(4)
    x[:, ::7] = float("-inf")
    x[:, 5::4099] = float("inf")
    return x


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.sort().values, b.sort().values)


def _top_row_ok(got: torch.Tensor, values: torch.Tensor, cols: torch.Tensor, k: int) -> bool:
    """``got`` (k ids, then -1) holds the columns ``cols`` of the k largest ``values`` (as a
    multiset of values: ties at the cut may pick any of them); fewer than k: all, then -1."""
    n = min(k, values.numel())
    taken, rest = got[:n].long(), got[n:]
    if not bool((rest == -1).all()) or taken.unique().numel() != n:
        return False
    pos = torch.searchsorted(cols, taken).clamp(max=max(cols.numel() - 1, 0))
    if n and not torch.equal(cols[pos], taken):  # an id that is not one of the columns
        return False
    return _same_values(values[pos], values.topk(n).values)


def _decode_ok(x, next_n, seq_lens, idx) -> str | None:
    rows, width = x.shape
    lens = seq_lens.view(-1).tolist()
    for r in range(rows):
        causal = lens[r // next_n] - next_n + r % next_n + 1
        end = max(0, min(causal if seq_lens.dim() == 1 else lens[r], width))
        row = idx[r]
        if end <= K:
            want = torch.full((K,), -1, dtype=row.dtype, device=row.device)
            want[:end] = torch.arange(end, device=row.device)
            if not torch.equal(row, want):
                return f"row {r} (end {end})"
        elif not _top_row_ok(row, x[r, :end], torch.arange(end, device=x.device), K):
            return f"row {r} (end {end})"
    return None


def check(device: torch.device) -> str | None:
    """None when every op gives torch's answer on ``device``, else what differed."""
    gen = torch.Generator(device=device).manual_seed(20261202)
    i32 = dict(dtype=torch.int32, device=device)
    chunk = topk.CHUNK
    # Decode: 41 chunks a row (two merge launches), rows ending after 1 / 5.x / 9 chunks / short.
    x = _grid_rows(gen, 4, 41 * chunk)
    lens = torch.tensor([[41 * chunk], [5 * chunk + 3], [300], [9 * chunk]], **i32)
    for register in (True, False):
        idx = torch.full((4, K), -7, **i32)
        topk.top_k_per_row_decode_512(x, 1, lens, idx, register_select=register)
        bad = _decode_ok(x, 1, lens, idx)
        if bad:
            return f"decode top-512 ({'register' if register else 'general'} path): {bad}"
    y = _grid_rows(gen, 4, 2 * chunk)
    lens1 = torch.tensor([2 * chunk, 1000], **i32)  # 1-D: one a request, next_n 2, causal
    idx = torch.full((4, K), -7, **i32)
    if not topk.decode_top_k(y, 2, lens1, idx, K):
        return "decode top-512 declined 1-D lengths"
    if bad := _decode_ok(y, 2, lens1, idx):
        return f"decode top-512 (1-D lengths): {bad}"

    # Candidate top-k (layers 24-36): 2048 blocks a row, some -1, some repeated.
    width = 2048 * 8 * BLOCK
    z = _grid_rows(gen, 2, width)
    cands = torch.stack([torch.randperm(width // BLOCK, generator=gen, device=device)[:2048]
                         for _ in range(2)]).int()  # fmt: skip
    cands[:, ::9] = -1
    cands[:, 100:150] = cands[:, 300:350]
    lens = torch.tensor([[width], [width - 12345]], **i32)
    idx = torch.full((2, K), -7, **i32)
    if not topk.candidate_top_k(z, 1, lens, cands, BLOCK, idx, K):
        return "candidate top-k declined"
    for r, end in enumerate(lens.view(-1).tolist()):
        blocks = cands[r][cands[r] >= 0].unique().long()
        cols = (blocks[:, None] * BLOCK + torch.arange(BLOCK, device=device)).flatten()
        cols = cols[cols < end].sort().values
        if not _top_row_ok(idx[r], z[r, cols], cols, K):
            return f"candidate top-k: row {r}"

    # Compact top-k: 16384 entries of distinct ids, some -1.
    v = _grid_rows(gen, 2, 16384)
    ids = torch.randperm(1 << 20, generator=gen, device=device)[: 2 * 16384].view(2, -1).int()
    ids[:, 3::11] = -1
    idx = torch.full((2, K), -7, **i32)
    if not topk.compact_top_k_512(v, ids, lens, 1, idx):
        return "compact top-k declined"
    for r in range(2):
        live = ids[r] >= 0
        cols, order = ids[r][live].long().sort()
        if not _top_row_ok(idx[r], v[r][live][order], cols, K):
            return f"compact top-k: row {r}"

    # Layer 20's selection: the top 2048 block scores, the newest block pinned to +inf.
    ends = torch.tensor([width, 70001], **i32)
    out = torch.full((2, 2048), -7, **i32)
    if not topk.select_candidates(z, 1, ends, BLOCK, out):
        return "candidate selection declined"
    for r, end in enumerate(ends.tolist()):
        live = torch.full((width,), float("-inf"), dtype=torch.float32, device=device)
        live[:end] = z[r, :end]
        scores = live.view(-1, BLOCK).amax(-1)
        scores[(end - 1) // BLOCK] = float("inf")
        blocks = torch.nonzero(scores != float("-inf")).flatten()
        if not _top_row_ok(out[r], scores[blocks], blocks, 2048):
            return f"candidate selection: row {r}"
    return None
