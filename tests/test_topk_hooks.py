"""The gating of ops/topk.py's hooks, on the CPU: a call a hook cannot take returns False and
launches nothing (so nothing is written); a call it takes launches the expected kernels with
arguments that pack into the kernel's layout. The kernels are replaced by recorders."""

from __future__ import annotations

import pytest
import torch

import ref_indexer
import ref_topk as ref
from dsv41_gfx942_plugin.ops import _launcher, _topk_check, topk


class Recorder:
    """Stands in for a loaded kernel: records launches and checks the arguments pack."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls
        self.pack = _launcher._packer(topk.KERNELS[name])

    def __call__(self, grid, block, stream, *args):
        self.pack.pack(*args)  # raises if the arguments do not fit the signature
        self.calls.append((self.name, grid, block, args))


class FakeScratch:
    """Hands out a buffer of the size asked, and keeps the last one (``buf``)."""

    def get(self, device, numel):
        self.buf = torch.empty(numel, dtype=torch.int32)
        return self.buf

    def reserve(self, device, numel):
        return self.get(device, numel) is not None


@pytest.fixture
def calls(monkeypatch):
    launched = []
    kernels = {name: Recorder(name, launched) for name in topk.KERNELS}
    monkeypatch.setattr(topk, "_GPU_TYPE", "cpu")
    monkeypatch.setattr(topk, "_kernels", lambda t: kernels)
    monkeypatch.setattr(topk, "_scratch", FakeScratch())
    monkeypatch.setattr(_launcher, "stream_handle", lambda device: 0)
    return launched


def decode_inputs(rows=6, width=131072, next_n=1):
    logits = torch.zeros(rows, width)
    seq = torch.full((rows, 1), width, dtype=torch.int32)
    idx = torch.full((rows, 512), 7, dtype=torch.int32)
    return logits, next_n, seq, idx


def test_decode_takes_and_launches_two_passes(calls):
    logits, next_n, seq, idx = decode_inputs()
    assert topk.decode_top_k(logits, next_n, seq, idx, 512)
    assert [c[0] for c in calls] == ["dsv_topk512_chunks", "dsv_topk512_merge_final"]
    assert calls[0][1] == (8, 6, 1) and calls[1][1] == (1, 6, 1)  # chunks of 16384


@pytest.mark.parametrize("width", [0, 1, 3, 4])
def test_decode_rows_narrower_than_a_float4_take_the_general_path(calls, width):
    """The chunk kernel reads a row's first float4 however short the row: rows of fewer than 4
    logits (16-byte aligned otherwise) go to the general path, which reads nothing of them."""
    logits = torch.zeros(3, 4)[:, :width]
    seq = torch.full((3, 1), width, dtype=torch.int32)
    assert topk.decode_top_k(logits, 1, seq, torch.zeros(3, 512, dtype=torch.int32), 512)
    want = "dsv_topk512_chunks" if width == 4 else "dsv_topk512_chunks_stream"
    assert calls[0][0] == want


@pytest.mark.parametrize("width", [(1 << 20) - 8, 1 << 20])  # up to 64 chunks exactly
def test_decode_wide_rows(calls, width):
    logits, next_n, seq, idx = decode_inputs(rows=2, width=width)
    assert topk.decode_top_k(logits, next_n, seq, idx, 512)
    merge = "dsv_topk512_merge_final"
    assert [c[0] for c in calls] == ["dsv_topk512_chunks", "dsv_topk512_merge", merge]
    assert [c[1] for c in calls] == [(64, 2, 1), (8, 2, 1), (1, 2, 1)]  # 64 chunks: two merges
    # Over 1M logits: the general path, 8 blocks, one merge.
    assert topk.decode_top_k(torch.zeros(2, (1 << 20) + 4), next_n, seq, idx, 512)
    assert calls[-2][0] == "dsv_topk512_chunks_stream" and calls[-2][1] == (8, 2, 1)
    assert calls[-1][0] == merge and calls[-1][1] == (1, 2, 1)


def test_mtp_lengths_one_a_row_are_taken(calls):
    """vLLM's native MTP hands 2-D (requests, next_n) lengths: one a row, 6 for 3 x 2 rows."""
    logits, _, _, idx = decode_inputs()
    seq = torch.full((3, 2), 131072, dtype=torch.int32)
    cands = torch.zeros(6, 2048, dtype=torch.int32)
    assert topk.decode_top_k(logits, 2, seq, idx, 512)
    assert topk.candidate_top_k(logits, 2, seq, cands, 8, idx, 512)
    assert topk.select_candidates(logits, 2, seq, 8, cands)
    assert len(calls) == 4


@pytest.mark.parametrize(("rows", "width"), [(6, 131072), (3, 1 << 20), (2, 40000)])
def test_decode_scratch_holds_every_launchs_keys(calls, rows, width):
    """The keys and ids each launch writes (chunks: 1,024 slots a chunk, first merge: a unit a
    group) lie inside the scratch the call asked for, without overlap."""
    logits, next_n, seq, idx = decode_inputs(rows=rows, width=width)
    assert topk.decode_top_k(logits, next_n, seq, idx, 512)
    base = topk._scratch.buf.data_ptr()
    end = base + 4 * topk._scratch.buf.numel()
    slots = rows * topk.CHUNK_SLOTS
    chunks = calls[0][1][0]
    regions = [(calls[0][3][8], slots * chunks), (calls[0][3][9], slots * chunks)]
    if calls[1][0] == "dsv_topk512_merge":  # the first merge's output
        groups = calls[1][1][0]
        regions += [(calls[1][3][13], slots * groups), (calls[1][3][14], slots * groups)]
    spans = sorted((start, start + 4 * n) for start, n in regions)
    assert spans[0][0] >= base and spans[-1][1] <= end
    assert all(a[1] <= b[0] for a, b in zip(spans[:-1], spans[1:], strict=True))


@pytest.mark.parametrize("width", [4096, 131072, 1 << 20, 40000, (1 << 20) + 4, 1 << 21])
def test_reserved_scratch_serves_every_decode_call(calls, monkeypatch, width):
    """What vLLM's profile run reserves (reserve_decode_scratch) is what the largest decode call
    of that many rows or fewer asks for, on the register and on the general path (past 64
    chunks, 1M columns, the general path alone: no more for a register path that never runs)."""
    asked = []
    get = topk._scratch.get
    monkeypatch.setattr(topk._scratch, "get", lambda d, n: asked.append(n) or get(d, n))
    assert topk.reserve_decode_scratch(6, width, 0)
    reserved = asked[0] if asked else 0
    for rows in (1, 6):
        logits, next_n, seq, idx = decode_inputs(rows=rows, width=width)
        assert topk.decode_top_k(logits, next_n, seq, idx, 512)
        general = torch.zeros(rows, width + 1)[:, 1:]  # not 16-byte aligned: the general path
        assert topk.decode_top_k(general, next_n, seq, idx, 512)
    assert reserved == max(asked[1:]) > 0
    assert calls[-2][0] == "dsv_topk512_chunks_stream"


def test_decode_split_of_one_chunk_needs_no_scratch():
    """A row of one chunk is written by its chunk: no scratch (so graph capture with none yet
    still takes it); two chunks need it."""
    assert topk._decode_split(16384, True, 8)[2] == 0
    assert topk._decode_split(16385, True, 8)[2] > 0
    assert topk._decode_split(1 << 20, False, 1)[2] == 0


def test_decode_one_chunk_is_one_launch(calls):
    logits, next_n, seq, idx = decode_inputs(width=16384)
    assert topk.decode_top_k(logits, next_n, seq, idx, 512)
    assert [c[0] for c in calls] == ["dsv_topk512_chunks"]


@pytest.mark.parametrize("cut", ["stride", "start"])
def test_decode_unaligned_rows_take_general_path(calls, cut):
    """Rows not 16-byte aligned, by their stride or by where they start: the general path."""
    full = torch.zeros(6, 131075 if cut == "stride" else 131076)
    logits = full[:, :131072] if cut == "stride" else full[:, 1:131073]
    _, next_n, seq, idx = decode_inputs()
    assert topk.decode_top_k(logits, next_n, seq, idx, 512)
    assert calls[0][0] == "dsv_topk512_chunks_stream" and calls[0][1] == (8, 6, 1)


@pytest.mark.parametrize(
    "change",
    [
        "topk256",
        "half",
        "col_stride",
        "lens_int64",
        "lens_short",
        "idx_int64",
        "idx_narrow",
        "idx_col_stride",
        "next_n_0",
        "1d_lens_short",
        "idx_rows_short",
        "idx_1d",
        "logits_3d",
        "lens_noncontig",
        "no_scratch",
        "lens_none",
        "idx_none",
        "lens_other_device",
        "idx_other_device",
        "lens_3d",
        "next_n_float",
        "2d_lens_short",
        "idx_rows_overlap",
    ],
)
def test_decode_refuses(calls, change, monkeypatch):
    logits, next_n, seq, idx = decode_inputs()
    topk_tokens = 512
    if change == "topk256":
        topk_tokens = 256
    elif change == "half":
        logits = logits.half()
    elif change == "col_stride":
        logits = torch.zeros(131072, 6).t()
    elif change == "lens_int64":
        seq = seq.long()
    elif change == "lens_short":
        seq = seq[:5]
    elif change == "idx_int64":
        idx = idx.long()
    elif change == "idx_narrow":
        idx = idx[:, :511]
    elif change == "idx_col_stride":
        idx = torch.full((512, 6), 7, dtype=torch.int32).t()
    elif change == "next_n_0":
        next_n = 0
    elif change == "1d_lens_short":
        seq, next_n = torch.full((2,), 5, dtype=torch.int32), 2
    elif change == "idx_rows_short":
        idx = idx[:5]
    elif change == "idx_1d":
        idx = idx.flatten()
    elif change == "logits_3d":
        logits = logits.view(6, 1, -1)
    elif change == "lens_noncontig":
        seq = torch.full((6, 2), 9, dtype=torch.int32)[:, :1]
    elif change == "lens_none":
        seq = None
    elif change == "idx_none":
        idx = None
    elif change == "lens_other_device":
        seq = torch.empty(seq.shape, dtype=torch.int32, device="meta")
    elif change == "idx_other_device":
        idx = torch.empty(idx.shape, dtype=torch.int32, device="meta")
    elif change == "lens_3d":
        seq = seq.view(6, 1, 1)
    elif change == "next_n_float":
        next_n = 1.0
    elif change == "2d_lens_short":  # 2-D lengths are one a row: 3 for 6 rows, whatever next_n
        seq, next_n = torch.full((3, 1), 5, dtype=torch.int32), 2
    elif change == "idx_rows_overlap":  # rows 256 apart: each row's 512 would overwrite
        idx = torch.full((6 * 256 + 256,), 7, dtype=torch.int32).as_strided((6, 512), (256, 1))
    elif change == "no_scratch":  # during graph capture the scratch cannot grow
        monkeypatch.setattr(topk._scratch, "get", lambda device, numel: None)
    assert topk.decode_top_k(logits, next_n, seq, idx, topk_tokens) is False
    assert calls == []
    assert idx is None or idx.is_meta or bool((idx == 7).all())


def test_two_overlapping_rows_are_refused(calls):
    """Only a single row cannot overlap itself: two output rows 256 apart (decode and candidate
    top-k) or one candidate row twice (selection) are refused like six, nothing launched or
    written (the cases above have six rows)."""
    logits, next_n, seq, _ = decode_inputs(rows=2)
    idx = torch.full((3 * 256,), 7, dtype=torch.int32).as_strided((2, 512), (256, 1))
    assert not topk.decode_top_k(logits, next_n, seq, idx, 512)
    cands = torch.zeros(2, 2048, dtype=torch.int32)
    assert not topk.candidate_top_k(logits, next_n, seq, cands, 8, idx, 512)
    assert not topk.select_candidates(logits, next_n, seq, 8, cands[:1].expand(2, -1))
    assert calls == []
    assert bool((idx == 7).all()) and bool((cands == 0).all())


def test_decode_zero_rows_is_done_without_a_launch(calls):
    logits, next_n, seq, idx = decode_inputs(rows=0)
    assert topk.decode_top_k(logits, next_n, seq, idx, 512) is True
    topk.top_k_per_row_decode_512(logits, next_n, seq, idx)
    assert calls == []


def test_public_decode_raises_naming_shapes(calls):
    logits, next_n, seq, idx = decode_inputs()
    with pytest.raises(ValueError, match=r"indices \(6, 511\)"):
        topk.top_k_per_row_decode_512(logits, next_n, seq, idx[:, :511])
    with pytest.raises(TypeError):
        topk.top_k_per_row_decode_512("logits", next_n, seq, idx)
    with pytest.raises(TypeError, match="seq_lens NoneType"):
        topk.top_k_per_row_decode_512(logits, next_n, None, idx)
    with pytest.raises(TypeError, match="indices list"):
        topk.top_k_per_row_decode_512(logits, next_n, seq, [0] * 512)
    with pytest.raises(ValueError, match="max_blocks"):
        topk.top_k_per_row_decode_512(logits, next_n, seq, idx, 65, register_select=False)
    with pytest.raises(ValueError, match="min_chunk"):
        topk.top_k_per_row_decode_512(logits, next_n, seq, idx, 8, 0, register_select=False)
    assert calls == []


@pytest.mark.parametrize(
    "change",
    [dict(max_blocks=2.5), dict(min_chunk=1.5), dict(max_blocks=None), dict(min_chunk="8")],
)
def test_public_decode_general_path_split_must_be_ints(calls, change):
    """The general path's split is checked before any work: a float, None or a string raised
    from torch.empty, the argument packer (struct.error) or a comparison, naming neither."""
    logits, next_n, seq, idx = decode_inputs(rows=2, width=1001)
    with pytest.raises(TypeError, match="max_blocks and min_chunk must be ints"):
        topk.top_k_per_row_decode_512(logits, next_n, seq, idx, register_select=False, **change)
    assert calls == []


def test_decode_width_bound_and_general_path_min_chunk(calls):
    """Rows wider than MAX_WIDTH are declined (the kernels' int32 offsets); the general path
    hands its kernels a min_chunk of at most the width (one chunk either way), so a huge one
    cannot overflow a chunk's start."""
    seq = torch.full((1, 1), 513, dtype=torch.int32)
    idx = torch.zeros(1, 512, dtype=torch.int32)
    wide = torch.empty(1, topk.MAX_WIDTH + 1)
    assert not topk.decode_top_k(wide, 1, seq, idx, 512)
    with pytest.raises(ValueError, match=f"width <= {topk.MAX_WIDTH}"):
        topk.top_k_per_row_decode_512(wide, 1, seq, idx)
    assert calls == []
    assert topk.decode_top_k(wide[:, :-1], 1, seq, idx, 512)
    topk.top_k_per_row_decode_512(torch.zeros(1, 513), 1, seq, idx, 3, 1 << 30,
                                  register_select=False)  # fmt: skip
    stream = calls[-2]  # its arguments: the row's 8, the scratch's 2, max_chunks, min_chunk
    assert stream[0] == "dsv_topk512_chunks_stream" and stream[3][11] == 513


def test_candidate_gating(calls):
    logits, next_n, seq, idx = decode_inputs()
    cands = torch.zeros(6, 2048, dtype=torch.int32)
    assert not topk.candidate_top_k(logits, next_n, seq, cands.long(), 8, idx, 512)
    assert not topk.candidate_top_k(logits, next_n, seq, cands, 16, idx, 512)  # 32768 columns
    assert not topk.candidate_top_k(logits, next_n, seq, cands[:5], 8, idx, 512)
    assert not topk.candidate_top_k(logits, next_n, seq, cands, 8, idx, 2048)
    assert not topk.candidate_top_k(logits, next_n, seq, torch.zeros(6, 4096).int(), 1, idx, 512)
    assert not topk.candidate_top_k(logits, next_n, seq, cands[:, ::2], 8, idx, 512)
    assert not topk.candidate_top_k(logits, next_n, seq, cands[:, :0], 8, idx, 512)
    assert not topk.candidate_top_k(logits, next_n, seq, cands.flatten(), 8, idx, 512)
    assert not topk.candidate_top_k(logits, next_n, seq, None, 8, idx, 512)
    assert not topk.candidate_top_k(logits, next_n, seq, cands, 0, idx, 512)
    assert not topk.candidate_top_k(logits, next_n, seq, cands.to("meta"), 8, idx, 512)
    # One column past the register limit (5 blocks of 3277: 16385 columns); at it, taken below.
    assert not topk.candidate_top_k(logits, next_n, seq, cands[:, :5], 3277, idx, 512)
    assert calls == []
    assert topk.candidate_top_k(logits, next_n, seq, cands[:, :4], 4096, idx, 512)
    calls.clear()
    assert topk.candidate_top_k(logits, next_n, seq, cands, 8, idx, 512)
    assert [c[0] for c in calls] == ["dsv_topk512_candidates"]


def test_select_gating(calls):
    logits = torch.zeros(6, 131072)
    cands = torch.zeros(6, 2048, dtype=torch.int32)
    seq = torch.full((2,), 100, dtype=torch.int32)
    assert not topk.select_candidates(logits, 2, seq, 8, cands)  # 2 lengths x 2 < 6 rows
    assert not topk.select_candidates(logits, 3, seq.long(), 8, cands)
    assert not topk.select_candidates(logits, 3, seq, 2, cands)  # 65536 blocks
    assert not topk.select_candidates(logits, 3, seq, topk.MAX_WIDTH + 1, cands)
    assert not topk.select_candidates(logits, 3, torch.full((2, 2), 9, dtype=torch.int32)[:, :1],
                                      8, cands)  # fmt: skip
    assert not topk.select_candidates(logits, 3, seq, 8, cands[:, ::2])
    assert not topk.select_candidates(logits, 3, seq, 8, cands.long())
    assert not topk.select_candidates(logits, 3, seq, 8, cands[:5])
    assert not topk.select_candidates(logits, 3, seq, 0, cands)
    assert not topk.select_candidates(logits, 3, seq, 8, torch.zeros(6, 4097, dtype=torch.int32))
    assert not topk.select_candidates(logits, 3, seq, 8, cands.flatten())
    assert not topk.select_candidates(logits, 3, seq, 8, None)
    assert not topk.select_candidates(logits, 3, seq.to("meta"), 8, cands)
    assert not topk.select_candidates(logits, 3, seq, 8, cands[:1].expand(6, -1))  # rows overlap
    five = torch.full((5,), 100, dtype=torch.int32)  # one length a row, but 5 for 6 rows
    assert not topk.select_candidates(logits, 1, five, 8, cands)
    wide = torch.zeros(6, 8 * topk.MAX_SELECT_BLOCKS + 1)  # one block past the wide kernel's
    assert not topk.select_candidates(wide, 3, seq, 8, cands)
    assert calls == []
    assert topk.select_candidates(logits, 3, seq, 8, cands)
    assert calls[0][0] == "dsv_select_blocks" and calls[0][3][4] == 3  # one length a request
    assert topk.select_candidates(logits, 3, torch.full((6, 1), 9, dtype=torch.int32), 8, cands)
    assert calls[1][3][4] == 1  # one length a row
    # More lengths than rows (4 for 2 rows): still one a request, as vLLM's repeat reads them.
    assert topk.select_candidates(logits[:2], 2, torch.full((4,), 9, dtype=torch.int32), 8,
                                  cands[:2])  # fmt: skip
    assert calls.pop()[3][4] == 2
    assert topk.select_candidates(torch.zeros(6, 262144), 3, seq, 8, cands)  # 32768 blocks
    assert topk.select_candidates(torch.zeros(6, 131065), 3, seq, 8, cands)  # 16384 blocks
    assert topk.select_candidates(torch.zeros(6, 131073), 3, seq, 8, cands)  # 16385
    assert [c[0] for c in calls[2:]] == ["dsv_select_blocks_wide", "dsv_select_blocks",
                                         "dsv_select_blocks_wide"]  # fmt: skip


def test_compact_gating(calls):
    logits, ids = torch.zeros(6, 16384), torch.zeros(6, 16384, dtype=torch.int32)
    seq, idx = torch.full((6, 1), 9, dtype=torch.int32), torch.zeros(6, 512, dtype=torch.int32)
    assert not topk.compact_top_k_512(logits, ids.long(), seq, 1, idx)
    assert not topk.compact_top_k_512(torch.zeros(6, 16385), ids, seq, 1, idx)
    wide = torch.zeros(6, 16385, dtype=torch.int32)  # ids of the same shape: the width bound
    assert not topk.compact_top_k_512(torch.zeros(6, 16385), wide, seq, 1, idx)
    assert not topk.compact_top_k_512(logits, ids, seq, 1, idx[:, :500])
    assert not topk.compact_top_k_512(logits, ids[:, :100], seq, 1, idx)
    assert not topk.compact_top_k_512(logits, torch.zeros(6, 32768, dtype=torch.int32)[:, ::2],
                                      seq, 1, idx)  # fmt: skip
    assert not topk.compact_top_k_512(logits, ids, seq, 0, idx)
    assert not topk.compact_top_k_512(logits[:, :0], ids[:, :0], seq, 1, idx)  # no entry to read
    assert not topk.compact_top_k_512(logits, ids.to("meta"), seq, 1, idx)
    assert not topk.compact_top_k_512(logits.half(), ids, seq, 1, idx)
    assert not topk.compact_top_k_512(logits, ids, seq.long(), 1, idx)
    assert not topk.compact_top_k_512(logits, ids, seq[:5], 1, idx)  # 5 lengths for 6 rows
    assert calls == []
    assert topk.compact_top_k_512(logits, ids, seq, 1, idx)
    assert [c[0] for c in calls] == ["dsv_topk512_compact"]


class Decode:
    def __init__(self, requires_padding):
        self.requires_padding = requires_padding


def test_skip_decode_fill(monkeypatch):
    monkeypatch.setattr(topk, "build", lambda: True)
    assert topk.skip_decode_fill(False, 6, 6, Decode(False), 512, 512)
    assert not topk.skip_decode_fill(True, 6, 6, Decode(False), 512, 512)
    assert not topk.skip_decode_fill(False, 6, 8, Decode(False), 512, 512)  # graph padding rows
    assert not topk.skip_decode_fill(False, 6, 6, Decode(True), 512, 512)
    assert not topk.skip_decode_fill(False, 6, 6, None, 512, 512)
    assert not topk.skip_decode_fill(False, 6, 6, Decode(False), 520, 512)  # columns past top-k
    monkeypatch.setattr(topk, "build", lambda: False)
    assert not topk.skip_decode_fill(False, 6, 6, Decode(False), 512, 512)


def test_build_failure_warns_once_and_hooks_refuse(monkeypatch, plugin_log):
    def missing(stem, kernels, device):
        raise OSError("no code object for gfx942: topk512.gfx942.co is missing")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(topk, "_modules", {})
    monkeypatch.setattr(_launcher, "load", missing)
    monkeypatch.setattr(topk, "_GPU_TYPE", "cpu")
    assert topk.build() is False
    assert topk.build() is False
    warnings = [r for r in plugin_log.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "topk512.gfx942.co is missing" in warnings[0].getMessage()
    logits, next_n, seq, idx = decode_inputs(width=1024)
    assert topk.decode_top_k(logits, next_n, seq, idx, 512) is False
    assert not topk.skip_decode_fill(False, 6, 6, Decode(False), 512, 512)
    assert bool((idx == 7).all())


def test_no_load_inside_graph_capture(monkeypatch):
    """build() never loads the code object during stream capture (a module load there would
    break the capture) and remembers nothing, so a later call outside it loads."""
    loads = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(topk, "_modules", {})
    monkeypatch.setattr(_launcher, "load", lambda *a: loads.append(a) or object())
    monkeypatch.setattr(_topk_check, "check", lambda device: None)  # no kernels to check
    assert topk.build() is False
    assert loads == [] and topk._modules == {}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert topk.build() is True and len(loads) == 1


def test_reference_check_can_fail():
    """The GPU tests' comparison rejects a wrong set and accepts ties at the cut."""
    x = torch.randn(1, 4096)
    x[0, :600] = 5.0  # ties across the cut
    seq = torch.tensor([[4096]], dtype=torch.int32)
    good = torch.arange(512, dtype=torch.int32).view(1, 512) + 50
    ref.check_decode(x, 1, seq, good)
    bad = good.clone()
    bad[0, 0] = 1000
    with pytest.raises(AssertionError, match="values differ"):
        ref.check_decode(x, 1, seq, bad)
    dup = good.clone()
    dup[0, 1] = dup[0, 0]
    with pytest.raises(AssertionError, match="repeated"):
        ref.check_decode(x, 1, seq, dup)
    zeros = torch.zeros(1, 900)  # -0 ranks below +0 (vLLM's order): any 212 of the +0 will do
    zeros[0, :300] = 9.0
    zeros[0, 300:600] = -0.0
    seq = torch.tensor([[900]], dtype=torch.int32)
    plus = torch.cat([torch.arange(300), torch.arange(650, 862)]).int().view(1, 512)
    ref.check_decode(zeros, 1, seq, plus)
    minus = torch.cat([torch.arange(300), torch.arange(450, 662)]).int().view(1, 512)  # -0, +0
    with pytest.raises(AssertionError, match="values differ"):
        ref.check_decode(zeros, 1, seq, minus)
    nan = torch.randn(1, 1000)
    nan[0, 3] = float("nan")
    top = torch.topk(nan, 512).indices.int()
    assert 3 in top[0].tolist()  # torch ranks NaN first, and so does the reference
    ref.check_decode(nan, 1, torch.tensor([[1000]], dtype=torch.int32), top)


@pytest.mark.parametrize("kind", ["specials", "denormals", "ties", "zeros", "masked", "all_ninf"])
def test_reference_order_is_torch_topk_but_for_signed_zeros(kind):
    """ref_topk.order_key, the GPU and emulation tests' oracle, ranks as torch.topk does, but
    for -0 below +0: torch's own top-512 of each row, with every zero made +0, passes the
    reference check, on rows with NaN of both signs, +-inf, zeros of both signs around
    denormals, ties and -inf at the cut, and on a stride and row ends short of the width."""
    x = ref.make_logits(3, 3001, kind, seed=11, stride=3008)
    seq = torch.tensor([[3001], [2000], [777]], dtype=torch.int32)
    top = torch.full((3, 512), -1, dtype=torch.int32)
    for r, end in enumerate(seq.flatten().tolist()):
        top[r] = torch.topk(x[r, :end] + 0.0, 512).indices.int()  # -0 + 0 is +0
    ref.check_decode(x + 0.0, 1, seq, top, kind)
    if kind == "denormals":  # the cut among the zeros: a -0 in place of a +0 fails
        row = x[0]
        good = ref.order_key(row).topk(512).indices
        ref.check_decode(x[:1], 1, seq[:1], good.int().view(1, 512), kind)
        bad = good.clone()
        bad[int((row[good] == 0).nonzero()[0])] = int(((row == 0) & row.signbit()).nonzero()[0])
        with pytest.raises(AssertionError, match="values differ"):
            ref.check_decode(x[:1], 1, seq[:1], bad.int().view(1, 512), kind)


def test_reference_order_is_vllms_bins():
    """ref_topk.order_key orders every non-NaN fp32 value as vLLM's top-k bins do, transcribed
    from the line its source holds (vLLM 0.33 ships it in its in-tree gfx942 copy of the top-k,
    vllm/models/deepseek_v41/amd/ops/topk512_gfx942.cu: a smaller bin is a larger value), and
    NaN of either sign above +inf (where the bins would put a NaN of the sign bit below -inf,
    vLLM's CUDA top-k ranks it on top: test_topk_gpu's ``specials`` rows against vLLM's op)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm.models.deepseek_v41.amd.ops")
    if spec is None:
        pytest.skip("vLLM 0.33 is not installed")
    src = (Path(spec.submodule_search_locations[0]) / "topk512_gfx942.cu").read_text()
    assert "bits = (bits & 0x80000000) ? bits : ~bits & 0x7fffffff;" in src
    assert "bits = (bits & 0x8000) ? bits : ~bits & 0x7fff;" in src  # the fp16 first pass
    vals = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 3e38, -3e38, 1e-45,
                         -1e-45, 1.2e-38, -1.2e-38, 0.5, -0.5, 2.0])  # fmt: skip
    bits = vals.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    bins = torch.where(bits >= 0x80000000, bits, (~bits) & 0x7FFFFFFF)
    key = ref.order_key(vals)
    assert torch.equal(key[:, None] > key[None, :], bins[:, None] < bins[None, :])
    nan = torch.tensor([float("nan"), -float("nan")])
    assert bool((ref.order_key(nan) > key.max()).all())


def vllm_select_candidate_blocks():
    """vLLM's own ``select_candidate_blocks`` (``_select_candidate_blocks``: its wrapper and
    Triton kernels, run in the interpreter), less the wrapper's ``assert logits.is_cuda``."""
    import inspect
    import textwrap

    import triton

    if not triton.knobs.runtime.interpret:
        pytest.skip(
            "runs vLLM's Triton candidate selection in the interpreter (TRITON_INTERPRET=1)"
        )
    from vllm.model_executor.kernels.attention.dsa import candidate_blocks as cb

    assert not cb.has_deep_select()  # the torch.topk branch, not NVIDIA's DeepSelect
    src = textwrap.dedent(inspect.getsource(cb.select_candidate_blocks))
    assert src.count("    assert logits.is_cuda\n") == 1
    scope = dict(vars(cb))
    exec(compile(src.replace("    assert logits.is_cuda\n", ""), cb.__file__, "exec"), scope)
    return scope["select_candidate_blocks"]


@pytest.mark.parametrize(("kind", "k"), [("specials", 64), ("ties", 64), ("masked", 40),
                                         ("sparse_finite", 64), ("all_ninf", 64),
                                         ("specials", 200)])  # fmt: skip
def test_select_references_are_vllms_select(kind, k):
    """The two transcriptions of vLLM's candidate block selection (``ref_indexer``'s, vLLM's
    stand-in in the indexer tests, and ``ref_topk.check_select``, the emulation's and GPU's
    oracle) against vLLM's real one on the CPU: the same block set a row (ties included, both
    use torch.topk on the same scores), on strided rows with NaN of both signs (a block of NaN
    only), +-inf, ties and -inf blocks, rows ending at 0, at and inside a block end, at and past
    the width, K over the block count."""
    x = ref.make_logits(6, 1001, kind, seed=13, stride=1008)
    x[4, 16:24] = float("nan")
    x[4, 40] = -float("nan")
    ends = torch.tensor([1001, 504, 0, 9, 1000, 1010])
    theirs = torch.full((6, k), -7, dtype=torch.int32)
    vllm_select_candidate_blocks()(x, torch.zeros(6, dtype=torch.int64), ends, k, 8, theirs)
    ours = torch.full((6, k), -7, dtype=torch.int32)  # its rows end within the width
    ref_indexer.vllm_select_candidate_blocks(x, None, ends[:5], k, 8, ours[:5])
    assert torch.equal(ours[:5].sort(1).values, theirs[:5].sort(1).values)
    ref.check_select(x, 1, ends, 8, theirs, kind)


def test_kernels_only_for_the_current_device(monkeypatch):
    from types import SimpleNamespace

    loaded = SimpleNamespace(kernels={"k": 1})
    monkeypatch.setattr(topk, "_modules", {0: loaded, 2: None})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(topk, "build", lambda: pytest.fail("must not load here"))
    on = lambda index: SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=index))
    assert topk._kernels(on(0)) == {"k": 1}
    assert topk._kernels(on(1)) is None  # not current: never loaded from here
    assert topk._kernels(on(2)) is None  # failed before
    # serves (the candidate-logits hook's question) answers the same, a host tensor never.
    assert [topk.serves(on(i)) for i in (0, 1, 2)] == [True, False, False]
    assert topk.serves(SimpleNamespace(is_cuda=False)) is False
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert topk._kernels(on(0)) is None  # loaded, but another device is current
    assert topk.serves(on(0)) is False
    monkeypatch.setattr(topk, "build", lambda: topk._modules.__setitem__(1, loaded) or True)
    assert topk._kernels(on(1)) == {"k": 1}  # current and not loaded: loads
    assert topk.serves(on(1)) is True
