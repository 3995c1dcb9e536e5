"""The gfx942 code object of hip/topk512.hip, inspected on the CPU (CI builds the real one).

It must be an AMDGPU ELF holding every kernel ops/topk.py launches, with no VGPR spills, no
scratch, LDS within 64 KiB, and argument metadata matching the launcher's packing; and no
architecture #if may appear outside hip/portability.h. The decode chunk kernel, launched once a
16k chunk (2048 workgroups for 32 rows of 1M), must let two workgroups share a CU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import ref_topk as ref
from dsv41_gfx942_plugin import envs
from dsv41_gfx942_plugin.ops import _launcher, _topk_check, topk

ROOT = Path(__file__).resolve().parent.parent
HIP = ROOT / "hip"
# Selected by `-m gfx942` too, so that on an MI300X they inspect the code object its wheel
# build made (with ROCm's compiler there, not CI's clang-19).
pytestmark = pytest.mark.gfx942


def _llvm_tool(tool: str) -> str | None:
    for name in (f"{tool}-19", tool, f"/usr/lib/llvm-19/bin/{tool}", f"/opt/rocm/llvm/bin/{tool}"):
        if found := shutil.which(name):
            return found
    return None


@pytest.fixture(scope="module")
def code_object(tmp_path_factory) -> Path:
    """The shipped gfx942 object if the wheel build made one, else one built here; where the
    build is required (``DSV41_GFX942_REQUIRE_HIP``, as in CI), a source that does not build
    fails these tests instead of skipping them."""
    shipped = _launcher.KERNEL_DIR / "topk512.gfx942.co"
    newest_source = max(p.stat().st_mtime for p in HIP.iterdir() if p.suffix in (".hip", ".h"))
    if shipped.is_file() and shipped.stat().st_mtime >= newest_source:
        return shipped
    out = tmp_path_factory.mktemp("kernels")
    proc = subprocess.run(
        [sys.executable, str(HIP / "build.py"), "--arch", "gfx942", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    built = out / "topk512.gfx942.co"
    if not built.is_file():
        if envs.get_bool("DSV41_GFX942_REQUIRE_HIP"):
            pytest.fail(f"the gfx942 build failed (hip/build.py: {proc.stderr.strip()[-300:]})")
        pytest.skip(f"no gfx942 compiler here (hip/build.py: {proc.stderr.strip()[-300:]})")
    return built


@pytest.fixture(scope="module")
def metadata(code_object) -> dict[str, dict]:
    readelf = _llvm_tool("llvm-readelf")
    if readelf is None:
        pytest.skip("llvm-readelf is not installed")
    notes = subprocess.run(
        [readelf, "--notes", str(code_object)], capture_output=True, text=True, check=True
    ).stdout
    doc = notes[notes.index("---") : notes.rindex("...") + 3]
    return {k[".name"]: k for k in yaml.safe_load(doc)["amdhsa.kernels"]}


def test_is_amdgpu_elf(code_object):
    head = code_object.read_bytes()[:20]
    assert head[:4] == b"\x7fELF"
    assert int.from_bytes(head[18:20], "little") == 224  # EM_AMDGPU


# ELF header fields of an AMDGPU code object (LLVM's BinaryFormat/ELF.h): EI_ABIVERSION 3 is
# code object v5 (ROCm 6's compilers' default, so its runtimes and later load it), e_flags holds
# the processor (0x4C, gfx942) and the xnack / sramecc settings, each "any" (0x100 / 0x400).
EF_AMDGPU_MACH_GFX942 = 0x4C
XNACK_ANY, SRAMECC_ANY = 0x100, 0x400
COV5 = 3


def test_loads_on_every_gfx942_mode(code_object):
    """One code object for every MI300X / MI325X: xnack and sramecc left "any" (an object built
    for xnack+ or sramecc- is refused by a GPU in the other mode), and code object v5."""
    head = code_object.read_bytes()[:52]
    assert head[8] == COV5, f"code object ABI version {head[8]}"
    flags = int.from_bytes(head[48:52], "little")
    assert flags & 0xFF == EF_AMDGPU_MACH_GFX942, hex(flags)
    assert flags & 0xF00 == XNACK_ANY | SRAMECC_ANY, hex(flags)


def test_every_kernel_present(metadata):
    assert set(topk.KERNELS) <= set(metadata), sorted(set(topk.KERNELS) - set(metadata))


@pytest.mark.parametrize("name", sorted(topk.KERNELS))
def test_resources(metadata, name):
    k = metadata[name]
    assert k[".wavefront_size"] == 64
    assert k[".vgpr_spill_count"] == 0, "VGPRs spilled"
    # SGPRs that do not fit go to VGPR lanes (v_writelane/v_readlane), never to memory (the
    # scratch check below); a handful is cheap, a jump means a loop lost its uniform shape.
    assert k[".sgpr_spill_count"] <= 64, "SGPR spills grew"
    assert k[".private_segment_fixed_size"] == 0, "uses scratch memory"
    assert k[".group_segment_fixed_size"] <= 64 * 1024, "LDS over 64 KiB"
    # Each kernel is written for exactly its __launch_bounds__ threads (its BLOCK): the launcher
    # must launch that many, no fewer.
    assert k[".max_flat_workgroup_size"] == topk.THREADS[name]


# A gfx942 CU: 64 KiB of LDS; 4 SIMDs, each with 512 VGPRs a lane for its waves (granule 8), at
# most 8 waves a SIMD.
CU_LDS, SIMDS, SIMD_VGPRS, VGPR_GRANULE, SIMD_WAVES = 64 * 1024, 4, 512, 8, 8


def _workgroups_a_cu(k: dict) -> int:
    waves = -(-k[".max_flat_workgroup_size"] // k[".wavefront_size"])
    vgprs = -(-k[".vgpr_count"] // VGPR_GRANULE) * VGPR_GRANULE
    by_vgprs = SIMDS * min(SIMD_VGPRS // vgprs, SIMD_WAVES) // waves
    return min(by_vgprs, CU_LDS // max(k[".group_segment_fixed_size"], 1))


def _per_cu() -> dict[str, int]:
    """Each kernel's DSV_KERNEL(threads, per_cu) in hip/topk512.hip."""
    found = re.findall(r"DSV_KERNEL\(\w+, (\d+)\) (\w+)\(", (HIP / "topk512.hip").read_text())
    return {name: int(n) for n, name in found}


def test_occupancy_is_the_declared_one(metadata):
    """Every kernel declares the workgroups a gfx942 CU holds at once, and the sm_90 build runs
    at that occupancy (hip/portability.h), so H200 timings of wide launches keep the product's
    shape. The chunk kernel needs two: with int32 list ids it took 34.3 KiB of LDS (one a CU,
    each a latency-bound chain of barriers); uint16 ids (26.3 KiB, 84 VGPRs) let two share
    one."""
    declared = _per_cu()
    # HIP's second launch bound means something else (waves an EU): only CUDA's takes per_cu.
    bounds = re.findall(r"#define DSV_LAUNCH_BOUNDS\(threads, per_cu\) (.+)",
                        (HIP / "portability.h").read_text())  # fmt: skip
    assert bounds == ["__launch_bounds__(threads)", "__launch_bounds__(threads, per_cu)"]
    assert sorted(declared) == sorted(topk.KERNELS)
    assert declared["dsv_topk512_chunks"] == 2
    for name, n in declared.items():
        assert _workgroups_a_cu(metadata[name]) == n, name


def test_no_device_scope_fences(code_object):
    """No workgroup waits on another's memory: on gfx942 a device-scope fence (__threadfence,
    an acq_rel global atomic) writes back and invalidates the die's L2 (buffer_wbl2 /
    buffer_inv sc1), about 16 us, and is fragile under graph replay."""
    objdump = _llvm_tool("llvm-objdump")
    if objdump is None:
        pytest.skip("llvm-objdump is not installed")
    asm = subprocess.run(
        [objdump, "-d", "--mcpu=gfx942", str(code_object)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "s_barrier" in asm  # the disassembly is the kernels' code
    assert not re.findall(r"\bbuffer_(?:wbl2|inv)\b", asm)


def test_fp32_denormals_are_kept(code_object):
    """Layer 20's block scores are float maxima (``block_key``, hip/topk512.hip), which keep a
    denormal logit's value only while fp32 denormals are not flushed: each kernel's descriptor
    must say mode 3 (no flush of inputs or outputs)."""
    objdump = _llvm_tool("llvm-objdump")
    if objdump is None:
        pytest.skip("llvm-objdump is not installed")
    descriptors = [f"--disassemble-symbols={name}.kd" for name in sorted(topk.KERNELS)]
    asm = subprocess.run(
        [objdump, "-D", "--mcpu=gfx942", *descriptors, str(code_object)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    modes = re.findall(r"\.amdhsa_float_denorm_mode_32 (\d+)", asm)
    assert modes == ["3"] * len(topk.KERNELS)


@pytest.mark.parametrize("name", sorted(topk.KERNELS))
def test_argument_layout_matches_launcher(metadata, name):
    signature = topk.KERNELS[name]
    args = [a for a in metadata[name][".args"] if not a[".value_kind"].startswith("hidden_")]
    assert [(a[".offset"], a[".size"]) for a in args] == _launcher.arg_layout(signature)
    pointers = [a[".value_kind"] == "global_buffer" for a in args]
    assert pointers == [c == "P" for c in signature]
    packed = _launcher._packer(signature).size
    assert packed == args[-1][".offset"] + args[-1][".size"]
    if len(args) == len(metadata[name][".args"]):  # no hidden arguments after ours
        assert packed == metadata[name][".kernarg_segment_size"]


ARCH_MACRO = re.compile(
    r"^\s*#\s*(if|ifdef|ifndef|elif)\b.*\b(__HIP\w*|__CUDA\w*|__NVCC__|__AMDGCN\w*|__gfx\w+|"
    r"__HIPCC__|__NVPTX__|__SPIRV__|DSV_WAVE|__AMDGPU\w*|__HIP_DEVICE_COMPILE__)",
    re.MULTILINE,
)


def hip_const(name: str, source: str = "topk512.hip") -> int:
    """The value of an int constant of ``hip/<source>``, defined there once."""
    found = re.findall(rf"\b{name} = (\d+)", (HIP / source).read_text())
    assert len(found) == 1, name
    return int(found[0])


def test_launcher_chunk_is_the_kernels():
    """dsv_topk512_chunks takes chunks of its CHUNK logits whatever the launch's min_chunk (its
    loads go out before the row's end is read), and the merge splits rows by the launch's
    min_chunk: the two must agree."""
    assert hip_const("CHUNK") == topk.CHUNK


def test_merge_holds_its_units():
    """A merge workgroup holds MERGE_UNITS units of CHUNK_SLOTS candidate slots in its registers
    (more would drop candidates, and with them right answers), and two merge launches cover
    MAX_CHUNKS chunks."""
    held = hip_const("MERGE_THREADS") * hip_const("MERGE_ITEMS")
    assert hip_const("MERGE_UNITS") == topk.MERGE_UNITS
    assert held >= topk.MERGE_UNITS * topk.CHUNK_SLOTS
    assert topk.CHUNK_SLOTS >= topk.TOPK
    assert topk.MAX_CHUNKS <= topk.MERGE_UNITS**2


def test_floor_digit_is_the_kernels():
    """The load-time check's rows of exact counts above a chunk's floor place their keys by the
    floor pass's bins (``_topk_check.exact_above_floor_rows``): with another radix digit they
    would still be right, but no longer on the bound they were built for."""
    assert hip_const("DIGIT", "topk_select.h") == _topk_check.FLOOR_DIGIT


@pytest.mark.parametrize("width", [1 << 17, 1 << 18], ids=["select", "select_wide"])
def test_far_cut_rows_reach_their_paths(width):
    """The load-time check's ``_far_cut_rows`` take the selection kernel their width picks
    (``topk.SELECT_BLOCKS``) down the two paths they were built for: more than 2048 of row 0's
    block scores are finite but fewer than 2048 lie within hip/topk_select.h's FLOOR_SPAN of the
    greatest (the cut over that span finds too few and runs again over every finite score),
    more than 2048 of row 1's (with the pinned newest block) rank at or above +inf, and each
    row's live blocks fit the LDS list."""
    (span,) = re.findall(r"\bFLOOR_SPAN = 1u << (\d+);", (HIP / "topk_select.h").read_text())
    rows = _topk_check._far_cut_rows(torch.Generator().manual_seed(5), width)
    scores = rows.view(2, -1, _topk_check.BLOCK).amax(-1)
    scores[:, -1] = float("inf")  # the newest block, pinned
    keys = ref.order_key(scores)
    finite = keys[0][scores[0].isfinite()]
    near = int((finite >= finite.max() - (1 << int(span))).sum())
    assert 0 < near < _topk_check.SELECT_K - 1 and finite.numel() > _topk_check.SELECT_K
    assert int((scores[1].isnan() | (scores[1] == float("inf"))).sum()) > _topk_check.SELECT_K
    assert int((scores != float("-inf")).sum(1).max()) <= hip_const("LIST", "topk_select.h")
    assert (scores.shape[1] > topk.SELECT_BLOCKS) == (width > 1 << 17)


def test_many_above_floor_rows_exceed_the_list():
    """The load-time check's ``_many_above_floor_rows`` keep, in a chunk of either decode path,
    each thread's keys all raised or none (the general path's thread t reads columns t,
    t + STREAM_THREADS, ...; the register path's, float4s t, t + CHUNK_THREADS, ...), so fewer
    than k of its group maxima are raised and the floor lies below every raised key: more
    raised keys than hip/topk_select.h's LIST lie above it."""
    rows = _topk_check._many_above_floor_rows(torch.Generator().manual_seed(5), topk.CHUNK)
    raised = rows >= 100
    assert torch.equal(raised[0], raised[1])
    col = torch.arange(topk.CHUNK)
    reg = hip_const("CHUNK_THREADS")
    groups = topk.CHUNK // reg // hip_const("CHUNK_GROUP")  # a register-path thread's
    layouts = [(hip_const("STREAM_THREADS"), col, 1), (reg, col // 4, groups)]
    for threads, of, groups in layouts:
        thread = of % threads
        hit = torch.zeros(threads, dtype=torch.long).index_add_(0, thread, raised[0].long())
        size = torch.bincount(thread, minlength=threads)
        assert bool(((hit == 0) | (hit == size)).all())
        assert int((hit > 0).sum()) * groups < topk.TOPK
    assert int(raised[0].sum()) > hip_const("LIST", "topk_select.h")


def test_top_k_fits_the_list():
    """top_k's k (512) and the selection's widest K fit the LDS list, through which a floor
    that is the k-th key (ties, -inf rows) and the selection write their entries."""
    assert hip_const("LIST", "topk_select.h") >= max(topk.TOPK, topk.MAX_SELECT_K)


def arch_conditionals(text: str) -> list[str]:
    return [m.group(0).strip() for m in ARCH_MACRO.finditer(text)]


def test_arch_conditionals_only_in_portability_header():
    sources = [p for p in HIP.iterdir() if p.suffix in (".hip", ".h", ".hpp", ".cuh")]
    assert any(p.name == "topk512.hip" for p in sources)
    found = {p.name: arch_conditionals(p.read_text()) for p in sources}
    found = {k: v for k, v in found.items() if v and k != "portability.h"}
    assert not found, f"architecture #if outside hip/portability.h: {found}"
    assert arch_conditionals((HIP / "portability.h").read_text())  # the check sees them


def test_arch_conditional_pattern():
    assert arch_conditionals("#if defined(__HIP__)\n# ifdef __CUDA_ARCH__\n#elif DSV_WAVE == 64")
    assert not arch_conditionals("#pragma unroll\n#define DSV_WAVE 64\n// #if __HIP__ no")
