"""Exact torch references for ops/topk.py, and the checks that compare a kernel's output to them.

Ranking is exact, on an order-preserving int64 key of each fp32 value: for the top-512 ops
vLLM's top-k order (``order_key``: NaN above +inf, -0 below +0), for layer 20's selection
torch.topk's, which vLLM's selection uses (``torch_key``: -0 equal to +0). A kernel's row is
right when its entries are distinct columns of the row and the multiset of their keys equals the
reference's top keys: any index set that differs only by ties at the cut passes, any other
fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

TOPK = 512


def make_logits(rows, width, kind="randn", seed=0, stride=None, device="cpu"):
    """[rows, width] fp32 logits of ``kind`` on ``device``, seeded, optionally a view with row
    stride ``stride``: the adversarial rows of the top-k tests (the CPU emulation's and the
    GPU's)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(rows, stride or width, device=device, generator=g)[:, :width]
    neg = float("-inf")
    if kind == "ties":  # few distinct values: ties everywhere, also at the cut
        x.copy_(torch.randint(0, 3, x.shape, device=device, generator=g).float())
    elif kind == "all_ninf":
        x.fill_(neg)
    elif kind == "masked":  # 7 of 8 blocks of 8 columns at -inf, as the candidate mask leaves
        keep = torch.rand(rows, -(-width // 8), device=device, generator=g) < 0.125
        x.masked_fill_(~keep.repeat_interleave(8, 1)[:, :width], neg)
    elif kind == "sparse_finite":  # fewer finite values than 512 in most chunks
        keep = torch.rand(x.shape, device=device, generator=g) < 0.01
        x.masked_fill_(~keep, neg)
    elif kind == "specials":  # +inf, NaN, -0, +0, -inf sprinkled over random values
        u = torch.rand(x.shape, device=device, generator=g)
        x.masked_fill_(u < 0.002, float("inf"))
        x.masked_fill_((u >= 0.002) & (u < 0.0025), float("nan"))
        x.masked_fill_((u >= 0.0025) & (u < 0.003), -float("nan"))  # sign bit set
        x.masked_fill_((u >= 0.003) & (u < 0.01), -0.0)
        x.masked_fill_((u >= 0.01) & (u < 0.02), 0.0)
        x.masked_fill_((u >= 0.02) & (u < 0.1), neg)
    elif kind == "denormals":  # a top-512 cut among zeros of both signs, between fp32
        # denormals: 300 positives, 75 positive and 75 negative denormals, 150 -0 and 150 +0 a
        # row, the rest -inf
        x.fill_(neg)
        for r in range(rows):
            cols = torch.randperm(width, device=device, generator=g)[:750]
            x[r, cols[:300]] = torch.rand(300, device=device, generator=g) + 1
            bits = torch.randint(1, 1 << 23, (150,), device=device, generator=g, dtype=torch.int32)
            x[r, cols[300:450]] = bits.view(torch.float32)
            x[r, cols[375:450]] *= -1
            x[r, cols[450:600]] = -0.0
            x[r, cols[600:750]] = 0.0
    elif kind == "outliers":  # a few finite logits 30 binades above the rest: a wide key range
        cols = torch.randint(0, width, (rows, 3), device=device, generator=g)
        x.scatter_(1, cols, torch.full(cols.shape, 1e9, device=device))
    elif kind == "equal":  # one value everywhere
        x.fill_(1.5)
    elif kind == "zeros":  # 95% zeros, the rest random: ties below the cut
        x.masked_fill_(torch.rand(x.shape, device=device, generator=g) < 0.95, 0.0)
    elif kind == "max_every_4":  # every float4 holds the row's greatest value, at its x: the
        # even-slot group of each thread of the interleaved kernels tops at it (the odd-slot one
        # holds y and w), and a row under 2048 columns has fewer than 512 copies
        x.zero_()[:, ::4] = 1.0
    elif kind == "one_binade":  # logits in [1, 2) and a NaN in every 16384 columns: the
        # NaN's key tops the floor pass's range, so its bins span a binade and nearly every key
        # lies above the floor, more than the LDS list's 4096 in a chunk, a merge, a candidate
        # or a compact row (their cut runs over the registers)
        x.uniform_(1.0, 2.0, generator=g)
        x[:, 7::16384] = float("nan")
    elif kind == "exactly_k":  # 512 finite logits a row (the least -FLT_MAX), the rest -inf: in
        # a one-chunk row the radix pass over the keys above the floor (-inf) counts exactly k,
        # its lowest bin occupied (only the thread reaching the k-th key may publish the cut)
        x.fill_(neg)
        for r in range(rows):
            cols = torch.randperm(width, device=device, generator=g)[:TOPK]
            x[r, cols] = torch.randn(TOPK, device=device, generator=g)
            x[r, cols[0]] = -torch.finfo(torch.float32).max
    elif kind == "cluster":  # the last 4096 columns of every 16384 high: more than a chunk's
        x[:, (torch.arange(width, device=device) // 4096) % 4 == 3] += 3.0  # 1024 superset slots
    return x


def specials_near_k(k: int, width: int, extra: int, device="cpu") -> torch.Tensor:
    """A random [1, width] row with k - 1 + extra blocks of 8 (not the newest) holding a NaN or
    a +inf: with the pinned newest block, k + extra block scores at or above +inf, so a top-k
    selection's cut falls below them, at their edge or among them."""
    x = make_logits(1, width, "randn", seed=20 + extra, device=device)
    g = torch.Generator().manual_seed(21)
    blocks = torch.randperm(width // 8 - 1, generator=g)[: k - 1 + extra].to(device)
    x[0, blocks[::2] * 8] = float("nan")
    x[0, blocks[1::2] * 8 + 3] = float("inf")
    return x


# hip/topk_select.h's SPARSE_POP: radix passes over at most this many keys count without the
# wave aggregation.
SPARSE_POP = int(
    re.search(
        r"\bSPARSE_POP = (\d+)", (Path(__file__).parent.parent / "hip/topk_select.h").read_text()
    )[1]
)


ONE_BITS = 0x3F800000  # 1.0f
# The tied blocks of the rows below start here: slot 1 of consecutive threads of the selection's
# 1024-thread workgroup, so on a GPU several lanes of a wave add to one histogram address.
TIED_FROM = 1024


def _tied(x: torch.Tensor, pop: int, top_bits: int) -> None:
    """Blocks TIED_FROM.. TIED_FROM + pop - 1 of x score in tied groups of 4, the greatest group
    top_bits (a positive float's bits), each group one ulp below the next (a block's first
    logit)."""
    j = torch.arange(pop, dtype=torch.int32).flip(0) // 4
    x[0, torch.arange(TIED_FROM, TIED_FROM + pop) * 8] = (top_bits - j).view(torch.float32)


def _blocks_after_tied(width: int, pop: int, n: int, g: torch.Generator) -> torch.Tensor:
    """n distinct random blocks past the tied ones, short of the newest (pinned) block."""
    return torch.randperm(width // 8 - 1 - TIED_FROM - pop, generator=g)[:n] + TIED_FROM + pop


def tied_bin_row(k: int, width: int, pop: int, device="cpu") -> torch.Tensor:
    """A [1, width] row for the selection (blocks of 8) whose cut falls among `pop` blocks
    scoring within pop / 4 ulps of 1.0 in tied groups of 4 (one bin of the first radix pass:
    the second runs over exactly `pop` keys), with k - 2 - pop // 2 blocks above them in [8, 16),
    the pinned newest block, the rest -inf. The cut takes 1 of a tied group, in a third pass
    over 128 keys."""
    above = k - 2 - pop // 2
    g = torch.Generator().manual_seed(pop)
    x = torch.full((1, width), float("-inf"))
    _tied(x, pop, ONE_BITS + (pop - 1) // 4)
    blocks = _blocks_after_tied(width, pop, above, g)
    x[0, blocks * 8] = 8 + 8 * torch.rand(above, generator=g)
    return x.to(device)


def tied_top_row(width: int, pop: int, device="cpu") -> torch.Tensor:
    """A [1, width] row for the selection whose greatest finite scores are `pop` blocks tied in
    groups of 4 (within pop / 4 ulps of 1.0), above 3000 blocks spread over the keys below,
    the least of them 2^25 - 1 keys under the greatest: the first radix pass's top bin (2^15
    keys up to the range's greatest) holds the tied ones, so the next pass keeps the range's
    upper end. With the pinned newest block a K below pop + 1 cuts among them."""
    g = torch.Generator().manual_seed(pop + 1)
    x = torch.full((1, width), float("-inf"))
    top = ONE_BITS + (pop - 1) // 4
    _tied(x, pop, top)
    low = top - (1 << 25) + 1
    bits = torch.randint(low, top - (1 << 15), (3000,), generator=g, dtype=torch.int64)
    bits[0] = low
    blocks = _blocks_after_tied(width, pop, 3000, g)
    x[0, blocks * 8] = bits.to(torch.int32).view(torch.float32)
    return x.to(device)


def equal_top_two_candidates(device="cpu"):
    """(logits, candidates, block size) of one candidate row that takes the candidate kernel's
    scalar path (its logits 4 bytes past a 16-byte boundary) into the floor pass's one-value
    range. There slot s of thread t is column t % 8 of candidate entry 64 s + t // 8, so a
    group's two keys (slots of one parity) come from different entries and a live group may
    hold one key: entries 0-24 hold V = 1.0 in every column (200 threads with one live key,
    V), entries 25-37 and 153-165 too, and the even slots after them lower keys (104 threads
    with two V atop their even group, their odd slots absent). 408 copies, fewer than k:
    radix_cut must count them first (2217b78; with its count reverted the answer repeats ids)."""
    width, bs = 131072, 8
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(1, width + 1, generator=g) * 0.5)[:, 1:]
    blocks = torch.randperm(width // bs, generator=g)[:2048].int()
    entries = list(range(25)) + [64 * s + p for p in range(25, 38) for s in range(0, 32, 2)]
    cands = torch.full((1, 2048), -1, dtype=torch.int32)
    cands[0, entries] = blocks[entries]
    for e in [*range(38), *range(153, 166)]:
        x[0, int(blocks[e]) * bs : int(blocks[e]) * bs + bs] = 1.0
    x = torch.empty(1, width + 1, device=device)[:, 1:].copy_(x)  # unaligned on the device too
    return x, cands.to(device), bs


def order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys in vLLM's top-k order: NaN > +inf > ... > +0 > -0 > ... > -inf."""
    bits = x.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    key = torch.where(bits >= 0x80000000, (~bits) & 0xFFFFFFFF, bits | 0x80000000)
    return torch.where(torch.isnan(x), torch.full_like(key, 0xFFFFFFFF), key)


def torch_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys in torch.topk's order: NaN > +inf > ... > -inf; -0 == +0."""
    return order_key(torch.where(x == 0, torch.zeros_like(x), x))


def decode_row_ends(seq_lens: torch.Tensor, rows: int, next_n: int, width: int) -> list[int]:
    """vLLM's decode top-k row ends: 2-D -> seq_lens.view(-1)[r]; 1-D -> causal; clamped."""
    lens = seq_lens.flatten().tolist()
    if seq_lens.dim() == 2:
        ends = [lens[r] for r in range(rows)]
    else:
        ends = [lens[r // next_n] - next_n + r % next_n + 1 for r in range(rows)]
    return [min(max(e, 0), width) for e in ends]


def select_row_ends(seq_lens: torch.Tensor, rows: int, next_n: int) -> list[int]:
    """vLLM's candidate-code row ends: seq_lens.reshape(-1), repeated next_n times when it
    holds one length a request."""
    lens = seq_lens.reshape(-1)
    if lens.numel() != rows:
        lens = lens.repeat_interleave(next_n)
    return lens[:rows].tolist()


def check_row(out: torch.Tensor, keys: torch.Tensor, cols: torch.Tensor, k: int, what: str):
    """``out`` (one row of ids, CPU) must hold min(k, len(cols)) distinct members of ``cols``
    (the row's eligible ids, CPU, with their ``keys``) whose keys are the top keys as a
    multiset, then -1 up to k."""
    n = min(k, cols.numel())
    got = out[:n]
    assert bool((out[n:k] == -1).all()), f"{what}: expected -1 after {n} entries"
    assert got.unique().numel() == n, f"{what}: repeated ids"
    order = cols.argsort()
    sorted_cols = cols[order]
    at = torch.searchsorted(sorted_cols, got.long()).clamp(max=max(cols.numel() - 1, 0))
    found = sorted_cols[at] == got.long() if cols.numel() else torch.zeros(n, dtype=torch.bool)
    assert bool(found.all()), f"{what}: ids outside the eligible set: {got[~found][:8].tolist()}"
    idx = order[at]
    want = keys.sort(descending=True).values[:n]
    have = keys[idx].sort(descending=True).values
    bad = int((want != have).sum())
    assert bad == 0, f"{what}: {bad} of {n} values differ from the reference top-{k}"


def check_short_row(row: torch.Tensor, end: int, what: str) -> None:
    """A row ending at or before 512 gets ``0..end-1`` then -1, whatever its logits."""
    want = torch.tensor([j if j < end else -1 for j in range(TOPK)], dtype=row.dtype)
    assert torch.equal(row, want), f"{what} (end {end}): not 0..end-1, -1"


def long_rows(indices, seq_lens, rows, next_n, width, what):
    """(r, end, first 512 entries) of each row longer than 512, having checked every shorter
    row's contract on the way."""
    for r, end in enumerate(decode_row_ends(seq_lens.cpu(), rows, next_n, width)):
        row = indices[r, :TOPK]
        if end <= TOPK:
            check_short_row(row, end, f"{what} row {r}")
        else:
            yield r, end, row


def check_decode(logits, next_n, seq_lens, indices, what=""):
    """Every row of a decode top-512 against torch (all of ``logits`` is compared on CPU)."""
    logits, indices = logits.float().cpu(), indices.cpu()
    rows, width = logits.shape
    for r, end, row in long_rows(indices, seq_lens, rows, next_n, width, what):
        check_row(row, order_key(logits[r, :end]), torch.arange(end), TOPK, f"{what} row {r}")


def candidate_columns(cands_row: torch.Tensor, block_size: int, end: int) -> torch.Tensor:
    """The distinct live columns of a row's candidate blocks (sorted)."""
    blocks = cands_row[cands_row >= 0].unique().to(torch.int64)
    cols = (blocks[:, None] * block_size + torch.arange(block_size)).flatten()
    return cols[cols < end].sort().values


def check_candidates(logits, next_n, seq_lens, candidates, block_size, indices, what=""):
    """candidate_top_k against the mask-then-top-k reference on each row's candidate columns."""
    logits, indices, candidates = logits.float().cpu(), indices.cpu(), candidates.cpu()
    rows, width = logits.shape
    for r, end, row in long_rows(indices, seq_lens, rows, next_n, width, what):
        cols = candidate_columns(candidates[r], block_size, end)
        check_row(row, order_key(logits[r, cols]), cols, TOPK, f"{what} row {r}")


def check_compact(logits, ids, next_n, seq_lens, indices, what=""):
    """compact_top_k_512 against torch on each row's entries whose id is >= 0."""
    logits, ids, indices = logits.float().cpu(), ids.cpu(), indices.cpu()
    rows = logits.shape[0]
    for r, _, row in long_rows(indices, seq_lens, rows, next_n, 2**31 - 1, what):
        live = ids[r] >= 0
        check_row(row, order_key(logits[r][live]), ids[r][live].long(), TOPK, f"{what} row {r}")


def block_scores(logits: torch.Tensor, end: int, block_size: int) -> torch.Tensor:
    """vLLM's block scores of one row: NaN-propagating max over columns < min(end, width),
    -inf for empty blocks, the newest block pinned to +inf (only blocks below the width)."""
    width = logits.numel()
    nblocks = -(-width // block_size)
    # fp32 also under a bf16 default dtype (vLLM builds models under one), on the logits' device.
    padded = torch.full((nblocks * block_size,), float("-inf"), dtype=torch.float32,
                        device=logits.device)  # fmt: skip
    live = min(max(end, 0), width)
    padded[:live] = logits[:live]
    scores = padded.view(nblocks, block_size).amax(-1)
    newest = (end - 1) // block_size
    if end > 0 and newest < nblocks:
        scores[newest] = float("inf")
    return scores


def check_select(logits, next_n, seq_lens, block_size, candidates, what=""):
    """select_candidates against vLLM's _select_candidate_blocks contract as sets: the kept
    blocks are the top min(K, live) block scores, where a -inf score is not kept."""
    logits, candidates = logits.float().cpu(), candidates.cpu()
    rows, k = logits.shape[0], candidates.shape[1]
    for r, end in enumerate(select_row_ends(seq_lens.cpu(), rows, next_n)):
        scores = block_scores(logits[r], end, block_size)
        live = torch.nonzero(scores != float("-inf")).flatten()
        check_row(candidates[r], torch_key(scores[live]), live, k, f"{what} row {r}")
