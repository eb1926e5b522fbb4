// vamp-bench's client over gRPC (--protocol=grpc) against a small in-process Serving service:
// the same records as over HTTP (timings, generated ids re-sent as history, cached tokens), the
// API key as metadata, server-side failures and unreachable servers per request, the cut-off and
// the idle timeout cancelling open streams.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "bench/vamp_bench/client.h"
#include "bench/workload/multi_turn_generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vamp/v1/serving.grpc.pb.h"

namespace vamp::bench {
namespace {

using ::testing::HasSubstr;

struct ServingBehaviour {
  double first_delay_s = 0.05;
  double token_gap_s = 0.01;
  std::string api_key;
  bool fail = false;  // answer every request with FINISH_REASON_ERROR
};

// Streams max_tokens tokens (ids 200, 201, ...), one response each, the first after
// first_delay_s and each next token_gap_s later; the last response is finished with usage
// (half the prompt cached). Records every prompt.
class FakeServing final : public vamp::v1::Serving::Service {
 public:
  explicit FakeServing(ServingBehaviour b) : b_(std::move(b)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakeServing() override {
    server_->Shutdown(
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(200, GPR_TIMESPAN)));
  }
  int port() const { return port_; }
  std::vector<std::vector<int32_t>> prompts() {
    absl::MutexLock lock(&mu_);
    return prompts_;
  }
  int max_active() const { return max_active_; }

  grpc::Status Generate(grpc::ServerContext* context, const vamp::v1::GenerateRequest* request,
                        grpc::ServerWriter<vamp::v1::GenerateResponse>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      prompts_.emplace_back(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
    }
    if (!b_.api_key.empty()) {
      auto it = context->client_metadata().find("authorization");
      if (it == context->client_metadata().end() ||
          std::string(it->second.data(), it->second.size()) != "Bearer " + b_.api_key) {
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or invalid API key");
      }
    }
    const int active = ++active_;
    for (int m = max_active_; active > m && !max_active_.compare_exchange_weak(m, active);) {
    }
    const int total = request->stop().max_tokens();
    for (int i = 0; i < total && !context->IsCancelled(); ++i) {
      Sleep(i == 0 ? b_.first_delay_s : b_.token_gap_s, context);
      vamp::v1::GenerateResponse r;
      if (b_.fail) {
        r.set_finished(true);
        r.set_finish_reason(vamp::v1::FINISH_REASON_ERROR);
        r.set_error_message("agent rank 0 failed");
        writer->Write(r);
        break;
      }
      r.add_token_ids(200 + i);
      if (i + 1 == total) {
        r.set_finished(true);
        r.set_finish_reason(vamp::v1::FINISH_REASON_LENGTH);
        r.mutable_usage()->set_prompt_tokens(request->prompt_token_ids_size());
        r.mutable_usage()->set_completion_tokens(total);
        r.mutable_usage()->set_cached_prompt_tokens(request->prompt_token_ids_size() / 2);
      }
      writer->Write(r);
    }
    --active_;
    return context->IsCancelled() ? grpc::Status::CANCELLED : grpc::Status::OK;
  }

 private:
  static void Sleep(double seconds, grpc::ServerContext* context) {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
    while (std::chrono::steady_clock::now() < until && !context->IsCancelled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  const ServingBehaviour b_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<int> active_{0};
  std::atomic<int> max_active_{0};
  absl::Mutex mu_;
  std::vector<std::vector<int32_t>> prompts_ ABSL_GUARDED_BY(mu_);
};

workload::Workload Sessions(int sessions, int turns, double think_s = 0.1) {
  workload::MultiTurnOptions o;
  o.concurrency = sessions;
  o.turns = turns;
  o.first_turn_tokens = 20;
  o.growth_tokens = 5;
  o.output_tokens = 4;
  o.think_time_s = think_s;
  o.vocab_size = 100;
  return *workload::GenerateMultiTurn(o);
}

ClientOptions Grpc(int port, int loops = 1) {
  ClientOptions o;
  o.protocol = StreamProtocol::kGrpc;
  o.grpc_endpoint.port = port;
  o.endpoint.port = 1;  // the HTTP API is not used for streaming
  o.loops = loops;
  o.progress = false;
  o.request_timeout_s = 10;
  return o;
}

TEST(GrpcClientTest, StreamsTimesTokensAndResendsHistory) {
  FakeServing server({});
  absl::StatusOr<ClientRun> run =
      RunWorkload(Sessions(2, 3), Grpc(server.port(), 2), BenchClock::now());
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->records.size(), 6u);
  EXPECT_FALSE(run->cut_off);
  for (const RequestRecord& r : run->records) {
    EXPECT_TRUE(r.Completed()) << r.error;
    EXPECT_EQ(r.output_tokens, 4);
    EXPECT_GE(r.Ttft(), 0.045);
    EXPECT_LT(r.Ttft(), 1.0);
    EXPECT_GE(r.Tpot(), 0.009);
    EXPECT_EQ(r.inter_token_s.size(), 3u);
    EXPECT_EQ(r.cached_tokens, r.prompt_tokens / 2);
  }
  // Later turns re-send the previous prompt, the 4 generated ids and 5 new tokens.
  const std::vector<std::vector<int32_t>> prompts = server.prompts();
  int extended = 0;
  for (const auto& p : prompts) {
    for (const auto& q : prompts) {
      if (q.size() != p.size() + 9 || !std::equal(p.begin(), p.end(), q.begin())) continue;
      EXPECT_EQ(std::vector<int32_t>(q.begin() + p.size(), q.begin() + p.size() + 4),
                (std::vector<int32_t>{200, 201, 202, 203}));
      ++extended;
    }
  }
  EXPECT_EQ(extended, 4);
}

TEST(GrpcClientTest, SendsTheApiKeyAsMetadata) {
  FakeServing server(
      {.first_delay_s = 0.01, .token_gap_s = 0.001, .api_key = "secret-key-1234", .fail = false});
  ClientOptions o = Grpc(server.port());
  absl::StatusOr<ClientRun> run = RunWorkload(Sessions(1, 2), o, BenchClock::now());
  ASSERT_TRUE(run.ok());
  EXPECT_FALSE(run->records[0].ok);
  EXPECT_THAT(run->records[0].error, HasSubstr("missing or invalid API key"));
  o.endpoint.api_key = "secret-key-1234";  // the one key of the run, for both protocols
  run = RunWorkload(Sessions(1, 2), o, BenchClock::now());
  ASSERT_TRUE(run.ok());
  for (const RequestRecord& r : run->records) EXPECT_TRUE(r.Completed()) << r.error;
}

TEST(GrpcClientTest, RecordsServerFailuresAndUnreachableServers) {
  FakeServing failing({.first_delay_s = 0.01, .token_gap_s = 0.01, .api_key = "", .fail = true});
  absl::StatusOr<ClientRun> run =
      RunWorkload(Sessions(2, 2), Grpc(failing.port()), BenchClock::now());
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(run->records.size(), 4u);  // a session goes on without an answer
  for (const RequestRecord& r : run->records) {
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.error, "agent rank 0 failed");
  }
  int unused_port;
  {
    FakeServing gone({});
    unused_port = gone.port();
  }
  ClientOptions o = Grpc(unused_port);
  o.request_timeout_s = 2;
  run = RunWorkload(Sessions(1, 2), o, BenchClock::now());
  ASSERT_TRUE(run.ok());
  for (const RequestRecord& r : run->records) {
    EXPECT_FALSE(r.ok);
    EXPECT_THAT(r.error, HasSubstr("gRPC"));
  }
}

TEST(GrpcClientTest, CutOffCancelsOpenStreams) {
  FakeServing server({.first_delay_s = 0.02, .token_gap_s = 0.2, .api_key = "", .fail = false});  // ~0.6 s a turn
  ClientOptions o = Grpc(server.port());
  o.max_duration_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ClientRun> run = RunWorkload(Sessions(2, 3), o, t0);
  ASSERT_TRUE(run.ok());
  EXPECT_TRUE(run->cut_off);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  ASSERT_EQ(run->records.size(), 2u);
  for (const RequestRecord& r : run->records) {
    EXPECT_FALSE(r.Completed());
    EXPECT_LT(r.finish_s, 0);
    EXPECT_GE(r.output_tokens, 1);  // tokens came before the cut-off, not all of them
    EXPECT_LT(r.output_tokens, 4);
  }
}

TEST(GrpcClientTest, AStreamTheServerLeavesSilentFailsAtTheTimeout) {
  FakeServing server({.first_delay_s = 5.0, .token_gap_s = 0.01, .api_key = "", .fail = false});
  ClientOptions o = Grpc(server.port());
  o.request_timeout_s = 0.5;
  absl::StatusOr<ClientRun> run = RunWorkload(Sessions(1, 1), o, BenchClock::now());
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(run->records.size(), 1u);
  EXPECT_FALSE(run->records[0].ok);
  EXPECT_THAT(run->records[0].error, HasSubstr("sent nothing within the request timeout"));
  EXPECT_LT(run->records[0].E2e(), 2.5);  // checked once a second
}

TEST(GrpcClientTest, HundredSessionsInFlightTogether) {
  // Each first token is held 2 s, so all 100 sessions are in flight together, even when loaded.
  FakeServing server({.first_delay_s = 2.0, .token_gap_s = 0.001, .api_key = "", .fail = false});
  absl::StatusOr<ClientRun> run =
      RunWorkload(Sessions(100, 2), Grpc(server.port(), 2), BenchClock::now());
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->records.size(), 200u);
  for (const RequestRecord& r : run->records) ASSERT_TRUE(r.Completed()) << r.error;
  EXPECT_GE(server.max_active(), 90);
}

}  // namespace
}  // namespace vamp::bench
