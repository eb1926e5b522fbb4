#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace vamp::kernels::cuda {
namespace {

using internal::Aligned16;
using internal::CeilDiv;

constexpr int kAttentionWarps = 4;
constexpr int kDimsPerLane = kMaxAttentionHeadDim / 32;
// Work items per multiprocessor of the persistent attention grid.
constexpr int kAttentionBlocksPerSm = 16;

// ---- bfloat16 tensor-core kernels: tiling (see attention_mma.cuh for the warp-level part) ----
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
// Decode: a CTA owns one tile of 16 query vectors (one m16 MMA tile: the query heads of one KV
// head for the sequence's query rows) and one KV split; each warp streams its own 16-key tiles
// through a kDecodeStages-deep cp.async pipeline, and the four warps' softmax states are merged
// in shared memory at the end.
constexpr int kDecodeRows = 16;
constexpr int kDecodeKeys = 16;
constexpr int kDecodeStages = 3;
// Launches whose max_query_len * group is at most this (or whose max_query_len is 1) use the
// decode kernel; query_tiles = ceil(max_query_len * group / 16) <= 2 then, or <= group when
// max_query_len is 1 (the bound PagedAttentionWorkspaceFloats relies on).
constexpr int64_t kDecodeMaxVectors = 32;
// Split-KV limits: at most kMaxSplits splits of at least kMinSplitKeys keys, and at most
// kMaxSplitCtas split work items (bounds the scratch; see PagedAttentionWorkspaceFloats).
constexpr int64_t kMaxSplits = 128;
constexpr int64_t kMinSplitKeys = 256;
constexpr int64_t kMaxSplitCtas = 2048;
// Fixed cost of a decode CTA (query load, pipeline fill, merge), in keys' worth of streaming.
constexpr int64_t kSplitOverheadKeys = 128;
// Split-KV prefill (PlanPagedAttention): resident prefill CTAs per multiprocessor (every prefill
// kernel fits two: PrefillTiling, PrefillWgmmaTiling), the fewest keys worth a split of their own,
// the key tile splits are rounded to, and a CTA's fixed cost (query tile, pipeline fill, partial
// write) in keys' worth of work.
constexpr int64_t kPrefillCtasPerSm = 2;
constexpr int64_t kMinPrefillSplitKeys = 1024;
constexpr int64_t kPrefillSplitKeyTile = 64;
constexpr int64_t kPrefillSplitOverheadKeys = 256;
// Prefill: a CTA owns kRows query vectors (kRowTilesPerWarp m16 row tiles per warp) and walks
// kKeys-key tiles shared by its warps through a kStages-deep cp.async pipeline. Up to head_dim 128,
// two row tiles per warp (FlashAttention-2's 128 x 64 tiling) feed every K and V fragment a warp
// reads from shared memory to 32 rows, halving the shared-memory traffic per MMA that limits one
// row tile; the 32 KiB Q tile then leaves room for two stages at head_dim 128 (96 KiB: two CTAs
// per multiprocessor). At head_dim 256 the O accumulators of one row tile already take 128
// registers per thread, so a warp owns one row tile (64 vectors per CTA) and the CTA walks 32-key
// tiles: 96 KiB with two stages, two CTAs per multiprocessor again.
template <int kHeadDim>
struct PrefillTiling {
  static constexpr int kRowTilesPerWarp = kHeadDim <= 128 ? 2 : 1;
  static constexpr int kRows = kTcWarps * 16 * kRowTilesPerWarp;
  static constexpr int kKeys = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kStages = 2;
  static constexpr int kSmemBytes = (kRows + kStages * 2 * kKeys) * kHeadDim * 2;
  static_assert(kStages >= 2, "pipelines need two stages or more");
};
static_assert(kDecodeStages >= 2, "pipelines need two stages or more");

// Hopper prefill (sm_90a builds on compute capability 9.0 devices, unless
// SetPagedAttentionMmaSyncOnly): PagedPrefillKernel's grid and query tiles, run by warpgroups of
// 64 vectors each on wgmma (attention_wgmma.cuh) over key tiles in a two-stage cp.async pipeline.
// Head_dim 128: two warpgroups (128 vectors), 64-key tiles; head_dim 256: one warpgroup (64
// vectors), 32-key tiles. Either takes 97 KiB of shared memory, and registers for two CTAs per
// multiprocessor, so one CTA's softmax overlaps the other's MMAs.
template <int kHeadDimArg>
struct PrefillWgmmaTiling {
  static constexpr int kHeadDim = kHeadDimArg;
  static constexpr int kWarpgroups = kHeadDim <= 128 ? 2 : 1;
  static constexpr int kRows = 64 * kWarpgroups;
  static constexpr int kKeys = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kMinBlocks = 2;
  // + 1,024 bytes of slack to align the tiles to the swizzle atoms.
  static constexpr int kSmemBytes = (kRows + kStages * 2 * kKeys) * kHeadDim * 2 + 1024;
  static_assert(kRows == PrefillTiling<kHeadDim>::kRows, "the planner sizes the query tiles");
  static_assert((kKeys * 128) % 1024 == 0 && (kRows * 128) % 1024 == 0,
                "tiles and their column blocks start on swizzle atoms");
};

// The head dimensions the tensor-core kernels are instantiated for, and their index in
// per-head_dim tables (-1: the simple kernel).
constexpr int TensorCoreHeadDimIndex(int64_t head_dim) {
  return head_dim == 64 ? 0 : head_dim == 128 ? 1 : head_dim == 256 ? 2 : -1;
}
constexpr int kTensorCoreHeadDims = 3;

// Query vectors per prefill CTA (host side of PrefillTiling).
constexpr int64_t PrefillRows(int64_t head_dim) {
  return head_dim <= 128 ? PrefillTiling<128>::kRows : PrefillTiling<256>::kRows;
}

// Floats of one split partial: kDecodeRows outputs of head_dim, then their max and sum.
__host__ __device__ constexpr int64_t SlotFloats(int64_t head_dim) {
  return kDecodeRows * (head_dim + 2);
}

// Decode: the query tile and every warp's stages. 200 KiB at head_dim 256 (one CTA per
// multiprocessor, which keeps 4 warps x 2 tiles x 16 KiB of K/V in flight: enough to stream HBM).
constexpr int DecodeSmemBytes(int head_dim) {
  return (kDecodeRows + kTcWarps * kDecodeStages * 2 * kDecodeKeys) * head_dim * 2;
}
// sm_90: 228 KiB of shared memory per multiprocessor, of which the system reserves 1 KiB per CTA;
// a CTA may opt in to at most 227 KiB.
constexpr int kMaxSmemPerSm = 228 * 1024;
constexpr int kMaxSmemPerCta = 227 * 1024;
static_assert(2 * (PrefillTiling<128>::kSmemBytes + 1024) <= kMaxSmemPerSm,
              "two prefill CTAs per multiprocessor at head_dim 128");
static_assert(2 * (PrefillTiling<256>::kSmemBytes + 1024) <= kMaxSmemPerSm,
              "two prefill CTAs per multiprocessor at head_dim 256");
static_assert(DecodeSmemBytes(256) <= kMaxSmemPerCta, "decode stages too deep at head_dim 256");
// The decode merge reuses the KV stages: four warps' [16][head_dim] outputs plus max and sum.
constexpr bool DecodeMergeFits(int head_dim) {
  return kTcWarps * kDecodeRows * (head_dim + 2) * 4 <=
         kTcWarps * kDecodeStages * 2 * kDecodeKeys * head_dim * 2;
}
static_assert(DecodeMergeFits(64) && DecodeMergeFits(128) && DecodeMergeFits(256),
              "decode merge buffer must fit in the KV stages");

__device__ __forceinline__ float LoadFloat(const float* p) { return *p; }
__device__ __forceinline__ float LoadFloat(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void StoreFloat(float* p, float v) { *p = v; }
__device__ __forceinline__ void StoreFloat(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// The simple kernel (float32, and bfloat16 shapes the tensor-core kernels do not take): each
// (query row, head) is one work item of a persistent grid; a block's four warps split the keys
// and each keeps an online (running max) softmax, merged at the end. T is float or __nv_bfloat16;
// arithmetic is float32 either way.
template <typename T>
__global__ void __launch_bounds__(kAttentionWarps * 32)
    PagedAttentionKernel(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                         KvCacheStrides strides, int64_t block_size, const int32_t* block_tables,
                         int64_t block_table_stride, const int32_t* seq_lens,
                         const int32_t* query_start_loc, int64_t num_seqs, int64_t num_q_heads,
                         int64_t num_kv_heads, int64_t head_dim, float scale, T* out,
                         int64_t out_stride) {
  __shared__ float warp_max[kAttentionWarps];
  __shared__ float warp_sum[kAttentionWarps];
  __shared__ float warp_acc[kAttentionWarps][kMaxAttentionHeadDim];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t group = num_q_heads / num_kv_heads;
  const int64_t num_items = static_cast<int64_t>(query_start_loc[num_seqs]) * num_q_heads;
  for (int64_t item = blockIdx.x; item < num_items; item += gridDim.x) {
    const int64_t row = item / num_q_heads;
    const int64_t h = item % num_q_heads;
    // The sequence owning `row`: the last s with query_start_loc[s] <= row (skips empty ones).
    int64_t lo = 0, hi = num_seqs;  // answer in [lo, hi)
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (query_start_loc[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    const int64_t s = lo;
    const int64_t q_len = query_start_loc[s + 1] - query_start_loc[s];
    const int64_t num_keys = seq_lens[s] - q_len + (row - query_start_loc[s]) + 1;
    const int32_t* table = block_tables + s * block_table_stride;
    const int64_t kv_head_offset = (h / group) * strides.head_stride;

    float qr[kDimsPerLane];
    float acc[kDimsPerLane];
    const T* qh = q + row * q_stride + h * head_dim;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      qr[i] = d < head_dim ? LoadFloat(qh + d) : 0.0f;
      acc[i] = 0.0f;
    }
    float m = -INFINITY;  // running max of this warp's scores
    float l = 0.0f;       // running sum of exp(score - m)
    for (int64_t p = warp; p < num_keys; p += kAttentionWarps) {
      const int64_t token_offset =
          static_cast<int64_t>(table[p / block_size]) * strides.block_stride +
          (p % block_size) * strides.token_stride + kv_head_offset;
      const T* kp = k_cache + token_offset;
      const T* vp = v_cache + token_offset;
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < head_dim) dot += qr[i] * LoadFloat(kp + d);
      }
      const float score = internal::WarpSum(dot) * scale;
      const float m_new = fmaxf(m, score);
      const float correction = expf(m - m_new);
      const float weight = expf(score - m_new);
      l = l * correction + weight;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < head_dim) acc[i] = acc[i] * correction + weight * LoadFloat(vp + d);
      }
      m = m_new;
    }
    if (lane == 0) {
      warp_max[warp] = m;
      warp_sum[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < head_dim) warp_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float max_all = -INFINITY;
    for (int w = 0; w < kAttentionWarps; ++w) max_all = fmaxf(max_all, warp_max[w]);
    float total = 0.0f;
    float factor[kAttentionWarps];
#pragma unroll
    for (int w = 0; w < kAttentionWarps; ++w) {
      // A warp that saw no key has max -inf and sum 0: its factor is 0.
      factor[w] = warp_sum[w] > 0.0f ? expf(warp_max[w] - max_all) : 0.0f;
      total += warp_sum[w] * factor[w];
    }
    const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;
    T* o = out + row * out_stride + h * head_dim;
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
      float value = 0.0f;
#pragma unroll
      for (int w = 0; w < kAttentionWarps; ++w) value += warp_acc[w][d] * factor[w];
      StoreFloat(o + d, value * inv_total);
    }
    __syncthreads();  // shared partials are reused by the next work item
  }
}

// ---- bfloat16 tensor-core kernels ----

using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::SwizzledChunk;
using internal::WarpAttention;

// Arguments of the tensor-core kernels, validated and narrowed by the host (sizes fit in int).
// A "query vector" v of a sequence is (query row v / group, query head kv_head * group + v %
// group): the query heads sharing one KV head, for each of the sequence's query rows in turn.
struct TcParams {
  const __nv_bfloat16* q;
  int64_t q_stride;
  const __nv_bfloat16* k_cache;
  const __nv_bfloat16* v_cache;
  KvCacheStrides strides;
  int block_size;
  int block_shift;  // log2(block_size) when a power of two (shift and mask), else -1 (divide)
  const int32_t* block_tables;
  int64_t block_table_stride;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;
  int num_seqs;
  int num_kv_heads;
  int group;         // query heads per KV head
  int query_tiles;   // query-vector tiles per (sequence, KV head)
  int splits;        // KV splits (decode)
  float scale_log2;  // scale * log2(e): scores in the log2 domain
  __nv_bfloat16* out;
  int64_t out_stride;
  float* workspace;  // split partials (decode with splits > 1)
};

__device__ __forceinline__ int DivUp(int a, int b) { return (a + b - 1) / b; }

// Chunk `chunk` of row `row` of a kRows-row shared tile: the mma.sync kernels' swizzled rows
// (SwizzledChunk) or the wgmma kernel's 64-dim column blocks (internal::WgmmaTileChunk).
template <int kHeadDim, int kRows, bool kWgmmaLayout>
__device__ __forceinline__ int TileChunk(int row, int chunk) {
  if constexpr (kWgmmaLayout) {
    return internal::WgmmaTileChunk<kRows>(row, chunk);
  } else {
    return SwizzledChunk<kHeadDim / 8>(row, chunk);
  }
}

// Starts the copy of query vectors vec0 .. vec0 + kRows - 1 of a sequence (rows of a swizzled
// [kRows][kHeadDim] tile, see TileChunk); vectors >= num_vectors are zero-filled. All threads of
// the block.
template <int kHeadDim, int kRows, bool kWgmmaLayout = false>
__device__ __forceinline__ void LoadQueryTile(const TcParams& p, __nv_bfloat16* q_tile,
                                              int row_begin, int vec0, int num_vectors,
                                              int kv_head) {
  constexpr int kChunks = kHeadDim / 8;
  const uint32_t base = internal::SharedAddress(q_tile);
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += blockDim.x) {
    const int row = idx / kChunks;
    const int chunk = idx % kChunks;
    const int v = vec0 + row;
    const bool valid = v < num_vectors;
    const __nv_bfloat16* src = p.q;
    if (valid) {
      src = p.q + static_cast<int64_t>(row_begin + v / p.group) * p.q_stride +
            static_cast<int64_t>(kv_head * p.group + v % p.group) * kHeadDim + chunk * 8;
    }
    internal::CpAsync16(base + 16 * TileChunk<kHeadDim, kRows, kWgmmaLayout>(row, chunk), src,
                        valid ? 16 : 0);
  }
}

// Starts the copy of keys key0 .. key0 + kKeys - 1 of one KV head (K and V rows gathered through
// the sequence's block table) into swizzled [kKeys][kHeadDim] tiles; keys >= key_end are
// zero-filled and their block-table entries never read. Threads `thread` (0-based among the
// num_threads taking part) split the 16-byte chunks. Tile layout: TileChunk.
template <int kHeadDim, int kKeys, bool kWgmmaLayout = false>
__device__ __forceinline__ void LoadKvTile(const TcParams& p, const int32_t* table, int kv_head,
                                           int key0, int key_end, __nv_bfloat16* k_tile,
                                           __nv_bfloat16* v_tile, int thread, int num_threads) {
  constexpr int kChunks = kHeadDim / 8;
  const uint32_t k_base = internal::SharedAddress(k_tile);
  const uint32_t v_base = internal::SharedAddress(v_tile);
  for (int idx = thread; idx < kKeys * kChunks; idx += num_threads) {
    const int row = idx / kChunks;
    const int chunk = idx % kChunks;
    const int key = key0 + row;
    const bool valid = key < key_end;
    int64_t offset = 0;
    if (valid) {
      const int block = p.block_shift >= 0 ? key >> p.block_shift : key / p.block_size;
      const int in_block = p.block_shift >= 0 ? key & (p.block_size - 1) : key % p.block_size;
      offset = static_cast<int64_t>(table[block]) * p.strides.block_stride +
               static_cast<int64_t>(in_block) * p.strides.token_stride +
               static_cast<int64_t>(kv_head) * p.strides.head_stride + chunk * 8;
    }
    const uint32_t dst = 16 * TileChunk<kHeadDim, kKeys, kWgmmaLayout>(row, chunk);
    internal::CpAsync16(k_base + dst, p.k_cache + offset, valid ? 16 : 0);
    internal::CpAsync16(v_base + dst, p.v_cache + offset, valid ? 16 : 0);
  }
}

// Keys visible to query vector v (causal: its query row's position + 1), at most key_end; 0 for
// vectors past the sequence (their rows are computed on zeros and never written).
__device__ __forceinline__ int VectorLimit(const TcParams& p, int v, int num_vectors, int first_pos,
                                           int key_end) {
  return v < num_vectors ? min(first_pos + v / p.group + 1, key_end) : 0;
}

// Split-KV decode. Grid: one CTA per (sequence, query tile, KV head, split), split fastest, so
// blockIdx.x is also the index of the CTA's partial in the workspace.
template <int kHeadDim>
__global__ void __launch_bounds__(kTcThreads) PagedDecodeKernel(const TcParams p) {
  constexpr int kTileElems = kDecodeKeys * kHeadDim;  // one K (or V) stage of one warp
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* kv = q_tile + kDecodeRows * kHeadDim;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;

  int bx = blockIdx.x;
  const int split = bx % p.splits;
  bx /= p.splits;
  const int kv_head = bx % p.num_kv_heads;
  bx /= p.num_kv_heads;
  const int tile = bx % p.query_tiles;
  const int seq = bx / p.query_tiles;
  const int row_begin = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - row_begin;
  const int num_vectors = q_len * p.group;
  const int vec0 = tile * kDecodeRows;
  if (vec0 >= num_vectors) return;  // whole CTA: past this sequence's query vectors
  const int first_pos = p.seq_lens[seq] - q_len;
  const int last_vec = min(vec0 + kDecodeRows, num_vectors) - 1;
  const int total_keys = first_pos + last_vec / p.group + 1;  // keys the tile's last row sees
  // This split's keys [begin, end): equal chunks (whole 16-key tiles) of the tile's keys; late
  // splits of a short sequence are empty and still record an empty partial.
  const int chunk_keys = DivUp(DivUp(total_keys, p.splits), kDecodeKeys) * kDecodeKeys;
  const int begin = min(split * chunk_keys, total_keys);
  const int end = min(begin + chunk_keys, total_keys);
  const int32_t* table = p.block_tables + seq * p.block_table_stride;
  // Warp w takes the split's 16-key tiles w, w + 4, w + 8, ...
  const int num_tiles = DivUp(end - begin, kDecodeKeys);
  const int my_tiles = num_tiles > warp ? DivUp(num_tiles - warp, kTcWarps) : 0;
  __nv_bfloat16* warp_kv = kv + warp * kDecodeStages * 2 * kTileElems;
  auto k_stage = [&](int t) { return warp_kv + (t % kDecodeStages) * 2 * kTileElems; };
  auto v_stage = [&](int t) { return k_stage(t) + kTileElems; };
  auto tile_key0 = [&](int t) { return begin + (warp + kTcWarps * t) * kDecodeKeys; };

  // cp.async groups, in commit order per thread: the query tile, then one per pipeline step
  // (possibly empty), so "all but the newest kDecodeStages - 1 groups done" always means "the
  // query tile and every KV tile up to the current one have landed".
  LoadQueryTile<kHeadDim, kDecodeRows>(p, q_tile, row_begin, vec0, num_vectors, kv_head);
  CpAsyncCommit();
  for (int t = 0; t < kDecodeStages - 1; ++t) {
    if (t < my_tiles) {
      LoadKvTile<kHeadDim, kDecodeKeys>(p, table, kv_head, tile_key0(t), end, k_stage(t),
                                        v_stage(t), lane, 32);
    }
    CpAsyncCommit();
  }
  CpAsyncWait<kDecodeStages - 1>();
  __syncthreads();  // every thread's part of the query tile is visible

  WarpAttention<kHeadDim> att;
  att.Init();
  att.LoadQ(q_tile, 0, lane);
  const int g = lane >> 2;
  const int limit0 = VectorLimit(p, vec0 + g, num_vectors, first_pos, end);
  const int limit1 = VectorLimit(p, vec0 + g + 8, num_vectors, first_pos, end);
  const int limits[1][2] = {{limit0, limit1}};
  // Tiles ending at or below every valid row's limit need no mask.
  const int min_limit =
      __reduce_min_sync(0xffffffffu, min(vec0 + g < num_vectors ? limit0 : INT_MAX,
                                         vec0 + g + 8 < num_vectors ? limit1 : INT_MAX));
  for (int t = 0; t < my_tiles; ++t) {
    __syncwarp();  // all lanes are done reading the stage refilled below (tile t - 1's)
    const int next = t + kDecodeStages - 1;
    if (next < my_tiles) {
      LoadKvTile<kHeadDim, kDecodeKeys>(p, table, kv_head, tile_key0(next), end, k_stage(next),
                                        v_stage(next), lane, 32);
    }
    CpAsyncCommit();
    CpAsyncWait<kDecodeStages - 1>();
    __syncwarp();  // every lane's copies of tile t are visible to the whole warp
    const int key0 = tile_key0(t);
    att.template Attend<kDecodeKeys>(k_stage(t), v_stage(t), lane, key0, limits,
                                     key0 + kDecodeKeys > min_limit, p.scale_log2);
  }
  CpAsyncWait<0>();
  att.FinishSums();
  __syncthreads();  // all warps are done with their stages: reuse them for the merge

  // Merge the four warps' states (each covering a quarter of the split's keys).
  float* merge_o = reinterpret_cast<float*>(kv);                 // [warp][row][dim]
  float* merge_m = merge_o + kTcWarps * kDecodeRows * kHeadDim;  // [warp][row]
  float* merge_l = merge_m + kTcWarps * kDecodeRows;             // [warp][row]
  const int c = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * kDecodeRows + g + 8 * r;
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      merge_o[row * kHeadDim + 8 * n + 2 * c] = att.o[0][n][2 * r];
      merge_o[row * kHeadDim + 8 * n + 2 * c + 1] = att.o[0][n][2 * r + 1];
    }
    if (c == 0) {
      merge_m[row] = att.m[0][r];
      merge_l[row] = att.l[0][r];
    }
  }
  __syncthreads();
  float* slot = p.workspace + static_cast<int64_t>(blockIdx.x) * SlotFloats(kHeadDim);
  for (int idx = threadIdx.x; idx < kDecodeRows * kHeadDim; idx += kTcThreads) {
    const int row = idx / kHeadDim;
    const int d = idx % kHeadDim;
    const int v = vec0 + row;
    if (v >= num_vectors) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kTcWarps; ++w) {
      if (merge_l[w * kDecodeRows + row] > 0.0f) mx = fmaxf(mx, merge_m[w * kDecodeRows + row]);
    }
    float sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kTcWarps; ++w) {
      const float lw = merge_l[w * kDecodeRows + row];
      if (lw > 0.0f) {
        const float f = exp2f(merge_m[w * kDecodeRows + row] - mx);
        sum += lw * f;
        acc += merge_o[(w * kDecodeRows + row) * kHeadDim + d] * f;
      }
    }
    const float value = sum > 0.0f ? acc / sum : 0.0f;
    if (p.splits == 1) {
      p.out[static_cast<int64_t>(row_begin + v / p.group) * p.out_stride +
            static_cast<int64_t>(kv_head * p.group + v % p.group) * kHeadDim + d] =
          __float2bfloat16_rn(value);
    } else {
      // Partial of this split: normalised output, max (log2 domain) and sum; an empty split
      // records sum 0 and is ignored by the merge.
      slot[row * kHeadDim + d] = value;
      if (d == 0) {
        slot[kDecodeRows * kHeadDim + row] = mx;
        slot[kDecodeRows * kHeadDim + kDecodeRows + row] = sum;
      }
    }
  }
}

// Combines the splits' partials of one query vector of one (sequence, query tile, KV head):
// blockIdx.x is the (sequence, query tile, KV head) work item, blockIdx.y the vector's row in the
// tile. Weights sum_j * exp2(max_j - max), normalised over the splits, each computed by one thread
// into shared memory; then one thread per output element (head_dim of them) sums the splits in
// order. A decode step's few work items thus merge on kDecodeRows times as many CTAs, each
// reading its splits' partials with independent, coalesced loads.
template <int kHeadDim>
__global__ void __launch_bounds__(kTcThreads) MergeSplitsKernel(const TcParams p) {
  __shared__ float part_m[kMaxSplits];
  __shared__ float part_l[kMaxSplits];
  __shared__ float weight[kMaxSplits];
  const int kv_head = blockIdx.x % p.num_kv_heads;
  const int rest = blockIdx.x / p.num_kv_heads;
  const int tile = rest % p.query_tiles;
  const int seq = rest / p.query_tiles;
  const int row_begin = p.query_start_loc[seq];
  const int q_len = p.query_start_loc[seq + 1] - row_begin;
  const int num_vectors = q_len * p.group;
  const int row = blockIdx.y;
  const int v = tile * kDecodeRows + row;
  if (v >= num_vectors) return;  // the whole block
  constexpr int64_t kSlot = SlotFloats(kHeadDim);
  const float* slots = p.workspace + static_cast<int64_t>(blockIdx.x) * p.splits * kSlot;
  for (int j = threadIdx.x; j < p.splits; j += kTcThreads) {
    const float* s = slots + j * kSlot + kDecodeRows * kHeadDim;
    part_m[j] = s[row];
    part_l[j] = s[kDecodeRows + row];
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = 0; j < p.splits; ++j) {
    if (part_l[j] > 0.0f) mx = fmaxf(mx, part_m[j]);
  }
  for (int j = threadIdx.x; j < p.splits; j += kTcThreads) {
    const float l = part_l[j];
    weight[j] = l > 0.0f ? l * exp2f(part_m[j] - mx) : 0.0f;
  }
  __syncthreads();
  float total = 0.0f;
  for (int j = 0; j < p.splits; ++j) total += weight[j];
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  __nv_bfloat16* out = p.out + static_cast<int64_t>(row_begin + v / p.group) * p.out_stride +
                       static_cast<int64_t>(kv_head * p.group + v % p.group) * kHeadDim;
  for (int d = threadIdx.x; d < kHeadDim; d += kTcThreads) {
    float acc = 0.0f;
#pragma unroll 8
    for (int j = 0; j < p.splits; ++j)
      acc += (weight[j] * inv) * slots[j * kSlot + row * kHeadDim + d];
    out[d] = __float2bfloat16_rn(acc);
  }
}

// The work of one prefill CTA. Grid: one CTA per (query tile, sequence, KV head, split), split
// fastest, then KV head, and the last query tiles (the most keys under the causal mask) first,
// so the longest CTAs start early. Split j of a tile takes an equal share, in whole kKeys tiles,
// of the keys the tile's last vector sees; a late split of a short tile may be empty.
struct PrefillWork {
  int split, kv_head, seq, tile;
  int row_begin, num_vectors, vec0, first_pos;
  int key_begin, key_end;  // this split's keys; key_begin a multiple of kKeys
};

template <int kRows, int kKeys>
__device__ __forceinline__ bool FindPrefillWork(const TcParams& p, PrefillWork* w) {
  int bx = blockIdx.x;
  w->split = bx % p.splits;
  bx /= p.splits;
  w->kv_head = bx % p.num_kv_heads;
  bx /= p.num_kv_heads;
  w->seq = bx % p.num_seqs;
  w->tile = p.query_tiles - 1 - bx / p.num_seqs;
  w->row_begin = p.query_start_loc[w->seq];
  const int q_len = p.query_start_loc[w->seq + 1] - w->row_begin;
  w->num_vectors = q_len * p.group;
  w->vec0 = w->tile * kRows;
  if (w->vec0 >= w->num_vectors) return false;
  w->first_pos = p.seq_lens[w->seq] - q_len;
  const int last_vec = min(w->vec0 + kRows, w->num_vectors) - 1;
  const int total_keys = w->first_pos + last_vec / p.group + 1;
  const int chunk = DivUp(DivUp(total_keys, p.splits), kKeys) * kKeys;
  w->key_begin = min(w->split * chunk, total_keys);
  w->key_end = min(w->key_begin + chunk, total_keys);
  return true;
}

// Writes query vector v's result over the CTA's keys, from this lane's output pairs
// pair(n, 0..1) = dims 8n + 2c, 8n + 2c + 1 (unnormalised) and the row's max m (log2 domain) and
// sum l: the output itself when there is one split, else the split's partial (normalised output,
// m and l; l = 0 for a split the row sees no key of) in the MergeSplitsKernel slot of v's
// 16-vector sub-tile, every valid vector's slot written so the merge never reads stale scratch.
template <int kHeadDim, int kRows, typename OutputPair>
__device__ __forceinline__ void StorePrefillVector(const TcParams& p, const PrefillWork& w, int v,
                                                   int c, float m, float l, OutputPair pair) {
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (p.splits == 1) {
    __nv_bfloat16* o = p.out + static_cast<int64_t>(w.row_begin + v / p.group) * p.out_stride +
                       static_cast<int64_t>(w.kv_head * p.group + v % p.group) * kHeadDim;
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      *reinterpret_cast<uint32_t*>(o + 8 * n + 2 * c) =
          internal::PackBf16(pair(n, 0) * inv, pair(n, 1) * inv);
    }
    return;
  }
  constexpr int kSubTiles = kRows / kDecodeRows;
  const int local = v - w.vec0;
  const int64_t slot_index = ((static_cast<int64_t>(w.seq) * p.query_tiles * kSubTiles +
                               w.tile * kSubTiles + local / kDecodeRows) *
                                  p.num_kv_heads +
                              w.kv_head) *
                                 p.splits +
                             w.split;
  float* slot = p.workspace + slot_index * SlotFloats(kHeadDim);
  const int row = local % kDecodeRows;
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) {
    *reinterpret_cast<float2*>(slot + row * kHeadDim + 8 * n + 2 * c) =
        make_float2(pair(n, 0) * inv, pair(n, 1) * inv);
  }
  if (c == 0) {
    slot[kDecodeRows * kHeadDim + row] = m;
    slot[kDecodeRows * kHeadDim + kDecodeRows + row] = l;
  }
}

// FlashAttention-2 style prefill (and any batch the decode kernel does not take). Grid and split
// keys: PrefillWork; with splits, partials for MergeSplitsKernel. Warp w owns the CTA's vectors
// 16 kRowTiles w .. 16 kRowTiles (w + 1) - 1 (row tile t: the 16 from 16 kRowTiles w + 16 t).
template <int kHeadDim>
__global__ void __launch_bounds__(kTcThreads) PagedPrefillKernel(const TcParams p) {
  using Tiling = PrefillTiling<kHeadDim>;
  constexpr int kRowTiles = Tiling::kRowTilesPerWarp;
  constexpr int kPrefillRows = Tiling::kRows;
  constexpr int kPrefillKeys = Tiling::kKeys;
  constexpr int kPrefillStages = Tiling::kStages;
  constexpr int kTileElems = kPrefillKeys * kHeadDim;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* kv = q_tile + kPrefillRows * kHeadDim;
  auto k_stage = [&](int t) { return kv + (t % kPrefillStages) * 2 * kTileElems; };
  auto v_stage = [&](int t) { return k_stage(t) + kTileElems; };
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;

  PrefillWork w;
  if (!FindPrefillWork<kPrefillRows, kPrefillKeys>(p, &w)) return;  // whole CTA
  const int num_vectors = w.num_vectors;
  const int vec0 = w.vec0;
  const int key_end = w.key_end;
  const int num_tiles = DivUp(key_end - w.key_begin, kPrefillKeys);
  auto tile_key0 = [&](int t) { return w.key_begin + t * kPrefillKeys; };
  const int32_t* table = p.block_tables + w.seq * p.block_table_stride;

  // cp.async groups, in commit order: the query tile with KV tile 0, KV tiles 1 .. kStages - 2,
  // then one per iteration (possibly empty), so waiting for all but the newest kStages - 1 groups
  // means tile t (and the query tile) have landed.
  LoadQueryTile<kHeadDim, kPrefillRows>(p, q_tile, w.row_begin, vec0, num_vectors, w.kv_head);
  for (int t = 0; t < kPrefillStages - 1; ++t) {
    if (t < num_tiles) {
      LoadKvTile<kHeadDim, kPrefillKeys>(p, table, w.kv_head, tile_key0(t), key_end, k_stage(t),
                                         v_stage(t), threadIdx.x, kTcThreads);
    }
    CpAsyncCommit();
  }

  const int g = lane >> 2;
  const int warp_row = warp * 16 * kRowTiles;  // the warp's first row in the Q tile
  // This lane's rows: vectors v0 + 16t and v0 + 16t + 8 of row tile t.
  const int v0 = vec0 + warp_row + g;
  int limits[kRowTiles][2];
  // Per warp: tiles below every valid row's limit need no mask; tiles at or past every row's
  // limit are skipped (fully masked).
  int lane_min = INT_MAX, lane_max = 0;
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int v = v0 + 16 * t + 8 * r;
      limits[t][r] = VectorLimit(p, v, num_vectors, w.first_pos, key_end);
      if (v < num_vectors) lane_min = min(lane_min, limits[t][r]);
      lane_max = max(lane_max, limits[t][r]);
    }
  }
  const int min_limit = __reduce_min_sync(0xffffffffu, lane_min);
  const int max_limit = __reduce_max_sync(0xffffffffu, lane_max);
  CpAsyncWait<kPrefillStages - 2>();  // the oldest group: the query tile (and KV tile 0)
  __syncthreads();
  WarpAttention<kHeadDim, kRowTiles> att;
  att.Init();
  att.LoadQ(q_tile, warp_row, lane);
  for (int t = 0; t < num_tiles; ++t) {
    // Refills the stage tile t - 1 used; the barrier ending iteration t - 1 freed it.
    const int next = t + kPrefillStages - 1;
    if (next < num_tiles) {
      LoadKvTile<kHeadDim, kPrefillKeys>(p, table, w.kv_head, tile_key0(next), key_end,
                                         k_stage(next), v_stage(next), threadIdx.x, kTcThreads);
    }
    CpAsyncCommit();
    CpAsyncWait<kPrefillStages - 1>();
    __syncthreads();  // tile t visible to all warps
    const int key0 = tile_key0(t);
    if (key0 < max_limit) {
      att.template Attend<kPrefillKeys>(k_stage(t), v_stage(t), lane, key0, limits,
                                        key0 + kPrefillKeys > min_limit, p.scale_log2);
    }
    __syncthreads();  // all warps are done with tile t's stage before it is refilled
  }
  CpAsyncWait<0>();
  att.FinishSums();
  const int c = lane & 3;
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int v = v0 + 16 * t + 8 * r;
      if (v >= num_vectors) continue;
      StorePrefillVector<kHeadDim, kPrefillRows>(
          p, w, v, c, att.m[t][r], att.l[t][r],
          [&](int n, int e) { return att.o[t][n][2 * r + e]; });
    }
  }
}

// PagedPrefillKernel on Hopper's wgmma (PrefillWgmmaTiling): the same grid, query tiles, masking
// and output. Warpgroup w owns the CTA's vectors 64w .. 64w + 63; a warpgroup whose vectors all
// lie past the sequence, or whose keys all lie before a tile, skips that tile's MMAs (a decision
// uniform over the warpgroup, as wgmma requires) but loads and reaches every barrier.
template <int kHeadDim>
__global__ void __launch_bounds__(PrefillWgmmaTiling<kHeadDim>::kThreads,
                                  PrefillWgmmaTiling<kHeadDim>::kMinBlocks)
    PagedPrefillWgmmaKernel(const TcParams p) {
  using Tiling = PrefillWgmmaTiling<kHeadDim>;
  constexpr int kRows = Tiling::kRows;
  constexpr int kKeys = Tiling::kKeys;
  constexpr int kTileElems = kKeys * kHeadDim;
  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  unsigned char* const aligned =
      wgmma_smem + ((1024u - (internal::SharedAddress(wgmma_smem) & 1023u)) & 1023u);
  __nv_bfloat16* q_tile = reinterpret_cast<__nv_bfloat16*>(aligned);
  __nv_bfloat16* kv = q_tile + kRows * kHeadDim;
  auto k_stage = [&](int t) { return kv + (t % Tiling::kStages) * 2 * kTileElems; };
  auto v_stage = [&](int t) { return k_stage(t) + kTileElems; };
  const int lane = threadIdx.x % 32;
  const int wg = threadIdx.x / 128;
  const int warp_in_wg = (threadIdx.x % 128) / 32;

  PrefillWork w;
  if (!FindPrefillWork<kRows, kKeys>(p, &w)) return;  // whole CTA
  const int num_vectors = w.num_vectors;
  const int key_end = w.key_end;
  const int num_tiles = DivUp(key_end - w.key_begin, kKeys);
  const int32_t* table = p.block_tables + w.seq * p.block_table_stride;

  // One cp.async group per tile: the query tile travels with KV tile 0.
  LoadQueryTile<kHeadDim, kRows, true>(p, q_tile, w.row_begin, w.vec0, num_vectors, w.kv_head);
  if (num_tiles > 0) {
    LoadKvTile<kHeadDim, kKeys, true>(p, table, w.kv_head, w.key_begin, key_end, k_stage(0),
                                      v_stage(0), threadIdx.x, Tiling::kThreads);
  }
  CpAsyncCommit();

  // Limits grow with the vector, so the warpgroup's first and last valid vectors bound its rows':
  // tiles below the first's limit need no mask, tiles from the last's on are skipped.
  const int wg_vec0 = w.vec0 + 64 * wg;
  const bool wg_active = wg_vec0 < num_vectors;
  const int wg_min_limit = VectorLimit(p, wg_vec0, num_vectors, w.first_pos, key_end);
  const int wg_max_limit =
      VectorLimit(p, min(wg_vec0 + 63, num_vectors - 1), num_vectors, w.first_pos, key_end);
  // This lane's rows: vectors v0 and v0 + 8.
  const int v0 = wg_vec0 + 16 * warp_in_wg + (lane >> 2);
  const int limits[2] = {VectorLimit(p, v0, num_vectors, w.first_pos, key_end),
                         VectorLimit(p, v0 + 8, num_vectors, w.first_pos, key_end)};
  internal::WarpgroupAttention<kHeadDim, kKeys> att;
  att.Init();
  const uint32_t q_rows = internal::SharedAddress(q_tile) + 64 * wg * att.kRowBytes;
  for (int t = 0; t < num_tiles; ++t) {
    // Tile t lands and is published to the async proxy; the stage tile t + 1 goes into was tile
    // t - 1's, whose MMAs every warpgroup waited for before this barrier.
    CpAsyncWait<0>();
    internal::FenceProxyAsyncShared();
    __syncthreads();
    const int key0 = w.key_begin + t * kKeys;
    if (t + 1 < num_tiles) {
      LoadKvTile<kHeadDim, kKeys, true>(p, table, w.kv_head, key0 + kKeys, key_end, k_stage(t + 1),
                                        v_stage(t + 1), threadIdx.x, Tiling::kThreads);
    }
    CpAsyncCommit();
    if (wg_active && key0 < wg_max_limit) {
      att.Attend(q_rows, kRows * att.kRowBytes, internal::SharedAddress(k_stage(t)),
                 internal::SharedAddress(v_stage(t)), lane, key0, limits,
                 key0 + kKeys > wg_min_limit, p.scale_log2);
    }
  }
  CpAsyncWait<0>();
  att.FinishSums();
  // The work's indices again rather than kept live through the loop (registers are the limit).
  FindPrefillWork<kRows, kKeys>(p, &w);
  const int c = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int v = v0 + 8 * r;
    if (v >= num_vectors) continue;
    StorePrefillVector<kHeadDim, kRows>(p, w, v, c, att.m[r], att.l[r],
                                        [&](int n, int e) { return att.o[4 * n + 2 * r + e]; });
  }
}

// ---- host side ----

// SetPagedAttentionMmaSyncOnly's setting.
std::atomic<bool> g_mma_sync_only{false};

bool UseWgmmaPrefill(int64_t head_dim) {
  return (head_dim == 128 || head_dim == 256) && !g_mma_sync_only.load(std::memory_order_relaxed) &&
         internal::WgmmaAvailable();
}

// Per device: multiprocessor count and resident decode CTAs per multiprocessor (per tensor-core
// head_dim, see TensorCoreHeadDimIndex), with the kernels' dynamic shared memory limits raised on
// that device. Computed once per device and cached lock-free (packed in one word; a race computes
// the same value twice).
struct DeviceLaunchInfo {
  int sms = 0;
  int decode_ctas_per_sm[kTensorCoreHeadDims] = {1, 1, 1};  // [head_dim 64, 128, 256]
};

template <int kHeadDim>
absl::Status PrepareTcKernels(int* decode_ctas_per_sm) {
  const int decode_smem = DecodeSmemBytes(kHeadDim);
  const int prefill_smem = PrefillTiling<kHeadDim>::kSmemBytes;
  if (absl::Status s = internal::CudaStatus(
          cudaFuncSetAttribute(PagedDecodeKernel<kHeadDim>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, decode_smem),
          "cudaFuncSetAttribute(PagedDecodeKernel)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = internal::CudaStatus(
          cudaFuncSetAttribute(PagedPrefillKernel<kHeadDim>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, prefill_smem),
          "cudaFuncSetAttribute(PagedPrefillKernel)");
      !s.ok()) {
    return s;
  }
  if constexpr (kHeadDim == 128 || kHeadDim == 256) {
    if (absl::Status s =
            internal::CudaStatus(cudaFuncSetAttribute(PagedPrefillWgmmaKernel<kHeadDim>,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      PrefillWgmmaTiling<kHeadDim>::kSmemBytes),
                                 "cudaFuncSetAttribute(PagedPrefillWgmmaKernel)");
        !s.ok()) {
      return s;
    }
  }
  int blocks = 0;
  if (absl::Status s =
          internal::CudaStatus(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                   &blocks, PagedDecodeKernel<kHeadDim>, kTcThreads, decode_smem),
                               "cudaOccupancyMaxActiveBlocksPerMultiprocessor(PagedDecodeKernel)");
      !s.ok()) {
    return s;
  }
  *decode_ctas_per_sm = std::max(blocks, 1);
  return absl::OkStatus();
}

constexpr int kMaxCachedDevices = 64;
std::atomic<uint64_t> g_device_info[kMaxCachedDevices];  // 0: not yet computed

absl::Status GetDeviceLaunchInfo(DeviceLaunchInfo* info) {
  int device = 0;
  if (absl::Status s = internal::CudaStatus(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) {
    return s;
  }
  if (device >= 0 && device < kMaxCachedDevices) {
    const uint64_t packed = g_device_info[device].load(std::memory_order_acquire);
    if (packed != 0) {
      info->sms = static_cast<int>(packed & 0xffff);
      for (int i = 0; i < kTensorCoreHeadDims; ++i) {
        info->decode_ctas_per_sm[i] = static_cast<int>((packed >> (16 + 8 * i)) & 0xff);
      }
      return absl::OkStatus();
    }
  }
  if (absl::Status s = internal::MultiProcessorCount(&info->sms); !s.ok()) return s;
  if (absl::Status s = PrepareTcKernels<64>(&info->decode_ctas_per_sm[0]); !s.ok()) return s;
  if (absl::Status s = PrepareTcKernels<128>(&info->decode_ctas_per_sm[1]); !s.ok()) return s;
  if (absl::Status s = PrepareTcKernels<256>(&info->decode_ctas_per_sm[2]); !s.ok()) return s;
  if (device >= 0 && device < kMaxCachedDevices) {
    uint64_t packed = (uint64_t{1} << 63) | static_cast<uint64_t>(info->sms & 0xffff);
    for (int i = 0; i < kTensorCoreHeadDims; ++i) {
      packed |= static_cast<uint64_t>(info->decode_ctas_per_sm[i] & 0xff) << (16 + 8 * i);
    }
    g_device_info[device].store(packed, std::memory_order_release);
  }
  return absl::OkStatus();
}

// After a split prefill launch: its partials are per 16-vector sub-tile, as the decode kernel's,
// so MergeSplitsKernel combines them over tiles of that size. Nothing for one split.
template <int kHeadDim>
absl::Status MergePrefillSplits(const PagedAttentionPlan& plan, const TcParams& params,
                                int num_seqs, int num_kv_heads, cudaStream_t stream) {
  if (plan.splits == 1) return absl::OkStatus();
  TcParams merge = params;
  merge.query_tiles = params.query_tiles * static_cast<int>(PrefillRows(kHeadDim) / kDecodeRows);
  const int64_t merge_ctas = int64_t{num_seqs} * merge.query_tiles * num_kv_heads;
  const dim3 grid(static_cast<unsigned>(merge_ctas), kDecodeRows);
  MergeSplitsKernel<kHeadDim><<<grid, kTcThreads, 0, stream>>>(merge);
  return internal::LaunchStatus("MergeSplitsKernel");
}

template <int kHeadDim>
absl::Status LaunchTc(const PagedAttentionPlan& plan, const TcParams& params, int num_seqs,
                      int num_kv_heads, cudaStream_t stream) {
  if (plan.kernel == AttentionKernel::kDecode) {
    PagedDecodeKernel<kHeadDim>
        <<<static_cast<unsigned>(plan.ctas), kTcThreads, DecodeSmemBytes(kHeadDim), stream>>>(
            params);
    if (absl::Status s = internal::LaunchStatus("PagedDecodeKernel"); !s.ok()) return s;
    if (plan.splits > 1) {
      const int64_t merge_ctas = int64_t{num_seqs} * plan.query_tiles * num_kv_heads;
      const dim3 grid(static_cast<unsigned>(merge_ctas), kDecodeRows);
      MergeSplitsKernel<kHeadDim><<<grid, kTcThreads, 0, stream>>>(params);
      return internal::LaunchStatus("MergeSplitsKernel");
    }
    return absl::OkStatus();
  }
  if constexpr (kHeadDim == 128 || kHeadDim == 256) {
    if (UseWgmmaPrefill(kHeadDim)) {
      using Tiling = PrefillWgmmaTiling<kHeadDim>;
      PagedPrefillWgmmaKernel<kHeadDim>
          <<<static_cast<unsigned>(plan.ctas), Tiling::kThreads, Tiling::kSmemBytes, stream>>>(
              params);
      if (absl::Status s = internal::LaunchStatus("PagedPrefillWgmmaKernel"); !s.ok()) return s;
      return MergePrefillSplits<kHeadDim>(plan, params, num_seqs, num_kv_heads, stream);
    }
  }
  PagedPrefillKernel<kHeadDim><<<static_cast<unsigned>(plan.ctas), kTcThreads,
                                 PrefillTiling<kHeadDim>::kSmemBytes, stream>>>(params);
  if (absl::Status s = internal::LaunchStatus("PagedPrefillKernel"); !s.ok()) return s;
  return MergePrefillSplits<kHeadDim>(plan, params, num_seqs, num_kv_heads, stream);
}

}  // namespace

void SetPagedAttentionMmaSyncOnly(bool mma_sync) {
  g_mma_sync_only.store(mma_sync, std::memory_order_relaxed);
}

bool PagedAttentionPrefillUsesWgmma(int64_t head_dim) { return UseWgmmaPrefill(head_dim); }

absl::Status PagedAttention(const PagedAttentionArgs<float>& a, cudaStream_t stream) {
  if (a.head_dim < 1 || a.head_dim > kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: head_dim ", a.head_dim,
                                                   " outside [1, ", kMaxAttentionHeadDim, "]"));
  }
  if (a.num_kv_heads < 1 || a.num_q_heads % a.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", a.num_q_heads,
                                                   " query heads are not a multiple of ",
                                                   a.num_kv_heads, " kv heads"));
  }
  if (a.num_seqs == 0) return absl::OkStatus();
  int sms = 0;
  if (absl::Status s = internal::MultiProcessorCount(&sms); !s.ok()) return s;
  PagedAttentionKernel<float><<<sms * kAttentionBlocksPerSm, kAttentionWarps * 32, 0, stream>>>(
      a.q, a.q_stride, a.k_cache, a.v_cache, a.strides, a.block_size, a.block_tables,
      a.block_table_stride, a.seq_lens, a.query_start_loc, a.num_seqs, a.num_q_heads,
      a.num_kv_heads, a.head_dim, a.scale, a.out, a.out_stride);
  return internal::LaunchStatus("PagedAttentionKernel");
}

// ---- bfloat16 ----

int64_t PagedAttentionWorkspaceFloats(int64_t /*max_num_tokens*/, int64_t max_num_seqs,
                                      int64_t num_q_heads, int64_t head_dim, int64_t max_seq_len) {
  const int64_t cap =
      std::min(kMaxSplits, CeilDiv(std::max<int64_t>(max_seq_len, 0), kMinSplitKeys));
  if (cap <= 1 || max_num_seqs <= 0 || num_q_heads <= 0 || head_dim <= 0) return 0;
  // A split launch writes at most kMaxSplitCtas partial slots of 16 query vectors: decode CTAs
  // (see PlanPagedAttention), or the 16-vector sub-tiles of split prefill CTAs.
  return kMaxSplitCtas * SlotFloats(head_dim);
}

const char* AttentionKernelName(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kSimple:
      return "simple";
    case AttentionKernel::kDecode:
      return "decode";
    case AttentionKernel::kPrefill:
      return "prefill";
  }
  return "?";
}

namespace {

// The number of KV splits in [1, cap] that minimises the estimated time of `units` CTAs' worth of
// work on `slots` resident CTAs, without launching more than max_ctas: waves of CTAs times each
// CTA's keys (max_seq_len / splits, rounded up to key_tile) plus its fixed cost (overhead_keys).
int64_t BestSplits(int64_t units, int64_t slots, int64_t max_ctas, int64_t cap, int64_t max_seq_len,
                   int64_t key_tile, int64_t overhead_keys) {
  auto cost = [&](int64_t splits) {
    const int64_t keys =
        CeilDiv(CeilDiv(std::max<int64_t>(max_seq_len, 1), splits), key_tile) * key_tile;
    return CeilDiv(units * splits, slots) * (keys + overhead_keys);
  };
  int64_t best = 1, best_cost = cost(1);
  for (int64_t splits = 2; splits <= cap && units * splits <= max_ctas; ++splits) {
    const int64_t c = cost(splits);
    if (c < best_cost) {
      best = splits;
      best_cost = c;
    }
  }
  return best;
}

}  // namespace

PagedAttentionPlan PlanPagedAttention(int64_t num_seqs, int64_t max_query_len, int64_t max_seq_len,
                                      int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
                                      bool tensor_core_layout, int64_t sm_count,
                                      int64_t decode_ctas_per_sm) {
  PagedAttentionPlan plan;
  sm_count = std::max<int64_t>(sm_count, 1);
  if (!tensor_core_layout || TensorCoreHeadDimIndex(head_dim) < 0) {
    plan.kernel = AttentionKernel::kSimple;
    plan.ctas = sm_count * kAttentionBlocksPerSm;
    return plan;
  }
  const int64_t group = num_q_heads / num_kv_heads;
  const int64_t vectors = max_query_len * group;
  if (max_query_len == 1 || vectors <= kDecodeMaxVectors) {
    plan.kernel = AttentionKernel::kDecode;
    plan.query_tiles = CeilDiv(vectors, kDecodeRows);
    const int64_t units = num_seqs * num_kv_heads * plan.query_tiles;
    const int64_t slots = sm_count * std::max<int64_t>(decode_ctas_per_sm, 1);
    const int64_t cap =
        std::min(kMaxSplits, CeilDiv(std::max<int64_t>(max_seq_len, 1), kMinSplitKeys));
    const int64_t best = BestSplits(units, slots, std::min(2 * slots, kMaxSplitCtas), cap,
                                    max_seq_len, kDecodeKeys, kSplitOverheadKeys);
    plan.splits = best;
    plan.ctas = units * best;
    plan.workspace_floats = best > 1 ? plan.ctas * SlotFloats(head_dim) : 0;
    return plan;
  }
  plan.kernel = AttentionKernel::kPrefill;
  plan.query_tiles = CeilDiv(vectors, PrefillRows(head_dim));
  const int64_t units = plan.query_tiles * num_seqs * num_kv_heads;
  // Splitting the keys pays only while the tiles leave prefill CTA slots idle (a short chunk after
  // a long prefix: 512 rows x 4 KV heads are 128 CTAs for 264 slots on an H200). Each split writes
  // its 16-vector sub-tiles' partials in the decode layout (MergeSplitsKernel combines them), at
  // most kMaxSplitCtas of them (PagedAttentionWorkspaceFloats).
  const int64_t slots = sm_count * kPrefillCtasPerSm;
  const int64_t sub_tiles = units * (PrefillRows(head_dim) / kDecodeRows);
  const int64_t cap = std::min({kMaxSplits, kMaxSplitCtas / std::max<int64_t>(sub_tiles, 1),
                                CeilDiv(std::max<int64_t>(max_seq_len, 0), kMinPrefillSplitKeys)});
  const int64_t best = BestSplits(units, slots, 2 * slots, cap, max_seq_len, kPrefillSplitKeyTile,
                                  kPrefillSplitOverheadKeys);
  plan.splits = best;
  plan.ctas = units * best;
  plan.workspace_floats = best > 1 ? sub_tiles * best * SlotFloats(head_dim) : 0;
  return plan;
}

absl::Status PagedAttention(const PagedAttentionArgs<BFloat16>& a, cudaStream_t stream) {
  if (a.head_dim < 1 || a.head_dim > kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: head_dim ", a.head_dim,
                                                   " outside [1, ", kMaxAttentionHeadDim, "]"));
  }
  if (a.num_kv_heads < 1 || a.num_q_heads < 1 || a.num_q_heads % a.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", a.num_q_heads,
                                                   " query heads are not a positive multiple of ",
                                                   a.num_kv_heads, " kv heads"));
  }
  if (a.block_size < 1 || a.block_size > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttention: block_size ", a.block_size, " outside [1, 2^31)"));
  }
  if (a.num_seqs < 0 || a.max_query_len < 0 || a.max_seq_len < 0 || a.workspace_floats < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedAttention: negative num_seqs ", a.num_seqs, ", max_query_len ", a.max_query_len,
        ", max_seq_len ", a.max_seq_len, " or workspace_floats ", a.workspace_floats));
  }
  const int64_t group = a.num_q_heads / a.num_kv_heads;
  if (a.num_seqs > INT_MAX / 2 || a.max_seq_len > INT_MAX / 2 ||
      a.max_query_len * group > INT_MAX / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttention: ", a.num_seqs, " sequences, max_seq_len ", a.max_seq_len,
                     " or max_query_len ", a.max_query_len, " x ", group,
                     " heads per KV head exceed 32-bit indexing"));
  }
  if (a.num_seqs == 0 || a.max_query_len == 0) return absl::OkStatus();
  DeviceLaunchInfo info;
  if (absl::Status s = GetDeviceLaunchInfo(&info); !s.ok()) return s;
  const bool aligned = Aligned16(a.q) && Aligned16(a.out) && Aligned16(a.k_cache) &&
                       Aligned16(a.v_cache) && a.q_stride % 8 == 0 && a.out_stride % 8 == 0 &&
                       a.strides.block_stride % 8 == 0 && a.strides.token_stride % 8 == 0 &&
                       a.strides.head_stride % 8 == 0;
  const PagedAttentionPlan plan = PlanPagedAttention(
      a.num_seqs, a.max_query_len, a.max_seq_len, a.num_q_heads, a.num_kv_heads, a.head_dim,
      aligned, info.sms, info.decode_ctas_per_sm[std::max(TensorCoreHeadDimIndex(a.head_dim), 0)]);
  if (plan.workspace_floats > a.workspace_floats ||
      (plan.workspace_floats > 0 && a.workspace == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttention: workspace of ", a.workspace_floats, " floats",
                     a.workspace == nullptr ? " (null)" : "", "; this launch (", a.num_seqs,
                     " sequences, ", plan.splits, " KV splits) needs ", plan.workspace_floats,
                     " (size it with PagedAttentionWorkspaceFloats)"));
  }
  if (plan.ctas > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedAttention: ", plan.ctas, " thread blocks exceed the grid limit"));
  }
  auto* q16 = reinterpret_cast<const __nv_bfloat16*>(a.q);
  auto* k16 = reinterpret_cast<const __nv_bfloat16*>(a.k_cache);
  auto* v16 = reinterpret_cast<const __nv_bfloat16*>(a.v_cache);
  auto* out16 = reinterpret_cast<__nv_bfloat16*>(a.out);
  if (plan.kernel == AttentionKernel::kSimple) {
    PagedAttentionKernel<__nv_bfloat16>
        <<<static_cast<unsigned>(plan.ctas), kAttentionWarps * 32, 0, stream>>>(
            q16, a.q_stride, k16, v16, a.strides, a.block_size, a.block_tables,
            a.block_table_stride, a.seq_lens, a.query_start_loc, a.num_seqs, a.num_q_heads,
            a.num_kv_heads, a.head_dim, a.scale, out16, a.out_stride);
    return internal::LaunchStatus("PagedAttentionKernel<bf16>");
  }
  TcParams params;
  params.q = q16;
  params.q_stride = a.q_stride;
  params.k_cache = k16;
  params.v_cache = v16;
  params.strides = a.strides;
  params.block_size = static_cast<int>(a.block_size);
  params.block_shift = -1;
  if ((a.block_size & (a.block_size - 1)) == 0) {
    params.block_shift = 0;
    while ((int64_t{1} << params.block_shift) < a.block_size) ++params.block_shift;
  }
  params.block_tables = a.block_tables;
  params.block_table_stride = a.block_table_stride;
  params.seq_lens = a.seq_lens;
  params.query_start_loc = a.query_start_loc;
  params.num_seqs = static_cast<int>(a.num_seqs);
  params.num_kv_heads = static_cast<int>(a.num_kv_heads);
  params.group = static_cast<int>(group);
  params.query_tiles = static_cast<int>(plan.query_tiles);
  params.splits = static_cast<int>(plan.splits);
  params.scale_log2 = a.scale * 1.4426950408889634f;  // log2(e)
  params.out = out16;
  params.out_stride = a.out_stride;
  params.workspace = a.workspace;
  switch (a.head_dim) {
    case 64:
      return LaunchTc<64>(plan, params, params.num_seqs, params.num_kv_heads, stream);
    case 128:
      return LaunchTc<128>(plan, params, params.num_seqs, params.num_kv_heads, stream);
    default:  // 256: PlanPagedAttention routes no other head_dim to the tensor-core kernels
      return LaunchTc<256>(plan, params, params.num_seqs, params.num_kv_heads, stream);
  }
}

}  // namespace vamp::kernels::cuda
