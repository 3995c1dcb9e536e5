"""The patched ``DSparkSpeculator._sample_sequential`` keeps vLLM's order: the draft top-k
path, the draft model's own hook, then the plugin's fused path, then vLLM's original loop."""

from __future__ import annotations

import os
import sys
import types

import pytest

import dsv41_gfx942_plugin
from dsv41_gfx942_plugin import patches
from dsv41_gfx942_plugin._log import LOGGER_NAME
from dsv41_gfx942_plugin.speculator import make_sample_sequential

SAMPLER = patches.SAMPLER.target


class _Spec:
    def __init__(self, draft_topk=None, model_hook=None):
        self._draft_topk = draft_topk
        self.model = types.SimpleNamespace()
        if model_hook is not None:
            self.model.sample_sequential = model_hook


@pytest.fixture
def calls(clean_plugin, monkeypatch):
    """Records which of vLLM's original, the model hook and the fused path ran."""
    rec = types.SimpleNamespace(log=[])
    fused = types.ModuleType("dsv41_gfx942_plugin.ops.fused_markov")
    fused.answer = False

    def sample_sequential(spec, num_reqs, head_hidden):
        rec.log.append("fused")
        return fused.answer

    fused.sample_sequential = sample_sequential
    import dsv41_gfx942_plugin.ops as ops

    monkeypatch.setitem(sys.modules, fused.__name__, fused)
    monkeypatch.setattr(ops, "fused_markov", fused, raising=False)
    rec.fused = fused
    return rec


def _original(rec):
    def original(self, num_reqs, head_hidden):
        rec.log.append("vllm")

    return original


def test_draft_topk_path_is_vllms(calls):
    patched = make_sample_sequential(_original(calls))
    patched(_Spec(draft_topk=8, model_hook=lambda *a: calls.log.append("hook") or True), 4, None)
    assert calls.log == ["vllm"]
    assert dsv41_gfx942_plugin.stats()["fused_markov"]["reasons"] == {"draft top-k path": 1}


def test_model_hook_first_and_plugin_stands_aside(calls, monkeypatch, plugin_log):
    from dsv41_gfx942_plugin import indexer

    monkeypatch.setattr(indexer, "layers_built", 0)  # vLLM's --monokernel indexer was built
    patched = make_sample_sequential(_original(calls))
    spec, hidden = _Spec(model_hook=lambda *a: calls.log.append(("hook", *a)) or True), object()
    patched(spec, 4, hidden)
    assert calls.log == [("hook", spec, 4, hidden)]  # vLLM's call: the speculator, rows, hidden
    served = [r.getMessage() for r in plugin_log.records if "served by" in r.getMessage()]
    assert len(served) == 1 and "--monokernel path" in served[0]
    assert "indexer by vLLM's own indexer class" in served[0]
    assert dsv41_gfx942_plugin.stats()["fused_markov"]["reasons"] == {"draft model's own hook": 1}


def test_model_hook_log_without_the_indexer_patch(calls, monkeypatch, plugin_log):
    """With patch 1 not applied (switched off), the log line does not blame --monokernel."""
    monkeypatch.delitem(sys.modules, "dsv41_gfx942_plugin.indexer", raising=False)
    patched = make_sample_sequential(_original(calls))
    patched(_Spec(model_hook=lambda *a: True), 4, None)
    served = [r.getMessage() for r in plugin_log.records if "served by" in r.getMessage()]
    assert len(served) == 1 and "indexer patch is not applied" in served[0]


def test_fused_path_serves_when_it_takes_the_step(calls):
    """The patch counts nothing for a step the fused path did: the fused path counts it (its
    launches, or vLLM's loop from its base logits; test_fused_markov.py)."""
    calls.fused.answer = True
    patched = make_sample_sequential(_original(calls))
    patched(_Spec(model_hook=lambda *a: calls.log.append("hook") or False), 4, None)
    assert calls.log == ["hook", "fused"]
    assert "fused_markov" not in dsv41_gfx942_plugin.stats()


@pytest.mark.parametrize(
    ("first", "line"),
    [
        ("compared with vLLM's loop", None),  # a comparison step: which path serves is open
        (None, "the plugin's fused Markov launches"),
        ("vLLM's loop from the base logits (bf16 base logits)", "vLLM's loop"),
    ],
)
def test_log_names_the_path_that_served_the_fused_paths_step(calls, plugin_log, first, line):
    """A step the fused path did (and counted) is served by its launches (counted taken) or by
    vLLM's loop from its base logits, which the INFO line names, but for a comparison step,
    after which the next step's path is named."""
    from dsv41_gfx942_plugin import counters

    def fused_step(reason):
        def sample_sequential(*args):
            counters.record(counters.FUSED_MARKOV, reason is None, reason or "")
            return True  # the fused path did the step

        calls.fused.sample_sequential = sample_sequential

    def served():
        return [r.getMessage() for r in plugin_log.records if "served by" in r.getMessage()]

    patched = make_sample_sequential(_original(calls))
    fused_step(first)
    patched(_Spec(), 4, None)
    if line is None:
        assert served() == []
    else:
        assert len(served()) == 1 and served()[0].endswith(line)
    fused_step(None)
    patched(_Spec(), 4, None)
    assert served()[-1].endswith("the plugin's fused Markov launches")
    patched(_Spec(), 4, None)  # once a process, not once a step
    assert sum(m.endswith("the plugin's fused Markov launches") for m in served()) == 1
    assert calls.log == []  # vLLM's original never ran


def test_vllm_loop_when_fused_declines(calls):
    patched = make_sample_sequential(_original(calls))
    patched(_Spec(), 4, None)
    assert calls.log == ["fused", "vllm"]
    assert dsv41_gfx942_plugin.stats()["fused_markov"]["reasons"] == {"fused path declined": 1}


def test_fused_path_that_raises_is_turned_off_and_vllm_runs(calls, monkeypatch, plugin_log):
    import dsv41_gfx942_plugin.speculator as speculator

    monkeypatch.setattr(speculator, "_fused_failed", False)

    def boom(spec, num_reqs, head_hidden):
        calls.log.append("fused")
        raise RuntimeError("kernel bug")

    calls.fused.sample_sequential = boom
    cleared = []  # the HIP last error the failure may leave, reset before vLLM's loop
    monkeypatch.setattr(speculator._launcher, "clear_last_error", lambda: cleared.append(1) or 0)
    patched = make_sample_sequential(_original(calls))
    patched(_Spec(), 4, None)
    patched(_Spec(), 4, None)  # the fused path stays off after it raised
    assert calls.log == ["fused", "vllm", "vllm"] and cleared == [1]
    errors = [r for r in plugin_log.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "kernel bug" in errors[0].exc_text
    assert dsv41_gfx942_plugin.stats()["fused_markov"]["reasons"] == {
        "raised": 1, "raised earlier in this process": 1}  # fmt: skip


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_a_base_exception_in_the_fused_path_propagates(calls, monkeypatch, error):
    """Ctrl-C or a worker's exit inside the fused path reaches vLLM, which does not run its
    loop; the fused path is not turned off."""
    import dsv41_gfx942_plugin.speculator as speculator

    monkeypatch.setattr(speculator, "_fused_failed", False)

    def stop(spec, num_reqs, head_hidden):
        raise error()

    calls.fused.sample_sequential = stop
    patched = make_sample_sequential(_original(calls))
    with pytest.raises(error):
        patched(_Spec(), 4, None)
    assert calls.log == [] and not speculator._fused_failed


@pytest.mark.parametrize("first_local_rank", [True, False])
def test_fused_path_out_of_memory_takes_vllms_loop_for_that_step(calls, monkeypatch, plugin_log,
                                                                 first_local_rank):  # fmt: skip
    """Out of memory (vLLM's own draft logits raise it too) is no plugin bug: vLLM's loop runs
    that step, and the fused path serves the next. The warning comes from every rank that ran
    out (vLLM's ``warning_once`` would keep it to each node's first rank)."""
    import torch
    from vllm.distributed import parallel_state

    import dsv41_gfx942_plugin.speculator as speculator

    monkeypatch.setattr(parallel_state, "is_local_first_rank", lambda: first_local_rank)
    monkeypatch.setattr(speculator, "_fused_failed", False)
    answers = iter([torch.OutOfMemoryError("CUDA out of memory"), True])

    def oom_once(spec, num_reqs, head_hidden):
        calls.log.append("fused")
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    calls.fused.sample_sequential = oom_once
    patched = make_sample_sequential(_original(calls))
    patched(_Spec(), 4, None)
    patched(_Spec(), 4, None)
    assert calls.log == ["fused", "vllm", "fused"]
    assert not speculator._fused_failed
    warnings = [r.getMessage() for r in plugin_log.records
                if r.levelname == "WARNING" and r.name == LOGGER_NAME]  # fmt: skip
    assert len(warnings) == 1 and "out of GPU memory" in warnings[0]
    assert dsv41_gfx942_plugin.stats()["fused_markov"]["reasons"] == {"out of memory": 1}


@pytest.mark.parametrize("error", ["out of memory", "another error"])
def test_an_error_after_the_base_logits_goes_to_vllm(calls, monkeypatch, error):
    """An error that vLLM's own op or loop raised once the fused call had asked for the base
    logits (``fused_markov`` marks it ``dsv41_after_base``) is raised to vLLM, not answered by
    running vLLM's whole step again: that would compute the base logits twice, repeating the
    lm_head's tensor-parallel all-gather on this rank alone. The fused path stays on, and the
    patch counts nothing (the fused path counted the step)."""
    import torch

    import dsv41_gfx942_plugin.speculator as speculator

    monkeypatch.setattr(speculator, "_fused_failed", False)

    def error_past_the_base_logits(spec, num_reqs, head_hidden):
        calls.log.append("fused")
        kind = torch.OutOfMemoryError if error == "out of memory" else RuntimeError
        err = kind("from vLLM's loop")
        err.dsv41_after_base = True
        raise err

    calls.fused.sample_sequential = error_past_the_base_logits
    patched = make_sample_sequential(_original(calls))
    with pytest.raises(Exception, match="from vLLM's loop"):
        patched(_Spec(), 4, None)
    assert calls.log == ["fused"] and not speculator._fused_failed
    assert "fused_markov" not in dsv41_gfx942_plugin.stats()


def test_fused_module_that_fails_to_import_is_turned_off_and_vllm_runs(
    calls, monkeypatch, plugin_log
):
    """An import error of the fused module (its Triton or vLLM imports) is a failure like any
    other: logged once, the fused path off, vLLM's loop runs; it never reaches vLLM."""
    import dsv41_gfx942_plugin.ops as ops
    import dsv41_gfx942_plugin.speculator as speculator

    monkeypatch.setattr(speculator, "_fused_failed", False)
    monkeypatch.delattr(ops, "fused_markov")
    monkeypatch.setitem(sys.modules, calls.fused.__name__, None)  # import raises ImportError
    patched = make_sample_sequential(_original(calls))
    patched(_Spec(), 4, None)
    patched(_Spec(), 4, None)
    assert calls.log == ["vllm", "vllm"]
    errors = [r for r in plugin_log.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "ModuleNotFoundError" in errors[0].exc_text
    assert dsv41_gfx942_plugin.stats()["fused_markov"]["reasons"] == {
        "raised": 1, "raised earlier in this process": 1}  # fmt: skip


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the fused Triton kernels run on the CPU only in the interpreter",
)
@pytest.mark.parametrize("greedy", [False, True])
def test_end_to_end_on_vllms_real_speculator(clean_plugin, fake_platform, targets, monkeypatch,
                                             greedy):  # fmt: skip
    """register() on a (stand-in) ROCm gfx942 platform, then a draft step through the patched
    method of vLLM's real DSparkSpeculator: the fused path serves, with vLLM's tokens."""
    import vllm.platforms
    from vllm.platforms.interface import UnspecifiedPlatform
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    import ref_markov as R

    clean_plugin.register()
    assert DSparkSpeculator._sample_sequential is not targets[SAMPLER]
    # The stand-in platform was for register() only; the step runs on this machine's.
    monkeypatch.setattr(vllm.platforms, "_current_platform", UnspecifiedPlatform())
    spec, hidden = R.make_case(vocab=333, rows=3, n_spec=3, greedy=greedy, seed=71)

    def patched(s, rows, h):
        s._sample_sequential(rows, h)  # the instance's (patched) method
        return True

    took, ref, out = R.run_both(spec, 3, hidden, patched)
    R.check_step(spec, 3, hidden, ref, out)
    assert dsv41_gfx942_plugin.stats()["fused_markov"] == {"taken": 1, "declined": 0,
                                                           "reasons": {}}  # fmt: skip
