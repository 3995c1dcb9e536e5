"""A whole DSv4.1 indexer decode step: the 8 index layers (2, 8, 14 plain; 20 the candidate
writer; 24-36 readers), through the plugin's decode path and through vLLM's decode branch, for
``tests/test_indexer_gpu.py`` and ``benchmarks/bench_indexer_step.py`` on a GPU, and for
``benchmarks/bench_host.py`` on the CPU (which also makes the device ops no-ops).

What does not run off gfx942 is replaced on both sides alike: AITER's paged logits by fixed
random logits per layer (stale garbage past each row's end, as AITER leaves it), and, where
vLLM's compiled library is not loaded (its C++ ``top_k_per_row_decode`` is then absent: on the
CPU, or a GPU without it), that top-k by a torch transcription of its contract. vLLM's Triton
candidate selection and mask run for real. The plugin's hooks are the real ones (the HIP
kernels' sm_90 build on an NVIDIA GPU); the candidate-logits hook is gfx942-only and declines
elsewhere.
"""

from __future__ import annotations

import functools
import types

import torch

LAYERS = ((2, "plain"), (8, "plain"), (14, "plain"), (20, "writer"), (24, "reader"),
          (28, "reader"), (32, "reader"), (36, "reader"))  # fmt: skip
TOPK, CAND_BLOCKS, CB = 512, 2048, 8


def torch_top_k_per_row_decode(logits, next_n, seq_lens, out, rows, stride0, stride1, k):
    """vLLM's ``top_k_per_row_decode`` contract in torch (GPU, capturable; the 512 ids in no
    order, as vLLM's op leaves them)."""
    width = logits.shape[1]
    if seq_lens.dim() == 2:
        ends = seq_lens.reshape(-1)[:rows].long()
    else:
        r = torch.arange(rows, device=logits.device)
        ends = seq_lens[r // next_n].long() - next_n + r % next_n + 1
    ends = ends.clamp(min=0)
    col = torch.arange(width, device=logits.device)
    top = (
        logits[:rows]
        .masked_fill(col >= ends[:, None], float("-inf"))
        .topk(k, dim=1, sorted=False)
        .indices
    )
    ar = torch.arange(k, device=logits.device)
    short = torch.where(ar < ends[:, None], ar, -1)
    out[:rows] = torch.where(ends[:, None] <= k, short, top).to(out.dtype)


@functools.cache
def vllm_top_k_loaded() -> bool:
    """Whether vLLM's compiled ``top_k_per_row_decode`` is registered here, once vLLM's
    libraries are loaded (as vLLM's platform loads them; its CUDA build registers the op in
    ``_C_stable_libtorch``; which of its libraries a ROCm build registers it in is not read
    here): on an NVIDIA GPU with vLLM's CUDA library, on gfx942 with its ROCm build; not on a
    CPU, where none of them loads."""
    import contextlib
    import importlib

    for name in ("vllm._C_stable_libtorch", "vllm._C", "vllm._rocm_C"):
        # absent, no driver, its ops already defined
        with contextlib.suppress(ImportError, OSError, RuntimeError):
            importlib.import_module(name)
    try:  # the registry, not torch.ops._C's attributes (which a test's monkeypatch may set)
        torch._C._dispatch_find_schema_or_throw("_C::top_k_per_row_decode", "")
    except RuntimeError:
        return False
    return True


class Step:
    """Buffers and metadata of one decode step of ``requests`` x ``next_n`` flattened rows
    (DSpark: one row a request position, 2-D ``(T, 1)`` lengths), contexts up to ``width``."""

    def __init__(self, requests: int, next_n: int, width: int, seed: int = 0, device="cuda"):
        from vllm.v1.attention.backends.mla.indexer import (
            DeepSeekV32IndexerDecodeMetadata,
            DeepseekV32IndexerMetadata,
        )

        self.device = dev = device
        self.rows = rows = requests * next_n
        self.width, self.next_n = width, next_n
        g = torch.Generator(device=dev).manual_seed(seed)
        self.logits = {lid: torch.randn(rows, width, device=dev, generator=g) for lid, _ in LAYERS}
        self.seq_lens = torch.empty(rows, 1, dtype=torch.int32, device=dev)
        self.set_lengths(torch.full((requests,), width, dtype=torch.int32))
        decode = DeepSeekV32IndexerDecodeMetadata(
            block_table=torch.zeros(rows, 1, dtype=torch.int32, device=dev),
            seq_lens=self.seq_lens, decode_lens=torch.ones(rows, dtype=torch.int32, device=dev),
            requires_padding=False, schedule_metadata=torch.zeros(1, dtype=torch.int32,
                                                                  device=dev))  # fmt: skip
        self.meta = DeepseekV32IndexerMetadata(
            seq_lens=self.seq_lens.view(-1), max_seq_len=width, slot_mapping=torch.zeros(
                rows, dtype=torch.int64, device=dev), num_decodes=rows, num_decode_tokens=rows,
            num_prefills=0, num_prefill_tokens=0, decode=decode)  # fmt: skip
        self.q = torch.zeros(rows, 1, 8, device=dev)  # [rows, heads, dim]: read by no stand-in
        self.weights = torch.ones(rows, 1, device=dev)

    def set_lengths(self, per_request: torch.Tensor) -> None:
        """Each request's length; its draft rows end causally before it (in place)."""
        n = self.next_n
        r = torch.arange(self.rows)
        ends = per_request[r // n] - n + r % n + 1
        self.seq_lens.copy_(ends.clamp(min=1).view(-1, 1))

    def layers(self) -> list:
        """Stand-in layers with the attributes the decode path reads; the writer and readers
        share one candidate buffer, as in the model."""
        from dsv41_gfx942_plugin import indexer

        cands = torch.full((self.rows, CAND_BLOCKS), -1, dtype=torch.int32, device=self.device)
        indexer.note_candidate_writer(cands, self.width)  # as the writer's build does
        return [self._layer(lid, kind, cands) for lid, kind in LAYERS]

    def _layer(self, lid: int, kind: str, cands: torch.Tensor):
        return types.SimpleNamespace(
            k_cache=types.SimpleNamespace(prefix=f"layers.{lid}",
                                          kv_cache=torch.zeros(1, 64, 132, dtype=torch.uint8,
                                                               device=self.device)),
            topk_indices_buffer=torch.full((self.rows, TOPK), 7777, dtype=torch.int32,
                                           device=self.device),
            topk_tokens=TOPK, max_model_len=self.width, compress_ratio=1,
            skip_k_cache_insert=True,  # the model wrote the K cache, as in DeepSeek-V4.1
            candidate_blocks=None if kind == "plain" else cands,
            candidate_block_size=CB, candidate_write=kind == "writer",
            dsv41_topk=True, dsv41_cand_logits=True)  # fmt: skip


class Patch:
    """pytest's monkeypatch for scripts (setattr only, never undone: one process)."""

    def setattr(self, obj, name, value, raising=True):
        setattr(obj, name, value)


def install_stand_ins(monkeypatch, step: Step, full_graph: bool = True):
    """AITER's logits and, where vLLM's library has not registered it, vLLM's C++ top-k
    replaced by their stand-ins; the forward context (FULL graphs: host choices must hold at
    every replay) given to both paths."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    from dsv41_gfx942_plugin import indexer

    current = {}
    mode = CUDAGraphMode.FULL if full_graph else CUDAGraphMode.NONE

    def logits(*args, **kwargs):
        return current["logits"]

    def context():
        return types.SimpleNamespace(attn_metadata={current["prefix"]: step.meta},
                                     cudagraph_runtime_mode=mode)  # fmt: skip

    monkeypatch.setattr(rocm, "rocm_fp8_paged_mqa_logits", logits)
    # AITER's logits module "imports", as on a gfx942 server with AITER (vLLM's probe raises
    # where AITER is not installed at all).
    aiter_logits = types.ModuleType("aiter.ops.triton.pa_mqa_logits")
    monkeypatch.setattr(rocm, "paged_mqa_logits_module", lambda: aiter_logits)
    monkeypatch.setattr(rocm, "get_forward_context", context)
    monkeypatch.setattr(indexer, "get_forward_context", context)
    if not vllm_top_k_loaded():
        monkeypatch.setattr(torch.ops._C, "top_k_per_row_decode", torch_top_k_per_row_decode,
                            raising=False)  # fmt: skip
    return current


def run_step(step: Step, layers, current, plugin: bool) -> None:
    """All 8 layers of one decode step, in model order."""
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import rocm_aiter_sparse_attn_indexer

    from dsv41_gfx942_plugin import indexer

    for (lid, _), layer in zip(LAYERS, layers, strict=True):
        current["logits"], current["prefix"] = step.logits[lid], layer.k_cache.prefix
        if plugin:
            indexer.decode_step(layer, step.meta, step.rows, step.q, step.weights)
        else:
            rocm_aiter_sparse_attn_indexer(
                step.q, layer.k_cache.prefix, layer.k_cache.kv_cache, step.q, None,
                step.weights, 128, "ue8m0", TOPK, 8,
                step.width, step.width, layer.topk_indices_buffer,
                skip_k_cache_insert=True, compress_ratio=1,
                candidate_blocks=layer.candidate_blocks, candidate_block_size=CB,
                candidate_write=layer.candidate_write)  # fmt: skip
