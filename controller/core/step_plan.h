// What one scheduler step tells the agents, and what they send back.
//
// Agent contract (what makes "diffs only" sufficient):
//  - Apply `finished_ids` and `preempted_ids` before the request lists (an id aborted and re-added
//    between two steps appears in `finished_ids` and, as a new request, in `new_requests`).
//  - A request is announced once, in `new_requests`, with its prompt, sampling parameters and full
//    block table. Afterwards it appears only in `cached_requests` with the blocks appended to its
//    table this step.
//  - A request in `preempted_ids` has lost its blocks: the agent drops its block table and batch
//    slot but keeps its token ids (prompt and the outputs it sampled) and sampling parameters.
//    When it is scheduled again it comes with `resumed = true` and `new_block_ids` holding its
//    whole new table, which replaces the old one; it recomputes from `num_computed_tokens`.
//  - A request in `finished_ids` is gone for good (stopped, length-capped or aborted); the agent
//    frees everything it holds for it.
//  - For each scheduled request the agent computes KV for token positions
//    [num_computed_tokens, num_computed_tokens + num_scheduled_tokens) into the block table, and
//    samples a token exactly when that range reaches the end of the request's known tokens.
//  - Models with recurrent state: a request that starts past token 0 (a prefix-cache hit, new or
//    resumed) comes with restore_state_blocks, where a snapshot of its state after exactly
//    num_computed_tokens tokens is (captured in an earlier step); the agent restores it first.
//    A step with capture_state_tokens > 0 copies the request's state after that many tokens
//    into capture_state_blocks. Snapshot blocks are in no block table; the controller never
//    names one for a restore before the step that captured it has answered, nor after it
//    handed one of its blocks to anything else. An agent refuses a restore it cannot serve.
//  - Only one step is in flight: the next plan comes after the controller applied this step's
//    StepOutput. Blocks freed by the controller are therefore never written by an older step.
#ifndef VAMP_CONTROLLER_CORE_STEP_PLAN_H_
#define VAMP_CONTROLLER_CORE_STEP_PLAN_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "controller/core/block_hash.h"
#include "controller/core/kv_block.h"
#include "controller/core/request.h"
#include "controller/core/sampling_params.h"

namespace vamp {

struct NewRequestPlan {
  RequestId request_id = 0;
  std::vector<TokenId> prompt_token_ids;
  SamplingParams sampling_params;
  // Needed by the sampler to suppress EOS before min_tokens.
  std::optional<TokenId> eos_token_id;
  std::vector<BlockId> block_ids;
  // Tokens already in the KV cache (the prefix-cache hit).
  int32_t num_computed_tokens = 0;
  int32_t num_scheduled_tokens = 0;
  // Recurrent state (see the contract above): the snapshot a hit restores; one to capture.
  std::vector<BlockId> restore_state_blocks;
  int32_t capture_state_tokens = 0;
  std::vector<BlockId> capture_state_blocks;
};

struct CachedRequestPlan {
  RequestId request_id = 0;
  // Scheduled again after a preemption: new_block_ids is the whole table and replaces the old one.
  bool resumed = false;
  std::vector<BlockId> new_block_ids;
  int32_t num_computed_tokens = 0;
  int32_t num_scheduled_tokens = 0;
  // As NewRequestPlan's; restore_state_blocks only when resumed.
  std::vector<BlockId> restore_state_blocks;
  int32_t capture_state_tokens = 0;
  std::vector<BlockId> capture_state_blocks;
};

struct StepPlan {
  int64_t step = 0;
  std::vector<NewRequestPlan> new_requests;
  std::vector<CachedRequestPlan> cached_requests;
  std::vector<RequestId> preempted_ids;
  std::vector<RequestId> finished_ids;
  // Pool size the block ids refer to (agents check it against their KV region).
  int32_t num_blocks = 0;
  int64_t total_num_scheduled_tokens = 0;

  // Nothing to execute (the id lists may still need delivering).
  bool empty() const { return total_num_scheduled_tokens == 0; }
};

// Tokens sampled for one request in one step (one token without speculative decoding).
struct SampledTokens {
  RequestId request_id = 0;
  absl::InlinedVector<TokenId, 1> token_ids;
};

// The agents' answer to a StepPlan.
struct StepOutput {
  int64_t step = 0;
  std::vector<SampledTokens> sampled;
};

// What a client stream gets from one step.
struct RequestOutput {
  RequestId request_id = 0;
  // Tokens accepted this step (after stop conditions: a stop token is kept, anything after it
  // dropped).
  absl::InlinedVector<TokenId, 1> new_token_ids;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<TokenId> stop_token_id;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_CORE_STEP_PLAN_H_
