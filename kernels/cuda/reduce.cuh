// Internal to kernels/cuda: warp and block reductions shared by the .cu files.
#ifndef VAMP_KERNELS_CUDA_REDUCE_CUH_
#define VAMP_KERNELS_CUDA_REDUCE_CUH_

namespace vamp::kernels::cuda::internal {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
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
