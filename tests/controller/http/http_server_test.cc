// HttpServer against raw sockets: keep-alive and pipelining, streams posted from other threads,
// clients that go away, slow or oversized requests, many connections on one loop thread.
#include "controller/http/http_server.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/raw_http_client.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using testing::RawHttpClient;

// Handler routes: /hello answers at once; /stream and /hold keep their exchange for the test.
class TestHandler {
 public:
  void Handle(std::shared_ptr<HttpExchange> exchange) {
    const HttpRequest& r = exchange->request();
    if (r.path == "/hello") {
      exchange->Respond(200, "text/plain", absl::StrCat("hello ", r.body));
      return;
    }
    exchange->SetOnClose([this] {
      absl::MutexLock lock(&mu_);
      ++closed_;
    });
    if (r.path == "/stream") exchange->StartStream(200, "text/event-stream");
    absl::MutexLock lock(&mu_);
    held_.push_back(exchange);
  }
  // Waits until `n` exchanges are held; false after 10 s.
  bool WaitHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(10));
  }
  bool WaitClosed(int n) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(10));
  }
  std::vector<std::shared_ptr<HttpExchange>> held() {
    absl::MutexLock lock(&mu_);
    return held_;
  }
  int closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<HttpExchange>> held_ ABSL_GUARDED_BY(mu_);
  int closed_ ABSL_GUARDED_BY(mu_) = 0;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options = {}) {
    options.address = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
        options, [this](std::shared_ptr<HttpExchange> e) { handler_.Handle(std::move(e)); });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Stop();
  }
  TestHandler handler_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, AnswersKeepsAliveAndServesPipelinedRequestsInOrder) {
  StartServer();
  RawHttpClient c(server_->port());
  ASSERT_TRUE(c.connected());
  c.Send("POST /hello HTTP/1.1\r\nContent-Length: 1\r\n\r\na");
  EXPECT_THAT(c.ReadUntil("hello a"), StartsWith("HTTP/1.1 200 OK\r\n"));
  c.Clear();
  // Two requests in one write: both answered, in order, on the same connection.
  c.Send("POST /hello HTTP/1.1\r\nContent-Length: 1\r\n\r\nb"
         "\r\nPOST /hello HTTP/1.1\r\nContent-Length: 1\r\n\r\nc");
  const std::string both = c.ReadUntil("hello c");
  EXPECT_LT(both.find("hello b"), both.find("hello c"));
  // Connection: close is honoured.
  c.Clear();
  c.Send("GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_THAT(c.data(), HasSubstr("Connection: close"));
}

TEST_F(HttpServerTest, ExpectContinueGetsAnInterimAnswer) {
  StartServer();
  RawHttpClient c(server_->port());
  c.Send("POST /hello HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_THAT(c.ReadUntil("\r\n\r\n"), StartsWith("HTTP/1.1 100 Continue\r\n\r\n"));
  c.Send("xy");
  EXPECT_THAT(c.ReadUntil("hello xy"), HasSubstr("hello xy"));
}

TEST_F(HttpServerTest, StreamsChunksPostedFromAnotherThread) {
  StartServer();
  RawHttpClient c(server_->port());
  c.Send("GET /stream HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(handler_.WaitHeld(1));
  std::shared_ptr<HttpExchange> e = handler_.held()[0];
  std::thread([e] {
    e->Post([e] { e->Write("data: one\n\n"); });
    e->Post([e] {
      e->Write("data: two\n\n");
      e->End();
    });
  }).join();
  const std::string got = c.ReadUntil("0\r\n\r\n");
  EXPECT_THAT(got, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(got, HasSubstr("b\r\ndata: one\n\n\r\nb\r\ndata: two\n\n\r\n0\r\n\r\n"));
  EXPECT_EQ(handler_.closed(), 0);  // ended, not closed: no abort
}

TEST_F(HttpServerTest, ClientThatGoesAwayClosesStreamingAndUnaryExchanges) {
  StartServer();
  RawHttpClient streaming(server_->port());
  RawHttpClient unary(server_->port());
  streaming.Send("GET /stream HTTP/1.1\r\n\r\n");
  unary.Send("POST /hold HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
  ASSERT_TRUE(handler_.WaitHeld(2));
  streaming.Close();
  unary.Close();
  // Each close callback runs once: this is what aborts the request in the engine.
  EXPECT_TRUE(handler_.WaitClosed(2));
  EXPECT_EQ(handler_.closed(), 2);
}

TEST_F(HttpServerTest, SlowHeadersNeitherBlockOthersNorStayForever) {
  HttpServerOptions options;
  options.threads = 1;
  options.header_timeout_s = 0.5;
  StartServer(options);
  std::vector<std::unique_ptr<RawHttpClient>> slow;
  for (int i = 0; i < 8; ++i) {
    slow.push_back(std::make_unique<RawHttpClient>(server_->port()));
    slow.back()->Send("GET /hello HTTP/1.1\r\nX-Slow: ");
  }
  // While eight heads trickle in, another client is served on the same (only) loop thread.
  RawHttpClient fast(server_->port());
  fast.Send("GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_THAT(fast.ReadUntil("hello "), StartsWith("HTTP/1.1 200 OK"));
  for (int i = 0; i < 3; ++i) {
    for (auto& s : slow) s->Send("a");
    absl::SleepFor(absl::Milliseconds(100));
  }
  // Byte-by-byte heads do not extend the deadline: 408 and closed.
  for (auto& s : slow) {
    EXPECT_TRUE(s->WaitClosed());
    EXPECT_THAT(s->data(), StartsWith("HTTP/1.1 408 Request Timeout"));
    EXPECT_THAT(s->data(), HasSubstr("http_header_timeout_s"));
  }
}

TEST_F(HttpServerTest, BodyThatNeverCompletesGets408) {
  HttpServerOptions options;
  options.body_timeout_s = 0.3;
  StartServer(options);
  RawHttpClient c(server_->port());
  c.Send("POST /hello HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_THAT(c.data(), StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(c.data(), HasSubstr("http_body_timeout_s"));
}

TEST_F(HttpServerTest, OversizedBodyGets413BeforeItIsSentAndHugeHeadGets431) {
  HttpServerOptions options;
  options.max_body_bytes = 1000;
  options.max_header_bytes = 2048;
  StartServer(options);
  RawHttpClient big_body(server_->port());
  big_body.Send("POST /hello HTTP/1.1\r\nContent-Length: 1001\r\n\r\n");  // no body byte sent
  EXPECT_TRUE(big_body.WaitClosed());
  EXPECT_THAT(big_body.data(), StartsWith("HTTP/1.1 413 Content Too Large"));
  EXPECT_THAT(big_body.data(), HasSubstr("1001 bytes"));

  RawHttpClient big_head(server_->port());
  big_head.Send(absl::StrCat("GET /hello HTTP/1.1\r\nX-Big: ", std::string(3000, 'x')));
  EXPECT_TRUE(big_head.WaitClosed());
  EXPECT_THAT(big_head.data(), StartsWith("HTTP/1.1 431"));

  RawHttpClient bad(server_->port());
  bad.Send("GET /hello HTTP/9.9\r\n\r\n");
  EXPECT_TRUE(bad.WaitClosed());
  EXPECT_THAT(bad.data(), StartsWith("HTTP/1.1 505"));
}

TEST_F(HttpServerTest, IdleKeepAliveConnectionIsClosed) {
  HttpServerOptions options;
  options.idle_timeout_s = 0.3;
  StartServer(options);
  RawHttpClient c(server_->port());
  c.Send("GET /hello HTTP/1.1\r\n\r\n");
  c.ReadUntil("hello ");
  EXPECT_TRUE(c.WaitClosed());
}

TEST_F(HttpServerTest, ConnectionsBeyondTheLimitGet503) {
  HttpServerOptions options;
  options.max_connections = 2;
  StartServer(options);
  RawHttpClient a(server_->port()), b(server_->port());
  a.Send("GET /stream HTTP/1.1\r\n\r\n");
  b.Send("GET /stream HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(handler_.WaitHeld(2));
  RawHttpClient c(server_->port());
  EXPECT_TRUE(c.WaitClosed());
  EXPECT_THAT(c.data(), StartsWith("HTTP/1.1 503"));
}

TEST_F(HttpServerTest, StopClosesOpenExchangesRunningTheirCallbacks) {
  StartServer();
  RawHttpClient a(server_->port()), b(server_->port());
  a.Send("GET /stream HTTP/1.1\r\n\r\n");
  b.Send("GET /hold HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(handler_.WaitHeld(2));
  server_->Stop();
  EXPECT_EQ(handler_.closed(), 2);
  EXPECT_EQ(server_->connections(), 0);
  // Posting to an exchange of a stopped server is harmless.
  for (const auto& e : handler_.held()) e->Post([] { ADD_FAILURE() << "ran after Stop"; });
}

// The old front end served 8 streams at a time (a thread per connection). One loop
// thread holds a thousand open streams and feeds all of them.
TEST_F(HttpServerTest, OneLoopThreadHoldsAThousandStreams) {
  const int n = static_cast<int>(std::min<int64_t>(1000, (testing::RaiseOpenFileLimit() - 64) / 2));
  ASSERT_GE(n, 400) << "open-file limit too low for this test";
  HttpServerOptions options;
  options.threads = 1;
  StartServer(options);
  std::vector<std::unique_ptr<RawHttpClient>> clients;
  for (int i = 0; i < n; ++i) {
    clients.push_back(std::make_unique<RawHttpClient>(server_->port()));
    clients.back()->Send("GET /stream HTTP/1.1\r\n\r\n");
  }
  ASSERT_TRUE(handler_.WaitHeld(static_cast<size_t>(n)));
  EXPECT_EQ(server_->connections(), n);
  for (const auto& e : handler_.held()) {
    e->Post([e] {
      e->Write("data: x\n\n");
      e->End();
    });
  }
  for (auto& c : clients) EXPECT_THAT(c->ReadUntil("0\r\n\r\n"), HasSubstr("data: x"));
}

TEST(HttpServerOptionsTest, BadOptionsNameTheField) {
  HttpServerOptions o;
  o.threads = 0;
  EXPECT_THAT(ValidateHttpServerOptions(o).message(), HasSubstr("http_threads"));
  o = {};
  o.header_timeout_s = -1;
  EXPECT_THAT(ValidateHttpServerOptions(o).message(), HasSubstr("http_header_timeout_s"));
  o = {};
  o.tls_cert_file = "x.pem";
  EXPECT_THAT(ValidateHttpServerOptions(o).message(), HasSubstr("tls_key_file"));
  o = {};
  o.address = "nonsense";
  EXPECT_THAT(HttpServer::Start(o, [](std::shared_ptr<HttpExchange>) {}).status().message(),
              HasSubstr("host:port"));
}

}  // namespace
}  // namespace vamp
