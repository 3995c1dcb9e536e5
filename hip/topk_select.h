// The selection core of hip/topk512.hip's kernels (top-512 for DeepSeek-V4.1's sparse indexer).
//
// Every kernel ranks fp32 logits by an order-preserving uint32 key (order_key): NaN above +inf,
// -0 below +0, as vLLM's top-k ranks them, and key 0 for "no entry" (past a row's end, a -1
// candidate). A workgroup holds its keys in registers and takes its k largest (top_k):
//  1. a floor from one histogram pass over the maxima of groups of G keys of a thread (at
//     least k maxima, so at least k keys, are >= it; most keys are below it), its bins over at
//     most FLOOR_SPAN below the greatest; when fewer than k maxima (2k with interleaved groups)
//     are above -inf (7/8-masked rows) or fewer than 2k are valid (a row's partial last chunk),
//     over the top two keys of each group (where those number at least k);
//  2. the keys above the floor are copied, with their column ids, to an LDS list (when at most
//     LIST of them, as in every random, masked or tied row measured). Where the caller takes a
//     superset (a chunk of a row whose merge has room), the list is written out as it is when
//     it holds at most `cap` keys, or cut at the k-th key's bin of one radix pass when that
//     leaves fewer; else a range radix select (8 bits a pass) finds the exact cut in it and
//     the taken entries are written from the list. When the floor is the k-th key (ties, -inf
//     rows), the keys above it and the first equal ones are listed and written from there.
//     Only rows with more than LIST keys above the floor select and write from the registers.
// Positions come from prefix sums (no atomics). Histogram counts are aggregated per wave: the
// lanes that share the wave's first active digit add as one, so a wave of equal values (-inf,
// masked logits) costs one atomic (a wave split between two values whose first active lane
// holds the rarer one still puts the other lanes on one address: not measurable on the H200),
// except in a pass over at most SPARSE_POP keys, one plain atomic each; when at least k keys
// equal the floor (all -inf, ties) no histogram of the keys is needed.
//
// Where a workgroup's time goes (H200, Nsight Compute and clock64 stamps, a 16k chunk held by
// 256 threads x 64 keys): each warp runs one long serial chain, about 3800 instructions at 11
// cycles each, 38% of the stalls waiting for instructions (unrolled code runs once, so its
// cache lines are cold when reached); phases in cycles: loads 7.4k, floor 4.4k, count and
// copy above the floor 4.5k, radix select of the list 6.6k, writing 6k. Hence loops over the
// LDS list are rolled, ids of taken keys are read ahead, and the workgroup shapes in
// hip/topk512.hip were measured. Later (clock() stamps of thread 0, one 16k chunk held by 512
// threads x 32 keys, before the one scan below): loads 3.9k cycles, group maxima 1.2k, floor
// 2.5k (7/8-masked: 4.1k, from the top two keys over [-inf, max]), count above it 2.0k, list
// copy 1.7k, radix select of the list (2 passes) 3.9k, writing 1.6k; 16.8k in all.
#pragma once

#include "portability.h"

constexpr int TOPK = 512;
// DIGIT: bits a radix pass resolves at most. 9 bits (H200, same-run A/B, two rounds): within 2%
// either way (dense 6x1M 31.14 -> 30.45 us, masked 32x128k 21.27 -> 20.71, masked 6x16k 9.99 ->
// 10.16, the rest within 1%): the passes saved cost as much in wider bins. 10 bits take the
// candidate kernel past sm_90's 48 KB of static shared memory (48.3 KiB on gfx942), 11 bits the
// chunk kernel to one workgroup a gfx942 CU (40.3 KiB of LDS).
constexpr int DIGIT = 8;
// Keys above the floor that top_k copies to LDS. 3072 (H200, same-run A/B) was no faster and
// made dense 32 x 128k 34.0 -> 39.4 us: the chunks of random rows whose one floor pass lands on
// a coarse bin hold up to about 3100 keys above it (0.3% of them, modelled), and one such chunk
// taking the register path holds up its launch.
constexpr int LIST = 4096;
constexpr uint32_t KEY_NEG_INF = 0x007fffffu;  // order_key(-inf): the least valid key
// The floor pass's range at most (keys: 2^23 a binade of floats, so 8 binades below the
// greatest key), when at least k of its keys lie in it; see top_k.
constexpr uint32_t FLOOR_SPAN = 1u << 26;
// A radix pass over a range known to hold at most this many keys (a pass after the first: the
// previous pass's bin count) counts each with a plain LDS atomic, not count_digit's ballots and
// broadcast in every slot: however those keys share addresses, gfx942 serializes at most this
// many updates. H200, one same-run A/B with emit's split below, two rounds: selection random /
// specials rows 16.24-16.47 / 16.46-16.53 -> 15.85-15.87 / 15.93-15.96 us, candidate top-k
// 10.68-10.70 -> 10.53-10.58; tied and masked rows, decode 6 x 128k and 32 x 1M within 1%
// (their later passes run over the LDS list, or over many tied keys). The selection's second
// pass had taken 3.4k cycles with about 40 of its 16384 keys in range (clock64 stamps), the
// first 5.3k with all of them. Keys tied on one value cost up to SPARSE_POP serialized updates
// in each remaining pass on gfx942 (not measured), where the aggregation costs one a slot.
constexpr uint32_t SPARSE_POP = 256;

// Every NaN ranks above +inf (torch.topk's order, and vLLM's top_k_per_row_decode's on CUDA,
// H100-measured on rows with NaN of both signs), and -0 below +0, as in vLLM's top-k (its bins
// keep the sign bit of a zero, in its fp16 first pass too), where torch.topk ties them: at a
// cut among zeros of both signs the kernels take vLLM's +0 first.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t k = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);   // -inf -> 0x007fffff
  return f != f ? 0xffffffffu : k;  // no key is 0
}

// Id: the type of the list's column ids. dsv_topk512_chunks stores a chunk's local column
// (< 16384) as uint16_t: 26.3 KiB of LDS in place of 34.3, so two of its workgroups fit a
// gfx942 CU's 64 KiB (its 84 VGPRs allow two as well); the other kernels keep int32 ids.
template <int BLOCK, class Id = int32_t, int BITS = DIGIT>
struct Sel {
  static constexpr int NWAVES = BLOCK / DSV_WAVE;
  static constexpr int BINS = 1 << BITS;  // bins of a radix pass
  uint32_t hist[2][BINS];  // ping-pong: one pass counts into one while the other is cleared
  uint32_t key[LIST];      // keys above top_k's floor, when few enough
  Id id[LIST];             // and their column ids
  uint32_t part[2][4][NWAVES];
  uint32_t res[2][3];
  uint32_t relay[2][2];  // a second pass's thresholds, see relay()
};

// The cut a select found: take every key > gt, and the first need_eq keys == eq; `total`
// entries in all (k, or every valid entry when a row holds fewer).
struct Cut {
  uint32_t gt, eq, need_eq, total;
};

// The second level of block_scan / block_reduce works on the NW wave totals only, so its
// shuffles span W = NW lanes, not the wave: log2(NW) rounds (each a shuffle, an LDS round trip
// on gfx942: ds_bpermute_b32 and a wait) in place of log2(DSV_WAVE), 3 or 4 in place of 6 on
// gfx942 at 512 or 1024 threads, 4 in place of 5 on sm_90 at 512. gfx942 (clang 19): 18-48
// fewer ds_bpermute_b32 a kernel (chunks 228 -> 180), 1-3% fewer instructions, VGPRs equal or
// fewer (chunks 87 -> 84). H100 (sm_90), same run, two rounds, us: decode 6x16k 7.72-7.75 ->
// 7.62-7.63, 6x128k 13.15-13.22 -> 12.97-12.99, 32x1M 87.3-87.7 -> 87.0, candidate top-k
// 9.85-9.87 -> 9.71-9.72, compact 8.68-8.70 -> 8.51-8.53; the selection (1024 threads, 32 warps:
// unchanged code there) 16.8 both; ragged 32x128k 17.9-18.0 -> 18.3-18.4.
template <int W>
constexpr bool lane_span_ok = W >= 1 && W <= DSV_WAVE && (W & (W - 1)) == 0;

// Inclusive prefix sums over lanes 0..W-1 (the lanes above hold sums nobody reads).
template <int W = DSV_WAVE>
__device__ __forceinline__ uint32_t wave_scan(uint32_t x) {
  static_assert(lane_span_ok<W>, "W: a power of two lanes within the wave");
  const int lane = dsv_lane();
#pragma unroll
  for (int d = 1; d < W; d <<= 1) {
    const uint32_t y = dsv_shfl_up(x, d);
    if (lane >= d) x += y;
  }
  return x;
}

// Exclusive prefix sums over the workgroup's threads of a and b, and their totals, with one
// barrier: every wave redoes the (short) scan of the wave totals. Consecutive calls of
// block_scan / block_reduce alternate `ph`'s parity, so that no barrier is needed after the
// reads; each call advances it.
template <int BLOCK, class Id, int B>
__device__ __forceinline__ void block_scan(Sel<BLOCK, Id, B>& s, int& ph, uint32_t& a, uint32_t& b,
                                           uint32_t& ta, uint32_t& tb) {
  constexpr int NW = Sel<BLOCK, Id, B>::NWAVES;
  const int buf = ph++ & 1;
  const int lane = dsv_lane(), w = dsv_wave();
  const uint32_t xa = wave_scan(a), xb = wave_scan(b);
  if (lane == DSV_WAVE - 1) {
    s.part[buf][0][w] = xa;
    s.part[buf][1][w] = xb;
  }
  __syncthreads();
  const uint32_t pa = wave_scan<NW>(lane < NW ? s.part[buf][0][lane] : 0u);
  const uint32_t pb = wave_scan<NW>(lane < NW ? s.part[buf][1][lane] : 0u);
  ta = dsv_bcast(pa, NW - 1);
  tb = dsv_bcast(pb, NW - 1);
  const uint32_t ba = dsv_bcast(pa, w > 0 ? w - 1 : 0), bb = dsv_bcast(pb, w > 0 ? w - 1 : 0);
  a = (w > 0 ? ba : 0u) + xa - a;
  b = (w > 0 ? bb : 0u) + xb - b;
}

// Sums of a and b, max of c, min of d over each aligned group of W lanes, in its every lane.
template <int W = DSV_WAVE>
__device__ __forceinline__ void wave_reduce(uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  static_assert(lane_span_ok<W>, "W: a power of two lanes within the wave");
#pragma unroll
  for (int m = W / 2; m > 0; m >>= 1) {
    a += dsv_shfl_xor(a, m);
    b += dsv_shfl_xor(b, m);
    c = max(c, dsv_shfl_xor(c, m));
    d = min(d, dsv_shfl_xor(d, m));
  }
}

// Workgroup sums of a and b, max of c, min of d, in every thread, with one barrier.
template <int BLOCK, class Id, int B>
__device__ __forceinline__ void block_reduce(Sel<BLOCK, Id, B>& s, int& ph, uint32_t& a,
                                             uint32_t& b, uint32_t& c, uint32_t& d) {
  constexpr int NW = Sel<BLOCK, Id, B>::NWAVES;
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
  const int p = lane % NW;  // every group of NW lanes reads all NW totals and reduces them
  a = s.part[buf][0][p];
  b = s.part[buf][1][p];
  c = s.part[buf][2][p];
  d = s.part[buf][3][p];
  wave_reduce<NW>(a, b, c, d);
}

// Adds one wave's active digits to hist in one atomic instruction: the first active lane adds
// for every lane holding its digit, the other lanes one each. A wave of equal keys (-inf,
// masked logits, ties) therefore costs one atomic, not 64 on one LDS address (gfx942
// serializes those: vLLM's top-k takes 100 us on a 6 x 128k masked row for it, per
// ../shared/docs/performance-anchors.md). H200,
// same run, two rounds, against aggregating the first two digits: selection random / tied /
// specials 25.1-25.3 / 21.0 / 23.9 -> 23.2-23.4 / 19.7 / 22.0 us, decode 6x16k 9.34 -> 8.73,
// 6x128k 14.9 -> 14.1, masked 16.3 -> 15.3, 32x1M 98.4 -> 94.4, masked 107.6 -> 102.0, tied
// 111.3 -> 110.0, candidate top-k 10.75 -> 10.3; no shape slower. One plain atomic a key (no
// aggregation) was faster still on the H200, tied rows too (selection 20.3, tied 17.8; decode
// 6x128k 13.1, 32x1M 88.0), whose same-address shared atomics do not serialize as gfx942's do.
// The lead's count and the others' ones in one atomic, not two (another run, two rounds):
// selection 19.0-19.2 -> 18.4-18.6 us, decode 6x128k 14.0 -> 13.6, 32x1M 94.1 -> 92.3, masked
// 101.8-102.1 -> 100.2-100.3; tied rows and the candidate top-k within 0.05 us.
// Modelled gfx942 serialization (CPU emulation, benchmarks/topk_sweeps.md): at most 4.9% of a
// workgroup's chain on random, bf16, masked and drifting rows, 14.7% in layer 20's selection on
// a grid of 0.25, 37.9% on descending block scores (a wave straddling a bin's edge with the
// rarer digit first). Aggregating the last active lane's digit too cut that to 5.3% but cost
// the H200 1-5% everywhere (selection 15.25 -> 16.06 us): not adopted. CI holds the
// aggregation (test_counts_keep_tied_lanes_off_one_lds_address).
__device__ __forceinline__ void count_digit(uint32_t* hist, bool active, uint32_t digit) {
  const lanemask_t m = dsv_ballot(active);
  if (m == 0) return;
  const int lead = dsv_ffs(m) - 1;
  const uint32_t hot = dsv_bcast(digit, lead);
  const bool is_hot = active && digit == hot;
  const lanemask_t mh = dsv_ballot(is_hot);
  const bool is_lead = dsv_lane() == lead;  // adds for every hot lane (hist[digit] is hist[hot])
  if (active && (is_lead || !is_hot))
    atomicAdd(&hist[digit], is_lead ? (uint32_t)dsv_popc(mh) : 1u);
}

// Keys held in registers: N a thread, `used` of them (uniform across the workgroup); the floor
// pass takes the maximum of each group of G slots: consecutive ones, or with INTERLEAVED every
// GROUPS-th slot (group g: slots g, g + GROUPS, ...).
template <int N, int G, bool INTERLEAVED = false>
struct RegKeys {
  static constexpr int GROUPS = N / G;
  static constexpr bool INTERLEAVED_GROUPS = INTERLEAVED;
  static __device__ __forceinline__ int group(int slot) {
    return INTERLEAVED ? slot % GROUPS : slot / G;
  }
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
  static constexpr bool INTERLEAVED_GROUPS = false;
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

// Clears hist[0]; a kernel calls it before its first count (some issue their loads first):
// top_k's first barrier orders it before that count.
template <int BLOCK, class Id, int B>
__device__ __forceinline__ void select_prologue(Sel<BLOCK, Id, B>& s) {
  for (int i = threadIdx.x; i < Sel<BLOCK, Id, B>::BINS; i += BLOCK) s.hist[0][i] = 0;
}

// The cut of the k largest keys in [lo, hi] (keys outside the range are not
// candidates, those above hi must not exist): a radix select over the key range, whose bins
// are 2^shift consecutive keys (at most Sel::BINS bins), that narrows the range to the k-th key's
// bin each pass and stops when that bin is taken whole. Each pass is one count and three
// barriers; hist[pc & 1] is clear when pass pc starts. After max_passes, or once the k-th
// key's bin holds at most `loose` keys (0: never), it returns a floor instead: every key in or
// above the k-th key's bin (gt = that bin's least key - 1). When [lo, hi] holds fewer than k
// keys (a floor pass over a narrowed range, see top_k), it returns total 0 after one pass.
// Not adopted: one barrier a pass, every wave then finding the k-th key's bin in the histogram
// by itself (lane l summing 8 contiguous bins on sm_90, 4 on gfx942; a third histogram for the
// next pass). H200, same-run A/B: 10-17% slower everywhere (dense 6x16k 9.28 -> 10.42 us,
// 6x128k 18.19 -> 20.74, 32x1M 169.3 -> 188.1); each of 16 waves reading all 256 bins, with
// lanes 8 words apart (bank conflicts, presumably), cost more than the two barriers it saved.
// Nor did wave 0 alone finding the bin and publishing it (two barriers a pass): 2-3% slower
// (6x16k 9.22 -> 9.43 us, 6x128k 18.18 -> 18.70, 32x1M 169.4 -> 173.2, selection 26.59 ->
// 27.43); one wave's serial scan of 256 bins outlasts the workgroup scan and its barrier.
template <int BLOCK, class Id, int B, class Keys>
__device__ __forceinline__ Cut radix_cut(Sel<BLOCK, Id, B>& s, int& ph, Keys& keys, uint32_t k,
                                         uint32_t lo, uint32_t hi, int& pc, int max_passes,
                                         uint32_t loose = 0) {
  uint32_t krem = k, pop = 0xffffffffu;  // keys in [lo, hi], once a pass has counted them
#pragma unroll 1
  for (int p = 0;; ++p, ++pc) {
    // One key value left, krem of its ties: only once a pass has counted them, since a floor
    // pass's range may open with fewer than k keys (every group's top two equal: lo == hi).
    if (lo == hi && pop != 0xffffffffu) return Cut{lo, lo, krem, k};
    const uint32_t span = hi - lo;
    const int bits = 32 - __clz((int)span);
    const int shift = bits > B ? bits - B : 0;
    const int nb = (int)(span >> shift) + 1;
    uint32_t* hist = s.hist[pc & 1];
    for (int i = threadIdx.x; i < Sel<BLOCK, Id, B>::BINS; i += BLOCK) s.hist[(pc + 1) & 1][i] = 0;
    if (pop <= SPARSE_POP) {  // few keys in range: one plain atomic each
      keys.each([&](uint32_t key, int) {
        if (key >= lo && key <= hi) atomicAdd(&hist[(key - lo) >> shift], 1u);
      });
    } else {
      keys.each([&](uint32_t key, int) {
        count_digit(hist, key >= lo && key <= hi, (key - lo) >> shift);
      });
    }
    __syncthreads();
    // The bin where the count from the top reaches krem: thread t sums bins nb-1-t*per down.
    constexpr int per = (Sel<BLOCK, Id, B>::BINS + BLOCK - 1) / BLOCK;
    const int b0 = nb - 1 - (int)threadIdx.x * per;
    uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < per; ++i)
      if (b0 - i >= 0) sum += hist[b0 - i];
    uint32_t before = sum, unused = 0, total, t2;
    block_scan(s, ph, before, unused, total, t2);
    if (total < krem) {
      ++pc;
      return Cut{0u, 0u, 0u, 0u};
    }
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
    if (cnt == krem || p + 1 == max_passes || (loose != 0 && cnt <= loose)) {  // a floor:
      ++pc;
      return Cut{least - 1, 0u, 0u, k};
    }
    lo = least;
    pop = cnt;
    const uint64_t top = (uint64_t)least + ((1ull << shift) - 1);
    hi = top < hi ? (uint32_t)top : hi;
  }
}

// radix_cut over the top FLOOR_SPAN of [lo, hi] first, where the cut lies unless few keys do
// (see top_k), and over all of [lo, hi] when that holds fewer than k keys.
template <int BLOCK, class Id, int B, class Keys>
__device__ __forceinline__ Cut span_cut(Sel<BLOCK, Id, B>& s, int& ph, Keys& keys, uint32_t k,
                                        uint32_t lo, uint32_t hi, int& pc, int max_passes) {
  Cut c = radix_cut(s, ph, keys, k, hi - lo > FLOOR_SPAN ? hi - FLOOR_SPAN : lo, hi, pc,
                    max_passes);
  if (c.total == 0) c = radix_cut(s, ph, keys, k, lo, hi, pc, max_passes);
  return c;
}

// Two passes over a thread's register keys that compare them with the same threshold would keep a
// comparison mask a key alive between the passes (the compiler reuses the first pass's), spilling
// SGPRs on gfx942 (found with 64 keys a thread; 32 at most now). Thread 0 stores the threshold
// before the block_scan/block_reduce call of parity `buf` (whose barrier publishes it) and every
// thread reads it back after: the same value, which the compiler cannot see, so the second pass
// compares afresh.
template <int BLOCK, class Id, int B>
__device__ __forceinline__ void relay(Sel<BLOCK, Id, B>& s, int buf, uint32_t a, uint32_t b) {
  if (threadIdx.x == 0) {
    s.relay[buf][0] = a;
    s.relay[buf][1] = b;
  }
}

// Calls out(key, pay(slot), position) for each key the cut takes; positions are 0..n-1, from
// prefix sums of each thread's counts (no atomics). Returns n: cut.total for an exact cut, every
// key above cut.gt for a floor (need_eq 0). A cut with no ties to take (need_eq 0, uniform)
// writes with a loop that has no equality test: H200, the same run as SPARSE_POP's, selection
// random / masked / specials / tied rows 15.85-15.87 / 15.66-15.68 / 15.93-15.96 / 14.63-14.65
// -> 15.21-15.29 / 14.99-15.00 / 15.29-15.32 / 14.47-14.49 us; decode and the candidate top-k
// within 0.6%. The count loop split the same way gained 0.2 us more but took the gfx942 chunk
// kernel from 87 to 134 VGPRs (one workgroup a CU, not two): not done.
template <int BLOCK, class Id, int B, class Keys, class Pay, class Out>
__device__ __forceinline__ uint32_t emit(Sel<BLOCK, Id, B>& s, int& ph, Keys& keys, const Cut cut,
                                         Pay pay, Out out) {
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
  if (need_eq == 0) {
    keys.each([&ngt, gt, pay, out](uint32_t key, int slot) {
      if (key > gt) out(key, pay(slot), ngt++);
    });
  } else {
    keys.each([&ngt, &neq, gt, eq, need_eq, eq_base, pay, out](uint32_t key, int slot) {
      if (key > gt) {
        out(key, pay(slot), ngt++);
      } else if (key == eq) {
        if (neq < need_eq) out(key, pay(slot), eq_base + neq);
        ++neq;
      }
    });
  }
  return t1 + need_eq;
}

// The k largest valid (nonzero) keys: calls out(key, pay(slot), position) for each, positions
// 0..n-1, and returns n (k, or every valid key when fewer). With cap > k, a superset of them
// will do: every valid key when at most cap, else every key above the floor when at most cap,
// else those in or above the k-th key's bin of a radix pass over them when fewer than cap
// (n between k and cap; the caller selects again), else the k largest. A floor F comes first,
// from one histogram pass over the group maxima: at least k maxima, so at least k keys, are
// >= F, and no key below F can be taken. If fewer than k keys lie above F, F is the k-th key
// (ties, -inf rows: no more selecting; the k are listed and written from the list). Else the
// keys above F go to the LDS list with pay(slot) when at most LIST, and are selected and
// written from there.
// One floor pass: two in every kernel (a second while the k-th maximum's bin held more than
// k / 8 maxima; H200, one A/B run) sped decode dense 6 x 16k 12.40 -> 11.64 us but slowed 32 x
// 1M 200.7 -> 209.0 and the candidate top-k 18.76 -> 19.70. (Layer 20's selection took two
// until it got its own cut, hip/topk512.hip.)
// The floor pass's range: [max - FLOOR_SPAN, max] first, when the keys span more, and the
// whole range only if that holds fewer than k of them. 256 bins over a wider range are too
// coarse: over [-inf, max] (7/8-masked rows, whose dead groups' maxima are -inf) or over group
// maxima that straddle zero (a key range of 2^31: some chunks of random rows) most bins are
// empty and many keys share the k-th key's bin (most of them pass the floor; a chunk with more
// than `cap` of them takes the exact cut and holds up its launch). H200, same-run A/B, chunk
// and first merge kernels at two workgroups an SM, before the one scan below: dense 32x128k
// 25.22 -> 22.71 us, ragged 6x128k 19.74 -> 16.63, ragged 32x1M 102.05 -> 100.04, 32x1M 116.67
// -> 115.26; 6x128k 16.11 -> 16.44.
template <int BLOCK, class Id, int B, class Keys, class Pay, class Out>
__device__ __forceinline__ uint32_t top_k(Sel<BLOCK, Id, B>& s, Keys& keys, uint32_t k, Pay pay,
                                          Out out, uint32_t cap = 0) {
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
  // nmax: the valid maxima (low 16 bits) and those above -inf (high 16 bits; at most 8192 of
  // each: BLOCK * M <= 1024 * 8).
  uint32_t nmax = 0, thi = 0, tlo = 0xffffffffu;
#pragma unroll
  for (int g = 0; g < M; ++g) {
    nmax += (mx[g] != 0 ? 1u : 0u) + (mx[g] > KEY_NEG_INF ? 0x10000u : 0u);
    thi = max(thi, mx[g]);
    tlo = mx[g] ? min(tlo, mx[g]) : tlo;
  }
  block_reduce(s, ph, nvalid, nmax, thi, tlo);
  // At most max(cap, k) valid keys: every one is taken (floor 0, written out from the list).
  const bool all = nvalid <= (cap > k ? cap : k);
  const uint32_t nlive = nmax >> 16;
  nmax &= 0xffffu;
  uint32_t floor = 0;  // count(key >= floor) >= k
  // Interleaved groups: fewer than 2k maxima above -inf, not k (below).
  const uint32_t min_live = Keys::INTERLEAVED_GROUPS ? 2 * k : k;
  if (!all && 2 * nmax >= k && (nlive < min_live || nmax < 2 * k)) {
    // Fewer than k maxima above -inf (masked rows: 7/8 of a chunk's groups hold only -inf):
    // a floor from the maxima would be -inf. Or fewer than 2k valid maxima (a row's partial
    // last chunk): a floor from them would be about the least of them. So would one from the
    // maxima of a 7/8-masked chunk's interleaved groups, about 670 of 1024 live: with the rule
    // of consecutive groups (fewer than k) they took it, modelled (the floor pass's bins
    // included) 873 keys above it and 2.9% of chunks over a superset's 1,024 slots, one such
    // chunk holding up its launch: H100, masked 6x128k rows of one seed 13.31-13.43 ->
    // 15.63-15.71 us, of another 13.26-13.34 -> 13.37-13.47, 32x128k 17.97-18.32 -> 19.01-19.06
    // (32x1M 90.3-91.3 -> 87.4-87.9). Their top two (min_live 2k): modelled 556 keys above the
    // floor, at most 602 in 1,000 chunks, against 615 with consecutive groups; H100, same run,
    // two rounds, against consecutive groups: masked 6x128k 13.17-13.28 -> 13.19-13.27 us,
    // 32x128k 18.06-18.13 -> 17.90-18.24, 32x1M 90.5-91.1 -> 90.2-90.9; bench_topk's other
    // masked 6x128k rows 13.31-13.51 -> 13.97-13.99, one radix pass more in one row's final
    // merge (the merge 6.75 -> 7.37 us, the chunks 6.4 in both); of 12 more seeds (another run)
    // 2 gained that pass's 0.65 us, 10 equal. The top two keys of each group, at least k of
    // them >= the least valid maximum tlo, give one: their k-th largest, as one histogram pass
    // over [tlo, thi] finds it, has k keys at or above it.
    // Partial random chunks of 3000 / 5000 / 8000 keys (modelled): 2290 / 2700 / 2890 keys
    // above the floor from the maxima, 810 / 820 / 630 from the top two (H200, same-run A/B
    // with chunk supersets: ragged 32x128k 29.10 -> 28.28 us, other shapes within 1.2%). Top
    // two in every kernel of groups of 16 (a full random chunk: 730 -> 540 keys above the
    // floor, modelled) was slower: dense 6x16k 9.34 -> 10.05 us, 32x1M 167.6 -> 177.2. So
    // was one floor pass for both paths (each group's top two kept in the maxima's loop, the
    // second keys zero on dense chunks): masked 6x16k 9.80 -> 9.70 us, 32x1M 107.9 -> 106.5,
    // but dense 32x1M 98.6 -> 101.1, selection 25.9 -> 27.6 (same run, three rounds).
    // Before, masked rows skipped the floor and listed every live key (2048 of a 16k chunk,
    // 2.6 radix passes; H200 then 13.64 -> 12.14 us at 6 x 16k against a floor pass that
    // returned -inf). Same-run A/B against skipping, masked 6 x 16k / 6 x 128k / 32 x 128k /
    // 32 x 1M: 12.00 -> 10.32 / 19.91 -> 18.96 / 32.26 -> 29.05 / 203.9 -> 188.6 us; dense
    // within 1.3% (32 x 1M 178.1 -> 180.3).
    uint32_t t1[M], t2[M];
#pragma unroll
    for (int g = 0; g < M; ++g) t1[g] = t2[g] = 0;
    keys.each([&](uint32_t key, int slot) {
      const int g = Keys::group(slot);
      t2[g] = max(t2[g], min(t1[g], key));
      t1[g] = max(t1[g], key);
    });
    RegKeys<2 * M, 1> top2;
#pragma unroll
    for (int g = 0; g < M; ++g) {
      top2.k[2 * g] = t1[g];
      top2.k[2 * g + 1] = t2[g];
    }
    top2.used = 2 * M;
    // With fewer than k valid maxima (a partial chunk under 1024 columns: two keys a group, of
    // its threads' first float4s), the top two keys may still be k; the floor pass then spans
    // every valid key, and when even that holds fewer than k, there is no floor (every valid key
    // is above 0).
    // (span_cut, but retrying over every valid key when fewer than k maxima are valid.)
    Cut f = radix_cut(s, ph, top2, k, thi - tlo > FLOOR_SPAN ? thi - FLOOR_SPAN : tlo, thi, pc, 1);
    if (f.total == 0) f = radix_cut(s, ph, top2, k, nmax >= k ? tlo : 1u, thi, pc, 1);
    if (f.total != 0) floor = f.need_eq ? f.eq : f.gt + 1;
  } else if (!all && nmax >= k) {
    RegKeys<M, 1> maxima;
#pragma unroll
    for (int g = 0; g < M; ++g) maxima.k[g] = mx[g];
    maxima.used = M;
    const Cut f = span_cut(s, ph, maxima, k, tlo, thi, pc, 1);
    floor = f.need_eq ? f.eq : f.gt + 1;
  }
  // One scan gives each key above the floor its position among them, and each key equal to it
  // its rank among those; the paths below write (or list) the keys from it. H200, same-run A/B
  // against a reduction for the count (and the keys' range) followed by a scan or an emit(),
  // one workgroup an SM: dense / masked 6x16k 9.38 -> 8.89 / 10.06 -> 9.57 us, candidate top-k
  // 11.18 -> 10.72, compact 10.21 -> 9.72, selection 25.98 -> 25.53; but 6x128k 15.80 -> 16.47,
  // 6x1M 38.49 -> 39.77, 32x1M 146.44 -> 149.60: in those launches, and only there, the chunk
  // kernel took longer (chunk and merge kernels of both builds mixed: +0.55 us at masked 6x128k,
  // the merge -0.3; timed alone, the chunk launch within 0.2 us). Kept for the kernels whose
  // workgroup is a whole row, and as the shorter code; a superset has since been written out
  // through the list (below), which more than made up for it (6x128k 16.82 -> 15.03 us).
  uint32_t gt = 0, eq = 0, ngt, unused;
  keys.each([&](uint32_t key, int) {
    gt += key > floor;
    eq += key == floor;
  });
  const int buf = ph & 1;
  relay(s, buf, floor, 0u);
  block_scan(s, ph, gt, eq, ngt, unused);
  const uint32_t above = s.relay[buf][0];  // == floor
  if (ngt < k && !all) {  // the floor is the k-th key: the keys above it, then k - ngt equal
    // Listed, then written out from the list (k <= LIST: every caller's k is at most LIST), as
    // a superset is, not from the registers (a few lanes a store, strided). H200, same run,
    // three rounds, against the registers: 6x128k rows of 95% zeros / all -inf / one value
    // 18.03-18.07 / 13.46-13.53 / 13.34-13.38 -> 16.87-16.88 / 12.14-12.17 / 11.96 us, 32x1M
    // rows of 95% zeros 128.9-129.0 -> 127.8-127.9, random 32x1M 98.2 -> 97.7-98.0; but 32x1M
    // all -inf / one value 101.1-101.4 / 100.7-101.0 -> 104.2-104.3 / 104.0-104.1. This fill
    // loop serving the list path below too (need_eq 0 there) made every shape slower, most by a
    // fifth (6x128k 14.5 -> 17.7 us, 32x1M 98.2 -> 126.5; benchmarks/topk_sweeps.md).
    const uint32_t need_eq = k - ngt;
    keys.each([&gt, &eq, &s, above, need_eq, ngt, pay](uint32_t key, int slot) {
      const bool take = key > above || (key == above && eq < need_eq);
      const uint32_t at = key > above ? gt : ngt + eq;
      if (take) {
        s.key[at] = key;
        s.id[at] = pay(slot);
      }
      gt += key > above;
      eq += key == above;
    });
    __syncthreads();
#pragma unroll 1
    for (int i = threadIdx.x; i < (int)k; i += BLOCK) out(s.key[i], s.id[i], (uint32_t)i);
    return k;
  }
  // The cut among the keys above the floor, over [floor + 1, the greatest key]: exact, or where a
  // superset will do (a chunk, a first merge), every key in or above the k-th key's bin once that
  // bin holds at most cap - k keys (fewer than cap in all): one radix pass, where the exact cut
  // takes up to four. A chunk with a cluster of high logits had more than cap keys above its floor
  // while the groups were consecutive (the interleaved groups leave about 650 of a chunk whose
  // newest 4096 are raised, 1,022 of an ascending one, within cap; modelled). H200, same run, three
  // rounds, against the exact cut: 6x128k rows whose newest 4096 logits are raised by 3 18.55-18.57
  // -> 17.34-17.38 us, one cluster of 600 17.13-17.15 -> 16.71-16.73; 32x1M ascending / descending
  // rows 132.6-132.8 / 132.5-132.6 -> 121.6-121.8 / 124.0-124.2; random rows within 0.4%; but
  // 6x128k descending / ascending rows 18.38-18.40 / 17.26-17.28 -> 19.11-19.37 / 17.63-17.74,
  // where a chunk's exact 512 were the row's answer and its merge's floor landed on the 512th key
  // (no radix pass there).
  const uint32_t loose = cap > k ? cap - k : 0u;
  if (ngt > LIST) {
    const Cut cut = radix_cut(s, ph, keys, k, above + 1, thi, pc, 32, loose);
    return emit(s, ph, keys, cut, pay, out);
  }
  keys.each([&gt, &s, above, pay](uint32_t key, int slot) {
    if (key > above) {
      s.key[gt] = key;
      s.id[gt] = pay(slot);
      ++gt;
    }
  });
  __syncthreads();
  // A superset will do: the list, written out in its order (a rolled loop, a few entries a
  // thread). Written from the registers, as the list is filled, it took a chunk 5926 cycles
  // (clock() stamps, H200, a random 16k chunk: most waves run most slots' stores for a few
  // lanes each), against 1116 for filling the list.
  if (all || (cap > k && ngt <= cap)) {
#pragma unroll 1
    for (int i = threadIdx.x; i < (int)ngt; i += BLOCK) out(s.key[i], s.id[i], (uint32_t)i);
    return ngt;
  }
  ListKeys<BLOCK> list{s.key, (int)ngt};
  const Cut cut = radix_cut(s, ph, list, k, above + 1, thi, pc, 32, loose);
  return emit(s, ph, list, cut, [&](int slot) { return s.id[slot * BLOCK + (int)threadIdx.x]; },
              out);
}
