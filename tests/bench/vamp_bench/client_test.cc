// vamp-bench's client against a small local libevent server that streams canned SSE: TTFT and
// token timings, multi-turn history re-sent with the generated token ids, think times, the API
// key header, HTTP errors and unreachable servers recorded per request.
#include "bench/vamp_bench/client.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/workload/multi_turn_generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace vamp::bench {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

// Streams `max_tokens` tokens (ids 200, 201, ...) as SSE, the first after `first_delay_s` and
// each next one `token_gap_s` later, then a usage chunk and [DONE]. Records every prompt.
class FakeServer {
 public:
  explicit FakeServer(double first_delay_s = 0.05, double token_gap_s = 0.01,
                      std::string api_key = "", int status = 200, double idle_timeout_s = 0)
      : first_delay_s_(first_delay_s),
        token_gap_s_(token_gap_s),
        api_key_(std::move(api_key)),
        status_(status) {
    InitLibevent();
    base_ = event_base_new();
    http_ = evhttp_new(base_);
    evhttp_bound_socket* socket = evhttp_bind_socket_with_handle(http_, "127.0.0.1", 0);
    port_ = ntohs(reinterpret_cast<sockaddr_in*>(&Local(socket))->sin_port);
    evhttp_set_gencb(http_, &FakeServer::Handle, this);
    if (idle_timeout_s > 0) {
      // Connections with nothing to read or write for this long are closed by the server.
      timeval tv{0, static_cast<suseconds_t>(idle_timeout_s * 1e6)};
      evhttp_set_timeout_tv(http_, &tv);
    }
    thread_ = std::thread([this] { event_base_dispatch(base_); });
  }
  ~FakeServer() {
    // loopexit, not loopbreak: a break asked for before the loop starts would be forgotten.
    event_base_loopexit(base_, nullptr);
    thread_.join();
    evhttp_free(http_);
    event_base_free(base_);
  }
  int port() const { return port_; }
  std::vector<Json> bodies() {
    absl::MutexLock lock(&mu_);
    return bodies_;
  }
  // The most streams the server had open at once.
  int max_active() const { return max_active_; }

 private:
  struct Stream {
    FakeServer* server;
    evhttp_request* req;
    int sent = 0;
    int total = 0;
    int prompt = 0;
  };
  static sockaddr_storage& Local(evhttp_bound_socket* s) {
    static thread_local sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    getsockname(evhttp_bound_socket_get_fd(s), reinterpret_cast<sockaddr*>(&ss), &len);
    return ss;
  }
  static void Handle(evhttp_request* req, void* arg) {
    auto* self = static_cast<FakeServer*>(arg);
    evbuffer* in = evhttp_request_get_input_buffer(req);
    std::string body(evbuffer_get_length(in), '\0');
    evbuffer_remove(in, body.data(), body.size());
    Json j = Json::parse(body, nullptr, false);
    {
      absl::MutexLock lock(&self->mu_);
      self->bodies_.push_back(j);
    }
    const char* auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (!self->api_key_.empty() &&
        (auth == nullptr || std::string(auth) != "Bearer " + self->api_key_)) {
      Reply(req, 401, "{\"error\":{\"message\":\"missing or invalid API key\",\"code\":401}}");
      return;
    }
    if (self->status_ != 200) {
      Reply(req, self->status_, "{\"error\":{\"message\":\"prompt: too long\",\"code\":400}}");
      return;
    }
    auto* s =
        new Stream{self, req, 0, j["max_tokens"].get<int>(), static_cast<int>(j["prompt"].size())};
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/event-stream");
    evhttp_send_reply_start(req, 200, "OK");
    if (++self->active_ > self->max_active_) self->max_active_ = self->active_;
    Later(s, self->first_delay_s_);
  }
  static void Reply(evhttp_request* req, int code, const std::string& body) {
    evbuffer* out = evbuffer_new();
    evbuffer_add(out, body.data(), body.size());
    evhttp_send_reply(req, code, "Error", out);
    evbuffer_free(out);
  }
  static void Later(Stream* s, double seconds) {
    const auto micros = static_cast<int64_t>(seconds * 1e6);
    timeval tv{static_cast<time_t>(micros / 1000000), static_cast<suseconds_t>(micros % 1000000)};
    event_base_once(s->server->base_, -1, EV_TIMEOUT, &FakeServer::Next, s, &tv);
  }
  static void Next(evutil_socket_t, short, void* arg) {
    auto* s = static_cast<Stream*>(arg);
    const bool last = s->sent + 1 == s->total;
    Json chunk = {{"choices",
                   {{{"index", 0},
                     {"token_ids", {200 + s->sent}},
                     {"finish_reason", last ? Json("length") : Json(nullptr)}}}}};
    std::string text = absl::StrCat("data: ", chunk.dump(), "\n\n");
    if (last) {
      Json usage = {{"choices", Json::array()},
                    {"usage",
                     {{"prompt_tokens", s->prompt},
                      {"completion_tokens", s->total},
                      {"prompt_tokens_details", {{"cached_tokens", s->prompt / 2}}}}}};
      absl::StrAppend(&text, "data: ", usage.dump(), "\n\ndata: [DONE]\n\n");
    }
    evbuffer* out = evbuffer_new();
    evbuffer_add(out, text.data(), text.size());
    evhttp_send_reply_chunk(s->req, out);
    evbuffer_free(out);
    ++s->sent;
    if (last) {
      evhttp_send_reply_end(s->req);
      --s->server->active_;
      delete s;
      return;
    }
    Later(s, s->server->token_gap_s_);
  }

  const double first_delay_s_;
  const double token_gap_s_;
  const std::string api_key_;
  const int status_;
  event_base* base_;
  evhttp* http_;
  int port_ = 0;
  int active_ = 0;  // on the server's thread only
  std::atomic<int> max_active_{0};
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<Json> bodies_ ABSL_GUARDED_BY(mu_);
};

workload::Workload TwoByThree() {
  workload::MultiTurnOptions o;
  o.concurrency = 2;
  o.turns = 3;
  o.first_turn_tokens = 20;
  o.growth_tokens = 5;
  o.output_tokens = 4;
  o.think_time_s = 0.1;
  o.vocab_size = 100;
  return *workload::GenerateMultiTurn(o);
}

ClientOptions Options(int port, int loops = 1) {
  ClientOptions o;
  o.endpoint.port = port;
  o.loops = loops;
  o.progress = false;
  o.request_timeout_s = 10;
  return o;
}

TEST(ClientTest, StreamsTimesTokensAndResendsHistory) {
  FakeServer server(/*first_delay_s=*/0.05, /*token_gap_s=*/0.01);
  const workload::Workload w = TwoByThree();
  absl::StatusOr<ClientRun> run = RunWorkload(w, Options(server.port(), 2), BenchClock::now());
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->records.size(), 6u);
  EXPECT_FALSE(run->cut_off);
  EXPECT_EQ(run->turns_per_session, (std::vector<int32_t>{3, 3}));
  for (const RequestRecord& r : run->records) {
    EXPECT_TRUE(r.Completed()) << r.error;
    EXPECT_EQ(r.output_tokens, 4);
    EXPECT_GE(r.Ttft(), 0.045);
    EXPECT_LT(r.Ttft(), 1.0);
    EXPECT_GE(r.Tpot(), 0.009);
    EXPECT_EQ(r.inter_token_s.size(), 3u);
    EXPECT_EQ(r.cached_tokens, r.prompt_tokens / 2);
  }
  // Turn k + 1 is issued at least a think time after turn k ended, and its prompt is turn k's
  // prompt, the 4 generated ids, and 5 new tokens.
  for (int s = 0; s < 2; ++s) {
    std::vector<const RequestRecord*> turns(3);
    for (const RequestRecord& r : run->records) {
      if (r.session == s) turns[r.turn] = &r;
    }
    for (int k = 1; k < 3; ++k) {
      EXPECT_GE(turns[k]->issue_s, turns[k - 1]->finish_s + 0.1 - 1e-3);
      EXPECT_EQ(turns[k]->prompt_tokens, turns[k - 1]->prompt_tokens + 4 + 5);
    }
  }
  std::vector<std::vector<int>> prompts;
  for (const Json& b : server.bodies()) prompts.push_back(b["prompt"].get<std::vector<int>>());
  int extended = 0;
  for (const auto& p : prompts) {
    for (const auto& q : prompts) {
      if (q.size() != p.size() + 9) continue;
      if (!std::equal(p.begin(), p.end(), q.begin())) continue;
      EXPECT_EQ(std::vector<int>(q.begin() + p.size(), q.begin() + p.size() + 4),
                (std::vector<int>{200, 201, 202, 203}));
      ++extended;
    }
  }
  EXPECT_EQ(extended, 4);  // 2 sessions × 2 later turns
}

TEST(ClientTest, SendsTheApiKey) {
  FakeServer server(0.01, 0.001, "secret-key-1234");
  const workload::Workload w = TwoByThree();
  ClientOptions o = Options(server.port());
  absl::StatusOr<ClientRun> run = RunWorkload(w, o, BenchClock::now());
  ASSERT_TRUE(run.ok());
  EXPECT_FALSE(run->records[0].ok);
  EXPECT_THAT(run->records[0].error, HasSubstr("HTTP 401: missing or invalid API key"));
  o.endpoint.api_key = "secret-key-1234";
  run = RunWorkload(w, o, BenchClock::now());
  ASSERT_TRUE(run.ok());
  for (const RequestRecord& r : run->records) EXPECT_TRUE(r.Completed()) << r.error;
}

TEST(ClientTest, RecordsHttpErrorsAndUnreachableServers) {
  FakeServer server(0.01, 0.001, "", 400);
  const workload::Workload w = TwoByThree();
  absl::StatusOr<ClientRun> run = RunWorkload(w, Options(server.port()), BenchClock::now());
  ASSERT_TRUE(run.ok());
  // Every turn is still issued (a session goes on without an answer) and fails with the message.
  ASSERT_EQ(run->records.size(), 6u);
  for (const RequestRecord& r : run->records) {
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.error, "HTTP 400: prompt: too long");
  }
  int unused_port;
  {
    FakeServer gone;
    unused_port = gone.port();
  }
  run = RunWorkload(w, Options(unused_port), BenchClock::now());
  ASSERT_TRUE(run.ok());
  for (const RequestRecord& r : run->records) {
    EXPECT_FALSE(r.ok);
    EXPECT_THAT(r.error, HasSubstr("transport"));
  }
}

TEST(ClientTest, CutsOffAtMaxDuration) {
  FakeServer server(/*first_delay_s=*/0.02, /*token_gap_s=*/0.2);  // a turn takes ~0.6 s
  const workload::Workload w = TwoByThree();
  ClientOptions o = Options(server.port());
  o.max_duration_s = 0.3;
  absl::StatusOr<ClientRun> run = RunWorkload(w, o, BenchClock::now());
  ASSERT_TRUE(run.ok());
  EXPECT_TRUE(run->cut_off);
  EXPECT_LT(run->duration_s, 1.0);
  ASSERT_EQ(run->records.size(), 2u);  // only the first turns were issued
  for (const RequestRecord& r : run->records) {
    EXPECT_FALSE(r.Completed());
    EXPECT_LT(r.finish_s, 0);
  }
}

TEST(ClientTest, SurvivesTheServerClosingIdleConnections) {
  // The server drops connections idle for 0.2 s; sessions think 0.5 s between turns, so every
  // later turn finds its kept-alive connection closed by the server. (libevent notices such
  // closes on idle connections; the pool's one resend covers a close racing the send.)
  FakeServer server(/*first_delay_s=*/0.01, /*token_gap_s=*/0.001, "", 200,
                    /*idle_timeout_s=*/0.2);
  workload::MultiTurnOptions o;
  o.concurrency = 4;
  o.turns = 3;
  o.first_turn_tokens = 8;
  o.growth_tokens = 4;
  o.output_tokens = 3;
  o.think_time_s = 0.5;
  o.vocab_size = 100;
  absl::StatusOr<ClientRun> run =
      RunWorkload(*workload::GenerateMultiTurn(o), Options(server.port()), BenchClock::now());
  ASSERT_TRUE(run.ok());
  ASSERT_EQ(run->records.size(), 12u);
  for (const RequestRecord& r : run->records) EXPECT_TRUE(r.Completed()) << r.error;
}

TEST(ClientTest, ThousandSessionsOnTwoLoops) {
  // 1,000 client and 1,000 server sockets in this one process.
  rlimit r;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &r), 0);
  if (r.rlim_max < 4096) GTEST_SKIP() << "open-file limit " << r.rlim_max << " is too low";
  r.rlim_cur = std::max<rlim_t>(r.rlim_cur, 4096);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &r), 0);
  // Every stream holds its first token for 2 s, so all sessions are in flight together even on a
  // loaded machine (opening 1,000 connections on two loops can take most of a second there).
  FakeServer server(/*first_delay_s=*/2.0, /*token_gap_s=*/0.001);
  workload::MultiTurnOptions o;
  o.concurrency = 1000;
  o.turns = 2;
  o.first_turn_tokens = 8;
  o.growth_tokens = 4;
  o.output_tokens = 2;
  o.think_time_s = 0.1;
  o.vocab_size = 100;
  absl::StatusOr<ClientRun> run =
      RunWorkload(*workload::GenerateMultiTurn(o), Options(server.port(), 2), BenchClock::now());
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->records.size(), 2000u);
  int completed = 0;
  std::string first_error;
  for (const RequestRecord& r : run->records) {
    completed += r.Completed() ? 1 : 0;
    if (!r.Completed() && first_error.empty()) first_error = r.error;
  }
  EXPECT_EQ(completed, 2000) << "first failure: " << first_error;
  EXPECT_GE(server.max_active(), 900);
}

}  // namespace
}  // namespace vamp::bench
