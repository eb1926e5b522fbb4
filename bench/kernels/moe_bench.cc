// vamp_moe_bench: one bf16 MoE layer (router top-k, permutation, gather, w13 GEMM, SiLU-and-mul,
// w2 GEMM, weighted un-permutation) on the GPU, with four expert-GEMM paths:
//   cublas          cuda::ExpertGemm: one cuBLAS call per expert, row offsets copied to the host
//                   first (the runner's current path: one stream synchronisation per layer);
//   cublas_grouped  cuda::ExpertGemmGrouped: one cublasGemmGroupedBatchedEx call, host offsets too;
//   grouped         cuda::GroupedExpertGemm: offsets and pointer table read on the device, no sync;
//   grouped_fused   as grouped, the w13 GEMM with SiLU-and-mul in its epilogue
//                   (cuda::GroupedExpertGemmSiluMul);
//   grouped_fused_mma
//                   as grouped_fused on the mma.sync tiles only (SetGroupedGemmMmaSyncOnly): the
//                   kernels before Hopper's wgmma tiles, timed in the same run.
// Each path is timed as the whole layer ("layer") and as its expert GEMMs alone ("gemms"; for the
// cuBLAS paths the host offsets are already known there, so no copy and no sync). One JSON line per
// (shape, tokens, path, scope) on stdout: median µs over --iters runs after --warmup runs (CUDA
// events around each run), TFLOP/s of the expert GEMMs (6 * rows * hidden * inter flops), and the
// expert weight bytes read (active experts x 3 * hidden * inter bf16) per time as GB/s.
// Random bf16 inputs; the expert weights of all experts live in one device allocation, shard e =
// [w13 (2 * inter x hidden) | w2 (hidden x inter)], with the pointer table on host and device.
// bench/kernels/moe_vs_grouped_mm.py runs this binary and torch._grouped_mm side by side.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/kernels/bench_device.h"
#include "common/config.h"
#include "common/status_macros.h"
#include "kernels/cpu/bfloat16.h"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/moe.h"

namespace vamp {
namespace {

namespace kc = kernels::cuda;
using kernels::BFloat16;

struct ModelShape {
  std::string name;
  int64_t hidden, inter, experts, top_k;
};

// shared/DESIGN.md, "Model shapes" (the MoE block of one rank, TP1).
const std::vector<ModelShape>& Shapes() {
  static const std::vector<ModelShape> shapes{{"qwen3-30b-a3b", 2048, 768, 128, 8},
                                              {"qwen3-next", 2048, 512, 512, 10}};
  return shapes;
}

// The bench's flags, typed.
struct Flags {
  std::string shapes = "all";  // all, or one of Shapes()' names
  std::vector<int64_t> tokens = {16, 128, 1024, 8192};
  int64_t warmup = 5;
  int64_t iters = 30;
  int64_t seed = 1;
  double weight_std = 0.02;
  bool check = true;
  int64_t cuda_device = 0;
};

ConfigSchema Schema() {
  const Flags d;
  ConfigSchema s;
  s.Enum("shapes", d.shapes, {"all", "qwen3-30b-a3b", "qwen3-next"}, "model shapes to run");
  s.String("tokens", absl::StrJoin(d.tokens, ","), "comma-separated token counts per layer call");
  s.Int("warmup", d.warmup, 0, 1000, "untimed runs before each measurement");
  s.Int("iters", d.iters, 1, 100000, "timed runs per measurement (the median is reported)");
  s.Int("seed", d.seed, 0, 1 << 30, "random seed of inputs and weights");
  s.Double("weight_std", d.weight_std, 1e-6, 1.0,
           "standard deviation of the random expert weights");
  s.Bool("check", d.check, "compare each path's layer output with the cublas path's");
  s.Int("cuda_device", d.cuda_device, 0, 64, "CUDA device ordinal");
  return s;
}

// The only reader of the flags by name.
absl::StatusOr<Flags> FlagsFromConfig(const Config& config) {
  Flags f;
  f.shapes = config.GetString("shapes");
  f.tokens.clear();
  for (absl::string_view part : absl::StrSplit(config.GetString("tokens"), ',')) {
    int64_t t = 0;
    if (!absl::SimpleAtoi(part, &t) || t <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens: '", part, "' is not a positive integer"));
    }
    f.tokens.push_back(t);
  }
  f.warmup = config.GetInt("warmup");
  f.iters = config.GetInt("iters");
  f.seed = config.GetInt("seed");
  f.weight_std = config.GetDouble("weight_std");
  f.check = config.GetBool("check");
  f.cuda_device = config.GetInt("cuda_device");
  return f;
}

std::vector<BFloat16> RandomBf16(size_t n, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<BFloat16> v(n);
  for (auto& x : v) x = kernels::ToBFloat16(dist(rng));
  return v;
}

// A device buffer freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Allocate(size_t n) {
    VAMP_BENCH_CUDA(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)));
    return absl::OkStatus();
  }
  T* get() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// The expert region of one layer: all shards in one allocation, filled by repeating a random
// block (the values only need to be realistic, not distinct).
struct Experts {
  DeviceBuffer<BFloat16> region;
  int64_t shard_elems = 0;
  std::vector<const BFloat16*> host_table;  // device pointers, host array (cuBLAS paths)
  DeviceBuffer<const BFloat16*> device_table;

  absl::Status Init(const ModelShape& m, std::mt19937& rng, float stddev) {
    shard_elems = 3 * m.inter * m.hidden;
    const int64_t total = shard_elems * m.experts;
    VAMP_RETURN_IF_ERROR(region.Allocate(total));
    const int64_t block = std::min<int64_t>(total, int64_t{1} << 22);
    const std::vector<BFloat16> pattern = RandomBf16(block, rng, stddev);
    VAMP_BENCH_CUDA(
        cudaMemcpy(region.get(), pattern.data(), block * sizeof(BFloat16), cudaMemcpyHostToDevice));
    for (int64_t done = block; done < total; done += block) {
      VAMP_BENCH_CUDA(cudaMemcpy(region.get() + done, region.get(),
                                 std::min(block, total - done) * sizeof(BFloat16),
                                 cudaMemcpyDeviceToDevice));
    }
    host_table.resize(m.experts);
    for (int64_t e = 0; e < m.experts; ++e) host_table[e] = region.get() + e * shard_elems;
    VAMP_RETURN_IF_ERROR(device_table.Allocate(m.experts));
    VAMP_BENCH_CUDA(cudaMemcpy(device_table.get(), host_table.data(),
                               m.experts * sizeof(const BFloat16*), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
};

// Activations and routing buffers of one layer call with `tokens` tokens.
struct Layer {
  int64_t tokens = 0, rows = 0;
  DeviceBuffer<BFloat16> x, permuted, h13, act, expert_out, out;
  DeviceBuffer<float> logits, topk_weights;
  DeviceBuffer<int32_t> topk_ids, offsets, row_token, pair_row;
  int32_t* host_offsets = nullptr;  // pinned

  ~Layer() {
    if (host_offsets != nullptr) cudaFreeHost(host_offsets);
  }

  absl::Status Init(const ModelShape& m, int64_t t, std::mt19937& rng) {
    tokens = t;
    rows = t * m.top_k;
    VAMP_RETURN_IF_ERROR(x.Allocate(t * m.hidden));
    VAMP_RETURN_IF_ERROR(permuted.Allocate(rows * m.hidden));
    VAMP_RETURN_IF_ERROR(h13.Allocate(rows * 2 * m.inter));
    VAMP_RETURN_IF_ERROR(act.Allocate(rows * m.inter));
    VAMP_RETURN_IF_ERROR(expert_out.Allocate(rows * m.hidden));
    VAMP_RETURN_IF_ERROR(out.Allocate(t * m.hidden));
    VAMP_RETURN_IF_ERROR(logits.Allocate(t * m.experts));
    VAMP_RETURN_IF_ERROR(topk_weights.Allocate(rows));
    VAMP_RETURN_IF_ERROR(topk_ids.Allocate(rows));
    VAMP_RETURN_IF_ERROR(offsets.Allocate(m.experts + 1));
    VAMP_RETURN_IF_ERROR(row_token.Allocate(rows));
    VAMP_RETURN_IF_ERROR(pair_row.Allocate(rows));
    VAMP_BENCH_CUDA(
        cudaMallocHost(reinterpret_cast<void**>(&host_offsets), (m.experts + 1) * sizeof(int32_t)));
    const std::vector<BFloat16> xs = RandomBf16(t * m.hidden, rng, 1.0f);
    VAMP_BENCH_CUDA(
        cudaMemcpy(x.get(), xs.data(), xs.size() * sizeof(BFloat16), cudaMemcpyHostToDevice));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> lg(t * m.experts);
    for (auto& v : lg) v = dist(rng);
    VAMP_BENCH_CUDA(
        cudaMemcpy(logits.get(), lg.data(), lg.size() * sizeof(float), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
};

// kGroupedFusedMma: the fused path on the mma.sync tiles only (kc::SetGroupedGemmMmaSyncOnly),
// as before Hopper's wgmma kernel: the in-run baseline of the default tiles.
enum class Path { kCublas, kCublasGrouped, kGrouped, kGroupedFused, kGroupedFusedMma };

constexpr Path kPaths[] = {Path::kCublas, Path::kCublasGrouped, Path::kGrouped, Path::kGroupedFused,
                           Path::kGroupedFusedMma};

const char* PathName(Path p) {
  switch (p) {
    case Path::kCublas:
      return "cublas";
    case Path::kCublasGrouped:
      return "cublas_grouped";
    case Path::kGrouped:
      return "grouped";
    case Path::kGroupedFused:
      return "grouped_fused";
    case Path::kGroupedFusedMma:
      return "grouped_fused_mma";
  }
  return "?";
}

bool NeedsHostOffsets(Path p) { return p == Path::kCublas || p == Path::kCublasGrouped; }

// The expert GEMMs (with SiLU-and-mul between them) of `path`. The cuBLAS paths read
// L.host_offsets, which the caller must have filled.
absl::Status ExpertGemms(const ModelShape& m, Layer& L, Experts& X, Path path,
                         cudaStream_t stream) {
  const int64_t H = m.hidden, I = m.inter, E = m.experts, R = L.rows;
  const int64_t w2_offset = 2 * I * H;
  switch (path) {
    case Path::kCublas:
    case Path::kCublasGrouped: {
      using BlasFn = absl::Status (*)(const BFloat16*, int64_t, const BFloat16* const*, int64_t,
                                      int64_t, const int32_t*, int64_t, BFloat16*, int64_t, int64_t,
                                      int64_t, cudaStream_t);
      const BlasFn gemm = path == Path::kCublas ? static_cast<BlasFn>(&kc::ExpertGemm)
                                                : static_cast<BlasFn>(&kc::ExpertGemmGrouped);
      VAMP_RETURN_IF_ERROR(gemm(L.permuted.get(), H, X.host_table.data(), 0, H, L.host_offsets, E,
                                L.h13.get(), 2 * I, 2 * I, H, stream));
      VAMP_RETURN_IF_ERROR(kc::SiluAndMul(L.h13.get(), 2 * I, R, I, L.act.get(), I, stream));
      return gemm(L.act.get(), I, X.host_table.data(), w2_offset, I, L.host_offsets, E,
                  L.expert_out.get(), H, H, I, stream);
    }
    case Path::kGrouped:
      VAMP_RETURN_IF_ERROR(kc::GroupedExpertGemm(L.permuted.get(), H, X.device_table.get(), 0, H,
                                                 L.offsets.get(), E, R, L.h13.get(), 2 * I, 2 * I,
                                                 H, stream));
      VAMP_RETURN_IF_ERROR(kc::SiluAndMul(L.h13.get(), 2 * I, R, I, L.act.get(), I, stream));
      return kc::GroupedExpertGemm(L.act.get(), I, X.device_table.get(), w2_offset, I,
                                   L.offsets.get(), E, R, L.expert_out.get(), H, H, I, stream);
    case Path::kGroupedFused:
    case Path::kGroupedFusedMma:
      VAMP_RETURN_IF_ERROR(kc::GroupedExpertGemmSiluMul(L.permuted.get(), H, X.device_table.get(),
                                                        0, H, L.offsets.get(), E, R, L.act.get(), I,
                                                        I, H, stream));
      return kc::GroupedExpertGemm(L.act.get(), I, X.device_table.get(), w2_offset, I,
                                   L.offsets.get(), E, R, L.expert_out.get(), H, H, I, stream);
  }
  return absl::InternalError("unknown path");
}

// The whole layer, as the runner's Moe() does it from the router logits on.
absl::Status MoeLayer(const ModelShape& m, Layer& L, Experts& X, Path path, cudaStream_t stream) {
  const int64_t H = m.hidden, E = m.experts, K = m.top_k, T = L.tokens;
  VAMP_RETURN_IF_ERROR(kc::RouterTopK(L.logits.get(), E, T, E, K, /*renormalize=*/true,
                                      L.topk_ids.get(), L.topk_weights.get(), stream));
  VAMP_RETURN_IF_ERROR(kc::MoePermute(L.topk_ids.get(), T, K, E, L.offsets.get(), L.row_token.get(),
                                      L.pair_row.get(), stream));
  if (NeedsHostOffsets(path)) {
    VAMP_BENCH_CUDA(cudaMemcpyAsync(L.host_offsets, L.offsets.get(), (E + 1) * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream));
    VAMP_BENCH_CUDA(cudaStreamSynchronize(stream));
  }
  VAMP_RETURN_IF_ERROR(
      kc::GatherRows(L.x.get(), H, L.row_token.get(), L.rows, H, L.permuted.get(), H, stream));
  VAMP_RETURN_IF_ERROR(ExpertGemms(m, L, X, path, stream));
  return kc::MoeUnpermute(L.expert_out.get(), H, L.pair_row.get(), L.topk_weights.get(), T, K, H,
                          L.out.get(), H, stream);
}

absl::Status SyncStream(cudaStream_t stream) {
  VAMP_BENCH_CUDA(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

// Median device time of `run` in µs (bench::MedianEventMs).
absl::StatusOr<double> MedianUs(const std::function<absl::Status()>& run, int64_t warmup,
                                int64_t iters, cudaStream_t stream) {
  VAMP_ASSIGN_OR_RETURN(const double ms, bench::MedianEventMs(run, warmup, iters, stream));
  return ms * 1e3;
}

// Max |a - b| and max |b| of two bf16 device arrays of n elements.
absl::Status Compare(const BFloat16* a, const BFloat16* b, int64_t n, double* max_diff,
                     double* max_ref) {
  std::vector<BFloat16> ha(n), hb(n);
  VAMP_BENCH_CUDA(cudaMemcpy(ha.data(), a, n * sizeof(BFloat16), cudaMemcpyDeviceToHost));
  VAMP_BENCH_CUDA(cudaMemcpy(hb.data(), b, n * sizeof(BFloat16), cudaMemcpyDeviceToHost));
  *max_diff = 0;
  *max_ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = kernels::ToFloat(ha[i]), y = kernels::ToFloat(hb[i]);
    *max_diff = std::max(*max_diff, std::isfinite(x - y) ? std::abs(x - y) : INFINITY);
    *max_ref = std::max(*max_ref, std::abs(y));
  }
  return absl::OkStatus();
}

void PrintError(const ModelShape& m, int64_t tokens, Path path, const char* scope,
                const absl::Status& s) {
  std::printf(
      "{\"shape\":\"%s\",\"tokens\":%lld,\"path\":\"%s\",\"scope\":\"%s\",\"error\":\"%s\"}\n",
      m.name.c_str(), static_cast<long long>(tokens), PathName(path), scope,
      absl::StrReplaceAll(s.ToString(), {{"\"", "'"}, {"\\", "/"}}).c_str());
  std::fflush(stdout);
}

absl::Status RunShape(const ModelShape& m, const std::vector<int64_t>& token_counts,
                      const Flags& flags, cudaStream_t stream, std::mt19937& rng) {
  Experts experts;
  VAMP_RETURN_IF_ERROR(experts.Init(m, rng, static_cast<float>(flags.weight_std)));
  const int64_t warmup = flags.warmup, iters = flags.iters;
  for (const int64_t tokens : token_counts) {
    Layer L;
    VAMP_RETURN_IF_ERROR(L.Init(m, tokens, rng));
    // The routing is the same on every run (same logits): learn the host offsets once, so the
    // "gemms" scope of the cuBLAS paths needs no copy, and count the experts actually read.
    VAMP_RETURN_IF_ERROR(MoeLayer(m, L, experts, Path::kCublas, stream));
    VAMP_BENCH_CUDA(cudaStreamSynchronize(stream));
    int64_t active = 0;
    for (int64_t e = 0; e < m.experts; ++e) active += L.host_offsets[e + 1] > L.host_offsets[e];
    const double flops = 6.0 * static_cast<double>(L.rows) * m.hidden * m.inter;
    const double weight_bytes = static_cast<double>(active) * 3 * m.hidden * m.inter * 2;

    // The reference output of the check: the cublas path's.
    DeviceBuffer<BFloat16> reference;
    VAMP_RETURN_IF_ERROR(reference.Allocate(tokens * m.hidden));
    VAMP_BENCH_CUDA(cudaMemcpy(reference.get(), L.out.get(), tokens * m.hidden * sizeof(BFloat16),
                               cudaMemcpyDeviceToDevice));

    for (Path path : kPaths) {
      kc::SetGroupedGemmMmaSyncOnly(path == Path::kGroupedFusedMma);
      std::string check;
      if (flags.check && path != Path::kCublas) {
        absl::Status s = MoeLayer(m, L, experts, path, stream);
        if (s.ok()) s = SyncStream(stream);
        double max_diff = 0, max_ref = 0;
        if (s.ok())
          s = Compare(L.out.get(), reference.get(), tokens * m.hidden, &max_diff, &max_ref);
        if (!s.ok()) {
          PrintError(m, tokens, path, "check", s);
          continue;
        }
        check = absl::StrFormat(",\"max_abs_diff_vs_cublas\":%.4g,\"max_abs_out\":%.4g", max_diff,
                                max_ref);
      }
      for (const char* scope : {"layer", "gemms"}) {
        const bool layer = std::string(scope) == "layer";
        absl::StatusOr<double> us = MedianUs(
            [&] {
              return layer ? MoeLayer(m, L, experts, path, stream)
                           : ExpertGemms(m, L, experts, path, stream);
            },
            warmup, iters, stream);
        if (!us.ok()) {
          PrintError(m, tokens, path, scope, us.status());
          // A failed launch may leave a sticky error; later paths report theirs.
          continue;
        }
        std::printf(
            "{\"shape\":\"%s\",\"tokens\":%lld,\"rows\":%lld,\"active_experts\":%lld,"
            "\"path\":\"%s\",\"scope\":\"%s\",\"us\":%.2f,\"tflops\":%.2f,\"weight_gbps\":%.1f%s}"
            "\n",
            m.name.c_str(), static_cast<long long>(tokens), static_cast<long long>(L.rows),
            static_cast<long long>(active), PathName(path), scope, *us, flops / (*us * 1e6),
            weight_bytes / (*us * 1e3), layer ? check.c_str() : "");
        std::fflush(stdout);
      }
    }
    kc::SetGroupedGemmMmaSyncOnly(false);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  auto invocation = ParseInvocation(Schema(), "vamp_moe_bench",
                                    "One bf16 MoE layer with cuBLAS and device-driven grouped "
                                    "expert GEMMs; one JSON line per measurement.",
                                    argc, argv, FlagsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const Flags& flags = *invocation.options;
  return bench::RunOnCudaDevice(
      "vamp_moe_bench", flags.cuda_device, [&](cudaStream_t stream) -> absl::Status {
        std::mt19937 rng(static_cast<uint32_t>(flags.seed));
        bool failed = false;
        for (const ModelShape& m : Shapes()) {
          if (flags.shapes != "all" && flags.shapes != m.name) continue;
          if (absl::Status s = RunShape(m, flags.tokens, flags, stream, rng); !s.ok()) {
            std::fprintf(stderr, "%s: %s\n", m.name.c_str(), s.ToString().c_str());
            failed = true;
          }
        }
        return failed ? absl::InternalError("a shape failed (above)") : absl::OkStatus();
      });
}

}  // namespace
}  // namespace vamp

int main(int argc, char** argv) { return vamp::Main(argc, argv); }
