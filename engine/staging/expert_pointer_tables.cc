#include "engine/staging/expert_pointer_tables.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace vamp {

absl::StatusOr<ExpertPointerTables> BuildExpertPointerTables(const ExpertStore& store) {
  const ExpertGeometry& g = store.geometry();
  const int num_layers =
      g.moe_layers.empty() ? 0 : *std::max_element(g.moe_layers.begin(), g.moe_layers.end()) + 1;
  ExpertPointerTables t;
  for (int layer : g.moe_layers) {
    if (store.OffloadedHostRange(layer).bytes > 0) t.staged_layers.push_back(layer);
  }
  // Nothing staged, no plan: a store that cannot offload has no staging buffer to plan with.
  if (!t.staged_layers.empty()) {
    VAMP_ASSIGN_OR_RETURN(t.plan, PlanStagingPass(t.staged_layers, store.num_staging_buffers()));
  }
  t.job_of_layer.assign(num_layers, -1);
  for (size_t i = 0; i < t.plan.size(); ++i) {
    t.job_of_layer[t.plan[i].layer] = static_cast<int>(i);
  }
  t.w13.assign(num_layers, {});
  t.w2.assign(num_layers, {});
  for (int layer : g.moe_layers) {
    const std::vector<ExpertLocation> table = store.PointerTable(layer);
    const int job = t.job_of_layer[layer];
    std::vector<const void*>& w13 = t.w13[layer];
    std::vector<const void*>& w2 = t.w2[layer];
    w13.resize(table.size());
    w2.resize(table.size());
    for (size_t e = 0; e < table.size(); ++e) {
      const ExpertLocation& loc = table[e];
      if (loc.where == ExpertLocation::Where::kResident) {
        w13[e] = reinterpret_cast<const void*>(static_cast<uintptr_t>(loc.w13));
        w2[e] = reinterpret_cast<const void*>(static_cast<uintptr_t>(loc.w2));
        continue;
      }
      if (job < 0 || loc.w2 + g.w2_bytes > g.staging_buffer_bytes()) {
        return absl::InternalError(absl::StrCat("expert ", e, " of layer ", layer,
                                                " is staged but has no staging buffer"));
      }
      const auto* base = reinterpret_cast<const uint8_t*>(
          static_cast<uintptr_t>(store.StagingBufferAddress(t.plan[job].buffer)));
      w13[e] = static_cast<const void*>(base + loc.w13);
      w2[e] = static_cast<const void*>(base + loc.w2);
    }
  }
  return t;
}

}  // namespace vamp
