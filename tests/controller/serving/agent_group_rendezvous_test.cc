// The controller's side of forming a tensor-parallel group (controller/serving/agent_group.h),
// against fake agents on loopback: CUDA agents get a fresh NCCL unique id from rank 0 at every
// Init, the same one on every rank, with the Inits sent concurrently; CPU agents keep the TCP
// rendezvous and are never asked for an id; mixed groups and a failing rank 0 fail before any
// Init is sent.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_server.h"
#include "controller/serving/agent_group.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vamp/v1/agent.grpc.pb.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

// What the Inits of one group have in common: each fake's Init waits until every rank's Init has
// arrived, so Inits sent one after another would time out here (NCCL's init blocks the same way).
struct InitBarrier {
  absl::Mutex mu;
  int expected = 0;
  int arrived ABSL_GUARDED_BY(mu) = 0;
};

class FakeAgent final : public vamp::v1::Agent::Service {
 public:
  FakeAgent(std::string device, InitBarrier* barrier)
      : device_(std::move(device)), barrier_(barrier) {}

  grpc::Status GetStats(grpc::ServerContext*, const vamp::v1::GetStatsRequest*,
                        vamp::v1::GetStatsResponse* response) override {
    response->mutable_memory()->set_device(device_);
    return grpc::Status::OK;
  }

  grpc::Status CreateCollectiveId(grpc::ServerContext*, const vamp::v1::CreateCollectiveIdRequest*,
                                  vamp::v1::CreateCollectiveIdResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++ids_created_;
    if (!id_error_.empty()) return grpc::Status(grpc::FAILED_PRECONDITION, id_error_);
    // A distinct 128-byte id per call, as ncclGetUniqueId gives.
    std::string id(128, '\0');
    id[0] = static_cast<char>(ids_created_);
    id[127] = 'n';
    response->set_nccl_unique_id(id);
    return grpc::Status::OK;
  }

  grpc::Status Init(grpc::ServerContext*, const vamp::v1::InitRequest* request,
                    vamp::v1::InitResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      inits_.push_back(*request);
    }
    {
      absl::MutexLock lock(&barrier_->mu);
      ++barrier_->arrived;
      auto all_here = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(barrier_->mu) {
        return barrier_->arrived % barrier_->expected == 0;
      };
      if (!barrier_->mu.AwaitWithTimeout(absl::Condition(&all_here), absl::Seconds(10))) {
        return grpc::Status(grpc::DEADLINE_EXCEEDED, "the other ranks' Inits never arrived");
      }
    }
    response->mutable_memory()->set_rank(request->parallel().tp_rank());
    response->mutable_memory()->set_device(device_);
    return grpc::Status::OK;
  }

  int ids_created() {
    absl::MutexLock lock(&mu_);
    return ids_created_;
  }
  std::vector<vamp::v1::InitRequest> inits() {
    absl::MutexLock lock(&mu_);
    return inits_;
  }
  void FailIds(std::string message) {
    absl::MutexLock lock(&mu_);
    id_error_ = std::move(message);
  }

 private:
  const std::string device_;
  InitBarrier* const barrier_;
  absl::Mutex mu_;
  int ids_created_ ABSL_GUARDED_BY(mu_) = 0;
  std::string id_error_ ABSL_GUARDED_BY(mu_);
  std::vector<vamp::v1::InitRequest> inits_ ABSL_GUARDED_BY(mu_);
};

// Fake agents on the given devices, serving on loopback, and an AgentGroup connected to them.
class Group {
 public:
  explicit Group(const std::vector<std::string>& devices) {
    barrier_.expected = static_cast<int>(devices.size());
    std::vector<AgentEndpoint> endpoints;
    for (size_t r = 0; r < devices.size(); ++r) {
      agents_.push_back(std::make_unique<FakeAgent>(devices[r], &barrier_));
      auto server = GrpcServer::Start("127.0.0.1:0", {agents_.back().get()});
      EXPECT_TRUE(server.ok()) << server.status();
      if (!server.ok()) return;
      endpoints.push_back({static_cast<int>(r), absl::StrCat("127.0.0.1:", (*server)->port())});
      servers_.push_back(std::move(*server));
    }
    AgentGroupOptions options;
    options.init_timeout_ms = 20000;
    auto group = AgentGroup::Connect(std::move(endpoints), options);
    EXPECT_TRUE(group.ok()) << group.status();
    if (group.ok()) group_ = std::move(*group);
  }
  ~Group() {
    group_.reset();
    for (auto& s : servers_) s->Shutdown(0);
  }

  AgentGroup& group() { return *group_; }
  FakeAgent& agent(int rank) { return *agents_[rank]; }

 private:
  InitBarrier barrier_;
  std::vector<std::unique_ptr<FakeAgent>> agents_;
  std::vector<std::unique_ptr<GrpcServer>> servers_;
  std::unique_ptr<AgentGroup> group_;
};

vamp::v1::InitRequest Request() {
  vamp::v1::InitRequest r;
  r.set_model_path("/models/m");
  r.set_dtype("auto");
  r.mutable_parallel()->set_host_transport_address("127.0.0.1:4321");
  return r;
}

TEST(ControllerAgentGroupTest, ChooseCollectiveTransportByDevices) {
  EXPECT_EQ(*ChooseCollectiveTransport({"cuda:0"}), CollectiveTransport::kNone);
  EXPECT_EQ(*ChooseCollectiveTransport({"cpu"}), CollectiveTransport::kNone);
  EXPECT_EQ(*ChooseCollectiveTransport({"cuda:0", "cuda:1"}), CollectiveTransport::kNccl);
  EXPECT_EQ(*ChooseCollectiveTransport({"cuda:1", "cuda", "cuda:7", "cuda:0"}),
            CollectiveTransport::kNccl);
  EXPECT_EQ(*ChooseCollectiveTransport({"cpu", "cpu"}), CollectiveTransport::kHost);
  absl::StatusOr<CollectiveTransport> mixed = ChooseCollectiveTransport({"cpu", "cuda:1"});
  ASSERT_FALSE(mixed.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(mixed.status())) << mixed.status();
  EXPECT_THAT(std::string(mixed.status().message()), HasSubstr("rank 1 runs on cuda:1"));
  EXPECT_THAT(std::string(mixed.status().message()), HasSubstr("rank 0 on cpu"));
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{}, {"cuda:0", "tpu:1"}, {"cuda:x", "cuda:1"}}) {
    absl::StatusOr<CollectiveTransport> t = ChooseCollectiveTransport(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  }
}

TEST(ControllerAgentGroupTest, CudaAgentsGetAFreshNcclIdFromRankZeroAtEveryInit) {
  Group g({"cuda:0", "cuda:1"});
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> first = g.group().Init(Request());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(g.group().transport(), CollectiveTransport::kNccl);
  EXPECT_TRUE(g.group().healthy());
  EXPECT_EQ(g.agent(0).ids_created(), 1);
  EXPECT_EQ(g.agent(1).ids_created(), 0) << "only rank 0 hosts the bootstrap root";
  std::vector<std::string> ids;
  for (int r = 0; r < 2; ++r) {
    const std::vector<vamp::v1::InitRequest> inits = g.agent(r).inits();
    ASSERT_EQ(inits.size(), 1u);
    const vamp::v1::ParallelSpec& p = inits[0].parallel();
    EXPECT_EQ(p.tp_size(), 2);
    EXPECT_EQ(p.tp_rank(), r);
    EXPECT_EQ(p.nccl_unique_id().size(), 128u);
    EXPECT_EQ(p.host_transport_address(), "") << "CUDA ranks meet through NCCL only";
    EXPECT_EQ(inits[0].model_path(), "/models/m");
    EXPECT_EQ(inits[0].dtype(), "auto");
    ids.push_back(p.nccl_unique_id());
  }
  EXPECT_EQ(ids[0], ids[1]) << "every rank joins the same group";

  // Re-initialisation (an agent came back): a new id, again from rank 0 only.
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> second = g.group().Init(Request());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(g.agent(0).ids_created(), 2);
  EXPECT_EQ(g.agent(1).ids_created(), 0);
  const std::string again0 = g.agent(0).inits().back().parallel().nccl_unique_id();
  const std::string again1 = g.agent(1).inits().back().parallel().nccl_unique_id();
  EXPECT_EQ(again0, again1);
  EXPECT_NE(again0, ids[0]) << "an NCCL unique id serves one group formation";
}

TEST(ControllerAgentGroupTest, CpuAgentsKeepTheTcpRendezvousAndAreNotAskedForAnId) {
  Group g({"cpu", "cpu"});
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> init = g.group().Init(Request());
  ASSERT_TRUE(init.ok()) << init.status();
  EXPECT_EQ(g.group().transport(), CollectiveTransport::kHost);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(g.agent(r).ids_created(), 0);
    const std::vector<vamp::v1::InitRequest> inits = g.agent(r).inits();
    ASSERT_EQ(inits.size(), 1u);
    EXPECT_EQ(inits[0].parallel().host_transport_address(), "127.0.0.1:4321");
    EXPECT_EQ(inits[0].parallel().nccl_unique_id(), "");
    EXPECT_EQ(inits[0].parallel().tp_rank(), r);
  }
  // Without the TCP address a CPU group cannot form: refused before any Init.
  vamp::v1::InitRequest no_address = Request();
  no_address.mutable_parallel()->clear_host_transport_address();
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> refused = g.group().Init(no_address);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("parallel.host_transport_address"));
  EXPECT_EQ(g.agent(0).inits().size(), 1u);
}

TEST(ControllerAgentGroupTest, OneCudaAgentNeedsNoRendezvous) {
  Group g({"cuda:0"});
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> init = g.group().Init(Request());
  ASSERT_TRUE(init.ok()) << init.status();
  EXPECT_EQ(g.group().transport(), CollectiveTransport::kNone);
  EXPECT_EQ(g.agent(0).ids_created(), 0);
  ASSERT_EQ(g.agent(0).inits().size(), 1u);
  EXPECT_EQ(g.agent(0).inits()[0].parallel().tp_size(), 1);
  EXPECT_EQ(g.agent(0).inits()[0].parallel().nccl_unique_id(), "");
}

TEST(ControllerAgentGroupTest, MixedDevicesFailBeforeAnyInit) {
  Group g({"cuda:0", "cpu"});
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> init = g.group().Init(Request());
  ASSERT_FALSE(init.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(init.status())) << init.status();
  EXPECT_THAT(std::string(init.status().message()), HasSubstr("mixes devices"));
  EXPECT_FALSE(g.group().healthy());
  EXPECT_EQ(g.agent(0).ids_created(), 0);
  EXPECT_TRUE(g.agent(0).inits().empty());
  EXPECT_TRUE(g.agent(1).inits().empty());
}

TEST(ControllerAgentGroupTest, RankZeroThatCannotCreateAnIdFailsInitNamingIt) {
  Group g({"cuda:0", "cuda:1"});
  g.agent(0).FailIds("this agent was built without CUDA");
  absl::StatusOr<std::vector<vamp::v1::InitResponse>> init = g.group().Init(Request());
  ASSERT_FALSE(init.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(init.status())) << init.status();
  EXPECT_THAT(std::string(init.status().message()), HasSubstr("agent rank 0"));
  EXPECT_THAT(std::string(init.status().message()), HasSubstr("CreateCollectiveId"));
  EXPECT_THAT(std::string(init.status().message()), HasSubstr("built without CUDA"));
  EXPECT_TRUE(g.agent(0).inits().empty());
  EXPECT_TRUE(g.agent(1).inits().empty());
}

}  // namespace
}  // namespace vamp
