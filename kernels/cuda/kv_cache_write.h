// Paged KV cache write, CUDA twins of cpu::WriteKv (kernels/cpu/attention.h: KV cache addressing
// and slots are the CPU twin's), device pointers, same arguments plus a stream. The attention
// kernels (attention.h) read what these write.
#ifndef VAMP_KERNELS_CUDA_KV_CACHE_WRITE_H_
#define VAMP_KERNELS_CUDA_KV_CACHE_WRITE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda {

using KvCacheStrides = cpu::KvCacheStrides;

// As cpu::WriteKv (a negative slot skips the token). Bit-exact copy.
absl::Status WriteKv(const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                     int64_t head_dim, float* k_cache, float* v_cache, KvCacheStrides strides,
                     int64_t block_size, cudaStream_t stream);

// ---- bfloat16 (the engine's storage type) ----

// As cpu::WriteKv for bfloat16 (a negative slot skips the token). Bit-exact copy; 16-byte vector
// copies when head_dim is a multiple of 8 and every pointer and stride is 16-byte aligned.
absl::Status WriteKv(const BFloat16* k, int64_t k_stride, const BFloat16* v, int64_t v_stride,
                     const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                     int64_t head_dim, BFloat16* k_cache, BFloat16* v_cache, KvCacheStrides strides,
                     int64_t block_size, cudaStream_t stream);

}  // namespace vamp::kernels::cuda

#endif  // VAMP_KERNELS_CUDA_KV_CACHE_WRITE_H_
