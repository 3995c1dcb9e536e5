"""Raw Triton kernels of the fused DSpark Markov sampling; ``fused_markov.py`` launches them.

One launch a draft step, grid ``(cdiv(rows, R_TILE), cdiv(cdiv(V, BV), BLOCKS))``: program
``(t, p)`` owns rows ``[t*R_TILE, (t+1)*R_TILE)`` (``R_EPI`` of them past the GEMM) and tokens
``[p*BV, (p+1)*BV)``, and with ``BLOCKS`` > 1 (small batches) also the blocks ``p + programs``,
``p + 2 * programs``, ... up to ``BLOCKS`` of them, in one pipelined loop (reading its rows'
request, temperature and noise key before it, and each block's base logits one block ahead).
The row tile is the fastest-varying program id, so the programs reading one block of
``markov_w2`` run side by side and all but the first find it in L2 (on gfx942, whose dies each
have their own L2, the programs are first reordered so that those run on one die:
``_xcd_order``); odd steps take the vocabulary blocks in reverse, so a step starts on the blocks
its predecessor read last, still in L2 (66 MB ``markov_w2``, 50 MB L2 on an H200). A program

1. takes its rows' previous tokens: step 0 the anchor ``input_ids[anchor_idx[r]]``, a later step
   the previous step's winner (one program of each row tile also stores it in
   ``draft_tokens[r, step - 1]``);
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
row but for about one row in five hundred: vLLM's exact noise is paid for one block (128
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
from vllm.v1.worker.gpu.sample.gumbel import murmur3_uniform32, murmur3_uniform64

from ._markov_math import (
    FAST_NOISE_ERR,
    FAST_NOISE_REL,
    KEY_MIN,
    _draft_noise_key,
    _first_max,
    _load_f32,
    _noise32,
    _order32,
    _order64,
    _pack_key,
    _round_bf16,
    _store_bf16,
    _xcd_order,
)


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
def _row_req(r, rmask, step, idx_ptr, map_stride):
    """The rows ``r``'s requests at this step (-1: inert, or past the batch)."""
    return tl.load(idx_ptr + r * map_stride + step, mask=rmask, other=-1)


@triton.jit
def _row_temp(req, live, temp_ptr):
    """The live rows' temperatures (0 for the others: no noise)."""
    return tl.load(temp_ptr + req, mask=live, other=0.0).to(tl.float32)


@triton.jit
def _row_key(req, live, r, rmask, step, seeds_ptr, pos_ptr, map_stride):
    """The rows' noise key at this step: vLLM's (seed, salted position)."""
    seed = tl.load(seeds_ptr + req, mask=live, other=0)
    return _draft_noise_key(
        seed, tl.load(pos_ptr + r * map_stride + step, mask=rmask, other=1), step
    )


@triton.jit
def _base_tile(base_ptr, base_stride, r, rmask, v, vmask, NATIVE_BF16: tl.constexpr):
    """The base logits of rows ``r`` at tokens ``v``, as fp32 [rows, tokens]."""
    ptr = base_ptr + r[:, None].to(tl.int64) * base_stride + v[None, :]
    return _load_f32(ptr, rmask[:, None] & vmask[None, :], NATIVE_BF16)


@triton.jit
def _block(p, j, programs, nb, step):
    """The vocabulary block of program ``p``'s ``j``-th trip: ``p + j * programs``, counted from
    the far end in odd steps."""
    pid = p + j * programs
    return tl.where(step % 2 == 1, nb - 1 - pid, pid)


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
    io,
    base,
    state,
    BV: tl.constexpr,
    R_TILE: tl.constexpr,
    R_EPI: tl.constexpr,
    GREEDY: tl.constexpr,
    USE_FP64: tl.constexpr,
    NATIVE_BF16: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    """Steps 3-5 for vocabulary block ``pid`` (tokens ``v``) of the rows ``r``, from its
    fp32 bias sums ``acc`` [BV, R_TILE]: the logits, the cache, the noise, the block's winner of
    each row. ``io``: the step's tensors it reads and writes (``_markov_step_kernel``'s, in the
    order unpacked below). The block's base logits (``base``) and the rows' state (``state``:
    request, temperature and noise key) come read, or None: read here, after the GEMM."""
    (
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
    ) = io
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
    if base is None:
        base = _base_tile(base_ptr, base_stride, r, rmask, v, vmask, NATIVE_BF16)
    logits = _round_bf16(base + bias, NATIVE_BF16)

    if GREEDY:
        y = logits
    else:
        req = _row_req(r, rmask, step, idx_ptr, map_stride) if state is None else state[0]
        live = rmask & (req >= 0)
        # Pre-temperature, as gumbel_sample caches them for the rejection sampler.
        cache = cache_ptr + req[:, None] * cache_s0 + step * cache_s1 + v[None, :]
        _store_bf16(cache, logits, m2 & live[:, None], NATIVE_BF16)
        temp = (_row_temp(req, live, temp_ptr) if state is None else state[1])[:, None]
        hot = temp != 0.0
        y = logits
        # x / 1 == x exactly: the division (an IEEE one, several instructions) only where a
        # row of the tile has another temperature.
        if tl.max(tl.where(hot & (temp != 1.0), 1, 0)) > 0:
            y = tl.where(hot, logits / tl.where(hot, temp, 1.0), logits)
        if USE_FP64:
            y = y.to(tl.float64)
        if tl.max(tl.where(hot, 1, 0)) > 0:
            if state is None:
                ks, kp = _row_key(req, live, r, rmask, step, seeds_ptr, pos_ptr, map_stride)
            else:
                ks, kp = state[2], state[3]
            ks, kp = ks[:, None], kp[:, None]
            if USE_FP64:
                u = murmur3_uniform64(ks, kp, v[None, :])
                noise = -tl.log(-tl.log(u))
            else:
                noise = _noise32(murmur3_uniform32(ks, kp, v[None, :]), FAST_LOG)
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


# The runtime ints that change between launches of one configuration (the batch's rows, the
# draft step) are not specialized: Triton would otherwise compile a variant for the value 1,
# one for multiples of 16 and one for the rest, up to 9 a configuration and 3 in every first
# call (steps 0, 1 and 2-4), each a compile at start-up. H200, the first calls (compiles) of 8
# row counts, sampled and greedy: 60 step-kernel variants in 45.2 s -> 30 in 25.2 s with these
# ints unspecialized, launch times within 1% (same run, same tokens); -> 15 in 10.6 s with the
# step's requests and positions read from their base (below).
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
    pid = _block(p, 0, 0, nb, step)
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
    # One program of the row tile stores the previous tokens: block 0's, or where a program walks
    # several blocks, program 0's (in an odd step its blocks do not include block 0).
    first = pid if BLOCKS == 1 else p
    tl.store(
        tokens_ptr + r * tokens_stride + (step - 1), prev, mask=rmask & (first == 0) & (step > 0)
    )
    # Never read outside markov_w1 (vLLM's embedding would raise on such an anchor).
    prev = tl.minimum(tl.maximum(prev, 0), w1_rows - 1)
    # What the epilogue reads and writes, one tuple for both call sites (_epilogue).
    io = (
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
    )

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
            io,
            None,
            None,
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
        # The epilogue rows' state, once a program, read before the loop: its two dependent
        # reads wait behind the first block's loads, not in the last block's epilogue, the step's
        # tail when a step is one wave of programs. H200, sampled, same run, three rounds, 1 / 2 /
        # 4 / 8 rows: 85.7-92.8 / 92.2-96.3 / 92.2-97.9 / 103.9-109.2 -> 86.1-91.1 / 86.0-92.4 /
        # 89.7-94.4 / 97.1-103.2 us, the same tokens and cached logits. Held through the GEMM of
        # a block a program, it cost 6% at 64 and 256 rows (228.9-230.2 / 667.3-669.9 ->
        # 242.3-243.6 / 708.3-713.3; 32 rows within 0.2%): those read it in the epilogue.
        re = tl.arange(0, R_EPI) if R_EPI < R_TILE else r  # R_EPI < R_TILE: the only tile
        remask = re < rows
        req = _row_req(re, remask, step, idx_ptr, map_stride)  # unused by a greedy draft
        live = remask & (req >= 0)
        temp = _row_temp(req, live, temp_ptr)
        seed, pos = _row_key(req, live, re, remask, step, seeds_ptr, pos_ptr, map_stride)
        # Each block's base logits, read one block ahead (the first before the loop), so that
        # they too are in flight during the block before's epilogue (H200, same run, three
        # rounds, sampled 1 / 8 / 16 rows: 84.4-92.2 / 97.7-102.4 / 120.6-122.7 -> 82.6-89.6 /
        # 96.7-103.0 / 114.6-118.3 us; greedy 1 row 80.3-86.6 -> 79.0-84.8).
        vn = _block(p, 0, programs, nb, step) * BV + tl.arange(0, BV)
        nxt = _base_tile(base_ptr, base_stride, re, remask, vn, vn < vocab, NATIVE_BF16)
        for it in range(0, mine * KSTEPS):
            j = it // KSTEPS
            pid = _block(p, j, programs, nb, step)
            v = pid * BV + tl.arange(0, BV)
            vmask = v < vocab
            kk = it - j * KSTEPS  # the rank chunk
            k = kk * BK + tl.arange(0, BK)
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
            if kk == KSTEPS - 1:
                cur = nxt
                vn = _block(p, j + 1, programs, nb, step) * BV + tl.arange(0, BV)
                more = remask & (j + 1 < mine)
                nxt = _base_tile(base_ptr, base_stride, re, more, vn, vn < vocab, NATIVE_BF16)
                _epilogue(
                    acc,
                    pid,
                    v,
                    vmask,
                    r,
                    rmask,
                    rows,
                    step,
                    io,
                    cur,
                    (req, temp, seed, pos),
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
    req = _row_req(r, True, step, idx_ptr, map_stride)
    live = req >= 0
    temp = _row_temp(req, live, temp_ptr)
    key = tl.load(win_ptr + step * win_stride + r)
    o = (key >> 32).to(tl.int32)
    m = tl.where(o >= 0, o, o ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    if (temp != 0.0) & (tl.abs(m) < float("inf")):
        delta = FAST_NOISE_ERR + tl.abs(m) * FAST_NOISE_REL
        j = tl.arange(0, NB_P2)
        bo = tl.load(bbest_ptr + r * scr_stride + j, mask=j < nb, other=-0x80000000)
        cand = bo >= _order32(m - 2.0 * delta, False)
        seed, pos = _row_key(req, live, r, True, step, seeds_ptr, pos_ptr, map_stride)
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
