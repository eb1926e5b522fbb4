// Grouped expert GEMM (bf16, float32 accumulation) with the expert table and row offsets in
// device memory. See grouped_gemm.h for the contract.
//
// Work distribution. The host knows only max_rows, so the grid covers an upper bound of M-tiles:
// expert e needs ceil(rows_e / BM) tiles, and sum_e ceil(rows_e / BM) <= ceil(max_rows / BM) +
// min(num_experts, max_rows) (each non-empty expert adds at most one partial tile). Tiles are
// numbered expert by expert; every CTA maps its tile number to (expert, first row) with a
// block-wide prefix sum over the per-expert tile counts read from expert_offsets (FindTile), so no
// workspace and no preparatory kernel are needed. CTAs past the last tile exit. blockIdx.x walks
// the column tiles (fastest in launch order, so the CTAs of one M-tile share its rows of `a` in
// L2), blockIdx.y the M-tiles (looping when there are more than 65535).
//
// Tensor-core path. Both operands are K-contiguous (a is [rows, k], W is [n, k]), which is the
// "row.col" form of mma.sync.m16n8k16.bf16: no transposition anywhere. Per stage the CTA stages a
// BM x 64 tile of `a` and a BN x 64 tile of W in shared memory with 16-byte cp.async (out-of-range
// rows and k-chunks are zero-filled through cp.async's src-size operand), several stages in
// flight; warps read fragments with ldmatrix.x4. Shared rows are 128 bytes (8 chunks of 16 bytes),
// chunk c of row r stored at chunk c ^ (r % 8), so the 8 row addresses of each ldmatrix phase and
// each warp's cp.async writes fall into 8 distinct 16-byte bank groups (no conflicts).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace vamp::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;
using internal::CeilDiv;

constexpr unsigned kFullMask = 0xffffffffu;

// Shared-memory staging of the tensor-core path: k per stage, and its 16-byte chunks.
constexpr int kBK = 64;
constexpr int kChunkElems = 8;  // bf16 per 16-byte chunk
constexpr int kChunksPerRow = kBK / kChunkElems;
constexpr int kRowBytes = kBK * 2;

// Plain path: tiles of 16 rows x 64 output columns, one output element per thread at a time.
constexpr int kScalarBM = 16;
constexpr int kScalarCols = 64;
constexpr int kScalarThreads = 256;

// gridDim.y limit; larger tile bounds loop inside the kernel.
constexpr int64_t kMaxGridY = 65535;

// Tile height by average rows per active expert (max_rows / min(num_experts, max_rows)): decode
// batches (a few rows per expert) are bound by reading the weights and waste tensor-core work on
// padding rows in tall tiles; prefill batches are bound by math and want the tallest tile.
constexpr int64_t kDecodeTileMaxAvgRows = 16;
constexpr int64_t kSmallTileMaxAvgRows = 32;
constexpr int64_t kMediumTileMaxAvgRows = 96;
// On Hopper every group above kSmallTileMaxAvgRows runs the wgmma kernel (WgmmaPairedTile).

// Everything a kernel needs, passed by value.
struct Problem {
  const bf16* a;
  int64_t lda;
  const bf16* const* weights;  // device table, num_experts entries
  int64_t weight_offset;
  int64_t ldw;
  const int32_t* offsets;  // device, num_experts + 1
  int num_experts;
  int tile_bound;  // M-tiles the grid walks (see the file comment)
  bf16* c;
  int64_t ldc;
  int out_cols;  // n, or inter for the fused SiLU-and-mul variant (up rows start at row inter)
  int k;
};

struct TileInfo {
  int expert;
  int row_begin;  // first row of `a` and `c` in this tile
  int rows;       // valid rows, 1..BM
};

__device__ __forceinline__ int TilesOf(int begin, int end, int bm) {
  return end > begin ? (end - begin + bm - 1) / bm : 0;
}

// Maps M-tile number `tile` to its expert and rows. Called by every thread of the block; returns
// the same value in all of them: false when `tile` is at or past the total number of tiles (then
// every later tile is too). Each thread sums the tile counts of a contiguous run of experts; a
// block-wide exclusive scan of those sums tells the one thread whose run holds `tile`, which walks
// its run and publishes the answer in shared memory.
template <int BM, int kThreads>
__device__ bool FindTile(const int32_t* offsets, int num_experts, int tile, TileInfo* out) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  __shared__ int warp_total[kThreads / 32];
  __shared__ TileInfo found;
  __shared__ int found_flag;
  if (threadIdx.x == 0) found_flag = 0;
  const int per_thread = (num_experts + kThreads - 1) / kThreads;
  const int e0 = min(num_experts, static_cast<int>(threadIdx.x) * per_thread);
  const int e1 = min(num_experts, e0 + per_thread);
  int local = 0;
  for (int e = e0; e < e1; ++e) local += TilesOf(offsets[e], offsets[e + 1], BM);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  int inclusive = local;
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += v;
  }
  if (lane == 31) warp_total[warp] = inclusive;
  __syncthreads();  // also orders found_flag = 0 before any write below
  int before = inclusive - local;
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  if (tile >= before && tile < before + local) {
    int t = tile - before;
    for (int e = e0; e < e1; ++e) {
      const int begin = offsets[e];
      const int end = offsets[e + 1];
      const int tiles = TilesOf(begin, end, BM);
      if (t < tiles) {
        found.expert = e;
        found.row_begin = begin + t * BM;
        found.rows = min(BM, end - found.row_begin);
        found_flag = 1;
        break;
      }
      t -= tiles;
    }
  }
  __syncthreads();
  const bool ok = found_flag != 0;
  if (ok) *out = found;
  __syncthreads();  // everyone has read before a later call resets found_flag
  return ok;
}

__device__ __forceinline__ float SiluMul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__device__ __forceinline__ float ScalarDot(const bf16* x, const bf16* w, int k) {
  float acc = 0.0f;
  for (int p = 0; p < k; ++p) acc = fmaf(__bfloat162float(x[p]), __bfloat162float(w[p]), acc);
  return acc;
}

// Output columns [col0, col0 + cols) of rows [row_begin, row_begin + rows) with plain loads and
// one float32 dot product per element (per pair of them when fused). The generic path, and the
// tensor-core kernel's fallback for an expert whose weights are not 16-byte aligned.
template <bool kSiluMul>
__device__ void ScalarTile(const Problem& p, const bf16* w, int row_begin, int rows, int col0,
                           int cols) {
  // Row index fastest: neighbouring threads read the same weight row (broadcast).
  for (int idx = threadIdx.x; idx < rows * cols; idx += blockDim.x) {
    const int r = idx % rows;
    const int j = col0 + idx / rows;
    const bf16* x = p.a + static_cast<int64_t>(row_begin + r) * p.lda;
    float out = ScalarDot(x, w + static_cast<int64_t>(j) * p.ldw, p.k);
    if constexpr (kSiluMul) {
      out = SiluMul(out, ScalarDot(x, w + static_cast<int64_t>(p.out_cols + j) * p.ldw, p.k));
    }
    p.c[static_cast<int64_t>(row_begin + r) * p.ldc + j] = __float2bfloat16_rn(out);
  }
}

template <bool kSiluMul>
__global__ void __launch_bounds__(kScalarThreads) GroupedGemmScalarKernel(Problem p) {
  const int col0 = blockIdx.x * kScalarCols;
  const int cols = min(kScalarCols, p.out_cols - col0);
  for (int tile = blockIdx.y; tile < p.tile_bound; tile += gridDim.y) {
    TileInfo info;
    if (!FindTile<kScalarBM, kScalarThreads>(p.offsets, p.num_experts, tile, &info)) break;
    const bf16* w = p.weights[info.expert];
    if (w == nullptr) continue;  // documented: skipped, cannot be reported
    ScalarTile<kSiluMul>(p, w + p.weight_offset, info.row_begin, info.rows, col0, cols);
  }
}

// ---- tensor-core primitives (kernels/cuda/mma.cuh) ----

using internal::CpAsync16;
using internal::CpAsyncCommit;
using internal::CpAsyncWait;
using internal::LdMatrixX4;

// PTX ISA "Matrix Fragments for mma.m16n8k16 with floating point type" (.bf16 inputs, .f32
// accumulators); g = lane / 4, t = lane % 4:
//   A (16 x 16, row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
//                           a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9];
//   B (16 x 8, "col": B[kk][nn] = W[nn][kk]): b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g];
//   C/D (16 x 8 float): d[0..1] = C[g][2t..2t+1], d[2..3] = C[g+8][2t..2t+1].
// So ldmatrix of the four 8x8 quarters of a 16x16 A tile (rows 0-7 / 8-15 x k 0-7 / 8-15, in the
// order top-left, bottom-left, top-right, bottom-right) yields a[0..3] exactly, and ldmatrix of a
// 16 (n) x 16 (k) block of W (quarters n 0-7 k 0-7, n 0-7 k 8-15, n 8-15 k 0-7, n 8-15 k 8-15)
// yields {b0, b1} of the n-fragment 0-7 then of 8-15.

__device__ __forceinline__ void Store2(bf16* dst, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
}

// Shared byte offset of 16-byte chunk `chunk` of row `row` (the XOR swizzle of the file comment).
__device__ __forceinline__ uint32_t Swizzle(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// A tile shape: BM rows x BN weight rows (columns of c) per CTA, warps arranged kWarpsM x kWarpsN,
// kStages cp.async stages.
template <int kBM, int kBN, int kWarpsMArg, int kWarpsNArg, int kStagesArg, int kMinBlocksArg>
struct TcTile {
  static constexpr int BM = kBM;
  static constexpr int BN = kBN;
  static constexpr int kWarpsM = kWarpsMArg;
  static constexpr int kWarpsN = kWarpsNArg;
  static constexpr int kStages = kStagesArg;
  static constexpr int kMinBlocks = kMinBlocksArg;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWarpM = BM / kWarpsM;  // rows per warp
  static constexpr int kWarpN = BN / kWarpsN;  // weight rows per warp
  static constexpr int kFragsM = kWarpM / 16;
  static constexpr int kFragsN = kWarpN / 8;
  // Loader: thread t copies chunk t % 8 of rows t / 8 + i * kRowsPerPass.
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kAPasses = BM / kRowsPerPass;
  static constexpr int kBPasses = BN / kRowsPerPass;
  static constexpr int kSmemBytes = kStages * (BM + BN) * kRowBytes;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "whole m16 fragments, n8 fragment pairs");
  // The fused epilogue pairs gate n-fragment j with up n-fragment j + kFragsN / 2.
  static_assert(kFragsN % 2 == 0 && (kWarpN / 2) % 8 == 0, "gate/up halves of whole fragments");
  // Every pass starts at a multiple of 8 rows, so a thread's swizzle (row % 8) never changes.
  static_assert(kRowsPerPass % 8 == 0, "swizzle constant per thread");
  static_assert(BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0, "whole loader passes");
  static_assert(kStages >= 2, "pipeline");
};

// The cp.async loads of one CTA's tiles, k-tile by k-tile: A is kPasses(A) x kRowsPerPass rows of
// the expert's activations, B the same of its weight rows for this CTA's columns; each thread
// copies chunk `chunk` of rows load_row + i * kRowsPerPass. Rows past the expert's (A) or past
// out_cols (B) are zero-filled, their pointers only kept valid. Fused w13 (kSiluMul): each
// kPairRows-row block of B holds kPairRows / 2 gate rows j, then the up rows inter + j of the same
// j, so one warp's (mma.sync: a warp column group) or one warpgroup's (wgmma: a 128-row block)
// accumulators hold both halves of its outputs.
template <class Tile, bool kSiluMul, int kPairRows>
struct StageLoader {
  const bf16* a_src[Tile::kAPasses];
  bool a_ok[Tile::kAPasses];
  const bf16* b_src[Tile::kBPasses];
  bool b_ok[Tile::kBPasses];

  __device__ __forceinline__ StageLoader(const Problem& p, const bf16* w, const TileInfo& info,
                                         int col0, int load_row, int chunk) {
#pragma unroll
    for (int i = 0; i < Tile::kAPasses; ++i) {
      const int r = load_row + i * Tile::kRowsPerPass;
      a_ok[i] = r < info.rows;
      a_src[i] = p.a + static_cast<int64_t>(info.row_begin + (a_ok[i] ? r : 0)) * p.lda +
                 chunk * kChunkElems;
    }
#pragma unroll
    for (int i = 0; i < Tile::kBPasses; ++i) {
      const int r = load_row + i * Tile::kRowsPerPass;
      int w_row;
      if constexpr (kSiluMul) {
        constexpr int kHalf = kPairRows / 2;
        const int q = r % kPairRows;
        const int j = col0 + (r / kPairRows) * kHalf + q % kHalf;
        b_ok[i] = j < p.out_cols;
        w_row = q < kHalf ? j : p.out_cols + j;
      } else {
        w_row = col0 + r;
        b_ok[i] = w_row < p.out_cols;
      }
      b_src[i] = w + static_cast<int64_t>(b_ok[i] ? w_row : 0) * p.ldw + chunk * kChunkElems;
    }
  }

  // Starts the copies of k-tile kt into `stage` of the A and B stage arrays (the thread's swizzled
  // chunk at load_offset of each row); `w` and p.a stand in as the never-read source of zeros.
  __device__ __forceinline__ void Load(const Problem& p, const bf16* w, uint32_t a_smem,
                                       uint32_t b_smem, uint32_t load_offset, int chunk, int stage,
                                       int kt) const {
    const bool k_ok = kt * kBK + chunk * kChunkElems < p.k;
    const uint32_t a_dst = a_smem + stage * Tile::BM * kRowBytes + load_offset;
    const uint32_t b_dst = b_smem + stage * Tile::BN * kRowBytes + load_offset;
#pragma unroll
    for (int i = 0; i < Tile::kAPasses; ++i) {
      const bool ok = a_ok[i] && k_ok;
      CpAsync16(a_dst + i * Tile::kRowsPerPass * kRowBytes, ok ? a_src[i] + kt * kBK : p.a,
                ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < Tile::kBPasses; ++i) {
      const bool ok = b_ok[i] && k_ok;
      CpAsync16(b_dst + i * Tile::kRowsPerPass * kRowBytes, ok ? b_src[i] + kt * kBK : w,
                ok ? 16 : 0);
    }
  }
};

// Decode at up to one m16 fragment of rows per expert on average (up to 256 tokens on
// Qwen3-30B-A3B: 2,048 rows over 128 experts): 16 x 64 tiles make twice the CTAs of SmallTile's
// 32 x 128 per expert (192 for a batch-1 w13 GEMM, where SmallTile's 96 leave a third of an H200's
// SMs idle), and three CTAs per SM keep 15 weight stages (120 KiB) in flight. Same k order per
// element as every other tile (bit-identical rows). Measured against SmallTile on the whole step:
// bench/results/2026-12-04-small-batch-decode/.
using DecodeTile = TcTile<16, 64, 1, 4, 6, 3>;
// Decode: few rows per expert; two CTAs per SM keep ~8 weight stages (128 KiB) in flight.
using SmallTile = TcTile<32, 128, 1, 4, 5, 2>;
// Mid-size batches.
using MediumTile = TcTile<64, 128, 2, 2, 4, 2>;
// Prefill: 128 x 128 tiles, 8 warps of 64 x 32.
using LargeTile = TcTile<128, 128, 2, 4, 4, 1>;

template <class Tile, bool kSiluMul>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    GroupedGemmTensorCoreKernel(Problem p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int BM = Tile::BM;
  constexpr int BN = Tile::BN;
  constexpr int kStages = Tile::kStages;
  constexpr int kWarpM = Tile::kWarpM;
  constexpr int kWarpN = Tile::kWarpN;
  constexpr int kFragsM = Tile::kFragsM;
  constexpr int kFragsN = Tile::kFragsN;
  // Output columns per CTA: fused, half of the BN weight rows are gate rows, half up rows.
  constexpr int kOutCols = kSiluMul ? BN / 2 : BN;

  const uint32_t a_smem = internal::SharedAddress(smem);
  const uint32_t b_smem = a_smem + kStages * BM * kRowBytes;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warp_m = warp / Tile::kWarpsN;
  const int warp_n = warp % Tile::kWarpsN;
  const int chunk = threadIdx.x % kChunksPerRow;
  const int load_row = threadIdx.x / kChunksPerRow;
  const uint32_t load_offset = Swizzle(load_row, chunk);
  const int k_tiles = (p.k + kBK - 1) / kBK;
  const int col0 = blockIdx.x * kOutCols;

  for (int tile = blockIdx.y; tile < p.tile_bound; tile += gridDim.y) {
    TileInfo info;
    if (!FindTile<BM, Tile::kThreads>(p.offsets, p.num_experts, tile, &info)) break;
    const bf16* w = p.weights[info.expert];
    if (w == nullptr) continue;  // documented: skipped, cannot be reported
    w += p.weight_offset;
    if ((reinterpret_cast<uintptr_t>(w) & 15) != 0) {
      ScalarTile<kSiluMul>(p, w, info.row_begin, info.rows, col0, min(kOutCols, p.out_cols - col0));
      continue;
    }

    // Warp column group r / kWarpN holds gate rows in its first half and the up rows of the same
    // columns in its second half.
    const StageLoader<Tile, kSiluMul, kWarpN> loader(p, w, info, col0, load_row, chunk);
    auto load_stage = [&](int stage, int kt) {
      loader.Load(p, w, a_smem, b_smem, load_offset, chunk, stage, kt);
    };

    float acc[kFragsM][kFragsN][4];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;

    // Warps (and m16 fragments) wholly below the tile's valid rows skip their math; the
    // condition is uniform per warp, as ldmatrix and mma.sync require.
    const bool warp_active = warp_m * kWarpM < info.rows;

    // Pipeline: stages 0..kStages-2 in flight up front; at step kt, tile kt is waited for, the
    // CTA syncs (which also retires the reads of stage (kt - 1) % kStages), tile kt + kStages - 1
    // is issued into that stage, then tile kt is multiplied. One commit group per step, empty at
    // the tail, so "at most kStages - 2 pending" always means "tile kt has landed".
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      CpAsyncCommit();
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
      CpAsyncWait<kStages - 2>();
      __syncthreads();
      const int next = kt + kStages - 1;
      if (next < k_tiles) load_stage(next % kStages, next);
      CpAsyncCommit();
      if (!warp_active) continue;
      const int stage = kt % kStages;
      const uint32_t a_stage = a_smem + stage * BM * kRowBytes;
      const uint32_t b_stage = b_smem + stage * BN * kRowBytes;
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        uint32_t af[kFragsM][4];
#pragma unroll
        for (int i = 0; i < kFragsM; ++i) {
          if (warp_m * kWarpM + i * 16 < info.rows) {
            // Quarter lane / 8: rows +8 for quarters 1 and 3, k chunk +1 for quarters 2 and 3.
            const int r = warp_m * kWarpM + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            LdMatrixX4(af[i], a_stage + Swizzle(r, ks * 2 + (lane >> 4)));
          }
        }
        uint32_t bf[kFragsN][2];
#pragma unroll
        for (int j = 0; j < kFragsN / 2; ++j) {
          // Quarter lane / 8: k chunk +1 for quarters 1 and 3, n rows +8 for quarters 2 and 3.
          const int r = warp_n * kWarpN + j * 16 + (lane & 7) + (lane >> 4) * 8;
          uint32_t q[4];
          LdMatrixX4(q, b_stage + Swizzle(r, ks * 2 + ((lane >> 3) & 1)));
          bf[2 * j][0] = q[0];
          bf[2 * j][1] = q[1];
          bf[2 * j + 1][0] = q[2];
          bf[2 * j + 1][1] = q[3];
        }
#pragma unroll
        for (int i = 0; i < kFragsM; ++i) {
          if (warp_m * kWarpM + i * 16 < info.rows) {
#pragma unroll
            for (int j = 0; j < kFragsN; ++j)
              internal::MmaBf16(acc[i][j], af[i], bf[j][0], bf[j][1]);
          }
        }
      }
    }
    CpAsyncWait<0>();  // only empty groups remain; leaves nothing pending into the next tile

    // Epilogue straight from the accumulators (layout of Mma's comment): one bf16 pair per
    // fragment row; rows past the expert's and columns past n (inter) are not written.
    const int g = lane >> 2;
    const int t2 = (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = warp_m * kWarpM + i * 16 + h * 8 + g;
        if (r >= info.rows) continue;
        bf16* c_row = p.c + static_cast<int64_t>(info.row_begin + r) * p.ldc;
        if constexpr (kSiluMul) {
#pragma unroll
          for (int j = 0; j < kFragsN / 2; ++j) {
            const int col = col0 + warp_n * (kWarpN / 2) + j * 8 + t2;
            if (col < p.out_cols) {
              Store2(c_row + col, SiluMul(acc[i][j][2 * h], acc[i][j + kFragsN / 2][2 * h]),
                     SiluMul(acc[i][j][2 * h + 1], acc[i][j + kFragsN / 2][2 * h + 1]));
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < kFragsN; ++j) {
            const int col = col0 + warp_n * kWarpN + j * 8 + t2;
            if (col < p.out_cols) Store2(c_row + col, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
          }
        }
      }
    }
    __syncthreads();  // the next tile's prologue overwrites stages still being read
  }
}

// ---- Hopper path: warpgroup MMA (wgmma) on the same swizzled shared-memory stages ----
//
// The cp.async loader and the 128-byte XOR swizzle above are exactly the layout wgmma's 128-byte
// swizzle mode reads (wgmma.cuh), so the stages stay as they are and the warps no longer load
// fragments: each warpgroup (4 warps) issues m64n128k16 MMAs whose A and B operands are read from
// shared memory by descriptor, keeping 64 float32 accumulators per thread per 128 columns. A
// CTA of kWgM x kWgN warpgroups covers BM = 64 kWgM rows and BN = 128 kNPerWg kWgN weight rows;
// every thread loads, so no warps idle while waiting for data. Stages are aligned to 1,024 bytes
// (the swizzle atom).
//
// Per output element the k order is the same as the mma.sync path's (k16 slices in order, each
// accumulated into the float32 sum), which the batch-invariance test checks bit for bit.
template <int kWgMArg, int kWgNArg, int kNPerWgArg, int kStagesArg, int kMinBlocksArg>
struct WgmmaTile {
  static constexpr int kWgM = kWgMArg;
  static constexpr int kWgN = kWgNArg;
  static constexpr int kNPerWg = kNPerWgArg;  // 128-column accumulator blocks per warpgroup
  static constexpr int kStages = kStagesArg;
  static constexpr int kMinBlocks = kMinBlocksArg;
  static constexpr int BM = 64 * kWgM;
  static constexpr int BN = 128 * kNPerWg * kWgN;
  static constexpr int kThreads = 128 * kWgM * kWgN;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kAPasses = BM / kRowsPerPass;
  static constexpr int kBPasses = BN / kRowsPerPass;
  static constexpr int kStageBytes = (BM + BN) * kRowBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment slack
  static_assert(kRowsPerPass % 8 == 0 && BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0,
                "whole loader passes with a constant swizzle per thread");
  static_assert((BM * kRowBytes) % 1024 == 0 && (BN * kRowBytes) % 1024 == 0, "aligned stages");
  static_assert(kStages >= 2, "pipeline");
};

// 128 x 128 tiles of two warpgroups stacked in M, 3 stages (97 KiB), two CTAs per SM, so one
// CTA's pipeline fill and epilogue overlap the other's MMAs. Measured on an H200 against 64 x 256
// and 128 x 256 tiles with one CTA per SM (4 stages, with and without one k-tile of MMAs kept in
// flight across the barrier) and against the mma.sync tiles: fastest at every size above 32
// rows per expert (bench/results/2026-12-04-wgmma-grouped-gemm/).
using WgmmaPairedTile = WgmmaTile<2, 1, 1, 3, 2>;

template <class Tile, bool kSiluMul>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    GroupedGemmWgmmaKernel(Problem p) {
  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  constexpr int BM = Tile::BM;
  constexpr int BN = Tile::BN;
  constexpr int kStages = Tile::kStages;
  constexpr int kNPerWg = Tile::kNPerWg;
  // Fused: each 128-row block of W holds 64 gate rows then the 64 up rows of the same columns.
  constexpr int kOutCols = kSiluMul ? BN / 2 : BN;

  const uint32_t base = (internal::SharedAddress(wgmma_smem) + 1023u) & ~1023u;
  const uint32_t a_smem = base;
  const uint32_t b_smem = base + kStages * BM * kRowBytes;
  const int wg = threadIdx.x / 128;
  const int wg_m = wg / Tile::kWgN;
  const int wg_n = wg % Tile::kWgN;
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = (threadIdx.x % 128) / 32;
  const int chunk = threadIdx.x % kChunksPerRow;
  const int load_row = threadIdx.x / kChunksPerRow;
  const uint32_t load_offset = Swizzle(load_row, chunk);
  const int k_tiles = (p.k + kBK - 1) / kBK;
  const int col0 = blockIdx.x * kOutCols;

  for (int tile = blockIdx.y; tile < p.tile_bound; tile += gridDim.y) {
    TileInfo info;
    if (!FindTile<BM, Tile::kThreads>(p.offsets, p.num_experts, tile, &info)) break;
    const bf16* w = p.weights[info.expert];
    if (w == nullptr) continue;  // documented: skipped, cannot be reported
    w += p.weight_offset;
    if ((reinterpret_cast<uintptr_t>(w) & 15) != 0) {
      ScalarTile<kSiluMul>(p, w, info.row_begin, info.rows, col0, min(kOutCols, p.out_cols - col0));
      continue;
    }

    const StageLoader<Tile, kSiluMul, 128> loader(p, w, info, col0, load_row, chunk);
    auto load_stage = [&](int stage, int kt) {
      loader.Load(p, w, a_smem, b_smem, load_offset, chunk, stage, kt);
    };

    float acc[kNPerWg][64];
#pragma unroll
    for (int h = 0; h < kNPerWg; ++h)
#pragma unroll
      for (int v = 0; v < 64; ++v) acc[h][v] = 0.0f;

    // A warpgroup wholly below the tile's valid rows skips its MMAs (uniform per warpgroup, as
    // wgmma requires); every thread still loads and reaches every barrier.
    const bool wg_active = wg_m * 64 < info.rows;

    // Pipeline: kStages - 1 k-tiles in flight up front. At step kt, tile kt is waited for and
    // published (fence, barrier); tile kt + kStages - 1 goes into stage (kt - 1) % kStages, whose
    // readers (the MMAs of k-tile kt - 1) every warpgroup waited for before this barrier; then
    // kt's MMAs are issued and waited for.
    constexpr int kAhead = kStages - 1;
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < k_tiles) load_stage(s, s);
      CpAsyncCommit();
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
      CpAsyncWait<kAhead - 1>();
      internal::FenceProxyAsyncShared();
      __syncthreads();  // tile kt visible to the async proxy
      const int next = kt + kAhead;
      if (next < k_tiles) load_stage(next % kStages, next);
      CpAsyncCommit();
      if (!wg_active) continue;
      const int stage = kt % kStages;
      const uint32_t a_stage = a_smem + stage * BM * kRowBytes + wg_m * 64 * kRowBytes;
      const uint32_t b_stage = b_smem + stage * BN * kRowBytes + wg_n * kNPerWg * 128 * kRowBytes;
      internal::WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        const uint64_t desc_a = internal::SwizzledKMajorDescriptor(a_stage + ks * 32);
#pragma unroll
        for (int h = 0; h < kNPerWg; ++h) {
          internal::WgmmaM64N128K16Bf16(
              acc[h], desc_a,
              internal::SwizzledKMajorDescriptor(b_stage + h * 128 * kRowBytes + ks * 32));
        }
      }
      internal::WgmmaCommit();
      internal::WgmmaWait<0>();
    }
    CpAsyncWait<0>();

    // Epilogue from the accumulators (wgmma.cuh's layout): rows past the expert's and columns
    // past n (inter) are not written.
    if (wg_active) {
      const int g = lane >> 2;
      const int t2 = (lane & 3) * 2;
#pragma unroll
      for (int h = 0; h < kNPerWg; ++h) {
        const int block_col = (wg_n * kNPerWg + h) * 128;  // first weight row of this block
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = wg_m * 64 + warp_in_wg * 16 + half * 8 + g;
          if (r >= info.rows) continue;
          bf16* c_row = p.c + static_cast<int64_t>(info.row_begin + r) * p.ldc;
          if constexpr (kSiluMul) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const int col = col0 + block_col / 2 + j * 8 + t2;
              if (col < p.out_cols) {
                Store2(c_row + col,
                       SiluMul(acc[h][4 * j + 2 * half], acc[h][4 * (j + 8) + 2 * half]),
                       SiluMul(acc[h][4 * j + 2 * half + 1], acc[h][4 * (j + 8) + 2 * half + 1]));
              }
            }
          } else {
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              const int col = col0 + block_col + j * 8 + t2;
              if (col < p.out_cols) {
                Store2(c_row + col, acc[h][4 * j + 2 * half], acc[h][4 * j + 2 * half + 1]);
              }
            }
          }
        }
      }
    }
    __syncthreads();  // the next tile's prologue overwrites stages still being read
  }
}

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

bool Aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Upper bound on the M-tiles of height bm over all experts (see the file comment).
int64_t TileBound(int64_t max_rows, int64_t num_experts, int bm) {
  return CeilDiv(max_rows, bm) + std::min(num_experts, max_rows);
}

// Launches `kernel` (GroupedGemmTensorCoreKernel or GroupedGemmWgmmaKernel of Tile) over the
// output columns (grid x) and Tile::BM-row tiles (grid y, strided past kMaxGridY).
template <class Tile, bool kSiluMul>
absl::Status LaunchTiled(void (*kernel)(Problem), const char* name, Problem p, int64_t max_rows,
                         int64_t num_experts, cudaStream_t stream) {
  constexpr int kOutCols = kSiluMul ? Tile::BN / 2 : Tile::BN;
  p.tile_bound = static_cast<int>(TileBound(max_rows, num_experts, Tile::BM));
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.out_cols, kOutCols)),
                  static_cast<unsigned>(std::min<int64_t>(p.tile_bound, kMaxGridY)));
  // Cheap host call; repeated per launch because the attribute is per device and per process.
  if (absl::Status s = internal::CudaStatus(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               Tile::kSmemBytes),
          absl::StrCat("cudaFuncSetAttribute(", name, ")").c_str());
      !s.ok()) {
    return s;
  }
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(p);
  return internal::LaunchStatus(name);
}

template <class Tile, bool kSiluMul>
absl::Status LaunchTensorCore(Problem p, int64_t max_rows, int64_t num_experts,
                              cudaStream_t stream) {
  return LaunchTiled<Tile, kSiluMul>(&GroupedGemmTensorCoreKernel<Tile, kSiluMul>,
                                     "GroupedGemmTensorCoreKernel", p, max_rows, num_experts,
                                     stream);
}

template <class Tile, bool kSiluMul>
absl::Status LaunchWgmma(Problem p, int64_t max_rows, int64_t num_experts, cudaStream_t stream) {
  return LaunchTiled<Tile, kSiluMul>(&GroupedGemmWgmmaKernel<Tile, kSiluMul>,
                                     "GroupedGemmWgmmaKernel", p, max_rows, num_experts, stream);
}

// SetGroupedGemmMmaSyncOnly's and SetGroupedGemmDecodeTile's settings.
std::atomic<bool> mma_sync_only{false};
std::atomic<bool> decode_tile{true};

template <bool kSiluMul>
absl::Status Launch(const char* name, const BFloat16* a, int64_t lda,
                    const BFloat16* const* expert_weights, int64_t weight_offset, int64_t ldw,
                    const int32_t* expert_offsets, int64_t num_experts, int64_t max_rows,
                    BFloat16* c, int64_t ldc, int64_t out_cols, int64_t k, cudaStream_t stream) {
  if (absl::Status s = cpu::CheckGroupedGemmShape(name, lda, weight_offset, ldw, num_experts,
                                                  max_rows, ldc, out_cols, k);
      !s.ok()) {
    return s;
  }
  // Row offsets are int32 on the device; weight rows (2 * inter when fused) index as int.
  const int64_t weight_rows = kSiluMul ? 2 * out_cols : out_cols;
  if (!FitsInt(num_experts) || !FitsInt(max_rows) || !FitsInt(weight_rows) || !FitsInt(k) ||
      !FitsInt(TileBound(max_rows, num_experts, kScalarBM))) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": sizes beyond int32 (num_experts ",
                                                   num_experts, ", max_rows ", max_rows,
                                                   ", weight rows ", weight_rows, ", k ", k, ")"));
  }
  if (num_experts == 0 || max_rows == 0 || out_cols == 0) return absl::OkStatus();
  if (a == nullptr || c == nullptr || expert_weights == nullptr || expert_offsets == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": null a, c, expert_weights or expert_offsets"));
  }
  Problem p;
  p.a = reinterpret_cast<const bf16*>(a);
  p.lda = lda;
  p.weights = reinterpret_cast<const bf16* const*>(expert_weights);
  p.weight_offset = weight_offset;
  p.ldw = ldw;
  p.offsets = expert_offsets;
  p.num_experts = static_cast<int>(num_experts);
  p.tile_bound = 0;
  p.c = reinterpret_cast<bf16*>(c);
  p.ldc = ldc;
  p.out_cols = static_cast<int>(out_cols);
  p.k = static_cast<int>(k);

  // cp.async moves 16-byte chunks (8 elements) of `a` and W; the epilogue stores bf16 pairs.
  const bool tensor_cores = k % kChunkElems == 0 && out_cols % kChunkElems == 0 &&
                            lda % kChunkElems == 0 && ldw % kChunkElems == 0 &&
                            weight_offset % kChunkElems == 0 && ldc % 2 == 0 && Aligned(a, 16) &&
                            Aligned(c, 4);
  if (!tensor_cores) {
    p.tile_bound = static_cast<int>(TileBound(max_rows, num_experts, kScalarBM));
    const dim3 grid(static_cast<unsigned>(CeilDiv(out_cols, kScalarCols)),
                    static_cast<unsigned>(std::min<int64_t>(p.tile_bound, kMaxGridY)));
    GroupedGemmScalarKernel<kSiluMul><<<grid, kScalarThreads, 0, stream>>>(p);
    return internal::LaunchStatus("GroupedGemmScalarKernel");
  }
  const int64_t avg_rows = CeilDiv(max_rows, std::min(num_experts, max_rows));
  if (avg_rows <= kDecodeTileMaxAvgRows && decode_tile.load(std::memory_order_relaxed)) {
    return LaunchTensorCore<DecodeTile, kSiluMul>(p, max_rows, num_experts, stream);
  }
  if (avg_rows <= kSmallTileMaxAvgRows) {
    return LaunchTensorCore<SmallTile, kSiluMul>(p, max_rows, num_experts, stream);
  }
  if (!mma_sync_only.load(std::memory_order_relaxed) && internal::WgmmaAvailable()) {
    return LaunchWgmma<WgmmaPairedTile, kSiluMul>(p, max_rows, num_experts, stream);
  }
  if (avg_rows <= kMediumTileMaxAvgRows) {
    return LaunchTensorCore<MediumTile, kSiluMul>(p, max_rows, num_experts, stream);
  }
  return LaunchTensorCore<LargeTile, kSiluMul>(p, max_rows, num_experts, stream);
}

}  // namespace

void SetGroupedGemmMmaSyncOnly(bool mma_sync) {
  mma_sync_only.store(mma_sync, std::memory_order_relaxed);
}

void SetGroupedGemmDecodeTile(bool enabled) {
  decode_tile.store(enabled, std::memory_order_relaxed);
}

absl::Status GroupedExpertGemm(const BFloat16* a, int64_t lda,
                               const BFloat16* const* expert_weights, int64_t weight_offset,
                               int64_t ldw, const int32_t* expert_offsets, int64_t num_experts,
                               int64_t max_rows, BFloat16* c, int64_t ldc, int64_t n, int64_t k,
                               cudaStream_t stream) {
  return Launch<false>("GroupedExpertGemm", a, lda, expert_weights, weight_offset, ldw,
                       expert_offsets, num_experts, max_rows, c, ldc, n, k, stream);
}

absl::Status GroupedExpertGemmSiluMul(const BFloat16* a, int64_t lda,
                                      const BFloat16* const* expert_weights, int64_t weight_offset,
                                      int64_t ldw, const int32_t* expert_offsets,
                                      int64_t num_experts, int64_t max_rows, BFloat16* out,
                                      int64_t ldo, int64_t inter, int64_t k, cudaStream_t stream) {
  return Launch<true>("GroupedExpertGemmSiluMul", a, lda, expert_weights, weight_offset, ldw,
                      expert_offsets, num_experts, max_rows, out, ldo, inter, k, stream);
}

}  // namespace vamp::kernels::cuda
