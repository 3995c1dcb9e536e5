"""Candidate logits on gfx942 hardware (MI300X/MI325X, with AITER and vLLM installed).

Ready for anyone with the hardware, one command:
    pytest -m gfx942 tests/test_cand_logits_gfx942.py
Nobody on this project has run them yet: bit-identity with AITER's dense kernel awaits gfx942.
1. The compact rows are bit-identical to AITER's dense Gluon kernel
   (`deepgemm_fp8_paged_mqa_logits`, called as vLLM 0.33 calls it) at the same positions, with
   -inf / -1 everywhere else.
2. The hook's top-512 equals vLLM's dense decode path (dense logits,
   `_apply_candidate_mask_strided`, `torch.ops._C.top_k_per_row_decode`), ties at the cut aside,
   at 4k-128k context, 1-6 rows.
"""

from __future__ import annotations

import pytest
import torch

from dsv41_gfx942_plugin.ops import _cand_layout, cand_logits
from test_cand_logits import make_case, run_candidate_logits


def _on_gfx942() -> bool:
    if torch.version.hip is None or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_properties(0).gcnArchName.startswith("gfx942")


pytestmark = [
    pytest.mark.gfx942,
    pytest.mark.skipif(not _on_gfx942(), reason="needs an MI300X/MI325X (gfx942) GPU"),
]

# (requests, next_n, context) of a decode step; rows = requests x next_n, 1 to 6. next_n is 1
# or 2, as vLLM 0.33 hands AITER on ROCm (more draft rows are flattened): the hook takes only
# those (cand_logits.AITER_NEXT_N).
STEPS = [(1, 1, 4096), (3, 2, 16384), (6, 1, 65536), (3, 2, 131072), (1, 2, 131072)]


def aiter_dense_kernel():
    """AITER's dense kernel from the module vLLM 0.33 takes it from (either of AITER's paths)."""
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import paged_mqa_logits_module

    module = paged_mqa_logits_module()
    assert module is not None, (
        "vLLM finds no AITER paged-MQA logits module with the gfx942 API "
        "(vllm.v1.attention.ops.rocm_aiter_mla_sparse.paged_mqa_logits_module)"
    )
    return module.deepgemm_fp8_paged_mqa_logits


def aiter_dense_logits(case, max_model_len: int) -> torch.Tensor:
    """AITER's dense logits exactly as vLLM 0.33's rocm_fp8_paged_mqa_logits asks for them."""
    deepgemm_fp8_paged_mqa_logits = aiter_dense_kernel()
    rows = case.candidates.shape[0]
    out = torch.full((rows, max_model_len), float("nan"), device=case.q.device)
    lens = case.seq_lens
    if lens.dim() == 2 and lens.shape[1] > 1:  # vLLM's _per_sequence_context_lens
        lens = lens[:, -1].contiguous()
    deepgemm_fp8_paged_mqa_logits(
        case.q, case.kv_cache, case.weights, out, lens, case.block_table, max_model_len,
        ChunkK=256, Preshuffle=True, KVBlockSize=case.kv_cache.shape[1], WavePerEU=2,
    )  # fmt: skip
    return out


def gfx942_case(requests, next_n, context, heads, page_size, seed, ratio2=False):
    """1-D lengths, or (``ratio2``) 2-D ones as vLLM's builder makes them at compress ratio 2
    from uncompressed lengths odd and even: ``(L - next_n + 1 + j) // 2``, where an odd L ends
    a request's first row one past the dense logits AITER writes it."""
    lens = [context - 37 * i for i in range(requests)]
    row_ends = None
    if ratio2:
        full = [2 * n + 1 - i for i, n in enumerate(lens)]
        row_ends = [(n - next_n + 1 + j) // 2 for n in full for j in range(next_n)]
        lens = [n // 2 for n in full]
    return make_case(
        lens=lens, next_n=next_n, heads=heads, page_size=page_size, blocks=2048,
        per_row=ratio2, row_ends=row_ends, fp8=torch.float8_e4m3fnuz, device="cuda", seed=seed,
        drop=0.02,
    )  # fmt: skip


def test_aiter_gives_the_layout_choice():
    from aiter.ops.triton.gluon.pa_decode_gluon import get_cdna_version

    assert _cand_layout.FROM_AITER and get_cdna_version() == 3
    assert _cand_layout.own_use_2d_instr_shape() == bool(_cand_layout.USE_2D_INSTR_SHAPE)


@pytest.mark.parametrize("ratio2", [False, True])
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("page_size", cand_logits.AITER_PAGES)
@pytest.mark.parametrize(("requests", "next_n", "context"), STEPS)
def test_compact_rows_bit_identical_to_aiter(requests, next_n, context, heads, page_size, ratio2):
    case = gfx942_case(requests, next_n, context, heads, page_size, context + heads, ratio2)
    dense = aiter_dense_logits(case, max_model_len=context + 256)
    for stages in (0, 8):
        logits, ids = run_candidate_logits(case, stages_per_program=stages)
        live = ids >= 0
        assert live.sum() > 0
        want = torch.gather(dense, 1, ids.clamp_min(0).long())
        assert torch.equal(logits[live].view(torch.int32), want[live].view(torch.int32))
        assert torch.isneginf(logits[~live]).all()


def vllm_dense_top512(case, max_model_len: int) -> torch.Tensor:
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import _apply_candidate_mask_strided

    logits = aiter_dense_logits(case, max_model_len)
    rows = logits.shape[0]
    visible = case.seq_lens.reshape(-1)
    if visible.numel() != rows:
        visible = visible.repeat_interleave(case.next_n)
    visible = visible[:rows].to(torch.int64)
    _apply_candidate_mask_strided(
        logits, torch.zeros_like(visible), visible, case.candidates, case.cand_block
    )
    indices = torch.full((rows, 512), -5, dtype=torch.int32, device=logits.device)
    torch.ops._C.top_k_per_row_decode(
        logits, case.next_n, case.seq_lens, indices, rows, logits.stride(0), logits.stride(1), 512
    )
    return indices, logits


@pytest.mark.parametrize("ratio2", [False, True])
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize(("requests", "next_n", "context"), STEPS)
def test_hook_top512_equals_vllm_dense_path(requests, next_n, context, heads, ratio2):
    case = gfx942_case(requests, next_n, context, heads, 64, 3 * context + heads, ratio2)
    want, masked = vllm_dense_top512(case, max_model_len=context + 256)
    rows = want.shape[0]
    got = torch.full_like(want, -5)
    assert cand_logits.candidate_logits_top_k(
        case.q, case.kv_cache, case.weights, case.seq_lens, case.block_table, case.candidates,
        case.cand_block, got, 512, True, False,
    )  # fmt: skip
    for r in range(rows):
        n = min(max(case.ends[r], 0), 512)
        assert (got[r, n:] == -1).all() and (want[r, n:] == -1).all()
        a, b = got[r, :n].long(), want[r, :n].long()
        assert len(set(a.tolist())) == n
        va, vb = masked[r, a].sort().values, masked[r, b].sort().values
        assert torch.equal(va, vb)  # the same values: the sets differ at most by ties at the cut
        cut = vb[0]
        assert set(a[masked[r, a] > cut].tolist()) == set(b[masked[r, b] > cut].tolist())
