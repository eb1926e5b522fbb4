// Test helper: a blocking client on a raw TCP socket to 127.0.0.1, for tests that must send
// exactly the bytes they mean (partial heads, pipelined requests) or hold many connections.
#ifndef VAMP_TESTS_COMMON_RAW_HTTP_CLIENT_H_
#define VAMP_TESTS_COMMON_RAW_HTTP_CLIENT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vamp::testing {

class RawHttpClient {
 public:
  explicit RawHttpClient(int port);  // connects; see connected()
  ~RawHttpClient();
  RawHttpClient(const RawHttpClient&) = delete;
  RawHttpClient& operator=(const RawHttpClient&) = delete;

  bool connected() const { return connected_; }
  void Send(absl::string_view bytes);
  // Reads until `marker` has arrived, the peer closed, or `timeout`; returns all read so far.
  const std::string& ReadUntil(absl::string_view marker,
                               absl::Duration timeout = absl::Seconds(10));
  // Whether the peer closed within `timeout`, keeping what arrives meanwhile.
  bool WaitClosed(absl::Duration timeout = absl::Seconds(10));
  const std::string& data() const { return data_; }
  void Clear() { data_.clear(); }
  void Close();  // drops the connection (the server sees the client go away)

 private:
  void Poll(absl::Time deadline);
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string data_;
};

// Raises this process's soft open-file limit to its hard limit; returns the new soft limit.
int64_t RaiseOpenFileLimit();

}  // namespace vamp::testing

#endif  // VAMP_TESTS_COMMON_RAW_HTTP_CLIENT_H_
