#include "agent/step_executor.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/sampling.h"

namespace vamp {

absl::StatusOr<RunnerSamplingParams> ToRunnerSampling(const vamp::v1::SamplingParams& s,
                                                      const std::string& field) {
  RunnerSamplingParams p;
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".temperature must be >= 0, got ", s.temperature()));
  }
  p.temperature = s.temperature();  // 0: greedy
  if (s.top_k() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".top_k must be >= 0 (0 = disabled), got ", s.top_k()));
  }
  p.top_k = s.top_k();
  if (s.top_p() == 0.0f) {
    p.top_p = 1.0f;
  } else if (!(s.top_p() > 0.0f && s.top_p() <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".top_p must be in (0, 1] (0 = disabled), got ", s.top_p()));
  } else {
    p.top_p = s.top_p();
  }
  if (s.has_seed()) p.seed = s.seed();
  if (!(s.min_p() >= 0.0f && s.min_p() <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".min_p must be in [0, 1], got ", s.min_p()));
  }
  p.min_p = s.min_p();
  if (!std::isfinite(s.presence_penalty()) || !std::isfinite(s.frequency_penalty()) ||
      !std::isfinite(s.repetition_penalty()) || s.repetition_penalty() < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        ": presence_penalty and frequency_penalty must be finite and repetition_penalty "
        ">= 0 (0 = disabled), got ",
        s.presence_penalty(), ", ", s.frequency_penalty(), ", ", s.repetition_penalty()));
  }
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  if (s.num_top_logprobs() < 0 || s.num_top_logprobs() > kernels::cpu::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".num_top_logprobs must be in [0, ",
                                                   kernels::cpu::kMaxTopLogprobs, "], got ",
                                                   s.num_top_logprobs()));
  }
  p.num_top_logprobs = s.num_top_logprobs();
  return p;
}

absl::Status StepExecutor::Run(const vamp::v1::StepRequest& request, int64_t pool, int64_t vocab,
                               ModelRunner& runner, vamp::v1::StepResponse* response) {
  if (request.num_blocks() < 0 || request.num_blocks() > pool) {
    return absl::FailedPreconditionError(absl::StrCat("num_blocks ", request.num_blocks(),
                                                      " does not match this rank's KV pool of ",
                                                      pool, " blocks"));
  }
  auto check_blocks = [&](const google::protobuf::RepeatedField<int32_t>& blocks,
                          const std::string& field) -> absl::Status {
    for (int j = 0; j < blocks.size(); ++j) {
      if (blocks[j] < 0 || blocks[j] >= pool) {
        return absl::OutOfRangeError(absl::StrCat(field, "[", j, "] = ", blocks[j],
                                                  " is outside the KV pool of ", pool, " blocks"));
      }
    }
    return absl::OkStatus();
  };

  // A snapshot of recurrent state, in range like every block id (what it holds is the runner's
  // to check).
  auto snapshot = [&](const vamp::v1::StateSnapshot& from,
                      const std::string& field) -> absl::StatusOr<StateSnapshotBlocks> {
    VAMP_RETURN_IF_ERROR(check_blocks(from.block_ids(), field + ".block_ids"));
    if (from.num_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".num_tokens must be >= 0, got ", from.num_tokens()));
    }
    return StateSnapshotBlocks{from.num_tokens(),
                               {from.block_ids().begin(), from.block_ids().end()}};
  };

  // Where every request the step touches ends up, if the step is applied.
  enum class Fate { kRunning, kPreempted, kGone };
  absl::flat_hash_map<uint64_t, Fate> fate;
  auto current = [&](uint64_t id) -> std::optional<Fate> {
    if (auto f = fate.find(id); f != fate.end()) return f->second;
    auto r = requests_.find(id);
    if (r == requests_.end()) return std::nullopt;
    return r->second.in_runner ? Fate::kRunning : Fate::kPreempted;
  };
  StepInput step;
  absl::flat_hash_set<uint64_t> fresh;  // announced in new_requests (not resumed)

  for (uint64_t id : request.finished_request_ids()) {
    const std::optional<Fate> f = current(id);
    // Finishing a request this rank never saw (or already forgot) has nothing to undo.
    if (!f.has_value() || *f == Fate::kGone) continue;
    if (*f == Fate::kRunning) step.finished_ids.push_back(id);
    fate[id] = Fate::kGone;
  }
  for (int i = 0; i < request.preempted_request_ids_size(); ++i) {
    const uint64_t id = request.preempted_request_ids(i);
    const std::optional<Fate> f = current(id);
    if (!f.has_value() || *f == Fate::kGone) {
      return absl::NotFoundError(
          absl::StrCat("preempted_request_ids[", i, "]: request ", id, " is unknown"));
    }
    if (*f == Fate::kRunning) step.finished_ids.push_back(id);
    fate[id] = Fate::kPreempted;
  }
  for (int i = 0; i < request.new_requests_size(); ++i) {
    const vamp::v1::NewRequest& r = request.new_requests(i);
    const std::string field = absl::StrCat("new_requests[", i, "]");
    const std::optional<Fate> f = current(r.request_id());
    if (f.has_value() && *f != Fate::kGone) {
      return absl::AlreadyExistsError(absl::StrCat(field, ".request_id ", r.request_id(),
                                                   " is already known (finish it before "
                                                   "reusing the id)"));
    }
    if (r.prompt_token_ids_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".prompt_token_ids is empty"));
    }
    for (int j = 0; j < r.prompt_token_ids_size(); ++j) {
      if (r.prompt_token_ids(j) < 0 || r.prompt_token_ids(j) >= vocab) {
        return absl::OutOfRangeError(absl::StrCat(field, ".prompt_token_ids[", j,
                                                  "] = ", r.prompt_token_ids(j),
                                                  " is outside the vocabulary of ", vocab));
      }
    }
    VAMP_RETURN_IF_ERROR(check_blocks(r.block_ids(), field + ".block_ids"));
    if (r.num_computed_tokens() < 0 || r.num_scheduled_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": num_computed_tokens and num_scheduled_tokens must be >= 0, got ",
                       r.num_computed_tokens(), " and ", r.num_scheduled_tokens()));
    }
    if (r.min_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".min_tokens must be >= 0, got ", r.min_tokens()));
    }
    VAMP_ASSIGN_OR_RETURN(RunnerSamplingParams sampling,
                          ToRunnerSampling(r.sampling(), field + ".sampling"));
    if (r.prompt_logprobs() && !options_.prompt_logprobs_supported) {
      return absl::FailedPreconditionError(
          absl::StrCat(field,
                       ".prompt_logprobs: this agent does not compute prompt log-probabilities (it "
                       "declared prompt_logprobs_supported = false)"));
    }
    sampling.prompt_logprobs = r.prompt_logprobs();
    sampling.min_tokens = r.min_tokens();
    if (r.min_tokens() > 0) {
      std::vector<int32_t>& banned = sampling.min_tokens_banned_ids;
      banned.assign(r.stop_token_ids().begin(), r.stop_token_ids().end());
      if (r.eos_token_id() >= 0) banned.push_back(r.eos_token_id());
      std::sort(banned.begin(), banned.end());
      banned.erase(std::unique(banned.begin(), banned.end()), banned.end());
    }
    NewRequestData data;
    data.id = r.request_id();
    data.prompt_token_ids.assign(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    data.num_prompt_tokens = r.prompt_token_ids_size();
    data.block_ids.assign(r.block_ids().begin(), r.block_ids().end());
    data.num_computed_tokens = r.num_computed_tokens();
    data.sampling = sampling;
    VAMP_ASSIGN_OR_RETURN(data.restore_state,
                          snapshot(r.restore_state(), field + ".restore_state"));
    VAMP_ASSIGN_OR_RETURN(StateSnapshotBlocks capture,
                          snapshot(r.capture_state(), field + ".capture_state"));
    step.new_requests.push_back(std::move(data));
    fresh.insert(r.request_id());
    fate[r.request_id()] = Fate::kRunning;
    if (r.num_scheduled_tokens() > 0) {
      step.scheduled.push_back({r.request_id(), r.num_scheduled_tokens(), std::move(capture)});
    }
  }
  for (int i = 0; i < request.cached_requests_size(); ++i) {
    const vamp::v1::CachedRequest& r = request.cached_requests(i);
    const std::string field = absl::StrCat("cached_requests[", i, "]");
    const std::optional<Fate> f = current(r.request_id());
    if (!f.has_value() || *f == Fate::kGone) {
      return absl::NotFoundError(
          absl::StrCat(field, ".request_id ", r.request_id(), " is unknown"));
    }
    VAMP_RETURN_IF_ERROR(check_blocks(r.new_block_ids(), field + ".new_block_ids"));
    if (r.num_computed_tokens() < 0 || r.num_scheduled_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": num_computed_tokens and num_scheduled_tokens must be >= 0, got ",
                       r.num_computed_tokens(), " and ", r.num_scheduled_tokens()));
    }
    VAMP_ASSIGN_OR_RETURN(StateSnapshotBlocks restore,
                          snapshot(r.restore_state(), field + ".restore_state"));
    VAMP_ASSIGN_OR_RETURN(StateSnapshotBlocks capture,
                          snapshot(r.capture_state(), field + ".capture_state"));
    if (*f == Fate::kPreempted) {
      if (!r.resumed()) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ": request ", r.request_id(),
            " is preempted; it must come back with resumed = true and its whole block table"));
      }
      // The runner forgot it at preemption: announce it again with every token it has.
      const RequestState& state = requests_.at(r.request_id());
      NewRequestData data;
      data.id = r.request_id();
      data.prompt_token_ids = state.tokens;
      data.num_prompt_tokens = state.num_prompt_tokens;
      data.block_ids.assign(r.new_block_ids().begin(), r.new_block_ids().end());
      data.num_computed_tokens = r.num_computed_tokens();
      data.sampling = state.sampling;
      data.restore_state = std::move(restore);
      step.new_requests.push_back(std::move(data));
    } else {
      CachedRequestData data;
      data.id = r.request_id();
      data.new_block_ids.assign(r.new_block_ids().begin(), r.new_block_ids().end());
      data.num_computed_tokens = r.num_computed_tokens();
      data.resumed_from_preemption = r.resumed();
      data.restore_state = std::move(restore);
      step.cached_requests.push_back(std::move(data));
    }
    fate[r.request_id()] = Fate::kRunning;
    if (r.num_scheduled_tokens() > 0) {
      step.scheduled.push_back({r.request_id(), r.num_scheduled_tokens(), std::move(capture)});
    }
  }

  const bool runner_work = !step.finished_ids.empty() || !step.new_requests.empty() ||
                           !step.cached_requests.empty() || !step.scheduled.empty();
  absl::StatusOr<StepOutput> out = StepOutput{};
  if (runner_work) out = runner.ExecuteStep(step);
  // The runner validates a step before changing anything; a failure after that (in the forward
  // pass) leaves its diffs applied. Mirror whichever happened so the agent and runner agree.
  bool applied = out.ok();
  if (!applied) {
    for (const NewRequestData& d : step.new_requests) {
      if (runner.batch().SlotOf(d.id) >= 0) applied = true;
    }
    for (RunnerRequestId id : step.finished_ids) {
      if (runner.batch().SlotOf(id) < 0) applied = true;
    }
  }
  if (applied) {
    for (const auto& [id, f] : fate) {
      if (f == Fate::kGone) {
        requests_.erase(id);
      } else if (f == Fate::kPreempted) {
        requests_[id].in_runner = false;
      }
    }
    for (const NewRequestData& d : step.new_requests) {
      RequestState& state = requests_[d.id];
      if (fresh.contains(d.id)) {
        state.tokens = d.prompt_token_ids;
        state.num_prompt_tokens = d.num_prompt_tokens;
        state.sampling = d.sampling;
      }
      state.in_runner = true;
    }
  }
  if (!out.ok()) return WithPrefix(out.status(), "step: ");
  for (const SampledToken& s : out->sampled) {
    requests_[s.id].tokens.push_back(s.token);
    vamp::v1::SampledTokens* sampled = response->add_sampled();
    sampled->set_request_id(s.id);
    sampled->add_token_ids(s.token);
    sampled->add_logprobs(s.logprob);
    sampled->mutable_top_token_ids()->Add(s.top_token_ids.begin(), s.top_token_ids.end());
    sampled->mutable_top_logprobs()->Add(s.top_logprobs.begin(), s.top_logprobs.end());
  }
  if (options_.return_prompt_logprobs) {
    for (const PromptLogprobs& p : out->prompt_logprobs) {
      vamp::v1::PromptLogprobs* lp = response->add_prompt_logprobs();
      lp->set_request_id(p.id);
      lp->set_first_position(p.first_position);
      lp->mutable_logprobs()->Add(p.logprobs.begin(), p.logprobs.end());
      lp->mutable_top_token_ids()->Add(p.top_token_ids.begin(), p.top_token_ids.end());
      lp->mutable_top_logprobs()->Add(p.top_logprobs.begin(), p.top_logprobs.end());
    }
  }
  response->mutable_timings()->set_forward_us(
      static_cast<int64_t>(out->forward_us + out->sample_us));
  return absl::OkStatus();
}

}  // namespace vamp
