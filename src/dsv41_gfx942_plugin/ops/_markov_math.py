"""Element-wise helpers of the fused DSpark Markov sampling kernels (``_markov_kernels.py``):
bf16 rounding and loads that also run in the Triton interpreter, vLLM's Gumbel noise and its fast
approximation, the order keys and block winners, and gfx942's program order for its dies."""

import triton
import triton.language as tl
from triton.language.extra import libdevice
from vllm.v1.worker.gpu.sample.gumbel import (
    _DRAFT_NOISE_SALT,
    _log1p_neg_stable,
    spec_step_seed,
)

# An int64 key below every real one (masked tokens; the winners' reset value).
KEY_MIN = tl.constexpr(-(2**63))
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
    return spec_step_seed(seed, step), pos - 1 + _DRAFT_NOISE_SALT  # vLLM's, 1 << 30


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
