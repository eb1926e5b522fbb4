// Fuzzes the HTTP/1.1 request-head parser of the front end: any bytes a client sends before the
// blank line must give a request or a refusal with an HTTP status, never a crash.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "controller/http/http_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  // As the server does: the head is everything up to the first blank line.
  const size_t end = bytes.find("\r\n\r\n");
  const std::string head = end == std::string::npos ? bytes + "\r\n\r\n" : bytes.substr(0, end + 4);
  absl::StatusOr<vamp::HttpRequest> r = vamp::ParseHttpRequestHead(head, 1 << 20);
  if (r.ok()) {
    if (r->path.empty() || r->path[0] != '/') std::abort();
    if (r->content_length < 0 || r->content_length > (1 << 20)) std::abort();
    if (r->minor_version != 0 && r->minor_version != 1) std::abort();
  } else {
    const int status = vamp::HttpStatusOfParseError(r.status());
    if (status < 400 || status > 599) std::abort();
    (void)vamp::HttpReasonPhrase(status);
  }
  return 0;
}
