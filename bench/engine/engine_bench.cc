// vamp_bench_engine: throughput of the CPU engine (ModelRunner over the CPU reference kernels) on
// a model directory, by default the tiny qwen3_moe test checkpoint. A sanity baseline for the CPU
// path, not a target: it shows what a step costs and how prefill and decode scale with the batch.
//
// Rows:
//   prefill B x L  one step computing B new prompts of L tokens (LM head for the last tokens);
//   decode B @ C   steps of B sequences decoding one token each after a context of C tokens.
// Each scenario runs with every expert resident (host buffers) and, when the model's experts can
// be offloaded at all, with the ExpertStore at its cap (experts above the residency boundary staged
// through the double buffer every step), so the staging overhead is visible.
// Reported, never asserted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "engine/model/model_loader.h"
#include "engine/rank/rank.h"
#include "engine/runner/model_runner.h"

namespace vamp {
namespace {

// The bench's flags, typed.
struct Flags {
  std::string model;  // empty: $VAMP_SOURCE_DIR/tests/data/tiny-qwen3-moe
  std::string load_format = "auto";
  int repeats = 5;
  int64_t decode_steps = 64;
  int64_t kv_blocks = 1024;
  double offload_ratio = 0.75;
  int64_t page_bytes = 4096;
  std::string output;
};

ConfigSchema Schema() {
  const Flags d;
  ConfigSchema s;
  s.String("model", d.model,
           "model directory (default: $VAMP_SOURCE_DIR/tests/data/tiny-qwen3-moe)");
  s.Enum("load_format", d.load_format, {"auto", "safetensors", "dummy"},
         "weights: checkpoint or dummy");
  s.Int("repeats", d.repeats, 1, 1000,
        "measured repetitions of each prefill scenario (best is reported)");
  s.Int("decode_steps", d.decode_steps, 1, 100000, "measured decode steps per decode scenario");
  s.Int("kv_blocks", d.kv_blocks, 16, 1 << 20, "KV blocks of 16 tokens");
  s.Double("offload_ratio", d.offload_ratio, 0.0, 1.0,
           "VAMP-r of the offloaded rows (fraction of experts)");
  s.Int("page_bytes", d.page_bytes, 4096, int64_t{1} << 30, "host page size of the offloaded rows");
  s.String("output", d.output, "also write the table as markdown to this file");
  return s;
}

// The only reader of the flags by name.
Flags FlagsFromConfig(const Config& config) {
  Flags f;
  f.model = config.GetString("model");
  f.load_format = config.GetString("load_format");
  f.repeats = static_cast<int>(config.GetInt("repeats"));
  f.decode_steps = config.GetInt("decode_steps");
  f.kv_blocks = config.GetInt("kv_blocks");
  f.offload_ratio = config.GetDouble("offload_ratio");
  f.page_bytes = config.GetInt("page_bytes");
  f.output = config.GetString("output");
  return f;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One engine: a model, its experts (resident buffers or an ExpertStore at its cap) and a runner.
struct Engine {
  std::string label;
  // Resident: the experts in host buffers, the model and a plain KV buffer.
  std::unique_ptr<HostExpertBuffers> buffers;
  std::unique_ptr<CausalLm> model;
  std::vector<float> kv_storage;
  std::unique_ptr<ModelRunner> resident_runner;
  // Offloaded: a host rank.
  std::unique_ptr<Rank> rank;
  ModelRunner* runner = nullptr;  // the one of the two in use
  int64_t num_blocks = 0;
};

absl::StatusOr<std::unique_ptr<Engine>> ResidentEngine(const ModelConfig& config,
                                                       const LoadOptions& options,
                                                       int64_t kv_blocks) {
  auto e = std::make_unique<Engine>();
  e->label = "resident";
  VAMP_ASSIGN_OR_RETURN(ExpertShardLayout layout, ExpertLayoutFor(config, options.parallel));
  e->buffers =
      std::make_unique<HostExpertBuffers>(config.num_hidden_layers, config.num_experts, layout);
  VAMP_ASSIGN_OR_RETURN(e->model, LoadModel(config, options, *e->buffers));
  BlockMajorKvLayout kv{16, config.num_hidden_layers, e->model->kv_heads_per_rank(),
                        config.head_dim};
  e->kv_storage.assign(kv_blocks * kv.BlockElements(), 0.0f);
  e->num_blocks = kv_blocks;
  RunnerConfig rc;
  VAMP_ASSIGN_OR_RETURN(
      e->resident_runner,
      ModelRunner::Create(rc, e->model.get(), e->buffers.get(), nullptr,
                          kv.View(e->kv_storage.data(), kv_blocks, e->model->attention_layers(),
                                  config.num_hidden_layers)));
  e->runner = e->resident_runner.get();
  return e;
}

// Experts in an ExpertStore offloaded to the cap; KV in the KvRegion (baseline = kv_blocks).
absl::StatusOr<std::unique_ptr<Engine>> OffloadedEngine(const ModelConfig& config,
                                                        const LoadOptions& options,
                                                        int64_t kv_blocks, double ratio,
                                                        uint64_t page) {
  auto e = std::make_unique<Engine>();
  const ModelShape shape = config.ToModelShape(sizeof(float));
  VAMP_ASSIGN_OR_RETURN(KvBlockGeometry kv_geometry, ComputeKvBlockGeometry(shape, 1, 16));
  HostDeviceOptions device;
  device.page_bytes = page;
  RankSpec spec;
  spec.device = CreateHostDevice(device);
  spec.config = config;
  spec.parallel = options.parallel;
  spec.plan.runtime_overhead_bytes = 0;
  spec.plan.activation_bytes = page;
  spec.plan.offload.max_offload_ratio = ratio;
  spec.kv_pages = (kv_blocks * static_cast<int64_t>(kv_geometry.block_bytes) + page - 1) /
                  static_cast<int64_t>(page);
  spec.load = LoadWith(options);
  VAMP_ASSIGN_OR_RETURN(e->rank, BuildRank(std::move(spec)));
  const MemoryPlan& plan = e->rank->plan;
  if (plan.experts.max_groups == 0) {
    return absl::FailedPreconditionError("nothing can be offloaded with these settings");
  }
  AgentMemory& memory = e->rank->memory;
  VAMP_RETURN_IF_ERROR(memory.page_remapper->Offload(plan.experts.max_groups).status());
  e->label = absl::StrFormat("b=%d/%d", memory.experts->boundary(), config.num_experts);
  VAMP_RETURN_IF_ERROR(e->rank->RefreshKv());
  e->runner = e->rank->runner.get();
  e->num_blocks = e->runner->kv_cache().num_blocks;
  return e;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

struct Result {
  std::string scenario;
  std::string engine;
  int64_t tokens = 0;
  double seconds = 0;
};

// B prompts of L tokens in one step; the best of `repeats`. Requests are finished afterwards.
absl::StatusOr<Result> Prefill(Engine& e, int64_t batch, int64_t len, int repeats, int64_t vocab,
                               RunnerRequestId& next_id) {
  std::mt19937 rng(1);
  const int64_t blocks_per = (len + 15) / 16;
  if (batch * blocks_per > e.num_blocks) return absl::ResourceExhaustedError("KV too small");
  Result r{absl::StrFormat("prefill %d x %d", batch, len), e.label, batch * len, 1e30};
  for (int rep = 0; rep < repeats; ++rep) {
    StepInput in;
    std::vector<RunnerRequestId> ids;
    for (int64_t b = 0; b < batch; ++b) {
      NewRequestData nr;
      nr.id = next_id++;
      nr.prompt_token_ids = RandomTokens(rng, len, vocab);
      for (int64_t k = 0; k < blocks_per; ++k) nr.block_ids.push_back(b * blocks_per + k);
      nr.sampling.temperature = 0;
      in.scheduled.push_back({nr.id, static_cast<int32_t>(len)});
      ids.push_back(nr.id);
      in.new_requests.push_back(std::move(nr));
    }
    const double start = Now();
    VAMP_RETURN_IF_ERROR(e.runner->ExecuteStep(in).status());
    r.seconds = std::min(r.seconds, Now() - start);
    StepInput done;
    done.finished_ids = ids;
    VAMP_RETURN_IF_ERROR(e.runner->ExecuteStep(done).status());
  }
  return r;
}

// B sequences with a context of C tokens decode `steps` tokens each.
absl::StatusOr<Result> Decode(Engine& e, int64_t batch, int64_t context, int64_t steps,
                              int64_t vocab, RunnerRequestId& next_id) {
  std::mt19937 rng(2);
  const int64_t blocks_per = (context + steps + 15) / 16;
  if (batch * blocks_per > e.num_blocks) return absl::ResourceExhaustedError("KV too small");
  StepInput in;
  std::vector<RunnerRequestId> ids;
  for (int64_t b = 0; b < batch; ++b) {
    NewRequestData nr;
    nr.id = next_id++;
    nr.prompt_token_ids = RandomTokens(rng, context, vocab);
    for (int64_t k = 0; k < blocks_per; ++k) nr.block_ids.push_back(b * blocks_per + k);
    nr.sampling.temperature = 0;
    in.scheduled.push_back({nr.id, static_cast<int32_t>(context)});
    ids.push_back(nr.id);
    in.new_requests.push_back(std::move(nr));
  }
  VAMP_RETURN_IF_ERROR(e.runner->ExecuteStep(in).status());
  Result r{absl::StrFormat("decode %d @ %d", batch, context), e.label, batch * steps, 0};
  const double start = Now();
  for (int64_t s = 0; s < steps; ++s) {
    StepInput step;
    for (RunnerRequestId id : ids) {
      step.cached_requests.push_back({id, {}, static_cast<int32_t>(context + s), false});
      step.scheduled.push_back({id, 1});
    }
    VAMP_RETURN_IF_ERROR(e.runner->ExecuteStep(step).status());
  }
  r.seconds = Now() - start;
  StepInput done;
  done.finished_ids = ids;
  VAMP_RETURN_IF_ERROR(e.runner->ExecuteStep(done).status());
  return r;
}

absl::Status Run(const Flags& flags) {
  std::string model_dir = flags.model;
  if (model_dir.empty()) {
    const char* src = std::getenv("VAMP_SOURCE_DIR");
    model_dir = absl::StrCat(src != nullptr ? src : ".", "/tests/data/tiny-qwen3-moe");
  }
  VAMP_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  LoadOptions options;
  options.model_path = model_dir;
  VAMP_ASSIGN_OR_RETURN(options.format, ParseLoadFormat(flags.load_format));
  const int64_t kv_blocks = flags.kv_blocks;
  std::vector<std::unique_ptr<Engine>> engines;
  VAMP_ASSIGN_OR_RETURN(auto resident, ResidentEngine(config, options, kv_blocks));
  engines.push_back(std::move(resident));
  auto offloaded = OffloadedEngine(config, options, kv_blocks, flags.offload_ratio,
                                   static_cast<uint64_t>(flags.page_bytes));
  if (offloaded.ok()) {
    engines.push_back(std::move(*offloaded));
  } else {
    VAMP_LOG(WARNING) << "no offloaded rows: " << offloaded.status();
  }

  const int repeats = flags.repeats;
  const int64_t steps = flags.decode_steps;
  std::vector<Result> results;
  RunnerRequestId next_id = 1;
  for (auto& e : engines) {
    for (auto [b, l] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {1, 512}, {4, 256}, {16, 64}}) {
      auto r = Prefill(*e, b, l, repeats, config.vocab_size, next_id);
      if (r.ok()) results.push_back(*r);
    }
    for (auto [b, c] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {8, 128}, {32, 128}, {8, 512}}) {
      auto r = Decode(*e, b, c, steps, config.vocab_size, next_id);
      if (r.ok()) results.push_back(*r);
    }
  }

  std::string table = absl::StrFormat(
      "model: %s (%s weights), %d layers, hidden %d, %d experts top-%d, float32, 1 thread\n\n"
      "| scenario | experts | tokens | time (ms) | tokens/s | ms/step |\n"
      "| --- | --- | ---: | ---: | ---: | ---: |\n",
      model_dir, flags.load_format, config.num_hidden_layers, config.hidden_size,
      config.num_experts, config.num_experts_per_tok);
  for (const Result& r : results) {
    const bool decode = r.scenario.rfind("decode", 0) == 0;
    const double step_ms = decode ? r.seconds * 1e3 / static_cast<double>(steps) : r.seconds * 1e3;
    absl::StrAppendFormat(&table, "| %s | %s | %d | %.2f | %.0f | %.3f |\n", r.scenario, r.engine,
                          r.tokens, r.seconds * 1e3, r.tokens / r.seconds, step_ms);
  }
  for (auto& e : engines) {
    if (e->rank == nullptr) continue;
    const StagingStats s = e->rank->experts->stats();
    absl::StrAppendFormat(&table,
                          "\nstaging (%s): %d passes, %d copies, %.1f MiB copied, copy %.1f ms, "
                          "forward pass waited %.1f ms for copies\n",
                          e->label, s.passes, s.copies, s.bytes / 1048576.0, s.copy_us / 1e3,
                          s.wait_us / 1e3);
  }
  std::printf("%s", table.c_str());
  if (const std::string& out = flags.output; !out.empty()) {
    std::ofstream(out) << table;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace vamp

int main(int argc, char** argv) {
  auto invocation =
      vamp::ParseInvocation(vamp::Schema(), "vamp_bench_engine", "CPU engine tokens/s.", argc, argv,
                            vamp::FlagsFromConfig);
  if (!invocation.options) return invocation.exit_code;
  const absl::Status s = vamp::Run(*invocation.options);
  if (!s.ok()) {
    std::fprintf(stderr, "vamp_bench_engine: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
