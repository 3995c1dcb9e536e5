"""``python -m dsv41_gfx942_plugin``: what the plugin would do in a vLLM process on this machine.

Prints the versions it depends on and whether they are supported, the platform and GPU arch,
each patch and whether it would apply here (and why not), the shipped code objects and what
built them, and the ``DSV41_GFX942_*`` settings. It never patches anything and exits 0.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib import metadata
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return f"{metadata.version(name)} ({name})"
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _section(title: str) -> None:
    print(f"\n{title}")


def _versions() -> None:
    from . import vllm_supported, vllm_version

    _section("Versions")
    vllm = vllm_version()
    if vllm is None:
        print("  vllm    no version found (needs >=0.33,<0.34)")
    else:
        print(f"  vllm    {vllm}: {'supported' if vllm_supported(vllm) else 'NOT supported'}"
              " (needs >=0.33,<0.34)")  # fmt: skip
    print(f"  torch   {_dist_version('torch')}")
    print(f"  triton  {_dist_version('pytorch-triton-rocm', 'triton')}")
    print(f"  plugin  {_dist_version('dsv41-gfx942-plugin')}")


ENTRY_POINT = "dsv41_gfx942"  # the plugin's name in vllm.general_plugins (pyproject.toml)
#: Names a VLLM_PLUGINS entry may be meant as, spaces, case and dashes aside: the entry point's,
#: the package's.
_NEAR_NAMES = (ENTRY_POINT, "dsv41_gfx942_plugin")


def _not_loaded_by_vllm() -> str | None:
    """Why vLLM's plugin loader would not call register() here (no installed entry point, as
    when the package is only on PYTHONPATH; its VLLM_PLUGINS allowlist, as vLLM parses it), or
    None."""
    if ENTRY_POINT not in {ep.name for ep in metadata.entry_points(group="vllm.general_plugins")}:
        return (f"no {ENTRY_POINT} entry point in vllm.general_plugins (the plugin is not "
                "installed; vLLM does not load it from a source tree on PYTHONPATH)")  # fmt: skip
    allowed = importlib.import_module("vllm.envs").VLLM_PLUGINS
    if allowed is not None and ENTRY_POINT not in allowed:
        # vLLM compares each name exactly: name the ones that look meant for this plugin.
        near = [n for n in allowed if n.strip().lower().replace("-", "_") in _NEAR_NAMES]
        hint = f" (vLLM takes each name exactly: {', '.join(map(repr, near))})" if near else ""
        return f"VLLM_PLUGINS={','.join(allowed)!r} does not list {ENTRY_POINT}{hint}"
    return None


def _no_patch() -> str | None:
    """Why register() would apply no patch (each switched off or not fitting this vLLM, as the
    Patches section says for each), which it reports as inactive; or None."""
    from .patches import check_all

    return None if None in check_all().values() else "no patch would apply"


def _platform() -> str | None:
    from . import inactive_reason

    _section("Platform")
    try:
        import torch

        hip = getattr(torch.version, "hip", None)
        print(f"  torch build: {'ROCm/HIP ' + hip if hip else 'CUDA ' + str(torch.version.cuda)}")
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            arch = getattr(props, "gcnArchName", None) or f"sm_{props.major}{props.minor}"
            print(f"  GPU 0: {props.name}, arch {arch}")
        else:
            print("  GPU: none visible")
    except Exception as exc:
        print(f"  torch: {type(exc).__name__}: {exc}")
    try:
        platform = importlib.import_module("vllm.platforms").current_platform
        print(f"  vLLM platform: {type(platform).__name__}")
        reason = _not_loaded_by_vllm() or inactive_reason() or _no_patch()
    except Exception as exc:
        reason = f"could not decide: {type(exc).__name__}: {exc}"
    print(
        f"  plugin in a vLLM process here: {'ACTIVE' if reason is None else 'inactive: ' + reason}"
    )
    return reason


def _patches(inactive: str | None) -> None:
    from .patches import check_all

    _section("Patches (see patches.py for the ledger)")
    for target, why_not in check_all().items():
        if why_not is None and inactive is None:
            print(f"  {target}: would apply")
        elif why_not is None:
            print(f"  {target}: fits this vLLM; not applied here (plugin inactive)")
        else:
            print(f"  {target}: would NOT apply: {why_not}")


def _code_objects() -> None:
    _section("Code objects (built ahead of time into the wheel)")
    try:
        info = importlib.import_module("dsv41_gfx942_plugin._build_info").BUILD_INFO
    except ImportError:
        # A source tree: `python hip/build.py` puts code objects here without build info, and
        # the loader takes them all the same.
        found = sorted((PACKAGE_DIR / "_kernels").glob("*.co"))
        print("  no build info: this is a source tree, not an installed wheel")
        for path in found:
            print(f"  {path.name} ({path.stat().st_size} bytes), from hip/build.py")
        if not found:
            print("  no code object here (`python hip/build.py` builds one into _kernels/)")
        return
    print(f"  built from commit {info.get('commit')}, archs {info.get('archs') or 'none'}")
    for arch, compiler in (info.get("compilers") or {}).items():
        print(f"  {arch} compiler: {compiler or 'none found at build time'}")
    objects = info.get("code_objects") or {}
    if not objects:
        print("  no code object in this build: the HIP hooks stay off, vLLM's ops run")
    for name, obj in objects.items():
        path = PACKAGE_DIR / "_kernels" / name
        found = f"{path.stat().st_size} bytes" if path.is_file() else "MISSING"
        print(f"  {name} ({obj.get('arch')}, {found}): {', '.join(obj.get('kernels', []))}")


def _settings() -> None:
    from . import envs

    _section("Settings (DSV41_GFX942_*)")
    for name, value in envs.settings().items():
        print(f"  {name}={value}  # {envs.VARIABLES[name].help}")
    _section("Hook counters")
    print("  kept per vLLM process; this command runs in its own process and cannot see them.")
    print("  Inside vLLM: dsv41_gfx942_plugin.stats(); a worker logs them at exit, and after its")
    print("  first decode step where the plugin's indexer serves.")


def main() -> int:
    print("dsv41-gfx942-plugin status")
    for step in (_versions, _platform):
        try:
            inactive = step()
        except Exception as exc:
            print(f"  error: {type(exc).__name__}: {exc}")
            inactive = "unknown"
    for step in (lambda: _patches(inactive), _code_objects, _settings):
        try:
            step()
        except Exception as exc:
            print(f"  error: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left early (`| head`): not this command's failure
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as the Python docs do
        code = 0
    sys.exit(code)
