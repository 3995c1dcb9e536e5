// Top-512 selection for DeepSeek-V4.1's sparse indexer (decode), written for gfx942.
//
// Every kernel ranks fp32 logits by an order-preserving uint32 key (order_key): NaN above +inf,
// as torch.topk ranks them, and key 0 for "no entry" (past a row's end, a -1 candidate). A
// workgroup holds its keys in registers and takes its k largest (top_k):
//  1. a floor from one histogram pass over the maxima of groups of G keys of a thread (at
//     least k maxima, so at least k keys, are >= it; most keys are below it);
//  2. the keys above the floor, with their column ids, are copied to an LDS list (when at most
//     LIST of them, as in every random, masked or tied row measured), where a range radix
//     select (8 bits a pass, over the range of the listed keys) finds the exact cut and the
//     taken entries are written from the list. Only rows with more than LIST keys above the
//     floor select and write from the registers.
// Positions come from prefix sums (no atomics). Histogram counts are aggregated per wave: the
// lanes that share the wave's first one or two digits add with one LDS atomic, so rows of
// equal values (-inf, masked logits) cost no more than others; when at least k keys equal the
// floor (all -inf, ties) no histogram of the keys is needed.
//
// Where a workgroup's time goes (H200, Nsight Compute and clock64 stamps, a 16k chunk held by
// 256 threads x 64 keys): each warp runs one long serial chain, about 3800 instructions at 11
// cycles each, 38% of the stalls waiting for instructions (unrolled code runs once, so its
// cache lines are cold when reached); phases in cycles: loads 7.4k, floor 4.4k, count and
// copy above the floor 4.5k, radix select of the list 6.6k, writing 6k. Hence loops over the
// LDS list are rolled, ids of taken keys are read ahead, and the shapes below were measured.
//
// Kernels (all launched by src/dsv41_gfx942_plugin/ops/topk.py through ops/_launcher.py):
//   dsv_topk512_chunks / _stream   pass 1 of the decode top-512: one workgroup per chunk of a row
//   dsv_topk512_merge / _wide      pass 2: each row's chunk candidates down to 512
//   dsv_topk512_candidates         top-512 over the columns of a row's candidate blocks
//   dsv_topk512_compact            top-512 over a compact row of (logit, column id)
//   dsv_select_blocks              layer 20's candidate blocks (block max, top-K blocks)
// Row ends are read on the device, so a CUDA graph captured once is right at every replay.
#include "portability.h"

constexpr int TOPK = 512;
constexpr int DIGIT = 8;                // bits a radix pass resolves at most
constexpr int HIST = 1 << DIGIT;        // bins of a radix pass
constexpr int LIST = 4096;              // keys above the floor that top_k copies to LDS
constexpr int TABLE = 4096;             // hash slots for deduplicating <= 2048 candidate blocks
constexpr uint32_t KEY_POS_INF = 0xff800000u;

// Workgroup shapes: threads, keys a thread (ITEMS), keys a maximum of the floor pass (GROUP:
// 16384 keys in groups of 8 give 2048 maxima, at least the 512 that a floor needs, and 4x that
// for a floor close to the 512th key). H200-measured, graph replay, decode 6x16k / 6x128k /
// 32x128k / 32x1M dense (us), with this code: 512 x 32 keys 12.1 / 21.5 / 33.9 / 201 (the
// previous engine, 1024 x 16: 13.4 / 26.9 / 41.1 / 237). On an earlier build (list loops
// unrolled, merge reading ids late): 512 x 32 12.2 / 25.8 / 38.6 / 205; 256 x 64 13.0 / 29.1 /
// 34.5 / 182 (on sm_90 ptxas holds it to 128 registers and spills); 1024 x 16 13.1 / 29.7 /
// 43.6 / 225. The per-warp work is a long serial chain (latency and instruction-fetch stalls),
// so neither fewer nor more warps a workgroup changes much.
constexpr int CHUNK = 16384;  // logits a workgroup of dsv_topk512_chunks holds
constexpr int CHUNK_THREADS = 512, CHUNK_GROUP = 8;
constexpr int MERGE_THREADS = 256, MERGE_ITEMS = 32, MERGE_GROUP = 4;  // <= 16 chunks a row
constexpr int WIDE_THREADS = 512, WIDE_ITEMS = 64, WIDE_GROUP = 16;   // <= 64 chunks (1M)
constexpr int STREAM_THREADS = 1024;
constexpr int SELECT_THREADS = 1024, SELECT_ITEMS = 32, SELECT_GROUP = 4;  // <= 32768 blocks
constexpr int CAND_THREADS = 512, CAND_ITEMS = 32, CAND_GROUP = 8;  // 16384 columns, 2048 blocks
constexpr int COMPACT_THREADS = 512, COMPACT_GROUP = 8;

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f) & ~(f == 0.f ? 0x80000000u : 0u);  // -0 ranks as +0
  const uint32_t k = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);   // -inf -> 0x007fffff
  return f != f ? 0xffffffffu : k;  // every NaN ranks above +inf; no key is 0
}

// A row's end as vLLM's decode top-k computes it: 2-D seq_lens (causal == 0) hold one end a
// row; 1-D ones hold one a request, and draft row r % next_n ends next_n - 1 - r % next_n
// earlier. Clamped to [0, width].
__device__ __forceinline__ int row_end(const int32_t* seq_lens, int causal, int next_n, int r,
                                       int width) {
  long long e = causal ? (long long)seq_lens[r / next_n] - next_n + r % next_n + 1
                       : (long long)seq_lens[r];
  e = e < 0 ? 0 : e;
  return (int)(e > width ? width : e);
}

template <int BLOCK>
struct Sel {
  static constexpr int NWAVES = BLOCK / DSV_WAVE;
  uint32_t hist[2][HIST];  // ping-pong: one pass counts into one while the other is cleared
  uint32_t key[LIST];      // keys above top_k's floor, when few enough
  int32_t id[LIST];        // and their column ids
  uint32_t part[2][4][NWAVES];
  uint32_t res[2][3];
  uint32_t relay[2][2];  // a second pass's thresholds, see relayed()
};

// The cut a select found: take every key > gt, and the first need_eq keys == eq; `total`
// entries in all (k, or every valid entry when a row holds fewer).
struct Cut {
  uint32_t gt, eq, need_eq, total;
};

__device__ __forceinline__ uint32_t wave_scan(uint32_t x) {  // inclusive
  const int lane = dsv_lane();
#pragma unroll
  for (int d = 1; d < DSV_WAVE; d <<= 1) {
    const uint32_t y = dsv_shfl_up(x, d);
    if (lane >= d) x += y;
  }
  return x;
}

// Exclusive prefix sums over the workgroup's threads of a and b, and their totals, with one
// barrier: every wave redoes the (short) scan of the wave totals. Consecutive calls of
// block_scan / block_reduce alternate `ph`'s parity, so that no barrier is needed after the
// reads; each call advances it.
template <int BLOCK>
__device__ __forceinline__ void block_scan(Sel<BLOCK>& s, int& ph, uint32_t& a, uint32_t& b,
                                           uint32_t& ta, uint32_t& tb) {
  constexpr int NW = Sel<BLOCK>::NWAVES;
  const int buf = ph++ & 1;
  const int lane = dsv_lane(), w = dsv_wave();
  const uint32_t xa = wave_scan(a), xb = wave_scan(b);
  if (lane == DSV_WAVE - 1) {
    s.part[buf][0][w] = xa;
    s.part[buf][1][w] = xb;
  }
  __syncthreads();
  const uint32_t pa = wave_scan(lane < NW ? s.part[buf][0][lane] : 0u);
  const uint32_t pb = wave_scan(lane < NW ? s.part[buf][1][lane] : 0u);
  ta = dsv_shfl(pa, NW - 1);
  tb = dsv_shfl(pb, NW - 1);
  const uint32_t ba = dsv_shfl(pa, w > 0 ? w - 1 : 0), bb = dsv_shfl(pb, w > 0 ? w - 1 : 0);
  a = (w > 0 ? ba : 0u) + xa - a;
  b = (w > 0 ? bb : 0u) + xb - b;
}

__device__ __forceinline__ void wave_reduce(uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
#pragma unroll
  for (int m = DSV_WAVE / 2; m > 0; m >>= 1) {
    a += dsv_shfl_xor(a, m);
    b += dsv_shfl_xor(b, m);
    c = max(c, dsv_shfl_xor(c, m));
    d = min(d, dsv_shfl_xor(d, m));
  }
}

// Workgroup sums of a and b, max of c, min of d, in every thread, with one barrier.
template <int BLOCK>
__device__ __forceinline__ void block_reduce(Sel<BLOCK>& s, int& ph, uint32_t& a, uint32_t& b,
                                             uint32_t& c, uint32_t& d) {
  constexpr int NW = Sel<BLOCK>::NWAVES;
  const int buf = ph++ & 1;
  wave_reduce(a, b, c, d);
  const int lane = dsv_lane(), w = dsv_wave();
  if (lane == 0) {
    s.part[buf][0][w] = a;
    s.part[buf][1][w] = b;
    s.part[buf][2][w] = c;
    s.part[buf][3][w] = d;
  }
  __syncthreads();
  a = lane < NW ? s.part[buf][0][lane] : 0u;
  b = lane < NW ? s.part[buf][1][lane] : 0u;
  c = lane < NW ? s.part[buf][2][lane] : 0u;
  d = lane < NW ? s.part[buf][3][lane] : 0xffffffffu;
  wave_reduce(a, b, c, d);
}

// Adds one wave's active digits to hist. The lanes holding the first active lane's digit add
// with one atomic, then those holding the next remaining digit; the rest add one each. A wave
// of equal keys therefore costs one atomic, not 64 on one LDS address.
__device__ __forceinline__ void count_digit(uint32_t* hist, bool active, uint32_t digit) {
  const lanemask_t m = dsv_ballot(active);
  if (m == 0) return;
  const int lead = dsv_ffs(m) - 1;
  const uint32_t hot = dsv_shfl(digit, lead);
  const bool is_hot = active && digit == hot;
  const lanemask_t mh = dsv_ballot(is_hot);
  if (dsv_lane() == lead) atomicAdd(&hist[hot], (uint32_t)dsv_popc(mh));
  bool rest = active && !is_hot;
  const lanemask_t mr = dsv_ballot(rest);
  if (mr == 0) return;
  const int lead2 = dsv_ffs(mr) - 1;
  const uint32_t hot2 = dsv_shfl(digit, lead2);
  const bool is_hot2 = rest && digit == hot2;
  const lanemask_t mh2 = dsv_ballot(is_hot2);
  if (dsv_lane() == lead2) atomicAdd(&hist[hot2], (uint32_t)dsv_popc(mh2));
  if (rest && !is_hot2) atomicAdd(&hist[digit], 1u);
}

// Keys held in registers: N a thread, `used` of them (uniform across the workgroup); the floor
// pass takes the maximum of each group of G consecutive slots.
template <int N, int G>
struct RegKeys {
  static constexpr int GROUPS = N / G;
  static __device__ __forceinline__ int group(int slot) { return slot / G; }
  uint32_t k[N];
  int used;
  template <class F>
  __device__ __forceinline__ void each(F f) {
    // A guard, not a break: a loop that can exit early is fully unrolled by LLVM only up to 8
    // trips, and a rolled loop would index k[] dynamically (scratch memory).
#pragma unroll
    for (int g = 0; g < N; g += 4) {
      if (g < used) {
#pragma unroll
        for (int s = g; s < g + 4 && s < N; ++s) f(k[s], s);
      }
    }
  }
};

// Keys read from memory at each pass (rows too long for registers): columns [lo, hi); one
// maximum a thread.
template <int BLOCK>
struct StreamKeys {
  static constexpr int GROUPS = 1;
  static __device__ __forceinline__ int group(int) { return 0; }
  const float* row;
  int lo, hi;
  template <class F>
  __device__ __forceinline__ void each(F f) {
    for (int s = 0; lo + s * BLOCK < hi; ++s) {
      const int c = lo + s * BLOCK + (int)threadIdx.x;
      f(c < hi ? order_key(row[c]) : 0u, s);
    }
  }
};

// Keys of the LDS list (top_k's keys above its floor): entry s * BLOCK + thread is slot s. A
// rolled loop: its body, run a few times, stays in the instruction cache, where unrolled
// copies of it would each be fetched once (instruction-fetch stalls were 38% of a chunk's
// warp stalls, H200 Nsight Compute).
template <int BLOCK>
struct ListKeys {
  const uint32_t* list;
  int n;
  template <class F>
  __device__ __forceinline__ void each(F f) {
#pragma unroll 1
    for (int s = 0; s * BLOCK < n; ++s) {
      const int i = s * BLOCK + (int)threadIdx.x;
      f(i < n ? list[i] : 0u, s);
    }
  }
};

// Clears hist[0]; a kernel calls it before loading its keys (top_k's first barrier orders it
// before the first count).
template <int BLOCK>
__device__ __forceinline__ void select_prologue(Sel<BLOCK>& s) {
  for (int i = threadIdx.x; i < HIST; i += BLOCK) s.hist[0][i] = 0;
}

// The cut of the k largest keys in [lo, hi] (k <= their count; keys outside the range are not
// candidates, those above hi must not exist): a radix select over the key range, whose bins
// are 2^shift consecutive keys (at most HIST bins), that narrows the range to the k-th key's
// bin each pass and stops when that bin is taken whole. Each pass is one count and three
// barriers; hist[pc & 1] is clear when pass pc starts. After max_passes it returns a floor
// instead: every key in or above the k-th key's bin (gt = that bin's least key - 1).
template <int BLOCK, class Keys>
__device__ __forceinline__ Cut radix_cut(Sel<BLOCK>& s, int& ph, Keys& keys, uint32_t k,
                                         uint32_t lo, uint32_t hi, int& pc, int max_passes) {
  uint32_t krem = k;
#pragma unroll 1
  for (int p = 0;; ++p, ++pc) {
    if (lo == hi) return Cut{lo, lo, krem, k};  // one key value left: krem of its ties
    const uint32_t span = hi - lo;
    const int bits = 32 - __clz((int)span);
    const int shift = bits > DIGIT ? bits - DIGIT : 0;
    const int nb = (int)(span >> shift) + 1;
    uint32_t* hist = s.hist[pc & 1];
    for (int i = threadIdx.x; i < HIST; i += BLOCK) s.hist[(pc + 1) & 1][i] = 0;
    keys.each([&](uint32_t key, int) {
      count_digit(hist, key >= lo && key <= hi, (key - lo) >> shift);
    });
    __syncthreads();
    // The bin where the count from the top reaches krem: thread t sums bins nb-1-t*per down.
    constexpr int per = (HIST + BLOCK - 1) / BLOCK;
    const int b0 = nb - 1 - (int)threadIdx.x * per;
    uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < per; ++i)
      if (b0 - i >= 0) sum += hist[b0 - i];
    uint32_t before = sum, unused = 0, total, t2;
    block_scan(s, ph, before, unused, total, t2);
    if (before < krem && before + sum >= krem) {
      uint32_t c = before;
      for (int i = 0; i < per; ++i) {
        const uint32_t h = hist[b0 - i];
        if (c + h >= krem) {
          s.res[pc & 1][0] = (uint32_t)(b0 - i);
          s.res[pc & 1][1] = c;
          s.res[pc & 1][2] = h;
          break;
        }
        c += h;
      }
    }
    __syncthreads();
    const uint32_t bin = s.res[pc & 1][0], above = s.res[pc & 1][1], cnt = s.res[pc & 1][2];
    const uint32_t least = lo + (bin << shift);
    krem -= above;
    if (shift == 0) {  // the k-th key exactly, with krem of its ties
      ++pc;
      return Cut{least, least, krem, k};
    }
    if (cnt == krem || p + 1 == max_passes) {  // every key >= the bin's least key
      ++pc;
      return Cut{least - 1, 0u, 0u, k};
    }
    lo = least;
    const uint64_t top = (uint64_t)least + ((1ull << shift) - 1);
    hi = top < hi ? (uint32_t)top : hi;
  }
}

// Two passes over 64 register keys that compare them with the same threshold would keep 64
// comparison masks alive between the passes (the compiler reuses the first pass's), spilling
// SGPRs on gfx942. Thread 0 stores the threshold before the block_scan/block_reduce call of
// parity `buf` (whose barrier publishes it) and every thread reads it back after: the same
// value, which the compiler cannot see, so the second pass compares afresh.
template <int BLOCK>
__device__ __forceinline__ void relay(Sel<BLOCK>& s, int buf, uint32_t a, uint32_t b) {
  if (threadIdx.x == 0) {
    s.relay[buf][0] = a;
    s.relay[buf][1] = b;
  }
}

// Calls out(key, pay(slot), position) for each key the cut takes; positions are
// 0..cut.total-1, from prefix sums of each thread's counts (no atomics).
template <int BLOCK, class Keys, class Pay, class Out>
__device__ __forceinline__ void emit(Sel<BLOCK>& s, int& ph, Keys& keys, const Cut cut, Pay pay,
                                     Out out) {
  uint32_t ngt = 0, neq = 0;
  keys.each([&](uint32_t key, int) {
    ngt += key > cut.gt;
    neq += cut.need_eq != 0 && key == cut.eq;
  });
  const int buf = ph & 1;
  relay(s, buf, cut.gt, cut.eq);
  uint32_t t1, t2;
  block_scan(s, ph, ngt, neq, t1, t2);
  const uint32_t gt = s.relay[buf][0], eq = s.relay[buf][1];
  const uint32_t eq_base = cut.total - cut.need_eq, need_eq = cut.need_eq;
  // pay and out by value: a closure holding their addresses would stay in scratch memory.
  keys.each([&ngt, &neq, gt, eq, need_eq, eq_base, pay, out](uint32_t key, int slot) {
    if (key > gt) {
      out(key, pay(slot), ngt++);
    } else if (need_eq != 0 && key == eq) {
      if (neq < need_eq) out(key, pay(slot), eq_base + neq);
      ++neq;
    }
  });
}

// The k largest valid (nonzero) keys: calls out(key, pay(slot), position) for each, positions
// 0..n-1, and returns n (k, or every valid key when fewer). A floor F comes first, from one
// histogram pass over the group maxima: at least k maxima, so at least k keys, are >= F, and
// no key below F can be taken. If fewer than k keys lie above F, F is the k-th key (ties, -inf
// rows: no more work). Else the keys above F go to the LDS list with pay(slot) when at most
// LIST, and are selected and written from there.
template <int BLOCK, class Keys, class Pay, class Out>
__device__ __forceinline__ uint32_t top_k(Sel<BLOCK>& s, Keys& keys, uint32_t k, Pay pay,
                                          Out out) {
  constexpr int M = Keys::GROUPS;
  int ph = 0, pc = 0;
  uint32_t mx[M];
#pragma unroll
  for (int g = 0; g < M; ++g) mx[g] = 0;
  uint32_t nvalid = 0;
  keys.each([&](uint32_t key, int slot) {
    nvalid += key != 0;
    mx[Keys::group(slot)] = max(mx[Keys::group(slot)], key);
  });
  uint32_t nmax = 0, thi = 0, tlo = 0xffffffffu;
#pragma unroll
  for (int g = 0; g < M; ++g) {
    nmax += mx[g] != 0;
    thi = max(thi, mx[g]);
    tlo = mx[g] ? min(tlo, mx[g]) : tlo;
  }
  block_reduce(s, ph, nvalid, nmax, thi, tlo);
  if (nvalid <= k) {  // take every valid key
    emit(s, ph, keys, Cut{0u, 0u, 0u, nvalid}, pay, out);
    return nvalid;
  }
  uint32_t floor = 0;  // count(key >= floor) >= k
  if (nmax >= k) {
    RegKeys<M, 1> maxima;
#pragma unroll
    for (int g = 0; g < M; ++g) maxima.k[g] = mx[g];
    maxima.used = M;
    const Cut f = radix_cut(s, ph, maxima, k, tlo, thi, pc, 1);
    floor = f.need_eq ? f.eq : f.gt + 1;
  }
  // The keys above the floor: how many, their least and greatest.
  uint32_t ngt = 0, ahi = 0, alo = 0xffffffffu, zero = 0;
  keys.each([&](uint32_t key, int) {
    const bool a = key > floor;
    ngt += a;
    ahi = a ? max(ahi, key) : ahi;
    alo = a ? min(alo, key) : alo;
  });
  const uint32_t mine = ngt;
  const int buf = ph & 1;
  relay(s, buf, floor, 0u);
  block_reduce(s, ph, ngt, zero, ahi, alo);
  if (ngt < k) {  // the floor is the k-th key
    emit(s, ph, keys, Cut{floor, floor, k - ngt, k}, pay, out);
    return k;
  }
  if (ngt > LIST) {
    const Cut cut = radix_cut(s, ph, keys, k, alo, ahi, pc, 32);
    emit(s, ph, keys, cut, pay, out);
    return k;
  }
  uint32_t pos = mine, unused = 0, t1, t2;
  block_scan(s, ph, pos, unused, t1, t2);
  const uint32_t above = s.relay[buf][0];  // == floor
  keys.each([&pos, &s, above, pay](uint32_t key, int slot) {
    if (key > above) {
      s.key[pos] = key;
      s.id[pos] = pay(slot);
      ++pos;
    }
  });
  __syncthreads();
  ListKeys<BLOCK> list{s.key, (int)ngt};
  const Cut cut = radix_cut(s, ph, list, k, alo, ahi, pc, 32);
  emit(s, ph, list, cut, [&](int slot) { return s.id[slot * BLOCK + (int)threadIdx.x]; }, out);
  return k;
}

// indices[0..n) = 0..end-1 then -1: the answer for a row of at most n entries.
template <int BLOCK>
__device__ __forceinline__ void write_iota(int32_t* out, int end, int n) {
  for (int j = threadIdx.x; j < n; j += BLOCK) out[j] = j < end ? j : -1;
}

template <int BLOCK>
__device__ __forceinline__ void write_tail(int32_t* out, int from, int n) {
  for (int j = from + (int)threadIdx.x; j < n; j += BLOCK) out[j] = -1;
}

// A row's chunk length: at least min_chunk, and at most max_chunks chunks a row.
__device__ __forceinline__ int chunk_len(int end, int min_chunk, int max_chunks) {
  const int even = (end + max_chunks - 1) / max_chunks;
  return even > min_chunk ? even : min_chunk;
}

// ------------------------------------------------------------------- decode top-512, pass 1
// Grid (max_chunks, rows). All four decode kernels take the same arguments.
#define TOPK_ARGS                                                                        \
  const float *logits, long long row_stride, int width, const int32_t *seq_lens,         \
      int causal, int next_n, int32_t *indices, long long idx_stride, uint32_t *cand_keys, \
      int32_t *cand_ids, int max_chunks, int min_chunk

// Pass 1 of a chunk: its top 512 go straight to the row's indices when the chunk is the whole
// row, else to the row's candidate scratch (key and column) for the merge.
template <int BLOCK, class Keys, class Col>
__device__ __forceinline__ void chunk_select(Sel<BLOCK>& s, Keys& keys, Col col, int32_t* out_row,
                                             uint32_t* ck, int32_t* ci, bool direct) {
  int32_t* ids = direct ? out_row : ci;  // one pointer: branches on `direct` around two stores
                                         // are merged into a load from the closure (scratch)
  const uint32_t total = top_k(s, keys, TOPK, col, [=](uint32_t key, int32_t id, uint32_t pos) {
    if (!direct) ck[pos] = key;
    ids[pos] = id;
  });
  if (direct) write_tail<BLOCK>(out_row, (int)total, TOPK);
}

// The register path: CHUNK / CHUNK_THREADS logits a thread, read once as float4 (rows 16-byte
// aligned); chunks of CHUNK logits, rows up to 64 * CHUNK (1M) logits.
DSV_KERNEL(CHUNK_THREADS) dsv_topk512_chunks(TOPK_ARGS) {
  constexpr int BLOCK = CHUNK_THREADS, ITEMS = CHUNK / BLOCK;
  __shared__ Sel<BLOCK> s;
  const int r = blockIdx.y, c = blockIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    if (c == 0) write_iota<BLOCK>(out_row, end, TOPK);
    return;
  }
  const int L = chunk_len(end, min_chunk, max_chunks);  // == CHUNK on this path
  const int lo = c * L;
  if (lo >= end) return;
  const int hi = min(lo + L, end);
  const float* row = logits + r * row_stride;
  const int t = threadIdx.x;
  select_prologue(s);
  RegKeys<ITEMS, CHUNK_GROUP> keys;
  keys.used = ITEMS;
  // All loads go out before any is used; a partial float4 (the row's last) is re-read by
  // elements.
  float4 v[ITEMS / 4];
#pragma unroll
  for (int q = 0; q < ITEMS / 4; ++q) {
    const int c0 = lo + ((q * BLOCK + t) << 2);
    v[q] = *reinterpret_cast<const float4*>(row + (c0 + 3 < hi ? c0 : 0));
  }
#pragma unroll
  for (int q = 0; q < ITEMS / 4; ++q) {
    const int c0 = lo + ((q * BLOCK + t) << 2);
    if (c0 + 3 >= hi) {
      v[q].x = c0 < hi ? row[c0] : 0.f;
      v[q].y = c0 + 1 < hi ? row[c0 + 1] : 0.f;
      v[q].z = c0 + 2 < hi ? row[c0 + 2] : 0.f;
    }
    keys.k[4 * q + 0] = c0 < hi ? order_key(v[q].x) : 0u;
    keys.k[4 * q + 1] = c0 + 1 < hi ? order_key(v[q].y) : 0u;
    keys.k[4 * q + 2] = c0 + 2 < hi ? order_key(v[q].z) : 0u;
    keys.k[4 * q + 3] = c0 + 3 < hi ? order_key(v[q].w) : 0u;
  }
  const size_t base = ((size_t)r * max_chunks + c) * TOPK;
  chunk_select(
      s, keys, [=](int slot) { return lo + (((slot >> 2) * BLOCK + t) << 2) + (slot & 3); },
      out_row, cand_keys + base, cand_ids + base, end <= L);
}

// The general path: any alignment, chunks of chunk_len(end, min_chunk, max_chunks) logits read
// from memory at each radix pass.
DSV_KERNEL(STREAM_THREADS) dsv_topk512_chunks_stream(TOPK_ARGS) {
  constexpr int BLOCK = STREAM_THREADS;
  __shared__ Sel<BLOCK> s;
  const int r = blockIdx.y, c = blockIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    if (c == 0) write_iota<BLOCK>(out_row, end, TOPK);
    return;
  }
  const int L = chunk_len(end, min_chunk, max_chunks);
  const int lo = c * L;
  if (lo >= end) return;
  select_prologue(s);
  StreamKeys<BLOCK> keys{logits + r * row_stride, lo, min(lo + L, end)};
  const int t = threadIdx.x;
  const size_t base = ((size_t)r * max_chunks + c) * TOPK;
  chunk_select(
      s, keys, [=](int slot) { return lo + slot * BLOCK + t; }, out_row, cand_keys + base,
      cand_ids + base, end <= L);
}

// Pass 2: a row's chunk candidates (up to ITEMS * BLOCK / 512 chunks of 512) down to its 512.
// IDS: the column ids are read with the keys (a taken key's id read then would wait for
// memory in turn), where registers allow (not at 64 keys a thread: sm_90 spills).
template <int BLOCK, int ITEMS, int G, bool IDS>
__device__ __forceinline__ void merge(Sel<BLOCK>& s, TOPK_ARGS) {
  const int r = blockIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  const int L = chunk_len(end, min_chunk, max_chunks);
  if (end <= TOPK || end <= L) return;  // pass 1 wrote the row
  const int nch = (end + L - 1) / L;
  const int n = nch * TOPK;
  const size_t base = (size_t)r * max_chunks * TOPK;
  const uint32_t* ck = cand_keys + base;
  const int32_t* ci = cand_ids + base;
  const int t = threadIdx.x;
  select_prologue(s);
  RegKeys<ITEMS, G> keys;
  keys.used = (n + BLOCK - 1) / BLOCK;
  int32_t ids[IDS ? ITEMS : 1];
#pragma unroll
  for (int s2 = 0; s2 < ITEMS; ++s2) {
    const int p = s2 * BLOCK + t;
    const int ch = p / TOPK, j = p % TOPK;
    const int len = min(L, end - ch * L);  // this chunk wrote min(len, 512) candidates
    const bool ok = p < n && j < len;
    keys.k[s2] = 0u;
    if (s2 < keys.used) keys.k[s2] = ok ? ck[p] : 0u;
    if constexpr (IDS) ids[s2] = s2 < keys.used && ok ? ci[p] : 0;
  }
  int32_t* out_row = indices + r * idx_stride;
  top_k(
      s, keys, TOPK,
      [&ids, ci, t](int slot) {
        if constexpr (IDS) return ids[slot];
        return ci[slot * BLOCK + t];
      },
      [=](uint32_t, int32_t id, uint32_t pos) { out_row[pos] = id; });
}

// Rows of up to 16 chunks (256k logits).
DSV_KERNEL(MERGE_THREADS) dsv_topk512_merge(TOPK_ARGS) {
  __shared__ Sel<MERGE_THREADS> s;
  merge<MERGE_THREADS, MERGE_ITEMS, MERGE_GROUP, true>(s, logits, row_stride, width, seq_lens,
                                                       causal, next_n, indices, idx_stride,
                                                       cand_keys, cand_ids, max_chunks, min_chunk);
}

// Rows of up to 64 chunks (1M logits).
DSV_KERNEL(WIDE_THREADS) dsv_topk512_merge_wide(TOPK_ARGS) {
  __shared__ Sel<WIDE_THREADS> s;
  merge<WIDE_THREADS, WIDE_ITEMS, WIDE_GROUP, false>(s, logits, row_stride, width, seq_lens,
                                                     causal, next_n, indices, idx_stride,
                                                     cand_keys, cand_ids, max_chunks, min_chunk);
}

// --------------------------------------------------------------- candidate top-512 (24-36)
// Grid (rows). Row r's columns are 8 (block_size) a candidate block: candidates[r, i] = b
// covers [b * bs, b * bs + bs). Entries -1, duplicates and columns at or past the row end are
// skipped. A row longer than 512 with fewer than 512 live candidate columns gets them all and
// then -1.
DSV_KERNEL(CAND_THREADS) dsv_topk512_candidates(const float* logits, long long row_stride,
                                                int width, const int32_t* seq_lens, int causal,
                                                int next_n, int32_t* indices, long long idx_stride,
                                                const int32_t* cands, long long cand_stride,
                                                int ncand, int bs) {
  constexpr int BLOCK = CAND_THREADS, ITEMS = CAND_ITEMS;
  __shared__ union {
    Sel<BLOCK> sel;
    struct {
      int32_t key[TABLE];
      int32_t slot[TABLE];
    } table;
  } u;
  __shared__ int32_t blocks[TABLE / 2];
  __shared__ int32_t bs_relay;
  const int r = blockIdx.x, t = threadIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    write_iota<BLOCK>(out_row, end, TOPK);
    return;
  }
  if (t == 0) bs_relay = bs;
  // Deduplicate the candidate blocks: a block id keeps its lowest slot (hash table in LDS).
  const int32_t* crow = cands + r * cand_stride;
  for (int i = t; i < TABLE; i += BLOCK) {
    u.table.key[i] = -1;
    u.table.slot[i] = 0x7fffffff;
  }
  for (int i = t; i < ncand; i += BLOCK) {
    const int32_t b = crow[i];
    blocks[i] = (b >= 0 && (long long)b * bs < end) ? b : -1;
  }
  __syncthreads();
  for (int i = t; i < ncand; i += BLOCK) {
    const int32_t b = blocks[i];
    if (b < 0) continue;
    uint32_t h = ((uint32_t)b * 2654435761u) >> 20;
    while (true) {
      const int32_t prev = atomicCAS(&u.table.key[h], -1, b);
      if (prev == -1 || prev == b) {
        atomicMin(&u.table.slot[h], i);
        break;
      }
      h = (h + 1) & (TABLE - 1);
    }
  }
  __syncthreads();
  for (int i = t; i < ncand; i += BLOCK) {
    const int32_t b = blocks[i];
    if (b < 0) continue;
    uint32_t h = ((uint32_t)b * 2654435761u) >> 20;
    while (u.table.key[h] != b) h = (h + 1) & (TABLE - 1);
    if (u.table.slot[h] != i) blocks[i] = -1;
  }
  __syncthreads();
  select_prologue(u.sel);
  const float* row = logits + r * row_stride;
  // Blocks of 8 whole columns in 16-byte aligned rows (vLLM's layout) are read as two float4:
  // slot s of a thread is column s % 8 of candidate entry (s / 8) * BLOCK + thread, and a
  // group of the floor pass is one block. Other block sizes read column i = s * BLOCK + thread
  // of the row's candidate columns alone.
  const bool vec = bs == 8 && width % 8 == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  RegKeys<ITEMS, CAND_GROUP> keys;
  keys.used = ITEMS;  // a uniform bound here costs guards, which spill SGPRs on gfx942
  if (vec) {
#pragma unroll
    for (int q = 0; q < ITEMS / 8; ++q) {
      const int j = q * BLOCK + t;
      const int b = j < ncand ? blocks[j] : -1;
      const float4* p = reinterpret_cast<const float4*>(row + (b >= 0 ? b * 8 : 0));
      const float4 x = p[0], y = p[1];
      const float v[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
      for (int e = 0; e < 8; ++e)
        keys.k[8 * q + e] = b >= 0 && b * 8 + e < end ? order_key(v[e]) : 0u;
    }
  } else {
    const int n = ncand * bs;
#pragma unroll
    for (int s2 = 0; s2 < ITEMS; ++s2) {
      const int i = s2 * BLOCK + t;
      const int b = i < n ? blocks[i / bs] : -1;
      const int col = b * bs + i % bs;
      const bool ok = b >= 0 && col < end;
      const float v = row[ok ? col : 0];
      keys.k[s2] = ok ? order_key(v) : 0u;
    }
  }
  // The column of a taken key, from bs read back from LDS: the compiler would otherwise keep
  // the quotients and remainders of the loads above alive through the select (VGPRs).
  const int bs2 = bs_relay;
  const uint32_t total = top_k(
      u.sel, keys, TOPK,
      [=](int slot) {
        if (vec) return blocks[(slot >> 3) * BLOCK + t] * 8 + (slot & 7);
        const int i = slot * BLOCK + t;
        return blocks[i / bs2] * bs2 + i % bs2;
      },
      [=](uint32_t, int32_t id, uint32_t pos) { out_row[pos] = id; });
  write_tail<BLOCK>(out_row, (int)total, TOPK);
}

// ------------------------------------------------------------- compact-row top-512
// Grid (rows). Entry i of row r is (logits[r, i], ids[r, i]); ids -1 mark no entry. Rows of
// at most 16384 entries, holding distinct ids. Row ends as dsv_topk512_chunks.
DSV_KERNEL(COMPACT_THREADS) dsv_topk512_compact(const float* logits, long long row_stride,
                                                const int32_t* ids, long long ids_stride, int len,
                                                const int32_t* seq_lens, int causal, int next_n,
                                                int32_t* indices, long long idx_stride) {
  constexpr int BLOCK = COMPACT_THREADS, ITEMS = CHUNK / BLOCK;
  __shared__ Sel<BLOCK> s;
  const int r = blockIdx.x, t = threadIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, 0x7fffffff);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    write_iota<BLOCK>(out_row, end, TOPK);
    return;
  }
  const float* row = logits + r * row_stride;
  const int32_t* id_row = ids + r * ids_stride;
  select_prologue(s);
  RegKeys<ITEMS, COMPACT_GROUP> keys;
  keys.used = ITEMS;  // as in dsv_topk512_candidates
  int32_t id[ITEMS];  // kept, as in dsv_topk512_merge
#pragma unroll
  for (int s2 = 0; s2 < ITEMS; ++s2) {
    const int i = s2 * BLOCK + t;
    const bool in = i < len;
    id[s2] = id_row[in ? i : 0];
    const float v = row[in ? i : 0];
    keys.k[s2] = (in && id[s2] >= 0) ? order_key(v) : 0u;
  }
  const uint32_t total = top_k(
      s, keys, TOPK, [&id](int slot) { return id[slot]; },
      [=](uint32_t, int32_t id, uint32_t pos) { out_row[pos] = id; });
  write_tail<BLOCK>(out_row, (int)total, TOPK);
}

// ------------------------------------------------------- candidate blocks (layer 20)
// The greatest key of columns [c0, c1): out of line, so that the unrolled loop that scores
// the common 8-column blocks with two float4 loads stays small.
__device__ __noinline__ uint32_t block_score(const float* row, int c0, int c1) {
  uint32_t m = 0;
  for (int c = c0; c < c1; ++c) m = max(m, order_key(row[c]));
  return m;
}

// Grid (rows). vLLM's _select_candidate_blocks in one launch: block b of row r scores the
// NaN-propagating max of its columns below min(end, width); the newest block (end - 1) / bs is
// pinned to +inf; the K best blocks whose score is not -inf are written (any order), then -1.
// end = seq_lens[r / rep] (each draft row of a request uses the request's length). Rows of at
// most 32768 blocks. Scoring row slices on many workgroups into scratch and selecting in a
// second launch was slower (6 x 128k, K 2048, H200: 36.2 us, against 31.0 us for this kernel
// on the previous top-K engine): the K = 2048 select by one workgroup is most of the time.
DSV_KERNEL(SELECT_THREADS) dsv_select_blocks(const float* logits, long long row_stride, int width,
                                             const int32_t* seq_lens, int rep, int bs,
                                             int32_t* cands, long long cand_stride, int K) {
  constexpr int BLOCK = SELECT_THREADS;
  __shared__ Sel<BLOCK> s;
  const int r = blockIdx.x, t = threadIdx.x;
  const int end = max(seq_lens[r / rep], 0);
  const int col_end = min(end, width);
  const int nb = (col_end + bs - 1) / bs;
  const int newest = end > 0 ? (end - 1) / bs : -1;
  const float* row = logits + r * row_stride;
  const bool vec = bs == 8 && width >= 8 && ((reinterpret_cast<uintptr_t>(row) & 15) == 0);
  select_prologue(s);
  RegKeys<SELECT_ITEMS, SELECT_GROUP> keys;
  keys.used = (nb + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int s2 = 0; s2 < SELECT_ITEMS; ++s2) {
    const int b = s2 * BLOCK + t;
    const int c0 = b * bs;
    uint32_t m = 0;
    if (s2 < keys.used) {
      if (vec && c0 + 8 <= col_end) {
        const float4* p = reinterpret_cast<const float4*>(row + c0);
        const float4 x = p[0], y = p[1];
        m = max(max(max(order_key(x.x), order_key(x.y)), max(order_key(x.z), order_key(x.w))),
                max(max(order_key(y.x), order_key(y.y)), max(order_key(y.z), order_key(y.w))));
      } else if (b < nb) {
        m = block_score(row, c0, min(c0 + bs, col_end));
      }
      if (b >= nb) m = 0;
      if (b == newest && b < nb) m = KEY_POS_INF;  // pinned, as vLLM does, even over NaN
      if (m <= 0x007fffffu) m = 0;                 // a -inf score is no candidate
    }
    keys.k[s2] = m;
  }
  int32_t* out_row = cands + r * cand_stride;
  const uint32_t total = top_k(
      s, keys, (uint32_t)K, [=](int slot) { return slot * BLOCK + t; },
      [=](uint32_t, int32_t id, uint32_t pos) { out_row[pos] = id; });
  write_tail<BLOCK>(out_row, (int)total, K);
}
