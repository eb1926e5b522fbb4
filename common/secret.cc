#include "common/secret.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace vamp {
namespace {

constexpr absl::string_view kBearer = "Bearer ";
// A secret file is a line or a few; anything bigger is the wrong file, and is not read whole.
constexpr std::streamsize kMaxSecretFileBytes = 1 << 20;

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read '", path, "'"));
  }
  std::string data(kMaxSecretFileBytes + 1, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read '", path, "'"));
  }
  data.resize(static_cast<size_t>(in.gcount()));
  if (data.size() > static_cast<size_t>(kMaxSecretFileBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is larger than 1 MiB: not a token file"));
  }
  return data;
}

}  // namespace

absl::Status ValidateSecret(absl::string_view secret) {
  if (secret.size() < kMinSecretBytes || secret.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the token is ", secret.size(),
                                                   " characters long; it must have ",
                                                   kMinSecretBytes, " to ", kMaxSecretBytes));
  }
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(secret[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("the token's byte at offset ", i,
                       " is not printable ASCII (spaces and control characters are not allowed "
                       "either)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view field) {
  absl::StatusOr<std::string> data = ReadSmallFile(path, field);
  if (!data.ok()) return data.status();
  std::string secret;
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(*data, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (++lines > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", path,
                       "' holds more than one line; a token file holds the token on one line"));
    }
    secret = std::string(line);
  }
  if (lines == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is empty"));
  }
  if (absl::Status s = ValidateSecret(secret); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "': ", s.message()));
  }
  return secret;
}

absl::StatusOr<std::vector<std::string>> ReadSecretListFile(const std::string& path,
                                                            absl::string_view field) {
  absl::StatusOr<std::string> data = ReadSmallFile(path, field);
  if (!data.ok()) return data.status();
  std::vector<std::string> secrets;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(*data, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (absl::Status s = ValidateSecret(line); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", path, "' line ", number, ": ", s.message()));
    }
    secrets.emplace_back(line);
  }
  if (secrets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' holds no key"));
  }
  return secrets;
}

absl::StatusOr<std::string> GenerateSecret() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string secret;
  secret.reserve(2 * sizeof(bytes));
  for (unsigned char b : bytes) {
    secret.push_back(kHex[b >> 4]);
    secret.push_back(kHex[b & 15]);
  }
  return secret;
}

bool SecretEquals(absl::string_view presented, absl::string_view expected) {
  // Walk `expected` whatever `presented` is, so the time depends on the lengths only.
  volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff = diff | (p ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

bool BearerMatches(absl::string_view header, absl::string_view secret) {
  if (!absl::StartsWith(header, kBearer)) return false;
  return SecretEquals(header.substr(kBearer.size()), secret);
}

bool BearerMatchesAny(absl::string_view header, const std::vector<std::string>& secrets) {
  bool any = false;
  for (const std::string& s : secrets) any |= BearerMatches(header, s);
  return any;
}

}  // namespace vamp
