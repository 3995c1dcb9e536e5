"""Candidate-only indexer logits (ops/cand_logits.py): gfx942 compile checks, split_cache, the
hook's gating (CPU, CI), and the portable twin against a float reference (marker gpu).

The reference (below) writes an indexer cache in vLLM's SHUFFLE layout (checked against vLLM's
own writer, `indexer_k_quant_and_cache_triton`, run in the Triton interpreter) and computes each
compact entry from the dense FP8 keys it wrote, never from the cache: so the twin's reads through
the shared `_column_addresses` helper are checked against the layout, not against a copy of it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

import fresh_compile
import ref_indexer
from dsv41_gfx942_plugin.ops import _cand_kernels, _cand_layout, cand_logits
from dsv41_gfx942_plugin.ops import topk as real_topk

CUDA = torch.cuda.is_available() and torch.version.hip is None
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU (the portable twin)")
GFX942 = (
    torch.cuda.is_available()
    and torch.version.hip is not None
    and torch.cuda.get_device_properties(0).gcnArchName.startswith("gfx942")
)
# Cases whose answer does not depend on the arithmetic's order run on whichever kernel the GPU
# has: the twin on an NVIDIA GPU, the gfx942 kernel on an MI300X (`-m gpu` runs them there).
needs_a_kernel = pytest.mark.skipif(
    not (CUDA or GFX942), reason="needs an NVIDIA GPU (the twin) or a gfx942 GPU (its kernel)"
)

# --------------------------------------------------------------------------------------------
# Reference: cache writer and float logits
# --------------------------------------------------------------------------------------------


def shuffle_offsets(page_size: int, dim: int) -> torch.Tensor:
    """Byte offset of key t, dim d inside a page: vLLM's SHUFFLE layout, 16 keys x 16 bytes tiles
    (`_indexer_k_quant_and_cache_kernel`: tile block t // 16, tile row t % 16, 16-byte column
    d // 16)."""
    t = torch.arange(page_size)[:, None]
    d = torch.arange(dim)[None, :]
    return t // 16 * (16 * dim) + d // 16 * 256 + t % 16 * 16 + d % 16


def strided_cache(pages: int, page_size: int, dim: int, pad: int, device, fill: int = 0):
    """A uint8 `[pages, page_size, 1, dim + 4]` view whose page stride is `pad` bytes longer than
    a page, like vLLM's cache view into blocks shared with the main KV cache."""
    page_bytes = page_size * (dim + 4)
    base = torch.full((pages * (page_bytes + pad),), fill, dtype=torch.uint8, device=device)
    return base.as_strided((pages, page_size, 1, dim + 4), (page_bytes + pad, dim + 4, dim + 4, 1))


def write_pages(cache, page_ids, keys_u8, scales):
    """Write positions 0..n-1 (keys_u8 `[n, dim]` bytes, scales `[n]`) into the pages page_ids."""
    pages, page_size, _, row = cache.shape
    dim = row - 4
    flat = cache.as_strided((pages, page_size * row), (cache.stride(0), 1))
    offs = shuffle_offsets(page_size, dim).to(cache.device)
    n = keys_u8.shape[0]
    for i, page in enumerate(page_ids):
        lo, hi = i * page_size, min(n, (i + 1) * page_size)
        if lo >= hi:
            break
        k = hi - lo
        flat[page, offs[:k].reshape(-1)] = keys_u8[lo:hi].reshape(-1)
        scale_bytes = scales[lo:hi].contiguous().view(torch.uint8)
        flat[page, page_size * dim : page_size * dim + 4 * k] = scale_bytes


@dataclasses.dataclass
class Case:
    q: torch.Tensor  # [batch, next_n, heads, dim] FP8
    kv_cache: torch.Tensor
    weights: torch.Tensor  # [rows, heads]
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    candidates: torch.Tensor  # [rows, blocks]
    cand_block: int
    keys: list  # per request: [len, dim] FP8 as float
    scales: list  # per request: [len] float
    ends: list  # per row: the row's end (the top-k's)
    live_ends: list  # per row: where its live columns end (ref_indexer.live_ends)

    @property
    def next_n(self) -> int:
        return self.q.shape[1]


def make_case(
    *,
    lens,
    next_n=1,
    heads=64,
    page_size=64,
    blocks=40,
    cand_block=8,
    per_row=True,
    row_ends=None,
    pad=4096,
    fp8=torch.float8_e4m3fn,
    device="cpu",
    seed=0,
    extra_pages=3,
    min_page=0,
    drop=0.2,
):
    """A decode step: requests of `lens` positions, pages in a random order of a strided cache
    (physical page 0 unused and full of NaN bytes, so dead entries that read it must still write
    -inf), unused block-table entries set to a page far outside the cache, candidates that mix
    blocks inside, straddling and past the row end with -1 anywhere."""
    g = torch.Generator().manual_seed(seed)
    dim = 128
    batch = len(lens)
    rows = batch * next_n
    npages = [max(1, math.ceil(n / page_size)) for n in lens]
    total = 1 + min_page + sum(npages) + extra_pages
    cache = strided_cache(total, page_size, dim, pad, device, fill=0xFF)
    order = (1 + min_page + torch.randperm(total - 1 - min_page, generator=g)).tolist()
    width = max(npages) + 2
    block_table = torch.full((batch, width), 1 << 30, dtype=torch.int32)
    keys, scales = [], []
    for b, n in enumerate(lens):
        pages = [order.pop() for _ in range(npages[b])]
        block_table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        k = (torch.randn(n, dim, generator=g) * 3).to(fp8)
        s = torch.rand(n, generator=g) * 0.5 + 0.25
        write_pages(cache, pages, k.view(torch.uint8).to(device), s.to(device))
        keys.append(k.float())
        scales.append(s)
    q = (torch.randn(batch, next_n, heads, dim, generator=g) * 2).to(fp8)
    weights = torch.randn(rows, heads, generator=g)
    if per_row:
        ends = list(row_ends) if row_ends is not None else [
            max(0, lens[r // next_n] - next_n + r % next_n + 1) for r in range(rows)
        ]  # fmt: skip
        shape = (rows, 1) if next_n == 1 else (batch, next_n)
        seq_lens = torch.tensor(ends, dtype=torch.int32).reshape(shape)
    else:
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        ends = [max(0, lens[r // next_n] - next_n + r % next_n + 1) for r in range(rows)]
    candidates = torch.empty(rows, blocks, dtype=torch.int32)
    for r in range(rows):
        # Distinct blocks (as vLLM's selection gives), some past the end, -1 anywhere.
        span = math.ceil(max(ends[r], 1) / cand_block) + 3
        pick = torch.full((blocks,), -1, dtype=torch.int64)
        take = min(span, blocks)
        pick[:take] = torch.randperm(span, generator=g)[:take]
        pick[torch.rand(blocks, generator=g) < drop] = -1
        candidates[r] = pick[torch.randperm(blocks, generator=g)].to(torch.int32)
    return Case(
        q=q.to(device),
        kv_cache=cache,
        weights=weights.to(device),
        seq_lens=seq_lens.to(device),
        block_table=block_table.to(device),
        candidates=candidates.to(device),
        cand_block=cand_block,
        keys=keys,
        scales=scales,
        ends=ends,
        live_ends=ref_indexer.live_ends(seq_lens, rows, next_n),
    )


def reference(case: Case):
    """Compact rows in float64 from the dense keys: (logits, ids)."""
    rows, blocks = case.candidates.shape
    cb = case.cand_block
    q = case.q.float().double().cpu().reshape(rows, *case.q.shape[2:])
    w = case.weights.double().cpu()
    cand = case.candidates.cpu()
    logits = torch.full((rows, blocks * cb), float("-inf"), dtype=torch.float64)
    ids = torch.full((rows, blocks * cb), -1, dtype=torch.int32)
    for r in range(rows):
        b = r // case.next_n
        cols = torch.arange(blocks * cb)
        block = cand[r, cols // cb].long()
        pos = block * cb + cols % cb
        live = (block >= 0) & (pos < case.live_ends[r])
        p = pos[live]
        k = case.keys[b][p].double()
        s = case.scales[b][p].double()
        dots = (q[r] @ k.T) * s[None, :]  # [heads, live]
        logits[r, live] = (dots.clamp_min(0) * w[r][:, None]).sum(0)
        ids[r, live] = p.to(torch.int32)
    return logits, ids


def run_candidate_logits(case: Case, **kw):
    rows = case.candidates.shape[0]
    row_len = case.candidates.shape[1] * case.cand_block
    dev = case.q.device
    out_logits = torch.full((rows, row_len), 7.0, device=dev)
    out_ids = torch.full((rows, row_len), 7, dtype=torch.int32, device=dev)
    cand_logits.candidate_logits(
        case.q.reshape(rows, *case.q.shape[2:]),
        case.kv_cache,
        case.weights,
        case.seq_lens,
        case.next_n,
        case.block_table,
        case.candidates,
        case.cand_block,
        out_logits,
        out_ids,
        **kw,
    )
    return out_logits, out_ids


# --------------------------------------------------------------------------------------------
# CPU: the reference writer is vLLM's layout
# --------------------------------------------------------------------------------------------


def test_reference_writer_matches_vllm_writer():
    """Our SHUFFLE writer puts every byte where vLLM's indexer cache writer puts it."""
    if not triton.knobs.runtime.interpret:
        pytest.skip("runs vLLM's Triton writer in the interpreter (TRITON_INTERPRET=1)")
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import indexer_k_quant_and_cache_triton

    page_size, dim, pages = 32, 128, 4
    theirs = torch.zeros(pages, page_size, dim + 4, dtype=torch.uint8)
    slots = torch.tensor([3, 40, 41, 95, 64, 17, 31, 16], dtype=torch.int64)
    indexer_k_quant_and_cache_triton(torch.randn(8, dim), theirs, slots, 128, "ue8m0")
    assert theirs.any()
    # Read back what vLLM wrote with our offsets, write it again with our writer.
    flat = theirs.view(pages, -1)
    offs = shuffle_offsets(page_size, dim)
    ours = strided_cache(pages, page_size, dim, 0, "cpu")
    for slot in slots.tolist():
        page, t = divmod(slot, page_size)
        key = flat[page, offs[t]]
        scale = flat[page, page_size * dim + 4 * t : page_size * dim + 4 * t + 4]
        full = torch.zeros(t + 1, dim, dtype=torch.uint8)
        full[t] = key
        scales = torch.zeros(t + 1)
        scales[t] = scale.view(torch.float32)[0]
        fresh = strided_cache(1, page_size, dim, 0, "cpu")
        write_pages(fresh, [0], full, scales)
        ours.view(pages, -1)[page, offs[t]] = fresh.reshape(-1)[offs[t]]
        base = page_size * dim + 4 * t
        ours.view(pages, -1)[page, base : base + 4] = fresh.reshape(-1)[base : base + 4]
    assert torch.equal(ours.view(pages, -1), flat)


# --------------------------------------------------------------------------------------------
# CPU: split_cache and candidate_logits' argument checks
# --------------------------------------------------------------------------------------------


def test_split_cache_honours_page_stride():
    cache = strided_cache(5, 32, 128, pad=1000, device="cpu")
    base = cache.as_strided((cache.untyped_storage().nbytes(),), (1,))
    base.copy_(torch.randint(0, 255, base.shape, dtype=torch.uint8))
    keys, scales = cand_logits.split_cache(cache, torch.float8_e4m3fn)
    stride = 32 * 132 + 1000
    assert keys.shape == (5, 32 * 128) and scales.shape == (5, 32)
    assert keys.stride(0) == stride and scales.stride(0) == stride // 4
    for p in range(5):
        assert torch.equal(keys[p].view(torch.uint8), base[p * stride : p * stride + 32 * 128])
        raw = base[p * stride + 32 * 128 : p * stride + 32 * 132].clone().view(torch.float32)
        assert torch.equal(scales[p].view(torch.int32), raw.view(torch.int32))
    assert keys.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("make", "error", "text"),
    [
        (lambda: strided_cache(2, 8, 128, 0, "cpu"), ValueError, "page size 8"),
        (lambda: strided_cache(2, 48, 120, 0, "cpu"), ValueError, "dim 120"),
        (lambda: strided_cache(2, 32, 128, 2, "cpu"), ValueError, "multiple of 4"),
        (lambda: strided_cache(2, 32, 128, 0, "cpu").float(), TypeError, "uint8"),
        (lambda: torch.zeros(2, 32, 2, 132, dtype=torch.uint8), ValueError, r"dim \+ 4"),
        (lambda: torch.zeros(2, 32, 132, dtype=torch.uint8), ValueError, r"dim \+ 4"),
        (lambda: torch.zeros(2, 132, 1, 32, dtype=torch.uint8).transpose(1, 3), ValueError,
         "contiguous"),
        (lambda: torch.zeros(8450, dtype=torch.uint8)[2:].view(2, 32, 1, 132), ValueError,
         "4-byte"),
    ],
)  # fmt: skip
def test_split_cache_rejects(make, error, text):
    with pytest.raises(error, match=text):
        cand_logits.split_cache(make(), torch.float8_e4m3fn)


def test_candidate_logits_rejects_bad_shapes():
    case = make_case(lens=[100, 37], next_n=1, heads=32, page_size=32, blocks=5)
    rows = 2
    ok = dict(
        q_fp8=case.q.reshape(rows, 32, 128),
        kv_cache=case.kv_cache,
        weights=case.weights,
        seq_lens=case.seq_lens,
        next_n=1,
        block_table=case.block_table,
        candidates=case.candidates,
        cand_block=8,
        out_logits=torch.empty(rows, 40),
        out_ids=torch.empty(rows, 40, dtype=torch.int32),
    )
    bad = [
        ("q_fp8", ok["q_fp8"].float(), TypeError),
        ("q_fp8", ok["q_fp8"][:, :, :64], ValueError),
        ("weights", case.weights[:, :16], ValueError),
        ("weights", case.weights.double(), TypeError),
        ("candidates", case.candidates[:1], ValueError),
        ("candidates", case.candidates.long(), TypeError),
        ("out_logits", torch.empty(rows, 41), ValueError),
        ("out_ids", torch.empty(40, rows, dtype=torch.int32).t(), ValueError),
        ("seq_lens", torch.tensor([5, 5, 5], dtype=torch.int32), ValueError),
        ("seq_lens", torch.tensor([[5, 5]], dtype=torch.int32), ValueError),  # [1, rows]
        ("block_table", case.block_table[:1], ValueError),
        ("next_n", 3, ValueError),
        ("cand_block", 0, ValueError),
    ]
    for name, value, error in bad:
        with pytest.raises(error):
            cand_logits.candidate_logits(**{**ok, name: value})
    with pytest.raises(ValueError, match="stages_per_program"):
        cand_logits.candidate_logits(**ok, stages_per_program=-1)
    # 16 heads: the gfx942 kernel's q layout does not compile (a CompilationError, not this).
    with pytest.raises(ValueError, match="heads 16, dim 128 unsupported"):
        cand_logits.candidate_logits(**{**ok, "q_fp8": ok["q_fp8"][:, :16], "weights":
                                        case.weights[:, :16]})  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("q_fp8", "q", TypeError),
        ("weights", None, TypeError),
        ("seq_lens", [100, 37], TypeError),
        ("out_ids", None, TypeError),
        ("next_n", 1.0, TypeError),
        ("cand_block", 8.0, TypeError),
        ("stages_per_program", 1.5, TypeError),
        ("kv_cache", "meta", ValueError),
    ],
)
def test_candidate_logits_rejects_nonsense_naming_it(monkeypatch, name, value, error):
    """Not a tensor (an AttributeError before), a float where an int goes, the cache on another
    device (each of the last four passed every check and reached the launch): the call raises
    naming the argument, and launches nothing."""
    log = []
    monkeypatch.setattr(cand_logits, "_cand_logits_gfx942", _Launches("gfx942", log))
    monkeypatch.setattr(cand_logits, "_cand_logits_portable", _Launches("portable", log))
    case = make_case(lens=[100, 37], next_n=1, heads=32, page_size=32, blocks=5)
    args = dict(
        q_fp8=case.q.reshape(2, 32, 128), kv_cache=case.kv_cache, weights=case.weights,
        seq_lens=case.seq_lens, next_n=1, block_table=case.block_table,
        candidates=case.candidates, cand_block=8, out_logits=torch.empty(2, 40),
        out_ids=torch.empty(2, 40, dtype=torch.int32), stages_per_program=0,
    )  # fmt: skip
    args[name] = case.kv_cache.to("meta") if value == "meta" else value
    with pytest.raises(error, match=name):
        cand_logits.candidate_logits(**args, portable=True)
    assert log == []


class _Launches:
    """A stand-in for a Triton kernel: records ``[grid](*args, **meta)``."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        return lambda *args, **meta: self.log.append((self.name, grid, meta))


@pytest.mark.parametrize(("fp8", "kernel"), [(torch.float8_e4m3fnuz, "gfx942"),
                                             (torch.float8_e4m3fn, "portable")])  # fmt: skip
@pytest.mark.parametrize("per_program", [1, 3])
def test_candidate_logits_launch(monkeypatch, fp8, kernel, per_program):
    """Which kernel a platform gets (gfx942's FP8 picks the gfx942 kernel, any other the twin)
    and a grid whose programs cover every row's columns (row r's ceil(columns / Columns) column
    groups, StagesPerProgram a program), with draft rows (next_n 3) and 1-D or 2-D lengths."""
    log = []
    monkeypatch.setattr(cand_logits, "_cand_logits_gfx942", _Launches("gfx942", log))
    monkeypatch.setattr(cand_logits, "_cand_logits_portable", _Launches("portable", log))
    monkeypatch.setattr(cand_logits, "_fp8_dtype", lambda: fp8)
    rows, blocks, cand_block = 6, 37, 8  # 296 columns a row: not a multiple of any tile
    row_len = blocks * cand_block
    for seq_lens in (torch.full((2,), 300, dtype=torch.int32),
                     torch.full((2, 3), 300, dtype=torch.int32)):  # fmt: skip
        log.clear()
        cand_logits.candidate_logits(
            torch.zeros(rows, 64, 128, dtype=fp8), strided_cache(8, 64, 128, 0, "cpu"),
            torch.zeros(rows, 64), seq_lens, 3, torch.zeros(2, 8, dtype=torch.int32),
            torch.zeros(rows, blocks, dtype=torch.int32), cand_block,
            torch.empty(rows, row_len), torch.empty(rows, row_len, dtype=torch.int32),
            per_program,
        )  # fmt: skip
        [(name, grid, meta)] = log
        columns = _cand_kernels.COLUMNS if kernel == "gfx942" else _cand_kernels.TWIN_COLUMNS
        splits = math.ceil(math.ceil(row_len / columns) / per_program)
        assert name == kernel and grid == (rows * splits,)
        assert meta["StagesPerProgram"] == per_program
        assert meta["SeqLensIs2D"] == (seq_lens.dim() == 2)
    with pytest.raises(ValueError, match="1-D per request"):  # 1-D lengths, one a row
        cand_logits.candidate_logits(
            torch.zeros(rows, 64, 128, dtype=fp8), strided_cache(8, 64, 128, 0, "cpu"),
            torch.zeros(rows, 64), torch.full((6,), 300, dtype=torch.int32), 3,
            torch.zeros(2, 8, dtype=torch.int32), torch.zeros(rows, blocks, dtype=torch.int32),
            cand_block, torch.empty(rows, row_len), torch.empty(rows, row_len, dtype=torch.int32),
        )  # fmt: skip


# --------------------------------------------------------------------------------------------
# CPU: the hook's gating
# --------------------------------------------------------------------------------------------


def hook_args(**change):
    """A call the hook takes (on a GPU): 3 requests x 2 rows (MTP-1), 64 heads, pages of 64."""
    batch, next_n, heads = 3, 2, 64
    rows = batch * next_n
    args = dict(
        q_fp8=torch.zeros(batch, next_n, heads, 128, dtype=torch.float8_e4m3fnuz),
        kv_cache=strided_cache(8, 64, 128, 4096, "cpu"),
        weights=torch.zeros(rows + 2, heads),
        seq_lens=torch.full((batch,), 300, dtype=torch.int32),
        block_table=torch.zeros(batch, 8, dtype=torch.int32),
        candidates=torch.full((rows + 2, 2048), -1, dtype=torch.int32),
        block_size=8,
        indices=torch.full((rows + 2, 512), -7, dtype=torch.int32),
        topk_tokens=512,
        dense_is_aiter_gluon=True,
        requires_padding=False,
    )
    args.update(change)
    return args


REFUSED = {
    "not AITER's Gluon logits": dict(dense_is_aiter_gluon=False),
    "padding": dict(requires_padding=True),
    "top-2048": dict(topk_tokens=2048),
    "16 heads": dict(q_fp8=torch.zeros(3, 2, 16, 128, dtype=torch.float8_e4m3fnuz)),
    "dim 64": dict(q_fp8=torch.zeros(3, 2, 64, 64, dtype=torch.float8_e4m3fnuz)),
    "q 3-D": dict(q_fp8=torch.zeros(6, 64, 128, dtype=torch.float8_e4m3fnuz)),
    "q bf16": dict(q_fp8=torch.zeros(3, 2, 64, 128, dtype=torch.bfloat16)),
    "q strided": dict(q_fp8=torch.zeros(3, 2, 128, 128, dtype=torch.float8_e4m3fnuz)[:, :, ::2]),
    # 2 requests x 3 draft rows: vLLM 0.33 on ROCm flattens these; AITER's dense kernel would
    # leave a row's dead columns before its last 128-column stage finite.
    "next_n 3": dict(
        q_fp8=torch.zeros(2, 3, 64, 128, dtype=torch.float8_e4m3fnuz),
        seq_lens=torch.full((2,), 300, dtype=torch.int32),
        block_table=torch.zeros(2, 8, dtype=torch.int32),
    ),
    "cache fp8": dict(kv_cache=strided_cache(8, 64, 128, 0, "cpu").view(torch.float8_e4m3fnuz)),
    "cache dim 64": dict(kv_cache=strided_cache(8, 64, 64, 0, "cpu")),
    "page 8": dict(kv_cache=strided_cache(8, 8, 128, 0, "cpu")),
    "page 1": dict(kv_cache=strided_cache(8, 1, 128, 0, "cpu")),
    "page 48": dict(kv_cache=strided_cache(8, 48, 128, 0, "cpu")),
    "page 256": dict(kv_cache=strided_cache(8, 256, 128, 0, "cpu")),  # AITER's other pipeline
    "page stride 2": dict(kv_cache=strided_cache(8, 64, 128, 2, "cpu")),
    "cache 3-D": dict(kv_cache=torch.zeros(8, 64, 132, dtype=torch.uint8)),
    "cache of 2 heads": dict(  # a broadcast view: every stride but the heads' is a cache's
        kv_cache=torch.zeros(8 * 64 * 132, dtype=torch.uint8).as_strided(
            (8, 64, 2, 132), (64 * 132, 132, 0, 1)
        )
    ),
    "pages overlap": dict(  # pages 4096 bytes apart, each 8448 long: split_cache raises
        kv_cache=torch.zeros(7 * 4096 + 64 * 132, dtype=torch.uint8).as_strided(
            (8, 64, 1, 132), (4096, 132, 132, 1)
        )
    ),
    # Layouts split_cache raises on (a ValueError would turn the hook off for the process).
    "cache at a 2-byte offset": dict(
        kv_cache=torch.zeros(8 * 64 * 132 + 2, dtype=torch.uint8)[2:].view(8, 64, 1, 132)
    ),
    "cache rows 136 bytes apart": dict(
        kv_cache=torch.zeros(8, 64, 1, 136, dtype=torch.uint8)[..., :132]
    ),
    "cache bytes strided": dict(  # rows 132 bytes apart, each byte 2 apart: only stride(3)
        kv_cache=torch.zeros(8 * 64 * 264, dtype=torch.uint8).as_strided(
            (8, 64, 1, 132), (64 * 264, 132, 132, 2)
        )
    ),
    "weights fp16": dict(weights=torch.zeros(8, 64, dtype=torch.float16)),
    "weights strided": dict(weights=torch.zeros(8, 128)[:, ::2]),
    "weights short": dict(weights=torch.zeros(5, 64)),
    "weights 3-D": dict(weights=torch.zeros(8, 64, 1)),
    "weights of 32 heads": dict(weights=torch.zeros(8, 32)),  # q has 64
    "seq_lens int64": dict(seq_lens=torch.full((3,), 300, dtype=torch.int64)),
    "seq_lens wrong count": dict(seq_lens=torch.full((4,), 300, dtype=torch.int32)),
    "seq_lens strided": dict(seq_lens=torch.full((6,), 300, dtype=torch.int32)[::2]),
    "seq_lens [rows, 1]": dict(seq_lens=torch.full((6, 1), 300, dtype=torch.int32)),
    "seq_lens [batch, 1]": dict(seq_lens=torch.full((3, 1), 300, dtype=torch.int32)),  # next_n 2
    "cache on another device": dict(kv_cache=strided_cache(8, 64, 128, 0, "meta")),
    "weights on another device": dict(weights=torch.zeros(8, 64, device="meta")),
    "seq_lens on another device": dict(
        seq_lens=torch.full((3,), 300, dtype=torch.int32, device="meta")
    ),
    "block table on another device": dict(
        block_table=torch.zeros(3, 8, dtype=torch.int32, device="meta")
    ),
    "candidates on another device": dict(
        candidates=torch.zeros(8, 2048, dtype=torch.int32, device="meta")
    ),
    "indices on another device": dict(
        indices=torch.zeros(8, 512, dtype=torch.int32, device="meta")
    ),
    "block table int64": dict(block_table=torch.zeros(3, 8, dtype=torch.int64)),
    "block table strided": dict(block_table=torch.zeros(3, 16, dtype=torch.int32)[:, ::2]),
    "block table short": dict(block_table=torch.zeros(2, 8, dtype=torch.int32)),
    "block table 1-D": dict(block_table=torch.zeros(24, dtype=torch.int32)),
    "candidates 1-D": dict(candidates=torch.zeros(8 * 2048, dtype=torch.int32)),
    "indices 1-D": dict(indices=torch.zeros(8 * 512, dtype=torch.int32)),
    "no rows": dict(
        q_fp8=torch.zeros(0, 2, 64, 128, dtype=torch.float8_e4m3fnuz),
        seq_lens=torch.zeros(0, dtype=torch.int32),
    ),
    "candidates int64": dict(candidates=torch.zeros(8, 2048, dtype=torch.int64)),
    "candidates strided": dict(candidates=torch.zeros(8, 4096, dtype=torch.int32)[:, ::2]),
    "candidates short": dict(candidates=torch.zeros(5, 2048, dtype=torch.int32)),
    "512 candidate columns": dict(candidates=torch.zeros(8, 64, dtype=torch.int32)),
    "16392 candidate columns": dict(candidates=torch.zeros(8, 2049, dtype=torch.int32)),
    "block size 0": dict(block_size=0),
    "block size True": dict(block_size=True),  # a bool is an int, not a block size
    "indices int64": dict(indices=torch.zeros(8, 512, dtype=torch.int64)),
    "indices strided": dict(indices=torch.zeros(8, 1024, dtype=torch.int32)[:, ::2]),
    "indices narrow": dict(indices=torch.zeros(8, 256, dtype=torch.int32)),
    "indices short": dict(indices=torch.zeros(5, 512, dtype=torch.int32)),
    # Rows 256 apart: each row's 512 would overwrite the next (compact_top_k_512 refuses it,
    # but only after the candidate logits and the probe's check ran).
    "indices rows overlap": dict(
        indices=torch.zeros(8 * 256 + 256, dtype=torch.int32).as_strided((8, 512), (256, 1))
    ),
}


def test_hook_takes_the_base_call():
    """The base call passes every check, so each refusal below is caused by its one change."""
    assert cand_logits._hook_takes(**hook_args())
    # 2-D lengths, one per row, are taken too; so are 513 candidate columns, one row a
    # request, and the other pages AITER's kernel takes in the same pipeline.
    assert cand_logits._hook_takes(**hook_args(seq_lens=torch.zeros(3, 2, dtype=torch.int32)))
    one = dict(q_fp8=torch.zeros(6, 1, 64, 128, dtype=torch.float8_e4m3fnuz),
               seq_lens=torch.zeros(6, 1, dtype=torch.int32),
               block_table=torch.zeros(6, 8, dtype=torch.int32))  # fmt: skip
    assert cand_logits._hook_takes(**hook_args(**one))
    for page in (16, 32, 128):
        assert cand_logits._hook_takes(**hook_args(kv_cache=strided_cache(8, page, 128, 0, "cpu")))
    assert cand_logits._hook_takes(
        **hook_args(candidates=torch.zeros(8, 513, dtype=torch.int32), block_size=1)
    )
    # Buffers of exactly the step's rows and requests (vLLM's at a full batch).
    exact = dict(weights=torch.zeros(6, 64), candidates=torch.zeros(6, 2048, dtype=torch.int32),
                 indices=torch.zeros(6, 512, dtype=torch.int32),
                 block_table=torch.zeros(3, 8, dtype=torch.int32))  # fmt: skip
    assert cand_logits._hook_takes(**hook_args(**exact))


def test_hook_declines_q_or_weights_past_the_buffer_loads_range(monkeypatch):
    """The gfx942 kernel reads q and the head weights by 32-bit buffer-load offsets within
    ``BUFFER_BYTES`` (a load past it reads 0): a call whose q, or whose last row of weights,
    reaches past it declines. The limit is lowered to the base call's q (49,152 bytes)."""
    args = hook_args()
    q_bytes = args["q_fp8"].numel()
    monkeypatch.setattr(cand_logits, "BUFFER_BYTES", q_bytes)
    assert cand_logits._hook_takes(**args)
    # Rows 2,432 floats apart: row 5 ends at byte 48,896; 2,448 apart: at 49,216, past it.
    assert cand_logits._hook_takes(**hook_args(weights=torch.zeros(8, 2432)[:, :64]))
    assert cand_logits._hook_takes(**hook_args(weights=torch.zeros(8, 2448)[:, :64])) is False
    monkeypatch.setattr(cand_logits, "BUFFER_BYTES", q_bytes - 1)
    assert cand_logits._hook_takes(**args) is False


@pytest.fixture
def fake_topk(monkeypatch):
    """ops.topk with a recording compact_top_k_512 and a ``serves`` that takes every tensor,
    and candidate_logits recording its call."""
    calls = {}
    module = types.ModuleType("dsv41_gfx942_plugin.ops.topk")

    def compact_top_k_512(logits, ids, seq_lens, next_n, indices):
        calls["topk"] = (logits, ids, seq_lens, next_n, indices)
        return calls.get("answer", True)

    def fake_candidate_logits(*args, **kwargs):
        calls["logits"] = args

    module.compact_top_k_512 = compact_top_k_512
    module.serves = lambda t: True
    monkeypatch.setitem(sys.modules, "dsv41_gfx942_plugin.ops.topk", module)
    monkeypatch.setattr(cand_logits, "candidate_logits", fake_candidate_logits)
    return calls


def test_hook_without_a_compact_top_k_declines_and_says_so_once(monkeypatch, plugin_log):
    """An ops.topk without its compact top-512 (a broken install): every call declines, having
    written nothing, and the DEBUG line comes once, not once a call."""
    monkeypatch.setitem(sys.modules, "dsv41_gfx942_plugin.ops.topk", types.ModuleType("topk"))
    args = hook_args(indices=torch.full((8, 512), -7, dtype=torch.int32))
    for _ in range(3):
        assert cand_logits.candidate_logits_top_k(**args) is False
    assert bool((args["indices"] == -7).all())
    said = [r for r in plugin_log.records if "no compact top-512" in r.getMessage()]
    assert len(said) == 1


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_hook_refuses_and_writes_nothing(name, fake_topk):
    """Against a top-k that takes every call (``fake_topk``, which takes the base call:
    test_hook_hands_compact_rows_to_the_top_k), so the refusal is the hook's own."""
    args = hook_args(**REFUSED[name])
    before = {
        k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and not v.is_meta
    }
    assert cand_logits._hook_takes(**args) is False
    assert cand_logits.candidate_logits_top_k(**args) is False
    assert fake_topk == {}  # neither the logits kernel nor the top-k was launched
    for k, v in before.items():
        as_bytes = lambda t: t.contiguous().view(torch.uint8)
        assert torch.equal(as_bytes(args[k]), as_bytes(v)), k


def test_hook_hands_compact_rows_to_the_top_k(fake_topk):
    """The kernel gets the step's rows (of longer buffers), the top-k the step's rows and 512
    columns of ``indices`` (here a wider buffer)."""
    args = hook_args(indices=torch.full((8, 1024), -7, dtype=torch.int32))
    assert cand_logits.candidate_logits_top_k(**args) is True
    q, cache, weights, seq_lens, next_n, table, cand, block, logits, ids = fake_topk["logits"]
    assert q.shape == (6, 64, 128) and q.data_ptr() == args["q_fp8"].data_ptr()
    assert weights.shape == (6, 64) and cand.shape == (6, 2048) and next_n == 2 and block == 8
    assert logits.shape == ids.shape == (6, 2048 * 8) and ids.dtype == torch.int32
    t_logits, t_ids, t_lens, t_next_n, indices = fake_topk["topk"]
    assert t_logits is logits and t_ids is ids and t_lens is seq_lens and t_next_n == 2
    assert indices.shape == (6, 512) and indices.data_ptr() == args["indices"].data_ptr()


@pytest.mark.parametrize("verdict", [True, False])
def test_hook_hands_its_check_the_compact_rows_first(fake_topk, verdict):
    """The indexer's comparison with vLLM's dense logits sees the compact rows before their
    top-k; when it fails the hook returns False and the top-k never runs."""
    seen = []
    args = hook_args(check=lambda logits, ids: seen.append((logits, ids)) or verdict)
    assert cand_logits.candidate_logits_top_k(**args) is verdict
    *_, logits, ids = fake_topk["logits"]
    assert len(seen) == 1 and seen[0][0] is logits and seen[0][1] is ids
    assert ("topk" in fake_topk) is verdict


def test_hook_returns_false_when_the_top_k_declines(fake_topk):
    fake_topk["answer"] = False
    assert cand_logits.candidate_logits_top_k(**hook_args()) is False


def test_hook_asks_the_top_k_whether_it_serves_q_first(fake_topk, monkeypatch):
    """A top-k that does not serve q (its code object failed to load, q off the current GPU):
    declined before the logits kernel runs, and ``serves`` was asked about q itself."""
    asked = []
    module = sys.modules["dsv41_gfx942_plugin.ops.topk"]
    monkeypatch.setattr(module, "serves", lambda t: asked.append(t) and False)
    args = hook_args()
    assert cand_logits.candidate_logits_top_k(**args) is False
    assert asked == [args["q_fp8"]] and fake_topk == {} and (args["indices"] == -7).all()


def test_hook_declines_q_off_the_gpu_before_any_launch(fake_topk, monkeypatch):
    """Loaded kernels do not make q on the CPU launchable: Triton would launch the logits kernel
    on the current GPU with host pointers. The real ``topk.serves``, with kernels said to be
    loaded on device 0, the current one: declined before the logits kernel runs."""
    monkeypatch.setattr(real_topk, "_modules", {0: types.SimpleNamespace(kernels={})})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(sys.modules["dsv41_gfx942_plugin.ops.topk"], "serves", real_topk.serves)
    args = hook_args()
    assert cand_logits.candidate_logits_top_k(**args) is False
    assert fake_topk == {} and (args["indices"] == -7).all()


@pytest.mark.gpu
def test_hook_declines_q_on_another_gpu_before_any_launch(fake_topk, monkeypatch):
    """q on a GPU that is not the current one (here: the current device is said to be 1):
    the logits kernel would run on the current GPU and read q's memory there. The real
    ``topk.serves``, kernels said to be loaded on device 0: declined before it runs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    monkeypatch.setattr(real_topk, "_modules", {0: types.SimpleNamespace(kernels={})})
    monkeypatch.setattr(sys.modules["dsv41_gfx942_plugin.ops.topk"], "serves", real_topk.serves)
    args = {k: v.to("cuda:0") if isinstance(v, torch.Tensor) else v for k, v in hook_args().items()}
    assert cand_logits.candidate_logits_top_k(**args) is True  # on the current GPU: taken
    fake_topk.clear()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert cand_logits.candidate_logits_top_k(**args) is False
    assert fake_topk == {}


def test_hook_returns_false_without_compact_top_k(monkeypatch):
    monkeypatch.setitem(sys.modules, "dsv41_gfx942_plugin.ops.topk", types.ModuleType("topk"))
    launched = []
    monkeypatch.setattr(cand_logits, "candidate_logits", lambda *a, **k: launched.append(a))
    args = hook_args()
    assert cand_logits.candidate_logits_top_k(**args) is False
    assert not launched and (args["indices"] == -7).all()


# --------------------------------------------------------------------------------------------
# CPU: the gfx942 kernel compiles to the MFMA FP8 code AITER's dense kernel runs
# --------------------------------------------------------------------------------------------

_ARGS = [
    "q", "stride_q_row", "stride_q_head", "keys", "stride_k_page", "scales", "stride_scale_page",
    "seq_lens", "next_n", "block_table", "stride_bt_row", "cand", "stride_cand_row", "weights",
    "stride_w_row", "out_logits", "out_ids", "row_len", "splits_per_row",
]  # fmt: skip
_POINTERS = {
    "q": "*fp8e4b8", "keys": "*fp8e4b8", "scales": "*fp32", "seq_lens": "*i32",
    "block_table": "*i32", "cand": "*i32", "weights": "*fp32", "out_logits": "*fp32",
    "out_ids": "*i32",
}  # fmt: skip

# AITER's dense gfx942 kernel (`_gluon_deepgemm_fp8_paged_mqa_logits_preshuffle`, ChunkK=256,
# HiddenDim=128, num_warps=4, waves_per_eu=2, as vLLM calls it), compiled on this CPU machine
# with triton 3.8.0 (the vllm==0.33.0 venv) from ROCm/aiter at e4048607a5 (main, 2026-11; the
# kernel file last changed in 9791b8c150, "Fix 32-bit KV block offsets"), with the KV stride
# divisibility hint vLLM's 16-byte-multiple page stride gets (`is_padded_mode`). Without the hint
# it takes more at pages of 32/64/128: 120/127/122 VGPRs (32 heads), 177/183/179 (64 heads).
# Pages of 16 (which the hook also takes) were compiled later from the same commit, with AITER's
# helper modules stubbed; the same run gave the other pages' figures again.
DENSE_TRITON = "3.8.0"
DENSE_VGPRS = {
    (32, 16): 88,
    (32, 32): 87,
    (32, 64): 91,
    (32, 128): 87,
    (64, 16): 135,
    (64, 32): 137,
    (64, 64): 141,
    (64, 128): 137,
}
# Per MFMA, the dense kernel's head reduction and epilogue (same compile): 128 MFMAs (64 heads,
# four stages) came with 32 v_pk_fma_f32, 28 v_pk_add_f32, 16 v_add_f32 and 16 ds_bpermute_b32.
DENSE_REDUCTION_PER_STAGE_64 = {
    "v_pk_fma_f32": 8,
    "v_pk_add_f32": 7,
    "v_add_f32_e32": 4,
    "ds_bpermute_b32": 4,
}


def compile_gfx942(heads: int, page_size: int, per_row: bool = True, big_cache: bool = False):
    """The kernel as Triton's JIT specializes it for vLLM's tensors: every pointer 16-byte
    aligned and within 2 GiB (buffer loads), and the strides of q ([tokens, heads, 128] fp8) and
    of the head weights multiples of 16. Without that, q's tile loads byte by byte.
    ``big_cache``: the keys' and scales' storage past 2 GiB, as a whole KV cache's is, and their
    page strides and the block table's row stride multiples of 16."""
    sig = {name: _POINTERS.get(name, "i32") for name in _ARGS}
    constexprs = dict(
        SeqLensIs2D=per_row, StagesPerProgram=1, Heads=heads, HiddenDim=128,
        PageSize=page_size, CandBlock=8,
    )  # fmt: skip
    sig.update(dict.fromkeys(constexprs, "constexpr"))
    aligned = [["tt.divisibility", 16], ["tt.pointer_range", 32]]
    attrs = {(_ARGS.index(name),): aligned for name in _POINTERS}
    strides = ["stride_q_row", "stride_q_head", "stride_w_row"]
    if big_cache:
        attrs[(_ARGS.index("keys"),)] = attrs[(_ARGS.index("scales"),)] = aligned[:1]
        strides += ["stride_k_page", "stride_scale_page", "stride_bt_row"]
    for name in strides:
        attrs[(_ARGS.index(name),)] = [["tt.divisibility", 16]]
    src = GluonASTSource(_cand_kernels._cand_logits_gfx942, sig, constexprs, attrs)
    options = {"num_warps": cand_logits.NUM_WARPS, "waves_per_eu": cand_logits.WAVES_PER_EU}
    return triton.compile(src, target=GPUTarget("hip", "gfx942", 64), options=options)


def compile_twin_sm90() -> str:
    sig = {name: _POINTERS.get(name, "i32").replace("fp8e4b8", "fp8e4nv") for name in _ARGS}
    constexprs = dict(
        SeqLensIs2D=False, StagesPerProgram=2, Heads=32, HiddenDim=128, PageSize=32,
        CandBlock=8, Columns=_cand_kernels.TWIN_COLUMNS, ThreadsPerWarp=32,
    )  # fmt: skip
    sig.update(dict.fromkeys(constexprs, "constexpr"))
    src = GluonASTSource(_cand_kernels._cand_logits_portable, sig, constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return kernel.asm["ptx"]


def amdgcn_summary(asm: str) -> dict:
    fields = ("vgpr_count", "agpr_count", "vgpr_spill_count", "sgpr_spill_count")
    fields += ("private_segment_fixed_size",)
    out = {f: int(re.search(rf"\.{f}:\s+(\d+)", asm).group(1)) for f in fields}
    ops = ("v_mfma_f32_16x16x32_fp8_fp8", "scratch_", *DENSE_REDUCTION_PER_STAGE_64)
    ops += ("buffer_load_ubyte", "global_load_ubyte", "buffer_wbl2", "buffer_inv")
    out.update({op: len(re.findall(rf"\b{op}", asm)) for op in ops})
    return out


def _aiter_dense_summaries() -> dict:
    """Where AITER is importable (a gfx942 machine): its dense kernel compiled now, as vLLM
    asks for it (padded mode: vLLM's page stride is a multiple of 16 bytes)."""
    if not _cand_layout.FROM_AITER:
        return {}
    # AITER's dense kernel's module as vLLM 0.33 finds it (its older path first, then
    # attention/, where AITER moved it in 2026-01), or None
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import paged_mqa_logits_module

    aiter_logits = paged_mqa_logits_module()
    if aiter_logits is None:
        return {}

    out = {}
    for heads in (32, 64):
        for page_size in cand_logits.AITER_PAGES:
            try:  # a private AITER helper: its arguments may change between AITER versions
                kernel = aiter_logits._compile_deepgemm_fp8_paged_mqa_logits(
                    ChunkQ=heads, ChunkK=256, Preshuffle=True, KVBlockSize=page_size,
                    HiddenDim=128, is_padded_mode=True, WavePerEU=2,
                )  # fmt: skip
            except Exception:  # noqa: BLE001 - then the recorded figures (or a skip) apply
                return {}
            summary = amdgcn_summary(kernel.asm["amdgcn"])
            stages = summary["v_mfma_f32_16x16x32_fp8_fp8"] // (heads // 16 * 8)
            summary["per_stage"] = {op: summary[op] / stages for op in DENSE_REDUCTION_PER_STAGE_64}
            out[f"{heads}-{page_size}"] = summary
    return out


def _instructions(asm: str) -> list[str]:
    return [line for line in asm.splitlines() if line.startswith("\t") and line[1:2] != "."]


def _compile_all() -> dict:
    out = {"triton": triton.__version__, "aiter": _aiter_dense_summaries()}
    for heads in (32, 64):
        for page_size in cand_logits.AITER_PAGES:
            kernel = compile_gfx942(heads, page_size, per_row=page_size != 64)
            summary = amdgcn_summary(kernel.asm["amdgcn"])
            ttgir = kernel.asm["ttgir"]  # the ReLU: maxnum (NaN -> 0), not NaN-propagating
            summary["maxnum_relu"] = "arith.maxnumf" in ttgir and "arith.maximumf" not in ttgir
            out[f"{heads}-{page_size}"] = summary
    same = (_instructions(compile_gfx942(64, 64, per_row=False, big_cache=big).asm["amdgcn"])
            for big in (False, True))  # fmt: skip
    out["big-cache-same-code"] = next(same) == next(same)
    try:  # a ROCm build of Triton may lack the NVIDIA backend's ptxas
        out["twin-ptx-loads"] = compile_twin_sm90().count("ld.global")
    except Exception as err:
        out["twin-ptx-error"] = f"{type(err).__name__}: {err}"[:300]
    return out


def dense_figures(builds, key: str):
    """AITER's dense kernel compiled in this run, else the figures recorded above, which hold
    for the Triton they were recorded with only."""
    if key in builds["aiter"]:
        return builds["aiter"][key]
    if builds["triton"] != DENSE_TRITON:
        pytest.skip(
            f"dense figures recorded with triton {DENSE_TRITON}, this is {builds['triton']}"
        )
    heads, page_size = map(int, key.split("-"))
    return {
        "vgpr_count": DENSE_VGPRS[(heads, page_size)],
        "per_stage": DENSE_REDUCTION_PER_STAGE_64,
    }


@pytest.fixture(scope="module")
def builds():
    """All compiles in one fresh process (about 10 s)."""
    return fresh_compile.compile_all("test_cand_logits")


@pytest.mark.gfx942  # on an MI300X: with the Triton that serves there
def test_gfx942_code_is_the_same_for_a_whole_kv_cache(builds):
    """The gfx942 kernel's instructions are the same whether the cache's storage is past 2 GiB
    (a whole KV cache: no 32-bit pointer range) and its strides and the block table's are
    multiples of 16 or not: the candidate-logits comparison's synthetic cache, 36 MB, then
    checks the code that serves, though Triton compiles another variant for each. (That
    comparison reproduces the strides' residues anyway, which the NVIDIA twin may need.)"""
    assert builds["big-cache-same-code"]


@pytest.mark.gfx942  # on an MI300X: against AITER's dense kernel compiled there
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("page_size", cand_logits.AITER_PAGES)
def test_gfx942_kernel_compiles_to_mfma_fp8(builds, heads, page_size):
    meta = builds[f"{heads}-{page_size}"]
    # One stage: heads/16 x 8 column tiles of 16x16, 4 MFMAs of K=32 over dim 128, 4 waves.
    assert meta["v_mfma_f32_16x16x32_fp8_fp8"] == heads // 16 * 8 * 4 // 4
    assert meta["vgpr_spill_count"] == meta["sgpr_spill_count"] == 0
    assert meta["private_segment_fixed_size"] == 0 and meta["scratch_"] == 0
    assert meta["buffer_load_ubyte"] == meta["global_load_ubyte"] == 0  # 16-byte loads
    assert meta["buffer_wbl2"] == meta["buffer_inv"] == 0  # no device-scope fence (L2 flushes)
    assert meta["maxnum_relu"]  # a NaN key or query byte gives a 0 term, no NaN logit (README)
    dense = dense_figures(builds, f"{heads}-{page_size}")
    assert meta["vgpr_count"] + meta["agpr_count"] <= dense["vgpr_count"]


@pytest.mark.gfx942  # on an MI300X: against AITER's dense kernel compiled there
def test_gfx942_reduction_matches_dense_kernel(builds):
    """The head reduction and epilogue compile to the dense kernel's instructions per stage."""
    meta = builds["64-64"]
    per_stage = dense_figures(builds, "64-64")["per_stage"]
    assert {op: meta[op] for op in DENSE_REDUCTION_PER_STAGE_64} == per_stage


def test_portable_twin_compiles_for_sm90(builds):
    """The twin the GPU tests run still compiles (sm_90, warp 32) where there is no GPU (with
    a ROCm torch, where Triton may not compile for NVIDIA, it says why not)."""
    if "twin-ptx-error" in builds and torch.version.hip is not None:
        pytest.skip(f"no sm_90 compile with this ROCm Triton: {builds['twin-ptx-error']}")
    assert builds.get("twin-ptx-loads", 0) > 0, builds.get("twin-ptx-error")


def test_layout_choice_is_aiters(monkeypatch):
    """AITER's module's choice is taken where it is importable, the plugin's probe elsewhere;
    the probe answers what AITER's module tests: whether a 2-D instr_shape is accepted."""
    import types

    own = _cand_layout.own_use_2d_instr_shape()
    aiter = types.SimpleNamespace(_sum_combine=object(), _Use_2d_instr_shape_mfma_layout=not own)
    assert _cand_layout.choose(aiter) == (aiter._sum_combine, not own)
    assert _cand_layout.choose(None) == (_cand_layout._own_sum_combine, own)
    # This machine's choice (where AITER is importable, AITER's and the probe's agree:
    # tests/test_cand_logits_gfx942.py).
    taken = _cand_layout.choose(_cand_layout._AITER)
    assert (_cand_layout.sum_combine, bool(_cand_layout.USE_2D_INSTR_SHAPE)) == taken
    real = _cand_layout.gl.amd.AMDMFMALayout

    def strict(**kw):  # a Triton that wants (M, N, K)
        if len(kw["instr_shape"]) != 3:
            raise AssertionError("instr_shape must follow the (M, N, K) format")
        return real(**kw)

    monkeypatch.setattr(_cand_layout.gl.amd, "AMDMFMALayout", strict)
    assert _cand_layout.own_use_2d_instr_shape() is False
    monkeypatch.setattr(_cand_layout.gl.amd, "AMDMFMALayout", lambda **kw: kw)
    assert _cand_layout.own_use_2d_instr_shape() is True


@pytest.mark.parametrize("path", ["aiter.ops.triton.pa_mqa_logits",
                                  "aiter.ops.triton.attention.pa_mqa_logits"])  # fmt: skip
def test_gfx942_tests_take_aiter_where_vllm_finds_it(monkeypatch, path):
    """The gfx942 tests' AITER dense kernel (tests/test_cand_logits_gfx942.py) is the one vLLM
    0.33 calls, at either of AITER's paths (its older one, which vLLM looks at first, before the
    2026-01 move into ``attention/``), on a gfx942 as vLLM's module sees it."""
    import importlib.machinery

    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    import test_cand_logits_gfx942 as gfx942

    def kernel(*args, ChunkK, Preshuffle, KVBlockSize, WavePerEU):  # vLLM's required parameters
        raise AssertionError("not called here")

    parts = path.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=i < len(parts))
        if i < len(parts):
            module.__path__ = []  # a package holding nothing else
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules[path].deepgemm_fp8_paged_mqa_logits = kernel
    monkeypatch.setattr(rocm, "_ON_GFX942", True)
    rocm.paged_mqa_logits_module.cache_clear()
    try:
        assert gfx942.aiter_dense_kernel() is kernel
    finally:
        rocm.paged_mqa_logits_module.cache_clear()


def test_aiter_module_taken_only_with_both_names(monkeypatch):
    """An AITER whose logits module lacks either name the kernel takes from it (another
    release) is not used: the plugin's own choice serves (judged at first use), not a raise."""
    import sys
    import types

    pkgs = ["aiter", "aiter.ops", "aiter.ops.triton", "aiter.ops.triton.gluon"]
    for name in pkgs:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setattr(_cand_layout.importlib.util, "find_spec", lambda name: object())
    logits = types.ModuleType("aiter.ops.triton.gluon.pa_mqa_logits")
    monkeypatch.setitem(sys.modules, logits.__name__, logits)
    monkeypatch.setattr(sys.modules[pkgs[-1]], "pa_mqa_logits", logits, raising=False)
    logits._sum_combine = object()
    assert _cand_layout._aiter_module() is None
    logits._Use_2d_instr_shape_mfma_layout = True
    assert _cand_layout._aiter_module() is logits


# --------------------------------------------------------------------------------------------
# GPU: the kernel the GPU has (the twin, which shares the addressing, on an NVIDIA GPU; the
# gfx942 kernel on an MI300X) against the float reference
# --------------------------------------------------------------------------------------------


def check_against_reference(case: Case, **kw):
    logits, ids = run_candidate_logits(case, **kw)
    ref_logits, ref_ids = reference(case)
    assert torch.equal(ids.cpu(), ref_ids)
    live = ref_ids >= 0
    assert torch.isneginf(logits.cpu()[~live]).all()
    got = logits.cpu()[live].double()
    want = ref_logits[live]
    scale = want.abs().max().item() if want.numel() else 1.0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
    return live


@pytest.mark.gpu
@needs_a_kernel
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("page_size", cand_logits.AITER_PAGES)
def test_kernel_matches_reference(heads, page_size):
    """Strided pages in random order, 2-D per-row lengths, blocks past and across row ends."""
    case = make_case(
        lens=[700, 65, 1, 301], next_n=1, heads=heads, page_size=page_size, blocks=37,
        device="cuda", seed=heads + page_size, fp8=cand_logits._fp8_dtype(),
    )  # fmt: skip
    live = check_against_reference(case)
    assert live.any() and (~live).any()


@pytest.mark.gpu
@needs_a_kernel
@pytest.mark.parametrize("next_n", [2, 3])
@pytest.mark.parametrize("per_row", [False, True])
def test_kernel_draft_rows(next_n, per_row):
    """Rows of draft positions: 1-D lengths (end = len - next_n + j + 1, some <= 0) and 2-D."""
    case = make_case(
        lens=[2, 129, 500], next_n=next_n, heads=64, page_size=32, blocks=33, per_row=per_row,
        device="cuda", seed=next_n, fp8=cand_logits._fp8_dtype(),
    )  # fmt: skip
    check_against_reference(case)


@pytest.mark.gpu
@needs_a_kernel
@pytest.mark.parametrize("lens", [[1001, 4097, 2, 6000], [7, 700, 1025]])
def test_kernel_rows_end_where_the_dense_logits_do(lens):
    """2-D lengths as vLLM's builder makes them at compress ratio 2 from uncompressed lengths
    ``lens``: ``(L - 2 + 1 + j) // 2``, so an odd L ends both rows of a request at the same
    compressed length, one past where AITER's dense kernel (given the request's last length)
    writes row 0's logits; its last column is dead here, as it is -inf there."""
    ends = [(n - 2 + 1 + j) // 2 for n in lens for j in range(2)]
    case = make_case(
        lens=[n // 2 for n in lens], next_n=2, heads=64, page_size=32, blocks=200,
        row_ends=ends, device="cuda", seed=len(lens), drop=0.0, fp8=cand_logits._fp8_dtype(),
    )  # fmt: skip
    assert case.live_ends != case.ends  # some row ends one past its dense logits
    live = check_against_reference(case)
    ids = run_candidate_logits(case)[1].cpu()
    dead = 0
    for r, (end, stop) in enumerate(zip(case.ends, case.live_ends, strict=True)):
        if stop < end and (case.candidates[r].cpu() == stop // case.cand_block).any():
            assert not (ids[r] == stop).any()  # a candidate column, dead
            dead += 1
    assert live.any() and dead > 0


@pytest.mark.gpu
@needs_a_kernel
def test_kernel_blocks_cross_pages_and_short_rows():
    """Candidate blocks of 12 columns straddle 32-key pages; rows end inside blocks, at 0, and
    far before the candidate span; the stage count exceeds the row (stages_per_program=3). The
    2-D ends are ones vLLM's builder makes (each row one past the one before it)."""
    case = make_case(
        lens=[1000, 33, 250, 1], next_n=2, heads=32, page_size=32, blocks=50, cand_block=12,
        per_row=True, row_ends=[999, 1000, 32, 33, 131, 132, 0, 1], device="cuda", seed=7,
        fp8=cand_logits._fp8_dtype(),
    )  # fmt: skip
    assert case.live_ends == case.ends
    for stages in (0, 3):
        check_against_reference(case, stages_per_program=stages)


@pytest.mark.gpu
@needs_cuda
def test_twin_on_the_indexer_probe_step():
    """The step the indexer compares a variant on (cand_probe.probe_step, built on the GPU
    beside a cache of vLLM-like page stride, ratio 2, next_n 2, a first request of 262144
    columns): the twin's compact rows equal the float reference computed from the probe's own
    pages, read back through vLLM's SHUFFLE layout."""
    from dsv41_gfx942_plugin import cand_probe

    real = strided_cache(8, 64, 128, 4104, "cuda")
    q = torch.zeros(3, 2, 64, 128, dtype=torch.float8_e4m3fn, device="cuda")
    lens, table = torch.zeros(3, 2, dtype=torch.int32), torch.zeros(3, 4689, dtype=torch.int32)
    step = cand_probe.probe_step(q, real, lens, table, 2, 300000, 2048)
    keys, scales = cand_logits.split_cache(step.kv_cache, torch.float8_e4m3fn)
    offs = shuffle_offsets(64, 128).cuda()
    dense_keys, dense_scales = [], []
    for b in range(3):  # positions up to the candidates' reach (2048 blocks of 8)
        pos = torch.arange(min(int(step.seq_lens[b, -1]), 2048 * 8), device="cuda")
        page = step.block_table[b, pos // 64].long()
        raw = keys.view(torch.uint8)[page[:, None], offs[pos % 64]]
        dense_keys.append(raw.view(torch.float8_e4m3fn).float().cpu())
        dense_scales.append(scales[page, pos % 64].float().cpu())
    case = Case(
        q=step.q, kv_cache=step.kv_cache, weights=step.weights, seq_lens=step.seq_lens,
        block_table=step.block_table, candidates=step.candidates, cand_block=8,
        keys=dense_keys, scales=dense_scales, ends=ref_indexer.topk_ends(step.seq_lens, 6, 2),
        live_ends=ref_indexer.live_ends(step.seq_lens, 6, 2),
    )  # fmt: skip
    assert int(step.seq_lens[0, -1]) == cand_probe.PROBE_LONG
    assert case.live_ends != case.ends  # ratio 2's odd lengths are in it
    live = check_against_reference(case)
    assert live.sum() > 4 * 2048


@pytest.mark.gpu
@needs_a_kernel
def test_stale_block_ids_are_dead():
    """Block ids far past every row (2**28 and more: their int32 position would wrap negative
    and look live) are dead, as the reference's int64 positions say."""
    case = make_case(
        lens=[700, 65, 301], heads=32, page_size=64, blocks=40, fp8=cand_logits._fp8_dtype(),
        device="cuda", seed=9,
    )  # fmt: skip
    huge = torch.tensor([1 << 28, (1 << 28) + 1, 1 << 30, (1 << 31) - 1], dtype=torch.int32)
    stale = case.candidates[:, ::5]  # a view: the copy writes the candidates
    stale.copy_(huge[torch.arange(stale.numel()) % 4].view_as(stale))
    live = check_against_reference(case)
    rows, blocks = case.candidates.shape
    assert live.any() and not live.view(rows, blocks, case.cand_block)[:, ::5].any()


@pytest.mark.gpu
@needs_a_kernel
def test_page_offsets_past_2gib():
    """Pages whose byte offset exceeds 2**31 (AITER once gave zero logits there)."""
    page_bytes = 64 * 132
    pad = (1 << 31) // 40 - page_bytes  # 40 pages span 2 GiB; 64 pages end near 3.4 GiB
    pad -= pad % 16
    case = make_case(
        lens=[1500, 900], next_n=1, heads=64, page_size=64, blocks=300, pad=pad, device="cuda",
        min_page=40, extra_pages=0, fp8=cand_logits._fp8_dtype(), seed=11,
    )  # fmt: skip
    assert case.block_table[case.block_table < (1 << 30)].min().item() >= 41
    live = check_against_reference(case)
    assert live.sum() > 1000


@pytest.mark.gpu
@needs_cuda
def test_hook_end_to_end_on_the_twin():
    """The hook on the twin and ops/topk.py's compact top-512 (sm_90 build) against the float
    reference's top 512 per row; a short row gets 0..end-1; rows past the step are untouched."""
    from dsv41_gfx942_plugin.ops import _launcher, topk

    if not topk.code_object_path().is_file():
        arch = _launcher.code_object_arch()
        pytest.skip(f"no top-k code object for {arch} (python hip/build.py --arch {arch})")
    # One that does not load or fails its load-time check fails here, never skips.
    assert topk.build(), "the top-k code object did not load or failed its load-time check"
    case = make_case(
        lens=[3000, 400, 9000], next_n=2, heads=64, page_size=64, blocks=300, per_row=False,
        device="cuda", seed=5, drop=0.1,
    )  # fmt: skip
    rows = 6
    indices = torch.full((rows + 2, 512), -9, dtype=torch.int32, device="cuda")
    assert cand_logits.candidate_logits_top_k(
        case.q, case.kv_cache, case.weights, case.seq_lens, case.block_table, case.candidates,
        case.cand_block, indices, 512, True, False,
    )  # fmt: skip
    got = indices.cpu()
    assert (got[rows:] == -9).all()
    ref_logits, ref_ids = reference(case)
    for r in range(rows):
        end = case.ends[r]
        if end <= 512:
            assert got[r, :end].tolist() == list(range(end)) and (got[r, end:] == -1).all()
            continue
        live = ref_ids[r] >= 0
        assert live.sum() > 512
        value = dict(zip(ref_ids[r][live].tolist(), ref_logits[r][live].tolist(), strict=True))
        chosen = got[r].tolist()
        assert len(set(chosen)) == 512 and all(c in value for c in chosen)
        want = sorted(value.values(), reverse=True)[:512]
        have = sorted((value[c] for c in chosen), reverse=True)
        torch.testing.assert_close(torch.tensor(have), torch.tensor(want), rtol=1e-5, atol=1e-6)
