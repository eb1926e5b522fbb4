#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/sampling.h"

namespace vamp::kernels::cuda {
namespace {

using internal::kFullMask;

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;  // 32: one scratch slot per lane

__device__ __forceinline__ void WarpArgMax(float& v, int64_t& i) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, offset);
    const int64_t oi = __shfl_xor_sync(kFullMask, i, offset);
    // A larger value, or an equal one at a lower index; -1 is "no candidate".
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
      v = ov;
      i = oi;
    }
  }
}

// One block per row.
__global__ void GreedySampleKernel(const float* logits, int64_t logits_stride, int64_t vocab,
                                   int32_t* out_tokens, float* out_logprobs) {
  __shared__ float warp_v[32];
  __shared__ int64_t warp_i[32];
  __shared__ float scratch[32];
  const float* row = logits + blockIdx.x * logits_stride;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  // Each thread walks its indices in increasing order, so a strict > keeps its first maximum.
  float v = 0.0f;
  int64_t i = -1;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    if (i < 0 || row[j] > v) {
      v = row[j];
      i = j;
    }
  }
  WarpArgMax(v, i);
  if (lane == 0) {
    warp_v[warp] = v;
    warp_i[warp] = i;
  }
  __syncthreads();
  v = lane < num_warps ? warp_v[lane] : 0.0f;
  i = lane < num_warps ? warp_i[lane] : -1;
  WarpArgMax(v, i);  // every warp reduces the same 32 candidates: all threads get the winner
  if (threadIdx.x == 0) out_tokens[blockIdx.x] = static_cast<int32_t>(i);
  if (out_logprobs == nullptr) return;  // uniform across the block
  const float max_value = v;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(row[j] - max_value);
  sum = internal::BlockSum(sum, scratch);
  // log_softmax at the argmax: (max - max) - log(sum).
  if (threadIdx.x == 0) out_logprobs[blockIdx.x] = -logf(sum);
}

// ---------------------------------------------------------------------------------------------
// SampleTokens. One block of kSampleThreads per row; every branch below depends only on values
// the whole block shares (row parameters and block-wide reductions), so the block stays uniform.
//
// Tuning (see sampling.h for the overall plan):
// Histogram of (max - logit): kBinsPerLogit bins per logit unit; the last bin collects everything
// kLastBin / kBinsPerLogit = 64 logits or more below the maximum. Independent of the temperature,
// so top-k candidates resolve at any temperature.
constexpr int kNumBins = 2048;
constexpr int kLastBin = kNumBins - 1;
constexpr float kBinsPerLogit = 32.0f;
// Candidates sorted in shared memory (a power of two); also the tile of the cumulative scans.
constexpr int kCandidateCapacity = 4096;
constexpr int kScanItems = kCandidateCapacity / kSampleThreads;
// Candidate sets that do not fit: a stable LSD radix sort by a 32-bit key, 8 bits per pass, each
// warp ranking a contiguous range of the input, kRadixUnroll groups of 32 loaded at a time.
constexpr int kRadixBits = 8;
constexpr int kRadixDigits = 1 << kRadixBits;
constexpr int kRadixCountsPerThread = kRadixDigits * kSampleWarps / kSampleThreads;
constexpr int kRadixUnroll = 8;
// Largest vocabulary SampleTokens takes (positions stay well inside int32 arithmetic).
constexpr int64_t kMaxSampleVocab = int64_t{1} << 30;

static_assert(kSampleWarps == 32, "the block reductions keep one scratch slot per lane");
static_assert(kNumBins == 2 * kSampleThreads, "the bin scan gives each thread two bins");
static_assert(kCandidateCapacity % kSampleThreads == 0);
static_assert((kCandidateCapacity & (kCandidateCapacity - 1)) == 0, "bitonic sort size");
static_assert(kRadixDigits * kSampleWarps % kSampleThreads == 0);

struct SampleShared {
  // Phases of one row, each done with the previous one: the histogram, the sorted candidates,
  // the radix sort's [digit][warp] counts (then output positions) of one pass.
  union {
    int bins[kNumBins];
    uint64_t candidates[kCandidateCapacity];
    int radix_counts[kRadixDigits * kSampleWarps];
  };
  double warp_mass[kSampleWarps];  // sum of p over each warp's segment of the row
  double dscratch[32];
  int64_t lscratch[32];
  int iscratch[32];
  float fscratch[32];
  double crossing;
  int num_candidates;
  int32_t token;
};

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Bit for bit cpu::UniformFromCounter.
__device__ __forceinline__ float UniformFromCounter(uint64_t seed, uint64_t draw_index) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ draw_index);
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// Ascending order of the key is the CPU's candidate order (larger logit first); -0 and +0 are
// the same key, as they compare equal on the CPU. Ties are broken by token id outside the key.
__device__ __forceinline__ uint32_t DescendingKey(float x) {
  uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7fffffffu) == 0) bits = 0;
  const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return ~ascending;
}

struct RowView {
  const float* row;
  int64_t vocab;
  float max_value;
  float inv_t;
};

// The CPU's unnormalised probability, in the same float operations.
__device__ __forceinline__ float Prob(float x, const RowView& v) {
  return expf((x - v.max_value) * v.inv_t);
}

// Histogram bin of a logit: monotone (a larger logit never has a larger bin), so every bin holds
// a contiguous run of the descending order and no tie straddles two bins.
__device__ __forceinline__ int Bin(float x, float max_value) {
  const float scaled = (max_value - x) * kBinsPerLogit;  // exact scaling by a power of two
  return scaled < static_cast<float>(kLastBin) ? static_cast<int>(scaled) : kLastBin;
}

// A lower bound of Prob over bin b < kLastBin, whose logits lie less than (b + 1) / kBinsPerLogit
// below the max. The slack covers the rounding of the product (relative 1e-6 of the exponent)
// and expf's error (relative 1e-6 of the result); a bound that is too low only costs speed.
__device__ __forceinline__ double MinProbInBin(int b, float inv_t) {
  return exp(-(b + 1) / static_cast<double>(kBinsPerLogit) * static_cast<double>(inv_t) *
             (1.0 + 1e-6)) *
         (1.0 - 1e-6);
}

__device__ __forceinline__ unsigned LanesBelow() { return (1u << (threadIdx.x % 32)) - 1u; }

template <typename T>
__device__ __forceinline__ T WarpInclusiveScan(T v) {
  const int lane = threadIdx.x % 32;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const T other = __shfl_up_sync(kFullMask, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

// Block reduction of a 32-warp block with a warp reduction `warp_op` (internal::WarpSum or
// WarpMin); every thread gets the same bits. scratch: 32 T of shared memory, reusable when this
// returns.
template <typename T, typename WarpOp>
__device__ T BlockAllReduce(T v, T* scratch, WarpOp warp_op) {
  v = warp_op(v);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_op(scratch[threadIdx.x % 32]);
  __syncthreads();
  return v;
}

template <typename T>
__device__ T BlockSumT(T v, T* scratch) {
  return BlockAllReduce(v, scratch, [](T x) { return internal::WarpSum(x); });
}

template <typename T>
__device__ T BlockMinT(T v, T* scratch) {
  return BlockAllReduce(v, scratch, [](T x) { return internal::WarpMin(x); });
}

// Exclusive prefix sum in thread order; *total receives the block's sum (every thread).
template <typename T>
__device__ T BlockExclusiveScan(T v, T* scratch, T* total) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const T inclusive = WarpInclusiveScan(v);
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  const T warp_total = scratch[lane];
  const T warps_inclusive = WarpInclusiveScan(warp_total);
  T warps_exclusive = __shfl_up_sync(kFullMask, warps_inclusive, 1);
  if (lane == 0) warps_exclusive = T(0);
  const T offset = __shfl_sync(kFullMask, warps_exclusive, warp);
  *total = __shfl_sync(kFullMask, warps_inclusive, 31);
  T exclusive = __shfl_up_sync(kFullMask, inclusive, 1);
  if (lane == 0) exclusive = T(0);
  __syncthreads();
  return offset + exclusive;
}

// First index of the largest logit, and its value, to every thread.
__device__ void BlockArgMax(const float* row, int64_t vocab, SampleShared& sm, float* max_value,
                            int64_t* argmax) {
  const int lane = threadIdx.x % 32;
  float v = 0.0f;
  int64_t i = -1;
  for (int64_t j = threadIdx.x; j < vocab; j += kSampleThreads) {
    const float x = row[j];
    if (i < 0 || x > v) {
      v = x;
      i = j;
    }
  }
  WarpArgMax(v, i);
  if (lane == 0) {
    sm.fscratch[threadIdx.x / 32] = v;
    sm.lscratch[threadIdx.x / 32] = i;
  }
  __syncthreads();
  v = sm.fscratch[lane];
  i = sm.lscratch[lane];
  WarpArgMax(v, i);
  __syncthreads();
  *max_value = v;
  *argmax = i;
}

// Pure temperature sampling: candidates in token-id order, the CPU's order when neither top-k nor
// top-p applies. Warp w owns the segment [w * segment, (w + 1) * segment) of the row and
// sm.warp_mass[w] its mass; the warp whose segment holds u walks it with a warp scan.
__device__ int32_t SampleInTokenOrder(const RowView& v, int64_t segment, double total,
                                      float uniform, SampleShared& sm) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const double u = static_cast<double>(uniform) * total;
  // The same additions as `total`, so u < total keeps u below the last `after`.
  int target = -1;
  double before = 0.0;
  for (int w = 0; w < kSampleWarps; ++w) {
    const double after = before + sm.warp_mass[w];
    if (after > u) {
      target = w;
      break;
    }
    before = after;
  }
  // No warp only for NaN masses; the CPU's fallback is the last candidate.
  if (threadIdx.x == 0) sm.token = static_cast<int32_t>(v.vocab - 1);
  __syncthreads();
  if (warp == target) {
    const int64_t begin = min(v.vocab, warp * segment);
    const int64_t end = min(v.vocab, begin + segment);
    double carry = before;
    int64_t last_nonzero = -1;
    bool found = false;
    for (int64_t g = begin; g < end; g += 32) {
      const int64_t i = g + lane;
      const float p = i < end ? Prob(v.row[i], v) : 0.0f;
      const double inclusive = WarpInclusiveScan(static_cast<double>(p));
      const unsigned crossed = __ballot_sync(kFullMask, i < end && carry + inclusive > u);
      if (crossed != 0) {
        if (lane == 0) sm.token = static_cast<int32_t>(g + __ffs(crossed) - 1);
        found = true;
        break;
      }
      const unsigned nonzero = __ballot_sync(kFullMask, p > 0.0f);
      if (nonzero != 0) last_nonzero = g + 31 - __clz(nonzero);
      carry += __shfl_sync(kFullMask, inclusive, 31);
    }
    // Rounding of the walk against the segment's sum: u sits at the top of the segment.
    if (!found && lane == 0 && last_nonzero >= 0) sm.token = static_cast<int32_t>(last_nonzero);
  }
  __syncthreads();
  return sm.token;
}

struct CandidateBins {
  int last_bin;   // the candidates are the logits of bins 0..last_bin
  int64_t count;  // how many there are
};

// From the histogram in sm.bins (every bin but the last counted), the candidates: for top-k
// (k < vocab) the bins up to the first whose cumulative count reaches k; for top-p alone the bins
// up to the first whose cumulative lower bound of mass reaches top_p * total (all bins when none
// does). Bins are descending runs, so the candidates are the largest logits, ties included.
__device__ CandidateBins ChooseCandidateBins(const RowView& v, int64_t k, float top_p, double total,
                                             SampleShared& sm) {
  const int b0 = 2 * threadIdx.x;
  const int b1 = b0 + 1;
  const int c0 = sm.bins[b0];
  int c1 = sm.bins[b1];  // 0 for kLastBin, which pass 2 does not count
  const int counted = BlockSumT(c0 + c1, sm.iscratch);
  if (b1 == kLastBin) c1 = static_cast<int>(v.vocab) - counted;
  int unused;
  const int before = BlockExclusiveScan(c0 + c1, sm.iscratch, &unused);
  const int64_t cum0 = before + c0;
  const int64_t cum1 = cum0 + c1;
  int reach;
  if (k < v.vocab) {
    reach = BlockMinT(cum0 >= k ? b0 : (cum1 >= k ? b1 : kLastBin), sm.iscratch);
  } else {
    const double lb0 = c0 * MinProbInBin(b0, v.inv_t);
    const double lb1 = b1 == kLastBin ? 0.0 : c1 * MinProbInBin(b1, v.inv_t);
    double unused_total;
    const double lb_before = BlockExclusiveScan(lb0 + lb1, sm.dscratch, &unused_total);
    // The margin covers the different order of the sums that decide the cut after the sort.
    const double bound = static_cast<double>(top_p) * total * (1.0 + 1e-9);
    reach =
        BlockMinT(lb_before + lb0 >= bound ? b0 : (lb_before + lb0 + lb1 >= bound ? b1 : kLastBin),
                  sm.iscratch);
  }
  const int64_t count =
      BlockSumT(b0 == reach ? cum0 : (b1 == reach ? cum1 : int64_t{0}), sm.lscratch);
  return {reach, count};
}

// Gathers the logits of bins 0..last_bin into sm.candidates as (DescendingKey << 32 | token id)
// and returns how many there are (more than kCandidateCapacity: not all were stored).
__device__ int GatherCandidates(const RowView& v, int last_bin, SampleShared& sm) {
  const int lane = threadIdx.x % 32;
  if (threadIdx.x == 0) sm.num_candidates = 0;
  __syncthreads();
  for (int64_t start = 0; start < v.vocab; start += kSampleThreads) {
    const int64_t i = start + threadIdx.x;
    float x = 0.0f;
    bool take = false;
    if (i < v.vocab) {
      x = v.row[i];
      take = Bin(x, v.max_value) <= last_bin;
    }
    const unsigned takers = __ballot_sync(kFullMask, take);
    if (takers == 0) continue;
    int slot = 0;
    if (lane == 0) slot = atomicAdd(&sm.num_candidates, __popc(takers));
    slot = __shfl_sync(kFullMask, slot, 0) + __popc(takers & LanesBelow());
    if (take && slot < kCandidateCapacity) {
      sm.candidates[slot] =
          (static_cast<uint64_t>(DescendingKey(x)) << 32) | static_cast<uint32_t>(i);
    }
  }
  __syncthreads();
  return sm.num_candidates;
}

// Sorts sm.candidates[0, n) ascending (n <= kCandidateCapacity): a bitonic network over the next
// power of two, padded with the largest key.
__device__ void SortCandidates(int n, SampleShared& sm) {
  int size = 2;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += kSampleThreads) sm.candidates[i] = ~uint64_t{0};
  __syncthreads();
  for (int block = 2; block <= size; block <<= 1) {
    for (int stride = block >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < size / 2; t += kSampleThreads) {
        const int lo = 2 * t - (t & (stride - 1));
        const int hi = lo + stride;
        const bool ascending = (lo & block) == 0;
        const uint64_t a = sm.candidates[lo];
        const uint64_t b = sm.candidates[hi];
        if ((a > b) == ascending) {
          sm.candidates[lo] = b;
          sm.candidates[hi] = a;
        }
      }
      __syncthreads();
    }
  }
}

// One stable counting pass of the radix sort: the ids src[0, n) (src null: the row's ids in
// order, keeping those whose logit is in bins 0..last_bin) into dst, ordered by the digit of
// DescendingKey at `shift`. Warp w ranks the input range [w * n / 32, (w + 1) * n / 32) twice: once
// counting its digits, then, after a block scan turns the [digit][warp] counts into output
// positions, writing each id at its position. Returns the number of ids written.
__device__ __noinline__ int RadixPass(const RowView& v, const int32_t* src, int n, int last_bin,
                                      int shift, int32_t* dst, SampleShared& sm) {
  int* counts = sm.radix_counts;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int per_warp = (n + kSampleWarps - 1) / kSampleWarps;
  const int begin = min(n, warp * per_warp);
  const int end = min(n, begin + per_warp);
  const bool filter = src == nullptr && last_bin < kLastBin;
  // Digits of positions g + u * 32 + lane; -1 where there is no element or it is filtered out.
  auto load = [&](int g, int32_t(&ids)[kRadixUnroll], int(&digits)[kRadixUnroll]) {
    float xs[kRadixUnroll];
#pragma unroll
    for (int u = 0; u < kRadixUnroll; ++u) {
      const int pos = g + u * 32 + lane;
      ids[u] = pos < end ? (src == nullptr ? pos : src[pos]) : 0;
    }
#pragma unroll
    for (int u = 0; u < kRadixUnroll; ++u) xs[u] = v.row[ids[u]];
#pragma unroll
    for (int u = 0; u < kRadixUnroll; ++u) {
      const bool keep = g + u * 32 + lane < end && (!filter || Bin(xs[u], v.max_value) <= last_bin);
      digits[u] =
          keep ? static_cast<int>((DescendingKey(xs[u]) >> shift) & (kRadixDigits - 1)) : -1;
    }
  };
  for (int i = threadIdx.x; i < kRadixDigits * kSampleWarps; i += kSampleThreads) counts[i] = 0;
  __syncthreads();
  // Count. Lanes sharing a digit elect one writer; a warp's writers touch distinct entries.
  for (int g = begin; g < end; g += 32 * kRadixUnroll) {
    int32_t ids[kRadixUnroll];
    int digits[kRadixUnroll];
    load(g, ids, digits);
#pragma unroll
    for (int u = 0; u < kRadixUnroll; ++u) {
      const unsigned peers = __match_any_sync(kFullMask, digits[u]);
      if (digits[u] >= 0 && (peers & LanesBelow()) == 0) {
        counts[digits[u] * kSampleWarps + warp] += __popc(peers);
      }
      __syncwarp();
    }
  }
  __syncthreads();
  // Exclusive prefix in [digit][warp] order: where warp w's first id of each digit goes.
  int* mine = counts + threadIdx.x * kRadixCountsPerThread;
  int local[kRadixCountsPerThread];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < kRadixCountsPerThread; ++j) {
    local[j] = mine[j];
    sum += local[j];
  }
  int written;
  int prefix = BlockExclusiveScan(sum, sm.iscratch, &written);
#pragma unroll
  for (int j = 0; j < kRadixCountsPerThread; ++j) {
    mine[j] = prefix;
    prefix += local[j];
  }
  __syncthreads();
  // Scatter, advancing the warp's positions group by group (ids keep their input order).
  for (int g = begin; g < end; g += 32 * kRadixUnroll) {
    int32_t ids[kRadixUnroll];
    int digits[kRadixUnroll];
    load(g, ids, digits);
#pragma unroll
    for (int u = 0; u < kRadixUnroll; ++u) {
      const int d = digits[u];
      const unsigned peers = __match_any_sync(kFullMask, d);
      int position = 0;
      if (d >= 0) {
        position = counts[d * kSampleWarps + warp];
        dst[position + __popc(peers & LanesBelow())] = ids[u];
      }
      __syncwarp();
      if (d >= 0 && (peers & LanesBelow()) == 0) {
        counts[d * kSampleWarps + warp] = position + __popc(peers);
      }
      __syncwarp();
    }
  }
  __syncthreads();  // dst is complete (and visible to the block), counts free
  return written;
}

// Stable LSD radix sort by DescendingKey (ties keep increasing ids: the CPU's order) of the ids
// of the row's logits in bins 0..last_bin, through `scratch` (2 * vocab ids). Returns where the
// sorted ids are and their number in *count.
__device__ const int32_t* RadixSortRow(const RowView& v, int last_bin, int32_t* scratch, int* count,
                                       SampleShared& sm) {
  int32_t* a = scratch;
  int32_t* b = scratch + v.vocab;
  const int n = RadixPass(v, nullptr, static_cast<int>(v.vocab), last_bin, 0, a, sm);
  RadixPass(v, a, n, kLastBin, kRadixBits, b, sm);
  RadixPass(v, b, n, kLastBin, 2 * kRadixBits, a, sm);
  RadixPass(v, a, n, kLastBin, 3 * kRadixBits, b, sm);
  *count = n;
  return b;
}

struct Crossing {
  int64_t count;      // the first m that crosses, 0 when none does
  double cumulative;  // C(m), or C(limit) when none crosses
};

// Over the first `limit` positions of the descending order (index_at(pos) is the token id at
// position pos), C(m) = the sum of p over positions [0, m) in order: the first m >= 1 with
// C(m) > threshold (strict) or C(m) >= threshold. Tiles of kCandidateCapacity positions, four
// consecutive ones per thread, with a block scan in double.
template <typename IndexAt>
__device__ __noinline__ Crossing FindCrossing(IndexAt index_at, int64_t limit, double threshold,
                                              bool strict, const RowView& v, SampleShared& sm) {
  double carry = 0.0;
  for (int64_t tile = 0; tile < limit; tile += kCandidateCapacity) {
    const int64_t first = tile + static_cast<int64_t>(threadIdx.x) * kScanItems;
    float p[kScanItems];
    double local = 0.0;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      p[j] = first + j < limit ? Prob(v.row[index_at(first + j)], v) : 0.0f;
      local += p[j];
    }
    double tile_total;
    double c = carry + BlockExclusiveScan(local, sm.dscratch, &tile_total);
    int64_t hit = INT64_MAX;
    double hit_value = 0.0;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      c += p[j];
      if (hit == INT64_MAX && first + j < limit && (strict ? c > threshold : c >= threshold)) {
        hit = first + j + 1;
        hit_value = c;
      }
    }
    const int64_t m = BlockMinT(hit, sm.lscratch);
    if (m != INT64_MAX) {
      if (hit == m) sm.crossing = hit_value;
      __syncthreads();
      return {m, sm.crossing};
    }
    carry += tile_total;
  }
  return {0, carry};
}

struct Selection {
  bool complete;  // false: the first `available` positions cannot decide the row
  int32_t token;
};

// The CPU's top-k / top-p / draw over the descending order, given its first `available`
// positions.
template <typename IndexAt>
__device__ Selection SelectFromSorted(IndexAt index_at, int64_t available, int64_t k, float top_p,
                                      double total_all, float uniform, const RowView& v,
                                      SampleShared& sm) {
  double total_k = total_all;
  if (k < v.vocab) {
    if (available < k) return {false, -1};
    total_k = FindCrossing(index_at, k, INFINITY, /*strict=*/true, v, sm).cumulative;
  }
  int64_t kept = k;
  double total = total_k;
  if (top_p < 1.0f) {
    const Crossing cut = FindCrossing(
        index_at, min(k, available), static_cast<double>(top_p) * total_k, /*strict=*/false, v, sm);
    if (cut.count > 0) {
      kept = cut.count;
      total = cut.cumulative;
    } else if (available >= k) {
      total = cut.cumulative;  // the mass never reached the target: all k stay, as on the CPU
    } else {
      return {false, -1};
    }
  }
  const double u = static_cast<double>(uniform) * total;
  const Crossing draw = FindCrossing(index_at, kept, u, /*strict=*/true, v, sm);
  // Rounding can leave u at the very top: the last kept token, as on the CPU.
  return {true, index_at((draw.count > 0 ? draw.count : kept) - 1)};
}

__global__ void __launch_bounds__(kSampleThreads)
    SampleTokensKernel(const float* logits, int64_t logits_stride, int64_t vocab,
                       const float* temperatures, const int32_t* top_ks, const float* top_ps,
                       const uint64_t* seeds, const int64_t* draw_indices, int32_t* workspace,
                       int32_t* out_tokens, float* out_logprobs) {
  __shared__ SampleShared sm;
  const int64_t r = blockIdx.x;
  const float* row = logits + r * logits_stride;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;

  float max_value;
  int64_t argmax;
  BlockArgMax(row, vocab, sm, &max_value, &argmax);
  const float temperature = temperatures[r];
  const bool sample = temperature > 0.0f;  // NaN is greedy, as on the CPU
  const bool want_logprob = out_logprobs != nullptr;
  if (!sample && !want_logprob) {
    if (threadIdx.x == 0) out_tokens[r] = static_cast<int32_t>(argmax);
    return;
  }
  const int32_t top_k = top_ks[r];
  const float top_p = top_ps[r];
  const int64_t k = (top_k > 0 && top_k < vocab) ? top_k : vocab;
  const bool need_order = sample && (k < vocab || top_p < 1.0f);
  const RowView v{row, vocab, max_value, sample ? 1.0f / temperature : 0.0f};

  // One pass: the logprob's sum of exp, each warp segment's mass, the histogram of bins.
  if (need_order) {
    for (int b = threadIdx.x; b < kNumBins; b += kSampleThreads) sm.bins[b] = 0;
    __syncthreads();
  }
  const int64_t segment = (vocab + 32 * kSampleWarps - 1) / (32 * kSampleWarps) * 32;
  const int64_t seg_begin = min(vocab, warp * segment);
  const int64_t seg_end = min(vocab, seg_begin + segment);
  double exp_sum = 0.0;
  double mass = 0.0;
  for (int64_t g = seg_begin; g < seg_end; g += 32) {  // warp-uniform trip count
    const int64_t i = g + lane;
    const bool valid = i < seg_end;
    const float x = valid ? row[i] : 0.0f;
    if (valid && want_logprob) exp_sum += expf(x - max_value);
    if (sample) {
      if (valid) mass += Prob(x, v);
      if (need_order) {
        // The last bin holds most of a typical row: counted by difference, not by atomics. A
        // flat row puts whole warps in one bin: one atomic for the warp instead of 32 colliding.
        const int b = valid ? Bin(x, max_value) : kLastBin;
        const unsigned same = __ballot_sync(kFullMask, b == __shfl_sync(kFullMask, b, 0));
        if (same == kFullMask) {
          if (lane == 0 && b != kLastBin) atomicAdd(&sm.bins[b], 32);
        } else if (b != kLastBin) {
          atomicAdd(&sm.bins[b], 1);
        }
      }
    }
  }
  mass = internal::WarpSum(mass);
  if (lane == 0) sm.warp_mass[warp] = mass;
  if (want_logprob) {
    exp_sum = BlockSumT(exp_sum, sm.dscratch);
  } else {
    __syncthreads();
  }

  int32_t token = static_cast<int32_t>(argmax);
  if (sample) {
    double total = 0.0;
    for (int w = 0; w < kSampleWarps; ++w) total += sm.warp_mass[w];
    const float uniform = UniformFromCounter(seeds[r], static_cast<uint64_t>(draw_indices[r]));
    if (!need_order) {
      token = SampleInTokenOrder(v, segment, total, uniform, sm);
    } else {
      Selection selection{false, -1};
      const CandidateBins bins = ChooseCandidateBins(v, k, top_p, total, sm);
      int32_t* scratch = workspace + r * 2 * vocab;
      if (bins.count <= kCandidateCapacity) {
        const int n = GatherCandidates(v, bins.last_bin, sm);
        if (n <= kCandidateCapacity) {  // always: the bins are those counted
          SortCandidates(n, sm);
          const uint64_t* candidates = sm.candidates;
          selection = SelectFromSorted(
              [candidates](int64_t pos) {
                return static_cast<int32_t>(candidates[pos] & 0xffffffffu);
              },
              n, k, top_p, total, uniform, v, sm);
        }
      } else if (bins.last_bin < kLastBin) {
        int n;
        const int32_t* sorted = RadixSortRow(v, bins.last_bin, scratch, &n, sm);
        selection = SelectFromSorted([sorted](int64_t pos) { return sorted[pos]; }, n, k, top_p,
                                     total, uniform, v, sm);
      }
      // The whole row: candidates that were all the row, or (only through rounding against the
      // lower bound of the mass) too few.
      if (!selection.complete) {
        int n;
        const int32_t* sorted = RadixSortRow(v, kLastBin, scratch, &n, sm);
        selection = SelectFromSorted([sorted](int64_t pos) { return sorted[pos]; }, n, k, top_p,
                                     total, uniform, v, sm);
      }
      token = selection.token;
    }
  }
  if (threadIdx.x == 0) {
    out_tokens[r] = token;
    if (want_logprob) {
      out_logprobs[r] =
          static_cast<float>(static_cast<double>(row[token] - max_value) - log(exp_sum));
    }
  }
}

// cpu::ProcessLogits, one block of kProcessThreads per row: the row's entries in parallel (distinct
// tokens, so no two threads write one logit), then the min_p mask over the whole row. Products and
// sums are explicitly rounded (no fused multiply-add) so the penalties match the CPU bit for bit.
constexpr int kProcessThreads = 256;

__global__ void ProcessLogitsKernel(float* logits, int64_t logits_stride, int64_t vocab,
                                    cpu::LogitsProcessing p) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float* row = logits + r * logits_stride;
  const float repetition = p.repetition_penalties[r];
  const float frequency = p.frequency_penalties[r];
  const float presence = p.presence_penalties[r];
  for (int32_t e = p.entry_offsets[r] + threadIdx.x; e < p.entry_offsets[r + 1]; e += blockDim.x) {
    float* l = row + p.entry_tokens[e];
    const int32_t count = p.entry_counts[e];
    if (p.entry_flags[e] & cpu::kLogitBanned) {
      *l = -INFINITY;
      continue;
    }
    float v = *l;
    if ((p.entry_flags[e] & cpu::kLogitInPrompt) || count > 0) {
      v = v > 0.0f ? v / repetition : __fmul_rn(v, repetition);
    }
    const float penalty = __fadd_rn(__fmul_rn(frequency, static_cast<float>(count)),
                                    __fmul_rn(presence, count > 0 ? 1.0f : 0.0f));
    *l = __fsub_rn(v, penalty);
  }
  const float min_p = p.min_ps[r];
  const float temperature = p.temperatures[r];
  // Uniform per block: every thread of the row returns together or none does.
  if (!(min_p > 0.0f && temperature > 0.0f)) return;
  __syncthreads();  // the entries are written before the row is read
  const float inv_t = 1.0f / temperature;
  float local = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) local = fmaxf(local, row[i]);
  const float max_value = internal::BlockMax(local, scratch);
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (expf(__fmul_rn(row[i] - max_value, inv_t)) < min_p) row[i] = -INFINITY;
  }
}

// The logits shape SampleTokens and TopLogprobs accept: at most INT32_MAX rows (one block each),
// a vocabulary of at most kMaxSampleVocab, rows no shorter than the vocabulary. InvalidArgument
// naming `fn` and the offending value otherwise.
absl::Status CheckLogitsShape(absl::string_view fn, int64_t num_rows, int64_t vocab,
                              int64_t logits_stride) {
  if (num_rows < 0 || num_rows > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": num_rows ", num_rows, " outside [0, ", INT32_MAX, "]"));
  }
  if (vocab <= 0 || vocab > kMaxSampleVocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": vocab ", vocab, " outside [1, ", kMaxSampleVocab, "]"));
  }
  if (logits_stride < vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": logits_stride ", logits_stride, " is less than vocab ", vocab));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ProcessLogits(float* logits, int64_t logits_stride, int64_t num_rows, int64_t vocab,
                           const cpu::LogitsProcessing& p, cudaStream_t stream) {
  if (num_rows < 0 || num_rows > INT32_MAX || vocab <= 0 || logits_stride < vocab) {
    return absl::InvalidArgumentError(absl::StrCat("ProcessLogits: num_rows ", num_rows, ", vocab ",
                                                   vocab, ", logits_stride ", logits_stride,
                                                   " are not a valid shape"));
  }
  if (num_rows == 0) return absl::OkStatus();
  if (logits == nullptr || p.entry_offsets == nullptr || p.repetition_penalties == nullptr ||
      p.frequency_penalties == nullptr || p.presence_penalties == nullptr || p.min_ps == nullptr ||
      p.temperatures == nullptr) {
    return absl::InvalidArgumentError(
        "ProcessLogits: logits, entry_offsets and the per-row arrays must not be null");
  }
  ProcessLogitsKernel<<<static_cast<unsigned>(num_rows), kProcessThreads, 0, stream>>>(
      logits, logits_stride, vocab, p);
  return internal::LaunchStatus("ProcessLogitsKernel");
}

absl::Status GreedySample(const float* logits, int64_t logits_stride, int64_t num_rows,
                          int64_t vocab, int32_t* out_tokens, float* out_logprobs,
                          cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  GreedySampleKernel<<<num_rows, kSampleThreads, 0, stream>>>(logits, logits_stride, vocab,
                                                              out_tokens, out_logprobs);
  return internal::LaunchStatus("GreedySampleKernel");
}

// ---------------------------------------------------------------------------------------------
// TopLogprobs. One block per row; pick t is the block-wide argmax over the logits that come after
// pick t - 1 in (logit descending, id ascending) order, so k picks read the row k times (k <= 20;
// the row stays in L2), then one more read sums exp(x - max) in double. A row that only wants
// its token's logprob makes one pick (the maximum).
constexpr int kTopThreads = 256;

__global__ void TopLogprobsKernel(const float* logits, int64_t logits_stride, int64_t vocab,
                                  const int32_t* top_counts, int32_t max_k, int32_t* out_ids,
                                  float* out_logprobs, const int32_t* tokens,
                                  float* out_token_logprobs) {
  __shared__ float warp_v[32];
  __shared__ int64_t warp_i[32];
  __shared__ double warp_sum[32];
  __shared__ float picked_v[cpu::kMaxTopLogprobs];
  __shared__ int32_t picked_i[cpu::kMaxTopLogprobs];
  const float* row = logits + blockIdx.x * logits_stride;
  int32_t* ids = out_ids + static_cast<int64_t>(blockIdx.x) * max_k;
  float* lps = out_logprobs + static_cast<int64_t>(blockIdx.x) * max_k;
  const int k = max_k > 0 ? max(0, min(top_counts[blockIdx.x], max_k)) : 0;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  for (int j = k + static_cast<int>(threadIdx.x); j < max_k; j += blockDim.x) {
    ids[j] = -1;
    lps[j] = 0.0f;
  }
  const int picks = tokens != nullptr ? max(k, 1) : k;
  if (picks == 0) return;  // uniform across the block
  float prev_v = INFINITY;
  int64_t prev_i = -1;
  for (int t = 0; t < picks; ++t) {
    float v = 0.0f;
    int64_t i = -1;
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float x = row[j];
      const bool after_prev = x < prev_v || (x == prev_v && j > prev_i);
      if (after_prev && (i < 0 || x > v)) {
        v = x;
        i = j;
      }
    }
    WarpArgMax(v, i);
    if (lane == 0) {
      warp_v[warp] = v;
      warp_i[warp] = i;
    }
    __syncthreads();
    v = lane < num_warps ? warp_v[lane] : 0.0f;
    i = lane < num_warps ? warp_i[lane] : -1;
    WarpArgMax(v, i);  // every thread gets the pick
    if (threadIdx.x == 0) {
      picked_v[t] = v;
      picked_i[t] = static_cast<int32_t>(i);
    }
    prev_v = v;
    prev_i = i;
    __syncthreads();  // warp_v / warp_i are read before the next pick overwrites them
  }
  const float max_value = picked_v[0];
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    sum += exp(static_cast<double>(row[j] - max_value));
  }
  sum = internal::WarpSum(sum);
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int w = 0; w < num_warps; ++w) total += warp_sum[w];
  const double log_sum = log(total);
  for (int t = 0; t < k; ++t) {
    ids[t] = picked_i[t];
    lps[t] = static_cast<float>(static_cast<double>(picked_v[t] - max_value) - log_sum);
  }
  if (tokens != nullptr) {
    const float x = row[tokens[blockIdx.x]];
    out_token_logprobs[blockIdx.x] =
        static_cast<float>(static_cast<double>(x - max_value) - log_sum);
  }
}

int64_t SampleTokensWorkspaceBytes(int64_t max_rows, int64_t vocab) {
  if (max_rows <= 0 || vocab <= 0) return 0;
  constexpr int64_t kBytesPerLogit = 2 * sizeof(int32_t);
  if (max_rows > INT64_MAX / kBytesPerLogit / vocab) return INT64_MAX;
  return max_rows * vocab * kBytesPerLogit;
}

absl::Status SampleTokens(const float* logits, int64_t logits_stride, int64_t num_rows,
                          int64_t vocab, const float* temperatures, const int32_t* top_ks,
                          const float* top_ps, const uint64_t* seeds, const int64_t* draw_indices,
                          void* workspace, int64_t workspace_bytes, int32_t* out_tokens,
                          float* out_logprobs, cudaStream_t stream) {
  if (absl::Status s = CheckLogitsShape("SampleTokens", num_rows, vocab, logits_stride); !s.ok()) {
    return s;
  }
  if (num_rows == 0) return absl::OkStatus();
  if (logits == nullptr || temperatures == nullptr || top_ks == nullptr || top_ps == nullptr ||
      seeds == nullptr || draw_indices == nullptr || out_tokens == nullptr) {
    return absl::InvalidArgumentError(
        "SampleTokens: logits, temperatures, top_ks, top_ps, seeds, draw_indices and out_tokens "
        "must not be null");
  }
  const int64_t needed = SampleTokensWorkspaceBytes(num_rows, vocab);
  if (workspace == nullptr || workspace_bytes < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("SampleTokens: workspace of ", workspace == nullptr ? 0 : workspace_bytes,
                     " bytes, ", num_rows, " rows of vocab ", vocab, " need ", needed));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % alignof(int32_t) != 0) {
    return absl::InvalidArgumentError("SampleTokens: workspace is not 4-byte aligned");
  }
  SampleTokensKernel<<<static_cast<unsigned>(num_rows), kSampleThreads, 0, stream>>>(
      logits, logits_stride, vocab, temperatures, top_ks, top_ps, seeds, draw_indices,
      static_cast<int32_t*>(workspace), out_tokens, out_logprobs);
  return internal::LaunchStatus("SampleTokensKernel");
}

absl::Status TopLogprobs(const float* logits, int64_t logits_stride, int64_t num_rows,
                         int64_t vocab, const int32_t* top_counts, int32_t max_k, int32_t* out_ids,
                         float* out_logprobs, const int32_t* tokens, float* out_token_logprobs,
                         cudaStream_t stream) {
  if (absl::Status s = CheckLogitsShape("TopLogprobs", num_rows, vocab, logits_stride); !s.ok()) {
    return s;
  }
  if (max_k < 0 || max_k > cpu::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("TopLogprobs: max_k ", max_k, " outside [0, ", cpu::kMaxTopLogprobs, "]"));
  }
  if ((tokens == nullptr) != (out_token_logprobs == nullptr)) {
    return absl::InvalidArgumentError(
        "TopLogprobs: tokens and out_token_logprobs must both be set or both be null");
  }
  if (num_rows == 0 || (max_k == 0 && tokens == nullptr)) return absl::OkStatus();
  if (logits == nullptr ||
      (max_k > 0 && (top_counts == nullptr || out_ids == nullptr || out_logprobs == nullptr))) {
    return absl::InvalidArgumentError(
        "TopLogprobs: logits (and, with max_k > 0, top_counts, out_ids and out_logprobs) must not "
        "be null");
  }
  TopLogprobsKernel<<<static_cast<unsigned>(num_rows), kTopThreads, 0, stream>>>(
      logits, logits_stride, vocab, top_counts, max_k, out_ids, out_logprobs, tokens,
      out_token_logprobs);
  return internal::LaunchStatus("TopLogprobsKernel");
}

}  // namespace vamp::kernels::cuda
