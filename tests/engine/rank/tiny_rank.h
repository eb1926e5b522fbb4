// A host rank of a small checkpoint for tests: BuildRank on the host device with a plan of exactly
// `kv_pages` KV pages in `page`-byte pages and VAMP-r = `ratio`.
#ifndef VAMP_TESTS_ENGINE_RANK_TINY_RANK_H_
#define VAMP_TESTS_ENGINE_RANK_TINY_RANK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "engine/rank/rank.h"

namespace vamp::testing {

inline absl::StatusOr<std::unique_ptr<Rank>> BuildHostRank(const std::string& model_dir,
                                                           uint64_t page, int64_t kv_pages,
                                                           double ratio,
                                                           StagingOptions staging = {}) {
  VAMP_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  HostDeviceOptions device;
  device.page_bytes = page;
  device.staging = staging;
  RankSpec spec;
  spec.device = CreateHostDevice(device);
  spec.config = std::move(config);
  spec.plan.runtime_overhead_bytes = 0;
  spec.plan.activation_bytes = page;
  spec.plan.offload.max_offload_ratio = ratio;
  spec.kv_pages = kv_pages;
  LoadOptions load;
  load.model_path = model_dir;
  spec.load = LoadWith(load);
  return BuildRank(std::move(spec));
}

}  // namespace vamp::testing

#endif  // VAMP_TESTS_ENGINE_RANK_TINY_RANK_H_
