#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/gated_delta_rule.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce.cuh"

namespace vamp::kernels::cuda {
namespace {

using internal::CeilDiv;
using internal::WarpSum;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;  // the value rows of a block's slice
// Row stride of the shared deltas u[t][row]: odd, so that lanes reading u[s][row] for
// consecutive s hit distinct banks.
constexpr int kUStride = kRowsPerBlock + 1;
// Each thread of the chunked kernel's Gram step computes a kGramTile x kGramTile tile of it.
constexpr int kGramTile = 4;

// The block's sequence, value head and state, from blockIdx = (sequence, value head, slice).
struct HeadRef {
  int64_t begin = 0, end = 0;  // the sequence's rows
  int64_t kh = 0;              // the key head serving value head h
  float* state = nullptr;      // [v_dim, k_dim]
  bool from_state = false;     // false: start from zero (the slot is not read)
};

// False for an empty sequence and for one the kernels skip (negative length or slot). Uniform
// over the block, so a block may return before its first barrier.
__device__ __forceinline__ bool ResolveHead(const cpu::GatedDeltaRuleArgs& a, HeadRef* r) {
  const int64_t i = blockIdx.x, h = blockIdx.y;
  r->begin = a.query_start_loc[i];
  r->end = a.query_start_loc[i + 1];
  const int32_t slot = a.state_slots[i];
  if (r->end <= r->begin || slot < 0) return false;
  r->kh = h / (a.num_v_heads / a.num_k_heads);
  r->state = a.states + slot * a.state_slot_stride + h * a.v_dim * a.k_dim;
  r->from_state = a.has_initial_state == nullptr || a.has_initial_state[i] != 0;
  return true;
}

// A warp's view of a k_dim vector: lane l holds elements l, l + 32, ..., l + 32 * (KPL - 1);
// those at or past k_dim are zero.
template <int KPL>
struct KeyVector {
  float x[KPL];
};

// The CPU twin's NormalizeHead on one warp: scale * src / sqrt(sum src^2 + eps) when l2norm,
// else scale * src. Every lane gets the same normaliser.
template <int KPL>
__device__ __forceinline__ KeyVector<KPL> LoadNormalized(const float* src, int64_t dk, bool l2norm,
                                                         float scale, int lane) {
  KeyVector<KPL> v;
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < KPL; ++i) {
    const int64_t e = lane + 32 * i;
    v.x[i] = e < dk ? src[e] : 0.0f;
    sum_sq += v.x[i] * v.x[i];
  }
  const float inv = l2norm ? 1.0f / sqrtf(WarpSum(sum_sq) + cpu::kDeltaRuleL2NormEps) : 1.0f;
#pragma unroll
  for (int i = 0; i < KPL; ++i) v.x[i] = (v.x[i] * inv) * scale;
  return v;
}

// The warp's kRowsPerWarp rows of S^T (row j = column j of S), lanes over k_dim as KeyVector.
// Rows at or past v_dim stay zero and are never stored.
template <int KPL>
struct StateRows {
  float s[kRowsPerWarp][KPL];

  __device__ __forceinline__ void Load(const HeadRef& r, int64_t j0, int64_t dk, int64_t dv,
                                       int lane) {
#pragma unroll
    for (int w = 0; w < kRowsPerWarp; ++w) {
#pragma unroll
      for (int i = 0; i < KPL; ++i) {
        const int64_t j = j0 + w, e = lane + 32 * i;
        s[w][i] = r.from_state && j < dv && e < dk ? r.state[j * dk + e] : 0.0f;
      }
    }
  }

  __device__ __forceinline__ void Store(const HeadRef& r, int64_t j0, int64_t dk, int64_t dv,
                                        int lane) const {
#pragma unroll
    for (int w = 0; w < kRowsPerWarp; ++w) {
#pragma unroll
      for (int i = 0; i < KPL; ++i) {
        const int64_t j = j0 + w, e = lane + 32 * i;
        if (j < dv && e < dk) r.state[j * dk + e] = s[w][i];
      }
    }
  }

  // Row w . x over k_dim (warp-reduced; every lane gets it).
  __device__ __forceinline__ float Dot(int w, const KeyVector<KPL>& x) const {
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < KPL; ++i) d += s[w][i] * x.x[i];
    return WarpSum(d);
  }
};

// Row stride of the chunked kernel's shared q and k rows: odd, so that threads reading one
// element of consecutive rows (the Gram step) hit distinct banks.
__host__ __device__ __forceinline__ int64_t KeyRowStride(int64_t dk) { return dk | 1; }

// Elements e = lane + 32 * i < dk of row `t` of a shared matrix of row stride ld as a KeyVector.
template <int KPL>
__device__ __forceinline__ KeyVector<KPL> SharedRow(const float* m, int64_t t, int64_t ld,
                                                    int64_t dk, int lane) {
  KeyVector<KPL> v;
#pragma unroll
  for (int i = 0; i < KPL; ++i) {
    const int64_t e = lane + 32 * i;
    v.x[i] = e < dk ? m[t * ld + e] : 0.0f;
  }
  return v;
}

// Token by token, exactly the CPU twin's recurrence. Each warp works alone on its rows (no block
// barrier): per token it normalises q and k itself, then for each row j decays it, computes the
// delta (v_j - row . k) * beta, adds k * delta and reads out row . q.
template <int KPL>
__global__ void __launch_bounds__(kThreads) DeltaRuleRecurrentKernel(cpu::GatedDeltaRuleArgs a) {
  HeadRef r;
  if (!ResolveHead(a, &r)) return;
  const int64_t dk = a.k_dim, dv = a.v_dim, h = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const int64_t j0 = int64_t{blockIdx.z} * kRowsPerBlock + threadIdx.x / 32 * kRowsPerWarp;
  if (j0 >= dv) return;  // a warp without rows
  StateRows<KPL> S;
  S.Load(r, j0, dk, dv, lane);
  for (int64_t t = r.begin; t < r.end; ++t) {
    const KeyVector<KPL> qn =
        LoadNormalized<KPL>(a.q + t * a.q_stride + r.kh * dk, dk, a.l2norm_qk, a.scale, lane);
    const KeyVector<KPL> kn =
        LoadNormalized<KPL>(a.k + t * a.k_stride + r.kh * dk, dk, a.l2norm_qk, 1.0f, lane);
    const float decay = expf(a.g[t * a.g_stride + h]);
    const float beta = a.beta[t * a.beta_stride + h];
    const float* v = a.v + t * a.v_stride + h * dv;
    float* o = a.out + t * a.out_stride + h * dv;
#pragma unroll
    for (int w = 0; w < kRowsPerWarp; ++w) {
      const int64_t j = j0 + w;
      if (j >= dv) break;
#pragma unroll
      for (int i = 0; i < KPL; ++i) S.s[w][i] *= decay;
      const float delta = (v[j] - S.Dot(w, kn)) * beta;
#pragma unroll
      for (int i = 0; i < KPL; ++i) S.s[w][i] += kn.x[i] * delta;
      const float out = S.Dot(w, qn);
      if (lane == 0) o[j] = out;
    }
  }
  S.Store(r, j0, dk, dv, lane);
}

// Shared floats of the chunked kernel for chunks of `chunk` tokens (see its layout).
int64_t ChunkSharedFloats(int64_t chunk, int64_t dk) {
  return 2 * chunk * KeyRowStride(dk) + 2 * chunk * (chunk + 1) + chunk * kUStride + 4 * chunk;
}

// Chunk by chunk, the CPU twin's chunked form. Per chunk of len tokens (S_0: the state before it):
//   1. one warp per token: normalised q_t, k_t into shared memory, with g_t and beta_t;
//   2. one thread per kGramTile x kGramTile tile of pairs (t, s), s <= t: A[t][s] = k_t . k_s
//      (s < t), B[t][s] = q_t . k_s, each a sum over k_dim in ascending order; thread 0 the
//      cumulative log decays G_t and exp(G_t);
//   3. one thread per token t: the decays D_t(s) = exp(g_{s+1} + ... + g_t), summed from t down,
//      folded in: A[t][s] = beta_t D_t(s) (k_t . k_s), B[t][s] = D_t(s) (q_t . k_s); and the
//      decays to the chunk's last token W[s] = D_{len-1}(s);
//   4. each warp for its rows j, t ascending (forward substitution; u_s final for s < t):
//      u_t[j] = beta_t (v_t[j] - exp(G_t) S_0[j] . k_t) - sum_{s<t} A[t][s] u_s[j];
//   5. out_t[j] = exp(G_t) S_0[j] . q_t + sum_{s<=t} B[t][s] u_s[j];
//   6. S[j] = exp(G_last) S_0[j] + sum_s (W[s] u_s[j]) k_s, s ascending (the CPU's order).
// Steps 4-6 touch only the warp's own rows of u and the state, so they need no block barrier.
template <int KPL>
__global__ void __launch_bounds__(kThreads)
    DeltaRuleChunkedKernel(cpu::GatedDeltaRuleArgs a, int chunk) {
  HeadRef r;
  if (!ResolveHead(a, &r)) return;
  const int64_t dk = a.k_dim, dv = a.v_dim, h = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int row0 = warp * kRowsPerWarp;  // the warp's first row within the slice
  const int64_t j0 = int64_t{blockIdx.z} * kRowsPerBlock + row0;
  const int ld = chunk + 1;  // row stride of A and B: odd for chunk 64, so step 3 is conflict-free
  const int64_t ldk = KeyRowStride(dk);
  extern __shared__ float smem[];
  float* qn = smem;                  // [chunk, ldk]
  float* kn = qn + chunk * ldk;      // [chunk, ldk]
  float* A = kn + chunk * ldk;       // [chunk, ld]
  float* B = A + chunk * ld;         // [chunk, ld]
  float* u = B + chunk * ld;         // [chunk, kUStride]: the deltas of the slice's rows
  float* lg = u + chunk * kUStride;  // [chunk] log decays g_t
  float* betas = lg + chunk;         // [chunk]
  float* eG = betas + chunk;         // [chunk] exp(G_t)
  float* W = eG + chunk;             // [chunk] decays to the last token
  StateRows<KPL> S;
  S.Load(r, j0, dk, dv, lane);
  for (int64_t c0 = r.begin; c0 < r.end; c0 += chunk) {
    const int len = static_cast<int>(min(int64_t{chunk}, r.end - c0));
    for (int t = warp; t < len; t += kWarps) {  // 1
      const int64_t row = c0 + t;
      const KeyVector<KPL> q =
          LoadNormalized<KPL>(a.q + row * a.q_stride + r.kh * dk, dk, a.l2norm_qk, a.scale, lane);
      const KeyVector<KPL> k =
          LoadNormalized<KPL>(a.k + row * a.k_stride + r.kh * dk, dk, a.l2norm_qk, 1.0f, lane);
#pragma unroll
      for (int i = 0; i < KPL; ++i) {
        const int64_t e = lane + 32 * i;
        if (e < dk) {
          qn[t * ldk + e] = q.x[i];
          kn[t * ldk + e] = k.x[i];
        }
      }
      if (lane == 0) {
        lg[t] = a.g[row * a.g_stride + h];
        betas[t] = a.beta[row * a.beta_stride + h];
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // 2: G_t, ascending as the CPU twin
      float cumulative = 0.0f;
      for (int t = 0; t < len; ++t) {
        cumulative += lg[t];
        eG[t] = expf(cumulative);
      }
    }
    const int tiles = (len + kGramTile - 1) / kGramTile;  // 2: the Gram matrices
    for (int p = threadIdx.x; p < tiles * tiles; p += kThreads) {
      const int t0 = p / tiles * kGramTile, s0 = p % tiles * kGramTile;
      if (s0 > t0) continue;  // every pair of the tile has s > t
      // Rows past the chunk's end are clamped to its last (their sums are not stored).
      int trow[kGramTile], srow[kGramTile];
#pragma unroll
      for (int i = 0; i < kGramTile; ++i) {
        trow[i] = min(t0 + i, len - 1) * static_cast<int>(ldk);
        srow[i] = min(s0 + i, len - 1) * static_cast<int>(ldk);
      }
      float kk[kGramTile][kGramTile] = {}, qk[kGramTile][kGramTile] = {};
      for (int e = 0; e < dk; ++e) {
        float kt[kGramTile], qt[kGramTile], ks[kGramTile];
#pragma unroll
        for (int i = 0; i < kGramTile; ++i) {
          kt[i] = kn[trow[i] + e];
          qt[i] = qn[trow[i] + e];
          ks[i] = kn[srow[i] + e];
        }
#pragma unroll
        for (int i = 0; i < kGramTile; ++i) {
#pragma unroll
          for (int m = 0; m < kGramTile; ++m) {
            kk[i][m] += kt[i] * ks[m];
            qk[i][m] += qt[i] * ks[m];
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kGramTile; ++i) {
#pragma unroll
        for (int m = 0; m < kGramTile; ++m) {
          const int t = t0 + i, s = s0 + m;
          if (t < len && s <= t) {
            A[t * ld + s] = kk[i][m];
            B[t * ld + s] = qk[i][m];
          }
        }
      }
    }
    __syncthreads();
    if (const int t = threadIdx.x; t < len) {  // 3
      float sum = 0.0f;
      for (int s = t - 1; s >= 0; --s) {
        sum += lg[s + 1];
        const float d = expf(sum);
        A[t * ld + s] = betas[t] * d * A[t * ld + s];
        B[t * ld + s] = d * B[t * ld + s];
        if (t == len - 1) W[s] = d;
      }
      if (t == len - 1) W[t] = 1.0f;
    }
    __syncthreads();
    // Steps 4-6 for the warp's rows side by side: each row's arithmetic is in the same order as
    // row by row, but the two rows' reductions (one WarpSum chain each) overlap, which halves the
    // serial latency of the substitution.
    bool live[kRowsPerWarp];
#pragma unroll
    for (int w = 0; w < kRowsPerWarp; ++w) live[w] = j0 + w < dv;
      // 4: the terms of S_0 first (independent over t, so their reductions overlap), then the
      // substitution proper, the only part serial in t.
#pragma unroll 4
    for (int t = 0; t < len; ++t) {
      const KeyVector<KPL> kt = SharedRow<KPL>(kn, t, ldk, dk, lane);
      const float* vt = a.v + (c0 + t) * a.v_stride + h * dv + j0;
#pragma unroll
      for (int w = 0; w < kRowsPerWarp; ++w) {
        const float dot = S.Dot(w, kt);
        if (live[w] && lane == 0) u[t * kUStride + row0 + w] = betas[t] * (vt[w] - eG[t] * dot);
      }
    }
    for (int t = 0; t < len; ++t) {
      float acc[kRowsPerWarp];
#pragma unroll
      for (int w = 0; w < kRowsPerWarp; ++w) {
        acc[w] = 0.0f;
        for (int s = lane; s < t; s += 32) acc[w] += A[t * ld + s] * u[s * kUStride + row0 + w];
        acc[w] = WarpSum(acc[w]);
      }
      if (lane == 0) {
#pragma unroll
        for (int w = 0; w < kRowsPerWarp; ++w) {
          if (live[w]) u[t * kUStride + row0 + w] -= acc[w];
        }
      }
      __syncwarp();  // u_t visible to the warp before u_{t+1} reads it
    }
#pragma unroll 4
    for (int t = 0; t < len; ++t) {  // 5
      const KeyVector<KPL> qt = SharedRow<KPL>(qn, t, ldk, dk, lane);
      float* ot = a.out + (c0 + t) * a.out_stride + h * dv + j0;
#pragma unroll
      for (int w = 0; w < kRowsPerWarp; ++w) {
        const float readout = eG[t] * S.Dot(w, qt);
        float acc = 0.0f;
        for (int s = lane; s <= t; s += 32) acc += B[t * ld + s] * u[s * kUStride + row0 + w];
        acc = WarpSum(acc);
        if (live[w] && lane == 0) ot[w] = readout + acc;
      }
    }
    const float state_decay = eG[len - 1];  // 6
#pragma unroll
    for (int w = 0; w < kRowsPerWarp; ++w) {
#pragma unroll
      for (int i = 0; i < KPL; ++i) S.s[w][i] *= live[w] ? state_decay : 1.0f;
    }
    for (int s = 0; s < len; ++s) {
      const KeyVector<KPL> ks = SharedRow<KPL>(kn, s, ldk, dk, lane);
#pragma unroll
      for (int w = 0; w < kRowsPerWarp; ++w) {
        if (!live[w]) continue;
        const float f = W[s] * u[s * kUStride + row0 + w];
#pragma unroll
        for (int i = 0; i < KPL; ++i) S.s[w][i] += ks.x[i] * f;
      }
    }
    __syncthreads();  // the chunk's shared data is dead before the next chunk overwrites it
  }
  S.Store(r, j0, dk, dv, lane);
}

// The elementwise gates, one thread per (token, head).
__global__ void DeltaGatesKernel(const float* a, int64_t a_stride, const float* b, int64_t b_stride,
                                 const float* a_log, const float* dt_bias, int64_t num_tokens,
                                 int64_t num_heads, float* g, int64_t g_stride, float* beta,
                                 int64_t beta_stride) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= num_tokens * num_heads) return;
  const int64_t t = idx / num_heads, h = idx % num_heads;
  const float x = a[t * a_stride + h] + dt_bias[h];
  const float softplus = x > 20.0f ? x : log1pf(expf(x));
  g[t * g_stride + h] = -expf(a_log[h]) * softplus;
  beta[t * beta_stride + h] = 1.0f / (1.0f + expf(-b[t * b_stride + h]));
}

// This twin's limits first (a head too large for the kernels is named as such, whatever its state
// stride), then the CPU twin's shape checks.
absl::Status Check(const cpu::GatedDeltaRuleArgs& a, int64_t chunk_size) {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("gated delta rule: ", parts...));
  };
  if (chunk_size > kMaxDeltaRuleChunkSize) {
    return bad("chunk_size ", chunk_size, " is above ", kMaxDeltaRuleChunkSize);
  }
  if (a.k_dim > kMaxDeltaRuleHeadDim || a.v_dim > kMaxDeltaRuleHeadDim) {
    return bad("k_dim ", a.k_dim, " or v_dim ", a.v_dim, " is above ", kMaxDeltaRuleHeadDim);
  }
  if (a.num_v_heads > 65535 || a.num_seqs > std::numeric_limits<int32_t>::max()) {
    return bad("num_v_heads ", a.num_v_heads, " or num_seqs ", a.num_seqs, " exceeds the grid");
  }
  return cpu::CheckGatedDeltaRuleShapes(a, chunk_size);
}

// Lanes' share of k_dim, rounded up to an instantiated KPL.
int KeysPerLane(int64_t dk) { return dk <= 32 ? 1 : dk <= 64 ? 2 : dk <= 128 ? 4 : 8; }

dim3 HeadGrid(const cpu::GatedDeltaRuleArgs& a) {
  return dim3(a.num_seqs, a.num_v_heads, CeilDiv(a.v_dim, kRowsPerBlock));
}

template <int KPL>
absl::Status LaunchRecurrent(const cpu::GatedDeltaRuleArgs& a, cudaStream_t stream) {
  DeltaRuleRecurrentKernel<KPL><<<HeadGrid(a), kThreads, 0, stream>>>(a);
  return internal::LaunchStatus("DeltaRuleRecurrentKernel");
}

template <int KPL>
absl::Status LaunchChunked(const cpu::GatedDeltaRuleArgs& a, int chunk, cudaStream_t stream) {
  // At most 64 * (2 * 257 + 2 * 65 + 17 + 4) floats = 166 KiB: within Hopper's 227 KiB per block.
  const size_t bytes = ChunkSharedFloats(chunk, a.k_dim) * sizeof(float);
  if (absl::Status s = internal::CudaStatus(
          cudaFuncSetAttribute(DeltaRuleChunkedKernel<KPL>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "cudaFuncSetAttribute(DeltaRuleChunkedKernel)");
      !s.ok()) {
    return s;
  }
  DeltaRuleChunkedKernel<KPL><<<HeadGrid(a), kThreads, bytes, stream>>>(a, chunk);
  return internal::LaunchStatus("DeltaRuleChunkedKernel");
}

}  // namespace

absl::Status GatedDeltaRuleRecurrent(const cpu::GatedDeltaRuleArgs& a, cudaStream_t stream) {
  if (absl::Status s = Check(a, 1); !s.ok()) return s;
  if (a.num_seqs <= 0) return absl::OkStatus();
  switch (KeysPerLane(a.k_dim)) {
    case 1:
      return LaunchRecurrent<1>(a, stream);
    case 2:
      return LaunchRecurrent<2>(a, stream);
    case 4:
      return LaunchRecurrent<4>(a, stream);
    default:
      return LaunchRecurrent<8>(a, stream);
  }
}

absl::Status GatedDeltaRuleChunked(const cpu::GatedDeltaRuleArgs& a, int64_t chunk_size,
                                   cudaStream_t stream) {
  if (absl::Status s = Check(a, chunk_size); !s.ok()) return s;
  if (a.num_seqs <= 0) return absl::OkStatus();
  const int chunk = static_cast<int>(chunk_size);
  switch (KeysPerLane(a.k_dim)) {
    case 1:
      return LaunchChunked<1>(a, chunk, stream);
    case 2:
      return LaunchChunked<2>(a, chunk, stream);
    case 4:
      return LaunchChunked<4>(a, chunk, stream);
    default:
      return LaunchChunked<8>(a, chunk, stream);
  }
}

absl::Status GatedDeltaGates(const float* a, int64_t a_stride, const float* b, int64_t b_stride,
                             const float* a_log, const float* dt_bias, int64_t num_tokens,
                             int64_t num_heads, float* g, int64_t g_stride, float* beta,
                             int64_t beta_stride, cudaStream_t stream) {
  if (num_tokens < 0 || num_heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("gated delta gates: num_tokens ", num_tokens,
                                                   " and num_heads ", num_heads,
                                                   " must be non-negative"));
  }
  if (num_tokens == 0 || num_heads == 0) return absl::OkStatus();
  constexpr int kGateThreads = 256;
  DeltaGatesKernel<<<CeilDiv(num_tokens * num_heads, kGateThreads), kGateThreads, 0, stream>>>(
      a, a_stride, b, b_stride, a_log, dt_bias, num_tokens, num_heads, g, g_stride, beta,
      beta_stride);
  return internal::LaunchStatus("DeltaGatesKernel");
}

}  // namespace vamp::kernels::cuda
