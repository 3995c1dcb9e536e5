"""Indexer logits of the DSpark candidate positions only, written as compact rows.

Layers 24-36 take their top 512 only from the 2048 candidate blocks of 8 positions that layer 20
chose for each decode row, yet vLLM scores every position of the row (AITER's dense Gluon kernel)
and then masks 7 of every 8 to -inf. At 128k context that is 8 times more work than the top-k
reads. Here only the candidate positions are scored, into compact rows of (logit, column id)
(the kernels: ``_cand_kernels.py``, AITER's gfx942 arithmetic and a portable twin), and
``candidate_logits_top_k`` takes their top 512 with the compact HIP top-512.
"""

import importlib

import torch
import triton

from ._cand_kernels import (
    COLUMNS,
    KEY_GROUP,
    TWIN_COLUMNS,
    _cand_logits_gfx942,
    _cand_logits_portable,
)

# Stages each program scores (the `stages_per_program=0` default). Each stage waits on three
# dependent loads (candidate block, page, keys), so many programs in flight hide latency best:
# on MI325X, 6 rows at 128k (2048 x 8 candidates) took 6.8 us at 1 stage a program and 14.0 us
# at 8 (vLLM's in-tree measurement; not re-measured here, nobody has gfx942 hardware).
STAGES_PER_PROGRAM = 1
# AITER's dense call: 4 waves, WavePerEU = 2 (vLLM's rocm_fp8_paged_mqa_logits).
NUM_WARPS = 4
WAVES_PER_EU = 2
# compact_top_k_512 (ops/topk.py) takes rows of up to 16384 entries: 2048 blocks x 8.
MAX_ROW = 16384
# What the gfx942 kernel compiles (its q layout needs 32 or 64 heads of 128), and so the twin,
# which stands in for it: candidate_logits refuses others, the hook declines them.
HEADS = (32, 64)
HEAD_DIM = 128
# Where AITER's dense kernel (ROCm/aiter gluon/pa_mqa_logits.py, the preshuffle pipeline) ends a
# row's finite logits where the candidate rows end theirs, so the hook takes only these:
# - pages of 16-128 keys dividing its 128-key stage; larger pages take its other pipeline,
#   whose key offsets are 32-bit;
# - next_n <= 2: it writes the causal -inf only in a split's last 128-column stage, so with
#   more draft rows a row's dead columns before that stage stay finite there. vLLM 0.33 on ROCm
#   passes next_n 1 or 2 natively and flattens more (`_supports_native_decode`).
AITER_PAGES = (16, 32, 64, 128)
AITER_NEXT_N = 2
# The gfx942 kernel reads q and the head weights with buffer loads: 32-bit byte offsets within a
# resource of this many bytes (Gluon's; a load past it returns 0). Larger inputs (262,144 rows
# of 64 heads) decline.
BUFFER_BYTES = 2**31 - 2


def _fp8_dtype() -> torch.dtype:
    """The platform's indexer FP8: e4m3fnuz on gfx94x (ROCm), e4m3fn elsewhere."""
    if torch.version.hip is not None and torch.cuda.is_available():
        arch = torch.cuda.get_device_properties(0).gcnArchName
        if arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def split_cache(kv_cache: torch.Tensor, fp8_dtype: torch.dtype | None = None):
    """The FP8 keys `[pages, page_size * dim]` and FP32 scales `[pages, page_size]` of an indexer
    cache `[pages, page_size, 1, dim + 4]` (uint8; each page: page_size x dim FP8 keys in the
    SHUFFLE layout, then page_size FP32 scales). Views, not copies: the page stride is kept, since
    vLLM's cache is a view whose pages sit inside larger physical blocks."""
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dtype != torch.uint8:
        raise TypeError(f"kv_cache must be a uint8 tensor, got {getattr(kv_cache, 'dtype', None)}")
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] <= 4:
        raise ValueError(
            f"kv_cache must be [pages, page_size, 1, dim + 4], got {tuple(kv_cache.shape)}"
        )
    pages, page_size, _, row_bytes = kv_cache.shape
    dim = row_bytes - 4
    if page_size % KEY_GROUP or dim % 16:
        raise ValueError(
            f"page size {page_size} and dim {dim} must be multiples of {KEY_GROUP}: the keys are "
            f"stored in shuffled groups of 16 (kv_cache {tuple(kv_cache.shape)})"
        )
    page_stride = kv_cache.stride(0)
    inner_contiguous = kv_cache.stride(3) == 1 and kv_cache.stride(1) == row_bytes
    if not inner_contiguous or page_stride < page_size * row_bytes or page_stride % 4:
        raise ValueError(
            f"kv_cache {tuple(kv_cache.shape)} with strides {kv_cache.stride()}: each page must "
            f"be contiguous and the page stride a multiple of 4 bytes, at least {page_size} x "
            f"{row_bytes}"
        )
    if kv_cache.storage_offset() % 4:
        raise ValueError(
            f"kv_cache must start at a 4-byte boundary, offset {kv_cache.storage_offset()}"
        )
    flat = kv_cache.as_strided((pages, page_size * row_bytes), (page_stride, 1))
    keys = flat[:, : page_size * dim].view(fp8_dtype or _fp8_dtype())
    scales = flat[:, page_size * dim :].view(torch.float32)
    return keys, scales


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def candidate_logits(
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    next_n: int,
    block_table: torch.Tensor,
    candidates: torch.Tensor,
    cand_block: int,
    out_logits: torch.Tensor,
    out_ids: torch.Tensor,
    stages_per_program: int = 0,
    *,
    portable: bool | None = None,
) -> None:
    """Write the compact candidate rows (module docstring) into out_logits / out_ids.

    q_fp8 `[rows, heads, dim]` FP8, row r = draft position r % next_n of request r // next_n;
    weights `[rows, heads]` FP32; block_table one row of pages per request; seq_lens as vLLM's
    decode metadata holds them (1-D per request, or `[requests, next_n]`: a row's columns then
    end at its own length and, as AITER's dense kernel writes them, before `seq_lens[b, -1] -
    next_n + j + 1`); candidates `[rows, blocks]` int32 with -1 padding; out_logits (fp32) and
    out_ids (int32) contiguous `[rows, blocks * cand_block]`.
    `stages_per_program=0` takes STAGES_PER_PROGRAM. `portable` picks the twin (default: the
    twin everywhere but gfx942)."""
    tensors = dict(q_fp8=q_fp8, kv_cache=kv_cache, weights=weights, seq_lens=seq_lens,
                   block_table=block_table, candidates=candidates, out_logits=out_logits,
                   out_ids=out_ids)  # fmt: skip
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    for name, n in (("next_n", next_n), ("cand_block", cand_block),
                    ("stages_per_program", stages_per_program)):  # fmt: skip
        if not isinstance(n, int):
            raise TypeError(f"{name} must be an int, got {n!r}")
    if q_fp8.dim() != 3 or not q_fp8.dtype.is_floating_point or q_fp8.element_size() != 1:
        raise TypeError(
            f"q_fp8 must be [rows, heads, dim] FP8, got {q_fp8.dtype} {tuple(q_fp8.shape)}"
        )
    rows, heads, dim = q_fp8.shape
    keys, scales = split_cache(kv_cache, q_fp8.dtype)
    page_size = kv_cache.shape[1]
    _check(kv_cache.shape[3] == dim + 4, f"kv_cache {tuple(kv_cache.shape)} vs q dim {dim}")
    _check(kv_cache.device == q_fp8.device, f"kv_cache is on {kv_cache.device}, q_fp8 on "
           f"{q_fp8.device}")  # fmt: skip
    _check(heads in HEADS and dim == HEAD_DIM,
           f"heads {heads}, dim {dim} unsupported ({HEADS} heads of dim {HEAD_DIM})")  # fmt: skip
    _check(q_fp8.stride(2) == 1, f"q_fp8 strides {q_fp8.stride()} need unit dim stride")
    _check(next_n >= 1 and rows % next_n == 0, f"{rows} rows is not a multiple of next_n={next_n}")
    _check(cand_block >= 1, f"cand_block {cand_block} must be positive")
    for name, t, dtype in (
        ("weights", weights, torch.float32),
        ("seq_lens", seq_lens, torch.int32),
        ("block_table", block_table, torch.int32),
        ("candidates", candidates, torch.int32),
        ("out_logits", out_logits, torch.float32),
        ("out_ids", out_ids, torch.int32),
    ):
        if t.dtype != dtype:
            raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
        _check(t.device == q_fp8.device, f"{name} is on {t.device}, q_fp8 on {q_fp8.device}")
    _check(
        weights.dim() == 2 and weights.shape[0] >= rows and weights.shape[1] == heads
        and weights.stride(1) == 1,
        f"weights {tuple(weights.shape)} must be [rows={rows}, heads={heads}], unit column stride",
    )  # fmt: skip
    _check(
        candidates.dim() == 2 and candidates.shape[0] == rows and candidates.stride(1) == 1,
        f"candidates {tuple(candidates.shape)} must be [rows={rows}, blocks], unit column stride",
    )
    requests = rows // next_n
    _check(
        block_table.dim() == 2 and block_table.shape[0] >= requests and block_table.stride(1) == 1,
        f"block_table {tuple(block_table.shape)} must be [>= {requests} requests, pages]",
    )
    _check(seq_lens.is_contiguous(), "seq_lens must be contiguous")
    _check(
        tuple(seq_lens.shape) in ((requests,), (requests, next_n)),
        f"seq_lens {tuple(seq_lens.shape)}: 1-D per request ({requests}) or 2-D per row "
        f"({requests}, {next_n})",
    )
    row_len = candidates.shape[1] * cand_block
    for name, t in (("out_logits", out_logits), ("out_ids", out_ids)):
        _check(
            tuple(t.shape) == (rows, row_len) and t.is_contiguous(),
            f"{name} {tuple(t.shape)} must be contiguous [{rows}, {row_len}]",
        )
    per_program = stages_per_program or STAGES_PER_PROGRAM
    _check(per_program >= 1, f"stages_per_program {stages_per_program} must be >= 0")
    if rows == 0 or row_len == 0:
        return
    if portable is None:
        portable = _fp8_dtype() != torch.float8_e4m3fnuz
    columns = TWIN_COLUMNS if portable else COLUMNS
    splits = triton.cdiv(triton.cdiv(row_len, columns), per_program)
    args = (
        q_fp8, q_fp8.stride(0), q_fp8.stride(1), keys, keys.stride(0), scales, scales.stride(0),
        seq_lens, next_n, block_table, block_table.stride(0), candidates, candidates.stride(0),
        weights, weights.stride(0), out_logits, out_ids, row_len, splits,
    )  # fmt: skip
    meta = dict(
        SeqLensIs2D=seq_lens.dim() == 2,
        StagesPerProgram=per_program,
        Heads=heads,
        HiddenDim=dim,
        PageSize=page_size,
        CandBlock=cand_block,
        num_warps=NUM_WARPS,
    )
    if portable:
        warp = 64 if torch.version.hip is not None else 32
        _cand_logits_portable[(rows * splits,)](*args, **meta, Columns=columns, ThreadsPerWarp=warp)
    else:
        _cand_logits_gfx942[(rows * splits,)](*args, **meta, waves_per_eu=WAVES_PER_EU)


def _hook_takes(
    q_fp8, kv_cache, weights, seq_lens, block_table, candidates, block_size, indices,
    topk_tokens, dense_is_aiter_gluon, requires_padding,
) -> bool:  # fmt: skip
    """Whether candidate_logits_top_k may take the call (pure checks, no side effects)."""
    tensors = (q_fp8, kv_cache, weights, seq_lens, block_table, candidates, indices)
    if not dense_is_aiter_gluon or requires_padding or topk_tokens != 512:
        return False
    if not all(isinstance(t, torch.Tensor) for t in tensors) or q_fp8.dim() != 4:
        return False
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        return False
    batch, next_n, heads, dim = q_fp8.shape
    rows = batch * next_n
    int32 = torch.int32
    return (
        all(t.device == q_fp8.device for t in tensors)
        and q_fp8.dtype in (torch.float8_e4m3fnuz, torch.float8_e4m3fn)
        and q_fp8.is_contiguous()
        and heads in HEADS
        and dim == HEAD_DIM
        and rows > 0
        and next_n <= AITER_NEXT_N
        and kv_cache.dtype == torch.uint8
        and kv_cache.dim() == 4
        and kv_cache.shape[2] == 1
        and kv_cache.shape[3] == dim + 4
        and kv_cache.shape[1] in AITER_PAGES
        and kv_cache.stride(3) == 1
        and kv_cache.stride(1) == kv_cache.shape[3]
        and kv_cache.stride(0) >= kv_cache.shape[1] * kv_cache.shape[3]
        and kv_cache.stride(0) % 4 == 0
        and kv_cache.storage_offset() % 4 == 0
        and weights.dtype == torch.float32
        and weights.dim() == 2
        and weights.shape[0] >= rows
        and weights.shape[1] == heads
        and weights.stride(1) == 1
        and q_fp8.numel() <= BUFFER_BYTES
        and ((rows - 1) * weights.stride(0) + heads) * 4 <= BUFFER_BYTES
        and seq_lens.dtype == int32
        and seq_lens.is_contiguous()
        and (
            (seq_lens.dim() == 1 and seq_lens.numel() == batch)
            or (seq_lens.dim() == 2 and tuple(seq_lens.shape) == (batch, next_n))
        )
        and block_table.dtype == int32
        and block_table.dim() == 2
        and block_table.shape[0] >= batch
        and block_table.stride(1) == 1
        and candidates.dtype == int32
        and candidates.dim() == 2
        and candidates.shape[0] >= rows
        and candidates.stride(1) == 1
        and 512 < candidates.shape[1] * block_size <= MAX_ROW
        and indices.dtype == int32
        and indices.dim() == 2
        and indices.shape[0] >= rows
        and indices.shape[1] >= 512
        and indices.stride(1) == 1
        and (rows == 1 or indices.stride(0) >= 512)  # rows apart, as the top-k requires
    )


def candidate_logits_top_k(
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    candidates: torch.Tensor,
    block_size: int,
    indices: torch.Tensor,
    topk_tokens: int,
    dense_is_aiter_gluon: bool,
    requires_padding: bool,
    check=None,
) -> bool:
    """The hook in front of the decode indexer's dense logits on the candidate-reader layers.

    Takes only calls whose dense logits would come from AITER's gfx942 Gluon kernel (the caller
    says so in `dense_is_aiter_gluon`: page size > 1, compress ratio not 4, AITER on with its
    paged-MQA logits module importable (vLLM's `paged_mqa_logits_module()`), gfx942),
    topK 512, 32 or 64 heads of dim 128, q `[batch, next_n, heads, 128]` FP8 contiguous with
    next_n 1 or 2, a uint8 cache `[pages, page, 1, 132]` with pages of 16, 32, 64 or 128 keys,
    int32 lengths/block table/candidates, unit column strides, no padding and more than 512
    candidate columns. It then writes the compact candidate rows and
    their top 512 (`compact_top_k_512` of ops/topk.py) into `indices` and returns True, and vLLM
    skips its dense logits, candidate mask and top-k. Otherwise it returns False having written
    nothing, and vLLM runs its own path. A row's candidate ids are taken as distinct, as layer
    20 writes them (vLLM's selection and the plugin's: a top-K of distinct blocks; a repeated
    id would list its columns twice); ids past the row's end, however large, are dead.
    `check(logits, ids)`, when given, sees the compact rows before their top-k; when it returns
    False the hook returns False, `indices` untouched (the indexer's comparison with vLLM's dense
    logits of a synthetic step, ``indexer._cand_probe``)."""
    if not _hook_takes(
        q_fp8, kv_cache, weights, seq_lens, block_table, candidates, block_size, indices,
        topk_tokens, dense_is_aiter_gluon, requires_padding,
    ):  # fmt: skip
        return False
    try:
        topk = importlib.import_module(f"{__package__}.topk")
        compact_top_k_512, serves = topk.compact_top_k_512, topk.serves
    except (ImportError, AttributeError) as err:
        from .._log import logger  # vLLM's logger; imported here so the kernels run without vLLM

        # The text, not the exception: a new exception object each call would log each call.
        logger.debug_once("candidate logits: no compact top-512 (%s), vLLM's path runs", str(err))
        return False
    # Its code object may be missing (a failed build): then decline before any work. So does
    # q off the current GPU: Triton launches the logits kernel on the current device, which
    # would read another device's memory (the top-k, too late, declines such tensors itself).
    if not serves(q_fp8):
        return False
    batch, next_n = q_fp8.shape[:2]
    rows = batch * next_n
    candidates = candidates[:rows]
    row_len = candidates.shape[1] * block_size
    logits = torch.empty(rows, row_len, device=q_fp8.device, dtype=torch.float32)
    ids = torch.empty(rows, row_len, device=q_fp8.device, dtype=torch.int32)
    candidate_logits(
        q_fp8.view(rows, *q_fp8.shape[2:]),
        kv_cache,
        weights[:rows],
        seq_lens,
        next_n,
        block_table,
        candidates,
        block_size,
        logits,
        ids,
    )
    if check is not None and not check(logits, ids):
        return False
    return bool(compact_top_k_512(logits, ids, seq_lens, next_n, indices[:rows, :512]))
