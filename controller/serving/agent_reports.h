// Checks of the numbers agents report (Init, step timings) before the controller sizes anything
// from them; what they report after a remap is compared with what the controller expects
// (RemoteOffloader::Confirm). An agent is a separate process, possibly buggy, possibly not ours:
// one that reported kv_blocks = 2^31 - 1 made the controller allocate a block table for it and die
// of std::bad_alloc. Every count is checked against what the agent itself declared (its device
// memory) and against the model; a report that fails refuses the agent with an error naming the
// rank and the field.
#ifndef VAMP_CONTROLLER_SERVING_AGENT_REPORTS_H_
#define VAMP_CONTROLLER_SERVING_AGENT_REPORTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "vamp/v1/agent.pb.h"

namespace vamp {

// Hard ceilings, far above any real deployment, that bound what the controller ever allocates
// from an agent's word.
inline constexpr uint64_t kMaxAgentDeviceBytes = uint64_t{1} << 50;  // 1 PiB
inline constexpr int64_t kMaxAgentKvBlocks = int64_t{1} << 24;       // 16 Mi blocks
inline constexpr int32_t kMaxModelLayers = 4096;
inline constexpr int32_t kMaxModelExperts = 1 << 16;
inline constexpr int32_t kMaxModelVocab = 1 << 24;
inline constexpr int32_t kMaxModelContext = 1 << 24;
// A step or remap that an agent says took longer than a day did not.
inline constexpr int64_t kMaxAgentStepMicros = int64_t{24} * 3600 * 1000000;

// Checks every rank's InitResponse (in rank order) against `request` and against each other: the
// model's shape within bounds and the same on every rank, the memory split within the declared
// device memory, KV blocks that fit in it (each block holds at least one byte of K and of V per
// layer and token) and in the KV bytes mapped, group counts within the model's experts and under
// the cap the request asked for (memory.max_offload_ratio), recurrent state within the device
// memory (and on every rank or none), and an offload geometry whose every
// reachable pool (all groups offloaded included) fits in the device and in kMaxAgentKvBlocks:
// the controller sizes every later remap from it without asking again.
absl::Status CheckInitResponses(const vamp::v1::InitRequest& request,
                                const std::vector<vamp::v1::InitResponse>& responses);

// Checks one rank's step timings: every duration within [0, kMaxAgentStepMicros], bytes within
// [0, kMaxAgentDeviceBytes].
absl::Status CheckStepTimings(const vamp::v1::StepTimings& timings, int rank);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_AGENT_REPORTS_H_
