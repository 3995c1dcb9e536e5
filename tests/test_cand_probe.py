"""The synthetic step the indexer compares a candidate-logits variant on (cand_probe.py): a step
of the same variant that the hook's own gate takes, with lengths as vLLM's builder makes them,
enough live candidate columns to judge, and no more rows than the step it stands for."""

from __future__ import annotations

import pytest
import torch

import ref_indexer
from dsv41_gfx942_plugin import cand_probe, indexer
from dsv41_gfx942_plugin.ops import cand_logits

FNUZ = torch.float8_e4m3fnuz


def real_step(batch, next_n, dims, heads=64, page=64):
    """The shapes of a decode step vLLM hands the hook (contents irrelevant to the probe)."""
    q = torch.zeros(batch, next_n, heads, 128, dtype=FNUZ)
    cache = torch.zeros(100, page, 1, 132, dtype=torch.uint8)
    lens = torch.zeros((batch, next_n) if dims == 2 else (batch,), dtype=torch.int32)
    # vLLM's block table is cdiv(max_model_len, block size) wide: no multiple of 16 here.
    table = torch.zeros(batch, 1563, dtype=torch.int32)
    return q, cache, lens, table


VARIANTS = [  # (requests, next_n, length dims, compress ratio)
    (1, 1, 2, 1), (24, 1, 2, 1), (3, 2, 2, 1), (3, 2, 2, 2), (2, 2, 1, 1), (256, 2, 2, 2),
]  # fmt: skip


@pytest.mark.parametrize(("batch", "next_n", "dims", "ratio"), VARIANTS)
def test_probe_is_a_step_of_the_variant_the_hook_takes(batch, next_n, dims, ratio):
    q, cache, lens, table = real_step(batch, next_n, dims)
    step = cand_probe.probe_step(q, cache, lens, table, ratio, 65536, 2048, seed=batch)
    requests = min(batch, cand_probe.PROBE_REQUESTS)
    rows = requests * next_n
    variant = indexer._cand_variant(q, cache, lens, table, ratio, 8)
    probed = indexer._cand_variant(step.q, step.kv_cache, step.seq_lens, step.block_table, ratio, 8)
    assert probed == variant
    assert step.q.shape == (requests, next_n, 64, 128) and step.q.dtype == FNUZ
    assert step.weights.shape == (rows, 64) and step.indices.shape == (rows, 512)
    assert cand_logits._hook_takes(
        step.q, step.kv_cache, step.weights, step.seq_lens, step.block_table, step.candidates,
        8, step.indices, 512, True, False,
    )  # fmt: skip
    # Lengths as vLLM's builder makes them: the last row of a request ends at its compressed
    # length (the first request's long enough for AITER's main loop, the others' shorter); at
    # ratio 2 odd uncompressed lengths end a first row past the dense logits.
    last = step.seq_lens if dims == 1 else step.seq_lens[:, -1]
    assert last[0] == 65536 and (last[1:] <= cand_probe.PROBE_LEN).all()
    assert (last >= next_n).all()
    if dims == 2:
        steps = step.seq_lens.diff(dim=1)
        assert ((steps == 0) | (steps == 1)).all() if ratio == 2 else (steps == 1).all()
        assert (steps == 0).any() == (ratio == 2 and next_n == 2 and requests > 1)
    own = ref_indexer.topk_ends(step.seq_lens, rows, next_n)
    live_end = ref_indexer.live_ends(step.seq_lens, rows, next_n)
    assert (own != live_end) == (ratio == 2 and next_n == 2 and requests > 1)
    # Pages: each request's own, distinct, covering its length (a row's tail names page 0);
    # keys finite, scales > 0.
    pages = step.kv_cache.shape[0]
    counts = [-(-int(n) // 64) for n in last]
    owned = [step.block_table[b, :n] for b, n in enumerate(counts)]
    assert sorted(torch.cat(owned).tolist()) == list(range(pages))
    assert torch.cat(owned).tolist() != list(range(pages))  # shuffled: the table is read
    assert all((step.block_table[b, n:] == 0).all() for b, n in enumerate(counts))
    keys, scales = cand_logits.split_cache(step.kv_cache, FNUZ)
    finite = keys.float().isfinite()
    assert (finite | (keys.view(torch.uint8) == 0x80)).all() and (scales >= 0.5).all()
    assert keys.float()[finite].abs().mean() > 1  # random keys, not zeros
    # Weights differ between heads and rows (a kernel mixing them up would not compare equal).
    assert (step.weights.std(dim=1) > 0).all() and step.weights.unique().numel() == rows * 64
    # Candidates: distinct block ids a row in no order, an eighth -1, the rows' orders
    # different (a kernel reading one row's candidates for every row would not compare equal),
    # enough live columns to judge.
    c = step.candidates
    both = (c[1:] >= 0) & (c[:1] >= 0)
    assert ((c[1:] != c[:1]) & both).any(dim=1).all()  # at a slot live in both, another block
    live = 0
    for r in range(rows):
        ids = step.candidates[r][step.candidates[r] >= 0]
        assert ids.unique().numel() == ids.numel() and ids.max() < 2048
        assert (ids.diff() < 0).any()  # in no order, as layer 20's top-K writes them
        assert 0.08 < (step.candidates[r] < 0).float().mean() < 0.17
        cols = (ids[:, None] * 8 + torch.arange(8)).flatten()
        live += int((cols < live_end[r]).sum())
    assert live >= indexer.MIN_COMPARED


def test_probe_fits_a_narrow_layer():
    """A reader layer narrower than PROBE_LEN, its width not a multiple of the page: every
    length within the width's whole pages (AITER writes a row's -inf tail to a page boundary)."""
    q, cache, lens, table = real_step(2, 2, 2)
    step = cand_probe.probe_step(q, cache, lens, table, 2, 1000, 2048)
    assert int(step.seq_lens.max()) == 960 and (step.seq_lens >= 1).all()


@pytest.mark.parametrize(("pad", "offset"), [(0, 0), (4, 4), (4104, 12), (48, 0), (32, 8)])
def test_probe_cache_aligns_as_the_real_one(pad, offset):
    """The probe's start agrees with the real cache's modulo 16 bytes and its page stride
    modulo 64 (the keys' stride in bytes and the scales' in floats modulo 16: the JIT's
    specializations of AITER's and the plugin's kernels depend on them), whatever vLLM's page
    stride; the variant the verdict is kept under tells such caches apart."""
    q, _, lens, table = real_step(2, 2, 2)
    page_bytes = 64 * 132
    base = torch.zeros(offset + 5 * (page_bytes + pad), dtype=torch.uint8)
    real = base[offset:].as_strided((5, 64, 1, 132), (page_bytes + pad, 132, 132, 1))
    step = cand_probe.probe_step(q, real, lens, table, 1, 8192, 2048)
    assert step.kv_cache.stride(0) % 64 == real.stride(0) % 64
    keys, scales = cand_logits.split_cache(step.kv_cache)
    real_keys, real_scales = cand_logits.split_cache(real)
    assert keys.stride(0) % 16 == real_keys.stride(0) % 16
    assert scales.stride(0) % 16 == real_scales.stride(0) % 16
    assert step.kv_cache.stride(0) >= page_bytes and step.kv_cache.stride()[1:] == (132, 132, 1)
    assert step.kv_cache.data_ptr() % 16 == real.data_ptr() % 16
    variant = indexer._cand_variant(q, real, lens, table, 1, 8)
    assert indexer._cand_variant(step.q, step.kv_cache, lens, step.block_table, 1, 8) == variant
    plain = torch.zeros(5, 64, 1, 132, dtype=torch.uint8)
    assert (indexer._cand_variant(q, plain, lens, table, 1, 8) == variant) == (
        pad % 64 == offset == 0
    )


def test_probe_keys_hold_the_bytes_vllms_writer_leaves():
    """vLLM 0.33's DSv4.1 indexer K writer (``indexer_k_norm_rope_store``) encodes OCP e4m3fn
    (``tl.float8e4nv``, max 448) on ROCm too, while AITER's gfx942 kernel and the candidate
    kernel read the bytes as e4m3fnuz: OCP's -0 (0x80, any tiny negative element) is NaN there.
    A probe of e4m3fnuz keys alone never holds 0x80, so the comparison could not see the two
    kernels treat such keys differently; the probe puts it in a few keys (at most a few
    percent of them, so that enough columns stay finite to judge)."""
    q, cache, lens, table = real_step(2, 1, 2)
    step = cand_probe.probe_step(q, cache, lens, table, 1, 8192, 2048)
    keys, _ = cand_logits.split_cache(step.kv_cache, FNUZ)
    page = step.kv_cache.shape[1]
    # SHUFFLE layout: byte (t // 16, d // 16, t % 16, d % 16) of a page holds key t, dim d.
    tiles = keys.view(torch.uint8).reshape(-1, page // 16, 128 // 16, 16, 16)
    nan_keys = (tiles == 0x80).any(dim=4).any(dim=2)  # [pages, page // 16, 16]: one a key
    share = nan_keys.float().mean().item()
    assert 0.005 < share < 0.05
    assert keys.float().isnan().sum() == (keys.view(torch.uint8) == 0x80).sum()
