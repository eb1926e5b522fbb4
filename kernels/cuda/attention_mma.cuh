// Internal to kernels/cuda/attention.cu: warp-level tensor-core building blocks of the bfloat16
// paged attention kernels (sm_80+ PTX: cp.async, ldmatrix, mma.sync m16n8k16 bf16).
//
// One warp owns 16 or 32 "query vectors" (the rows of one or two m16 MMA tiles; a vector is one
// (query row, query head) pair) and attends them to a tile of keys held in shared memory,
// FlashAttention-2 style: S = Q K^T on tensor cores, an online softmax in float32 in registers, O
// += P V on tensor cores with P converted to bfloat16. Rows of Q, K and V tiles in shared memory
// are head_dim bfloat16 elements = head_dim / 8 16-byte chunks, stored swizzled (see SwizzledChunk)
// so that ldmatrix reads them without bank conflicts.
//
// Fragment layouts relied on (PTX ISA 9.x, section 9.7.14.5.8 "Matrix Fragments for mma.m16n8k16
// with floating point type"; g = lane / 4 ("groupID"), c = lane % 4 ("threadID_in_group")):
//   A (16x16, row-major), 4 .b32 registers of 2 bf16 each (low half = lower column):
//     a[0] = (row g,   cols 2c, 2c+1)    a[1] = (row g+8, cols 2c, 2c+1)
//     a[2] = (row g,   cols 2c+8, 2c+9)  a[3] = (row g+8, cols 2c+8, 2c+9)
//   B (16x8, "col"), 2 registers:  b[0] = (rows k = 2c, 2c+1; col n = g)
//                                  b[1] = (rows k = 2c+8, 2c+9; col n = g)
//   C/D (16x8 float32): d[0], d[1] = (row g, cols 2c, 2c+1); d[2], d[3] = (row g+8, same cols).
// ldmatrix.m8n8.x4 (PTX ISA section 9.7.14.5.15 "ldmatrix"): lanes 8i..8i+7 give the addresses of
// the 8 rows (16 bytes each) of matrix i; register i of every lane receives, from matrix i, the
// two elements (row lane/4, cols 2(lane%4), 2(lane%4)+1); with .trans it receives (rows 2(lane%4),
// 2(lane%4)+1; col lane/4) instead, i.e. the matrix transposed.
// Consequences used below:
//   - a Q tile stored [vector][dim] gives A fragments with plain ldmatrix (matrix i = rows
//     8(i%2).., dims 8(i/2)..: registers a[0..3] in order);
//   - a K tile stored [key][dim] is B of S = Q K^T in "col" layout (B[k=dim][n=key] = K[key][dim]):
//     plain ldmatrix of (keys 8j.., dims 8h..) gives b[h] of key block j;
//   - a V tile stored [key][dim] is B of O = P V in row layout (B[k=key][n=dim] = V[key][dim]):
//     ldmatrix.trans of (keys 8h.., dims 8j..) gives b[h] of dim block j;
//   - the C fragments of S for key blocks 2t and 2t+1 are, after rounding to bf16, exactly the A
//     fragment of P for keys 16t..16t+15 (a[0] = S_2t{d0,d1}, a[1] = S_2t{d2,d3},
//     a[2] = S_2t+1{d0,d1}, a[3] = S_2t+1{d2,d3}).
#ifndef VAMP_KERNELS_CUDA_ATTENTION_MMA_CUH_
#define VAMP_KERNELS_CUDA_ATTENTION_MMA_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace vamp::kernels::cuda::internal {

// Position (in 16-byte chunks from the tile start) of chunk `chunk` of row `row` in a tile whose
// rows have kChunks chunks (a multiple of 8): the chunk index is XORed with row % 8, so the 8 rows
// an ldmatrix matrix reads (consecutive rows, same logical chunk) land in 8 distinct 16-byte bank
// groups of a 128-byte line.
template <int kChunks>
__device__ __forceinline__ int SwizzledChunk(int row, int chunk) {
  static_assert(kChunks % 8 == 0, "rows must be a multiple of 128 bytes");
  return row * kChunks + (chunk ^ (row & 7));
}

// Two floats rounded to bf16 (nearest even) in one register: `lo` in the low half (the lower
// column of a fragment pair).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The online-softmax step of one row of a score tile, which the four lanes of a group (same
// g = lane / 4) hold between them. row_max: this lane's max of the row's scores in the tile (log2
// domain); on return the row's max over the tile and its running max m, or 0 for a row that has
// seen no visible key yet (m stays -inf, and exp2 relative to 0 gives its all-masked scores weight
// 0 instead of exp2(-inf - -inf) = NaN): the reference its new exp2 weights are taken against. m
// becomes the running max. Returns the factor the row's earlier sum and output are scaled by.
__device__ __forceinline__ float OnlineSoftmaxMax(float& row_max, float& m) {
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
  row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
  const float m_new = fmaxf(m, row_max);
  const float m_use = m_new == -INFINITY ? 0.0f : m_new;
  const float correction = exp2f(m - m_use);
  m = m_new;
  row_max = m_use;
  return correction;
}

// The sum of x over the four lanes of this lane's group.
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The state of one warp's kRowTiles x 16 query vectors (kRowTiles m16 row tiles: rows
// 16t..16t+15 of the warp's share of the Q tile form row tile t): the output accumulators and the
// online-softmax statistics of the two rows of each row tile this lane holds (g and g+8), and the
// A fragments of Q, or where they come from. Every K and V fragment loaded from shared memory
// feeds all kRowTiles row tiles, so a warp owning more rows reads less shared memory per MMA.
// Scores are kept in the log2 domain (score * scale * log2(e)), so exp2f gives the softmax
// weights.
template <int kHeadDim, int kRowTiles = 1>
struct WarpAttention {
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static_assert(kHeadDim % 16 == 0 && kChunks % 8 == 0, "head_dim must be 64, 128 or 256");
  static_assert(kRowTiles == 1 || kRowTiles == 2, "one or two m16 row tiles per warp");
  // Q's A fragments take kRowTiles * kHeadDim / 4 registers: kept in registers up to 32 (one row
  // tile at head_dim 128, two at 64), otherwise re-read from the shared Q tile at every k-step so
  // that the accumulators (two row tiles at head_dim 128, one at 256: 128 registers) fit in the 255
  // registers of a thread without spilling.
  static constexpr bool kQInRegisters = kRowTiles * kHeadDim <= 128;

  uint32_t q[kQInRegisters ? kRowTiles * kHeadDim / 16 : 1][4];  // A fragments [tile][k-step]
  uint32_t q_row[kRowTiles];  // !kQInRegisters: shared address of this lane's ldmatrix row
  float o[kRowTiles][kHeadDim / 8][4];  // O accumulators, one per 8-dim block (unnormalised)
  float m[kRowTiles][2];  // running max of rows g, g+8 (log2 domain); -inf before any key
  float l[kRowTiles][2];  // this lane's share of the running sum of exp2(s - m)

  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) {
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[t][n][e] = 0.0f;
      }
      m[t][0] = m[t][1] = -INFINITY;
      l[t][0] = l[t][1] = 0.0f;
    }
  }

  // !kQInRegisters: shared address of the ldmatrix row this lane gives for the A fragment of row
  // tile t, k-step kk: matrix i = lane / 8 covers rows 8(i%2).. and dims 16kk + 8(i/2).. (registers
  // a[0..3] in order), as in LoadQ; the swizzle XORs with row % 8 = lane % 8 (row tiles start at
  // multiples of 16).
  __device__ __forceinline__ uint32_t QAddress(int t, int kk, int lane) const {
    return q_row[t] + 16 * ((2 * kk + (lane >> 4)) ^ (lane & 7));
  }

  // Row tiles of rows first_row..first_row + 16 kRowTiles - 1 (first_row a multiple of 16) of the
  // swizzled [rows][kHeadDim] tile q_tile, which must stay in shared memory, unchanged, while
  // Attend runs when !kQInRegisters.
  __device__ __forceinline__ void LoadQ(const __nv_bfloat16* q_tile, int first_row, int lane) {
    const uint32_t base = SharedAddress(q_tile);
    const int i = lane >> 3;  // the matrix this lane addresses
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) {
      const int row = first_row + 16 * t + (i & 1) * 8 + (lane & 7);
      if constexpr (kQInRegisters) {
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
          LdMatrixX4(q[t * (kHeadDim / 16) + kk],
                     base + 16 * SwizzledChunk<kChunks>(row, 2 * kk + (i >> 1)));
        }
      } else {
        q_row[t] = base + 16 * row * kChunks;
      }
    }
  }

  // Attends to kKeys keys: rows 0..kKeys-1 of the swizzled tiles k_tile and v_tile hold keys
  // key0, key0+1, ...; this lane's row g of row tile t sees keys < limits[t][0] and row g+8 keys
  // < limits[t][1] (the others are masked) when `mask` is set; with `mask` clear every key of the
  // tile is visible to all rows. Zero-filled rows (keys past the end) must be masked.
  template <int kKeys>
  __device__ __forceinline__ void Attend(const __nv_bfloat16* k_tile, const __nv_bfloat16* v_tile,
                                         int lane, int key0, const int (&limits)[kRowTiles][2],
                                         bool mask, float scale_log2) {
    static_assert(kKeys % 16 == 0, "keys come in m16n8k16 steps");
    const uint32_t k_base = SharedAddress(k_tile);
    const uint32_t v_base = SharedAddress(v_tile);
    const int i = lane >> 3;
    float s[kRowTiles][kKeys / 8][4];
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) {
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][j][e] = 0.0f;
      }
    }
    // S = Q K^T. One ldmatrix.x4 covers keys 16np..16np+15 x dims 16kk..16kk+15: matrices
    // (keys +0, dims +0), (keys +0, dims +8), (keys +8, dims +0), (keys +8, dims +8) =
    // b[0], b[1] of key block 2np and b[0], b[1] of key block 2np+1; both feed every row tile.
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t a[kRowTiles][4];
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) {
        if constexpr (kQInRegisters) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[t][e] = q[t * (kHeadDim / 16) + kk][e];
        } else {
          LdMatrixX4(a[t], QAddress(t, kk, lane));
        }
      }
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];
        const int key = np * 16 + (i >> 1) * 8 + (lane & 7);
        LdMatrixX4(b, k_base + 16 * SwizzledChunk<kChunks>(key, 2 * kk + (i & 1)));
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          MmaBf16(s[t][2 * np], a[t], b[0], b[1]);
          MmaBf16(s[t][2 * np + 1], a[t], b[2], b[3]);
        }
      }
    }
    // Online softmax, per row tile. Element e of key block j is key key0 + 8j + 2c + e%2 of row
    // g (e < 2) or g+8 (e >= 2).
    const int c = lane & 3;
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) {
      float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[t][j][e] * scale_log2;
          if (mask) {
            const int key = key0 + 8 * j + 2 * c + (e & 1);
            if (key >= limits[t][e >> 1]) x = -INFINITY;
          }
          s[t][j][e] = x;
          row_max[e >> 1] = fmaxf(row_max[e >> 1], x);
        }
      }
      float correction[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) correction[r] = OnlineSoftmaxMax(row_max[r], m[t][r]);
      float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[t][j][e] = exp2f(s[t][j][e] - row_max[e >> 1]);
          row_sum[e >> 1] += s[t][j][e];
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) l[t][r] = l[t][r] * correction[r] + row_sum[r];
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) {
        o[t][n][0] *= correction[0];
        o[t][n][1] *= correction[0];
        o[t][n][2] *= correction[1];
        o[t][n][3] *= correction[1];
      }
    }
    // O += P V. One ldmatrix.x4.trans covers keys 16kt..16kt+15 x dims 16dp..16dp+15: matrices
    // (keys +0, dims +0), (keys +8, dims +0), (keys +0, dims +8), (keys +8, dims +8) =
    // b[0], b[1] of dim block 2dp and b[0], b[1] of dim block 2dp+1; both feed every row tile.
#pragma unroll
    for (int kt = 0; kt < kKeys / 16; ++kt) {
      uint32_t a[kRowTiles][4];
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) {
        a[t][0] = PackBf16(s[t][2 * kt][0], s[t][2 * kt][1]);
        a[t][1] = PackBf16(s[t][2 * kt][2], s[t][2 * kt][3]);
        a[t][2] = PackBf16(s[t][2 * kt + 1][0], s[t][2 * kt + 1][1]);
        a[t][3] = PackBf16(s[t][2 * kt + 1][2], s[t][2 * kt + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t b[4];
        const int key = kt * 16 + (i & 1) * 8 + (lane & 7);
        LdMatrixX4Trans(b, v_base + 16 * SwizzledChunk<kChunks>(key, 2 * dp + (i >> 1)));
#pragma unroll
        for (int t = 0; t < kRowTiles; ++t) {
          MmaBf16(o[t][2 * dp], a[t], b[0], b[1]);
          MmaBf16(o[t][2 * dp + 1], a[t], b[2], b[3]);
        }
      }
    }
  }

  // Completes the row sums (l) across the four lanes of each group; m is already uniform there.
  __device__ __forceinline__ void FinishSums() {
#pragma unroll
    for (int t = 0; t < kRowTiles; ++t) {
#pragma unroll
      for (int r = 0; r < 2; ++r) l[t][r] = QuadSum(l[t][r]);
    }
  }
};

}  // namespace vamp::kernels::cuda::internal

#endif  // VAMP_KERNELS_CUDA_ATTENTION_MMA_CUH_
