"""Shared fixtures: the plugin's log records, a stand-in ROCm gfx942 platform, a clean slate.

vLLM's "vllm" logger does not propagate to the root logger, where pytest's ``caplog`` listens,
so :func:`plugin_log` attaches caplog's handler to the plugin's logger itself.
"""

from __future__ import annotations

import logging
import os
import sys
import types

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    # No GPU: run Triton kernels (vLLM's and ours) in the interpreter, set before anything
    # imports Triton. vLLM keeps Triton on without a GPU only if CUDA_VISIBLE_DEVICES is empty.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["TRITON_INTERPRET"] = "1"

import dsv41_gfx942_plugin as plugin
from dsv41_gfx942_plugin import counters, patches, patching
from dsv41_gfx942_plugin._log import LOGGER_NAME

# The modules the patches target, imported while vLLM still sees this machine's real platform.
TARGET_MODULES = (
    "vllm.models.deepseek_v41.attention",
    "vllm.model_executor.layers.sparse_attn_indexer",
    "vllm.v1.attention.ops.rocm_aiter_mla_sparse",
    "vllm.v1.worker.gpu.spec_decode.dspark.speculator",
)


def _reaches_root(logger: logging.Logger) -> bool:
    node = logger
    while node is not None and node.propagate:
        node = node.parent
    return node is None or node is logging.getLogger()


@pytest.fixture
def plugin_log(caplog):
    """caplog, wired to the plugin's logger at DEBUG (each record captured once), with vLLM's
    ``*_once`` memory cleared so that a test sees its own once-only records."""
    import vllm.logger as vllm_logger

    for name in ("_print_debug_once", "_print_info_once", "_print_warning_once"):
        getattr(vllm_logger, name).cache_clear()
    logger = logging.getLogger(LOGGER_NAME)
    attach = not _reaches_root(logger)
    if attach:
        logger.addHandler(caplog.handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    caplog.handler.setLevel(logging.DEBUG)
    yield caplog
    if attach:
        logger.removeHandler(caplog.handler)
    logger.setLevel(old)


@pytest.fixture
def clean_plugin(monkeypatch):
    """A process in which register() has not run yet and nothing is patched; undone after."""
    for name in list(os.environ):
        if name.startswith("DSV41_GFX942_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(plugin, "_status", None)
    patching.undo_all()
    counters.reset()
    yield plugin
    patching.undo_all()
    counters.reset()


class _FakeRocm:
    """Stands in for vLLM's RocmPlatform in what register() asks of it."""

    def is_rocm(self) -> bool:
        return True


@pytest.fixture
def fake_platform(monkeypatch):
    """Make vLLM report a ROCm platform with a gfx942 GPU (or not: set ``.gfx942``)."""
    import importlib

    for name in TARGET_MODULES:
        importlib.import_module(name)
    import vllm.platforms

    state = types.SimpleNamespace(gfx942=True)
    rocm = types.ModuleType("vllm.platforms.rocm")
    rocm.on_gfx942 = lambda: state.gfx942
    monkeypatch.setattr(vllm.platforms, "_current_platform", _FakeRocm())
    monkeypatch.setitem(sys.modules, "vllm.platforms.rocm", rocm)
    return state


@pytest.fixture
def targets():
    """vLLM's original objects at each patch target, read before any patch."""
    return {
        patch.target: vars(patching.resolve(f"{patch.module}:{patch.owner}"))[patch.attr]
        for patch, _ in patches.PATCHES
    }
