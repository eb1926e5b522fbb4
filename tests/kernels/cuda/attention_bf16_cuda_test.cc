// bfloat16 KV write and paged attention on the GPU against their CPU twins (kernels/cpu/), on a
// block-major cache of two layers (the layout of shared/DESIGN.md) with shuffled block tables,
// plus host-only tests of the launch planner (those run without a GPU).
//
// Poison: every cache element the kernels must not read (the other layer, unreferenced blocks,
// slots past a sequence's length, padding between query rows) is NaN, so reading one shows up as
// a NaN output. Tolerance: |gpu - cpu| <= 2e-2 * max(1, |cpu|) per element (the GPU rounds the
// softmax probabilities to bf16 for the P V product and both round the output to bf16), and the
// RMS of the difference at most 8e-3 * max(1, RMS(cpu)) so that a systematic error (a key too many
// or too few) cannot hide below the per-element bound. The causal mask is also checked exactly:
// changing the one key only a sequence's last query row sees must leave every other row's output
// bit-identical.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cuda/attention.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace vamp::kernels::cuda {
namespace {

constexpr double kTol = 2e-2;
constexpr double kRmsTol = 8e-3;
constexpr int64_t kLayers = 2;
constexpr int64_t kLayer = 1;  // the layer under test: its pointers are offsets inside block 0
const BFloat16 kNaN = ToBFloat16(std::numeric_limits<float>::quiet_NaN());
const BFloat16 kSentinel = ToBFloat16(-12345.0f);

#define VAMP_EXPECT_CUDA_OK(expr) EXPECT_EQ((expr), cudaSuccess) << #expr

std::vector<float> ToFloats(const std::vector<BFloat16>& v) {
  std::vector<float> f(v.size());
  ToFloat(absl::MakeConstSpan(v), f.data());
  return f;
}

struct Shape {
  int64_t q_heads, kv_heads, head_dim, block_size;
};

std::string ShapeName(const Shape& s) {
  return "heads " + std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads) + " dim " +
         std::to_string(s.head_dim) + " block " + std::to_string(s.block_size);
}

struct Batch {
  std::vector<int32_t> q_lens, seq_lens;
  std::string name;
};

// Host data of one attention call. Only K/V of layer 1 at positions < seq_len of referenced
// blocks and the first head_dim * q_heads elements of each query row hold numbers; the rest is
// NaN.
struct Problem {
  Shape shape;
  KvCacheStrides strides;
  int64_t k_offset = 0, v_offset = 0, table_stride = 0, q_stride = 0, out_stride = 0;
  int64_t num_seqs = 0, rows = 0, max_query_len = 0, max_seq_len = 0;
  std::vector<int32_t> tables, seq_lens, qsl;
  std::vector<BFloat16> cache, q;

  // Index of K (or V, with v_offset) of `pos` of sequence `seq`, head `h`, dim `d` in `cache`.
  int64_t CacheIndex(int64_t seq, int64_t pos, int64_t h, int64_t d, bool value) const {
    const int64_t block = tables[seq * table_stride + pos / shape.block_size];
    return (value ? v_offset : k_offset) + block * strides.block_stride +
           (pos % shape.block_size) * strides.token_stride + h * strides.head_stride + d;
  }

  // PagedAttention's arguments for the whole problem over `q`, `cache`, `tables`, `seq_lens` and
  // `qsl` (the host vectors above or device copies of them), writing `out`; no workspace.
  PagedAttentionArgs<BFloat16> Args(const BFloat16* q_data, const BFloat16* cache_data,
                                    const int32_t* table_data, const int32_t* seq_len_data,
                                    const int32_t* qsl_data, BFloat16* out, float scale) const {
    return {.q = q_data,
            .q_stride = q_stride,
            .k_cache = cache_data + k_offset,
            .v_cache = cache_data + v_offset,
            .strides = strides,
            .block_size = shape.block_size,
            .block_tables = table_data,
            .block_table_stride = table_stride,
            .seq_lens = seq_len_data,
            .query_start_loc = qsl_data,
            .num_seqs = num_seqs,
            .max_query_len = max_query_len,
            .max_seq_len = max_seq_len,
            .num_q_heads = shape.q_heads,
            .num_kv_heads = shape.kv_heads,
            .head_dim = shape.head_dim,
            .scale = scale,
            .out = out,
            .out_stride = out_stride};
  }
};

// `aligned`: strides that are multiples of 8 elements (the tensor-core layout); otherwise the
// query rows are padded by 3 elements.
Problem MakeProblem(const Shape& s, const Batch& b, uint32_t seed, bool aligned = true) {
  Problem p;
  p.shape = s;
  const int64_t per_layer = s.block_size * s.kv_heads * s.head_dim;
  p.strides = {kLayers * 2 * per_layer, s.kv_heads * s.head_dim, s.head_dim};
  p.k_offset = kLayer * 2 * per_layer;
  p.v_offset = p.k_offset + per_layer;
  p.num_seqs = b.q_lens.size();
  p.seq_lens = b.seq_lens;
  p.qsl.assign(p.num_seqs + 1, 0);
  for (int64_t i = 0; i < p.num_seqs; ++i) {
    p.qsl[i + 1] = p.qsl[i] + b.q_lens[i];
    p.max_query_len = std::max<int64_t>(p.max_query_len, b.q_lens[i]);
    p.max_seq_len = std::max<int64_t>(p.max_seq_len, b.seq_lens[i]);
  }
  p.rows = p.qsl[p.num_seqs];
  const int64_t max_blocks = (p.max_seq_len + s.block_size - 1) / s.block_size;
  p.table_stride = max_blocks + 2;
  // Physical blocks: every sequence's blocks, shuffled, plus spares never referenced.
  int64_t total_blocks = 3;
  for (int32_t len : b.seq_lens) total_blocks += (len + s.block_size - 1) / s.block_size;
  std::vector<int32_t> physical(total_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), std::mt19937(seed));
  p.tables.assign(p.num_seqs * p.table_stride, -1);
  int64_t next = 0;
  for (int64_t i = 0; i < p.num_seqs; ++i) {
    for (int64_t j = 0; j < (b.seq_lens[i] + s.block_size - 1) / s.block_size; ++j)
      p.tables[i * p.table_stride + j] = physical[next++];
  }
  p.cache.assign(total_blocks * p.strides.block_stride, kNaN);
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < p.num_seqs; ++i) {
    for (int64_t pos = 0; pos < b.seq_lens[i]; ++pos) {
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        for (int64_t d = 0; d < s.head_dim; ++d) {
          p.cache[p.CacheIndex(i, pos, h, d, false)] = ToBFloat16(dist(rng));
          p.cache[p.CacheIndex(i, pos, h, d, true)] = ToBFloat16(dist(rng));
        }
      }
    }
  }
  const int64_t q_width = s.q_heads * s.head_dim;
  p.q_stride = q_width + (aligned ? 8 : 3);
  p.out_stride = q_width + (aligned ? 8 : 5);
  // Query scale 2: scores of standard deviation 2, a softmax peaked enough that a wrong key moves
  // the output visibly.
  const std::vector<BFloat16> qv =
      RandomBf16(std::max<int64_t>(p.rows, 1) * q_width, seed + 3, 2.0f);
  p.q.assign(std::max<int64_t>(p.rows, 1) * p.q_stride, kNaN);
  for (int64_t r = 0; r < p.rows; ++r) {
    std::copy(qv.begin() + r * q_width, qv.begin() + (r + 1) * q_width,
              p.q.begin() + r * p.q_stride);
  }
  return p;
}

// Rounded output of the CPU twin, as floats (padding keeps the sentinel).
std::vector<float> CpuAttention(const Problem& p, float scale) {
  const Shape& s = p.shape;
  std::vector<BFloat16> out(p.rows * p.out_stride, kSentinel);
  std::vector<float> ws(
      cpu::PagedAttentionWorkspaceFloats(p.rows, p.num_seqs, s.q_heads, s.head_dim, p.max_seq_len));
  PagedAttentionArgs<BFloat16> args = p.Args(p.q.data(), p.cache.data(), p.tables.data(),
                                             p.seq_lens.data(), p.qsl.data(), out.data(), scale);
  args.workspace = ws.data();
  args.workspace_floats = static_cast<int64_t>(ws.size());
  const absl::Status st = cpu::PagedAttention(args);
  EXPECT_TRUE(st.ok()) << st;
  return ToFloats(out);
}

void ExpectRmsClose(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  const double n = std::max<size_t>(got.size(), 1);
  const double rms_diff = std::sqrt(diff / n), rms_want = std::sqrt(norm / n);
  EXPECT_LE(rms_diff, kRmsTol * std::max(1.0, rms_want))
      << what << ": RMS difference " << rms_diff << " (RMS of the reference " << rms_want << ")";
}

class CudaAttentionBf16Test : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    int device = 0;
    VAMP_ASSERT_CUDA(cudaGetDevice(&device));
    VAMP_ASSERT_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
  }

  // The plan PagedAttention makes for `p` (the kernel choice does not depend on occupancy; the
  // split count may, so tests only rely on splits > 1 where any occupancy gives it).
  PagedAttentionPlan Plan(const Problem& p, int64_t max_query_len, int64_t max_seq_len,
                          bool aligned) const {
    return PlanPagedAttention(p.num_seqs, max_query_len, max_seq_len, p.shape.q_heads,
                              p.shape.kv_heads, p.shape.head_dim, aligned, sms_, 1);
  }

  // Runs PagedAttention(bf16) on the device; the output (padding included) as floats.
  std::vector<float> GpuAttention(const Problem& p, float scale, int64_t max_query_len,
                                  int64_t max_seq_len) {
    const Shape& s = p.shape;
    const int64_t ws_floats =
        PagedAttentionWorkspaceFloats(p.rows, p.num_seqs, s.q_heads, s.head_dim, max_seq_len);
    BFloat16* d_cache = Upload(p.cache);
    BFloat16* d_out = Upload(std::vector<BFloat16>(p.rows * p.out_stride, kSentinel));
    float* d_ws = Alloc<float>(ws_floats);
    // NaN scratch: a partial read before it is written shows.
    VAMP_EXPECT_CUDA_OK(cudaMemsetAsync(d_ws, 0xff, std::max<int64_t>(ws_floats, 1) * 4, stream_));
    PagedAttentionArgs<BFloat16> args = p.Args(Upload(p.q), d_cache, Upload(p.tables),
                                               Upload(p.seq_lens), Upload(p.qsl), d_out, scale);
    args.max_query_len = max_query_len;
    args.max_seq_len = max_seq_len;
    args.workspace = d_ws;
    args.workspace_floats = ws_floats;
    const absl::Status st = PagedAttention(args, stream_);
    EXPECT_TRUE(st.ok()) << st;
    return ToFloats(Download(d_out, p.rows * p.out_stride));
  }

  // GPU vs CPU twin on one batch; returns the plan used. Prefill launches run on every prefill
  // kernel this device has (PrefillKernels).
  PagedAttentionPlan Check(const Shape& s, const Batch& b, uint32_t seed, bool aligned = true,
                           int64_t extra_query_len = 0, int64_t extra_seq_len = 0) {
    const Problem p = MakeProblem(s, b, seed, aligned);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    const int64_t max_query_len = p.max_query_len + extra_query_len;
    const int64_t max_seq_len = p.max_seq_len + extra_seq_len;
    const PagedAttentionPlan plan = Plan(p, max_query_len, max_seq_len, aligned);
    const std::vector<float> want = CpuAttention(p, scale);
    for (const bool mma_sync : PrefillKernels(s, plan)) {
      SetPagedAttentionMmaSyncOnly(mma_sync);
      const std::string what =
          b.name + ", " + ShapeName(s) + " (" + AttentionKernelName(plan.kernel) + " kernel" +
          KernelSuffix(s, plan) + ", " + std::to_string(plan.splits) + " splits)";
      const std::vector<float> got = GpuAttention(p, scale, max_query_len, max_seq_len);
      ExpectClose(got, want, kTol, what);
      ExpectRmsClose(got, want, what);
    }
    SetPagedAttentionMmaSyncOnly(false);
    return plan;
  }

  // SetPagedAttentionMmaSyncOnly's settings to run a launch under: both where the default prefill
  // kernel is the Hopper wgmma one (so the mma.sync kernel stays tested on Hopper), else the
  // default only.
  static std::vector<bool> PrefillKernels(const Shape& s, const PagedAttentionPlan& plan) {
    if (plan.kernel == AttentionKernel::kPrefill && PagedAttentionPrefillUsesWgmma(s.head_dim)) {
      return {false, true};
    }
    return {false};
  }

  static std::string KernelSuffix(const Shape& s, const PagedAttentionPlan& plan) {
    if (plan.kernel != AttentionKernel::kPrefill) return "";
    return PagedAttentionPrefillUsesWgmma(s.head_dim) ? " on wgmma" : " on mma.sync";
  }

  int sms_ = 0;
};

// Tiny model (simple kernel), Qwen3-30B-A3B (GQA 8, blocks 16 and 32), GQA 1 and 2 at head_dim
// 64, GQA 8 at head_dim 64, Qwen3-Next-80B-A3B's full attention at head_dim 256 (16/2 heads at
// TP 1, 8/1 at TP 2) and GQA 2 at head_dim 256.
const std::vector<Shape> kShapes = {{4, 2, 16, 16},   {32, 4, 128, 16}, {32, 4, 128, 32},
                                    {8, 8, 64, 16},   {16, 8, 64, 32},  {16, 2, 64, 16},
                                    {16, 2, 256, 16}, {8, 1, 256, 32},  {4, 2, 256, 16}};

bool TensorCoreDim(const Shape& s) {
  return s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256;
}

TEST_F(CudaAttentionBf16Test, WriteKvMatchesCpuBitExact) {
  struct Case {
    Shape shape;
    int64_t pad;  // extra elements per k/v row: 0 and 8 keep 16-byte vectors, 3 does not
  };
  const std::vector<Case> cases = {{{4, 2, 16, 16}, 0},
                                   {{32, 4, 128, 16}, 8},
                                   {{32, 4, 128, 32}, 3},
                                   {{6, 2, 20, 5}, 0},
                                   {{8, 8, 64, 16}, 8}};
  for (const Case& c : cases) {
    const Shape& s = c.shape;
    const int64_t per_layer = s.block_size * s.kv_heads * s.head_dim;
    const KvCacheStrides strides{kLayers * 2 * per_layer, s.kv_heads * s.head_dim, s.head_dim};
    const int64_t k_offset = kLayer * 2 * per_layer, v_offset = k_offset + per_layer;
    const int64_t num_blocks = 7, tokens = 13;
    const int64_t kv_width = s.kv_heads * s.head_dim;
    const int64_t k_stride = kv_width + c.pad, v_stride = kv_width + 2 * c.pad;
    const auto k = RandomBf16(tokens * k_stride, 111);
    const auto v = RandomBf16(tokens * v_stride, 112);
    std::vector<int64_t> all_slots(num_blocks * s.block_size);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), std::mt19937(113));
    std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + tokens);
    slots[2] = -1;
    slots[tokens - 1] = -1;
    slots[0] = num_blocks * s.block_size - 1;  // last slot of the last block
    slots[1] = 0;
    std::vector<BFloat16> want(num_blocks * strides.block_stride, kSentinel);
    cpu::WriteKv(k.data(), k_stride, v.data(), v_stride, slots.data(), tokens, s.kv_heads,
                 s.head_dim, want.data() + k_offset, want.data() + v_offset, strides, s.block_size);
    BFloat16* d_cache = Upload(std::vector<BFloat16>(want.size(), kSentinel));
    VAMP_ASSERT_OK(WriteKv(Upload(k), k_stride, Upload(v), v_stride, Upload(slots), tokens,
                           s.kv_heads, s.head_dim, d_cache + k_offset, d_cache + v_offset, strides,
                           s.block_size, stream_));
    const std::vector<BFloat16> got = Download(d_cache, want.size());
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += got[i].bits != want[i].bits;
    EXPECT_EQ(bad, 0u) << ShapeName(s) << " pad " << c.pad;
  }
}

TEST_F(CudaAttentionBf16Test, DecodeWithVariedContextsMatchesCpu) {
  const Batch decode{{1, 1, 1, 1, 1, 1}, {1, 15, 16, 17, 1000, 5000}, "decode"};
  uint32_t seed = 200;
  for (const Shape& s : kShapes) {
    const PagedAttentionPlan plan = Check(s, decode, seed += 7);
    EXPECT_EQ(plan.kernel, TensorCoreDim(s) ? AttentionKernel::kDecode : AttentionKernel::kSimple)
        << ShapeName(s);
  }
}

TEST_F(CudaAttentionBf16Test, PrefillWithoutPrefixMatchesCpu) {
  // Whole prompts: lengths around the 64-vector and 64-key tiles.
  const Batch prefill{{1, 63, 64, 65, 150}, {1, 63, 64, 65, 150}, "prefill"};
  uint32_t seed = 300;
  for (const Shape& s : kShapes) {
    const PagedAttentionPlan plan = Check(s, prefill, seed += 7);
    EXPECT_EQ(plan.kernel, TensorCoreDim(s) ? AttentionKernel::kPrefill : AttentionKernel::kSimple)
        << ShapeName(s);
  }
}

TEST_F(CudaAttentionBf16Test, PrefillWithCachedPrefixMatchesCpu) {
  // Chunks attending to cached prefixes (one not block aligned), and a one-row chunk.
  const Batch chunks{{16, 130, 1, 40}, {700, 400, 33, 77}, "prefill with cached prefix"};
  uint32_t seed = 400;
  for (const Shape& s : kShapes) Check(s, chunks, seed += 7);
}

TEST_F(CudaAttentionBf16Test, LongPrefillChunksMatchCpu) {
  // Qwen3-30B-A3B's shape over many 64-key tiles: a 520-row prompt (33 query tiles, warpgroups
  // with and without masked tiles) and a 130-row chunk after a 1,827-token prefix that is not
  // block aligned.
  const Batch chunks{{520, 130}, {520, 1957}, "long prefill chunks"};
  EXPECT_EQ(Check({32, 4, 128, 16}, chunks, 450).splits, 1);
}

TEST_F(CudaAttentionBf16Test, SplitPrefillMatchesCpu) {
  // Chunks too small to fill the GPU after long prefixes split their keys: one 64-row chunk after
  // 2,500 tokens (16 CTAs), and a 20-row and a 3-row chunk after 6,000 and 3,001 tokens; at
  // head_dim 64 and 256 too (the mma.sync kernel). Every split's partial is merged.
  const Batch one{{64}, {2564}, "split prefill"};
  const Batch two{{20, 3}, {6020, 3004}, "split prefill, two sequences"};
  uint32_t seed = 460;
  for (const Shape& s : {Shape{32, 4, 128, 16}, Shape{32, 4, 128, 32}, Shape{16, 2, 64, 16},
                         Shape{16, 2, 256, 16}}) {
    const PagedAttentionPlan a = Check(s, one, seed += 7);
    EXPECT_EQ(a.kernel, AttentionKernel::kPrefill) << ShapeName(s);
    EXPECT_GT(a.splits, 1) << ShapeName(s);
    const PagedAttentionPlan b = Check(s, two, seed += 7);
    EXPECT_EQ(b.kernel, AttentionKernel::kPrefill) << ShapeName(s);
    EXPECT_GT(b.splits, 1) << ShapeName(s);
  }
}

TEST_F(CudaAttentionBf16Test, MixedBatchWithEmptySequenceMatchesCpu) {
  // Decode rows, prefill chunks and a sequence with no query rows in one launch.
  const Batch mixed{{1, 37, 0, 1, 100, 1}, {900, 37, 50, 2, 400, 16}, "mixed"};
  uint32_t seed = 500;
  for (const Shape& s : kShapes) {
    const PagedAttentionPlan plan = Check(s, mixed, seed += 7);
    if (TensorCoreDim(s)) {
      EXPECT_EQ(plan.kernel, AttentionKernel::kPrefill) << ShapeName(s);
    }
  }
}

TEST_F(CudaAttentionBf16Test, ShortMultiRowQueriesUseDecodeKernel) {
  // max_query_len * group <= 32: the decode kernel with several query rows per tile, causal
  // within the tile, and (group 1, 32 vectors) two query tiles per sequence.
  struct Case {
    Shape shape;
    Batch batch;
  };
  const std::vector<Case> cases = {
      {{16, 8, 64, 32}, {{4, 1, 3, 0, 2}, {3000, 17, 40, 5, 2}, "group 2, up to 4 rows"}},
      {{8, 8, 128, 16}, {{20, 1, 32}, {20, 700, 2500}, "group 1, up to 32 rows"}},
      {{32, 4, 128, 16}, {{4, 2, 1}, {1500, 3, 64}, "group 8, up to 4 rows"}},
      {{16, 2, 256, 16}, {{4, 1, 3}, {2100, 9, 300}, "head_dim 256, group 8, up to 4 rows"}},
  };
  uint32_t seed = 600;
  for (const Case& c : cases) {
    const PagedAttentionPlan plan = Check(c.shape, c.batch, seed += 7);
    EXPECT_EQ(plan.kernel, AttentionKernel::kDecode) << c.batch.name;
  }
}

TEST_F(CudaAttentionBf16Test, LongContextSplitsMatchCpu) {
  // Few sequences with long contexts: the decode kernel splits the keys over many CTAs and merges.
  const Shape qwen{32, 4, 128, 16};
  const Batch one{{1}, {20000}, "one long sequence"};
  const Batch three{{1, 1, 1}, {8192, 100, 12001}, "three sequences"};
  EXPECT_GT(Check(qwen, one, 700).splits, 1);
  EXPECT_GT(Check(qwen, three, 701).splits, 1);
  EXPECT_GT(Check({16, 8, 64, 32}, three, 702).splits, 1);
  EXPECT_GT(Check({16, 2, 256, 16}, three, 703).splits, 1);
}

TEST_F(CudaAttentionBf16Test, LooseHostBoundsStayCorrect) {
  // The runner may pass bounds above the batch's real maxima.
  const Batch decode{{1, 1, 1}, {40, 3000, 1}, "decode, max_seq_len x4"};
  const Batch mixed{{1, 37, 0, 9}, {900, 37, 50, 300}, "mixed, max_query_len + 100"};
  for (const Shape& s : {Shape{32, 4, 128, 16}, Shape{16, 8, 64, 32}, Shape{4, 2, 16, 16}}) {
    Check(s, decode, 800, true, 0, 3 * 3000);
    Check(s, mixed, 801, true, 100, 0);
  }
}

TEST_F(CudaAttentionBf16Test, UnalignedLayoutFallsBackAndMatches) {
  const Shape qwen{32, 4, 128, 16};
  const Batch mixed{{1, 20, 1}, {300, 60, 5}, "unaligned query stride"};
  EXPECT_EQ(Check(qwen, mixed, 900, /*aligned=*/false).kernel, AttentionKernel::kSimple);
}

TEST_F(CudaAttentionBf16Test, MaskedKeysNeverInfluenceOutput) {
  // Exact causal check: only a sequence's last query row sees its last key. Making that key
  // dominate (K = the last row's query of the first head of each group, so its score is
  // |q|^2 * scale, far above the others; V = 1000) must change the last rows and leave every other
  // row bit-identical.
  const Batch b{{5, 70, 1, 130}, {5, 200, 40, 130}, "causal"};
  for (const Shape& s : {Shape{32, 4, 128, 16}, Shape{16, 8, 64, 32}, Shape{16, 2, 64, 16},
                         Shape{16, 2, 256, 16}, Shape{4, 2, 16, 16}}) {
    const Problem problem = MakeProblem(s, b, 1000);
    const PagedAttentionPlan plan = Plan(problem, problem.max_query_len, problem.max_seq_len, true);
    for (const bool mma_sync : PrefillKernels(s, plan)) {
      SetPagedAttentionMmaSyncOnly(mma_sync);
      Problem p = problem;
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
      const std::vector<float> before = GpuAttention(p, scale, p.max_query_len, p.max_seq_len);
      std::vector<bool> last_row(p.rows, false);
      for (int64_t i = 0; i < p.num_seqs; ++i) {
        if (p.qsl[i + 1] == p.qsl[i]) continue;
        const int64_t row = p.qsl[i + 1] - 1;
        last_row[row] = true;
        const int64_t group = s.q_heads / s.kv_heads;
        for (int64_t h = 0; h < s.kv_heads; ++h) {
          for (int64_t d = 0; d < s.head_dim; ++d) {
            p.cache[p.CacheIndex(i, p.seq_lens[i] - 1, h, d, false)] =
                p.q[row * p.q_stride + h * group * s.head_dim + d];
            p.cache[p.CacheIndex(i, p.seq_lens[i] - 1, h, d, true)] = ToBFloat16(1000.0f);
          }
        }
      }
      const std::vector<float> after = GpuAttention(p, scale, p.max_query_len, p.max_seq_len);
      const int64_t width = s.q_heads * s.head_dim;
      for (int64_t r = 0; r < p.rows; ++r) {
        double max_change = 0;
        for (int64_t c = 0; c < width; ++c) {
          const float x = before[r * p.out_stride + c], y = after[r * p.out_stride + c];
          ASSERT_FALSE(std::isnan(x) || std::isnan(y)) << ShapeName(s) << " row " << r;
          max_change = std::max(max_change, std::abs(double(x) - y));
        }
        const std::string what = ShapeName(s) + (mma_sync ? " (mma.sync prefill)" : "");
        if (last_row[r]) {
          EXPECT_GT(max_change, 1.0) << what << ": row " << r << " ignores its last key";
        } else {
          EXPECT_EQ(max_change, 0.0) << what << ": row " << r << " sees a future key";
        }
      }
    }
  }
  SetPagedAttentionMmaSyncOnly(false);
}

TEST_F(CudaAttentionBf16Test, RejectsBadArguments) {
  const KvCacheStrides strides{4096, 512, 128};
  auto call = [&](int64_t q_heads, int64_t kv_heads, int64_t head_dim, float* ws,
                  int64_t ws_floats) {
    // Pointers are never dereferenced: validation fails before any launch.
    return PagedAttention(PagedAttentionArgs<BFloat16>{.q_stride = 4096,
                                                       .strides = strides,
                                                       .block_size = 16,
                                                       .num_seqs = 1,
                                                       .max_query_len = 1,
                                                       .max_seq_len = 30000,
                                                       .num_q_heads = q_heads,
                                                       .num_kv_heads = kv_heads,
                                                       .head_dim = head_dim,
                                                       .scale = 0.1f,
                                                       .out_stride = 4096,
                                                       .workspace = ws,
                                                       .workspace_floats = ws_floats},
                          stream_);
  };
  float* ws = Alloc<float>(16);
  EXPECT_TRUE(absl::IsInvalidArgument(call(32, 4, 512, ws, 16)));  // head_dim too large
  EXPECT_TRUE(absl::IsInvalidArgument(call(5, 2, 128, ws, 16)));   // 5 % 2 != 0
  EXPECT_TRUE(absl::IsInvalidArgument(call(4, 0, 128, ws, 16)));   // no kv heads
  // One sequence with 30000 tokens of context splits the keys: 16 floats are too few.
  const absl::Status small = call(32, 4, 128, ws, 16);
  EXPECT_TRUE(absl::IsInvalidArgument(small)) << small;
  EXPECT_NE(small.message().find("workspace"), absl::string_view::npos) << small;
  EXPECT_TRUE(absl::IsInvalidArgument(call(32, 4, 128, nullptr, 1 << 30)));  // null scratch
}

// ---- the planner (host only: these run without a GPU) ----

TEST(PagedAttentionPlanTest, RoutesByShapeAndLayout) {
  auto plan = [](int64_t seqs, int64_t max_q, int64_t max_len, int64_t qh, int64_t kvh, int64_t hd,
                 bool aligned) {
    return PlanPagedAttention(seqs, max_q, max_len, qh, kvh, hd, aligned, 132, 2);
  };
  EXPECT_EQ(plan(64, 1, 8192, 32, 4, 128, true).kernel, AttentionKernel::kDecode);
  EXPECT_EQ(plan(64, 1, 8192, 32, 4, 64, true).kernel, AttentionKernel::kDecode);
  EXPECT_EQ(plan(64, 4, 8192, 32, 4, 128, true).kernel, AttentionKernel::kDecode);  // 32 vectors
  EXPECT_EQ(plan(64, 5, 8192, 32, 4, 128, true).kernel, AttentionKernel::kPrefill);
  EXPECT_EQ(plan(1, 512, 512, 32, 4, 128, true).kernel, AttentionKernel::kPrefill);
  EXPECT_EQ(plan(64, 1, 8192, 32, 4, 128, false).kernel, AttentionKernel::kSimple);
  EXPECT_EQ(plan(64, 1, 8192, 4, 2, 16, true).kernel, AttentionKernel::kSimple);
  EXPECT_EQ(plan(64, 1, 8192, 16, 2, 256, true).kernel, AttentionKernel::kDecode);
  EXPECT_EQ(plan(64, 1, 8192, 16, 2, 96, true).kernel, AttentionKernel::kSimple);
  // 64 query heads on one KV head: four 16-vector tiles per sequence even for one row.
  EXPECT_EQ(plan(8, 1, 100, 64, 1, 128, true).query_tiles, 4);
  const PagedAttentionPlan prefill = plan(3, 512, 9000, 32, 4, 128, true);
  // 128 query vectors per prefill CTA up to head_dim 128, 64 at head_dim 256.
  EXPECT_EQ(prefill.query_tiles, 512 * 8 / 128);
  EXPECT_EQ(prefill.ctas, prefill.query_tiles * 3 * 4);
  EXPECT_EQ(prefill.workspace_floats, 0);
  const PagedAttentionPlan next = plan(3, 512, 9000, 16, 2, 256, true);
  EXPECT_EQ(next.kernel, AttentionKernel::kPrefill);
  EXPECT_EQ(next.query_tiles, 512 * 8 / 64);
  EXPECT_EQ(next.ctas, next.query_tiles * 3 * 2);
}

TEST(PagedAttentionPlanTest, PrefillSplitsOnlyWhenItsTilesLeaveTheGpuIdle) {
  auto plan = [](int64_t seqs, int64_t max_q, int64_t max_len) {
    return PlanPagedAttention(seqs, max_q, max_len, 32, 4, 128, true, 132, 2);
  };
  // 512 rows after 8,192 cached tokens: 128 CTAs for 264 slots; two splits fill one wave.
  const PagedAttentionPlan after_prefix = plan(1, 512, 8704);
  EXPECT_EQ(after_prefix.kernel, AttentionKernel::kPrefill);
  EXPECT_EQ(after_prefix.splits, 2);
  EXPECT_EQ(after_prefix.ctas, 2 * 128);
  EXPECT_EQ(after_prefix.workspace_floats, 2 * 128 * 128 * (128 + 2));
  // The same chunk without a prefix has too few keys to split; 2,048 rows after 8,192 fill the GPU.
  EXPECT_EQ(plan(1, 512, 512).splits, 1);
  EXPECT_EQ(plan(1, 2048, 10240).splits, 1);
  EXPECT_EQ(plan(1, 2048, 10240).workspace_floats, 0);
  // A few rows on a long context spread over the GPU, within the partial slots.
  const PagedAttentionPlan few = plan(1, 20, 32768);
  EXPECT_GT(few.splits, 8);
  EXPECT_LE(few.ctas, 2 * 132 * 2);
  EXPECT_LE(few.workspace_floats, PagedAttentionWorkspaceFloats(20, 1, 32, 128, 32768));
}

TEST(PagedAttentionPlanTest, SplitsFillTheGpuOnlyWhenNeeded) {
  // Qwen3-30B-A3B decode on 132 SMs with 2 resident decode CTAs each.
  const PagedAttentionPlan one = PlanPagedAttention(1, 1, 32768, 32, 4, 128, true, 132, 2);
  EXPECT_GT(one.splits, 32);
  EXPECT_LE(one.ctas, 2 * 132 * 2);
  EXPECT_GT(one.workspace_floats, 0);
  const PagedAttentionPlan full = PlanPagedAttention(64, 1, 32768, 32, 4, 128, true, 132, 2);
  EXPECT_EQ(full.splits, 1);  // 256 CTAs already fill 264 slots
  EXPECT_EQ(full.workspace_floats, 0);
  const PagedAttentionPlan short_ctx = PlanPagedAttention(1, 1, 200, 32, 4, 128, true, 132, 2);
  EXPECT_EQ(short_ctx.splits, 1);  // fewer keys than one split's minimum
  const PagedAttentionPlan mid = PlanPagedAttention(16, 1, 8192, 32, 4, 128, true, 132, 2);
  EXPECT_GT(mid.splits, 1);
  EXPECT_LE(mid.ctas, 2 * 132 * 2);
}

TEST(PagedAttentionPlanTest, WorkspaceNeverExceedsTheSizingFunction) {
  // The runner sizes scratch once with PagedAttentionWorkspaceFloats at its largest bounds; every
  // launch within those bounds must fit.
  int64_t checked = 0, split = 0, prefill_split = 0;
  for (int64_t sms : {1, 16, 132, 264}) {
    for (int64_t per_sm : {1, 2, 4}) {
      for (auto [qh, kvh] : std::vector<std::pair<int64_t, int64_t>>{
               {32, 4}, {16, 2}, {8, 8}, {64, 1}, {16, 16}, {40, 5}}) {
        for (int64_t hd : {64, 128, 256}) {
          for (int64_t seqs : {1, 2, 3, 7, 16, 64, 255}) {
            for (int64_t max_q : {1, 2, 3, 4, 8, 16, 32, 33, 64, 512, 2048}) {
              for (int64_t len : {1, 255, 256, 257, 1000, 8192, 32768, 131072}) {
                const PagedAttentionPlan plan =
                    PlanPagedAttention(seqs, max_q, len, qh, kvh, hd, true, sms, per_sm);
                const int64_t sized =
                    PagedAttentionWorkspaceFloats(seqs * max_q, seqs, qh, hd, len);
                ASSERT_LE(plan.workspace_floats, sized)
                    << seqs << " seqs, max_q " << max_q << ", len " << len << ", heads " << qh
                    << "/" << kvh << ", hd " << hd << ", sms " << sms << "x" << per_sm;
                // Larger bounds never need less.
                ASSERT_LE(sized,
                          PagedAttentionWorkspaceFloats(seqs * max_q, seqs + 1, qh, hd, 2 * len));
                ASSERT_LE(plan.splits, 128);
                if (plan.splits > 1) {
                  // Decode CTAs hold 16 query vectors, prefill CTAs 128 (64 at head_dim 256).
                  const int64_t vectors =
                      plan.kernel == AttentionKernel::kDecode ? 16 : (hd > 128 ? 64 : 128);
                  ASSERT_NE(plan.kernel, AttentionKernel::kSimple);
                  ASSERT_EQ(plan.workspace_floats, plan.ctas * vectors * (hd + 2));
                  if (plan.kernel == AttentionKernel::kPrefill) ++prefill_split;
                  ++split;
                }
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(split, checked / 10);  // the sweep exercises splitting
  EXPECT_GT(prefill_split, checked / 100);
}

TEST(PagedAttentionPlanTest, SizingIsZeroWhenNothingCanSplit) {
  EXPECT_EQ(PagedAttentionWorkspaceFloats(8192, 256, 32, 128, 256), 0);
  EXPECT_EQ(PagedAttentionWorkspaceFloats(8192, 0, 32, 128, 40960), 0);
  // Qwen3-30B-A3B at 40k context: the split partial slots, about 17 MiB, whatever the batch.
  EXPECT_EQ(PagedAttentionWorkspaceFloats(8192, 256, 32, 128, 40960), 2048 * 16 * 130);
  EXPECT_EQ(PagedAttentionWorkspaceFloats(64, 1, 32, 128, 40960), 2048 * 16 * 130);
}

}  // namespace
}  // namespace vamp::kernels::cuda
