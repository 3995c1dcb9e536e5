"""The fused Markov step kernel compiled for gfx942 on the CPU (no GPU needed): every launch
configuration the GPU path uses (``fused_markov.GPU_CONFIGS`` sampled and with fp64 noise,
``GREEDY_GPU_CONFIGS`` greedy), each at every row tile and tile fold that a batch of up to 256
rows gives it (``BATCHES``), must compile to AMDGCN with no VGPR spills, no scratch and LDS within
64 KiB; so must the verify launch of the configurations that take the fast noise (``FAST``).

Each is compiled as Triton's JIT specializes a launch (``SPECS``): with its pointers 16-byte
aligned and within 2 GiB (DSv4.1's 129280-token rows; AMD buffer loads, ``buffer_load_dwordx4``),
the same without buffer loads (``AMDGCN_USE_BUFFER_OPS=0``), and with no alignment known (a
vocabulary that is not a multiple of 8: every bf16 load scalar, ``global_load_ushort``). Triton
3.8 here, 129280 tokens, rank 256, over the configurations and modes: aligned with buffer loads,
VGPRs 62-191 (191: fp64 noise at 16 rows, two blocks a program), LDS 20-48 KiB, and at 256 rows
1483 static instructions sampled with the fast noise (BV 128, 8 waves; 1429 before the dies'
program order, ``fused_markov.GFX942_XCDS``), 1402 greedy (128-row tiles); unaligned, VGPRs
91-140, LDS 8-32 KiB; the verify kernel 31 VGPRs, 445 instructions. SGPRs that do
not fit go to VGPR lanes, never to memory (the scratch check). The H200 runs the same kernels
(tests/test_fused_markov_gpu.py); no gfx942 has run them yet.
"""

from __future__ import annotations

import re

import pytest

import fresh_compile
from dsv41_gfx942_plugin.ops import fused_markov as F

# Selected by `-m gfx942` too, so that on an MI300X they check what that machine's Triton
# compiles (its ROCm Triton, not CI's 3.8).
pytestmark = pytest.mark.gfx942

# Pointer arguments of _markov_step_kernel by name (without "_ptr"); every other runtime
# argument is an int32 (sizes, strides, the step).
POINTERS = dict(
    input_ids="*i32", anchor="*i64", w1="*bf16", w2="*bf16", base="*bf16", idx="*i64",
    pos="*i64", temp="*fp32", seeds="*i64", cache="*bf16", tokens="*i64", win="*i64",
    prev_keys="*i64", prev_toks="*i32", out_keys="*i64", out_toks="*i32", bbest="*i32",
)  # fmt: skip
LDS_MAX = 48 * 1024
FIELDS = ("vgpr_count", "vgpr_spill_count", "sgpr_spill_count", "private_segment_fixed_size")
MODES = {"sampled": (False, False), "greedy": (True, False), "fp64": (False, True)}
# The int arguments of an even step's launch on a 129280-token vocabulary, 5 draft steps and
# 256 rows; the JIT marks those that are multiples of 16 (and its pointers, 16-byte aligned).
INTS = dict(
    w1_rows=129280, base_stride=5 * 129280, map_stride=5, cache_s0=5 * 129280,
    cache_s1=129280, tokens_stride=5, win_stride=256, scr_stride=2020, rows=256,
    vocab=129280, step=2, nb=2020,
)  # fmt: skip
# Pointer attributes by specialization: 16-byte aligned ("tt.divisibility") and within 2 GiB
# ("tt.pointer_range", AMD's buffer loads), aligned alone, or nothing known.
SPECS = {
    "jit": [["tt.divisibility", 16], ["tt.pointer_range", 32]],
    "no-buffer-ops": [["tt.divisibility", 16]],
    "unaligned": None,
}


def _batches(greedy: bool) -> list[int]:
    """The batch sizes (powers of two up to 256) whose launch configurations differ, the largest
    of each: a table entry's row tile clamps to the batch, and below 16 rows the padded tile's
    fold (``R_EPI``) is the batch's, so every configuration a step of up to 256 rows compiles."""
    seen, batches = [], []
    for rows in (256, 128, 64, 32, 16, 8, 4, 2, 1):
        cfg = F._config(rows, 129280, 256, False, greedy=greedy)
        if cfg not in seen:
            seen.append(cfg)
            batches.append(rows)
    return batches


# One build a (configuration, mode, specialization), named by the batch it serves.
BATCHES = {mode: _batches(greedy) for mode, (greedy, _) in MODES.items()}
FAST = [rows for rows in BATCHES["sampled"] if F._config(rows, 129280, 256, False)["FAST_LOG"]]
BUILDS = [f"{rows}-{mode}-{spec}" for mode in MODES for rows in BATCHES[mode] for spec in SPECS]
BUILDS += [f"{rows}-verify" for rows in FAST]


def _attrs(fn, pointer) -> dict:
    """The argument attributes of a specialization (ASTSource's attrs): the ints the JIT
    specializes (not ``fn.do_not_specialize``) marked where they are multiples of 16."""
    if pointer is None:
        return {}
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        if name.endswith("_ptr"):
            attrs[(i,)] = pointer
        elif name not in fn.do_not_specialize and INTS.get(name, 1) % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def _compile_all() -> dict:
    """Every (configuration, mode) of BUILDS, compiled for gfx942: their resource figures."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dsv41_gfx942_plugin.ops import _markov_kernels as K

    target = GPUTarget("hip", "gfx942", 64)

    def build(fn, consts, spec, options):
        sig = {
            n: POINTERS[n[:-4]] if n.endswith("_ptr") else "constexpr" if n.isupper() else "i32"
            for n in fn.arg_names
        }
        src = ASTSource(fn, sig, consts, _attrs(fn, SPECS[spec]))
        kernel = triton.compile(src, target=target, options=options)
        asm = kernel.asm["amdgcn"]
        figures = {f: int(re.search(rf"\.{f}:\s+(\d+)", asm).group(1)) for f in FIELDS}
        figures["instructions"] = len(re.findall(r"^\s+[vs]_|^\s+(?:ds|global|buffer)_", asm, re.M))
        figures["loads"] = sorted(set(re.findall(r"\b(?:global|buffer)_load_\w+", asm)))
        figures["l2_fences"] = len(re.findall(r"^\s+buffer_(?:wbl2|inv)\b", asm, re.M))
        return dict(lds=kernel.metadata.shared, waves=options["num_warps"], **figures)

    out = {}
    for mode, (greedy, fp64) in MODES.items():
        for rows in BATCHES[mode]:
            cfg = F._config(rows, 129280, 256, False, greedy=greedy)
            options = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
            fast_log = "log2" if cfg["FAST_LOG"] else ""  # _config here names this CPU's backend
            cfg["XCDS"] = F.GFX942_XCDS  # and its dies (one)
            consts = dict(cfg, RANK=256, GREEDY=greedy, USE_FP64=fp64, NB_CHUNK=F.NB_CHUNK)
            consts["FAST_LOG"] = fast_log if mode == "sampled" else ""
            for spec in SPECS:
                b = build(K._markov_step_kernel, consts, spec, options)
                out[f"{rows}-{mode}-{spec}"] = dict(b, tile=cfg["R_EPI"] * cfg["BV"])
            if fast_log and mode == "sampled":
                nb_p2 = triton.next_power_of_2(
                    triton.cdiv(129280, cfg["BV"])
                )  # as _launch passes it
                consts = dict(BV=cfg["BV"], NB_P2=nb_p2, NATIVE_BF16=True)
                verify = build(K._markov_verify_kernel, consts, "jit", {"num_warps": 4})
                out[f"{rows}-verify"] = verify
    return out


@pytest.fixture(scope="module")
def builds():
    """All compiles in one fresh process (about 20 s)."""
    return fresh_compile.compile_all("test_fused_markov_build")


@pytest.mark.parametrize("build", BUILDS)
def test_gfx942_resources(builds, build):
    b = builds[build]
    assert b["vgpr_spill_count"] == 0, b
    assert b["private_segment_fixed_size"] == 0, b  # no scratch: SGPR spills stay in VGPR lanes
    # gfx942 gives a workgroup 64 KiB; a quarter of it stays free, as margin for other Triton
    # releases' allocations (vLLM's ROCm builds pin their own), whose overflow would send
    # every step of that batch size to vLLM's loop.
    assert b["lds"] <= LDS_MAX, b
    # At most 2 waves a SIMD above 168 VGPRs (512 a lane, in granules of 8): too few to hide
    # memory latency, unless the LDS already holds a CU to fewer (the 16-row fp64 step, two
    # vocabulary blocks a program: 191 VGPRs, 44 KiB of LDS, one workgroup of 4 waves a CU).
    waves_vgpr = 512 // (-(-b["vgpr_count"] // 8) * 8)
    waves_lds = 64 * 1024 // max(b["lds"], 1) * b["waves"] / 4
    assert b["vgpr_count"] <= 168 or waves_vgpr >= min(waves_lds, 8), b
    # No device-scope fence: on gfx942 one writes back and invalidates the die's L2 (buffer_wbl2 /
    # buffer_inv sc1), which Triton's default acq_rel atomic_max put around every program's
    # winner key (H200, relaxed against acq_rel, same run: greedy 1 / 256 rows 93.5-95.9 /
    # 365.0-365.7 -> 87.8-89.5 / 351.7-354.0 us).
    assert b["l2_fences"] == 0, b
    if build.endswith(("-jit", "-no-buffer-ops")):
        # Aligned rows stream markov_w2 and the logits 16 bytes a load, never 2; but a batch of
        # 1-2 rows has a logits tile (R_EPI x BV) of less than one dword a lane, read 2 bytes a
        # lane (0.26 MB a row a step, beside markov_w2's 66 MB in 16-byte loads).
        wide = "buffer_load_dwordx4" if build.endswith("-jit") else "global_load_dwordx4"
        assert wide in b["loads"], b
        if b["tile"] >= 2 * 64 * b["waves"]:
            assert not any("ushort" in x for x in b["loads"]), b
