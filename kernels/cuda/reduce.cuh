// Internal to kernels/cuda: warp and block reductions shared by the .cu files, and the storage
// type helpers of kernels templated on float32 / bfloat16 storage.
#ifndef VAMP_KERNELS_CUDA_REDUCE_CUH_
#define VAMP_KERNELS_CUDA_REDUCE_CUH_

#include <cuda_bf16.h>

#include "kernels/cpu/bfloat16.h"

namespace vamp::kernels::cuda::internal {

// Host-side view of the API's bfloat16 pointers as CUDA's type (same size, alignment and bits;
// see kernels/cpu/bfloat16.h).
static_assert(sizeof(BFloat16) == sizeof(__nv_bfloat16) &&
              alignof(BFloat16) == alignof(__nv_bfloat16));
inline __nv_bfloat16* AsDevice(BFloat16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
inline const __nv_bfloat16* AsDevice(const BFloat16* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}

// Kernels templated on the storage type T (float or __nv_bfloat16) compute in float32: AsFloat
// widens a loaded element (exact), FromFloat<T> narrows a result for storing (round to nearest
// even for bfloat16, as the CPU twins' ToBFloat16; NaN payloads are not preserved, a NaN stays a
// NaN).
__device__ __forceinline__ float AsFloat(float v) { return v; }
__device__ __forceinline__ float AsFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// 16-byte loads and stores of T elements widened to / narrowed from float32 (the same rounding as
// FromFloat). Pointers must be 16-byte aligned.
template <typename T>
struct Vec16 {
  static constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte chunk
  static __device__ __forceinline__ void Load(const T* src, float* v);
  static __device__ __forceinline__ void Store(T* dst, const float* v);
};
template <>
__device__ __forceinline__ void Vec16<float>::Load(const float* src, float* v) {
  const float4 q = *reinterpret_cast<const float4*>(src);
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
template <>
__device__ __forceinline__ void Vec16<float>::Store(float* dst, const float* v) {
  *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
}
template <>
__device__ __forceinline__ void Vec16<__nv_bfloat16>::Load(const __nv_bfloat16* src, float* v) {
  const uint4 q = *reinterpret_cast<const uint4*>(src);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
template <>
__device__ __forceinline__ void Vec16<__nv_bfloat16>::Store(__nv_bfloat16* dst, const float* v) {
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    words[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
}

constexpr unsigned kFullMask = 0xffffffffu;

// Sum / minimum over the warp; every lane gets the same bits (the xor butterfly combines the same
// pairs in every lane). T: float, double or an integer type.
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <typename T>
__device__ __forceinline__ T WarpMin(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = min(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` is 32 floats of shared memory, reusable once this returns.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : 0.0f;
  v = WarpSum(v);
  __syncthreads();
  return v;
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  v = WarpMax(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : -INFINITY;
  v = WarpMax(v);
  __syncthreads();
  return v;
}

}  // namespace vamp::kernels::cuda::internal

#endif  // VAMP_KERNELS_CUDA_REDUCE_CUH_
