// Stop strings (OpenAI's `stop`): the generated text ends before the first occurrence of any of
// them, which is not part of the output (vLLM's default, include_stop_str_in_output = false).
// Streaming hold-back: text that could still be the start of a stop string is not released until
// the next piece decides it, so a client never receives part of a stop string.
// Not thread-safe: one matcher per request.
#ifndef VAMP_CONTROLLER_FRONTEND_STOP_STRINGS_H_
#define VAMP_CONTROLLER_FRONTEND_STOP_STRINGS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace vamp {

class StopStringMatcher {
 public:
  // `stops` must hold non-empty strings; with none, Next passes text straight through.
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends `text` (whole UTF-8 characters) and returns what may be sent now: everything before
  // a match once one occurred, else everything but the longest tail that is a proper prefix of a
  // stop string. Returns "" for every call after a match.
  std::string Next(absl::string_view text);
  // The held-back tail at the end of the output (no stop string followed).
  std::string Finish();
  // Whether a stop string has matched.
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // received, not yet released
  bool matched_ = false;
};

}  // namespace vamp

#endif  // VAMP_CONTROLLER_FRONTEND_STOP_STRINGS_H_
