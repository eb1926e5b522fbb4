#include "tokenizer/utf8.h"

namespace vamp {
namespace {

// For a lead byte: how many continuation bytes follow and the allowed range of the first one.
// need = -1 for a byte that cannot start a character.
struct Lead {
  int need;
  unsigned char lo;
  unsigned char hi;
};

Lead LeadOf(unsigned char b) {
  if (b < 0x80) return {0, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  return {-1, 0, 0};
}

enum class Step { kOk, kInvalid, kTruncated };

// Reads one character at s[i]; sets *end to the first byte not consumed. kInvalid consumes the
// maximal ill-formed subpart (at least one byte); kTruncated means the input ended inside a
// so-far valid character.
Step ReadChar(absl::string_view s, size_t i, size_t* end) {
  const Lead lead = LeadOf(static_cast<unsigned char>(s[i]));
  if (lead.need < 0) {
    *end = i + 1;
    return Step::kInvalid;
  }
  size_t j = i + 1;
  for (int k = 0; k < lead.need; ++k, ++j) {
    if (j >= s.size()) {
      *end = j;
      return Step::kTruncated;
    }
    const unsigned char c = static_cast<unsigned char>(s[j]);
    const unsigned char lo = k == 0 ? lead.lo : 0x80;
    const unsigned char hi = k == 0 ? lead.hi : 0xBF;
    if (c < lo || c > hi) {
      *end = j;
      return Step::kInvalid;
    }
  }
  *end = j;
  return Step::kOk;
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t end;
    if (ReadChar(s, i, &end) != Step::kOk) return false;
    i = end;
  }
  return true;
}

std::string SanitizeUtf8(absl::string_view s) {
  if (IsValidUtf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    size_t end;
    if (ReadChar(s, i, &end) == Step::kOk) {
      out.append(s.data() + i, end - i);
    } else {
      out += kReplacement;
    }
    i = end;
  }
  return out;
}

size_t IncompleteUtf8Tail(absl::string_view s) {
  // The last lead (non-continuation) byte within the final 4 bytes starts the only character that
  // can be incomplete.
  const size_t first = s.size() >= 4 ? s.size() - 4 : 0;
  for (size_t p = s.size(); p > first; --p) {
    const unsigned char b = static_cast<unsigned char>(s[p - 1]);
    if (b >= 0x80 && b <= 0xBF) continue;
    size_t end;
    return ReadChar(s, p - 1, &end) == Step::kTruncated ? s.size() - (p - 1) : 0;
  }
  return 0;
}

std::vector<char32_t> DecodeUtf8(absl::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    size_t end;
    if (ReadChar(s, i, &end) != Step::kOk) {
      out.push_back(0xFFFD);
      i = end;
      continue;
    }
    const int n = static_cast<int>(end - i);
    char32_t cp = b & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
    for (size_t k = i + 1; k < end; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3F);
    out.push_back(cp);
    i = end;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace vamp
