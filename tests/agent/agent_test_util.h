// Test harness of the agent suites: in-process agents on the tiny qwen3_moe checkpoint, a gRPC
// client that speaks the controller's side of agent.proto (one Step stream per rank, lockstep
// across ranks as controller/serving/agent_group.h does), and a miniature controller that turns
// requests into StepRequests following controller/core/step_plan.h (new requests once, then
// deltas; blocks appended as sequences grow and never reused; preemption and resume).
#ifndef VAMP_TESTS_AGENT_AGENT_TEST_UTIL_H_
#define VAMP_TESTS_AGENT_AGENT_TEST_UTIL_H_

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "agent/agent_service.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/free_port.h"
#include "vamp/v1/agent.grpc.pb.h"

namespace vamp::testing {

// tests/data: $VAMP_TEST_DATA when set (a bundle run on another machine, see
// deploy/bundle/run_gpu_suite.sh), else the source tree's.
inline std::string TestDataDir() {
  const char* env = std::getenv("VAMP_TEST_DATA");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(VAMP_TEST_DATA_DIR);
}

inline std::string TinyModelDir() { return TestDataDir() + "/tiny-qwen3-moe"; }

struct Goldens {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> continuations;  // 16 greedy tokens each (HF transformers)
};

inline Goldens LoadGoldens() {
  std::ifstream in(TestDataDir() + "/tiny-qwen3-moe-goldens.json");
  std::stringstream text;
  text << in.rdbuf();
  const auto json = nlohmann::json::parse(text.str());
  Goldens g;
  for (const auto& p : json["prompts"]) g.prompts.push_back(p.get<std::vector<int32_t>>());
  for (const auto& c : json["greedy_continuations"]) {
    g.continuations.push_back(c.get<std::vector<int32_t>>());
  }
  return g;
}

// Options of an in-process CPU agent sized for the tiny model: 4 KiB pages (groups of 2 experts),
// 8 MiB of "device memory", a private metrics registry, no /metrics endpoint (stopping the
// prometheus-cpp exposer takes about 2 s; the metrics tests turn it on).
inline AgentOptions TinyAgentOptions() {
  AgentOptions o;
  o.listen_address = "127.0.0.1:0";
  o.metrics_address = "";
  o.host_page_bytes = 4096;
  o.host_memory_bytes = uint64_t{8} << 20;
  o.tp_connect_timeout_ms = 20000;
  o.tp_io_timeout_ms = 20000;
  return o;
}

// The tiny model from its checkpoint, VAMP-r 0.75 (6 groups of 2 experts in layers 1 and 2).
inline vamp::v1::InitRequest TinyInitRequest() {
  vamp::v1::InitRequest r;
  r.set_model_path(TinyModelDir());
  r.set_load_format("safetensors");
  r.set_dtype("float32");
  r.mutable_parallel()->set_tp_size(1);
  r.mutable_memory()->set_gpu_memory_utilization(1.0);
  r.mutable_memory()->set_block_size(16);
  r.mutable_memory()->set_max_offload_ratio(0.75);
  r.mutable_memory()->set_max_num_batched_tokens(512);
  r.mutable_memory()->set_max_num_seqs(16);
  return r;
}

// The KV blocks a rank whose memory is `now` has after offloading (delta > 0) or restoring
// (delta < 0) |delta| groups, by the geometry it declared at Init: the controller's arithmetic
// (controller/serving/remote_offloader.h), which the agent's real remaps must match.
inline int64_t KvBlocksAfter(const vamp::v1::InitResponse& init, const vamp::v1::RankMemory& now,
                             int32_t delta) {
  const int64_t moved =
      static_cast<int64_t>(now.page_bytes()) * init.offload().kv_pages_per_group();
  const int64_t mapped = static_cast<int64_t>(now.kv_pool_bytes()) + delta * moved;
  const int64_t region = mapped / static_cast<int64_t>(init.offload().kv_block_bytes());
  return delta >= 0 ? region : std::min(region, now.kv_blocks());
}

// The controller's side of one agent: unary calls and one Step stream.
class AgentClient {
 public:
  explicit AgentClient(int port, std::string token = "") : token_(std::move(token)) {
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = vamp::v1::Agent::NewStub(channel_);
  }
  ~AgentClient() { CloseStream(); }

  void Prepare(grpc::ClientContext* context) const {
    if (!token_.empty()) context->AddMetadata("authorization", "Bearer " + token_);
  }

  grpc::Status Init(const vamp::v1::InitRequest& request, vamp::v1::InitResponse* response) {
    grpc::ClientContext context;
    Prepare(&context);
    return stub_->Init(&context, request, response);
  }
  grpc::Status CreateCollectiveId(std::string* id) {
    grpc::ClientContext context;
    Prepare(&context);
    vamp::v1::CreateCollectiveIdResponse response;
    grpc::Status s = stub_->CreateCollectiveId(&context, {}, &response);
    *id = response.nccl_unique_id();
    return s;
  }
  grpc::Status GetStats(vamp::v1::GetStatsResponse* response) {
    grpc::ClientContext context;
    Prepare(&context);
    return stub_->GetStats(&context, {}, response);
  }

  // Writes one request on the (lazily opened) step stream.
  bool Write(const vamp::v1::StepRequest& request) {
    if (stream_ == nullptr) {
      stream_context_ = std::make_unique<grpc::ClientContext>();
      Prepare(stream_context_.get());
      stream_ = stub_->Step(stream_context_.get());
    }
    return stream_->Write(request);
  }
  bool Read(vamp::v1::StepResponse* response) { return stream_->Read(response); }
  // Write + Read; the response, or an error when the stream broke.
  absl::StatusOr<vamp::v1::StepResponse> Step(const vamp::v1::StepRequest& request) {
    vamp::v1::StepResponse response;
    if (!Write(request) || !Read(&response)) {
      return absl::UnavailableError(
          absl::StrCat("step stream broke: ", CloseStream().error_message()));
    }
    return response;
  }
  grpc::Status CloseStream() {
    if (stream_ == nullptr) return grpc::Status::OK;
    stream_->WritesDone();
    grpc::Status s = stream_->Finish();
    stream_.reset();
    stream_context_.reset();
    return s;
  }

 private:
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<vamp::v1::Agent::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> stream_context_;
  std::unique_ptr<grpc::ClientReaderWriter<vamp::v1::StepRequest, vamp::v1::StepResponse>> stream_;
};

// Every rank of a group in lockstep, as controller/serving/agent_group.h drives them.
class GroupClient {
 public:
  explicit GroupClient(std::vector<AgentClient*> ranks) : ranks_(std::move(ranks)) {}
  // Writes to every rank, then reads every rank. Fails the test on a broken stream.
  std::vector<vamp::v1::StepResponse> Step(const vamp::v1::StepRequest& request) {
    std::vector<vamp::v1::StepResponse> responses(ranks_.size());
    for (AgentClient* r : ranks_) EXPECT_TRUE(r->Write(request));
    for (size_t i = 0; i < ranks_.size(); ++i) EXPECT_TRUE(ranks_[i]->Read(&responses[i]));
    return responses;
  }

 private:
  std::vector<AgentClient*> ranks_;
};

// A miniature controller: requests run greedily to max_new_tokens; prefill in one chunk; blocks
// come from a counter (never reused, so a finished request's blocks can serve as a prefix cache).
class MiniController {
 public:
  struct Request {
    uint64_t id = 0;
    std::vector<int32_t> tokens;  // prompt + outputs
    std::vector<int32_t> outputs;
    int32_t computed = 0;
    int32_t max_new_tokens = 0;
    std::vector<int32_t> blocks;
    bool sent = false;
    bool preempt_pending = false;
    bool preempted = false;
    bool finished = false;
    int32_t initial_computed = 0;
  };

  explicit MiniController(int32_t first_block = 0, int32_t block_size = 16)
      : next_block_(first_block), block_size_(block_size) {}

  void Submit(uint64_t id, std::vector<int32_t> prompt, int32_t max_new_tokens,
              std::vector<int32_t> cached_blocks = {}, int32_t num_cached = 0) {
    Request r;
    r.id = id;
    r.tokens = std::move(prompt);
    r.max_new_tokens = max_new_tokens;
    r.blocks = std::move(cached_blocks);
    r.computed = num_cached;
    r.initial_computed = num_cached;
    order_.push_back(id);
    requests_[id] = std::move(r);
  }
  // The request loses its blocks at the next step and is resumed at the one after.
  void Preempt(uint64_t id) { requests_.at(id).preempt_pending = true; }

  bool Done() const {
    for (const auto& [id, r] : requests_) {
      if (!r.finished) return false;
    }
    return true;
  }

  vamp::v1::StepRequest Next() {
    vamp::v1::StepRequest step;
    step.set_step_id(++step_id_);
    for (uint64_t id : to_finish_) step.add_finished_request_ids(id);
    to_finish_.clear();
    scheduled_.clear();
    for (uint64_t id : order_) {
      Request& r = requests_[id];
      if (r.finished) continue;
      if (r.preempt_pending) {
        r.preempt_pending = false;
        r.preempted = true;
        r.blocks.clear();
        r.computed = 0;
        step.add_preempted_request_ids(id);
        continue;
      }
      const int32_t n = static_cast<int32_t>(r.tokens.size()) - r.computed;
      std::vector<int32_t> added;
      while (static_cast<int32_t>(r.blocks.size()) * block_size_ < r.computed + n) {
        r.blocks.push_back(next_block_);
        added.push_back(next_block_++);
      }
      if (!r.sent) {
        vamp::v1::NewRequest* nr = step.add_new_requests();
        nr->set_request_id(id);
        nr->mutable_prompt_token_ids()->Add(r.tokens.begin(), r.tokens.end());
        nr->mutable_block_ids()->Add(r.blocks.begin(), r.blocks.end());
        nr->set_num_computed_tokens(r.computed);
        nr->set_num_scheduled_tokens(n);
        nr->set_eos_token_id(-1);
        r.sent = true;
      } else {
        vamp::v1::CachedRequest* cr = step.add_cached_requests();
        cr->set_request_id(id);
        cr->set_resumed(r.preempted);
        const std::vector<int32_t>& blocks = r.preempted ? r.blocks : added;
        cr->mutable_new_block_ids()->Add(blocks.begin(), blocks.end());
        cr->set_num_computed_tokens(r.computed);
        cr->set_num_scheduled_tokens(n);
        r.preempted = false;
      }
      scheduled_.push_back({id, n});
    }
    step.set_num_blocks(num_blocks_);
    return step;
  }

  // Records rank 0's answer to the last Next().
  void Apply(const vamp::v1::StepResponse& response) {
    for (const auto& [id, n] : scheduled_) requests_[id].computed += n;
    for (const vamp::v1::SampledTokens& s : response.sampled()) {
      Request& r = requests_.at(s.request_id());
      for (int32_t t : s.token_ids()) {
        r.tokens.push_back(t);
        r.outputs.push_back(t);
      }
      if (static_cast<int32_t>(r.outputs.size()) >= r.max_new_tokens) {
        r.finished = true;
        to_finish_.push_back(r.id);
      }
    }
  }

  // Runs steps until every request finished or `max_steps` passed; stops at the first error.
  void Run(AgentClient& agent, int max_steps = 1000) {
    for (int i = 0; i < max_steps && !Done(); ++i) {
      absl::StatusOr<vamp::v1::StepResponse> r = agent.Step(Next());
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->error_message(), "");
      Apply(*r);
    }
  }

  void set_num_blocks(int64_t n) { num_blocks_ = n; }
  int32_t next_block() const { return next_block_; }
  int64_t step_id() const { return step_id_; }
  int64_t NextStepId() { return ++step_id_; }
  const Request& request(uint64_t id) const { return requests_.at(id); }

 private:
  int32_t next_block_;
  int32_t block_size_;
  int64_t step_id_ = 0;
  int64_t num_blocks_ = 0;
  std::vector<uint64_t> order_;
  std::map<uint64_t, Request> requests_;
  std::vector<uint64_t> to_finish_;
  std::vector<std::pair<uint64_t, int32_t>> scheduled_;
};

// An in-process agent (null, with a test failure, when it does not start).
inline std::unique_ptr<AgentService> StartAgent(AgentOptions options = TinyAgentOptions()) {
  absl::StatusOr<std::unique_ptr<AgentService>> agent = AgentService::Start(std::move(options));
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? std::move(*agent) : nullptr;
}

// A step that carries one remap command and nothing else.
inline vamp::v1::StepRequest RemapOnly(int64_t step_id, vamp::v1::RemapCommand::Action action,
                                       int32_t groups, int64_t expected, const std::string& id) {
  vamp::v1::StepRequest step;
  step.set_step_id(step_id);
  vamp::v1::RemapCommand* c = step.add_remaps();
  c->set_action(action);
  c->set_num_groups(groups);
  c->set_expected_kv_blocks(expected);
  c->set_remap_id(id);
  return step;
}

}  // namespace vamp::testing

#endif  // VAMP_TESTS_AGENT_AGENT_TEST_UTIL_H_
