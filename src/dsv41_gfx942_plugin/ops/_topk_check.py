"""The top-k kernels' check at load time: each op once on a few fixed rows of the GPU at hand,
against torch, before any hook takes a call.

No gfx942 GPU has run the shipped code object yet. A kernel that loads but answers wrongly there (a
compiler's or the hardware's semantics that neither the CPU emulation nor the sm_90 build can show)
would give vLLM wrong index sets without an error. ``topk.build`` runs :func:`check` after loading
and keeps every top-k hook off in the process when it fails, so vLLM's ops run. The rows take every
kernel and the product's paths: decode rows of one chunk, of one and of two merge launches, both
paths with 2-D and with 1-D causal lengths, rows ending at or before 512; candidate and compact rows
with -1 and repeated ids, fewer than 512 live entries or an end at or before 512, with 2-D and 1-D
lengths; layer 20's selection with fewer than 2048 live blocks, one length a request, and rows of
more than 16384 blocks (``dsv_select_blocks_wide``). Their values lie on a grid of 0.25 (ties at
every cut), every 7th is -inf, a few +inf and NaN. In both selection kernels, rows whose cut lies
below the finite scores' top 8 binades, or among NaN and +inf scores (``_far_cut_rows``). Rows in
one binade with a NaN take the cut over the registers (more keys above a workgroup's floor than its
LDS list holds) in the chunks, both merges and the candidate and compact kernels, a path random rows
seldom reach. Rows cut among zeros of both signs, below denormals (decode in a merge on both paths,
candidate, compact), refuse a kernel that ranks -0 as +0 or flushes denormals (the GPU tests check
that order too; this check is what a gfx942 machine runs before serving). Rows of a width 3 past a
multiple of 4, 16-byte aligned, end in a partial float4 whose logits rank first; rows with exactly a
superset's slots and one, or the LDS list and one, above a chunk's floor
(``exact_above_floor_rows``). A compact row whose groups of keys all top at one value with fewer
than 512 copies takes the floor pass's one-value range, which a kernel must count before taking it
as the cut (``equal_top_two_compact``). Continuous rows (off the grid) take the radix passes'
plain-atomic count of a sparse range (the selection's usual second pass); rows of +0 but for 300
logits the floor on the 512th key in the chunk, candidate and compact kernels; candidate rows of
short requests (fewer than 256 live blocks) the floor from each group's top two keys; a candidate
width not a multiple of 8 and a selection width not a multiple of 4 the scalar loads. Rows of one
value, ties in one chunk and 6400 keys above a chunk's floor take the radix passes to a single
key, and the register cut's sparse pass, in every kernel's copy; one-value rows in 16 chunks of
the general path the first merge's floor on the 512th key; rows 1% finite the top-two floor
pass's retry from the least group maximum. With these (drawn from their own
generators, ``_more``), the check runs every line of ``hip/`` that the CPU emulation's tests run,
counting each kernel's copy of the shared code apart (gcov of the emulation, wave 64 and 32; it
missed 13 lines, 66 counting copies, before the first of them, 20 before the last). H100, with
every row (e1dbb33): 76-82 ms a check in all (the first, with the code object's load and torch's
first launches, 0.70 s; 88-136 ms on another H100 host: host time), 30.5 ms of it GPU time
(torch's profiler), most of that torch's reference (its sorts and top-k of int64 keys): decode
rows 40 ms, candidate and compact 22, selection 13. H200 before the binade rows: 8.7 ms of GPU
time, 27.4-29.0 ms, 0.35 s.
"""

from __future__ import annotations

import torch

from . import topk

K = 512
BLOCK = 8  # the candidate block size
SELECT_K = 2048
NEG = float("-inf")
# Bits a radix pass of the floor takes (hip/topk_select.h's DIGIT; tests/test_topk_build.py ties
# them): exact_above_floor_rows places its keys by the floor pass's bins.
FLOOR_DIGIT = 8


def _grid_rows(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    f32 = dict(dtype=torch.float32, device=gen.device)  # vLLM builds models under a bf16 default
    x = torch.randn(rows, width, generator=gen, **f32).mul_(4).round_().div_(4)
    x[:, ::7] = NEG
    x[:, 5::4099] = float("inf")
    x[:, 11::50021] = float("nan")
    return x


def _binade_rows(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """Logits in [1, 2) and a NaN in every 16384 columns: the NaN tops a floor pass's range, so
    its bins span a binade and nearly every key lies above the floor, more than the LDS list's
    4096 (the workgroup's cut then runs over its registers)."""
    x = torch.rand(rows, width, generator=gen, dtype=torch.float32, device=gen.device).add_(1)
    x[:, 7::16384] = float("nan")
    return x


def equal_top_two_compact(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A [1, 16384] compact row (logits, ids) whose live entries put one value V = 1.0 atop every
    live group of keys of dsv_topk512_compact (entry i: slot i // 512 of thread i % 512; group
    (thread, slot % 2)), each group's second key V too or absent: 200 groups of one live entry
    (V), 100 of two V and 14 lower. The floor pass over the groups' top two keys opens on one
    value (its range [V, V]) holding 400 copies, fewer than k: radix_cut must count them before
    taking V as the 512th key (else 112 slots of the answer are stale LDS entries). The kernels'
    float4 paths reach that range only here: the decode and candidate ones take keys live or
    absent a float4 at a time (but the one holding a row's end), so each of their live groups
    holds two keys, and top two keys all equal mean at least k copies. (The candidate kernel's
    scalar path, for rows not 16-byte aligned, reaches it too: ``ref_topk``'s
    ``equal_top_two_candidates``, a test row; vLLM's rows are aligned.)"""
    n, dev = 16384, gen.device
    x = torch.rand(1, n, generator=gen, dtype=torch.float32, device=dev).mul_(0.5)
    ids = torch.full((1, n), -1, dtype=torch.int32, device=dev)
    slot, thread = torch.arange(n, device=dev) // 512, torch.arange(n, device=dev) % 512
    single = (thread < 200) & (slot == 0)  # group (thread, slot % 2): the even slots
    double = (thread >= 200) & (thread < 300) & (slot % 2 == 0)
    x[0, single | (double & (slot < 4))] = 1.0
    live = single | double
    ids[0, live] = torch.randperm(1 << 20, generator=gen, device=dev)[: int(live.sum())].int()
    return x, ids


def _from_bits(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def exact_above_floor_rows(gen: torch.Generator, counts=(1025, 4097)) -> torch.Tensor:
    """Decode rows of two chunks whose first chunk has exactly ``counts[r]`` keys above its floor:
    1,025 is a superset's 1,024 slots and one, 4,097 the LDS list's 4,096 and one (a kernel one
    entry off there writes past them). In dsv_topk512_chunks (slot s of thread t: column
    4 (512 (s // 4) + t) + s % 4; group (t, s % 2)) 511 even groups hold the keys 1.0 + 1 ulp,
    + 2 ulp, ... (the last listed the greatest), group (511, 0) holds 1.0 and every odd group
    tops at 1.0 less one bin of the floor pass (8-bit digits over the maxima's span), so that
    pass's floor is exactly 1.0; every other logit lies in (-2, -1]."""
    dev = gen.device
    f32 = dict(dtype=torch.float32, device=dev)  # vLLM builds models under a bf16 default
    x = torch.rand(len(counts), 2 * topk.CHUNK, generator=gen, **f32).neg_().sub_(1)
    one = 0x3F800000
    threads = topk.THREADS["dsv_topk512_chunks"]
    slots = topk.CHUNK // threads
    for r, n in enumerate(counts):
        # One bin of the floor pass, whose span (the maxima's, n + d keys) sets the bin width.
        d, prev = 1, 0
        while d != prev:
            prev, d = d, 1 << max((n + d).bit_length() - FLOOR_DIGIT, 0)
        i = torch.arange(n, device=dev)
        t, s = i % (threads - 1), 2 * (i // (threads - 1))
        order = (t * slots + s).argsort()  # the list's order: thread, then slot
        t, s = t[order], s[order]
        x[r, 4 * (threads * (s // 4) + t) + s % 4] = _from_bits(one + 1 + i)
        x[r, 4 * (threads - 1)] = 1.0
        x[r, 4 * torch.arange(threads, device=dev) + 1] = _from_bits(torch.tensor(one - d))
    return x


def _signed_zero_rows(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """A top-512 cut among zeros of both signs, below denormals: a row holds 400 logits in [1, 2),
    50 positive denormals, 300 +0 and 300 -0 (scattered), the rest in (-2, -1] but 50 negative
    denormals. The top 512 are the positives and 62 of the +0s: a kernel that ranks -0 as +0, or
    whose arithmetic flushes denormals to zero, takes other ids."""
    f32 = dict(dtype=torch.float32, device=gen.device)
    x = torch.rand(rows, width, generator=gen, **f32).add_(1).neg_()
    bits = torch.randint(1, 1 << 23, (rows, 100), generator=gen, device=gen.device)
    bits[:, 50:] -= 2**31  # the sign bit: negative denormals
    tiny = bits.int().view(torch.float32)
    for r in range(rows):
        cols = torch.randperm(width, generator=gen, device=gen.device)[:1100]
        x[r, cols[:400]] = torch.rand(400, generator=gen, **f32).add_(1)
        x[r, cols[400:500]] = tiny[r]
        x[r, cols[500:800]] = 0.0
        x[r, cols[800:]] = -0.0
    return x


def _short_candidate_rows(
    gen: torch.Generator, width: int, ends: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Candidate rows as layer 20 writes them for a short request: every block below the row's end,
    in random order (layer 20's is by score), then -1 (2,048 entries a row); ``_grid_rows`` logits,
    2-D lengths. An end of 1,025 to 2,040 columns leaves fewer than 256 live blocks: in
    dsv_topk512_candidates' vector path (entry q * 256 + thread / 2; groups of 16 keys) only the
    threads of the first 256 entries hold a valid key, so fewer than 2k of its 1,024 group maxima
    are valid and the floor pass runs over each group's top two keys, which rows of 2,048 live
    blocks never take. A ``width`` not a multiple of 8 (a model length vLLM was given) sends every
    row down the kernel's scalar loads instead."""
    dev = gen.device
    x = _grid_rows(gen, len(ends), width)
    cands = torch.full((len(ends), SELECT_K), -1, dtype=torch.int32, device=dev)
    for r, end in enumerate(ends):
        nb = -(-end // BLOCK)
        cands[r, :nb] = torch.randperm(nb, generator=gen, device=dev).int()
    return x, cands, torch.tensor(ends, dtype=torch.int32, device=dev).view(-1, 1)


def _every_block(gen: torch.Generator) -> torch.Tensor:
    """One candidate row naming every block of a 16384-column row (2048), in random order."""
    return torch.randperm(2048, generator=gen, device=gen.device).int()[None]


def _distinct_ids(gen: torch.Generator) -> torch.Tensor:
    """One compact row's 16384 distinct column ids below 2^20, in random order."""
    return torch.randperm(1 << 20, generator=gen, device=gen.device)[:16384].int()[None]


def _more(gen: torch.Generator) -> torch.Generator:
    """A generator of its own for the rows added after the first ones, so that those stay as they
    were (which paths a random row takes can hang on its draws; a coverage run showed it)."""
    return torch.Generator(device=gen.device).manual_seed(gen.initial_seed() + 1)


def _randn_rows(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """Continuous logits (off the grid of 0.25: few ties), as a served row's are: a radix pass
    after the first has at most SPARSE_POP keys in range and counts them with plain atomics (the
    selection's usual second pass; the general path's list cut), which grid rows never reach."""
    return torch.randn(rows, width, generator=gen, dtype=torch.float32, device=gen.device)


def _tied_floor_rows(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """Rows of +0 but for 300 logits in [1, 2), scattered (an indexer's ReLU'd logits that are
    all exactly 0): more than k group maxima are +0 and fewer than k keys lie above it, so the
    floor pass lands on the k-th key and top_k lists the keys above it and the first equal ones
    (its 'floor is the k-th key' path), which neither random nor binade rows take in the chunk,
    candidate or compact kernels."""
    f32 = dict(dtype=torch.float32, device=gen.device)
    x = torch.zeros(rows, width, **f32)
    for r in range(rows):
        cols = torch.randperm(width, generator=gen, device=gen.device)[:300]
        x[r, cols] = torch.rand(300, generator=gen, **f32).add_(1)
    return x


def _one_value_rows(width: int, device: torch.device) -> torch.Tensor:
    """A row of 1.0 and one of -inf: every group's maximum is the same key, so the floor pass's
    range is that one key (a pass whose bins are single keys at once) in the chunk, stream and
    merge kernels, and the floor is the 512th key (top_k lists the first equal keys, the first
    merge of two too)."""
    x = torch.ones(2, width, dtype=torch.float32, device=device)
    x[1] = NEG
    return x


def _many_above_floor_rows(gen: torch.Generator, width: int) -> torch.Tensor:
    """Random rows whose columns c with c % 1024 < 400 are raised above 100: in the general
    path's chunks, where thread t reads columns t, t + 1024, ... (STREAM_THREADS), the floor
    from the group maxima leaves their 6400 keys of a 16384-column chunk above it, more than
    the LDS list holds (so in the register path's, where they are thread t's float4s t,
    t + 512, ... with t % 256 < 100): the cut runs over the keys themselves. Row 0's raised
    logits are 50 tied values (its passes end on the exact key), row 1's continuous (a sparse
    pass over the registers)."""
    f32 = dict(dtype=torch.float32, device=gen.device)
    x = torch.randn(2, width, generator=gen, **f32)
    raised = torch.arange(width, device=gen.device) % 1024 < 400
    n = int(raised.sum())
    x[0, raised] = torch.randint(0, 50, (n,), generator=gen, **f32).add_(100)
    x[1, raised] = torch.rand(n, generator=gen, **f32).mul_(50).add_(100)
    return x


def _sparse_finite_rows(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """Random rows of which 1% of the logits are finite, the rest -inf: a chunk's groups mostly
    top at -inf, so its floor comes from each group's top two keys, and the top 8 binades of
    those hold fewer than 512 of them: the floor pass runs again from the least group maximum
    (the check's other retries, in partial chunks of fewer than 512 valid maxima, run from the
    least key)."""
    x = _randn_rows(gen, rows, width)
    return x.masked_fill_(
        torch.rand(x.shape, generator=gen, dtype=x.dtype, device=x.device) >= 0.01, NEG
    )


def _keys(v: torch.Tensor) -> torch.Tensor:
    """int64 keys in vLLM's top-k order: NaN above +inf, -0 below +0."""
    b = v.view(torch.int32).to(torch.int64)
    key = torch.where(b >= 0, b + 2**31, 2**31 - 1 - (b & 0x7FFFFFFF))
    return torch.where(v.isnan(), 2**33, key)


def _iota_ok(row: torch.Tensor, end: int) -> bool:
    want = torch.full_like(row, -1)
    want[:end] = torch.arange(end, device=row.device)
    return torch.equal(row, want)


def _top_row_ok(got: torch.Tensor, values: torch.Tensor, cols: torch.Tensor, k: int) -> bool:
    """``got`` (k ids) holds distinct ids among ``cols`` (sorted) whose ``values`` are the k
    largest as a multiset (ties at the cut may pick any of them); fewer than k: all, then -1."""
    n = min(k, values.numel())
    taken, rest = got[:n].long(), got[n:]
    if not bool((rest == -1).all()) or taken.unique().numel() != n:
        return False
    pos = torch.searchsorted(cols, taken).clamp(max=max(cols.numel() - 1, 0))
    if n and not torch.equal(cols[pos], taken):  # an id that is not one of the columns
        return False
    keys = _keys(values)
    return torch.equal(keys[pos].sort().values, keys.topk(n).values.sort().values)


def _row_ok(got: torch.Tensor, end: int, values: torch.Tensor, cols: torch.Tensor) -> bool:
    """A top-512 row's contract: 0..end-1 then -1 for an end at or before 512, else the top
    512 of ``values`` (at ``cols``)."""
    return _iota_ok(got, end) if end <= K else _top_row_ok(got, values, cols, K)


def _ends(seq_lens: torch.Tensor, rows: int, next_n: int, width: int) -> list[int]:
    """The top-k's row ends: 2-D lengths one a row, 1-D ones causal; clamped to [0, width]."""
    lens = seq_lens.view(-1).tolist()
    if seq_lens.dim() == 2:
        return [max(0, min(lens[r], width)) for r in range(rows)]
    return [max(0, min(lens[r // next_n] - next_n + r % next_n + 1, width)) for r in range(rows)]


def _decode_bad(x, next_n, seq_lens, idx) -> str | None:
    for r, end in enumerate(_ends(seq_lens, x.shape[0], next_n, x.shape[1])):
        if not _row_ok(idx[r], end, x[r, :end], torch.arange(end, device=x.device)):
            return f"row {r} (end {end})"
    return None


def _path_bad(x, next_n, lens, i32, register: bool, *split) -> str | None:
    """The decode top-512 on one path (``split``: its max_blocks and min_chunk, when not the
    defaults), and what differed."""
    idx = torch.full((x.shape[0], K), -7, **i32)
    topk.top_k_per_row_decode_512(x, next_n, lens, idx, *split, register_select=register)
    return _decode_bad(x, next_n, lens, idx)


def _both_paths_bad(x, next_n, lens, i32, what: str) -> str | None:
    """The decode top-512 on its register and its general path, and what differed."""
    for register in (True, False):
        if bad := _path_bad(x, next_n, lens, i32, register):
            path = "register" if register else "general"
            return f"decode top-512 ({path} path, {what}): {bad}"
    return None


def _check_decode(gen, i32) -> str | None:
    c = topk.CHUNK
    x = _grid_rows(gen, 4, 41 * c)  # 41 chunks: two merge launches
    for next_n, lens in [
        # 11c + 5: 12 chunks, the first merge's second group of 4 (its floor from top-two keys)
        (1, torch.tensor([[41 * c], [5 * c + 3], [300], [11 * c + 5]], **i32)),
        (2, torch.tensor([41 * c, 513], **i32)),  # 1-D: causal ends 41c - 1, 41c, 512, 513
    ]:
        if bad := _both_paths_bad(x, next_n, lens, i32, f"{lens.dim()}-D lengths"):
            return bad
    for rows, width, lens, next_n in [
        (4, 2 * c, torch.tensor([2 * c, 1000], **i32), 2),  # 1-D: one a request, causal
        (2, c, torch.tensor([[c], [c - 100]], **i32), 1),  # one chunk: no merge launch
    ]:
        y = _grid_rows(gen, rows, width)
        idx = torch.full((rows, K), -7, **i32)
        if not topk.decode_top_k(y, next_n, lens, idx, K):
            return f"decode top-512 declined {rows} x {width}"
        if bad := _decode_bad(y, next_n, lens, idx):
            return f"decode top-512 ({rows} x {width}): {bad}"
    # The cut over the registers: in chunks handing on supersets; in a first merge (64 chunks
    # of 1000 keys, each handing on all of them) and a second (64 of 128 keys).
    for width, register, blocks, chunk in [(3 * c, True, 8, c), (64000, False, 64, 1000),
                                           (8192, False, 64, 128)]:  # fmt: skip
        y = _binade_rows(gen, 2, width)
        lens = torch.tensor([[width], [width - 5]], **i32)
        if bad := _path_bad(y, 1, lens, i32, register, blocks, chunk):
            return f"decode top-512 (more than the list above a floor, {width} columns): {bad}"
    y = _signed_zero_rows(gen, 2, 2 * c)  # two chunks a row: the cut in a merge too
    lens = torch.tensor([[2 * c], [2 * c - 9]], **i32)
    if bad := _both_paths_bad(y, 1, lens, i32, "a cut among zeros of both signs"):
        return bad
    more = _more(gen)
    y = _randn_rows(more, 2, c)  # one chunk a row: the exact cut, sparse passes
    lens = torch.tensor([[c], [c - 3]], **i32)
    if bad := _both_paths_bad(y, 1, lens, i32, "continuous logits"):
        return bad
    y = _tied_floor_rows(more, 2, 2 * c)  # the floor on the 512th key, in the chunks and merge
    lens = torch.tensor([[2 * c], [2 * c - 1]], **i32)
    if bad := _both_paths_bad(y, 1, lens, i32, "300 logits above ties at +0"):
        return bad
    # A width 3 past a multiple of 4 with 16-byte aligned rows (a view): the register path's last
    # float4 is partial, read by elements; its three logits rank first.
    y = _grid_rows(gen, 2, 2 * c + 4)[:, : 2 * c + 3]
    y[:, -3:] = 1000.0
    lens = torch.tensor([[2 * c + 3], [2 * c + 3]], **i32)
    if bad := _both_paths_bad(y, 1, lens, i32, "a width 3 past a multiple of 4"):
        return bad
    y = exact_above_floor_rows(gen)
    lens = torch.tensor([[2 * c], [2 * c]], **i32)
    if bad := _both_paths_bad(y, 1, lens, i32, "1,025 and 4,097 keys above a chunk's floor"):
        return bad
    for what, y, lens in [
        ("one value a row", _one_value_rows(2 * c, more.device), [[2 * c], [2 * c - 1]]),
        ("ties in one chunk", _grid_rows(more, 2, c), [[c], [c - 7]]),  # an exact cut among ties
        ("6400 keys above the floor", _many_above_floor_rows(more, c), [[c], [c]]),
        ("1% finite", _sparse_finite_rows(more, 2, 3 * c), [[3 * c], [3 * c - 5]]),
    ]:
        if bad := _both_paths_bad(y, 1, torch.tensor(lens, **i32), i32, what):
            return bad
    # 16 chunks of 1000 on the general path: two merges, the first's floor on the 512th key
    y, lens = _one_value_rows(16000, more.device), torch.tensor([[16000], [15999]], **i32)
    if bad := _path_bad(y, 1, lens, i32, False, 16, 1000):
        return f"decode top-512 (general path, one value a row in 16 chunks): {bad}"
    return None


def _check_candidates(gen, i32, z) -> str | None:
    """Candidate top-k (layers 24-36, 2048 blocks a row, some -1, some repeated) and the
    compact top-k (16384 entries of distinct ids, some -1): rows with many live entries, with
    fewer than 512, and ending at or before 512; 2-D lengths (vLLM's) and 1-D causal ones."""
    rows, width = z.shape
    dev = z.device
    cands = torch.stack([torch.randperm(width // BLOCK, generator=gen, device=dev)[:2048]
                         for _ in range(rows)]).int()  # fmt: skip
    cands[:, ::9] = -1
    cands[:, 100:150] = cands[:, 300:350]
    calls = [
        (z, cands, 1, torch.tensor([[width], [3000], [400]], **i32)),
        (z, cands, 3, torch.tensor([514], **i32)),  # causal ends 512 (0..511), 513, 514
        # Every block of a row in one binade (more than the list above the floor)
        (_binade_rows(gen, 1, 16384), _every_block(gen), 1, torch.tensor([[16384]], **i32)),
        (_signed_zero_rows(gen, 1, 16384), _every_block(gen), 1, torch.tensor([[16383]], **i32)),
    ]
    more = _more(gen)
    calls.append(
        (_tied_floor_rows(more, 1, 16384), _every_block(more), 1, torch.tensor([[16384]], **i32))
    )
    # Short requests' rows (fewer than 256 live blocks: the floor from the top two keys); then a
    # width not a multiple of 8 (the scalar loads), a full row and a short one.
    for w, ends in ((16384, (1500, 2040)), (16380, (16380, 1500))):
        x, cand, lens = _short_candidate_rows(more, w, ends)
        calls.append((x, cand, 1, lens))
    newer = _more(more)  # later rows still, so that the compact rows' draws stay as they were
    calls.append(  # no ties at the cut
        (_randn_rows(newer, 1, 16384), _every_block(newer), 1, torch.tensor([[16384]], **i32))
    )
    for x, cand, next_n, lens in calls:
        idx = torch.full((x.shape[0], K), -7, **i32)
        if not topk.candidate_top_k(x, next_n, lens, cand, BLOCK, idx, K):
            return f"candidate top-k declined ({lens.dim()}-D lengths)"
        for r, end in enumerate(_ends(lens, x.shape[0], next_n, x.shape[1])):
            blocks = cand[r][cand[r] >= 0].unique().long()
            cols = (blocks[:, None] * BLOCK + torch.arange(BLOCK, device=dev)).flatten()
            cols = cols[cols < end].sort().values
            if not _row_ok(idx[r], end, x[r, cols], cols):
                return f"candidate top-k ({lens.dim()}-D lengths): row {r} (end {end})"
    ids = torch.randperm(1 << 20, generator=gen, device=dev)[: rows * 16384].view(rows, -1).int()
    ids[:, 3::11] = -1
    ids[1, 300:] = -1
    v = _grid_rows(gen, rows, 16384)
    whole = torch.tensor([[width]], **i32)
    calls = [
        (v, ids, 1, torch.tensor([[width], [width], [400]], **i32)),
        (v, ids, 3, torch.tensor([514], **i32)),  # causal ends 512 (0..511), 513, 514
        # A row in one binade, every entry live (more than the list above the floor)
        (_binade_rows(gen, 1, 16384), _distinct_ids(gen), 1, whole),
        (_signed_zero_rows(gen, 1, 16384), _distinct_ids(gen), 1, whole - 1),
        (*equal_top_two_compact(gen), 1, whole),  # one-value floor range
        (_tied_floor_rows(more, 1, 16384), _distinct_ids(more), 1, whole),
        (_sparse_finite_rows(newer, 1, 16384), _distinct_ids(newer), 1, whole),
    ]
    for n, (y, vid, next_n, lens) in enumerate(calls):
        idx = torch.full((y.shape[0], K), -7, **i32)
        if not topk.compact_top_k_512(y, vid, lens, next_n, idx):
            return f"compact top-k declined ({lens.dim()}-D lengths)"
        for r, end in enumerate(_ends(lens, y.shape[0], next_n, 1 << 30)):
            live = vid[r] >= 0
            cols, order = vid[r][live].long().sort()
            if not _row_ok(idx[r], end, y[r][live][order], cols):
                return f"compact top-k ({lens.dim()}-D lengths): call {n}, row {r} (end {end})"
    return None


def _far_cut_rows(gen: torch.Generator, width: int) -> torch.Tensor:
    """Two selection rows whose cut lies outside the finite scores' top 8 binades (FLOOR_SPAN),
    each of 3000 live blocks (the rest -inf; fewer than the LDS list's 4096 entries, so a kernel
    that took every live block would answer wrongly, not write past its list). Their block
    scores spread over 240 binades, of either sign (a block's logits within a factor of 2 of
    each other). In row 0 about 50 lie within 8 binades of the greatest, fewer than 2048: the
    cut over that span finds too few and runs again over every finite score, from the least (a
    reduction's minimum, here over lanes that hold no live block). In row 1, 2600 blocks score
    NaN or +inf, more than the selection takes: its cut runs among those."""
    f32 = dict(dtype=torch.float32, device=gen.device)
    blocks = width // BLOCK
    scale = torch.rand(2, blocks, generator=gen, **f32).mul_(240).sub_(120).exp2_()
    scale[torch.rand(2, blocks, generator=gen, **f32) < 0.5] *= -1
    x = torch.rand(2, blocks, BLOCK, generator=gen, **f32).add_(1).mul_(scale[..., None])
    live = torch.randperm(blocks, generator=gen, device=gen.device)[:3000]
    dead = torch.ones(blocks, dtype=torch.bool, device=gen.device)
    dead[live] = False
    x[:, dead] = NEG
    x[1, live[:1300], 0] = float("nan")
    x[1, live[1300:2600], 0] = float("inf")
    return x.view(2, width)


def _check_selection(gen, i32, z) -> str | None:
    """Layer 20's selection: the top 2048 block scores (NaN-propagating block maxima below the
    row's end, the newest block pinned to +inf, -inf blocks never taken)."""
    dev = z.device
    wide = _grid_rows(gen, 2, 32768 * BLOCK)  # more than 16384 blocks: the wide kernel
    calls = [
        (z, 1, torch.tensor([z.shape[1], 70001, 5000], **i32)),  # 5000: 625 live blocks
        (z[:2], 2, torch.tensor([z.shape[1] - 3], **i32)),  # one length a request, 2 rows
        (wide, 1, torch.tensor([wide.shape[1], 200001], **i32)),
        *((_far_cut_rows(gen, n), 1, torch.tensor([n - 5, n], **i32)) for n in (1 << 17, 1 << 18)),
    ]
    more, w = _more(gen), 32768 * BLOCK - 3
    calls += [
        # A width not a multiple of 4: row 1 is not 16-byte aligned (scalar block scores), its
        # last block one column
        (_grid_rows(more, 2, 8 * 8192 + 1), 1, torch.tensor([40001, 8 * 8192 + 1], **i32)),
        (_randn_rows(more, 1, 1 << 17), 1, torch.tensor([1 << 17], **i32)),  # sparse passes
        # The wide kernel's sparse passes (row 0) and scalar block scores (row 1, unaligned)
        (_randn_rows(more, 2, w), 1, torch.tensor([200001, w], **i32)),
    ]
    for x, next_n, lens in calls:
        rows, width = x.shape
        out = torch.full((rows, SELECT_K), -7, **i32)
        if not topk.select_candidates(x, next_n, lens, BLOCK, out):
            return f"candidate selection declined {rows} x {width}"
        ends = lens.repeat_interleave(next_n) if lens.numel() != rows else lens
        for r, end in enumerate(ends.tolist()):
            live = torch.full((-(-width // BLOCK) * BLOCK,), NEG, dtype=torch.float32, device=dev)
            live[:end] = x[r, :end]
            scores = live.view(-1, BLOCK).amax(-1) + 0.0  # -0 as +0: torch.topk's order
            scores[(end - 1) // BLOCK] = float("inf")
            blocks = torch.nonzero(scores != NEG).flatten()
            if not _top_row_ok(out[r], scores[blocks], blocks, SELECT_K):
                return f"candidate selection ({rows} x {width}): row {r} (end {end})"
    return None


def check(device: torch.device) -> str | None:
    """None when every op gives the reference answer on ``device`` (vLLM's top-k order; torch.topk's
    for the selection), else what differed."""
    gen = torch.Generator(device=device).manual_seed(20261202)
    i32 = dict(dtype=torch.int32, device=device)
    z = _grid_rows(gen, 3, 2048 * 8 * BLOCK)  # 128k columns, 16384 blocks
    return (
        _check_decode(gen, i32) or _check_candidates(gen, i32, z) or _check_selection(gen, i32, z)
    )
