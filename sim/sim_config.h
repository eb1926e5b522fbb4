// vamp-sim's configuration: the schema of its flags and SimConfig, the typed values main runs on.
// SimConfigFromConfig is the only code that reads vamp-sim's flags by name; every default is
// written once, in SimConfig (or in the library struct it holds), and the schema takes it from
// there.
#ifndef VAMP_SIM_SIM_CONFIG_H_
#define VAMP_SIM_SIM_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/workload/lmcache_trace.h"
#include "bench/workload/low_reuse_generator.h"
#include "bench/workload/mooncake_trace.h"
#include "bench/workload/multi_turn_generator.h"
#include "common/config.h"
#include "sim/simulator.h"

namespace vamp::sim {

struct SimConfig {
  // multi-turn | mooncake | lmcache | low-reuse
  std::string workload = "multi-turn";
  // The policies every workload runs under (--policies, parsed by ParsePolicy).
  std::vector<PolicySpec> policies;
  // What every run shares: the calibration (preset, then file), scheduler, offload geometry,
  // remap costs, measurement and progress settings. Where vamp-sim's defaults differ from the
  // library's they are set here.
  SimOptions sim = [] {
    SimOptions o;
    o.scheduler.max_num_seqs = 128;  // the paper's H100 setting
    o.scheduler.max_model_len = 262144;
    return o;
  }();
  std::string calibration = "qwen3-next-80b-a3b-h100-tp2";
  std::string calibration_file;

  // multi-turn: a sweep over concurrency (session counts), plus optional tail sessions and
  // low-reuse requests mixed in. Seeds: workload_seed for the sessions, + 7919 for low-reuse.
  std::vector<int32_t> concurrencies = {16, 20, 24, 28};
  workload::MultiTurnOptions multi_turn = [] {
    workload::MultiTurnOptions o;
    // 6144 new tokens a turn put the paper's H100 capacity boundaries at the concurrencies its
    // Figure 9 shows.
    o.first_turn_tokens = 8192;
    o.growth_tokens = 6144;
    o.output_tokens = 256;
    o.think_time_s = 2.0;
    return o;
  }();
  int32_t tail_sessions = 0;
  double tail_start_s = 0;
  workload::LowReuseOptions low_reuse;
  bool mix_low_reuse = false;
  std::string mooncake_trace = "../shared/traces/mooncake/synthetic_trace.jsonl";
  workload::MooncakeOptions mooncake;
  std::string lmcache_dir = "../shared/traces/lmcache-agent-trace/miniswe";
  workload::LmcacheOptions lmcache;
  // A model folder whose tokenizer.json turns the traces' text into token ids ("" = none).
  std::string lmcache_tokenizer_dir;

  // Runs and output.
  int32_t threads = 0;  // 0 = one per core
  bool progress = true;
  std::string report;  // markdown path; empty = none
  std::string decision_log_dir;
  std::string title;
  double phase_split_s = 0;
  bool paper_figure9 = false;
};

// The schema of vamp-sim's flags (see `vamp-sim --help`).
const ConfigSchema& SimConfigSchema();

// The configuration a config of SimConfigSchema() holds: the calibration loaded, the policies
// and concurrency list parsed, vocabulary sizes taken from the calibrated model. Errors name the
// field.
absl::StatusOr<SimConfig> SimConfigFromConfig(const Config& config);

}  // namespace vamp::sim

#endif  // VAMP_SIM_SIM_CONFIG_H_
