"""The ledger: every vLLM 0.33.0 symbol the plugin replaces, why, how, and what would remove it.

1. ``vllm.models.deepseek_v41.attention.DeepseekV4Indexer.attn_cls``
   - Why: DSv4.1's decode indexer (top-512, layer 20's candidate selection, the reader layers'
     candidate mask and logits) runs vLLM's generic ops on gfx942, about 0.5-0.7 ms a step at
     128k (``../shared/docs/performance-anchors.md``). The plugin's decode path replaces them there.
   - How: the ClassVar is set to a subclass of the ``SparseAttnIndexer`` it held
     (``indexer.make_indexer_cls``), whose ``forward_hip`` runs the plugin's decode path on a
     decode-only step and vLLM's ``rocm_aiter_sparse_attn_indexer`` on every other step
     (``super().forward_hip`` only with an MXFP4 cache or AITER off). Only DSv4.1's FP8 indexer is
     affected: DSv3.2 builds ``SparseAttnIndexer`` directly, the ROCm MXFP4 indexer and the
     ``--monokernel`` gfx942 indexer (``DeepseekV41Gfx942Indexer``) set their own ``attn_cls``
     and keep vLLM's classes. ``CustomOp.register_oot`` was not used: it is keyed by class name
     and would take every model's ``SparseAttnIndexer``; for the same reason the subclass
     builds another plugin's ``register_oot`` replacement of ``SparseAttnIndexer`` where one is
     registered, as vLLM would unpatched (one warning). Must land before the model is built
     (``CustomOp`` binds its forward in ``__init__``): vLLM loads general plugins in each worker
     before that.
   - Checked first: ``attn_cls`` is still vLLM's ``SparseAttnIndexer``; the parameters of
     ``SparseAttnIndexer.__init__`` and ``.forward_hip``, of ``rocm_aiter_sparse_attn_indexer``
     (whose decode branch the plugin's path reproduces and which serves every other step), of
     each vLLM op that decode branch calls, and of the indexer metadata it reads.
   - Removed by: an upstream hook for the indexer's decode top-k/logits (a registered
     ``top_k_per_row_decode`` backend), or vLLM enabling its in-tree gfx942 ops without
     ``--monokernel``.
   - Switch: ``DSV41_GFX942_TOPK`` (every hook of this patch runs its HIP kernels, the
     candidate logits' compact top-512 too); ``DSV41_GFX942_CAND_LOGITS`` turns the candidate
     logits off alone.
2. ``vllm.v1.worker.gpu.spec_decode.dspark.speculator.DSparkSpeculator._sample_sequential``
   - Why: vLLM's Markov loop launches about 9 kernels for each of the 5 draft steps (about
     220 us a decode step on MI325X); the plugin fuses each step to one launch.
   - How: a wrapper keeping vLLM's order (``speculator.make_sample_sequential``): the draft
     top-k path, the draft model's own ``sample_sequential`` hook (vLLM's ``--monokernel`` path
     serves there), then the plugin's fused launches, then vLLM's original method.
   - Checked first: it is still vLLM's own function (defined in that module, not wrapped),
     with the parameters ``(self, num_reqs, head_hidden)``; ``_sample_logits``, which the fused
     path calls to finish a step with vLLM's loop, has ``(self, logits, idx_map, sample_pos,
     step)``.
   - Removed by: vLLM fusing the Markov steps itself outside ``--monokernel``.
   - Switch: ``DSV41_GFX942_FUSED_MARKOV``.

With ``--monokernel`` on gfx942 vLLM's in-tree copy of these ops serves both places (its
indexer class bypasses patch 1, its draft model hook answers before patch 2's fused path), so
nothing runs twice; the log says which path serves. The plugin never imports that copy.
"""

from __future__ import annotations

from . import envs, patching
from .patching import Expect, Patch

_SAI = "vllm.model_executor.layers.sparse_attn_indexer:SparseAttnIndexer"
_ROCM_OP = "vllm.v1.attention.ops.rocm_aiter_mla_sparse:rocm_aiter_sparse_attn_indexer"
_SPEC = "vllm.v1.worker.gpu.spec_decode.dspark.speculator:DSparkSpeculator"
_ROCM = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
_COMMON = "vllm.v1.attention.ops.common"
_META = "vllm.v1.attention.backends.mla.indexer"
_AITER = "vllm._aiter_ops:rocm_aiter_ops"


def _make_indexer(original):
    from .indexer import make_indexer_cls

    return make_indexer_cls(original)


def _make_sampler(original):
    from .speculator import make_sample_sequential

    return make_sample_sequential(original)


INDEXER = Patch(
    module="vllm.models.deepseek_v41.attention",
    owner="DeepseekV4Indexer",
    attr="attn_cls",
    make=_make_indexer,
    expects=(
        Expect("vllm.models.deepseek_v41.attention:DeepseekV4Indexer.attn_cls", is_class=_SAI),
        Expect(
            f"{_SAI}.__init__",
            params=(
                "self", "k_cache", "quant_block_size", "scale_fmt", "topk_tokens", "head_dim",
                "max_model_len", "max_total_seq_len", "topk_indices_buffer",
                "skip_k_cache_insert", "use_fp4_cache", "compress_ratio", "candidate_blocks",
                "candidate_block_size", "candidate_write",
            ),
        ),
        Expect(f"{_SAI}.forward_hip", params=("self", "hidden_states", "q_quant", "k", "weights")),
        Expect(
            _ROCM_OP,
            params=(
                "hidden_states", "k_cache_prefix", "kv_cache", "q_fp8", "k", "weights",
                "quant_block_size", "scale_fmt", "topk_tokens", "head_dim", "max_model_len",
                "total_seq_lens", "topk_indices_buffer", "skip_k_cache_insert",
                "compress_ratio", "candidate_blocks", "candidate_block_size", "candidate_write",
            ),
        ),
        # What the plugin's indexer module imports from vLLM besides the above (a missing one
        # would fail building the patch after these checks, and the plugin would register
        # neither patch).
        Expect("vllm.compilation.breakable_cudagraph:eager_break_during_capture", params=("fn",)),
        Expect("vllm.forward_context:get_forward_context", params=()),
        Expect("vllm.config:CUDAGraphMode.FULL"),
        Expect("vllm.model_executor.custom_op:op_registry_oot.get"),  # other plugins' ops
        # What the plugin's decode path (indexer.decode_step) calls or reads of vLLM.
        Expect(f"{_ROCM}:rocm_fp8_paged_mqa_logits", params=(
            "q_fp8", "kv_cache_fp8", "weights", "context_lens", "block_tables",
            "schedule_metadata", "max_model_len", "compress_ratio")),
        Expect(f"{_ROCM}:_apply_candidate_mask_strided", params=(
            "logits", "row_ks", "row_ke", "candidate_blocks", "block_size", "row_repeat")),
        Expect(f"{_ROCM}:_indexer_k_is_c4a_block_flat", params=("compress_ratio",)),
        Expect(f"{_ROCM}:paged_mqa_logits_module", params=()),
        Expect(f"{_ROCM}:_max_decode_logits_rows", params=("num_batched_tokens",)),
        Expect(f"{_AITER}.is_enabled", params=("cls",)),
        Expect(f"{_AITER}.is_indexer_top_k_supported", params=(
            "is_prefill", "compress_ratio", "num_rows", "max_valid_seq_len", "topk_tokens")),
        Expect(f"{_AITER}.dsv4_indexer_prefers_native_top_k", params=(
            "num_rows", "num_columns", "topk_tokens")),
        Expect(f"{_AITER}.indexer_top_k_decode", params=(
            "logits", "next_n", "seq_lens", "topk_indices", "topk_tokens")),
        Expect("vllm.model_executor.layers.sparse_attn_indexer:_select_candidate_blocks",
               params=("logits", "row_ks", "row_ke", "topk_blocks", "block_size", "out",
                       "row_repeat")),
        Expect(f"{_COMMON}:pack_seq_triton",
               params=("x", "lengths", "pad_value", "block_t", "block_d")),
        Expect(f"{_COMMON}:unpack_seq_triton",
               params=("packed_tensor", "lengths", "block_t", "block_d")),
        Expect(f"{_META}:DeepseekV32IndexerMetadata", params=(
            "seq_lens", "max_seq_len", "slot_mapping", "num_decodes", "num_decode_tokens",
            "num_prefills", "num_prefill_tokens", "decode", "prefill", "positions",
            "block_table")),
        Expect(f"{_META}:DeepSeekV32IndexerDecodeMetadata", params=(
            "block_table", "seq_lens", "decode_lens", "requires_padding", "schedule_metadata",
            "global_seq_lens", "per_req_decode_lens", "decode_is_uniform",
            "write_max_decode_len", "indices")),
    ),
)  # fmt: skip

SAMPLER = Patch(
    module="vllm.v1.worker.gpu.spec_decode.dspark.speculator",
    owner="DSparkSpeculator",
    attr="_sample_sequential",
    make=_make_sampler,
    expects=(
        Expect(
            f"{_SPEC}._sample_sequential",
            params=("self", "num_reqs", "head_hidden"),
            vllms_own=True,
        ),
        # Called by fused_markov._loop_rest, past the step's base logits, where an error is
        # vLLM's own and goes to vLLM.
        Expect(
            f"{_SPEC}._sample_logits", params=("self", "logits", "idx_map", "sample_pos", "step")
        ),
    ),
)

#: Every patch with the hook families that want it (applied when any of them is on).
PATCHES: tuple[tuple[Patch, tuple[str, ...]], ...] = (
    (INDEXER, ("topk",)),
    (SAMPLER, ("fused_markov",)),
)


def wanted(families: tuple[str, ...]) -> str | None:
    """Why a patch for ``families`` is off by the env switches, or None if it is wanted."""
    if any(envs.enabled(f) for f in families):
        return None
    if envs.disabled():
        return "turned off by DSV41_GFX942_DISABLE"
    # The value as set (a value that is not a boolean reads as off: envs.get_bool).
    names = (envs.FAMILIES[f] for f in families)
    return "turned off by " + " and ".join(f"{n}={envs.value_as_set(n)}" for n in names)


def apply_all() -> dict[str, str]:
    """Apply every wanted patch that fits; {target: "applied" or why not}."""
    results = {}
    for patch, families in PATCHES:
        off = wanted(families)
        if off is not None:
            results[patch.target] = off
        elif patch.target in patching.applied():
            results[patch.target] = "already applied"
        else:
            results[patch.target] = "applied" if patching.apply(patch) else patching.check(patch)
    return results


def check_all() -> dict[str, str | None]:
    """Without patching: {target: None if it would apply on this vLLM, else why not}."""
    return {patch.target: wanted(families) or patching.check(patch) for patch, families in PATCHES}
