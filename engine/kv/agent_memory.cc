#include "engine/kv/agent_memory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace vamp {

AgentMemory& AgentMemory::operator=(AgentMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    pool = std::move(other.pool);
    experts = std::move(other.experts);
    kv = std::move(other.kv);
    page_remapper = std::move(other.page_remapper);
  }
  return *this;
}

void AgentMemory::Reset() {
  page_remapper.reset();
  kv.reset();
  experts.reset();
  pool.reset();
}

absl::StatusOr<AgentMemory> CreateAgentMemory(MemoryBackend* backend, const MemoryPlan& plan,
                                              InFlightFence* fence) {
  if (backend->page_bytes() != plan.experts.page_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the memory plan assumes ", plan.experts.page_bytes, "-byte pages but the ",
                     backend->name(), " backend's page is ", backend->page_bytes(), " bytes"));
  }
  AgentMemory memory;
  VAMP_ASSIGN_OR_RETURN(memory.pool, PagePool::Create(backend, plan.pool_pages()));
  VAMP_ASSIGN_OR_RETURN(memory.experts, ExpertStore::Create(memory.pool.get(), plan.experts));
  VAMP_ASSIGN_OR_RETURN(memory.kv,
                        KvRegion::Create(memory.pool.get(), plan.kv, plan.kv_baseline_pages,
                                         plan.experts.max_kv_offload_pages()));
  memory.page_remapper = std::make_unique<PageRemapper>(memory.pool.get(), memory.experts.get(),
                                                        memory.kv.get(), fence);
  return memory;
}

}  // namespace vamp
