"""The patched DSv4.1 indexer's decode path on vLLM 0.33.0's real objects, on the CPU.

The layer is the plugin's subclass of vLLM's real ``SparseAttnIndexer``, driven through
``forward_hip`` under vLLM's real ``set_forward_context`` with real ``DeepseekV32IndexerMetadata``.
The oracle is vLLM's real ``rocm_aiter_sparse_attn_indexer`` on the same inputs. vLLM's Triton
pieces run for real in the interpreter (pack/unpack of padded rows, the candidate mask); what
cannot run on a CPU is replaced, for both sides alike, by torch references with the same contract
(``tests/ref_indexer.py``): AITER's paged logits, vLLM's C++ ``top_k_per_row_decode`` and its
CUDA-only candidate selection. No code object runs on a CPU, so the plugin's hooks are replaced
by reference hooks that take the call; then by hooks that decline, where vLLM's op must run at
each place.
"""

from __future__ import annotations

import os
import types
import weakref

import pytest
import torch

import ref_indexer as ref
from dsv41_gfx942_plugin import cand_probe, counters, indexer
from dsv41_gfx942_plugin.ops import topk

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("CUDA_VISIBLE_DEVICES") != "",
    reason="vLLM's Triton pieces run on the CPU only with CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1",
)

HEADS, DIM, WIDTH, CB = 4, 16, 8192, 8
_REAL_CAND_HOOK = topk.candidate_logits_top_k  # imports the Gluon kernels at its first call
TOTAL = 5 * WIDTH  # the layers' max_total_seq_len (vLLM's prefill bound): not their width
PREFIX = "model.layers.{}.attn.indexer.k_cache"


@pytest.fixture
def vllm_env(monkeypatch, clean_plugin):
    """vLLM's config, its CPU-impossible ops replaced by references, and a call log."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers import sparse_attn_indexer as sai
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    calls: list[str] = []
    logits_ref = ref.PagedLogits(WIDTH)

    def spy(name, fn):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        return wrapper

    mask = rocm._apply_candidate_mask_strided
    monkeypatch.setattr(rocm, "rocm_fp8_paged_mqa_logits", spy("vllm:logits", logits_ref))
    monkeypatch.setattr(rocm, "_apply_candidate_mask_strided", spy("vllm:mask", mask))
    monkeypatch.setattr(sai, "_select_candidate_blocks",
                        spy("vllm:select", ref.vllm_select_candidate_blocks))  # fmt: skip
    monkeypatch.setattr(torch.ops._C, "top_k_per_row_decode",
                        spy("vllm:topk", ref.top_k_per_row_decode), raising=False)  # fmt: skip
    monkeypatch.setattr(indexer, "_aiter_enabled", lambda: True)
    aiter_logits = types.ModuleType("aiter.ops.triton.pa_mqa_logits")  # as on a gfx942 server
    monkeypatch.setattr(rocm, "paged_mqa_logits_module", lambda: aiter_logits)
    monkeypatch.setattr(topk, "build", lambda: True)  # "the code object is loaded"
    # As after the process's first reader call compared the candidate logits with vLLM's
    # (tests of that comparison set it back): one kernel variant, compared equal.
    monkeypatch.setattr(indexer, "_cand_variant", lambda *args: "compared")
    monkeypatch.setattr(indexer, "_cand_verdict", {"compared": True})
    monkeypatch.setattr(indexer, "_off", {})
    monkeypatch.setattr(indexer, "_candidate_writers", {})  # make_layer records its writers
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        yield types.SimpleNamespace(config=config, calls=calls, spy=spy, logits=logits_ref)


def install_hooks(monkeypatch, env, take: bool):
    """Reference hooks that take every call (``take``) or decline every call."""
    hooks = {
        "decode_top_k": ref.decode_top_k,
        "select_candidates": ref.select_candidates,
        "candidate_top_k": ref.candidate_top_k,
        "candidate_logits_top_k": ref.CandidateLogitsTopK(env.logits),
    }
    for name, fn in hooks.items():
        impl = fn if take else (lambda *a, **k: False)
        monkeypatch.setattr(topk, name, env.spy(f"hook:{name}", impl), raising=False)


def make_layer(env, kind: str, rows: int, noted: bool = True):
    """A layer of ``kind``; a reader's candidates recorded as a writer's (``noted``)."""
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    cls = indexer.make_indexer_cls(SparseAttnIndexer)
    layer_id = {"writer": 20, "reader": 24, "plain": 2}[kind]
    kv = types.SimpleNamespace(prefix=PREFIX.format(layer_id),
                               kv_cache=torch.zeros(8, 64, DIM + 4, dtype=torch.uint8))  # fmt: skip
    buf = torch.full((rows + 4, 512), 7777, dtype=torch.int32)
    cands = None
    if kind != "plain":
        g = torch.Generator().manual_seed(3)
        cands = torch.randint(-1, WIDTH // CB, (rows + 4, 2048), generator=g, dtype=torch.int32)
    layer = cls(kv, 128, "ue8m0", 512, DIM, WIDTH, TOTAL, buf, skip_k_cache_insert=True,
                compress_ratio=1, candidate_blocks=cands, candidate_block_size=CB,
                candidate_write=kind == "writer")  # fmt: skip
    if kind == "reader" and noted:  # as where layer 20, built before it, fills its candidates
        indexer.note_candidate_writer(cands, WIDTH)
    return layer


def make_step(case: str, seed: int = 0):
    """(metadata fields, num_tokens): decode rows of one of vLLM's shapes."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([5000, 300, 7000, 6100], dtype=torch.int32)
    if case == "dspark_flat":  # next_n = 6 flattened: (T, 1) lengths, one row a request
        seq = torch.stack([lens[r // 6] - 6 + r % 6 + 1 for r in range(24)]).view(-1, 1)
        decode_lens, padded, n_dec = torch.ones(24, dtype=torch.int32), False, 24
    elif case == "mtp_2d":  # next_n = 2 native: (B, 2) lengths
        seq = torch.stack([lens - 1, lens], dim=1)
        decode_lens, padded, n_dec = torch.full((4,), 2, dtype=torch.int32), False, 8
    elif case == "mtp_2d_odd":  # the same compressed at ratio 2 from odd lengths (2L + 1)
        seq = torch.stack([lens, lens], dim=1)  # row 0 one past AITER's dense logits
        decode_lens, padded, n_dec = torch.full((4,), 2, dtype=torch.int32), False, 8
    elif case == "padded":  # a short prefill chunk counted as a decode: rows packed per request
        seq = torch.stack([lens - 1, lens], dim=1)
        decode_lens, padded, n_dec = torch.tensor([2, 1, 2, 2], dtype=torch.int32), True, 7
    elif case == "lens_1d":  # one length per request, next_n = 2
        seq = lens.clone()
        decode_lens, padded, n_dec = torch.full((4,), 2, dtype=torch.int32), False, 8
    else:
        raise ValueError(case)
    q = (torch.randn(n_dec, HEADS, DIM, generator=g) * 2).to(torch.float16)
    return seq, decode_lens, padded, n_dec, q


def metadata(seq, decode_lens, padded, n_dec, prefills=0):
    from vllm.v1.attention.backends.mla.indexer import (
        DeepSeekV32IndexerDecodeMetadata,
        DeepseekV32IndexerMetadata,
    )

    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=torch.zeros(decode_lens.numel(), 4, dtype=torch.int32), seq_lens=seq,
        decode_lens=decode_lens, requires_padding=padded,
        schedule_metadata=torch.zeros(1, dtype=torch.int32))  # fmt: skip
    return DeepseekV32IndexerMetadata(
        seq_lens=seq.reshape(-1), max_seq_len=int(seq.max()),
        slot_mapping=torch.zeros(n_dec, dtype=torch.int64), num_decodes=decode_lens.numel(),
        num_decode_tokens=n_dec, num_prefills=prefills, num_prefill_tokens=0,
        decode=decode)  # fmt: skip


def run(env, layer, meta, q, num_tokens, mode=None, plugin=True):
    """One step of ``layer``: the plugin's forward_hip, or vLLM's op (the oracle)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import rocm_aiter_sparse_attn_indexer

    hidden = torch.zeros(num_tokens, 1)
    qpad = torch.zeros(num_tokens, HEADS, DIM, dtype=q.dtype)
    qpad[: q.shape[0]] = q
    weights = torch.ones(num_tokens, HEADS)
    with set_forward_context({layer.k_cache.prefix: meta}, env.config,
                             cudagraph_runtime_mode=mode or CUDAGraphMode.NONE):  # fmt: skip
        if plugin:
            return layer.forward_hip(hidden, qpad, None, weights)
        return rocm_aiter_sparse_attn_indexer(
            hidden, layer.k_cache.prefix, layer.k_cache.kv_cache, qpad, None, weights,
            layer.quant_block_size, layer.scale_fmt, layer.topk_tokens, layer.head_dim,
            layer.max_model_len, layer.max_total_seq_len, layer.topk_indices_buffer,
            skip_k_cache_insert=True, compress_ratio=layer.compress_ratio,
            candidate_blocks=layer.candidate_blocks,
            candidate_block_size=layer.candidate_block_size,
            candidate_write=layer.candidate_write)  # fmt: skip


def pair(env, kind, case, num_tokens=None):
    seq, decode_lens, padded, n_dec, q = make_step(case)
    num_tokens = num_tokens or n_dec
    plugin_layer = make_layer(env, kind, num_tokens)
    oracle_layer = make_layer(env, kind, num_tokens)
    meta = metadata(seq, decode_lens, padded, n_dec)
    return plugin_layer, oracle_layer, meta, q, num_tokens


def assert_same_rows(got, want):
    """Equal top-k buffers: each row's entries as a multiset (order is free), its -1 entries
    where vLLM's are."""
    assert got.shape == want.shape
    for r in range(got.shape[0]):
        g, w = got[r].tolist(), want[r].tolist()
        assert sorted(g) == sorted(w), f"row {r}"
        assert [x == -1 for x in g] == [x == -1 for x in w], f"row {r}: -1 entries"


@pytest.mark.parametrize("case", ["dspark_flat", "mtp_2d", "mtp_2d_odd", "padded", "lens_1d"])
@pytest.mark.parametrize("kind", ["plain", "writer", "reader"])
def test_taking_hooks_match_vllm_decode_branch(vllm_env, monkeypatch, kind, case):
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, kind, case)
    install_hooks(monkeypatch, vllm_env, take=True)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    vllm_env.calls.clear()
    run(vllm_env, plugin_layer, meta, q, n)
    got = plugin_layer.topk_indices_buffer
    want = oracle_layer.topk_indices_buffer
    rows = meta.num_decode_tokens
    assert_same_rows(got[:rows], want[:rows])
    assert torch.equal(got[rows:], want[rows:])  # untouched beyond the step
    if kind != "plain":  # so are the candidate rows past the step's (vLLM hands over its rows)
        assert torch.equal(plugin_layer.candidate_blocks[rows:],
                           oracle_layer.candidate_blocks[rows:])  # fmt: skip
    if kind == "writer":
        for r in range(rows if not meta.decode.requires_padding else 0):
            assert set(plugin_layer.candidate_blocks[r].tolist()) == set(
                oracle_layer.candidate_blocks[r].tolist())  # fmt: skip
    expected = {
        "plain": ["vllm:logits", "hook:decode_top_k"],
        "writer": ["vllm:logits", "hook:select_candidates", "hook:decode_top_k"],
        "reader": ["vllm:logits", "hook:candidate_top_k"],
    }[kind]
    if kind == "reader" and case != "padded":  # the candidate logits take all but these
        expected = ["hook:candidate_logits_top_k"]
    assert vllm_env.calls == expected
    assert counters.stats()["indexer_decode"]["taken"] == 1


@pytest.mark.parametrize("writer", ["none", "wider", "freed"])
def test_reader_of_candidates_no_writer_here_fills_takes_vllms_mask(
    vllm_env, monkeypatch, plugin_log, writer
):
    """The candidate hooks take only what layer 20 writes before the readers: distinct block
    ids inside the reader's width. A buffer that no writer layer of this process fills ("freed":
    a writer's buffer gone, another at its address) or that a writer with wider logits fills
    may hold a repeated id and ids past the reader's width, for
    which vLLM's mask keeps the row's last column. Its reader takes vLLM's logits, mask and the
    top-k, and gets vLLM's index sets (that last column among them); neither candidate hook
    runs; the reason is counted and warned once."""
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    seq = torch.tensor([[WIDTH], [WIDTH - 5], [WIDTH]], dtype=torch.int32)
    n = seq.shape[0]
    meta = metadata(seq, torch.ones(n, dtype=torch.int32), False, n)
    q = torch.zeros(n, HEADS, DIM, dtype=torch.float16)
    logits = torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(5))
    logits[:, WIDTH - 1] = 50.0  # the row's last column, in no candidate block
    monkeypatch.setattr(rocm, "rocm_fp8_paged_mqa_logits", lambda *a, **k: logits.clone())
    cands = torch.full((n, 2048), -1, dtype=torch.int32)
    cands[:, :200] = torch.arange(200, dtype=torch.int32) * 3  # 1,600 live columns a row
    cands[:, 200:202] = torch.tensor([3, WIDTH // CB + 7])  # a repeat; one past the width
    if writer == "wider":
        indexer.note_candidate_writer(cands, 2 * WIDTH)
    elif writer == "freed":
        indexer._candidate_writers[id(cands)] = (weakref.ref(torch.empty(0)), WIDTH)
    plugin_layer, oracle_layer = (make_layer(vllm_env, "reader", n) for _ in range(2))
    plugin_layer.candidate_blocks, oracle_layer.candidate_blocks = cands, cands.clone()
    install_hooks(monkeypatch, vllm_env, take=True)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    vllm_env.calls.clear()
    run(vllm_env, plugin_layer, meta, q, n)
    want = oracle_layer.topk_indices_buffer[:n]
    assert (want == WIDTH - 1).any(1).tolist() == [True, False, True]  # vLLM's edge column
    assert_same_rows(plugin_layer.topk_indices_buffer[:n], want)
    assert vllm_env.calls == ["vllm:mask", "hook:decode_top_k"]
    why = {"wider": "its candidates come from a writer layer with wider logits"}.get(
        writer, "no writer layer of this process fills its candidates"
    )
    stats = counters.stats()
    for name in ("candidate_logits_top_k", "candidate_top_k"):
        assert stats[name] == {"taken": 0, "declined": 1, "reasons": {why: 1}}
    warned = [r for r in plugin_log.records if why in r.getMessage()]
    assert len(warned) == 2 and all(r.levelname == "WARNING" for r in warned)  # one a hook
    run(vllm_env, plugin_layer, meta, q, n)
    assert len([r for r in plugin_log.records if why in r.getMessage()]) == 2


def test_only_a_writer_layer_records_the_candidates_it_fills(vllm_env):
    """Building a reader records nothing: its buffer counts as filled only once a writer layer
    (layer 20) of this process was built over it, at its width or narrower."""
    reader = make_layer(vllm_env, "reader", 3, noted=False)
    assert not reader.candidate_write and reader.candidate_blocks is not None
    why = "no writer layer of this process fills its candidates"
    assert indexer._why_not_candidates(reader) == why
    writer = make_layer(vllm_env, "writer", 3)
    reader.candidate_blocks = writer.candidate_blocks
    assert indexer._why_not_candidates(reader) is None


@pytest.mark.parametrize("case", ["mtp_2d", "lens_1d"])
@pytest.mark.parametrize("kind", ["plain", "writer", "reader"])
def test_declining_hooks_leave_vllms_op_at_each_place(vllm_env, monkeypatch, kind, case):
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, kind, case)
    install_hooks(monkeypatch, vllm_env, take=False)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    oracle_calls = list(vllm_env.calls)
    vllm_env.calls.clear()
    run(vllm_env, plugin_layer, meta, q, n)
    assert torch.equal(plugin_layer.topk_indices_buffer, oracle_layer.topk_indices_buffer)
    assert [c for c in vllm_env.calls if c.startswith("vllm:")] == oracle_calls
    declined = {"taken": 0, "declined": 1, "reasons": {"declined by the hook": 1}}
    assert counters.stats()["decode_top_k"] == declined
    hooks = [c for c in vllm_env.calls if c.startswith("hook:")]
    assert hooks == {"plain": ["hook:decode_top_k"],
                     "writer": ["hook:select_candidates", "hook:decode_top_k"],
                     "reader": ["hook:candidate_logits_top_k", "hook:candidate_top_k",
                                "hook:decode_top_k"]}[kind]  # fmt: skip


def install_aiter_top_k(monkeypatch, env, supported: bool, native: bool) -> dict:
    """vLLM's choice of AITER's decode top-k (gfx950-only) made by spies: AITER's top-k is
    ``supported``, the in-tree kernel preferred (``native``); AITER's kernel writes 4242. Returns
    the arguments each spy gets, per call."""
    from vllm._aiter_ops import rocm_aiter_ops

    asked = {"supported": [], "native": [], "kernel": []}

    def kernel(logits, next_n, seq_lens, out, topk_tokens):
        asked["kernel"].append((logits.clone(), next_n, seq_lens, out, topk_tokens))
        out.fill_(4242)

    monkeypatch.setattr(rocm_aiter_ops, "is_indexer_top_k_supported",
                        lambda **kw: asked["supported"].append(kw) or supported)  # fmt: skip
    monkeypatch.setattr(rocm_aiter_ops, "dsv4_indexer_prefers_native_top_k",
                        lambda **kw: asked["native"].append(kw) or native)  # fmt: skip
    monkeypatch.setattr(rocm_aiter_ops, "indexer_top_k_decode", env.spy("aiter:topk", kernel))
    return asked


def aiter_pair(env, monkeypatch, supported, native, mode=None, ratio=1):
    """One plain next_n = 2 step through vLLM's op, then the plugin, under the spies above
    (the hooks take): (plugin layer, oracle layer, metadata, vLLM's asks, the plugin's asks)."""
    plugin_layer, oracle_layer, meta, q, n = pair(env, "plain", "mtp_2d")
    plugin_layer.compress_ratio = oracle_layer.compress_ratio = ratio
    install_hooks(monkeypatch, env, take=True)
    asked = install_aiter_top_k(monkeypatch, env, supported, native)
    run(env, oracle_layer, meta, q, n, mode=mode, plugin=False)
    by_vllm = {k: v[:] for k, v in asked.items()}
    for calls in (*asked.values(), env.calls):
        calls.clear()
    run(env, plugin_layer, meta, q, n, mode=mode)
    return plugin_layer, oracle_layer, meta, by_vllm, asked


def test_aiter_top_k_called_as_vllm_calls_it(vllm_env, monkeypatch):
    """Where vLLM takes AITER's indexer top-k, the plugin calls it with vLLM's arguments (one
    row a query: next_n 1, the lengths flattened), does not ask its top-512 hook, counts why."""
    layer, _, meta, by_vllm, asked = aiter_pair(vllm_env, monkeypatch, True, False)
    assert vllm_env.calls == ["vllm:logits", "aiter:topk"]
    assert len(asked["kernel"]) == len(by_vllm["kernel"]) == 1
    (logits, next_n, seq_lens, out, k), want = asked["kernel"][0], by_vllm["kernel"][0]
    assert torch.equal(logits, want[0]) and next_n == want[1] == 1
    assert torch.equal(seq_lens, want[2]) and torch.equal(seq_lens, meta.decode.seq_lens.view(-1))
    buf = layer.topk_indices_buffer
    assert out.shape == want[3].shape == (8, 512) and out.data_ptr() == buf.data_ptr()
    assert k == want[4] == 512
    assert (buf[:8] == 4242).all() and (buf[8:] == 7777).all()
    assert counters.stats()["decode_top_k"] == {
        "taken": 0, "declined": 1, "reasons": {"AITER's indexer top-k serves": 1}}  # fmt: skip


@pytest.mark.parametrize("full", [False, True])
def test_aiter_top_k_asked_with_vllms_length_bound(vllm_env, monkeypatch, full):
    """vLLM bounds the lengths by max_model_len under FULL graphs (a bound for every replay),
    else by this step's compressed max_seq_len: the plugin asks AITER's check the same."""
    from vllm.config import CUDAGraphMode

    mode = CUDAGraphMode.FULL if full else CUDAGraphMode.NONE
    _, _, meta, by_vllm, asked = aiter_pair(vllm_env, monkeypatch, False, False, mode, ratio=4)
    bound = WIDTH if full else meta.max_seq_len // 4
    assert len({WIDTH, meta.max_seq_len, meta.max_seq_len // 4}) == 3  # bounds that differ
    want = dict(is_prefill=False, compress_ratio=4, num_rows=8, max_valid_seq_len=bound,
                topk_tokens=512)  # fmt: skip
    assert asked["supported"] == by_vllm["supported"] == [want]


@pytest.mark.parametrize(("supported", "native"), [(False, False), (True, True)])
def test_native_top_k_where_vllm_keeps_it(vllm_env, monkeypatch, supported, native):
    """Where AITER's top-k is unsupported or the in-tree kernel is preferred, the plugin's
    top-512 hook takes vLLM's place and gives vLLM's sets."""
    layer, oracle, _, by_vllm, asked = aiter_pair(vllm_env, monkeypatch, supported, native)
    assert vllm_env.calls == ["vllm:logits", "hook:decode_top_k"]
    assert asked == by_vllm and not asked["kernel"]
    assert asked["native"] == ([dict(num_rows=8, num_columns=WIDTH, topk_tokens=512)]
                               if supported else [])  # fmt: skip
    assert_same_rows(layer.topk_indices_buffer, oracle.topk_indices_buffer)
    assert counters.stats()["decode_top_k"]["taken"] == 1


@pytest.mark.parametrize("compared", [True, False])
def test_candidate_logits_declined_where_vllm_takes_its_torch_logits(vllm_env, monkeypatch,
                                                                     compared):  # fmt: skip
    """Without AITER's paged-MQA logits module vLLM computes the dense logits with its torch
    reference, which the candidate logits do not mirror: the hook is told so and declines, and
    the reader takes vLLM's logits and the candidate top-k. A variant not compared yet is told
    so at its probe too, which then judges nothing (vLLM's path keeps that variant)."""
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    monkeypatch.setattr(rocm, "paged_mqa_logits_module", lambda: None)
    if not compared:
        monkeypatch.setattr(indexer, "_cand_verdict", {})
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    told = []
    take = topk.candidate_logits_top_k
    monkeypatch.setattr(topk, "candidate_logits_top_k",
                        lambda *a: told.append(a[9]) or take(*a))  # fmt: skip
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    vllm_env.calls.clear()
    run(vllm_env, plugin_layer, meta, q, n)
    assert told == [False]
    assert vllm_env.calls == ["hook:candidate_logits_top_k", "vllm:logits", "hook:candidate_top_k"]
    assert_same_rows(plugin_layer.topk_indices_buffer[: meta.num_decode_tokens],
                     oracle_layer.topk_indices_buffer[: meta.num_decode_tokens])  # fmt: skip
    assert indexer._cand_verdict == {"compared": compared}


# The calls of a probe (cand_probe.probe_step): the stand-in kernel hands the check its compact
# rows, and the check asks vLLM's dense logits of the same synthetic step.
PROBE = ["hook:candidate_logits_top_k", "vllm:logits"]


@pytest.mark.parametrize(("case", "ratio"), [("mtp_2d", 1), ("lens_1d", 1), ("mtp_2d_odd", 2)])
def test_first_candidate_logits_are_compared_with_vllms_dense_logits(
    vllm_env, monkeypatch, plugin_log, case, ratio
):
    """The first candidate-logits call of a variant outside capture compares the kernel with
    vLLM's dense logits on a synthetic step (its own rows would do: vLLM's warm-up runs dummy
    rows); equal, the hook serves that call and every later one, unchecked. At compress ratio 2
    the probe's 2-D lengths hold rows ending one column past the dense logits, which compare
    equal where the kernel's columns end with the dense logits."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", case)
    for layer in (plugin_layer, oracle_layer):
        layer.compress_ratio = ratio
    install_hooks(monkeypatch, vllm_env, take=True)
    probed, handed = [], []
    build = indexer.cand_probe.probe_step
    monkeypatch.setattr(indexer.cand_probe, "probe_step",
                        lambda *a, **k: probed.append(build(*a, **k)) or probed[-1])  # fmt: skip
    for cls in (ref.PagedLogits, ref.CandidateLogitsTopK):  # record what each side is handed
        call = cls.__call__
        monkeypatch.setattr(cls, "__call__", lambda self, *a, call=call, **k: (
            handed.append(a), call(self, *a, **k))[1])  # fmt: skip
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    for expected in ([*PROBE, "hook:candidate_logits_top_k"], ["hook:candidate_logits_top_k"]):
        vllm_env.calls.clear()
        handed.clear()
        run(vllm_env, plugin_layer, meta, q, n)
        assert vllm_env.calls == expected
        assert_same_rows(plugin_layer.topk_indices_buffer[: meta.num_decode_tokens],
                         oracle_layer.topk_indices_buffer[: meta.num_decode_tokens])  # fmt: skip
        if expected[:2] == PROBE:  # the probe: both sides got its step, not the real one
            [step] = probed
            assert len(handed) == 3  # the probe's kernel, its dense logits, the step's kernel
            fields = [step.q, step.kv_cache, step.weights, step.seq_lens, step.block_table]
            kernel, dense = handed[0], handed[1]
            assert all(a is b for a, b in zip(kernel, [*fields, step.candidates], strict=False))
            assert kernel[7] is step.indices
            assert all(a is b for a, b in zip(dense, fields, strict=False))
    assert indexer._cand_verdict == {"compared": True}
    [step] = probed
    assert step.seq_lens.dim() == meta.decode.seq_lens.dim() and step.q.shape[1] == 2
    assert int(step.seq_lens.max()) == WIDTH  # the dense logits' width, not max_total_seq_len
    if ratio == 2:  # a request's first row ends past its last row's dense logits
        assert (step.seq_lens[:, 0] == step.seq_lens[:, 1]).any()
    infos = [r.getMessage() for r in plugin_log.records if "equal vLLM's dense" in r.getMessage()]
    assert len(infos) == 1


def test_each_candidate_kernel_variant_is_compared(vllm_env, monkeypatch):
    """A variant of the candidate-logits kernel (another page size, say) is compared with
    vLLM's dense logits at its first call, though another was compared before; then it serves."""
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    keyed = []
    monkeypatch.setattr(indexer, "_cand_variant", lambda *args: keyed.append(args) or "pages of 64")
    for expected in ([*PROBE, "hook:candidate_logits_top_k"], ["hook:candidate_logits_top_k"]):
        vllm_env.calls.clear()
        run(vllm_env, plugin_layer, meta, q, n)
        assert vllm_env.calls == expected
    assert indexer._cand_verdict == {"compared": True, "pages of 64": True}
    assert keyed and all(args[4:] == (1, CB) for args in keyed)  # ratio, candidate block size


def test_candidate_kernel_variants():
    """Heads, page size, the lengths' dims, next_n, the compress ratio, q's FP8 dtype (the hook
    takes e4m3fnuz and e4m3fn; the kernel reads the keys as q's dtype, and so does the probe),
    the block table's row stride modulo 16 (the JIT specializes on it) and the candidate block
    size (a constexpr) name a variant; the requests do not."""
    q = torch.empty(2, 3, 64, 128, dtype=torch.float8_e4m3fnuz)
    cache = torch.empty(10, 64, 1, 132)
    table = torch.empty(2, 32, dtype=torch.int32)
    one = indexer._cand_variant(q, cache, torch.empty(2), table, 1, 8)
    same = torch.empty(5, 3, 64, 128, dtype=torch.float8_e4m3fnuz)
    wider = torch.empty(5, 48, dtype=torch.int32)
    assert one == indexer._cand_variant(same, cache, torch.empty(5), wider, 1, 8)
    others = [
        indexer._cand_variant(q[:, :, :32], cache, torch.empty(2), table, 1, 8),
        indexer._cand_variant(q, cache[:, :32], torch.empty(2), table, 1, 8),
        indexer._cand_variant(q, cache, torch.empty(2, 3), table, 1, 8),
        indexer._cand_variant(q[:, :1], cache, torch.empty(2), table, 1, 8),
        indexer._cand_variant(q, cache, torch.empty(2), table, 2, 8),
        indexer._cand_variant(q.view(torch.float8_e4m3fn), cache, torch.empty(2), table, 1, 8),
        indexer._cand_variant(q, cache, torch.empty(2), table[:, :31].contiguous(), 1, 8),
        indexer._cand_variant(q, cache, torch.empty(2), table, 1, 16),
    ]
    assert len({one, *others}) == 9


def _skewed_hook(monkeypatch, env, skew: str) -> None:
    """The candidate-logits stand-in whose compact rows carry ``skew`` (ref_indexer)."""
    skewed = ref.CandidateLogitsTopK(env.logits, skew=skew)
    monkeypatch.setattr(topk, "candidate_logits_top_k",
                        env.spy("hook:candidate_logits_top_k", skewed))  # fmt: skip


def probe_then_vllms_path(env, plugin_layer, oracle_layer, meta, q, n):
    """Two steps of a variant whose probe does not let the hook serve: the first probes, and
    both take vLLM's dense logits and candidate top-k, with vLLM's index sets."""
    run(env, oracle_layer, meta, q, n, plugin=False)
    rest = ["vllm:logits", "hook:candidate_top_k"]
    for expected in ([*PROBE, *rest], rest):
        env.calls.clear()
        run(env, plugin_layer, meta, q, n)
        assert env.calls == expected
        assert_same_rows(plugin_layer.topk_indices_buffer[: meta.num_decode_tokens],
                         oracle_layer.topk_indices_buffer[: meta.num_decode_tokens])  # fmt: skip


def spy_probe_rows(monkeypatch) -> list:
    """The compact rows and ids that the candidate-logits stand-in hands each probe's check,
    in the order of the probes (the probe's call is the one with a check, its 12th argument)."""
    probed = []
    call = ref.CandidateLogitsTopK.__call__

    def spying(self, *args):
        if len(args) == 12:
            *rest, check = args
            args = (*rest, lambda logits, ids: probed.append((logits.clone(), ids.clone()))
                    or check(logits, ids))  # fmt: skip
        return call(self, *args)

    monkeypatch.setattr(ref.CandidateLogitsTopK, "__call__", spying)
    return probed


def test_candidate_logits_of_too_few_columns_are_not_judged(vllm_env, monkeypatch, plugin_log):
    """A probe with fewer meaningful columns than MIN_COMPARED (a very narrow reader layer)
    judges nothing: that variant keeps vLLM's path, is not probed again, and the hook stays
    on for other variants."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    monkeypatch.setattr(indexer, "MIN_COMPARED", 10**9)
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    probe_then_vllms_path(vllm_env, plugin_layer, oracle_layer, meta, q, n)
    assert indexer._cand_verdict == {"compared": False} and indexer._off == {}
    assert any("not compared" in r.getMessage() for r in plugin_log.records)


def test_candidate_logits_of_exactly_min_compared_columns_serve(vllm_env, monkeypatch,
                                                                 plugin_log):  # fmt: skip
    """MIN_COMPARED columns to judge, all equal, are enough: the hook serves that variant (the
    probe is seeded, so a probe judged short says how many columns its step holds: its live
    columns of a finite, nonzero logit)."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    monkeypatch.setattr(indexer, "MIN_COMPARED", 10**9)
    plugin_layer, _, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    probed = spy_probe_rows(monkeypatch)
    run(vllm_env, plugin_layer, meta, q, n)
    [short] = [r.args[0] for r in plugin_log.records if "not compared" in r.getMessage()]
    assert indexer._cand_verdict == {"compared": False} and short > 1000
    # Only live columns count, not the dead ones (-1 ids, in every probe) whose gather lands
    # on column 0's finite logit.
    [(logits, ids)] = probed
    assert (ids < 0).any() and short == (ids.ge(0) & logits.isfinite() & logits.ne(0)).sum()
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    monkeypatch.setattr(indexer, "MIN_COMPARED", short)
    vllm_env.calls.clear()
    run(vllm_env, plugin_layer, meta, q, n)
    assert vllm_env.calls == [*PROBE, "hook:candidate_logits_top_k"]
    assert indexer._cand_verdict == {"compared": True}
    said = plugin_log.records[-1].getMessage()
    assert "candidate logits equal vLLM's dense logits" in said and "the hook serves" in said


def test_candidate_logits_probe_the_hook_declines_judges_nothing(vllm_env, monkeypatch):
    """A probe that the hook declines before its check sees any row (its gate refuses the
    synthetic step, or no code object loaded) compared nothing: that variant keeps vLLM's
    path, and is not probed again."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    hook = ref.CandidateLogitsTopK(vllm_env.logits)  # takes only calls without a check
    monkeypatch.setattr(topk, "candidate_logits_top_k", vllm_env.spy(
        "hook:candidate_logits_top_k", lambda *a: len(a) == 11 and hook(*a)))  # fmt: skip
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    rest = ["vllm:logits", "hook:candidate_top_k"]
    for expected in (["hook:candidate_logits_top_k", *rest], rest):
        vllm_env.calls.clear()
        run(vllm_env, plugin_layer, meta, q, n)
        assert vllm_env.calls == expected
        assert_same_rows(plugin_layer.topk_indices_buffer[: meta.num_decode_tokens],
                         oracle_layer.topk_indices_buffer[: meta.num_decode_tokens])  # fmt: skip
    assert indexer._cand_verdict == {"compared": False} and indexer._off == {}


def test_candidate_logits_probe_without_memory_is_not_retried(vllm_env, monkeypatch, plugin_log):
    """A probe that finds no GPU memory leaves its variant on vLLM's path (its index sets), one
    warning, and is not built again at the next eager step (each try would allocate and flush
    torch's cache); the hook stays on for other variants."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    tries = []

    def no_room(*args):
        tries.append(args)
        raise torch.OutOfMemoryError("CUDA out of memory (test)")

    monkeypatch.setattr(cand_probe, "probe_step", no_room)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    for _ in range(2):
        vllm_env.calls.clear()
        run(vllm_env, plugin_layer, meta, q, n)
        assert vllm_env.calls == ["vllm:logits", "hook:candidate_top_k"]
        assert_same_rows(plugin_layer.topk_indices_buffer[: meta.num_decode_tokens],
                         oracle_layer.topk_indices_buffer[: meta.num_decode_tokens])  # fmt: skip
    assert len(tries) == 1 and indexer._cand_verdict == {"compared": False}
    assert indexer._off == {}
    warnings = [r.getMessage() for r in plugin_log.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "no GPU memory to compare" in warnings[0]


@pytest.mark.parametrize("skew", ["last bit", "last bit at 0", "zero sign"])
def test_candidate_logits_that_differ_from_vllms_stay_off(vllm_env, monkeypatch, plugin_log,
                                                          skew):  # fmt: skip
    """One last-bit difference at one candidate column of the probe (the first live one, or
    column 0), or a -0 where vLLM has +0 (the top-k ranks it below): the hook declines (vLLM's
    dense logits, mask or candidate top-k, and top-k serve, the same index sets as vLLM's) and
    stays off."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    _skewed_hook(monkeypatch, vllm_env, skew)
    probe_then_vllms_path(vllm_env, plugin_layer, oracle_layer, meta, q, n)
    assert indexer._cand_verdict == {"compared": False}
    warnings = [r.getMessage() for r in plugin_log.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "differ from vLLM's dense logits at 1 of" in warnings[0]
    reasons = counters.stats()["candidate_logits_top_k"]["reasons"]
    assert reasons == {"declined by the hook": 1, "differed from vLLM's dense logits": 1}


def test_candidate_logits_are_not_compared_inside_graph_capture(vllm_env, monkeypatch):
    """Capture cannot read the comparison's result: before it has compared, the hook declines
    before any candidate kernel runs (none is captured), and the comparison stays to be done
    by the next eager call."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    monkeypatch.setattr(indexer, "_capturing", lambda t: True)
    run(vllm_env, plugin_layer, meta, q, n)
    assert vllm_env.calls == ["vllm:logits", "hook:candidate_top_k"]  # no candidate kernel
    assert not indexer._cand_verdict and indexer._off == {}
    # A variant compared before capture (in vLLM's eager warm-up) is captured: the hook serves.
    indexer._cand_verdict["compared"] = True
    vllm_env.calls.clear()
    run(vllm_env, plugin_layer, meta, q, n)
    assert vllm_env.calls == ["hook:candidate_logits_top_k"]


def test_reader_with_few_live_candidates_pads_with_minus_one(vllm_env, monkeypatch):
    """The documented difference: vLLM's mask path fills such a row with arbitrary masked
    columns (-inf logits); the plugin gives the live candidates, then -1."""
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    for layer in (plugin_layer, oracle_layer):
        layer.candidate_blocks[0].fill_(-1)
        layer.candidate_blocks[0, :10] = torch.arange(10, 20)  # 80 live columns
    install_hooks(monkeypatch, vllm_env, take=True)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    run(vllm_env, plugin_layer, meta, q, n)
    got = plugin_layer.topk_indices_buffer[0].tolist()
    want = oracle_layer.topk_indices_buffer[0].tolist()
    live = set(range(80, 160))
    assert set(got[:80]) == live and got[80:] == [-1] * 432
    assert live <= set(want) and len(set(want) - live) == 432  # vLLM: 432 masked columns


@pytest.mark.parametrize(("padded_graph", "skips"), [(0, True), (3, False)])
def test_fill_skipped_only_when_every_entry_is_written(vllm_env, monkeypatch, padded_graph,
                                                       skips):  # fmt: skip
    """CUDA-graph padding rows (num_tokens > decode rows) must still get vLLM's -1 fill."""
    seq, decode_lens, padded, n_dec, q = make_step("mtp_2d")
    layer = make_layer(vllm_env, "plain", n_dec + padded_graph)
    install_hooks(monkeypatch, vllm_env, take=True)
    fills = []
    real_skip = topk.skip_decode_fill
    monkeypatch.setattr(topk, "skip_decode_fill",
                        lambda *a: fills.append(real_skip(*a)) or fills[-1])  # fmt: skip
    run(vllm_env, layer, metadata(seq, decode_lens, padded, n_dec), q, n_dec + padded_graph)
    assert fills == [skips]
    buf = layer.topk_indices_buffer
    assert not (buf[: n_dec + padded_graph] == 7777).any()  # every entry of the step written
    assert (buf[n_dec:n_dec + padded_graph] == -1).all()  # fmt: skip
    assert (buf[n_dec + padded_graph :] == 7777).all()


def test_fill_kept_for_a_buffer_wider_than_topk(vllm_env, monkeypatch):
    """The top-k writes topk_tokens columns a row; a buffer wider than that keeps vLLM's -1 fill
    past them (DSv4.1's is 512 wide, as its topk_tokens)."""
    seq, decode_lens, padded, n_dec, q = make_step("mtp_2d")
    layer = make_layer(vllm_env, "plain", n_dec)
    layer.topk_indices_buffer = torch.full((n_dec + 4, 520), 7777, dtype=torch.int32)
    install_hooks(monkeypatch, vllm_env, take=True)
    handed = []  # the top-k writes vLLM's topk_indices_buffer[:rows, :topk_tokens]
    take = topk.decode_top_k
    monkeypatch.setattr(topk, "decode_top_k", lambda *a: handed.append(a[3]) or take(*a))
    run(vllm_env, layer, metadata(seq, decode_lens, padded, n_dec), q, n_dec)
    assert (layer.topk_indices_buffer[:n_dec, 512:] == -1).all()
    [out] = handed
    assert out.shape == (n_dec, 512) and out.data_ptr() == layer.topk_indices_buffer.data_ptr()


def test_padded_rows_are_never_fill_skipped(vllm_env, monkeypatch):
    seq, decode_lens, padded, n_dec, q = make_step("padded")
    decode = metadata(seq, decode_lens, padded, n_dec).decode
    assert topk.skip_decode_fill(False, n_dec, n_dec, decode, 512, 512) is False


@pytest.mark.parametrize("why", ["prefill", "profile", "own_k"])
@pytest.mark.parametrize("kind", ["plain", "writer"])
def test_other_steps_run_vllms_op(vllm_env, monkeypatch, why, kind):
    """Such a step is vLLM's op, called with the arguments vLLM's own ``forward_hip`` passes
    (the layer's, each of its own value here: its K-cache switch, candidate role, width and
    total length), so vLLM's op does what it would unpatched."""
    seq, decode_lens, padded, n_dec, q = make_step("mtp_2d")
    layer = make_layer(vllm_env, kind, n_dec)
    install_hooks(monkeypatch, vllm_env, take=True)
    ops = []
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    monkeypatch.setattr(rocm, "rocm_aiter_sparse_attn_indexer",
                        lambda *a, **k: ops.append((a, k)) or "vllm's")  # fmt: skip
    meta = metadata(seq, decode_lens, padded, n_dec, prefills=1 if why == "prefill" else 0)
    if why == "own_k":
        layer.skip_k_cache_insert = False
    if why == "profile":
        meta = None
    assert run(vllm_env, layer, meta, q, n_dec) == "vllm's"
    [(args, kwargs)] = ops
    hidden, prefix, kv_cache, q_fp8, k, weights, *rest = args
    assert hidden.shape == (n_dec, 1) and torch.equal(q_fp8, q) and weights.shape == (n_dec, HEADS)
    assert prefix == layer.k_cache.prefix and kv_cache is layer.k_cache.kv_cache and k is None
    assert rest[:-1] == [128, "ue8m0", 512, DIM, WIDTH, TOTAL]
    assert rest[-1] is layer.topk_indices_buffer
    assert kwargs == dict(skip_k_cache_insert=why != "own_k", compress_ratio=1,
                          candidate_blocks=layer.candidate_blocks, candidate_block_size=CB,
                          candidate_write=kind == "writer")  # fmt: skip
    assert not any(c.startswith("hook:") for c in vllm_env.calls)
    reasons = counters.stats()["indexer_decode"]["reasons"]
    want = {"prefill": "prefill or mixed step",
            "profile": "no indexer metadata (profile or dummy run)",
            "own_k": "layer writes its own K cache"}[why]  # fmt: skip
    assert list(reasons) == [want]


@pytest.mark.parametrize("outcome", ["reserved", "out of memory", "top-k off", "not built",
                                     "prefill"])  # fmt: skip
def test_profile_run_reserves_the_top_k_scratch(vllm_env, monkeypatch, plugin_log, outcome):
    """vLLM's memory-profile run (no indexer metadata): beside vLLM's op, which reserves its
    decode logits for ``_max_decode_logits_rows`` rows, the layer reserves the decode
    top-512's scratch for as many rows of its width, so the profile counts it. A reservation
    that fails is logged once (HIP's error reset; an out-of-memory message differs each time)
    and the step is vLLM's all the same; with the top-k off or its kernels not loaded, none; nor
    on a step with metadata (a prefill)."""
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    monkeypatch.setattr(indexer, "_reserve_warned", False)
    seq, decode_lens, padded, n_dec, q = make_step("mtp_2d")
    layer = make_layer(vllm_env, "plain", n_dec)
    layer.dsv41_topk = outcome != "top-k off"
    monkeypatch.setattr(topk, "build", lambda: outcome != "not built")
    meta = metadata(seq, decode_lens, padded, n_dec, prefills=1) if outcome == "prefill" else None
    cleared = []
    monkeypatch.setattr(indexer._launcher, "clear_last_error", lambda: cleared.append(1) or 0)
    monkeypatch.setattr(topk, "_GPU_TYPE", "cpu")
    ops, reserved = [], []
    monkeypatch.setattr(rocm, "rocm_aiter_sparse_attn_indexer",
                        lambda *a, **k: ops.append(a[1]) or layer.topk_indices_buffer)  # fmt: skip
    monkeypatch.setattr(rocm, "_max_decode_logits_rows", lambda tokens: 10 * tokens)

    def reserve(rows, width, device):
        reserved.append((rows, width, device))
        if outcome == "out of memory":
            raise torch.OutOfMemoryError(f"no room ({len(reserved)} MiB free)")
        return True

    monkeypatch.setattr(topk, "reserve_decode_scratch", reserve)
    for _ in range(2):
        run(vllm_env, layer, meta, q, n_dec)
    assert ops == [layer.k_cache.prefix] * 2
    asks = outcome in ("reserved", "out of memory")
    assert reserved == ([(10 * n_dec, WIDTH, None)] * 2 if asks else [])
    warned = [r for r in plugin_log.records if "not reserved" in r.getMessage()]
    assert len(warned) == len(cleared) / 2 == (1 if outcome == "out of memory" else 0)


@pytest.mark.parametrize("why", ["aiter off", "mxfp4 cache", "q not one tensor"])
def test_aiter_off_keeps_vllms_dispatch(vllm_env, monkeypatch, why):
    """With AITER off, an MXFP4 cache, or q handed as (values, scales) (the FP4 indexer's), the
    layer runs vLLM's own forward_hip (which on gfx942 refuses to run all three), not vLLM's
    Python op behind it: the plugin serves no configuration vLLM would not."""
    seq, decode_lens, padded, n_dec, q = make_step("mtp_2d")
    layer = make_layer(vllm_env, "plain", n_dec)
    install_hooks(monkeypatch, vllm_env, take=True)
    parent = type(layer).__mro__[1]
    seen = []
    monkeypatch.setattr(parent, "forward_hip", lambda self, *a: seen.append(a[1]) or "vllm's")
    if why == "aiter off":
        monkeypatch.setattr(indexer, "_aiter_enabled", lambda: False)
    layer.use_fp4_cache = why == "mxfp4 cache"
    hidden, weights = torch.zeros(n_dec, 1), torch.ones(n_dec, HEADS)
    q_quant = (q, torch.ones(n_dec, HEADS)) if why == "q not one tensor" else q
    from vllm.forward_context import set_forward_context

    meta = metadata(seq, decode_lens, padded, n_dec)
    with set_forward_context({layer.k_cache.prefix: meta}, vllm_env.config):
        assert layer.forward_hip(hidden, q_quant, None, weights) == "vllm's"
    assert seen == [q_quant] and "indexer_decode" not in counters.stats()
    assert not any(c.startswith("hook:") for c in vllm_env.calls)


@pytest.mark.parametrize("kind", ["plain", "writer", "reader"])
def test_full_graph_choices_do_not_depend_on_lengths(vllm_env, monkeypatch, kind):
    """Under FULL graphs the Python runs only at capture: the host-side path taken must be the
    same for any lengths of the same shapes (the kernels read lengths on the device), on every
    kind of layer, down to rows shorter than 512 (scale 50: 5 to 140 columns)."""
    from vllm.config import CUDAGraphMode

    install_hooks(monkeypatch, vllm_env, take=True)
    paths = []
    for scale in (1, 3, 50):
        seq, decode_lens, padded, n_dec, q = make_step("mtp_2d")
        seq = (seq // scale).clamp(min=1)
        layer = make_layer(vllm_env, kind, n_dec)
        vllm_env.calls.clear()
        run(vllm_env, layer, metadata(seq, decode_lens, padded, n_dec), q, n_dec,
            mode=CUDAGraphMode.FULL)  # fmt: skip
        paths.append(list(vllm_env.calls))
    assert paths[0] == paths[1] == paths[2] and any(c.startswith("hook:") for c in paths[0])


@pytest.mark.parametrize("kind", ["writer", "reader"])
def test_switched_off_family_keeps_vllms_ops(vllm_env, monkeypatch, kind):
    """DSV41_GFX942_TOPK=0: vLLM's ops everywhere, the candidate logits too on readers (their
    top-512 is the HIP compact top-k), and vLLM's sets; nothing asks for the kernels (the
    skip of vLLM's -1 fill would load them, at a step that may be inside graph capture), and
    vLLM's fill runs before its ops."""
    monkeypatch.setenv("DSV41_GFX942_TOPK", "0")
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, kind, "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    vllm_env.calls.clear()
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    builds, filled = [], []
    monkeypatch.setattr(topk, "build", lambda: builds.append(1) or True)
    dense = rocm.rocm_fp8_paged_mqa_logits
    monkeypatch.setattr(rocm, "rocm_fp8_paged_mqa_logits", lambda *a, **k: filled.append(
        bool((plugin_layer.topk_indices_buffer[:n] == -1).all())) or dense(*a, **k))  # fmt: skip
    run(vllm_env, plugin_layer, meta, q, n)
    middle = "vllm:select" if kind == "writer" else "vllm:mask"
    assert vllm_env.calls == ["vllm:logits", middle, "vllm:topk"]
    assert torch.equal(plugin_layer.topk_indices_buffer, oracle_layer.topk_indices_buffer)
    assert builds == [] and filled == [True]


def test_monokernel_indexer_bypasses_the_patch(clean_plugin, fake_platform):
    """vLLM's --monokernel indexer class sets its own attn_cls (as DeepseekV41Gfx942Indexer
    does): the plugin's patch of DeepseekV4Indexer.attn_cls never reaches it."""
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.models.deepseek_v41.attention import DeepseekV4Indexer

    class InTreeOp(SparseAttnIndexer):
        pass

    class MonokernelIndexer(DeepseekV4Indexer):
        attn_cls = InTreeOp

    clean_plugin.register()
    assert DeepseekV4Indexer.attn_cls.__name__ == "Dsv41Gfx942SparseAttnIndexer"
    assert MonokernelIndexer.attn_cls is InTreeOp


def test_hook_that_raises_is_turned_off_and_vllm_runs(vllm_env, monkeypatch, plugin_log):
    monkeypatch.setattr(indexer, "_off", {})
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "plain", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)

    def boom(logits, next_n, seq_lens, indices, topk_tokens):
        indices.fill_(123)  # a partial write before the failure
        raise RuntimeError("kernel bug")

    monkeypatch.setattr(topk, "decode_top_k", vllm_env.spy("hook:decode_top_k", boom))
    cleared = []  # the HIP last error the hook may leave, reset before vLLM's op
    monkeypatch.setattr(indexer._launcher, "clear_last_error", lambda: cleared.append(1) or 0)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    for _ in range(2):
        vllm_env.calls.clear()
        run(vllm_env, plugin_layer, meta, q, n)
        assert torch.equal(plugin_layer.topk_indices_buffer, oracle_layer.topk_indices_buffer)
    assert vllm_env.calls == ["vllm:logits", "vllm:topk"]  # not asked again
    assert cleared == [1]
    errors = [r for r in plugin_log.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "kernel bug" in errors[0].exc_text


def test_a_triton_without_gluon_keeps_the_candidate_logits_off(vllm_env, monkeypatch,
                                                               plugin_log):  # fmt: skip
    """A Triton without ``triton.experimental.gluon`` (or whose Gluon API differs): the plugin
    and its indexer import and build as before (the Gluon kernels are imported at the hook's
    first call only); that call, the probe's, raises ImportError, which turns the hook off once
    (one ERROR, the HIP error reset), and vLLM's dense logits serve, then and after."""
    import sys

    for name in ("cand_logits", "_cand_kernels", "_cand_layout"):
        monkeypatch.delitem(sys.modules, f"dsv41_gfx942_plugin.ops.{name}", raising=False)
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)  # import raises
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    hook = vllm_env.spy("hook:candidate_logits_top_k", _REAL_CAND_HOOK)
    monkeypatch.setattr(topk, "candidate_logits_top_k", hook)
    cleared = []
    monkeypatch.setattr(indexer._launcher, "clear_last_error", lambda: cleared.append(1) or 0)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    for first in (True, False):
        vllm_env.calls.clear()
        run(vllm_env, plugin_layer, meta, q, n)
        probe = ["hook:candidate_logits_top_k"] if first else []
        assert vllm_env.calls == [*probe, "vllm:logits", "hook:candidate_top_k"]
        assert_same_rows(plugin_layer.topk_indices_buffer[: meta.num_decode_tokens],
                         oracle_layer.topk_indices_buffer[: meta.num_decode_tokens])  # fmt: skip
    assert indexer._off == {"candidate_logits_top_k": "raised earlier in this process"}
    errors = [r for r in plugin_log.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "triton.experimental.gluon" in errors[0].exc_text
    assert cleared == [1]


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_a_base_exception_in_a_hook_propagates(vllm_env, monkeypatch, error):
    """Ctrl-C or a worker's exit inside a hook is no plugin bug to swallow: it reaches vLLM, and
    the hook is not turned off."""
    monkeypatch.setattr(indexer, "_off", {})
    plugin_layer, _, meta, q, n = pair(vllm_env, "plain", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)

    def stop(*args):
        raise error()

    monkeypatch.setattr(topk, "decode_top_k", stop)
    with pytest.raises(error):
        run(vllm_env, plugin_layer, meta, q, n)
    assert indexer._off == {}


def test_hook_out_of_memory_declines_and_tries_again(vllm_env, monkeypatch, plugin_log):
    """A hook that finds no GPU memory (the top-k scratch could not grow) declines that call,
    one warning, vLLM's op serves, and the next call asks the hook again."""
    monkeypatch.setattr(indexer, "_off", {})
    monkeypatch.setattr(indexer, "_no_memory", set())
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "plain", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    take = topk.decode_top_k
    full = [True, True, False]

    def short(*args):
        if full.pop(0):
            args[3].fill_(123)  # a partial write before the failure
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        return take(*args)

    monkeypatch.setattr(topk, "decode_top_k", vllm_env.spy("hook:decode_top_k", short))
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    for vllms in (True, True, False):  # the hook asked every time, vLLM's op while it declines
        vllm_env.calls.clear()
        run(vllm_env, plugin_layer, meta, q, n)
        assert torch.equal(plugin_layer.topk_indices_buffer, oracle_layer.topk_indices_buffer)
        assert "hook:decode_top_k" in vllm_env.calls and ("vllm:topk" in vllm_env.calls) == vllms
    assert "decode_top_k" not in indexer._off
    warned = [r for r in plugin_log.records if "found no GPU memory" in r.getMessage()]
    assert [r.levelname for r in warned] == ["WARNING"]


def test_first_decode_step_is_logged_once(vllm_env, monkeypatch, plugin_log):
    """One INFO line with the counters once every layer has run its first decode step, then
    none."""
    monkeypatch.setattr(indexer, "_first_layer", None)
    monkeypatch.setattr(indexer, "_first_step_logged", False)
    install_hooks(monkeypatch, vllm_env, take=True)
    seq, decode_lens, padded, n_dec, q = make_step("mtp_2d")
    meta = metadata(seq, decode_lens, padded, n_dec)
    first, second = make_layer(vllm_env, "plain", n_dec), make_layer(vllm_env, "writer", n_dec)
    for _ in range(3):
        for layer in (first, second):
            run(vllm_env, layer, meta, q, n_dec)
    lines = [r.getMessage() for r in plugin_log.records if "first decode step" in r.getMessage()]
    assert len(lines) == 1 and "indexer_decode 2/2" in lines[0]


def test_first_decode_step_log_waits_for_layers_sharing_a_k_cache(vllm_env, monkeypatch,
                                                                    plugin_log):  # fmt: skip
    """DSv4.1's index layers that are not KV sources share the K cache (and so its prefix) of
    the KV source below them (vLLM's ``DeepseekV4Attention``: the same ``DeepseekV4IndexerCache``
    object). The first-step line waits until the first layer itself comes round again, not
    the next layer with its prefix: every layer's decisions are in it."""
    monkeypatch.setattr(indexer, "_first_layer", None)
    monkeypatch.setattr(indexer, "_first_step_logged", False)
    install_hooks(monkeypatch, vllm_env, take=True)
    seq, decode_lens, padded, n_dec, q = make_step("mtp_2d")
    meta = metadata(seq, decode_lens, padded, n_dec)
    source = make_layer(vllm_env, "plain", n_dec)
    sharing = make_layer(vllm_env, "plain", n_dec)
    sharing.k_cache = source.k_cache  # a non-owning index source, as vLLM builds it
    writer = make_layer(vllm_env, "writer", n_dec)
    for _ in range(2):
        for layer in (source, sharing, writer):
            run(vllm_env, layer, meta, q, n_dec)
    lines = [r.getMessage() for r in plugin_log.records if "first decode step" in r.getMessage()]
    assert len(lines) == 1
    assert "indexer_decode 3/3" in lines[0] and "select_candidates 1/1" in lines[0]


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("module", [True, False])
def test_dense_logits_kernel_as_vllm_chooses_it(monkeypatch, page_size, ratio, module):
    """``_dense_is_aiter_gluon`` says True exactly where vLLM's ``rocm_fp8_paged_mqa_logits``
    (run here on gfx942 with AITER on, its kernels replaced by recorders) takes AITER's
    preshuffled Gluon kernel, the one the candidate logits mirror."""
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    taken = []

    def aiter_kernel(*args, Preshuffle, **kwargs):
        taken.append("aiter preshuffled" if Preshuffle else "aiter flat")

    class Workspace:
        def get_simultaneous(self, *specs):
            return [torch.empty(shape, dtype=dtype) for shape, dtype in specs]

    aiter = types.SimpleNamespace(__name__="aiter", deepgemm_fp8_paged_mqa_logits=aiter_kernel)
    monkeypatch.setattr(rocm, "_ON_GFX942", True)
    monkeypatch.setattr(rocm, "paged_mqa_logits_module", lambda: aiter if module else None)
    monkeypatch.setattr(rocm_aiter_ops, "is_enabled", classmethod(lambda cls: True))
    monkeypatch.setattr(rocm, "current_workspace_manager", Workspace)
    for name in ("rocm_fp8_paged_mqa_logits_triton", "fp8_paged_mqa_logits_torch"):
        monkeypatch.setattr(rocm, name, lambda *a, name=name, **k: taken.append(name))
    cache = torch.zeros(4, page_size, 1, DIM + 4, dtype=torch.uint8)
    q = torch.zeros(2, 1, HEADS, DIM)
    rocm.rocm_fp8_paged_mqa_logits(
        q, cache, torch.ones(2, HEADS), torch.full((2,), 64, dtype=torch.int32),
        torch.zeros(2, 4, dtype=torch.int32), None, 256, compress_ratio=ratio,
    )  # fmt: skip
    assert len(taken) == 1
    assert indexer._dense_is_aiter_gluon(cache, ratio) is (taken == ["aiter preshuffled"])


def test_dense_logits_called_as_vllm_calls_them(vllm_env, monkeypatch):
    """The plugin's decode path calls vLLM's dense logits with vLLM's own arguments (the
    stand-in ignores most of them, so only a record of them tells), on a step with CUDA-graph
    padding rows (3 tokens past the 8 decode rows), whose weights vLLM does not hand over."""
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    asked = []

    def record(*args, **kwargs):
        asked.append((args, kwargs))
        return vllm_env.logits(*args, **kwargs)

    monkeypatch.setattr(rocm, "rocm_fp8_paged_mqa_logits", record)
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "plain", "mtp_2d", num_tokens=11)
    for layer in (plugin_layer, oracle_layer):
        layer.compress_ratio = 2
    install_hooks(monkeypatch, vllm_env, take=True)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    run(vllm_env, plugin_layer, meta, q, n)
    (want_args, want_kw), (got_args, got_kw) = asked
    assert len(got_args) == len(want_args) and got_kw.keys() == want_kw.keys()
    for got, want in zip(
        (*got_args, *got_kw.values()), (*want_args, *want_kw.values()), strict=True
    ):
        if isinstance(want, torch.Tensor):
            assert got.shape == want.shape and torch.equal(got, want)
        else:
            assert got == want
    assert got_kw["compress_ratio"] == 2


def test_cand_logits_switch_off_keeps_vllms_logits(vllm_env, monkeypatch):
    """DSV41_GFX942_CAND_LOGITS=0 with the top-k on: a reader layer takes vLLM's dense logits
    and the candidate top-k, never the candidate-logits hook."""
    monkeypatch.setenv("DSV41_GFX942_CAND_LOGITS", "0")
    plugin_layer, oracle_layer, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    install_hooks(monkeypatch, vllm_env, take=True)
    run(vllm_env, oracle_layer, meta, q, n, plugin=False)
    vllm_env.calls.clear()
    run(vllm_env, plugin_layer, meta, q, n)
    assert vllm_env.calls == ["vllm:logits", "hook:candidate_top_k"]
    assert_same_rows(plugin_layer.topk_indices_buffer, oracle_layer.topk_indices_buffer)


@pytest.mark.parametrize("on", [True, False])
def test_code_object_loaded_when_a_layer_is_built(vllm_env, monkeypatch, on):
    """Model load, not the first decode step (which may be inside graph capture), loads the
    top-k kernels; with DSV41_GFX942_TOPK=0 nothing loads them. Either way the layer is
    counted (``layers_built``: the speculator's log then names the plugin's indexer path)."""
    if not on:
        monkeypatch.setenv("DSV41_GFX942_TOPK", "0")
    builds = []
    monkeypatch.setattr(topk, "build", lambda: builds.append(1) or True)
    monkeypatch.setattr(indexer, "layers_built", 0)
    make_layer(vllm_env, "plain", 4)
    assert builds == ([1] if on else [])
    assert indexer.layers_built == 1


def test_another_plugins_replacement_of_the_op_serves(vllm_env, monkeypatch, plugin_log):
    """vLLM builds an op registered with ``CustomOp.register_oot`` under ``SparseAttnIndexer``
    in place of vLLM's; the patched class, whose name differs, builds that one too (once
    built, only its own __init__ ran), with one warning; unregistered, the plugin's class."""
    from vllm.model_executor import custom_op
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    class OtherVendorIndexer(SparseAttnIndexer):
        pass

    builds = []
    monkeypatch.setattr(topk, "build", lambda: builds.append(1) or True)
    monkeypatch.setattr(indexer, "layers_built", 0)
    monkeypatch.setitem(custom_op.op_registry_oot, "SparseAttnIndexer", OtherVendorIndexer)
    for _ in range(2):
        layer = make_layer(vllm_env, "plain", 4)
        assert type(layer) is OtherVendorIndexer and not hasattr(layer, "dsv41_topk")
    assert builds == [] and indexer.layers_built == 0  # no layer of the plugin's was built
    warned = [r for r in plugin_log.records if "OtherVendorIndexer replaces" in r.getMessage()]
    assert [r.levelname for r in warned] == ["WARNING"]
    del custom_op.op_registry_oot["SparseAttnIndexer"]
    assert type(make_layer(vllm_env, "plain", 4)).__name__ == "Dsv41Gfx942SparseAttnIndexer"


@pytest.mark.parametrize("value", [0.0, float("nan")])
def test_candidate_logits_of_zero_are_not_proof(vllm_env, monkeypatch, value):
    """Dense logits all 0 (keys or queries of zeros), or all NaN (NaN keys): however many live
    columns compare equal, nothing meaningful was compared, so the variant keeps vLLM's path,
    unjudged."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    monkeypatch.setattr(indexer, "MIN_COMPARED", 1)
    plugin_layer, _, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    vllm_env.logits.proj.fill_(value)
    install_hooks(monkeypatch, vllm_env, take=True)
    run(vllm_env, plugin_layer, meta, q, n)
    assert vllm_env.calls == [*PROBE, "vllm:logits", "hook:candidate_top_k"]
    assert indexer._cand_verdict == {"compared": False} and indexer._off == {}


def test_candidate_logits_nan_where_vllms_are_nan_serve(vllm_env, monkeypatch):
    """NaN in the compact rows where vLLM's dense logits hold NaN too is equal (the top-k ranks
    both alike): the hook serves."""
    monkeypatch.setattr(indexer, "_cand_verdict", {})
    plugin_layer, _, meta, q, n = pair(vllm_env, "reader", "mtp_2d")
    vllm_env.logits.proj[:, 3 * CB] = float("nan")  # column 24: NaN in every row, both paths
    install_hooks(monkeypatch, vllm_env, take=True)
    probed = spy_probe_rows(monkeypatch)
    run(vllm_env, plugin_layer, meta, q, n)
    assert vllm_env.calls == [*PROBE, "hook:candidate_logits_top_k"]
    [(logits, ids)] = probed
    assert logits[ids >= 0].isnan().any()  # the probe's compact rows held a live NaN
    assert indexer._cand_verdict == {"compared": True} and indexer._off == {}


def _shuffled_select(logits, next_n, seq_lens, block_size, candidates) -> bool:
    """The selection hook's contract with its freedom used: vLLM's set of blocks a row, in a
    shuffled order (-1s among them), as the plugin's kernel may write them."""
    ref.select_candidates(logits, next_n, seq_lens, block_size, candidates)
    g = torch.Generator().manual_seed(5)
    rows = logits.shape[0]
    order = torch.stack([torch.randperm(candidates.shape[1], generator=g) for _ in range(rows)])
    candidates[:rows] = candidates[:rows].gather(1, order)
    return True


@pytest.mark.parametrize("case", ["dspark_flat", "mtp_2d"])
@pytest.mark.parametrize("declines", ["select", "reader", "candidate logits"])
def test_writer_feeds_readers_whichever_side_declines(vllm_env, monkeypatch, case, declines):
    """Layer 20 then a reader over one candidate buffer, as in the model: whichever of the
    writer's selection or the reader's hooks declines (vLLM's op writes or reads the
    candidates in its place), the reader gets the index sets of vLLM's writer and reader. The
    taking selection writes its blocks in shuffled order, which readers must not depend on."""
    seq, decode_lens, padded, n_dec, q = make_step(case)
    meta = metadata(seq, decode_lens, padded, n_dec)
    writer, reader = make_layer(vllm_env, "writer", n_dec), make_layer(vllm_env, "reader", n_dec)
    vwriter, vreader = make_layer(vllm_env, "writer", n_dec), make_layer(vllm_env, "reader", n_dec)
    reader.candidate_blocks, vreader.candidate_blocks = (
        writer.candidate_blocks,
        vwriter.candidate_blocks,
    )
    install_hooks(monkeypatch, vllm_env, take=True)
    select = vllm_env.spy("hook:select_candidates", _shuffled_select)
    no = lambda *a, **k: False  # noqa: E731
    if declines == "select":
        select = no
    else:
        monkeypatch.setattr(topk, "candidate_logits_top_k", no)
        if declines == "reader":
            monkeypatch.setattr(topk, "candidate_top_k", no)
    monkeypatch.setattr(topk, "select_candidates", select)
    for layer in (vwriter, vreader):
        run(vllm_env, layer, meta, q, n_dec, plugin=False)
    vllm_env.calls.clear()
    for layer in (writer, reader):
        run(vllm_env, layer, meta, q, n_dec)
    for r in range(n_dec):  # the writer's blocks as sets, then the readers' index sets
        assert set(writer.candidate_blocks[r].tolist()) == set(vwriter.candidate_blocks[r].tolist())
    assert_same_rows(reader.topk_indices_buffer[:n_dec], vreader.topk_indices_buffer[:n_dec])
    by_vllm = {"select": "vllm:select", "reader": "vllm:mask", "candidate logits": ""}[declines]
    assert not by_vllm or by_vllm in vllm_env.calls
    taken = {"select": "hook:candidate_logits_top_k", "reader": "hook:select_candidates",
             "candidate logits": "hook:candidate_top_k"}[declines]  # fmt: skip
    assert taken in vllm_env.calls
