// The kernels of hip/topk512.hip built for the CPU emulation (hip/cpu_emu.h), as a shared
// library: dsv_emu_launch(name, grid, threads, packed arguments) runs a kernel over CPU memory,
// with the arguments packed as ops/_launcher.py packs them for the GPU. Built and driven by
// tests/test_topk_emu.py.
#include "../../hip/topk512.hip"

#include <string.h>

#include <tuple>

namespace {

template <class T>
T take(const char* buf, size_t& off) {
  off = (off + alignof(T) - 1) / alignof(T) * alignof(T);
  T v;
  memcpy(&v, buf + off, sizeof(T));
  off += sizeof(T);
  return v;
}

template <class... A>
struct Call {
  void (*kernel)(A...);
  std::tuple<A...> args;
  static void run(void* self) {
    Call* c = static_cast<Call*>(self);
    std::apply(c->kernel, c->args);
  }
};

template <class... A>
int launch(void (*kernel)(A...), const char* buf, unsigned gx, unsigned gy, unsigned threads) {
  size_t off = 0;
  Call<A...> call{kernel, std::tuple<A...>{take<A>(buf, off)...}};
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x)
      dsv_emu::run_block(dsv_dim3{x, y, 0}, threads, DSV_WAVE, &Call<A...>::run, &call);
  return 0;
}

}  // namespace

// A known answer for the conflict count (test_conflict_count_has_known_answers): each lane adds
// (lane % 3) times at buf[lane % mod] (a loop of atomics, as the sparse count), then, after a
// wave operation, once at buf[0] if its lane is even (as count_digit's atomic after its ballots).
extern "C" void dsv_emu_probe(int* buf, int mod) {
  const unsigned lane = threadIdx.x % DSV_WAVE;
  for (unsigned i = 0; i < lane % 3; ++i) atomicAdd(&buf[lane % mod], 1);
  if (dsv_ballot(true) && lane % 2 == 0) atomicAdd(&buf[0], 1);
}

extern "C" int dsv_emu_wave() { return DSV_WAVE; }

// The LDS atomics' address conflicts of the launches since the last call (hip/cpu_emu.h's
// Conflicts): out = {instructions, extra updates, the most extra in one workgroup, the deepest
// instruction's lanes on one address}; then starts counting afresh.
extern "C" void dsv_emu_conflicts(uint64_t* out) {
  dsv_emu::Conflicts& c = dsv_emu::st().conflicts;
  out[0] = c.instructions, out[1] = c.extra, out[2] = c.extra_max_block, out[3] = c.depth_max;
  c = dsv_emu::Conflicts();
}

extern "C" int dsv_emu_launch(const char* name, unsigned gx, unsigned gy, unsigned threads,
                              const char* args) {
#define DSV_EMU_KERNEL(k) \
  if (strcmp(name, #k) == 0) return launch(k, args, gx, gy, threads);
  DSV_EMU_KERNEL(dsv_topk512_chunks)
  DSV_EMU_KERNEL(dsv_topk512_chunks_stream)
  DSV_EMU_KERNEL(dsv_topk512_merge)
  DSV_EMU_KERNEL(dsv_topk512_merge_final)
  DSV_EMU_KERNEL(dsv_topk512_candidates)
  DSV_EMU_KERNEL(dsv_topk512_compact)
  DSV_EMU_KERNEL(dsv_select_blocks)
  DSV_EMU_KERNEL(dsv_select_blocks_wide)
  DSV_EMU_KERNEL(dsv_emu_probe)
  return -1;
}
