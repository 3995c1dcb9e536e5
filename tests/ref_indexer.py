"""Torch references with the contracts of the indexer decode path's pieces, for the CPU tests of
``indexer.py``: vLLM's AITER logits and C++ top-k do not run on a CPU, so these stand in for
them (as vLLM's oracle) and, as "hooks that take the call", for the plugin's kernels.

Contracts (``../shared/docs/vllm-0.33-integration.md``):
* top-k row ends: 2-D ``seq_lens`` -> ``seq_lens.view(-1)[r]``; 1-D -> the causal end
  ``seq_lens[r // next_n] - next_n + r % next_n + 1``; clamped at 0. A row ending at or before
  512 gets ``0..end-1`` then -1; a longer row the ids of its 512 largest logits.
* candidate row ends: ``seq_lens.reshape(-1)``, repeated ``next_n`` times when it holds one
  length per request.
"""

from __future__ import annotations

import torch

from ref_topk import block_scores, select_row_ends

K = 512
NEG = float("-inf")


def topk_ends(seq_lens: torch.Tensor, rows: int, next_n: int) -> list[int]:
    if seq_lens.dim() == 2:
        return [max(0, int(v)) for v in seq_lens.reshape(-1)[:rows]]
    return dense_ends(seq_lens, rows, next_n)  # 1-D: the same causal end


def request_lens(seq_lens: torch.Tensor) -> torch.Tensor:
    """One length a request, as vLLM's ``_per_sequence_context_lens`` hands AITER's dense
    kernel: a 2-D table's last column."""
    return seq_lens[:, -1] if seq_lens.dim() == 2 else seq_lens


def dense_ends(seq_lens: torch.Tensor, rows: int, next_n: int) -> list[int]:
    """Where AITER's dense logits of each row end (-inf from there): handed ``request_lens``,
    its kernel writes -inf from ``last - next_n + j + 1`` on."""
    last = request_lens(seq_lens)
    return [max(0, int(last[r // next_n]) - next_n + r % next_n + 1) for r in range(rows)]


def live_ends(seq_lens: torch.Tensor, rows: int, next_n: int) -> list[int]:
    """Where the candidate-logits kernel's live columns end: the top-k's row end, and no further
    than the dense logits (a 2-D row can end one past them at compress ratio 2)."""
    own, dense = topk_ends(seq_lens, rows, next_n), dense_ends(seq_lens, rows, next_n)
    return [min(a, b) for a, b in zip(own, dense, strict=True)]


def _row_top_k(values: torch.Tensor, cols: torch.Tensor, end: int, out_row: torch.Tensor):
    """Top-512 of ``values`` (at column ids ``cols``) into ``out_row``, -1 padded; ties by the
    lowest column so that two callers given the same row agree exactly."""
    out_row.fill_(-1)
    if cols.numel() == 0:
        return
    order = sorted(range(cols.numel()), key=lambda i: (-float(values[i]), int(cols[i])))[:K]
    picked = cols[order]
    out_row[: picked.numel()] = picked.to(out_row.dtype)


def top_k_per_row_decode(logits, next_n, seq_lens, indices, rows, stride0, stride1, k):
    """``torch.ops._C.top_k_per_row_decode``'s contract (k = 512): the C++ kernel reads
    ``logits`` through the row count and strides it is given, so they must be its own."""
    assert k == K
    assert (rows, stride0, stride1) == (logits.shape[0], *logits.stride())
    for r, end in enumerate(topk_ends(seq_lens, rows, next_n)):
        if end <= K:
            indices[r].fill_(-1)
            indices[r, :end] = torch.arange(end, dtype=indices.dtype)
        else:
            _row_top_k(logits[r, :end], torch.arange(end), end, indices[r])


def decode_top_k(logits, next_n, seq_lens, indices, topk_tokens) -> bool:
    """The plugin hook's contract: the same as vLLM's top-k."""
    top_k_per_row_decode(logits, next_n, seq_lens, indices, logits.shape[0], *logits.stride(),
                         topk_tokens)  # fmt: skip
    return True


def select_rows(logits, ends, topk_blocks, block_size, out):
    nblocks = (logits.shape[1] + block_size - 1) // block_size
    out.fill_(-1)
    for r, end in enumerate(ends):
        scores = block_scores(logits[r], end, block_size)
        vals, ids = scores.topk(min(topk_blocks, nblocks))
        ids = torch.where(vals == float("-inf"), -1, ids)
        out[r, : ids.numel()] = ids.to(out.dtype)


def vllm_select_candidate_blocks(logits, row_ks, row_ke, topk_blocks, block_size, out,
                                 row_repeat=1):  # fmt: skip
    """``_select_candidate_blocks``'s contract (its wrapper asserts a CUDA tensor)."""
    assert row_ks is None or int(row_ks.abs().sum()) == 0
    select_rows(logits, [int(v) for v in row_ke], topk_blocks, block_size, out)


def select_candidates(logits, next_n, seq_lens, block_size, candidates) -> bool:
    ends = select_row_ends(seq_lens, logits.shape[0], next_n)
    select_rows(logits, ends, candidates.shape[1], block_size, candidates)
    return True


def candidate_top_k(logits, next_n, seq_lens, candidates, block_size, indices, topk_tokens,
                    col_ends=None):  # fmt: skip
    """Top-512 among each row's live candidate columns (< the top-k row end, or ``col_ends``),
    all of them and then -1 when there are fewer than 512 (the plugin's documented
    difference)."""
    ends = topk_ends(seq_lens, logits.shape[0], next_n)
    for r, end in enumerate(ends):
        stop = end if col_ends is None else col_ends[r]
        blocks = sorted({int(b) for b in candidates[r] if int(b) >= 0})
        cols = torch.tensor([b * block_size + i for b in blocks for i in range(block_size)
                             if b * block_size + i < stop], dtype=torch.long)  # fmt: skip
        if end <= K:
            indices[r].fill_(-1)
            indices[r, :end] = torch.arange(end, dtype=indices.dtype)
        else:
            _row_top_k(logits[r, cols] if cols.numel() else cols.float(), cols, end, indices[r])
    return True


class PagedLogits:
    """Stands in for AITER's paged FP8 logits: a fixed random projection of each query row
    (``raw``), so that packing and row order matter; masked as AITER's kernel masks them, -inf
    from the row's causal end (``dense_ends``) to its request's length and stale garbage past
    that, as AITER leaves them."""

    def __init__(self, width: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.proj = torch.randn(16, width, generator=g)
        self.garbage = torch.rand(1, width, generator=g) * 1e4
        self.width = width

    def __call__(self, q_fp8, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                 max_model_len, compress_ratio=1):  # fmt: skip
        next_n = q_fp8.shape[1]
        logits = self.raw(q_fp8)
        last = request_lens(context_lens)
        for r, end in enumerate(dense_ends(context_lens, logits.shape[0], next_n)):
            stop = max(0, int(last[r // next_n]))
            logits[r, end:stop] = NEG
            logits[r, stop:] = self.garbage[0, stop:]
        return logits

    def raw(self, q_fp8) -> torch.Tensor:
        """Every column's logit, unmasked: what the candidate-logits kernel computes itself."""
        rows = q_fp8.shape[0] * q_fp8.shape[1]
        feats = q_fp8.reshape(rows, -1)[:, :16].float()
        return (feats @ self.proj).round(decimals=1)  # rounding makes ties


class CandidateLogitsTopK:
    """The candidate-logits hook's contract: the top-512 that vLLM's dense logits, candidate
    mask and top-k give (same references), computed here from the same stand-in logits; it
    declines padded steps, as the real hook does. Its logits are the unmasked ones (the kernel
    computes each live column's own), its columns live before ``live_ends``. Given a ``check``,
    it hands it the compact rows first (each candidate column's logit and id; past the row's
    live end id -1 and logit -inf, as the real kernel writes them), and declines when the check
    does. ``skew``: "last bit"
    flips the last bit of one live logit, "last bit at 0" that of column 0's, "zero sign" the
    sign of a live zero."""

    def __init__(self, paged_logits: PagedLogits, skew: str = ""):
        self.paged_logits, self.skew = paged_logits, skew

    def __call__(self, q_fp8, kv_cache, weights, seq_lens, block_table, candidates, block_size,
                 indices, topk_tokens, dense_is_aiter_gluon, requires_padding,
                 check=None):  # fmt: skip
        if requires_padding or not dense_is_aiter_gluon:
            return False
        next_n = q_fp8.shape[1]
        logits = self.paged_logits.raw(q_fp8)
        rows = logits.shape[0]
        live = live_ends(seq_lens, rows, next_n)
        if check is not None:
            blocks = candidates[:rows].long()
            cols = (blocks[:, :, None] * block_size + torch.arange(block_size)).flatten(1)
            ends = torch.tensor(live)[:, None]
            ids = torch.where((blocks.repeat_interleave(block_size, 1) >= 0) & (cols < ends),
                              cols, -1).int()  # fmt: skip
            compact = logits.gather(1, ids.clamp(min=0).long()).masked_fill(ids < 0, NEG)
            if self.skew:
                bit, at = {"last bit": (1, ids >= 0), "last bit at 0": (1, ids == 0),
                           "zero sign": (1 << 31, compact == 0)}[self.skew]  # fmt: skip
                r, c = torch.nonzero(at & (ids >= 0))[0].tolist()
                compact[r, c] = (compact[r, c].view(torch.int32) ^ bit).view(torch.float32)
            if not check(compact, ids):
                return False
        return candidate_top_k(logits, next_n, seq_lens, candidates, block_size, indices,
                               topk_tokens, col_ends=live)  # fmt: skip
