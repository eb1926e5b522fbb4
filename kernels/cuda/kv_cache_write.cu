#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/kv_cache_write.h"
#include "kernels/cuda/launch.h"

namespace vamp::kernels::cuda {
namespace {

using internal::Aligned16;
using internal::CeilDiv;

constexpr int kWriteKvThreads = 256;

// One block per token.
__global__ void WriteKvKernel(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                              const int64_t* slot_mapping, int64_t num_kv_heads, int64_t head_dim,
                              float* k_cache, float* v_cache, KvCacheStrides strides,
                              int64_t block_size) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  const int64_t offset =
      (slot / block_size) * strides.block_stride + (slot % block_size) * strides.token_stride;
  for (int64_t i = threadIdx.x; i < num_kv_heads * head_dim; i += blockDim.x) {
    const int64_t h = i / head_dim;
    const int64_t d = i % head_dim;
    const int64_t dst = offset + h * strides.head_stride + d;
    k_cache[dst] = k[t * k_stride + i];
    v_cache[dst] = v[t * v_stride + i];
  }
}

// bfloat16 KV write over a flat grid of (token, kElems-element piece) pairs: 16-byte vectors
// (kElems 8; the host checked alignment and head_dim % 8) or single elements. Bit copies.
template <int kElems>
__global__ void WriteKvBf16Kernel(const uint16_t* k, int64_t k_stride, const uint16_t* v,
                                  int64_t v_stride, const int64_t* slot_mapping, int64_t num_tokens,
                                  int64_t num_kv_heads, int64_t head_dim, uint16_t* k_cache,
                                  uint16_t* v_cache, KvCacheStrides strides, int64_t block_size) {
  using Piece = std::conditional_t<kElems == 8, uint4, uint16_t>;
  static_assert(sizeof(Piece) == kElems * sizeof(uint16_t), "piece size");
  const int64_t per_token = num_kv_heads * head_dim / kElems;
  const int64_t total = num_tokens * per_token;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_token;
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t e = (i % per_token) * kElems;  // element within the token's heads
    const int64_t dst = (slot / block_size) * strides.block_stride +
                        (slot % block_size) * strides.token_stride +
                        (e / head_dim) * strides.head_stride + e % head_dim;
    *reinterpret_cast<Piece*>(k_cache + dst) =
        *reinterpret_cast<const Piece*>(k + t * k_stride + e);
    *reinterpret_cast<Piece*>(v_cache + dst) =
        *reinterpret_cast<const Piece*>(v + t * v_stride + e);
  }
}

}  // namespace

absl::Status WriteKv(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                     int64_t head_dim, float* k_cache, float* v_cache, KvCacheStrides strides,
                     int64_t block_size, cudaStream_t stream) {
  if (num_tokens == 0) return absl::OkStatus();
  WriteKvKernel<<<num_tokens, kWriteKvThreads, 0, stream>>>(k, k_stride, v, v_stride, slot_mapping,
                                                            num_kv_heads, head_dim, k_cache,
                                                            v_cache, strides, block_size);
  return internal::LaunchStatus("WriteKvKernel");
}

// ---- bfloat16 ----

absl::Status WriteKv(const BFloat16* k, int64_t k_stride, const BFloat16* v, int64_t v_stride,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                     int64_t head_dim, BFloat16* k_cache, BFloat16* v_cache, KvCacheStrides strides,
                     int64_t block_size, cudaStream_t stream) {
  if (num_tokens <= 0 || num_kv_heads <= 0 || head_dim <= 0) return absl::OkStatus();
  if (block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("WriteKv: block_size ", block_size, " < 1"));
  }
  const bool vector = head_dim % 8 == 0 && Aligned16(k) && Aligned16(v) && Aligned16(k_cache) &&
                      Aligned16(v_cache) && k_stride % 8 == 0 && v_stride % 8 == 0 &&
                      strides.block_stride % 8 == 0 && strides.token_stride % 8 == 0 &&
                      strides.head_stride % 8 == 0;
  const int64_t pieces = num_tokens * num_kv_heads * head_dim / (vector ? 8 : 1);
  const int64_t blocks = std::min<int64_t>(CeilDiv(pieces, kWriteKvThreads), int64_t{1} << 20);
  auto* k16 = reinterpret_cast<const uint16_t*>(k);
  auto* v16 = reinterpret_cast<const uint16_t*>(v);
  auto* kc16 = reinterpret_cast<uint16_t*>(k_cache);
  auto* vc16 = reinterpret_cast<uint16_t*>(v_cache);
  if (vector) {
    WriteKvBf16Kernel<8><<<blocks, kWriteKvThreads, 0, stream>>>(
        k16, k_stride, v16, v_stride, slot_mapping, num_tokens, num_kv_heads, head_dim, kc16, vc16,
        strides, block_size);
  } else {
    WriteKvBf16Kernel<1><<<blocks, kWriteKvThreads, 0, stream>>>(
        k16, k_stride, v16, v_stride, slot_mapping, num_tokens, num_kv_heads, head_dim, kc16, vc16,
        strides, block_size);
  }
  return internal::LaunchStatus("WriteKvBf16Kernel");
}

}  // namespace vamp::kernels::cuda
