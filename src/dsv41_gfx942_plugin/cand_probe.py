"""A synthetic decode step on which the indexer compares a candidate-logits kernel variant with
vLLM's dense logits before the hook serves it (``indexer._cand_probe``).

Under vLLM's defaults for DeepSeek-V4.1 on ROCm, uniform decode steps run as FULL CUDA graphs
captured at start-up: the only eager decode calls before capture are vLLM's warm-up runs, whose
dummy rows (a few tokens over an empty cache) prove nothing. So the comparison does not wait
for real rows; it builds its own, of the same variant (heads, page size, FP8 dtype, rows a
request, 1-D or 2-D lengths as vLLM's builder makes them at the layer's compress ratio), with
random keys, scales, weights and queries, paged through a shuffled block table, and candidate
blocks that end inside and past each row.
"""

from __future__ import annotations

import types

import torch

#: Requests of a probe (at most the step's own, so vLLM's dense logits of the probe never ask
#: its workspace for more than the step would) and compressed columns each holds at most:
#: at one row of 4096, about 3,600 live candidate columns, past indexer.MIN_COMPARED.
PROBE_REQUESTS = 4
PROBE_LEN = 4096


def probe_step(q, kv_cache, seq_lens, compress_ratio: int, width: int, cand_slots: int,
               cand_block: int, seed: int = 0):  # fmt: skip
    """Tensors of a decode step of ``q``'s variant on ``q``'s device: ``q``, ``kv_cache``,
    ``weights``, ``seq_lens``, ``block_table``, ``candidates`` (``cand_slots`` block ids a row,
    an eighth of them -1) and ``indices`` (``[rows, 512]`` int32 for the top-512). Requests
    alternate odd and even uncompressed lengths, so that at compress ratio 2 a 2-D table holds
    rows that end one column past the dense logits (``_cand_kernels._column_addresses``)."""
    batch, next_n, heads, dim = q.shape
    page, key_bytes = kv_cache.shape[1], kv_cache.shape[3]  # a key's dim + its FP32 scale
    requests = min(batch, PROBE_REQUESTS)
    rows = requests * next_n
    g = torch.Generator().manual_seed(seed)
    # Within whole pages of the width: AITER's dense kernel writes a row's -inf tail up to the
    # next page boundary, over the next row's first columns when that is past the width.
    longest = max(next_n + 1, min(PROBE_LEN, width - width % page))
    lens = [max(next_n, longest - 37 * b) for b in range(requests)]  # compressed
    if seq_lens.dim() == 1:
        table = torch.tensor(lens, dtype=torch.int32)
    else:  # vLLM's builder: row j ends at (L - next_n + 1 + j) // ratio, L uncompressed
        full = [compress_ratio * n + b % compress_ratio for b, n in enumerate(lens)]
        table = torch.tensor([[(n - next_n + 1 + j) // compress_ratio for j in range(next_n)]
                              for n in full], dtype=torch.int32)  # fmt: skip
    per_request = -(-longest // page)
    pages = requests * per_request
    block_table = torch.randperm(pages, generator=g).view(requests, per_request).int()
    # The cache holds keys in the indexer's FP8, q's (the hook takes only FP8 queries).
    fp8 = q.dtype if q.element_size() == 1 else torch.float8_e4m3fn
    keys = (torch.randn(pages, page * (key_bytes - 4), generator=g) * 2).to(fp8)
    scales = torch.rand(pages, page, generator=g) + 0.5
    cache = torch.cat([keys.view(torch.uint8), scales.view(torch.uint8)], dim=1)
    cache = cache.view(pages, page, 1, key_bytes)
    candidates = torch.stack([torch.randperm(cand_slots, generator=g) for _ in range(rows)])
    candidates[torch.rand(rows, cand_slots, generator=g) < 0.125] = -1
    dev = q.device
    return types.SimpleNamespace(
        q=torch.randn(requests, next_n, heads, dim, generator=g).to(q.dtype).to(dev),
        kv_cache=cache.to(dev),
        weights=(torch.randn(rows, heads, generator=g) / heads).to(dev),
        seq_lens=table.to(dev),
        block_table=block_table.to(dev),
        candidates=candidates.int().to(dev),
        indices=torch.full((rows, 512), -1, dtype=torch.int32, device=dev),
    )
