"""A whole decode step of the 8 index layers on a GPU (an NVIDIA H200 through the sm_90 build
of the HIP kernels, or gfx942): the plugin's decode path against vLLM's decode branch on the
same inputs (``tests/indexer_step.py`` says what stands in for AITER and vLLM's C++ top-k), once
eagerly and under a CUDA graph captured once and replayed with new lengths and logits."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)
pytest.importorskip("vllm")

import indexer_step as harness  # noqa: E402
import topk_object  # noqa: E402
from dsv41_gfx942_plugin.ops import topk  # noqa: E402

topk_object.require()


@pytest.fixture(autouse=True)
def _kernels_load():
    """A code object that does not load, or fails its load-time check, fails each test (the
    hooks would decline and the plugin's step would be vLLM's own), never skips it."""
    assert topk.build(), "the top-k code object did not load or failed its load-time check"


def assert_same_sets(got_layers, want_layers, rows):
    for (lid, _), got, want in zip(harness.LAYERS, got_layers, want_layers, strict=True):
        g = got.topk_indices_buffer[:rows].sort(dim=1).values
        w = want.topk_indices_buffer[:rows].sort(dim=1).values
        assert torch.equal(g, w), f"layer {lid}"
    # Layer 20's candidate blocks: the same set of block ids a row.
    gc = got_layers[3].candidate_blocks[:rows].sort(dim=1).values
    wc = want_layers[3].candidate_blocks[:rows].sort(dim=1).values
    assert torch.equal(gc, wc)


@pytest.mark.parametrize("width", [32768, 131072])
def test_decode_step_matches_vllm(monkeypatch, width):
    step = harness.Step(requests=1, next_n=6, width=width)
    current = harness.install_stand_ins(monkeypatch, step)
    plugin, oracle = step.layers(), step.layers()
    harness.run_step(step, plugin, current, plugin=True)
    harness.run_step(step, oracle, current, plugin=False)
    torch.cuda.synchronize()
    assert_same_sets(plugin, oracle, step.rows)


def test_decode_step_graph_replay_with_new_lengths(monkeypatch):
    step = harness.Step(requests=2, next_n=3, width=131072)
    current = harness.install_stand_ins(monkeypatch, step)
    plugin, oracle = step.layers(), step.layers()
    harness.run_step(step, plugin, current, plugin=True)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        harness.run_step(step, plugin, current, plugin=True)
    g = torch.Generator(device="cuda").manual_seed(5)
    for lengths in ([131072, 131072], [700, 90000], [515, 40000], [131000, 513]):
        step.set_lengths(torch.tensor(lengths, dtype=torch.int32))
        for logits in step.logits.values():
            logits.copy_(torch.randn(logits.shape, device="cuda", generator=g))
        graph.replay()
        harness.run_step(step, oracle, current, plugin=False)
        torch.cuda.synchronize()
        assert_same_sets(plugin, oracle, step.rows)
