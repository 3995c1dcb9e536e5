"""The top-k code object the GPU test modules need, or why they do not run."""

from __future__ import annotations

import pytest

from dsv41_gfx942_plugin.ops import _launcher, topk


def require() -> None:
    """Module level: skip where this GPU has no top-k code object, except on gfx942, where the
    wheel build makes it (the product): there the module runs and its tests fail, as they do
    for a code object that does not load (``topk.build()`` is False, with its warning naming the
    path), rather than the module skipping (an inherited ``PYTHONPATH=src`` without
    ``hip/build.py`` run would skip them all) or the whole run stopping at collection."""
    if topk.code_object_path().is_file():
        return
    arch = _launcher.code_object_arch()
    if arch != "gfx942":
        pytest.skip(
            f"no top-k code object for {arch} under {_launcher.KERNEL_DIR} (build it: "
            f"python hip/build.py --arch {arch})",
            allow_module_level=True,
        )
