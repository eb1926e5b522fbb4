#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace vamp {

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  auto failed = [&](absl::string_view what) {
    const int error = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot ", what, " '", path, "': ", std::strerror(error)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return failed("create a temporary file for");
  const char* data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return failed("write");
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    return failed("flush");
  }
  if (::close(fd) != 0) return failed("close");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return failed("rename a temporary file onto");
  return absl::OkStatus();
}

}  // namespace vamp
