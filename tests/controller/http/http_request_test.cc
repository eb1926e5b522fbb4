#include "controller/http/http_request.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vamp {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMaxBody = 1000;

int StatusOf(absl::string_view head) {
  absl::StatusOr<HttpRequest> r = ParseHttpRequestHead(head, kMaxBody);
  return r.ok() ? 0 : HttpStatusOfParseError(r.status());
}

TEST(HttpRequestTest, ParsesRequestLineHeadersAndLength) {
  absl::StatusOr<HttpRequest> r = ParseHttpRequestHead(
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n"
      "Authorization:   Bearer k  \r\n\r\n",
      kMaxBody);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->method, "POST");
  EXPECT_EQ(r->path, "/v1/completions");
  EXPECT_EQ(r->query, "x=1");
  EXPECT_EQ(r->minor_version, 1);
  EXPECT_EQ(r->content_length, 12);
  EXPECT_EQ(r->Header("authorization"), "Bearer k");
  EXPECT_EQ(r->Header("host"), "a");
  EXPECT_EQ(r->Header("missing"), "");
  EXPECT_TRUE(r->keep_alive);
  EXPECT_FALSE(r->expect_continue);
}

TEST(HttpRequestTest, KeepAliveFollowsVersionAndConnectionHeader) {
  EXPECT_FALSE(ParseHttpRequestHead("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", kMaxBody)
                   ->keep_alive);
  EXPECT_FALSE(ParseHttpRequestHead("GET / HTTP/1.0\r\n\r\n", kMaxBody)->keep_alive);
  EXPECT_TRUE(ParseHttpRequestHead("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", kMaxBody)
                  ->keep_alive);
  EXPECT_FALSE(
      ParseHttpRequestHead("GET / HTTP/1.1\r\nConnection: upgrade, close\r\n\r\n", kMaxBody)
          ->keep_alive);
  EXPECT_TRUE(ParseHttpRequestHead("POST / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", kMaxBody)
                  ->expect_continue);
}

TEST(HttpRequestTest, RefusesWithTheStatusAClientCanActOn) {
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\n\r\n"), 0);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\n"), 400);                  // no blank line
  EXPECT_EQ(StatusOf("GET  / HTTP/1.1\r\n\r\n"), 400);             // two spaces
  EXPECT_EQ(StatusOf("GET http://x/ HTTP/1.1\r\n\r\n"), 400);      // not origin-form
  EXPECT_EQ(StatusOf("G(T / HTTP/1.1\r\n\r\n"), 400);              // method not a token
  EXPECT_EQ(StatusOf("GET /\x01 HTTP/1.1\r\n\r\n"), 400);          // control byte in target
  EXPECT_EQ(StatusOf("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(StatusOf("GET / FTP/1.0\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\nNoColon\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\nA: b\x01\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"), 0);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n"), 413);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 1000\r\n\r\n"), 0);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), 501);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nExpect: something\r\n\r\n"), 417);
}

TEST(HttpRequestTest, ErrorsNameWhatIsWrong) {
  absl::StatusOr<HttpRequest> r =
      ParseHttpRequestHead("POST / HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", kMaxBody);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("5000 bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("http_max_body_bytes"));
  EXPECT_EQ(HttpStatusOfParseError(absl::InvalidArgumentError("no payload")), 400);
  EXPECT_EQ(HttpReasonPhrase(413), "Content Too Large");
}

}  // namespace
}  // namespace vamp
