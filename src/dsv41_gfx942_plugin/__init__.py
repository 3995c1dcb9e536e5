"""dsv41-gfx942-plugin: faster DeepSeek-V4.1 decode on AMD gfx942 for vLLM 0.33.

vLLM calls :func:`register` (entry point ``dsv41_gfx942`` of group ``vllm.general_plugins``) in
every process it starts. On ROCm gfx942 it patches two places of vLLM (see ``patches.py``);
everywhere else it patches nothing and says why in one INFO line.
"""

from __future__ import annotations

import re

from .counters import stats

__all__ = ["SUPPORTED_VLLM", "register", "stats", "status"]

#: The vLLM releases whose internals this plugin was written against: [0.33, 0.34).
SUPPORTED_VLLM = ((0, 33), (0, 34))

_status: str | None = None


def vllm_version() -> str | None:
    """The installed vLLM's version: from its distribution metadata, else (a build installed
    without metadata, or with a dist-info folder that lacks it, where ``metadata.version`` gives
    None) its ``vllm.__version__``; None when neither is there."""
    import importlib
    from importlib import metadata

    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        version = None
    if isinstance(version, str):
        return version
    try:
        version = importlib.import_module("vllm").__version__
    except (ImportError, AttributeError):
        return None
    return version if isinstance(version, str) else None


#: A version's epoch and first two release numbers, as PEP 440 spells them ("0.33.0", "0.33rc1",
#: "v0.33.0", "0!0.33"); what follows them (more numbers, a pre-release, a local label) is free.
_VERSION = re.compile(r"v?(?:(\d+)!)?(\d+)\.(\d+)(?!\d)")


def vllm_supported(version: str) -> bool:
    """Whether ``version`` (e.g. "0.33.0", "0.33.1rc1", "0.33.0+rocm700") is in
    :data:`SUPPORTED_VLLM`: of valid PEP 440 versions, those pip's ``>=0.33.0.dev0,<0.34``
    admits, however spelt. Only the leading epoch and two numbers are read, so a string that is
    no version but begins like one ("0.33garbage") passes; vLLM's ``__version__`` is written
    by its build from the same version its wheel's metadata carries (or is "dev")."""
    match = _VERSION.match(version.strip().lower())
    if match is None:
        return False
    epoch, major, minor = match.groups()
    low, high = SUPPORTED_VLLM
    return int(epoch or 0) == 0 and low <= (int(major), int(minor)) < high


def inactive_reason() -> str | None:
    """Why the plugin must stay off in this process, or None; checked in the documented
    order: the off switch, the vLLM version, the ROCm platform, the gfx942 arch."""
    import importlib

    from . import envs

    if envs.disabled():
        return "turned off by DSV41_GFX942_DISABLE"
    version = vllm_version()
    if version is None:
        return "no vLLM version found (no distribution metadata, no vllm.__version__)"
    if not vllm_supported(version):
        return f"vLLM {version} is not supported (needs >=0.33,<0.34)"
    platforms = importlib.import_module("vllm.platforms")
    platform = platforms.current_platform
    if not platform.is_rocm():
        return f"platform is {type(platform).__name__}, not ROCm"
    rocm = importlib.import_module("vllm.platforms.rocm")
    if not rocm.on_gfx942():
        return "GPU is not gfx942 (MI300X/MI325X)"
    return None


def _register() -> str:
    from . import patches
    from ._log import logger

    reason = inactive_reason()
    if reason is not None:
        logger.info("dsv41_gfx942 plugin inactive: %s", reason)
        return "inactive: " + reason
    results = patches.apply_all()
    done = [t.rsplit(".", 2)[-2] + "." + t.rsplit(".", 1)[-1] for t, r in results.items()
            if r == "applied"]  # fmt: skip
    if not done:  # every patch switched off (the status command says which) or its check failed
        # (which logged a warning)
        logger.info("dsv41_gfx942 plugin inactive on gfx942: no patch applied")
        return "inactive: no patch applied"
    logger.info("dsv41_gfx942 plugin active on gfx942: patched %s", ", ".join(done))
    return "active"


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Never raises; a second call does nothing.

    A bug here becomes one logged error and an inactive plugin: whatever was patched before
    the error is undone, so vLLM runs unchanged.
    """
    global _status
    if _status is not None:
        return
    _status = "registering"
    try:
        _status = _register()
    except Exception:
        _status = "inactive: internal error"
        try:
            from . import patching
            from ._log import logger

            patching.undo_all()
            logger.exception("dsv41_gfx942 plugin failed to register; it stays inactive")
        except Exception:  # even logging failed: stay silent rather than take vLLM down
            pass


def status() -> str | None:
    """What :func:`register` decided in this process ("active", "inactive: why"), or None."""
    return _status
