// Internal to kernels/cuda/attention.cu: the Hopper (sm_90a) warpgroup-level part of the bfloat16
// prefill attention kernel. One warpgroup (4 warps, 128 threads) owns 64 query vectors (rows of
// one m64 wgmma tile; a vector is one (query row, query head) pair) and attends them to a tile of
// keys in shared memory, FlashAttention-2's algorithm on Hopper's instructions (the
// FlashAttention-3 paper's basic form, without its producer warps or its overlap of softmax with
// the next tile's MMA): S = Q K^T with both operands read from shared memory, an online softmax in
// float32 in registers, O += P V with P taken from the score registers (rounded to bf16) and V from
// shared memory.
//
// Shared-memory tiles (Q, K and V alike) are stored for the 128-byte wgmma swizzle: a tile of R
// rows of head_dim bf16 is head_dim / 64 column blocks, each R rows of 128 bytes (64 elements),
// block b holding dims 64b..64b+63; 16-byte chunk c of row r of a block sits at chunk c ^ (r % 8);
// blocks and the tile start at multiples of 1,024 bytes (see WgmmaTileChunk). Q and K are then
// K-major operands (the dim index, the reduction of Q K^T, is contiguous) and V an MN-major one
// (the reduction of P V runs over keys, V's rows).
//
// Register layouts (wgmma.cuh): the accumulator of warp w, lane l (g = l / 4, c = l % 4) holds
// rows 16w + g and 16w + g + 8 of its warpgroup's 64; element 4j + e of a tile is column
// 8j + 2c + e % 2 of row g (e < 2) or g + 8 (e >= 2). Scores are kept in the log2 domain
// (score * scale * log2(e)), so exp2f gives the softmax weights.
#ifndef VAMP_KERNELS_CUDA_ATTENTION_WGMMA_CUH_
#define VAMP_KERNELS_CUDA_ATTENTION_WGMMA_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace vamp::kernels::cuda::internal {

// Position, in 16-byte chunks from the tile start, of chunk `chunk` (of head_dim / 8) of row `row`
// in a tile of kRows rows stored for the 128-byte wgmma swizzle (see above).
template <int kRows>
__device__ __forceinline__ int WgmmaTileChunk(int row, int chunk) {
  static_assert(kRows % 8 == 0, "whole 8-row swizzle atoms");
  return (chunk >> 3) * (kRows * 8) + row * 8 + ((chunk & 7) ^ (row & 7));
}

// The state of one warpgroup's 64 query vectors: the output accumulators and the online-softmax
// statistics of the two rows this lane holds. kKeys keys per tile.
template <int kHeadDim, int kKeys>
struct WarpgroupAttention {
  // P V is one m64n{head_dim}k16 wgmma per 16 keys, S one m64n{keys} accumulator: 64 keys at
  // head_dim 128 (64 + 32 accumulator registers), 32 at 256 (128 + 16).
  static_assert((kHeadDim == 128 && kKeys == 64) || (kHeadDim == 256 && kKeys == 32),
                "instantiated for head_dim 128 with 64-key tiles and 256 with 32-key tiles");
  static constexpr int kRowBytes = 128;  // one row of a 64-dim column block

  float o[kHeadDim / 2];  // O accumulators (unnormalised), element 4n + e: dims 8n + 2c + e % 2
  float m[2];             // running max of rows g, g+8 (log2 domain); -inf before any key
  float l[2];             // this lane's share of the running sum of exp2(s - m)

  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  // Attends the warpgroup's 64 vectors to kKeys keys. q: shared address of the warpgroup's first Q
  // row in column block 0 of the Q tile, whose blocks are q_block_bytes apart; k, v: shared
  // addresses of the K and V tiles (kKeys rows each) holding keys key0, key0 + 1, ... This lane's
  // row g sees keys < limits[0] and row g+8 keys < limits[1] when `mask` is set (zero-filled rows
  // past the end must be masked); with `mask` clear every key of the tile is visible. All 128
  // threads of the warpgroup call it together with the same `mask` (wgmma is warpgroup-wide).
  __device__ __forceinline__ void Attend(uint32_t q, uint32_t q_block_bytes, uint32_t k, uint32_t v,
                                         int lane, int key0, const int (&limits)[2], bool mask,
                                         float scale_log2) {
    constexpr uint32_t kKvBlockBytes = kKeys * kRowBytes;
    float s[kKeys / 2];
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) s[i] = 0.0f;
    // S = Q K^T: k16 slice ks of column block ks / 4 starts 32 (ks % 4) bytes into its rows.
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t offset = (ks % 4) * 32;
      const uint64_t desc_q = SwizzledKMajorDescriptor(q + (ks / 4) * q_block_bytes + offset);
      const uint64_t desc_k = SwizzledKMajorDescriptor(k + (ks / 4) * kKvBlockBytes + offset);
      if constexpr (kKeys == 64) {
        WgmmaM64N64K16Bf16(s, desc_q, desc_k);
      } else {
        WgmmaM64N32K16Bf16(s, desc_q, desc_k);
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();

    // Online softmax over the tile, rows g (r = 0) and g + 8 (r = 1).
    const int c = lane & 3;
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[4 * j + e] * scale_log2;
        if (mask && key0 + 8 * j + 2 * c + (e & 1) >= limits[e >> 1]) x = -INFINITY;
        s[4 * j + e] = x;
        row_max[e >> 1] = fmaxf(row_max[e >> 1], x);
      }
    }
    float correction[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) correction[r] = OnlineSoftmaxMax(row_max[r], m[r]);
    float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      s[i] = exp2f(s[i] - row_max[(i >> 1) & 1]);
      row_sum[(i >> 1) & 1] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * correction[r] + row_sum[r];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] *= correction[(i >> 1) & 1];

    // O += P V: the bf16 A fragment of keys 16kt..16kt+15 is score blocks 2kt and 2kt+1; V's k16
    // slice kt is 16 rows (two 1,024-byte atoms) into each column block.
    uint32_t p[kKeys / 16][4];
#pragma unroll
    for (int kt = 0; kt < kKeys / 16; ++kt) {
      p[kt][0] = PackBf16(s[8 * kt + 0], s[8 * kt + 1]);
      p[kt][1] = PackBf16(s[8 * kt + 2], s[8 * kt + 3]);
      p[kt][2] = PackBf16(s[8 * kt + 4], s[8 * kt + 5]);
      p[kt][3] = PackBf16(s[8 * kt + 6], s[8 * kt + 7]);
    }
    WgmmaFence();
#pragma unroll
    for (int kt = 0; kt < kKeys / 16; ++kt) {
      const uint64_t desc_v = SwizzledMnMajorDescriptor(v + kt * 16 * kRowBytes, kKvBlockBytes);
      if constexpr (kHeadDim == 128) {
        WgmmaM64N128K16Bf16RegA(o, p[kt], desc_v);
      } else {
        WgmmaM64N256K16Bf16RegA(o, p[kt], desc_v);
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();
  }

  // Completes the row sums (l) across the four lanes of each group; m is already uniform there.
  __device__ __forceinline__ void FinishSums() {
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = QuadSum(l[r]);
  }
};

}  // namespace vamp::kernels::cuda::internal

#endif  // VAMP_KERNELS_CUDA_ATTENTION_WGMMA_CUH_
