#include "tests/common/metrics_scrape.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace vamp::testing {

absl::StatusOr<std::string> ScrapeMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/metrics");
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("GET /metrics on port ", port, ": ", httplib::to_string(result.error())));
  }
  if (result->status != 200) {
    return absl::InternalError(absl::StrCat("GET /metrics answered HTTP ", result->status));
  }
  return result->body;
}

absl::Status PromtoolCheckMetrics(const std::string& exposition) {
  if (access("/usr/bin/promtool", X_OK) != 0) {
    return absl::UnavailableError("promtool not installed (Debian package 'prometheus')");
  }
  char path[] = "/tmp/vamp_metrics_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("mkstemp failed");
  close(fd);
  std::ofstream(path) << exposition;
  const std::string command = absl::StrCat("/usr/bin/promtool check metrics < ", path, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int rc = pipe == nullptr ? -1 : pclose(pipe);
  std::remove(path);
  if (rc != 0 || !output.empty()) {
    // promtool prints lint findings (and exits non-zero) for bad names, units and help text.
    return absl::InvalidArgumentError(absl::StrCat("promtool check metrics: ", output));
  }
  return absl::OkStatus();
}

}  // namespace vamp::testing
