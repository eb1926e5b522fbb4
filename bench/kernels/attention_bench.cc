// vamp_attention_bench: bfloat16 paged attention (kernels/cuda/attention.h) on Qwen3-30B-A3B
// shapes (32 query / 4 KV heads, head_dim 128, blocks of 16 tokens):
//   decode   batch {1, 16, 64} x context {2k, 8k, 32k}, one query row per sequence;
//   prefill  one chunk of {512, 2048, 8192} tokens after a cached prefix of {0, 8192} tokens.
// The KV cache is one block-major layer (block i = [K | V] of 16 tokens), filled with random bf16,
// and every case uses shuffled block tables, so the kernels gather non-contiguous blocks as in
// serving. Each case is timed with CUDA events around PagedAttention (host planning included):
// --warmup untimed runs, then the median of --iters runs.
//
// Also measured in the same run: the device's achievable HBM bandwidth, as a device-to-device
// cudaMemcpy of 1 GiB (bytes read + written per time). Decode is reported as bytes moved (the KV
// read, plus q and out) per time and as a fraction of that bandwidth; prefill as TFLOP/s of the
// causal attention actually computed (4 * q_heads * head_dim * sum over rows of visible keys).
// One JSON object per line on stdout (fields: case, kind, batch, q_len, ctx, prefix, us, bytes,
// gbps, hbm_fraction, flops, tflops, kernel, splits; "splits" is the planner's choice for the
// resident decode CTAs per multiprocessor measured on H200: two up to head_dim 128, one at 256).
// bench/kernels/attention_vs_sdpa.py runs this binary next to PyTorch SDPA. On Hopper, prefill runs
// the wgmma kernel; --prefill_mma_sync_only=true times the mma.sync kernel instead (the "kernel"
// field names which ran).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/kernels/bench_device.h"
#include "bench/kernels/bench_flags.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cuda/attention.h"

namespace vamp {
namespace {

namespace kc = kernels::cuda;
using kernels::BFloat16;

// The bench's flags, typed (defaults: Qwen3-30B-A3B's attention shapes).
struct Flags {
  std::string cases = "all";  // all | decode | prefill
  std::vector<int64_t> decode_batches = {1, 16, 64};
  std::vector<int64_t> decode_contexts = {2048, 8192, 32768};
  std::vector<int64_t> prefill_chunks = {512, 2048, 8192};
  std::vector<int64_t> prefill_prefixes = {0, 8192};
  int64_t q_heads = 32;
  int64_t kv_heads = 4;
  int64_t head_dim = 128;
  int64_t block_size = 16;
  int64_t warmup = 3;
  int64_t iters = 20;
  int64_t seed = 1;
  int64_t cuda_device = 0;
  bool prefill_mma_sync_only = false;
};

ConfigSchema Schema() {
  const Flags d;
  ConfigSchema s;
  s.Enum("cases", d.cases, {"all", "decode", "prefill"}, "which cases to run");
  s.String("decode_batches", absl::StrJoin(d.decode_batches, ","),
           "comma-separated decode batch sizes (sequences)");
  s.String("decode_contexts", absl::StrJoin(d.decode_contexts, ","),
           "comma-separated decode context lengths");
  s.String("prefill_chunks", absl::StrJoin(d.prefill_chunks, ","),
           "comma-separated prefill chunk lengths (tokens)");
  s.String("prefill_prefixes", absl::StrJoin(d.prefill_prefixes, ","),
           "comma-separated cached prefix lengths before a chunk");
  s.Int("q_heads", d.q_heads, 1, 1024, "query heads");
  s.Int("kv_heads", d.kv_heads, 1, 1024, "KV heads (must divide q_heads)");
  s.Int("head_dim", d.head_dim, 1, 256, "head dimension");
  s.Int("block_size", d.block_size, 1, 4096, "tokens per KV block");
  s.Int("warmup", d.warmup, 0, 1000, "untimed runs before each measurement");
  s.Int("iters", d.iters, 1, 100000, "timed runs per measurement (the median is reported)");
  s.Int("seed", d.seed, 0, 1 << 30, "random seed of the cache, queries and block tables");
  s.Int("cuda_device", d.cuda_device, 0, 64, "CUDA device ordinal");
  s.Bool("prefill_mma_sync_only", d.prefill_mma_sync_only,
         "run prefill on the mma.sync kernel even where the Hopper wgmma kernel is the default "
         "(the baseline of the wgmma kernel, timed in the same session)");
  return s;
}

// The only reader of the flags by name.
absl::StatusOr<Flags> FlagsFromConfig(const Config& config) {
  Flags f;
  f.cases = config.GetString("cases");
  VAMP_ASSIGN_OR_RETURN(f.decode_batches, bench::ParseIntList(config, "decode_batches", 0));
  VAMP_ASSIGN_OR_RETURN(f.decode_contexts, bench::ParseIntList(config, "decode_contexts", 0));
  VAMP_ASSIGN_OR_RETURN(f.prefill_chunks, bench::ParseIntList(config, "prefill_chunks", 0));
  VAMP_ASSIGN_OR_RETURN(f.prefill_prefixes, bench::ParseIntList(config, "prefill_prefixes", 0));
  f.q_heads = config.GetInt("q_heads");
  f.kv_heads = config.GetInt("kv_heads");
  f.head_dim = config.GetInt("head_dim");
  f.block_size = config.GetInt("block_size");
  f.warmup = config.GetInt("warmup");
  f.iters = config.GetInt("iters");
  f.seed = config.GetInt("seed");
  f.cuda_device = config.GetInt("cuda_device");
  f.prefill_mma_sync_only = config.GetBool("prefill_mma_sync_only");
  if (f.q_heads % f.kv_heads != 0)
    return absl::InvalidArgumentError("kv_heads must divide q_heads");
  return f;
}

// Median device time of fn in microseconds (bench::MedianEventMs).
absl::StatusOr<double> MedianUs(const std::function<absl::Status()>& fn, int64_t warmup,
                                int64_t iters, cudaStream_t stream) {
  VAMP_ASSIGN_OR_RETURN(const double ms, bench::MedianEventMs(fn, warmup, iters, stream));
  return ms * 1e3;
}

// Device-to-device copy of 1 GiB: bytes read + written per microsecond, in GB/s.
absl::StatusOr<double> MeasureHbm(int64_t warmup, int64_t iters, cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  void* a = nullptr;
  void* b = nullptr;
  VAMP_BENCH_CUDA(cudaMalloc(&a, bytes));
  if (cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return absl::ResourceExhaustedError("cannot allocate 2 GiB for the bandwidth measurement");
  }
  cudaMemsetAsync(a, 1, bytes, stream);
  absl::StatusOr<double> us = MedianUs(
      [&]() -> absl::Status {
        VAMP_BENCH_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
        return absl::OkStatus();
      },
      warmup, iters, stream);
  cudaFree(a);
  cudaFree(b);
  if (!us.ok()) return us.status();
  const double gbps = 2.0 * bytes / *us / 1e3;
  std::printf(
      "{\"case\": \"hbm_copy\", \"kind\": \"hbm\", \"bytes\": %zu, \"us\": %.2f, \"gbps\": %.1f}\n",
      2 * bytes, *us, gbps);
  std::fflush(stdout);
  return gbps;
}

struct Case {
  std::string name, kind;
  int64_t batch = 0, q_len = 0, prefix = 0;  // ctx = prefix + q_len tokens per sequence
};

class Bench {
 public:
  Bench(const Flags& flags, cudaStream_t stream)
      : flags_(flags),
        stream_(stream),
        q_heads_(flags.q_heads),
        kv_heads_(flags.kv_heads),
        head_dim_(flags.head_dim),
        block_size_(flags.block_size),
        rng_(static_cast<uint32_t>(flags.seed)),
        buffers_(stream) {}

  // Allocates the cache for the largest case and the per-step buffers; fills them with random
  // bf16.
  absl::Status Setup(const std::vector<Case>& cases) {
    int64_t max_blocks = 0, max_rows = 0, max_seqs = 0, max_ctx = 0;
    for (const Case& c : cases) {
      const int64_t ctx = c.prefix + c.q_len;
      max_blocks = std::max(max_blocks, c.batch * BlocksPerSeq(ctx));
      max_rows = std::max(max_rows, c.batch * c.q_len);
      max_seqs = std::max(max_seqs, c.batch);
      max_ctx = std::max(max_ctx, ctx);
    }
    per_layer_ = block_size_ * kv_heads_ * head_dim_;
    strides_ = {2 * per_layer_, kv_heads_ * head_dim_, head_dim_};
    num_blocks_ = max_blocks;
    VAMP_ASSIGN_OR_RETURN(cache_, buffers_.Alloc<BFloat16>(num_blocks_ * strides_.block_stride));
    VAMP_RETURN_IF_ERROR(FillRandom(cache_, num_blocks_ * strides_.block_stride));
    const int64_t width = q_heads_ * head_dim_;
    VAMP_ASSIGN_OR_RETURN(q_, buffers_.Alloc<BFloat16>(max_rows * width));
    VAMP_RETURN_IF_ERROR(FillRandom(q_, max_rows * width));
    VAMP_ASSIGN_OR_RETURN(out_, buffers_.Alloc<BFloat16>(max_rows * width));
    ws_floats_ =
        kc::PagedAttentionWorkspaceFloats(max_rows, max_seqs, q_heads_, head_dim_, max_ctx);
    VAMP_ASSIGN_OR_RETURN(ws_, buffers_.Alloc<float>(std::max<int64_t>(ws_floats_, 1)));
    VAMP_ASSIGN_OR_RETURN(tables_, buffers_.Alloc<int32_t>(max_blocks));
    VAMP_ASSIGN_OR_RETURN(seq_lens_, buffers_.Alloc<int32_t>(max_seqs));
    VAMP_ASSIGN_OR_RETURN(qsl_, buffers_.Alloc<int32_t>(max_seqs + 1));
    int device = 0;
    VAMP_BENCH_CUDA(cudaGetDevice(&device));
    VAMP_BENCH_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
    return absl::OkStatus();
  }

  absl::Status Run(const Case& c, double hbm_gbps) {
    const int64_t ctx = c.prefix + c.q_len;
    const int64_t blocks_per_seq = BlocksPerSeq(ctx);
    // Every sequence's blocks are distinct, drawn at random from the whole cache.
    std::vector<int32_t> physical(num_blocks_);
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), rng_);
    std::vector<int32_t> tables(physical.begin(), physical.begin() + c.batch * blocks_per_seq);
    std::vector<int32_t> seq_lens(c.batch, static_cast<int32_t>(ctx));
    std::vector<int32_t> qsl(c.batch + 1);
    for (int64_t i = 0; i <= c.batch; ++i) qsl[i] = static_cast<int32_t>(i * c.q_len);
    VAMP_RETURN_IF_ERROR(buffers_.Upload(tables_, tables));
    VAMP_RETURN_IF_ERROR(buffers_.Upload(seq_lens_, seq_lens));
    VAMP_RETURN_IF_ERROR(buffers_.Upload(qsl_, qsl));
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
    const int64_t width = q_heads_ * head_dim_;
    auto call = [&]() {
      return kc::PagedAttention(
          kc::PagedAttentionArgs<BFloat16>{.q = q_,
                                           .q_stride = width,
                                           .k_cache = cache_,
                                           .v_cache = cache_ + per_layer_,
                                           .strides = strides_,
                                           .block_size = block_size_,
                                           .block_tables = tables_,
                                           .block_table_stride = blocks_per_seq,
                                           .seq_lens = seq_lens_,
                                           .query_start_loc = qsl_,
                                           .num_seqs = c.batch,
                                           .max_query_len = c.q_len,
                                           .max_seq_len = ctx,
                                           .num_q_heads = q_heads_,
                                           .num_kv_heads = kv_heads_,
                                           .head_dim = head_dim_,
                                           .scale = scale,
                                           .out = out_,
                                           .out_stride = width,
                                           .workspace = ws_,
                                           .workspace_floats = ws_floats_},
          stream_);
    };
    VAMP_ASSIGN_OR_RETURN(const double us, MedianUs(call, flags_.warmup, flags_.iters, stream_));
    // Keys visible to the rows of one sequence (causal, after the prefix).
    const double keys =
        static_cast<double>(c.q_len) * c.prefix + static_cast<double>(c.q_len) * (c.q_len + 1) / 2;
    const double flops = 4.0 * c.batch * q_heads_ * head_dim_ * keys;
    const double bytes = 2.0 * 2.0 * c.batch * ctx * kv_heads_ * head_dim_ +  // K and V read
                         2.0 * 2.0 * c.batch * c.q_len * width;               // q read, out written
    const double gbps = bytes / us / 1e3;
    const kc::PagedAttentionPlan plan = kc::PlanPagedAttention(
        c.batch, c.q_len, ctx, q_heads_, kv_heads_, head_dim_, true, sms_, head_dim_ > 128 ? 1 : 2);
    std::printf(
        "{\"case\": \"%s\", \"kind\": \"%s\", \"batch\": %lld, \"q_len\": %lld, \"ctx\": %lld, "
        "\"prefix\": %lld, \"us\": %.2f, \"bytes\": %.0f, \"gbps\": %.1f, \"hbm_fraction\": %.3f, "
        "\"flops\": %.0f, \"tflops\": %.2f, \"kernel\": \"%s\", \"splits\": %lld}\n",
        c.name.c_str(), c.kind.c_str(), static_cast<long long>(c.batch),
        static_cast<long long>(c.q_len), static_cast<long long>(ctx),
        static_cast<long long>(c.prefix), us, bytes, gbps, hbm_gbps > 0 ? gbps / hbm_gbps : 0.0,
        flops, flops / us / 1e6, KernelName(plan).c_str(), static_cast<long long>(plan.splits));
    std::fflush(stdout);
    return absl::OkStatus();
  }

 private:
  // The plan's kernel, prefill naming the instructions it runs on.
  std::string KernelName(const kc::PagedAttentionPlan& plan) const {
    std::string name = kc::AttentionKernelName(plan.kernel);
    if (plan.kernel == kc::AttentionKernel::kPrefill) {
      name += kc::PagedAttentionPrefillUsesWgmma(head_dim_) ? " (wgmma)" : " (mma.sync)";
    }
    return name;
  }

  int64_t BlocksPerSeq(int64_t ctx) const { return (ctx + block_size_ - 1) / block_size_; }

  // Random N(0, 1) bf16: a 16 MiB random pattern tiled over the buffer.
  absl::Status FillRandom(BFloat16* dev, int64_t n) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<BFloat16> pattern(std::min<int64_t>(n, int64_t{8} << 20));
    for (BFloat16& x : pattern) x = kernels::ToBFloat16(dist(rng_));
    return buffers_.Tile(dev, n, pattern);
  }

  const Flags& flags_;
  cudaStream_t stream_;
  const int64_t q_heads_, kv_heads_, head_dim_, block_size_;
  std::mt19937 rng_;
  bench::DeviceBuffers buffers_;
  int sms_ = 0;
  int64_t per_layer_ = 0, num_blocks_ = 0, ws_floats_ = 0;
  kc::KvCacheStrides strides_;
  BFloat16* cache_ = nullptr;
  BFloat16* q_ = nullptr;
  BFloat16* out_ = nullptr;
  float* ws_ = nullptr;
  int32_t* tables_ = nullptr;
  int32_t* seq_lens_ = nullptr;
  int32_t* qsl_ = nullptr;
};

absl::Status RunAll(const Flags& flags, cudaStream_t stream) {
  const std::string& which = flags.cases;
  std::vector<Case> cases;
  if (which == "all" || which == "decode") {
    for (int64_t b : flags.decode_batches) {
      for (int64_t ctx : flags.decode_contexts) {
        if (b == 0 || ctx == 0) continue;
        cases.push_back({absl::StrCat("decode_b", b, "_ctx", ctx), "decode", b, 1, ctx - 1});
      }
    }
  }
  if (which == "all" || which == "prefill") {
    for (int64_t chunk : flags.prefill_chunks) {
      for (int64_t prefix : flags.prefill_prefixes) {
        if (chunk == 0) continue;
        cases.push_back(
            {absl::StrCat("prefill_q", chunk, "_prefix", prefix), "prefill", 1, chunk, prefix});
      }
    }
  }
  kc::SetPagedAttentionMmaSyncOnly(flags.prefill_mma_sync_only);
  VAMP_ASSIGN_OR_RETURN(const double hbm_gbps, MeasureHbm(flags.warmup, flags.iters, stream));
  Bench bench(flags, stream);
  VAMP_RETURN_IF_ERROR(bench.Setup(cases));
  for (const Case& c : cases) {
    if (absl::Status s = bench.Run(c, hbm_gbps); !s.ok()) {
      std::printf("{\"case\": \"%s\", \"kind\": \"%s\", \"error\": \"%s\"}\n", c.name.c_str(),
                  c.kind.c_str(), std::string(s.message()).c_str());
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  auto invocation = ParseInvocation(Schema(), "vamp_attention_bench",
                                    "bf16 paged attention (decode and prefill) on Qwen3-30B-A3B "
                                    "shapes, with the device's copy bandwidth; one JSON line per "
                                    "measurement.",
                                    argc, argv, FlagsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const Flags& flags = *invocation.options;
  return bench::RunOnCudaDevice("vamp_attention_bench", flags.cuda_device,
                                [&](cudaStream_t stream) { return RunAll(flags, stream); });
}

}  // namespace
}  // namespace vamp

int main(int argc, char** argv) { return vamp::Main(argc, argv); }
