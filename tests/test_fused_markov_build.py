"""The fused Markov step kernel compiled for gfx942 on the CPU (no GPU needed): every launch
configuration the GPU path uses (``fused_markov.GPU_CONFIGS``), sampled, greedy and fp64 noise,
must compile to AMDGCN with no VGPR spills, no scratch and LDS within 64 KiB.

Compiled with Triton 3.8 here (129280 tokens, rank 256; sampled / greedy / fp64 noise): VGPRs
74-81 at 8 rows (BV 128, 16-row tile), 55-70 at 16, 139-148 at 32 (32-row tile, BK 64), 120-138
above 32 (BK 32, 4 stages); LDS 8-16 KiB. SGPRs that do not fit go to VGPR lanes, never to
memory (the scratch check). The H200 runs the same kernels (tests/test_fused_markov_gpu.py); no
gfx942 has run them yet.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from dsv41_gfx942_plugin.ops import fused_markov as F

# Pointer arguments of _markov_step_kernel by name (without "_ptr"); every other runtime
# argument is an int32 (sizes, strides, the step).
POINTERS = dict(
    input_ids="*i32", anchor="*i64", w1="*bf16", w2="*bf16", base="*bf16", idx="*i64",
    pos="*i64", temp="*fp32", seeds="*i64", cache="*bf16", tokens="*i64", win="*i64",
    prev_keys="*i64", prev_toks="*i32", out_keys="*i64", out_toks="*i32",
)  # fmt: skip
FIELDS = ("vgpr_count", "vgpr_spill_count", "sgpr_spill_count", "private_segment_fixed_size")
MODES = {"sampled": (False, False), "greedy": (True, False), "fp64": (False, True)}
# One build a (configuration, mode): a configuration by the batch it serves (256 for the last).
BUILDS = [f"{min(top, 256)}-{mode}" for top, _ in F.GPU_CONFIGS for mode in MODES]


def _compile_all() -> dict:
    """Every (configuration, mode) of BUILDS, compiled for gfx942: their resource figures."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dsv41_gfx942_plugin.ops import _markov_kernels as K

    fn = K._markov_step_kernel
    sig = {
        n: POINTERS[n[:-4]] if n.endswith("_ptr") else "constexpr" if n.isupper() else "i32"
        for n in fn.arg_names
    }
    out = {}
    for top, _ in F.GPU_CONFIGS:
        rows = min(top, 256)
        cfg = F._config(rows, 129280, 256, False)
        options = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
        for mode, (greedy, fp64) in MODES.items():
            consts = dict(cfg, RANK=256, GREEDY=greedy, USE_FP64=fp64, NB_CHUNK=F.NB_CHUNK)
            src = ASTSource(fn, dict(sig), consts)
            kernel = triton.compile(src, target=GPUTarget("hip", "gfx942", 64), options=options)
            asm = kernel.asm["amdgcn"]
            figures = {f: int(re.search(rf"\.{f}:\s+(\d+)", asm).group(1)) for f in FIELDS}
            out[f"{rows}-{mode}"] = dict(lds=kernel.metadata.shared, **figures)
    return out


@pytest.fixture(scope="module")
def builds():
    """All compiles in one fresh process without the interpreter (under TRITON_INTERPRET=1,
    ``@triton.jit`` gives interpreted functions, which do not compile); about 20 s."""
    code = "import json, test_fused_markov_build as t; print(json.dumps(t._compile_all()))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), *sys.path])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("build", BUILDS)
def test_gfx942_resources(builds, build):
    b = builds[build]
    assert b["vgpr_spill_count"] == 0, b
    assert b["private_segment_fixed_size"] == 0, b  # no scratch: SGPR spills stay in VGPR lanes
    assert b["lds"] <= 64 * 1024, b
    # At most 2 waves a SIMD above this (512 VGPRs a lane): too few to hide memory latency.
    assert b["vgpr_count"] <= 168, b
