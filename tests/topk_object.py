"""The top-k code object the GPU test modules need, or why they do not run."""

from __future__ import annotations

import pytest

from dsv41_gfx942_plugin.ops import _launcher, topk


def require() -> None:
    """Module level: skip where this GPU has no top-k code object, except on gfx942, where the
    wheel build makes it (the product): its absence there is an error, not a skipped module (an
    inherited ``PYTHONPATH=src`` without ``hip/build.py`` run would otherwise skip them all)."""
    if topk.code_object_path().is_file():
        return
    arch = _launcher.code_object_arch()
    why = (
        f"no top-k code object for {arch} under {_launcher.KERNEL_DIR} (build it: "
        f"python hip/build.py --arch {arch})"
    )
    if arch == "gfx942":
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)
