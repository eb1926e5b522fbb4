#include "controller/serving/agent_group.h"

#include <chrono>
#include <future>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/grpc_auth.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "controller/serving/agent_reports.h"

namespace vamp {
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

// NCCL_UNIQUE_ID_BYTES: the controller never links NCCL, so the size is checked here by value.
constexpr size_t kNcclUniqueIdBytes = 128;

}  // namespace

absl::string_view CollectiveTransportName(CollectiveTransport t) {
  switch (t) {
    case CollectiveTransport::kNone:
      return "none";
    case CollectiveTransport::kHost:
      return "tcp";
    case CollectiveTransport::kNccl:
      return "nccl";
  }
  return "unknown";
}

absl::StatusOr<CollectiveTransport> ChooseCollectiveTransport(
    const std::vector<std::string>& devices) {
  if (devices.empty()) return absl::InvalidArgumentError("agent group: no agents");
  int first_cpu = -1, first_cuda = -1;
  for (size_t r = 0; r < devices.size(); ++r) {
    const std::string& d = devices[r];
    int ordinal = 0;
    if (d == "cpu") {
      if (first_cpu < 0) first_cpu = static_cast<int>(r);
    } else if (d == "cuda" ||
               (absl::StartsWith(d, "cuda:") && absl::SimpleAtoi(d.substr(5), &ordinal))) {
      if (first_cuda < 0) first_cuda = static_cast<int>(r);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("agent rank ", r, " reports device '", d, "', not cpu or cuda:N"));
    }
  }
  if (first_cpu >= 0 && first_cuda >= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("agent group mixes devices: rank ", first_cuda, " runs on ",
                     devices[first_cuda], ", rank ", first_cpu,
                     " on cpu; the ranks of a tensor-parallel group must all be CUDA "
                     "agents (NCCL) or all CPU agents (TCP)"));
  }
  if (devices.size() == 1) return CollectiveTransport::kNone;
  return first_cuda >= 0 ? CollectiveTransport::kNccl : CollectiveTransport::kHost;
}

absl::StatusOr<std::unique_ptr<AgentGroup>> AgentGroup::Connect(
    std::vector<AgentEndpoint> endpoints, AgentGroupOptions options) {
  if (endpoints.empty()) return absl::InvalidArgumentError("agent group: no agents");
  std::sort(endpoints.begin(), endpoints.end(),
            [](const AgentEndpoint& a, const AgentEndpoint& b) { return a.rank < b.rank; });
  for (size_t i = 0; i < endpoints.size(); ++i) {
    if (endpoints[i].rank != static_cast<int>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("agent group: ranks must be 0..", endpoints.size() - 1,
                       " each exactly once; rank ", i, " is missing or doubled"));
    }
  }
  std::unique_ptr<AgentGroup> group(new AgentGroup(std::move(options)));
  for (AgentEndpoint& e : endpoints) {
    grpc::ChannelArguments args;
    // Notice a dead peer within seconds even when no step is in flight.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetMaxReceiveMessageSize(kGrpcMaxMessageBytes);
    args.SetMaxSendMessageSize(kGrpcMaxMessageBytes);
    Rank rank;
    rank.endpoint = std::move(e);
    rank.channel =
        grpc::CreateCustomChannel(rank.endpoint.address, grpc::InsecureChannelCredentials(), args);
    rank.stub = vamp::v1::Agent::NewStub(rank.channel);
    group->ranks_.push_back(std::move(rank));
  }
  group->watchdog_ = std::thread([g = group.get()] { g->Watchdog(); });
  return group;
}

AgentGroup::~AgentGroup() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  watchdog_.join();
  for (Rank& r : ranks_) {
    if (r.stream != nullptr) {
      r.stream_context->TryCancel();
      (void)r.stream->Finish();
    }
  }
}

void AgentGroup::PrepareContext(grpc::ClientContext* context, int64_t timeout_ms) const {
  if (timeout_ms > 0) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  }
  AddBearerMetadata(context, options_.auth_token);
}

void AgentGroup::Watchdog() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(50));
    if (stop_) break;
    if (step_deadline_micros_ != 0 && SteadyClock::Get().NowMicros() > step_deadline_micros_) {
      timed_out_ = true;
      step_deadline_micros_ = 0;
      for (Rank& r : ranks_) {
        if (r.stream_context != nullptr) r.stream_context->TryCancel();
      }
    }
  }
}

absl::Status AgentGroup::OpenStreams() {
  for (Rank& r : ranks_) {
    r.stream_context = std::make_unique<grpc::ClientContext>();
    PrepareContext(r.stream_context.get(), /*timeout_ms=*/0);
    r.stream = r.stub->Step(r.stream_context.get());
    if (r.stream == nullptr) {
      healthy_ = false;
      return absl::UnavailableError(absl::StrCat("agent rank ", r.endpoint.rank, " (",
                                                 r.endpoint.address,
                                                 "): cannot open the step stream"));
    }
  }
  return absl::OkStatus();
}

absl::Status AgentGroup::ArrangeRendezvous(vamp::v1::InitRequest* request) {
  vamp::v1::ParallelSpec& parallel = *request->mutable_parallel();
  if (world_size() == 1) {
    transport_ = CollectiveTransport::kNone;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<vamp::v1::GetStatsResponse>> stats = GetStats();
  if (!stats.ok()) {
    return absl::Status(stats.status().code(), absl::StrCat("asking the agents for their devices: ",
                                                            stats.status().message()));
  }
  std::vector<std::string> devices;
  for (const auto& s : *stats) devices.push_back(s.memory().device());
  absl::StatusOr<CollectiveTransport> transport = ChooseCollectiveTransport(devices);
  if (!transport.ok()) return transport.status();
  transport_ = *transport;
  if (*transport == CollectiveTransport::kNccl) {
    // A fresh id for every initialisation: NCCL's bootstrap root serves one group formation.
    Rank& root = ranks_.front();
    grpc::ClientContext context;
    PrepareContext(&context, options_.rpc_timeout_ms);
    vamp::v1::CreateCollectiveIdResponse id;
    grpc::Status s = root.stub->CreateCollectiveId(&context, {}, &id);
    if (!s.ok()) {
      return FromGrpc(
          s, absl::StrCat("agent rank 0 (", root.endpoint.address, ") CreateCollectiveId"));
    }
    if (id.nccl_unique_id().size() != kNcclUniqueIdBytes) {
      return absl::InternalError(
          absl::StrCat("agent rank 0 (", root.endpoint.address, ") CreateCollectiveId returned ",
                       id.nccl_unique_id().size(), " bytes, not ", kNcclUniqueIdBytes));
    }
    parallel.set_nccl_unique_id(id.nccl_unique_id());
    parallel.clear_host_transport_address();
  } else {
    parallel.clear_nccl_unique_id();
    if (parallel.host_transport_address().empty()) {
      return absl::InvalidArgumentError(
          "agent group: CPU agents need parallel.host_transport_address for tp_size > 1");
    }
  }
  VAMP_LOG(INFO) << "agent group of " << world_size() << " ranks on "
                 << absl::StrJoin(devices, ", ") << ": all-reduce over "
                 << CollectiveTransportName(*transport);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<vamp::v1::InitResponse>> AgentGroup::Init(
    const vamp::v1::InitRequest& request) {
  vamp::v1::InitRequest arranged = request;
  if (absl::Status s = ArrangeRendezvous(&arranged); !s.ok()) {
    healthy_ = false;
    return s;
  }
  std::vector<std::future<absl::StatusOr<vamp::v1::InitResponse>>> calls;
  for (Rank& r : ranks_) {
    vamp::v1::InitRequest ranked = arranged;
    ranked.mutable_parallel()->set_tp_size(world_size());
    ranked.mutable_parallel()->set_tp_rank(r.endpoint.rank);
    calls.push_back(std::async(
        std::launch::async, [this, &r, ranked]() -> absl::StatusOr<vamp::v1::InitResponse> {
          grpc::ClientContext context;
          PrepareContext(&context, options_.init_timeout_ms);
          vamp::v1::InitResponse response;
          grpc::Status s = r.stub->Init(&context, ranked, &response);
          if (!s.ok()) {
            return FromGrpc(s, absl::StrCat("agent rank ", r.endpoint.rank, " (",
                                            r.endpoint.address, ") Init"));
          }
          return response;
        }));
  }
  std::vector<vamp::v1::InitResponse> responses;
  absl::Status first_error;
  for (auto& c : calls) {
    absl::StatusOr<vamp::v1::InitResponse> r = c.get();
    if (!r.ok()) {
      first_error.Update(r.status());
    } else {
      responses.push_back(*std::move(r));
    }
  }
  if (!first_error.ok()) {
    healthy_ = false;
    return first_error;
  }
  if (absl::Status s = OpenStreams(); !s.ok()) return s;
  healthy_ = true;
  return responses;
}

absl::StatusOr<std::vector<vamp::v1::StepResponse>> AgentGroup::Step(
    const vamp::v1::StepRequest& request) {
  if (!healthy_) return absl::UnavailableError("agent group is unhealthy");
  if (ranks_.front().stream == nullptr) {
    return absl::FailedPreconditionError("agent group: Init has not succeeded");
  }
  {
    absl::MutexLock lock(&mu_);
    timed_out_ = false;
    step_deadline_micros_ = SteadyClock::Get().NowMicros() + options_.step_timeout_ms * 1000;
  }
  std::vector<vamp::v1::StepResponse> responses(ranks_.size());
  absl::Status broken;
  // Write to every rank first so they compute concurrently, then collect.
  for (Rank& r : ranks_) {
    if (!r.stream->Write(request)) {
      broken.Update(absl::UnavailableError(absl::StrCat(
          "agent rank ", r.endpoint.rank, " (", r.endpoint.address, ") closed its step stream")));
    }
  }
  for (size_t i = 0; broken.ok() && i < ranks_.size(); ++i) {
    if (!ranks_[i].stream->Read(&responses[i])) {
      broken.Update(
          absl::UnavailableError(absl::StrCat("agent rank ", ranks_[i].endpoint.rank, " (",
                                              ranks_[i].endpoint.address, ") stopped answering")));
    }
  }
  bool timed_out;
  {
    absl::MutexLock lock(&mu_);
    step_deadline_micros_ = 0;
    timed_out = timed_out_;
  }
  if (timed_out) {
    missed_step_deadline_ = true;
    broken =
        absl::DeadlineExceededError(absl::StrCat("agents did not answer step ", request.step_id(),
                                                 " within ", options_.step_timeout_ms, " ms"));
  }
  if (!broken.ok()) {
    healthy_ = false;
    VAMP_LOG(ERROR) << broken;
    return broken;
  }
  size_t refused = 0;
  std::vector<std::string> reasons;
  for (size_t i = 0; i < responses.size(); ++i) {
    if (responses[i].step_id() != request.step_id()) {
      healthy_ = false;
      return absl::InternalError(absl::StrCat("agent rank ", i, " answered step ",
                                              responses[i].step_id(), " to step ",
                                              request.step_id()));
    }
    if (responses[i].refused()) {
      ++refused;
      reasons.push_back(absl::StrCat("agent rank ", i, ": ", responses[i].error_message()));
    }
  }
  if (refused == responses.size()) {
    return absl::AbortedError(absl::StrCat("step ", request.step_id(), " refused by every rank (",
                                           absl::StrJoin(reasons, "; "), ")"));
  }
  if (refused > 0) {
    // Some ranks ran a step the others did not: their states differ, nothing can be trusted.
    healthy_ = false;
    return absl::InternalError(absl::StrCat("step ", request.step_id(), " refused by ", refused,
                                            " of ", responses.size(), " ranks only (",
                                            absl::StrJoin(reasons, "; "), ")"));
  }
  for (size_t i = 0; i < responses.size(); ++i) {
    if (!responses[i].error_message().empty()) {
      return absl::InternalError(
          absl::StrCat("agent rank ", i, ": ", responses[i].error_message()));
    }
    // The cost model and metrics average these: one absurd report would skew them for the whole
    // window, so an agent that sends one is treated as broken.
    if (absl::Status s = CheckStepTimings(responses[i].timings(), static_cast<int>(i)); !s.ok()) {
      healthy_ = false;
      VAMP_LOG(ERROR) << s;
      return s;
    }
  }
  return responses;
}

absl::StatusOr<std::vector<vamp::v1::GetStatsResponse>> AgentGroup::GetStats() {
  std::vector<vamp::v1::GetStatsResponse> responses(ranks_.size());
  for (size_t i = 0; i < ranks_.size(); ++i) {
    grpc::ClientContext context;
    PrepareContext(&context, options_.rpc_timeout_ms);
    grpc::Status s = ranks_[i].stub->GetStats(&context, {}, &responses[i]);
    if (!s.ok()) return FromGrpc(s, absl::StrCat("agent rank ", i, " GetStats"));
  }
  return responses;
}

}  // namespace vamp
