// A CPU stand-in for the GPU, so that the kernels' logic runs in tests without a GPU, with
// either wave width (64 as on gfx942, which no GPU here has; or 32). Included by portability.h
// when DSV_CPU_EMU is defined (tests/emu/topk_emu.cpp); never part of a shipped build.
//
// A launch runs the grid's workgroups one after another. A workgroup's threads are fibers on
// one OS thread, switched cooperatively: a thread runs until it reaches __syncthreads or a wave
// operation (ballot, shuffle), which wait for the whole workgroup or wave. So LDS (__shared__,
// one static copy, as workgroups run in turn) and atomics need no locking. Wave operations must
// be reached by every lane of the wave, as the kernels are written to (uniform control flow).
#pragma once

#include <stdint.h>
#include <math.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(n)
#define __shared__ static

struct float4 {
  float x, y, z, w;
} __attribute__((aligned(16)));

struct dsv_dim3 {
  unsigned x, y, z;
};

namespace dsv_emu {

struct Fiber {
  ucontext_t ctx;
  unsigned tid;
  bool done;
  unsigned gen;  // wave operations this lane has started
  unsigned bar;  // barriers this lane has started
  unsigned atom_gen, atom_k;  // atomicAdds since the last wave operation (see Conflicts)
};

// What gfx942's LDS would serialize: the lanes of one wave's atomic instruction that share an
// address take one update each, in turn (vLLM's top-k spends 100 us on 6 x 128k masked rows for
// it, ../shared/docs/performance-anchors.md). An atomicAdd is taken to be the k-th instruction
// of its wave after the lane's last wave operation, so lanes that reach it between the same two
// wave operations are one instruction (exact for count_digit, whose atomic follows its ballots;
// a loop of atomics without wave operations, as the sparse count, pairs lanes by their k-th
// atomic). Per launch: the instructions, and the updates beyond the first on each one's most
// shared address ("extra", summed over instructions, and its largest in one workgroup).
struct Conflicts {
  uint64_t instructions, extra, extra_max_block;
  unsigned depth_max;
  // (wave, generation, k) -> address -> lanes
  std::map<std::tuple<unsigned, unsigned, unsigned>, std::map<const void*, unsigned>> open;
};

struct Wave {
  uint64_t vals[2][64];
  unsigned arrived[2];
  unsigned released[2];  // generation number + 1 of the last released operation per parity
};

struct State {
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;
  std::vector<Wave> waves;
  unsigned bar_arrived[2], bar_released[2];
  ucontext_t sched;
  Fiber* cur;
  Conflicts conflicts;
  dsv_dim3 block_idx;
  int wave;  // lanes a wave
};

inline State& st() {
  static State s;
  return s;
}

inline void yield() { swapcontext(&st().cur->ctx, &st().sched); }

// Deposits this lane's value, waits for the wave, and returns the wave's values.
inline const uint64_t* wave_exchange(uint64_t mine) {
  State& s = st();
  Fiber* f = s.cur;
  const int W = s.wave;
  Wave& w = s.waves[f->tid / W];
  const unsigned g = f->gen++, p = g & 1;
  w.vals[p][f->tid % W] = mine;
  if (++w.arrived[p] == (unsigned)W) {
    w.arrived[p] = 0;
    w.released[p] = g + 1;
  }
  while (w.released[p] != g + 1) yield();
  return w.vals[p];
}

inline void barrier() {
  State& s = st();
  Fiber* f = s.cur;
  const unsigned g = f->bar++, p = g & 1;
  if (++s.bar_arrived[p] == s.fibers.size()) {
    s.bar_arrived[p] = 0;
    s.bar_released[p] = g + 1;
  }
  while (s.bar_released[p] != g + 1) yield();
}

typedef void (*Body)(void*);
struct Start {
  Body body;
  void* arg;
};

inline void trampoline(unsigned lo, unsigned hi) {
  Start* start = reinterpret_cast<Start*>(((uintptr_t)hi << 32) | lo);
  start->body(start->arg);
  st().cur->done = true;
  swapcontext(&st().cur->ctx, &st().sched);
}

// Runs body(arg) as every thread of workgroup `block` (threads a workgroup, lanes a wave).
inline void run_block(dsv_dim3 block, unsigned threads, int wave, Body body, void* arg) {
  State& s = st();
  s.block_idx = block;
  s.wave = wave;
  s.fibers.assign(threads, Fiber());
  s.stacks.resize(std::max<size_t>(s.stacks.size(), threads));
  s.waves.assign((threads + wave - 1) / wave, Wave());
  s.bar_arrived[0] = s.bar_arrived[1] = s.bar_released[0] = s.bar_released[1] = 0;
  Start start{body, arg};
  const uintptr_t sp = reinterpret_cast<uintptr_t>(&start);
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[t];
    f.tid = t;
    std::vector<char>& stack = s.stacks[t];
    stack.resize(64 * 1024);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack.data();
    f.ctx.uc_stack.ss_size = stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, (void (*)())trampoline, 2, (unsigned)(sp & 0xffffffffu),
                (unsigned)(sp >> 32));
  }
  for (bool busy = true; busy;) {
    busy = false;
    for (Fiber& f : s.fibers) {
      if (f.done) continue;
      busy = true;
      s.cur = &f;
      swapcontext(&s.sched, &f.ctx);
    }
  }
  uint64_t extra = 0;
  for (auto& ins : s.conflicts.open) {
    unsigned depth = 0;
    for (auto& a : ins.second) depth = std::max(depth, a.second);
    extra += depth - 1;
    s.conflicts.depth_max = std::max(s.conflicts.depth_max, depth);
  }
  s.conflicts.instructions += s.conflicts.open.size();
  s.conflicts.extra += extra;
  s.conflicts.extra_max_block = std::max(s.conflicts.extra_max_block, extra);
  s.conflicts.open.clear();
}

}  // namespace dsv_emu

#define threadIdx (dsv_dim3{dsv_emu::st().cur->tid, 0u, 0u})
#define blockIdx (dsv_emu::st().block_idx)

inline void __syncthreads() { dsv_emu::barrier(); }

inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
using std::max;
using std::min;

template <class T>
inline T atomicAdd(T* p, T v) {
  dsv_emu::State& s = dsv_emu::st();
  dsv_emu::Fiber* f = s.cur;
  if (f->atom_gen != f->gen + 1) f->atom_gen = f->gen + 1, f->atom_k = 0;
  ++s.conflicts.open[std::make_tuple(f->tid / s.wave, f->gen, f->atom_k++)][p];
  const T old = *p;
  *p = old + v;
  return old;
}
inline int32_t atomicCAS(int32_t* p, int32_t cmp, int32_t v) {
  const int32_t old = *p;
  if (old == cmp) *p = v;
  return old;
}
inline uint32_t atomicOr(uint32_t* p, uint32_t v) {
  const uint32_t old = *p;
  *p = old | v;
  return old;
}
inline int32_t atomicMin(int32_t* p, int32_t v) {
  const int32_t old = *p;
  *p = std::min(old, v);
  return old;
}

// Wave operations over `dsv_emu::st().wave` lanes; the header that includes this one picks the
// width (DSV_WAVE) and must match it at launch.
inline uint64_t emu_ballot(bool p) {
  const uint64_t* v = dsv_emu::wave_exchange(p);
  uint64_t m = 0;
  for (int l = 0; l < dsv_emu::st().wave; ++l) m |= (v[l] ? 1ull : 0ull) << l;
  return m;
}
// Lane src's x, src taken from the wave's first lane, as gfx942's v_readlane_b32 reads one lane
// named by a scalar (the compiler takes a divergent index's first lane): a caller passing
// different lanes gets wrong values here too.
inline uint32_t emu_bcast(uint32_t x, int src) {
  const uint64_t* v = dsv_emu::wave_exchange((uint64_t)(uint32_t)src << 32 | x);
  return (uint32_t)v[(v[0] >> 32) % dsv_emu::st().wave];
}
inline uint32_t emu_shfl_up(uint32_t x, int d) {
  const uint64_t* v = dsv_emu::wave_exchange(x);
  const int lane = (int)(dsv_emu::st().cur->tid % dsv_emu::st().wave);
  return lane >= d ? (uint32_t)v[lane - d] : x;
}
inline uint32_t emu_shfl_xor(uint32_t x, int m) {
  const uint64_t* v = dsv_emu::wave_exchange(x);
  const int lane = (int)(dsv_emu::st().cur->tid % dsv_emu::st().wave);
  return (uint32_t)v[lane ^ m];
}
