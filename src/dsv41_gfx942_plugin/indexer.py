"""The plugin's DeepSeek-V4.1 sparse indexer layer: vLLM's, with the gfx942 decode path.

``patches.py`` installs :func:`make_indexer_cls` as ``DeepseekV4Indexer.attn_cls``, so DSv4.1's
FP8 indexer layers (and no other model's) are built from a subclass of vLLM's
``SparseAttnIndexer``. Its ``forward_hip`` calls :func:`indexer_step`, which, like vLLM's
``rocm_aiter_sparse_attn_indexer``, is an eager break of a breakable CUDA graph: its Python runs
at every step, so it chooses per step between

* vLLM's op, unchanged: the profile run, prefill and mixed steps, a layer that writes its own
  K cache; and
* :func:`decode_step`, vLLM's decode branch with the plugin's hooks in front of vLLM's ops.

A layer with an MXFP4 cache, or with AITER off, never reaches it: ``forward_hip`` hands it to
vLLM's own ``forward_hip``, whose dispatch decides (without AITER on gfx942, it raises).

Under FULL CUDA graphs (vLLM's default for uniform decode steps, mixed steps taking the
breakable graphs) the step is captured inline instead, and every host-side choice holds for
every replay of that graph: the choices below depend only on shapes, dtypes, the layer's
configuration and the metadata's structure (never on this step's lengths, which the kernels read
from device memory), and vLLM keys FULL graphs by batch shape.
"""

from __future__ import annotations

import weakref

import torch
from vllm._aiter_ops import rocm_aiter_ops
from vllm.compilation.breakable_cudagraph import eager_break_during_capture
from vllm.config import CUDAGraphMode
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import op_registry_oot
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadata
from vllm.v1.attention.ops import common as _vllm_common
from vllm.v1.attention.ops import rocm_aiter_mla_sparse as _vllm_rocm

from . import cand_probe, counters, envs
from ._log import logger
from .ops import _launcher, topk

_first_layer: int | None = None  # id() of the first layer to take a decode step
_reserve_warned = False  # a top-k scratch reservation failed, and was warned, in this process
_first_step_logged = False
#: Layers built from the plugin's class in this process (none with vLLM's --monokernel or the
#: MXFP4 indexer, whose classes bypass the patch): the speculator's log names the indexer path.
layers_built = 0
#: The candidate buffers of writer layers (layer 20) built in this process, by ``id``: a weak
#: reference to the buffer (an ``id`` is reused after a buffer is freed) and the writer's logits
#: width (its ``max_model_len``: vLLM's dense logits are that wide). See ``_why_not_candidates``.
_candidate_writers: dict[int, tuple[weakref.ref, int]] = {}


def make_indexer_cls(original: type) -> type:
    """A subclass of vLLM's ``SparseAttnIndexer`` (``original``) whose HIP path runs
    :func:`indexer_step`."""

    class Dsv41Gfx942SparseAttnIndexer(original):
        """vLLM's sparse indexer op with the plugin's gfx942 decode path in ``forward_hip``."""

        def __new__(cls, *args, **kwargs):
            # Another plugin's replacement of vLLM's op (``CustomOp.register_oot``, keyed by the
            # class name, which this subclass does not carry) serves, as it would unpatched.
            other = op_registry_oot.get(original.__name__)
            if other is not None:
                logger.warning_once(
                    "dsv41_gfx942: %s replaces vLLM's %s (registered by another plugin); it "
                    "serves DeepSeek-V4.1's indexer, not the plugin's decode path",
                    other.__qualname__, original.__name__,
                )  # fmt: skip
                return other(*args, **kwargs)
            return super().__new__(cls, *args, **kwargs)

        def __init__(self, *args, **kwargs):
            global layers_built
            super().__init__(*args, **kwargs)
            layers_built += 1
            if self.candidate_write and self.candidate_blocks is not None:
                note_candidate_writer(self.candidate_blocks, self.max_model_len)
            # Read once per layer: the switches hold for the process.
            self.dsv41_topk = envs.enabled("topk")
            self.dsv41_cand_logits = envs.enabled("cand_logits")  # implies dsv41_topk
            # Load the code object now (model load: the device is set, no capture runs),
            # never at the first decode step.
            if self.dsv41_topk:
                topk.build()
            logger.info_once(
                "dsv41_gfx942: DeepSeek-V4.1 indexer decode steps are served by the plugin's "
                "decode path (vLLM's op serves every other step)"
            )

        def forward_hip(self, hidden_states, q_quant, k, weights):
            # Without AITER vLLM's own dispatch decides (on gfx942 it refuses to run).
            if self.use_fp4_cache or not isinstance(q_quant, torch.Tensor) or not _aiter_enabled():
                return super().forward_hip(hidden_states, q_quant, k, weights)
            return indexer_step(self, hidden_states, q_quant, k, weights)

    Dsv41Gfx942SparseAttnIndexer.__qualname__ = "Dsv41Gfx942SparseAttnIndexer"
    Dsv41Gfx942SparseAttnIndexer.__module__ = __name__
    return Dsv41Gfx942SparseAttnIndexer


def _aiter_enabled() -> bool:
    """vLLM's own test, as its ``forward_hip`` makes it (traceable: a class attribute)."""
    return rocm_aiter_ops.is_enabled()


def note_candidate_writer(buffer: torch.Tensor, width: int) -> None:
    """Record that a writer layer of this process, its logits ``width`` wide, fills ``buffer``
    at every decode step (layer 20, built and run before the readers it feeds)."""
    _candidate_writers[id(buffer)] = (weakref.ref(buffer), width)


def _why_not_candidates(layer) -> str | None:
    """Why a reader layer's candidate hooks must decline, or None. They take the candidates
    that layer 20 writes at every decode step before the readers: distinct block ids (a top-K
    of blocks), each inside the reader's width when the writer's logits are no wider. Other ids
    would give other sets than vLLM's mask: it takes a repeated id once, where the candidate
    logits list its columns twice, and for an id past the reader's width it keeps the row's last
    column, which the kernels leave out. A buffer no writer of this process fills or one filled
    by a wider writer gets vLLM's mask and the top-k. Defensive: DSv4.1 as vLLM 0.33 builds it
    is expected to build layer 20 beside its readers, at their width."""
    ref, width = _candidate_writers.get(id(layer.candidate_blocks), (None, 0))
    if ref is None or ref() is not layer.candidate_blocks:
        return "no writer layer of this process fills its candidates"
    if width > layer.max_model_len:
        return "its candidates come from a writer layer with wider logits"
    return None


def _why_vllm(layer, meta) -> str | None:
    """Why this step must run vLLM's op, or None for a decode step the plugin takes."""
    if not isinstance(meta, DeepseekV32IndexerMetadata):
        return "no indexer metadata (profile or dummy run)"
    if meta.num_prefills > 0:
        return "prefill or mixed step"
    if meta.num_decodes == 0 or meta.decode is None:
        return "no decode rows"
    if not layer.skip_k_cache_insert:
        return "layer writes its own K cache"
    return None


@eager_break_during_capture
def indexer_step(layer, hidden_states, q_fp8, k, weights) -> torch.Tensor:
    """One step of ``layer``: the plugin's decode path or vLLM's op (see the module doc)."""
    attn_metadata = get_forward_context().attn_metadata
    meta = attn_metadata.get(layer.k_cache.prefix) if isinstance(attn_metadata, dict) else None
    reason = _why_vllm(layer, meta)
    if reason is not None:
        if meta is None and layer.dsv41_topk:
            _reserve_scratch(layer, hidden_states)
        counters.record("indexer_decode", False, reason)
        return _vllm_rocm.rocm_aiter_sparse_attn_indexer(
            hidden_states, layer.k_cache.prefix, layer.k_cache.kv_cache, q_fp8, k, weights,
            layer.quant_block_size, layer.scale_fmt, layer.topk_tokens, layer.head_dim,
            layer.max_model_len, layer.max_total_seq_len, layer.topk_indices_buffer,
            skip_k_cache_insert=layer.skip_k_cache_insert,
            compress_ratio=layer.compress_ratio,
            candidate_blocks=layer.candidate_blocks,
            candidate_block_size=layer.candidate_block_size,
            candidate_write=layer.candidate_write,
        )  # fmt: skip
    _note_step(layer)
    counters.record("indexer_decode", True)
    return decode_step(layer, meta, hidden_states.shape[0], q_fp8, weights)


def _reserve_scratch(layer, hidden_states) -> None:
    """In a run without indexer metadata (vLLM's memory-profile run, where vLLM's op reserves
    its decode logits for ``_max_decode_logits_rows`` rows of the layer's width), reserve the
    decode top-512's scratch for as many rows, so that vLLM's profile counts it; not where the
    kernels did not load. Never raises: without it the scratch grows at the first step that
    needs it, as before. A failure is warned once a process (each layer's reservation may fail,
    and an out-of-memory message differs each time)."""
    global _reserve_warned
    if hidden_states.device.type != topk._GPU_TYPE:
        return
    try:
        if not topk.build():
            return  # no kernels in this process: nothing will use it
        rows = _vllm_rocm._max_decode_logits_rows(hidden_states.shape[0])
        # False inside graph capture (never a profile run): a later step grows it then.
        topk.reserve_decode_scratch(rows, layer.max_model_len, hidden_states.device.index)
    except Exception as err:  # out of memory, or a vLLM that changed underneath
        _launcher.clear_last_error()
        if not _reserve_warned:
            _reserve_warned = True
            logger.warning("dsv41_gfx942: top-k scratch not reserved in vLLM's memory profile "
                           "(%s); it grows at the first step that needs it", err)  # fmt: skip


def _note_step(layer) -> None:
    """Log which hooks serve once, when the first decode step has passed every layer (the
    first layer comes round again). Under CUDA graphs that step is vLLM's warm-up run before
    its first capture. Costs one comparison a layer after. Keyed by the layer, not its K
    cache's prefix: DSv4.1's index layers that are not KV sources share the K cache (and
    prefix) of the KV source below them."""
    global _first_layer, _first_step_logged
    if _first_step_logged:
        return
    if _first_layer is None:
        _first_layer = id(layer)
    elif id(layer) == _first_layer:
        _first_step_logged = True
        logger.info("dsv41_gfx942: first decode step done (a warm-up's, under CUDA graphs); "
                    "hooks taken/decided: %s",
                    counters.summary())  # fmt: skip


# Hooks off for the rest of this process, and why.
_off: dict[str, str] = {}
# Hooks that ran out of GPU memory at least once (warned once each).
_no_memory: set[str] = set()
# The candidate-logits kernel variants this process has probed (_cand_probe), as _cand_variant
# names them: True where they compared equal (the hook serves them), else False.
_cand_verdict: dict = {}


def _hook(name: str, on: bool, call, why_not: str | None = None) -> bool:
    """Run a hook that may decline; count its decision. A hook that raises is logged once and
    stays off in this process: vLLM's op runs in its place (it rewrites every entry the hook
    may have touched), so a plugin bug never takes the server down. Out of GPU memory (the
    top-k's scratch, the candidate rows), the hook declines this call only, warned once: vLLM's
    op runs, and the next call tries the hook again. ``why_not``: a reason, known before the
    call, for which the hook does not run (warned once a hook and reason)."""
    if not on:
        counters.record(name, False, "switched off")
        return False
    if why_not is not None:
        counters.record(name, False, why_not)
        logger.warning_once("dsv41_gfx942: hook %s does not run on a layer: %s; vLLM's op runs "
                            "in its place", name, why_not)  # fmt: skip
        return False
    if name in _off:
        counters.record(name, False, _off[name])
        return False
    try:
        taken = bool(call())
    except torch.OutOfMemoryError:
        counters.record(name, False, "out of memory")
        if name not in _no_memory:
            _no_memory.add(name)
            logger.warning("dsv41_gfx942: hook %s found no GPU memory; vLLM's op runs in its "
                           "place until it does", name)  # fmt: skip
        return False
    except Exception:
        _launcher.clear_last_error()  # else vLLM's op, next, could raise the hook's HIP error
        _off[name] = "raised earlier in this process"
        counters.record(name, False, "raised")
        logger.exception("dsv41_gfx942: hook %s raised; it stays off in this process and "
                         "vLLM's op runs instead", name)  # fmt: skip
        return False
    counters.record(name, taken, "" if taken else "declined by the hook")
    return taken


def decode_step(layer, meta, num_tokens: int, q_fp8, weights) -> torch.Tensor:
    """vLLM 0.33.0's decode branch of ``rocm_aiter_sparse_attn_indexer`` for a decode-only step
    whose K cache the model already wrote, each op behind the plugin hook that may replace it:
    fill, (readers) candidate logits + top-k, paged logits, (writer) candidate selection,
    (readers) candidate top-k or mask, top-k, unpack of padded rows."""
    decode = meta.decode
    buf = layer.topk_indices_buffer
    n_dec = meta.num_decode_tokens
    on = layer.dsv41_topk
    if not (on and topk.skip_decode_fill(False, n_dec, num_tokens, decode, buf.shape[1],
                                         layer.topk_tokens)):  # fmt: skip
        buf[:num_tokens] = -1

    kv_cache = layer.k_cache.kv_cache.unsqueeze(-2)  # [pages, page_size, 1, dim + 4]
    if decode.requires_padding:
        q = _vllm_common.pack_seq_triton(q_fp8[:n_dec], decode.decode_lens)
    else:
        q = q_fp8[:n_dec].reshape(decode.decode_lens.shape[0], -1, *q_fp8.shape[1:])
    batch, next_n = q.shape[:2]
    rows = batch * next_n
    out = buf[:rows, : layer.topk_tokens]
    cands = layer.candidate_blocks
    reader = cands is not None and not layer.candidate_write
    why_not = _why_not_candidates(layer) if reader else None

    done = reader and _hook(
        "candidate_logits_top_k",
        layer.dsv41_cand_logits,
        lambda: _candidate_logits(layer, decode, q, kv_cache, weights, cands, out),
        why_not,
    )
    if not done:
        logits = _dense_logits(layer, decode, q, kv_cache, weights[:rows])
        done = _candidates(layer, logits, next_n, decode.seq_lens, out, on, why_not)
    if not done:
        _top_k(layer, meta, logits, next_n, out, on)

    if decode.requires_padding:
        unpacked = _vllm_common.unpack_seq_triton(
            out.reshape(batch, next_n, out.shape[-1]), decode.decode_lens
        )
        buf[:n_dec, : unpacked.shape[-1]] = unpacked
    return buf


def _dense_logits(layer, decode, q, kv_cache, weights) -> torch.Tensor:
    """vLLM's dense paged FP8 logits of ``q``'s rows (``weights``: one row each), as its branch
    calls it; ``decode`` holds the lengths, block table and schedule metadata."""
    return _vllm_rocm.rocm_fp8_paged_mqa_logits(
        q, kv_cache, weights, decode.seq_lens, decode.block_table,
        decode.schedule_metadata, max_model_len=layer.max_model_len,
        compress_ratio=layer.compress_ratio,
    )  # fmt: skip


def _candidate_logits(layer, decode, q, kv_cache, weights, cands, out) -> bool:
    """The candidate-logits hook, once its kernel variant (``_cand_variant``) has compared equal
    with vLLM's dense logits on a synthetic step (``_cand_probe``, at the variant's first call
    outside CUDA-graph capture: vLLM's eager warm-up before it captures a decode graph, or an
    eager step). Inside capture a variant not compared yet declines before any kernel runs, and
    vLLM's path is captured. A probe that finds no GPU memory leaves its variant on vLLM's path
    (it peaks at about 50 MB: 36 MB of cache, 13 MB of keys drawn 256 pages at a time)."""
    if decode.requires_padding:
        return False  # the hook takes no padded step: nothing to compare for
    variant = _cand_variant(
        q, kv_cache, decode.seq_lens, decode.block_table, layer.compress_ratio,
        layer.candidate_block_size,
    )  # fmt: skip
    verdict = _cand_verdict.get(variant)
    if verdict is None:
        if _capturing(q):
            return False
        try:
            verdict = _cand_probe(layer, decode, q, kv_cache, variant)
        except torch.OutOfMemoryError:  # final too: a retry at every eager step would flush
            verdict = False  # torch's cache each time (and the graphs captured vLLM's path)
            logger.warning("dsv41_gfx942: no GPU memory to compare the candidate logits with "
                           "vLLM's (variant %s); vLLM's path serves that variant",
                           variant)  # fmt: skip
        _cand_verdict[variant] = verdict
    return verdict and topk.candidate_logits_top_k(
        q, kv_cache, weights, decode.seq_lens, decode.block_table, cands,
        layer.candidate_block_size, out, layer.topk_tokens,
        _dense_is_aiter_gluon(kv_cache, layer.compress_ratio), False,
    )  # fmt: skip


# Live candidate columns with a finite, nonzero dense logit that the comparison needs to judge
# (random keys make nearly every live column one: with 2,048 candidate slots of 8 columns, a
# probe request of about 4,000 columns holds about 3,500, its first, of 16,384 or more, 14,300).
MIN_COMPARED = 2048


def _cand_variant(
    q, kv_cache, seq_lens, block_table, compress_ratio: int, cand_block: int
) -> tuple:
    """What the candidate-logits kernel is compiled for (heads, page size, 1-D or 2-D lengths;
    vLLM's reader layers differ in page size; q's FP8 dtype, as which the kernel and AITER's read
    the keys: the hook takes e4m3fnuz and e4m3fn), the rows a request (``next_n``: vLLM hands
    AITER's dense kernel other lengths for 2 than for 1) and the compress ratio (at 2 the builder's
    row lengths can end past the dense kernel's), the candidate block size (a constexpr of the
    kernel; DSv4.1 has one for every reader layer, so this only guards another model), and
    ``cand_probe.layout`` of the cache and the block table, on which the JIT specializes the
    kernels' pointers and strides (``cand_probe.probe_step`` reproduces it; q and the candidates are
    contiguous, and vLLM's head weights, ``torch.empty_like`` of its projection's, dense, so their
    strides follow from their shapes): each is compared with vLLM's once."""
    shape = (q.shape[-2], kv_cache.shape[1], seq_lens.dim(), q.shape[1], compress_ratio, q.dtype,
             cand_block)  # fmt: skip
    return shape + cand_probe.layout(kv_cache, block_table)


def _cand_probe(layer, decode, q, kv_cache, variant: tuple) -> bool:
    """Whether the hook may serve ``variant``: its compact rows of a synthetic step of that
    variant (``cand_probe.probe_step``) against vLLM's dense logits of the same step, at every
    live candidate column, equal as the top-k ranks them (-0 is not +0, NaN = NaN). The
    candidate kernel mirrors one AITER release's arithmetic and no gfx942 GPU has compared the
    two yet; another AITER build, or a gfx942 that computes otherwise, would change index sets
    near the cut with no error. Any difference keeps the hook off in this process (one warning;
    vLLM's dense path runs); fewer than MIN_COMPARED columns to judge (a reader layer so narrow
    that its probe rows hold fewer: about 2,400 columns for a probe of one row) keep this variant
    on vLLM's path. Host syncs: never inside capture."""
    step = cand_probe.probe_step(
        q, kv_cache, decode.seq_lens, decode.block_table, layer.compress_ratio, layer.max_model_len,
        layer.candidate_blocks.shape[1],
    )  # fmt: skip
    step.schedule_metadata = decode.schedule_metadata  # the step doubles as its decode metadata
    verdict: list[bool] = []

    def check(logits: torch.Tensor, ids: torch.Tensor) -> bool:
        dense = _dense_logits(layer, step, step.q, step.kv_cache, step.weights)
        live = ids >= 0
        want = dense[: logits.shape[0]].gather(1, ids.clamp(min=0).long())
        same = logits.view(torch.int32) == want.view(torch.int32)  # -0 is not +0 to the top-k
        differ = ~same & ~(logits.isnan() & want.isnan()) & live
        meaningful = live & want.isfinite() & (want != 0)
        counts = torch.stack([live.sum(), differ.sum(), meaningful.sum()])
        live_n, differ_n, compared = counts.tolist()
        if differ_n:
            _off["candidate_logits_top_k"] = "differed from vLLM's dense logits"
            logger.warning(
                "dsv41_gfx942: candidate logits differ from vLLM's dense logits at %d of %d "
                "candidate columns on this GPU; the hook stays off and vLLM's path runs",
                differ_n, live_n,
            )  # fmt: skip
        elif compared < MIN_COMPARED:
            logger.info("dsv41_gfx942: candidate logits not compared (%d columns to judge, "
                        "variant %s); vLLM's path serves that variant",
                        compared, variant)  # fmt: skip
        else:
            logger.info("dsv41_gfx942: candidate logits equal vLLM's dense logits at %d candidate "
                        "columns (heads, page size, length dims, next_n, compress ratio, q "
                        "dtype: %s); the hook serves them",
                        live_n, variant)  # fmt: skip
        verdict.append(not differ_n and compared >= MIN_COMPARED)
        return verdict[0]

    topk.candidate_logits_top_k(
        step.q, step.kv_cache, step.weights, step.seq_lens, step.block_table, step.candidates,
        layer.candidate_block_size, step.indices, layer.topk_tokens,
        _dense_is_aiter_gluon(kv_cache, layer.compress_ratio), False, check,
    )  # fmt: skip
    return bool(verdict) and verdict[0]


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _dense_is_aiter_gluon(kv_cache, compress_ratio) -> bool:
    """Whether vLLM's ``rocm_fp8_paged_mqa_logits`` would take AITER's gfx942 kernel, the one
    the candidate logits mirror: pages of more than one key, a compress ratio other than C4A's,
    and AITER's paged-MQA logits module importable with that API (else its torch reference).
    Asked only where the candidate-logits hook runs (reader layers, the hook on)."""
    return (
        kv_cache.shape[1] > 1
        and not _vllm_rocm._indexer_k_is_c4a_block_flat(compress_ratio)
        and _vllm_rocm.paged_mqa_logits_module() is not None
    )


def _candidates(layer, logits, next_n: int, seq_lens, out, on: bool, why_not=None) -> bool:
    """Layer 20 writes its candidate blocks; layers 24-36 restrict to theirs (the candidate
    top-k unless ``why_not``). True when the reader's top-512 is already in ``out``."""
    cands = layer.candidate_blocks
    if cands is None:
        return False
    rows = logits.shape[0]
    cands = cands[:rows]
    size = layer.candidate_block_size
    if layer.candidate_write:

        def select():
            return topk.select_candidates(logits, next_n, seq_lens, size, cands)

        if not _hook("select_candidates", on, select):
            from vllm.model_executor.layers.sparse_attn_indexer import _select_candidate_blocks

            starts, ends = _candidate_row_bounds(seq_lens, rows, next_n)
            _select_candidate_blocks(logits, starts, ends, cands.shape[1], size, cands)
        return False
    if _hook("candidate_top_k", on, lambda: topk.candidate_top_k(
            logits, next_n, seq_lens, cands, size, out, layer.topk_tokens), why_not):  # fmt: skip
        return True
    starts, ends = _candidate_row_bounds(seq_lens, rows, next_n)
    _vllm_rocm._apply_candidate_mask_strided(logits, starts, ends, cands, size)
    return False


def _candidate_row_bounds(seq_lens, rows: int, next_n: int):
    """vLLM's row bounds for its candidate kernels: every draft row of a request ends at the
    request's length (``seq_lens`` repeated ``next_n`` times when it holds one per request)."""
    visible = seq_lens.reshape(-1)
    if visible.numel() != rows:
        visible = visible.repeat_interleave(next_n)
    visible = visible[:rows].to(torch.int64)
    return torch.zeros_like(visible), visible


def _top_k(layer, meta, logits, next_n: int, out, on: bool) -> None:
    """vLLM's decode top-k choice: AITER's indexer top-k where vLLM would take it (never on
    gfx942: it is gfx950-only), else the plugin's top-512, else vLLM's ``top_k_per_row_decode``."""
    decode = meta.decode
    rows = logits.shape[0]
    if get_forward_context().cudagraph_runtime_mode == CUDAGraphMode.FULL:
        max_len = layer.max_model_len  # a bound that holds at every replay
    else:
        max_len = meta.max_seq_len // layer.compress_ratio
    if rocm_aiter_ops.is_indexer_top_k_supported(
        is_prefill=False, compress_ratio=layer.compress_ratio, num_rows=rows,
        max_valid_seq_len=max_len, topk_tokens=layer.topk_tokens,
    ) and not rocm_aiter_ops.dsv4_indexer_prefers_native_top_k(
        num_rows=rows, num_columns=logits.shape[1], topk_tokens=layer.topk_tokens
    ):  # fmt: skip
        counters.record("decode_top_k", False, "AITER's indexer top-k serves")
        rocm_aiter_ops.indexer_top_k_decode(
            logits, 1, decode.seq_lens.reshape(-1), out, layer.topk_tokens
        )
        return
    if not _hook("decode_top_k", on, lambda: topk.decode_top_k(
            logits, next_n, decode.seq_lens, out, layer.topk_tokens)):  # fmt: skip
        vllm_top_k_per_row_decode(logits, next_n, decode.seq_lens, out, layer.topk_tokens)


def vllm_top_k_per_row_decode(logits, next_n: int, seq_lens, out, topk_tokens: int) -> None:
    """vLLM's C++ decode top-k (``torch.ops._C.top_k_per_row_decode``)."""
    torch.ops._C.top_k_per_row_decode(
        logits, next_n, seq_lens, out, logits.shape[0], logits.stride(0), logits.stride(1),
        topk_tokens,
    )  # fmt: skip
