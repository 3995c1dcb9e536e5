"""The top-k code object the GPU test modules need, or why they do not run."""

from __future__ import annotations

import pytest

from dsv41_gfx942_plugin.ops import _launcher, topk


def _missing() -> str | None:
    if topk.code_object_path().is_file():
        return None
    arch = _launcher.code_object_arch()
    return (
        f"no top-k code object for {arch} under {_launcher.KERNEL_DIR} (build it: "
        f"python hip/build.py --arch {arch})"
    )


def require() -> None:
    """Module level: skip where this GPU has no top-k code object, except on gfx942, where the
    wheel build makes it (the product): there every test of the module fails instead (the
    module's ``code_object`` fixture, imported from here), rather than the module skipping (an
    inherited ``PYTHONPATH=src`` without ``hip/build.py`` run would skip them all) or the whole
    run stopping at collection."""
    why = _missing()
    if why is not None and _launcher.code_object_arch() != "gfx942":
        pytest.skip(why, allow_module_level=True)


@pytest.fixture(autouse=True)
def code_object():
    """Fails each test of a module that imports it where :func:`require` let a missing gfx942
    code object through."""
    why = _missing()
    if why is not None:
        pytest.fail(why, pytrace=False)
