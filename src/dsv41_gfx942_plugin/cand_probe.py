"""A synthetic decode step on which the indexer compares a candidate-logits kernel variant with
vLLM's dense logits before the hook serves it (``indexer._cand_probe``).

Under vLLM's defaults for DeepSeek-V4.1 on ROCm, uniform decode steps run as FULL CUDA graphs
captured at start-up: the only eager decode calls before capture are vLLM's warm-up runs, whose
dummy rows (a few tokens over an empty cache) prove nothing. So the comparison does not wait
for real rows; it builds its own, of the same variant (heads, page size, FP8 dtype, rows a
request, 1-D or 2-D lengths as vLLM's builder makes them at the layer's compress ratio), with
random keys (with the 0x80 bytes vLLM's K writer leaves: ``WRITER_NEG_ZERO``), scales, weights
and queries, paged through a shuffled block table, and candidate blocks that end inside and past
each row.
"""

from __future__ import annotations

import types

import torch

#: Requests of a probe (at most the step's own, so vLLM's dense logits of the probe never ask
#: its workspace for more than the step would) and the compressed columns of each but the
#: first: at one row of 4096, about 3,600 live candidate columns, past indexer.MIN_COMPARED.
PROBE_REQUESTS = 4
PROBE_LEN = 4096
#: The first request's columns (the layer's width permitting): AITER's dense kernel splits a
#: row over ((CUs // rows + 4) // 5 * 5) * 2 programs (ROCm/aiter pa_mqa_logits.py), each taking
#: 256-column chunks, and runs its pipelined main loop only for a program of 2 chunks or more:
#: with 8 probe rows on 304 CUs that needs 80 x 512 columns, with 1 row 610 x 512. 262144
#: columns give 3.3 chunks a program at 2 rows (12.8 at 8), 1.7 at one (35 MB of cache at 132
#: bytes a key).
PROBE_LONG = 262144
PAGES_AT_ONCE = 256
#: The share of key bytes set to 0x80 (about 1.5% of keys hold one): vLLM 0.33's DSv4.1 indexer
#: K writer (``indexer_k_norm_rope_store``) encodes OCP e4m3fn on ROCm too (``tl.float8e4nv``,
#: max 448), whose -0 (any tiny negative element) is 0x80, NaN in the e4m3fnuz that AITER's
#: gfx942 kernel and the candidate kernel read; keys of e4m3fnuz alone never hold it.
WRITER_NEG_ZERO = 1 / 8192
#: The JIT compiles a variant a pointer aligned to 16 bytes or not and an integer a multiple of
#: 16 or not; the kernels take the keys' page stride in bytes and the FP32 scales' in floats (a
#: quarter of it), so a page stride matters modulo 64.
SPECIALIZE = 16
PAGE_STRIDE_MOD = 4 * SPECIALIZE


def layout(kv_cache, block_table) -> tuple[int, int, int]:
    """What the compiled kernels depend on of the cache's and block table's layout: the cache's
    start modulo 16 bytes, its page stride modulo 64, the table's row stride modulo 16
    (``probe_step`` reproduces each)."""
    return (
        kv_cache.data_ptr() % SPECIALIZE,
        kv_cache.stride(0) % PAGE_STRIDE_MOD,
        block_table.stride(0) % SPECIALIZE,
    )


def probe_step(q, kv_cache, seq_lens, block_table, compress_ratio: int, width: int,
               cand_slots: int, seed: int = 0):  # fmt: skip
    """Tensors of a decode step of ``q``'s variant on ``q``'s device: ``q``, ``kv_cache``,
    ``weights``, ``seq_lens``, ``block_table``, ``candidates`` (``cand_slots`` block ids a row,
    an eighth of them -1) and ``indices`` (``[rows, 512]`` int32 for the top-512). Requests
    alternate odd and even uncompressed lengths, so that at compress ratio 2 a 2-D table holds
    rows that end one column past the dense logits (``_cand_kernels._column_addresses``). Its
    ``layout`` is that of ``kv_cache`` and ``block_table`` (vLLM's table is cdiv(max_model_len,
    block size) wide). Its pages are as many as the lengths take, so its storage stays
    within the 2 GiB past which ROCm's Triton compiles yet another variant (a whole KV cache's):
    the gfx942 kernel's instructions are the same for it (``tests/test_cand_logits.py``,
    ``test_gfx942_code_is_the_same_for_a_whole_kv_cache``)."""
    batch, next_n, heads, dim = q.shape
    page, key_bytes = kv_cache.shape[1], kv_cache.shape[3]  # a key's dim + its FP32 scale
    dev = q.device
    requests = min(batch, PROBE_REQUESTS)
    rows = requests * next_n
    g = torch.Generator(device=dev).manual_seed(seed)
    # Compressed lengths, within whole pages of the width: AITER's dense kernel writes a row's
    # -inf tail up to the next page boundary, over the next row's first columns past the width.
    whole = width - width % page
    lens = [max(next_n + 1, min(PROBE_LONG if b == 0 else PROBE_LEN - 37 * b, whole))
            for b in range(requests)]  # fmt: skip
    if seq_lens.dim() == 1:
        table = torch.tensor(lens, dtype=torch.int32)
    else:  # vLLM's builder: row j ends at (L - next_n + 1 + j) // ratio, L uncompressed
        full = [compress_ratio * n + b % compress_ratio for b, n in enumerate(lens)]
        table = torch.tensor([[(n - next_n + 1 + j) // compress_ratio for j in range(next_n)]
                              for n in full], dtype=torch.int32)  # fmt: skip
    # Each request's pages, shuffled; entries past a request's pages name page 0, as a table
    # row's tail may.
    counts = [-(-n // page) for n in lens]
    pages = sum(counts)
    order = torch.randperm(pages, generator=g, device=dev).int()
    columns = max(counts) + (block_table.stride(0) - max(counts)) % SPECIALIZE
    pages_of = torch.zeros(requests, columns, dtype=torch.int32, device=dev)
    start = 0
    for b, n in enumerate(counts):
        pages_of[b, :n] = order[start : start + n]
        start += n
    page_bytes = page * key_bytes
    stride = page_bytes + (kv_cache.stride(0) - page_bytes) % PAGE_STRIDE_MOD
    shift = kv_cache.data_ptr() % SPECIALIZE
    base = torch.empty(shift + pages * stride, dtype=torch.uint8, device=dev)
    cache = base[shift:].as_strided((pages, page, 1, key_bytes), (stride, key_bytes, key_bytes, 1))
    flat = base[shift:].as_strided((pages, page_bytes), (stride, 1))
    # The cache holds keys in the indexer's FP8, q's (the hook takes only FP8 queries), and the
    # 0x80 bytes vLLM's writer leaves (WRITER_NEG_ZERO), drawn PAGES_AT_ONCE pages at a time
    # (8 MiB of float32 at 64 keys of 128).
    fp8 = q.dtype if q.element_size() == 1 else torch.float8_e4m3fn
    key_row = page * (key_bytes - 4)
    for p0 in range(0, pages, PAGES_AT_ONCE):
        n = min(PAGES_AT_ONCE, pages - p0)
        keys = torch.randn(n, key_row, generator=g, device=dev).mul_(2)
        raw = keys.to(fp8).view(torch.uint8)
        raw[keys.uniform_(generator=g) < WRITER_NEG_ZERO] = 0x80
        flat[p0 : p0 + n, :key_row] = raw
    scales = torch.rand(pages, page, generator=g, device=dev) + 0.5
    flat[:, key_row:] = scales.view(torch.uint8)
    candidates = torch.stack(
        [torch.randperm(cand_slots, generator=g, device=dev) for _ in range(rows)]
    ).int()
    candidates[torch.rand(rows, cand_slots, generator=g, device=dev) < 0.125] = -1
    return types.SimpleNamespace(
        q=torch.randn(requests, next_n, heads, dim, generator=g, device=dev).to(q.dtype),
        kv_cache=cache,
        weights=torch.randn(rows, heads, generator=g, device=dev) / heads,
        seq_lens=table.to(dev),
        block_table=pages_of,
        candidates=candidates,
        indices=torch.full((rows, 512), -1, dtype=torch.int32, device=dev),
    )
