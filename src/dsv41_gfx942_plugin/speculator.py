"""The replacement of ``DSparkSpeculator._sample_sequential`` (vLLM 0.33.0).

It keeps vLLM's order and adds one step: the ``_draft_topk`` path (vLLM's), then the draft
model's own ``sample_sequential`` hook (vLLM's; with ``--monokernel`` on gfx942 that is vLLM's
in-tree fused path, which serves the steps it takes: sampled drafts of at most 8 requests), then
the plugin's fused Markov launches (``ops.fused_markov``), then vLLM's loop. When the fused path
declines, vLLM's original runs whole; it asks the draft model's hook once more, which declines
again having done nothing (one Python call, no kernel).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from . import counters
from ._log import logger, warn_markov_out_of_memory
from .ops import _launcher

HOOK = counters.FUSED_MARKOV


def _served_by(path: str) -> None:
    logger.info_once("dsv41_gfx942: DSpark Markov draft sampling is served by %s", path)


def _indexer_path() -> str:
    """Which indexer serves DeepSeek-V4.1 in this process, for the --monokernel log line."""
    indexer = sys.modules.get(f"{__package__}.indexer")  # imported where patch 1 applied
    if indexer is None:
        return "vLLM's op (the plugin's indexer patch is not applied in this process)"
    if indexer.layers_built:
        return "the plugin's decode path"
    return "vLLM's own indexer class (--monokernel or MXFP4: the plugin's patch is bypassed)"


_fused_failed = False


def _fused(spec, num_reqs: int, head_hidden) -> bool:
    """The plugin's fused path; True when it did the step (which the fused path counts: its
    launches, or vLLM's loop from the base logits it computed). If it raises, it is logged once
    and stays off in this process, and vLLM's loop runs (rewriting every token and cached logit
    the fused path may have touched), so a plugin bug never takes the server down. Running out of
    GPU memory before the step's base logits is no bug: that step takes vLLM's loop, and the next
    tries the fused path again. Once the fused path has asked for the step's base logits, it
    finishes the step itself, its own errors there included (computing them again would repeat
    the lm_head's tensor-parallel all-gather on this rank alone), and an error that vLLM's own op
    or loop raises there (out of memory in vLLM's draft logits too; marked ``dsv41_after_base``)
    goes to vLLM as it would without the plugin."""
    global _fused_failed
    try:
        from .ops import fused_markov  # inside: an import that fails is a failure like any other

        if fused_markov.sample_sequential(spec, num_reqs, head_hidden):
            return True
        counters.record(HOOK, False, "fused path declined")
    except Exception as e:
        if getattr(e, "dsv41_after_base", False):
            raise  # vLLM's own op or loop, past the step's base logits (counted by fused_markov)
        if isinstance(e, torch.OutOfMemoryError):
            counters.record(HOOK, False, "out of memory")
            warn_markov_out_of_memory()
        else:
            _launcher.clear_last_error()  # else vLLM's loop, next, could raise the path's HIP error
            _fused_failed = True
            counters.record(HOOK, False, "raised")
            logger.exception("dsv41_gfx942: the fused Markov path raised; it stays off in this "
                             "process and vLLM's loop runs instead")  # fmt: skip
    return False


def make_sample_sequential(original: Callable) -> Callable:
    """The patched ``_sample_sequential`` around vLLM's ``original`` (applied only where
    ``DSV41_GFX942_FUSED_MARKOV`` is on: ``patches.SAMPLER``)."""

    def _sample_sequential(self, num_reqs: int, head_hidden) -> None:
        if self._draft_topk is not None:
            counters.record(HOOK, False, "draft top-k path")
            _served_by("vLLM's draft top-k path")
            return original(self, num_reqs, head_hidden)
        model_hook = getattr(self.model, "sample_sequential", None)
        if model_hook is not None and model_hook(self, num_reqs, head_hidden):
            counters.record(HOOK, False, "draft model's own hook")
            _served_by("the draft model's own sample_sequential (vLLM's --monokernel path); "
                       f"the DSv4.1 indexer by {_indexer_path()}")  # fmt: skip
            return None
        if _fused_failed:
            counters.record(HOOK, False, "raised earlier in this process")
        elif _fused(self, num_reqs, head_hidden):
            # The step the fused path did (and counted): its launches, or vLLM's loop from its
            # base logits, which on a comparison step leaves which path serves undecided.
            taken, reason = counters.last(HOOK) or (False, "")
            if taken:
                _served_by("the plugin's fused Markov launches")
            elif reason != counters.COMPARED:
                _served_by("vLLM's loop")
            return None
        _served_by("vLLM's loop")
        return original(self, num_reqs, head_hidden)

    _sample_sequential.__wrapped__ = original
    _sample_sequential.__doc__ = __doc__
    return _sample_sequential
