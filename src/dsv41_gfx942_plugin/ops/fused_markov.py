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
loop at every batch measured (``benchmarks/bench_markov.py``, graphed, 5 steps, three runs:
2.08-2.24x at 1 row, 2.17x at 64, 2.13-2.16x at 256; greedy drafts 3.31-3.51x, 3.45-3.53x,
2.58-2.63x), so no batch size sends a step back to the loop.

Tokens equal vLLM's wherever the step's logits are bit-equal; a bias may differ from vLLM's in
its last bf16 bit (another summation order of the same exact products), which changes only which
tokens are proposed: the rejection sampler verifies every one against the target.

The first steps of each launch configuration outside graph capture run vLLM's loop as well, and
the fused output serves only when it is vLLM's within that rule (``_markov_check``); a difference
keeps the fused path off in the process. ``sample_sequential`` returns False having done nothing
when ``_why_not`` names a reason; the plugin's patch then runs vLLM's loop. The hooks read none
of the plugin's switches (the patch layer gates them).
"""

from __future__ import annotations

import os

import torch
import triton
from vllm import envs as vllm_envs

from .. import counters
from .._log import logger, warn_markov_out_of_memory
from . import _launcher, _markov_check
from . import _markov_kernels as K

__all__ = ["sample_sequential"]

# GPU launch configurations, by the largest batch (rows rounded up to a power of 2) each serves:
# vocabulary tokens a program (BV), rank chunk of the pipelined GEMM loop (BK), rows a tile (R_TILE;
# the GEMM's N, as tl.dot needs it >= 16: fewer rows are padded and folded away before the
# epilogue), Triton's num_warps and num_stages, FAST (the fast noise and its verify launch) and
# BLOCKS (the vocabulary blocks a program walks, in one pipelined loop; 1: a block a program).
# Chosen on an H200 against their neighbours in the same run (fused graphed, 5 steps, V = 129280,
# rank 256; every sweep and every design measured and not adopted: benchmarks/markov_sweeps.md):
# - <= 16 rows: two blocks a program (one block's loads in flight during the epilogue of the one
#   before), the exact noise. Same run, three rounds: 16 rows 114.6-118.3 us against 130.0-130.7
#   with one block; 1 / 8 rows (before the reads ahead) 89.8-92.0 / 102.1-103.2 against
#   94.2-96.5 / 111.4-111.9. BV 64 or 256, 8 warps, 3 or 4 blocks, 2 or 4 stages: slower or even.
# - above: 32-row tiles of BV 128 with 8 warps, BK 32, 4 stages, the fast noise. Two rounds of
#   one run, 64 / 128 / 256 rows 248.9-251.3 / 405.7-408.1 / 730.1-732.5 us against 269.0-278.7 /
#   451.5-454.0 / 764.1-773.7 with BV 64 and 4 warps; every neighbour tried since is slower
#   (gfx942: 70 VGPRs, 30 KiB LDS). 17-32 rows had their own entry (BV 64, 4 warps, BK 64, 3
#   stages) until one run, three rounds, two calls each, the same tokens and cached logits: 17 /
#   20 / 24 / 32 rows 149.6-153.6 / 153.4-154.5 / 157.4-158.3 / 164.5-165.1 -> 147.0-151.6 /
#   151.2-152.2 / 154.0-155.2 / 160.5-161.3 us with this one.
GPU_CONFIGS = (
    (16, dict(BV=128, BK=64, R_TILE=16, num_warps=4, num_stages=3, FAST=False, BLOCKS=2)),
    (1 << 30, dict(BV=128, BK=32, R_TILE=32, num_warps=8, num_stages=4, FAST=True, BLOCKS=1)),
)
# Greedy drafts (vLLM 0.33's default ``draft_sample_method``: no noise, no cache) have a light
# epilogue, so larger row tiles pay: fewer re-reads of markov_w2 from L2. H200, against the
# sampled table in the same run, then against each entry's neighbours (bench_markov.py --greedy
# --sweep), the same tokens; every entry also fits gfx942 with room to spare (LDS <= 48 KiB,
# tests/test_fused_markov_build.py):
# - <= 16 rows: the sampled entry; 1 / 8 rows 93 / 96 us against 95-97 (BV 256 or 8 warps), 99-101
#   (BK 32, 4 stages); 16 rows 87.5-94.1 us against 93.2-94.4 with BV 128 and 8 warps.
# - <= 64 rows: BV 128 with 8 warps, BK 64, 2 stages, row tiles of up to 64 (a batch of 17-32
#   rows is one tile of 32). At 32 rows BV 128 with 8 warps took 122.2 us against 133.0-133.3
#   with the sampled table's entry (BV 256 109.5-110.3, but 72 KiB of LDS on gfx942); 64-row
#   tiles with 2 stages 131.1-133.1 at 64 rows against 172.7-173.0 (3 stages 137, 4 warps
#   136-144, BV 256 135-160, BK 32 146-150, 16 warps 171). 17-32 rows had kept 3 stages
#   until one run, three rounds, two calls each (after the relaxed atomics, the same tokens), 17
#   / 20 / 24 / 28 / 32 rows: 106.6-109.8 / 108.1-109.4 / 109.9-111.0 / 110.4-111.6 / 114.8-116.8
#   -> 101.1-103.3 / 102.8-103.4 / 103.7-104.2 / 105.3-105.8 / 110.5-111.3 us with 2 (gfx942: 20
#   KiB of LDS, not 40; 122 VGPRs both); two blocks a program with 2 stages were slower
#   (114.2-119.2).
# - above: 128-row tiles with BK 32, 4 stages: 128 / 256 rows 216.6 / 366.3-366.9 us against
#   293.0-293.8 / 528.2-528.9 (64-row tiles 215-220 / 387-389, BK 32 with 3 stages 222 / 385,
#   16 warps 212-217 / 382-384, BV 256 222 / 408, 256-row tiles 388-542). BK 64 with 3 stages
#   was 3-5% faster on the H200 (198.2-207.7 / 354.6-355.2) but takes all 64 KiB of gfx942's LDS
#   (133 VGPRs; 135 before the dies' program order), leaving no margin for another Triton
#   release's allocation; this entry takes 48 KiB and 72 VGPRs there (90 before the dies'
#   program order).
GREEDY_GPU_CONFIGS = (
    (16, GPU_CONFIGS[0][1]),
    (64, dict(BV=128, BK=64, R_TILE=64, num_warps=8, num_stages=2, FAST=False, BLOCKS=1)),
    (1 << 30, dict(BV=128, BK=32, R_TILE=128, num_warps=8, num_stages=4, FAST=False, BLOCKS=1)),
)
# Dies (XCDs) of a gfx942 MI300X / MI325X, which deal a launch's workgroups in turn: the step
# kernel then orders its programs so that the row tiles sharing a block of markov_w2 run on one
# die and its L2 (_markov_math._xcd_order). Modelled, not measured: at 256 sampled rows (8
# row tiles) each die's L2 would otherwise fetch all of markov_w2 every step, 8 x 66 MB from the
# Infinity Cache, against about 66 MB. An MI300A (6 dies) stays correct, its dies then holding
# uneven ranges. One die elsewhere (NVIDIA: one L2 for every SM, the order left as it is).
# `bench_markov.py --sweep` times XCDS 1 against it.
GFX942_XCDS = 8
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
# The smallest vocabulary block a configuration may use (the table's are 128, the sweeps' 64):
# sizes the block-best scratch (the fast noise's verify and the fp64 noise).
MIN_BV = 64
# Rows a program of the last launch takes at most (fewer: the batch's next power of two).
LAST_MAX_TILE = 64
# ROCm's Triton compiles a kernel one way for a tensor whose storage spans at most 2**31 - 1
# bytes (32-bit buffer loads) and another for a larger one. The base logits are the one tensor
# that grows with the batch (num_reqs x steps x the padded vocabulary in bf16: past this from
# 1,662 requests of 5 steps at 129,280 tokens); a larger one takes vLLM's loop, so that what
# serves is the variant the comparison ran. None: no such variant (CUDA).
BASE_BYTES = 2**31 - 1 if torch.version.hip else None

_logged: set[str] = set()
_buffers: dict = {}
# Launch configurations that failed to compile here (say, out of shared memory): their steps
# take vLLM's loop from then on.
_broken: set = set()
# Launch configurations compared with vLLM's loop (_markov_check) at least once (a graph may
# capture them; a sampled one's first comparison makes rows live for it, at each temperature
# path), those compared on a step with a live row too (compared no more), and why the fused path
# is off in this process: one differed (graphs already captured keep their launches: a
# comparison that differs after a capture cannot reach its replays), or the path raised.
_checked: set = set()
_settled: set = set()
_off_reason: str | None = None


def _log_once(why: str) -> None:
    if why not in _logged:
        _logged.add(why)
        logger.debug("dsv41_gfx942: DSpark fused Markov sampling declines a step: %s", why)


def _interpreted(device: torch.device) -> bool:
    return device.type == "cpu"


def _why_not(spec, num_reqs: int) -> str | None:
    """Why this step must take vLLM's loop, or None when the fused launches compute it."""
    if _off_reason is not None:
        return _off_reason
    if vllm_envs.VLLM_BATCH_INVARIANT:
        # vLLM then takes the bias from its batch-invariant GEMM; the fused tiles' summation
        # order depends on the batch (GPU_CONFIGS), so a bias's last bit could too.
        return "vLLM's batch-invariant mode"
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
        if cache.shape[2] < lp.org_vocab_size:  # vLLM's gumbel_sample asserts here
            return "a draft logits cache narrower than the vocabulary"
    # vLLM's dtypes, which the kernels' noise keys, temperatures and 64-bit addresses of the
    # cache rows (``request * cache stride``: int32 products would wrap past 3,300 requests of 5
    # steps) are written for.
    state = (spec.sample_idx_mapping, spec.sample_pos, spec.seeds, spec._anchor_idx)
    if any(t.dtype != torch.int64 for t in state) or spec.temperature.dtype != torch.float32:
        return "a sampling state of other dtypes"
    if spec.num_speculative_steps < 1:
        return "no draft steps"
    if not 1 <= num_reqs <= spec.max_num_reqs:
        return f"{num_reqs} requests"
    if w2.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "CPU tensors without the Triton interpreter"
    if _capturing_cold(spec, w2.device, lp.org_vocab_size):
        return "scratch not allocated before CUDA graph capture"
    if _capturing_unchecked(spec, num_reqs, w2.device):
        return "not yet compared with vLLM's loop (inside CUDA graph capture)"
    return None


def _capturing_unchecked(spec, num_reqs: int, device: torch.device) -> bool:
    """Whether a CUDA graph is being captured on ``device`` before this step's launch
    configuration was compared with vLLM's loop (``_markov_check``). vLLM runs each captured
    batch eagerly first, which compares it."""
    return (
        device.type == "cuda"
        and torch.cuda.is_current_stream_capturing()
        and _launch_key(spec, num_reqs, device)[0] not in _checked
    )


def _compare_now(key: tuple) -> bool:
    """Whether this step of the configuration is compared with vLLM's loop: on a GPU outside
    graph capture (the comparison copies to the host), until a step with a live row of its own
    has compared (vLLM's warm-up rows are all inert: that first comparison makes rows live,
    ``_markov_check.first_step``'s probe, and a later step with live rows compares again);
    never under the interpreter, the tests' backend (they compare every call)."""
    return key[0] == "cuda" and key not in _settled and not torch.cuda.is_current_stream_capturing()


def _launch_key(spec, num_reqs: int, device: torch.device) -> tuple[tuple, dict]:
    """The step's launch configuration, and the key that names it (compiled, checked, broken)."""
    w1 = spec.model.model.markov_head.markov_w1.weight
    w2 = spec.model.model.markov_head.markov_w2.weight
    vocab = min(w2.shape[0], spec.model.logits_processor.org_vocab_size)
    greedy = spec.draft_logits is None
    cfg = _config(num_reqs, vocab, w1.shape[1], _interpreted(device), greedy=greedy)
    # The vocabulary (the last block's masks) and the draft steps (the launches) too: one
    # speculator's comparison says nothing of another's, as a second engine in a process may be.
    # And what else the launches compile or specialize on: the last launch's tile and the
    # winners' row stride (the speculator's rows).
    fp64 = bool(spec.use_fp64_gumbel)
    key = (device.type, vocab, spec.num_speculative_steps, w1.shape[1], greedy, fp64)
    key += (spec.max_num_reqs, _last_tile(num_reqs))
    return key + tuple(sorted(cfg.items())), cfg


def _last_tile(num_reqs: int) -> int:
    """Rows a program of the last launch (a constexpr: each value compiles its own kernel)."""
    return min(triton.next_power_of_2(num_reqs), LAST_MAX_TILE)


def _capturing_cold(spec, device: torch.device, vocab: int) -> bool:
    """Whether a CUDA graph is being captured on ``device`` before this speculator's scratch
    exists: allocating it there would give the graph addresses that the next call replaces."""
    return (
        device.type == "cuda"
        and torch.cuda.is_current_stream_capturing()
        and _key(spec, device, vocab) not in _buffers
    )


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


def _config(
    num_reqs: int, vocab: int, rank: int, interpreted: bool, over=None, greedy: bool = False
) -> dict:
    """Block sizes of a step launch for this batch of sampled (or ``greedy``) drafts, and
    ``FAST_LOG``: the fast noise's log on this backend ("ptx" on CUDA, "log2" on ROCm and in the
    interpreter), or "" for vLLM's exact noise on every token, and ``XCDS``, the dies the step
    kernel orders its programs for. On a GPU, ``over`` replaces entries of the table's
    configuration (``benchmarks/bench_markov.py --sweep``)."""
    rows = triton.next_power_of_2(num_reqs)
    table = next(c for top, c in (GREEDY_GPU_CONFIGS if greedy else GPU_CONFIGS) if rows <= top)
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
            FAST_LOG="log2" if table["FAST"] else "",
            XCDS=GFX942_XCDS,  # the die order gfx942 runs
            BLOCKS=table["BLOCKS"],
        )
    cfg = dict(XCDS=GFX942_XCDS if torch.version.hip else 1) | table | (over or {})
    cfg["BK"] = min(cfg["BK"], rank & -rank)  # a power of 2 that divides the rank
    cfg["R_TILE"] = tile = max(DOT_MIN_TILE, min(rows, cfg["R_TILE"]))
    fast_log = ("log2" if torch.version.hip else "ptx") if cfg.pop("FAST") else ""
    return dict(cfg, R_EPI=min(rows, tile), USE_DOT=True, NATIVE_BF16=True, FAST_LOG=fast_log)


def sample_sequential(spec, num_reqs: int, head_hidden: torch.Tensor) -> bool:
    """``DSparkSpeculator._sample_sequential`` with one launch a draft step (plus one; with the
    fast noise a verify launch a step too). Returns False, having done nothing, when this step
    must take vLLM's loop."""
    global _off_reason
    why = _why_not(spec, num_reqs)
    if why is not None:
        _log_once(why)
        return False
    n_spec = spec.num_speculative_steps
    num_sample = num_reqs * n_spec
    sample_hidden = head_hidden[spec.sample_indices[:num_sample]]
    try:
        base = spec.model.compute_draft_logits(sample_hidden)
    except Exception as e:
        # vLLM's own op, which raises without the plugin too; its lm_head's all-gather may have
        # run already (the gathered rows are copied after it), so vLLM's step is not run again.
        what = "out of memory" if isinstance(e, torch.OutOfMemoryError) else "an error"
        counters.record(counters.FUSED_MARKOV, False, f"{what} in vLLM's draft logits")
        e.dsv41_after_base = True
        raise
    try:
        return _from_base(spec, num_reqs, base, sample_hidden)
    except Exception as e:
        if getattr(e, "dsv41_after_base", False):
            raise  # vLLM's own loop raised it (``_rest``)
        # A plugin bug past the base logits: running vLLM's whole step again (the patch's answer
        # to an error before them) would repeat the lm_head's all-gather on this rank alone.
        _launcher.clear_last_error()
        _off_reason = f"raised after the base logits ({e!r})"
        logger.exception("dsv41_gfx942: the fused Markov path raised after the step's base "
                         "logits; vLLM's loop finishes the step from them, and runs instead "
                         "in this process")  # fmt: skip
        return _rest(spec, num_reqs, base, sample_hidden, "raised")


def _from_base(spec, num_reqs: int, base: torch.Tensor, sample_hidden: torch.Tensor) -> bool:
    """The step from its base logits: the fused launches (compared with vLLM's loop at first),
    or vLLM's loop from these logits where the launches cannot take them or fail."""
    n_spec = spec.num_speculative_steps
    head = spec.model.model.markov_head
    w1, w2 = head.markov_w1.weight, head.markov_w2.weight
    vocab = base.shape[-1]
    bias_width = min(w2.shape[0], spec.model.logits_processor.org_vocab_size)
    if base.dtype != w2.dtype or base.stride(-1) != 1 or vocab != bias_width:
        # The lm_head's output is not what the kernel adds to: vLLM's loop, from these logits.
        _log_once(f"{base.dtype} base logits of width {vocab} (bias {bias_width})")
        return _rest(spec, num_reqs, base, sample_hidden, "base logits the kernel does not take")
    if BASE_BYTES is not None and base.untyped_storage().nbytes() > BASE_BYTES:
        _log_once(f"base logits of more than {BASE_BYTES} bytes")
        return _rest(spec, num_reqs, base, sample_hidden, "base logits past 2 GiB")
    key, cfg = _launch_key(spec, num_reqs, base.device)
    if key in _broken:
        _log_once(f"a launch configuration that did not compile here: {key}")
        return _rest(spec, num_reqs, base, sample_hidden, "launch configuration broken")
    try:
        _scratch(spec, base.device, vocab)
    except torch.OutOfMemoryError:
        # No memory for the scratch (allocated at the first fused step): this step takes vLLM's
        # loop, which needs none of it, and the next tries again (so the handler below never
        # allocates).
        _log_once("no memory for the fused path's scratch")
        warn_markov_out_of_memory()
        return _rest(spec, num_reqs, base, sample_hidden, "out of memory")
    base3 = base.view(num_reqs, n_spec, vocab)
    failed = None  # why vLLM's loop finishes the step, once the handler below has let go
    try:
        if not _compare_now(key):
            _launch(spec, num_reqs, base3, w1, w2, cfg)
            counters.record(counters.FUSED_MARKOV, True)
        else:
            why, live = _markov_check.first_step(
                spec,
                num_reqs,
                base3,
                lambda: _loop_rest(spec, num_reqs, base, sample_hidden),
                lambda: _launch(spec, num_reqs, base3, w1, w2, cfg),
                probe=key not in _checked,  # before a graph may capture it
            )
            _checked.add(key)
            if live:
                _settled.add(key)
            if why is not None:
                _off(why)
            counters.record(counters.FUSED_MARKOV, False, counters.COMPARED)  # its output
    except torch.OutOfMemoryError:
        # The comparison's copies (or a launch) found no memory: no broken configuration. This
        # step is vLLM's loop from its base logits, and the next tries the fused path again.
        warn_markov_out_of_memory()
        failed = "out of memory"
    except Exception as e:
        # A launch that raises has not run: Triton compiles a configuration at its first launch
        # and raises CompilationError, OutOfResources, or a RuntimeError from its backend's passes
        # (Triton 3.6 on the H200, for a kernel its layout pass could not verify: "PassManager::run
        # failed"); so may the comparison. Earlier steps of this call may have run: clear their
        # winners, and vLLM's loop rewrites every output.
        logger.warning("dsv41_gfx942: fused Markov step %s failed (%r)", key, e)
        _launcher.clear_last_error()
        _broken.add(key)
        failed = "step failed"
    if failed is not None:
        # Out of the handler, so that the failed step's frames (the comparison's copies, up to
        # about 400 MiB) are freed before vLLM's loop runs.
        _scratch(spec, base.device, vocab)["win"].fill_(K.KEY_MIN.value)
        return _rest(spec, num_reqs, base, sample_hidden, failed)
    return True


def _off(why: str) -> None:
    """The fused path stays off in this process: its first step differed from vLLM's loop."""
    global _off_reason
    _off_reason = f"its first step differed from vLLM's loop ({why})"
    logger.warning("dsv41_gfx942: the fused Markov launches differ from vLLM's loop on this GPU "
                   "(%s); vLLM's loop runs instead in this process", why)  # fmt: skip


def _launch(spec, num_reqs: int, base: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, cfg=None):
    """The step launches and the last one, on ``base`` [rows, n_spec, V] bf16."""
    n_spec, vocab = base.shape[1], base.shape[2]
    device = base.device
    greedy = spec.draft_logits is None
    fp64 = bool(spec.use_fp64_gumbel) and not greedy
    cfg = cfg or _config(num_reqs, vocab, w1.shape[1], _interpreted(device), greedy=greedy)
    if greedy or fp64:  # no fp32 noise to approximate
        cfg = dict(cfg, FAST_LOG="")
    buf = _scratch(spec, device, vocab)
    win = buf["win"]
    nb = triton.cdiv(vocab, cfg["BV"])
    grid = (triton.cdiv(num_reqs, cfg["R_TILE"]), triton.cdiv(nb, cfg["BLOCKS"]))
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
    # The sampling state (requests and positions of every step, temperatures, seeds, logits
    # cache), in the order both kernels take it.
    sampling = (idx_map, pos, idx_map.stride(0), spec.temperature)
    sampling += (spec.seeds, cache, cache.stride(0), cache.stride(1))
    for step in range(n_spec):
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
    r_tile = _last_tile(num_reqs)
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


def _rest(spec, num_reqs: int, base: torch.Tensor, sample_hidden: torch.Tensor, why: str) -> bool:
    """:func:`_loop_rest` for a step whose base logits this call computed, counted as vLLM's
    loop's (``why``). An error vLLM's loop raises here (out of memory, say) is marked
    ``dsv41_after_base`` for the patch, which raises it to vLLM, as vLLM's own loop would,
    instead of running vLLM's whole ``_sample_sequential`` again: that would compute the base
    logits a second time, through the lm_head's tensor-parallel all-gather, on this rank alone
    (a collective the other ranks do not match: a hang)."""
    counters.record(counters.FUSED_MARKOV, False, f"vLLM's loop from the base logits ({why})")
    try:
        return _loop_rest(spec, num_reqs, base, sample_hidden)
    except Exception as e:
        e.dsv41_after_base = True
        raise


def _loop_rest(spec, num_reqs: int, base_logits: torch.Tensor, sample_hidden: torch.Tensor) -> bool:
    """vLLM's loop of ``_sample_sequential`` from its base logits on (they are computed once): for
    a step whose base logits the kernel does not take, one that ``_rest`` finishes (out of memory,
    a broken configuration, an error), and the first-use comparison's loop. Returns True: the
    step is done."""
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
