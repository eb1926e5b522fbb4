#include "controller/frontend/stop_strings.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"

namespace vamp {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopStringMatcher::Next(absl::string_view text) {
  if (matched_) return "";
  if (stops_.empty()) return std::string(text);
  held_.append(text.data(), text.size());
  // The earliest match of any stop string ends the output there.
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that a stop string starts with.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n) {
      if (absl::EndsWith(held_, absl::string_view(stop).substr(0, n))) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::Finish() {
  return std::exchange(held_, std::string());
}

}  // namespace vamp
