// AgentMemory: the memory layer of one rank built from its plan — the page pool, the expert store,
// the KV region and the page remapper that moves pages between them.
#ifndef VAMP_ENGINE_KV_AGENT_MEMORY_H_
#define VAMP_ENGINE_KV_AGENT_MEMORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/experts/expert_store.h"
#include "engine/kv/kv_region.h"
#include "engine/kv/page_remapper.h"
#include "engine/memory/fence.h"
#include "engine/memory/memory_backend.h"
#include "engine/memory/memory_plan.h"
#include "engine/memory/page_pool.h"

namespace vamp {

// Everything one agent's memory layer owns, built from its plan. Teardown (destruction, Reset, and
// move-assignment over a live value) goes page remapper, KV, experts, then the pool, since regions
// hand their pages back to the pool.
struct AgentMemory {
  AgentMemory() = default;
  AgentMemory(AgentMemory&&) noexcept = default;
  AgentMemory& operator=(AgentMemory&& other) noexcept;
  ~AgentMemory() { Reset(); }
  void Reset();

  std::unique_ptr<PagePool> pool;
  std::unique_ptr<ExpertStore> experts;
  std::unique_ptr<KvRegion> kv;
  std::unique_ptr<PageRemapper> page_remapper;
};

// Creates the pool (plan.pool_pages() pages), the expert regions, the KV region (baseline mapped,
// room for every offloadable page) and the page remapper. `backend`'s page must equal the plan's;
// `backend` and `fence` must outlive the result.
absl::StatusOr<AgentMemory> CreateAgentMemory(MemoryBackend* backend, const MemoryPlan& plan,
                                              InFlightFence* fence);

}  // namespace vamp

#endif  // VAMP_ENGINE_KV_AGENT_MEMORY_H_
