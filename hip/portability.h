// The one place where the plugin's HIP sources see which GPU they are compiled for.
//
// The kernels are written once against these wrappers. hip/build.py compiles them for gfx942
// (the product: clang/hipcc, wave64) and for sm_90 (tests and benchmarks on an NVIDIA H200:
// nvcc, warp32); tests also build them for the CPU (DSV_CPU_EMU, hip/cpu_emu.h) to run the
// wave64 logic without a GPU. Every architecture #if of the project lives here
// (tests/test_topk_build.py checks), so the code that runs on the H200 is the code that ships
// for gfx942, with only the wave width changed.
#pragma once

#include <stdint.h>

#if defined(DSV_CPU_EMU)
// ---------------------------------------------------------------- CPU emulation (tests only)
// hip/cpu_emu.h runs a workgroup's threads as fibers; DSV_EMU_WAVE picks the wave width (64 by
// default, as on gfx942).
#include "cpu_emu.h"

#ifndef DSV_EMU_WAVE
#define DSV_EMU_WAVE 64
#endif
#define DSV_WAVE DSV_EMU_WAVE
typedef uint64_t lanemask_t;
#define DSV_LAUNCH_BOUNDS(threads, per_cu)

inline lanemask_t dsv_ballot(bool p) { return emu_ballot(p); }
inline int dsv_popc(lanemask_t m) { return __builtin_popcountll(m); }
inline int dsv_ffs(lanemask_t m) { return __builtin_ffsll((long long)m); }
inline uint32_t dsv_bcast(uint32_t v, int src) { return emu_bcast(v, src); }
inline uint32_t dsv_shfl_up(uint32_t v, int d) { return emu_shfl_up(v, d); }
inline uint32_t dsv_shfl_xor(uint32_t v, int m) { return emu_shfl_xor(v, m); }

#elif defined(__HIP__)
// ---------------------------------------------------------------- AMD (gfx942), wave64
#include <hip/hip_runtime.h>

#define DSV_WAVE 64
typedef uint64_t lanemask_t;
// per_cu (see DSV_KERNEL) is not passed: HIP's second launch-bounds argument means something
// else (waves an execution unit), and the kernels' VGPRs and LDS give gfx942 the counts anyway.
#define DSV_LAUNCH_BOUNDS(threads, per_cu) __launch_bounds__(threads)

__device__ __forceinline__ lanemask_t dsv_ballot(bool p) { return __ballot(p); }
__device__ __forceinline__ int dsv_popc(lanemask_t m) { return __popcll(m); }
// 1-based index of the lowest set bit, 0 when none (like ffs).
__device__ __forceinline__ int dsv_ffs(lanemask_t m) { return __ffsll((unsigned long long)m); }
// Lane src's v in every lane; src must be the same in every lane (wave-uniform). A VALU read
// of that lane (v_readlane_b32), where __shfl would go through LDS (ds_bpermute_b32, an LDS
// round trip and a wait on it, each call).
__device__ __forceinline__ uint32_t dsv_bcast(uint32_t v, int src) {
  return (uint32_t)__builtin_amdgcn_readlane((int)v, src);
}
__device__ __forceinline__ uint32_t dsv_shfl_up(uint32_t v, int d) {
  return (uint32_t)__shfl_up((int)v, (unsigned)d, DSV_WAVE);
}
__device__ __forceinline__ uint32_t dsv_shfl_xor(uint32_t v, int m) {
  return (uint32_t)__shfl_xor((int)v, m, DSV_WAVE);
}

#else
// ---------------------------------------------------------------- NVIDIA (sm_90), warp32
#define DSV_WAVE 32
typedef uint32_t lanemask_t;
// per_cu workgroups an SM, as many as a gfx942 CU holds (see DSV_KERNEL), so that ptxas holds
// its registers to that occupancy. With a minimum of one, a kernel may take up to 128 registers
// a thread (the chunk kernel took 116-122, so one workgroup an SM where gfx942 runs two);
// without a minimum ptxas may spill to fit two (a variant of the selection core once got 64
// registers and 144 bytes of spill loads that way, 80 registers and none with one).
#define DSV_LAUNCH_BOUNDS(threads, per_cu) __launch_bounds__(threads, per_cu)

__device__ __forceinline__ lanemask_t dsv_ballot(bool p) { return __ballot_sync(0xffffffffu, p); }
__device__ __forceinline__ int dsv_popc(lanemask_t m) { return __popc(m); }
__device__ __forceinline__ int dsv_ffs(lanemask_t m) { return __ffs((int)m); }
__device__ __forceinline__ uint32_t dsv_bcast(uint32_t v, int src) {
  return __shfl_sync(0xffffffffu, v, src);
}
__device__ __forceinline__ uint32_t dsv_shfl_up(uint32_t v, int d) {
  return __shfl_up_sync(0xffffffffu, v, d);
}
__device__ __forceinline__ uint32_t dsv_shfl_xor(uint32_t v, int m) {
  return __shfl_xor_sync(0xffffffffu, v, m);
}
#endif

// Kernels have C names, so the launcher finds them by name in either code object. per_cu: the
// workgroups of `threads` threads that one gfx942 CU holds at once, by the kernel's VGPRs and
// LDS (tests/test_topk_build.py checks it against the gfx942 object); the sm_90 build runs the
// kernel at that occupancy too, so that H200 timings of wide launches are the product's shape.
#define DSV_KERNEL(threads, per_cu) extern "C" __global__ void DSV_LAUNCH_BOUNDS(threads, per_cu)

__device__ __forceinline__ int dsv_lane() { return (int)(threadIdx.x % DSV_WAVE); }
__device__ __forceinline__ int dsv_wave() { return (int)(threadIdx.x / DSV_WAVE); }
