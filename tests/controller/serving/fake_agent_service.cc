#include "tests/controller/serving/fake_agent_service.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

namespace vamp::testing {

vamp::v1::InitRequest FakeInitRequest() {
  vamp::v1::InitRequest r;
  r.set_model_path("/models/fake");
  r.set_load_format("dummy");
  r.mutable_memory()->set_block_size(16);
  r.mutable_memory()->set_max_offload_ratio(0.5);  // 4 of 8 experts
  r.mutable_parallel()->set_host_transport_address("127.0.0.1:1");
  return r;
}

namespace {

constexpr uint64_t kFakePageBytes = 4096;  // also one KV block

}  // namespace

bool FakeAgreement::AllRanksOk(int64_t step_id, bool ok) {
  absl::MutexLock lock(&mu_);
  Round& round = rounds_[step_id];
  ++round.posted;
  round.all_ok = round.all_ok && ok;
  auto all_posted = [this, step_id]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return rounds_[step_id].posted >= ranks_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&all_posted), absl::Seconds(10))) return false;
  return rounds_[step_id].all_ok;
}

void FakeAgentService::FillMemoryLocked(vamp::v1::RankMemory* m) const {
  m->set_rank(rank_);
  m->set_device("cpu");
  m->set_device_total_bytes(spec_.device_total_bytes);
  m->set_page_bytes(kFakePageBytes);
  m->set_kv_pool_bytes(static_cast<uint64_t>(OwnBlocksLocked(offloaded_)) * kFakePageBytes);
  m->set_kv_blocks(lie_kv_blocks_.value_or(used_blocks_));
  m->set_max_offload_groups(spec_.max_offload_groups);
  m->set_offloaded_groups(offloaded_);
}

grpc::Status FakeAgentService::Init(grpc::ServerContext*, const vamp::v1::InitRequest*,
                                    vamp::v1::InitResponse* response) {
  absl::MutexLock lock(&mu_);
  ++unary_calls_;
  offloaded_ = 0;
  used_blocks_ = spec_.kv_blocks;
  remap_history_.clear();
  requests_.clear();
  FillMemoryLocked(response->mutable_memory());
  response->set_num_layers(spec_.num_layers);
  response->set_num_experts(spec_.num_experts);
  response->set_experts_per_group(spec_.experts_per_group);
  response->set_vocab_size(spec_.vocab_size);
  response->set_eos_token_id(spec_.eos_token_id);
  response->set_max_position_embeddings(spec_.max_position_embeddings);
  vamp::v1::OffloadGeometry& offload = *response->mutable_offload();
  offload.set_kv_block_bytes(kFakePageBytes);
  offload.set_kv_pages_per_group(spec_.blocks_per_group);
  offload.set_staged_bytes_per_group(spec_.staged_bytes_per_group);
  return grpc::Status::OK;
}

grpc::Status FakeAgentService::GetStats(grpc::ServerContext*, const vamp::v1::GetStatsRequest*,
                                        vamp::v1::GetStatsResponse* response) {
  absl::MutexLock lock(&mu_);
  ++unary_calls_;
  FillMemoryLocked(response->mutable_memory());
  return grpc::Status::OK;
}

vamp::v1::StepResponse FakeAgentService::ApplyLocked(const vamp::v1::StepRequest& request) {
  vamp::v1::StepResponse response;
  response.set_step_id(request.step_id());
  response.set_rank(rank_);
  for (uint64_t id : request.finished_request_ids()) {
    finished_.push_back(id);
    requests_.erase(id);
  }
  for (uint64_t id : request.preempted_request_ids()) requests_[id].computed = 0;
  std::vector<uint64_t> scheduled;
  // Prompt positions [from, to) whose rows score the next prompt token, per request.
  auto score_prompt = [&](uint64_t id, const RequestState& s, int32_t from) {
    const int32_t to = std::min(s.computed, s.prompt - 1);
    from = std::max(0, from - prompt_logprobs_overlap_);
    if (!s.prompt_logprobs || rank_ != 0 || from >= to) return;
    vamp::v1::PromptLogprobs* p = response.add_prompt_logprobs();
    p->set_request_id(id);
    p->set_first_position(from + 1);
    for (int32_t row = from; row < to; ++row) {
      p->add_logprobs(FakePromptLogprob(row + 1, 0));
      for (int32_t j = 0; j < s.num_top_logprobs; ++j) {
        p->add_top_token_ids((row + 1 + j) % spec_.vocab_size);
        p->add_top_logprobs(FakePromptLogprob(row + 1, j + 1));
      }
    }
  };
  for (const vamp::v1::NewRequest& r : request.new_requests()) {
    RequestState& s = requests_[r.request_id()];
    s.tokens = r.prompt_token_ids_size();
    s.prompt = r.prompt_token_ids_size();
    s.prompt_logprobs = r.prompt_logprobs();
    s.num_top_logprobs = r.sampling().num_top_logprobs();
    s.computed = r.num_computed_tokens() + r.num_scheduled_tokens();
    score_prompt(r.request_id(), s, r.num_computed_tokens());
    scheduled.push_back(r.request_id());
  }
  for (const vamp::v1::CachedRequest& r : request.cached_requests()) {
    RequestState& s = requests_[r.request_id()];
    s.computed = r.num_computed_tokens() + r.num_scheduled_tokens();
    score_prompt(r.request_id(), s, r.num_computed_tokens());
    scheduled.push_back(r.request_id());
  }
  for (uint64_t id : scheduled) {
    RequestState& s = requests_[id];
    if (s.computed < s.tokens) continue;  // a prefill chunk short of the end
    ++s.tokens;
    if (rank_ != 0) continue;  // only rank 0 returns tokens
    vamp::v1::SampledTokens* sampled = response.add_sampled();
    sampled->set_request_id(id);
    sampled->add_token_ids(sampled_token_);
  }
  FillMemoryLocked(response.mutable_memory());
  return response;
}

std::string FakeAgentService::RemapLocked(const vamp::v1::StepRequest& request) {
  for (const std::string& id : request.rollback_remap_ids()) {
    rollbacks_.push_back(id);
    auto it = remap_history_.find(id);
    if (it == remap_history_.end()) continue;  // never applied here: nothing to undo
    offloaded_ -= it->second.delta;
    used_blocks_ = it->second.blocks_before;
    remap_history_.erase(it);
  }
  for (const vamp::v1::RemapCommand& remap : request.remaps()) {
    if (fail_next_remap_.has_value()) {
      std::string error = *std::move(fail_next_remap_);
      fail_next_remap_.reset();
      return error;
    }
    const int32_t delta = remap.action() == vamp::v1::RemapCommand::ACTION_OFFLOAD
                              ? remap.num_groups()
                              : -remap.num_groups();
    if (offloaded_ + delta < 0 || offloaded_ + delta > spec_.max_offload_groups) {
      return absl::StrCat("rank ", rank_, ": cannot move ", delta, " groups with ", offloaded_,
                          " offloaded");
    }
    const int64_t own = OwnBlocksLocked(offloaded_ + delta);
    if (remap.expected_kv_blocks() > own) {
      return absl::StrCat("rank ", rank_, ": expected ", remap.expected_kv_blocks(),
                          " KV blocks, can have ", own);
    }
    remap_history_[remap.remap_id()] = {delta, used_blocks_};
    if (lie_after_remap_.has_value()) lie_kv_blocks_ = *std::exchange(lie_after_remap_, {});
    offloaded_ += delta;
    used_blocks_ = remap.expected_kv_blocks() > 0 ? remap.expected_kv_blocks() : own;
  }
  return "";
}

grpc::Status FakeAgentService::Step(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<vamp::v1::StepResponse, vamp::v1::StepRequest>* stream) {
  vamp::v1::StepRequest request;
  while (stream->Read(&request)) {
    vamp::v1::StepResponse response;
    std::string remap_error;
    {
      absl::MutexLock lock(&mu_);
      steps_.push_back(request);
      if (break_stream_) {
        break_stream_ = false;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake agent went away");
      }
      remap_error = RemapLocked(request);
    }
    // The ranks agree on a step with remaps, as real agents do, outside the lock (every rank's
    // stream thread waits here for the others).
    const bool remapping = request.remaps_size() > 0 || request.rollback_remap_ids_size() > 0;
    bool run = remap_error.empty();
    if (remapping && agreement_ != nullptr) run = agreement_->AllRanksOk(request.step_id(), run);
    {
      absl::MutexLock lock(&mu_);
      if (run) {
        response = ApplyLocked(request);
      } else {
        response.set_step_id(request.step_id());
        response.set_rank(rank_);
        response.set_refused(true);
        response.set_error_message(
            remap_error.empty() ? "a remap of this step failed on another rank" : remap_error);
        FillMemoryLocked(response.mutable_memory());
      }
    }
    if (!stream->Write(response)) break;
  }
  return grpc::Status::OK;
}

void FakeAgentService::FailNextRemap(std::string error) {
  absl::MutexLock lock(&mu_);
  fail_next_remap_ = std::move(error);
}

void FakeAgentService::ReportKvBlocks(int64_t blocks, bool from_next_remap) {
  absl::MutexLock lock(&mu_);
  (from_next_remap ? lie_after_remap_ : lie_kv_blocks_) = blocks;
}

void FakeAgentService::BreakStreamAtNextStep() {
  absl::MutexLock lock(&mu_);
  break_stream_ = true;
}

void FakeAgentService::SetSampledToken(int32_t token) {
  absl::MutexLock lock(&mu_);
  sampled_token_ = token;
}

void FakeAgentService::SetPromptLogprobsOverlap(int32_t positions) {
  absl::MutexLock lock(&mu_);
  prompt_logprobs_overlap_ = positions;
}

int32_t FakeAgentService::offloaded_groups() {
  absl::MutexLock lock(&mu_);
  return offloaded_;
}

std::vector<vamp::v1::StepRequest> FakeAgentService::steps() {
  absl::MutexLock lock(&mu_);
  return steps_;
}

int64_t FakeAgentService::unary_calls() {
  absl::MutexLock lock(&mu_);
  return unary_calls_;
}

std::vector<std::string> FakeAgentService::rollbacks() {
  absl::MutexLock lock(&mu_);
  return rollbacks_;
}

std::vector<uint64_t> FakeAgentService::finished_ids() {
  absl::MutexLock lock(&mu_);
  return finished_;
}

int64_t FakeAgentService::kv_blocks() {
  absl::MutexLock lock(&mu_);
  return used_blocks_;
}

FakeAgentGroup::FakeAgentGroup(std::vector<FakeRankSpec> ranks, AgentGroupOptions options) {
  std::vector<AgentEndpoint> endpoints;
  agreement_ = std::make_unique<FakeAgreement>(static_cast<int>(ranks.size()));
  for (size_t r = 0; r < ranks.size(); ++r) {
    agents_.push_back(
        std::make_unique<FakeAgentService>(static_cast<int>(r), ranks[r], agreement_.get()));
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::Start("127.0.0.1:0", {agents_.back().get()});
    if (!server.ok()) {
      status_ = server.status();
      return;
    }
    endpoints.push_back({static_cast<int>(r), absl::StrCat("127.0.0.1:", (*server)->port())});
    servers_.push_back(*std::move(server));
  }
  absl::StatusOr<std::unique_ptr<AgentGroup>> group =
      AgentGroup::Connect(std::move(endpoints), options);
  if (!group.ok()) {
    status_ = group.status();
    return;
  }
  group_ = *std::move(group);
  const vamp::v1::InitRequest init = FakeInitRequest();
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> responses = group_->Init(init);
  if (!responses.ok()) {
    status_ = responses.status();
    return;
  }
  responses_ = *std::move(responses);
  status_ = CheckInitResponses(init, responses_);
}

FakeAgentGroup::~FakeAgentGroup() {
  group_.reset();  // ends the step streams first
  for (auto& server : servers_) server->Shutdown(0);
}

}  // namespace vamp::testing
