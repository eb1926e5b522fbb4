#include "agent/init_request.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/offload_cap.h"
#include "common/status_macros.h"

namespace vamp {
namespace {

// MemorySpec.`field`: `value`, or `fallback` when the controller left it at 0; InvalidArgument
// naming the field unless the result is >= 1.
absl::StatusOr<int32_t> AtLeastOne(int32_t value, int32_t fallback, absl::string_view field) {
  const int32_t resolved = value == 0 ? fallback : value;
  if (resolved < 1) {
    return absl::InvalidArgumentError(absl::StrCat("memory.", field, " must be >= 1, got ", value));
  }
  return resolved;
}

}  // namespace

absl::StatusOr<DType> ResolveAgentDType(absl::string_view requested, DeviceSpec::Kind device) {
  const bool cuda = device == DeviceSpec::Kind::kCuda;
  if (requested.empty() || requested == "auto") {
    return cuda ? DType::kBFloat16 : DType::kFloat32;
  }
  if (requested == "float16") {
    if (!cuda) return DType::kFloat32;
    return absl::InvalidArgumentError(
        "dtype 'float16' is not supported by CUDA agents (Qwen3 checkpoints are bfloat16 and "
        "float16 overflows their activations): use auto, bfloat16 or float32");
  }
  absl::StatusOr<DType> parsed = ParseDType(requested);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype '", requested, "' is not one of auto, bfloat16, float32", cuda ? "" : ", float16"));
  }
  return cuda ? *parsed : DType::kFloat32;
}

absl::StatusOr<ResolvedInit> ResolveInit(const vamp::v1::InitRequest& r,
                                         const AgentEngineOptions& o, uint64_t device_bytes,
                                         uint64_t page_bytes) {
  const bool cuda = o.device.kind == DeviceSpec::Kind::kCuda;
  ResolvedInit out;
  if (r.model_path().empty()) {
    return absl::InvalidArgumentError(
        "model_path is empty: it must name a directory with config.json (and *.safetensors "
        "unless load_format is dummy)");
  }
  const std::string format = r.load_format().empty() ? "auto" : r.load_format();
  absl::StatusOr<LoadFormat> load_format = ParseLoadFormat(format);
  if (!load_format.ok()) return WithPrefix(load_format.status(), "load_format: ");
  VAMP_ASSIGN_OR_RETURN(out.dtype, ResolveAgentDType(r.dtype(), o.device.kind));
  if (!cuda && (r.dtype() == "bfloat16" || r.dtype() == "float16")) {
    // The CPU engine has float32 kernels only; the weights are widened on load.
    VAMP_LOG(WARNING) << "dtype " << r.dtype()
                      << " requested: the CPU engine computes and stores KV in float32";
  }
  const vamp::v1::ParallelSpec& p = r.parallel();
  out.parallel.tp_size = p.tp_size() == 0 ? 1 : p.tp_size();
  out.parallel.tp_rank = p.tp_rank();
  if (out.parallel.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.tp_size must be >= 1, got ", p.tp_size()));
  }
  if (out.parallel.tp_rank < 0 || out.parallel.tp_rank >= out.parallel.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.tp_rank ", p.tp_rank(), " is outside [0, tp_size = ", out.parallel.tp_size, ")"));
  }
  if (cuda && out.parallel.tp_size > 1 &&
      p.nccl_unique_id().size() != static_cast<size_t>(kNcclUniqueIdBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.nccl_unique_id has ", p.nccl_unique_id().size(), " bytes; tp_size ",
                     out.parallel.tp_size, " on a CUDA agent needs the ", kNcclUniqueIdBytes,
                     "-byte NCCL unique id that rank 0 created for this initialisation (Agent."
                     "CreateCollectiveId; the controller hands it to every rank)"));
  }
  if (!cuda && out.parallel.tp_size > 1 && p.host_transport_address().empty()) {
    return absl::InvalidArgumentError(
        "parallel.host_transport_address is required for tp_size > 1 on CPU agents: rank 0 "
        "listens there and the other ranks connect (a fixed host:port)");
  }

  const vamp::v1::MemorySpec& m = r.memory();
  const InitDefaults& d = o.defaults;
  const double util =
      m.gpu_memory_utilization() == 0 ? d.gpu_memory_utilization : m.gpu_memory_utilization();
  if (!(util > 0.0 && util <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.gpu_memory_utilization must be in (0, 1], got ", m.gpu_memory_utilization()));
  }
  VAMP_ASSIGN_OR_RETURN(const int32_t block_size,
                        AtLeastOne(m.block_size(), d.block_size, "block_size"));
  VAMP_ASSIGN_OR_RETURN(const OffloadCap offload_cap,
                        OffloadCap::FromRatio(m.max_offload_ratio(), "memory.max_offload_ratio"));
  VAMP_ASSIGN_OR_RETURN(
      const int32_t batched,
      AtLeastOne(m.max_num_batched_tokens(), d.max_num_batched_tokens, "max_num_batched_tokens"));
  VAMP_ASSIGN_OR_RETURN(const int32_t seqs,
                        AtLeastOne(m.max_num_seqs(), d.max_num_seqs, "max_num_seqs"));

  absl::StatusOr<ModelConfig> config = LoadModelConfig(r.model_path());
  if (!config.ok()) {
    return WithCode(config.status(), absl::StatusCode::kInvalidArgument,
                    absl::StrCat("model_path '", r.model_path(), "': "));
  }
  out.config = *std::move(config);
  absl::StatusOr<ExpertShardLayout> layout = ExpertLayoutFor(out.config, out.parallel);
  if (!layout.ok()) {
    return WithCode(layout.status(), absl::StatusCode::kInvalidArgument,
                    absl::StrCat("parallel.tp_size ", out.parallel.tp_size, ": "));
  }

  out.load.model_path = r.model_path();
  out.load.format = *load_format;
  out.load.dummy_seed = r.dummy_seed();
  out.load.parallel = out.parallel;

  out.plan_config.tp_rank = out.parallel.tp_rank;
  out.plan_config.tp_size = out.parallel.tp_size;
  out.plan_config.device_memory_bytes = device_bytes;
  out.plan_config.gpu_memory_utilization = util;
  out.plan_config.page_bytes = page_bytes;
  out.plan_config.kv_block_size = block_size;
  out.plan_config.offload.max_offload_ratio = offload_cap.ratio();
  out.plan_config.max_num_batched_tokens = batched;
  out.plan_config.max_num_seqs = seqs;
  out.plan_config.max_model_len = 0;
  // On CUDA the utilisation fraction leaves room for the context and cuBLAS; the device copies of
  // the non-expert weights and the activation workspace are in the plan's weight and activation
  // terms.
  out.plan_config.runtime_overhead_bytes = cuda ? 0 : o.host_runtime_overhead_bytes;
  out.plan_config.activation_bytes = m.activation_reserve_bytes();

  // Expert shards, dense weights and KV are planned in the engine's element size.
  const ModelShape shape = out.config.ToModelShape(DTypeBytes(out.dtype));
  absl::StatusOr<MemoryPlan> plan = PlanMemory(shape, out.plan_config);
  if (!plan.ok()) {
    const std::string prefix = absl::StrFormat(
        "memory (gpu_memory_utilization %.3f of %s %d bytes, page %d bytes): ", util,
        cuda ? absl::StrCat("device ", o.device.ToString()) : "--host_memory_bytes", device_bytes,
        page_bytes);
    return WithCode(plan.status(),
                    plan.status().code() == absl::StatusCode::kResourceExhausted
                        ? absl::StatusCode::kFailedPrecondition
                        : absl::StatusCode::kInvalidArgument,
                    prefix);
  }
  out.plan = *std::move(plan);

  out.runner.block_size = block_size;
  out.runner.max_num_seqs = seqs;
  out.runner.max_num_batched_tokens = batched;
  out.runner.max_model_len = 0;
  out.runner.seed = o.sampling_seed;
  return out;
}

}  // namespace vamp
