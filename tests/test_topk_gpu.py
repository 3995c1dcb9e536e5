"""ops/topk.py on a GPU (an NVIDIA H200 through the sm_90 build, or gfx942) against the exact
torch references of tests/ref_topk.py: random and adversarial rows, both row-end forms, strides,
and CUDA-graph capture and replay with changed lengths."""

from __future__ import annotations

import pytest
import torch

import fuzz_topk
import ref_topk as ref
from sanitizer import assert_clean, needs_sanitizer

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

import topk_object  # noqa: E402
from dsv41_gfx942_plugin.ops import _topk_check, topk  # noqa: E402

topk_object.require()
# A code object that does not load, or fails its load-time check, fails the test below (and
# every other: the hooks then decline), never skips.
topk.build()

DEV = "cuda"
NEG = float("-inf")
NEG_KEY = int(ref.order_key(torch.tensor([NEG]))[0])  # -inf's key


def test_build_loads_and_passes_its_load_time_check():
    """build() loaded the code object and its check (ops/_topk_check.py) found every op's
    answers equal to torch's on this GPU; the check itself passes again."""
    assert topk.build()
    assert _topk_check.check(torch.device(DEV, torch.cuda.current_device())) is None


def make_logits(rows, width, kind="randn", seed=0, stride=None):
    """[rows, width] fp32 logits on the GPU (``ref_topk.make_logits``)."""
    return ref.make_logits(rows, width, kind, seed, stride, DEV)


def lens_2d(ends):
    return torch.tensor(ends, dtype=torch.int32, device=DEV).view(-1, 1)


def out_buf(rows, width=512, stride=512):
    return torch.full((rows, stride), 12345, dtype=torch.int32, device=DEV)[:, :width]


DECODE_CASES = [
    # rows, width, ends (None: random), kind
    (1, 700, [700], "randn"),
    (6, 16384, None, "randn"),
    (6, 16385, [16385, 16384, 513, 512, 1, 0], "randn"),
    (6, 131072, None, "randn"),
    (6, 131072, None, "masked"),
    (6, 131072, None, "ties"),
    (6, 131072, None, "all_ninf"),
    (6, 131072, None, "sparse_finite"),
    (3, 131072, [131072] * 3, "denormals"),  # the cut among zeros, between denormals
    (6, 131072, None, "specials"),
    (4, 100000, None, "equal"),
    (2, 1 << 20, [1 << 20, (1 << 20) - 77], "randn"),
    (2, 1 << 20, [1 << 20, 999_983], "masked"),
    (6, 131072, None, "cluster"),
    (2, 1 << 20, [1 << 20, 999_983], "cluster"),
    (256, 3000, None, "randn"),
    (33, 40000, None, "specials"),
    # Ties at the maximum, fewer than 512 copies (a short row, a row's short last chunk).
    (4, 17888, [1500, 2048, 17884, 1100], "max_every_4"),
    # One-chunk rows of exactly 512 finite logits: a radix pass that counts exactly k keys.
    (3, 4096, [4096, 4096, 3000], "exactly_k"),
    # More than 4096 (LIST) keys above the floor in every chunk and merge: the register cut.
    (6, 131072, None, "one_binade"),
    (2, 1 << 20, [1 << 20, 999_983], "one_binade"),
]


@pytest.mark.parametrize("rows,width,ends,kind", DECODE_CASES)
@pytest.mark.parametrize("register", [True, False])
def test_decode_2d(rows, width, ends, kind, register):
    logits = make_logits(rows, width, kind, seed=rows + width)
    if ends is None:
        g = torch.Generator().manual_seed(width)
        ends = torch.randint(1, width + 1, (rows,), generator=g).tolist()
        ends[0] = width
    seq = lens_2d(ends)
    idx = out_buf(rows)
    topk.top_k_per_row_decode_512(logits, 1, seq, idx, register_select=register)
    ref.check_decode(logits, 1, seq, idx, f"{kind} {rows}x{width}")


@pytest.mark.parametrize("next_n", [1, 2, 3, 6])
def test_decode_causal_1d(next_n):
    reqs = 5
    width = 70001
    lens = torch.tensor([width, 520, 3, 0, 33333], dtype=torch.int32, device=DEV)[:reqs]
    rows = reqs * next_n
    logits = make_logits(rows, width, "specials", seed=next_n)
    idx = out_buf(rows, stride=640)
    assert topk.decode_top_k(logits, next_n, lens, idx, 512)
    ref.check_decode(logits, next_n, lens, idx, f"1-D next_n {next_n}")


@pytest.mark.parametrize("extra", [0, 4, 3])  # row stride width+extra: aligned, aligned, not
def test_decode_row_stride(extra):
    rows, width = 7, 50000
    logits = make_logits(rows, width, "randn", seed=extra, stride=width + extra)
    ends = [width, 49999, 20000, 16384, 16385, 600, 512]
    idx = out_buf(rows)
    assert topk.decode_top_k(logits, 1, lens_2d(ends), idx, 512)
    ref.check_decode(logits, 1, lens_2d(ends), idx, f"stride +{extra}")


@pytest.mark.parametrize("max_blocks,min_chunk", [(8, 16384), (1, 1), (64, 1000), (3, 100)])
def test_decode_general_path_splits(max_blocks, min_chunk):
    rows, width = 5, 300001
    logits = make_logits(rows, width, "masked", seed=max_blocks)
    ends = [width, 250000, 100000, 2000, 513]
    idx = out_buf(rows)
    topk.top_k_per_row_decode_512(
        logits, 1, lens_2d(ends), idx, max_blocks, min_chunk, register_select=False
    )
    ref.check_decode(logits, 1, lens_2d(ends), idx, f"general {max_blocks}/{min_chunk}")


def test_decode_lengths_sweep():
    """Lengths 1..1M that are multiples of nothing in particular."""
    ends = [1, 2, 511, 512, 513, 1023, 4097, 16383, 16385, 32769, 65537, 131071, 524289, 1048575]
    rows, width = len(ends), 1 << 20
    logits = make_logits(rows, width, "randn", seed=7)
    idx = out_buf(rows)
    assert topk.decode_top_k(logits, 1, lens_2d(ends), idx, 512)
    ref.check_decode(logits, 1, lens_2d(ends), idx, "sweep")


def random_candidates(rows, k, nblocks, seed, dup=True):
    g = torch.Generator().manual_seed(seed)
    c = torch.stack([torch.randperm(nblocks, generator=g)[:k] for _ in range(rows)]).int()
    c[torch.rand(c.shape, generator=g) < 0.05] = -1  # holes
    if dup:
        c[:, 1::97] = c[:, 0:1]
    return c.to(DEV)


@pytest.mark.parametrize("kind", ["randn", "ties", "specials", "all_ninf"])
@pytest.mark.parametrize("lens_form", ["2d", "1d"])
@pytest.mark.parametrize("dup", [True, False], ids=["dups", "distinct"])
def test_candidate_top_k(kind, lens_form, dup):
    """Distinct blocks (vLLM's) take the kernel's bitmap alone, duplicates its hash table."""
    next_n, reqs, width, bs = 3, 2, 131072, 8
    rows = next_n * reqs
    logits = make_logits(rows, width, kind, seed=11)
    cands = random_candidates(rows, 2048, width // bs, seed=3, dup=dup)
    if kind != "all_ninf":  # the duplicated block in every row's top 512: a kept copy shows
        for r, first in enumerate(cands[:, 0].tolist()):
            logits[r, first * bs : first * bs + bs] = 1e30
    if lens_form == "2d":
        seq = lens_2d([width, 131000, 70000, 5000, 600, 300])
    else:
        seq = torch.tensor([width, 4000], dtype=torch.int32, device=DEV)
    idx = out_buf(rows)
    assert topk.candidate_top_k(logits, next_n, seq, cands, bs, idx, 512)
    ref.check_candidates(logits, next_n, seq, cands, bs, idx, f"cand {kind} {lens_form}")


def test_candidate_few_live_columns():
    """The documented difference: a long row with fewer than 512 live candidate columns gets
    them all, then -1."""
    rows, width, bs = 2, 100000, 8
    logits = make_logits(rows, width, "randn", seed=5)
    cands = torch.full((rows, 2048), -1, dtype=torch.int32, device=DEV)
    cands[0, :10] = torch.arange(10, dtype=torch.int32) * 7  # 80 columns
    cands[1, 5:70] = torch.arange(65, dtype=torch.int32)  # 520 columns, 3 past the end
    seq = lens_2d([width, 517])
    idx = out_buf(rows)
    assert topk.candidate_top_k(logits, 1, seq, cands, bs, idx, 512)
    ref.check_candidates(logits, 1, seq, cands, bs, idx, "few live")
    assert int((idx[0] >= 0).sum()) == 80


def test_equal_group_maxima_in_candidates_and_compact_rows():
    """130 live candidate blocks whose every half block holds the row's maximum at its first
    column (260 copies, fewer than 512, atop the even-slot group of each live thread), and
    ``_topk_check.equal_top_two_compact`` rows and ``ref_topk.equal_top_two_candidates``' row: the
    floor from each group's top two keys opens on one value with fewer than 512 copies, which
    radix_cut must count (2217b78's fix; the aligned candidate rows reached it before the
    interleaved groups, the compact rows and the candidate kernel's scalar path do now)."""
    width, bs = 131072, 8
    logits = make_logits(2, width, "max_every_4", seed=12)
    cands = torch.full((2, 2048), -1, dtype=torch.int32, device=DEV)
    cands[:, :130] = torch.arange(1000, 1130, dtype=torch.int32, device=DEV)
    cands[1, :130] += 7000
    seq = lens_2d([width, width])
    idx = out_buf(2)
    assert topk.candidate_top_k(logits, 1, seq, cands, bs, idx, 512)
    ref.check_candidates(logits, 1, seq, cands, bs, idx, "cand equal group maxima")
    x, cands, bs = ref.equal_top_two_candidates(DEV)
    seq = lens_2d([x.shape[1]])
    idx = out_buf(1)
    assert topk.candidate_top_k(x, 1, seq, cands, bs, idx, 512)
    ref.check_candidates(x, 1, seq, cands, bs, idx, "cand equal top two, unaligned")
    gens = [torch.Generator(DEV).manual_seed(seed) for seed in (15, 16)]
    rows = [_topk_check.equal_top_two_compact(g) for g in gens]
    x, ids = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    seq = lens_2d([10**6, 10**6])
    idx = out_buf(2)
    assert topk.compact_top_k_512(x, ids, seq, 1, idx)
    ref.check_compact(x, ids, 1, seq, idx, "compact equal top two")


PAST_THE_LIST = [  # width, max_blocks, min_chunk (the register path where max_blocks is 8)
    (3 * 16384, 8, 16384),  # chunks handing on supersets
    (64000, 64, 1000),  # 64 chunks handing on all their keys: a first merge's register cut
    (8192, 64, 128),  # 64 chunks of 128 keys: the second merge's
]


@pytest.mark.parametrize("width,max_blocks,min_chunk", PAST_THE_LIST)
def test_decode_keys_above_the_floor_past_the_list(width, max_blocks, min_chunk):
    """Rows in one binade with a NaN (more than 4096 keys above a workgroup's floor): the cut
    over the registers in the chunks and in both merge kernels."""
    logits = make_logits(2, width, "one_binade", seed=width)
    seq = lens_2d([width, width - 5])
    idx = out_buf(2)
    topk.top_k_per_row_decode_512(
        logits, 1, seq, idx, max_blocks, min_chunk, register_select=max_blocks == 8
    )
    ref.check_decode(logits, 1, seq, idx, f"past the list, {width} {max_blocks} {min_chunk}")


def test_candidates_and_compact_keys_above_the_floor_past_the_list():
    """Rows in one binade with a NaN (more than 4096 keys above the floor): the register cut of
    the candidate and compact kernels."""
    logits = make_logits(2, 16384, "one_binade", seed=3)
    g = torch.Generator().manual_seed(4)
    cands = torch.stack([torch.randperm(2048, generator=g) for _ in range(2)]).int().to(DEV)
    seq = lens_2d([16384, 16000])
    idx = out_buf(2)
    assert topk.candidate_top_k(logits, 1, seq, cands, 8, idx, 512)
    ref.check_candidates(logits, 1, seq, cands, 8, idx, "candidates past the list")
    ids = torch.stack([torch.randperm(10**6, generator=g)[:16384] for _ in range(2)]).int()
    ids = ids.to(DEV)
    seq = lens_2d([10**6, 10**6])
    idx = out_buf(2)
    assert topk.compact_top_k_512(logits, ids, seq, 1, idx)
    ref.check_compact(logits, ids, 1, seq, idx, "compact past the list")


@pytest.mark.parametrize("kind", ["randn", "ties", "specials"])
def test_compact_top_k(kind):
    rows, n = 6, 16384
    logits = make_logits(rows, n, kind, seed=21)
    g = torch.Generator().manual_seed(2)
    ids = torch.stack([torch.randperm(10**6, generator=g)[:n] for _ in range(rows)]).int()
    ids[torch.rand(ids.shape, generator=g) < 0.1] = -1
    ids[3, 700:] = -1  # 700 entries, ~630 live
    ids[4, 520:] = -1  # fewer than 512 live
    ids = ids.to(DEV)
    logits.masked_fill_(ids < 0, NEG)
    seq = lens_2d([10**6, 10**6, 512, 10**6, 10**6, 9000])
    idx = out_buf(rows)
    assert topk.compact_top_k_512(logits, ids, seq, 1, idx)
    ref.check_compact(logits, ids, 1, seq, idx, f"compact {kind}")


SELECT_CASES = [
    # rows, width, ends, kind, k
    (6, 131072, [131072, 131071, 100000, 16000, 9, 0], "randn", 2048),
    (6, 131072, None, "specials", 2048),
    (6, 131072, [131072] * 6, "specials", 256),  # more NaN / +inf scores than K
    (2, 131072, None, "equal", 2048),
    (3, 131072, None, "outliers", 2048),
    (3, 131072, [131072] * 3, "denormals", 512),  # the cut among zero scores, between denormals
    (6, 131072, None, "ties", 2048),
    (4, 131072, None, "masked", 2048),
    (3, 20000, [20000, 19999, 25000], "randn", 2048),  # a length past the width
    (2, 262144, [262144, 200001], "masked", 512),  # dsv_select_blocks_wide
    (3, 131073, [131073, 131072, 70000], "randn", 2048),  # one block past dsv_select_blocks
    (5, 10000, None, "all_ninf", 64),
]


@pytest.mark.parametrize("rows,width,ends,kind,k", SELECT_CASES)
def test_select_candidates(rows, width, ends, kind, k):
    logits = make_logits(rows, width, kind, seed=width + rows)
    if ends is None:
        g = torch.Generator().manual_seed(rows)
        ends = torch.randint(1, width + 1, (rows,), generator=g).tolist()
    seq = torch.tensor(ends, dtype=torch.int32, device=DEV)
    cands = torch.full((rows, k), 777, dtype=torch.int32, device=DEV)
    assert topk.select_candidates(logits, 1, seq, 8, cands)
    ref.check_select(logits, 1, seq, 8, cands, f"select {kind}")


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_select_as_many_specials_as_k(extra):
    """K - 1, K and K + 1 block scores at or above +inf: the cut below them, at their edge and
    among them; nothing written past K."""
    k, width = 256, 131072
    x = ref.specials_near_k(k, width, extra, DEV)
    seq = torch.tensor([width], dtype=torch.int32, device=DEV)
    cands = torch.full((1, k + 8), 777, dtype=torch.int32, device=DEV)
    assert topk.select_candidates(x, 1, seq, 8, cands[:, :k])
    ref.check_select(x, 1, seq, 8, cands[:, :k], f"select {k + extra} specials")
    assert (cands[:, k:] == 777).all()


@pytest.mark.parametrize("pop", [ref.SPARSE_POP, ref.SPARSE_POP + 1])
def test_select_cut_in_a_tied_bin(pop):
    """Radix passes over SPARSE_POP keys (one plain atomic a key, several lanes on one address)
    and one more (the wave-aggregated count), the cut inside a group of tied scores."""
    k, width = 2048, 131072
    x = ref.tied_bin_row(k, width, pop, DEV)
    seq = torch.tensor([width], dtype=torch.int32, device=DEV)
    cands = torch.full((1, k), 777, dtype=torch.int32, device=DEV)
    assert topk.select_candidates(x, 1, seq, 8, cands)
    ref.check_select(x, 1, seq, 8, cands, f"select tied bin of {pop}")


@pytest.mark.parametrize("k", [64, 130])
def test_select_cut_in_the_top_bin(k):
    """A sparse pass that keeps the range's greatest key as its upper end, the cut among tied
    scores there."""
    width = 131072
    x = ref.tied_top_row(width, ref.SPARSE_POP, DEV)
    seq = torch.tensor([width], dtype=torch.int32, device=DEV)
    cands = torch.full((1, k), 777, dtype=torch.int32, device=DEV)
    assert topk.select_candidates(x, 1, seq, 8, cands)
    ref.check_select(x, 1, seq, 8, cands, f"select top bin, K {k}")


def test_select_one_length_a_request():
    next_n, reqs, width = 4, 2, 50000
    rows = next_n * reqs
    logits = make_logits(rows, width, "randn", seed=9)
    seq = torch.tensor([[49001], [777]], dtype=torch.int32, device=DEV)
    cands = torch.full((rows, 2048), 777, dtype=torch.int32, device=DEV)
    assert topk.select_candidates(logits, next_n, seq, 8, cands)
    ref.check_select(logits, next_n, seq, 8, cands, "select per request")


def test_select_block_size_not_8():
    rows, width, bs = 3, 30001, 5
    logits = make_logits(rows, width, "specials", seed=1, stride=30003)
    seq = torch.tensor([30001, 29998, 4], dtype=torch.int32, device=DEV)
    cands = torch.full((rows, 2048), 777, dtype=torch.int32, device=DEV)
    assert topk.select_candidates(logits, 1, seq, bs, cands)
    ref.check_select(logits, 1, seq, bs, cands, "select bs 5")


def vllms_own(what: str):
    """vLLM 0.33.0's own op, skipping where vLLM's compiled library does not load (it does on an
    NVIDIA GPU with vLLM's CUDA wheel, or its library alone: ``benchmarks/device_h200.sh``;
    on gfx942 with vLLM's ROCm build)."""
    import indexer_step

    if not indexer_step.vllm_top_k_loaded():
        pytest.skip(f"vLLM's compiled library does not load here: no {what} to compare with")
    return torch.ops._C.top_k_per_row_decode


def assert_same_sets(ours, vllms, keys, what, ends=None):
    """Row for row the same ids as vLLM's op, order and ties at the cut aside: ours distinct
    (and within the row, given row ``ends``), as many ids, and the same multiset of their keys
    (``keys[r, id]``), so that only ids of equal keys may differ. With row
    ``ends``, where vLLM's own row is malformed (an id twice or past the row's end: its C++
    top-k on a row of 513 to a few thousand columns with fewer than 512 finite logits,
    H100-measured; README), ours are checked complete and only the finite picks compared.
    Returns the number of such rows."""
    ours, vllms = ours.cpu().long(), vllms.cpu().long()
    malformed = 0
    for r in range(ours.shape[0]):
        a, b = ours[r][ours[r] >= 0], vllms[r][vllms[r] >= 0]
        assert a.unique().numel() == a.numel(), f"{what} row {r}: an id twice"
        if ends is not None:
            assert bool((a < ends[r]).all()), f"{what} row {r}: an id past the row's end"
        if ends is not None and (b.unique().numel() < b.numel() or bool((b >= ends[r]).any())):
            malformed += 1
            assert a.numel() == min(512, ends[r]), f"{what} row {r}"
            finite = keys[r, a] > NEG_KEY
            b = b[b < ends[r]].unique()
            a, b = a[finite], b[keys[r, b] > NEG_KEY]
        assert a.numel() == b.numel(), f"{what} row {r}: {a.numel()} ids, vLLM's {b.numel()}"
        if not torch.equal(a.sort().values, b.sort().values):
            ka, kb = keys[r, a].sort().values, keys[r, b].sort().values
            assert torch.equal(ka, kb), f"{what} row {r}: other values than vLLM's op picks"
    return malformed


# Random, candidate-masked and sparse rows (-inf ties at the cut of short rows), +inf and NaN
# of both signs, a cut among zeros of both signs, a NaN every 16384 over one binade, clusters,
# ties everywhere; row ends 0, 1, 511, 512, 513, a chunk and one, the width.
VLLM_DECODE_KINDS = [
    "randn",
    "masked",
    "sparse_finite",
    "specials",
    "denormals",
    "one_binade",
    "cluster",
    "ties",
]


@pytest.mark.parametrize("kind", VLLM_DECODE_KINDS)
@pytest.mark.parametrize("form", ["2d", "1d next_n 3", "stride +3"])
def test_decode_gives_vllms_own_index_sets(kind, form):
    """The decode hook against vLLM's real C++ ``top_k_per_row_decode`` on the same call (the
    oracle the hook must match, the others check ref_topk's order), both row-end forms and
    a row stride that is not 16-byte aligned."""
    vllm_top_k = vllms_own("top_k_per_row_decode")
    width, next_n = 131072, 3 if form.startswith("1d") else 1
    if form.startswith("1d"):
        seq = torch.tensor([width, 515, 2, 40000], dtype=torch.int32, device=DEV)
        rows = 4 * next_n
    else:
        seq = lens_2d([width, 0, 1, 511, 512, 513, 16385, 99999])
        rows = 8
    stride = width + 3 if form.startswith("stride") else None
    logits = make_logits(rows, width, kind, seed=21, stride=stride)
    ours, vllms = out_buf(rows), out_buf(rows)
    assert topk.decode_top_k(logits, next_n, seq, ours, 512)
    vllm_top_k(logits, next_n, seq, vllms, rows, logits.stride(0), logits.stride(1), 512)
    ends = ref.decode_row_ends(seq.cpu(), rows, next_n, width)
    keys = ref.order_key(logits.cpu())
    malformed = assert_same_sets(ours, vllms, keys, f"decode {kind} {form}", ends)
    # vLLM's op is malformed only where a row of over 512 columns has fewer than 512 finite ones.
    few = [e > 512 and int((keys[r, :e] > NEG_KEY).sum()) < 512 for r, e in enumerate(ends)]
    assert malformed <= sum(few)


@pytest.mark.parametrize("kind", ["randn", "specials", "ties"])
def test_candidate_top_k_gives_vllms_own_index_sets(kind):
    """The candidate hook against what vLLM's reader layers run: its real Triton decode mask
    (``_apply_candidate_mask_strided``, in place) then its real C++ top-k, on rows of 2048
    candidate blocks with duplicates and -1 holes (at least 512 live columns each, where the two
    agree by contract), 2-D lengths as vLLM passes them."""
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import _apply_candidate_mask_strided

    vllm_top_k = vllms_own("top_k_per_row_decode")
    rows, width, bs = 4, 131072, 8
    logits = make_logits(rows, width, kind, seed=23)
    cands = random_candidates(rows, 2048, width // bs, seed=4)
    seq = lens_2d([width, 131000, 70001, 9000])
    ours, vllms = out_buf(rows), out_buf(rows)
    assert topk.candidate_top_k(logits, 1, seq, cands, bs, ours, 512)
    ends = seq.view(-1).long()
    masked = logits.clone()
    _apply_candidate_mask_strided(masked, torch.zeros_like(ends), ends, cands, bs)
    vllm_top_k(masked, 1, seq, vllms, rows, masked.stride(0), masked.stride(1), 512)
    # The masked row's keys: a column outside the candidates is -inf there (vLLM's mask stops
    # at the row's end, so the ends check the columns past it).
    ends = ref.decode_row_ends(seq.cpu(), rows, 1, width)
    assert_same_sets(ours, vllms, ref.order_key(masked.cpu()), f"candidates {kind}", ends)


@pytest.mark.parametrize("kind", ["randn", "masked", "specials", "ties"])
def test_select_candidates_gives_vllms_own_block_sets(kind):
    """Layer 20's hook against vLLM's real ``select_candidate_blocks`` (Triton block scores,
    torch.topk, Triton store) on the same rows, one length a request repeated over its rows as
    vLLM's decode branch passes them."""
    from vllm.model_executor.kernels.attention.dsa.candidate_blocks import (
        select_candidate_blocks,
    )

    rows, width, bs, k = 6, 131072, 8, 2048
    logits = make_logits(rows, width, kind, seed=25)
    ends = torch.tensor([width, width, 100003, 100003, 16000, 16000], device=DEV)
    ours = torch.full((rows, k), 777, dtype=torch.int32, device=DEV)
    vllms = ours.clone()
    assert topk.select_candidates(logits, 2, ends[::2].int(), bs, ours)
    select_candidate_blocks(logits, torch.zeros_like(ends), ends, k, bs, vllms)
    scores = [
        ref.block_scores(row, int(end), bs)
        for row, end in zip(logits.cpu(), ends.tolist(), strict=True)
    ]
    assert_same_sets(ours, vllms, ref.torch_key(torch.stack(scores)), f"selection {kind}")


def test_cuda_graph_replay_with_changed_lengths():
    """Capture every hook once, replay with new lengths and logits: the kernels read both on
    the device, so every replay is right."""
    rows, width, bs = 6, 131072, 8
    logits = make_logits(rows, width, "randn", seed=1)
    seq = lens_2d([width] * rows)
    seq1 = torch.full((2,), width, dtype=torch.int32, device=DEV)
    cands = torch.full((rows, 2048), -1, dtype=torch.int32, device=DEV)
    idx_dec, idx_cand = out_buf(rows), out_buf(rows)
    ids = torch.arange(rows * 16384, device=DEV, dtype=torch.int32).view(rows, 16384)
    compact, idx_comp = make_logits(rows, 16384, "randn", seed=2), out_buf(rows)

    def step():
        assert topk.decode_top_k(logits, 1, seq, idx_dec, 512)
        assert topk.select_candidates(logits, 3, seq1, bs, cands)
        assert topk.candidate_top_k(logits, 1, seq, cands, bs, idx_cand, 512)
        assert topk.compact_top_k_512(compact, ids, seq, 1, idx_comp)

    step()  # warm-up: scratch exists before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for i, ends in enumerate([[width, 5, 600, 70000, 513, 131000], [1, 0, 512, 16385, 99, 4]]):
        seq.copy_(lens_2d(ends))
        seq1.copy_(torch.tensor(ends[:2], dtype=torch.int32))
        logits.copy_(make_logits(rows, width, "specials", seed=10 + i))
        compact.copy_(make_logits(rows, 16384, "ties", seed=20 + i))
        graph.replay()
        torch.cuda.synchronize()
        ref.check_decode(logits, 1, seq, idx_dec, f"replay {i} decode")
        ref.check_select(logits, 3, seq1, bs, cands, f"replay {i} select")
        ref.check_candidates(logits, 1, seq, cands, bs, idx_cand, f"replay {i} cand")
        ref.check_compact(compact, ids, 1, seq, idx_comp, f"replay {i} compact")


def test_hooks_refuse_without_writing():
    rows, width = 2, 4096
    logits = make_logits(rows, width)
    seq = lens_2d([width, 1000])
    idx = out_buf(rows)
    cands = torch.zeros((rows, 2048), dtype=torch.int32, device=DEV)
    assert not topk.decode_top_k(logits, 1, seq, idx, 256)
    assert not topk.decode_top_k(logits.half(), 1, seq, idx, 512)
    assert not topk.decode_top_k(logits.t(), 1, seq, idx, 512)
    assert not topk.decode_top_k(logits, 1, seq.long(), idx, 512)
    assert not topk.candidate_top_k(logits, 1, seq, cands.long(), 8, idx, 512)
    assert not topk.candidate_top_k(logits, 1, seq, cands, 16, idx, 512)  # 32768 columns
    assert not topk.select_candidates(logits, 1, seq.float(), 8, cands)
    torch.cuda.synchronize()
    assert bool((idx == 12345).all()) and bool((cands == 0).all())


# H100: 7.6 s (a one-off run of the same generators took 28,949 cases in 180 s, no failure).
GPU_FUZZ_CASES = 2000


def test_fuzz():
    """``fuzz_topk``'s seeded random calls of every hook (adversarial rows, widths and ends about
    the kernels' branch points) on this GPU's kernels, against the torch references; another
    seed than the emulation's."""
    fuzz_topk.run(GPU_FUZZ_CASES, 20261206, DEV, "gpu")


def sanitized_calls():
    """Every kernel's paths on small adversarial rows, each answer checked: the calls that
    ``test_kernels_pass_sanitizer`` runs under compute-sanitizer (a few seconds unsanitized)."""
    dec = [
        (6, 40000, "randn", True),  # register chunks, one merge level
        (2, 1 << 20, "cluster", True),  # 64 chunks: two merge levels, the superset cut
        (4, 70001, "equal", True),  # the listed tie path
        (4, 50000, "specials", True),
        (3, 40000, "sparse_finite", True),  # masked chunks' top-two floor
        (5, 300001, "masked", False),  # the general path
        (3, 1000, "ties", False),
        (3, 2048, "max_every_4", True),  # ties at the maximum atop every even-slot group
    ]
    for rows, width, kind, register in dec:
        logits = make_logits(rows, width, kind, seed=rows)
        ends = [width] + [width - 1 - 97 * r for r in range(1, rows - 1)] + [511]
        idx = out_buf(rows)
        topk.top_k_per_row_decode_512(logits, 1, lens_2d(ends), idx, register_select=register)
        ref.check_decode(logits, 1, lens_2d(ends), idx, f"sanitized {kind} {rows}x{width}")
    width, bs = 131072, 8
    for kind, dup in (("randn", True), ("ties", False), ("all_ninf", False)):
        logits = make_logits(6, width, kind, seed=3)
        cands = random_candidates(6, 2048, width // bs, seed=4, dup=dup)
        seq = lens_2d([width, 131000, 70000, 5000, 600, 300])
        idx = out_buf(6)
        assert topk.candidate_top_k(logits, 1, seq, cands, bs, idx, 512)
        ref.check_candidates(logits, 1, seq, cands, bs, idx, f"sanitized cand {kind}")
        sel = torch.full((6, 2048), 777, dtype=torch.int32, device=DEV)
        assert topk.select_candidates(logits, 1, seq.view(-1), bs, sel)
        ref.check_select(logits, 1, seq.view(-1), bs, sel, f"sanitized select {kind}")
    compact = make_logits(3, 16384, "ties", seed=5)
    ids = torch.arange(3 * 16384, device=DEV, dtype=torch.int32).view(3, 16384)
    ids[1, 600:] = -1
    compact.masked_fill_(ids < 0, NEG)
    seq = lens_2d([10**6, 10**6, 512])
    idx = out_buf(3)
    assert topk.compact_top_k_512(compact, ids, seq, 1, idx)
    ref.check_compact(compact, ids, 1, seq, idx, "sanitized compact")
    for case in PAST_THE_LIST:  # the cut over the registers in every kernel that has one
        test_decode_keys_above_the_floor_past_the_list(*case)
    test_candidates_and_compact_keys_above_the_floor_past_the_list()
    torch.cuda.synchronize()


@needs_sanitizer
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_kernels_pass_sanitizer(tool):
    """``sanitized_calls`` under compute-sanitizer: no access outside an allocation (memcheck), no
    shared-memory race between threads (racecheck: the LDS lists, histograms and bitmaps between
    barriers), no barrier a thread of the workgroup skips (synccheck). The sm_90 build of the gfx942
    source; a race here would be one there too, whatever the wave width. H100 (2026-12-07):
    racecheck 87 s, memcheck and synccheck 15 s each. Not initcheck: the merge kernels read every
    unit's slots before they know the row's end and clear those past it (by design: the end's read
    then waits beside them), which it reports (H100, 2026-12-06: 1.7M reports, those printed at one
    dsv_topk512_merge load; the Markov kernels none); torch's own topk in the load-time check reads
    uninitialized workspace too."""
    assert_clean(tool, "import test_topk_gpu as T; T.sanitized_calls()", timeout=170)
