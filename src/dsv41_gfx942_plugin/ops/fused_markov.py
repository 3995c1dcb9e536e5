"""DSpark's sequential Markov sampling with one Triton launch a draft step.

vLLM 0.33.0's ``DSparkSpeculator._sample_sequential`` runs about 9 kernels for each of the 5 draft
steps (Markov embedding, a bias GEMV over the whole vocabulary reading the 66 MB ``markov_w2``,
the add, the Gumbel sample's kernel, argmax and gather, the token store). Here each step is one
launch (``_markov_kernels._markov_step_kernel``) over a grid of (row tile, vocabulary block)
programs: each computes its tile's bias as a small GEMM (the programs sharing a block of
``markov_w2`` run together, so it leaves DRAM about once a step whatever the batch), adds the base
logits, caches them, and reduces its block's Gumbel-max (vLLM's own noise) into one packed key a
row; the next step's programs read the previous token from those keys. From 17 rows on, a
sampled fp32 step takes every token's noise from the hardware's log2 (within a tested bound of
vLLM's) and a small verify launch recomputes each row's few closest blocks with vLLM's exact
noise, so the sampled tokens stay vLLM's. One small launch stores the last step's tokens. It
serves greedy and probabilistic drafts, fp32 and fp64 noise, any batch up to the speculator's
``max_num_reqs``, and runs inside vLLM's CUDA graph of the draft step. On an H200 it beats vLLM's
loop at every batch measured (``benchmarks/bench_markov.py``, graphed, 5 steps: 1.82x at 1 row,
2.10x at 64, 2.08x at 256; greedy drafts 2.91x, 2.59x, 1.76x), so no batch size sends a step
back to the loop.

Tokens equal vLLM's wherever the step's logits are bit-equal; a bias may differ from vLLM's in
its last bf16 bit (another summation order of the same exact products), which changes only which
tokens are proposed: the rejection sampler verifies every one against the target.

``sample_sequential`` returns False having done nothing when ``_why_not`` names a reason; the
plugin's patch then runs vLLM's loop. The hooks read no environment variables (the patch layer
gates them).
"""

from __future__ import annotations

import os

import torch
import triton
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from .._log import logger
from . import _markov_kernels as K

__all__ = ["sample_sequential"]

# GPU launch configurations, by the largest batch (rows rounded up to a power of 2) each serves:
# vocabulary tokens a program (BV), rank chunk of the pipelined GEMM loop (BK), rows a tile
# (R_TILE; tl.dot needs M >= 16: fewer rows are padded and folded away before the epilogue), and
# Triton's num_warps and num_stages. H200-measured, fused graphed, 5 steps, V = 129280, rank 256
# (Triton 3.6; each alternative timed in the same run):
# - 1 row: BV 128 103 us, BV 64 111, BV 256 (8 warps) 114; 8 rows: BV 128 120, BV 64 122.
# - 32 rows, R_TILE 32: BV 64 198 us, BV 128 218. 64 rows: BV 64 334 us, BV 128 373, BV 64 with
#   16-row tiles 389. 128 rows: 608 us, 16-row tiles 733. 256 rows: 1084 us; 16-row tiles 1423,
#   8 warps 1433, BV 32 1323, each row's atomics spread over 8 winner slots 1158.
# - Above 32 rows, BK 32 with 4 stages (one run, `bench_markov.py --sweep 32,64,128,256`): 64 rows
#   300 us (BK 64: 310), 128 rows 532 (564), 256 rows 1011 (1073); at 32 rows 200 (BK 64: 192);
#   BK 32 with 2 stages 226 / 362 / 635 / 1177, BV 128 with BK 32 213 / 353 / 639 / 1239.
# - Several row tiles a program, one after another (so the later tiles find the block of
#   markov_w2 in L1, not L2), with BK 32 / 4 stages: 64 / 128 / 256 rows 389 / 656 / 1223 us with
#   2 tiles, 401 / 748 / 1357 with 4, 406 / 757 / 1520 with 8, against 305 / 532 / 1014 with one:
#   the programs' parallelism matters more than the L2 traffic it saves.
# - A grid sized to the GPU (PER_SM programs an SM), each program walking consecutive blocks and
#   keeping its rows' best key in registers (one previous-token read and one atomic a row a
#   program): never faster (one run, graphed, 5 steps, PER_SM 1 / 2 / 4 / 8 against one block a
#   program): 1 row 154 / 117 / 107 / 104 us against 102; 8 rows 179 / 135 / 134 / 113 against
#   114; 64 rows 960 / 564 / 356 / 354 against 332; 256 rows 3507 / 1999 / 1220 / 1242 against
#   1080 (64-row tiles with 8 warps 1237). The same with one flat loop over (block, rank chunk),
#   so the pipeline streams across a program's blocks (Triton's persistent-matmul shape): best
#   at PER_SM 4, 1 / 8 rows 97.3 / 108.7 us (committed kernel 100.6 / 123.4 in another run),
#   16 rows no faster, 64 / 256 rows slower (345 / 1250 us at one block a program, 367 / 1333
#   at PER_SM 8); and 178-214 VGPRs on gfx942 for 32-row tiles. Not adopted.
# - At 1 / 8 rows (one run, against 102 / 114 us for the entries below): 8 warps 112 / 118 us,
#   2 warps 112 / 129, BK 128 with 2 stages 104 / 119, BK 64 with 2 stages 125 / 121, with 4
#   stages 107 / 121, BV 256 with BK 32 and 4 stages 135 / 157, BV 256 with 8 warps 119 / 124.
# - Memory-side variants, one run against the committed kernel (1 / 8 / 16 / 64 / 256 rows:
#   101.4 / 121.9 / 143.2 / 299.4 / 1050.4 us): markov_w2's loads issued before the embedding's
#   in the rank loop 101.7 / 122.4 / 144.4 / 302.0 / 1056.0; eviction hints (markov_w2 kept in
#   L2, base logits and the cache streamed) 101.8 / 122.7 / 142.2 / 302.0 / 1026.7; the whole
#   rank in one tl.dot with markov_w2's block loaded before the previous token is known (BV 32
#   to 128, 4 or 8 warps) 139.6-152.0 / 146.8-157.1 / 168.4-184.0 / 364.4 / 1293.3. The
#   epilogue's reads (base logits, requests, temperatures, seeds, positions) issued before the
#   rank loop, not after it (another run, 1 / 8 / 16 / 32 / 64 / 256 rows, against 101.5 /
#   125.5 / 143.6 / 192.4 / 304.6 / 1030.7 us): 108.1 / 124.9 / 141.8 / 213.3 / 359.1 / 1218.2,
#   same tokens and cached logits; on gfx942 the 32-row tiles needed 170-179 VGPRs.
# - Bound-then-verify noise (every token's noise with fast logs, lg2.approx on sm_90, then the
#   winner of each row of a block recomputed with vLLM's exact noise, the block taken exactly
#   when another token came within the fast logs' error bound): the same tokens and cached
#   logits as this kernel on 6 seeds at each batch, GPU tests passed, but slower: 1 / 8 / 64 /
#   128 / 256 rows 104.1 / 125.1 / 383.4 / 712.3 / 1393.3 us against 100.6 / 124.9 / 303.5 /
#   533.4 / 1023.9 (same run). ptxas gave it 128 registers a thread against 63 (the tile's
#   noisy values, approximate values and logits live together), half the programs an SM.
# Before odd steps ran backwards: at 1 row 3 stages 122 us, 4 stages 121, BK 128 125, BK 32 143;
# at 256 rows 32-row tiles 1138 us, 64-row tiles 1187 (BV 128, 8 warps: 1220), 128-row 1760.
# An fp32 product sum in place of tl.dot was far slower (254 us at 1 row, 1523 us at 8); it
# serves the interpreter only.
# - FAST (sampled fp32 steps take the fast noise and the verify launch, _markov_kernels), one
#   run against the exact noise: 16 / 32 / 64 / 128 / 256 rows 144.6 / 188.8 / 286.9 / 451.6 /
#   824.8 us against 145.2 / 190.9 / 306.6 / 531.8 / 1013.8; 8 rows, with the fast log as
#   inline assembly, 127.7 against 119.8 (the 5 verify launches cost about 6-14 us; a greedy
#   draft, no noise at all: 219.8 / 359.1 / 693.2 at 64 / 128 / 256 rows). With FAST, another
#   run at 64 / 128 / 256 rows against 284.5 / 467.6 / 842.3 us: 64-row tiles with 8 warps
#   271.5 / 454.9 / 831.8, with 4 warps 308.3 / 527.0 / 970.2; BV 128 301.0 / 519.7 / 952.6,
#   with 8 warps 287.7 / 492.9 / 909.4; BK 64 279.9 / 490.2 / 902.9; 3 stages 300.3 / 483.5 /
#   864.7. Not adopted: 1-5%, one run.
# - With the GEMM transposed (tokens as M), one run at 32 / 64 / 256 rows against 168.7 / 267.6 /
#   766.9 us: BV 128 with 8 warps 171.7 / 251.0 / 730.5, BV 128 178.8 / 258.9 / 789.7, 64-row
#   tiles 168.5 / 271.9 / 833.0 (8 warps 171.4 / 261.1 / 777.4), BK 64 172.5 / 288.0 / 956.7,
#   16-row tiles 202.9 / 349.1 / 1095.3. BV 128 with 8 warps repeated, two rounds of another
#   run, 32 / 64 / 128 / 256 rows against 169.1-173.6 / 269.0-278.7 / 451.5-454.0 / 764.1-773.7:
#   171.6-172.5 / 248.9-251.3 / 405.7-408.1 / 730.1-732.5, the same tokens and cached logits:
#   adopted above 32 rows (gfx942: 70 VGPRs, 30 KiB LDS at 256 rows, 66 and 18 KiB before).
#   Around it, one run, two rounds, 64 / 128 / 256 rows against 244.2-247.6 / 404.5-405.8 /
#   727.3-728.2 us: BV 64 with 4 warps 262.0-270.4 / 441.5-443.8 / 751.9-771.3, BK 64 303.6-307.6
#   / 541.4-541.8 / 1013.2-1050.1, 3 stages 254.9-255.1 / 414.3-416.1 / 736.8-744.4, 64-row
#   tiles 280.9-281.6 / 477.6-480.1 / 888.1-890.4, 16-row tiles 316.0-316.1 / 559.9-563.2 /
#   1058.1-1061.2, BV 256 281.5-282.4 / 473.2-474.4 / 861.2-863.8, 4 warps 257.8-257.9 /
#   430.0-430.6 / 790.9-792.0. With the float winner (_markov_kernels._first_max), another run,
#   two rounds, against 232.8-234.8 / 383.2-384.6 / 678.8-683.2 us: 64-row tiles with 16 warps
#   260.7-264.0 / 453.7-456.4 / 809.2-813.7 (3 stages, or BK 64 with 2, slower still), 64-row
#   tiles of BV 64 with 8 warps 247.2-250.9 / 405.0-406.9 / 725.5-726.0, BV 256 with 16 warps
#   262.4-263.5 / 454.5-458.0 / 813.5-815.9. One more run at 128 / 256 rows against 378.4 /
#   684.1 us: BK 64 with 2 stages 414.3 / 762.5, with 3 414.3 / 771.3, BK 128 with 2 552.2 /
#   1026.2, 5 stages 401.0 / 725.1, 6 stages 454.3 / 835.2.
# - An upper bound for a precomputed embedding (later steps' programs reading markov_w1's rows
#   without the previous winner's key: the same bytes, wrong tokens), same run, two rounds, 1 / 8
#   / 64 / 256 rows: 97.9-100.1 / 115.2-115.7 / 237.9-239.5 / 707.4-710.0 us against 100.8-102.6
#   / 115.8-116.6 / 234.6-236.4 / 680.3-685.1. Not pursued.
# - Each program holding its block of markov_w2 on chip (the whole rank, loaded once) while it
#   walks every row tile (grid (1, blocks); L2 traffic a step 776 -> about 330 MB at 256 rows),
#   same run: 32 / 64 / 128 / 256 rows 232.6 / 371.3 / 643.6 / 1207.8 us at its best (2 stages;
#   BV 128 with 8 warps 209.3 / 321.8 / 550.9 / 1018.9), 194-256 VGPRs on gfx942: the serial
#   row tiles cost more than the L2 traffic they save. Not adopted.
GPU_CONFIGS = (
    (8, dict(BV=128, BK=64, R_TILE=16, num_warps=4, num_stages=3, FAST=False)),
    (16, dict(BV=64, BK=64, R_TILE=16, num_warps=4, num_stages=3, FAST=False)),
    (32, dict(BV=64, BK=64, R_TILE=32, num_warps=4, num_stages=3, FAST=True)),
    (1 << 30, dict(BV=128, BK=32, R_TILE=32, num_warps=8, num_stages=4, FAST=True)),
)
DOT_MIN_TILE = 16
# Under the interpreter every program costs Python time (about 0.1 s on a CI core): large
# blocks, few programs (16 vocabulary blocks a step at 129280 tokens).
BV_INTERP = 8192
INTERP_MAX_TILE = 16
# Rows a tile at least under the interpreter (a test sets 16 to run the GPU's padded fold).
INTERP_MIN_TILE = 1
INTERP_MAX_PRODUCT = 2**20  # Triton's largest tensor
# Block-best columns one scan step reads (fp64 noise only).
NB_CHUNK = 128
# Markov ranks the kernel takes: a multiple of its rank chunk, at most this many.
RANK_STEP = 64
MAX_RANK = 1024
# The smallest vocabulary block any configuration uses (sizes the fp64 block-best scratch).
MIN_BV = 64

_logged: set[str] = set()
_buffers: dict = {}
# Launch configurations that failed to compile here (say, out of shared memory): their steps
# take vLLM's loop from then on.
_broken: set = set()


def _log_once(why: str) -> None:
    if why not in _logged:
        _logged.add(why)
        logger.debug("dsv41_gfx942: DSpark fused Markov sampling declines a step: %s", why)


def _interpreted(device: torch.device) -> bool:
    return device.type == "cpu"


def _why_not(spec, num_reqs: int) -> str | None:
    """Why this step must take vLLM's loop, or None when the fused launches compute it."""
    model = spec.model
    head = getattr(getattr(model, "model", None), "markov_head", None)
    if head is None or type(head).__name__ != "DSparkMarkovHead":
        return "no Markov head"
    if spec._draft_topk is not None:
        return "the draft top-k path"
    if spec.draft_watermarker is not None:
        return "a draft watermarker"
    if (
        spec._d2t_scatter_index is not None
        or getattr(model, "draft_id_to_target_id", None) is not None
    ):
        return "a reduced draft vocabulary"
    if spec.use_confidence_head:
        return "the confidence head"
    if spec.acceptance_estimator is not None:
        return "the acceptance estimator"
    if hasattr(model, "apply_output_logit_transform"):
        return "an output logit transform"
    lp = getattr(model, "logits_processor", None)
    if lp is None or type(lp).__name__ != "LogitsProcessor" or lp.logits_as_input:
        return "a logits processor the kernel does not mirror"
    if lp.soft_cap is not None:
        return "a logits soft cap"
    if lp.scale != 1.0:
        return "a logits scale"
    if lp.head_dtype not in (None, torch.bfloat16):
        return f"a {lp.head_dtype} head dtype"
    if type(head.markov_w2.quant_method).__name__ != "UnquantizedEmbeddingMethod":
        return "a quantized Markov head"
    if getattr(head.markov_w2, "tp_size", 1) != 1:
        return "a vocab-parallel Markov head"
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    if w1.dtype != torch.bfloat16 or w2.dtype != torch.bfloat16:
        return "Markov weights not bf16"
    if not (w1.is_contiguous() and w2.is_contiguous()):
        return "non-contiguous Markov weights"
    rank = w1.shape[1]
    if w2.shape[1] != rank or rank % RANK_STEP or not RANK_STEP <= rank <= MAX_RANK:
        return f"Markov rank {rank} (w2 {w2.shape[1]})"
    if w1.shape[0] < lp.org_vocab_size:
        return "a Markov embedding smaller than the vocabulary"
    cache = spec.draft_logits
    if cache is not None:
        if cache.dtype != w2.dtype:
            return f"a {cache.dtype} draft logits cache"
        if cache.stride(-1) != 1 or cache.shape[1] < spec.num_speculative_steps:
            return "a draft logits cache of another layout"
    if spec.num_speculative_steps < 1:
        return "no draft steps"
    if not 1 <= num_reqs <= spec.max_num_reqs:
        return f"{num_reqs} requests"
    if w2.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "CPU tensors without the Triton interpreter"
    if (
        w2.device.type == "cuda"
        and torch.cuda.is_current_stream_capturing()
        and _key(spec, w2.device, lp.org_vocab_size) not in _buffers
    ):
        return "scratch not allocated before CUDA graph capture"
    return None


def _key(spec, device, vocab):
    return (
        str(device),
        vocab,
        bool(spec.use_fp64_gumbel),
        spec.num_speculative_steps,
        spec.max_num_reqs,
    )


def _scratch(spec, device: torch.device, vocab: int) -> dict:
    """The winners and block-best buffers, allocated once per (device, vocabulary, noise dtype,
    steps, rows) so that a CUDA graph keeps their addresses. ``win`` starts at the key floor and
    every call leaves it there (``_markov_last_kernel`` resets it)."""
    key = _key(spec, device, vocab)
    if key not in _buffers:
        rows, n_spec = spec.max_num_reqs, spec.num_speculative_steps
        nb = triton.cdiv(vocab, MIN_BV)
        buf = {"win": torch.full((n_spec, rows), -(2**63), dtype=torch.int64, device=device)}
        buf["bbest"] = torch.empty(rows, nb, dtype=torch.int32, device=device)
        if spec.use_fp64_gumbel:
            buf["keys"] = [torch.empty(rows, nb, dtype=torch.int64, device=device) for _ in "ab"]
            buf["toks"] = [torch.empty(rows, nb, dtype=torch.int32, device=device) for _ in "ab"]
        _buffers[key] = buf
    return _buffers[key]


def _config(num_reqs: int, vocab: int, rank: int, interpreted: bool, over=None) -> dict:
    """Block sizes of a step launch for this batch, and ``FAST_LOG``: the fast noise's log on
    this backend ("ptx" on CUDA, "log2" on ROCm and in the interpreter), or "" for vLLM's exact
    noise on every token. On a GPU, ``over`` replaces entries of the table's configuration
    (``benchmarks/bench_markov.py --sweep``)."""
    rows = triton.next_power_of_2(num_reqs)
    fast = next(c["FAST"] for top, c in GPU_CONFIGS if rows <= top)
    if interpreted:
        bv = min(BV_INTERP, triton.next_power_of_2(vocab))
        tile = max(INTERP_MIN_TILE, min(rows, INTERP_MAX_TILE))
        bk = min(64, max(8, INTERP_MAX_PRODUCT // (tile * bv)))
        return dict(
            BV=bv,
            BK=bk,
            R_TILE=tile,
            R_EPI=min(rows, tile),
            USE_DOT=False,
            NATIVE_BF16=False,
            FAST_LOG="log2" if fast else "",
        )
    cfg = next(dict(c) for top, c in GPU_CONFIGS if rows <= top) | (over or {})
    cfg["BK"] = min(cfg["BK"], rank & -rank)  # a power of 2 that divides the rank
    cfg["R_TILE"] = tile = max(DOT_MIN_TILE, min(rows, cfg["R_TILE"]))
    fast_log = ("log2" if torch.version.hip else "ptx") if cfg.pop("FAST") else ""
    return dict(cfg, R_EPI=min(rows, tile), USE_DOT=True, NATIVE_BF16=True, FAST_LOG=fast_log)


def sample_sequential(spec, num_reqs: int, head_hidden: torch.Tensor) -> bool:
    """``DSparkSpeculator._sample_sequential`` with one launch a draft step (plus one). Returns
    False, having done nothing, when this step must take vLLM's loop."""
    why = _why_not(spec, num_reqs)
    if why is not None:
        _log_once(why)
        return False
    n_spec = spec.num_speculative_steps
    num_sample = num_reqs * n_spec
    sample_hidden = head_hidden[spec.sample_indices[:num_sample]]
    base = spec.model.compute_draft_logits(sample_hidden)
    head = spec.model.model.markov_head
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    vocab = base.shape[-1]
    bias_width = min(w2.shape[0], spec.model.logits_processor.org_vocab_size)
    if base.dtype != w2.dtype or base.stride(-1) != 1 or vocab != bias_width:
        # The lm_head's output is not what the kernel adds to: vLLM's loop, from these logits.
        _log_once(f"{base.dtype} base logits of width {vocab} (bias {bias_width})")
        return _loop_rest(spec, num_reqs, base, sample_hidden)
    interpreted = _interpreted(base.device)
    cfg = _config(num_reqs, vocab, w1.shape[1], interpreted)
    key = (base.device.type, w1.shape[1], spec.draft_logits is None, bool(spec.use_fp64_gumbel))
    key += tuple(sorted(cfg.items()))
    if key in _broken:
        _log_once(f"a launch configuration that did not compile here: {key}")
        return _loop_rest(spec, num_reqs, base, sample_hidden)
    try:
        _launch(spec, num_reqs, base.view(num_reqs, n_spec, vocab), w1, w2, cfg)
    except (CompilationError, OutOfResources) as e:
        # Raised at the first launch of a configuration, before it runs; earlier steps of this
        # call may have run: clear their winners, and vLLM's loop rewrites every output.
        logger.warning("dsv41_gfx942: fused Markov launch %s failed to compile (%s)", key, e)
        _broken.add(key)
        _scratch(spec, base.device, vocab)["win"].fill_(K.KEY_MIN.value)
        return _loop_rest(spec, num_reqs, base, sample_hidden)
    return True


def _launch(spec, num_reqs: int, base: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, cfg=None):
    """The step launches and the last one, on ``base`` [rows, n_spec, V] bf16."""
    n_spec, vocab = base.shape[1], base.shape[2]
    device = base.device
    greedy = spec.draft_logits is None
    fp64 = bool(spec.use_fp64_gumbel) and not greedy
    cfg = cfg or _config(num_reqs, vocab, w1.shape[1], _interpreted(device))
    if greedy or fp64:  # no fp32 noise to approximate
        cfg = dict(cfg, FAST_LOG="")
    buf = _scratch(spec, device, vocab)
    win = buf["win"]
    nb = triton.cdiv(vocab, cfg["BV"])
    grid = (triton.cdiv(num_reqs, cfg["R_TILE"]), nb)
    keys, toks = buf.get("keys", [win, win]), buf.get("toks", [win, win])
    bbest = buf["bbest"]
    scr_stride = bbest.stride(0)
    num_sample = num_reqs * n_spec
    idx_map = spec.sample_idx_mapping[:num_sample].view(num_reqs, n_spec)
    pos = spec.sample_pos[:num_sample].view(num_reqs, n_spec)
    cache = spec.draft_logits if not greedy else base
    if not cfg["NATIVE_BF16"]:  # the interpreter reads bf16 as int16 bits (_markov_kernels)
        w1, w2, base, cache = (t.view(torch.int16) for t in (w1, w2, base, cache))
    tokens = spec.draft_tokens
    for step in range(n_spec):
        # The step's sampling state (requests, positions, temperatures, seeds, logits cache), in
        # the order both kernels take it.
        sampling = (idx_map[:, step], pos[:, step], idx_map.stride(0), spec.temperature)
        sampling += (spec.seeds, cache, cache.stride(0), cache.stride(1))
        K._markov_step_kernel[grid](
            spec.input_buffers.input_ids,
            spec._anchor_idx,
            w1,
            w1.shape[0],
            w2,
            base[:, step],
            base.stride(0),
            *sampling,
            tokens,
            tokens.stride(0),
            win,
            win.stride(0),
            keys[(step + 1) % 2],
            toks[(step + 1) % 2],
            keys[step % 2],
            toks[step % 2],
            scr_stride,
            bbest,
            num_reqs,
            vocab,
            step,
            nb,
            RANK=w1.shape[1],
            GREEDY=greedy,
            USE_FP64=fp64,
            NB_CHUNK=NB_CHUNK,
            **cfg,
        )
        if cfg["FAST_LOG"]:
            K._markov_verify_kernel[(num_reqs,)](
                win,
                win.stride(0),
                bbest,
                bbest.stride(0),
                *sampling,
                vocab,
                step,
                nb,
                BV=cfg["BV"],
                NB_P2=triton.next_power_of_2(nb),
                NATIVE_BF16=cfg["NATIVE_BF16"],
            )
    r_tile = min(triton.next_power_of_2(num_reqs), 64)
    K._markov_last_kernel[(triton.cdiv(num_reqs, r_tile),)](
        tokens,
        tokens.stride(0),
        win,
        win.stride(0),
        keys[(n_spec - 1) % 2],
        toks[(n_spec - 1) % 2],
        scr_stride,
        num_reqs,
        n_spec,
        nb,
        USE_FP64=fp64,
        R_TILE=r_tile,
        NB_CHUNK=NB_CHUNK,
    )


def _loop_rest(spec, num_reqs: int, base_logits: torch.Tensor, sample_hidden: torch.Tensor) -> bool:
    """vLLM's loop of ``_sample_sequential`` from its base logits on, for a step whose base logits
    the kernel does not take (they are computed once). Returns True: the step is done."""
    n_spec = spec.num_speculative_steps
    num_sample = num_reqs * n_spec
    base_logits = base_logits.view(num_reqs, n_spec, base_logits.shape[-1])
    idx_map = spec.sample_idx_mapping[:num_sample].view(num_reqs, n_spec)
    sample_pos = spec.sample_pos[:num_sample].view(num_reqs, n_spec)
    embeds = []
    prev = spec.input_buffers.input_ids[spec._anchor_idx[:num_reqs]]
    for i in range(n_spec):
        embed = spec.model.markov_embed(prev)
        if spec.use_confidence_head:
            embeds.append(embed)
        logits = base_logits[:, i] + spec.model.markov_bias(embed)
        if hasattr(spec.model, "apply_output_logit_transform"):
            logits = spec.model.apply_output_logit_transform(logits)
        token = spec._sample_logits(logits, idx_map[:, i], sample_pos[:, i], i)
        spec.draft_tokens[:num_reqs, i] = token
        prev = token
    if spec.use_confidence_head:
        confidence = spec.model.compute_confidence(
            sample_hidden, torch.stack(embeds, dim=1).flatten(0, 1)
        )
        spec.draft_token_confidence_probs[:num_reqs] = confidence.view(num_reqs, n_spec)
    return True
