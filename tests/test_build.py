"""The ahead-of-time build driver (hip/build.py) and what the installed wheel carries.

Where ``DSV41_GFX942_REQUIRE_HIP=1`` (CI), a missing compiler fails these tests instead of
skipping them, so CI always builds a real gfx942 code object.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dsv41_gfx942_plugin import envs

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = envs.get_bool("DSV41_GFX942_REQUIRE_HIP")  # as the build reads it
KERNEL = 'extern "C" __global__ void addone(float* x, int n) { if (threadIdx.x < n) x[threadIdx.x] += 1.f; }\n'  # noqa: E501


@pytest.fixture
def hip_build():
    spec = importlib.util.spec_from_file_location("dsv41_hip_build_test", ROOT / "hip" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_kernel(tmp_path, monkeypatch, hip_build):
    src = tmp_path / "hip"
    src.mkdir()
    (src / "tiny.hip").write_text("#include <hip/hip_runtime.h>\n" + KERNEL)
    monkeypatch.setattr(hip_build, "HIP_DIR", src)
    return hip_build


def _script(path: Path, body: str = "") -> Path:
    """An executable shell script at ``path`` (its folder made) running ``body``: a stand-in
    compiler or tool."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_no_source_builds_nothing_and_says_so(tmp_path, monkeypatch, hip_build, capsys):
    """No ``hip/*.hip`` (an sdist that lost them): nothing built, said so; a required build
    fails, as it does without a compiler, instead of shipping a wheel without kernels."""
    monkeypatch.setattr(hip_build, "HIP_DIR", tmp_path)
    assert hip_build.build("gfx942", tmp_path / "out") == {}
    assert "no HIP source" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(hip_build.BuildError, match="no HIP source"):
        hip_build.build("gfx942", tmp_path / "out", require=True)


def test_missing_compiler_is_fine_unless_required(tmp_path, monkeypatch, one_kernel, capsys):
    monkeypatch.setattr(one_kernel, "find_compiler", lambda arch: None)
    assert one_kernel.build("gfx942", tmp_path / "out") == {}
    assert "no compiler found" in capsys.readouterr().err
    with pytest.raises(one_kernel.BuildError, match="DSV41_GFX942_REQUIRE_HIP=1"):
        one_kernel.build("gfx942", tmp_path / "out", require=True)


def test_missing_device_libraries_are_fine_unless_required(
    tmp_path, monkeypatch, one_kernel, capsys
):
    """A plain clang without the ROCm device libraries for the arch: no code object and a
    message, or with ``require`` an error (a ROCm CI's wheel must not ship without them)."""
    monkeypatch.setattr(one_kernel, "find_compiler", lambda arch: ["clang++-19"])
    monkeypatch.setattr(one_kernel, "_device_lib_dir", lambda *args: None)
    assert one_kernel.build("gfx942", tmp_path / "out") == {}
    assert "no ROCm device libraries" in capsys.readouterr().err
    with pytest.raises(one_kernel.BuildError, match="no ROCm device libraries"):
        one_kernel.build("gfx942", tmp_path / "out", require=True)


@pytest.mark.parametrize(
    "raw,required", [("", False), (" ", False), ("0", False), ("off", False), ("1", True),
                     (" Yes ", True), ("2", None), ("required", None)],
)  # fmt: skip
def test_require_variable(raw, required, monkeypatch, hip_build):
    """The build's switch reads as the plugin's booleans; a value it cannot read fails the
    build instead of silently not requiring the compiler."""
    assert (hip_build.TRUE, hip_build.FALSE) == (envs._TRUE, envs._FALSE)  # one reading
    monkeypatch.setenv(hip_build.REQUIRE_ENV, raw)
    if required is None:
        with pytest.raises(hip_build.BuildError, match=f"REQUIRE_HIP={raw!r} is not a boolean"):
            hip_build._required()
    else:
        assert hip_build._required() is required


@pytest.mark.parametrize(
    ("raw", "error"),
    [("2", "not a boolean"), ("required", "not a boolean"), ("1", "no compiler"),
     (" TRUE ", "no compiler"), ("0", None), ("", None), (" ", None)],
)  # fmt: skip
def test_build_package_reads_the_require_variable(tmp_path, monkeypatch, one_kernel, raw, error):
    """The wheel build (setup.py calls build_package) without a compiler: an error where the
    switch is on in any spelling (README: a missing compiler is an error) or not a boolean; a
    wheel without code objects where it is off, empty or blank."""
    monkeypatch.setattr(one_kernel, "find_compiler", lambda arch: None)
    monkeypatch.setenv(one_kernel.REQUIRE_ENV, raw)
    (tmp_path / "pkg").mkdir()  # the built package's folder, as setup.py hands it over
    if error is None:
        assert one_kernel.build_package(tmp_path / "pkg")["code_objects"] == {}
    else:
        with pytest.raises(one_kernel.BuildError, match=error):
            one_kernel.build_package(tmp_path / "pkg")


@pytest.mark.parametrize(
    "raw,flag,code", [("1", [], 1), ("0", [], 0), ("2", [], 1), ("0", ["--require"], 1),
                      ("2", ["--require"], 1)],
)  # fmt: skip
def test_command_reads_the_require_variable(tmp_path, monkeypatch, one_kernel, raw, flag, code):
    """`python hip/build.py` fails without a compiler where the variable or --require asks it
    to, and where the variable cannot be read (with --require too), as the wheel build does."""
    monkeypatch.setattr(one_kernel, "find_compiler", lambda arch: None)
    monkeypatch.setenv(one_kernel.REQUIRE_ENV, raw)
    assert one_kernel.main(["--arch", "gfx942", "--out", str(tmp_path / "out"), *flag]) == code


def test_command_reads_the_variable_even_with_require(tmp_path, monkeypatch, one_kernel):
    """--require does not skip reading the variable: one it cannot read fails the command even
    where every build succeeds."""
    monkeypatch.setattr(one_kernel, "build", lambda *args, **kwargs: {})
    monkeypatch.setenv(one_kernel.REQUIRE_ENV, "2")
    assert one_kernel.main(["--arch", "gfx942", "--out", str(tmp_path / "out"), "--require"]) == 1


#: Where a ROCm compiler is put, and whether the build finds it (README, Install: on PATH, or
#: under $ROCM_PATH, $ROCM_HOME, $HIP_PATH; a blank variable or a folder by the name is none).
_ROCM_COMPILERS = [
    ("PATH", "hipcc", True), ("PATH", "amdclang++", True), ("ROCM_PATH", "bin/hipcc", True),
    ("ROCM_HOME", "llvm/bin/amdclang++", True), ("HIP_PATH", "lib/llvm/bin/amdclang++", True),
    ("ROCM_PATH", "bin/hipcc/", False), ("ROCM_PATH", "hipcc", False),
    ("ROCM_PATH", "bin/HIPCC", False), ("", "", False),
]  # fmt: skip


@pytest.mark.parametrize(("where", "rel", "found"), _ROCM_COMPILERS)
def test_rocm_compiler_search(tmp_path, monkeypatch, hip_build, where, rel, found):
    """The build finds ROCm's compiler where the README says it looks, and nothing elsewhere."""
    if Path("/opt/rocm").exists():
        pytest.skip("a ROCm install here would be found whatever the test sets")
    root = tmp_path / "root"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    for name in ("ROCM_PATH", "ROCM_HOME", "HIP_PATH"):
        monkeypatch.setenv(name, "")  # blank: no root
    if where:
        target = root / rel
        if rel.endswith("/"):
            target.mkdir(parents=True)
        else:
            _script(target)
        monkeypatch.setenv(where, str(root if where != "PATH" else target.parent))
    assert hip_build.find_rocm_compiler() == (str(root / rel) if found else None)


def test_compiler_search_order(tmp_path, monkeypatch, hip_build):
    """README, Install: a ROCm compiler on PATH before one under the ROCm roots, a ROCm compiler
    before a plain clang, the newest plain clang of at least MIN_CLANG (17) before an older
    one; never one older than MIN_CLANG (the machine's own /usr/lib/llvm-* may then be found)."""
    bin_, root = tmp_path / "bin", tmp_path / "rocm"
    monkeypatch.setenv("PATH", str(bin_))
    for name in ("ROCM_HOME", "HIP_PATH"):
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("ROCM_PATH", str(root))
    clang16 = _script(bin_ / "clang++", "echo 'clang version 16.0.6'")
    assert hip_build._find_plain_clang() != str(clang16)
    clang17 = _script(bin_ / "clang++-17", "echo 'Ubuntu clang version 17.0.6'")
    assert hip_build._find_plain_clang() == str(clang17)  # 17 is new enough
    clang19 = _script(bin_ / "clang++-19", "echo 'Debian clang version 19.1.7'")
    assert hip_build._find_plain_clang() == str(clang19)
    in_root = _script(root / "bin" / "hipcc")
    assert hip_build.find_compiler("gfx942")[0] == str(in_root)
    on_path = _script(bin_ / "hipcc")
    assert hip_build.find_compiler("gfx942")[0] == str(on_path)


def test_rocm_roots_in_order(monkeypatch, hip_build):
    """$ROCM_PATH, $ROCM_HOME, $HIP_PATH, then /opt/rocm (README, Install); an unset or empty
    variable is skipped."""
    monkeypatch.setenv("ROCM_PATH", "/a")
    monkeypatch.setenv("ROCM_HOME", "")
    monkeypatch.setenv("HIP_PATH", "/c")
    assert hip_build._rocm_roots() == [Path("/a"), Path("/c"), Path("/opt/rocm")]
    monkeypatch.delenv("ROCM_PATH")
    monkeypatch.setenv("ROCM_HOME", "/b")
    assert hip_build._rocm_roots() == [Path("/b"), Path("/c"), Path("/opt/rocm")]


@pytest.mark.parametrize(
    ("says", "major"),
    [("Ubuntu clang version 19.1.7 (3)", 19), ("clang version 16.0.6", 16), ("gcc 14", 0),
     ("", 0), (None, 0)],
)  # fmt: skip
def test_plain_clang_version(tmp_path, hip_build, says, major):
    """A plain clang counts from version 17 (README: "a plain clang >= 17"); its version is read
    from ``--version``, and one that says none, or no program, counts as none."""
    clang = tmp_path / "clang++"
    if says is not None:
        _script(clang, f"echo '{says}'")
    assert hip_build._clang_major(str(clang)) == major
    assert hip_build.MIN_CLANG == 17


def test_unknown_arch_is_refused(tmp_path, hip_build):
    with pytest.raises(ValueError, match="gfx90a"):
        hip_build.build("gfx90a", tmp_path)


def test_build_package_ships_only_what_it_built(tmp_path, monkeypatch, one_kernel):
    """A code object left in the package folder (an earlier build's, or an sm_90 test build
    copied from the source tree) is not shipped: without a compiler the folder ends empty,
    as the build info says."""
    kernels = tmp_path / "pkg" / "_kernels"
    kernels.mkdir(parents=True)
    for name in ("topk512.gfx942.co", "topk512.sm_90.co"):
        (kernels / name).write_bytes(b"stale")
    monkeypatch.setattr(one_kernel, "find_compiler", lambda arch: None)
    info = one_kernel.build_package(tmp_path / "pkg", require=False)
    assert info["code_objects"] == {} and list(kernels.glob("*.co")) == []
    assert info["compilers"] == {"gfx942": None}
    namespace: dict = {}  # the recorded info reads back (JSON's null was a NameError here)
    exec((tmp_path / "pkg" / "_build_info.py").read_text(), namespace)
    assert namespace["BUILD_INFO"] == info


def test_build_package_records_what_it_built(tmp_path, one_kernel):
    if one_kernel.find_compiler("gfx942") is None and not REQUIRED:
        pytest.skip("no gfx942-capable compiler here")
    pkg = tmp_path / "pkg"
    (one_kernel.HIP_DIR / one_kernel.SDIST_COMMIT).write_text("0123456789ab\n")  # an sdist's
    info = one_kernel.build_package(pkg, require=True)
    assert info["archs"] == ["gfx942"]
    obj = pkg / "_kernels" / "tiny.gfx942.co"
    assert obj.read_bytes()[:4] == b"\x7fELF"
    assert info["code_objects"]["tiny.gfx942.co"]["kernels"] == ["addone"]
    assert info["compilers"]["gfx942"]
    assert info["commit"] == "0123456789ab"
    namespace: dict = {}
    exec((pkg / "_build_info.py").read_text(), namespace)
    assert namespace["BUILD_INFO"] == info


def test_installed_wheel_carries_its_build_info():
    import dsv41_gfx942_plugin

    if ROOT / "src" in Path(dsv41_gfx942_plugin.__file__).parents:
        pytest.skip("the package comes from the source tree (PYTHONPATH=src), not a wheel")
    from dsv41_gfx942_plugin import _build_info

    info = _build_info.BUILD_INFO
    kernels_dir = Path(_build_info.__file__).parent / "_kernels"
    shipped = sorted(p.name for p in kernels_dir.glob("*.co"))
    assert shipped == sorted(info["code_objects"])  # no stale or sm_90 object beside them
    if REQUIRED and list((ROOT / "hip").glob("*.hip")):
        from dsv41_gfx942_plugin.ops import topk

        assert info["archs"] == ["gfx942"]
        # Every kernel the hooks launch, as the code object's notes name them.
        assert set(topk.KERNELS) <= set(info["code_objects"]["topk512.gfx942.co"]["kernels"])


def test_installed_wheel_is_pure_python():
    """README: the wheel holds no torch-ABI-dependent binary, so one wheel serves every torch
    and ROCm that vLLM 0.33 runs on: it is tagged for any Python and platform, and ships no
    compiled extension, only Python and the code objects loaded through HIP at run time."""
    from importlib import metadata

    # The installed wheel's metadata (not a source tree's egg-info, first on PYTHONPATH=src).
    wheels = [d for d in metadata.distributions(name="dsv41-gfx942-plugin") if d.read_text("WHEEL")]
    if not wheels:
        pytest.skip("the plugin's wheel is not installed here (tests/run.sh installs it)")
    dist = wheels[0]
    wheel = dist.read_text("WHEEL")
    assert "Root-Is-Purelib: true" in wheel
    assert [ln for ln in wheel.splitlines() if ln.startswith("Tag:")] == ["Tag: py3-none-any"]
    shipped = {Path(str(f)).suffix for f in dist.files or () if "__pycache__" not in str(f)}
    assert shipped and shipped <= {"", ".py", ".co", ".txt", ".json"}, shipped


def _git(cwd: Path, *args: str) -> str:
    who = {
        f"GIT_{r}_{f}": v
        for r in ("AUTHOR", "COMMITTER")
        for f, v in (("NAME", "t"), ("EMAIL", "t@t"))
    }
    env = {**os.environ, **who}
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()  # fmt: skip


def test_recorded_commit_is_this_checkouts(tmp_path, monkeypatch, hip_build):
    """The build records its own checkout's commit, marked dirty by a changed tracked file, and
    for a source tree inside another repository or none (an sdist unpacked in a CI workspace)
    the commit the sdist recorded, else "unknown"."""
    outer = tmp_path / "outer"
    (outer / "pkg" / "hip").mkdir(parents=True)
    (outer / "pkg" / "hip" / "k.hip").write_text("// one\n")
    _git(outer, "init", "-q")
    _git(outer, "add", ".")
    _git(outer, "commit", "-qm", "outer")
    monkeypatch.setattr(hip_build, "HIP_DIR", outer / "pkg" / "hip")
    assert hip_build._git_commit() == "unknown"
    monkeypatch.setattr(hip_build, "HIP_DIR", outer / "hip")
    (outer / "hip").mkdir()
    head = _git(outer, "rev-parse", "--short=12", "HEAD")
    assert hip_build._git_commit() == head
    (outer / "pkg" / "hip" / "k.hip").write_text("// two\n")
    assert hip_build._git_commit() == head + "-dirty"
    monkeypatch.setattr(hip_build, "HIP_DIR", tmp_path / "none" / "hip")
    (tmp_path / "none" / "hip").mkdir(parents=True)
    assert hip_build._git_commit() == "unknown"
    # An unpacked sdist records the commit its sdist command wrote, inside a repository or not.
    for hip in (outer / "pkg" / "hip", tmp_path / "none" / "hip"):
        (hip / hip_build.SDIST_COMMIT).write_text("0123456789ab\n")
        monkeypatch.setattr(hip_build, "HIP_DIR", hip)
        assert hip_build._git_commit() == "0123456789ab"


def test_sdist_records_the_commit(tmp_path, hip_build):
    """An sdist of this checkout carries its commit (``hip/COMMIT``, as ``_git_commit`` gives it
    here), which a wheel built from that sdist records instead of "unknown", and the HIP
    sources and build script that wheel's build compiles with."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/hip/COMMIT"))
        recorded = tar.extractfile(member).read().decode().strip()
        hip = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/hip/" in m.name}
    assert recorded == hip_build._git_commit() != "unknown"
    kinds = (".hip", ".h", ".py")
    sources = [f"hip/{p.name}" for p in (ROOT / "hip").iterdir() if p.suffix in kinds]
    assert len(sources) >= 5 and hip >= set(sources)


@pytest.mark.parametrize(
    "version",
    ["0.33.0", "0.33.0rc1", "0.33.0+rocm700", "0.33.0rc1+rocm700", "0.33.1.dev5+g1a2b.rocm700",
     "0.33.9", "0.32.9", "0.32.9.dev3+rocm700", "0.34.0", "0.34.0rc1", "0.34.0.dev1", "1.33.0",
     # Other spellings PEP 440 gives the same versions: no patch number, a leading "v", upper
     # case, whitespace, an explicit epoch (0, or another: a different version line), and
     # prefixes of supported numbers that are not them.
     "0.33", "0.33rc1", "0.33.dev0", "v0.33.0", "V0.33.0RC1", " 0.33.0 ", "0!0.33.0",
     "1!0.33.0", "0.333.0", "0.3.3", "10.33.0", "0.330"],
)  # fmt: skip
def test_declared_vllm_range_is_the_plugins_own(version):
    """pip's view of the wheel's vLLM requirement agrees with register()'s version check: a
    ROCm build of vLLM 0.33 (a pre-release, a local version) satisfies it, so pip keeps it
    rather than installing PyPI's, and PyPI's torch with it; and a version pip reads as 0.33,
    however spelt, is one the plugin runs on (README: it stays off unless it is 0.33)."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    from dsv41_gfx942_plugin import vllm_supported

    with open(ROOT / "pyproject.toml", "rb") as f:
        (dep,) = tomllib.load(f)["project"]["dependencies"]
    req = Requirement(dep)
    assert req.name == "vllm"
    assert req.specifier.contains(version, prereleases=True) == vllm_supported(version)


def test_code_objects_are_reproducible(tmp_path, monkeypatch, one_kernel):
    """Two builds of the same source, from two checkout paths (one with a space), give the same
    bytes: clang's compilation-unit id would otherwise hash the build's temporary
    device-library folder and the source path into a symbol of the code object."""
    if one_kernel.find_compiler("gfx942") is None and not REQUIRED:
        pytest.skip("no gfx942 compiler here")
    first = one_kernel.build("gfx942", tmp_path / "a", require=True)
    other = tmp_path / "other checkout" / "hip"
    other.mkdir(parents=True)
    (other / "tiny.hip").write_text((one_kernel.HIP_DIR / "tiny.hip").read_text())
    monkeypatch.setattr(one_kernel, "HIP_DIR", other)
    second = one_kernel.build("gfx942", tmp_path / "b", require=True)
    assert first == second and list(first) == ["tiny.gfx942.co"]
    assert (tmp_path / "a" / "tiny.gfx942.co").read_bytes() == (
        tmp_path / "b" / "tiny.gfx942.co"
    ).read_bytes()


def test_wheel_build_drops_modules_an_earlier_build_left(tmp_path, monkeypatch):
    """setup.py's build_py starts from an empty package folder: a module that an earlier build
    left in build/lib (deleted or renamed in src/ since) does not ship in the next wheel."""
    import setuptools
    from setuptools.dist import Distribution

    captured: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    spec = importlib.util.spec_from_file_location("dsv41_setup_test", ROOT / "setup.py")
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)
    built = []

    class NoHip:  # the HIP step is tested above; here only what build_py leaves
        @staticmethod
        def build_package(package_dir):
            built.append(package_dir)

    monkeypatch.setattr(setup_py, "_hip_build", lambda: NoHip)
    monkeypatch.chdir(ROOT)
    stale = tmp_path / "dsv41_gfx942_plugin" / "ops" / "removed_module.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("LEFT_BY_AN_EARLIER_BUILD = True\n")
    dist = Distribution(
        {"name": "dsv41-gfx942-plugin", "script_name": "setup.py", "package_dir": {"": "src"},
         "packages": ["dsv41_gfx942_plugin", "dsv41_gfx942_plugin.ops"]}
    )  # fmt: skip
    cmd = captured["cmdclass"]["build_py"](dist)
    cmd.build_lib = str(tmp_path)
    cmd.ensure_finalized()
    cmd.run()
    assert built == [tmp_path / "dsv41_gfx942_plugin"]
    assert (tmp_path / "dsv41_gfx942_plugin" / "ops" / "topk.py").is_file()
    assert not stale.exists()


def test_status_lists_a_build_without_a_compiler(tmp_path, monkeypatch, one_kernel, capsys):
    """A wheel built where no compiler was found: the status command reads its build info and
    says so (the recorded None was written as JSON's null, and the section was an error)."""
    from dsv41_gfx942_plugin import __main__ as status

    monkeypatch.setattr(one_kernel, "find_compiler", lambda arch: None)
    (tmp_path / "pkg").mkdir()
    one_kernel.build_package(tmp_path / "pkg", require=False)
    name = "dsv41_gfx942_plugin._build_info"
    spec = importlib.util.spec_from_file_location(name, tmp_path / "pkg" / "_build_info.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, name, module)
    status._code_objects()
    out = capsys.readouterr().out
    assert "gfx942 compiler: none found at build time" in out
    assert "no code object in this build: the HIP hooks stay off" in out
    assert "error" not in out


def test_readelf_of_a_rocm_install_is_found(tmp_path, monkeypatch, hip_build):
    """The build lists the kernels of a code object with the llvm-readelf of the ROCm whose
    compiler built it (``<rocm>/llvm/bin``, which a ROCm image need not put on PATH): without
    it the release wheel's build info, and so the status command, listed no kernel."""
    rocm = tmp_path / "rocm-7.0.0"
    for tool in ("bin/hipcc", "llvm/bin/amdclang++", "llvm/bin/llvm-readelf"):
        (rocm / tool).parent.mkdir(parents=True, exist_ok=True)
        (rocm / tool).write_text("")
    monkeypatch.setattr(hip_build, "_rocm_roots", lambda: [])
    readelf = str(rocm / "llvm" / "bin" / "llvm-readelf")
    assert hip_build._find_readelf(str(rocm / "bin" / "hipcc")) == readelf
    assert hip_build._find_readelf(str(rocm / "llvm" / "bin" / "amdclang++")) == readelf


def test_build_without_readelf_says_so(tmp_path, monkeypatch, one_kernel, capsys):
    if one_kernel.find_compiler("gfx942") is None and not REQUIRED:
        pytest.skip("no gfx942 compiler here")
    monkeypatch.setattr(one_kernel, "_find_readelf", lambda compiler: None)
    built = one_kernel.build("gfx942", tmp_path / "out", require=True)
    assert built["tiny.gfx942.co"]["kernels"] == []
    assert "no llvm-readelf found" in capsys.readouterr().err


@pytest.mark.skipif(
    not Path("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode/oclc_isa_version_940.bc").is_file(),
    reason="Debian's ROCm device libraries (the shim's donor) are not installed",
)
def test_device_library_shim_failure_is_a_build_error(hip_build, tmp_path):
    """Debian ships no gfx942 ISA file, so the build makes one from gfx940's with the compiler's
    llvm-dis and llvm-as: an llvm-as that fails is a BuildError naming it, not a traceback."""
    tools = tmp_path / "llvm" / "bin"
    tools.mkdir(parents=True)
    (tools / "clang++").touch()
    for name, body in (("llvm-dis", "echo 'i32 9400'"), ("llvm-as", "echo broken >&2; exit 3")):
        _script(tools / name, body)
    with pytest.raises(hip_build.BuildError, match="llvm-as"):
        hip_build._device_lib_dir(str(tools / "clang++"), "gfx942", tmp_path / "scratch")
