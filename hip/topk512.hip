// Top-512 selection for DeepSeek-V4.1's sparse indexer (decode), written for gfx942.
//
// Every kernel ranks fp32 logits by an order-preserving uint32 key (order_key): NaN above +inf,
// as torch.topk ranks them, and key 0 for "no entry" (past a row's end, a -1 candidate). A
// workgroup of BLOCK threads finds the key of its k-th largest entry with a radix select over
// the key's bits (12, 10, 10) and then writes the entries above it plus just enough entries
// equal to it (select_top / emit). Histograms are counted per wave: the lanes that share the
// wave's first one or two digits add their count with one LDS atomic, so a row of equal values
// (-inf, masked logits) costs no more than a row of distinct ones.
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
constexpr int CHUNK = BLOCK * 16;       // logits a workgroup holds in registers (16 each)
constexpr int MAX_MERGE = BLOCK * 32;   // chunk candidates one row can merge (64 chunks of 512)
constexpr int HIST = 4096;              // bins of the first radix pass (12 bits)
constexpr int TABLE = 4096;             // hash slots for deduplicating <= 2048 candidate blocks
constexpr uint32_t KEY_POS_INF = 0xff800000u;

__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (f != f) return 0xffffffffu;  // every NaN ranks above +inf
  if (u == 0x80000000u) u = 0u;    // -0 ranks as +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // -inf -> 0x007fffff, never 0
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
  uint32_t hist[HIST];
  uint32_t wsum[NWAVES];
  uint32_t bin, above, cnt, found, total;
  uint32_t ctr_gt, ctr_eq;
};

// The cut a select found: take every key > gt, and the first need_eq keys == eq; `total`
// entries in all (k, or every valid entry when a row holds fewer).
struct Cut {
  uint32_t gt, eq, need_eq, total;
};

__device__ uint32_t block_excl_scan(uint32_t v, uint32_t* wsum, uint32_t& total) {
  const int lane = dsv_lane(), w = dsv_wave();
  uint32_t x = v;
#pragma unroll
  for (int d = 1; d < DSV_WAVE; d <<= 1) {
    uint32_t y = dsv_shfl_up(x, d);
    if (lane >= d) x += y;
  }
  if (lane == DSV_WAVE - 1) wsum[w] = x;
  __syncthreads();
  if (w == 0) {
    uint32_t s = lane < NWAVES ? wsum[lane] : 0u;
#pragma unroll
    for (int d = 1; d < DSV_WAVE; d <<= 1) {
      uint32_t y = dsv_shfl_up(s, d);
      if (lane >= d) s += y;
    }
    if (lane < NWAVES) wsum[lane] = s;
  }
  __syncthreads();
  total = wsum[NWAVES - 1];
  return (w > 0 ? wsum[w - 1] : 0u) + x - v;
}

// Finds the bin, counting from the highest, where the running count reaches k: s.bin, the
// count above it (s.above) and in it (s.cnt). s.found is 0 when all bins hold fewer than k.
__device__ void find_bin(Sel& s, int nbins, uint32_t k) {
  const int per = nbins / BLOCK;
  const int hi = nbins - 1 - (int)threadIdx.x * per;
  uint32_t sum = 0;
  for (int i = 0; i < per; ++i) sum += s.hist[hi - i];
  uint32_t total;
  const uint32_t before = block_excl_scan(sum, s.wsum, total);
  if (before < k && before + sum >= k) {
    uint32_t c = before;
    for (int i = 0; i < per; ++i) {
      const uint32_t h = s.hist[hi - i];
      if (c + h >= k) {
        s.bin = (uint32_t)(hi - i);
        s.above = c;
        s.cnt = h;
        break;
      }
      c += h;
    }
  }
  if (threadIdx.x == 0) {
    s.found = total >= k;
    s.total = total;
  }
  __syncthreads();
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

// A slot in the ctr-counted output for each lane with p set, one atomic a wave.
__device__ __forceinline__ uint32_t wave_append(bool p, uint32_t* ctr) {
  const lanemask_t m = dsv_ballot(p);
  if (m == 0) return 0;
  const int lead = dsv_ffs(m) - 1;
  uint32_t base = 0;
  if (dsv_lane() == lead) base = atomicAdd(ctr, (uint32_t)dsv_popc(m));
  base = dsv_shfl(base, lead);
  return base + (uint32_t)dsv_popc(m & dsv_lanes_below());
}

// Keys held in registers: N a thread, `used` of them (uniform across the workgroup).
template <int N>
struct RegKeys {
  uint32_t k[N];
  int used;
  template <class F>
  __device__ __forceinline__ void each(F f) {
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s < used) f(k[s], s);
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

// The cut of the k largest valid keys (radix select, 12 + 10 + 10 bits, stops early when a
// whole bin is taken).
template <class Keys>
__device__ Cut select_top(Sel& s, Keys& keys, uint32_t k) {
  uint32_t prefix = 0, krem = k;
#pragma unroll 1
  for (int p = 0; p < 3; ++p) {
    const int bits = p == 0 ? 12 : 10;
    const int shift = p == 0 ? 20 : (p == 1 ? 10 : 0);
    const int nb = 1 << bits;
    for (int i = threadIdx.x; i < nb; i += BLOCK) s.hist[i] = 0;
    __syncthreads();
    keys.each([&](uint32_t key, int) {
      const bool active = key != 0 && (p == 0 || (key >> (shift + bits)) == prefix);
      count_digit(s.hist, active, (key >> shift) & (uint32_t)(nb - 1));
    });
    __syncthreads();
    find_bin(s, nb, krem);
    if (!s.found) return Cut{0u, 0u, 0u, s.total};  // fewer than k: take every valid key
    prefix = (prefix << bits) | s.bin;
    krem -= s.above;
    if (s.cnt == krem) {  // the whole bin is taken: every key >= its lowest key
      const uint32_t lo = prefix << shift;
      return Cut{lo == 0 ? 0u : lo - 1, 0u, 0u, k};
    }
  }
  return Cut{prefix, prefix, krem, k};
}

// Calls out(key, slot, position) for each taken key; positions are 0..cut.total-1.
template <class Keys, class Out>
__device__ void emit(Sel& s, Keys& keys, const Cut cut, Out out) {
  if (threadIdx.x == 0) {
    s.ctr_gt = 0;
    s.ctr_eq = 0;
  }
  __syncthreads();
  const uint32_t eq_base = cut.total - cut.need_eq;
  keys.each([&](uint32_t key, int slot) {
    const bool gt = key > cut.gt;
    const bool eq = cut.need_eq != 0 && key == cut.eq;
    const uint32_t pg = wave_append(gt, &s.ctr_gt);
    const uint32_t pe = wave_append(eq, &s.ctr_eq);
    if (gt)
      out(key, slot, pg);
    else if (eq && pe < cut.need_eq)
      out(key, slot, eq_base + pe);
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
__device__ void chunk_select(Sel& s, Keys& keys, Col col, int32_t* out_row, uint32_t* ck,
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

// The register path: 16 logits a thread, read once as 4 float4 (rows 16-byte aligned).
DSV_KERNEL(BLOCK) dsv_topk512_chunks(TOPK_ARGS) {
  __shared__ Sel s;
  const int r = blockIdx.y, c = blockIdx.x;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    if (c == 0) write_iota(out_row, end, TOPK);
    return;
  }
  const int L = chunk_len(end, min_chunk, max_chunks);  // == CHUNK on this path
  const int lo = c * L;
  if (lo >= end) return;
  const int hi = min(lo + L, end);
  const float* row = logits + r * row_stride;
  const int t = threadIdx.x;
  RegKeys<16> keys;
  keys.used = 16;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int c0 = lo + ((q * BLOCK + t) << 2);
    const bool full = c0 + 3 < hi;
    const float4 v = *reinterpret_cast<const float4*>(row + (full ? c0 : 0));
    keys.k[4 * q + 0] = full ? order_key(v.x) : (c0 < hi ? order_key(row[c0]) : 0u);
    keys.k[4 * q + 1] = full ? order_key(v.y) : (c0 + 1 < hi ? order_key(row[c0 + 1]) : 0u);
    keys.k[4 * q + 2] = full ? order_key(v.z) : (c0 + 2 < hi ? order_key(row[c0 + 2]) : 0u);
    keys.k[4 * q + 3] = full ? order_key(v.w) : 0u;
  }
  const bool direct = end <= L;
  const size_t base = ((size_t)r * max_chunks + c) * TOPK;
  chunk_select(
      s, keys, [&](int slot) { return lo + (((slot >> 2) * BLOCK + t) << 2) + (slot & 3); },
      out_row, cand_keys + base, cand_ids + base, direct);
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
  RegKeys<MAX_MERGE / BLOCK> keys;
  keys.used = (n + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int s2 = 0; s2 < MAX_MERGE / BLOCK; ++s2) {
    const int p = s2 * BLOCK + t;
    const int ch = p / TOPK, j = p % TOPK;
    const int len = min(L, end - ch * L);  // this chunk wrote min(len, 512) candidates
    const bool ok = p < n && j < len;
    const uint32_t k = ck[ok ? p : 0];
    keys.k[s2] = ok ? k : 0u;
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
  RegKeys<32> keys;
  keys.used = (nb + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int s2 = 0; s2 < 32; ++s2) {
    const int b = s2 * BLOCK + t;
    uint32_t m = 0;
    if (s2 < keys.used) {
      const int c0 = b * bs;
      if (vec) {
        const bool full = c0 + 8 <= col_end;
        const float4* p = reinterpret_cast<const float4*>(row + (full ? c0 : 0));
        const float4 x = p[0], y = p[1];
        if (full) {
          m = max(max(max(order_key(x.x), order_key(x.y)), max(order_key(x.z), order_key(x.w))),
                  max(max(order_key(y.x), order_key(y.y)), max(order_key(y.z), order_key(y.w))));
        } else {
          for (int c = c0; c < col_end; ++c) m = max(m, order_key(row[c]));
        }
      } else {
        const int c1 = min(c0 + bs, col_end);
        for (int c = c0; c < c1; ++c) m = max(m, order_key(row[c]));
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
