// One HTTP/1.1 request as the front end's server hands it to a handler, and the parser of a
// request head (request line and header fields, RFC 9112). Pure: no sockets, so the parser is
// unit-tested and fuzzed on bytes.
//
// What the parser accepts: origin-form targets ("/path?query"), HTTP/1.0 and HTTP/1.1, a body
// framed by Content-Length only. It refuses, with the status a client should see:
//   400 malformed request line, header field or Content-Length (also duplicate, differing ones),
//   413 a Content-Length above the body limit (before any body byte is read),
//   431 a head larger than the header limit (checked by the server before parsing),
//   501 Transfer-Encoding in a request (no client of this API sends chunked bodies),
//   505 an HTTP version other than 1.0 and 1.1.
#ifndef VAMP_CONTROLLER_HTTP_HTTP_REQUEST_H_
#define VAMP_CONTROLLER_HTTP_HTTP_REQUEST_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vamp {

struct HttpRequest {
  std::string method;  // as sent, e.g. "GET"
  std::string path;    // target up to '?', e.g. "/v1/completions"
  std::string query;   // after '?', without it; may be empty
  int minor_version = 1;  // HTTP/1.<minor_version>
  // Field names lower-cased, values with surrounding whitespace trimmed, in arrival order.
  std::vector<std::pair<std::string, std::string>> headers;
  int64_t content_length = 0;  // bytes of body that follow the head
  bool keep_alive = true;      // the connection may carry another request afterwards
  bool expect_continue = false;  // "Expect: 100-continue"
  std::string body;

  // The first value of header `lower_name`, or "" when absent.
  absl::string_view Header(absl::string_view lower_name) const;
};

// The payload key under which a parse error carries the HTTP status to answer (decimal text).
inline constexpr char kHttpStatusPayload[] = "type.vamp.dev/http_status";

// Parses `head`: everything up to and including the blank line ending the header section.
// `max_body_bytes` bounds Content-Length. Errors are InvalidArgument with kHttpStatusPayload set.
absl::StatusOr<HttpRequest> ParseHttpRequestHead(absl::string_view head, int64_t max_body_bytes);

// The HTTP status a parse error asks for (400 when it carries none).
int HttpStatusOfParseError(const absl::Status& status);

// "OK", "Not Found", ... for the statuses this server sends; "Unknown" otherwise.
absl::string_view HttpReasonPhrase(int status);

}  // namespace vamp

#endif  // VAMP_CONTROLLER_HTTP_HTTP_REQUEST_H_
