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
// The recurrent kernel: each warp keeps kRowsPerWarp rows of the state in registers.
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;  // the value rows of a block's slice

// The chunked kernel. Its shared tiles always span kChunkTile tokens (rows past a shorter chunk's
// end are zero), so the tile geometry below is fixed.
constexpr int kChunkTile = 64;
static_assert(kChunkTile == kMaxDeltaRuleChunkSize);
constexpr int kSliceRows = 32;  // value rows of a block's slice
constexpr int kChunkWarps = 8;
constexpr int kChunkThreads = kChunkWarps * 32;
constexpr int kTokensPerWarp = kChunkTile / kChunkWarps;  // tokens each warp loads per chunk
constexpr int kTokenLd = kChunkTile + 4;                  // row stride of the [s][t] matrices
constexpr int kRowLd = kSliceRows + 4;                    // row stride of the [t][row] matrices
constexpr int kSliceValuesPerThread = kChunkTile * kSliceRows / kChunkThreads;
// A thread's register tile of every matrix product is 4 x 4 (float4 loads along both sides).
constexpr int kTile = 4;
constexpr int kReadoutTiles = (kChunkTile / kTile) * (kSliceRows / kTile);  // of [chunk, rows]
// The substitution's panel: its deltas live in registers, fully unrolled. A whole chunk's (64)
// was 110 KB of straight-line code that warp 0 streams through once per chunk; with panels (and
// the conflict-free Gram tiles and one square root per lane) a 4096-token prefill went from 2.58
// to 2.14 ms on an H200 (bench/results/2026-12-03-delta-rule-kernel/).
constexpr int kPanel = 16;
static_assert(kChunkTile % kPanel == 0);

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

// Row stride of the chunked kernel's shared [token][k_dim] rows (q, k, the state slice): k_dim
// rounded up to whole warps (KeysPerLane's lanes write that far; zero past k_dim), plus 4 floats
// so that the rows of a float4 column fall on distinct banks (the stride is 4 mod 32).
__host__ __device__ __forceinline__ int64_t KeyRowStride(int64_t dk) {
  return (dk + 31) / 32 * 32 + 4;
}

// Shared floats of the chunked kernel (see its layout).
int64_t ChunkSharedFloats(int64_t dk) {
  return (2 * kChunkTile + kSliceRows) * KeyRowStride(dk) + 2 * kChunkTile * kTokenLd +
         3 * kChunkTile * kRowLd + 4 * kChunkTile;
}

__device__ __forceinline__ float4 Load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ float Lane4(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// acc[i][m] += a_i . b_m over e in [0, dk4), e ascending, for the rows a_i = a + a_off[i] and
// b_m = b + b_off[m] of shared matrices (16-byte aligned rows, zero past k_dim).
__device__ __forceinline__ void DotTile(const float* a, const int (&a_off)[kTile], const float* b,
                                        const int (&b_off)[kTile], int dk4,
                                        float (&acc)[kTile][kTile]) {
#pragma unroll 2
  for (int e = 0; e < dk4; e += 4) {
    float4 av[kTile], bv[kTile];
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      av[i] = Load4(a + a_off[i] + e);
      bv[i] = Load4(b + b_off[i] + e);
    }
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
#pragma unroll
      for (int m = 0; m < kTile; ++m) {
        acc[i][m] += av[i].x * bv[m].x;
        acc[i][m] += av[i].y * bv[m].y;
        acc[i][m] += av[i].z * bv[m].z;
        acc[i][m] += av[i].w * bv[m].w;
      }
    }
  }
}

// out[t][j] = x_t . S_j (x: the shared q or k rows) for the 4 x 4 tile `p` of the [chunk, slice
// rows] product: tokens tg + 16 i (a warp's 16 values of tg read 16 distinct rows, conflict-free
// at KeyRowStride), rows 4 jg + m.
__device__ __forceinline__ void ReadoutTile(const float* x, const float* S, int ldk, int dk4, int p,
                                            float* out) {
  const int tg = p % (kChunkTile / kTile), jg = p / (kChunkTile / kTile);
  int x_off[kTile], s_off[kTile];
#pragma unroll
  for (int i = 0; i < kTile; ++i) {
    x_off[i] = (tg + i * (kChunkTile / kTile)) * ldk;
    s_off[i] = (jg * kTile + i) * ldk;
  }
  float acc[kTile][kTile] = {};
  DotTile(x, x_off, S, s_off, dk4, acc);
#pragma unroll
  for (int i = 0; i < kTile; ++i) {
#pragma unroll
    for (int m = 0; m < kTile; ++m) {
      out[(tg + i * (kChunkTile / kTile)) * kRowLd + jg * kTile + m] = acc[i][m];
    }
  }
}

// One chunk's inputs, loaded into registers ahead of use (the next chunk's while the current one
// finishes): warp w's tokens w + kChunkWarps * i of q and k as KeyVector lanes, the slice's values
// v (element threadIdx.x + kChunkThreads * m of the [chunk, slice rows] tile), and g, beta of token
// threadIdx.x. Past the chunk's end, past k_dim and past v_dim: zero.
template <int KPL>
struct ChunkInputs {
  float q[kTokensPerWarp][KPL], k[kTokensPerWarp][KPL];
  float v[kSliceValuesPerThread];
  float g, beta;

  __device__ __forceinline__ void Load(const cpu::GatedDeltaRuleArgs& a, const HeadRef& r,
                                       int64_t c0, int len, int64_t j0) {
    const int64_t dk = a.k_dim, dv = a.v_dim, h = blockIdx.y;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int i = 0; i < kTokensPerWarp; ++i) {
      const int t = warp + kChunkWarps * i;
      const float* qrow = a.q + (c0 + t) * a.q_stride + r.kh * dk;
      const float* krow = a.k + (c0 + t) * a.k_stride + r.kh * dk;
#pragma unroll
      for (int x = 0; x < KPL; ++x) {
        const int64_t e = lane + 32 * x;
        const bool in = t < len && e < dk;
        q[i][x] = in ? qrow[e] : 0.0f;
        k[i][x] = in ? krow[e] : 0.0f;
      }
    }
#pragma unroll
    for (int m = 0; m < kSliceValuesPerThread; ++m) {
      const int idx = threadIdx.x + kChunkThreads * m, t = idx / kSliceRows, j = idx % kSliceRows;
      v[m] = t < len && j0 + j < dv ? a.v[(c0 + t) * a.v_stride + h * dv + j0 + j] : 0.0f;
    }
    const int t = threadIdx.x;
    g = t < len ? a.g[(c0 + t) * a.g_stride + h] : 0.0f;
    beta = t < len ? a.beta[(c0 + t) * a.beta_stride + h] : 0.0f;
  }

  // Into shared memory: q and k normalised as the CPU twin's NormalizeHead, rows [0, dk32).
  // Lane n < 2 * kTokensPerWarp computes the normaliser of vector n (q, k of token n / 2) and
  // hands it out by shuffle: one division and square root per lane instead of sixteen (each is a
  // long instruction sequence, and sixteen of them took half the kernel's code).
  __device__ __forceinline__ void Store(const cpu::GatedDeltaRuleArgs& a, int ldk, float* qn,
                                        float* kn, float* vs, float* lg, float* betas) const {
    const int64_t dk32 = (a.k_dim + 31) / 32 * 32;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float mine = 0.0f;
#pragma unroll
    for (int i = 0; i < kTokensPerWarp; ++i) {
      float qq = 0.0f, kk = 0.0f;
#pragma unroll
      for (int x = 0; x < KPL; ++x) {
        qq += q[i][x] * q[i][x];
        kk += k[i][x] * k[i][x];
      }
      qq = WarpSum(qq);
      kk = WarpSum(kk);
      if (lane == 2 * i) mine = qq;
      if (lane == 2 * i + 1) mine = kk;
    }
    const float inv = a.l2norm_qk ? 1.0f / sqrtf(mine + cpu::kDeltaRuleL2NormEps) : 1.0f;
#pragma unroll
    for (int i = 0; i < kTokensPerWarp; ++i) {
      const float q_inv = __shfl_sync(internal::kFullMask, inv, 2 * i);
      const float k_inv = __shfl_sync(internal::kFullMask, inv, 2 * i + 1);
      const int t = warp + kChunkWarps * i;
#pragma unroll
      for (int x = 0; x < KPL; ++x) {
        const int e = lane + 32 * x;
        if (e < dk32) {
          qn[t * ldk + e] = (q[i][x] * q_inv) * a.scale;
          kn[t * ldk + e] = k[i][x] * k_inv;
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kSliceValuesPerThread; ++m) {
      const int idx = threadIdx.x + kChunkThreads * m;
      vs[idx / kSliceRows * kRowLd + idx % kSliceRows] = v[m];
    }
    if (threadIdx.x < kChunkTile) {
      lg[threadIdx.x] = g;
      betas[threadIdx.x] = beta;
    }
  }
};

// Chunk by chunk, the CPU twin's chunked form, as block-wide products on shared memory. One
// block of kChunkThreads per (sequence, value head, slice of kSliceRows value rows); the slice's
// rows of the state stay in shared memory for the whole call. Per chunk of len <= 64 tokens
// (S_0: the state before it), phases separated by block barriers:
//   0. the chunk's inputs (prefetched into registers during the previous chunk's last phase):
//      normalised q_t, k_t, the slice's v_t, g_t and beta_t into shared memory;
//   A. 4 x 4 tiles of the lower triangles of the Gram matrices k_t . k_s and q_t . k_s, and of
//      X = K S_0^T for the slice's rows, spread over the threads; the last thread also the
//      cumulative log decays G_t (ascending, as the CPU twin) and exp(G_t);
//   B. one thread per token t: the decays D_t(s) = exp(g_{s+1} + ... + g_t), summed from t down,
//      folded in: A[t][s] = beta_t D_t(s) (k_t . k_s) for s < t, B[t][s] = D_t(s) (q_t . k_s)
//      for s <= t, zero elsewhere; and W[s] = D_{len-1}(s);
//   C. warp 0, one lane per slice row j: the forward substitution
//        u_t[j] = beta_t (v_t[j] - exp(G_t) X[t][j]) - sum_{s<t} A[t][s] u_s[j]
//      by panels of kPanel tokens in registers: first the earlier panels' final u_s subtracted
//      (kPanel independent multiply-adds per s), then the panel's own triangle column by column
//      (once u_s is final it is subtracted from every later row of the panel), so the serial
//      chain is one multiply-add per token, not a reduction; meanwhile the other warps:
//      Y = Q S_0^T;
//   D. out_t[j] = exp(G_t) Y[t][j] + sum_{s<=t} B[t][s] u_s[j] and
//      S[j] = exp(G_last) S_0[j] + sum_s (W[s] u_s[j]) k_s, 4 x 4 tiles per thread.
// Every sum over tokens runs in ascending order as the CPU twin's; sums over k_dim are in
// ascending e too (the CPU's Dot may group them differently).
template <int KPL>
__global__ void __launch_bounds__(kChunkThreads, 1)
    DeltaRuleChunkedKernel(cpu::GatedDeltaRuleArgs a, int chunk) {
  HeadRef r;
  if (!ResolveHead(a, &r)) return;
  const int64_t dk = a.k_dim, dv = a.v_dim, h = blockIdx.y;
  const int64_t j0 = int64_t{blockIdx.z} * kSliceRows;  // the slice's first value row
  const int tid = threadIdx.x, lane = tid % 32;
  const int ldk = static_cast<int>(KeyRowStride(dk));
  const int dk4 = static_cast<int>((dk + 3) / 4 * 4), dk32 = static_cast<int>((dk + 31) / 32 * 32);
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* qn = smem;                        // [64, ldk] normalised, scaled q
  float* kn = qn + kChunkTile * ldk;       // [64, ldk] normalised k
  float* S = kn + kChunkTile * ldk;        // [kSliceRows, ldk] the slice's rows of S^T
  float* At = S + kSliceRows * ldk;        // [64 (s), kTokenLd] A, transposed: At[s][t]
  float* Bt = At + kChunkTile * kTokenLd;  // [64 (s), kTokenLd] B, transposed
  float* X = Bt + kChunkTile * kTokenLd;   // [64, kRowLd] K S_0^T; then W[s] u_s[j]
  float* Uw = X;
  float* Vs = X + kChunkTile * kRowLd;  // [64, kRowLd] the slice's v; then the deltas u
  float* U = Vs;
  float* Y = Vs + kChunkTile * kRowLd;  // [64, kRowLd] Q S_0^T
  float* lg = Y + kChunkTile * kRowLd;  // [64] g_t
  float* betas = lg + kChunkTile;       // [64]
  float* eG = betas + kChunkTile;       // [64] exp(G_t)
  float* W = eG + kChunkTile;           // [64] decays to the chunk's last token
  for (int idx = tid; idx < kSliceRows * dk32; idx += kChunkThreads) {
    const int j = idx / dk32, e = idx % dk32;
    S[j * ldk + e] = r.from_state && j0 + j < dv && e < dk ? r.state[(j0 + j) * dk + e] : 0.0f;
  }
  ChunkInputs<KPL> in;
  in.Load(a, r, r.begin, static_cast<int>(min(int64_t{chunk}, r.end - r.begin)), j0);
  for (int64_t c0 = r.begin; c0 < r.end; c0 += chunk) {
    const int len = static_cast<int>(min(int64_t{chunk}, r.end - c0));
    in.Store(a, ldk, qn, kn, Vs, lg, betas);  // 0
    __syncthreads();
    // A. The lower-triangle tiles of the Gram matrices are enumerated row by row.
    const int nt = (len + kTile - 1) / kTile, ng = nt * (nt + 1) / 2;
    for (int item = tid; item < 2 * ng + kReadoutTiles; item += kChunkThreads) {
      if (item >= 2 * ng) {
        ReadoutTile(kn, S, ldk, dk4, item - 2 * ng, X);
        continue;
      }
      // Items [0, ng): tiles of k.k; [ng, 2 ng): the same tiles of q.k.
      const bool kk = item < ng;
      int ti = 0, si = kk ? item : item - ng;
      while (si > ti) si -= ++ti;
      // Register i of the tile holds row 4 ti + (i + ti / 2) % 4: the row blocks of a warp's
      // lanes start on only two bank offsets (16 ti mod 32), and the rotation spreads eight
      // consecutive blocks over all 32 banks.
      int t_row[kTile], s_row[kTile], t_off[kTile], s_off[kTile];
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
        t_row[i] = ti * kTile + (i + ti / 2) % kTile;
        s_row[i] = si * kTile + (i + si / 2) % kTile;
        t_off[i] = t_row[i] * ldk;
        s_off[i] = s_row[i] * ldk;
      }
      float acc[kTile][kTile] = {};
      DotTile(kk ? kn : qn, t_off, kn, s_off, dk4, acc);
      float* gram = kk ? At : Bt;
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
#pragma unroll
        for (int m = 0; m < kTile; ++m) {
          if (s_row[m] <= t_row[i]) gram[s_row[m] * kTokenLd + t_row[i]] = acc[i][m];
        }
      }
    }
    if (tid == kChunkThreads - 1) {
      float cumulative = 0.0f;
      for (int t = 0; t < kChunkTile; ++t) {
        cumulative += lg[t];
        eG[t] = t < len ? expf(cumulative) : 0.0f;
      }
    }
    __syncthreads();
    if (tid < kChunkTile) {  // B
      const int t = tid;
      const float beta = betas[t];
      float sum = 0.0f;
      for (int s = kChunkTile - 1; s >= 0; --s) {
        float av = 0.0f, bv = 0.0f, d = 0.0f;
        if (t < len && s <= t) {
          d = 1.0f;
          if (s < t) {
            sum += lg[s + 1];
            d = expf(sum);
            av = beta * d * At[s * kTokenLd + t];
          }
          bv = d * Bt[s * kTokenLd + t];
        }
        At[s * kTokenLd + t] = av;
        Bt[s * kTokenLd + t] = bv;
        if (t == len - 1) W[s] = d;  // zero past the chunk's end
      }
    }
    __syncthreads();
    if (tid < 32) {  // C: the substitution, lane = slice row, in panels of kPanel tokens
      for (int p0 = 0; p0 < len; p0 += kPanel) {
        float x[kPanel];
#pragma unroll
        for (int i = 0; i < kPanel; ++i) {
          const int t = p0 + i;
          x[i] = betas[t] * (Vs[t * kRowLd + lane] - eG[t] * X[t * kRowLd + lane]);
        }
        for (int s = 0; s < p0; ++s) {  // the earlier panels' final deltas
          const float us = U[s * kRowLd + lane];
#pragma unroll
          for (int i = 0; i < kPanel; i += 4) {
            const float4 coeff = Load4(At + s * kTokenLd + p0 + i);
#pragma unroll
            for (int c = 0; c < 4; ++c) x[i + c] -= Lane4(coeff, c) * us;
          }
        }
        // The panel's own triangle. Writing row t of U and Uw overwrites row t of Vs and X,
        // which this panel has read and no later one reads.
#pragma unroll
        for (int i = 0; i < kPanel; ++i) {
          const int s = p0 + i;
          U[s * kRowLd + lane] = x[i];
          Uw[s * kRowLd + lane] = W[s] * x[i];
#pragma unroll
          for (int i4 = (i + 1) / 4 * 4; i4 < kPanel; i4 += 4) {
            const float4 coeff = Load4(At + s * kTokenLd + p0 + i4);
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              if (i4 + c > i) x[i4 + c] -= Lane4(coeff, c) * x[i];
            }
          }
        }
      }
    } else {
      for (int p = tid - 32; p < kReadoutTiles; p += kChunkThreads - 32) {
        ReadoutTile(qn, S, ldk, dk4, p, Y);
      }
    }
    __syncthreads();
    // The next chunk's inputs, in flight during D (its registers are free until the next 0).
    if (c0 + chunk < r.end) {
      in.Load(a, r, c0 + chunk, static_cast<int>(min(int64_t{chunk}, r.end - c0 - chunk)), j0);
    }
    // D. Outputs: tiles of tokens 4 tg + i and rows 4 jg + m, threads [0, kReadoutTiles).
    if (const int p = tid - (kChunkThreads - kReadoutTiles); p >= 0) {
      const int tg = p % (kChunkTile / kTile), jg = p / (kChunkTile / kTile);
      float acc[kTile][kTile];
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
        const int t = tg * kTile + i;
        const float4 y = Load4(Y + t * kRowLd + jg * kTile);
#pragma unroll
        for (int m = 0; m < kTile; ++m) acc[i][m] = eG[t] * Lane4(y, m);
      }
      const int s_end = min(len, (tg + 1) * kTile);
      for (int s = 0; s < s_end; ++s) {
        const float4 b = Load4(Bt + s * kTokenLd + tg * kTile);
        const float4 u = Load4(U + s * kRowLd + jg * kTile);
#pragma unroll
        for (int i = 0; i < kTile; ++i) {
#pragma unroll
          for (int m = 0; m < kTile; ++m) acc[i][m] += Lane4(b, i) * Lane4(u, m);
        }
      }
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
        const int t = tg * kTile + i;
        if (t >= len) break;
        float* o = a.out + (c0 + t) * a.out_stride + h * dv + j0 + jg * kTile;
#pragma unroll
        for (int m = 0; m < kTile; ++m) {
          if (j0 + jg * kTile + m < dv) o[m] = acc[i][m];
        }
      }
    }
    // D. The state: tiles of rows 4 jg + m and elements 4 eg + c; a warp spans 8 values of eg
    // (one contiguous 128-byte k row segment) and 4 of jg.
    const float state_decay = eG[len - 1];
    const int e_groups = dk4 / 4;
    const int state_tiles = (e_groups + 7) / 8 * 8 * (kSliceRows / kTile);
    for (int p = tid; p < state_tiles; p += kChunkThreads) {
      const int jg = p / 8 % (kSliceRows / kTile);
      const int eg = p % 8 + p / (8 * (kSliceRows / kTile)) * 8;
      if (eg >= e_groups) continue;
      float acc[kTile][4];
#pragma unroll
      for (int m = 0; m < kTile; ++m) {
        const float4 s0 = Load4(S + (jg * kTile + m) * ldk + eg * 4);
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[m][c] = Lane4(s0, c) * state_decay;
      }
      for (int s = 0; s < len; ++s) {
        const float4 kv = Load4(kn + s * ldk + eg * 4);
        const float4 w = Load4(Uw + s * kRowLd + jg * kTile);
#pragma unroll
        for (int m = 0; m < kTile; ++m) {
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[m][c] += Lane4(kv, c) * Lane4(w, m);
        }
      }
#pragma unroll
      for (int m = 0; m < kTile; ++m) {
        *reinterpret_cast<float4*>(S + (jg * kTile + m) * ldk + eg * 4) =
            make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
      }
    }
    __syncthreads();  // the chunk's shared data is dead before the next chunk overwrites it
  }
  for (int idx = tid; idx < kSliceRows * dk32; idx += kChunkThreads) {
    const int j = idx / dk32, e = idx % dk32;
    if (j0 + j < dv && e < dk) r.state[(j0 + j) * dk + e] = S[j * ldk + e];
  }
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

// blockIdx = (sequence, value head, slice of `rows` value rows).
dim3 HeadGrid(const cpu::GatedDeltaRuleArgs& a, int rows) {
  return dim3(a.num_seqs, a.num_v_heads, CeilDiv(a.v_dim, rows));
}

template <int KPL>
absl::Status LaunchRecurrent(const cpu::GatedDeltaRuleArgs& a, cudaStream_t stream) {
  DeltaRuleRecurrentKernel<KPL><<<HeadGrid(a, kRowsPerBlock), kThreads, 0, stream>>>(a);
  return internal::LaunchStatus("DeltaRuleRecurrentKernel");
}

template <int KPL>
absl::Status LaunchChunked(const cpu::GatedDeltaRuleArgs& a, int chunk, cudaStream_t stream) {
  // At most (2 * 64 + 32) * 260 + 2 * 64 * 68 + 3 * 64 * 36 + 4 * 64 floats = 224.5 KiB (k_dim
  // 256): within Hopper's 227 KiB per block. 144.5 KiB at k_dim 128.
  const size_t bytes = ChunkSharedFloats(a.k_dim) * sizeof(float);
  if (absl::Status s = internal::CudaStatus(
          cudaFuncSetAttribute(DeltaRuleChunkedKernel<KPL>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "cudaFuncSetAttribute(DeltaRuleChunkedKernel)");
      !s.ok()) {
    return s;
  }
  DeltaRuleChunkedKernel<KPL><<<HeadGrid(a, kSliceRows), kChunkThreads, bytes, stream>>>(a, chunk);
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
