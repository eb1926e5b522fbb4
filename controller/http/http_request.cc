#include "controller/http/http_request.h"

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace vamp {
namespace {

absl::Status ParseError(int http_status, absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kHttpStatusPayload, absl::Cord(absl::StrCat(http_status)));
  return status;
}

// RFC 9110 token characters (method and field names).
bool IsTokenChar(char c) {
  if (absl::ascii_isalnum(static_cast<unsigned char>(c))) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-':
    case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// Field values: visible ASCII, obs-text, space and tab; no control characters (CR/LF injection).
bool IsFieldValue(absl::string_view s) {
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u == '\t') continue;
    if (u < 0x20 || u == 0x7f) return false;
  }
  return true;
}

// Whether the comma-separated `list` holds `token` (case-insensitive), as Connection does.
bool ListHasToken(absl::string_view list, absl::string_view token) {
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(item), token)) return true;
  }
  return false;
}

}  // namespace

absl::string_view HttpRequest::Header(absl::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return {};
}

absl::StatusOr<HttpRequest> ParseHttpRequestHead(absl::string_view head, int64_t max_body_bytes) {
  if (!absl::ConsumeSuffix(&head, "\r\n\r\n")) {
    return ParseError(400, "the request head does not end with an empty line (CRLF CRLF)");
  }
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  HttpRequest request;
  // Request line: METHOD SP request-target SP HTTP-version.
  std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || parts[1].empty()) {
    return ParseError(400, "malformed request line (expected 'METHOD /path HTTP/1.1')");
  }
  if (parts[2] == "HTTP/1.1") {
    request.minor_version = 1;
  } else if (parts[2] == "HTTP/1.0") {
    request.minor_version = 0;
  } else if (absl::StartsWith(parts[2], "HTTP/")) {
    return ParseError(505, absl::StrCat("HTTP version '", parts[2],
                                        "' is not supported (HTTP/1.0 and HTTP/1.1 are)"));
  } else {
    return ParseError(400, "malformed request line (expected 'METHOD /path HTTP/1.1')");
  }
  request.method = std::string(parts[0]);
  absl::string_view target = parts[1];
  if (target[0] != '/') {
    return ParseError(400, "the request target must be a path starting with '/'");
  }
  for (char c : target) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) {
      return ParseError(400, "the request target holds a control, space or non-ASCII byte");
    }
  }
  const size_t q = target.find('?');
  request.path = std::string(target.substr(0, q));
  if (q != absl::string_view::npos) request.query = std::string(target.substr(q + 1));

  bool have_length = false;
  bool connection_close = false;
  bool connection_keep_alive = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    if (!line.empty() && (line[0] == ' ' || line[0] == '\t')) {
      return ParseError(400, "obsolete header line folding is not accepted");
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return ParseError(400, absl::StrCat("malformed header field on line ", i + 1,
                                          " (expected 'Name: value')"));
    }
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (!IsFieldValue(value)) {
      return ParseError(400, absl::StrCat("header field on line ", i + 1,
                                          " holds a control character"));
    }
    std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    if (name == "content-length") {
      int64_t length = 0;
      if (value.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(value[0])) ||
          !absl::SimpleAtoi(value, &length) || length < 0) {
        return ParseError(400, "Content-Length is not a non-negative integer");
      }
      if (have_length && length != request.content_length) {
        return ParseError(400, "two Content-Length fields disagree");
      }
      have_length = true;
      request.content_length = length;
    } else if (name == "transfer-encoding") {
      return ParseError(501, "Transfer-Encoding in requests is not supported; send the body "
                             "with Content-Length");
    } else if (name == "connection") {
      connection_close = connection_close || ListHasToken(value, "close");
      connection_keep_alive = connection_keep_alive || ListHasToken(value, "keep-alive");
    } else if (name == "expect") {
      if (!absl::EqualsIgnoreCase(value, "100-continue")) {
        return ParseError(417, absl::StrCat("Expect: '", value, "' is not supported"));
      }
      request.expect_continue = true;
    }
    request.headers.emplace_back(std::move(name), std::string(value));
  }
  if (request.content_length > max_body_bytes) {
    return ParseError(413, absl::StrCat("the request body (", request.content_length,
                                        " bytes) is larger than the limit of ", max_body_bytes,
                                        " bytes (--http_max_body_bytes)"));
  }
  request.keep_alive =
      request.minor_version == 1 ? !connection_close : (connection_keep_alive && !connection_close);
  return request;
}

int HttpStatusOfParseError(const absl::Status& status) {
  const auto payload = status.GetPayload(kHttpStatusPayload);
  int code = 0;
  if (payload.has_value() && absl::SimpleAtoi(std::string(*payload), &code)) return code;
  return 400;
}

absl::string_view HttpReasonPhrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

}  // namespace vamp
