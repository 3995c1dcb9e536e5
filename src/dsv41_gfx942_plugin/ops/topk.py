"""Top-512 selection for DeepSeek-V4.1's sparse indexer decode path (``hip/topk512.hip``).

vLLM 0.33's decode indexer picks each row's 512 best columns with its generic top-k, which on
gfx942 sends every -inf logit of a candidate-masked row to one LDS histogram bin with an
atomic, and selects layer 20's candidate blocks with three launches and a sort. The kernels here
do the same work from a code object compiled ahead of time (no compiler at run time): the
functions below launch them, and the hooks (``decode_top_k``, ``candidate_top_k``,
``select_candidates``, ``skip_decode_fill``) return False, having written nothing, for any call
they cannot take, so vLLM's op runs instead.

Call :func:`build` at a warm-up point (model load), after the device is set and outside stream
capture. Every launch goes on torch's current stream, reads row lengths on the device and uses
persistent scratch, so a CUDA graph captured once is right at every replay.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import _launcher

try:
    from .._log import logger
except ImportError:  # vLLM absent (the bare GPU test machine): a plain logger of the same name
    import logging

    logger = logging.getLogger("vllm.plugins.dsv41_gfx942")

__all__ = [
    "build",
    "top_k_per_row_decode_512",
    "decode_top_k",
    "candidate_top_k",
    "select_candidates",
    "compact_top_k_512",
    "skip_decode_fill",
]

TOPK = 512
# Pass 1 of the register path: a workgroup holds a chunk of 16384 logits, and the merges take up
# to 64 chunks a row: rows of up to 1M logits. H200-measured (graph replay,
# 6x16k / 6x128k / 32x128k / 6x256k rows), with 1024-thread workgroups: 16384-logit chunks
# 13.8 / 26.5 / 41.0 / 28.6 us; 8192-logit chunks 22.6 / 24.8 / 56.2 / 38.0 us. With chunk
# supersets and 512-thread workgroups (same run, three rounds, 8192-logit chunks of 512 x 16 keys
# in groups of 8, merges of 16 chunks): dense 6x16k / 6x128k / 32x1M 9.09 / 14.5 / 98.6 ->
# 13.2 / 14.8 / 128.4 us, masked 32x1M 107.9 -> 195.0. (Threads a
# workgroup: THREADS below, measured in hip/topk512.hip.) hip/topk512.hip's CHUNK, which the
# chunk kernel takes whatever min_chunk says (tests/test_topk_build.py checks they agree).
CHUNK = 16384
MAX_CHUNKS = 64  # MERGE_UNITS ** 2: two merge launches
# Candidate slots a chunk hands the merge: a superset of its top 512, the keys above its floor
# when at most CHUNK_SLOTS of them (about 720 of a random chunk), else its exact top 512
# (hip/topk512.hip). A merge workgroup holds MERGE_UNITS units of CHUNK_SLOTS slots (8192) and
# hands on a superset in turn: rows of up to 8 chunks take one merge launch, of up to 64 two.
CHUNK_SLOTS = 1024
MERGE_UNITS = 8
# The general path's defaults, vLLM's in-tree gfx942 values: a row is split into one block for
# every MIN_CHUNK live logits, up to MAX_BLOCKS blocks (222 us against 543 us for vLLM's kernel
# over the 8 calls of a 128k step on MI325X; 16 blocks took 294 us).
MAX_BLOCKS = 8
MIN_CHUNK = 16384
# Logits a row, at most: the kernels' int32 offsets (a general-path chunk's start, up to 63
# chunks of up to a row; a merge unit of 8 chunks; a selection block's end) stay below 2**31.
# 32M logits (128 MB) a row, 32 times DeepSeek-V4.1's 1M context.
MAX_WIDTH = 1 << 25
# Candidate top-k: at most 2048 blocks (LDS hash table) and 16384 columns (registers) a row.
MAX_CANDIDATE_BLOCKS = 2048
MAX_CANDIDATE_COLUMNS = CHUNK
# Candidate selection keeps a row's block scores in registers: 16 a thread in dsv_select_blocks
# (16384 blocks, 128k columns of 8), 32 in dsv_select_blocks_wide (256k columns of 8).
SELECT_BLOCKS = 16384
MAX_SELECT_BLOCKS = 2 * SELECT_BLOCKS
# ... and takes at most this many of them a row (vLLM: 2048): the kernels stage a row's ids in
# the LDS list of hip/topk_select.h (LIST; tests/test_topk_build.py checks).
MAX_SELECT_K = 4096

# Kernel name -> C parameters (P pointer, q int64, i int32); checked against the code object's
# argument metadata in tests/test_topk_build.py.
_TOPK_SIG = "PqiPiiPqPPiii"
KERNELS = {
    "dsv_topk512_chunks": _TOPK_SIG,
    "dsv_topk512_chunks_stream": _TOPK_SIG,
    "dsv_topk512_merge": _TOPK_SIG + "PPi",
    "dsv_topk512_merge_final": _TOPK_SIG + "PPi",
    "dsv_topk512_candidates": "PqiPiiPqPqii",
    "dsv_topk512_compact": "PqPqiPiiPq",
    "dsv_select_blocks": "PqiPiiPqi",
    "dsv_select_blocks_wide": "PqiPiiPqi",
}
# Threads a workgroup of each kernel (its __launch_bounds__ in hip/topk512.hip).
THREADS = {
    "dsv_topk512_chunks": 512,
    "dsv_topk512_chunks_stream": 1024,
    "dsv_topk512_merge": 512,
    "dsv_topk512_merge_final": 512,
    "dsv_topk512_candidates": 512,
    "dsv_topk512_compact": 512,
    "dsv_select_blocks": 1024,
    "dsv_select_blocks_wide": 1024,
}
# The device type the hooks take (ROCm tensors are "cuda" tensors too); the CPU gating tests
# set it to "cpu" together with fake kernels.
_GPU_TYPE = "cuda"

# The code object's name: _kernels/<STEM>.<arch>.co (hip/build.py's output for topk512.hip).
STEM = "topk512"
_modules: dict[int, _launcher.Module | None] = {}
_scratch = _launcher.Scratch()


def code_object_path() -> Path:
    """This GPU's top-k code object file (``_kernels/topk512.<arch>.co``), there or not."""
    return _launcher.code_object_path(STEM, _launcher.code_object_arch())


def build() -> bool:
    """Load the shipped code object on the current device once and check its answers against
    torch there (``_topk_check``); whether the kernels are available. When it cannot (no code
    object for this GPU, a runtime error, an answer that differs), log one warning and return
    False: every hook then returns False and vLLM's ops run."""
    if not torch.cuda.is_available():
        return False
    device = torch.cuda.current_device()
    if device in _modules:
        return _modules[device] is not None
    if torch.cuda.is_current_stream_capturing():
        return False  # never load inside capture; a later call outside it loads
    try:
        from . import _topk_check  # which calls this module's ops

        _modules[device] = _launcher.load(STEM, KERNELS, device)
        differs = _topk_check.check(torch.device(_GPU_TYPE, device))
        if differs:
            raise RuntimeError(f"the load-time check against torch failed: {differs}")
    except Exception as err:  # any failure keeps vLLM's ops: log it once
        _modules[device] = None
        logger.warning("dsv41_gfx942 top-k kernels unavailable, vLLM's ops run instead: %s", err)
    return _modules[device] is not None


def _kernels(t: torch.Tensor) -> dict[str, _launcher.Kernel] | None:
    """The loaded kernels for t's device, when they are loaded and that device is current."""
    if not t.is_cuda:
        return None
    device = t.device.index
    module = _modules.get(device)
    if module is None:  # not loaded yet (load it if t's device is current), or failed
        if device in _modules or device != torch.cuda.current_device() or not build():
            return None
        module = _modules[device]
    elif device != torch.cuda.current_device():
        return None
    return module.kernels


def serves(t: torch.Tensor) -> bool:
    """Whether the kernels can take tensors on t's device: loaded there (loading them once, as
    ``build``) and that device the current one, where a launch runs. The candidate-logits hook
    asks before its own launch."""
    return _kernels(t) is not None


def _is_int32_lens(seq_lens, rows: int, next_n: int, device) -> bool:
    if not isinstance(seq_lens, torch.Tensor):
        return False
    if seq_lens.dtype != torch.int32 or seq_lens.device != device or not seq_lens.is_contiguous():
        return False
    if seq_lens.dim() == 2:
        return seq_lens.numel() >= rows
    return seq_lens.dim() == 1 and seq_lens.numel() * next_n >= rows


def _is_int32_rows(t, rows: int, device) -> bool:
    """A 2-D int32 tensor of at least ``rows`` rows with unit column stride on ``device``."""
    return (
        isinstance(t, torch.Tensor)
        and t.dtype == torch.int32
        and t.dim() == 2
        and t.device == device
        and t.shape[0] >= rows
        and t.stride(1) == 1
    )


def _rows_apart(t: torch.Tensor, rows: int, width: int) -> bool:
    """Whether ``rows`` rows of ``width`` entries written into ``t`` do not overlap (an expanded
    or overlapping view would have its rows overwrite each other)."""
    return rows <= 1 or t.stride(0) >= width


def _is_index_out(indices, rows: int, width: int, device) -> bool:
    return (
        _is_int32_rows(indices, rows, device)
        and indices.shape[1] >= width
        and _rows_apart(indices, rows, width)
    )


def _is_block_ids(candidates, rows: int, max_blocks: int, device) -> bool:
    """int32 block ids [>= rows, 1..max_blocks] with unit column stride on ``device``."""
    return _is_int32_rows(candidates, rows, device) and 1 <= candidates.shape[1] <= max_blocks


def _is_logits(logits: torch.Tensor) -> bool:
    return (
        logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.device.type == _GPU_TYPE
        and logits.stride(1) == 1
        and logits.shape[1] <= MAX_WIDTH
    )


def _register_width(width: int) -> bool:
    """Widths the chunk kernel takes: at least one float4 (it reads a row's first 4 logits
    however short the row; a narrower row ends at or before 512, which the general path answers
    without reading it), at most 64 chunks."""
    return 4 <= width <= MAX_CHUNKS * CHUNK


def _register_path(logits: torch.Tensor) -> bool:
    """Rows the chunk kernel takes: 16-byte aligned, of a width it takes."""
    return (
        logits.stride(0) % 4 == 0
        and logits.data_ptr() % 16 == 0
        and _register_width(logits.shape[1])
    )


def _shape(t) -> tuple | str:
    """A tensor's shape, or what else ``t`` is, for a message."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _why_not_decode(logits, next_n, seq_lens, indices) -> str | None:
    if not isinstance(logits, torch.Tensor) or not _is_logits(logits):
        return (
            f"logits must be a float32 CUDA tensor [rows, width <= {MAX_WIDTH}] with unit "
            "column stride"
        )
    if not isinstance(next_n, int) or next_n < 1:
        return f"next_n must be an int >= 1, got {next_n!r}"
    rows = logits.shape[0]
    if not _is_int32_lens(seq_lens, rows, next_n, logits.device):
        return (
            f"seq_lens {_shape(seq_lens)} must be contiguous int32 on {logits.device}, "
            f"one length a row (2-D) or a request (1-D) for {rows} rows, next_n {next_n}"
        )
    if not _is_index_out(indices, rows, TOPK, logits.device):
        return (
            f"indices {_shape(indices)} must be int32 [>= {rows}, >= {TOPK}] with unit "
            f"column stride on {logits.device}"
        )
    return None


def _decode_split(width: int, register: bool, max_blocks: int) -> tuple[int, int, int]:
    """A decode row's chunks (the first launch's workgroups a row), the first merge's groups a
    row, and the int32 scratch a row takes (keys and ids of both; none for a single chunk)."""
    max_chunks = max(-(-width // CHUNK) if register else max_blocks, 1)
    groups = -(-max_chunks // MERGE_UNITS)
    return max_chunks, groups, 2 * CHUNK_SLOTS * (max_chunks + groups) if max_chunks > 1 else 0


def reserve_decode_scratch(rows: int, width: int, device: int) -> bool:
    """Grow the decode top-512's scratch on ``device`` now to what ``rows`` rows of ``width``
    logits take on either path, and say whether it holds that much. vLLM's profile run reserves
    its decode logits for its most decode rows; the indexer reserves this beside them, so that
    vLLM's memory profile counts it and sizes the KV cache around it (a call that later finds
    it too small grows it then, outside graph capture). About a seventh of vLLM's own: 72 KiB a
    row of 128k logits against its 512 KiB, 576 KiB a row of 1M."""
    paths = (True, False) if _register_width(width) else (False,)
    need = max(rows * _decode_split(width, register, MAX_BLOCKS)[2] for register in paths)
    return need == 0 or _scratch.reserve(device, need)


def _launch_decode(kernels, logits, next_n, seq_lens, indices, register, max_blocks, min_chunk):
    """Launch the decode top-512; False (nothing launched) when scratch cannot be had."""
    rows, width = logits.shape
    if rows == 0:
        return True
    first = "dsv_topk512_chunks" if register else "dsv_topk512_chunks_stream"
    max_chunks, groups, per_row = _decode_split(width, register, max_blocks)
    # A chunk longer than the row is the row: min_chunk past it changes nothing.
    min_chunk = CHUNK if register else min(min_chunk, max(width, 1))
    slots = rows * CHUNK_SLOTS  # int32 slots a unit of every row
    device = logits.device.index
    scratch = _scratch.get(device, rows * per_row) if per_row else None
    if per_row and scratch is None:
        return False
    keys = ids = keys2 = ids2 = 0
    if scratch is not None:  # the chunks' keys and ids, then the first merge's
        keys = scratch.data_ptr()
        ids = keys + 4 * slots * max_chunks
        keys2 = ids + 4 * slots * max_chunks
        ids2 = keys2 + 4 * slots * groups
    row = (
        logits.data_ptr(),
        logits.stride(0),
        width,
        seq_lens.data_ptr(),
        int(seq_lens.dim() == 1),
        next_n,
        indices.data_ptr(),
        indices.stride(0),
    )
    split = (max_chunks, min_chunk, CHUNK_SLOTS)
    stream = _launcher.stream_handle(device)
    kernels[first]((max_chunks, rows, 1), THREADS[first], stream, *row, keys, ids, *split)
    # The last merge launch holds each row whole (<= MERGE_UNITS units): dsv_topk512_merge_final.
    span = 1
    if groups > 1:  # <= MERGE_UNITS groups (max_chunks <= 64): the second merge writes the rows
        name = "dsv_topk512_merge"
        kernels[name](
            (groups, rows, 1), THREADS[name], stream, *row, keys, ids, *split, keys2, ids2, 1
        )
        keys, ids, span = keys2, ids2, MERGE_UNITS
    if max_chunks > 1:
        name = "dsv_topk512_merge_final"
        kernels[name]((1, rows, 1), THREADS[name], stream, *row, keys, ids, *split, 0, 0, span)
    return True


def _launch_rows(name: str, logits: torch.Tensor, *args) -> bool:
    """One workgroup a row of ``logits`` for kernel ``name`` on torch's current stream; False
    (nothing launched) when the kernels are not loaded on this device."""
    kernels = _kernels(logits)
    if kernels is None:
        return False
    rows = logits.shape[0]
    if rows:
        stream = _launcher.stream_handle(logits.device.index)
        kernels[name]((rows, 1, 1), THREADS[name], stream, *args)
    return True


def top_k_per_row_decode_512(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    max_blocks: int = MAX_BLOCKS,
    min_chunk: int = MIN_CHUNK,
    register_select: bool = True,
) -> None:
    """vLLM's ``top_k_per_row_decode`` with topK 512: ``indices[r, :512]`` gets the column ids
    of row r's 512 largest logits (torch.topk's order: NaN above +inf), in no order; a row whose
    end is <= 512 gets ``0..end-1`` then -1. Row ends: 2-D ``seq_lens`` -> ``seq_lens.view(-1)
    [r]``; 1-D -> ``seq_lens[r // next_n] - next_n + r % next_n + 1`` (causal); clamped to
    ``[0, width]``. Rows 16-byte aligned (and ``register_select``) take the register path:
    chunks of 16384 logits read once, then one merge launch where the widest row spans 2-8
    chunks, two where it spans more, none where one. Others split a row into at most
    ``max_blocks`` (<= 64) chunks of at least ``min_chunk`` logits, read at each radix pass.
    Raises ValueError/TypeError for inputs it cannot take."""
    why = _why_not_decode(logits, next_n, seq_lens, indices)
    if why is not None:
        tensors = all(isinstance(t, torch.Tensor) for t in (logits, seq_lens, indices))
        raise ValueError(why) if tensors else TypeError(why)
    register = register_select and _register_path(logits)
    if not register and not (isinstance(max_blocks, int) and isinstance(min_chunk, int)):
        raise TypeError(f"max_blocks and min_chunk must be ints, got {max_blocks!r}, {min_chunk!r}")
    if not register and not (1 <= max_blocks <= MAX_CHUNKS and min_chunk >= 1):
        raise ValueError(f"max_blocks must be in [1, {MAX_CHUNKS}] and min_chunk >= 1")
    kernels = _kernels(logits)
    if kernels is None:
        raise RuntimeError("the top-k kernels are not loaded on this device (see build())")
    if not _launch_decode(
        kernels, logits, next_n, seq_lens, indices, register, max_blocks, min_chunk
    ):
        raise RuntimeError("top-k scratch must grow, which it cannot during graph capture")


def decode_top_k(logits, next_n, seq_lens, indices, topk_tokens) -> bool:
    """The hook in front of vLLM's ``top_k_per_row_decode`` in the indexer decode path: runs
    :func:`top_k_per_row_decode_512` and returns True, or returns False having written nothing
    (topK != 512, dtypes, strides, sizes, kernels not loaded)."""
    if topk_tokens != TOPK or _why_not_decode(logits, next_n, seq_lens, indices) is not None:
        return False
    kernels = _kernels(logits)
    if kernels is None:
        return False
    register = _register_path(logits)
    return _launch_decode(
        kernels, logits, next_n, seq_lens, indices, register, MAX_BLOCKS, MIN_CHUNK
    )


def candidate_top_k(logits, next_n, seq_lens, candidates, block_size, indices, topk_tokens) -> bool:
    """Layers 24-36: each row's top 512 among the columns of its candidate blocks
    (``candidates[r]``: int32 block ids, -1 anywhere, any order, duplicates allowed; block b
    covers columns ``[b * block_size, (b + 1) * block_size)``), reading only those columns
    instead of masking the whole row. The set equals vLLM's candidate mask followed by its
    top-k (ties at the cut aside), except that a row longer than 512 with fewer than 512 live
    candidate columns gets all of them and then -1 (vLLM's path would add arbitrary masked
    columns), and that an id past the logits' width is dead (vLLM's mask keeps the row's last
    column for it; layer 20 writes none: the indexer hands readers only a writer's candidates
    no wider than theirs). Rows end as the top-k's (2-D lengths; with 1-D ones, the causal
    end). False, having written nothing, for a call it cannot take."""
    if topk_tokens != TOPK or _why_not_decode(logits, next_n, seq_lens, indices) is not None:
        return False
    rows = logits.shape[0]
    if not (
        isinstance(block_size, int)
        and block_size >= 1
        and _is_block_ids(candidates, rows, MAX_CANDIDATE_BLOCKS, logits.device)
        and candidates.shape[1] * block_size <= MAX_CANDIDATE_COLUMNS
    ):
        return False
    return _launch_rows(
        "dsv_topk512_candidates",
        logits,
        logits.data_ptr(),
        logits.stride(0),
        logits.shape[1],
        seq_lens.data_ptr(),
        int(seq_lens.dim() == 1),
        next_n,
        indices.data_ptr(),
        indices.stride(0),
        candidates.data_ptr(),
        candidates.stride(0),
        candidates.shape[1],
        block_size,
    )


def compact_top_k_512(logits, ids, seq_lens, next_n, indices) -> bool:
    """Top-512 over compact candidate rows: entry i of row r is ``(logits[r, i], ids[r, i])``,
    ``ids`` -1 where there is no entry, distinct ids otherwise (rows of 1..16384 entries).
    ``indices[r]`` gets the ids of the 512 largest entries, in no order, then -1 when fewer;
    a row whose end (as in :func:`top_k_per_row_decode_512`) is <= 512 gets ``0..end-1``
    then -1. Returns False, having written nothing, for a call it cannot take."""
    if not (
        isinstance(logits, torch.Tensor)
        and _is_logits(logits)
        and isinstance(ids, torch.Tensor)
        and ids.dtype == torch.int32
        and ids.shape == logits.shape
        and ids.stride(1) == 1
        and ids.device == logits.device
        and 1 <= logits.shape[1] <= CHUNK  # the kernel reads each row's first entry
        and isinstance(next_n, int)
        and next_n >= 1
    ):
        return False
    rows = logits.shape[0]
    if not (
        _is_int32_lens(seq_lens, rows, next_n, logits.device)
        and _is_index_out(indices, rows, TOPK, logits.device)
    ):
        return False
    return _launch_rows(
        "dsv_topk512_compact",
        logits,
        logits.data_ptr(),
        logits.stride(0),
        ids.data_ptr(),
        ids.stride(0),
        logits.shape[1],
        seq_lens.data_ptr(),
        int(seq_lens.dim() == 1),
        next_n,
        indices.data_ptr(),
        indices.stride(0),
    )


def select_candidates(logits, next_n, seq_lens, block_size, candidates) -> bool:
    """Layer 20: one launch writes each row's candidate blocks, the same set of block ids as
    vLLM's ``_select_candidate_blocks`` in any order (ties at the cut aside): block b scores
    the NaN-propagating max of the row's columns ``[b * block_size, ...)`` below
    ``min(end, width)``, the newest block ``(end - 1) // block_size`` is pinned to +inf, the
    ``candidates.shape[1]`` best are kept, -1 for blocks scoring -inf and for the rest. Row
    ends as vLLM's candidate code takes them: ``seq_lens.reshape(-1)``, repeated ``next_n``
    times when it holds one length a request (every draft row uses the request's length).
    False, having written nothing, for a call it cannot take (more than ``MAX_SELECT_K``
    candidates a row among them; vLLM keeps 2048)."""
    if not (isinstance(logits, torch.Tensor) and _is_logits(logits)):
        return False
    rows, width = logits.shape
    if not (
        isinstance(next_n, int)
        and next_n >= 1
        and isinstance(block_size, int)
        and 1 <= block_size <= MAX_WIDTH  # a block's end (b * size + size) fits int32
        and isinstance(seq_lens, torch.Tensor)
        and seq_lens.dtype == torch.int32
        and seq_lens.is_contiguous()
        and seq_lens.device == logits.device
        and _is_block_ids(candidates, rows, MAX_SELECT_K, logits.device)
        and _rows_apart(candidates, rows, candidates.shape[1])
    ):
        return False
    blocks = -(-width // block_size)
    ends = seq_lens.numel()
    rep = 1 if ends == rows else next_n
    if blocks > MAX_SELECT_BLOCKS or ends * rep < rows:
        return False
    return _launch_rows(
        "dsv_select_blocks_wide" if blocks > SELECT_BLOCKS else "dsv_select_blocks",
        logits,
        logits.data_ptr(),
        logits.stride(0),
        width,
        seq_lens.data_ptr(),
        rep,
        block_size,
        candidates.data_ptr(),
        candidates.stride(0),
        candidates.shape[1],
    )


def skip_decode_fill(has_prefill, num_decode_tokens, num_tokens, decode, columns, topk_tokens):
    """Whether the indexer decode path may skip vLLM's ``topk_indices_buffer[:num_tokens] = -1``:
    only when the kernels are loaded, the step has no prefill, its decode rows are not padded,
    they are all ``num_tokens`` rows (``hidden_states.shape[0]``, graph padding included), and
    the buffer's ``columns`` are the ``topk_tokens`` a row the top-k writes. The decode top-k
    then writes every entry of every row (this module's kernels and vLLM's
    ``top_k_per_row_decode`` both write -1 past a short row's end)."""
    return (
        not has_prefill
        and columns == topk_tokens
        and decode is not None
        and not getattr(decode, "requires_padding", True)
        and num_decode_tokens == num_tokens
        and build()
    )


def candidate_logits_top_k(
    q_fp8, kv_cache, weights, seq_lens, block_table, candidates, block_size, indices,
    topk_tokens, dense_is_aiter_gluon, requires_padding, check=None,
) -> bool:  # fmt: skip
    """Layers 24-36: the candidate-only FP8 logits (Gluon, ``cand_logits``) and their compact
    top-512, instead of vLLM's dense logits, mask and top-k. Lives with the other top-k hooks
    so the indexer finds them in one module; imported lazily (Gluon compiles on first call)."""
    from .cand_logits import candidate_logits_top_k as hook

    return hook(q_fp8, kv_cache, weights, seq_lens, block_table, candidates, block_size,
                indices, topk_tokens, dense_is_aiter_gluon, requires_padding, check)  # fmt: skip
