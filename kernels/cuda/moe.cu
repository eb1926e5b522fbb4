#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/reduce.cuh"

namespace vamp::kernels::cuda {
namespace {

using internal::AsFloat;
using internal::FromFloat;
using internal::kFullMask;
using internal::Vec16;
using internal::WarpSum;

constexpr int kRouterThreads = 128;
constexpr int kPermuteThreads = 512;
constexpr int kPermutePairsPerThread = 8;
constexpr int kRowThreads = 256;

// True when candidate (av, ai) beats (bv, bi): a larger logit, or an equal one with a lower id.
// Index -1 means "no candidate".
__device__ __forceinline__ bool Beats(float av, int ai, float bv, int bi) {
  if (ai < 0) return false;
  if (bi < 0) return true;
  return av > bv || (av == bv && ai < bi);
}

__device__ __forceinline__ void WarpArgMax(float& v, int& i) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, offset);
    const int oi = __shfl_xor_sync(kFullMask, i, offset);
    if (Beats(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// One block per token. Dynamic shared memory: num_experts flags marking experts already chosen.
__global__ void RouterTopKKernel(const float* router_logits, int64_t logits_stride,
                                 int64_t num_experts, int64_t top_k, bool renormalize,
                                 int32_t* topk_ids, float* topk_weights) {
  extern __shared__ unsigned char taken[];
  __shared__ float scratch[32];
  __shared__ float warp_v[32];
  __shared__ int warp_i[32];
  const int64_t t = blockIdx.x;
  const float* logits = router_logits + t * logits_stride;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;

  float max_logit = -INFINITY;
  for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
    max_logit = fmaxf(max_logit, logits[e]);
    taken[e] = 0;
  }
  max_logit = internal::BlockMax(max_logit, scratch);
  float denom = 0.0f;
  for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x)
    denom += expf(logits[e] - max_logit);
  denom = internal::BlockSum(denom, scratch);

  int32_t* ids = topk_ids + t * top_k;
  float* weights = topk_weights + t * top_k;
  for (int64_t j = 0; j < top_k; ++j) {
    float v = 0.0f;
    int i = -1;
    for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
      if (!taken[e] && Beats(logits[e], static_cast<int>(e), v, i)) {
        v = logits[e];
        i = static_cast<int>(e);
      }
    }
    WarpArgMax(v, i);
    if (lane == 0) {
      warp_v[warp] = v;
      warp_i[warp] = i;
    }
    __syncthreads();
    if (warp == 0) {
      v = lane < num_warps ? warp_v[lane] : 0.0f;
      i = lane < num_warps ? warp_i[lane] : -1;
      WarpArgMax(v, i);
      if (lane == 0) {
        taken[i] = 1;
        ids[j] = i;
        weights[j] = expf(logits[i] - max_logit) / denom;
      }
    }
    __syncthreads();
  }
  if (renormalize && threadIdx.x == 0) {
    // Thread 0 wrote every weight above, so it reads them back in program order.
    float sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) sum += weights[j];
    for (int64_t j = 0; j < top_k; ++j) weights[j] /= sum;
  }
}

// One block per expert (gridDim.x = num_experts), kPermuteThreads threads, each thread taking
// kPermutePairsPerThread consecutive pairs per pass. Every block counts the whole batch's pairs
// per expert in shared memory (the ids are read from L2 once per expert, a few hundred KiB at
// most), takes its expert's first row from the counts of the experts before it, then walks the
// pairs in order and places the ones routed to its expert: a block-wide exclusive scan of the
// threads' match counts gives each match its rank, so rows follow pair order (a stable sort, the
// CPU twin's output exactly). No workspace and no host synchronisation: the launch can be captured.
// Block 0 also marks pairs with an id outside [0, num_experts) (pair_row -1). Dynamic shared
// memory: counts[num_experts].
__global__ void __launch_bounds__(kPermuteThreads)
    MoePermuteKernel(const int32_t* topk_ids, int64_t num_pairs, int64_t top_k, int64_t num_experts,
                     int32_t* expert_offsets, int32_t* row_token, int32_t* pair_row) {
  extern __shared__ int32_t permute_counts[];
  __shared__ int32_t warp_part[kPermuteThreads / 32];
  const int expert = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  constexpr int kWarps = kPermuteThreads / 32;
  constexpr int64_t kPass = int64_t{kPermuteThreads} * kPermutePairsPerThread;

  for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x) permute_counts[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < num_pairs; p += blockDim.x) {
    const int32_t e = topk_ids[p];
    if (e >= 0 && e < num_experts) atomicAdd(&permute_counts[e], 1);
  }
  __syncthreads();
  // Sum of the counts of experts before this one (and of all of them, for the last block).
  int32_t before = 0, all = 0;
  for (int64_t e = threadIdx.x; e < num_experts; e += blockDim.x) {
    const int32_t c = permute_counts[e];
    all += c;
    if (e < expert) before += c;
  }
  before = WarpSum(before);
  all = WarpSum(all);
  if (lane == 0) warp_part[warp] = before;
  __syncthreads();
  int32_t start = 0;
  for (int w = 0; w < kWarps; ++w) start += warp_part[w];
  __syncthreads();  // warp_part is reused below
  if (lane == 0) warp_part[warp] = all;
  __syncthreads();
  if (threadIdx.x == 0) {
    expert_offsets[expert] = start;
    if (expert == num_experts - 1) {
      int32_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += warp_part[w];
      expert_offsets[num_experts] = total;
    }
  }

  int32_t next_row = start;  // this expert's next free row, the same in every thread
  for (int64_t base = 0; base < num_pairs; base += kPass) {
    const int64_t first = base + int64_t{threadIdx.x} * kPermutePairsPerThread;
    int32_t ids[kPermutePairsPerThread];
    int32_t mine = 0;
#pragma unroll
    for (int j = 0; j < kPermutePairsPerThread; ++j) {
      const int64_t p = first + j;
      ids[j] = p < num_pairs ? topk_ids[p] : -1;
      mine += ids[j] == expert ? 1 : 0;
      if (expert == 0 && p < num_pairs && (ids[j] < 0 || ids[j] >= num_experts)) pair_row[p] = -1;
    }
    // Exclusive scan of `mine` over the block: within the warp by shuffles, then over the warps'
    // totals (one value per warp in shared memory).
    int32_t inclusive = mine;
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t v = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d) inclusive += v;
    }
    __syncthreads();  // the previous pass's reads of warp_part are done
    if (lane == 31) warp_part[warp] = inclusive;
    __syncthreads();
    int32_t rank = inclusive - mine, pass_total = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int32_t v = warp_part[w];
      if (w < warp) rank += v;
      pass_total += v;
    }
    if (mine > 0) {
      int32_t row = next_row + rank;
#pragma unroll
      for (int j = 0; j < kPermutePairsPerThread; ++j) {
        if (ids[j] == expert) {
          pair_row[first + j] = row;
          row_token[row] = static_cast<int32_t>((first + j) / top_k);
          ++row;
        }
      }
    }
    next_row += pass_total;
  }
}

// Router top-k with one warp per token (kRouterWarpTokens tokens per block) for up to
// 32 * kPerLane experts (kPerLane 4: Qwen3-30B-A3B's 128; 16: Qwen3-Next's 512): lane l holds the
// logits of experts l, l + 32, ... in registers and a bit per expert it has given away, so each of
// the top_k selections is a scan of the lane's registers and one warp arg-max (no shared memory, no
// block barrier). The same selection and tie rule as RouterTopKKernel; the softmax sums in a
// different order (per lane, then across the warp), so the weights agree to rounding.
constexpr int kRouterSmallPerLane = 4;
constexpr int kRouterMaxPerLane = 16;
constexpr int kRouterWarpTokens = 4;

template <int kPerLane>
__global__ void __launch_bounds__(kRouterWarpTokens * 32)
    RouterTopKWarpKernel(const float* router_logits, int64_t logits_stride, int num_tokens,
                         int num_experts, int top_k, bool renormalize, int32_t* topk_ids,
                         float* topk_weights) {
  const int t = blockIdx.x * kRouterWarpTokens + threadIdx.x / 32;
  if (t >= num_tokens) return;  // whole warps leave: the full-mask shuffles below stay valid
  const int lane = threadIdx.x % 32;
  const float* logits = router_logits + static_cast<int64_t>(t) * logits_stride;
  float v[kPerLane];
  float max_logit = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < num_experts ? logits[e] : -INFINITY;
    if (e < num_experts) max_logit = fmaxf(max_logit, v[i]);
  }
  max_logit = internal::WarpMax(max_logit);
  float denom = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (lane + 32 * i < num_experts) denom += expf(v[i] - max_logit);
  }
  denom = WarpSum(denom);

  int32_t* ids = topk_ids + static_cast<int64_t>(t) * top_k;
  float* weights = topk_weights + static_cast<int64_t>(t) * top_k;
  uint32_t taken = 0;  // bit i: expert lane + 32 i already chosen
  float sum = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    float bv = 0.0f;
    int bi = -1;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < num_experts && !((taken >> i) & 1u) && Beats(v[i], e, bv, bi)) {
        bv = v[i];
        bi = e;
      }
    }
    WarpArgMax(bv, bi);  // every lane now holds the winner
    if (bi >= 0 && bi % 32 == lane) taken |= 1u << (bi / 32);
    const float w = bi >= 0 ? expf(bv - max_logit) / denom : 0.0f;
    sum += w;
    if (lane == 0) {
      ids[j] = bi;
      weights[j] = w;
    }
  }
  if (renormalize && lane == 0) {
    // Lane 0 wrote every weight above, so it reads them back in program order, as the CPU twin.
    for (int j = 0; j < top_k; ++j) weights[j] /= sum;
  }
}

// T is the storage type of x and out (float or __nv_bfloat16); arithmetic is float32.
template <typename T>
__global__ void SiluAndMulKernel(const T* x, int64_t x_stride, int64_t inter, T* out,
                                 int64_t out_stride) {
  const int64_t r = blockIdx.x;
  const T* gate = x + r * x_stride;
  const T* up = gate + inter;
  T* o = out + r * out_stride;
  for (int64_t j = threadIdx.x; j < inter; j += blockDim.x) {
    const float g = AsFloat(gate[j]);
    o[j] = FromFloat<T>(g / (1.0f + expf(-g)) * AsFloat(up[j]));
  }
}

// T is the storage type of expert_out and out; the weights and the accumulator are float32, the
// sum runs in choice order and is stored (rounded) once.
template <typename T>
__global__ void MoeUnpermuteKernel(const T* expert_out, int64_t expert_out_stride,
                                   const int32_t* pair_row, const float* topk_weights,
                                   int64_t top_k, int64_t hidden, T* out, int64_t out_stride) {
  const int64_t t = blockIdx.x;
  T* o = out + t * out_stride;
  for (int64_t d = threadIdx.x; d < hidden; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      const float w = topk_weights[t * top_k + j];
      const T* y = expert_out + static_cast<int64_t>(pair_row[t * top_k + j]) * expert_out_stride;
      acc += w * AsFloat(y[d]);
    }
    o[d] = FromFloat<T>(acc);
  }
}

// The bfloat16 unpermute with 16-byte loads: grid (token, group of kUnpermuteThreads chunks of 8
// columns), the token's top_k rows and weights read once into shared memory, each thread's top_k
// row loads independent of each other. The same sum in the same order as MoeUnpermuteKernel, so
// the same bits; a decode token's hidden row spreads over several SMs instead of one block
// walking it with a chain of dependent loads per column.
constexpr int kUnpermuteThreads = 64;
constexpr int kUnpermuteMaxTopK = 32;

__global__ void __launch_bounds__(kUnpermuteThreads)
    MoeUnpermuteVecKernel(const __nv_bfloat16* expert_out, int64_t expert_out_stride,
                          const int32_t* pair_row, const float* topk_weights, int top_k,
                          int64_t hidden, __nv_bfloat16* out, int64_t out_stride) {
  constexpr int kVec = Vec16<__nv_bfloat16>::kVec;
  __shared__ int64_t row_offset[kUnpermuteMaxTopK];
  __shared__ float weight[kUnpermuteMaxTopK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < top_k) {
    row_offset[threadIdx.x] =
        static_cast<int64_t>(pair_row[t * top_k + threadIdx.x]) * expert_out_stride;
    weight[threadIdx.x] = topk_weights[t * top_k + threadIdx.x];
  }
  __syncthreads();
  const int64_t j0 = (int64_t{blockIdx.y} * kUnpermuteThreads + threadIdx.x) * kVec;
  if (j0 >= hidden) return;
  float acc[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) acc[e] = 0.0f;
#pragma unroll 4
  for (int j = 0; j < top_k; ++j) {
    float y[kVec];
    Vec16<__nv_bfloat16>::Load(expert_out + row_offset[j] + j0, y);
    const float w = weight[j];
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] += w * y[e];
  }
  Vec16<__nv_bfloat16>::Store(out + t * out_stride + j0, acc);
}

}  // namespace

absl::Status RouterTopK(const float* router_logits, int64_t logits_stride, int64_t num_tokens,
                        int64_t num_experts, int64_t top_k, bool renormalize, int32_t* topk_ids,
                        float* topk_weights, cudaStream_t stream) {
  if (top_k < 0 || top_k > num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("RouterTopK: top_k ", top_k, " outside [0, num_experts = ", num_experts, "]"));
  }
  if (num_tokens == 0 || top_k == 0) return absl::OkStatus();
  if (num_experts <= 32 * kRouterMaxPerLane && num_tokens <= INT32_MAX - kRouterWarpTokens) {
    const int64_t blocks = internal::CeilDiv(num_tokens, kRouterWarpTokens);
    auto* kernel = num_experts <= 32 * kRouterSmallPerLane
                       ? &RouterTopKWarpKernel<kRouterSmallPerLane>
                       : &RouterTopKWarpKernel<kRouterMaxPerLane>;
    kernel<<<static_cast<unsigned>(blocks), kRouterWarpTokens * 32, 0, stream>>>(
        router_logits, logits_stride, static_cast<int>(num_tokens), static_cast<int>(num_experts),
        static_cast<int>(top_k), renormalize, topk_ids, topk_weights);
    return internal::LaunchStatus("RouterTopKWarpKernel");
  }
  RouterTopKKernel<<<num_tokens, kRouterThreads, num_experts, stream>>>(
      router_logits, logits_stride, num_experts, top_k, renormalize, topk_ids, topk_weights);
  return internal::LaunchStatus("RouterTopKKernel");
}

absl::Status MoePermute(const int32_t* topk_ids, int64_t num_tokens, int64_t top_k,
                        int64_t num_experts, int32_t* expert_offsets, int32_t* row_token,
                        int32_t* pair_row, cudaStream_t stream) {
  const int64_t num_pairs = num_tokens * top_k;
  if (num_pairs > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoePermute: ", num_pairs, " pairs overflow int32 rows"));
  }
  if (num_experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoePermute: negative expert count ", num_experts));
  }
  if (num_experts == 0 || num_pairs == 0) {
    // No block would run: the offsets are all zero (no pair has a valid expert).
    return internal::CudaStatus(
        cudaMemsetAsync(expert_offsets, 0, (num_experts + 1) * sizeof(int32_t), stream),
        "cudaMemsetAsync(MoePermute expert_offsets)");
  }
  const size_t shared = num_experts * sizeof(int32_t);
  if (shared > 48 * 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoePermute: ", num_experts, " experts exceed the shared-memory cursor table"));
  }
  MoePermuteKernel<<<static_cast<unsigned>(num_experts), kPermuteThreads, shared, stream>>>(
      topk_ids, num_pairs, top_k, num_experts, expert_offsets, row_token, pair_row);
  return internal::LaunchStatus("MoePermuteKernel");
}

absl::Status SiluAndMul(const float* x, int64_t x_stride, int64_t num_rows, int64_t inter,
                        float* out, int64_t out_stride, cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  SiluAndMulKernel<float>
      <<<num_rows, kRowThreads, 0, stream>>>(x, x_stride, inter, out, out_stride);
  return internal::LaunchStatus("SiluAndMulKernel");
}

absl::Status MoeUnpermute(const float* expert_out, int64_t expert_out_stride,
                          const int32_t* pair_row, const float* topk_weights, int64_t num_tokens,
                          int64_t top_k, int64_t hidden, float* out, int64_t out_stride,
                          cudaStream_t stream) {
  if (num_tokens == 0) return absl::OkStatus();
  MoeUnpermuteKernel<float><<<num_tokens, kRowThreads, 0, stream>>>(
      expert_out, expert_out_stride, pair_row, topk_weights, top_k, hidden, out, out_stride);
  return internal::LaunchStatus("MoeUnpermuteKernel");
}

absl::Status SiluAndMul(const BFloat16* x, int64_t x_stride, int64_t num_rows, int64_t inter,
                        BFloat16* out, int64_t out_stride, cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  SiluAndMulKernel<__nv_bfloat16><<<num_rows, kRowThreads, 0, stream>>>(
      internal::AsDevice(x), x_stride, inter, internal::AsDevice(out), out_stride);
  return internal::LaunchStatus("SiluAndMulKernel<bf16>");
}

absl::Status MoeUnpermute(const BFloat16* expert_out, int64_t expert_out_stride,
                          const int32_t* pair_row, const float* topk_weights, int64_t num_tokens,
                          int64_t top_k, int64_t hidden, BFloat16* out, int64_t out_stride,
                          cudaStream_t stream) {
  if (num_tokens == 0) return absl::OkStatus();
  constexpr int64_t kVec = Vec16<__nv_bfloat16>::kVec;
  const int64_t groups = internal::CeilDiv(hidden, kVec * kUnpermuteThreads);
  if (hidden % kVec == 0 && expert_out_stride % kVec == 0 && out_stride % kVec == 0 &&
      internal::Aligned16(expert_out) && internal::Aligned16(out) && top_k >= 1 &&
      top_k <= kUnpermuteMaxTopK && num_tokens <= INT32_MAX && groups <= 65535) {
    const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(groups));
    MoeUnpermuteVecKernel<<<grid, kUnpermuteThreads, 0, stream>>>(
        internal::AsDevice(expert_out), expert_out_stride, pair_row, topk_weights,
        static_cast<int>(top_k), hidden, internal::AsDevice(out), out_stride);
    return internal::LaunchStatus("MoeUnpermuteVecKernel");
  }
  MoeUnpermuteKernel<__nv_bfloat16><<<num_tokens, kRowThreads, 0, stream>>>(
      internal::AsDevice(expert_out), expert_out_stride, pair_row, topk_weights, top_k, hidden,
      internal::AsDevice(out), out_stride);
  return internal::LaunchStatus("MoeUnpermuteKernel<bf16>");
}

}  // namespace vamp::kernels::cuda
