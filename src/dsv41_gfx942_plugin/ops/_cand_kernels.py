"""Gluon kernels of the candidate-only indexer logits; ``cand_logits.py`` launches them.

Position i of compact row r holds the logit of column `8 * cand[r][i // 8] + i % 8` and that
column as its id, or -inf and id -1 when the block entry is -1 or the column is at or past the
row's end (``_column_addresses`` says which end: where AITER's dense kernel stops writing logits).

`_cand_logits_gfx942` does each logit's arithmetic the way AITER's gfx942 kernel
(`_gluon_deepgemm_fp8_paged_mqa_logits_preshuffle`, ChunkK = 256 run as two MFMA stages of 128
columns) does: the same MFMA layout and `v_mfma_f32_16x16x32_fp8_fp8`, a zero accumulator, times
the key's scale, ReLU, times the head weights, and the heads summed by one reduction inside a wave
whose order does not depend on the column's place in the tile. Only the key's address differs, so
each logit is meant to be bit-identical to the dense one (a gfx942-marked test checks it).
`_cand_logits_portable` is a twin with blocked layouts and multiply-and-sum that runs anywhere
(tested on an NVIDIA H200). Both call `_column_addresses`, the one place that maps candidate ->
column -> page -> key address, so the twin's tests execute the gfx942 kernel's addressing.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from . import _cand_layout

# Columns of one gfx942 MFMA stage: the dense kernel runs ChunkK = 256 as two stages of 128.
COLUMNS = 128
# Columns of one portable-twin stage (a [dim, columns] fp32 tile in registers).
TWIN_COLUMNS = 64
# The cache stores each page's keys shuffled in groups of 16 keys x 16 bytes (vLLM's SHUFFLE
# layout for page size > 1, which the dense kernel's `offset_k_fixed` reads).
KEY_GROUP = 16
SHUFFLE = gl.constexpr(KEY_GROUP)


@gluon.jit
def _column_addresses(
    cols,
    dims,
    row,
    seq_lens,
    next_n,
    block_table,
    stride_bt_row,
    cand,
    stride_cand_row,
    row_len,
    stride_k_page,
    stride_scale_page,
    SeqLensIs2D: gl.constexpr,
    CandBlock: gl.constexpr,
    PageSize: gl.constexpr,
    HiddenDim: gl.constexpr,
):
    """For compact columns `cols` of `row` (and key dims `dims`, the other axis of the tile):
    the 64-bit key offsets [dims, cols], the scale offsets [cols], the ids (column or -1) and
    whether each is live. A dead entry reads page 0's first key, so every load stays inside the
    cache; the caller replaces its logit with -inf."""
    # The row's end. 1-D lengths: the causal end vLLM's top_k_per_row_decode takes. 2-D ones
    # ([requests, next_n]): the row's own, but no further than AITER's dense kernel writes logits:
    # handed the request's last length alone (vLLM's _per_sequence_context_lens), it writes -inf
    # from last - next_n + j + 1 on, and vLLM's builder, which divides each row's length by the
    # compress ratio, ends row j one later at ratio 2 and an odd length. vLLM's top-k ranks that
    # column -inf; here it is dead.
    if SeqLensIs2D:
        last = gl.load(seq_lens + (row // next_n) * next_n + next_n - 1)
        end = gl.minimum(gl.load(seq_lens + row), last - next_n + row % next_n + 1)
    else:
        end = gl.load(seq_lens + row // next_n) - next_n + row % next_n + 1
    block = gl.load(
        cand + row.to(gl.int64) * stride_cand_row + cols // CandBlock,
        mask=cols < row_len,
        other=-1,
    )
    # A block past the row's end is dead before its position is formed, so a stale id (2**28
    # and more) cannot wrap the int32 product to a live-looking negative position.
    block = gl.where((block >= 0) & (block <= end // CandBlock), block, -1)
    position = block * CandBlock + cols % CandBlock
    live = (block >= 0) & (position < end)
    position = gl.where(live, position, 0)
    # Row r reads the pages of its request, r // next_n, as the dense kernel does.
    page = gl.load(
        block_table + (row // next_n).to(gl.int64) * stride_bt_row + position // PageSize,
        mask=live,
        other=0,
    ).to(gl.int64)
    key = position % PageSize
    key_offsets = page * stride_k_page + (
        key % SHUFFLE * 16 + key // SHUFFLE * (SHUFFLE * HiddenDim)
    )
    dim_offsets = dims % 16 + dims // 16 * (SHUFFLE * 16)
    offsets = key_offsets[None, :] + dim_offsets[:, None]
    scale_offsets = page * stride_scale_page + key
    ids = gl.where(live, position, -1)
    return offsets, scale_offsets, ids, live


@gluon.jit
def _cand_logits_gfx942(
    q,
    stride_q_row,
    stride_q_head,
    keys,
    stride_k_page,
    scales,
    stride_scale_page,
    seq_lens,
    next_n,
    block_table,
    stride_bt_row,
    cand,
    stride_cand_row,
    weights,
    stride_w_row,
    out_logits,
    out_ids,
    row_len,
    splits_per_row,
    SeqLensIs2D: gl.constexpr,
    StagesPerProgram: gl.constexpr,
    Heads: gl.constexpr,
    HiddenDim: gl.constexpr,
    PageSize: gl.constexpr,
    CandBlock: gl.constexpr,
):
    # AITER's gfx942 layouts for ChunkQ = Heads, ChunkK = 256 (ChunkKPerStage = 128), 4 waves.
    NumWarps: gl.constexpr = 4
    ThreadsPerWarp: gl.constexpr = 64
    Columns: gl.constexpr = 128
    MFMAPerWarp: gl.constexpr = Columns // 16 // NumWarps
    layout_q: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[Heads // (NumWarps * ThreadsPerWarp // (HiddenDim // 16)), 16],
        threads_per_warp=[ThreadsPerWarp // (HiddenDim // 16), HiddenDim // 16],
        warps_per_cta=[NumWarps, 1],
        order=[1, 0],
    )
    if _cand_layout.USE_2D_INSTR_SHAPE:
        mfma: gl.constexpr = gl.amd.AMDMFMALayout(
            version=3,
            instr_shape=[16, 16],
            transposed=False,
            warps_per_cta=[1, NumWarps],
            tiles_per_warp=[1, MFMAPerWarp],
        )
    else:
        mfma: gl.constexpr = gl.amd.AMDMFMALayout(
            version=3,
            instr_shape=[16, 16, 32],
            transposed=False,
            warps_per_cta=[1, NumWarps],
            tiles_per_warp=[1, MFMAPerWarp],
        )
    mfma_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mfma, k_width=16)
    mfma_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mfma, k_width=16)
    layout_out: gl.constexpr = gl.SliceLayout(0, mfma)

    pid = gl.program_id(0)
    row = pid // splits_per_row
    split = pid % splits_per_row
    q_tile = gl.amd.cdna3.buffer_load(
        ptr=q,
        offsets=row * stride_q_row
        + (gl.arange(0, Heads, layout=gl.SliceLayout(1, layout_q)) * stride_q_head)[:, None]
        + gl.arange(0, HiddenDim, layout=gl.SliceLayout(0, layout_q))[None, :],
    )
    mfma_q = gl.convert_layout(q_tile, mfma_a)
    head_weights = gl.amd.cdna3.buffer_load(
        ptr=weights,
        offsets=row * stride_w_row + gl.arange(0, Heads, layout=gl.SliceLayout(1, mfma)),
    )
    dims = gl.arange(0, HiddenDim, layout=gl.SliceLayout(1, mfma_b))
    zero = gl.zeros((Heads, Columns), dtype=gl.float32, layout=mfma)
    out_row = row.to(gl.int64) * row_len

    for stage in range(StagesPerProgram):
        first = (split * StagesPerProgram + stage) * Columns
        cols = first + gl.arange(0, Columns, layout=gl.SliceLayout(0, mfma_b))
        offsets, scale_offsets, ids, live = _column_addresses(
            cols, dims, row, seq_lens, next_n, block_table, stride_bt_row, cand,
            stride_cand_row, row_len, stride_k_page, stride_scale_page,
            SeqLensIs2D, CandBlock, PageSize, HiddenDim,
        )  # fmt: skip
        k = gl.load(keys + offsets)
        k_scale = gl.load(scales + scale_offsets)
        o = gl.amd.cdna3.mfma(mfma_q, gl.convert_layout(k, mfma_b), zero)
        o = o * gl.convert_layout(k_scale, layout_out)[None, :]
        o = gl.maximum(o, 0.0)
        o = o * head_weights[:, None]
        logits = gl.reduce(o, axis=0, combine_fn=_cand_layout.sum_combine)

        cols_out = gl.convert_layout(cols, layout_out)
        live_out = gl.convert_layout(live, layout_out)
        in_row = cols_out < row_len
        gl.store(
            out_logits + out_row + cols_out,
            gl.where(live_out, logits, float("-inf")),
            mask=in_row,
        )
        gl.store(out_ids + out_row + cols_out, gl.convert_layout(ids, layout_out), mask=in_row)


@gluon.jit
def _cand_logits_portable(
    q,
    stride_q_row,
    stride_q_head,
    keys,
    stride_k_page,
    scales,
    stride_scale_page,
    seq_lens,
    next_n,
    block_table,
    stride_bt_row,
    cand,
    stride_cand_row,
    weights,
    stride_w_row,
    out_logits,
    out_ids,
    row_len,
    splits_per_row,
    SeqLensIs2D: gl.constexpr,
    StagesPerProgram: gl.constexpr,
    Heads: gl.constexpr,
    HiddenDim: gl.constexpr,
    PageSize: gl.constexpr,
    CandBlock: gl.constexpr,
    Columns: gl.constexpr,
    ThreadsPerWarp: gl.constexpr,
):
    """The twin: same addressing, float multiply-and-sum over a [dim, columns] tile per head."""
    NumWarps: gl.constexpr = 4
    tile: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[HiddenDim // 8, 1],
        threads_per_warp=[8, ThreadsPerWarp // 8],
        warps_per_cta=[1, NumWarps],
        order=[0, 1],
    )
    layout_cols: gl.constexpr = gl.SliceLayout(0, tile)

    pid = gl.program_id(0)
    row = pid // splits_per_row
    split = pid % splits_per_row
    dims = gl.arange(0, HiddenDim, layout=gl.SliceLayout(1, tile))
    q_row = q + row.to(gl.int64) * stride_q_row
    out_row = row.to(gl.int64) * row_len

    for stage in range(StagesPerProgram):
        first = (split * StagesPerProgram + stage) * Columns
        cols = first + gl.arange(0, Columns, layout=layout_cols)
        offsets, scale_offsets, ids, live = _column_addresses(
            cols, dims, row, seq_lens, next_n, block_table, stride_bt_row, cand,
            stride_cand_row, row_len, stride_k_page, stride_scale_page,
            SeqLensIs2D, CandBlock, PageSize, HiddenDim,
        )  # fmt: skip
        k = gl.load(keys + offsets).to(gl.float32)
        k_scale = gl.load(scales + scale_offsets)
        logits = gl.zeros((Columns,), dtype=gl.float32, layout=layout_cols)
        for h in range(Heads):
            q_h = gl.load(q_row + h * stride_q_head + dims).to(gl.float32)
            dot = gl.reduce(k * q_h[:, None], axis=0, combine_fn=_cand_layout.sum_combine)
            w_h = gl.load(weights + row * stride_w_row + h)
            logits += gl.maximum(dot * k_scale, 0.0) * w_h
        in_row = cols < row_len
        gl.store(out_logits + out_row + cols, gl.where(live, logits, float("-inf")), mask=in_row)
        gl.store(out_ids + out_row + cols, ids, mask=in_row)
