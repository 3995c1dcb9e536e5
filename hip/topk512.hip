// Top-512 selection for DeepSeek-V4.1's sparse indexer (decode), written for gfx942.
//
// Every kernel ranks fp32 logits by an order-preserving uint32 key (order_key): NaN above +inf,
// as torch.topk ranks them, and key 0 for "no entry" (past a row's end, a -1 candidate). A
// workgroup of BLOCK threads holds its keys in registers and finds the cut of its k largest
// (select_top): first a floor from one histogram pass over the threads' own maxima (at least k
// keys are >= it, most keys are below it), then an exact radix select (11 bits a pass, over the
// bits where the candidates differ) of the keys above the floor, copied to an LDS list when few.
// The taken keys are written at positions from prefix sums (emit), with no atomics. Histogram
// counts are aggregated per wave: the lanes that share the wave's first one or two digits add
// with one LDS atomic, so rows of equal values (-inf, masked logits) cost no more than others;
// when at least k keys equal the floor (all -inf, ties) no histogram of the keys is needed.
//
// Kernels (all launched by src/dsv41_gfx942_plugin/ops/topk.py through ops/_launcher.py):
//   dsv_topk512_chunks / _stream   pass 1 of the decode top-512: one workgroup per chunk of a row
//   dsv_topk512_merge               pass 2: each row's chunk candidates down to 512
//   dsv_topk512_candidates          top-512 over the columns of a row's candidate blocks
//   dsv_topk512_compact             top-512 over a compact row of (logit, column id)
//   dsv_select_blocks               layer 20's candidate blocks (block max, top-K blocks)
// Row ends are read on the device, so a CUDA graph captured once is right at every replay.
#include "portability.h"

constexpr int BLOCK = 1024;
constexpr int NWAVES = BLOCK / DSV_WAVE;
constexpr int TOPK = 512;
constexpr int CHUNK = BLOCK * 16;       // a chunk of dsv_topk512_chunks (16 logits a thread)
constexpr int MAX_MERGE = BLOCK * 32;   // chunk candidates one row can merge (64 chunks of 512)
constexpr int MAX_SELECT = BLOCK * 32;  // blocks of a row dsv_select_blocks scores
constexpr int DIGIT = 11;               // bits a radix pass resolves (3 passes cover 32)
constexpr int HIST = 1 << DIGIT;        // bins of a radix pass
constexpr int LIST = 4096;              // keys above the floor that select_top copies to LDS
constexpr int TABLE = 4096;             // hash slots for deduplicating <= 2048 candidate blocks
constexpr uint32_t KEY_POS_INF = 0xff800000u;

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

struct Sel {
  uint32_t hist[2][HIST];  // ping-pong: one pass counts into one while the other is cleared
  uint32_t list[LIST];     // keys above select_top's floor, when few enough
  uint32_t part[2][4][NWAVES];
  uint32_t res[2][3];
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
// barrier: every wave redoes the (short) scan of the wave totals. `buf` alternates between
// consecutive calls so that no barrier is needed after the reads.
__device__ __forceinline__ void block_scan(Sel& s, int buf, uint32_t& a, uint32_t& b, uint32_t& ta,
                           uint32_t& tb) {
  const int lane = dsv_lane(), w = dsv_wave();
  const uint32_t xa = wave_scan(a), xb = wave_scan(b);
  if (lane == DSV_WAVE - 1) {
    s.part[buf][0][w] = xa;
    s.part[buf][1][w] = xb;
  }
  __syncthreads();
  const uint32_t pa = wave_scan(lane < NWAVES ? s.part[buf][0][lane] : 0u);
  const uint32_t pb = wave_scan(lane < NWAVES ? s.part[buf][1][lane] : 0u);
  ta = dsv_shfl(pa, NWAVES - 1);
  tb = dsv_shfl(pb, NWAVES - 1);
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
__device__ __forceinline__ void block_reduce(Sel& s, int buf, uint32_t& a, uint32_t& b, uint32_t& c,
                             uint32_t& d) {
  wave_reduce(a, b, c, d);
  const int lane = dsv_lane(), w = dsv_wave();
  if (lane == 0) {
    s.part[buf][0][w] = a;
    s.part[buf][1][w] = b;
    s.part[buf][2][w] = c;
    s.part[buf][3][w] = d;
  }
  __syncthreads();
  a = lane < NWAVES ? s.part[buf][0][lane] : 0u;
  b = lane < NWAVES ? s.part[buf][1][lane] : 0u;
  c = lane < NWAVES ? s.part[buf][2][lane] : 0u;
  d = lane < NWAVES ? s.part[buf][3][lane] : 0xffffffffu;
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

// Keys held in registers: N a thread, `used` of them (uniform across the workgroup).
template <int N>
struct RegKeys {
  uint32_t k[N];
  int used;
  template <class F>
  __device__ __forceinline__ void each(F f) {
#pragma unroll
    for (int g = 0; g < N; g += 4) {
      if (g >= used) break;
#pragma unroll
      for (int s = g; s < g + 4 && s < N; ++s) f(k[s], s);
    }
  }
};

// Keys read from memory at each pass (rows too long for registers): columns [lo, hi).
struct StreamKeys {
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

// Keys of the LDS list (select_top's keys above its floor).
struct ListKeys {
  const uint32_t* list;
  int n;
  template <class F>
  __device__ __forceinline__ void each(F f) {
#pragma unroll
    for (int s = 0; s < LIST / BLOCK; ++s) {
      const int i = s * BLOCK + (int)threadIdx.x;
      if (s * BLOCK < n) f(i < n ? list[i] : 0u, s);
    }
  }
};

// Clears hist[0]; a kernel calls it before loading its keys (select_top's first barrier
// orders it before the first count).
__device__ __forceinline__ void select_prologue(Sel& s) {
  for (int i = threadIdx.x; i < HIST; i += BLOCK) s.hist[0][i] = 0;
}

// The cut of the k largest keys above `floor` (k <= their count; lo and hi their least and
// greatest): radix select over the bits below the common prefix of lo and hi, 11 bits a pass,
// that stops when the k-th key's bin is taken whole. Each pass is one count and three
// barriers; hist[pc & 1] is clear when pass pc starts. After max_passes it returns a floor
// instead: every key in or above the k-th key's bin (gt = that bin's least key - 1).
template <class Keys>
__device__ __forceinline__ Cut radix_cut(Sel& s, Keys& keys, uint32_t k, uint32_t floor, uint32_t lo,
                         uint32_t hi, int& pc, int max_passes) {
  if (lo == hi) return Cut{lo, lo, k, k};  // all equal: any k of them
  int top = 31 - __clz((int)(lo ^ hi));    // highest bit where the keys differ
  uint64_t prefix = (uint64_t)hi >> (top + 1);
  uint32_t krem = k;
#pragma unroll 1
  for (int p = 0;; ++p, ++pc) {
    const int shift = top + 1 > DIGIT ? top + 1 - DIGIT : 0;
    const int bits = top + 1 - shift;
    const int nb = 1 << bits;
    uint32_t* hist = s.hist[pc & 1];
    for (int i = threadIdx.x; i < HIST; i += BLOCK) s.hist[(pc + 1) & 1][i] = 0;
    keys.each([&](uint32_t key, int) {
      const bool active = key > floor && ((uint64_t)key >> (top + 1)) == prefix;
      count_digit(hist, active, (key >> shift) & (uint32_t)(nb - 1));
    });
    __syncthreads();
    // The bin where the count from the top reaches krem: thread t sums bins nb-1-t*per down.
    const int per = (nb + BLOCK - 1) / BLOCK;
    const int b0 = nb - 1 - (int)threadIdx.x * per;
    uint32_t sum = 0;
    for (int i = 0; i < per; ++i)
      if (b0 - i >= 0) sum += hist[b0 - i];
    uint32_t before = sum, unused = 0, total, t2;
    block_scan(s, pc & 1, before, unused, total, t2);
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
    prefix = (prefix << bits) | bin;
    krem -= above;
    if (cnt != krem && shift == 0) {  // the k-th key exactly, with krem of its ties
      ++pc;
      return Cut{(uint32_t)prefix, (uint32_t)prefix, krem, k};
    }
    if (cnt == krem || p + 1 == max_passes) {  // every key >= the bin's least key
      ++pc;
      const uint32_t least = (uint32_t)(prefix << shift);
      return Cut{least > floor + 1 ? least - 1 : floor, 0u, 0u, k};
    }
    top = shift - 1;
  }
}

// The cut of the k largest valid (nonzero) keys. A floor F comes first, from one histogram
// pass over the threads' own maxima: at least k maxima, so at least k keys, are >= F, and no
// key below F can be taken. Most keys fall below it. If fewer than k keys lie above F, F is the
// k-th key (ties, -inf rows: no more work). Else the keys above F, copied to an LDS list when
// few, are radix-selected: far fewer keys reach a histogram than the workgroup holds.
template <class Keys>
__device__ __forceinline__ Cut select_top(Sel& s, Keys& keys, uint32_t k) {
  uint32_t nvalid = 0, tmax = 0;
  keys.each([&](uint32_t key, int) {
    nvalid += key != 0;
    tmax = max(tmax, key);
  });
  uint32_t nthreads = tmax != 0, thi = tmax, tlo = tmax ? tmax : 0xffffffffu;
  block_reduce(s, 0, nvalid, nthreads, thi, tlo);
  if (nvalid <= k) return Cut{0u, 0u, 0u, nvalid};  // take every valid key
  int pc = 0;
  uint32_t floor = 0;  // count(key >= floor) >= k
  if (nthreads >= k) {
    RegKeys<1> maxima;
    maxima.k[0] = tmax;
    maxima.used = 1;
    const Cut f = radix_cut(s, maxima, k, 0u, tlo, thi, pc, 1);
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
  block_reduce(s, 1, ngt, zero, ahi, alo);
  if (ngt < k) return Cut{floor, floor, k - ngt, k};  // the floor is the k-th key
  if (ngt > LIST) return radix_cut(s, keys, k, floor, alo, ahi, pc, 3);
  uint32_t pos = mine, unused = 0, t1, t2;
  block_scan(s, 0, pos, unused, t1, t2);
  keys.each([&](uint32_t key, int) {
    if (key > floor) s.list[pos++] = key;
  });
  __syncthreads();
  ListKeys list{s.list, (int)ngt};
  return radix_cut(s, list, k, floor, alo, ahi, pc, 3);
}

// Calls out(key, slot, position) for each taken key; positions are 0..cut.total-1, from
// prefix sums of each thread's counts (no atomics).
template <class Keys, class Out>
__device__ __forceinline__ void emit(Sel& s, Keys& keys, const Cut cut, Out out) {
  uint32_t ngt = 0, neq = 0;
  keys.each([&](uint32_t key, int) {
    ngt += key > cut.gt;
    neq += cut.need_eq != 0 && key == cut.eq;
  });
  uint32_t t1, t2;
  block_scan(s, 0, ngt, neq, t1, t2);
  const uint32_t eq_base = cut.total - cut.need_eq;
  keys.each([&](uint32_t key, int slot) {
    if (key > cut.gt) {
      out(key, slot, ngt++);
    } else if (cut.need_eq != 0 && key == cut.eq) {
      if (neq < cut.need_eq) out(key, slot, eq_base + neq);
      ++neq;
    }
  });
}

// indices[0..n) = 0..end-1 then -1: the answer for a row of at most n entries.
__device__ __forceinline__ void write_iota(int32_t* out, int end, int n) {
  for (int j = threadIdx.x; j < n; j += BLOCK) out[j] = j < end ? j : -1;
}

__device__ __forceinline__ void write_tail(int32_t* out, int from, int n) {
  for (int j = from + (int)threadIdx.x; j < n; j += BLOCK) out[j] = -1;
}

// A row's chunk length: at least min_chunk, and at most max_chunks chunks a row.
__device__ __forceinline__ int chunk_len(int end, int min_chunk, int max_chunks) {
  const int even = (end + max_chunks - 1) / max_chunks;
  return even > min_chunk ? even : min_chunk;
}

// ------------------------------------------------------------------- decode top-512, pass 1
// Grid (max_chunks, rows). All three decode kernels take the same arguments.
#define TOPK_ARGS                                                                        \
  const float *logits, long long row_stride, int width, const int32_t *seq_lens,         \
      int causal, int next_n, int32_t *indices, long long idx_stride, uint32_t *cand_keys, \
      int32_t *cand_ids, int max_chunks, int min_chunk

// Pass 1 of a chunk: its top 512 go straight to the row's indices when the chunk is the whole
// row, else to the row's candidate scratch (key and column) for dsv_topk512_merge.
template <class Keys, class Col>
__device__ __forceinline__ void chunk_select(Sel& s, Keys& keys, Col col, int32_t* out_row, uint32_t* ck,
                             int32_t* ci, bool direct) {
  const Cut cut = select_top(s, keys, TOPK);
  emit(s, keys, cut, [&](uint32_t key, int slot, uint32_t pos) {
    if (direct) {
      out_row[pos] = col(slot);
    } else {
      ck[pos] = key;
      ci[pos] = col(slot);
    }
  });
  if (direct) write_tail(out_row, (int)cut.total, TOPK);
}

// The register path: ITEMS logits a thread, read once as float4 (rows 16-byte aligned).
template <int ITEMS>
__device__ __forceinline__ void chunk_regs(Sel& s, TOPK_ARGS) {
  const int r = blockIdx.y, c = blockIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    if (c == 0) write_iota(out_row, end, TOPK);
    return;
  }
  const int L = chunk_len(end, min_chunk, max_chunks);  // == ITEMS * BLOCK on this path
  const int lo = c * L;
  if (lo >= end) return;
  const int hi = min(lo + L, end);
  const float* row = logits + r * row_stride;
  const int t = threadIdx.x;
  select_prologue(s);
  RegKeys<ITEMS> keys;
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
  const bool direct = end <= L;
  const size_t base = ((size_t)r * max_chunks + c) * TOPK;
  chunk_select(
      s, keys, [&](int slot) { return lo + (((slot >> 2) * BLOCK + t) << 2) + (slot & 3); },
      out_row, cand_keys + base, cand_ids + base, direct);
}

// Chunks of CHUNK logits: rows up to 64 * CHUNK (1M) logits.
DSV_KERNEL(BLOCK) dsv_topk512_chunks(TOPK_ARGS) {
  __shared__ Sel s;
  chunk_regs<CHUNK / BLOCK>(s, logits, row_stride, width, seq_lens, causal, next_n, indices,
                            idx_stride, cand_keys, cand_ids, max_chunks, min_chunk);
}

// The general path: any alignment, chunks of chunk_len(end, min_chunk, max_chunks) logits read
// from memory at each radix pass.
DSV_KERNEL(BLOCK) dsv_topk512_chunks_stream(TOPK_ARGS) {
  __shared__ Sel s;
  const int r = blockIdx.y, c = blockIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    if (c == 0) write_iota(out_row, end, TOPK);
    return;
  }
  const int L = chunk_len(end, min_chunk, max_chunks);
  const int lo = c * L;
  if (lo >= end) return;
  select_prologue(s);
  StreamKeys keys{logits + r * row_stride, lo, min(lo + L, end)};
  const int t = threadIdx.x;
  const size_t base = ((size_t)r * max_chunks + c) * TOPK;
  chunk_select(
      s, keys, [&](int slot) { return lo + slot * BLOCK + t; }, out_row, cand_keys + base,
      cand_ids + base, end <= L);
}

// Pass 2: a row's chunk candidates (up to 64 chunks of 512) down to its 512.
DSV_KERNEL(BLOCK) dsv_topk512_merge(TOPK_ARGS) {
  __shared__ Sel s;
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
  RegKeys<MAX_MERGE / BLOCK> keys;
  keys.used = (n + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int s2 = 0; s2 < MAX_MERGE / BLOCK; ++s2) {
    const int p = s2 * BLOCK + t;
    const int ch = p / TOPK, j = p % TOPK;
    const int len = min(L, end - ch * L);  // this chunk wrote min(len, 512) candidates
    const bool ok = p < n && j < len;
    keys.k[s2] = 0u;
    if (s2 < keys.used) keys.k[s2] = ok ? ck[p] : 0u;
  }
  int32_t* out_row = indices + r * idx_stride;
  const Cut cut = select_top(s, keys, TOPK);
  emit(s, keys, cut, [&](uint32_t, int slot, uint32_t pos) { out_row[pos] = ci[slot * BLOCK + t]; });
}

// --------------------------------------------------------------- candidate top-512 (24-36)
// Grid (rows). Row r's columns are 8 (block_size) a candidate block: candidates[r, i] = b
// covers [b * bs, b * bs + bs). Entries -1, duplicates and columns at or past the row end are
// skipped. A row longer than 512 with fewer than 512 live candidate columns gets them all and
// then -1.
DSV_KERNEL(BLOCK) dsv_topk512_candidates(const float* logits, long long row_stride, int width,
                                         const int32_t* seq_lens, int causal, int next_n,
                                         int32_t* indices, long long idx_stride,
                                         const int32_t* cands, long long cand_stride, int ncand,
                                         int bs) {
  __shared__ union {
    Sel sel;
    struct {
      int32_t key[TABLE];
      int32_t slot[TABLE];
    } table;
  } u;
  __shared__ int32_t blocks[TABLE / 2];
  const int r = blockIdx.x, t = threadIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    write_iota(out_row, end, TOPK);
    return;
  }
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
  const int n = ncand * bs;
  RegKeys<CHUNK / BLOCK> keys;
  keys.used = (n + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int s2 = 0; s2 < CHUNK / BLOCK; ++s2) {
    const int i = s2 * BLOCK + t;
    const int b = i < n ? blocks[i / bs] : -1;
    const int col = b * bs + i % bs;
    const bool ok = b >= 0 && col < end;
    const float v = row[ok ? col : 0];
    keys.k[s2] = ok ? order_key(v) : 0u;
  }
  const Cut cut = select_top(u.sel, keys, TOPK);
  emit(u.sel, keys, cut, [&](uint32_t, int slot, uint32_t pos) {
    const int i = slot * BLOCK + t;
    out_row[pos] = blocks[i / bs] * bs + i % bs;
  });
  write_tail(out_row, (int)cut.total, TOPK);
}

// ------------------------------------------------------------- compact-row top-512
// Grid (rows). Entry i of row r is (logits[r, i], ids[r, i]); ids -1 mark no entry. Rows of
// at most 16384 entries, holding distinct ids. Row ends as dsv_topk512_chunks.
DSV_KERNEL(BLOCK) dsv_topk512_compact(const float* logits, long long row_stride,
                                      const int32_t* ids, long long ids_stride, int len,
                                      const int32_t* seq_lens, int causal, int next_n,
                                      int32_t* indices, long long idx_stride) {
  __shared__ Sel s;
  const int r = blockIdx.x, t = threadIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, 0x7fffffff);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    write_iota(out_row, end, TOPK);
    return;
  }
  const float* row = logits + r * row_stride;
  const int32_t* id_row = ids + r * ids_stride;
  select_prologue(s);
  RegKeys<CHUNK / BLOCK> keys;
  keys.used = (len + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int s2 = 0; s2 < CHUNK / BLOCK; ++s2) {
    const int i = s2 * BLOCK + t;
    const bool in = i < len;
    const int32_t id = id_row[in ? i : 0];
    const float v = row[in ? i : 0];
    keys.k[s2] = (in && id >= 0) ? order_key(v) : 0u;
  }
  const Cut cut = select_top(s, keys, TOPK);
  emit(s, keys, cut, [&](uint32_t, int slot, uint32_t pos) {
    out_row[pos] = id_row[slot * BLOCK + t];
  });
  write_tail(out_row, (int)cut.total, TOPK);
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
// most 32768 blocks.
DSV_KERNEL(BLOCK) dsv_select_blocks(const float* logits, long long row_stride, int width,
                                    const int32_t* seq_lens, int rep, int bs, int32_t* cands,
                                    long long cand_stride, int K) {
  __shared__ Sel s;
  const int r = blockIdx.x, t = threadIdx.x;
  const int end = max(seq_lens[r / rep], 0);
  const int col_end = min(end, width);
  const int nb = (col_end + bs - 1) / bs;
  const int newest = end > 0 ? (end - 1) / bs : -1;
  const float* row = logits + r * row_stride;
  const bool vec = bs == 8 && width >= 8 && ((reinterpret_cast<uintptr_t>(row) & 15) == 0);
  select_prologue(s);
  RegKeys<MAX_SELECT / BLOCK> keys;
  keys.used = (nb + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int s2 = 0; s2 < MAX_SELECT / BLOCK; ++s2) {
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
      if (m <= 0x007fffffu) m = 0;  // a -inf score is no candidate
    }
    keys.k[s2] = m;
  }
  int32_t* out_row = cands + r * cand_stride;
  const Cut cut = select_top(s, keys, (uint32_t)K);
  emit(s, keys, cut,
       [&](uint32_t, int slot, uint32_t pos) { out_row[pos] = slot * BLOCK + t; });
  write_tail(out_row, (int)cut.total, K);
}
