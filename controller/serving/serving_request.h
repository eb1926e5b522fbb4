// What the serving engine runs for one request: the prompt's token ids and how to sample its
// output. Each front end builds it from its own format (OpenAI bodies parsed by
// controller/frontend/openai_api.h, gRPC GenerateRequest in controller/server/serving_service.h)
// and keeps what only it needs (streaming, response shape) to itself.
#ifndef VAMP_CONTROLLER_SERVING_SERVING_REQUEST_H_
#define VAMP_CONTROLLER_SERVING_SERVING_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "controller/core/sampling_params.h"

namespace vamp {

struct ServingRequest {
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
  // Requests with different salts never share prefix-cache blocks (tenant isolation).
  std::string cache_salt;
  // Lower values are scheduled first under the priority policy (ignored by FCFS).
  int32_t priority = 0;
  // Return the log-probability of every prompt token after the first, with
  // sampling.num_top_logprobs alternatives each (EngineEvent::prompt_logprobs). The request skips
  // the prefix cache (a cached prefix has no logits), as vLLM does. Only for agents that declared
  // they compute them (ServedModel::prompt_logprobs).
  bool prompt_logprobs = false;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_SERVING_SERVING_REQUEST_H_
