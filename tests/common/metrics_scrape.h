// Test helpers: scrape a /metrics endpoint over HTTP and validate it with promtool.
#ifndef VAMP_TESTS_COMMON_METRICS_SCRAPE_H_
#define VAMP_TESTS_COMMON_METRICS_SCRAPE_H_

#include <string>

#include "absl/status/statusor.h"

namespace vamp::testing {

// GET http://127.0.0.1:<port>/metrics; the body, or an error for non-200 answers.
absl::StatusOr<std::string> ScrapeMetrics(int port);

// Runs `promtool check metrics` on `exposition`. OK when promtool accepts it (lint problems
// included); otherwise the error carries promtool's output. Unavailable when promtool is missing.
absl::Status PromtoolCheckMetrics(const std::string& exposition);

}  // namespace vamp::testing

#endif  // VAMP_TESTS_COMMON_METRICS_SCRAPE_H_
