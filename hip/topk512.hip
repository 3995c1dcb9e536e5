// Top-512 selection for DeepSeek-V4.1's sparse indexer (decode), written for gfx942: the
// kernels, on the selection core of hip/topk_select.h (order keys, group-maxima floor, LDS list,
// radix cut; its comment says where a workgroup's time goes).
//
// Kernels (all launched by src/dsv41_gfx942_plugin/ops/topk.py through ops/_launcher.py):
//   dsv_topk512_chunks / _stream   pass 1 of the decode top-512: one workgroup per chunk of a row
//   dsv_topk512_merge / _final     passes 2 and 3: each row's chunk candidates down to 512
//   dsv_topk512_candidates         top-512 over the columns of a row's candidate blocks
//   dsv_topk512_compact            top-512 over a compact row of (logit, column id)
//   dsv_select_blocks / _wide      layer 20's candidate blocks (block max, top-K blocks)
// Row ends are read on the device, so a CUDA graph captured once is right at every replay.
#include <type_traits>

#include "topk_select.h"

constexpr int TABLE = 4096;             // hash slots for deduplicating <= 2048 candidate blocks
constexpr uint32_t KEY_POS_INF = 0xff800000u;

// Workgroup shapes: threads, keys a thread (ITEMS), keys a maximum of the floor pass (GROUP).
// H200-measured, graph replay, decode 6x16k / 6x128k / 32x128k / 32x1M dense (us), with this
// code before the groups below: 512 x 32 keys 12.1 / 21.5 / 33.9 / 201 (the previous engine,
// 1024 x 16: 13.4 / 26.9 / 41.1 / 237). On an earlier build (list loops unrolled, merge reading
// ids late): 512 x 32 12.2 / 25.8 / 38.6 / 205; 256 x 64 13.0 / 29.1 / 34.5 / 182 (on sm_90
// ptxas holds it to 128 registers and spills); 1024 x 16 13.1 / 29.7 / 43.6 / 225. The
// per-warp work is a long serial chain (latency and instruction-fetch stalls), so neither fewer
// nor more warps a workgroup changes much.
// CHUNK_GROUP: a chunk's 16384 keys in groups of 16 give 1024 maxima (a partial chunk of at least
// 1024 keys still gives the 512 a floor needs: each of a thread's two groups holds half of its
// first float4, below). The maxima of 16 random keys seldom straddle zero, so the floor pass's bins
// are fine and fewer keys pass the floor (a Python model of the algorithm on random rows: 770
// against 1696 with groups of 8). One same-run A/B (H200, 8 -> 16, with the 512 x 16 merge below):
// dense 6x16k / 6x128k / 32x128k / 32x1M 12.32 -> 9.62 / 21.42 -> 18.29 / 33.99 -> 28.96 / 200.5 ->
// 178.6 us, rows of random lengths (half to all of 128k, 1M) 6x128k 27.5 -> 21.9, 32x1M 162.5 ->
// 144.7; masked rows 0-8% faster. Groups of 4 were slower everywhere (dense 6x128k 30.3), of 32
// slower on dense rows (28.3). The model puts 1-2% of partial chunks of 7000-7600 random keys above
// the LDS list (the register path); full chunks, none.
// The groups are interleaved (group g of a thread: its slots g, g + 2, ...: half of each of
// its 8 float4s, 2,048 columns apart), not consecutive slots (4 float4s: columns [0, 8192) of
// the chunk in one group, [8192, 16384) in the other). With consecutive groups a run of high
// logits lands in one group of every thread (the newest 4,096 raised: all in the second), so
// the 512th maximum is about the least of that run's and most of the run passes the floor
// (modelled, a 16k chunk: 1,742 keys above it, over the superset's 1,024 slots, against 652;
// ascending rows 2,045 against 1,022; random rows 694 / 695). H100, same run, two rounds each,
// answers checked by the GPU tests (before the top-two rule of top_k for masked chunks, which
// routes 7/8-masked chunks as before): recency 6x128k 14.81-14.96 -> 12.77-12.85 us, 32x1M
// 86.88-87.54 -> 84.61-85.23; 600 at a third raised by 6, 6x128k 14.37-14.49 -> 12.73-12.91;
// ascending / descending 6x128k 15.37-15.58 -> 14.50-14.67, 32x1M 108.2-109.5 -> 93.6-94.6;
// ragged 6x128k 13.37-13.47 -> 12.92-13.01; random, tied, all -inf and one-value rows within
// 0.7%. gfx942: 84 VGPRs either way, no spill.
// MERGE: 512 threads x 16 keys against 256 x 32 (the same run, groups of 8): 6x128k dense /
// masked 21.36 -> 20.37 / 21.88 -> 20.73 us, 32x128k 33.92 -> 33.03. Again with this code
// (H200, same run, two rounds, 512 against 256 x 32 / 1024 x 8): 6x128k 12.70-13.07 against
// 13.68-13.71 / 14.21 us, 6x1M 26.5-26.6 against 27.5-27.6 / 28.5, but 32x1M 84.5-84.7 against
// 82.0-82.1 / 87.1-87.2: there the first merge's 256 workgroups share the H200's 132 SMs,
// several a SM, which gfx942's 304 CUs would take one a CU, where only a workgroup's chain
// counts, as at 6 rows. 512 stays.
// Not adopted: a floor handed from the chunks to the merge, which then skipped its floor pass
// (each chunk wrote the least key of its ceil(512 * len / end)-th key's bin from its list's
// first radix pass; at least 512 candidates are >= the least of them). H200, same-run A/B:
// 6x128k dense / masked 18.18 -> 17.34 / 18.76 -> 17.19 us, but 6x16k 9.28 -> 9.67, 32x1M
// 169.4 -> 176.9, rows of random lengths 6x128k 19.26 -> 21.70 (a short last chunk's coarse
// bins pull the least bound down), and the wide merge's own floor (about 590 candidates above
// it, modelled) beats the chunks' (about 1060).
constexpr int CHUNK = 16384;  // logits a workgroup of dsv_topk512_chunks holds
constexpr int CHUNK_THREADS = 512, CHUNK_GROUP = 16;
// MERGE_GROUP 8 once chunks hand on supersets (up to 8 x 1024 slots, about 5800 keys of random
// rows): one same-run A/B (H200), groups of 4 / 8 / 16: dense 6x128k 16.26 / 15.73 / 15.78 us,
// masked 16.90 / 16.44 / 16.58, ragged 19.79 / 19.25 / 19.38, dense 32x128k 28.10 / 27.49 /
// 27.84 (with exact 512-key chunks, groups of 8 had been slower, 18.32 -> 20.22 us at 6x128k).
// A merge's time is its chain's fixed steps, not its slots: one reading only 256 of each
// chunk's 1024 (512 x 4 keys; wrong answers, an upper bound for two-tier supersets) took
// 6x128k 14.47 -> 14.01-14.11 us, 32x1M 98.6 -> 97.6-98.5 (H200, same run, three rounds).
constexpr int MERGE_THREADS = 512, MERGE_ITEMS = 16, MERGE_GROUP = 8;
constexpr int MERGE_UNITS = 8;  // units of candidate slots (ops/topk.py's CHUNK_SLOTS, 1024) a
                                // merge workgroup holds (tests/test_topk_build.py checks)
constexpr int STREAM_THREADS = 1024;
// dsv_select_blocks: 16 slots a thread (rows of up to 16384 blocks, 128k columns of 8; _wide holds
// 32), loads of SELECT_BATCH slots (_wide: SELECT_WIDE_BATCH) issued together, radix passes of
// SELECT_DIGIT bits. H200, 6 x 128k, K 2048, graph replay, one run, hot / from DRAM (us): the
// previous kernel (32 slots, batch 2, top_k's floor and list) 25.6-25.9 / 27.3-27.7; its cut
// replaced by the one below 24.8-25.0 / 27.3-27.4 (digits of 8: 27.9 / 29.5; batch 4: 24.8 / 26.2,
// spilling 212 bytes at 32 slots); with 16 slots and batch 4, 23.8-24.0 / 25.3 (batch 2: 24.5 /
// 26.9). Not adopted (same runs): rolled loops over the keys (36 KB of sm_90 code in place of 255
// KB; 26.5 / 29.1: the instruction fetch was not the bound), coalesced loads with a lane pair a
// block (28.8 / 30.2). With block_key's cheaper scores, batch 2 (no sm_90 spill, against 48 bytes
// at batch 4; gfx942 spills neither) took 18.1-18.3 -> 17.6-17.8 us (another run, two rounds).
// _wide loads one slot at a time: with SPARSE_POP's second count loop, batch 2 spilled 376 bytes
// under sm_90's 64 registers (6 x 256k 29.17-29.28 -> 32.19-32.21 us, same run, two rounds), batch
// 1 none (29.36-29.38); gfx942 spills neither.
constexpr int SELECT_THREADS = 1024, SELECT_ITEMS = 16, SELECT_BATCH = 2, SELECT_WIDE_BATCH = 1;
constexpr int SELECT_DIGIT = 10;  // 11 would pass sm_90's 48 KB of static shared memory
// CAND_GROUP and COMPACT_GROUP: 16 keys a maximum, as CHUNK_GROUP (1024 maxima; at least 512
// once a row holds 512 entries, else every key fits the LDS list), interleaved as there: vLLM's
// own selection (its torch.topk path) lists a row's candidate blocks by score, so consecutive
// groups put the best blocks' columns in one group of every thread. H100, same run, two rounds:
// candidates in that order 10.80-10.88 -> 9.65-9.71 us, their compact row 9.63-9.70 ->
// 9.23-9.28; in random order 9.59-9.67 -> 9.64-9.71 / 8.42-8.48 -> 8.46-8.52 (+0.5%).
// Group size, H200, same-run A/B against 8: candidate top-k 18.40 -> 16.85 us, compact 12.10
// -> 10.53; 32: 18.74 and 19.30. (Nor, in another run, did two floor passes in the chunk
// kernel (within 1.5%) gain.)
// 512 threads against 256 / 1024 (H200, same run, two rounds): candidate top-k 9.84-9.89
// against 11.58-11.60 / 10.37-10.43 us, compact 8.68-8.69 against 9.09 / 9.45-9.51.
constexpr int CAND_THREADS = 512, CAND_ITEMS = 32, CAND_GROUP = 16;  // 16384 columns, 2048 blocks
constexpr int COMPACT_THREADS = 512, COMPACT_GROUP = 16;

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
// Grid (max_chunks, rows). Both chunk kernels take these arguments; the merges MERGE_ARGS.
#define TOPK_ARGS                                                                        \
  const float *logits, long long row_stride, int width, const int32_t *seq_lens,         \
      int causal, int next_n, int32_t *indices, long long idx_stride, uint32_t *cand_keys, \
      int32_t *cand_ids, int max_chunks, int min_chunk, int cap

// Pass 1 of a chunk: its top 512 go straight to the row's indices when the chunk is the whole
// row, else a superset of them, at most `cap` (the launcher's candidate slots a chunk), to the
// row's candidate scratch (key and column) for the merge, the slots left over cleared (key 0:
// no entry). col(slot) is a column relative to lo (what the list stores: uint16 in
// dsv_topk512_chunks).
// A superset (cap 1024 in every chunk launch, CHUNK_SLOTS; a merge unit of 8 chunks, 8192 slots)
// skips the chunk's exact cut: the keys above its floor, about 720 of a random 16k chunk and 820
// of a 7/8-masked one (p99 780 / 930, modelled), go to the merge as they are. H200, same-run
// A/B against exact 512-key chunks, with the floor of partial chunks (hip/topk_select.h) and
// MERGE_GROUP 8: dense / masked 6x128k 18.18 -> 15.73 / 18.70 -> 16.44 us, 32x128k 28.64 ->
// 27.49 / 28.79 -> 26.34, ragged 6x128k 19.20 -> 19.25, ragged 32x128k 29.41 -> 27.71; 6x16k
// (one chunk, no merge) 9.27 -> 9.36; 1M rows (64 chunks, exact) 0-1% faster.
template <int BLOCK, class Id, class Keys, class Col>
__device__ __forceinline__ void chunk_select(Sel<BLOCK, Id>& s, Keys& keys, Col col, int lo,
                                             int32_t* out_row, uint32_t* ck, int32_t* ci,
                                             bool direct, int cap) {
  int32_t* ids = direct ? out_row : ci;  // one pointer: branches on `direct` around two stores
                                         // are merged into a load from the closure (scratch)
  const uint32_t total = top_k(
      s, keys, TOPK, col,
      [=](uint32_t key, int32_t id, uint32_t pos) {
        if (!direct) ck[pos] = key;
        ids[pos] = lo + id;
      },
      direct ? 0u : (uint32_t)cap);
  if (direct) {
    write_tail<BLOCK>(out_row, (int)total, TOPK);
  } else {
    for (int j = (int)total + (int)threadIdx.x; j < cap; j += BLOCK) ck[j] = 0u;
  }
}

// The register path: CHUNK / CHUNK_THREADS logits a thread, read once as float4 (rows 16-byte
// aligned); chunks of CHUNK logits, rows up to 64 * CHUNK (1M) logits.
DSV_KERNEL(CHUNK_THREADS, 2) dsv_topk512_chunks(TOPK_ARGS) {
  constexpr int BLOCK = CHUNK_THREADS, ITEMS = CHUNK / BLOCK;
  static_assert(CHUNK <= 65536, "a chunk's local columns are uint16_t list ids");
  __shared__ Sel<BLOCK, uint16_t> s;
  const int r = blockIdx.y, c = blockIdx.x, t = threadIdx.x;
  // Chunks of CHUNK logits: the launcher passes min_chunk = CHUNK and max_chunks = the width's
  // chunks, so chunk_len() is CHUNK whatever the row's end. The loads therefore go out before
  // that end is read (bounded by the width), and the end's read waits on memory beside them,
  // not ahead of them; a partial float4 (the width's last) is re-read by elements. With the
  // merge's early reads below (H200, same-run A/B against reading the end first): dense
  // 6x16k 9.63 -> 9.28 us, 6x128k 18.36 -> 18.22, 32x1M 181.1 -> 169.4, masked 32x1M 190.5 ->
  // 178.3, ragged 32x1M 146.5 -> 141.1; gfx942 VGPRs 111 -> 99.
  const int lo = c * CHUNK, whi = min(lo + CHUNK, width);
  const float* row = logits + r * row_stride;
  float4 v[ITEMS / 4];
#pragma unroll
  for (int q = 0; q < ITEMS / 4; ++q) {
    const int c0 = lo + ((q * BLOCK + t) << 2);
    v[q] = *reinterpret_cast<const float4*>(row + (c0 + 3 < whi ? c0 : 0));
  }
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    if (c == 0) write_iota<BLOCK>(out_row, end, TOPK);
    return;
  }
  if (lo >= end) return;
  const int hi = min(lo + CHUNK, end);
  select_prologue(s);
  RegKeys<ITEMS, CHUNK_GROUP, true> keys;
  keys.used = ITEMS;
  // A whole chunk (every chunk of a row but the one holding its end) takes its keys without a
  // guard a column: H200, same run, two rounds, dense 6x16k 8.16-8.17 -> 8.01 us, 6x128k
  // 13.41-13.42 -> 13.22-13.24, 32x1M 88.5-88.6 -> 84.8-84.9, masked 94.8-95.0 -> 91.5-91.7.
  auto fill = [&](auto whole_chunk) {
    constexpr bool whole = decltype(whole_chunk)::value;
#pragma unroll
    for (int q = 0; q < ITEMS / 4; ++q) {
      const int c0 = lo + ((q * BLOCK + t) << 2);
      if (!whole && c0 + 3 >= whi) {
        v[q].x = c0 < hi ? row[c0] : 0.f;
        v[q].y = c0 + 1 < hi ? row[c0 + 1] : 0.f;
        v[q].z = c0 + 2 < hi ? row[c0 + 2] : 0.f;
      }
      keys.k[4 * q + 0] = whole || c0 < hi ? order_key(v[q].x) : 0u;
      keys.k[4 * q + 1] = whole || c0 + 1 < hi ? order_key(v[q].y) : 0u;
      keys.k[4 * q + 2] = whole || c0 + 2 < hi ? order_key(v[q].z) : 0u;
      keys.k[4 * q + 3] = whole || c0 + 3 < hi ? order_key(v[q].w) : 0u;
    }
  };
  if (hi - lo == CHUNK)
    fill(std::true_type{});
  else
    fill(std::false_type{});
  const size_t base = ((size_t)r * max_chunks + c) * cap;
  chunk_select(
      s, keys, [=](int slot) { return (((slot >> 2) * BLOCK + t) << 2) + (slot & 3); }, lo,
      out_row, cand_keys + base, cand_ids + base, end <= CHUNK, cap);
}

// The general path: any alignment, chunks of chunk_len(end, min_chunk, max_chunks) logits read
// from memory at each radix pass.
DSV_KERNEL(STREAM_THREADS, 1) dsv_topk512_chunks_stream(TOPK_ARGS) {
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
  const size_t base = ((size_t)r * max_chunks + c) * cap;
  chunk_select(
      s, keys, [=](int slot) { return slot * BLOCK + t; }, lo, out_row, cand_keys + base,
      cand_ids + base, end <= L, cap);
}

// Passes 2 and 3: a row's candidates, in units of `span` chunks (1: the chunks' own slots; 8:
// a first merge's groups), `cap` slots a unit (cleared where a unit wrote no entry), merged
// MERGE_UNITS units a workgroup: grid (groups, rows). A group holding the whole row writes its
// indices; else it hands on a superset of its top 512 (as a chunk does) to out_keys / out_ids
// at (row, group), for a second launch with span MERGE_UNITS: 64 chunks (1M logits) take two.
// A group's keys and column ids are read before the row's end is known, so that the end's
// read waits on memory beside them (slots of units past the end are cleared after), and a
// taken key's id is not read from memory in turn at the end.
// FINAL: a launch whose groups each hold a whole row (the launcher's last merge), compiled
// without the superset's code. H200, against one kernel for both (each in a same-run A/B with
// the single-level merge of exact 512-key chunks above 8 chunks a row): 6x128k dense / masked /
// ragged +0.28 / +0.45 / +0.29 us over that merge with one kernel, +0.10 / +0.24 / +0.17 with
// this one.
// Two merge launches for rows of more than 8 chunks (every chunk handing on a superset),
// against one merge of 512 threads x 64 keys over each chunk's exact 512 (H200, same-run A/B):
// dense 6x1M 47.69 -> 38.25 us, 32x1M 169.17 -> 147.08, masked 32x1M 178.35 -> 156.74, ragged
// 32x1M 141.01 -> 126.18 (the chunk launch alone at 32x1M: 142.4 us with exact 512-key chunks,
// 117.9 with supersets).
#define MERGE_ARGS TOPK_ARGS, uint32_t *out_keys, int32_t *out_ids, int span
template <bool FINAL>
__device__ __forceinline__ void merge(Sel<MERGE_THREADS>& s, MERGE_ARGS) {
  constexpr int BLOCK = MERGE_THREADS, ITEMS = MERGE_ITEMS;
  const int g = blockIdx.x, r = blockIdx.y, t = threadIdx.x;
  const int max_units = (max_chunks + span - 1) / span;
  const int groups = (max_units + MERGE_UNITS - 1) / MERGE_UNITS;
  const int first = g * MERGE_UNITS;
  const size_t base = ((size_t)r * max_units + first) * cap;
  const uint32_t* ck = cand_keys + base;
  const int32_t* ci = cand_ids + base;
  RegKeys<ITEMS, MERGE_GROUP> keys;
  int32_t ids[ITEMS];
  const int nmax = min(MERGE_UNITS, max_units - first) * cap;
#pragma unroll
  for (int s2 = 0; s2 < ITEMS; ++s2) {
    const int p = s2 * BLOCK + t;
    keys.k[s2] = p < nmax ? ck[p] : 0u;
    ids[s2] = p < nmax ? ci[p] : 0;
  }
  const int end = row_end(seq_lens, causal, next_n, r, width);
  const int L = chunk_len(end, min_chunk, max_chunks) * span;  // logits a unit
  if (end <= TOPK || end <= L) return;  // an earlier pass wrote the row
  const int units = (end + L - 1) / L;  // <= max_units
  if (first >= units) return;
  const int n = min(units - first, MERGE_UNITS) * cap;  // this group's live slots
  select_prologue(s);
  keys.used = (n + BLOCK - 1) / BLOCK;
#pragma unroll
  for (int s2 = 0; s2 < ITEMS; ++s2)
    if (s2 * BLOCK + t >= n) keys.k[s2] = 0u;
  const size_t out = ((size_t)r * groups + g) * cap;
  chunk_select(
      s, keys, [&ids](int slot) { return ids[slot]; }, 0, indices + r * idx_stride,
      out_keys + out, out_ids + out, FINAL || units <= MERGE_UNITS, cap);
}

#define MERGE_PASS                                                                          \
  s, logits, row_stride, width, seq_lens, causal, next_n, indices, idx_stride, cand_keys,    \
      cand_ids, max_chunks, min_chunk, cap, out_keys, out_ids, span
DSV_KERNEL(MERGE_THREADS, 1) dsv_topk512_merge(MERGE_ARGS) {
  __shared__ Sel<MERGE_THREADS> s;
  merge<false>(MERGE_PASS);
}
DSV_KERNEL(MERGE_THREADS, 1) dsv_topk512_merge_final(MERGE_ARGS) {
  __shared__ Sel<MERGE_THREADS> s;
  merge<true>(MERGE_PASS);
}

// --------------------------------------------------------------- candidate top-512 (24-36)
// Grid (rows). Row r's columns are 8 (block_size) a candidate block: candidates[r, i] = b
// covers [b * bs, b * bs + bs). Entries -1, duplicates and columns at or past the row end are
// skipped. A row longer than 512 with fewer than 512 live candidate columns gets them all and
// then -1.
// Deduplication: each entry sets its block's bit in an LDS bitmap (one atomicOr); when no bit
// was set twice, the blocks are distinct (vLLM's candidates are: a top-K of block ids) and
// nothing more is done. Else (or for rows of more than BITMAP_BLOCKS blocks) a hash table
// keeps each block id's lowest slot, so the output's order never depends on the order of the
// atomics. H200, same-run A/B against the hash table alone (clock() stamps: 11068 of a
// workgroup's 29858 cycles), 6 x 2048 x 8 of 128k: 16.54 -> 11.36 us; 1M rows 17.31 -> 11.31;
// 48 rows 17.67 -> 12.03; candidates with duplicates 13.68 -> 15.35 (both passes).
// Lane pairs load halves of a block: 32 lanes' float4 loads then cover 16 whole 32-byte blocks,
// not 32 half blocks (a gfx942 wave's 64 lanes: 32, not 64; the gather above was 4775 cycles
// against 3903 for a decode chunk's contiguous loads).
constexpr int BITMAP_BLOCKS = 2 * TABLE * 32;  // the bitmap shares the hash table's LDS
DSV_KERNEL(CAND_THREADS, 1) dsv_topk512_candidates(const float* logits, long long row_stride,
                                                   int width, const int32_t* seq_lens,
                                                   int causal, int next_n, int32_t* indices,
                                                   long long idx_stride, const int32_t* cands,
                                                   long long cand_stride, int ncand, int bs) {
  constexpr int BLOCK = CAND_THREADS, ITEMS = CAND_ITEMS;
  constexpr int PAIRS = BLOCK / 2, ENTRIES = ITEMS / 4;  // 4 columns of each entry a thread
  __shared__ union {
    Sel<BLOCK> sel;
    struct {
      int32_t key[TABLE];
      int32_t slot[TABLE];
    } table;
    uint32_t bits[BITMAP_BLOCKS / 32];
  } u;
  __shared__ int32_t blocks[TABLE / 2];
  __shared__ int32_t bs_relay, dups;
  const int r = blockIdx.x, t = threadIdx.x, pair = t >> 1, half = t & 1;
  // The thread's candidate entries (q * PAIRS + pair) are read before the row's end, as in
  // dsv_topk512_chunks (H200, same-run A/B: 15.95 -> 15.81 us). Reading their columns then too,
  // before the deduplication, was slower (15.94 -> 17.65 us).
  static_assert(ENTRIES * PAIRS >= TABLE / 2, "a thread reads all its candidate entries");
  const int32_t* crow = cands + r * cand_stride;
  int32_t entry[ENTRIES];
#pragma unroll
  for (int q = 0; q < ENTRIES; ++q)
    entry[q] = q * PAIRS + pair < ncand ? crow[q * PAIRS + pair] : -1;
  const int end = row_end(seq_lens, causal, next_n, r, width);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    write_iota<BLOCK>(out_row, end, TOPK);
    return;
  }
  const long long nblocks = ((long long)end + bs - 1) / bs;  // block ids that can be live
  const bool bitmap = nblocks <= BITMAP_BLOCKS;
  if (t == 0) {
    bs_relay = bs;
    dups = !bitmap;
  }
  if (bitmap)
    for (int i = t; i < (int)((nblocks + 31) / 32); i += BLOCK) u.bits[i] = 0;
  __syncthreads();
  bool seen = false;
#pragma unroll
  for (int q = 0; q < ENTRIES; ++q) {
    const int32_t b = entry[q] >= 0 && (long long)entry[q] * bs < end ? entry[q] : -1;
    entry[q] = b;
    if (half == 0 && q * PAIRS + pair < ncand) {
      blocks[q * PAIRS + pair] = b;
      if (bitmap && b >= 0) {
        const uint32_t bit = 1u << (b & 31);
        seen |= (atomicOr(&u.bits[b >> 5], bit) & bit) != 0;
      }
    }
  }
  if (seen) dups = 1;
  __syncthreads();
  if (dups) {
    for (int i = t; i < TABLE; i += BLOCK) {
      u.table.key[i] = -1;
      u.table.slot[i] = 0x7fffffff;
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
#pragma unroll
    for (int q = 0; q < ENTRIES; ++q)
      entry[q] = q * PAIRS + pair < ncand ? blocks[q * PAIRS + pair] : -1;
  }
  select_prologue(u.sel);
  const float* row = logits + r * row_stride;
  // Blocks of 8 whole columns in 16-byte aligned rows (vLLM's layout) are read as float4
  // halves: slot s of a thread is column 4 * (thread & 1) + s % 4 of entry (s / 4) * PAIRS +
  // thread / 2, and a group of the floor pass is half of each of its eight half blocks
  // (interleaved, CAND_GROUP). Other block sizes read column i = s * BLOCK + thread of the
  // row's candidate columns alone.
  const bool vec = bs == 8 && width % 8 == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
  RegKeys<ITEMS, CAND_GROUP, true> keys;
  keys.used = ITEMS;  // a uniform bound here costs guards, which spill SGPRs on gfx942
  if (vec) {
#pragma unroll
    for (int q = 0; q < ENTRIES; ++q) {
      const int b = entry[q], c0 = b * 8 + half * 4;
      const float4 x = *reinterpret_cast<const float4*>(row + (b >= 0 ? c0 : 0));
      keys.k[4 * q + 0] = b >= 0 && c0 < end ? order_key(x.x) : 0u;
      keys.k[4 * q + 1] = b >= 0 && c0 + 1 < end ? order_key(x.y) : 0u;
      keys.k[4 * q + 2] = b >= 0 && c0 + 2 < end ? order_key(x.z) : 0u;
      keys.k[4 * q + 3] = b >= 0 && c0 + 3 < end ? order_key(x.w) : 0u;
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
        if (vec) return blocks[(slot >> 2) * PAIRS + pair] * 8 + half * 4 + (slot & 3);
        const int i = slot * BLOCK + t;
        return blocks[i / bs2] * bs2 + i % bs2;
      },
      [=](uint32_t, int32_t id, uint32_t pos) { out_row[pos] = id; });
  write_tail<BLOCK>(out_row, (int)total, TOPK);
}

// ------------------------------------------------------------- compact-row top-512
// Grid (rows). Entry i of row r is (logits[r, i], ids[r, i]); ids -1 mark no entry. Rows of
// at most 16384 entries, holding distinct ids. Row ends as dsv_topk512_chunks.
DSV_KERNEL(COMPACT_THREADS, 1) dsv_topk512_compact(const float* logits, long long row_stride,
                                                   const int32_t* ids, long long ids_stride,
                                                   int len, const int32_t* seq_lens, int causal,
                                                   int next_n, int32_t* indices,
                                                   long long idx_stride) {
  constexpr int BLOCK = COMPACT_THREADS, ITEMS = CHUNK / BLOCK;
  __shared__ Sel<BLOCK> s;
  const int r = blockIdx.x, t = threadIdx.x;
  const float* row = logits + r * row_stride;
  const int32_t* id_row = ids + r * ids_stride;
  // The entries are read before the row's end, as in dsv_topk512_chunks (H200, same-run
  // A/B: 10.77 -> 10.29 us).
  int32_t id[ITEMS];  // kept, as in dsv_topk512_merge
  float v[ITEMS];
#pragma unroll
  for (int s2 = 0; s2 < ITEMS; ++s2) {
    const int i = s2 * BLOCK + t;
    id[s2] = id_row[i < len ? i : 0];
    v[s2] = row[i < len ? i : 0];
  }
  const int end = row_end(seq_lens, causal, next_n, r, 0x7fffffff);
  int32_t* out_row = indices + r * idx_stride;
  if (end <= TOPK) {
    write_iota<BLOCK>(out_row, end, TOPK);
    return;
  }
  select_prologue(s);
  RegKeys<ITEMS, COMPACT_GROUP, true> keys;
  keys.used = ITEMS;  // as in dsv_topk512_candidates
#pragma unroll
  for (int s2 = 0; s2 < ITEMS; ++s2) {
    const bool in = s2 * BLOCK + t < len;
    keys.k[s2] = (in && id[s2] >= 0) ? order_key(v[s2]) : 0u;
  }
  const uint32_t total = top_k(
      s, keys, TOPK, [&id](int slot) { return id[slot]; },
      [=](uint32_t, int32_t id, uint32_t pos) { out_row[pos] = id; });
  write_tail<BLOCK>(out_row, (int)total, TOPK);
}

// ------------------------------------------------------- candidate blocks (layer 20)
// The key of a block of 8 logits: the order key of their float maximum, or NaN's when one is
// NaN (fmaxf drops NaN; the flag is one unordered compare a pair): the greatest of their 8
// order keys (up to a zero's sign, which torch.topk, vLLM's selection, ignores) in half the
// instructions. The selection is bound by issuing
// them: H200, same run, two rounds, 6 x 128k, K 2048, against the 8 order keys' maximum,
// random / tied / specials / masked rows 23.2-23.4 / 19.7-19.9 / 22.1 / 22.9-23.0 -> 19.0-19.2 /
// 15.7 / 17.9 / 18.8 us; the loads and scores alone (scratch kernels) 10.0-10.2 -> 6.0-6.2,
// a float maximum with no NaN flag 5.7 (nvcc PTX for 16 blocks: 1465 -> 688 instructions;
// gfx942 select kernel 8600 -> 7856).
__device__ __forceinline__ uint32_t block_key(float4 x, float4 y) {
  const bool nan = (x.x != x.x) | (x.y != x.y) | (x.z != x.z) | (x.w != x.w) | (y.x != y.x) |
                   (y.y != y.y) | (y.z != y.z) | (y.w != y.w);
  const float m = fmaxf(fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)),
                        fmaxf(fmaxf(y.x, y.y), fmaxf(y.z, y.w)));
  return nan ? 0xffffffffu : order_key(m);
}

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
// most 16384 blocks (dsv_select_blocks) or 32768 (_wide). Scoring row slices on many
// workgroups (1024 blocks each) into scratch and selecting in a second launch: H200, 6 x 128k,
// K 2048, 20.7 us under graph replay against 26.1 for the kernel then, but 32.9 against 27.3
// eager (one launch more of host time), and the issue asks one launch; on ROCm vLLM launches
// the indexer eagerly by default (an eager break of its breakable graph). Not adopted.
// Nor in one launch with the row's last scoring workgroup cutting (H100, 6 x 128k: 15.1 -> 12.3
// us): it needs a device-scope fence, a write-back and invalidate of gfx942's L2 (about 16 us;
// benchmarks/topk_sweeps.md, "Measured and not adopted").
// Where its time goes (H200, clock64 stamps of thread 0 after each barrier, 6 x 128k random
// rows, 30.3k cycles in all, before SPARSE_POP): thread 0's loads and scores 10.7k cycles, the
// reduction (the other waves' loads) 3.4k, the first radix pass's count 5.3k and its scan 1.0k,
// the second's 3.4k and 1.0k, the emit's count and scan 2.1k, its LDS writes 2.1k, the
// coalesced output 0.8k. (An earlier cut with 32 slots a thread: 50k cycles, 22.4k of them in
// the loads, before block_key.) Not adopted: the first pass counted as the scores arrive, over
// fixed bins of the keys' top 12 bits, with no reduction (H200, same run: random rows 16.3-16.5
// -> 17.0-17.1 us, tied 14.5-14.6 -> 18.7; masked 15.6-15.8 -> 14.2): the loads are bound by
// issuing, so the count added to them what it saved later; and 512 threads of 32 scores
// (16.3-16.5 -> 20.3 us).
using SelectSel = Sel<SELECT_THREADS, int32_t, SELECT_DIGIT>;

// The kernels' body, for rows of at most ITEMS * SELECT_THREADS blocks. (LDS is declared in
// the kernels: a static in this inline template would be one object shared by every code
// object that defines it, as g++ emits it for the CPU emulation's wave-64 and wave-32 builds.)
template <int ITEMS, int BATCH>
__device__ __forceinline__ void select_blocks(SelectSel& s, const float* logits,
                                              long long row_stride, int width,
                                              const int32_t* seq_lens, int rep, int bs,
                                              int32_t* cands, long long cand_stride, int K) {
  constexpr int BLOCK = SELECT_THREADS;
  const int r = blockIdx.x, t = threadIdx.x;
  const int end = max(seq_lens[r / rep], 0);
  const int col_end = min(end, width);
  const int nb = (col_end + bs - 1) / bs;
  const int newest = end > 0 ? (end - 1) / bs : -1;
  const float* row = logits + r * row_stride;
  const bool vec = bs == 8 && width >= 8 && ((reinterpret_cast<uintptr_t>(row) & 15) == 0);
  select_prologue(s);
  RegKeys<ITEMS, ITEMS> keys;  // (one group: the cut takes no floor pass)
  keys.used = (nb + BLOCK - 1) / BLOCK;
  // BATCH slots' loads go out together (in-range addresses, unguarded), then are used: a
  // guard around each slot's loads made them one memory round trip each, in turn (16 for
  // 131072 columns).
#pragma unroll
  for (int q = 0; q < ITEMS; q += BATCH) {
    uint32_t m[BATCH];
#pragma unroll
    for (int j = 0; j < BATCH; ++j) m[j] = 0;
    if (q < keys.used) {
      if (vec) {
        float4 x[BATCH], y[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
          const int c0 = ((q + j) * BLOCK + t) * 8;
          const float4* p = reinterpret_cast<const float4*>(row + (c0 + 8 <= col_end ? c0 : 0));
          x[j] = p[0];
          y[j] = p[1];
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
          const int b = (q + j) * BLOCK + t, c0 = b * 8;
          if (c0 + 8 <= col_end)
            m[j] = block_key(x[j], y[j]);
          else if (b < nb)
            m[j] = block_score(row, c0, col_end);
        }
      } else {
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
          const int b = (q + j) * BLOCK + t;
          if (b < nb) m[j] = block_score(row, b * bs, min(b * bs + bs, col_end));  // no overflow
        }
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const int b = (q + j) * BLOCK + t;
        if (b == newest && b < nb) m[j] = KEY_POS_INF;  // pinned, as vLLM does, even over NaN
        if (m[j] <= KEY_NEG_INF) m[j] = 0;              // a -inf score is no candidate
      }
    }
#pragma unroll
    for (int j = 0; j < BATCH; ++j) keys.k[q + j] = m[j];
  }
  // The cut: a radix select over the scores themselves, no floor or list. The keys at or above
  // +inf (the pinned newest block, NaN and +inf scores) rank above every other and are counted
  // apart, so the passes' bins span only the finite scores' range (a range up to the pinned
  // +inf key would leave the first pass's bins too coarse: most scores in one).
  int ph = 0, pc = 0;
  uint32_t nvalid = 0, nspec = 0, thi = 0, tlo = 0xffffffffu;
  keys.each([&](uint32_t key, int) {
    nvalid += key != 0;
    nspec += key >= KEY_POS_INF;
    thi = key < KEY_POS_INF ? max(thi, key) : thi;
    tlo = key != 0 ? min(tlo, key) : tlo;
  });
  block_reduce(s, ph, nvalid, nspec, thi, tlo);
  Cut cut{0u, 0u, 0u, nvalid};  // at most K valid keys: every one
  if (nvalid > (uint32_t)K && nspec >= (uint32_t)K) {  // the cut among those at or above +inf
    cut = radix_cut(s, ph, keys, (uint32_t)K, KEY_POS_INF, 0xffffffffu, pc, 32);
  } else if (nvalid > (uint32_t)K) {
    // The cut among the finite scores, below the nspec taken (above hi: every key > gt takes
    // them).
    cut = span_cut(s, ph, keys, (uint32_t)K - nspec, tlo, thi, pc, 32);
    cut.total = (uint32_t)K;
  }
  int32_t* out_row = cands + r * cand_stride;
  // The taken ids go to LDS, then out in order (coalesced): written from the registers, a few
  // lanes a store, they took 0.3 us more (H200, same run, 6 x 128k: 18.4-18.6 -> 18.3 us).
  int32_t* ids = s.id;  // K <= LIST (ops/topk.py's MAX_SELECT_K)
  const uint32_t total = emit(
      s, ph, keys, cut, [=](int slot) { return slot * BLOCK + t; },
      [=](uint32_t, int32_t id, uint32_t pos) { ids[pos] = id; });
  __syncthreads();
  for (int i = t; i < (int)total; i += BLOCK) out_row[i] = ids[i];
  write_tail<BLOCK>(out_row, (int)total, K);
}

#define SELECT_ARGS                                                                   \
  const float *logits, long long row_stride, int width, const int32_t *seq_lens, int rep, \
      int bs, int32_t *cands, long long cand_stride, int K

DSV_KERNEL(SELECT_THREADS, 1) dsv_select_blocks(SELECT_ARGS) {
  __shared__ SelectSel s;
  select_blocks<SELECT_ITEMS, SELECT_BATCH>(s, logits, row_stride, width, seq_lens, rep, bs,
                                            cands, cand_stride, K);
}

DSV_KERNEL(SELECT_THREADS, 1) dsv_select_blocks_wide(SELECT_ARGS) {
  __shared__ SelectSel s;
  select_blocks<2 * SELECT_ITEMS, SELECT_WIDE_BATCH>(s, logits, row_stride, width, seq_lens, rep,
                                                      bs, cands, cand_stride, K);
}
