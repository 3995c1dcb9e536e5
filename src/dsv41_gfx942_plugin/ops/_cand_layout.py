"""The MFMA layout choice and head reduction shared with AITER's dense indexer logits.

The candidate kernel (_cand_kernels.py) is bit-identical to AITER's gfx942 Gluon kernel
(`_gluon_deepgemm_fp8_paged_mqa_logits_preshuffle`) only while it builds the same MFMA layout
and sums the heads with the same combine function. Where AITER is importable both come from its
module, so that the two cannot drift; elsewhere (CI, the H200) this module computes the same
choice itself: AITER asks whether `AMDMFMALayout` accepts a 2-D `instr_shape=[16, 16]` (older
Triton) or needs the 3-D `[16, 16, 32]` (Triton >= 3.5 on some builds, 3.8 here).
"""

import importlib.util

import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# gfx942 (MI300X/MI325X) is CDNA 3; AITER's get_cdna_version() returns 3 there.
CDNA_VERSION = 3


# A Gluon function, not @triton.jit: under TRITON_INTERPRET=1 (CI) a Triton function becomes an
# interpreter object that a Gluon kernel cannot call, and CI still compiles the kernel for gfx942.
@gluon.jit
def _own_sum_combine(a, b):
    return a + b


def own_use_2d_instr_shape() -> bool:
    """AITER's test, done here: does this Triton's AMDMFMALayout take a 2-D instr_shape?"""
    try:
        gl.amd.AMDMFMALayout(
            version=CDNA_VERSION,
            instr_shape=[16, 16],
            transposed=False,
            warps_per_cta=[1, 1],
            tiles_per_warp=[1, 1],
        )
    except Exception:  # noqa: BLE001 - any refusal means "use the 3-D shape", as in AITER
        return False
    return True


def _aiter_module():
    """AITER's dense Gluon logits module, or None where AITER is absent, fails to import, or
    lacks the two names taken from it (another release: the plugin's own choice serves, and the
    comparison with vLLM's dense logits at first use judges it)."""
    if importlib.util.find_spec("aiter") is None:
        return None
    try:
        from aiter.ops.triton.gluon import pa_mqa_logits
    except Exception:  # noqa: BLE001 - a broken AITER install means "not importable"
        return None
    names = ("_sum_combine", "_Use_2d_instr_shape_mfma_layout")
    return pa_mqa_logits if all(hasattr(pa_mqa_logits, n) for n in names) else None


def choose(aiter) -> tuple:
    """(combine function, 2-D instr_shape?): AITER's module's, when given, else the plugin's."""
    if aiter is not None:
        return aiter._sum_combine, bool(aiter._Use_2d_instr_shape_mfma_layout)
    return _own_sum_combine, own_use_2d_instr_shape()


_AITER = _aiter_module()
FROM_AITER = _AITER is not None
sum_combine, _use_2d = choose(_AITER)
USE_2D_INSTR_SHAPE = tl.constexpr(_use_2d)
