"""Raw Triton kernels of the fused DSpark Markov sampling; ``fused_markov.py`` launches them.

One launch a draft step, grid ``(cdiv(rows, R_TILE), cdiv(V, BV))``: program ``(t, p)`` owns rows
``[t*R_TILE, (t+1)*R_TILE)`` (``R_EPI`` of them past the GEMM) and tokens ``[p*BV, (p+1)*BV)``.
The row tile is the fastest-varying program id, so the programs reading one block of
``markov_w2`` run side by side and all but the first find it in L2 (on gfx942, whose dies each
have their own L2, the programs are first reordered so that those run on one die:
``_xcd_order``); odd steps take the vocabulary blocks in reverse, so a step starts on the blocks
its predecessor read last, still in L2 (66 MB ``markov_w2``, 50 MB L2 on an H200). A program

1. takes its rows' previous tokens: step 0 the anchor ``input_ids[anchor_idx[r]]``, a later step
   the previous step's winner (block 0's programs also store it in ``draft_tokens[r, step - 1]``);
2. computes the Markov bias ``bf16(sum_k w1[prev, k] * w2[v, k])``, an fp32 sum of the exact
   products, as vLLM's bf16 GEMV does (its summation order differs: the last bf16 bit may too).
   The rows of a step are a small GEMM (``tl.dot``, the rank loop software-pipelined; tokens as
   its M, rows as its N), so each block of ``markov_w2`` leaves DRAM about once a step for all
   rows;
3. ``logits = bf16(base + bias)`` (one rounding, as a bf16 tensor add), stored pre-temperature
   into ``draft_logits[req, step]`` for a live row (``req >= 0``) of a probabilistic draft;
4. ``y = logits / temp`` plus vLLM's Gumbel noise for the row's (seed, step, position, token)
   (vLLM's murmur3 helpers from ``vllm/v1/worker/gpu/sample/gumbel.py``), or ``y = logits`` for a
   greedy draft, a zero temperature, an inert row;
5. the winner: the largest ``y``, the first token among equal ones, -0 equal to +0. A NaN wins a
   greedy draft (torch's argmax, vLLM's greedy path) and never wins a sampled one (vLLM's Gumbel
   kernel drops it under the interpreter; on a GPU its block reduction keeps or drops a NaN
   depending on where it sits). With fp32 noise ``y`` and the token fit one int64,
   ``order(y) << 32 | (2**32 - 1 - token)``, whose maximum is the winner: every program finds its
   block's best of each row in int32 (the first of equal ones), ``atomic_max``-es that row's key
   into ``win[step, r]``, and the next step reads one key a row.
   With fp64 noise the key has no room for the token: each program writes its block's best
   (key, token) to a scratch row and the next step scans the row's blocks (slower, rare).

With ``FAST_LOG`` set (sampled fp32 drafts of large batches, ``fused_markov.GPU_CONFIGS``), step 4
takes every token's noise from the hardware's log2 instruction (``_noise32``), within
``FAST_NOISE_ERR`` of vLLM's noise, and each program also stores its block's best of each row;
``_markov_verify_kernel`` then recomputes, with vLLM's exact noise, each row's blocks whose best
comes within the error bound of the row's best, and writes the exact winner's key. A Gumbel
race's runner-up trails the winner by about one unit (an exponential gap), so that is one block a
row but for about one row in five hundred: vLLM's exact noise is paid for one block (64 or 128
tokens) a row instead of all of them.

The last step's tokens come from ``_markov_last_kernel``, which also resets ``win`` (``-2**63``) for
the next call, so every call starts from a clean slate without a fill launch.

The Triton interpreter (CPU tests) has no bf16 arithmetic, truncates fp32->bf16 casts and converts
bf16 loads element by element in Python: with ``NATIVE_BF16=False`` the bf16 tensors come as
their int16 bits, widened by a shift, and fp32 rounds to nearest-even with integer ops.
``USE_DOT`` (GPU only, ``R_TILE >= 16``) multiplies bf16 tiles with ``tl.dot``; otherwise the
products are upcast to fp32 and summed (exact products, so the sums differ only in order).
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice
from vllm.v1.worker.gpu.sample.gumbel import (
    _log1p_neg_stable,
    murmur3_uniform32,
    murmur3_uniform64,
    spec_step_seed,
)

# An int64 key below every real one (masked tokens; the winners' reset value).
KEY_MIN = tl.constexpr(-(2**63))
# vLLM's offset salt of drafting positions (gumbel.py's _DRAFT_NOISE_SALT).
DRAFT_NOISE_SALT = tl.constexpr(1 << 30)
# Bound on |fast noise - vLLM's noise| over every uniform vLLM draws (fp32 in [2**-33, 1]). The
# GPU test measures it exhaustively on the GPU at hand and requires at most a quarter of this
# (H200: 2.05e-5, the series below 2**-7, whose error is within u**2 / 3 = 2**-15.6).
FAST_NOISE_ERR = tl.constexpr(2.0**-10)
# Relative slack for the rounding of ``y = logits / temp + noise`` (a few fp32 ulps of |y|).
FAST_NOISE_REL = tl.constexpr(2.0**-20)
FAST_SERIES_MAX = tl.constexpr(2.0**-7)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _round_bf16(x, NATIVE_BF16: tl.constexpr):
    """fp32 -> nearest-even bf16, returned as the fp32 of that bf16 (NaN -> 0x7FC0, torch's)."""
    if NATIVE_BF16:
        return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    r = tl.where(x != x, 0x7FC00000, r)
    return r.to(tl.float32, bitcast=True)


@triton.jit
def _load_f32(ptr, mask, NATIVE_BF16: tl.constexpr):
    """bf16 values as fp32. Without native bf16, ``ptr`` points at their int16 bits: the
    interpreter converts bf16 element by element in Python, this is one shift."""
    if NATIVE_BF16:
        return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(ptr, mask=mask, other=0).to(tl.int32) & 0xFFFF
    return (b << 16).to(tl.float32, bitcast=True)


@triton.jit
def _store_bf16(ptr, x, mask, NATIVE_BF16: tl.constexpr):
    """Stores fp32 values that are exact bf16 (the int16 bits without native bf16)."""
    if NATIVE_BF16:
        tl.store(ptr, x.to(tl.bfloat16), mask=mask)
    else:
        tl.store(ptr, (x.to(tl.int32, bitcast=True) >> 16).to(tl.int16), mask=mask)


@triton.jit
def _fast_log(x, FAST_LOG: tl.constexpr):
    """ln(x) for positive normal x, fast: ``"ptx"`` libdevice's ``__nv_fast_logf`` (one
    ``lg2.approx`` where the exact ``logf`` is a software routine); otherwise ``tl.log2`` (on
    gfx942 one ``v_log_f32`` with its denormal scaling, without the exact log's extra-precision
    fix-up; no inline assembly, so the compiler keeps the wait state a gfx942 transcendental's
    result needs; under the interpreter, numpy's log2)."""
    if FAST_LOG == "ptx":
        return libdevice.fast_logf(x)  # the backend's libdevice, resolved at compile time
    return tl.log2(x) * LN2


@triton.jit
def _noise32(u, FAST_LOG: tl.constexpr):
    """vLLM's fp32 Gumbel noise of the uniform ``u`` (``FAST_LOG`` empty), or its fast
    approximation within ``FAST_NOISE_ERR``: ``log(1 - u)`` from the series ``-u (1 + u / 2)``
    below ``FAST_SERIES_MAX``, else from the fast log of vLLM's clamped ``1 - u``."""
    if FAST_LOG == "":
        return -tl.log(-_log1p_neg_stable(u))
    series = -u * (1.0 + 0.5 * u)
    direct = _fast_log(tl.maximum(1.0 - u, 5.960464477539063e-08), FAST_LOG)
    return -_fast_log(-tl.where(u < FAST_SERIES_MAX, series, direct), FAST_LOG)


@triton.jit
def _draft_noise_key(seed, pos, step):
    """The (seed, position) that vLLM's ``gumbel_sample`` keys a draft step's noise by: the
    request's seed mixed with the step, and the position before the sampled token, salted. The
    step and verify kernels both draw with it, so their noises are the same draws."""
    return spec_step_seed(seed, step), pos - 1 + DRAFT_NOISE_SALT


@triton.jit
def _order32(y, NAN_MAX: tl.constexpr):
    """int32 whose signed order is y's (fp32), with -0 == +0 and every NaN the largest
    (``NAN_MAX``) or below -inf."""
    y = tl.where(y == 0.0, 0.0, y)
    b = y.to(tl.int32, bitcast=True)
    o = tl.where(b >= 0, b, b ^ 0x7FFFFFFF)
    return tl.where(y != y, 0x7FFFFFFF if NAN_MAX else -0x80000000, o)


@triton.jit
def _first_max(y, valid, BV: tl.constexpr, NAN_MAX: tl.constexpr):
    """Each row's largest ``y`` among its valid entries as an ``_order32`` value, and the first
    column holding it: what the largest ``_order32`` key of each entry (masked ones at -2**31)
    would give, from float compares instead of a key a token. With ``NAN_MAX`` a NaN is the
    largest (the first NaN wins; masked entries, which only ever follow a row's valid ones, sit at
    -inf); without, a NaN never wins and a row with no other valid entry gives ``(-2**31, 0)``.
    H200, 5 steps at 256 rows: sampled 730.2-736.2 -> 681.9-687.0 us, greedy 551.9-553.8 ->
    524.6-525.4, the same tokens (benchmarks/markov_sweeps.md); static instructions sampled /
    greedy 1488 / 784 -> 1376 / 704 (sm_90), 1506 / 881 -> 1429 / 854 (gfx942)."""
    cols = tl.arange(0, BV)[None, :]
    if NAN_MAX:
        yv = tl.where(valid, y, float("-inf"))
        m = tl.max(yv, axis=1)  # NaN-ignoring
        # One reduction: a NaN at column c keys c, a maximum BV + c, so the first NaN wins.
        k = tl.where(yv != yv, cols, tl.where(yv == m[:, None], cols + BV, 2 * BV))
        k = tl.min(k, axis=1)
        nan = k < BV
        return tl.where(nan, 0x7FFFFFFF, _order32(m, True)), tl.where(nan, k, k - BV)
    yv = tl.where(valid, y, float("nan"))
    m = tl.max(yv, axis=1)  # NaN-ignoring, as tl.maximum
    col = tl.min(tl.where(yv == m[:, None], cols, BV), axis=1)
    none = col == BV
    return tl.where(none, -0x80000000, _order32(m, False)), tl.where(none, 0, col)


@triton.jit
def _pack_key(order, token):
    """The int64 winner key of an ``_order32`` value and its token: ``order << 32 | (2**32 - 1 -
    token)``, so the larger value wins and, among equal ones, the first token."""
    return (order.to(tl.int64) << 32) | (0xFFFFFFFF - token.to(tl.int64))


@triton.jit
def _order64(y, NAN_MAX: tl.constexpr):
    """int64 whose signed order is y's (fp64), as ``_order32``; NaN stays above the key floor."""
    y = tl.where(y == 0.0, 0.0, y)
    b = y.to(tl.int64, bitcast=True)
    o = tl.where(b >= 0, b, b ^ 0x7FFFFFFFFFFFFFFF)
    return tl.where(y != y, 0x7FFFFFFFFFFFFFFF if NAN_MAX else -0x7FFFFFFFFFFFFFFF, o)


@triton.jit
def _xcd_order(lin, total, XCDS: tl.constexpr):
    """The program that dispatch slot ``lin`` (of ``total``) runs, so that each of ``XCDS``
    dies gets consecutive programs. gfx942 deals workgroups to its XCDs (each with its own L2)
    in turn, slot ``lin`` to die ``lin % XCDS``: without this the row tiles sharing a block of
    markov_w2 land on different dies, and every die's L2 fetches the block. Die ``d`` runs
    programs ``[first_d, first_d + count_d)`` in order, the first dies one more than the rest
    when ``total`` is not a multiple of ``XCDS``. A bijection on ``[0, total)``."""
    per = (total + XCDS - 1) // XCDS  # programs of the dies that take one more
    tall = total - (per - 1) * XCDS  # how many dies take `per` (1..XCDS)
    die = lin % XCDS
    k = lin // XCDS
    return tl.where(die < tall, die * per + k, tall * per + (die - tall) * (per - 1) + k)


@triton.jit
def _prev_tokens(
    r,
    rmask,
    step,
    input_ids_ptr,
    anchor_ptr,
    win_ptr,
    win_stride,
    keys_ptr,
    toks_ptr,
    scr_stride,
    nb,
    PACKED: tl.constexpr,
    NB_CHUNK: tl.constexpr,
):
    """The token each row of ``r`` sampled at step ``step - 1`` (its anchor at step 0)."""
    if step == 0:
        anchor = tl.load(anchor_ptr + r, mask=rmask, other=0)
        prev = tl.load(input_ids_ptr + anchor, mask=rmask, other=0).to(tl.int64)
    elif PACKED:
        key = tl.load(win_ptr + (step - 1) * win_stride + r, mask=rmask, other=0)
        prev = 0xFFFFFFFF - (key & 0xFFFFFFFF)
    else:
        # First block holding the row's largest key: its token is the first of equal maxima.
        best = tl.full(r.shape, KEY_MIN, tl.int64)
        best_j = tl.zeros(r.shape, tl.int32)
        for j0 in range(0, nb, NB_CHUNK):
            j = j0 + tl.arange(0, NB_CHUNK)
            m2 = rmask[:, None] & (j < nb)[None, :]
            k = tl.load(keys_ptr + r[:, None] * scr_stride + j[None, :], mask=m2, other=KEY_MIN)
            m, jj = tl.max(k, axis=1, return_indices=True, return_indices_tie_break_left=True)
            upd = m > best
            best = tl.where(upd, m, best)
            best_j = tl.where(upd, j0 + jj, best_j)
        prev = tl.load(toks_ptr + r * scr_stride + best_j, mask=rmask, other=0).to(tl.int64)
    return prev


# The runtime ints that change between launches of one configuration (the batch's rows, the
# draft step) are not specialized: Triton would otherwise compile a variant for the value 1,
# one for multiples of 16 and one for the rest, up to 9 a configuration and 3 in every first
# call (steps 0, 1 and 2-4), each a compile at start-up. H200, the first calls (compiles) of 8
# row counts, sampled and greedy: 60 step-kernel variants in 45.2 s -> 30 in 25.2 s with these
# ints unspecialized, launch times within 1% (same run, same tokens); -> 15 in 10.6 s with the
# step's requests and positions read from their base (below).
@triton.jit
def _bias_chunk(
    acc,
    w1_ptr,
    w2_ptr,
    prev,
    rmask,
    v64,
    vmask,
    k,
    RANK: tl.constexpr,
    USE_DOT: tl.constexpr,
    NATIVE_BF16: tl.constexpr,
):
    """acc [BV, R_TILE] plus the products of rank chunk ``k`` of the previous tokens'
    embeddings (markov_w1 rows ``prev``) and the block's markov_w2 rows ``v64``."""
    e_ptr = w1_ptr + prev[:, None] * RANK + k[None, :]
    w_ptr = w2_ptr + v64[:, None] * RANK + k[None, :]
    if USE_DOT:
        e = tl.load(e_ptr, mask=rmask[:, None], other=0.0)
        w = tl.load(w_ptr, mask=vmask[:, None], other=0.0)
        return tl.dot(w, tl.trans(e), acc)
    e = _load_f32(e_ptr, rmask[:, None], NATIVE_BF16)
    w = _load_f32(w_ptr, vmask[:, None], NATIVE_BF16)
    return acc + tl.sum(w[:, None, :] * e[None, :, :], axis=2)


@triton.jit
def _epilogue(
    acc,
    pid,
    v,
    vmask,
    r,
    rmask,
    rows,
    step,
    base_ptr,
    base_stride,
    idx_ptr,
    map_stride,
    cache_ptr,
    cache_s0,
    cache_s1,
    temp_ptr,
    seeds_ptr,
    pos_ptr,
    win_ptr,
    win_stride,
    bbest_ptr,
    scr_stride,
    out_keys_ptr,
    out_toks_ptr,
    BV: tl.constexpr,
    R_TILE: tl.constexpr,
    R_EPI: tl.constexpr,
    GREEDY: tl.constexpr,
    USE_FP64: tl.constexpr,
    NATIVE_BF16: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    """Steps 3-5 for vocabulary block ``pid`` (tokens ``v``) of the rows ``r``, from its
    fp32 bias sums ``acc`` [BV, R_TILE]: the logits, the cache, the noise, the block's
    winner of each row."""
    PACKED: tl.constexpr = not USE_FP64
    acc = tl.trans(acc)
    if R_EPI < R_TILE:
        # Fewer rows than the tile (padded for tl.dot; one tile): fold the padded rows, exact
        # zeros, away so the epilogue works on R_EPI rows only.
        acc = tl.sum(tl.reshape(acc, [R_TILE // R_EPI, R_EPI, BV]), axis=0)
        r = tl.arange(0, R_EPI)
        rmask = r < rows
    m2 = rmask[:, None] & vmask[None, :]
    bias = _round_bf16(acc, NATIVE_BF16)
    base = _load_f32(base_ptr + r[:, None].to(tl.int64) * base_stride + v[None, :], m2, NATIVE_BF16)
    logits = _round_bf16(base + bias, NATIVE_BF16)

    if GREEDY:
        y = logits
    else:
        req = tl.load(idx_ptr + r * map_stride + step, mask=rmask, other=-1)
        live = rmask & (req >= 0)
        # Pre-temperature, as gumbel_sample caches them for the rejection sampler.
        cache = cache_ptr + req[:, None] * cache_s0 + step * cache_s1 + v[None, :]
        _store_bf16(cache, logits, m2 & live[:, None], NATIVE_BF16)
        temp = tl.load(temp_ptr + req, mask=live, other=0.0).to(tl.float32)[:, None]
        hot = temp != 0.0
        y = logits
        # x / 1 == x exactly: the division (an IEEE one, several instructions) only where a
        # row of the tile has another temperature.
        if tl.max(tl.where(hot & (temp != 1.0), 1, 0)) > 0:
            y = tl.where(hot, logits / tl.where(hot, temp, 1.0), logits)
        if USE_FP64:
            y = y.to(tl.float64)
        if tl.max(tl.where(hot, 1, 0)) > 0:
            seed, pos = _draft_noise_key(
                tl.load(seeds_ptr + req, mask=live, other=0),
                tl.load(pos_ptr + r * map_stride + step, mask=rmask, other=1),
                step,
            )
            seed, pos = seed[:, None], pos[:, None]
            if USE_FP64:
                u = murmur3_uniform64(seed, pos, v[None, :])
                noise = -tl.log(-tl.log(u))
            else:
                noise = _noise32(murmur3_uniform32(seed, pos, v[None, :]), FAST_LOG)
            y = tl.where(hot, y + noise, y)

    if PACKED:
        # The block's best of each row in int32 (its first index among equal ones), then one
        # int64 key a row. Relaxed: only the next launch reads the key, and a kernel boundary
        # orders it; Triton's default (acq_rel) fences every program at device scope, on gfx942
        # an L2 write-back and invalidate around each atomic (buffer_wbl2 / buffer_inv sc1).
        best, at = _first_max(y, m2, BV, GREEDY)
        key = _pack_key(best, pid * BV + at)
        tl.atomic_max(win_ptr + step * win_stride + r, key, mask=rmask, sem="relaxed")
        if FAST_LOG != "":
            tl.store(bbest_ptr + r * scr_stride + pid, best, mask=rmask)
    else:
        key = tl.where(m2, _order64(y, GREEDY), KEY_MIN)
        best, at = tl.max(key, axis=1, return_indices=True, return_indices_tie_break_left=True)
        tl.store(out_keys_ptr + r * scr_stride + pid, best, mask=rmask)
        tl.store(out_toks_ptr + r * scr_stride + pid, pid * BV + at, mask=rmask)


@triton.jit(do_not_specialize=["rows", "step"])
def _markov_step_kernel(
    input_ids_ptr,  # int32 [max_tokens]; step 0's previous token is input_ids[anchor_idx[r]]
    anchor_ptr,  # int64 [rows]
    w1_ptr,  # bf16 [w1_rows, RANK] markov_w1 (embedding of the previous token)
    w1_rows,
    w2_ptr,  # bf16 [>= vocab, RANK] markov_w2 (bias head)
    base_ptr,  # bf16 base logits of (row r, this step) at base_ptr + r * base_stride + v
    base_stride,
    # int64 sample_idx_mapping of (row r, step s) at idx_ptr + r * map_stride + s: the base, not
    # the step's column, whose odd steps' 8-byte alignment would be one more JIT variant
    idx_ptr,
    pos_ptr,  # int64 sample_pos, the same layout
    map_stride,
    temp_ptr,  # fp32 [max_num_reqs]
    seeds_ptr,  # int64 [max_num_reqs]
    cache_ptr,  # bf16 draft_logits [max_num_reqs, n_spec, >= vocab]
    cache_s0,
    cache_s1,
    tokens_ptr,  # int64 draft_tokens [max_num_reqs, n_spec]
    tokens_stride,
    win_ptr,  # int64 [n_spec, >= rows] packed winners (PACKED)
    win_stride,
    prev_keys_ptr,  # int64 / int32 [max_rows, nb] the previous step's block bests (fp64 noise)
    prev_toks_ptr,
    out_keys_ptr,  # this step's block bests (fp64 noise)
    out_toks_ptr,
    scr_stride,
    bbest_ptr,  # int32 [max_rows, nb] this step's block bests (FAST_LOG)
    rows,
    vocab,
    step,
    nb,
    RANK: tl.constexpr,
    BV: tl.constexpr,
    BK: tl.constexpr,
    R_TILE: tl.constexpr,
    R_EPI: tl.constexpr,
    GREEDY: tl.constexpr,
    USE_FP64: tl.constexpr,
    USE_DOT: tl.constexpr,
    NATIVE_BF16: tl.constexpr,
    NB_CHUNK: tl.constexpr,
    FAST_LOG: tl.constexpr,
    XCDS: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    # Row tile fastest: the programs reading one block of markov_w2 run side by side (L2 hits),
    # on one die of a multi-die GPU (XCDS > 1, _xcd_order). Odd steps walk the vocabulary
    # backwards: they start on the blocks the step before read last, still in L2 (H200-measured,
    # graphed, 5 steps at 1 row: 122 -> 103 us).
    tile = tl.program_id(0)
    p = tl.program_id(1)
    if XCDS > 1 and BLOCKS == 1:
        tiles = tl.num_programs(0)
        lin = _xcd_order(tile + tiles * p, tiles * nb, XCDS)
        tile = lin % tiles
        p = lin // tiles
    pid = tl.where(step % 2 == 1, nb - 1 - p, p)
    v = pid * BV + tl.arange(0, BV)
    vmask = v < vocab
    v64 = v.to(tl.int64)
    PACKED: tl.constexpr = not USE_FP64
    r = tile * R_TILE + tl.arange(0, R_TILE)
    rmask = r < rows
    prev = _prev_tokens(
        r,
        rmask,
        step,
        input_ids_ptr,
        anchor_ptr,
        win_ptr,
        win_stride,
        prev_keys_ptr,
        prev_toks_ptr,
        scr_stride,
        nb,
        PACKED,
        NB_CHUNK,
    )
    # One program of the row tile stores the previous tokens: block 0's (the first program's when
    # a program walks several blocks, of which block 0 is the last in an odd step).
    first = pid if BLOCKS == 1 else p
    tl.store(
        tokens_ptr + r * tokens_stride + (step - 1), prev, mask=rmask & (first == 0) & (step > 0)
    )
    # Never read outside markov_w1 (vLLM's embedding would raise on such an anchor).
    prev = tl.minimum(tl.maximum(prev, 0), w1_rows - 1)

    # The GEMM transposed, tokens as M and rows as N: [BV, R_TILE] (H200-measured, same run,
    # graphed, 5 steps, 1 / 8 / 32 / 64 / 128 / 256 rows: 101.5 / 119.4 / 185.5 / 275.8 / 466.4 /
    # 826.7 us with rows as M, 100.6 / 117.2 / 172.1 / 268.2 / 457.5 / 763.3 this way; the same
    # tokens and cached logits).
    acc = tl.zeros([BV, R_TILE], dtype=tl.float32)
    if BLOCKS == 1:
        for k0 in range(0, RANK, BK):  # software-pipelined on a GPU (num_stages)
            acc = _bias_chunk(
                acc,
                w1_ptr,
                w2_ptr,
                prev,
                rmask,
                v64,
                vmask,
                k0 + tl.arange(0, BK),
                RANK,
                USE_DOT,
                NATIVE_BF16,
            )
        _epilogue(
            acc,
            pid,
            v,
            vmask,
            r,
            rmask,
            rows,
            step,
            base_ptr,
            base_stride,
            idx_ptr,
            map_stride,
            cache_ptr,
            cache_s0,
            cache_s1,
            temp_ptr,
            seeds_ptr,
            pos_ptr,
            win_ptr,
            win_stride,
            bbest_ptr,
            scr_stride,
            out_keys_ptr,
            out_toks_ptr,
            BV,
            R_TILE,
            R_EPI,
            GREEDY,
            USE_FP64,
            NATIVE_BF16,
            FAST_LOG,
        )
    else:
        # BLOCKS vocabulary blocks a program, p, p + programs, ...: one pipelined loop over
        # (block, rank chunk), so a block's loads are in flight during the block before's
        # epilogue (small batches, whose programs otherwise all stream, then all compute).
        programs = tl.num_programs(1)
        KSTEPS: tl.constexpr = RANK // BK
        mine = tl.minimum((nb - p + programs - 1) // programs, BLOCKS)
        for it in range(0, mine * KSTEPS):
            j = it // KSTEPS
            pid = p + j * programs
            pid = tl.where(step % 2 == 1, nb - 1 - pid, pid)
            v = pid * BV + tl.arange(0, BV)
            vmask = v < vocab
            k = (it - j * KSTEPS) * BK + tl.arange(0, BK)
            acc = _bias_chunk(
                acc,
                w1_ptr,
                w2_ptr,
                prev,
                rmask,
                v.to(tl.int64),
                vmask,
                k,
                RANK,
                USE_DOT,
                NATIVE_BF16,
            )
            if it - j * KSTEPS == KSTEPS - 1:
                _epilogue(
                    acc,
                    pid,
                    v,
                    vmask,
                    r,
                    rmask,
                    rows,
                    step,
                    base_ptr,
                    base_stride,
                    idx_ptr,
                    map_stride,
                    cache_ptr,
                    cache_s0,
                    cache_s1,
                    temp_ptr,
                    seeds_ptr,
                    pos_ptr,
                    win_ptr,
                    win_stride,
                    bbest_ptr,
                    scr_stride,
                    out_keys_ptr,
                    out_toks_ptr,
                    BV,
                    R_TILE,
                    R_EPI,
                    GREEDY,
                    USE_FP64,
                    NATIVE_BF16,
                    FAST_LOG,
                )
                acc = tl.zeros([BV, R_TILE], dtype=tl.float32)


@triton.jit(do_not_specialize=["step"])
def _markov_verify_kernel(
    win_ptr,
    win_stride,
    bbest_ptr,
    scr_stride,
    idx_ptr,
    pos_ptr,
    map_stride,
    temp_ptr,
    seeds_ptr,
    cache_ptr,
    cache_s0,
    cache_s1,
    vocab,
    step,
    nb,
    BV: tl.constexpr,
    NB_P2: tl.constexpr,
    NATIVE_BF16: tl.constexpr,
):
    """Program r: row r's exact winner of a fast-noise step (``FAST_LOG``). A token whose exact
    value reaches the row's exact best has a fast value within ``2 * delta`` of the row's fast
    best ``m`` (each within ``delta`` of its exact one), so only the blocks whose fast best is
    ``>= m - 2 * delta`` are recomputed, from the cached logits, with vLLM's noise. Rows without
    noise (inert, zero temperature) and rows whose best is infinite or NaN (the noise cannot
    move those) keep their key."""
    r = tl.program_id(0)
    req = tl.load(idx_ptr + r * map_stride + step)
    live = req >= 0
    temp = tl.load(temp_ptr + req, mask=live, other=0.0).to(tl.float32)
    key = tl.load(win_ptr + step * win_stride + r)
    o = (key >> 32).to(tl.int32)
    m = tl.where(o >= 0, o, o ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    if (temp != 0.0) & (tl.abs(m) < float("inf")):
        delta = FAST_NOISE_ERR + tl.abs(m) * FAST_NOISE_REL
        j = tl.arange(0, NB_P2)
        bo = tl.load(bbest_ptr + r * scr_stride + j, mask=j < nb, other=-0x80000000)
        cand = bo >= _order32(m - 2.0 * delta, False)
        seed, pos = _draft_noise_key(
            tl.load(seeds_ptr + req), tl.load(pos_ptr + r * map_stride + step), step
        )
        best = tl.full([1], KEY_MIN, tl.int64)
        blk = tl.min(tl.where(cand, j, nb))
        while blk < nb:
            v = blk * BV + tl.arange(0, BV)[None, :]
            vmask = v < vocab
            logits = _load_f32(cache_ptr + req * cache_s0 + step * cache_s1 + v, vmask, NATIVE_BF16)
            y = logits / temp + _noise32(murmur3_uniform32(seed, pos, v), "")
            b, at = _first_max(y, vmask, BV, False)  # the step kernel's rule, one row
            best = tl.maximum(best, _pack_key(b, blk * BV + at))
            blk = tl.min(tl.where(cand & (j > blk), j, nb))
        tl.store(win_ptr + step * win_stride + r + tl.arange(0, 1), best)


@triton.jit(do_not_specialize=["rows"])
def _markov_last_kernel(
    tokens_ptr,
    tokens_stride,
    win_ptr,
    win_stride,
    keys_ptr,
    toks_ptr,
    scr_stride,
    rows,
    n_spec,
    nb,
    USE_FP64: tl.constexpr,
    R_TILE: tl.constexpr,
    NB_CHUNK: tl.constexpr,
):
    """Stores the last step's tokens and resets the packed winners of every step."""
    r = tl.program_id(0) * R_TILE + tl.arange(0, R_TILE)
    rmask = r < rows
    PACKED: tl.constexpr = not USE_FP64
    prev = _prev_tokens(
        r,
        rmask,
        n_spec,
        tokens_ptr,  # input_ids and anchor_idx: not read, n_spec > 0
        tokens_ptr,
        win_ptr,
        win_stride,
        keys_ptr,
        toks_ptr,
        scr_stride,
        nb,
        PACKED,
        NB_CHUNK,
    )
    tl.store(tokens_ptr + r * tokens_stride + (n_spec - 1), prev, mask=rmask)
    if PACKED:
        for s in range(0, n_spec):
            tl.store(win_ptr + s * win_stride + r, tl.full([R_TILE], KEY_MIN, tl.int64), mask=rmask)
