"""Ahead-of-time build of the plugin's HIP kernels.

Compiles every ``hip/*.hip`` source into ``<out>/<stem>.<arch>.co``:

* ``gfx942`` (the product, shipped in the wheel): an AMDGPU ELF code object, built by ROCm's
  ``hipcc`` or ``amdclang++`` where ROCm is installed, else by a plain clang >= 17 with HIP
  headers and the ROCm device libraries (Debian's ``clang-19``, ``libamdhip64-dev`` and
  ``rocm-device-libs``). Debian's device libraries predate gfx942 and lack
  ``oclc_isa_version_942.bc``; that file only defines the ISA version constant, so the build
  makes it from the gfx940 one in a private copy of the folder.
* ``sm_90`` (tests and benchmarks on an NVIDIA H200, never shipped): a cubin built by ``nvcc``
  from the same source through ``hip/portability.h``.

``setup.py`` calls :func:`build_package` during the wheel build; it also writes the generated
``_build_info.py`` that the status command prints. From the command line::

    python hip/build.py --arch gfx942 --out DIR     # or --arch sm_90; --require fails loudly

With no compiler the build succeeds without code objects and says so, unless ``require`` is set
(``DSV41_GFX942_REQUIRE_HIP=1``, for the ROCm release build and CI), which makes it an error.
"""

from __future__ import annotations

import argparse
import os
import pprint
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HIP_DIR = Path(__file__).resolve().parent
SUPPORTED_ARCHS = ("gfx942", "sm_90")
SHIPPED_ARCHS = ("gfx942",)
REQUIRE_ENV = "DSV41_GFX942_REQUIRE_HIP"
CFLAGS = ["-O3", "-std=c++17"]
MIN_CLANG = 17


class BuildError(RuntimeError):
    """A required code object could not be built."""


# The plugin's boolean spellings (src/dsv41_gfx942_plugin/envs.py; this script runs without the
# package importable, and tests/test_build.py checks the two agree).
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


def _required() -> bool:
    """``DSV41_GFX942_REQUIRE_HIP`` as the plugin's booleans read (``TRUE``, ``FALSE``; unset
    or blank: off). Anything else fails the build rather than turning the requirement off: a
    release build that meant to require the compiler must not ship a wheel without code
    objects."""
    raw = os.environ.get(REQUIRE_ENV, "").strip().lower()
    if raw == "" or raw in FALSE:
        return False
    if raw in TRUE:
        return True
    raise BuildError(f"{REQUIRE_ENV}={os.environ[REQUIRE_ENV]!r} is not a boolean (1 or 0)")


def _log(msg: str) -> None:
    print(f"[dsv41-gfx942 build] {msg}", file=sys.stderr)


def _run(cmd: list[str], stdin: str | None = None) -> str:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def _clang_major(clang: str) -> int:
    try:
        out = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return 0
    m = re.search(r"clang version (\d+)", out)
    return int(m.group(1)) if m else 0


def _rocm_roots() -> list[Path]:
    roots = [os.environ.get(v) for v in ("ROCM_PATH", "ROCM_HOME", "HIP_PATH")]
    return [Path(r) for r in roots if r] + [Path("/opt/rocm")]


def find_rocm_compiler() -> str | None:
    for name in ("hipcc", "amdclang++"):
        if found := shutil.which(name):
            return found
    for root in _rocm_roots():
        for rel in ("bin/hipcc", "llvm/bin/amdclang++", "lib/llvm/bin/amdclang++"):
            if (root / rel).is_file():
                return str(root / rel)
    return None


def _find_plain_clang() -> str | None:
    candidates = [f"clang++-{v}" for v in range(25, MIN_CLANG - 1, -1)] + ["clang++"]
    candidates += [f"/usr/lib/llvm-{v}/bin/clang++" for v in range(25, MIN_CLANG - 1, -1)]
    for name in candidates:
        path = shutil.which(name) or (name if os.path.isfile(name) else None)
        if path and _clang_major(path) >= MIN_CLANG:
            return path
    return None


def _device_lib_dir(clang: str, arch: str, scratch: Path) -> Path | None:
    """A ROCm device-library folder usable for ``arch``, shimmed if the ISA file is missing."""
    for folder in (
        Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode"),
        Path("/usr/lib/amdgcn/bitcode"),
        *(root / "amdgcn/bitcode" for root in _rocm_roots()),
    ):
        if (folder / "ockl.bc").is_file():
            break
    else:
        return None
    isa = f"oclc_isa_version_{arch[3:]}.bc"
    if (folder / isa).is_file():
        return folder
    donor = folder / "oclc_isa_version_940.bc"
    tools = Path(clang).resolve().parent
    dis, asm = tools / "llvm-dis", tools / "llvm-as"
    if not (donor.is_file() and dis.is_file() and asm.is_file()):
        return None
    shim = scratch / "device-libs"
    shutil.copytree(folder, shim, dirs_exist_ok=True)
    text = _run([str(dis), str(donor), "-o", "-"])
    version = f"{arch[3]}{arch[4]}0{arch[5]}"  # gfx942 -> 9402, as ROCm's own file says
    text = text.replace("i32 9400", f"i32 {version}")
    _run([str(asm), "-o", str(shim / isa)], stdin=text)
    return shim


def find_compiler(arch: str) -> list[str] | None:
    """The compiler command (without sources) that builds ``arch``, or None if none is here."""
    if arch == "sm_90":
        nvcc = shutil.which("nvcc")
        return [nvcc, "-x", "cu", "-arch=sm_90", "-cubin", *CFLAGS] if nvcc else None
    if rocm := find_rocm_compiler():
        return [
            rocm,
            "-x",
            "hip",
            f"--offload-arch={arch}",
            "--offload-device-only",
            "--no-gpu-bundle-output",
            *CFLAGS,
        ]
    if clang := _find_plain_clang():
        return [
            clang,
            "-x",
            "hip",
            f"--offload-arch={arch}",
            "--offload-device-only",
            "--no-gpu-bundle-output",
            *CFLAGS,
        ]
    return None


def _find_readelf(compiler: str) -> str | None:
    """llvm-readelf: beside the compiler (amdclang++, a plain clang), in the LLVM of the ROCm
    that holds it (``hipcc`` is in ``<rocm>/bin``, LLVM in ``<rocm>/llvm/bin``, which a ROCm
    image need not put on PATH), on PATH, in the other ROCm roots, or Debian's LLVM."""
    here = Path(compiler).resolve().parent
    for candidate in (
        here / "llvm-readelf",
        here.parent / "llvm" / "bin" / "llvm-readelf",
        here.parent / "lib" / "llvm" / "bin" / "llvm-readelf",
        shutil.which("llvm-readelf"),
        *(root / rel for root in _rocm_roots() for rel in ("llvm/bin/llvm-readelf",
                                                            "lib/llvm/bin/llvm-readelf")),
        *(f"/usr/lib/llvm-{v}/bin/llvm-readelf" for v in range(25, MIN_CLANG - 1, -1)),
    ):  # fmt: skip
        if candidate and os.path.isfile(candidate):
            return str(candidate)
    return None


def _kernel_names(code_object: Path, arch: str, compiler: str) -> list[str]:
    """Kernel symbols of a built code object (AMDGPU metadata notes, or the cubin's symbols)."""
    if arch.startswith("gfx"):
        readelf = _find_readelf(compiler)
        if readelf is None:
            _log(f"{arch}: no llvm-readelf found, the build info lists no kernel names")
            return []
        notes = _run([readelf, "--notes", str(code_object)])
        return sorted(set(re.findall(r"\.symbol:\s+(\S+)\.kd", notes)))
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        return []
    out = _run([cuobjdump, "-elf", str(code_object)])
    return sorted(set(re.findall(r"\.text\.(\w+)", out)))


def build(arch: str, out_dir: Path, require: bool = False) -> dict[str, dict]:
    """Build every ``hip/*.hip`` for ``arch`` into ``out_dir``; returns {file: info}."""
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"arch {arch!r} is not one of {SUPPORTED_ARCHS}")
    sources = sorted(HIP_DIR.glob("*.hip"))
    if not sources:  # an sdist that lost them: a required build must not ship without kernels
        msg = f"{arch}: no HIP source under {HIP_DIR}"
        if require:
            raise BuildError(msg + f"; {REQUIRE_ENV}=1 makes this an error")
        _log(msg + ", nothing to build")
        return {}
    compiler = find_compiler(arch)
    if compiler is None:
        msg = f"{arch}: no compiler found (hipcc, amdclang++, clang++ >= {MIN_CLANG}, or nvcc)"
        if require:
            raise BuildError(msg + f"; {REQUIRE_ENV}=1 makes this an error")
        _log(msg + "; building without code objects, the plugin's HIP hooks will stay off")
        return {}
    out_dir.mkdir(parents=True, exist_ok=True)
    built = {}
    with tempfile.TemporaryDirectory() as scratch:
        cmd = list(compiler)
        if arch.startswith("gfx") and not cmd[0].endswith(("hipcc", "amdclang++")):
            libs = _device_lib_dir(cmd[0], arch, Path(scratch))
            if libs is None:
                msg = f"{arch}: {cmd[0]} has no ROCm device libraries for {arch}"
                if require:
                    raise BuildError(msg)
                _log(msg + "; building without code objects")
                return {}
            cmd.append(f"--rocm-device-lib-path={libs}")
        for src in sources:
            target = out_dir / f"{src.stem}.{arch}.co"
            # clang names a HIP compilation unit by a hash of its paths and options unless told
            # (``__hip_cuid_<hash>``, a symbol of the code object), and the device-library path
            # above is a fresh temporary folder: a fixed name makes the code object the same
            # bytes from build to build and from any checkout path.
            cuid = [f"-cuid=dsv41_{src.stem}"] if arch.startswith("gfx") else []
            _run([*cmd, *cuid, "-I", str(HIP_DIR), str(src), "-o", str(target)])
            kernels = _kernel_names(target, arch, cmd[0])
            built[target.name] = {"arch": arch, "source": src.name, "kernels": kernels}
            _log(f"{arch}: built {target} ({len(kernels)} kernels) with {Path(cmd[0]).name}")
    return built


# Written into an sdist's hip/ by setup.py's sdist command: the commit the sdist was made from.
SDIST_COMMIT = "COMMIT"


def _git_commit() -> str:
    """The source checkout's commit, "-dirty" with uncommitted changes to its tracked files;
    outside a checkout of this project (an unpacked sdist, even one inside another repository,
    whose commit would be that repository's) the commit its sdist recorded (``SDIST_COMMIT``),
    else "unknown"."""
    root = HIP_DIR.parent
    git = ["git", "-C", str(root)]
    try:
        if Path(_run([*git, "rev-parse", "--show-toplevel"]).strip()).resolve() != root.resolve():
            return _sdist_commit()
        commit = _run([*git, "rev-parse", "--short=12", "HEAD"]).strip()
        dirty = _run([*git, "status", "--porcelain", "--untracked-files=no"]).strip()
    except (BuildError, OSError):
        return _sdist_commit()
    return commit + ("-dirty" if dirty else "")


def _sdist_commit() -> str:
    recorded = HIP_DIR / SDIST_COMMIT
    commit = recorded.read_text().strip() if recorded.is_file() else ""
    return commit or "unknown"


def build_package(package_dir: Path, require: bool | None = None) -> dict:
    """The wheel build's step: shipped code objects into ``package_dir/_kernels`` plus
    ``package_dir/_build_info.py``. Returns the recorded build info."""
    if require is None:
        require = _required()
    # The package ships exactly what this build compiles: not a code object an earlier build
    # left in the build folder, nor one copied from the source tree (an sm_90 test build there).
    for stale in (package_dir / "_kernels").glob("*.co"):
        stale.unlink()
    objects: dict[str, dict] = {}
    compilers = {}
    for arch in SHIPPED_ARCHS:
        objects.update(build(arch, package_dir / "_kernels", require=require))
        cmd = find_compiler(arch)
        compilers[arch] = _compiler_version(cmd[0]) if cmd else None
    info = {
        "archs": sorted({o["arch"] for o in objects.values()}),
        "compilers": compilers,
        "commit": _git_commit(),
        "code_objects": objects,
    }
    (package_dir / "_build_info.py").write_text(
        '"""Generated by hip/build.py during the wheel build: what was compiled, by what."""\n\n'
        # A Python literal, not JSON: a compiler not found is None, which JSON spells null.
        f"BUILD_INFO = {pprint.pformat(info, width=100)}\n"
    )
    return info


def _compiler_version(compiler: str) -> str:
    try:
        first = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return compiler
    line = next((ln for ln in first.splitlines() if "version" in ln), first.strip())
    return f"{Path(compiler).name}: {line.strip()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", choices=SUPPORTED_ARCHS)
    parser.add_argument(
        "--out", type=Path, default=HIP_DIR.parent / "src/dsv41_gfx942_plugin/_kernels"
    )
    hint = f"a missing compiler is an error ({REQUIRE_ENV}=1 does the same)"
    parser.add_argument("--require", action="store_true", help=hint)
    args = parser.parse_args(argv)
    try:
        require = _required() or args.require  # the variable read first: a bad value fails
        for arch in args.arch or list(SHIPPED_ARCHS):
            build(arch, args.out, require=require)
    except BuildError as exc:
        _log(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
