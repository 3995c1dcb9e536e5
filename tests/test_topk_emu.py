"""hip/topk512.hip's kernels on the CPU, against the exact torch references of ref_topk.py.

The kernels are built with g++ for the CPU emulation of hip/cpu_emu.h (a workgroup's threads as
fibers, wave operations exchanged between them) at wave width 64, as they run on gfx942 (no GPU
here has that width: the H200 runs them at 32), and at 32. They are launched through ops/topk.py's
own hooks with the arguments packed as for the GPU, on CPU tensors. Slow per workgroup (about
0.5 s), so the rows are few and short; tests/test_topk_gpu.py covers sizes on a GPU.

With g++ (CI's compiler) the emulation is built with UndefinedBehaviorSanitizer: a shift past a
word, a signed overflow, an index past a fixed-size array (the LDS arrays, at wave 64 too, which
no GPU here runs) fails the launch that reached it, with the sanitizer's report. About 20 s more
(117 -> 132-137 s on 2 cores). AddressSanitizer, run once by hand (2026-12-06: the 126 tests clean,
both widths), needs the Python process preloaded with libasan and libstdc++ and takes twice as
long: not in CI.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

import fuzz_topk
import ref_topk as ref
from dsv41_gfx942_plugin.ops import _launcher, _topk_check, topk

ROOT = Path(__file__).resolve().parent.parent
# UndefinedBehaviorSanitizer's flags where the compiler is g++, whose runtime ships with it. A
# report does not end the process (pytest's captured output would lose it): each launch reads
# what the kernels wrote to stderr and fails on one (the runtime takes no options set after the
# process started, so its reports cannot go to a file of the test's choosing).
UBSAN = ["-fsanitize=undefined"]


def _launch_reporting(launch) -> tuple[int, str]:
    """``launch()``'s return value and what it wrote to file descriptor 2."""
    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            rc = launch()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return rc, err.read().decode(errors="replace")


_libs: dict[int, ctypes.CDLL] = {}  # the emulation's library of each wave width


@pytest.fixture(scope="module", params=[64, 32], ids=["wave64", "wave32"])
def emu(request, tmp_path_factory):
    """ops/topk.py wired to the CPU-built kernels of one wave width."""
    cxx = next(filter(None, map(shutil.which, ("g++", "clang++", "clang++-19"))), None)
    if cxx is None:
        pytest.skip("no C++ compiler for the CPU emulation")
    lib_path = tmp_path_factory.mktemp("emu") / f"topk_emu{request.param}.so"
    sanitize = UBSAN if Path(cxx).name == "g++" else []
    subprocess.run(
        [cxx, "-std=c++17", "-O1", *sanitize, "-shared", "-fPIC", "-DDSV_CPU_EMU",
         f"-DDSV_EMU_WAVE={request.param}", "-I", str(ROOT / "hip"),
         str(ROOT / "tests/emu/topk_emu.cpp"), "-o", str(lib_path)],
        check=True,
    )  # fmt: skip
    lib = ctypes.CDLL(str(lib_path))
    lib.dsv_emu_launch.argtypes = [ctypes.c_char_p] + [ctypes.c_uint] * 3 + [ctypes.c_char_p]
    _libs[request.param] = lib
    assert lib.dsv_emu_wave() == request.param

    class Kernel:
        def __init__(self, name):
            self.name, self.pack = name, _launcher._packer(topk.KERNELS[name])

        def __call__(self, grid, block, stream, *args):
            assert grid[2] == 1 and block == topk.THREADS[self.name]
            packed = self.pack.pack(*args)
            rc, err = _launch_reporting(
                lambda: lib.dsv_emu_launch(self.name.encode(), grid[0], grid[1], block, packed)
            )
            assert rc == 0, f"{self.name} is not in tests/emu/topk_emu.cpp"
            assert "runtime error" not in err, f"{self.name}: {err[-3000:]}"

    class Scratch:
        def get(self, device, numel):
            return torch.full((numel,), -7, dtype=torch.int32)

    kernels = {name: Kernel(name) for name in topk.KERNELS}
    mp = pytest.MonkeyPatch()
    mp.setattr(topk, "_GPU_TYPE", "cpu")
    mp.setattr(topk, "_kernels", lambda t: kernels)
    mp.setattr(topk, "_scratch", Scratch())
    mp.setattr(_launcher, "stream_handle", lambda device: 0)
    yield request.param
    mp.undo()


def logits_of(rows, width, kind="randn", seed=0, stride=None):
    return ref.make_logits(rows, width, kind, seed, stride)


def lens(ends):
    return torch.tensor(ends, dtype=torch.int32).view(-1, 1)


def out(rows, cols=512):
    return torch.full((rows, cols), 12345, dtype=torch.int32)


@pytest.mark.parametrize(
    "rows,width,ends,kind",
    [
        (2, 16384, [16384, 9001], "randn"),  # one chunk a row: written directly
        (1, 40000, [39999], "specials"),  # three chunks and the merge
        (1, 20000, [20000], "ties"),
        (2, 16384, [16384, 16000], "all_ninf"),
        (1, 33000, [33000], "sparse_finite"),
        (1, 33000, [33000], "denormals"),  # the cut among zeros, between denormals
        (1, 32768, [32768], "masked"),
        (1, 40000, [40000], "cluster"),  # chunks cut their supersets at a radix pass's bin
        (4, 600, [0, 1, 512, 513], "randn"),  # short and empty rows
        # Ties at the maximum, fewer than 512 copies, atop every even-slot group of keys (with
        # consecutive groups, every group: then the rows of 2217b78's fix; now compact rows).
        (2, 2048, [1500, 2047], "max_every_4"),
        (1, 1500, [1500], "max_every_4"),
    ],
)
def test_decode(emu, rows, width, ends, kind):
    x = logits_of(rows, width, kind, seed=width)
    idx = out(rows)
    assert topk.decode_top_k(x, 1, lens(ends), idx, 512)
    ref.check_decode(x, 1, lens(ends), idx, f"wave{emu} {kind}")


@pytest.mark.parametrize("width", [0, 1, 3])
def test_decode_rows_narrower_than_a_float4(emu, width):
    """Rows of 16-byte aligned storage but fewer than 4 logits: 0..end-1, then -1."""
    x = logits_of(3, 4, "randn", seed=5)[:, :width]
    ends = [width, max(width - 1, 0), 0]
    idx = out(3)
    assert topk.decode_top_k(x, 1, lens(ends), idx, 512)
    ref.check_decode(x, 1, lens(ends), idx, f"wave{emu} width {width}")


def test_decode_many_keys_above_the_floor(emu):
    """The keys of the chunk's first threads (5200 of its 16384) are all large: the floor from
    group maxima leaves over 4096 (LIST) keys above it, which are selected from the registers,
    not the LDS list. Thread t holds the float4s t, t + threads, ... of the chunk."""
    x = logits_of(1, 16384, "randn", seed=1)
    threads = topk.THREADS["dsv_topk512_chunks"]
    cols = torch.arange(16384)
    x[0, (cols // 4) % threads < 5200 * threads // 16384 + 1] += 10.0
    idx = out(1)
    assert topk.decode_top_k(x, 1, lens([16384]), idx, 512)
    ref.check_decode(x, 1, lens([16384]), idx, f"wave{emu} many above the floor")


@pytest.mark.parametrize("register", [True, False])
def test_decode_exactly_k_live_logits(emu, register):
    """A one-chunk row (its exact top 512) of 512 finite logits, the rest -inf, the least of
    them -FLT_MAX: the floor is -inf, and the radix pass over the 512 keys above it counts
    exactly k, its least key in its lowest bin. Only the thread whose bins reach the k-th key
    may publish the cut: the threads past the pass's bins also have k keys before theirs, and
    one of them publishing names a bin below 0, a floor past every key (a row of -1, as the
    fuzz's wave-32 case 234 found in a masked row of 512 live logits)."""
    x = logits_of(1, 4096, "exactly_k", seed=16)
    idx = out(1)
    topk.top_k_per_row_decode_512(x, 1, lens([4096]), idx, 8, 16384, register_select=register)
    ref.check_decode(x, 1, lens([4096]), idx, f"wave{emu} 512 live, register {register}")


@pytest.mark.parametrize(
    "width,register,max_blocks,min_chunk",
    [
        (16384, True, 8, 16384),  # one chunk: the row's top 512
        (3 * 16384, True, 8, 16384),  # chunks handing on supersets
        (3 * 16384, False, 3, 1000),  # the general path's chunks (keys read at each pass)
        # 64 chunks of 1000 keys, each handing on all of them: a first merge workgroup holds
        # 8000, of which more than 4096 lie above its floor; then the second merge
        (64000, False, 64, 1000),
        # 64 chunks of 128 keys: each first merge hands on all its 1024, so the second holds
        # 8192, of which more than 4096 lie above its floor
        (8192, False, 64, 128),
    ],
)
def test_decode_keys_above_the_floor_past_the_list(emu, width, register, max_blocks, min_chunk):
    """Rows in one binade with a NaN a chunk: more than 4096 (LIST) keys above the floor, so the
    workgroup selects from its registers (no emulation or GPU test reached that cut in the merge
    kernels before, nor with a chunk handing on a superset)."""
    x = logits_of(2, width, "one_binade", seed=width)
    ends = [width, width - 5]
    idx = out(2)
    topk.top_k_per_row_decode_512(
        x, 1, lens(ends), idx, max_blocks, min_chunk, register_select=register
    )
    ref.check_decode(x, 1, lens(ends), idx, f"wave{emu} past the list, {width} {register}")


def test_candidates_and_compact_keys_above_the_floor_past_the_list(emu):
    """The same rows (one binade, a NaN) as candidate blocks covering all 16384 columns and as
    a compact row: the register cut of both kernels."""
    x = logits_of(1, 16384, "one_binade", seed=3)
    g = torch.Generator().manual_seed(4)
    cands = torch.randperm(2048, generator=g).int().view(1, -1)
    idx = out(1)
    assert topk.candidate_top_k(x, 1, lens([16384]), cands, 8, idx, 512)
    ref.check_candidates(x, 1, lens([16384]), cands, 8, idx, f"wave{emu} candidates past list")
    ids = torch.randperm(10**6, generator=g)[:16384].int().view(1, -1)
    idx = out(1)
    assert topk.compact_top_k_512(x, ids, lens([10**6]), 1, idx)
    ref.check_compact(x, ids, 1, lens([10**6]), idx, f"wave{emu} compact past the list")


@pytest.mark.parametrize("chunks", [17, 13])
@pytest.mark.parametrize("kind", ["specials", "randn"])
def test_decode_two_merges(emu, kind, chunks):
    """Rows of more than 8 chunks take two merge launches; in the same launch, a row of 8 chunks
    is written by the first merge, one of 9 by the second, one of a chunk by its chunk. The
    first merge's workgroups a row: 3 at 17 chunks, 2 (its least above one) at 13."""
    width = (chunks - 1) * 16384 + 1000
    ends = [width - 3, 8 * 16384, 8 * 16384 + 1, 16384]
    x = logits_of(len(ends), width, kind, seed=2)
    idx = out(len(ends))
    assert topk.decode_top_k(x, 1, lens(ends), idx, 512)
    ref.check_decode(x, 1, lens(ends), idx, f"wave{emu} two merges {kind} {chunks} chunks")


def test_decode_general_path(emu):
    x = logits_of(1, 30001, "specials", seed=3, stride=30003)  # rows not 16-byte aligned
    idx = out(1)
    topk.top_k_per_row_decode_512(x, 1, lens([30001]), idx, 3, 1000, register_select=False)
    ref.check_decode(x, 1, lens([30001]), idx, f"wave{emu} general")


def test_decode_general_path_huge_min_chunk(emu):
    """min_chunk far past the row (2**30): the row is one chunk, as with min_chunk = width."""
    x = logits_of(1, 513, "specials", seed=12)
    idx = out(1)
    topk.top_k_per_row_decode_512(x, 1, lens([513]), idx, 3, 1 << 30, register_select=False)
    ref.check_decode(x, 1, lens([513]), idx, f"wave{emu} general, huge min_chunk")


def test_decode_causal(emu):
    """1-D lengths: draft row r % 3 ends 2 - r % 3 columns before the request's length (4997,
    4998, 4999); the largest logits sit in the last three columns, so a wrong end shows. The
    index buffer's columns past 512 are left as they were."""
    x = logits_of(3, 5000, "randn", seed=4)
    x[:, -3:] = 1e30
    seq = torch.tensor([4999], dtype=torch.int32)
    buf = out(3, 600)
    idx = buf[:, :512]
    assert topk.decode_top_k(x, 3, seq, idx, 512)
    ref.check_decode(x, 3, seq, idx, f"wave{emu} causal")
    assert bool((buf[:, 512:] == 12345).all())


@pytest.mark.parametrize("dups", [True, False])
def test_candidates(emu, dups):
    """Distinct blocks take the bitmap alone; one duplicate sends the row to the hash table."""
    width, bs = 131072, 8
    x = logits_of(1, width, "specials", seed=5)
    g = torch.Generator().manual_seed(6)
    cands = torch.randperm(width // bs, generator=g)[:2048].int().view(1, -1)
    cands[0, 100:200] = -1
    if dups:
        cands[0, 1::97] = cands[0, 0]  # duplicates, of a block the top 512 takes whole
    first = int(cands[0, 0]) * bs
    x[0, first : first + bs] = 1e30
    idx = out(1)
    assert topk.candidate_top_k(x, 1, lens([131000]), cands, bs, idx, 512)
    ref.check_candidates(x, 1, lens([131000]), cands, bs, idx, f"wave{emu} candidates")


def test_candidates_past_the_bitmap(emu):
    """Rows of more block ids than the bitmap holds (2**18; here blocks of one column) take
    the hash table, duplicates or not."""
    width, bs = 300000, 1
    x = logits_of(1, width, "randn", seed=8)
    g = torch.Generator().manual_seed(9)
    cands = torch.randperm(width, generator=g)[:2048].int().view(1, -1)
    cands[0, 5::101] = cands[0, 3]
    x[0, int(cands[0, 3])] = 1e30
    idx = out(1)
    assert topk.candidate_top_k(x, 1, lens([width]), cands, bs, idx, 512)
    ref.check_candidates(x, 1, lens([width]), cands, bs, idx, f"wave{emu} candidates bs 1")


def test_candidates_ending_inside_a_float4(emu):
    """Rows ending 1, 2, 3 and 4 columns into candidate block 2000, +inf from the end to the
    block's end: each of a float4's four lanes tests its own column against the row's end (the
    first or second float4 of a block), so none of those +inf columns is taken and the block's
    columns before the end compete as any."""
    width, bs, b = 16384, 8, 2000
    ends = [b * bs + tail for tail in (1, 2, 3, 4)]
    x = logits_of(4, width, "randn", seed=20)
    for r, end in enumerate(ends):
        x[r, end : (b + 1) * bs] = float("inf")
    g = torch.Generator().manual_seed(21)
    cands = torch.stack([torch.randperm(width // bs, generator=g) for _ in ends]).int()
    idx = out(4)
    assert topk.candidate_top_k(x, 1, lens(ends), cands, bs, idx, 512)
    ref.check_candidates(x, 1, lens(ends), cands, bs, idx, f"wave{emu} candidates end in a float4")


def test_candidates_block_size_not_8(emu):
    """Blocks of 4 columns take the general loads (column by column), not two float4."""
    width, bs = 20000, 4
    x = logits_of(1, width, "ties", seed=6)
    g = torch.Generator().manual_seed(7)
    cands = torch.randperm(width // bs, generator=g)[:2048].int().view(1, -1)
    cands[0, :50] = -1
    cands[0, 60::89] = cands[0, 50]  # duplicates, of a block the top 512 takes whole
    first = int(cands[0, 50]) * bs
    x[0, first : first + bs] = 1e30
    idx = out(1)
    assert topk.candidate_top_k(x, 1, lens([19999]), cands, bs, idx, 512)
    ref.check_candidates(x, 1, lens([19999]), cands, bs, idx, f"wave{emu} candidates bs 4")


def test_compact(emu):
    x = logits_of(1, 16384, "ties", seed=7)
    g = torch.Generator().manual_seed(8)
    ids = torch.randperm(10**6, generator=g)[:16384].int().view(1, -1)
    ids[0, torch.rand(16384, generator=g) < 0.2] = -1
    idx = out(1)
    assert topk.compact_top_k_512(x, ids, lens([10**6]), 1, idx)
    ref.check_compact(x, ids, 1, lens([10**6]), idx, f"wave{emu} compact")


@pytest.mark.parametrize("live", [0, 1, 300, 511])
def test_compact_fewer_live_ids_than_k(emu, live):
    """A compact row longer than 512 whose ids are -1 but for fewer than 512 entries: every live
    id, then -1 from the first free entry on (a tail written one entry late leaves a stale one)."""
    g = torch.Generator().manual_seed(9 + live)
    x = logits_of(1, 2000, "specials", seed=9)
    ids = torch.full((1, 2000), -1, dtype=torch.int32)
    where, which = torch.randperm(2000, generator=g), torch.randperm(10**6, generator=g)
    ids[0, where[:live]] = which[:live].int()
    idx = out(1)
    assert topk.compact_top_k_512(x, ids, lens([10**6]), 1, idx)
    ref.check_compact(x, ids, 1, lens([10**6]), idx, f"wave{emu} compact {live} live")


def test_candidates_with_equal_group_maxima(emu):
    """130 live blocks (1040 columns) whose every half block holds the row's maximum at its first
    column: 260 copies, fewer than 512, atop the even-slot group of each live thread, the floor
    from the groups' top two keys (520 valid maxima, fewer than 2k). Written when the groups were
    consecutive and every one topped at the maximum (2217b78's one-value range; since the
    interleaved groups ``test_compact_equal_top_two_keys_fewer_than_k`` reaches that)."""
    width, bs = 131072, 8
    x = logits_of(1, width, "max_every_4", seed=12)
    cands = torch.full((1, 2048), -1, dtype=torch.int32)
    cands[0, :130] = torch.arange(1000, 1130, dtype=torch.int32)
    idx = out(1)
    assert topk.candidate_top_k(x, 1, lens([width]), cands, bs, idx, 512)
    ref.check_candidates(x, 1, lens([width]), cands, bs, idx, f"wave{emu} equal group maxima")


def test_compact_with_equal_group_maxima(emu):
    """A compact row whose live lanes (300 of each 512) hold two values: 300 copies of the greater
    (slot 0 of threads 0-299, atop their even-slot groups), fewer than 512, then the cut among
    300 ties of the lesser (the odd-slot groups' maxima)."""
    x = torch.zeros(1, 1024)
    ids = torch.full((1, 1024), -1, dtype=torch.int32)
    live = torch.arange(1024) % 512 < 300
    ids[0, live] = torch.arange(600, dtype=torch.int32) * 7 + 3
    x[0, :300], x[0, 512:812] = 1.0, 0.5
    idx = out(1)
    assert topk.compact_top_k_512(x, ids, lens([10**6]), 1, idx)
    ref.check_compact(x, ids, 1, lens([10**6]), idx, f"wave{emu} compact equal group maxima")


def test_candidates_few_live(emu):
    """A long row with fewer than 512 live candidate columns gets them all, then -1: no slot
    without a column (key 0) may fill the rest."""
    width, bs = 131072, 8
    x = logits_of(1, width, "randn", seed=10)
    g = torch.Generator().manual_seed(11)
    cands = torch.full((1, 2048), -1, dtype=torch.int32)
    cands[0, 100:140] = torch.randperm(width // bs, generator=g)[:40].int()
    idx = out(1)
    assert topk.candidate_top_k(x, 1, lens([width]), cands, bs, idx, 512)
    ref.check_candidates(x, 1, lens([width]), cands, bs, idx, f"wave{emu} candidates few live")
    assert int((idx >= 0).sum()) == 320


@pytest.mark.parametrize(
    "kind,k",
    [
        ("randn", 2048),
        ("masked", 512),
        ("ties", 2048),
        ("equal", 2048),
        ("specials", 2048),  # about 390 blocks score NaN or +inf: taken, the rest cut below
        ("specials", 256),  # more of them than K: the cut among them
        ("outliers", 2048),  # fewer than K scores near the greatest: the cut over all of them
        ("denormals", 512),  # the cut among zero scores, between denormals
        ("sparse_finite", 2048),  # about 1,300 live blocks: the rest -1, no -inf block taken
        ("all_ninf", 2048),  # the pinned newest block alone, then -1
    ],
)
def test_select(emu, kind, k):
    x = logits_of(1, 131072, kind, seed=9)
    seq = torch.tensor([130001], dtype=torch.int32)
    cands = torch.full((1, k), 777, dtype=torch.int32)
    assert topk.select_candidates(x, 1, seq, 8, cands)
    ref.check_select(x, 1, seq, 8, cands, f"wave{emu} select {kind}")


@pytest.mark.parametrize("width", [131072, 131073, 262144])
def test_select_at_the_kernels_bounds(emu, width):
    """16384 blocks (dsv_select_blocks' 16 a thread), one more (the last of one column:
    dsv_select_blocks_wide), and 32768 (the wide kernel's bound)."""
    x = logits_of(2, width, "specials", seed=width)
    seq = torch.tensor([width, width - 4000], dtype=torch.int32)
    cands = torch.full((2, 2048), 777, dtype=torch.int32)
    assert topk.select_candidates(x, 1, seq, 8, cands)
    ref.check_select(x, 1, seq, 8, cands, f"wave{emu} select {width} columns")


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_select_as_many_specials_as_k(emu, extra):
    """K - 1, K and K + 1 blocks at or above +inf (NaN and +inf scores, the pinned newest block):
    the cut below them, at their edge, and among them."""
    k, width = 256, 131072
    x = ref.specials_near_k(k, width, extra)
    seq = torch.tensor([width], dtype=torch.int32)
    cands = torch.full((1, k + 8), 777, dtype=torch.int32)
    assert topk.select_candidates(x, 1, seq, 8, cands[:, :k])
    ref.check_select(x, 1, seq, 8, cands[:, :k], f"wave{emu} select {k + extra} specials")
    assert (cands[:, k:] == 777).all()  # nothing past K


@pytest.mark.parametrize("pop", [ref.SPARSE_POP, ref.SPARSE_POP + 1])
def test_select_cut_in_a_tied_bin(emu, pop):
    """Radix passes over SPARSE_POP keys (one plain atomic a key) and one more (the
    wave-aggregated count), the cut inside a group of tied scores."""
    k, width = 2048, 131072
    x = ref.tied_bin_row(k, width, pop)
    seq = torch.tensor([width], dtype=torch.int32)
    cands = torch.full((1, k), 777, dtype=torch.int32)
    assert topk.select_candidates(x, 1, seq, 8, cands)
    ref.check_select(x, 1, seq, 8, cands, f"wave{emu} select tied bin of {pop}")


@pytest.mark.parametrize("k", [64, 130])
def test_select_cut_in_the_top_bin(emu, k):
    """A sparse pass that keeps the range's greatest key as its upper end (the top bin of the
    first pass), the cut among tied scores there."""
    width = 131072
    x = ref.tied_top_row(width, ref.SPARSE_POP)
    seq = torch.tensor([width], dtype=torch.int32)
    cands = torch.full((1, k), 777, dtype=torch.int32)
    assert topk.select_candidates(x, 1, seq, 8, cands)
    ref.check_select(x, 1, seq, 8, cands, f"wave{emu} select top bin, K {k}")


def test_select_block_as_large_as_the_bound(emu):
    """A block size of MAX_WIDTH: one block, the newest, pinned (int32 block arithmetic)."""
    x = logits_of(1, 16, "randn", seed=11)
    seq = torch.tensor([16], dtype=torch.int32)
    cands = torch.full((1, 4), 777, dtype=torch.int32)
    assert topk.select_candidates(x, 1, seq, topk.MAX_WIDTH, cands)
    ref.check_select(x, 1, seq, topk.MAX_WIDTH, cands, f"wave{emu} select one huge block")


def test_select_one_length_a_request(emu):
    """1-D lengths, one a request of next_n 2: both draft rows of a request end at its length."""
    x = logits_of(4, 32768, "randn", seed=10)
    seq = torch.tensor([20001, 32768], dtype=torch.int32)
    cands = torch.full((4, 2048), 777, dtype=torch.int32)
    assert topk.select_candidates(x, 2, seq, 8, cands)
    ref.check_select(x, 2, seq, 8, cands, f"wave{emu} select 1-D")


def test_load_time_check_passes(emu):
    """The check build() runs before any hook serves (ops/_topk_check.py: every kernel, both
    decode paths, 1-D and 2-D lengths, ties, -inf, NaN) accepts these kernels' answers at
    gfx942's wave width, 64, and at the H200's, 32 (where tests/test_topk_gpu.py runs it on the
    GPU too): a check that failed on correct gfx942 kernels would keep every top-k hook off
    there. About 37 s a width (this project's 2-core VM)."""
    assert _topk_check.check(torch.device("cpu")) is None


def lds_conflicts(wave: int) -> list[int]:
    """The LDS atomics' address conflicts since the last call (hip/cpu_emu.h's Conflicts):
    [instructions, extra updates, the most extra in one workgroup, the deepest instruction]."""
    out = (ctypes.c_uint64 * 4)()
    _libs[wave].dsv_emu_conflicts(out)
    return list(out)


def _probe_expected(wave: int, waves: int, mod: int) -> tuple[list[int], int]:
    """dsv_emu_probe's count, worked out lane by lane: each wave's k-th atomic of its loop
    (lanes with lane % 3 > k, at lane % mod), then its atomic after the ballot (even lanes, at 0);
    [instructions, extra, extra of the workgroup, deepest], and the sum of the adds."""
    depths = []
    for k in range(2):
        lanes = [ln for ln in range(wave) if ln % 3 > k]
        depths.append(max(sum(1 for ln in lanes if ln % mod == a) for a in range(mod)))
    depths.append(wave // 2)
    extra = sum(d - 1 for d in depths) * waves
    adds = (sum(ln % 3 for ln in range(wave)) + wave // 2) * waves
    return [3 * waves, extra, extra, max(depths)], adds


@pytest.mark.parametrize("mod", [1, 4, 64])
def test_conflict_count_has_known_answers(emu, mod):
    """The counter behind the bound below, on a probe kernel whose count is known lane by lane
    (tests/emu/topk_emu.cpp): a counter that missed the shared addresses, split one wave's
    instruction in two or merged two would pass an upper bound but fails this."""
    waves = 4
    buf = torch.zeros(64, dtype=torch.int32)
    lds_conflicts(emu)
    args = struct.pack("<Qi", buf.data_ptr(), mod)
    assert _libs[emu].dsv_emu_launch(b"dsv_emu_probe", 1, 1, waves * emu, args) == 0
    want, adds = _probe_expected(emu, waves, mod)
    assert lds_conflicts(emu) == want, f"wave{emu} mod {mod}"
    assert int(buf.sum()) == adds


def _decode(x):
    seq = lens([x.shape[1]])
    idx = out(1)
    assert topk.decode_top_k(x, 1, seq, idx, 512)
    ref.check_decode(x, 1, seq, idx, "conflicts")


def _select(x):
    ends = torch.tensor([x.shape[1]], dtype=torch.int32)
    cands = out(1, 2048)
    assert topk.select_candidates(x, 1, ends, 8, cands)
    ref.check_select(x, 1, ends, 8, cands, "conflicts")


def _candidates(x):
    seq = lens([x.shape[1]])
    g = torch.Generator().manual_seed(1)
    cands = torch.randperm(x.shape[1] // 8, generator=g)[:2048].int().view(1, -1)
    idx = out(1)
    assert topk.candidate_top_k(x, 1, seq, cands, 8, idx, 512)
    ref.check_candidates(x, 1, seq, cands, 8, idx, "conflicts")


@pytest.mark.parametrize("emu", [64], indirect=True)  # modelled for gfx942's wave64
@pytest.mark.parametrize(
    "op,kind,bound",
    [
        (_decode, "ties", 256),  # 1 / 3,019
        (_decode, "sparse_finite", 2048),  # 923 / 8,362
        (_decode, "denormals", 4096),  # 1,454 / 9,572
        (_select, "ties", 2048),  # 558 / 7,725
        (_select, "zeros", 6144),  # 1,610 / 26,453
        (_candidates, "ties", 256),  # 0 / 1,006
        (_candidates, "sparse_finite", 512),  # 202 / 1,851
        (_candidates, "denormals", 512),  # 140 / 1,843
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_counts_keep_tied_lanes_off_one_lds_address(emu, op, kind, bound):
    """What gfx942 would serialize (modelled; no gfx942 has run these kernels): the updates
    beyond the first on an LDS address shared by one wave's atomic, summed over a call on one
    row of 65,536 logits (4 chunks and the merge; 8,192 blocks; 2,048 candidate blocks). The
    comments give count_digit's wave aggregation / one plain atomic a key. The H200 prefers the
    plain atomics (benchmarks/topk_sweeps.md: its shared atomics do not serialize), so this
    holds the aggregation that gfx942 needs; the bounds lie between the two."""
    x = logits_of(1, 65536, kind, seed=0)
    lds_conflicts(emu)
    op(x)
    assert lds_conflicts(emu)[1] <= bound


FUZZ_CASES = 250  # a wave width; about 25 s each on a CI core


def test_fuzz(emu):
    """Random rows of every hook against the references (``fuzz_topk``), seeded (the failing
    case's seed is in the message). A review helper's fuzz found rows whose every group of keys
    had the same maximum with fewer than 512 copies (7 failures in 4,691 cases); on the kernels
    before that fix (2217b78) this one failed at wave 64 (case 120) while the groups were
    consecutive. With the interleaved groups it passes with the fix reverted (checked
    2026-12-07): ``test_compact_equal_top_two_keys_fewer_than_k`` fails then."""
    fuzz_topk.run(FUZZ_CASES, emu, "cpu", f"wave{emu}")


def test_select_finite_scores_sharing_the_top_bin_with_infinities(emu):
    """Block scores of FLT_MAX, each in lane 0 of a wave with a +inf block in lane 1: the +inf
    key (0xff800000) is one above FLT_MAX's, outside the cut's range (the finite scores) but in
    the digit of its top bin. count_digit must lead its wave aggregation from the first lane in
    range (ffs - 1), not from an out-of-range lane holding the same digit (then no lane adds the
    FLT_MAX scores), and a pass must keep the range's upper end (the top bin's end lies past it:
    counting the +inf keys among the finite ones). K 8: the pinned newest block and the 4 +inf
    blocks, then 3 of the 4 FLT_MAX blocks (ties at the cut); nothing written past K."""
    k, width = 8, 131072
    x = logits_of(1, width, "randn", seed=13)
    blocks = torch.arange(4) * 64  # slot 0 of threads 0, 64, 128, 192: lane 0 of a wave
    x[0, blocks * 8] = torch.finfo(torch.float32).max
    x[0, (blocks + 1) * 8] = float("inf")
    seq = torch.tensor([width], dtype=torch.int32)
    cands = torch.full((1, k + 8), 777, dtype=torch.int32)
    assert topk.select_candidates(x, 1, seq, 8, cands[:, :k])
    ref.check_select(x, 1, seq, 8, cands[:, :k], f"wave{emu} select FLT_MAX beside +inf")
    assert (cands[:, k:] == 777).all()  # nothing past K


def test_exactly_one_past_the_superset_and_the_list(emu):
    """``_topk_check.exact_above_floor_rows``: a chunk with exactly 1,025 keys above its floor (a
    superset's 1,024 slots and one) and one with 4,097 (the LDS list's 4,096 and one). With the
    superset's bound one entry late the 1,025th entry lands in the next chunk's first slot and the
    row loses its greatest key; with the list's, the list is written one entry past its end (the
    sanitizer's report). Both mutations, which no other test caught (a helper's mutation run),
    fail this; the kernels pass it."""
    x = _topk_check.exact_above_floor_rows(torch.Generator().manual_seed(1))
    idx = out(2)
    topk.top_k_per_row_decode_512(x, 1, lens([x.shape[1]] * 2), idx)
    ref.check_decode(x, 1, lens([x.shape[1]] * 2), idx, f"wave{emu} exact counts above a floor")


def test_candidates_scalar_path_equal_top_two_keys_fewer_than_k(emu):
    """``ref_topk.equal_top_two_candidates``: an unaligned candidate row whose floor pass opens
    on one value with 408 copies, fewer than k (the scalar path's groups hold keys of two
    entries); with 2217b78's count reverted the answer repeats ids and this fails."""
    x, cands, bs = ref.equal_top_two_candidates()
    assert x.data_ptr() % 16 != 0
    idx = out(1)
    assert topk.candidate_top_k(x, 1, lens([x.shape[1]]), cands, bs, idx, 512)
    ref.check_candidates(x, 1, lens([x.shape[1]]), cands, bs, idx, f"wave{emu} unaligned")


def test_compact_equal_top_two_keys_fewer_than_k(emu):
    """``_topk_check.equal_top_two_compact``: the floor pass's range opens on one value holding 400
    copies, fewer than k, which it must count before taking that value as the 512th key (with
    2217b78's count reverted, 112 slots of the answer are stale LDS entries and this fails); the
    answer is the 400 copies and the 112 greatest lower keys."""
    x, ids = _topk_check.equal_top_two_compact(torch.Generator().manual_seed(15))
    idx = out(1)
    assert topk.compact_top_k_512(x, ids, lens([10**6]), 1, idx)
    ref.check_compact(x, ids, 1, lens([10**6]), idx, f"wave{emu} compact equal top two")
